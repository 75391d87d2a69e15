"""Compute definitions (td.placeholder / td.compute / td.reduce) and their numpy reference
evaluator (`taskdsl.compute.evaluate`), checked against independent numpy / math formulas.

This is the oracle the schedules of tests/schedule are tested against; kernels run here only where a
definition's construction is in question (Select's number operands).
"""
import math
import re

import numpy as np
import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

import taskdsl as td
from taskdsl import ir
from taskdsl.compute import bind_sizes, evaluate, size_var, topological

FEW = settings(max_examples=8, deadline=None)
DIM = st.integers(1, 9) | st.sampled_from([1, 2, 3, 5, 7, 13])


def rand(rng, shape, lo=-2.0, hi=2.0, dtype=np.float32):
    return rng.uniform(lo, hi, shape).astype(dtype)


# ---------------------------------------------------------------- elementwise, broadcasting, index arithmetic
A = td.placeholder("A", td.f32, ("M", "N"))
B = td.placeholder("B", td.f32, ("N",))
C = td.placeholder("C", td.f32, ("M", 1))
BCAST = td.compute("Bcast", ("M", "N"), lambda i, j: A[i, j] * B[j] + C[i, 0] + (i - 2 * j))
TRANSPOSE = td.compute("Tr", ("N", "M"), lambda j, i: A[i, j])


@FEW
@given(m=DIM, n=DIM, seed=st.integers(0, 2**16))
@example(m=1, n=1, seed=0)
def test_broadcast_and_index_arithmetic(m, n, seed):
    rng = np.random.default_rng(seed)
    a, b, c = rand(rng, (m, n)), rand(rng, (n,)), rand(rng, (m, 1))
    y, t = evaluate([A, B, C], [BCAST, TRANSPOSE], [a, b, c])
    ii, jj = np.arange(m)[:, None], np.arange(n)[None, :]
    expected = a * b[None, :] + c + (ii - 2 * jj)
    assert y.dtype == np.float32 and y.shape == (m, n)
    np.testing.assert_allclose(y, expected, rtol=1e-6, atol=1e-6)
    assert t.shape == (n, m)
    np.testing.assert_array_equal(t, a.T)


def test_size_symbol_in_a_body():
    """A size symbol used as a value is the bound size."""
    y = td.compute("Ysz", ("M", "N"), lambda i, j: A[i, j] + size_var("M") * 10 + size_var("N"))
    a = np.zeros((3, 4), np.float32)
    out, = evaluate([A], [y], [a])
    np.testing.assert_array_equal(out, np.full((3, 4), 34.0, np.float32))


def test_constant_body_broadcasts_to_shape():
    y = td.compute("Yc", ("M", 2), lambda i, j: 1.5)
    out, = evaluate([A], [y], [np.zeros((3, 5), np.float32)])
    assert out.shape == (3, 2) and out.dtype == np.float32
    np.testing.assert_array_equal(out, np.full((3, 2), 1.5, np.float32))


# ---------------------------------------------------------------- select: padded shifts (clipped untaken loads)
X2 = td.placeholder("X", td.f32, ("M", "N"))
SHIFT_DOWN = td.compute("Down", ("M", "N"),
                        lambda i, j: ir.Select(i > 0, X2[i - 1, j], ir.const(0.0), td.f32))
SHIFT_UP = td.compute("Up", ("M", "N"),
                      lambda i, j: ir.Select(i < size_var("M") - 1, X2[i + 1, j], ir.const(-1.0), td.f32))


@FEW
@given(m=DIM, n=DIM, seed=st.integers(0, 2**16))
@example(m=1, n=1, seed=0)
@example(m=2, n=3, seed=1)
def test_select_padded_shift(m, n, seed):
    x = rand(np.random.default_rng(seed), (m, n))
    down, up = evaluate([X2], [SHIFT_DOWN, SHIFT_UP], [x])
    exp_down = np.zeros_like(x)
    exp_down[1:] = x[:-1]
    exp_up = np.full_like(x, -1.0)
    exp_up[:-1] = x[1:]
    np.testing.assert_array_equal(down, exp_down)
    np.testing.assert_array_equal(up, exp_up)


def test_pad_concat_gather_with_fixed_shapes():
    P = td.placeholder("P", td.f32, (5,))
    Q = td.placeholder("Q", td.f32, (3,))
    I = td.placeholder("I", td.i32, (4,))
    pad = td.compute("Pad", (9,), lambda i: ir.Select(ir.binary("and", i >= 2, i < 7), P[i - 2],
                                                      ir.const(0.0), td.f32))
    cat = td.compute("Cat", (8,), lambda i: ir.Select(i < 5, P[i], Q[i - 5], td.f32))
    gather = td.compute("Gather", (4,), lambda i: P[I[i]])
    p = np.arange(1, 6, dtype=np.float32)
    q = np.array([10, 20, 30], np.float32)
    idx = np.array([4, 0, 2, 2], np.int32)
    padded, cat_, gathered = evaluate([P, Q, I], [pad, cat, gather], [p, q, idx])
    np.testing.assert_array_equal(padded, np.pad(p, 2))
    np.testing.assert_array_equal(cat_, np.concatenate([p, q]))
    np.testing.assert_array_equal(gathered, p[idx])


# ---------------------------------------------------------------- casts
F1 = td.placeholder("F", td.f32, ("N",))
I1 = td.placeholder("I", td.i32, ("N",))
D1 = td.placeholder("D", td.i32, ("N",))


def test_float_to_int_truncates_toward_zero():
    f = np.array([-2.9, -1.5, -1.0, -0.7, -0.0, 0.3, 0.999, 1.0, 1.5, 2.9, 100.25, -100.75], np.float32)
    to_i32 = td.compute("ToI", ("N",), lambda i: F1[i], dtype=td.i32)
    to_i8 = td.compute("ToI8", ("N",), lambda i: F1[i], dtype=td.i8)
    cast_in_arith = td.compute("CastMul", ("N",), lambda i: ir.Cast(F1[i], td.i32) * 3)
    a, b, c = evaluate([F1], [to_i32, to_i8, cast_in_arith], [f])
    expected = np.array([int(v) for v in f.tolist()])   # Python int() truncates toward zero
    assert a.dtype == np.int32 and b.dtype == np.int8 and c.dtype == np.int32
    np.testing.assert_array_equal(a, expected)
    np.testing.assert_array_equal(b, expected)
    np.testing.assert_array_equal(c, expected * 3)


def test_int_to_float_and_to_f16():
    i = np.array([-7, 0, 3, 2049], np.int32)
    to_f = td.compute("ToF", ("N",), lambda k: I1[k], dtype=td.f32)
    half = td.compute("Half", ("N",), lambda k: I1[k] / 2)           # int / int is true division
    to_h = td.compute("ToH", ("N",), lambda k: I1[k], dtype=td.f16)
    f, h, fh = evaluate([I1], [to_f, half, to_h], [i])
    assert f.dtype == np.float32 and h.dtype == np.float32 and fh.dtype == np.float16
    np.testing.assert_array_equal(f, [-7.0, 0.0, 3.0, 2049.0])
    np.testing.assert_array_equal(h, [-3.5, 0.0, 1.5, 1024.5])
    np.testing.assert_array_equal(fh, np.array([-7, 0, 3, 2048], np.float16))   # 2049 rounds to even in f16


