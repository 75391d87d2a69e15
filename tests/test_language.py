"""Every construct of the kernel language, run on the cpu target and compared with numpy.

Each kernel is small and checks one construct against a reference computed here with
numpy (or plain Python), never with taskdsl itself. Hypothesis draws the sizes; a kernel
is compiled once per block shape, so the block shapes are fixed and only sizes vary.
"""
import math

import numpy as np
import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

import taskdsl as td
from taskdsl import blockDim, blockIdx, f32, f64, gridDim, i32, repeat, spatial, threadIdx

from .kernels import histogram, warp_sums
from .program_files import load_program

GPU_TWINS = True   # every test also runs as a @gpu twin on the cuda target (conftest.py)
OPTIMIZED = True   # the optimized cpu path (unrolled register tiles in locals), not td.fast_compile

FEW = settings(max_examples=6, deadline=None)
SIZES = st.integers(1, 300) | st.sampled_from([1, 2, 31, 32, 33, 63, 64, 65, 127, 257])


def rand_f32(rng, *shape, low=-2.0, high=2.0):
    return rng.uniform(low, high, size=shape).astype(np.float32)


# --------------------------------------------------------------------------- elementwise + guard
@td.kernel(grid=lambda N: td.cdiv(N, 64), block=64)
def axpb(X: f32["N"], Y: f32["N"]):
    i = blockIdx.x * 64 + threadIdx.x
    if i < N:
        Y[i] = X[i] * 2.0 + 1.0


@FEW
@given(n=SIZES, seed=st.integers(0, 2**16))
@example(n=1, seed=0)
@example(n=64, seed=1)
@example(n=65, seed=2)
def test_elementwise_with_bounds_guard(n, seed):
    rng = np.random.default_rng(seed)
    x = rand_f32(rng, n)
    y = np.full(n, np.nan, np.float32)
    axpb(x, y)
    np.testing.assert_allclose(y, x * np.float32(2) + np.float32(1), rtol=1e-6)


def test_grid_of_zero_blocks_does_nothing():
    x = np.zeros(0, np.float32)
    y = np.zeros(0, np.float32)
    axpb(x, y)  # cdiv(0, 64) == 0 blocks: a no-op, not an error
    assert y.shape == (0,)


def test_tail_elements_beyond_n_are_untouched():
    # a view of the first 70 elements of a bigger buffer: the guard keeps the 2nd block in bounds
    x = np.arange(70, dtype=np.float32)
    y = np.full(70, -5.0, np.float32)
    axpb(x, y)
    np.testing.assert_array_equal(y, x * 2 + 1)


def test_non_contiguous_arguments_are_read_and_written_in_place():
    base = np.arange(200, dtype=np.float32)
    x = base[::2]                        # a strided input
    out = np.zeros((100, 3), np.float32)
    axpb(x, out[:, 1])                   # a strided output: writes must land in `out`
    np.testing.assert_array_equal(out[:, 1], base[::2] * 2 + 1)
    np.testing.assert_array_equal(out[:, [0, 2]], 0)
    m = np.asfortranarray(np.arange(35, dtype=np.float32).reshape(5, 7))
    t = np.zeros((7, 5), np.float32)
    transpose_2d(m, t)
    np.testing.assert_array_equal(t, np.arange(35).reshape(5, 7).T)


# --------------------------------------------------------------------------- math functions
@td.kernel(grid=lambda N: td.cdiv(N, 64), block=64)
def math_all(X: f32["N"], Y: f32["N"], Out: f32[24, "N"]):
    i = blockIdx.x * 64 + threadIdx.x
    if i < N:
        x = X[i]
        y = Y[i]
        Out[0, i] = td.exp(y)
        Out[1, i] = td.log(x)
        Out[2, i] = td.sqrt(x)
        Out[3, i] = td.rsqrt(x)
        Out[4, i] = td.tanh(y)
        Out[5, i] = td.erf(y)
        Out[6, i] = td.abs(y)
        Out[7, i] = td.max(x, y)
        Out[8, i] = td.min(x, y)
        Out[9, i] = td.pow(x, y)
        Out[10, i] = td.sin(y)
        Out[11, i] = td.cos(y)
        Out[12, i] = td.exp2(y)
        Out[13, i] = td.log2(x)
        Out[14, i] = td.floor(y * 3.0)
        Out[15, i] = td.ceil(y * 3.0)
        Out[16, i] = td.sigmoid(y)
        Out[17, i] = td.fma(x, y, 0.5)
        Out[18, i] = max(x, y)
        Out[19, i] = min(x, y)
        Out[20, i] = abs(y)
        Out[21, i] = x ** y
        Out[22, i] = y ** 2
        Out[23, i] = y / x


def math_reference(x, y):
    x64, y64 = x.astype(np.float64), y.astype(np.float64)
    erf = np.vectorize(math.erf)
    y3 = (y * np.float32(3.0)).astype(np.float64)  # the kernel multiplies in f32
    return [np.exp(y64), np.log(x64), np.sqrt(x64), 1 / np.sqrt(x64), np.tanh(y64), erf(y64), np.abs(y64),
            np.maximum(x64, y64), np.minimum(x64, y64), x64 ** y64, np.sin(y64), np.cos(y64), 2.0 ** y64,
            np.log2(x64), np.floor(y3), np.ceil(y3), 1 / (1 + np.exp(-y64)), x64 * y64 + 0.5,
            np.maximum(x64, y64), np.minimum(x64, y64), np.abs(y64), x64 ** y64, y64 ** 2, y64 / x64]


@FEW
@given(n=SIZES, seed=st.integers(0, 2**16))
@example(n=1, seed=3)
def test_math_functions(n, seed):
    rng = np.random.default_rng(seed)
    x = rand_f32(rng, n, low=0.1, high=3.0)
    y = rand_f32(rng, n, low=-3.0, high=3.0)
    out = np.full((24, n), np.nan, np.float32)
    math_all(x, y, out)
    for row, ref in enumerate(math_reference(x, y)):
        np.testing.assert_allclose(out[row], ref, rtol=2e-6, atol=2e-6, err_msg=f"row {row}")


@td.kernel(grid=1, block=32)
def math_of_ints(I: i32[32], Out: f32[3, 32], Imax: i32[2, 32]):
    t = threadIdx.x
    Out[0, t] = td.sqrt(I[t])          # integer argument: computed in f32
    Out[1, t] = td.exp(I[t] * 0.125)
    Out[2, t] = td.abs(I[t] - 16)      # integer abs stays an integer, stored as f32
    Imax[0, t] = max(I[t], 16 - I[t])
    Imax[1, t] = td.min(I[t], 16 - I[t])


def test_math_on_integer_values():
    i = np.arange(32, dtype=np.int32)
    out = np.zeros((3, 32), np.float32)
    imax = np.zeros((2, 32), np.int32)
    math_of_ints(i, out, imax)
    np.testing.assert_allclose(out[0], np.sqrt(i), rtol=1e-6)
    np.testing.assert_allclose(out[1], np.exp(i * 0.125), rtol=1e-6)
    np.testing.assert_array_equal(out[2], np.abs(i - 16))
    np.testing.assert_array_equal(imax[0], np.maximum(i, 16 - i))
    np.testing.assert_array_equal(imax[1], np.minimum(i, 16 - i))


@td.kernel(grid=1, block=64)
def unsigned_wraps(Out: td.u32[3, 64]):
    t = threadIdx.x
    two = td.u32(2)
    Out[0, t] = min(two - 5, td.u32(10))            # 2 - 5 wraps to 4294967293, so the min is 10
    Out[1, t] = max(td.u32(t) - 1, td.u32(7))       # t == 0 wraps to the largest u32
    Out[2, t] = (td.u32(t) - 1) // 64               # ... which is not below 64


