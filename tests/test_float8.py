"""The 8-bit floats f8e4m3 and f8e5m2 (OCP's E4M3 and E5M2): storage formats computed in f32, converted to as
CUDA's cuda_fp8.h converts with __NV_SATFINITE (to nearest even, once; saturated to the largest finite value).

The oracle of a rounding is a search over ml_dtypes' 256 values of the format for the nearest (ties to the even bit
pattern); the kernels run on the cpu target and, through tests/cuda_on_host.py, as CUDA C++ on the host (NVRTC
compiles them too, as it does every kernel the tests launch), and on a GPU in the @gpu twins.
"""
from __future__ import annotations

import math
import os

import ml_dtypes
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import taskdsl as td
from taskdsl import bf16, blockIdx, f8e4m3, f8e5m2, f16, f32, f64, i32, threadIdx
from taskdsl.ir import types as T

from .cuda_on_host import host_compiler, run_on_host

GPU_TWINS = True   # each test also runs as a @gpu twin on the cuda target (conftest.py)
FORMATS = {"f8e4m3": ml_dtypes.float8_e4m3fn, "f8e5m2": ml_dtypes.float8_e5m2}
needs_host_compiler = pytest.mark.skipif(host_compiler() is None, reason="no host C++ compiler ($CXX, g++, clang++)")


def _table(name: str) -> tuple[np.ndarray, np.ndarray]:
    """ml_dtypes' finite values of the format, as f64, and their bit patterns."""
    bits = np.arange(256, dtype=np.uint8)
    values = bits.view(FORMATS[name]).astype(np.float64)
    finite = np.isfinite(values)
    return values[finite], bits[finite]


def nearest_bits(x: float, name: str) -> int:
    """The bits of the format's value nearest to `x`, ties to the even pattern, saturated; a NaN's 0x7F."""
    values, bits = _table(name)
    largest = float(values.max())
    if math.isnan(x):
        return 0x7F
    x = min(max(x, -largest), largest)
    distance = np.abs(values - x)
    best = [int(b) for b in bits[distance == distance.min()]]
    even = [b for b in best if b & 1 == 0]      # neighbours' patterns differ by one: a tie has one even
    if len(even) > 1:       # +0 and -0: the zero of x's sign
        return 0x80 if math.copysign(1, x) < 0 else 0
    return even[0] if even else best[0]


def test_the_value_tables_and_the_cpu_helpers_match_ml_dtypes_and_the_cuda_formats():
    """Every bit pattern decodes to ml_dtypes' value; the numba helpers round with FLOAT8_FORMATS' arguments."""
    from taskdsl.backend.cpu import support
    for name, fmt in T.FLOAT8_FORMATS.items():
        want = np.arange(256, dtype=np.uint8).view(FORMATS[name]).astype(np.float32)
        np.testing.assert_array_equal(T.FLOAT8_VALUES[name], want)
        np.testing.assert_array_equal([getattr(support, f"{name}_to_f32")(np.uint8(b)) for b in range(256)], want)
        assert fmt[2] == float(np.abs(want[np.isfinite(want)]).max()) and np.isnan(want[T.FLOAT8_NAN])
        for x in (0.1, -3.3e4, 1e9, -math.inf, 2.0 ** -12, -0.0):
            assert getattr(support, f"f32_to_{name}")(x) == T.float8_bits(x, *fmt) == nearest_bits(x, name)


@settings(max_examples=300, deadline=None)
@given(st.floats(allow_nan=True, allow_infinity=True), st.sampled_from(sorted(FORMATS)))
def test_rounding_to_8_bits_is_to_the_nearest_even_and_saturates(x, name):
    assert T.float8_bits(x, *T.FLOAT8_FORMATS[name]) == nearest_bits(x, name)


def test_every_midpoint_rounds_to_even_once_from_f64():
    """Each value halfway between two neighbours rounds to the even one; a hair above or below it (in f64, where
    f32 would round it onto the tie first) to the nearer one."""
    for name, fmt in T.FLOAT8_FORMATS.items():
        values, _ = _table(name)
        values = np.unique(values)
        for low, high in zip(values[:-1], values[1:]):
            mid = (low + high) / 2
            for x in (mid, mid + abs(mid) * 2.0 ** -40, mid - abs(mid) * 2.0 ** -40):
                assert T.float8_bits(x, *fmt) == nearest_bits(x, name), (name, x)


