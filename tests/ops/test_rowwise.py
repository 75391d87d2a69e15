"""The fused row kernels, in both schedules (block per row for GPUs, thread per row for CPUs)."""
import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

from stdlib_ops.rowwise import layer_norm_rows, softmax_rows

GPU_TWINS = True

SHAPES = st.tuples(st.integers(1, 9), st.sampled_from([1, 2, 31, 255, 256, 257, 1031]))


def _softmax(x):
    x = x.astype(np.float64)
    e = np.exp(x - x.max(axis=-1, keepdims=True))
    return e / e.sum(axis=-1, keepdims=True)


@pytest.mark.parametrize("schedule", ["block", "thread"])
@settings(max_examples=5, deadline=None)
@given(shape=SHAPES, seed=st.integers(0, 1000))
def test_softmax_and_log_softmax(schedule, shape, seed):
    x = (np.random.default_rng(seed).standard_normal(shape) * 5).astype(np.float32)
    np.testing.assert_allclose(softmax_rows(x, schedule=schedule), _softmax(x), rtol=1e-5, atol=1e-7)
    np.testing.assert_allclose(softmax_rows(x, log=True, schedule=schedule), np.log(_softmax(x)), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("schedule", ["block", "thread"])
@settings(max_examples=5, deadline=None)
@given(shape=SHAPES, seed=st.integers(0, 1000), masked=st.floats(0.0, 1.0))
def test_softmax_of_masked_rows(schedule, shape, seed, masked):
    """Rows where an attention mask took a fraction of the scores 1e4 down (their exps far below float32's
    smallest subnormal): those weights are 0, the rest a softmax of their own."""
    rng = np.random.default_rng(seed)
    x = rng.standard_normal(shape).astype(np.float32)
    x[rng.random(shape) < masked] -= np.float32(1e4)
    np.testing.assert_allclose(softmax_rows(x, schedule=schedule), _softmax(x), rtol=1e-5, atol=1e-7)


@pytest.mark.parametrize("schedule", ["block", "thread"])
@settings(max_examples=5, deadline=None)
@given(shape=SHAPES, seed=st.integers(0, 1000), masked=st.floats(0.0, 0.9))
def test_softmax_of_rows_with_minus_infinity_and_nan(schedule, shape, seed, masked):
    """-inf scores (a causal mask) weigh 0 wherever they come in the row, before the first finite score too;
    a NaN makes its row NaN, as numpy's formula does."""
    rng = np.random.default_rng(seed)
    x = rng.standard_normal(shape).astype(np.float32)
    x[rng.random(shape) < masked] = -np.inf
    x[:, -1] = 0.5                                  # every row keeps a finite score
    np.testing.assert_allclose(softmax_rows(x, schedule=schedule), _softmax(x), rtol=1e-5, atol=1e-7)
    x[0, rng.integers(shape[1])] = np.nan
    got = softmax_rows(x, schedule=schedule)
    assert np.isnan(got[0]).all() and not np.isnan(got[1:]).any()


@pytest.mark.parametrize("schedule", ["block", "thread"])
@pytest.mark.parametrize("columns", [7, 16, 37])
@pytest.mark.parametrize("log", [False, True])
def test_softmax_rows_of_infinities_and_nans_match_numpy(schedule, columns, log):
    """Rows all -inf, with +inf, with a NaN in the lanes' body or in their tail, with both zeros: the 'thread' row
    max drops NaNs (`lane_max`), and the NaN still reaches every output through its exp. Rows whose max is in the
    first lane, a middle one or the tail, 100 above the next: a max missed by any lane overflows an exp."""
    rng = np.random.default_rng(columns)
    x = rng.standard_normal((11, columns)).astype(np.float32)
    j = np.arange(columns, dtype=np.float32)
    x[8], x[9], x[10] = 100 * j, -100 * j, -100 * np.abs(j - columns // 2)
    x[0] = -np.inf
    x[1, 3] = np.inf
    x[2, [0, 5]] = np.inf
    x[3, 0] = np.nan
    x[4, -1] = np.nan
    x[5, 1], x[5, -2] = np.nan, -np.inf
    x[6] = 0.0
    x[6, ::2] = -0.0
    x[7, 2:] = -np.inf
    with np.errstate(invalid="ignore", divide="ignore"):
        if log:     # as x - max - log(sum), not log(softmax): exp(-800) is 0 even in float64
            x64 = x.astype(np.float64)
            shifted = x64 - x64.max(axis=-1, keepdims=True)
            expected = shifted - np.log(np.exp(shifted).sum(axis=-1, keepdims=True))
        else:
            expected = _softmax(x)
    np.testing.assert_allclose(softmax_rows(x, log=log, schedule=schedule), expected, rtol=1e-5, atol=1e-7)


@pytest.mark.parametrize("schedule", ["block", "thread"])
@settings(max_examples=6, deadline=None)
@given(shape=SHAPES, seed=st.integers(0, 1000), rms=st.booleans(), weight=st.booleans(), bias=st.booleans())
def test_layer_and_rms_norm(schedule, shape, seed, rms, weight, bias):
    """Layer norm, or RMS norm (no centring), with or without a weight and a bias."""
    rng = np.random.default_rng(seed)
    x = (rng.standard_normal(shape) * 3 + 1).astype(np.float32)
    w, b = rng.standard_normal(shape[-1]).astype(np.float32), rng.standard_normal(shape[-1]).astype(np.float32)
    x64 = x.astype(np.float64)
    centred = x64 if rms else x64 - x64.mean(-1, keepdims=True)
    normalized = centred / np.sqrt((centred ** 2).mean(-1, keepdims=True) + 1e-5)
    expected = normalized * (w if weight else 1) + (b if bias else 0)
    got = layer_norm_rows(x, w if weight else None, b if bias else None, schedule=schedule, rms=rms)
    np.testing.assert_allclose(got, expected, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("schedule", ["block", "thread"])
def test_float64_rows_keep_float64_precision(schedule):
    """f64 rows: the statistics (1 / sum, log(sum), mean, rstd), the block's partials and eps are f64 too (they
    were f32, which left f64 softmax with f32's 1e-7 relative error, and an eps of 0.1 rounded to f32 a layer
    norm with 7e-9)."""
    rng = np.random.default_rng(3)
    x = rng.standard_normal((3, 257)) * 4
    w, b = rng.standard_normal(257), rng.standard_normal(257)
    np.testing.assert_allclose(softmax_rows(x, schedule=schedule), _softmax(x), rtol=1e-13)
    np.testing.assert_allclose(softmax_rows(x, log=True, schedule=schedule), np.log(_softmax(x)), rtol=1e-13)
    expected = (x - x.mean(-1, keepdims=True)) / np.sqrt(x.var(-1, keepdims=True) + 0.1) * w + b
    np.testing.assert_allclose(layer_norm_rows(x, w, b, 0.1, schedule), expected, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("schedule", ["block", "thread"])
@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
@settings(max_examples=2, deadline=None)
@given(shape=SHAPES, seed=st.integers(0, 1000))
def test_16_bit_rows_are_computed_in_f32_and_rounded_once(schedule, dtype, shape, seed):
    """f16 / bf16 rows (the GPU models' attention and layer norms: one kernel each, not three): within one
    rounding of the result in the 16-bit type of the float64 formula on the same (rounded) inputs."""
    import ml_dtypes
    dt = np.dtype(ml_dtypes.bfloat16) if dtype == "bfloat16" else np.dtype(dtype)
    rng = np.random.default_rng(seed)
    x = (rng.standard_normal(shape) * 3).astype(dt)
    w, b = rng.standard_normal(shape[-1]).astype(dt), rng.standard_normal(shape[-1]).astype(dt)
    x64, w64, b64 = (a.astype(np.float64) for a in (x, w, b))
    ulp = float(ml_dtypes.finfo(dt).eps)
    ln = (x64 - x64.mean(-1, keepdims=True)) / np.sqrt(x64.var(-1, keepdims=True) + float(np.float32(1e-5)))
    for got, want in ((softmax_rows(x, schedule=schedule), _softmax(x64)),
                      (softmax_rows(x, log=True, schedule=schedule), np.log(_softmax(x64))),
                      (layer_norm_rows(x, w, b, schedule=schedule), ln * w64 + b64)):
        assert got.dtype == dt
        err = np.abs(got.astype(np.float64) - want)
        assert (err <= ulp * (np.abs(want) + 1e-3 * np.abs(want).max() + 1e-30)).all(), err.max()
    # softmax has no cancellation: within half a unit in the last place of the exact value (f32's own error
    # aside), where the cpu kernel had stored each exp in 16 bits first and rounded again (1.1 ulp)
    got, want = softmax_rows(x, schedule=schedule).astype(np.float64), _softmax(x64)
    scale = np.maximum(2.0 ** np.floor(np.log2(np.maximum(want, 1e-300))), float(ml_dtypes.finfo(dt).smallest_normal))
    half_ulp = 0.5 * ulp * scale        # (below the smallest normal the spacing stays that of the smallest normal)
    assert (np.abs(got - want) <= half_ulp + 1e-6 * want).all()


@pytest.mark.parametrize("columns", [1, 256, 257, 2048, 8192, 8193])
def test_block_rows_in_registers_and_streamed(columns):
    """The 'block' kernels keep rows of up to 256 x 32 elements in registers (the least of CACHED that covers the
    row), and stream longer ones; both, at the edges of each, against numpy. A -inf and a NaN row included."""
    from stdlib_ops import rowwise
    import taskdsl as td
    cached = rowwise.cached_per_thread(columns, "block")
    assert cached == (next(n for n in rowwise.CACHED if 256 * n >= columns) if columns <= 8192 else 0)
    rng = np.random.default_rng(columns)
    x = (rng.standard_normal((3, columns)) * 4).astype(np.float32)
    x[1, ::3] = -np.inf
    x[1, -1] = 1.5
    w, b = rng.standard_normal(columns).astype(np.float32), rng.standard_normal(columns).astype(np.float32)
    for kernel_cached in {cached, 0}:
        y, z, ln = np.empty_like(x), np.empty_like(x), np.empty_like(x)
        rowwise.softmax_kernel(td.f32, False, "block", kernel_cached)(x, y)
        rowwise.softmax_kernel(td.f32, True, "block", kernel_cached)(x, z)
        np.testing.assert_allclose(y, _softmax(x), rtol=1e-5, atol=1e-7)
        with np.errstate(divide="ignore"):          # the -inf entries' log-softmax is log(0) = -inf
            np.testing.assert_allclose(z, np.log(_softmax(x)), rtol=1e-5, atol=1e-5)
        finite = x[[0, 2]].astype(np.float64)
        rowwise.layer_norm_kernel(td.f32, "block", kernel_cached)(x[[0, 2]].copy(), w, b, ln[:2], 1e-5)
        want = (finite - finite.mean(-1, keepdims=True)) / np.sqrt(finite.var(-1, keepdims=True) + 1e-5) * w + b
        np.testing.assert_allclose(ln[:2], want, rtol=1e-4, atol=1e-4)
    x[2, columns // 2] = np.nan
    got = rowwise.softmax_rows(x, schedule="block")
    assert np.isnan(got[2]).all() and not np.isnan(got[:2]).any()