def test_unsigned_arithmetic_wraps_before_min_max_and_division_are_simplified():
    t = np.arange(64, dtype=np.uint32)
    out = np.zeros((3, 64), np.uint32)
    unsigned_wraps(out)
    np.testing.assert_array_equal(out[0], np.full(64, 10, np.uint32))
    np.testing.assert_array_equal(out[1], np.maximum(t - np.uint32(1), np.uint32(7)))
    np.testing.assert_array_equal(out[2], (t - np.uint32(1)) // np.uint32(64))


@td.kernel(grid=1, block=64)
def unsigned_min_max(C: td.u32[64], Out: td.u32[3, 64]):
    t = threadIdx.x
    Out[0, t] = max(C[t] >> 2, td.i32(-2) | -8) >> 1     # -2 converts to the u32 4294967294, as in C
    Out[1, t] = min(C[t] >> 2, 5)
    Out[2, t] = max(C[t] >> 1, C[t] >> 3)


def test_min_and_max_of_unsigned_values_and_literals():
    """The cpu once failed to compile these: numba took `u32 >> 2` as a uint64 and its max with an int literal to
    float64 (random integer programs, seed 373)."""
    c = np.random.default_rng(6).integers(0, 2**32, 64).astype(np.uint32)
    out = np.zeros((3, 64), np.uint32)
    unsigned_min_max(c, out)
    np.testing.assert_array_equal(out[0], np.full(64, 2**31 - 1))
    np.testing.assert_array_equal(out[1], np.minimum(c >> 2, 5))
    np.testing.assert_array_equal(out[2], c >> 1)


@td.kernel(grid=1, block=64)
def unsigned_widened(C: td.u32[64], Out: td.i64[2, 64], U: td.u64[64]):
    t = threadIdx.x
    Out[0, t] = max(td.i64(2**53 + 1), C[t] >> 2)    # u32 widened to i64, exactly (not through a double)
    Out[1, t] = max(td.i64(-1) * t, C[t] + 1)        # C[t] + 1 wraps in u32 first
    U[t] = min(td.i64(-1), C[t] >> 2)                # -1, converted to u64


def test_unsigned_values_widened_to_i64_stay_exact():
    c = np.random.default_rng(5).integers(0, 2**32, 64).astype(np.uint32)
    c[:3] = [0, 2**32 - 1, 7]
    out, u = np.zeros((2, 64), np.int64), np.zeros(64, np.uint64)
    unsigned_widened(c, out, u)
    np.testing.assert_array_equal(out[0], np.full(64, 2**53 + 1))
    np.testing.assert_array_equal(out[1], np.maximum(-np.arange(64), (c + np.uint32(1)).astype(np.int64)))
    np.testing.assert_array_equal(u, np.full(64, 2**64 - 1, np.uint64))


@td.kernel(grid=1, block=64)
def widened_i32(A: td.i32[64], Out: td.i64[3, 64]):
    t = threadIdx.x
    Out[0, t] = abs(td.i64(A[t]))       # 2**31 for -2**31: the absolute value taken in i64
    Out[1, t] = -td.i64(A[t])
    Out[2, t] = td.abs(td.i64(A[t])) - td.i64(A[t])


def test_i32_values_widened_to_i64_do_not_wrap():
    a = np.random.default_rng(6).integers(-2**31, 2**31, 64).astype(np.int32)
    a[:3] = [-2**31, 2**31 - 1, -1]
    out = np.zeros((3, 64), np.int64)
    widened_i32(a, out)
    wide = a.astype(np.int64)
    np.testing.assert_array_equal(out, [np.abs(wide), -wide, np.abs(wide) - wide])


@td.kernel(grid=1, block=64)
def unsigned_select(C: td.u32[64], Out: td.u32[64]):
    t = threadIdx.x
    Out[t] = ~((C[t] >> 0) if t < 32 else td.u32(-3))     # a u32 value or a constant, then ~ of the u32


def test_selects_between_unsigned_values_and_constants_stay_unsigned():
    c = np.random.default_rng(7).integers(0, 2**32, 64).astype(np.uint32)
    out = np.zeros(64, np.uint32)
    unsigned_select(c, out)
    np.testing.assert_array_equal(out, ~np.where(np.arange(64) < 32, c, np.uint32(2**32 - 3)))


@td.kernel(grid=1, block=64)
def narrow_integers(B: td.u8[64], C: td.i8[64], S: td.i16[64], Out: td.i64[7, 64]):
    t = threadIdx.x
    Out[0, t] = -B[t]               # C's integer promotion: computed in i32, so -255, not 1
    Out[1, t] = ~B[t]               # -256, not 0
    Out[2, t] = -C[t]               # 128 for -128
    Out[3, t] = abs(C[t])
    Out[4, t] = td.abs(S[t])        # 32768 for -32768
    Out[5, t] = ~S[t]
    Out[6, t] = max(B[t], C[t])


@FEW
@given(seed=st.integers(0, 2**16))
def test_narrow_integers_are_promoted_to_i32_in_unary_operators_and_math(seed):
    rng = np.random.default_rng(seed)
    b, c, s = (rng.integers(info.min, info.max + 1, 64).astype(dt) for dt, info in
               ((np.uint8, np.iinfo(np.uint8)), (np.int8, np.iinfo(np.int8)), (np.int16, np.iinfo(np.int16))))
    b[:2], c[:2], s[:2] = [0, 255], [-128, 127], [-32768, 32767]
    out = np.zeros((7, 64), np.int64)
    narrow_integers(b, c, s, out)
    b, c, s = (x.astype(np.int64) for x in (b, c, s))
    for k, want in enumerate([-b, ~b, -c, np.abs(c), np.abs(s), ~s, np.maximum(b, c)]):
        np.testing.assert_array_equal(out[k], want, err_msg=f"row {k}")


def test_math_functions_work_on_host_numbers():
    assert td.exp(0.0) == 1.0
    assert td.max(2, 7) == 7
    assert td.fma(2.0, 3.0, 1.0) == 7.0
    assert td.cdiv(10, 4) == 3 and td.cdiv(0, 4) == 0
    # IEEE results, as kernels compute them, where Python's math would raise or return an int
    assert td.log(0.0) == -math.inf and math.isnan(td.sqrt(-1.0)) and td.exp(1000.0) == math.inf
    assert td.floor(2.5) == 2.0 and isinstance(td.floor(2.5), float) and td.floor(math.inf) == math.inf
    assert math.isnan(td.max(math.nan, 1.0)) and math.isnan(td.max(1.0, math.nan)) and math.isnan(td.min(1.0, math.nan))


EDGES = np.array([np.nan, np.inf, -np.inf, 1e30, -1e30, 3e38, -0.0, 0.0, -0.5, 0.5, 2.5, -2.5, 16777215.0, 1e-40],
                 np.float32)


@td.kernel(grid=1, block=len(EDGES))
def math_edges(X: f32[len(EDGES)], Y: f32[len(EDGES)], Out: f32[10, len(EDGES)], Folded: f32[10]):
    t = threadIdx.x
    x, y = X[t], Y[t]
    Out[0, t] = td.floor(x)
    Out[1, t] = td.ceil(x)
    Out[2, t] = td.max(x, y)
    Out[3, t] = td.min(x, y)
    Out[4, t] = max(y, x)
    Out[5, t] = td.abs(x)
    Out[6, t] = td.sqrt(x)
    Out[7, t] = td.log(td.abs(x))
    Out[8, t] = td.max(x, 0.0)          # relu
    Out[9, t] = td.rint(x)              # halves to even, a zero with x's sign
    if t == 0:                          # compile-time arguments: evaluated while translating
        Folded[0] = td.log(0.0)
        Folded[1] = td.sqrt(-1.0)
        Folded[2] = td.exp(1000.0)
        Folded[3] = td.floor(1e30)
        Folded[4] = td.max(float("nan"), 1.0)
        Folded[5] = (-8.0) ** (1 / 3)      # Python: a complex number; td.pow: nan
        Folded[6] = 0.0 ** -1.0            # Python: ZeroDivisionError
        Folded[7] = -1.0 // 0.0
        Folded[8] = 1.0 % 0.0
        Folded[9] = 1.0 / -0.0


def test_math_functions_follow_ieee_at_edges():
    """floor/ceil/rint of huge, infinite and signed-zero floats stay floats (rint's halves to even); max/min keep a NaN
    and put -0.0 below 0.0 (IEEE's maximum / minimum); float operators of compile-time numbers give IEEE's value
    where Python raises or gives a complex number (they were "compile-time '//' failed: float floor division by
    zero", "expected a number, got complex")."""
    assert_math_edges()


def test_math_edges_through_the_cuda_source(simulated_gpu):
    """The same through the kernel's CUDA C++ run on the host: the C library's functions it calls (rintf, ...)."""
    assert_math_edges()


def assert_math_edges():
    """`math_edges` gives IEEE's values at EDGES, on the target set."""
    x = EDGES
    y = np.roll(EDGES, 3)
    out = np.zeros((10, len(x)), np.float32)
    folded = np.zeros(10, np.float32)
    math_edges(x, y, out, folded)

    def ieee(extreme, a, b):        # numpy's, but -0.0 below 0.0 (numpy's gives the second of two zeros)
        zeros = a + b if extreme is np.maximum else -(-a - b)       # of two zeros: the sum is 0.0 unless both are -0.0
        return np.where((a == 0) & (b == 0), zeros, extreme(a, b))

    with np.errstate(all="ignore"):
        want = [np.floor(x), np.ceil(x), ieee(np.maximum, x, y), ieee(np.minimum, x, y), ieee(np.maximum, y, x),
                np.abs(x), np.sqrt(x), np.log(np.abs(x)), ieee(np.maximum, x, np.float32(0)), np.rint(x)]
    for row, ref in enumerate(want):
        np.testing.assert_array_equal(out[row], ref, err_msg=f"row {row}")
        zeros = ref == 0
        assert (np.signbit(out[row][zeros]) == np.signbit(ref[zeros])).all(), f"row {row}"
    np.testing.assert_array_equal(folded, np.array([-np.inf, np.nan, np.inf, 1e30, np.nan, np.nan, np.inf, -np.inf,
                                                    np.nan, -np.inf], np.float32))


# f64 values whose nearest f16 (elements 0 and 2) or bf16 (element 1) is farther from zero, but that round
# to a tie, and then toward zero, when they go through f32 first
ROUND_ONCE = np.array([1 + 2**-11 + 2**-40, -(1 + 2**-8 + 2**-30), 2049 + 2**-30, 1 + 3 * 2**-9 + 2**-35])


@td.kernel(grid=1, block=len(ROUND_ONCE))
def to_16_bits(Y: f64[len(ROUND_ONCE)], A: i32[1], H: td.f16[len(ROUND_ONCE)], B: td.bf16[len(ROUND_ONCE) + 1]):
    t = threadIdx.x
    H[t] = Y[t]
    B[t] = Y[t]
    if t == 0:
        B[len(ROUND_ONCE)] = A[0]


def test_f64_and_int_to_16_bit_floats_round_once():
    """As CUDA's __double2half and __int2bfloat16_rn (and constant folding) do: through f32 they would round twice."""
    import ml_dtypes
    a = np.array([2**24 + 2**16 + 1], np.int32)     # its nearest bf16 is 2**24 + 2**17; through f32: 2**24
    h = np.zeros(len(ROUND_ONCE), np.float16)
    b = np.zeros(len(ROUND_ONCE) + 1, ml_dtypes.bfloat16)
    to_16_bits(ROUND_ONCE, a, h, b)
    np.testing.assert_array_equal(h, ROUND_ONCE.astype(np.float16))    # numpy rounds f64 -> f16 once
    want = [1.0, -(1 + 2**-7), 2048.0, 1 + 2**-7, 2**24 + 2**17]   # by hand: bf16 has 8 significant bits
    np.testing.assert_array_equal(b.astype(np.float64), want)


# --------------------------------------------------------------------------- casts
@td.kernel(grid=lambda N: td.cdiv(N, 64), block=64)
def casts(X: f32["N"], I: i32["N"], T1: i32["N"], T2: i32["N"], F1: f32["N"], F2: f32["N"], F3: f32["N"]):
    i = blockIdx.x * 64 + threadIdx.x
    if i < N:
        T1[i] = td.cast(X[i], td.i32)
        T2[i] = int(X[i] * 2.0)
        F1[i] = td.cast(I[i], f32) * 0.5
        F2[i] = f32(I[i]) + 0.25
        F3[i] = I[i] / 4            # true division of integers gives a float


@FEW
@given(n=SIZES, seed=st.integers(0, 2**16))
def test_casts(n, seed):
    rng = np.random.default_rng(seed)
    x = rand_f32(rng, n, low=-50.0, high=50.0)
    x[: min(n, 4)] = np.array([-2.7, 2.7, -0.5, 0.0], np.float32)[: min(n, 4)]
    ints = rng.integers(-1000, 1000, size=n).astype(np.int32)
    t1, t2 = np.zeros(n, np.int32), np.zeros(n, np.int32)
    f1, f2, f3 = (np.zeros(n, np.float32) for _ in range(3))
    casts(x, ints, t1, t2, f1, f2, f3)
    np.testing.assert_array_equal(t1, np.trunc(x).astype(np.int32))  # C: toward zero, not floor
    np.testing.assert_array_equal(t2, np.trunc(x * np.float32(2)).astype(np.int32))
    np.testing.assert_array_equal(f1, ints.astype(np.float32) * np.float32(0.5))
    np.testing.assert_array_equal(f2, ints.astype(np.float32) + np.float32(0.25))
    np.testing.assert_allclose(f3, ints / 4.0, rtol=1e-7)


# Ties of f16 (65520 -> inf, 2**-25 -> 0) and bf16 (1 + 2**-8 -> 1, 1 + 3 * 2**-8 -> 1 + 2**-6), subnormals.
@settings(max_examples=4, deadline=None)
@given(values=st.lists(st.floats(width=32), min_size=1, max_size=6))
@example(values=[0.1, 65520.0, 65519.0, 2.0**-25, 3e-8, -0.0])
@example(values=[1.00390625, 1.01171875, 3.3e38, -1e-40, float("inf"), float("nan")])
def test_constants_cast_to_narrow_floats_round_like_numpy(values):
    """`f16(0.1)` folded at compile time rounds as the run-time conversion and numpy do."""
    import ml_dtypes
    lines = "\n".join(f"    H[{k}] = f32(f16({v!r}))\n    B[{k}] = f32(bf16({v!r}))\n    F[{k}] = f32(f16({v!r}) * 3.0)"
                      for k, v in enumerate(values)).replace("inf", "float('inf')").replace("nan", "float('nan')")
    n = len(values)
    text = (f"import taskdsl as td\nfrom taskdsl import bf16, f16, f32\n\n\n@td.kernel(grid=1, block=1)\n"
            f"def constants(H: f32[{n}], B: f32[{n}], F: f32[{n}]):\n{lines}\n")
    kernel = load_program(text, "constants").constants
    h, b, f = (np.zeros(n, np.float32) for _ in range(3))
    kernel(h, b, f)
    x = np.array(values, np.float32)          # f32 values: numpy's and ml_dtypes' conversions round once
    with np.errstate(over="ignore", invalid="ignore"):
        np.testing.assert_array_equal(h, x.astype(np.float16).astype(np.float32))
        np.testing.assert_array_equal(b, x.astype(ml_dtypes.bfloat16).astype(np.float32))
        np.testing.assert_array_equal(f, x.astype(np.float16).astype(np.float32) * np.float32(3))


@td.kernel(grid=1, block=64)
def half_with_literals(H: td.f16[64], Out: f32[3, 64]):
    t = threadIdx.x
    Out[0, t] = H[t] * 0.1                       # computed in f32, with 0.1 as an f32
    Out[1, t] = 1.0 if H[t] < 0.1 else 0.0       # compared in f32
    Out[2, t] = H[t] if t % 2 == 0 else 0.1


@FEW
@given(seed=st.integers(0, 2**16))
def test_literals_next_to_16_bit_floats_are_f32(seed):
    """A 16-bit float's arithmetic is done in f32, and a literal beside it is not rounded to 16 bits."""
    h = np.random.default_rng(seed).uniform(-1, 1, 64).astype(np.float16)
    h[:3] = [0.1, 0.3, -0.1]                     # f16(0.1) < 0.1; 0.3 * 0.1 differs with f16(0.1)
    out = np.zeros((3, 64), np.float32)
    half_with_literals(h, out)
    x, tenth = h.astype(np.float32), np.float32(0.1)
    np.testing.assert_array_equal(out[0], x * tenth)
    np.testing.assert_array_equal(out[1], (x < tenth).astype(np.float32))
    np.testing.assert_array_equal(out[2], np.where(np.arange(64) % 2 == 0, x, tenth))


@td.kernel(grid=1, block=8)
def cast_f64(X: f64[8], Y: f32[8], Z: f64[8]):
    t = threadIdx.x
    Y[t] = X[t]                    # stores convert to the tensor's dtype
    Z[t] = td.cast(X[t], f32)      # f64 -> f32 -> f64 rounds to f32 precision


def test_f64_to_f32_conversion():
    x = np.array([1 / 3, 1e-9, -2.5, 1e10, 0.1, 7.0, -1 / 7, 3.0000001], np.float64)
    y, z = np.zeros(8, np.float32), np.zeros(8, np.float64)
    cast_f64(x, y, z)
    np.testing.assert_array_equal(y, x.astype(np.float32))
    np.testing.assert_array_equal(z, x.astype(np.float32).astype(np.float64))


@td.kernel(grid=1, block=1)
def f64_literals(X: f64[1], Out: f64[7], Big: td.i64[2]):
    z: f64 = 0.1                  # an annotated f64 variable
    v = X[0]
    v = 1e-300                    # a literal for a variable that is already f64 (f32 would flush it to 0)
    acc = 0.1                     # f64 from the start: the next line widens it
    acc += X[0]
    Out[0], Out[1], Out[2] = z, v, acc
    Out[3] = td.cast(0.1, f64)
    Out[4] = td.cast(1e300, f64)  # past f32's range
    Out[5] = f64(1e300)
    w: f64 = 2.0 ** 40 + 1.0 / 3.0
    Out[6] = w
    Big[0] = td.cast(16777217.0, td.i64)    # not f32's 16777216 on the way
    Big[1] = td.i64(2.0 ** 40 + 1)


def test_float_literals_convert_once_to_the_type_they_are_given():
    """A Python float given to an f64 variable or cast (to f64, to i64) converts from the number itself, not
    from its f32 rounding."""
    out, big = np.zeros(7, np.float64), np.zeros(2, np.int64)
    f64_literals(np.zeros(1, np.float64), out, big)
    np.testing.assert_array_equal(out, [0.1, 1e-300, 0.1, 0.1, 1e300, 1e300, 2.0 ** 40 + 1.0 / 3.0])
    np.testing.assert_array_equal(big, [16777217, 2 ** 40 + 1])


@td.kernel(grid=1, block=32)
def f64_math(X: f64[32], S: f32[32], Out: f64[5, 32]):
    t = threadIdx.x
    x = X[t]
    Out[0, t] = td.exp(x)
    Out[1, t] = td.sqrt(x) + td.tanh(x)
    Out[2, t] = x * S[t]                 # f64 * f32 computes in f64
    Out[3, t] = td.shfl_xor(x, 1)        # 64-bit shuffle
    Out[4, t] = x / 3.0 + 1e-12          # the literal stays double


def test_f64_math_keeps_double_precision():
    x = np.linspace(0.1, 3.0, 32)
    s = np.linspace(-1, 1, 32).astype(np.float32)
    out = np.zeros((5, 32))
    f64_math(x, s, out)
    np.testing.assert_allclose(out[0], np.exp(x), rtol=1e-14)
    np.testing.assert_allclose(out[1], np.sqrt(x) + np.tanh(x), rtol=1e-14)
    np.testing.assert_allclose(out[2], x * s.astype(np.float64), rtol=1e-15)
    np.testing.assert_array_equal(out[3], x[np.arange(32) ^ 1])
    np.testing.assert_allclose(out[4], x / 3 + 1e-12, rtol=1e-15)


# --------------------------------------------------------------------------- integer arithmetic
@td.kernel(grid=lambda N: td.cdiv(N, 64), block=64)
def int_divmod(A: i32["N"], B: i32["N"], Q: i32["N"], R: i32["N"], Q4: i32["N"], R4: i32["N"],
               FQ: f32["N"], FR: f32["N"], QN: i32["N"], RN: i32["N"]):
    i = blockIdx.x * 64 + threadIdx.x
    if i < N:
        a = A[i]
        b = B[i]
        Q[i] = a // b
        R[i] = a % b
        Q4[i] = a // 4
        R4[i] = (a * 8 + 3) % 4     # simplifiable: (q*c + r) % c == r % c
        FQ[i] = f32(a) // f32(b)
        FR[i] = f32(a) % f32(b)
        QN[i] = (a * 6 + 5) // -3   # constant negative divisor
        RN[i] = a % -3


@FEW
@given(n=SIZES, seed=st.integers(0, 2**16))
@example(n=8, seed=0)
def test_integer_floor_division_and_modulo_follow_python(n, seed):
    rng = np.random.default_rng(seed)
    a = rng.integers(-100, 100, size=n).astype(np.int32)
    b = rng.integers(1, 9, size=n).astype(np.int32) * rng.choice([-1, 1], size=n).astype(np.int32)
    fixed = [(7, 2), (-7, 2), (7, -2), (-7, -2), (0, 3), (-1, 3), (1, -3), (-9, 3)]
    for k, (p, q) in enumerate(fixed[:n]):
        a[k], b[k] = p, q
    outs = [np.zeros(n, np.int32) for _ in range(4)] + [np.zeros(n, np.float32) for _ in range(2)]
    outs += [np.zeros(n, np.int32) for _ in range(2)]
    int_divmod(a, b, *outs)
    q, r, q4, r4, fq, fr, qn, rn = outs
    np.testing.assert_array_equal(qn, [(int(x) * 6 + 5) // -3 for x in a])
    np.testing.assert_array_equal(rn, [int(x) % -3 for x in a])
    # Python's (floor) semantics, computed with Python ints
    np.testing.assert_array_equal(q, [int(x) // int(y) for x, y in zip(a, b)])
    np.testing.assert_array_equal(r, [int(x) % int(y) for x, y in zip(a, b)])
    np.testing.assert_array_equal(q4, [int(x) // 4 for x in a])
    np.testing.assert_array_equal(r4, [(int(x) * 8 + 3) % 4 for x in a])
    np.testing.assert_array_equal(fq, [float(x) // float(y) for x, y in zip(a, b)])
    np.testing.assert_array_equal(fr, [float(x) % float(y) for x, y in zip(a, b)])


@td.kernel(grid=lambda N: td.cdiv(N, 64), block=64)
def float_divmod(A: f32["N"], B: f32["N"], C: f64["N"], D: f64["N"], Q: f32["N"], R: f32["N"], Q2: f64["N"],
                 R2: f64["N"]):
    i = blockIdx.x * 64 + threadIdx.x
    if i < N:
        Q[i] = A[i] // B[i]
        R[i] = A[i] % B[i]
        Q2[i] = C[i] // D[i]
        R2[i] = C[i] % D[i]


@FEW
@given(n=SIZES, seed=st.integers(0, 2**16))
@example(n=8, seed=0)
def test_float_floor_division_and_modulo_follow_python(n, seed):
    """Python's float divmod, exact through fmod: 1.0 // 0.1 is 9 (floor(1.0 / 0.1) would be 10)."""
    rng = np.random.default_rng(seed)
    a = rng.uniform(-10, 10, n)
    b = rng.uniform(0.05, 3, n) * rng.choice([-1, 1], n)
    fixed = [(1.0, 0.1), (-1.0, 0.1), (1.0, -0.1), (0.3, 0.1), (-0.0, 1.0), (7.5, -2.5), (-86515256.0, 6.424532),
             (-3.0, 3.0), (1.0, 0.0), (-5.0, np.inf), (np.inf, 2.0)]      # numpy's results for these three
    for k, (p, q) in enumerate(fixed[:n]):
        a[k], b[k] = p, q
    a32, b32 = a.astype(np.float32), b.astype(np.float32)
    q, r = np.zeros(n, np.float32), np.zeros(n, np.float32)
    q2, r2 = np.zeros(n), np.zeros(n)
    float_divmod(a32, b32, a, b, q, r, q2, r2)
    with np.errstate(divide="ignore", invalid="ignore"):    # numpy computes Python's divmod, in the operands' type
        np.testing.assert_array_equal(q, np.floor_divide(a32, b32))
        np.testing.assert_array_equal(r, np.mod(a32, b32))
        np.testing.assert_array_equal(q2, np.floor_divide(a, b))
        np.testing.assert_array_equal(r2, np.mod(a, b))
    assert np.signbit(r[np.flatnonzero(r == 0)]).tolist() == np.signbit(b32[r == 0]).tolist()   # zero takes b's sign


@td.kernel(grid=1, block=1)
def folded_float_divmod(Out: f32[9]):
    Out[0] = f32(1.0) // f32(0.1)       # constants: simplify folds these, in f32
    Out[1] = f32(1.0) % f32(0.1)
    Out[2] = f32(-1.0) // f32(0.1)
    Out[3] = f32(-1.0) % f32(0.1)
    Out[4] = f32(1e7) // f32(0.3)
    Out[5] = f32(1e7) % f32(0.3)
    Out[6] = f32(-0.0) % f32(1.0)
    Out[7] = f32(3.0) % f32(-3.0)
    Out[8] = f32(-86515256.0) // f32(6.424532)    # the quotient needs more than f32's 24 bits


def test_folded_float_floor_division_and_modulo_match_run_time():
    out = np.zeros(9, np.float32)
    folded_float_divmod(out)
    a = np.array([1.0, -1.0, 1e7, -0.0, 3.0], np.float32)
    b = np.array([0.1, 0.1, 0.3, 1.0, -3.0], np.float32)
    want = np.stack([np.floor_divide(a, b), np.mod(a, b)], axis=1).reshape(-1)
    np.testing.assert_array_equal(out[:6], want[:6])
    assert out[8] == np.floor_divide(np.float32(-86515256.0), np.float32(6.424532))   # not f64's, rounded
    assert out[6] == 0 and not np.signbit(out[6]) and out[7] == 0 and np.signbit(out[7])   # zero takes b's sign


@td.kernel(grid=1, block=8)
def mixed_signs(A: i32[8], U: td.u32[8], L: td.i64[8], W: td.u64[8], F: f32[8], Out: td.i64[15, 8]):
    t = threadIdx.x
    a, u, w, l = A[t], U[t], W[t], L[t]
    Out[0, t] = a < u              # exact, as in Python (C would give -1 < 1u == false)
    Out[1, t] = u >= a
    Out[2, t] = a == u
    Out[3, t] = l < w              # against a u64: the sign decides first
    Out[4, t] = w <= l
    Out[5, t] = l != w
    Out[6, t] = u < -1             # a literal that u32 cannot hold keeps its own type
    Out[7, t] = u + (-1)           # arithmetic keeps C's rules: u32, wrapping
    Out[8, t] = a + 3000000000     # an i64 literal: i64 arithmetic
    Out[9, t] = a == F[t]          # int against float compares in the float type (f32)
    Out[10, t] = w == 18446744073709551615
    Out[11, t] = min(a, 3000000000)   # min/max promote a literal that does not fit, as arithmetic does
    Out[12, t] = min(u, -3)           # u32 with i32: u32, so -3 wraps
    Out[13, t] = i32(u) % 7           # u32 -> i32 wraps (on the cpu too, where ints live in int64)
    Out[14, t] = -u                   # u32 negation wraps


INT32_EDGES = [0, 1, -1, 2**31 - 1, -2**31, 7, -7, 16777217]
UINT32_EDGES = [0, 1, 2**32 - 1, 2**31, 7, 5, 3, 16777216]


@FEW
@given(seed=st.integers(0, 2**16))
@example(seed=0)
def test_mixed_signedness_comparisons_and_literals(seed):
    rng = np.random.default_rng(seed)
    a = rng.permutation(np.array(INT32_EDGES, np.int64)).astype(np.int32)
    u = rng.permutation(np.array(UINT32_EDGES, np.uint64)).astype(np.uint32)
    l = rng.permutation(np.array([0, -1, 1, -2**63, 2**63 - 1, 5, -5, 2**40], np.int64))
    w = rng.permutation(np.array([0, 1, 2**64 - 1, 2**63, 5, 2**63 - 1, 3, 2**40], np.uint64))
    f = np.float32(a)
    f[rng.integers(0, 8)] += 1.0
    out = np.zeros((15, 8), np.int64)
    mixed_signs(a, u, l, w, f, out)
    A, U, L, W = ([int(v) for v in x] for x in (a, u, l, w))     # Python ints: exact
    expected = [[x < y for x, y in zip(A, U)], [y >= x for x, y in zip(A, U)], [x == y for x, y in zip(A, U)],
                [x < y for x, y in zip(L, W)], [y <= x for x, y in zip(L, W)], [x != y for x, y in zip(L, W)],
                [False] * 8, [(y - 1) % 2**32 for y in U], [x + 3000000000 for x in A],
                [bool(np.float32(x) == y) for x, y in zip(a, f)], [y == 2**64 - 1 for y in W],
                [min(x, 3000000000) for x in A], [min(y, 2**32 - 3) for y in U],
                [(y - 2**32 if y >= 2**31 else y) % 7 for y in U], [-y % 2**32 for y in U]]
    np.testing.assert_array_equal(out, np.array(expected, np.int64))


@td.kernel(grid=lambda N: td.cdiv(N, 64), block=64)
def bitwise(A: i32["N"], B: i32["N"], Out: i32[7, "N"]):
    i = blockIdx.x * 64 + threadIdx.x
    if i < N:
        a = A[i]
        b = B[i]
        Out[0, i] = a & b
        Out[1, i] = a | b
        Out[2, i] = a ^ b
        Out[3, i] = (a | 7) ^ -1       # ~a is tested with the unary operators
        Out[4, i] = (a & 0xFFFF) << (b & 7)
        Out[5, i] = a >> (b & 15)        # arithmetic shift of negative numbers
        Out[6, i] = (a ^ b) & (a | 255)


@FEW
@given(n=SIZES, seed=st.integers(0, 2**16))
def test_bitwise_operators(n, seed):
    rng = np.random.default_rng(seed)
    a = rng.integers(-2**31, 2**31, size=n, dtype=np.int64).astype(np.int32)
    b = rng.integers(-2**31, 2**31, size=n, dtype=np.int64).astype(np.int32)
    out = np.zeros((7, n), np.int32)
    bitwise(a, b, out)
    np.testing.assert_array_equal(out[0], a & b)
    np.testing.assert_array_equal(out[1], a | b)
    np.testing.assert_array_equal(out[2], a ^ b)
    np.testing.assert_array_equal(out[3], ~(a | np.int32(7)))
    np.testing.assert_array_equal(out[4], (a & np.int32(0xFFFF)) << (b & np.int32(7)))
    np.testing.assert_array_equal(out[5], a >> (b & np.int32(15)))
    np.testing.assert_array_equal(out[6], (a ^ b) & (a | np.int32(255)))


@td.kernel(grid=1, block=8)
def unary_ops(X: f32[8], A: i32[8], Y: f32[8], B: i32[8], C: i32[8]):
    t = threadIdx.x
    Y[t] = -X[t] + +X[t] * 0.5
    B[t] = ~A[t]
    C[t] = 1 if not (A[t] > 0) else -A[t]


def test_unary_operators():
    x = np.array([1.5, -2.0, 0.0, 3.25, -0.5, 7.0, -8.0, 100.0], np.float32)
    a = np.array([0, 1, -1, 5, -6, 2**31 - 1, -2**31, 12345], np.int32)
    y, b, c = np.zeros(8, np.float32), np.zeros(8, np.int32), np.zeros(8, np.int32)
    unary_ops(x, a, y, b, c)
    np.testing.assert_array_equal(y, -x + x * np.float32(0.5))
    np.testing.assert_array_equal(b, ~a)
    with np.errstate(over="ignore"):
        np.testing.assert_array_equal(c, np.where(a > 0, -a, 1))


@td.kernel(grid=1, block=8)
def int32_shifts(A: i32[8], Out: i32[3, 8]):
    t = threadIdx.x
    a = A[t]
    Out[0, t] = (a << 4) >> 4           # an i32 shift drops the high bits, as on a GPU
    Out[1, t] = 1 if (a << 4) < 0 else 0
    Out[2, t] = (a << 4) // 16


def test_int32_shifts_drop_high_bits():
    # non-negative values whose a * 16 fits in 32 unsigned bits: well defined in CUDA C++17
    a = np.array([0x12345678, 0x0FFFFFFF, 0x0F000000, 0x08000000, 5, 0, 0x07FFFFFF, 0x00F00000], np.int32)
    out = np.zeros((3, 8), np.int32)
    int32_shifts(a, out)
    shifted = a << np.int32(4)           # numpy int32 keeps 32 bits, like the GPU's registers
    np.testing.assert_array_equal(out[0], shifted >> np.int32(4))
    np.testing.assert_array_equal(out[1], (shifted < 0).astype(np.int32))
    np.testing.assert_array_equal(out[2], shifted // np.int32(16))


@td.kernel(grid=1, block=1)
def mixed_sign_loops(N: td.u32[1], S: i32[1], A: i32[1], Out: td.i64[9]):
    n, s, a = N[0], S[0], A[0]
    c0 = 0
    for i in range(n - 1, -1, -1):         # an unsigned start counting down past 0
        c0 += 1
    c1 = 0
    for j in range(n, 0, -1):
        c1 += 1
    c2 = 0
    for m in range(s, n):                  # a signed start, an unsigned stop
        c2 += 1
    c3 = 0
    for q in range(n - n, -1):             # no iteration: 0 is not below -1
        c3 += 1
    Out[0], Out[1], Out[2], Out[3] = c0, c1, c2, c3
    Out[4] = a >> N[0]                     # a shift has its left operand's type: arithmetic, as in C and Python
    Out[5] = a << td.u32(2)
    Out[6] = ~(a < 0)                      # ~ of a bool widens it to i32 first (~ of True is -2)
    Out[7] = ~(a > 0)


def test_loops_with_mixed_signedness_and_shifts_by_unsigned_counts():
    """Trip counts as Python's range gives them (the loop variable widens to i64 where an unsigned bound meets a
    negative number); a shift's type is its left operand's."""
    out = np.zeros(9, np.int64)
    mixed_sign_loops(np.array([4], np.uint32), np.array([-2], np.int32), np.array([-20], np.int32), out)
    trips = [len(range(3, -1, -1)), len(range(4, 0, -1)), len(range(-2, 4)), len(range(0, -1))]
    np.testing.assert_array_equal(out[:8], trips + [-20 >> 4, -20 << 2, ~1, ~0])   # ~ of True and of False


def test_flat_indices_of_tensors_past_2_31_elements_are_64_bit():
    """A CUDA kernel's flat index of a tensor of more than 2^31 - 1 elements is computed in i64 (the cpu
    target's are i64 anyway); a single axis beyond i32, the size symbols' type, is refused."""
    @td.kernel(grid=1, block=1)
    def corner(A: f32["M", "N"], B: f32["M", "N"]):
        B[M - 1 - threadIdx.x, N - 1] = A[M - 1 - threadIdx.x, N - 1]

    big = np.broadcast_to(np.zeros(1, np.float32), (65536, 65536))     # shapes only: nothing is allocated
    source = corner.source(big, big, target="cuda")
    assert "B[((((long long)((65535 - ((int)threadIdx.x)))) * 65536LL) + 65535LL)]" in source
    small = np.zeros((4, 5), np.float32)
    assert "long long" not in corner.source(small, small, target="cuda")
    huge = np.broadcast_to(np.zeros(1, np.float32), (1, 2 ** 31))
    with pytest.raises(ValueError, match="size 'N' is 2147483648 .* size symbols are i32"):
        corner.source(huge, huge, target="cuda")


@td.kernel(grid=lambda N: td.cdiv(N, 64), block=64)
def tanh_erf(X: f32["N"], T: f32["N"], E: f32["N"]):
    i = blockIdx.x * 64 + threadIdx.x
    if i < N:
        T[i] = td.tanh(X[i])
        E[i] = td.erf(X[i])


def test_tanh_and_erf_of_tiny_inputs():
    """Within 5e-7 of math.tanh / math.erf for normal inputs down to float32's least (the rational forms would
    have multiplied subnormal powers of x)."""
    x = np.array([1.2e-38, -3e-37, 1e-20, 2.4e-4, -2.5e-4, 1e-3, 0.0, -0.0, 0.7], np.float32)
    t, e = np.zeros_like(x), np.zeros_like(x)
    tanh_erf(x, t, e)
    for got, fn in ((t, math.tanh), (e, math.erf)):
        want = np.array([fn(float(v)) for v in x])
        np.testing.assert_allclose(got, want, rtol=5e-7, atol=0)


# --------------------------------------------------------------------------- conditional expressions
@td.kernel(grid=lambda N: td.cdiv(N, 64), block=64)
def shift_left(X: f32["N"], Y: f32["N"], Z: f32["N"]):
    i = blockIdx.x * 64 + threadIdx.x
    if i < N:
        Y[i] = X[i + 1] if i + 1 < N else -1.0          # the load must not run when i + 1 == N
        Z[i] = X[i - 1] * 2.0 if i >= 1 and X[i - 1] > 0.0 else X[i]   # 'and' short-circuits


@FEW
@given(n=SIZES, seed=st.integers(0, 2**16))
@example(n=1, seed=0)
def test_conditional_expression_with_guarded_load(n, seed):
    rng = np.random.default_rng(seed)
    x = rand_f32(rng, n)
    y, z = np.zeros(n, np.float32), np.zeros(n, np.float32)
    shift_left(x, y, z)
    np.testing.assert_array_equal(y, np.append(x[1:], np.float32(-1.0)))
    prev = np.concatenate([[0.0], x[:-1]]).astype(np.float32)
    want = np.where((np.arange(n) >= 1) & (prev > 0), prev * np.float32(2), x)
    np.testing.assert_array_equal(z, want)


def test_conditional_expression_guarded_load_in_debug_mode():
    td.debug(True)
    x = np.arange(5, dtype=np.float32)
    y, z = np.zeros(5, np.float32), np.zeros(5, np.float32)
    shift_left(x, y, z)  # bounds-checked: a lazy conditional never reads X[N] or X[-1]
    np.testing.assert_array_equal(y, [1, 2, 3, 4, -1])
    np.testing.assert_array_equal(z, [0, 1, 2, 4, 6])


@td.kernel(grid=lambda N: td.cdiv(N, 64), block=64)
def boolean_forms(X: f32["N"], I: i32["N"], Out: i32[6, "N"]):
    i = blockIdx.x * 64 + threadIdx.x
    if i < N:
        x = X[i]
        k = I[i]
        Out[0, i] = 1 if -1.0 <= x < 1.0 else 0          # chained comparison
        Out[1, i] = 1 if x < -1.5 or x > 1.5 else 0
        Out[2, i] = 1 if not (k % 3 == 0) and k != 7 else 0
        Out[3, i] = 1 if k else 0                        # numbers are true when non-zero
        Out[4, i] = (x > 0.0) + (k > 0) * 2              # bools do arithmetic as ints
        Out[5, i] = 0
        if k > 2 and x > 0.0 or k == -1:
            Out[5, i] = 1
        elif k < -5:
            Out[5, i] = 2


@FEW
@given(n=SIZES, seed=st.integers(0, 2**16))
def test_boolean_operators_and_chained_comparisons(n, seed):
    rng = np.random.default_rng(seed)
    x = rand_f32(rng, n)
    k = rng.integers(-10, 10, size=n).astype(np.int32)
    out = np.full((6, n), -9, np.int32)
    boolean_forms(x, k, out)
    np.testing.assert_array_equal(out[0], (-1 <= x) & (x < 1))
    np.testing.assert_array_equal(out[1], (x < -1.5) | (x > 1.5))
    np.testing.assert_array_equal(out[2], (k % 3 != 0) & (k != 7))
    np.testing.assert_array_equal(out[3], k != 0)
    np.testing.assert_array_equal(out[4], (x > 0).astype(int) + 2 * (k > 0))
    np.testing.assert_array_equal(out[5], np.where(((k > 2) & (x > 0)) | (k == -1), 1, np.where(k < -5, 2, 0)))


# --------------------------------------------------------------------------- loops
@td.kernel(grid=lambda N: td.cdiv(N, 32), block=32)
def collatz(A: i32["N"], Steps: i32["N"], Last: i32["N"]):
    i = blockIdx.x * 32 + threadIdx.x
    if i < N:
        n = A[i]
        steps = 0
        while n != 1:
            if steps >= 40:
                break
            steps += 1
            if n % 2 == 0:
                n = n // 2
                continue
            n = 3 * n + 1
        Steps[i] = steps
        Last[i] = n


def collatz_ref(n):
    steps = 0
    while n != 1:
        if steps >= 40:
            break
        steps += 1
        n = n // 2 if n % 2 == 0 else 3 * n + 1
    return steps, n


@FEW
@given(n=SIZES, seed=st.integers(0, 2**16))
def test_while_break_continue(n, seed):
    rng = np.random.default_rng(seed)
    a = rng.integers(1, 200, size=n).astype(np.int32)
    steps, last = np.zeros(n, np.int32), np.zeros(n, np.int32)
    collatz(a, steps, last)
    ref = [collatz_ref(int(v)) for v in a]
    np.testing.assert_array_equal(steps, [s for s, _ in ref])
    np.testing.assert_array_equal(last, [v for _, v in ref])


@td.kernel(grid=lambda M: td.cdiv(M, 32), block=32)
def row_scan(X: f32["M", "K"], S: f32["M"], Stop: i32["M"]):
    r = blockIdx.x * 32 + threadIdx.x
    if r < M:
        acc = 0                      # an int, widened to f32 by the += below
        stop = -1
        for j in range(K):
            v = X[r, j]
            if v < 0.0:
                continue             # skip negatives
            if v > 1.5:
                stop = j
                break                # stop at the first big value
            acc += v
        S[r] = acc
        Stop[r] = stop


@FEW
@given(m=st.integers(1, 70), k=st.integers(1, 20), seed=st.integers(0, 2**16))
def test_for_with_break_continue_and_type_widening(m, k, seed):
    rng = np.random.default_rng(seed)
    x = rand_f32(rng, m, k)
    s, stop = np.zeros(m, np.float32), np.zeros(m, np.int32)
    row_scan(x, s, stop)
    for r in range(m):
        acc, where = np.float32(0), -1
        for j in range(k):
            if x[r, j] < 0:
                continue
            if x[r, j] > 1.5:
                where = j
                break
            acc = np.float32(acc + x[r, j])
        assert stop[r] == where
        np.testing.assert_allclose(s[r], acc, rtol=1e-6)


@td.kernel(grid=lambda N: td.cdiv(N, 32), block=32)
def range_forms(X: f32["N", 12], Out: f32["N", 4]):
    r = blockIdx.x * 32 + threadIdx.x
    if r < N:
        a = 0.0
        for j in range(3, 12, 3):          # start, stop, step
            a += X[r, j]
        b = 0.0
        for j in range(11, -1, -2):        # negative step
            b += X[r, j] * j
        c = 0.0
        for j in td.unroll(4):             # unrolled
            c += X[r, j] * (j + 1)
        d = 0.0
        for w in (-1.0, 2.0, 0.5)[::-1]:   # compile-time tuple (a slice of one): unrolled with constants
            d += w * X[r, 0]
        for j, w in enumerate((1.0, 10.0, 7.0)[:2]):
            d += w * X[r, j + 1]
        Out[r, 0] = a
        Out[r, 1] = b
        Out[r, 2] = c
        Out[r, 3] = d


@FEW
@given(n=SIZES, seed=st.integers(0, 2**16))
def test_range_unroll_and_compile_time_tuple_loops(n, seed):
    rng = np.random.default_rng(seed)
    x = rand_f32(rng, n, 12)
    out = np.zeros((n, 4), np.float32)
    range_forms(x, out)
    x64 = x.astype(np.float64)
    np.testing.assert_allclose(out[:, 0], x64[:, [3, 6, 9]].sum(1), rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(out[:, 1], (x64[:, 11::-2] * np.arange(11, -1, -2)).sum(1), rtol=1e-5, atol=1e-4)
    np.testing.assert_allclose(out[:, 2], (x64[:, :4] * [1, 2, 3, 4]).sum(1), rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(out[:, 3], 1.5 * x64[:, 0] + x64[:, 1] + 10 * x64[:, 2], rtol=1e-5, atol=1e-5)


@td.kernel(grid=lambda N: td.cdiv(N, 32), block=32)
def constant_trip_loops(X: f32["N", 8], S: f32["N"], Stop: i32["N"]):
    r = blockIdx.x * 32 + threadIdx.x
    if r < N:
        acc = 0.0
        stop = -1
        for j in range(8):                  # constant bounds, left early
            if X[r, j] < 0.0:
                continue
            if X[r, j] > 1.5:
                stop = j
                break
            acc += X[r, j]
        for j in range(2):
            for q in range(3):              # an inner constant loop with a break of its own
                if q == 2:
                    break
                acc += X[r, j * 3 + q] * 0.5
        S[r] = acc
        Stop[r] = stop


@FEW
@given(n=SIZES, seed=st.integers(0, 2**16))
def test_constant_trip_loops_with_break_and_continue(n, seed):
    x = rand_f32(np.random.default_rng(seed), n, 8)
    s, stop = np.zeros(n, np.float32), np.zeros(n, np.int32)
    constant_trip_loops(x, s, stop)
    for r in range(n):
        acc, where = 0.0, -1
        for j in range(8):
            if x[r, j] < 0:
                continue
            if x[r, j] > 1.5:
                where = j
                break
            acc += float(x[r, j])
        acc += 0.5 * float(x[r, [0, 1, 3, 4]].astype(np.float64).sum())
        assert stop[r] == where
        np.testing.assert_allclose(s[r], acc, rtol=1e-5, atol=1e-5)


def make_select_kernel(mode):
    @td.kernel(grid=1, block=16)
    def select_mode(X: f32[16], Y: f32[16]):
        t = threadIdx.x
        if mode == "square":        # a compile-time condition picks one branch
            Y[t] = X[t] * X[t]
        elif mode == "neg":
            Y[t] = X[t] * -1.0
        else:
            Y[t] = X[t] + float(len(mode))
        Y[t] += X.shape[0]          # T.shape: compile-time dims

    return select_mode


def test_compile_time_if_and_shape():
    x = np.arange(16, dtype=np.float32) - 4
    for mode, want in (("square", x * x), ("neg", -x), ("other", x + 5)):
        y = np.zeros(16, np.float32)
        make_select_kernel(mode)(x, y)
        np.testing.assert_array_equal(y, want + 16)
    assert "X[" in make_select_kernel("neg").ir(x, x)


def test_tuple_unpacking_and_augmented_assignment():
    @td.kernel(grid=1, block=8)
    def swap(X: i32[8], Y: i32[8]):
        t = threadIdx.x
        a, b = X[t], t * 10
        a, b = b, a
        a -= 1
        b *= 3
        a += b
        Y[t] = a
        Y[t] -= 2

    x = np.arange(8, dtype=np.int32) * 7
    y = np.zeros(8, np.int32)
    swap(x, y)
    np.testing.assert_array_equal(y, np.arange(8) * 10 - 1 + 3 * x - 2)


def test_power_assignment_and_len_of_a_tensor():
    """`v **= e` is `v = v ** e` (it was refused); len(X) is X.shape[0], as numpy's len."""
    @td.kernel(grid=1, block=1)
    def powers(X: f32["N", 3], Y: f32[4]):
        v = X[0, 0]
        v **= 2.0
        Y[0] = v
        Y[1] = len(X)
        Y[2] = X[1, 1]
        Y[2] **= 3
        w = 2
        w **= 3
        Y[3] = w

    x = np.arange(1.5, 16.5, dtype=np.float32).reshape(5, 3)
    y = np.zeros(4, np.float32)
    powers(x, y)
    np.testing.assert_allclose(y, [x[0, 0] ** 2, 5, x[1, 1] ** 3, 8], rtol=1e-6)


_REVERSED_STEPS = (-3, -1, 1, 2)


def _reversed_ranges(bound):
    """A kernel running reversed(range(Bounds[0], Bounds[1], step)) for each of _REVERSED_STEPS, bounds of type
    `bound`."""
    @td.kernel(grid=1, block=1)
    def reversed_ranges(Out: i32[len(_REVERSED_STEPS), 16], Count: i32[len(_REVERSED_STEPS)], Bounds: bound[2]):
        for s, step in enumerate(_REVERSED_STEPS):
            c = 0
            for i in reversed(range(Bounds[0], Bounds[1], step)):
                if c < 16:                  # (a wrapped count ran 2**32 trips)
                    Out[s, c] = i
                c += 1
            Count[s] = c
        c = 0
        for i in reversed(td.unroll(1, 8, 3)):      # compile-time bounds: the loop Python's reversed() gives
            Out[0, 12 + c] = i
            c += 1
    return reversed_ranges


REVERSED_RANGES = {np.int32: _reversed_ranges(i32), np.uint32: _reversed_ranges(td.u32)}


@given(start=st.integers(-7, 7), stop=st.integers(-7, 7), unsigned=st.booleans())
@settings(max_examples=60, deadline=None)
@example(start=0, stop=0, unsigned=True)
@example(start=3, stop=0, unsigned=True)
def test_reversed_range_loops(start, stop, unsigned):
    """`for i in reversed(range(a, b, s))`: from the range's last value back to its first, with run-time bounds
    (it was refused: range() outside a for loop's source). Unsigned bounds wrapped: reversed(range(0)) ran 2**32
    trips, reversed(range(3, 25, 5)) none."""
    if unsigned:
        start, stop = abs(start), abs(stop)
    dtype = np.uint32 if unsigned else np.int32
    out = np.full((len(_REVERSED_STEPS), 16), -99, np.int32)
    count = np.zeros(len(_REVERSED_STEPS), np.int32)
    REVERSED_RANGES[dtype](out, count, np.array([start, stop], dtype))
    for s, step in enumerate(_REVERSED_STEPS):
        want = list(reversed(range(start, stop, step)))
        assert count[s] == len(want) and out[s, :len(want)].tolist() == want
    assert out[0, 12:15].tolist() == [7, 4, 1]


# --------------------------------------------------------------------------- device functions
@td.func
def relu(x: f32) -> f32:
    if x < 0.0:
        return 0.0
    return x


@td.func
def scaled_relu(x: f32, s: f32) -> f32:
    r = relu(x)
    return r * s


@td.func
def load_or(T, i: i32, n: i32, fill: f32) -> f32:
    if i >= n:
        return fill
    return T[i]


@td.func
def accumulate(T, i: i32, v: f32):
    T[i] = T[i] + v


@td.func
def to_int(x: f32) -> i32:
    return x          # converted to the declared return type


@td.kernel(grid=lambda N: td.cdiv(N, 64), block=64)
def funcs(X: f32["N"], Y: f32["N"], Z: f32["N"], W: i32["N"]):
    i = blockIdx.x * 64 + threadIdx.x
    if i < N:
        Y[i] = scaled_relu(X[i], 3.0) + relu(0.0 - X[i])
        Z[i] = load_or(X, i + 2, N, 100.0)
        accumulate(Z, i, 0.5)
        W[i] = to_int(X[i] * 10.0)


@FEW
@given(n=SIZES, seed=st.integers(0, 2**16))
@example(n=1, seed=0)
def test_device_functions(n, seed):
    rng = np.random.default_rng(seed)
    x = rand_f32(rng, n)
    y, z, w = np.zeros(n, np.float32), np.zeros(n, np.float32), np.zeros(n, np.int32)
    funcs(x, y, z, w)
    np.testing.assert_allclose(y, np.maximum(x, 0) * 3 + np.maximum(-x, 0), rtol=1e-6)
    shifted = np.append(x[2:], np.full(min(n, 2), 100.0, np.float32))
    np.testing.assert_array_equal(z, shifted + np.float32(0.5))
    np.testing.assert_array_equal(w, np.trunc(x * np.float32(10)).astype(np.int32))


@td.func
def clamp_pos(x: f32, hi: f32) -> f32:
    if x > 0.0:
        if x > hi:
            return hi          # a return nested two ifs deep must end the function
    return x


@td.kernel(grid=1, block=8)
def nested_return_func(X: f32[8], Y: f32[8]):
    Y[threadIdx.x] = clamp_pos(X[threadIdx.x], 10.0)


def test_device_function_return_nested_in_ifs():
    x = np.array([-1, 5, 20, 11, 10, 0, -30, 9.5], np.float32)
    y = np.zeros(8, np.float32)
    nested_return_func(x, y)
    np.testing.assert_array_equal(y, np.where(x > 10, 10, x))


@td.kernel(grid=1, block=8)
def nested_return_kernel(X: f32[8], Y: f32[8]):
    i = threadIdx.x
    if i < 6:
        if X[i] < 0.0:
            return             # early return from the kernel: the store below must not run
    Y[i] = 1.0


def test_kernel_early_return_nested_in_ifs():
    x = np.array([-1, 2, -3, 4, 5, -6, -7, 8], np.float32)
    y = np.zeros(8, np.float32)
    nested_return_kernel(x, y)
    np.testing.assert_array_equal(y, [0, 1, 0, 1, 1, 0, 1, 1])


@td.kernel(grid=1, block=8)
def early_return_kernel(X: f32[8], Y: f32[8]):
    i = threadIdx.x
    if X[i] < 0.0:
        return
    Y[i] = X[i] * 2.0


def test_kernel_early_return():
    x = np.array([-1, 2, -3, 4, 5, -6, -7, 8], np.float32)
    y = np.full(8, 9.0, np.float32)
    early_return_kernel(x, y)
    np.testing.assert_array_equal(y, np.where(x < 0, 9, 2 * x))


@td.kernel(grid=1, block=8)
def return_in_unrolled_loop(Y: f32[8]):
    t = threadIdx.x
    for i in (0, 1, 2, 3):          # a compile-time tuple: the loop is unrolled
        if t % 5 == i:
            return                  # ...and ends here, as Python's does: no later iteration runs
        Y[t] += 1.0
    Y[t] += 10.0


def test_a_return_in_an_unrolled_loop_ends_it():
    """The unrolled iterations after a return ran (thread 0 stored 3, not 0) until session 50."""
    y = np.zeros(8, np.float32)
    return_in_unrolled_loop(y)
    want = [min(t % 5, 4) + (10 if t % 5 == 4 else 0) for t in range(8)]
    np.testing.assert_array_equal(y, want)


@td.func
def bucket(v: f32) -> f32:
    for c in (1.0, 2.0, 3.0):
        if v < c:
            return c            # the value of the first bucket (a later iteration's return overwrote it)
    return 0.0


@td.kernel(grid=1, block=8)
def buckets(X: f32[8], Y: f32[8]):
    Y[threadIdx.x] = bucket(X[threadIdx.x])


def test_a_device_function_returns_from_an_unrolled_loop():
    x = np.array([0.5, 1.5, 2.5, 3.5, -1, 1, 2, 9], np.float32)
    y = np.zeros(8, np.float32)
    buckets(x, y)
    np.testing.assert_array_equal(y, [next((c for c in (1, 2, 3) if v < c), 0) for v in x])


@td.func
def poly(x: f32, coeffs: tuple) -> f32:
    acc = 0.0
    for c in coeffs:            # a compile-time tuple argument
        acc = acc * x + c
    return acc


@td.func
def poly_twice(x: f32) -> f32:
    r = poly(poly(x, (1.0, 0.0)), (2.0, -1.0, 0.5))
    return r


@td.kernel(grid=1, block=16)
def nested_funcs(X: f32[16], Y: f32[16]):
    Y[threadIdx.x] = poly_twice(X[threadIdx.x])


def test_nested_device_functions_with_compile_time_args():
    x = np.linspace(-2, 2, 16).astype(np.float32)
    y = np.zeros(16, np.float32)
    nested_funcs(x, y)
    np.testing.assert_allclose(y, 2 * x ** 2 - x + 0.5, rtol=1e-6, atol=1e-6)


@td.func
def double(x: f32) -> f32:
    return x * 2.0


@td.func
def quadruple_plus_one(x: f32) -> f32:
    if x < 0.0:
        return double(x) + 1.0       # a call inside a return expression
    return double(double(x)) + 1.0


@td.kernel(grid=1, block=8)
def call_in_return(X: f32[8], Y: f32[8]):
    Y[threadIdx.x] = quadruple_plus_one(X[threadIdx.x])


def test_device_function_call_in_return_expression():
    x = np.array([-1, 0, 1, 2, -3, 4, 5, 6], np.float32)
    y = np.zeros(8, np.float32)
    call_in_return(x, y)
    np.testing.assert_array_equal(y, np.where(x < 0, 2 * x + 1, 4 * x + 1))


@td.func
def digit_sum(v: i32) -> i32:
    total = 0
    while v > 0:                  # a loop: the inlined call is statements, not one expression
        total += v % 10
        v //= 10
    return total


@td.func
def counted(CALLS, i: i32, j: i32, v: i32) -> i32:
    CALLS[i, j] = CALLS[i, j] + 1   # a side effect that shows whether the call ran
    return v


@td.kernel(grid=1, block=8)
def calls_in_conditions(X: i32[8], ROOT: i32[8], CALLS: i32[8, 4], Y: i32[8, 4]):
    t = threadIdx.x
    v = X[t]
    steps = 0
    while steps < 5 and digit_sum(v) > 9:   # the call runs again before every test of the condition
        v = digit_sum(v)
        steps += 1
    ROOT[t] = steps * 100 + digit_sum(v)
    Y[t, 0] = t < 4 and counted(CALLS, t, 0, t) > 1          # called only when t < 4
    Y[t, 1] = t < 4 or counted(CALLS, t, 1, t) > 5           # called only when t >= 4
    Y[t, 2] = counted(CALLS, t, 2, t) if t % 2 == 0 else -1  # called only for the chosen operand
    Y[t, 3] = 2 <= t <= counted(CALLS, t, 3, 5)              # called only when 2 <= t


def test_device_function_calls_in_loop_conditions_and_short_circuits():
    x = np.array([0, 9, 10, 99, 999999, 12345, 98765, 7], np.int32)
    root, calls, y = np.zeros(8, np.int32), np.zeros((8, 4), np.int32), np.zeros((8, 4), np.int32)
    calls_in_conditions(x, root, calls, y)

    def digits(v):
        return sum(map(int, str(v)))

    def python_root(v):
        steps = 0
        while steps < 5 and digits(v) > 9:
            v, steps = digits(v), steps + 1
        return steps * 100 + digits(v)

    t = np.arange(8)
    np.testing.assert_array_equal(root, [python_root(int(v)) for v in x])
    np.testing.assert_array_equal(calls, np.stack([t < 4, t >= 4, t % 2 == 0, t >= 2], axis=1))
    np.testing.assert_array_equal(y, np.stack([(t < 4) & (t > 1), (t < 4) | (t > 5), np.where(t % 2 == 0, t, -1),
                                               (2 <= t) & (t <= 5)], axis=1))


# --------------------------------------------------------------------------- scalar params
@td.kernel(grid=lambda N, chunk: td.cdiv(N, 32 * chunk), block=32)
def saxpy_chunked(X: f32["N"], Y: f32["N"], alpha: f32, shift: i32, chunk: i32):
    base = (blockIdx.x * 32 + threadIdx.x) * chunk
    for k in range(chunk):
        i = base + k
        if i < N:
            Y[i] = alpha * X[i] + Y[i] + shift


@FEW
@given(n=SIZES, alpha=st.floats(-4, 4, width=32), shift=st.integers(-100, 100), chunk=st.integers(1, 5),
       seed=st.integers(0, 2**16))
def test_scalar_params(n, alpha, shift, chunk, seed):
    rng = np.random.default_rng(seed)
    x, y = rand_f32(rng, n), rand_f32(rng, n)
    want = np.float32(alpha) * x + y + np.float32(shift)
    saxpy_chunked(x, y, alpha, shift, chunk)
    np.testing.assert_allclose(y, want, rtol=1e-5, atol=1e-5)


# --------------------------------------------------------------------------- 2-D and 3-D blocks
@td.kernel(grid=lambda N: (N // 384, 3, 2), block=(8, 4, 2))
def index_registers(Out: i32["N", 12]):
    b = (blockIdx.z * gridDim.y + blockIdx.y) * gridDim.x + blockIdx.x
    t = (threadIdx.z * blockDim.y + threadIdx.y) * blockDim.x + threadIdx.x
    g = b * 64 + t
    Out[g, 0] = threadIdx.x
    Out[g, 1] = threadIdx.y
    Out[g, 2] = threadIdx.z
    Out[g, 3] = blockIdx.x
    Out[g, 4] = blockIdx.y
    Out[g, 5] = blockIdx.z
    Out[g, 6] = blockDim.x
    Out[g, 7] = blockDim.y
    Out[g, 8] = blockDim.z
    Out[g, 9] = gridDim.x
    Out[g, 10] = gridDim.y
    Out[g, 11] = gridDim.z


@FEW
@given(gx=st.integers(1, 3))
def test_3d_blocks_and_grid_registers(gx):
    n = gx * 3 * 2 * 64
    out = np.full((n, 12), -1, np.int32)
    index_registers(out)
    bz, by, bx, tz, ty, tx = np.meshgrid(range(2), range(3), range(gx), range(2), range(4), range(8), indexing="ij")
    cols = [tx, ty, tz, bx, by, bz] + [np.full_like(tx, v) for v in (8, 4, 2, gx, 3, 2)]
    want = np.stack([c.reshape(-1) for c in cols], axis=1)
    np.testing.assert_array_equal(out, want)


@td.kernel(grid=lambda M, N: (td.cdiv(N, 16), td.cdiv(M, 8)), block=(16, 8))
def transpose_2d(X: f32["M", "N"], Y: f32["N", "M"]):
    r = blockIdx.y * blockDim.y + threadIdx.y
    c = blockIdx.x * blockDim.x + threadIdx.x
    if r < M and c < N:
        Y[c, r] = X[r, c]


@FEW
@given(m=SIZES, n=st.integers(1, 70), seed=st.integers(0, 2**16))
@example(m=1, n=1, seed=0)
def test_2d_block_transpose(m, n, seed):
    x = rand_f32(np.random.default_rng(seed), m, n)
    y = np.zeros((n, m), np.float32)
    transpose_2d(x, y)
    np.testing.assert_array_equal(y, x.T)


# --------------------------------------------------------------------------- registers and shared memory
@td.kernel(grid=lambda N: td.cdiv(N, 32 * 4), block=32)
def register_scan(X: f32["N"], Y: f32["N"]):
    regs = td.registers(f32, (4,))
    base = (blockIdx.x * 32 + threadIdx.x) * 4
    for k in range(4):
        regs[k] = X[base + k] if base + k < N else 0.0
    for k in range(1, 4):
        regs[k] += regs[k - 1]              # inclusive prefix sum of the thread's 4 values
    for k in range(4):
        if base + k < N:
            Y[base + k] = regs[3 - k]       # written back reversed


@FEW
@given(n=SIZES, seed=st.integers(0, 2**16))
@example(n=1, seed=0)
def test_registers(n, seed):
    x = rand_f32(np.random.default_rng(seed), n)
    y = np.zeros(n, np.float32)
    register_scan(x, y)
    padded = np.zeros(-(-n // 4) * 4, np.float32)
    padded[:n] = x
    want = np.cumsum(padded.reshape(-1, 4), axis=1, dtype=np.float32)[:, ::-1].reshape(-1)[:n]
    np.testing.assert_allclose(y, want, rtol=1e-6, atol=1e-6)


@td.kernel(grid=lambda N: td.cdiv(N, 32), block=32)
def register_gather(X: f32["N", 4], Sel: i32["N", 3], Y: f32["N", 3]):
    regs = td.registers(f32, (4,))
    r = blockIdx.x * 32 + threadIdx.x
    if r < N:
        for k in range(4):
            regs[k] = X[r, k]
        regs[Sel[r, 0]] += 10.0             # a register element picked by data
        for k in range(3):
            Y[r, k] = regs[Sel[r, k]]


@FEW
@given(n=SIZES, seed=st.integers(0, 2**16))
def test_registers_with_data_dependent_indices(n, seed):
    rng = np.random.default_rng(seed)
    x = rand_f32(rng, n, 4)
    sel = rng.integers(0, 4, size=(n, 3)).astype(np.int32)
    y = np.zeros((n, 3), np.float32)
    register_gather(x, sel, y)
    regs = x.copy()
    regs[np.arange(n), sel[:, 0]] += np.float32(10)
    np.testing.assert_array_equal(y, np.take_along_axis(regs, sel, axis=1))


@td.kernel(grid=lambda R: R, block=lambda W: W)
def row_sums_block_per_row(X: f32["R", "W"], Y: f32["R", "W"]):
    s = td.shared(f32, (256,))
    t = threadIdx.x
    s[t] = X[blockIdx.x, t]
    td.syncthreads()
    acc = 0.0
    for k in range(blockDim.x):             # blockDim comes from the block callable
        acc += s[k]
    Y[blockIdx.x, t] = acc - s[t]


@FEW
@given(rows=st.integers(1, 9), width=st.sampled_from([40, 256]), seed=st.integers(0, 2**16))
def test_block_shape_from_a_callable(rows, width, seed):
    x = np.random.default_rng(seed).integers(-9, 9, size=(rows, width)).astype(np.float32)
    y = np.zeros_like(x)
    row_sums_block_per_row(x, y)
    np.testing.assert_array_equal(y, x.sum(1, keepdims=True) - x)


@td.kernel(grid=lambda R: td.cdiv(R, 4), block=(32, 4))
def shuffle_rows(X: f32["R", 32], Y: f32["R", 32]):
    r = blockIdx.x * 4 + threadIdx.y
    v = X[r, threadIdx.x] if r < R else 0.0
    if threadIdx.y % 2 == 1:                # warp-uniform: threadIdx.y with blockDim.x == 32
        v = td.shfl_down(v, 1)
    else:
        v = td.shfl_up(v, 2)
    if r < R:
        Y[r, threadIdx.x] = v


@FEW
@given(rows=st.integers(1, 13), seed=st.integers(0, 2**16))
def test_shuffles_in_a_2d_block_under_warp_uniform_if(rows, seed):
    x = rand_f32(np.random.default_rng(seed), rows, 32)
    y = np.zeros_like(x)
    shuffle_rows(x, y)
    want = x.copy()
    for r in range(rows):
        if (r % 4) % 2 == 1:
            want[r, :31] = x[r, 1:]
        else:
            want[r, 2:] = x[r, :30]
    np.testing.assert_array_equal(y, want)


@td.kernel(grid=lambda M, N: (td.cdiv(N, 32), td.cdiv(M, 32)), block=(32, 8))
def transpose_shared(X: f32["M", "N"], Y: f32["N", "M"]):
    tile = td.shared(f32, (32, 33))     # padded against bank conflicts
    for k in range(0, 32, 8):
        r, c = blockIdx.y * 32 + threadIdx.y + k, blockIdx.x * 32 + threadIdx.x
        tile[threadIdx.y + k, threadIdx.x] = X[r, c] if r < M and c < N else 0.0
    td.syncthreads()
    for k in range(0, 32, 8):
        r, c = blockIdx.x * 32 + threadIdx.y + k, blockIdx.y * 32 + threadIdx.x
        if r < N and c < M:
            Y[r, c] = tile[threadIdx.x, threadIdx.y + k]


@FEW
@given(m=SIZES, n=SIZES, seed=st.integers(0, 2**16))
@example(m=1, n=1, seed=0)
@example(m=33, n=31, seed=0)
def test_shared_memory_transpose(m, n, seed):
    x = rand_f32(np.random.default_rng(seed), m, n)
    y = np.zeros((n, m), np.float32)
    transpose_shared(x, y)
    np.testing.assert_array_equal(y, x.T)


# --------------------------------------------------------------------------- atomics
@FEW
@given(n=SIZES, bins=st.integers(1, 40), seed=st.integers(0, 2**16))
@example(n=60000, bins=3, seed=0)        # many blocks hitting the same few bins
def test_atomic_add_histogram(n, bins, seed):
    vals = np.random.default_rng(seed).integers(0, bins, size=n).astype(np.int32)
    hist, total = np.zeros(bins, np.int32), np.zeros(1, np.float32)
    histogram(vals, hist, total)
    np.testing.assert_array_equal(hist, np.bincount(vals, minlength=bins))
    assert total[0] == n


@td.kernel(grid=lambda N: td.cdiv(N, 64), block=64)
def atomic_extrema(X: f32["N"], I: i32["N"], Mx: f32[1], Mn: f32[1], IMx: i32[1], IMn: i32[1], Sub: i32[1]):
    i = blockIdx.x * 64 + threadIdx.x
    if i < N:
        td.atomic_max(Mx[0], X[i])
        td.atomic_min(Mn[0], X[i])
        td.atomic_max(IMx[0], I[i])
        td.atomic_min(IMn[0], I[i])
        td.atomic_sub(Sub[0], I[i])


@FEW
@given(n=SIZES, seed=st.integers(0, 2**16), nan=st.booleans())
def test_atomic_max_min_sub(n, seed, nan):
    rng = np.random.default_rng(seed)
    x = rand_f32(rng, n, low=-100, high=100)
    if nan:     # float atomic max / min keep a NaN, whichever thread comes first (as td.max does)
        x[rng.integers(n)] = np.nan
    ints = rng.integers(-1000, 1000, size=n).astype(np.int32)
    mx, mn = np.array([-1e30], np.float32), np.array([1e30], np.float32)
    imx, imn, sub = np.array([-10**9], np.int32), np.array([10**9], np.int32), np.array([7], np.int32)
    atomic_extrema(x, ints, mx, mn, imx, imn, sub)
    np.testing.assert_array_equal([mx[0], mn[0]], [x.max(), x.min()])    # NaN if x has one
    assert imx[0] == ints.max() and imn[0] == ints.min()
    assert sub[0] == 7 - int(ints.sum())


@td.kernel(grid=lambda N: td.cdiv(N, 64), block=64)
def atomic_tickets(Counter: i32[1], Slot: i32[1], Ticket: i32["N"], Prev: i32["N"]):
    i = blockIdx.x * 64 + threadIdx.x
    if i < N:
        Ticket[i] = td.atomic_add(Counter[0], 1)    # the value before the add
        old = td.atomic_exch(Slot[0], i)
        Prev[i] = old


@FEW
@given(n=SIZES)
@example(n=1)
def test_atomics_return_old_value(n):
    counter, slot = np.array([5], np.int32), np.array([-1], np.int32)
    ticket, prev = np.zeros(n, np.int32), np.zeros(n, np.int32)
    atomic_tickets(counter, slot, ticket, prev)
    assert counter[0] == 5 + n
    np.testing.assert_array_equal(np.sort(ticket), np.arange(5, 5 + n))   # every ticket once
    # the exchanges form a chain: the old values plus the final value are the initial value plus every i
    np.testing.assert_array_equal(np.sort(np.append(prev, slot[0])), np.arange(-1, n))


@td.kernel(grid=lambda N: td.cdiv(N, 128), block=128)
def block_histogram(Vals: i32["N"], Hist: i32["G", 8]):
    local = td.shared(i32, (8,))
    t = threadIdx.x
    if t < 8:
        local[t] = 0
    td.syncthreads()
    i = blockIdx.x * 128 + t
    if i < N:
        td.atomic_add(local[Vals[i]], 1)        # shared-memory atomics
    td.syncthreads()
    if t < 8:
        Hist[blockIdx.x, t] = local[t]


@FEW
@given(n=SIZES, seed=st.integers(0, 2**16))
def test_shared_memory_atomics(n, seed):
    vals = np.random.default_rng(seed).integers(0, 8, size=n).astype(np.int32)
    g = -(-n // 128)
    hist = np.full((g, 8), -1, np.int32)
    block_histogram(vals, hist)
    padded = np.full(g * 128, -1)
    padded[:n] = vals
    want = np.stack([np.bincount(b[b >= 0], minlength=8) for b in padded.reshape(g, 128)])
    np.testing.assert_array_equal(hist, want)


# --------------------------------------------------------------------------- warp shuffles
def shuffle_reference(vals, mode, b, width, nthreads):
    """PTX shfl.sync semantics (segmask = 32 - width; up uses clamp 0, the others 0x1f)."""
    out = np.empty_like(vals)
    segmask = 32 - width
    for tid in range(nthreads):
        lane = tid % 32
        bval = int(b[tid]) & 31
        cval = 0 if mode == "up" else 31
        max_lane = (lane & segmask) | (cval & ~segmask)
        min_lane = lane & segmask
        if mode == "up":
            j = lane - bval
            ok = j >= max_lane
        elif mode == "down":
            j = lane + bval
            ok = j <= max_lane
        elif mode == "xor":
            j = lane ^ bval
            ok = j <= max_lane
        else:
            j = min_lane | (bval & ~segmask)
            ok = j <= max_lane
        src = tid - lane + (j if ok else lane)
        assert src < nthreads, "the test reads a lane of a partial warp that does not exist"
        out[tid] = vals[src]
    return out


def make_shuffle_kernel(block, width, dtype):
    @td.kernel(grid=lambda N: td.cdiv(N, block), block=block)
    def shuffles(X: dtype["N"], Out: dtype[4, "N"], mask: i32, delta: i32, mul: i32, add: i32):
        g = blockIdx.x * block + threadIdx.x
        v = X[g] if g < N else 0
        lane = threadIdx.x % 32
        a = td.shfl_xor(v, mask, width=width)
        b = td.shfl_down(v, delta, width=width)
        c = td.shfl_up(v, delta, width=width)
        d = td.shfl_idx(v, lane * mul + add, width=width)
        if g < N:
            Out[0, g] = a
            Out[1, g] = b
            Out[2, g] = c
            Out[3, g] = d

    return shuffles


SHUFFLE_CASES = [(64, 32, f32), (96, 8, f32), (48, 16, f32), (32, 4, i32)]
_shuffle_kernels = {}


@pytest.mark.parametrize("block,width,dtype", SHUFFLE_CASES, ids=lambda v: getattr(v, "name", str(v)))
@settings(max_examples=5, deadline=None)
@given(blocks=st.integers(1, 3), data=st.data())
def test_warp_shuffles(block, width, dtype, blocks, data):
    key = (block, width, dtype.name)
    if key not in _shuffle_kernels:
        _shuffle_kernels[key] = make_shuffle_kernel(block, width, dtype)
    kernel = _shuffle_kernels[key]
    n = data.draw(st.integers((blocks - 1) * block + 1, blocks * block), label="n")
    mask = data.draw(st.integers(0, width - 1), label="mask")
    delta = data.draw(st.integers(0, width), label="delta")
    mul = data.draw(st.integers(0, 7), label="mul")
    add = data.draw(st.integers(-40, 40), label="add")
    rng = np.random.default_rng(n * 7919 + mask)
    x = (rng.integers(-1000, 1000, size=n)).astype(dtype.numpy)
    out = np.zeros((4, n), dtype.numpy)
    kernel(x, out, mask, delta, mul, add)
    padded = np.zeros(blocks * block, dtype.numpy)
    padded[:n] = x
    for row, mode in enumerate(("xor", "down", "up", "idx")):
        want = []
        for blk in range(blocks):
            vals = padded[blk * block:(blk + 1) * block]
            lanes = np.arange(block) % 32
            b = {"xor": np.full(block, mask), "down": np.full(block, delta), "up": np.full(block, delta),
                 "idx": lanes * mul + add}[mode]
            want.append(shuffle_reference(vals, mode, b, width, block))
        np.testing.assert_array_equal(out[row], np.concatenate(want)[:n], err_msg=mode)


@td.kernel(grid=1, block=32)
def narrow_shuffles(B: td.u8[32], S: td.i16[32], H: td.f16[32], Out: td.i64[3, 32], F: f32[32]):
    t = threadIdx.x
    Out[0, t] = td.shfl_xor(B[t], 1)
    Out[1, t] = td.shfl_down(S[t], 3)
    Out[2, t] = td.shfl_xor(B[t] > 100, 2)      # a bool
    F[t] = td.shfl_idx(H[t], 5)


def test_shuffles_of_narrow_integers_halves_and_bools():
    lane = np.arange(32)
    b = (lane * 7).astype(np.uint8)
    s = (lane * -1000).astype(np.int16)
    h = np.linspace(-2, 2, 32).astype(np.float16)
    out, f = np.zeros((3, 32), np.int64), np.zeros(32, np.float32)
    narrow_shuffles(b, s, h, out, f)
    np.testing.assert_array_equal(out[0], b[lane ^ 1])
    np.testing.assert_array_equal(out[1], np.where(lane + 3 < 32, s[np.minimum(lane + 3, 31)], s))
    np.testing.assert_array_equal(out[2], (b > 100)[lane ^ 2])
    np.testing.assert_array_equal(f, np.full(32, h[5].astype(np.float32)))


@td.kernel(grid=1, block=32)
def xor_across_segments(X: f32[32], Out: f32[2, 32]):
    v = X[threadIdx.x]
    Out[0, threadIdx.x] = td.shfl_xor(v, 16, width=16)    # lanes 16..31 may read the earlier segment
    Out[1, threadIdx.x] = td.shfl_xor(v, 12, width=8)


def test_shfl_xor_lane_mask_beyond_width():
    # CUDA (PTX shfl.sync.bfly with c = ((32 - width) << 8) | 0x1f): a lane may read from an earlier
    # segment, while reading from a later one gives its own value.
    x = np.arange(32, dtype=np.float32) * 3
    out = np.zeros((2, 32), np.float32)
    xor_across_segments(x, out)
    for row, (mask, width) in enumerate(((16, 16), (12, 8))):
        want = shuffle_reference(x, "xor", np.full(32, mask), width, 32)
        np.testing.assert_array_equal(out[row], want)
    np.testing.assert_array_equal(out[0], np.concatenate([x[:16], x[:16]]))


@FEW
@given(n=SIZES, seed=st.integers(0, 2**16))
def test_warp_shuffle_reduction(n, seed):
    x = rand_f32(np.random.default_rng(seed), n)
    w = -(-n // 64) * 2
    out = np.zeros(w, np.float32)
    warp_sums(x, out)
    padded = np.zeros(w * 32, np.float64)
    padded[:n] = x
    np.testing.assert_allclose(out, padded.reshape(w, 32).sum(1), rtol=1e-5, atol=1e-5)


# --------------------------------------------------------------------------- task mappings
def _pairs(w):
    return [(w,), (15 - w,)]


PAIRS = td.TaskMapping((16,), 8, _pairs)     # worker w takes tasks w and 15 - w


@td.kernel(grid=1, block=32)
def custom_mapping(Out: i32[32], Hits: i32[32]):
    k = 0
    for (t) in (repeat(2) * PAIRS)(threadIdx.x):   # 8 workers on a block of 32 threads
        Out[t] = threadIdx.x * 100 + k
        k += 1
    Hits[threadIdx.x] = k


def test_custom_task_mapping():
    out, hits = np.full(32, -1, np.int32), np.zeros(32, np.int32)
    custom_mapping(out, hits)
    want = np.full(32, -1)
    for w in range(8):
        for k, t in enumerate((w, 15 - w, 16 + w, 31 - w)):
            want[t] = w * 100 + k
    np.testing.assert_array_equal(out, want)
    np.testing.assert_array_equal(hits, [4] * 8 + [0] * 24)   # threads 8..31 have no tasks


@td.kernel(grid=1, block=32)
def ranked_mapping(Out: i32[8, 24]):
    k = 0
    for i, j in (spatial(4, 8, ranks=[1, 0]) * repeat(2, 3, ranks=[1, 0]))(threadIdx.x):
        Out[i, j] = threadIdx.x * 100 + k
        k += 1


def test_mapping_with_ranks():
    out = np.full((8, 24), -1, np.int32)
    ranked_mapping(out)
    want = np.full((8, 24), -1)
    for w in range(32):
        si, sj = w % 4, w // 4                      # ranks=[1, 0]: dimension 0 varies fastest
        order = [(a, b) for b in range(3) for a in range(2)]   # repeat: dimension 1 outermost
        for k, (ri, rj) in enumerate(order):
            want[si * 2 + ri, sj * 3 + rj] = w * 100 + k
    np.testing.assert_array_equal(out, want)


@td.kernel(grid=lambda N: N, block=40)
def small_mapping(Out: i32["N", 8, 8], Hits: i32["N", 40]):
    hits = 0
    for i, j in (spatial(4, 4) * repeat(2, 2))(threadIdx.x):   # 16 workers, 40 threads
        Out[blockIdx.x, i, j] = threadIdx.x + blockIdx.x * 1000
        hits += 1
    Hits[blockIdx.x, threadIdx.x] = hits


@FEW
@given(n=st.integers(1, 5))
def test_mapping_with_fewer_workers_than_threads(n):
    out, hits = np.full((n, 8, 8), -1, np.int32), np.full((n, 40), -1, np.int32)
    small_mapping(out, hits)
    i, j = np.meshgrid(range(8), range(8), indexing="ij")
    owner = (i // 2) * 4 + j // 2
    np.testing.assert_array_equal(out, owner[None] + 1000 * np.arange(n)[:, None, None])
    np.testing.assert_array_equal(hits, np.tile([4] * 16 + [0] * 24, (n, 1)))


@td.kernel(grid=1, block=64)
def mapping_on_expression(Out: i32[4, 16]):
    warp, lane = threadIdx.x // 32, threadIdx.x % 32
    for i, j in spatial(2, 16)(lane):           # worker index is any integer expression
        if lane < 32:
            Out[warp * 2 + i, j] = threadIdx.x


def test_mapping_on_an_expression_worker():
    out = np.full((4, 16), -1, np.int32)
    mapping_on_expression(out)
    np.testing.assert_array_equal(out, np.arange(64).reshape(4, 16))


# --------------------------------------------------------------------------- inspection API
def test_ir_and_source_stages():
    x = np.zeros(10, np.float32)
    y = np.zeros(10, np.float32)
    assert "blockIdx.x" in axpb.ir(x, y, stage="frontend")
    assert axpb.ir(x, y, stage="lowered")
    assert "10" in axpb.ir(x, y, stage="cuda")           # sizes bound in the cuda stage
    cuda = axpb.source(x, y, target="cuda")
    assert '__global__' in cuda and "axpb" in cuda
    cpu = axpb.source(x, y, target="cpu")
    assert "njit" in cpu
    compiled = axpb.compile(x, y, target="cuda", arch="sm_80")
    assert isinstance(compiled.binary, bytes) and compiled.binary
    with pytest.raises(ValueError):
        axpb.ir(x, y, stage="nope")


def test_fast_compile_skips_unrolling_and_computes_the_same():
    @td.kernel(grid=1, block=4)
    def tile_sums(x: f32[4, 8], out: f32[4]):
        acc = td.registers(f32, (8,))
        for j in range(8):
            acc[j] = x[threadIdx.x, j] * 2.0
        s = 0.0
        for j in range(8):
            s += acc[j]
        out[threadIdx.x] = s

    x = np.arange(32, dtype=np.float32).reshape(4, 8)
    results, sources = [], []
    for fast in (False, True):
        td.fast_compile(fast)
        out = np.zeros(4, np.float32)
        tile_sums(x, out)
        results.append(out)
        sources.append(tile_sums.source(x, out, target="cpu"))
    np.testing.assert_allclose(results[0], 2 * x.sum(axis=1))
    np.testing.assert_array_equal(results[0], results[1])
    assert "for j in range" not in sources[0] and "acc_7" in sources[0]      # unrolled, elements in locals
    assert "while j < 8:" in sources[1]     # a loop (`codegen.counted_loop`)
