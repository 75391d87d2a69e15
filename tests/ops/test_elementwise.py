"""stdlib_ops.elementwise: each operator vs its op's numpy reference and an independent numpy formula."""
import math

import numpy as np
import pytest
from hypothesis import example, given
from hypothesis import strategies as st

import taskdsl as td
from stdlib_ops import elementwise as E

from . import FEWER, SEEDS, TWO, broadcast_shapes, check, rand, shapes

GPU_TWINS = True     # each test also runs on cuda (as a @gpu test) where a GPU is usable

_erf = np.vectorize(math.erf, otypes=[np.float64])


def _sigmoid(x):
    return 1.0 / (1.0 + np.exp(-x))


BINARY = {
    "add": np.add, "sub": np.subtract, "mul": np.multiply, "div": np.divide, "pow": np.power,
    "maximum": np.maximum, "minimum": np.minimum,
}

UNARY = {   # name: (numpy formula on f64, input range)
    "relu": (lambda x: np.maximum(x, 0), (-3, 3)),
    "gelu": (lambda x: 0.5 * x * (1 + _erf(x / np.sqrt(2))), (-4, 4)),
    "silu": (lambda x: x * _sigmoid(x), (-8, 8)),
    "sigmoid": (_sigmoid, (-20, 20)),
    "tanh": (np.tanh, (-5, 5)),
    "exp": (np.exp, (-10, 10)),
    "log": (np.log, (1e-3, 100)),
    "sqrt": (np.sqrt, (0, 100)),
    "rsqrt": (lambda x: 1 / np.sqrt(x), (1e-2, 100)),
    "erf": (_erf, (-3, 3)),
}


def _gelu_tanh(x):
    return 0.5 * x * (1 + np.tanh(np.sqrt(2 / np.pi) * (x + 0.044715 * x ** 3)))


@pytest.mark.parametrize("name", list(BINARY))
@FEWER
@given(shp=broadcast_shapes(2), seed=SEEDS)
@example(shp=[(5, 1031), (1031,)], seed=0)
def test_binary_broadcast(name, shp, seed):
    a = rand(shp[0], seed)
    b = rand(shp[1], seed + 1)
    if name == "pow":
        a = np.abs(a) + 0.1
    if name == "div":
        b = np.where(np.abs(b) < 0.1, 0.5, b).astype(np.float32)
    got = getattr(E, name)(a, b)
    expected = BINARY[name](a.astype(np.float64), b.astype(np.float64))
    check(got, E.op_for(name, a, b), expected, rtol=1e-5, atol=1e-5, dtype=np.float32)


@pytest.mark.parametrize("name", list(UNARY))
@FEWER
@given(shape=shapes(1, 4), seed=SEEDS)
def test_unary(name, shape, seed):
    formula, (low, high) = UNARY[name]
    x = rand(shape, seed, low=low, high=high)
    got = getattr(E, name)(x)
    check(got, E.op_for(name, x), formula(x.astype(np.float64)), rtol=2e-5, atol=2e-6, dtype=np.float32)


@FEWER
@given(shape=shapes(1, 3), seed=SEEDS)
def test_gelu_tanh_approximation(shape, seed):
    x = rand(shape, seed, low=-5, high=5)
    got = E.gelu(x, approximate="tanh")
    check(got, E.op_for("gelu", x, approximate="tanh"), _gelu_tanh(x.astype(np.float64)), rtol=2e-5, atol=2e-6,
          dtype=np.float32)
    # the approximation stays close to the exact form
    np.testing.assert_allclose(got, E.gelu(x), atol=1e-3)
    with pytest.raises(ValueError):
        E.gelu(x, approximate="sigmoid")


