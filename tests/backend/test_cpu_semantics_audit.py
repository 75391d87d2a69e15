"""The cpu target's arithmetic at the edges the DSL reference promises, against independent oracles.

Each kernel is small; the expected values come from Python's integers, numpy with explicit dtypes or
hand-worked bit patterns, never from taskdsl itself.
"""
import numpy as np
from hypothesis import example, given, settings
from hypothesis import strategies as st

import taskdsl as td
from taskdsl import threadIdx

OPTIMIZED = True   # the optimized cpu path; each test also runs its kernels under td.fast_compile

FEW = settings(max_examples=8, deadline=None)
LANES = 64


def both_modes(kernel, *args):
    """Run `kernel` on the optimized path and under td.fast_compile (which calls the support helpers): one
    result for both, as the copies of the arrays each run writes must agree bit for bit."""
    results = []
    for fast in (False, True):
        td.fast_compile(fast)
        copies = [a.copy() if isinstance(a, np.ndarray) else a for a in args]
        kernel(*copies)
        results.append(copies)
    td.fast_compile(False)
    for a, b in zip(*results):
        if isinstance(a, np.ndarray):
            np.testing.assert_array_equal(a.view(np.uint8), b.view(np.uint8))
    return results[0]


# --------------------------------------------------------------------------- integer division
def python_floordiv(a: int, b: int, bits: int | None = None) -> int:
    """a // b as the reference promises it on the cpu target: floor division, 0 for a zero divisor and for
    MIN // -1 of a signed type of `bits` bits."""
    if b == 0 or (bits is not None and a == -(1 << (bits - 1)) and b == -1):
        return 0
    return a // b


def python_mod(a: int, b: int) -> int:
    return 0 if b == 0 else a % b


@td.kernel(grid=1, block=LANES)
def signed_divmod(A: td.i32[LANES], B: td.i32[LANES], C: td.i64[LANES], D: td.i64[LANES],
                  Q: td.i32[3, LANES], R: td.i32[LANES], Q64: td.i64[2, LANES], R64: td.i64[LANES]):
    t = threadIdx.x
    a = A[t]
    Q[0, t] = a // B[t]
    q = a // B[t]               # an i32 variable holds the quotient
    Q[1, t] = q + 0
    Q[2, t] = a // -1           # a constant divisor
    R[t] = a % B[t]
    Q64[0, t] = C[t] // D[t]
    Q64[1, t] = td.i64(a) // td.i64(B[t])      # i32 operands widened: MIN32 // -1 is 2**31 in i64
    R64[t] = C[t] % D[t]


I32 = st.integers(-2**31, 2**31 - 1)
I64 = st.integers(-2**63, 2**63 - 1)
EDGE_DIVISORS = st.sampled_from([-1, 0, 1, -2, 2, 7, -7])


@FEW
@given(a=st.lists(I32 | st.just(-2**31), min_size=LANES, max_size=LANES),
       b=st.lists(I32 | EDGE_DIVISORS, min_size=LANES, max_size=LANES),
       c=st.lists(I64 | st.just(-2**63), min_size=LANES, max_size=LANES),
       d=st.lists(I64 | EDGE_DIVISORS, min_size=LANES, max_size=LANES))
