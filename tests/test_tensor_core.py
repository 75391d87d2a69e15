"""Tensor cores (mma_m16n8k16, ldmatrix), syncwarp and asynchronous copies (cp_async).

Each instruction runs on the cpu target and is compared with a numpy model written here
from the PTX ISA's fragment-layout tables (not from taskdsl's emulation); the CUDA of each
kernel compiles with NVRTC for sm_80 and sm_90 (the conftest compiles every launched
kernel for sm_90 too), and runs on the host against the same models (the `host` twin:
tests/ptx_on_host.py emulates the PTX). Misuse is a DSLError at the offending line.
"""
import functools
import re

import ml_dtypes
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import taskdsl as td
from taskdsl import bf16, blockIdx, f16, f32, i8, i16, i32, threadIdx

from .markers import Markers

GPU_TWINS = True   # every test also runs as a @gpu twin on the cuda target (conftest.py)
HOST_RUNS = True   # and with its kernels' CUDA source run on the host, the inline PTX emulated (ptx_on_host.py)

FEW = settings(max_examples=6, deadline=None)
MARKS = Markers(__file__)
NUMPY_16 = {"f16": np.float16, "bf16": ml_dtypes.bfloat16, "i16": np.int16}


# --------------------------------------------------------------------------- the PTX ISA layouts
# mma.m16n8k16 with .f16/.bf16 inputs and .f32 accumulators; groupID = lane >> 2,
# threadID_in_group = lane % 4. Each returns the (row, col) of matrix element `r` of `lane`.
def a_position(lane, r):
    """a0,a1: (groupID, 2*tig + i); a2,a3: row + 8; a4,a5: col + 8; a6,a7: both + 8."""
    return (lane >> 2) + 8 * (r // 2 % 2), (lane % 4) * 2 + r % 2 + 8 * (r // 4)


def b_position(lane, r):
    """b0,b1: (k = 2*tig + i, n = groupID); b2,b3: k + 8."""
    return (lane % 4) * 2 + r % 2 + 8 * (r // 2), lane >> 2


def c_position(lane, r):
    """c0,c1: (groupID, 2*tig + i); c2,c3: row + 8."""
    return (lane >> 2) + 8 * (r // 2), (lane % 4) * 2 + r % 2


def layout_table(position, regs: int) -> np.ndarray:
    """int32 [32, regs, 2]: the (row, col) each lane's register holds."""
    return np.array([[position(lane, r) for r in range(regs)] for lane in range(32)], np.int32)


@pytest.mark.parametrize("position, regs, shape", [(a_position, 8, (16, 16)), (b_position, 4, (16, 8)),
                                                   (c_position, 4, (16, 8))])
def test_layout_tables_cover_each_element_once(position, regs, shape):
    assert_covers_each_element_once(position, regs, shape)


def assert_covers_each_element_once(position, regs: int, shape: tuple) -> None:
    """The 32 lanes' `regs` elements placed by `position` cover a `shape` matrix, each element once."""
    cells = layout_table(position, regs).reshape(-1, 2)
    assert len({tuple(c) for c in cells}) == cells.shape[0] == shape[0] * shape[1]
    assert cells.max(axis=0).tolist() == [shape[0] - 1, shape[1] - 1]


# --------------------------------------------------------------------------- mma
@functools.cache
def mma_kernel(dtype):
    """Warp w of a (32, W) block loads A[w], B[w], C[w] by the layout tables and does one mma."""
    @td.kernel(block=lambda W: (32, W))
    def mma(A: dtype["W", 16, 16], B: dtype["W", 16, 8], C: f32["W", 16, 8],
            AI: i32[32, 8, 2], BI: i32[32, 4, 2], CI: i32[32, 4, 2]):
        a = td.registers(dtype, (2, 8))      # fragments may be slices of bigger register arrays
        b = td.registers(dtype, (4,))
        c = td.registers(f32, (3, 4))
        lane, w = threadIdx.x, threadIdx.y
        for r in range(8):
            a[1, r] = A[w, AI[lane, r, 0], AI[lane, r, 1]]
        for r in range(4):
            b[r] = B[w, BI[lane, r, 0], BI[lane, r, 1]]
            c[2, r] = C[w, CI[lane, r, 0], CI[lane, r, 1]]
        td.mma_m16n8k16(a[1], b, c[2])
        for r in range(4):
            C[w, CI[lane, r, 0], CI[lane, r, 1]] = c[2, r]
    return mma


@FEW
@given(dtype=st.sampled_from([f16, bf16]), warps=st.sampled_from([1, 2]), seed=st.integers(0, 2**16))
def test_mma_matches_numpy(dtype, warps, seed):
    rng = np.random.default_rng(seed)
    a = rng.standard_normal((warps, 16, 16)).astype(NUMPY_16[dtype.name])
    b = rng.standard_normal((warps, 16, 8)).astype(NUMPY_16[dtype.name])
    c = rng.standard_normal((warps, 16, 8)).astype(np.float32)
    expected = a.astype(np.float64) @ b.astype(np.float64) + c    # the products of 16-bit inputs are exact
    mma_kernel(dtype)(a, b, c, layout_table(a_position, 8), layout_table(b_position, 4),
                      layout_table(c_position, 4))
    np.testing.assert_allclose(c, expected, rtol=1e-5, atol=1e-4)   # f32 sums, in the hardware's order on a GPU


def test_mma_passes_the_debug_mode_checks():
    # The emulation's scratch exchange is bounds-checked (its syncwarps order the exchange, not the kernel's own
    # accesses: the race check leaves both out).
    td.debug(True)
    rng = np.random.default_rng(3)
    a, b = (rng.standard_normal((1, 16, n)).astype(np.float16) for n in (16, 8))
    c = np.zeros((1, 16, 8), np.float32)
    mma_kernel(f16)(a, b, c, layout_table(a_position, 8), layout_table(b_position, 4), layout_table(c_position, 4))
    np.testing.assert_allclose(c, a.astype(np.float64) @ b.astype(np.float64), rtol=1e-5, atol=1e-4)


def _every_pattern_widened(convert) -> tuple:
    """(every 16-bit pattern, `convert` (a numba function: bits -> f32) of each)."""
    from numba import njit

    @njit
    def widen(bits, out):
        for i in range(bits.size):
            out[i] = convert(bits[i])

    bits = np.arange(2**16, dtype=np.uint16)
    out = np.empty(2**16, np.float32)
    widen(bits, out)
    return bits, out


@pytest.mark.parametrize("name, numpy_type", [("f16", np.float16), ("bf16", ml_dtypes.bfloat16)])
def test_16_bit_to_f32_is_exact_for_every_bit_pattern(name, numpy_type):
    # The cpu emulation of mma widens fragments with these helpers (F16C's instruction, or bit manipulations; a
    # bitcast for bf16).
    from taskdsl.backend.cpu import support
    bits, out = _every_pattern_widened(getattr(support, f"{name}_to_f32"))
    want = bits.view(numpy_type).astype(np.float32).view(np.uint32)
    # a signaling NaN may come out quiet (IEEE 754's conversion, and F16C's vcvtph2ps): sign and payload kept
    quiet = np.uint32(0x00400000)
    nan = np.isnan(bits.view(numpy_type).astype(np.float32))
    np.testing.assert_array_equal(np.where(nan, out.view(np.uint32) | quiet, out.view(np.uint32)),
                                  np.where(nan, want | quiet, want))


def test_the_software_f16_widening_is_exact_for_every_bit_pattern():
    """The conversion hosts without F16C run (this one may use the instruction): exact, signaling NaNs too."""
    from numba import njit

    from taskdsl.backend.cpu import support
    bits, out = _every_pattern_widened(njit(support._f32_of_f16_bits_in_software))
    np.testing.assert_array_equal(out.view(np.uint32), bits.view(np.float16).astype(np.float32).view(np.uint32))


@pytest.mark.parametrize("path, numpy_type", [("f16 instruction", np.float16), ("f16 software", np.float16),
                                              ("bf16", ml_dtypes.bfloat16)])
def test_f32_to_16_bits_rounds_to_nearest_even_as_numpy(path, numpy_type):
    """The roundings of f32 to f16 (F16C's instruction where the host has it, the bit manipulations elsewhere) and
    to bf16 (integer arithmetic on the bits) against numpy and ml_dtypes: ties, subnormals, overflow to inf, the
    largest finite values, random bit patterns (NaNs compared as NaNs of the same sign)."""
    from numba import njit

    from taskdsl.backend.cpu import support
    if path == "f16 instruction" and not support.HARDWARE_HALVES:
        pytest.skip("the host has no F16C (or numba compiles for a named cpu)")
    rounding = {"f16 instruction": support._f16_bits_by_hardware, "bf16": njit(support._bf16_bits_of_f32),
                "f16 software": njit(lambda x: np.uint16(support._round_to_bits(x, 10, 15, 31)))}[path]

    @njit
    def narrow(x, out):
        for i in range(x.size):
            out[i] = rounding(x[i])

    ties = (np.arange(1, 2048, dtype=np.float32) + 0.5) * np.float32(2.0**-10)
    edges = np.array([0, -0.0, 65504, 65519.99, 65520, -65520, 2.0**-24, 2.0**-25, 1.5 * 2.0**-25, 2.0**-14,
                      np.inf, -np.inf, np.nan, -np.nan, 3.3895314e38, np.finfo(np.float32).max, 1e-45],
                     np.float32)
    randoms = np.random.default_rng(5).integers(0, 2**32, 200_000, dtype=np.uint64).astype(np.uint32).view(np.float32)
    x = np.concatenate([ties, edges, randoms, randoms * np.float32(2.0**-100)])
    out = np.empty(x.size, np.uint16)
    narrow(x, out)
    with np.errstate(all="ignore"):
        want = x.astype(numpy_type)
    got = out.view(numpy_type)
    nan = np.isnan(want)
    np.testing.assert_array_equal(np.isnan(got), nan)
    np.testing.assert_array_equal(np.signbit(got[nan]), np.signbit(want[nan]))
    np.testing.assert_array_equal(out[~nan], want[~nan].view(np.uint16))


# --------------------------------------------------------------------------- ldmatrix
ROWS, COLS = 64, 24      # a shared tile whose rows are 48 bytes; row addresses are 16-byte aligned


@functools.cache
def ldmatrix_kernel(dtype, num: int, trans: bool):
    """Each of two warps loads `num` matrices whose rows lane l points at: s[rows[l], cols[l]]."""
    @td.kernel(block=64)
    def ldm(X: dtype[ROWS, COLS], rows: i32[64], cols: i32[64], Out: dtype[64, 2 * num]):
        s = td.shared(dtype, (ROWS, COLS))
        t = threadIdx.x
        for j in range(COLS):
            s[t, j] = X[t, j]
        td.syncthreads()
        frag = td.registers(dtype, (2 * num,))
        td.ldmatrix(frag, s[rows[t], cols[t]], trans=trans)
        for i in range(2 * num):
            Out[t, i] = frag[i]
    return ldm


def ldmatrix_model(x, rows, cols, num, trans):
    """PTX ldmatrix: lanes 8j..8j+7 give the rows of matrix j; lane l receives elements
    (l // 4, 2 * (l % 4) + i) of matrix j in registers 2j + i, of its transpose with .trans."""
    flat = x.reshape(-1)
    out = np.zeros((64, 2 * num), x.dtype)
    for warp in range(2):
        for j in range(num):
            starts = [rows[32 * warp + 8 * j + r] * COLS + cols[32 * warp + 8 * j + r] for r in range(8)]
            matrix = np.stack([flat[s:s + 8] for s in starts])
            if trans:
                matrix = matrix.T
            for lane in range(32):
                out[32 * warp + lane, 2 * j:2 * j + 2] = matrix[lane // 4, 2 * (lane % 4):2 * (lane % 4) + 2]
    return out


@FEW
@given(num=st.sampled_from([1, 2, 4]), trans=st.booleans(), seed=st.integers(0, 2**16))
def test_ldmatrix_matches_numpy(num, trans, seed):
    rng = np.random.default_rng(seed)
    x = rng.permutation(ROWS * COLS).reshape(ROWS, COLS).astype(np.float16)   # distinct, exact values
    rows = rng.integers(0, ROWS, 64).astype(np.int32)
    cols = (8 * rng.integers(0, COLS // 8, 64)).astype(np.int32)
    out = np.zeros((64, 2 * num), np.float16)
    ldmatrix_kernel(f16, num, trans)(x, rows, cols, out)
    np.testing.assert_array_equal(out, ldmatrix_model(x, rows, cols, num, trans))


@pytest.mark.parametrize("dtype", [bf16, i16])
def test_ldmatrix_moves_any_16_bit_type(dtype):
    rng = np.random.default_rng(7)
    x = rng.permutation(ROWS * COLS).reshape(ROWS, COLS).astype(NUMPY_16[dtype.name])
    rows, cols = rng.permutation(64).astype(np.int32), np.full(64, 16, np.int32)
    out = np.zeros((64, 8), x.dtype)
    ldmatrix_kernel(dtype, 4, True)(x, rows, cols, out)
    np.testing.assert_array_equal(out, ldmatrix_model(x, rows, cols, 4, True))


# --------------------------------------------------------------------------- a tensor-core matmul
BM, BN, BK = 32, 32, 16   # a block tile; four warps of 16 x 16, each two m16n8k16 tiles wide


@td.kernel(grid=lambda M, N: (td.cdiv(N, BN), td.cdiv(M, BM)), block=128)
def tc_matmul(A: f16["M", "K"], B: f16["K", "N"], C: f32["M", "N"]):
    sa = td.shared(f16, (BM, BK))
    sb = td.shared(f16, (BK, BN))
    a_frag = td.registers(f16, (8,))
    b_frag = td.registers(f16, (2, 4))
    acc = td.registers(f32, (2, 4))
    t = threadIdx.x
    lane, wm, wn = t % 32, t // 64, t // 32 % 2
    for ni in range(2):
        for r in range(4):
            acc[ni, r] = 0.0
    for k0 in range(0, K, BK):
        if t < 64:     # A tile: 32 rows of two 16-byte copies; rows past M are zero-filled
            r, c = t // 2, t % 2 * 8
            td.cp_async(sa[r, c], A[blockIdx.y * BM + r, k0 + c], 8, pred=blockIdx.y * BM + r < M)
        else:          # B tile: 16 rows of four 16-byte copies
            r, c = (t - 64) // 4, (t - 64) % 4 * 8
            td.cp_async(sb[r, c], B[k0 + r, blockIdx.x * BN + c], 8, pred=blockIdx.x * BN + c < N)
        td.cp_async_commit()
        td.cp_async_wait(n=0)                 # (the keyword form the docs show)
        td.syncthreads()
        td.ldmatrix(a_frag, sa[wm * 16 + lane % 16, lane // 16 * 8])        # x4: the 16 x 16 A tile
        for ni in range(2):
            td.ldmatrix(b_frag[ni], sb[lane % 16, wn * 16 + ni * 8], trans=True)   # x2.trans: 16 x 8 of B
            td.mma_m16n8k16(a_frag, b_frag[ni], acc[ni])
        td.syncthreads()
    for ni in range(2):
        for r in range(4):
            gi = blockIdx.y * BM + wm * 16 + lane // 4 + r // 2 * 8
            gj = blockIdx.x * BN + wn * 16 + ni * 8 + lane % 4 * 2 + r % 2
            if gi < M and gj < N:
                C[gi, gj] = acc[ni, r]


@FEW
@given(m=st.integers(1, 5), n=st.integers(1, 5), k=st.integers(1, 4), seed=st.integers(0, 2**16))
def test_tensor_core_matmul_matches_numpy(m, n, k, seed):
    rng = np.random.default_rng(seed)
    a = rng.standard_normal((16 * m, 16 * k)).astype(np.float16)
    b = rng.standard_normal((16 * k, 16 * n)).astype(np.float16)
    c = np.full((16 * m, 16 * n), np.nan, np.float32)
    tc_matmul(a, b, c)
    np.testing.assert_allclose(c, a.astype(np.float64) @ b.astype(np.float64), rtol=1e-5, atol=1e-4)


def test_the_tensor_core_matmul_is_silent_in_debug_mode():
    """cp_async, ldmatrix and mma between barriers: no race reported, the same product."""
    rng = np.random.default_rng(5)
    a, b = rng.standard_normal((40, 32)).astype(np.float16), rng.standard_normal((32, 40)).astype(np.float16)
    c = np.full((40, 40), np.nan, np.float32)
    td.debug(True)
    tc_matmul(a, b, c)
    np.testing.assert_allclose(c, a.astype(np.float64) @ b.astype(np.float64), rtol=1e-5, atol=1e-4)


# --------------------------------------------------------------------------- cp_async
@functools.cache
def copy_kernel(dtype, n: int):
    """Blocks of 64 threads copy 16-row tiles of X (rows of 4n elements) in two commit groups,
    tile rows past R zero-filled; each group is used after waiting for it."""
    width = 4 * n

    @td.kernel(grid=lambda R: td.cdiv(R, 16), block=64)
    def copy(X: dtype["R", width], Out: dtype["P", width]):
        s = td.shared(dtype, (2, 8, width))
        t = threadIdx.x
        for half in (0, 1):
            row = blockIdx.x * 16 + half * 8 + t // 4
            if t < 32:
                td.cp_async(s[half, t // 4, t % 4 * n], X[row, t % 4 * n], n, pred=row < R)
            td.cp_async_commit()
        for half in (0, 1):
            td.cp_async_wait(1 - half)    # the first group is done when at most one is in flight
            td.syncthreads()
            if t < 32:
                for e in range(n):
                    Out[blockIdx.x * 16 + half * 8 + t // 4, t % 4 * n + e] = s[half, t // 4, t % 4 * n + e]
    return copy


@FEW
@given(kind=st.sampled_from([(f32, 1), (f32, 2), (f32, 4), (f16, 2), (f16, 8), (i8, 16)]),
       rows=st.integers(1, 40), seed=st.integers(0, 2**16))
def test_cp_async_copies_and_zero_fills(kind, rows, seed):
    dtype, n = kind
    rng = np.random.default_rng(seed)
    x = rng.integers(1, 100, (rows, 4 * n)).astype(dtype.numpy)
    padded = -(-rows // 16) * 16
    out = np.full((padded, 4 * n), 7, dtype.numpy)
    copy_kernel(dtype, n)(x, out)
    expected = np.zeros_like(out)
    expected[:rows] = x
    np.testing.assert_array_equal(out, expected)


@td.kernel(grid=1, block=32)
def gather_rows(X: f32["R", 4], rows: i32["N"], Out: f32[32, 4]):
    s = td.shared(f32, (32, 4))
    t = threadIdx.x
    td.cp_async(s[t, 0], X[rows[t], 0], 4, pred=t < N)     # rows[t] exists only where the copy happens
    td.cp_async_commit()
    td.cp_async_wait(0)
    td.syncthreads()
    for e in range(4):
        Out[t, e] = s[t, e]


def test_a_zero_filled_copy_does_not_compute_its_source_index():
    """The emulated copy computes its predicate and indices once for its elements; the source index only
    where the predicate holds, as CUDA's does: here that index reads a table past its end (debug mode checks)."""
    td.debug(True)
    x = np.arange(40, dtype=np.float32).reshape(10, 4)
    rows = np.array([3, 0, 9, 3, 5], np.int32)
    out = np.full((32, 4), -1, np.float32)
    gather_rows(x, rows, out)
    expected = np.zeros((32, 4), np.float32)
    expected[:5] = x[rows]
    np.testing.assert_array_equal(out, expected)


# --------------------------------------------------------------------------- syncwarp
@td.kernel(block=64)
def rotate_in_warp(X: f32[64], Y: f32[64]):
    s = td.shared(f32, (64,))
    if threadIdx.x // 32 == 1:          # warp-uniform: the second warp only
        s[threadIdx.x] = X[threadIdx.x]
        td.syncwarp()
        Y[threadIdx.x] = s[32 + (threadIdx.x + 1) % 32]


def test_syncwarp_orders_shared_memory_within_a_warp():
    x = np.arange(64, dtype=np.float32)
    y = np.full(64, -1, np.float32)
    rotate_in_warp(x, y)
    np.testing.assert_array_equal(y, np.concatenate([np.full(32, -1), np.roll(x[32:], -1)]))


# --------------------------------------------------------------------------- CUDA
def _launches() -> dict:
    """name -> (kernel, arguments), for every kernel above."""
    h = lambda *shape: np.zeros(shape, np.float16)
    tables = (np.zeros((32, 8, 2), np.int32), np.zeros((32, 4, 2), np.int32), np.zeros((32, 4, 2), np.int32))
    ints = np.zeros(64, np.int32)
    launches = {"mma_f16": (mma_kernel(f16), (h(2, 16, 16), h(2, 16, 8), np.zeros((2, 16, 8), np.float32), *tables)),
                "mma_bf16": (mma_kernel(bf16), (h(1, 16, 16).view(np.uint16), h(1, 16, 8).view(np.uint16),
                                                np.zeros((1, 16, 8), np.float32), *tables)),
                "tc_matmul": (tc_matmul, (h(48, 32), h(32, 80), np.zeros((48, 80), np.float32))),
                "rotate_in_warp": (rotate_in_warp, (np.zeros(64, np.float32), np.zeros(64, np.float32)))}
    for num in (1, 2, 4):
        for trans in (False, True):
            launches[f"ldmatrix_x{num}_{trans}"] = (ldmatrix_kernel(f16, num, trans), (h(ROWS, COLS), ints, ints,
                                                                                    h(64, 2 * num)))
    for dtype, n in ((f32, 1), (f16, 4), (i8, 16)):
        launches[f"copy_{dtype.name}_{n}"] = (copy_kernel(dtype, n), (np.zeros((5, 4 * n), dtype.numpy),
                                                                      np.zeros((16, 4 * n), dtype.numpy)))
    return launches


@pytest.mark.parametrize("arch", ["sm_80", "sm_90"])
def test_every_kernel_compiles_with_nvrtc(arch):
    for kernel, args in _launches().values():
        assert kernel.compile(*args, target="cuda", arch=arch).binary[:4] == b"\x7fELF"


def test_cuda_source_uses_the_ptx_instructions():
    source = {name: kernel.source(*args, target="cuda") for name, (kernel, args) in _launches().items()}
    matmul = source["tc_matmul"]
    assert "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32" in matmul
    assert "ldmatrix.sync.aligned.m8n8.x4.shared.b16" in matmul
    assert "ldmatrix.sync.aligned.m8n8.x2.trans.shared.b16" in matmul
    assert "cp.async.cg.shared.global [%0], [%1], 16, %2;" in matmul    # with a src-size operand
    assert re.search(r"\(const void\*\)&A\[.+ \? .+ : 0\]", matmul)   # predicated off: index 0, in bounds
    assert "cp.async.commit_group;" in matmul and "cp.async.wait_group 0;" in matmul
    assert "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32" in source["mma_bf16"]
    assert "ldmatrix.sync.aligned.m8n8.x1.shared.b16" in source["ldmatrix_x1_False"]
    assert "cp.async.ca.shared.global [%0], [%1], 4, %2;" in source["copy_f32_1"]
    assert "cp.async.wait_group 1;" in source["copy_f32_1"]
    assert "__syncwarp(0xffffffffu);" in source["rotate_in_warp"]


# --------------------------------------------------------------------------- misuse
@td.kernel(block=32)
def bad_a_dtype(X: f32[4]):
    a = td.registers(f32, (8,))
    b = td.registers(f16, (4,))
    c = td.registers(f32, (4,))
    td.mma_m16n8k16(a, b, c)  # E_A_DTYPE


@td.kernel(block=32)
def bad_a_size(X: f32[4]):
    a = td.registers(f16, (2, 4))
    b = td.registers(f16, (4,))
    c = td.registers(f32, (4,))
    td.mma_m16n8k16(a[0], b, c)  # E_A_SIZE


@td.kernel(block=32)
def bad_b_dtype(X: f32[4]):
    a = td.registers(f16, (8,))
    b = td.registers(bf16, (4,))
    c = td.registers(f32, (4,))
    td.mma_m16n8k16(a, b, c)  # E_B_DTYPE


@td.kernel(block=32)
def bad_c_scope(X: f32[4]):
    a = td.registers(f16, (8,))
    b = td.registers(f16, (4,))
    c = td.shared(f32, (4,))
    td.mma_m16n8k16(a, b, c)  # E_C_SCOPE


@td.kernel(block=32)
def mma_as_value(X: f32[4]):
    a = td.registers(f16, (8,))
    b = td.registers(f16, (4,))
    c = td.registers(f32, (4,))
    d = td.mma_m16n8k16(a, b, c)  # E_VALUE


@td.kernel(block=32)
def mma_divergent(X: f32[4]):
    a = td.registers(f16, (8,))
    b = td.registers(f16, (4,))
    c = td.registers(f32, (4,))
    if threadIdx.x < 16:
        td.mma_m16n8k16(a, b, c)  # E_DIVERGENT


@td.kernel(block=48)
def mma_partial_warp(X: f32[4]):
    a = td.registers(f16, (8,))
    b = td.registers(f16, (4,))
    c = td.registers(f32, (4,))
    td.mma_m16n8k16(a, b, c)  # E_PARTIAL


@td.kernel(block=32)
def ldmatrix_from_global(X: f16[16, 16]):
    a = td.registers(f16, (8,))
    td.ldmatrix(a, X[threadIdx.x % 16, 0])  # E_LDM_GLOBAL


@td.kernel(block=32)
def ldmatrix_bad_size(X: f16[16, 16]):
    s = td.shared(f16, (16, 16))
    a = td.registers(f16, (6,))
    td.ldmatrix(a, s[threadIdx.x % 16, 0])  # E_LDM_SIZE


@td.kernel(block=32)
def ldmatrix_f32(X: f16[16, 16]):
    s = td.shared(f32, (16, 16))
    a = td.registers(f32, (8,))
    td.ldmatrix(a, s[threadIdx.x % 16, 0])  # E_LDM_DTYPE


@td.kernel(block=32)
def ldmatrix_runtime_trans(X: f16[16, 16], flag: i32):
    s = td.shared(f16, (16, 16))
    a = td.registers(f16, (8,))
    td.ldmatrix(a, s[threadIdx.x % 16, 0], trans=flag > 0)  # E_LDM_TRANS


@td.kernel(block=32)
def cp_async_to_global(X: f32[64], Y: f32[64]):
    td.cp_async(Y[threadIdx.x], X[threadIdx.x], 4)  # E_CP_DST


@td.kernel(block=32)
def cp_async_from_shared(X: f32[64]):
    s = td.shared(f32, (64,))
    t = td.shared(f32, (64,))
    td.cp_async(s[threadIdx.x], t[threadIdx.x], 4)  # E_CP_SRC


@td.kernel(block=32)
def cp_async_12_bytes(X: f32[128]):
    s = td.shared(f32, (128,))
    td.cp_async(s[threadIdx.x * 4], X[threadIdx.x * 4], 3)  # E_CP_SIZE


@td.kernel(block=32)
def cp_async_mixed_dtypes(X: f16[128]):
    s = td.shared(f32, (128,))
    td.cp_async(s[threadIdx.x * 4], X[threadIdx.x * 4], 4)  # E_CP_DTYPE


@td.kernel(block=32)
def cp_async_runtime_count(X: f32[128], n: i32):
    s = td.shared(f32, (128,))
    td.cp_async(s[threadIdx.x * 4], X[threadIdx.x * 4], n)  # E_CP_COUNT


@td.kernel(block=32)
def cp_async_wait_runtime(X: f32[128], n: i32):
    td.cp_async_wait(n)  # E_WAIT


@td.kernel(block=32)
def syncwarp_divergent(X: f32[32]):
    if X[threadIdx.x] > 0.0:
        td.syncwarp()  # E_SYNCWARP


@pytest.mark.parametrize("kernel, tag, fragment", [
    (bad_a_dtype, "E_A_DTYPE", "the a fragment must hold f16 or bf16 elements; 'a' holds f32"),
    (bad_a_size, "E_A_SIZE", "the a fragment must be a fragment of 8 elements, got 4"),
    (bad_b_dtype, "E_B_DTYPE", "the b fragment must hold f16 elements"),
    (bad_c_scope, "E_C_SCOPE", "the c fragment must be in register memory; 'c' is shared"),
    (mma_as_value, "E_VALUE", "td.mma_m16n8k16() is a statement and has no value"),
    (mma_divergent, "E_DIVERGENT", "'mma_m16n8k16()' inside a branch or loop that differs between the lanes"),
    (mma_partial_warp, "E_PARTIAL", "needs whole warps, but the block has 48 threads"),
    (ldmatrix_from_global, "E_LDM_GLOBAL", "the ldmatrix source must be in shared memory; 'X' is global"),
    (ldmatrix_bad_size, "E_LDM_SIZE", "must be a fragment of 2 or 4 or 8 elements, got 6"),
    (ldmatrix_f32, "E_LDM_DTYPE", "ldmatrix loads 16-bit or 8-bit elements"),
    (ldmatrix_runtime_trans, "E_LDM_TRANS", "trans= must be True or False"),
    (cp_async_to_global, "E_CP_DST", "the cp_async destination must be in shared memory; 'Y' is global"),
    (cp_async_from_shared, "E_CP_SRC", "the cp_async source must be in global memory; 't' is shared"),
    (cp_async_12_bytes, "E_CP_SIZE", "cp_async copies 4, 8 or 16 bytes; 3 f32 elements are 12 bytes"),
    (cp_async_mixed_dtypes, "E_CP_DTYPE", "cp_async copies between tensors of one dtype"),
    (cp_async_runtime_count, "E_CP_COUNT", "must be a non-negative int known at compile time"),
    (cp_async_wait_runtime, "E_WAIT", "the group count of cp_async_wait must be a non-negative int"),
    (syncwarp_divergent, "E_SYNCWARP", "'syncwarp()' inside a branch or loop that differs between the lanes"),
])
def test_misuse_is_a_dsl_error_at_the_line(kernel, tag, fragment):
    assert_dsl_error_at(MARKS, kernel, tag, fragment)


def assert_dsl_error_at(marks: Markers, kernel, tag: str, fragment: str) -> None:
    """Lowering `kernel` (zeros for its arrays, 1 for its scalars) is a DSLError at the line marked `tag`, whose
    message holds `fragment`."""
    args = [np.zeros(spec.dims, spec.dtype.numpy) if hasattr(spec, "dims") else 1 for _, spec in kernel.params]
    err = marks.expect_error(lambda: kernel.ir(*args, stage="lowered"), tag)
    assert fragment in err.message, err.message