def test_scalar_operands():
    x = rand((3, 7), 1)
    check(E.add(x, 2.5), E.op_for("add", x, 2.5), x + np.float32(2.5), dtype=np.float32)
    check(E.sub(1.0, x), E.op_for("sub", 1.0, x), 1.0 - x, dtype=np.float32)
    check(E.mul(x, 3), E.op_for("mul", x, 3), x * 3, dtype=np.float32)
    check(E.pow(np.abs(x), 2.0), E.op_for("pow", np.abs(x), 2.0), np.abs(x) ** 2, rtol=1e-5, dtype=np.float32)
    # a scalar is an input array, not a constant of the kernel: other values reuse the op
    assert E.op_for("add", x, 2.5).op is E.op_for("add", x, -7.0).op
    np.testing.assert_allclose(E.add(x, -7.0), x - 7.0)


def test_bool_arrays_with_numbers_promote_as_numpy_does():
    """An int scalar with a bool array gives i64 (True + 2 is 3), a float scalar f32; two bools stay bool, and
    their difference is refused, as numpy refuses it."""
    b = np.array([[True, False, True], [False, False, True]])
    for name, scalar, want in [("add", 2, b + 2), ("mul", 3, b * 3), ("maximum", 5, np.maximum(b, 5)),
                               ("sub", 1, b.astype(np.int64) - 1), ("add", 1.5, (b + 1.5).astype(np.float32))]:
        got = getattr(E, name)(b, scalar)
        assert got.dtype == want.dtype, (name, got.dtype)
        np.testing.assert_array_equal(got, want)
    np.testing.assert_array_equal(E.where(b, b, 2), np.where(b, b, 2))
    assert E.add(b, True).dtype == np.bool_
    with pytest.raises(TypeError, match="sub of two bool operands is not defined"):
        E.sub(b, b)


def test_big_endian_inputs_compute_like_native_ones():
    x = rand((3, 5), 5)
    be = x.astype(">f4")
    np.testing.assert_array_equal(E.add(be, 1.0), x + np.float32(1.0))
    np.testing.assert_array_equal(E.add(be, x.astype(">i4")), x + x.astype(np.int32).astype(np.float32))
    from stdlib_ops import reduce as R, transform
    np.testing.assert_allclose(R.sum(be, axis=1), x.sum(axis=1), rtol=1e-6)
    np.testing.assert_array_equal(transform.transpose(be), x.T)


def test_bfloat16_arrays():
    """bf16 like f16: computed in f32, stored as bf16, through the elementwise, norm and pooling ops."""
    ml_dtypes = pytest.importorskip("ml_dtypes")
    from stdlib_ops import norm, pool
    xb = rand((2, 3, 6, 6), 6).astype(ml_dtypes.bfloat16)
    x = xb.astype(np.float32)
    for got, want, tol in [(E.add(xb, xb), x + x, 0), (E.exp(xb), np.exp(x), 1e-2),
                           (norm.softmax(xb, -1), np.exp(x) / np.exp(x).sum(-1, keepdims=True), 1e-2),
                           (pool.max_pool2d(xb, 2), x.reshape(2, 3, 3, 2, 3, 2).max(axis=(3, 5)), 0)]:
        assert got.dtype == xb.dtype
        np.testing.assert_allclose(got.astype(np.float32), want, rtol=tol, atol=tol)
    np.testing.assert_array_equal(E.cast(xb, np.float32), x)


def test_float16():
    a = rand((4, 33), 2).astype(np.float16)
    b = rand((33,), 3).astype(np.float16)
    got = E.add(a, b)
    check(got, E.op_for("add", a, b), (a.astype(np.float32) + b.astype(np.float32)).astype(np.float16),
          rtol=1e-3, atol=1e-3, dtype=np.float16)
    g = E.gelu(a)
    expected = (0.5 * a.astype(np.float64) * (1 + _erf(a.astype(np.float64) / np.sqrt(2))))
    check(g, E.op_for("gelu", a), expected, rtol=2e-3, atol=2e-3, dtype=np.float16)
    # f16 with f32 computes and returns f32
    c = rand((33,), 4)
    check(E.mul(a, c), E.op_for("mul", a, c), a.astype(np.float32) * c, rtol=1e-6, dtype=np.float32)


