"""stdlib_ops.norm: softmax, log_softmax, layer_norm, rms_norm, batch_norm."""
import numpy as np
import pytest
from hypothesis import example, given
from hypothesis import strategies as st

from stdlib_ops import norm as N

from . import FEW, FEWER, SEEDS, check, rand, shapes

GPU_TWINS = True     # each test also runs on cuda (as a @gpu test) where a GPU is usable


def _softmax(x, axis):
    e = np.exp(x - x.max(axis=axis, keepdims=True))
    return e / e.sum(axis=axis, keepdims=True)


def _log_softmax(x, axis):
    m = x.max(axis=axis, keepdims=True)
    return x - m - np.log(np.exp(x - m).sum(axis=axis, keepdims=True))


@pytest.mark.parametrize("name", ["softmax", "log_softmax"])
@FEW
@given(shape=shapes(1, 4), data=st.data(), seed=SEEDS)
@example(shape=(3, 1031), data=None, seed=0)
def test_softmax(name, shape, data, seed):
    axis = -1 if data is None else data.draw(st.integers(-len(shape), len(shape) - 1), label="axis")
    x = rand(shape, seed, low=-40, high=40)        # large logits: the max subtraction matters
    got = getattr(N, name)(x, axis=axis)
    x64 = x.astype(np.float64)
    expected = _softmax(x64, axis) if name == "softmax" else _log_softmax(x64, axis)
    check(got, N.op_for(name, x, axis), expected, rtol=1e-5, atol=1e-6, dtype=np.float32)
    if name == "softmax":
        np.testing.assert_allclose(got.sum(axis=axis), 1.0, rtol=1e-5)


def test_softmax_float16():
    x = rand((4, 100), 1, low=-8, high=8).astype(np.float16)
    got = N.softmax(x)
    check(got, N.op_for("softmax", x), _softmax(x.astype(np.float64), -1), rtol=5e-3, atol=1e-4, dtype=np.float16)


def test_softmax_of_a_nested_list():
    """Lists are arrays as numpy reads them (the fast-path check read `.ndim` off the list)."""
    rows = [[1.0, 2.0, 3.0], [0.5, -1.0, 4.0]]
    x = np.array(rows)
    np.testing.assert_allclose(N.softmax(rows), _softmax(x, -1), rtol=1e-12)
    np.testing.assert_allclose(N.log_softmax(rows), np.log(_softmax(x, -1)), rtol=1e-12)


@FEW
@given(shape=shapes(2, 4, max_size=20_000), k=st.integers(1, 2), affine=st.sampled_from(["none", "weight", "both"]),
       seed=SEEDS)
def test_layer_norm(shape, k, affine, seed):
    x = rand(shape, seed, low=-5, high=5)
    norm_shape = shape[len(shape) - k:]
    w = rand(norm_shape, seed + 1) if affine != "none" else None
    b = rand(norm_shape, seed + 2) if affine == "both" else None
    eps = 1e-5
    got = N.layer_norm(x, w, b, eps=eps, ndim=k)
    x64 = x.astype(np.float64)
    axes = tuple(range(len(shape) - k, len(shape)))
    mu, var = x64.mean(axis=axes, keepdims=True), x64.var(axis=axes, keepdims=True)
    expected = (x64 - mu) / np.sqrt(var + eps)
    if w is not None:
        expected = expected * w
    if b is not None:
        expected = expected + b
    check(got, N.op_for("layer_norm", x, w, b, eps=eps, ndim=k), expected, rtol=2e-4, atol=5e-5, dtype=np.float32)


@pytest.mark.parametrize("fast", [False, True])
@pytest.mark.parametrize("shape, k", [((3, 7, 5), 2), ((2, 35), 1), ((4, 1), 1)])
def test_layer_norm_of_constant_rows_is_the_bias(shape, k, fast):
    """x - mean is 0 in a constant row, so the output is the bias exactly: the mean summed in f32 was off by an
    ulp, which 1 / sqrt(eps) scaled to 1e-4 (a random ONNX model's LayerNorm of a Where of a constant)."""
    import taskdsl as td
    rng = np.random.default_rng(7)
    x = np.broadcast_to(rng.uniform(-2, 2, shape[:-k] + (1,) * k), shape).astype(np.float32)
    x = np.full(shape, np.float32(0.86612785)) if shape == (2, 35) else x
    weight = rng.uniform(0.5, 1.5, shape[-k:]).astype(np.float32)
    bias = rng.uniform(-0.5, 0.5, shape[-k:]).astype(np.float32)
    td.fast_compile(fast)
    try:
        np.testing.assert_array_equal(N.layer_norm(x, weight, bias, ndim=k), np.broadcast_to(bias, shape))
    finally:
        td.fast_compile(False)


@FEWER
@given(shape=shapes(1, 3), with_weight=st.booleans(), seed=SEEDS)
def test_rms_norm(shape, with_weight, seed):
    x = rand(shape, seed)
    w = rand(shape[-1:], seed + 1) if with_weight else None
    got = N.rms_norm(x, w, eps=1e-6)
    x64 = x.astype(np.float64)
    expected = x64 / np.sqrt((x64 * x64).mean(axis=-1, keepdims=True) + 1e-6)
    if w is not None:
        expected = expected * w
    check(got, N.op_for("rms_norm", x, w, eps=1e-6), expected, rtol=2e-5, atol=1e-5, dtype=np.float32)


@FEWER
@given(shape=shapes(2, 4, max_size=20_000, last=(1, 3, 17, 31)), affine=st.booleans(), seed=SEEDS)
@example(shape=(2, 3, 7, 5), affine=True, seed=0)
def test_batch_norm(shape, affine, seed):
    c = shape[1]
    x = rand(shape, seed)
    mean, var = rand((c,), seed + 1), rand((c,), seed + 2, low=0.1, high=2)
    w, b = (rand((c,), seed + 3), rand((c,), seed + 4)) if affine else (None, None)
    got = N.batch_norm(x, mean, var, w, b, eps=1e-5)
    per_channel = (1, c) + (1,) * (len(shape) - 2)
    expected = (x.astype(np.float64) - mean.reshape(per_channel)) / np.sqrt(var.reshape(per_channel) + 1e-5)
    if affine:
        expected = expected * w.reshape(per_channel) + b.reshape(per_channel)
    check(got, N.op_for("batch_norm", x, mean, var, w, b, eps=1e-5), expected, rtol=1e-5, atol=1e-5,
          dtype=np.float32)


def test_norm_errors():
    x = rand((3, 4), 0)
    with pytest.raises(ValueError):
        N.layer_norm(x, rand((5,), 1))
    with pytest.raises(TypeError):
        N.softmax(x.astype(np.int32))
    with pytest.raises(ValueError):
        N.batch_norm(x, rand((3,), 0), rand((3,), 1))
