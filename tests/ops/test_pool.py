"""stdlib_ops.pool: max_pool2d, avg_pool2d (count_include_pad both ways), global_avg_pool2d."""
import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from stdlib_ops import pool as P

from . import FEWER, SEEDS, check, rand

GPU_TWINS = True     # each test also runs on cuda (as a @gpu test) where a GPU is usable

NCHW = st.tuples(st.sampled_from([1, 2]), st.sampled_from([1, 3, 5]), st.sampled_from([3, 7, 13, 32]),
                 st.sampled_from([3, 5, 11, 31]))


def _np_pool(x, kernel, stride, padding, kind, count_include_pad=True):
    """A direct numpy loop over output positions (float64), PyTorch semantics (floor mode)."""
    n, c, h, w = x.shape
    (kh, kw), (sh, sw), (ph, pw) = kernel, stride, padding
    fill = -np.inf if kind == "max" else 0.0
    xp = np.full((n, c, h + 2 * ph, w + 2 * pw), fill)
    xp[:, :, ph:ph + h, pw:pw + w] = x
    inside = np.zeros(xp.shape[2:])
    inside[ph:ph + h, pw:pw + w] = 1
    oh, ow = (h + 2 * ph - kh) // sh + 1, (w + 2 * pw - kw) // sw + 1
    out = np.empty((n, c, oh, ow))
    for i in range(oh):
        for j in range(ow):
            win = xp[:, :, i * sh:i * sh + kh, j * sw:j * sw + kw]
            if kind == "max":
                out[:, :, i, j] = win.max(axis=(2, 3))
            else:
                count = kh * kw if count_include_pad else inside[i * sh:i * sh + kh, j * sw:j * sw + kw].sum()
                out[:, :, i, j] = win.sum(axis=(2, 3)) / count
    return out


CONFIGS = [((3, 3), (2, 2), (1, 1)), ((3, 2), (1, 2), (1, 0))]     # the plain 2x2 / stride 2 case is below


@pytest.mark.parametrize("kernel,stride,padding", CONFIGS)
@FEWER
@given(shape=NCHW, seed=SEEDS)
def test_max_pool2d(kernel, stride, padding, shape, seed):
    x = rand(shape, seed)
    got = P.max_pool2d(x, kernel, stride, padding)
    check(got, P.op_for("max_pool2d", x, kernel, stride, padding), _np_pool(x, kernel, stride, padding, "max"),
          dtype=np.float32)


@pytest.mark.parametrize("kernel,stride,padding", CONFIGS)
@pytest.mark.parametrize("include_pad", [True, False])
@FEWER
@given(shape=NCHW, seed=SEEDS)
def test_avg_pool2d(kernel, stride, padding, include_pad, shape, seed):
    x = rand(shape, seed)
    got = P.avg_pool2d(x, kernel, stride, padding, count_include_pad=include_pad)
    expected = _np_pool(x, kernel, stride, padding, "avg", include_pad)
    check(got, P.op_for("avg_pool2d", x, kernel, stride, padding, count_include_pad=include_pad), expected,
          rtol=1e-5, atol=1e-6, dtype=np.float32)


def test_pool_int_arguments_and_defaults():
    x = rand((2, 3, 9, 8), 3)
    check(P.max_pool2d(x, 2), P.op_for("max_pool2d", x, 2), _np_pool(x, (2, 2), (2, 2), (0, 0), "max"),
          dtype=np.float32)
    check(P.avg_pool2d(x, 2), P.op_for("avg_pool2d", x, 2), _np_pool(x, (2, 2), (2, 2), (0, 0), "avg"),
          rtol=1e-5, atol=1e-6, dtype=np.float32)
    with pytest.raises(ValueError):
        P.max_pool2d(x, 2, padding=2)          # padding above half the window
    with pytest.raises(ValueError):
        P.avg_pool2d(rand((1, 1, 2, 2), 0), 3)  # window larger than the input
    with pytest.raises(TypeError, match="kernel_size must be integers"):
        P.max_pool2d(x, 2.0)                    # (was "'float' object is not iterable")
    with pytest.raises(TypeError, match="stride must be integers"):
        P.avg_pool2d(x, 2, 1.0)
    with pytest.raises(ValueError, match="an integer or 2 of them"):
        P.max_pool2d(x, (2, 2, 2))