def test_overflow_of_a_scalar_argument_is_what_rounding_would_change():
    """464 rounds to E4M3's 448 (a tie, to even), a hair above it would saturate; E5M2's tie above 57344 rounds
    up, past it."""
    assert not f8e4m3.overflows(464.0) and f8e4m3.overflows(464.0001) and not f8e4m3.overflows(math.inf)
    assert f8e5m2.overflows(61440.0) and not f8e5m2.overflows(61439.9)
    assert f16.overflows(65520.0) and not f16.overflows(65519.0) and f64.overflows(10 ** 400)


@td.kernel(grid=lambda N: td.cdiv(N, 64), block=64)
def to_8_bits(X32: f32["N"], X64: f64["N"], XI: i32["N"], XH: f16["N"], XB: bf16["N"],
              E: f8e4m3[5, "N"], M: f8e5m2[5, "N"]):
    i = blockIdx.x * 64 + threadIdx.x
    if i < N:
        for k, x in enumerate((X32[i], X64[i], XI[i], XH[i], XB[i])):    # unrolled: a tuple of the five types
            E[k, i] = f8e4m3(x)
            M[k, i] = x     # the store converts


@td.kernel(grid=lambda N: td.cdiv(N, 64), block=64)
def from_8_bits(E: f8e4m3["N"], M: f8e5m2["N"], F: f32[2, "N"], D: f64[2, "N"], H: f16[2, "N"], B: bf16[2, "N"],
                I: i32[2, "N"], EM: f8e5m2["N"], ME: f8e4m3["N"], S: f8e4m3["N"], Z: td.boolean[2, "N"]):
    i = blockIdx.x * 64 + threadIdx.x
    if i < N:
        F[0, i] = E[i]
        F[1, i] = f32(M[i])
        D[0, i] = f64(E[i])
        D[1, i] = M[i]
        H[0, i] = f16(E[i])
        H[1, i] = M[i]
        B[0, i] = bf16(E[i])
        B[1, i] = M[i]
        I[0, i] = i32(E[i])
        I[1, i] = i32(M[i])
        EM[i] = E[i]
        ME[i] = M[i]
        S[i] = E[i] * M[i] - E[i] if E[i] > M[i] else -E[i]     # arithmetic and comparisons in f32
        Z[0, i] = bool(E[i])
        Z[1, i] = M[i]


def _targets(kernel, inputs: list, outputs: list, host: bool) -> dict:
    """{'cpu': outputs[, 'cuda on host': outputs]} of `kernel` on `inputs` and fresh copies of `outputs`."""
    runs = {"cpu": [o.copy() for o in outputs]}
    kernel(*inputs, *runs["cpu"])
    if host:
        runs["cuda on host"] = [o.copy() for o in outputs]
        run_on_host(kernel, *inputs, *runs["cuda on host"])
    return runs


def assert_same_8_bit_floats(got: np.ndarray, want_bits, err_msg: str = "") -> None:
    """`got` (8-bit floats) holds the bit patterns `want_bits`, but where those are NaNs: any NaN (a GPU's conversion
    of an f16 NaN, by its cvt instruction, may give another than 0x7F)."""
    got_bits, want_bits = got.view(np.uint8), np.asarray(want_bits, np.uint8)
    name = "f8e4m3" if got.dtype == ml_dtypes.float8_e4m3fn else "f8e5m2"
    nan = np.isnan(T.FLOAT8_VALUES[name][want_bits])
    np.testing.assert_array_equal(np.isnan(T.FLOAT8_VALUES[name][got_bits]), nan, err_msg=err_msg)
    np.testing.assert_array_equal(got_bits[~nan], want_bits[~nan], err_msg=err_msg)


def _check_conversions_to_8_bits(x64: np.ndarray, host: bool) -> None:
    x32 = x64.astype(np.float32)
    with np.errstate(invalid="ignore"):
        xi = np.nan_to_num(np.clip(x64, -2.0 ** 31, 2.0 ** 31 - 1)).astype(np.int64).astype(np.int32)
    with np.errstate(over="ignore"):
        xh, xb = x64.astype(np.float16), x64.astype(ml_dtypes.bfloat16)
    n = x64.size
    runs = _targets(to_8_bits, [x32, x64, xi, xh, xb],
                    [np.zeros((5, n), ml_dtypes.float8_e4m3fn), np.zeros((5, n), ml_dtypes.float8_e5m2)], host)
    sources = [x32, x64, xi, xh, xb.astype(np.float32)]
    for target, outs in runs.items():
        for name, out in zip(("f8e4m3", "f8e5m2"), outs):
            want = [[nearest_bits(float(v), name) for v in row] for row in sources]
            assert_same_8_bit_floats(out, want, err_msg=f"{target} {name}")


