"""The generated CUDA C++, run on the host (tests/cuda_on_host.py), against Python and numpy oracles.

CI has no GPU: elsewhere the CUDA sources are only compiled (NVRTC). Here they run, each CUDA thread a
host thread, so the generator's semantics (loops, floor division, barriers, shuffles) meet an oracle.
"""
from __future__ import annotations

import math

import ml_dtypes
import numpy as np
import pytest

import taskdsl as td
from taskdsl import bf16, blockIdx, f16, f32, f64, i8, i16, i32, i64, threadIdx, u8, u16, u32, u64

from .cuda_on_host import UnsupportedSource, host_compiler, run_on_host, run_source, unsupported
from .host_twin import HostTwins
from .kernels import histogram, tree_sum

pytestmark = pytest.mark.skipif(host_compiler() is None,
                                reason="no host C++ compiler ($CXX, g++ or clang++) to run CUDA sources on the host")


def run_both(kernel, inputs: list, outputs: list) -> dict:
    """{'cpu': outputs, 'cuda on host': outputs} of `kernel` on `inputs` and fresh copies of `outputs`."""
    runs = {"cpu": [o.copy() for o in outputs], "cuda on host": [o.copy() for o in outputs]}
    kernel(*inputs, *runs["cpu"])
    run_on_host(kernel, *inputs, *runs["cuda on host"])
    return runs


# --------------------------------------------------------------------------- the shim itself
@td.kernel(grid=1, block=4)
def fdiv(A: f32[4], B: f32[4], OUT: f32[4]):      # named like libm's fdiv (C23), which python has loaded
    t = threadIdx.x
    OUT[t] = A[t] / B[t]


def test_a_kernel_named_like_a_loaded_c_function_runs_itself():
    """The launcher called libm's `fdiv` in place of the kernel: its outputs stayed as they were, and a test
    comparing them with a cpu run's compared nothing it computed."""
    a, b = np.array([7, -1, 3, 9], np.float32), np.array([2, 4, -8, 3], np.float32)
    for target, (out,) in run_both(fdiv, [a, b], [np.zeros(4, np.float32)]).items():
        np.testing.assert_array_equal(out, a / b, err_msg=target)


# --------------------------------------------------------------------------- range() reads its stop once
@td.kernel(grid=1, block=4)
def trips(OUT: i64[4]):
    t = threadIdx.x
    n = t + 3
    count = 0
    for i in range(n):
        n = 1            # range() read n once: t + 3 trips
        count += 1
    OUT[t] = count


@td.kernel(grid=1, block=4)
def trips_from_memory(N: i64[4], OUT: i64[4]):
    t = threadIdx.x
    count = 0
    for i in range(1, N[t] + 1):
        N[t] = 0         # range() read N[t] once
        count += i
    OUT[t] = count


def test_range_reads_a_stop_the_body_reassigns_once():
    expected = np.array([t + 3 for t in range(4)])
    for target, (out,) in run_both(trips, [], [np.zeros(4, np.int64)]).items():
        np.testing.assert_array_equal(out, expected, err_msg=target)


def test_range_reads_a_stop_the_body_stores_to_once():
    n = np.array([2, 0, 5, 3], np.int64)
    expected = np.array([sum(range(1, k + 1)) for k in n])
    for target, (stops, out) in run_both(trips_from_memory, [], [n, np.zeros(4, np.int64)]).items():
        np.testing.assert_array_equal(out, expected, err_msg=target)
        np.testing.assert_array_equal(stops, [0, 0, 0, 0], err_msg=target)


# --------------------------------------------------------------------------- floor division and modulo
@td.kernel(grid=lambda N: td.cdiv(N, 64), block=64)
def divmod_kernel(A: i64["N"], B: i64["N"], C: i32["N"], D: i32["N"], Q: i64[6, "N"], R: i32[6, "N"]):
    i = blockIdx.x * 64 + threadIdx.x
    if i < N:
        a, b, c, d = A[i], B[i], C[i], D[i]
        Q[0, i] = a // b
        Q[1, i] = a % b
        Q[2, i] = a // 8             # a power of two: a shift, whatever a's sign
        Q[3, i] = a % 8
        Q[4, i] = a // -3
        Q[5, i] = a % -3
        R[0, i] = c // d
        R[1, i] = c % d
        R[2, i] = c // 16
        R[3, i] = c % 16
        R[4, i] = c // -7
        R[5, i] = c % -7