@TWO
@given(shp=broadcast_shapes(2, max_ndim=3), seed=SEEDS)
def test_integers(shp, seed):
    a = rand(shp[0], seed, np.int32, -50, 50)
    b = rand(shp[1], seed + 1, np.int32, -50, 50)
    for name in ("add", "maximum"):
        check(getattr(E, name)(a, b), E.op_for(name, a, b), BINARY[name](a, b), dtype=np.int32)
    check(E.relu(a), E.op_for("relu", a), np.maximum(a, 0), dtype=np.int32)
    nz = np.where(b == 0, 7, b).astype(np.int32)
    check(E.div(a, nz), E.op_for("div", a, nz), a / nz, rtol=1e-6, dtype=np.float32)   # true division -> f32
    check(E.clip(a, -10, 20), E.op_for("clip", a, -10, 20), np.clip(a, -10, 20), dtype=np.int32)
    check(E.add(a, 3), E.op_for("add", a, 3), a + 3, dtype=np.int32)


@FEWER
@given(shp=broadcast_shapes(3, max_ndim=2), seed=SEEDS, mode=st.sampled_from(["both", "lo", "hi"]))
def test_clip(shp, seed, mode):
    x = rand(shp[0], seed)
    lo = rand(shp[1], seed + 1, low=-2, high=0)
    hi = rand(shp[2], seed + 2, low=0, high=2)
    lo_arg, hi_arg = (lo if mode != "hi" else None), (hi if mode != "lo" else None)
    expected = np.clip(x, lo_arg, hi_arg) if mode == "both" else (
        np.maximum(x, lo) if mode == "lo" else np.minimum(x, hi))
    check(E.clip(x, lo_arg, hi_arg), E.op_for("clip", x, lo_arg, hi_arg), expected, dtype=np.float32)
    check(E.clip(x, -0.5, 0.5), E.op_for("clip", x, -0.5, 0.5), np.clip(x, -0.5, 0.5), dtype=np.float32)


@FEWER
@given(shp=broadcast_shapes(3, max_ndim=3), seed=SEEDS)
def test_where(shp, seed):
    cond = rand(shp[0], seed) > 0
    a, b = rand(shp[1], seed + 1), rand(shp[2], seed + 2)
    check(E.where(cond, a, b), E.op_for("where", cond, a, b), np.where(cond, a, b), dtype=np.float32)
    check(E.where(cond, a, 0.0), E.op_for("where", cond, a, 0.0), np.where(cond, a, np.float32(0)),
          dtype=np.float32)
    icond = cond.astype(np.int32) * 3      # nonzero means true
    check(E.where(icond, a, b), E.op_for("where", icond, a, b), np.where(icond, a, b), dtype=np.float32)


@FEWER
@given(shape=shapes(1, 3), seed=SEEDS)
def test_cast(shape, seed):
    x = rand(shape, seed, low=-100, high=100)
    check(E.cast(x, np.int32), E.op_for("cast", x, np.int32), x.astype(np.int32), dtype=np.int32)   # truncation
    check(E.cast(x, np.float16), E.op_for("cast", x, np.float16), x.astype(np.float16), dtype=np.float16)
    i = x.astype(np.int32)
    check(E.cast(i, np.float32), E.op_for("cast", i, np.float32), i.astype(np.float32), dtype=np.float32)
    check(E.cast(i, td.i64), E.op_for("cast", i, td.i64), i.astype(np.int64), dtype=np.int64)


def test_ops_are_cached_per_structure():
    """Sizes are symbolic: new sizes with the same broadcast pattern reuse the op and its kernel."""
    a, b = rand((3, 5), 0), rand((5,), 1)
    E.add(a, b)
    plan = E.op_for("add", a, b)
    n_ops = len(E._OPS)
    c, d = rand((7, 1031), 2), rand((1031,), 3)
    np.testing.assert_allclose(E.add(c, d), c + d)
    assert E.op_for("add", c, d).op is plan.op
    assert len(E._OPS) == n_ops
    # any same-shape operands of any rank are one 1-d op
    x = rand((2, 3, 4), 4)
    assert E.op_for("add", x, x).op is E.op_for("add", rand((9,), 5), rand((9,), 6)).op