@needs_host_compiler
def test_conversions_to_8_bits_from_every_type_round_once_on_both_targets():
    """f32, f64, i32, f16 and bf16 to both formats; 1 + 2**-4 + 2**-40 is above an E4M3 tie only in f64."""
    x64 = np.array([0.0, -0.0, 1.0, 1 + 2.0 ** -4, 1 + 3 * 2.0 ** -4, 1 + 2.0 ** -4 + 2.0 ** -40, 464.0, 465.0,
                    -1e6, 448.0, 57344.0, 61440.0, 2.0 ** -9, 2.0 ** -10, 3 * 2.0 ** -11, 2.0 ** -17, 2.0 ** -16,
                    np.nan, -np.nan, np.inf, -np.inf, 0.3, -17.5, 3e38, 7.0, 240.0], np.float64)
    _check_conversions_to_8_bits(x64, host=True)


@settings(max_examples=10, deadline=None)
@given(st.lists(st.floats(allow_nan=True, allow_infinity=True, width=64), min_size=1, max_size=67))
def test_conversions_to_8_bits_of_drawn_values(values):
    with np.errstate(over="ignore"):
        _check_conversions_to_8_bits(np.array(values, np.float64), host=False)


@needs_host_compiler
def test_conversions_from_8_bits_to_every_type_on_both_targets():
    """Every bit pattern of both formats to f32, f64, f16, bf16 (exact), i32 (truncated and saturated, NaN 0), the
    other format (rounded and saturated), bool (NaN true), and arithmetic done in f32 then rounded once."""
    bits = np.arange(256, dtype=np.uint8)
    e, m = bits.view(ml_dtypes.float8_e4m3fn), bits.view(ml_dtypes.float8_e5m2)
    n = bits.size
    outputs = [np.zeros((2, n), np.float32), np.zeros((2, n), np.float64), np.zeros((2, n), np.float16),
               np.zeros((2, n), ml_dtypes.bfloat16), np.zeros((2, n), np.int32), np.zeros(n, ml_dtypes.float8_e5m2),
               np.zeros(n, ml_dtypes.float8_e4m3fn), np.zeros(n, ml_dtypes.float8_e4m3fn), np.zeros((2, n), bool)]
    ef, mf = e.astype(np.float64), m.astype(np.float64)
    with np.errstate(invalid="ignore", over="ignore"):
        ints = [[T.i32.saturate(float(v)) for v in row] for row in (ef, mf)]
        arithmetic = np.where(ef > mf, (ef.astype(np.float32) * mf.astype(np.float32) - ef.astype(np.float32)),
                              -ef).astype(np.float64)
    for target, (f, d, h, b, i, em, me, s, z) in _targets(from_8_bits, [e, m], outputs, host=True).items():
        for got in (f, d, h, b.astype(np.float32)):
            np.testing.assert_array_equal(got.astype(np.float64), np.stack([ef, mf]), err_msg=target)
        np.testing.assert_array_equal(i, ints, err_msg=target)
        assert_same_8_bit_floats(em, [nearest_bits(v, "f8e5m2") for v in ef], err_msg=target)
        assert_same_8_bit_floats(me, [nearest_bits(v, "f8e4m3") for v in mf], err_msg=target)
        assert_same_8_bit_floats(s, [nearest_bits(v, "f8e4m3") for v in arithmetic], err_msg=target)
        np.testing.assert_array_equal(z, np.stack([ef, mf]) != 0, err_msg=target)     # NaN is true


@td.kernel(grid=lambda N: td.cdiv(N, 128), block=128)
def from_f32(X: f32["N"], E: f8e4m3["N"], M: f8e5m2["N"]):
    i = blockIdx.x * 128 + threadIdx.x
    if i < N:
        E[i] = X[i]
        M[i] = X[i]