def test_floor_division_and_modulo_of_negative_integers_follow_python():
    rng = np.random.default_rng(7)
    n = 150
    edges = [(7, 2), (-7, 2), (7, -2), (-7, -2), (0, 3), (-1, 3), (1, -3), (-9, 3), (-8, 8), (-2**40 - 1, 5)]
    a = rng.integers(-2**62, 2**62, n)
    b = rng.integers(1, 2**20, n) * rng.choice([-1, 1], n)
    c = rng.integers(-2**31, 2**31, n).astype(np.int32)   # no INT_MIN // -1 (x86 traps; d is never -1)
    d = (rng.integers(2, 1000, n) * rng.choice([-1, 1], n)).astype(np.int32)
    for k, (p, q) in enumerate(edges):
        a[k], b[k] = p, q
        c[k], d[k] = max(p, -2**31), q
    runs = run_both(divmod_kernel, [a, b, c, d], [np.zeros((6, n), np.int64), np.zeros((6, n), np.int32)])
    cases = [(0, a, y, q, r) for y, q, r in [(b, 0, 1), (8, 2, 3), (-3, 4, 5)]] + \
            [(1, c, y, q, r) for y, q, r in [(d, 0, 1), (16, 2, 3), (-7, 4, 5)]]
    for which, x, y, q, r in cases:     # which: the i64 outputs or the i32 ones
        ys = np.broadcast_to(y, n)
        want_q, want_r = [int(p) // int(s) for p, s in zip(x, ys)], [int(p) % int(s) for p, s in zip(x, ys)]
        for target, outputs in runs.items():
            np.testing.assert_array_equal(outputs[which][q], want_q, err_msg=f"{target}: {x.dtype} //")
            np.testing.assert_array_equal(outputs[which][r], want_r, err_msg=f"{target}: {x.dtype} %")


# --------------------------------------------------------------------------- floats to integers
@td.kernel(grid=lambda N: td.cdiv(N, 64), block=64)
def to_integers(X: f32["N"], Y: f64["N"], S8: i8[2, "N"], S16: i16[2, "N"], S32: i32[2, "N"], S64: i64[2, "N"],
                U8: u8[2, "N"], U16: u16[2, "N"], U32: u32[2, "N"], U64: u64[2, "N"]):
    i = blockIdx.x * 64 + threadIdx.x
    if i < N:
        for row, v in ((0, X[i]), (1, Y[i])):
            S8[row, i] = i8(v)
            S16[row, i] = i16(v)
            S32[row, i] = i32(v)
            S64[row, i] = i64(v)
            U8[row, i] = u8(v)
            U16[row, i] = u16(v)
            U32[row, i] = u32(v)
            U64[row, i] = u64(v)


def saturated(values: np.ndarray, dtype) -> list:
    """The DSL reference's conversion, from its words: truncated toward zero, clamped to the type, NaN giving 0."""
    info = np.iinfo(dtype)
    return [0 if math.isnan(v) else int(info.min) if v <= info.min else int(info.max) if v >= info.max
            else math.trunc(v) for v in values.astype(np.float64)]


def test_floats_convert_to_integers_saturating_with_nan_as_zero():
    special = [np.nan, np.inf, -np.inf, 0.5, -0.5, -0.99, 127.9, 128.0, -128.5, -129.0, 255.9, 256.0, -1.0,
               65535.5, 65536.0, -32769.0, 2147483520.0, 2147483648.0, -2147483904.0, 4294967295.5, 9.2e18, -9.3e18,
               1.8e19, 2e19, 3.4e38, -3.4e38, 1e300, -1e300]
    y = np.concatenate([special, np.random.default_rng(3).standard_normal(40) * 10.0 ** np.arange(40) % 1e12])
    with np.errstate(over="ignore"):
        x = y.astype(np.float32)
    types = [np.int8, np.int16, np.int32, np.int64, np.uint8, np.uint16, np.uint32, np.uint64]
    runs = run_both(to_integers, [x, y], [np.zeros((2, len(y)), t) for t in types])
    for target, outputs in runs.items():
        for dtype, out in zip(types, outputs):
            for row, source in enumerate((x, y)):
                np.testing.assert_array_equal(out[row].astype(object), np.array(saturated(source, dtype), object),
                                              err_msg=f"{target}: {source.dtype} to {np.dtype(dtype)}")


@td.kernel(grid=1, block=4)
def after_a_conversion_that_cannot_fit(Y: f64[4], OUT: i64[4, 4]):
    t = threadIdx.x
    OUT[0, t] = i32(Y[t]) // i64(td.max(f64(3.4e38), f64(t)))  # the divisor's conversion provably does not fit
    OUT[1, t] = 5
    OUT[2, t] = i32(3.4e38) + u8(-3.5)                        # folded while translating, as at run time
    OUT[3, t] = i16(-1e9)


def test_code_after_a_conversion_that_cannot_fit_still_runs():
    """A C cast of a float that does not fit is undefined: LLVM (numba) dropped the kernel's stores around one
    it could prove out of range, silently. The conversions saturate now, on both targets."""
    y = np.array([np.nan, 1e300, -np.inf, 2.5])
    i64_max = 2**63 - 1
    expected = [[v // i64_max for v in saturated(y, np.int32)], [5] * 4, [2**31 - 1] * 4, [-2**15] * 4]
    for target, (out,) in run_both(after_a_conversion_that_cannot_fit, [y], [np.full((4, 4), 12345)]).items():
        np.testing.assert_array_equal(out, expected, err_msg=target)


# --------------------------------------------------------------------------- 16-bit floats
@td.kernel(grid=lambda N: td.cdiv(N, 64), block=64)
def to_16_bits(X32: f32["N"], X64: f64["N"], XI: i32["N"], H: f16[3, "N"], B: bf16[3, "N"], BACK: f32[2, "N"]):
    i = blockIdx.x * 64 + threadIdx.x
    if i < N:
        H[0, i] = f16(X32[i])
        H[1, i] = f16(X64[i])
        H[2, i] = f16(XI[i])
        B[0, i] = bf16(X32[i])
        B[1, i] = bf16(X64[i])
        B[2, i] = bf16(XI[i])
        BACK[0, i] = f32(H[0, i]) * 2.0 + f32(B[0, i])
        BACK[1, i] = f32(f16(f32(H[1, i]) * f32(B[1, i])))


def bf16_nearest_even(x: float) -> float:
    """`x` rounded once to bfloat16's 8 significant bits, ties to even (normal range: the test's values)."""
    if x == 0 or math.isnan(x) or math.isinf(x):
        return x
    m, e = math.frexp(x)            # x = m * 2**e, 0.5 <= |m| < 1: m * 2**8 is exact, round() ties to even
    return math.ldexp(round(m * 256), e - 8)


def test_16_bit_floats_round_to_nearest_even_from_every_type():
    """f16 and bf16 from f32, f64 and i32 round once, to nearest even, on both targets; numpy's float16 and an
    exact rounding of the value are the oracles. 1 + 2**-8 + 2**-40 is above a bfloat16 tie only in f64: through
    f32 it rounds twice, down to 1."""
    x64 = np.array([0.0, -0.0, 1.0, 1 + 2.0 ** -8, 1 + 3 * 2.0 ** -8, 1 + 2.0 ** -8 + 2.0 ** -40, -1 - 2.0 ** -11,
                    1 + 2.0 ** -11 + 2.0 ** -30, 65504.0, 65520.0, 1e5, -3.14159, 6.1e-5, 2.0 ** -24, 3e38,
                    np.nan, np.inf, -np.inf, 1234.5678, -0.1], np.float64)
    x32 = x64.astype(np.float32)
    xi = np.array([0, 1, -7, 2049, 2051, 65519, 65520, 100000, 16777217, -(2 ** 31),
                   3, 257, 258, 511, 513, -1, 4097, 12345, 99999, 2 ** 31 - 1], np.int32)
    n = x64.size
    runs = run_both(to_16_bits, [x32, x64, xi], [np.zeros((3, n), np.float16),
                                                 np.zeros((3, n), ml_dtypes.bfloat16), np.zeros((2, n), np.float32)])
    bf16_of = np.vectorize(bf16_nearest_even, otypes=[np.float64])
    with np.errstate(over="ignore", invalid="ignore"):      # to infinity, as the kernels do
        h = np.stack([x32.astype(np.float16), x64.astype(np.float16), xi.astype(np.float64).astype(np.float16)])
        b = np.stack([bf16_of(x32.astype(np.float64)), bf16_of(x64), bf16_of(xi.astype(np.float64))])
        back = np.stack([h[0].astype(np.float32) * 2 + b[0].astype(np.float32),
                         (h[1].astype(np.float32) * b[1].astype(np.float32)).astype(np.float16).astype(np.float32)])
    for target, (out_h, out_b, out_back) in runs.items():
        np.testing.assert_array_equal(out_h, h, err_msg=target)
        np.testing.assert_array_equal(out_b.astype(np.float64), b, err_msg=target)
        np.testing.assert_array_equal(out_back, back, err_msg=target)


@td.kernel(grid=1, block=4)
def extremes(A: f32[4], B: f32[4], A64: f64[4], B64: f64[4], A16: f16[4], B16: f16[4], AB: bf16[4], BB: bf16[4],
             OUT: f32[4, 4], OUT64: f64[2, 4], OUT16: f16[2, 4], OUTB: bf16[2, 4], RUNNING: f32[2], ATOMIC: f32[2]):
    t = threadIdx.x
    OUT[0, t] = td.max(A[t], B[t])
    OUT[1, t] = td.max(B[t], A[t])
    OUT[2, t] = td.min(A[t], B[t])
    OUT[3, t] = td.min(B[t], A[t])
    OUT64[0, t] = td.max(A64[t], B64[t])
    OUT64[1, t] = td.min(A64[t], B64[t])
    OUT16[0, t] = td.max(A16[t], B16[t])
    OUT16[1, t] = td.min(A16[t], B16[t])
    OUTB[0, t] = td.max(AB[t], BB[t])
    OUTB[1, t] = td.min(AB[t], BB[t])
    td.atomic_max(ATOMIC[0], A[t])
    td.atomic_min(ATOMIC[1], A[t])
    if t == 0:
        hi = B[0]
        lo = B[0]
        for j in range(4):         # a running extreme, as a reduction keeps it
            hi = td.max(hi, A[j])
            lo = td.min(lo, A[j])
        RUNNING[0] = hi
        RUNNING[1] = lo


def test_max_and_min_are_ieee_maximum_and_minimum_on_both_targets():
    """td.max / td.min are IEEE 754's maximum / minimum on the cpu (selects; LLVM's intrinsics in a running extreme)
    and in CUDA (td_max): a NaN wins, -0.0 is below 0.0 in either order, for f16, bf16, f32 and f64, in a running
    extreme and in atomics."""
    a = np.array([-0.0, 0.0, -0.0, np.nan], np.float32)
    b = np.array([0.0, -0.0, -0.0, 1.0], np.float32)
    outputs = [np.zeros((4, 4), np.float32), np.zeros((2, 4), np.float64), np.zeros((2, 4), np.float16),
               np.zeros((2, 4), ml_dtypes.bfloat16), np.zeros(2, np.float32), np.array([-0.0, 0.0], np.float32)]
    typed = [x.astype(t) for t in (np.float64, np.float16, ml_dtypes.bfloat16) for x in (a, b)]
    runs = run_both(extremes, [a, b, *typed], outputs)
    largest, smallest = [0.0, 0.0, -0.0, np.nan], [-0.0, -0.0, -0.0, np.nan]
    for target, (out, out64, out16, outb, running, atomic) in runs.items():
        for got, want in [(out[0], largest), (out[1], largest), (out[2], smallest), (out[3], smallest),
                          (out64[0], largest), (out64[1], smallest), (out16[0], largest), (out16[1], smallest),
                          (outb[0], largest), (outb[1], smallest), (running, [np.nan, np.nan]),
                          (atomic, [np.nan, np.nan])]:
            got = got.astype(np.float64)
            np.testing.assert_array_equal(got, want, err_msg=target)
            zeros = got == 0
            assert (np.signbit(got[zeros]) == np.signbit(np.array(want)[zeros])).all(), f"{target}: {got} vs {want}"
    a[3] = 1.0                     # without the NaN: the zeros' order decides nothing
    for target, (*_, running, atomic) in run_both(extremes, [a, b, *typed], outputs).items():
        np.testing.assert_array_equal(np.signbit(running), [False, True], err_msg=target)
        np.testing.assert_array_equal(atomic, [1.0, -0.0], err_msg=target)
        np.testing.assert_array_equal(np.signbit(atomic), [False, True], err_msg=target)


# --------------------------------------------------------------------------- barriers and shared memory
@td.kernel(grid=3, block=128)
def rotate_through_shared(X: f32[3, 128], OUT: f32[3, 128], SUMS: f32[3]):
    s = td.shared(f32, (128,))
    t = threadIdx.x
    b = blockIdx.x
    s[t] = X[b, t]
    td.syncthreads()
    v = s[(t * 5 + 7) % 128] + s[127 - t]
    td.syncthreads()             # every thread has read before any overwrites
    s[t] = v
    td.syncthreads()
    OUT[b, t] = s[(t + 1) % 128]
    td.syncthreads()
    h = 64
    while h > 0:                 # a tree sum of the new values, a barrier per level
        if t < h:
            s[t] += s[t + h]
        td.syncthreads()
        h //= 2
    if t == 0:
        SUMS[b] = s[0]


def test_barriers_order_the_exchanges_through_shared_memory():
    x = np.random.default_rng(3).integers(-50, 50, (3, 128)).astype(np.float32)    # sums exact in f32
    t = np.arange(128)
    v = x[:, (t * 5 + 7) % 128] + x[:, 127 - t]
    runs = run_both(rotate_through_shared, [x], [np.zeros((3, 128), np.float32), np.zeros(3, np.float32)])
    for target, (out, sums) in runs.items():
        np.testing.assert_array_equal(out, v[:, (t + 1) % 128], err_msg=target)
        np.testing.assert_array_equal(sums, v.sum(axis=1), err_msg=target)


def test_tree_sum_over_several_blocks():
    x = np.random.default_rng(4).integers(-9, 9, 700).astype(np.float32)
    out = np.zeros(3, np.float32)
    run_on_host(tree_sum, x, out)
    np.testing.assert_array_equal(out, [x[k * 256:(k + 1) * 256].sum() for k in range(3)])


@td.kernel(grid=(2, 3), block=(8, 4, 2))
def indices(OUT: i64[3, 2, 2, 4, 8]):
    OUT[blockIdx.y, blockIdx.x, threadIdx.z, threadIdx.y, threadIdx.x] = \
        ((blockIdx.y * 10 + blockIdx.x) * 10 + threadIdx.z) * 100 + threadIdx.y * 10 + threadIdx.x


def test_multidimensional_grids_and_blocks_number_their_threads():
    y, x, z, ty, tx = np.indices((3, 2, 2, 4, 8))
    for target, (out,) in run_both(indices, [], [np.full((3, 2, 2, 4, 8), -1, np.int64)]).items():
        np.testing.assert_array_equal(out, ((y * 10 + x) * 10 + z) * 100 + ty * 10 + tx, err_msg=target)


# --------------------------------------------------------------------------- warp shuffles
@td.kernel(grid=2, block=64)
def shuffles(X: i64[2, 64], Y: f32[2, 64], L: i32[64], OUT: i64[8, 2, 64], FOUT: f32[2, 2, 64],
             DOUT: f64[2, 64]):
    t = threadIdx.x
    b = blockIdx.x
    v = X[b, t]
    OUT[0, b, t] = td.shfl_xor(v, 5)
    OUT[1, b, t] = td.shfl_xor(v, 6, width=4)        # may read the earlier segment, never the later one
    OUT[2, b, t] = td.shfl_down(v, 3, width=8)
    OUT[3, b, t] = td.shfl_up(v, 2, width=4)
    OUT[4, b, t] = td.shfl_idx(v, L[t])              # run-time lanes: negative, past 31
    OUT[5, b, t] = td.shfl_idx(v, L[t], width=8)
    OUT[6, b, t] = td.shfl_down(v, 33)               # only the low 5 bits of the lane argument count
    OUT[7, b, t] = td.shfl_up(v, 1)
    w = Y[b, t]
    for off in (16, 8, 4, 2, 1):                     # a warp sum: every lane ends with it
        w += td.shfl_xor(w, off)
    FOUT[0, b, t] = w
    FOUT[1, b, t] = td.shfl_down(Y[b, t], 4, width=16)
    DOUT[b, t] = td.shfl_idx(f64(Y[b, t]) * 0.5, 31 - t % 32)


def shuffle_oracle(values: np.ndarray, kind: str, arg, width: int = 32) -> np.ndarray:
    """CUDA's __shfl_*_sync over the last axis (warps of 32 lanes), as the CUDA programming guide defines them."""
    lane = np.arange(values.shape[-1]) % 32
    base = np.arange(values.shape[-1]) - lane
    arg = np.broadcast_to(arg, lane.shape) & 31      # shfl.sync reads b[4:0]
    segment = lane // width * width
    if kind == "idx":
        source = segment + (arg & (width - 1))
    elif kind == "up":
        source = np.where(lane - arg >= segment, lane - arg, lane)
    elif kind == "down":
        source = np.where(lane + arg < segment + width, lane + arg, lane)
    else:
        source = np.where((lane ^ arg) < segment + width, lane ^ arg, lane)
    return values[..., base + source]


def test_warp_shuffles_follow_cuda():
    rng = np.random.default_rng(5)
    x = rng.integers(-2**62, 2**62, (2, 64))           # 64-bit values shuffle whole
    y = rng.integers(-100, 100, (2, 64)).astype(np.float32)
    lanes = rng.integers(-40, 70, 64).astype(np.int32)
    outputs = [np.zeros((8, 2, 64), np.int64), np.zeros((2, 2, 64), np.float32), np.zeros((2, 64), np.float64)]
    expected = [shuffle_oracle(x, "xor", 5), shuffle_oracle(x, "xor", 6, 4), shuffle_oracle(x, "down", 3, 8),
                shuffle_oracle(x, "up", 2, 4), shuffle_oracle(x, "idx", lanes), shuffle_oracle(x, "idx", lanes, 8),
                shuffle_oracle(x, "down", 33), shuffle_oracle(x, "up", 1)]
    warp_sums = np.repeat(y.reshape(2, 2, 32).sum(axis=2), 32, axis=1)
    for target, (out, fout, dout) in run_both(shuffles, [x, y, lanes], outputs).items():
        for k, want in enumerate(expected):
            np.testing.assert_array_equal(out[k], want, err_msg=f"{target}: OUT[{k}]")
        np.testing.assert_array_equal(fout[0], warp_sums, err_msg=target)
        np.testing.assert_array_equal(fout[1], shuffle_oracle(y, "down", 4, 16), err_msg=target)
        np.testing.assert_array_equal(dout, shuffle_oracle(y.astype(np.float64) * 0.5, "idx", 31 - np.arange(64) % 32),
                                      err_msg=target)


@td.kernel(grid=1, block=40)
def partial_warp(X: i32[40], OUT: i32[2, 40]):
    t = threadIdx.x
    v = X[t]
    OUT[0, t] = td.shfl_xor(v, 1)
    OUT[1, t] = td.shfl_idx(v, 2, width=8)


def test_shuffles_in_a_partial_last_warp():
    x = np.arange(40, dtype=np.int32) * 3 - 50
    expected = [shuffle_oracle(x, "xor", 1), shuffle_oracle(x, "idx", 2, 8)]
    for target, (out,) in run_both(partial_warp, [x], [np.zeros((2, 40), np.int32)]).items():
        np.testing.assert_array_equal(out, expected, err_msg=target)


# --------------------------------------------------------------------------- the helper itself
def test_a_deadlock_raises_instead_of_hanging():
    source = """extern "C" __global__ void __launch_bounds__(64) stuck(int* __restrict__ OUT) {
  if (threadIdx.x == 0) { __syncthreads(); } else { __syncwarp(0xffffffffu); }
  OUT[threadIdx.x] = 1;
}
"""
    with pytest.raises(RuntimeError, match="deadlock"):
        run_source(source, (1, 1, 1), (64, 1, 1), [np.zeros(64, np.int32)], "stuck")


def test_exited_threads_count_as_arrived_at_barriers():
    source = """extern "C" __global__ void __launch_bounds__(64) early(int* __restrict__ OUT, int n) {
  if ((int)threadIdx.x >= n) return;
  OUT[threadIdx.x] = (int)threadIdx.x;
  __syncthreads();
  int next = OUT[(threadIdx.x + 1) % n];
  __syncthreads();
  OUT[threadIdx.x] += next;
}
"""
    out = np.zeros(64, np.int32)
    run_source(source, (1, 1, 1), (64, 1, 1), [out, np.int32(40)], "early")
    t = np.arange(40)
    np.testing.assert_array_equal(out[:40], t + (t + 1) % 40)


def test_sources_the_host_cannot_run_are_refused():
    assert unsupported('asm volatile("cp.async.commit_group;" ::: "memory");') is None     # ptx_on_host.py's
    assert unsupported('asm volatile("bar.sync 0;" ::: "memory");') == "inline PTX 'bar.sync 0'"
    assert unsupported("#include <cuda_fp16.h>\n__half h;") is None
    with pytest.raises(UnsupportedSource, match="inline PTX 'membar.gl'"):
        run_source('extern "C" __global__ void k(int* X) {\n  asm volatile("membar.gl;" ::: "memory");\n}\n',
                   (1, 1, 1), (1, 1, 1), [np.zeros(1, np.int32)], "k")


def test_atomics_add_up_across_threads_and_blocks():
    """An i32 histogram and an f32 count over 2000 values in 32 blocks: the threads' read-modify-writes take
    turns, so none is lost (the f32 sum of ones is exact)."""
    values = np.random.default_rng(4).integers(0, 7, 2000).astype(np.int32)
    for target, (hist, total) in run_both(histogram, [values], [np.zeros(7, np.int32),
                                                               np.zeros(1, np.float32)]).items():
        np.testing.assert_array_equal(hist, np.bincount(values, minlength=7), err_msg=target)
        np.testing.assert_array_equal(total, [2000.0], err_msg=target)



def test_host_twins_compare_every_array_and_pass_over_what_they_cannot_run():
    """`TASKDSL_HOST_TWIN=1`'s checker (host_twin.py): a host run from the call's inputs must leave every array
    as the cpu kernel did (16-bit floats within two ulps); a cpu result it does not reproduce fails; an array
    passed twice is one array on the host too; an atomic kernel (its results may depend on the threads' order)
    and a compile run on zeros are passed over and counted."""
    twins = HostTwins()
    x = np.linspace(-3, 3, 77).astype(np.float16)
    out = np.zeros(77, np.float16)
    twins.call(to_16_bits_of_half, lambda: to_16_bits_of_half(x, out), (x, out))
    np.testing.assert_array_equal(out, (x.astype(np.float32) * 3).astype(np.float16))
    wrong = out.copy()
    with pytest.raises(AssertionError, match="to_16_bits_of_half', argument 1"):
        twins.call(to_16_bits_of_half, lambda: np.copyto(wrong, wrong * 2), (x, wrong))
    hist = [np.arange(64, dtype=np.int32) % 4, np.zeros(4, np.int32), np.zeros(1, np.float32)]
    twins.call(histogram, lambda: histogram(*hist), tuple(hist))
    zeros = np.zeros_like(x)
    twins.call(to_16_bits_of_half, lambda: to_16_bits_of_half(zeros, out), (zeros, out))     # a compile run
    y = x.copy()      # passed as both arguments: one copy for the host run, written in place
    twins.call(to_16_bits_of_half, lambda: to_16_bits_of_half(y, y), (y, y))
    np.testing.assert_array_equal(y, (x.astype(np.float32) * 3).astype(np.float16))
    assert twins.counts == {"ran": 3, "passed over: every input zero": 1,
                            "passed over: atomics (what they leave may depend on the threads' order)": 1}


@td.kernel(grid=lambda N: td.cdiv(N, 32), block=32)
def to_16_bits_of_half(X: f16["N"], OUT: f16["N"]):
    i = blockIdx.x * 32 + threadIdx.x
    if i < N:
        OUT[i] = f16(f32(X[i]) * 3.0)


def test_an_integer_division_by_zero_stops_the_launch_with_an_error():
    """x86 traps where a GPU gives an unspecified value: the host run raises instead of killing the process."""
    source = """extern "C" __global__ void __launch_bounds__(32) divide(int* __restrict__ OUT, int d) {
  OUT[threadIdx.x] = 7 / (d + (int)threadIdx.x % 2);
}
"""
    out = np.zeros(32, np.int32)
    with pytest.raises(RuntimeError, match="integer division by zero"):
        run_source(source, (1, 1, 1), (32, 1, 1), [out, np.int32(0)], "divide")
    run_source(source, (1, 1, 1), (32, 1, 1), [out, np.int32(1)], "divide")     # the process lives on
    np.testing.assert_array_equal(out, 7 // (1 + np.arange(32) % 2))


@td.kernel(grid=1, block=1)
def nan_to_zero_of_atomics(C: f32[1], OUT: f32[1]):
    OUT[0] = td.atomic_add(C[0], 1.0) + 0.0 if td.atomic_add(C[0], 1.0) == td.atomic_add(C[0], 1.0) else 0.0


@td.kernel(grid=1, block=4)
def u64_trips(S: u64[4], E: u64[4], OUT: i64[4]):
    n = 0
    for i in range(S[threadIdx.x], E[threadIdx.x]):
        n += 1
    OUT[threadIdx.x] = n


def test_atomics_that_look_alike_are_each_made_and_u64_ranges_count_as_python():
    """`a + 0.0 if a == a else 0.0` of three atomics became the one-operand nan_to_zero of one (both targets: the
    sum made once, not twice); numba counted a u64 range from 2**64 - 2 to 1 as 3 trips (the difference, wrapped)."""
    runs = run_both(nan_to_zero_of_atomics, [], [np.zeros(1, np.float32), np.full(1, -1.0, np.float32)])
    for target, (c, out) in runs.items():      # 0 == 1 is false: the else side, no third atomic
        assert (c[0], out[0]) == (2.0, 0.0), target
    starts = np.array([2**64 - 2, 2**63 - 1, 5, 2**63], np.uint64)
    stops = np.array([1, 2**63 + 2, 9, 2**63 + 3], np.uint64)
    want = [len(range(int(s), int(e))) for s, e in zip(starts, stops)]
    for target, (out,) in run_both(u64_trips, [starts, stops], [np.zeros(4, np.int64)]).items():
        assert out.tolist() == want, target