# ---------------------------------------------------------------- floor division and modulo on negative ints
def test_floor_div_mod_negative_ints():
    i = np.array([-7, -7, 7, 7, -1, 0, -6, 6, -2**31 + 1, 13], np.int32)
    d = np.array([2, -2, 2, -2, 3, -5, 3, -4, 7, -1], np.int32)
    div = td.compute("Div", ("N",), lambda k: I1[k] // D1[k])
    mod = td.compute("Mod", ("N",), lambda k: I1[k] % D1[k])
    div3 = td.compute("Div3", ("N",), lambda k: I1[k] // -3)
    mod3 = td.compute("Mod3", ("N",), lambda k: I1[k] % 3)
    a, b, c, e = evaluate([I1, D1], [div, mod, div3, mod3], [i, d])
    ii, dd = i.tolist(), d.tolist()
    np.testing.assert_array_equal(a, [x // y for x, y in zip(ii, dd)])     # Python: floor division
    np.testing.assert_array_equal(b, [x % y for x, y in zip(ii, dd)])      # sign of the divisor
    np.testing.assert_array_equal(c, [x // -3 for x in ii])
    np.testing.assert_array_equal(e, [x % 3 for x in ii])
    assert a.dtype == b.dtype == np.int32
    assert (a[0], b[0], a[1], b[1], a[2], b[2]) == (-4, 1, 3, -1, 3, 1)


def test_operators():
    i = np.array([-5, -1, 0, 3, 12], np.int32)
    d = np.array([3, 1, 2, 3, 5], np.int32)
    outs = {
        "lt": (lambda k: I1[k] < D1[k], lambda x, y: x < y),
        "ge": (lambda k: I1[k] >= D1[k], lambda x, y: x >= y),
        "eq": (lambda k: ir.binary("==", I1[k], D1[k]), lambda x, y: x == y),
        "and": (lambda k: ir.binary("and", I1[k] > 0, D1[k] > 2), lambda x, y: (x > 0) & (y > 2)),
        "or": (lambda k: ir.binary("or", I1[k] > 0, D1[k] > 2), lambda x, y: (x > 0) | (y > 2)),
        "band": (lambda k: ir.binary("&", I1[k], D1[k]), lambda x, y: x & y),
        "bxor": (lambda k: ir.binary("^", I1[k], D1[k]), lambda x, y: x ^ y),
        "shl": (lambda k: ir.binary("<<", I1[k], D1[k]), lambda x, y: x << y),
        "shr": (lambda k: ir.binary(">>", I1[k], D1[k]), lambda x, y: x >> y),   # arithmetic shift
        "neg": (lambda k: -I1[k], lambda x, y: -x),
        "not": (lambda k: ir.Unary("not", I1[k] > 0, td.boolean), lambda x, y: ~(x > 0)),
        "arith": (lambda k: (I1[k] * D1[k] - 3) + D1[k] * D1[k], lambda x, y: x * y - 3 + y * y),
    }
    tensors = [td.compute(f"Op_{name}", ("N",), f) for name, (f, _) in outs.items()]
    results = evaluate([I1, D1], tensors, [i, d])
    for (name, (_, formula)), t, got in zip(outs.items(), tensors, results):
        expected = formula(i.astype(np.int64), d.astype(np.int64))
        assert got.dtype == (np.bool_ if expected.dtype == np.bool_ else np.int32), name
        np.testing.assert_array_equal(got, expected, err_msg=name)


# ---------------------------------------------------------------- every math function
POS = (0.1, 3.0)
SIGNED = (-3.0, 3.0)
UNIT = (-0.95, 0.95)
MATH_CASES = {   # name: (number of arguments, domain, independent scalar formula)
    "exp": (1, SIGNED, math.exp),
    "exp2": (1, SIGNED, lambda x: 2.0 ** x),
    "log": (1, POS, math.log),
    "log2": (1, POS, math.log2),
    "sqrt": (1, POS, math.sqrt),
    "rsqrt": (1, POS, lambda x: 1.0 / math.sqrt(x)),
    "sin": (1, SIGNED, math.sin),
    "cos": (1, SIGNED, math.cos),
    "tanh": (1, SIGNED, math.tanh),
    "asin": (1, UNIT, math.asin),
    "acos": (1, UNIT, math.acos),
    "atan": (1, SIGNED, math.atan),
    "sinh": (1, SIGNED, math.sinh),
    "cosh": (1, SIGNED, math.cosh),
    "asinh": (1, SIGNED, math.asinh),
    "acosh": (1, (1.0, 3.0), math.acosh),
    "atanh": (1, UNIT, math.atanh),
    "erf": (1, SIGNED, math.erf),
    "abs": (1, SIGNED, abs),
    "floor": (1, SIGNED, math.floor),
    "ceil": (1, SIGNED, math.ceil),
    "rint": (1, SIGNED, round),         # Python's round: halves to even, as rint
    "max": (2, SIGNED, max),
    "min": (2, SIGNED, min),
    "pow": (2, POS, math.pow),
    "fma": (3, SIGNED, lambda a, b, c: a * b + c),
    "sigmoid": (1, SIGNED, lambda x: 1.0 / (1.0 + math.exp(-x))),
}


def test_math_cases_cover_every_math_function():
    from taskdsl.lang.intrinsics import MATH
    assert set(MATH_CASES) == set(MATH)


@pytest.mark.parametrize("name", sorted(MATH_CASES))
def test_math_function(name):
    arity, (lo, hi), formula = MATH_CASES[name]
    inputs = [td.placeholder(f"M{k}", td.f32, ("N",)) for k in range(arity)]
    fn = getattr(td, name)
    out = td.compute(f"Math_{name}", ("N",), lambda i: fn(*(p[i] for p in inputs)))
    rng = np.random.default_rng(7)
    arrays = [rand(rng, (257,), lo, hi) for _ in range(arity)]
    got, = evaluate(inputs, [out], arrays)
    expected = np.array([formula(*(float(a[k]) for a in arrays)) for k in range(257)])
    assert got.dtype == np.float32
    np.testing.assert_allclose(got, expected, rtol=2e-6, atol=1e-6)


def test_erf_is_maths_erf_in_f64_at_the_ends_of_its_range():
    """erf has no numpy ufunc: the reference's (a numba ufunc) gives math.erf's values, the specials too."""
    x = np.array([0.0, -0.0, 1e-300, 0.5, -2.5, 6.0, 30.0, -30.0, np.inf, -np.inf, np.nan])
    F = td.placeholder("F", td.f64, ("N",))
    got, = evaluate([F], [td.compute("Erf64", ("N",), lambda i: td.erf(F[i]))], [x])
    np.testing.assert_array_equal(got, [math.erf(v) for v in x])


def test_math_on_integers():
    """Transcendentals of ints compute in f32; abs / max / min keep the integer type."""
    i = np.array([-3, -1, 0, 2, 5], np.int32)
    e = td.compute("IExp", ("N",), lambda k: td.exp(I1[k]))
    a = td.compute("IAbs", ("N",), lambda k: td.abs(I1[k]))
    mx = td.compute("IMax", ("N",), lambda k: td.max(I1[k], 1))
    mn = td.compute("IMin", ("N",), lambda k: td.min(I1[k], 1))
    got_e, got_a, got_mx, got_mn = evaluate([I1], [e, a, mx, mn], [i])
    assert got_e.dtype == np.float32 and got_a.dtype == got_mx.dtype == got_mn.dtype == np.int32
    np.testing.assert_allclose(got_e, [math.exp(v) for v in i.tolist()], rtol=1e-6)
    np.testing.assert_array_equal(got_a, [abs(v) for v in i.tolist()])
    np.testing.assert_array_equal(got_mx, [max(v, 1) for v in i.tolist()])
    np.testing.assert_array_equal(got_mn, [min(v, 1) for v in i.tolist()])


# ---------------------------------------------------------------- reductions
X3 = td.placeholder("X3", td.f32, ("P", "Q", "R"))
REDUCE_OPS = ["sum", "max", "min", "prod", "mean"]
NP_REDUCE = {"sum": np.sum, "max": np.max, "min": np.min, "prod": np.prod, "mean": np.mean}
# name: (output shape, reduce shape, fcompute(out axes..., reduce axes...), numpy axis, keepdims)
REDUCE_CONFIGS = {
    "last": (("P", "Q"), ("R",), lambda p, q, r: X3[p, q, r], 2, False),
    "first": (("Q", "R"), ("P",), lambda q, r, p: X3[p, q, r], 0, False),
    "middle_keepdims": (("P", 1, "R"), ("Q",), lambda p, z, r, q: X3[p, q + z, r], 1, True),
    "first_and_last": (("Q",), ("P", "R"), lambda q, p, r: X3[p, q, r], (0, 2), False),
    "all": ((), ("P", "Q", "R"), lambda p, q, r: X3[p, q, r], None, False),
    "all_keepdims": ((1, 1, 1), ("P", "Q", "R"), lambda a, b, c, p, q, r: X3[p, q, r], None, True),
}
REDUCTIONS = {(op, cfg): td.reduce(f"Red_{op}_{cfg}", out, red, f, op=op)
              for op in REDUCE_OPS for cfg, (out, red, f, _, _) in REDUCE_CONFIGS.items()}


@pytest.mark.parametrize("cfg", sorted(REDUCE_CONFIGS))
@pytest.mark.parametrize("op", REDUCE_OPS)
@settings(max_examples=5, deadline=None)
@given(p=st.integers(1, 6), q=st.integers(1, 6), r=st.integers(1, 6), seed=st.integers(0, 2**16))
@example(p=1, q=1, r=1, seed=0)
def test_reduce(op, cfg, p, q, r, seed):
    _, _, _, axis, keepdims = REDUCE_CONFIGS[cfg]
    t = REDUCTIONS[op, cfg]
    x = rand(np.random.default_rng(seed), (p, q, r), 0.5, 1.5) if op == "prod" else \
        rand(np.random.default_rng(seed), (p, q, r))
    got, = evaluate([X3], [t], [x])
    expected = NP_REDUCE[op](x.astype(np.float64), axis=axis, keepdims=keepdims)
    assert got.dtype == np.float32
    assert got.shape == np.shape(expected)
    np.testing.assert_allclose(got, expected, rtol=1e-5, atol=1e-6)


def test_reduce_body_with_arithmetic_and_a_producer():
    """sum_k exp(A[i,k] - B[k]) and a matrix-vector product read through a compute definition."""
    Y = td.compute("Yexp", ("M", "N"), lambda i, j: td.exp(A[i, j] - B[j]))
    S = td.reduce("Sexp", ("M",), ("N",), lambda i, k: Y[i, k], op="sum")
    MV = td.reduce("MV", ("M",), ("N",), lambda i, k: A[i, k] * B[k])
    AMAX = td.reduce("AMax", ("M",), ("N",), lambda i, k: td.abs(A[i, k]), op="max")
    assert [t.name for t in topological([S])] == ["A", "B", "Yexp", "Sexp"]
    rng = np.random.default_rng(3)
    a, b = rand(rng, (4, 37)), rand(rng, (37,))
    y, s, mv, amax = evaluate([A, B], [Y, S, MV, AMAX], [a, b])
    a64, b64 = a.astype(np.float64), b.astype(np.float64)
    np.testing.assert_allclose(y, np.exp(a64 - b64), rtol=1e-6)
    np.testing.assert_allclose(s, np.exp(a64 - b64).sum(axis=1), rtol=1e-5)
    np.testing.assert_allclose(mv, a64 @ b64, rtol=1e-5, atol=1e-5)
    np.testing.assert_array_equal(amax, np.abs(a).max(axis=1))


def test_reduce_of_a_body_without_the_reduce_axis_counts():
    """A body that ignores the reduced axis is broadcast over it: summing 1 counts."""
    cnt = td.reduce("Cnt", ("M",), ("N",), lambda i, k: ir.const(1))
    got, = evaluate([A], [cnt], [np.zeros((3, 11), np.float32)])
    assert got.dtype == np.int32
    np.testing.assert_array_equal(got, [11, 11, 11])


def test_integer_reductions_and_dtypes():
    X = td.placeholder("XI", td.i32, ("M", "N"))
    x = np.array([[-3, 7, 2, -1], [5, 5, -8, 0]], np.int32)
    outs = {op: td.reduce(f"RI_{op}", ("M",), ("N",), lambda i, k: X[i, k], op=op) for op in REDUCE_OPS}
    got = dict(zip(outs, evaluate([X], list(outs.values()), [x])))
    for op in ("sum", "max", "min", "prod"):
        assert outs[op].dtype == td.i32 and got[op].dtype == np.int32
        np.testing.assert_array_equal(got[op], [NP_REDUCE[op]([int(v) for v in row]) for row in x.tolist()])
    assert outs["mean"].dtype == td.f32 and got["mean"].dtype == np.float32   # the mean of ints is a float
    np.testing.assert_allclose(got["mean"], [1.25, 0.5])


def test_reduce_dtype_override():
    t = td.reduce("SumF64", ("M",), ("N",), lambda i, k: A[i, k], dtype=td.f64)
    a = np.full((2, 3), 0.1, np.float32)
    got, = evaluate([A], [t], [a])
    assert t.dtype == td.f64 and got.dtype == np.float64
    np.testing.assert_allclose(got, a.astype(np.float64).sum(axis=1), rtol=1e-7)


# ---------------------------------------------------------------- f16 inputs compute in f32
H = td.placeholder("H", td.f16, ("N",))


def test_f16_arithmetic_is_computed_in_f32():
    h = np.array([40000, -40000, 1.5, 65504], np.float16)
    twice = td.compute("Twice", ("N",), lambda i: H[i] + H[i])               # overflows in f16
    narrow = td.compute("Narrow", ("N",), lambda i: H[i] * 0.5, dtype=td.f16)
    copy = td.compute("Copy", ("N",), lambda i: H[i])
    t, n, c = evaluate([H], [twice, narrow, copy], [h])
    assert twice.dtype == td.f32 and t.dtype == np.float32
    np.testing.assert_array_equal(t, h.astype(np.float32) * 2)               # 80000, not inf
    assert np.isfinite(t).all()
    assert n.dtype == np.float16 and c.dtype == np.float16
    np.testing.assert_array_equal(n, (h.astype(np.float32) * 0.5).astype(np.float16))
    np.testing.assert_array_equal(c, h)


def test_f16_reduction_accumulates_in_f32():
    s = td.reduce("HSum", (), ("N",), lambda k: H[k])
    m = td.reduce("HMean", (), ("N",), lambda k: H[k], op="mean")
    mx = td.reduce("HMax", (), ("N",), lambda k: H[k], op="max")
    h = np.ones(4096, np.float16)
    h[0] = 3.0
    got_s, got_m, got_mx = evaluate([H], [s, m, mx], [h])
    assert s.dtype == m.dtype == mx.dtype == td.f32
    assert got_s.dtype == np.float32 and got_s.shape == ()
    assert float(got_s) == 4098.0                                            # f16 accumulation stalls at 2048
    assert float(got_m) == pytest.approx(4098.0 / 4096.0, rel=1e-6)
    assert float(got_mx) == 3.0


# ---------------------------------------------------------------- empty reductions and empty tensors
def test_empty_reduction_float_identities():
    X = td.placeholder("XE", td.f32, ("M", "N"))
    outs = {op: td.reduce(f"RE_{op}", ("M",), ("N",), lambda i, k: X[i, k], op=op)
            for op in ("sum", "max", "min", "prod")}
    got = dict(zip(outs, evaluate([X], list(outs.values()), [np.zeros((3, 0), np.float32)])))
    np.testing.assert_array_equal(got["sum"], np.zeros(3, np.float32))
    np.testing.assert_array_equal(got["max"], np.full(3, -np.inf, np.float32))
    np.testing.assert_array_equal(got["min"], np.full(3, np.inf, np.float32))
    np.testing.assert_array_equal(got["prod"], np.ones(3, np.float32))
    assert all(g.dtype == np.float32 and g.shape == (3,) for g in got.values())


@pytest.mark.parametrize("dtype", ["i8", "u8", "i16", "u16", "i32", "u32", "i64"])
def test_empty_reduction_integer_identities(dtype):
    """An empty int max / min is the values' type's lowest / highest value, in the kernels and the reference (an i8
    max over no elements gave 0: its i32 accumulator's INT_MIN, wrapped to i8; ONNX's ReduceMax says -128)."""
    X = td.placeholder("XEI", getattr(td, dtype), ("M", "N"))
    outs = {op: td.reduce(f"REI_{op}", ("M",), ("N",), lambda i, k: X[i, k], op=op)
            for op in ("sum", "max", "min", "prod")}
    info = np.iinfo(np.dtype(getattr(td, dtype).numpy))
    op = td.op([X], list(outs.values()))
    for result in (op(np.zeros((2, 0), info.dtype)), op.reference(np.zeros((2, 0), info.dtype))):
        got = dict(zip(outs, result))
        assert all(v.dtype == info.dtype for v in got.values())
        np.testing.assert_array_equal(got["sum"], [0, 0])
        np.testing.assert_array_equal(got["prod"], [1, 1])
        np.testing.assert_array_equal(got["max"], [info.min, info.min])
        np.testing.assert_array_equal(got["min"], [info.max, info.max])


def test_empty_outputs():
    X = td.placeholder("XZ", td.f32, ("M", "N"))
    y = td.compute("YZ", ("M", "N"), lambda i, j: td.exp(X[i, j]))
    s = td.reduce("SZ", ("M",), ("N",), lambda i, k: X[i, k], op="max")
    got_y, got_s = evaluate([X], [y, s], [np.zeros((0, 4), np.float32)])
    assert got_y.shape == (0, 4) and got_s.shape == (0,) and got_s.dtype == np.float32


# ---------------------------------------------------------------- size symbols and inputs
def test_size_symbols_are_shared_between_placeholders():
    a, b = np.zeros((3, 5), np.float32), np.zeros((5,), np.float32)
    assert bind_sizes([A, B], [a, b]) == {"M": 3, "N": 5}
    with pytest.raises(ValueError, match=r"'N'") as info:
        bind_sizes([A, B], [a, np.zeros((4,), np.float32)])
    assert "5" in str(info.value) and "4" in str(info.value)
    with pytest.raises(ValueError, match=r"size 'N'"):
        evaluate([A, B, C], [BCAST], [a, np.zeros((6,), np.float32), np.zeros((3, 1), np.float32)])
    with pytest.raises(ValueError, match=r"size 'M'"):
        evaluate([A, B, C], [BCAST], [a, b, np.zeros((2, 1), np.float32)])


def test_constant_dims_and_ranks_are_checked():
    a, b = np.zeros((3, 5), np.float32), np.zeros((5,), np.float32)
    with pytest.raises(ValueError, match=r"axis 1 of input 'C' must be 1"):
        evaluate([A, B, C], [BCAST], [a, b, np.zeros((3, 2), np.float32)])
    with pytest.raises(ValueError, match=r"'B' must be 1-d"):
        evaluate([A, B, C], [BCAST], [a, np.zeros((5, 1), np.float32), np.zeros((3, 1), np.float32)])


def test_wrong_number_of_inputs():
    a, b = np.zeros((3, 5), np.float32), np.zeros((5,), np.float32)
    with pytest.raises(TypeError, match=r"expected 3 input arrays \(A, B, C\), got 2"):
        evaluate([A, B, C], [BCAST], [a, b])


def test_output_reading_a_placeholder_that_is_not_an_input():
    with pytest.raises(ValueError, match=r"'C' is used by the outputs but is not one of the inputs"):
        evaluate([A, B], [BCAST], [np.zeros((3, 5), np.float32), np.zeros((5,), np.float32)])


def test_output_size_symbol_not_bound_by_any_input():
    """A definition whose shape names a size no input determines is an error that names the size."""
    y = td.compute("Unbound", ("Zsize",), lambda i: ir.const(1.0))
    with pytest.raises(ValueError, match=r"Zsize"):
        evaluate([A], [y], [np.zeros((2, 2), np.float32)])


@given(n=st.integers(0, 9), k=st.integers(0, 9))
@settings(max_examples=12, deadline=None)
def test_a_size_that_evaluates_negative_is_an_error_naming_it(n, k):
    """A valid convolution of X (N) by W (K) has N - K + 1 outputs; for K > N + 1 that is negative. The call
    allocated an array of a negative byte count (of arbitrary size) and reported a garbage axis; the reference
    failed in numpy. A reduction axis of negative size is refused the same way."""
    X = td.placeholder("X", td.f32, ("N",))
    W = td.placeholder("W", td.f32, ("K",))
    N, K = size_var("N"), size_var("K")
    valid = td.reduce("Valid", (N - K + 1,), ("K",), lambda i, j: X[i + j] * W[j])
    window = td.reduce("Window", (1,), (N - K,), lambda _, j: X[j])
    op = td.op([X, W], [valid, window])
    x, w = np.arange(n, dtype=np.float32), np.ones(k, np.float32)
    if k <= n:
        for got_valid, got_window in (op(x, w), op.reference(x, w)):
            np.testing.assert_allclose(got_valid, [x[i:i + k].sum() for i in range(n - k + 1)])
            np.testing.assert_allclose(got_window, [x[:n - k].sum()])
        return
    for run in (op, op.reference):
        with pytest.raises(ValueError, match=rf"'(Valid|Window)' would have a negative size: N - K( \+ 1)? = -\d+ "
                                             rf"for N={n}, K={k}"):
            run(x, w)


@given(m=st.integers(1, 7), n=st.integers(1, 7), seed=st.integers(0, 2**31 - 1))
@settings(max_examples=8, deadline=None)
def test_logical_and_bitwise_operators_mean_what_numpy_means(m, n, seed):
    """& | ^ ~ on comparisons are logical, on integers bitwise (numpy's meanings); Python's `and`, `or`, `if` and
    max() cannot work on an expression, and their error says what to write instead."""
    F = td.placeholder("F", td.f32, ("M", "N"))
    I = td.placeholder("I", td.i8, ("M", "N"))
    clipped = td.compute("Clipped", ("M", "N"), lambda i, j: ir.Select(
        (i > 0) & (F[i, j] < 0.5) | ~(j % 2 == 0) ^ (I[i, j] > 3), F[i, j], td.max(F[i, j], 0.25), td.f32))
    bits = td.compute("Bits", ("M", "N"), lambda i, j: (I[i, j] & 6) | ~I[i, j] ^ (j << 1))
    rng = np.random.default_rng(seed)
    f, x = rng.random((m, n), np.float32), rng.integers(-128, 128, (m, n), np.int8)
    i, j = np.indices((m, n))
    condition = (i > 0) & (f < 0.5) | ~(j % 2 == 0) ^ (x > 3)
    expected_bits = (x.astype(np.int32) & 6) | ~x.astype(np.int32) ^ (j << 1)     # int8 computes in i32
    op = td.op([F, I], [clipped, bits])
    for got_clipped, got_bits in (op(f, x), op.reference(f, x)):
        np.testing.assert_array_equal(got_clipped, np.where(condition, f, np.maximum(f, np.float32(0.25))))
        np.testing.assert_array_equal(got_bits, expected_bits)
    for body in (lambda i, j: F[i, j] if i > 0 else 0.0, lambda i, j: max(F[i, j], 0.0), lambda i, j: i > 0 and j > 0):
        with pytest.raises(TypeError, match=r"ir.Select\(c, x, y, dtype\), max/min as td.max/td.min, and "
                                            r"`and`/`or`/`not` as & \| ~"):
            td.compute("Bad", ("M", "N"), body)
    with pytest.raises(TypeError, match="'&' needs integer or bool operands, got f32"):
        td.compute("Bad", ("M", "N"), lambda i, j: F[i, j] & 1)


def test_powers_shifts_and_python_conversions_in_a_definition():
    """`**` is td.pow, as in a kernel's body (it was a TypeError); a constant shift count outside the type's
    bits is refused as a kernel's body refuses it (`>> -1` was accepted, and the kernel left its output unwritten);
    math.exp(x) and int(x) say what to write."""
    X = td.placeholder("X", td.f32, ("N",))
    I = td.placeholder("I", td.i32, ("N",))
    powers = td.compute("P", ("N",), lambda i: X[i] ** 2 + 2.0 ** X[i])
    x = np.linspace(-2, 3, 7, dtype=np.float32)
    op = td.op([X], [powers])
    for (got,) in (op(x), op.reference(x)):
        np.testing.assert_allclose(got, x.astype(np.float64) ** 2 + 2.0 ** x.astype(np.float64), rtol=1e-6)
    for count in (-1, 32, 40):
        with pytest.raises(ValueError, match=f"shift by {count}: the count must be in 0..31 for i32"):
            td.compute("Bad", ("N",), lambda i: I[i] >> count)
    shifted = td.op([I], [td.compute("S", ("N",), lambda i: (I[i] << 31) >> 3)])
    np.testing.assert_array_equal(shifted(np.arange(5, dtype=np.int32))[0],
                                  (np.arange(5, dtype=np.int32) << 31) >> 3)
    for body, words in ((lambda i: math.exp(X[i]), "td.cast(x, td.f32)"), (lambda i: int(X[i]), "td.cast(x, td.i32)"),
                        (lambda i: round(X[i]), "td.floor(x + 0.5)")):
        with pytest.raises(TypeError, match=r"no \w+ Python value \(it is only known when the kernel runs\): write "
                                            + re.escape(words)):
            td.compute("Bad", ("N",), body)


def test_numpy_functions_of_definition_values():
    """numpy's ufuncs with an IR meaning build it (`np.exp(x)` gave numpy's "loop of ufunc does not support
    argument 0"); numpy scalars keep working in operators and comparisons; the rest say what to write."""
    X = td.placeholder("X", td.f32, ("N",))
    I = td.placeholder("I", td.i32, ("N",))
    y = td.compute("Y", ("N",), lambda i: np.maximum(np.exp(X[i]) - np.sqrt(np.abs(X[i])), np.float32(1.5))
                   + np.power(np.floor(X[i]), 2) * np.float32(2))
    bits = td.compute("Bits", ("N",), lambda i: np.right_shift(np.bitwise_xor(I[i], 6), 1) - np.negative(I[i]))
    flags = td.compute("Flags", ("N",), lambda i: np.int64(0) < X[i])
    x = np.linspace(-3, 3, 11, dtype=np.float32)
    k = np.arange(-5, 6, dtype=np.int32)
    op = td.op([X, I], [y, bits, flags])
    x64 = x.astype(np.float64)
    for got_y, got_bits, got_flags in (op(x, k), op.reference(x, k)):
        np.testing.assert_allclose(got_y, np.maximum(np.exp(x64) - np.sqrt(np.abs(x64)), 1.5)
                                   + np.floor(x64) ** 2 * 2, rtol=1e-6)
        np.testing.assert_array_equal(got_bits, ((k ^ 6) >> 1) + k)
        np.testing.assert_array_equal(got_flags, x > 0)
    with pytest.raises(TypeError, match="numpy's equal of IR values outside a compute definition"):
        np.int64(3) == X[0]     # noqa: B015 (outside a definition `==` is identity, not a silent False)
    for body, words in ((lambda i: np.logaddexp(X[i], 1.0), "numpy's logaddexp does not take IR values"),
                        (lambda i: np.arange(3) * X[i], "multiply of an IR value and a ndarray"),
                        (lambda i: np.add.reduce(X[i]), "add.reduce does not take IR values")):
        with pytest.raises(TypeError, match=re.escape(words)):
            td.compute("Bad", ("N",), body)


# ---------------------------------------------------------------- definition errors
@pytest.mark.parametrize("bad", [-1, 2.5, True, None, (3, -2)])
def test_bad_shapes(bad):
    shape = bad if isinstance(bad, tuple) else ("M", bad)
    with pytest.raises(ValueError, match=r"non-negative ints or size-symbol names"):
        td.placeholder("Bad", td.f32, shape)
    with pytest.raises(ValueError, match=r"compute 'BadC'.*non-negative"):
        td.compute("BadC", shape, lambda *ix: ir.const(0.0))
    with pytest.raises(ValueError, match=r"reduce 'BadR'.*non-negative"):
        td.reduce("BadR", ("M",), shape, lambda *ix: ir.const(0.0))


def test_a_shape_computed_from_a_size_symbol():
    """td.cdiv(td.size_var("N"), 2) elements, every other one of A (N odd, even, 1 and 0), against numpy slicing; the
    symbol's name in td.cdiv is a TypeError that says to spell it td.size_var."""
    a = td.placeholder("Aodd", td.f32, ("N",))
    every_other = td.op([a], [td.compute("Yodd", (td.cdiv(td.size_var("N"), 2),), lambda i: a[2 * i])])
    for n in (7, 8, 1, 0):
        x = np.arange(n, dtype=np.float32)
        np.testing.assert_array_equal(every_other(x)[0], x[::2])
    assert td.size_var("N") is a.shape[0]
    with pytest.raises(TypeError, match=r"td.cdiv\('N', 2\).*td.size_var\('N'\)"):
        td.cdiv("N", 2)


def test_bad_reduce_op():
    with pytest.raises(ValueError, match=r"op must be one of sum, max, min, prod, mean, got 'avg'"):
        td.reduce("BadOp", ("M",), ("N",), lambda i, k: A[i, k], op="avg")


def test_bad_indexing_and_bodies():
    with pytest.raises(IndexError, match=r"'A' has 2 dimension\(s\) but is indexed with 1"):
        td.compute("BadIx", ("M",), lambda i: A[i])
    with pytest.raises(TypeError, match=r"indices of 'B' must be integers, got f32"):
        td.compute("BadFx", ("N",), lambda i: B[A[0, i]])
    with pytest.raises(TypeError, match=r"must return an expression"):
        td.compute("BadBody", ("N",), lambda i: "x")


def test_tensor_metadata():
    assert A.kind == "placeholder" and A.ndim == 2 and A.inputs == [] and not A.is_injective
    assert BCAST.is_injective and BCAST.kind == "compute" and BCAST.dtype == td.f32
    assert BCAST.inputs == [A, B, C]
    s = REDUCTIONS["sum", "first_and_last"]
    assert s.kind == "reduce" and not s.is_injective and s.op == "sum" and s.ndim == 1
    assert len(s.reduce_axes) == 2 and s.inputs == [X3]
    assert repr(A) == "<placeholder A: f32[M, N]>"
    assert repr(C) == "<placeholder C: f32[M, 1]>"
    assert size_var("M") is size_var("M") and A.shape[0] is size_var("M")


SM_X = td.placeholder("X", td.f32, ("M", "N"))
SM_MAX = td.reduce("Mx", ("M",), ("N",), lambda i, j: SM_X[i, j], op="max")
SM_E = td.compute("E", ("M", "N"), lambda i, j: td.exp(SM_X[i, j] - SM_MAX[i]))
SM_SUM = td.reduce("S", ("M",), ("N",), lambda i, j: SM_E[i, j], op="sum")
SOFTMAX = td.op([SM_X], [td.compute("P", ("M", "N"), lambda i, j: SM_E[i, j] / SM_SUM[i])])


@settings(max_examples=8, deadline=None)
@given(m=st.sampled_from([1, 3, 17]), n=st.sampled_from([1, 5, 64, 97]), calls=st.integers(2, 3),
       seed=st.integers(0, 2**16))
def test_repeated_op_calls_reuse_the_plan_on_fresh_arrays(m, n, calls, seed):
    """A call with the dtypes and shapes of an earlier one reuses its checked plan (fresh outputs each time)."""
    rng = np.random.default_rng(seed)
    outputs = []
    for _ in range(calls):
        x = rng.standard_normal((m, n)).astype(np.float32)
        p, = SOFTMAX(x)
        e = np.exp(x.astype(np.float64) - x.max(1, keepdims=True))
        np.testing.assert_allclose(p, e / e.sum(1, keepdims=True), rtol=1e-5, atol=1e-6)
        assert all(p is not q for q in outputs)
        outputs.append(p)
    assert any(key[0] == ((np.ndarray, np.dtype(np.float32), (m, n)),) for key in SOFTMAX._prepared)
    with pytest.raises(TypeError, match="dtype"):
        SOFTMAX(np.zeros((m, n), np.float64))          # another key: checked again, and refused


def test_select_takes_python_numbers():
    """`Select(cond, x, 0, td.i32)` (compute.md's conditional): the number becomes a constant of the select's
    type, for the reference evaluator and for the scheduled kernel alike."""
    x_in = td.placeholder("X", td.i32, ("R", "L"))
    relu = td.compute("Relu", ("R", "L"), lambda i, j: ir.Select(x_in[i, j] > 0, x_in[i, j], 0, td.i32))
    clamp = td.compute("Clamp", ("R", "L"), lambda i, j: ir.Select(relu[i, j] < 3, relu[i, j], 3, td.i32))
    assert isinstance(relu.body.b, ir.Const) and relu.body.b.dtype == td.i32
    x = np.arange(-6, 9, dtype=np.int32).reshape(3, 5)
    (got,) = evaluate([x_in], [clamp], [x])
    np.testing.assert_array_equal(got, np.clip(x, 0, 3))
    (ran,) = td.op([x_in], [clamp])(x)
    np.testing.assert_array_equal(ran, np.clip(x, 0, 3))


def test_equality_in_definitions_compares_elementwise():
    """`==` and `!=` in a definition's function compare elementwise, as `<` does (they were Python's identity
    test: the constant False / True, which kernel and reference agreed on)."""
    x = td.placeholder("X", td.i32, (8,))
    op = td.op([x], [td.compute("M", (8,), lambda i: x[i] % 3 == 0), td.compute("N", (8,), lambda i: 0 != x[i]),
                     td.reduce("K", (1,), (8,), lambda i, r: td.ir.Cast(x[r] == 2, td.i32), op="sum")])
    a = np.arange(8, dtype=np.int32)
    for m, n, k in (op(a), op.reference(a)):
        np.testing.assert_array_equal(m, a % 3 == 0)
        np.testing.assert_array_equal(n, a != 0)
        assert k.tolist() == [1]
    assert (x.buffer == x.buffer) is True and (x.axes == ()) is True     # outside definitions: Python's meaning


def test_the_reference_refuses_unguarded_reads_outside_a_tensor():
    """An unguarded read past the end is an error of the oracle (it clipped it into range, agreeing with nothing a
    kernel computes); reads a condition guards, in a select or behind `and`, are still evaluated safely."""
    a = td.placeholder("A", td.f32, ("N",))
    n = a.shape[0]
    diff = td.op([a], [td.compute("Y", ("N",), lambda i: a[i + 1] - a[i])])
    x = np.arange(8, dtype=np.float32) ** 2
    with pytest.raises(ValueError, match=r"reads A\[8\], outside its shape \(8,\)"):
        diff.reference(x)
    guarded = td.op([a], [td.compute("Y", ("N",), lambda i: ir.Select(i + 1 < n, a[i + 1] - a[i], 0.0, td.f32)),
                          td.compute("Z", ("N",), lambda i: ir.binary("and", i + 1 < n, a[i + 1] > 10.0))])
    y, z = guarded.reference(x)
    np.testing.assert_array_equal(y, np.append(np.diff(x), 0))
    np.testing.assert_array_equal(z, np.append(x[1:] > 10, False))
    for got, want in zip(guarded(x), (y, z)):
        np.testing.assert_array_equal(got, want)


def test_sixteen_bit_negation_rounding_and_empty_bool_reductions():
    """From a differential fuzz of the rule scheduler: -x of f16 / bf16 negated the cpu's bit patterns as integers;
    the reference did not round a cast or select to a 16-bit float; max of no bools was True; and a select of an
    f16 and a float did not compile for CUDA."""
    import ml_dtypes
    for dt, t in ((np.float16, td.f16), (ml_dtypes.bfloat16, td.bf16)):
        a = td.placeholder("A", t, ("N",))
        op = td.op([a], [td.compute("Y", ("N",), lambda i: -a[i]), td.reduce("S", (1,), ("N",), lambda i, k: -a[k])])
        x = np.array([1.0, 0.5, -2.0], dt)
        for y, total in (op(x), op.reference(x)):
            np.testing.assert_array_equal(np.asarray(y, np.float32), [-1.0, -0.5, 2.0])
            assert float(total[0]) == 0.5
    f = td.placeholder("F", td.f32, ("N",))
    rounded = td.op([f], [td.compute("R", ("N",), lambda i: ir.Cast(ir.Cast(f[i], td.f16), td.f32) - f[i])])
    v = np.array([0.1, 1.0, 3.14159], np.float32)
    want = v.astype(np.float16).astype(np.float32) - v
    np.testing.assert_array_equal(rounded.reference(v)[0], want)
    np.testing.assert_array_equal(rounded(v)[0], want)
    b = td.placeholder("B", td.boolean, ("M", "N"))
    anyof = td.op([b], [td.reduce("any", ("M",), ("N",), lambda i, k: b[i, k], op="max"),
                        td.reduce("all", ("M",), ("N",), lambda i, k: b[i, k], op="min")])
    empty = np.zeros((3, 0), bool)
    for got_any, got_all in (anyof(empty), anyof.reference(empty)):
        assert got_any.tolist() == [False] * 3 and got_all.tolist() == [True] * 3
    h = td.placeholder("H", td.f16, (4,))
    mixed = td.op([h], [td.compute("Z", (4,), lambda i: ir.Select(i + 1 < 4, h[i], 0.0, td.f32))])
    from taskdsl.backend.cuda.nvrtc import compile_cubin
    assert compile_cubin(mixed.source(np.ones(4, np.float16), target="cuda"), "sm_90")
    np.testing.assert_array_equal(mixed(np.ones(4, np.float16))[0], [1, 1, 1, 0])


def test_a_reduction_accumulates_in_the_wider_of_its_values_and_result_types():
    """`td.reduce(..., dtype=)`: kernel and reference both accumulate in the wider of the two types, then convert
    (they disagreed: the kernel summed then converted, the reference converted each value first)."""
    f = td.placeholder("F", td.f32, ("N",))
    i = td.placeholder("I", td.i32, ("N",))
    op = td.op([f, i], [td.reduce("s", (1,), ("N",), lambda _, k: f[k], dtype=td.i32),
                        td.reduce("w", (1,), ("N",), lambda _, k: i[k], dtype=td.i64),
                        td.reduce("m", (1,), ("N",), lambda _, k: i[k] % 16, op="mean", dtype=td.i32)])
    fv = np.array([0.5, 0.5, 0.75, 0.75, -1.0, -0.0], np.float32)
    iv = np.full(6, 2**30, np.int32)
    iv[0] = 3
    for s, w, m in (op(fv, iv), op.reference(fv, iv)):
        assert s.tolist() == [1] and w.tolist() == [int(iv.astype(np.int64).sum())]
        assert m.tolist() == [int((iv % 16).mean())]
    # floats into i32 accumulate in f32, as the kernels do (the reference summed in f64: 2^24 + 1 where the kernels
    # give 2^24; two terms, so in any order)
    rounding = td.op([f], [td.reduce("r", (1,), ("N",), lambda _, k: f[k], dtype=td.i32)])
    values = np.array([2 ** 24, 1], np.float32)
    assert rounding(values)[0].tolist() == rounding.reference(values)[0].tolist() == [2 ** 24]


@pytest.mark.parametrize("dtype", [td.u8, td.i8, td.i32])
@given(rows=st.lists(st.lists(st.sampled_from([-300.5, -2.75, 0.0, 2.5, 300.5, 1e10, -math.inf, math.nan, math.inf]),
                              min_size=1, max_size=3), min_size=1, max_size=6))
@settings(max_examples=15, deadline=None)
def test_a_float_reduction_into_an_integer_type_saturates(dtype, rows):
    """`td.reduce(..., dtype=<int>)` of floats: the kernels truncate, clamp to the type and give 0 for NaN (as a
    cast does); the reference's numpy astype wrapped (300.5 into u8 was 44) and gave junk for NaN."""
    K = max(len(r) for r in rows)
    x = np.array([r + [0.0] * (K - len(r)) for r in rows], np.float32)
    X = td.placeholder("X", td.f32, ("N", "K"))
    op = td.op([X], [td.reduce(op, ("N",), ("K",), lambda n, k: X[n, k], op=op, dtype=dtype)
                     for op in ("sum", "max")])
    low, high = np.iinfo(dtype.numpy).min, np.iinfo(dtype.numpy).max
    with np.errstate(invalid="ignore"):
        sums, maxima = x.astype(np.float64).sum(axis=1), x.max(axis=1)    # exact but where 1e10 saturates anyway
    for got_sum, got_max in (op(x), op.reference(x)):
        for got, value in ((got_sum, sums), (got_max, maxima)):
            expected = [0 if math.isnan(v) else low if v < low else high if v >= high + 1 else int(v) for v in value]
            assert got.tolist() == expected


@pytest.mark.parametrize("op", ["sum", "prod", "mean", "max", "min"])
@given(n=st.integers(1, 40), seed=st.integers(0, 2**31 - 1))
@settings(max_examples=5, deadline=None)
def test_reductions_of_bools_count(op, n, seed):
    """A sum of bools counts the true ones (i32), as numpy counts them; it was a bool, an 'any'."""
    A = td.placeholder("A", "bool", ("N",))
    S = td.reduce("S", (1,), ("N",), lambda i, k: A[k], op=op)
    a = np.random.default_rng(seed).random(n) < 0.5
    s, = td.op([A], [S])(a)
    expected = getattr(np, op)(a)
    assert s.dtype == {"sum": np.int32, "prod": np.int32, "mean": np.float32}.get(op, np.bool_)
    np.testing.assert_allclose(s, [expected], rtol=1e-6)


def test_type_names_mean_the_same_everywhere():
    """'float' is C's 32-bit float in compute definitions as in the graph layer (compute read it as numpy's f64)."""
    import taskdsl.graph as tg
    for name, dtype in (("float", td.f32), ("half", td.f16), ("double", td.f64), ("f32", td.f32),
                        ("int64", td.i64), (np.float64, td.f64), (np.dtype("uint8"), td.u8)):
        assert td.placeholder("P", name, (2,)).dtype == dtype
        assert tg.input("x", (2,), name).dtype == dtype
    with pytest.raises(TypeError, match="placeholder 'P': unknown type name 'f31'"):
        td.placeholder("P", "f31", (2,))


def test_reference_checks_inputs_as_the_kernels_do():
    """op.reference took f64 data for an f32 input and computed on it; the op refuses it, so the oracle
    and the kernels could disagree on what was computed."""
    B = td.placeholder("B", td.f32, ("N",))
    op = td.op([B], [td.compute("Y", ("N",), lambda i: B[i] * 2)])
    for run in (op, op.reference):
        with pytest.raises(TypeError, match=r"input 'B' must have dtype float32 \(f32\), got float64; convert it "
                                            r"with \.astype\(np\.float32\)"):
            run(np.arange(3.0))
        with pytest.raises(TypeError, match=r"got int64; convert it with np\.asarray\(x, np\.float32\)"):
            run([1, 2, 3])
        with pytest.raises(TypeError, match=r"takes 1 arrays \(B\), got 2"):
            run(np.zeros(3, np.float32), np.zeros(3, np.float32))


def test_abs_and_cast_in_definitions():
    """Python's abs() and td.cast work on a definition's values (abs: TypeError 'bad operand type for abs()';
    td.cast: 'can only be used inside a @td.kernel'), and a Select's dtype may be a name (an AttributeError)."""
    A = td.placeholder("A", td.f32, ("M", "K"))
    Y = td.compute("Y", ("M", "K"), lambda i, j: abs(A[i, j]))
    Z = td.compute("Z", ("M", "K"), lambda i, j: td.cast(A[i, j] * 10, "i32"))
    H = td.compute("H", ("M", "K"), lambda i, j: td.cast(A[i, j], np.float16))
    a = np.random.default_rng(0).standard_normal((3, 5)).astype(np.float32)
    y, z, h = td.op([A], [Y, Z, H])(a)
    np.testing.assert_array_equal(y, np.abs(a))
    np.testing.assert_array_equal(z, (a * np.float32(10)).astype(np.int32))
    np.testing.assert_array_equal(h, a.astype(np.float16))
    # a number is cast as a kernel casts it (a definition adding td.cast(5.7, "i32") was refused as outside one)
    assert td.cast(3.5, "i32") == 3 and td.cast(3e10, "i32") == 2**31 - 1 and td.cast(-1, "u8") == 255
    assert td.cast(3.5, "i32").dtype == np.int32
    W = td.compute("W", ("M", "K"), lambda i, j: A[i, j] + td.cast(5.7, "i32"))
    np.testing.assert_array_equal(td.op([A], [W])(a)[0], a + np.float32(5))
    with pytest.raises(RuntimeError, match="convert arrays with numpy"):
        td.cast([3.5], "i32")
    with pytest.raises(TypeError, match="td.cast: unknown type name 'f31'"):
        td.cast(A[0, 0], "f31")
    for dtype in ("float32", np.float32):
        P = td.compute("P", ("M", "K"), lambda i, j: ir.Select(i > 0, A[i, j], 0.0, dtype))
        np.testing.assert_array_equal(td.op([A], [P])(a)[0], np.where(np.arange(3)[:, None] > 0, a, 0))


@pytest.mark.parametrize("target", ["cpu", "cuda"])
def test_a_select_converts_operands_of_another_type_as_cast_does(target, request):
    """`ir.Select(c, x * 300.0, -5.0, td.u8)`: f32 operands into u8 saturate, as `td.cast` does; the cpu kernel
    saturated, the CUDA source converted as C does (undefined on a GPU) and the reference wrapped."""
    if target == "cuda":
        request.getfixturevalue("simulated_gpu")
    X = td.placeholder("X", td.f32, (3,))
    Y = td.compute("Y", (3,), lambda i: ir.Select(X[i] > 0.0, X[i] * 300.0, -5.0, td.u8))
    op = td.op([X], [Y])
    x = np.array([1.1, -2.3, 0.7], np.float32)
    want = np.clip(np.where(x > 0, x * np.float32(300.0), -5.0), 0, 255).astype(np.uint8)
    np.testing.assert_array_equal(op.reference(x)[0], want)
    got = op(td.to_device(x) if target == "cuda" else x)[0]
    np.testing.assert_array_equal(got.numpy() if target == "cuda" else got, want)


def _kernel_and_reference(op, *arrays) -> tuple:
    return op(*arrays)[0], op.reference(*arrays)[0]


def test_the_reference_rounds_f64_and_wide_integers_to_bf16_once():
    """ml_dtypes rounds through f32: 1 + 2^-8 + 2^-40 became 1.0 and 2^24 + 2^16 + 1 became 2^24 in the reference
    (kernels round once: 1 + 2^-7 and 2^24 + 2^17)."""
    for values, want in (([1 + 2**-8 + 2**-40, 3.0, -(1 + 2**-8 + 2**-40)], [1 + 2**-7, 3.0, -(1 + 2**-7)]),
                         ([2**24 + 2**16 + 1, 5, -(2**24 + 2**16 + 1)], [2**24 + 2**17, 5, -(2**24 + 2**17)])):
        dtype = td.f64 if isinstance(values[0], float) else td.i32
        X = td.placeholder("X", dtype, (3,))
        op = td.op([X], [td.compute("Y", (3,), lambda i: td.cast(X[i], td.bf16))])
        for got in _kernel_and_reference(op, np.array(values, dtype.numpy)):
            np.testing.assert_array_equal(np.asarray(got, np.float64), want)


@pytest.mark.parametrize("dtype", [td.i32, td.i64])
def test_min_floordiv_minus_one_is_zero_in_the_reference_as_in_kernels(dtype):
    X = td.placeholder("X", dtype, (3,))
    op = td.op([X], [td.compute("Y", (3,), lambda i: X[i] // -1)])
    for got in _kernel_and_reference(op, np.array([np.iinfo(dtype.numpy).min, 7, -7], dtype.numpy)):
        np.testing.assert_array_equal(got, [0, -7, 7])


def test_max_and_min_order_zeros_as_ieee_in_the_reference_as_in_kernels():
    """`td.max` of -0.0 and 0.0 is 0.0 and `td.min` -0.0, in either order (IEEE 754's maximum / minimum: a max whose
    result depends on its operands' order makes a reduction's depend on its schedule); numpy's maximum gives the
    second of two zeros. NaN wins either way."""
    A, B = td.placeholder("A", td.f32, (4,)), td.placeholder("B", td.f32, (4,))
    op = td.op([A, B], [td.compute("Y", (4,), lambda i: 1.0 / td.max(A[i], B[i])),
                        td.compute("Z", (4,), lambda i: 1.0 / td.min(B[i], A[i]))])
    a, b = np.array([-0.0, 0.0, -0.0, np.nan], np.float32), np.array([0.0, -0.0, -0.0, 1.0], np.float32)
    for got in (op(a, b), op.reference(a, b)):
        np.testing.assert_array_equal(got[0], [np.inf, np.inf, -np.inf, np.nan])
        np.testing.assert_array_equal(got[1], [-np.inf, -np.inf, -np.inf, np.nan])


def _ieee(a: float, b: float, larger: bool) -> float:
    """IEEE 754's maximum (`larger`) or minimum of two floats: a NaN if either is one, +0.0 above -0.0."""
    if math.isnan(a) or math.isnan(b):
        return math.nan
    if a == b == 0.0:
        negative = math.copysign(1.0, a) < 0, math.copysign(1.0, b) < 0
        return -0.0 if (all(negative) if larger else any(negative)) else 0.0
    return max(a, b) if larger else min(a, b)


_SPECIAL = [math.nan, -math.inf, -3.4028235e38, -1.5, -1e-45, -0.0, 0.0, 1e-45, 1.0, 1.5, 3.4028235e38, math.inf]


@pytest.mark.parametrize("invariant", [False, True], ids=["pairs", "one_b_throughout"])
def test_max_and_min_of_special_values_are_ieee_in_kernels(invariant):
    """`td.max` / `td.min` of every pair of NaN, infinities, zeros of both signs, subnormals and the largest
    floats, against IEEE 754's maximum / minimum computed here; with `invariant`, b is one value read by every
    element (a clamp's bound, whose tests on b alone the cpu hoists out of the loop)."""
    n = len(_SPECIAL)
    A = td.placeholder("A", td.f32, (n,))
    B = td.placeholder("B", td.f32, (1 if invariant else n,))
    b_of = (lambda i: B[0]) if invariant else (lambda i: B[i])
    op = td.op([A, B], [td.compute("Y", (n,), lambda i: td.max(A[i], b_of(i))),
                        td.compute("Z", (n,), lambda i: td.min(A[i], b_of(i)))])
    a = np.array(_SPECIAL, np.float32)
    for shift, b_value in enumerate(_SPECIAL):      # (pairs: b is a rotated, so every pair meets once)
        b = np.full(1, b_value, np.float32) if invariant else np.roll(a, shift)
        got_max, got_min = op(a, b)
        for k in range(n):
            bk = float(b[0] if invariant else b[k])
            for got, larger in ((got_max[k], True), (got_min[k], False)):
                want = np.float32(_ieee(float(a[k]), bk, larger))
                assert (np.isnan(got) and np.isnan(want)) or (got == want and np.signbit(got) == np.signbit(want)), \
                    f"{'max' if larger else 'min'}({a[k]}, {bk}) = {got}, want {want}"


@pytest.mark.parametrize("values, op_name, want", [(td.i64, "min", -1), (td.boolean, "min", 1),
                                                   (td.f32, "max", np.iinfo(np.int32).min)])
def test_an_empty_min_or_max_into_i32_gives_the_kernels_start_in_the_reference(values, op_name, want):
    """Over no elements a min or max gives what the kernels start from, the accumulator's identity, converted:
    i64's MAX wraps to -1 in i32, a min of bools starts True, -inf saturates to i32's MIN (the reference gave i32's
    identity for the first two)."""
    L = td.placeholder("L", values, ("N", "R"))
    op = td.op([L], [td.reduce("S", ("N",), ("R",), lambda i, r: L[i, r], op=op_name, dtype=td.i32)])
    for got in _kernel_and_reference(op, np.zeros((3, 0), values.numpy)):
        np.testing.assert_array_equal(got, [want] * 3)


def test_dropped_definitions_are_freed():
    """Every tensor ever defined stayed in compute's owner table: a session making ops and dropping them grew
    without bound. A definition still reads its producers, also ones no name holds."""
    import gc
    import importlib
    compute = importlib.import_module("taskdsl.compute")       # (td.compute is the function)

    def made_and_run():
        A = td.placeholder("A", td.f32, ("M",))
        op = td.op([A], [td.reduce("S", (), ("M",), lambda k: td.compute("Y", ("M",), lambda i: A[i] * 2.0)[k])])
        np.testing.assert_array_equal(op(np.arange(4, dtype=np.float32))[0], 12.0)

    made_and_run()
    gc.collect()
    before = len(compute._OWNER)
    for _ in range(20):
        made_and_run()
    gc.collect()
    assert len(compute._OWNER) == before
    A = td.placeholder("A", td.f32, (3,))
    Y = td.compute("Y", (3,), lambda i: A[i] + td.placeholder("C", td.f32, (3,))[i])   # C: held by Y's body only
    gc.collect()
    assert [t.name for t in Y.inputs] == ["A", "C"]


def test_an_ops_cuda_source_is_of_the_kernels_a_gpu_launches():
    """On the cpu target `op.source(target="cuda")` gave the cpu plan's kernels (row spans, a thread per output, one
    thread a block): CI's NVRTC check of the CUDA source never saw the GPU's rows, warp or block kernels."""
    x_ = td.placeholder("X", "float32", ("M", "N"))
    y = td.compute("Y", ("M", "N"), lambda i, j: x_[i, j] * 2.0)
    s = td.reduce("S", ("M",), ("N",), lambda i, k: x_[i, k])
    op = td.op([x_], [y, s])
    x = np.ones((4, 600), np.float32)
    names = lambda target: re.findall(r"__global__ void(?: __launch_bounds__\(\d+\))? (\w+)",
                                      op.source(x, target=target))
    from taskdsl.runtime.config import target_scope
    with target_scope("cpu"):
        assert names("cuda") == ["Y_rows", "S_reduce_block"]         # docs/compute.md's GPU strategies
        op(x)
        assert [k.name for k in op.kernels][0] == "Y_row_spans"      # what the cpu launches


def test_max_and_min_reductions_order_zeros_as_ieee_in_the_reference_as_in_kernels():
    """A float max reduction of zeros is 0.0 where any is 0.0 and a min -0.0 where any is -0.0, whatever their order
    (numpy's max gives the first of equal values), in the reference as in kernels; a NaN wins."""
    X = td.placeholder("X", td.f32, (4, "R"))
    op = td.op([X], [td.reduce("H", (4,), ("R",), lambda i, r: X[i, r], op="max"),
                     td.reduce("L", (4,), ("R",), lambda i, r: X[i, r], op="min")])
    x = np.array([[-0.0, 0.0, -0.0], [0.0, -0.0, -1.0], [-0.0, -0.0, -0.0], [np.nan, 0.0, -0.0]], np.float32)
    for high, low in (op(x), op.reference(x)):
        np.testing.assert_array_equal(1.0 / high[:3], [np.inf, np.inf, -np.inf])
        np.testing.assert_array_equal(1.0 / low[:2], [-np.inf, -1.0])
        assert low[2] == 0 and np.signbit(low[2]) and np.isnan(high[3]) and np.isnan(low[3])


def test_nested_nan_to_zero_is_written_once_a_level_in_both_targets_sources():
    """`x + 0 if x == x else 0` (the graph's nan_to_zero, one per quantize-dequantize pair of a QDQ epilogue) nested
    four deep: each level is one call in the cpu and CUDA sources, X read once (the select's form wrote X 3^4 = 81
    times), and the values are the reference's: NaN to 0, -0.0 to 0.0 at every level."""
    X = td.placeholder("X", td.f32, ("N",))

    def nan_to_zero(v):
        return ir.Select(ir.binary("==", v, v), v + 0.0, ir.const(0.0), td.f32)

    def level(v, depth):
        return v if depth == 0 else nan_to_zero(level(v, depth - 1) * 2.0 - 1.0)

    op = td.op([X], [td.compute("Y", ("N",), lambda i: level(X[i], 4))])
    x = np.array([np.nan, -0.0, 0.0, 0.5, -np.inf, np.inf, 3.0e38, -1.5], np.float32)
    cpu, cuda = op.source(x, target="cpu"), op.source(x, target="cuda")
    assert cpu.count("rt.nan_to_zero(") == 4 and cuda.count("td_nan_to_zero(") == 4 + 1    # (+ the helper)
    assert len(re.findall(r"\bX\[", cpu)) == 1 and len(re.findall(r"\bX\[", cuda)) == 1
    got, want = _kernel_and_reference(op, x)
    np.testing.assert_array_equal(got, want)
    np.testing.assert_array_equal(np.signbit(got), np.signbit(want))


@pytest.mark.parametrize("kept_zero, else_zero", [(-0.0, 0.0), (0.0, -0.0)])
def test_a_nan_to_zero_lookalike_with_a_negative_zero_keeps_its_own_meaning(kept_zero, else_zero):
    """`x + -0.0 if x == x else 0.0` keeps a -0.0 x, and `... else -0.0` gives -0.0 for a NaN: neither is the
    graph's nan_to_zero, so neither is written as its call; kernels give the reference's values and zero signs."""
    X = td.placeholder("X", td.f32, (4,))

    def body(i):
        return ir.Select(ir.binary("==", X[i], X[i]), X[i] + ir.const(kept_zero), ir.const(else_zero), td.f32)

    assert ir.nan_to_zero_operand(body(ir.const(0))) is None
    op = td.op([X], [td.compute("Y", (4,), body)])
    x = np.array([np.nan, -0.0, 0.0, 2.5], np.float32)
    got, want = _kernel_and_reference(op, x)
    np.testing.assert_array_equal(got, want)
    np.testing.assert_array_equal(np.signbit(got), np.signbit(want))
    assert (np.signbit(want[0]), np.signbit(want[1])) == (math.copysign(1, else_zero) < 0,
                                                          math.copysign(1, kept_zero) < 0)