@example(a=[-2**31] * LANES, b=[-1] * LANES, c=[-2**63] * LANES, d=[-1] * LANES)
def test_signed_division_by_minus_one_and_zero_gives_zero_as_documented(a, b, c, d):
    """'An integer division or remainder by zero, and MIN // -1 of a signed type, give 0 on the cpu target':
    i32 arithmetic is done in int64 on the cpu target, where -2**31 // -1 is 2**31 (stored: -2**31)."""
    a, b = np.array(a, np.int32), np.array(b, np.int32)
    c, d = np.array(c, np.int64), np.array(d, np.int64)
    q, r = np.zeros((3, LANES), np.int32), np.zeros(LANES, np.int32)
    q64, r64 = np.zeros((2, LANES), np.int64), np.zeros(LANES, np.int64)
    q, r, q64, r64 = both_modes(signed_divmod, a, b, c, d, q, r, q64, r64)[4:]
    want = [python_floordiv(int(x), int(y), 32) for x, y in zip(a, b)]
    np.testing.assert_array_equal(q[0], want)
    np.testing.assert_array_equal(q[1], want)
    np.testing.assert_array_equal(q[2], [python_floordiv(int(x), -1, 32) for x in a])
    np.testing.assert_array_equal(r, [python_mod(int(x), int(y)) for x, y in zip(a, b)])
    np.testing.assert_array_equal(q64[0], [python_floordiv(int(x), int(y), 64) for x, y in zip(c, d)])
    np.testing.assert_array_equal(q64[1], [python_floordiv(int(x), int(y), 64) for x, y in zip(a, b)])
    np.testing.assert_array_equal(r64, [python_mod(int(x), int(y)) for x, y in zip(c, d)])


@td.kernel(grid=1, block=LANES)
def unsigned_divmod(U: td.u32[LANES], V: td.u32[LANES], W: td.u64[LANES], X: td.u64[LANES],
                    Q: td.u32[2, LANES], Q64: td.u64[2, LANES]):
    t = threadIdx.x
    Q[0, t] = U[t] // V[t]
    Q[1, t] = U[t] % V[t]
    Q64[0, t] = W[t] // X[t]
    Q64[1, t] = W[t] % X[t]


def test_unsigned_division_by_zero_gives_zero():
    rng = np.random.default_rng(3)
    u = rng.integers(0, 2**32, LANES, dtype=np.uint64).astype(np.uint32)
    v = rng.integers(0, 2**32, LANES, dtype=np.uint64).astype(np.uint32)
    w = rng.integers(0, 2**64, LANES, dtype=np.uint64)
    x = rng.integers(0, 2**64, LANES, dtype=np.uint64)
    v[::3], x[::3] = 0, 0
    v[1::5], x[1::5] = 2**32 - 1, 2**64 - 1
    w[:4] = [2**64 - 1, 2**63, 2**63 + 1, 0]
    q, q64 = np.zeros((2, LANES), np.uint32), np.zeros((2, LANES), np.uint64)
    q, q64 = both_modes(unsigned_divmod, u, v, w, x, q, q64)[4:]
    np.testing.assert_array_equal(q[0], [python_floordiv(int(p), int(s)) for p, s in zip(u, v)])
    np.testing.assert_array_equal(q[1], [python_mod(int(p), int(s)) for p, s in zip(u, v)])
    np.testing.assert_array_equal(q64[0], [python_floordiv(int(p), int(s)) for p, s in zip(w, x)])
    np.testing.assert_array_equal(q64[1], [python_mod(int(p), int(s)) for p, s in zip(w, x)])