def test_f32_values_of_every_exponent_round_to_8_bits_as_ml_dtypes_rounds_them():
    """The cpu target rounds an f32 by integer arithmetic on its bits (which vectorizes): every f32 exponent, with
    mantissas at, beside and between both formats' rounding boundaries, both signs, against ml_dtypes' conversion
    of the value clipped to the format's range (TASKDSL_EXHAUSTIVE=1: the test below, all 2**32 patterns)."""
    mantissas = {0, 1, 0x7fffff} | {k * (1 << (shift - 1)) + d for shift in (20, 21) for k in range(8)
                                     for d in (-1, 0, 1) if 0 <= k * (1 << (shift - 1)) + d <= 0x7fffff}
    bits = np.array([sign | (exp << 23) | m for sign in (0, 1 << 31) for exp in range(256) for m in sorted(mantissas)],
                    np.uint32)
    x = bits.view(np.float32)
    e, m = np.zeros(x.size, ml_dtypes.float8_e4m3fn), np.zeros(x.size, ml_dtypes.float8_e5m2)
    from_f32(x, e, m)
    nan = np.isnan(x)
    for got, dtype in ((e, ml_dtypes.float8_e4m3fn), (m, ml_dtypes.float8_e5m2)):
        largest = float(ml_dtypes.finfo(dtype).max)
        with np.errstate(invalid="ignore"):
            want = np.clip(x, -largest, largest).astype(dtype)
        np.testing.assert_array_equal(got.view(np.uint8)[~nan], want.view(np.uint8)[~nan])
        assert np.isnan(got[nan].astype(np.float32)).all()


@pytest.mark.skipif(os.environ.get("TASKDSL_EXHAUSTIVE") != "1", reason="TASKDSL_EXHAUSTIVE=1 runs it (about a minute)")
def test_every_f32_pattern_rounds_to_8_bits_as_ml_dtypes_rounds_it():
    """All 2**32 f32 bit patterns through the cpu kernel, 2**24 at a time, against ml_dtypes (clipped); NaNs to
    0x7F."""
    chunk = 1 << 24
    e, m = np.zeros(chunk, ml_dtypes.float8_e4m3fn), np.zeros(chunk, ml_dtypes.float8_e5m2)
    for start in range(0, 1 << 32, chunk):
        x = np.arange(start, start + chunk, dtype=np.uint64).astype(np.uint32).view(np.float32)
        from_f32(x, e, m)
        nan = np.isnan(x)
        for got, dtype in ((e, ml_dtypes.float8_e4m3fn), (m, ml_dtypes.float8_e5m2)):
            largest = float(ml_dtypes.finfo(dtype).max)
            with np.errstate(invalid="ignore"):
                want = np.clip(x, -largest, largest).astype(dtype).view(np.uint8)
            want[nan] = T.FLOAT8_NAN
            wrong = np.flatnonzero(got.view(np.uint8) != want)
            assert not wrong.size, f"{dtype.__name__}: f32 bits {x[wrong[:3]].view(np.uint32)} to {got[wrong[:3]]}"


@td.kernel(grid=1, block=1)
def fill(OUT: f8e4m3["N"], value: f8e4m3):
    for i in range(N):
        OUT[i] = value + f8e4m3(0.3)     # the constant rounded when compiled (0.3 -> 0.3125), the sum in f32


def test_an_8_bit_scalar_argument_rounds_once_and_refuses_a_value_it_would_saturate():
    out = np.zeros(3, ml_dtypes.float8_e4m3fn)
    fill(out, 464.0)                 # a tie: to 448, then 448 + 0.3125 rounds to 448
    np.testing.assert_array_equal(out.astype(np.float32), [448.0] * 3)
    fill(out, 1.0 + 2.0 ** -4 + 2.0 ** -40)      # 1.125 from the f64 (1.0 through f32), + 0.3125 -> 1.4375 -> 1.5
    np.testing.assert_array_equal(out.astype(np.float32), [1.5] * 3)
    with pytest.raises(ValueError, match="outside the range of f8e4m3 .it would saturate"):
        fill(out, 465.0)
    for value in (math.inf, -math.inf):     # no inf in the 8-bit formats here: it would saturate too
        with pytest.raises(ValueError, match="= -?inf is outside the range of f8e4m3 .it would saturate"):
            fill(out, value)
        with pytest.raises(ValueError, match="= -?inf is outside the range of f8e5m2 .it would saturate"):
            fill_both(np.zeros(1, ml_dtypes.float8_e5m2), np.zeros(1, ml_dtypes.bfloat16), value, 1.0)