@FEWER
@given(shape=NCHW, seed=SEEDS)
def test_global_avg_pool2d(shape, seed):
    x = rand(shape, seed)
    check(P.global_avg_pool2d(x), P.op_for("global_avg_pool2d", x), x.astype(np.float64).mean(axis=(2, 3),
          keepdims=True), rtol=1e-5, atol=1e-6, dtype=np.float32)


def test_ops_kept_for_reuse_are_bounded(monkeypatch):
    """avg_pool2d builds an Op per input shape, and every Op was kept: a program of many shapes grew without bound."""
    from stdlib_ops import elementwise
    monkeypatch.setattr(elementwise, "OPS_KEPT", 3)
    monkeypatch.setattr(elementwise, "_OPS", {})
    for size in (5, 6, 7, 9, 11):
        x = np.random.default_rng(size).standard_normal((1, 2, size, size)).astype(np.float32)
        got = P.avg_pool2d(x, 2)
        want = x[:, :, :size // 2 * 2, :size // 2 * 2].reshape(1, 2, size // 2, 2, size // 2, 2).mean(axis=(3, 5))
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)
        assert len(elementwise._OPS) <= 3


@pytest.mark.parametrize("fast", [True, False])
@pytest.mark.parametrize("include_pad", [True, False])
def test_average_pools_by_rows(fast, include_pad, monkeypatch):
    """f32 average pooling on the cpu sums each output row's window taps into a chunk of registers and divides by
    the window's size or by its taps inside the input (a thread per output, four divisions and nine guarded
    loads each: 17x onnxruntime's time); rows wider than a chunk (64), the generic kernel (fast compile) and
    one built for the layer."""
    import taskdsl as td
    calls, real = [], P.pool_rows
    monkeypatch.setattr(P, "pool_rows", lambda *a, **k: calls.append(k["kind"]) or real(*a, **k))
    td.fast_compile(fast)
    try:
        for shape, kernel, stride, padding in (((1, 2, 9, 150), (3, 3), (1, 1), (1, 1)),
                                               ((2, 3, 13, 11), (3, 2), (2, 1), (1, 1)),
                                               ((1, 1, 5, 5), (5, 5), (1, 1), (2, 2))):
            x = rand(shape, sum(shape))
            got = P.avg_pool2d(x, kernel, stride, padding, count_include_pad=include_pad)
            check(got, P.op_for("avg_pool2d", x, kernel, stride, padding, count_include_pad=include_pad),
                  _np_pool(x, kernel, stride, padding, "avg", include_pad), rtol=1e-5, atol=1e-6, dtype=np.float32)
        assert calls == (["avg"] * 3 if td.get_target() == "cpu" else [])
    finally:
        td.fast_compile(True)


@pytest.mark.parametrize("fast", [True, False])
def test_max_pools_keep_nans_and_infinities(fast):
    """A NaN anywhere in a window makes its maximum NaN, before or after the window's largest number, and -inf and
    inf pool as numbers (the cpu's rows kernel selects by a compare and a NaN test, the generic kernel and one built
    for the layer); numpy's max of each window is the oracle."""
    import taskdsl as td
    x = rand((1, 2, 7, 9), 3)
    x[0, 0, 0, 0] = x[0, 0, 3, 5] = np.nan        # the first element of a window, and one after larger ones
    x[0, 1, 2, 2] = np.inf
    x[0, 1, 4:6, 6:8] = -np.inf                    # a window of -inf only
    td.fast_compile(fast)
    try:
        for kernel, stride, padding in (((2, 2), (2, 2), (0, 0)), ((3, 3), (2, 2), (1, 1)), ((3, 2), (1, 1), (1, 0))):
            want = _np_pool(x, kernel, stride, padding, "max")
            got = P.max_pool2d(x, kernel, stride, padding)
            np.testing.assert_array_equal(got, want.astype(np.float32))
            assert np.isnan(got).any() and np.isinf(got).any()
    finally:
        td.fast_compile(True)