def test_floor_division_by_a_size_or_positive_constant_needs_no_overflow_guard():
    """The MIN // -1 guard costs a compare and a select: only divisions whose divisor may be -1 pay for it."""
    @td.kernel(grid=1, block=LANES)
    def divide(A: td.i32["N"], B: td.i32[LANES], Out: td.i32[3, LANES]):
        t = threadIdx.x
        Out[0, t] = A[t] // N
        Out[1, t] = A[t] // 7
        Out[2, t] = A[t] // B[t]

    a = np.arange(-LANES, LANES, 2, dtype=np.int32)
    b = np.full(LANES, -1, np.int32)
    source = divide.source(a, b, np.zeros((3, LANES), np.int32), target="cpu")
    assert source.count("floordiv_i32") == 1
    out = np.zeros((3, LANES), np.int32)
    divide(a, b, out)
    np.testing.assert_array_equal(out, [[int(x) // LANES for x in a], [int(x) // 7 for x in a], -a])


# --------------------------------------------------------------------------- scalar parameters
@td.kernel(grid=1, block=1)
def half_scalar(h: td.f16, Out: td.f32[2], H: td.f16[1]):
    Out[0] = h
    Out[1] = h * 2.0
    H[0] = -h


@FEW
@given(value=st.floats(-70000.0, 70000.0) | st.sampled_from([0.1, 65504.0, 2**-24, float("inf")]))
def test_f16_scalar_parameters_are_passed_as_their_bits(value):
    """An f16 scalar (the reference: a scalar may have any dtype) reached numba as a float16, which it cannot
    type; it travels as its bit pattern, as f16 arrays do. (No -0.0: a call's cached binding is keyed by the
    scalars' values, and -0.0 == 0.0 there.)"""
    with np.errstate(over="ignore"):
        h = np.float16(value) + np.float16(0.0)     # -0.0 -> 0.0
    for _ in range(2):      # the second call takes the prepared launch, with the binding's scalars
        out, neg = np.zeros(2, np.float32), np.zeros(1, np.float16)
        half_scalar(h, out, neg)
        np.testing.assert_array_equal(out, [np.float32(h), np.float32(h) * np.float32(2.0)])
        assert neg.view(np.uint16)[0] == np.float16(h).view(np.uint16) ^ 0x8000


# --------------------------------------------------------------------------- 16-bit floats, bit for bit
@td.kernel(grid=lambda N: td.cdiv(N, 256), block=256)
def half_conversions(H: td.f16["N"], X: td.f32["N"], D: td.f64["N"], HF: td.f32["N"], BF: td.f32["N"],
                     XH: td.f16["N"], XB: td.bf16["N"], DH: td.f16["N"]):
    i = td.blockIdx.x * 256 + threadIdx.x
    if i < N:
        HF[i] = H[i]
        BF[i] = td.bf16(X[i])       # an f32 rounded to bf16 and back
        XH[i] = X[i]
        XB[i] = X[i]
        DH[i] = D[i]


def test_16_bit_float_conversions_match_numpy_and_ml_dtypes_bit_for_bit():
    """Every f16 bit pattern to f32; f32s of random bit patterns and around the f16 range's edges (subnormals,
    the largest finite value, ties) to f16 and bf16, rounded to nearest-even; f64s to f16, rounded once."""
    import ml_dtypes
    n = 65536
    h = np.arange(n, dtype=np.uint16).view(np.float16)
    rng = np.random.default_rng(11)
    bits = rng.integers(0, 2**32, n, dtype=np.uint64).astype(np.uint32)
    edges = np.array([65504.0, 65519.99, 65520.0, 2**-24, 2**-25, 2**-25 * 1.0001, 3 * 2**-25, 2**-14, 1 + 2**-11,
                      1 + 3 * 2**-11, 3.3895314e38, 3.4028235e38, 1e-45, -0.0, np.inf, -np.inf], np.float32)
    bits[:len(edges)] = edges.view(np.uint32)
    bits[len(edges):n // 2] = rng.integers(0x33000000, 0x47800000, n // 2 - len(edges))     # f16's range
    x = bits.view(np.float32)
    d = x.astype(np.float64) * (1 + rng.uniform(-2**-20, 2**-20, n))
    d[:len(edges)] = edges
    outs = [np.zeros(n, np.float32), np.zeros(n, np.float32), np.zeros(n, np.float16), np.zeros(n, ml_dtypes.bfloat16),
            np.zeros(n, np.float16)]
    hf, bf, xh, xb, dh = both_modes(half_conversions, h, x, d, *outs)[3:]
    with np.errstate(all="ignore"):
        want = [h.astype(np.float32), x.astype(ml_dtypes.bfloat16).astype(np.float32), x.astype(np.float16),
                x.astype(ml_dtypes.bfloat16), d.astype(np.float16)]
    for name, got, ref in zip(["f16->f32", "f32->bf16->f32", "f32->f16", "f32->bf16", "f64->f16"],
                              [hf, bf, xh, xb, dh], want):
        got32, ref32 = got.astype(np.float32), ref.astype(np.float32)
        nan = np.isnan(ref32)
        assert np.isnan(got32[nan]).all(), name       # a NaN's sign and payload are not promised
        np.testing.assert_array_equal(got32.view(np.uint32)[~nan], ref32.view(np.uint32)[~nan], err_msg=name)


@FEW
@given(n=st.sampled_from([8, 9, 63, 1031, 4099]), at=st.integers(0, 10**6), op=st.sampled_from(["max", "min"]),
       seed=st.integers(0, 2**16))
def test_a_nan_anywhere_reaches_an_operators_max_and_min(n, at, op, seed):
    """The optimized 'thread' max / min keep each lane's extreme by plain compares and note NaNs beside them: a NaN
    in any lane, the tail or a split's chunk is the result, as in numpy; the other rows are exact."""
    from stdlib_ops import reduce
    x = np.random.default_rng(seed).uniform(-3, 3, (3, n)).astype(np.float32)
    x[1, at % n] = np.nan
    x[2, at % n] = np.inf if op == "max" else -np.inf
    for axis in (1, None):
        np.testing.assert_array_equal(getattr(reduce, op)(x, axis=axis), getattr(np, op)(x, axis=axis))
    big = np.repeat(x[1:2], 1 + 2**20 // n, axis=0)        # one output of over 2^20 elements: split on the cpu
    assert np.isnan(getattr(reduce, op)(big))


# --------------------------------------------------------------------------- selects
@td.kernel(grid=1, block=LANES)
def selects(A: td.f32[LANES], B: td.i32[LANES], S: td.f32[1], Out: td.f32[4, LANES], Q: td.i32[LANES]):
    t = threadIdx.x
    Out[0, t] = (A[t] * 2.0 + 1.0) if A[t] == A[t] else S[0]     # a NaN to S[0]: both sides safe everywhere
    Out[1, t] = A[t - 1] if t >= 1 else -1.0      # a padding's border: A[-1] must not be read
    Out[2, t] = A[t] if B[t] > 0 else 0.0         # A[t] is not read by the condition
    Out[3, t] = A[t + 1] if t < LANES - 1 and A[t + 1] > 0 else 0.0   # the condition reads A[LANES] only past `and`
    Q[t] = (B[t] // (B[t] - 3)) if B[t] != 3 else 7       # an integer division is never made for the lane it skips


@given(a=st.lists(st.floats(-1e6, 1e6, width=32) | st.just(np.nan), min_size=LANES, max_size=LANES),
       b=st.lists(st.integers(-5, 5), min_size=LANES, max_size=LANES))
@FEW
def test_a_select_computes_both_sides_only_where_both_are_safe_everywhere(a, b):
    """A select whose sides read only what its condition always reads, or constant elements, and divide no integers
    is one `rt.select` (a branch in a loop keeps it scalar); the others stay branches, and read nothing out of
    bounds (debug mode checks every load). Values against numpy."""
    a, b, s = np.array(a, np.float32), np.array(b, np.int32), np.array([-2.5], np.float32)
    out, q = np.zeros((4, LANES), np.float32), np.zeros(LANES, np.int32)
    assert selects.source(a, b, s, out, q, target="cpu").count("rt.select(") == 1
    td.debug(True)
    try:
        selects(a, b, s, out.copy(), q.copy())
    finally:
        td.debug(False)
    out, q = both_modes(selects, a, b, s, out, q)[3:]
    with np.errstate(all="ignore"):
        np.testing.assert_array_equal(out[0], np.where(a == a, a * np.float32(2) + np.float32(1), s[0]))
        np.testing.assert_array_equal(out[1], np.concatenate([[-1.0], a[:-1]]).astype(np.float32))
        np.testing.assert_array_equal(out[2], np.where(b > 0, a, np.float32(0)))
        ahead = np.append(a[1:], np.float32(0))
        np.testing.assert_array_equal(out[3], np.where(ahead > 0, ahead, np.float32(0)))
        np.testing.assert_array_equal(q, [7 if x == 3 else x // (x - 3) for x in b.tolist()])