def test_empty_and_scalar_shapes():
    e = np.zeros((0, 3), np.float32)
    assert E.add(e, rand((3,), 0)).shape == (0, 3)
    s = np.float32(2.0) * np.ones((), np.float32)
    got = E.mul(s, rand((), 1))
    assert got.shape == () and np.isclose(got, 2 * rand((), 1))


def test_float64():
    x = rand((5, 77), 7, np.float64, 0.01, 4)
    y = rand((77,), 8, np.float64, -2, 2)
    for name, expected in (("exp", np.exp(x)), ("erf", _erf(x)), ("sigmoid", _sigmoid(x))):
        check(getattr(E, name)(x), E.op_for(name, x), expected, rtol=1e-12, atol=1e-14)
    check(E.pow(x, y), E.op_for("pow", x, y), x ** y, rtol=1e-12)
    check(E.maximum(x, y), E.op_for("maximum", x, y), np.maximum(x, y))


def test_buffer_named_like_a_math_function_compiles():
    """A tensor called `exp` must not shadow exp() in the CUDA source."""
    a = td.placeholder("a", td.f64, ("BUG_N",))
    y = td.compute("exp", ("BUG_N",), lambda i: td.exp(a[i]))
    op = td.op([a], [y])
    x = np.linspace(0, 1, 5)
    kernel = op.kernels_for(x)[0]
    kernel.compile(x, np.empty_like(x), target="cuda", arch="sm_90")


@pytest.mark.parametrize("dtype", [np.float16, np.float32, np.float64])
def test_gelu_and_silu_at_infinities_take_their_limits(dtype):
    """gelu(-inf) and silu(-inf) are -inf * 0 in their textbook forms, NaN: they are 0 (PyTorch's limits)."""
    x = np.array([-np.inf, np.inf, np.nan, -60.0, -2.0, 0.0, 3.0], dtype)
    finite = [float(v) for v in x[3:]]
    phi = [0.5 * (1 + math.erf(v / math.sqrt(2))) for v in finite]
    tanh_phi = [0.5 * (1 + math.tanh(math.sqrt(2 / math.pi) * (v + 0.044715 * v ** 3))) for v in finite]
    sig = [1 / (1 + math.exp(-v)) for v in finite]
    for got, cdf in ((E.gelu(x), phi), (E.gelu(x, approximate="tanh"), tanh_phi), (E.silu(x), sig)):
        assert got.dtype == dtype
        np.testing.assert_array_equal(got[:3], np.array([0.0, np.inf, np.nan], dtype))
        np.testing.assert_allclose(got[3:].astype(np.float64), [v * c for v, c in zip(finite, cdf)],
                                   rtol=2e-3 if dtype == np.float16 else 1e-5, atol=1e-6)


@pytest.mark.parametrize("fast", [True, False])
def test_a_square_is_a_multiply_and_other_powers_stay_pow(fast):
    """pow(x, 2) is x * x on the cpu (math.pow, a libm call an element, squared 4096 x 4096 at 10x numpy's time):
    the same value, correctly rounded, for NaN, infinities, signed zeros, subnormals and overflow; an exponent
    array holding 2 among other values takes each element's own."""
    td.fast_compile(fast)      # helpers called (fast) or inlined, where LLVM may unswitch the loop on y == 2
    try:
        tiny = np.float32(1e-30)
        x = np.array([np.nan, np.inf, -np.inf, -0.0, 0.0, tiny, -3.0, 1.5e19, 1.1, -7.25], np.float32)
        got = E.pow(x, np.float32(2.0))
        assert got.dtype == np.float32
        if td.get_target() == "cpu":
            np.testing.assert_array_equal(got, x * x)
        else:       # CUDA's powf: within 2 ulp
            np.testing.assert_allclose(got, x * x, rtol=3e-7)
        y = np.array([2, 0.5, 2, 3, 2, -1, 2, 1, 2.5, 2], np.float32)
        np.testing.assert_allclose(E.pow(np.abs(x), y), np.abs(x) ** y, rtol=1e-6)
    finally:
        td.fast_compile(True)