def test_an_array_of_bits_is_taken_and_arrays_of_other_types_are_refused_with_the_conversion():
    """As bf16 takes uint16 bits, an 8-bit float takes uint8 ones; another float type asks for a conversion."""
    bits = np.zeros(3, np.uint8)
    fill(bits, 2.0)
    np.testing.assert_array_equal(bits.view(ml_dtypes.float8_e4m3fn).astype(np.float32), [2.25] * 3)
    with pytest.raises(TypeError, match=r"must have dtype float8_e4m3fn \(f8e4m3\), got float32.*"
                                        r"astype\(ml_dtypes.float8_e4m3fn\)"):
        fill(np.zeros(3, np.float32), 1.0)
    with pytest.raises(TypeError, match=r"float8_e4m3fn \(f8e4m3\), got float8_e5m2"):
        fill(np.zeros(3, ml_dtypes.float8_e5m2), 1.0)


@td.kernel(grid=1, block=32)
def shuffle_8_bits(E: f8e4m3[32], M: f8e5m2[32], OE: f8e4m3[32], OM: f8e5m2[32]):
    OE[threadIdx.x] = td.shfl_xor(E[threadIdx.x], 3)
    OM[threadIdx.x] = td.shfl_down(M[threadIdx.x], 1)


@needs_host_compiler
def test_8_bit_floats_move_through_shuffles_as_their_bits():
    """CUDA has no shuffle of cuda_fp8.h's types (NVRTC refused such a kernel): one moves as its byte."""
    bits = np.random.default_rng(0).permutation(256)[:64].astype(np.uint8)
    e, m = bits[:32].view(ml_dtypes.float8_e4m3fn), bits[32:].view(ml_dtypes.float8_e5m2)
    lanes = np.arange(32)
    runs = _targets(shuffle_8_bits, [e, m], [np.zeros(32, e.dtype), np.zeros(32, m.dtype)], True)
    for target, (oe, om) in runs.items():
        assert_same_8_bit_floats(oe, bits[:32][lanes ^ 3], err_msg=target)
        assert_same_8_bit_floats(om, bits[32:][np.minimum(lanes + 1, 31)], err_msg=target)


def test_the_type_names_and_numpy_dtypes():
    assert T.as_dtype("float8_e4m3fn") is f8e4m3 and T.as_dtype(ml_dtypes.float8_e5m2) is f8e5m2
    assert T.numpy_dtype(f8e5m2) == np.dtype(ml_dtypes.float8_e5m2) and f8e4m3.numpy == np.uint8
    assert T.promote(f8e4m3, f8e5m2) == f32 and T.promote(f8e4m3, f16) == f32 and T.promote(f8e4m3, f64) == f64
    assert f8e4m3.round(0.3) == 0.3125 and f8e5m2.round(1e9) == 57344.0 and math.isnan(f8e4m3.round(math.nan))


@td.kernel(grid=1, block=1)
def fill_both(OUT8: f8e5m2["N"], OUT16: bf16["N"], value8: f8e5m2, value16: bf16):
    for i in range(N):
        OUT8[i] = value8
        OUT16[i] = value16


def test_scalar_bits_reach_a_simulated_gpus_launch_as_the_values_they_hold(simulated_gpu):
    """8-bit float and bf16 scalars travel as their bits; the simulated GPU bound them again as numbers (a bf16 3.0,
    bits 0x4040, became 16448.0)."""
    out8, out16 = np.zeros(2, ml_dtypes.float8_e5m2), np.zeros(2, ml_dtypes.bfloat16)
    fill_both(out8, out16, -3.0, 3.0)
    assert simulated_gpu.launches
    np.testing.assert_array_equal(out8.astype(np.float32), [-3.0] * 2)
    np.testing.assert_array_equal(out16.astype(np.float32), [3.0] * 2)


def test_device_arrays_of_8_bit_floats_convert_on_a_simulated_gpu(simulated_gpu):
    """td.to_device and DeviceArray.numpy keep ml_dtypes' type; stdlib_ops.cast converts to and from it on the GPU."""
    import stdlib_ops
    x = (np.random.default_rng(0).standard_normal(1000) * 100).astype(np.float32)
    d8 = stdlib_ops.cast(td.to_device(x), ml_dtypes.float8_e4m3fn)
    h = d8.numpy()
    assert isinstance(d8, td.DeviceArray) and h.dtype == ml_dtypes.float8_e4m3fn
    assert_same_8_bit_floats(h, [nearest_bits(float(v), "f8e4m3") for v in x])
    np.testing.assert_array_equal(stdlib_ops.cast(td.to_device(h), np.float32).numpy(), h.astype(np.float32))
    assert len(simulated_gpu.launches) == 2
