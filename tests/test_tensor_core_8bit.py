"""8-bit tensor cores: mma_m16n8k32 on s8/u8 (s32 accumulators, sm_80+) and E4M3/E5M2 (f32, sm_89+), and
ldmatrix of 8-bit tiles.

As in test_tensor_core.py, each instruction runs on the cpu target against a numpy model written here from the
PTX ISA's fragment layouts for m16n8k32 (not from taskdsl's emulation), as a @gpu twin, and with its CUDA source
run on the host (tests/ptx_on_host.py); the CUDA compiles with NVRTC for the architectures that have the
instruction. Misuse is a DSLError at the offending line.
"""
import functools

import ml_dtypes
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import taskdsl as td
from taskdsl import blockIdx, f8e4m3, f8e5m2, f16, f32, i8, i32, threadIdx, u8

from .markers import Markers
from .test_tensor_core import assert_covers_each_element_once, assert_dsl_error_at, c_position, layout_table

GPU_TWINS = True   # every test also runs as a @gpu twin on the cuda target (conftest.py)
HOST_RUNS = True   # and with its kernels' CUDA source run on the host, the inline PTX emulated (ptx_on_host.py)

FEW = settings(max_examples=6, deadline=None)
MARKS = Markers(__file__)
INTEGERS, FLOATS = (i8, u8), (f8e4m3, f8e5m2)
# every operand pair PTX has: either integer type with either, either 8-bit float with either
PAIRS = [(a, b) for kind in (INTEGERS, FLOATS) for a in kind for b in kind]


def numpy_type(dtype):
    return {"f8e4m3": ml_dtypes.float8_e4m3fn, "f8e5m2": ml_dtypes.float8_e5m2}.get(dtype.name, dtype.numpy)


def accumulator(dtype):
    return f32 if dtype.is_float else i32


def random_operand(rng, dtype, shape) -> np.ndarray:
    """Values of `dtype` over its range: integers uniform, floats normal at scales from subnormal to 100."""
    if not dtype.is_float:
        lo, hi = dtype.limits
        return rng.integers(lo, hi + 1, shape).astype(dtype.numpy)
    scale = 10.0 ** rng.integers(-3, 3, shape)
    return (rng.standard_normal(shape) * scale).astype(numpy_type(dtype))


# --------------------------------------------------------------------------- the PTX ISA layouts
# mma.m16n8k32 with 8-bit inputs: four elements a 32-bit register; groupID = lane >> 2, threadID_in_group =
# lane % 4. Each returns the (row, col) of matrix element `r` of `lane`; C's layout is m16n8k16's (c_position).
def a_position(lane, r):
    """a0-a3: (groupID, 4*tig + i); a4-a7: row + 8; a8-a11: col + 16; a12-a15: both."""
    return (lane >> 2) + 8 * (r // 4 % 2), (lane % 4) * 4 + r % 4 + 16 * (r // 8)


def b_position(lane, r):
    """b0-b3: (k = 4*tig + i, n = groupID); b4-b7: k + 16."""
    return (lane % 4) * 4 + r % 4 + 16 * (r // 4), lane >> 2


TABLES = (layout_table(a_position, 16), layout_table(b_position, 8), layout_table(c_position, 4))


@pytest.mark.parametrize("position, regs, shape", [(a_position, 16, (16, 32)), (b_position, 8, (32, 8))])
def test_layout_tables_cover_each_element_once(position, regs, shape):
    assert_covers_each_element_once(position, regs, shape)


# --------------------------------------------------------------------------- mma
@functools.cache
def mma_kernel(a_type, b_type):
    """Warp w of a (32, W) block loads A[w], B[w], C[w] by the layout tables and does one mma."""
    acc = accumulator(a_type)

    @td.kernel(block=lambda W: (32, W))
    def mma8(A: a_type["W", 16, 32], B: b_type["W", 32, 8], C: acc["W", 16, 8],
             AI: i32[32, 16, 2], BI: i32[32, 8, 2], CI: i32[32, 4, 2]):
        a = td.registers(a_type, (2, 16))    # fragments may be slices of bigger register arrays
        b = td.registers(b_type, (8,))
        c = td.registers(acc, (4,))
        lane, w = threadIdx.x, threadIdx.y
        for r in range(16):
            a[1, r] = A[w, AI[lane, r, 0], AI[lane, r, 1]]
        for r in range(8):
            b[r] = B[w, BI[lane, r, 0], BI[lane, r, 1]]
        for r in range(4):
            c[r] = C[w, CI[lane, r, 0], CI[lane, r, 1]]
        td.mma_m16n8k32(a[1], b, c)
        for r in range(4):
            C[w, CI[lane, r, 0], CI[lane, r, 1]] = c[r]
    return mma8


def expected_product(a, b, c) -> np.ndarray:
    """A B + C in f64 (exact for 8-bit operands over k = 32), or in int64 for integer ones."""
    wide = np.float64 if c.dtype == np.float32 else np.int64
    return a.astype(wide) @ b.astype(wide) + c


@FEW
@given(pair=st.sampled_from(PAIRS), warps=st.sampled_from([1, 2]), seed=st.integers(0, 2**16))
def test_mma_matches_numpy(pair, warps, seed):
    a_type, b_type = pair
    rng = np.random.default_rng(seed)
    a, b = random_operand(rng, a_type, (warps, 16, 32)), random_operand(rng, b_type, (warps, 32, 8))
    if a_type.is_float:
        c = rng.standard_normal((warps, 16, 8)).astype(np.float32)
    else:
        c = rng.integers(-2**30, 2**30, (warps, 16, 8)).astype(np.int32)
    expected = expected_product(a, b, c)
    mma_kernel(a_type, b_type)(a, b, c, *TABLES)
    if a_type.is_float:      # f32 sums, in the hardware's order on a GPU
        np.testing.assert_allclose(c, expected, rtol=1e-5, atol=1e-3 * np.abs(expected).max())
    else:
        np.testing.assert_array_equal(c, expected)


def test_mma_of_the_extreme_integers_is_exact():
    """-128 * -128 and 255 * 255 summed 32 times: the products and sums the s32 accumulators must hold."""
    for a_type, b_type, value in ((i8, i8, -128), (u8, u8, 255), (i8, u8, -128)):
        a = np.full((1, 16, 32), value, a_type.numpy)
        b = np.full((1, 32, 8), value if b_type == a_type else 255, b_type.numpy)
        c = np.full((1, 16, 8), 7, np.int32)
        expected = expected_product(a, b, c)
        mma_kernel(a_type, b_type)(a, b, c, *TABLES)
        np.testing.assert_array_equal(c, expected)


def test_mma_passes_the_debug_mode_checks():
    td.debug(True)
    rng = np.random.default_rng(4)
    a, b = random_operand(rng, f8e4m3, (1, 16, 32)), random_operand(rng, f8e4m3, (1, 32, 8))
    c = np.zeros((1, 16, 8), np.float32)
    mma_kernel(f8e4m3, f8e4m3)(a, b, c, *TABLES)
    np.testing.assert_allclose(c, expected_product(a, b, np.zeros_like(c)), rtol=1e-5, atol=1e-5)


# --------------------------------------------------------------------------- ldmatrix
ROWS, COLS = 64, 48      # a shared tile whose rows are 48 bytes; row addresses are 16-byte aligned


@functools.cache
def ldmatrix_kernel(dtype, num: int):
    """Each of two warps loads `num` matrices whose rows lane l points at: s[rows[l], cols[l]]."""
    @td.kernel(block=64)
    def ldm8(X: dtype[ROWS, COLS], rows: i32[64], cols: i32[64], Out: dtype[64, 4 * num]):
        s = td.shared(dtype, (ROWS, COLS))
        t = threadIdx.x
        for j in range(COLS):
            s[t, j] = X[t, j]
        td.syncthreads()
        frag = td.registers(dtype, (4 * num,))
        td.ldmatrix(frag, s[rows[t], cols[t]])
        for i in range(4 * num):
            Out[t, i] = frag[i]
    return ldm8


def ldmatrix_model(x, rows, cols, num):
    """PTX ldmatrix of 8x8 b16 matrices (rows of 16 bytes): lanes 8j..8j+7 give the rows of matrix j; lane l
    receives bytes 4 * (l % 4) .. + 3 of row l // 4 of matrix j: four 8-bit elements, in register j."""
    flat = x.reshape(-1)
    out = np.zeros((64, 4 * num), x.dtype)
    for warp in range(2):
        for j in range(num):
            starts = [rows[32 * warp + 8 * j + r] * COLS + cols[32 * warp + 8 * j + r] for r in range(8)]
            matrix = np.stack([flat[s:s + 16] for s in starts])
            for lane in range(32):
                out[32 * warp + lane, 4 * j:4 * j + 4] = matrix[lane // 4, 4 * (lane % 4):4 * (lane % 4) + 4]
    return out


@FEW
@given(num=st.sampled_from([1, 2, 4]), dtype=st.sampled_from([i8, u8, f8e4m3, f8e5m2]), seed=st.integers(0, 2**16))
def test_ldmatrix_of_8_bit_elements_matches_numpy(num, dtype, seed):
    rng = np.random.default_rng(seed)
    bits = rng.integers(0, 256, (ROWS, COLS)).astype(np.uint8)      # every pattern, NaNs too: moved, not read
    x = bits.view(numpy_type(dtype))
    rows = rng.integers(0, ROWS, 64).astype(np.int32)
    cols = (16 * rng.integers(0, COLS // 16, 64)).astype(np.int32)
    out = np.zeros((64, 4 * num), x.dtype)
    ldmatrix_kernel(dtype, num)(x, rows, cols, out)
    np.testing.assert_array_equal(out.view(np.uint8), ldmatrix_model(bits, rows, cols, num))


# --------------------------------------------------------------------------- an 8-bit tensor-core matmul
BM, BN, BK = 32, 32, 32   # a block tile; four warps of 16 x 16, each two m16n8k32 tiles wide


@functools.cache
def tc8_matmul_kernel(a_type, b_type):
    """C (M, N) = A (M, K) @ B where B is given k-major, as BT (N, K): the layout the instruction reads."""
    acc = accumulator(a_type)

    @td.kernel(grid=lambda M, N: (td.cdiv(N, BN), td.cdiv(M, BM)), block=128)
    def tc8_matmul(A: a_type["M", "K"], BT: b_type["N", "K"], C: acc["M", "N"]):
        sa = td.shared(a_type, (BM, BK))
        sb = td.shared(b_type, (BN, BK))
        a_frag = td.registers(a_type, (16,))
        b_frag = td.registers(b_type, (2, 8))
        c = td.registers(acc, (2, 4))
        t = threadIdx.x
        lane, wm, wn = t % 32, t // 64, t // 32 % 2
        for ni in range(2):
            for r in range(4):
                c[ni, r] = 0
        for k0 in range(0, K, BK):
            r, col = t % 64 // 2, t % 2 * 16     # 32 rows of two 16-byte copies, of A or of BT
            if t < 64:
                td.cp_async(sa[r, col], A[blockIdx.y * BM + r, k0 + col], 16, pred=blockIdx.y * BM + r < M)
            else:
                td.cp_async(sb[r, col], BT[blockIdx.x * BN + r, k0 + col], 16, pred=blockIdx.x * BN + r < N)
            td.cp_async_commit()
            td.cp_async_wait(0)
            td.syncthreads()
            td.ldmatrix(a_frag, sa[wm * 16 + lane % 16, lane // 16 * 16])            # x4: the 16 x 32 A tile
            for ni in range(2):      # x2: B's 32 x 8, lanes 0-7 its k 0-15, lanes 8-15 its k 16-31
                td.ldmatrix(b_frag[ni], sb[wn * 16 + ni * 8 + lane % 8, lane // 8 % 2 * 16])
                td.mma_m16n8k32(a_frag, b_frag[ni], c[ni])
            td.syncthreads()
        for ni in range(2):
            for r in range(4):
                gi = blockIdx.y * BM + wm * 16 + lane // 4 + r // 2 * 8
                gj = blockIdx.x * BN + wn * 16 + ni * 8 + lane % 4 * 2 + r % 2
                if gi < M and gj < N:
                    C[gi, gj] = c[ni, r]
    return tc8_matmul


@settings(max_examples=4, deadline=None)      # a numba build per shape
@given(pair=st.sampled_from(PAIRS), m=st.integers(1, 70), n=st.integers(1, 70), k=st.integers(1, 3),
       seed=st.integers(0, 2**16))
def test_8_bit_tensor_core_matmul_matches_numpy(pair, m, n, k, seed):
    a_type, b_type = pair
    rng = np.random.default_rng(seed)
    a, bt = random_operand(rng, a_type, (m, 32 * k)), random_operand(rng, b_type, (n, 32 * k))
    c = np.zeros((m, n), accumulator(a_type).numpy)
    expected = expected_product(a, bt.T, c)
    tc8_matmul_kernel(a_type, b_type)(a, bt, c)
    if a_type.is_float:
        np.testing.assert_allclose(c, expected, rtol=1e-5, atol=1e-5 * np.abs(expected).max())
    else:
        np.testing.assert_array_equal(c, expected)


# --------------------------------------------------------------------------- CUDA
def _launches() -> dict:
    """name -> (kernel, arguments), for the kernels above at each operand pair."""
    launches = {}
    for a_type, b_type in PAIRS:
        a, b = np.zeros((2, 16, 32), numpy_type(a_type)), np.zeros((2, 32, 8), numpy_type(b_type))
        c = np.zeros((2, 16, 8), accumulator(a_type).numpy)
        launches[f"mma_{a_type.name}_{b_type.name}"] = (mma_kernel(a_type, b_type), (a, b, c, *TABLES))
        launches[f"matmul_{a_type.name}_{b_type.name}"] = (
            tc8_matmul_kernel(a_type, b_type), (a[0], b[0].T.copy(), np.zeros((16, 8), accumulator(a_type).numpy)))
    ints = np.zeros(64, np.int32)
    for num in (1, 2, 4):
        launches[f"ldmatrix_x{num}"] = (ldmatrix_kernel(i8, num), (np.zeros((ROWS, COLS), np.int8), ints, ints,
                                                                   np.zeros((64, 4 * num), np.int8)))
    return launches


@pytest.mark.parametrize("arch", ["sm_80", "sm_89", "sm_90"])
def test_every_kernel_compiles_with_nvrtc_where_the_instruction_exists(arch):
    for name, (kernel, args) in _launches().items():
        if "f8" in name and arch == "sm_80":      # the 8-bit float mma needs sm_89: ptxas says so
            with pytest.raises(td.DSLError, match="requires .target sm_89 or higher"):
                kernel.compile(*args, target="cuda", arch=arch)
        else:
            assert kernel.compile(*args, target="cuda", arch=arch).binary[:4] == b"\x7fELF", name


def test_cuda_source_uses_the_ptx_instructions():
    source = {name: kernel.source(*args, target="cuda") for name, (kernel, args) in _launches().items()}
    assert "mma.sync.aligned.m16n8k32.row.col.s32.s8.u8.s32" in source["mma_i8_u8"]
    assert '"+r"(c[0])' in source["mma_i8_u8"]                # s32 accumulators in 32-bit integer registers
    assert "mma.sync.aligned.m16n8k32.row.col.f32.e5m2.e4m3.f32" in source["mma_f8e5m2_f8e4m3"]
    matmul = source["matmul_u8_u8"]
    assert "ldmatrix.sync.aligned.m8n8.x4.shared.b16" in matmul
    assert "ldmatrix.sync.aligned.m8n8.x2.shared.b16" in matmul
    assert "cp.async.cg.shared.global [%0], [%1], 16, %2;" in matmul
    assert "__align__(4) unsigned char a_frag[16];" in matmul   # fragments are read as 32-bit words


# --------------------------------------------------------------------------- misuse
@functools.cache
def mma8_misuse(a_type, a_size: int, b_type, b_size: int, c_type):
    """A kernel calling mma_m16n8k32 on fragments of these types and sizes."""
    @td.kernel(block=32)
    def mma8(X: f32[4]):
        a = td.registers(a_type, (a_size,))
        b = td.registers(b_type, (b_size,))
        c = td.registers(c_type, (4,))
        td.mma_m16n8k32(a, b, c)  # E_MMA8
    return mma8


@td.kernel(block=32)
def mma8_divergent(X: f32[4]):
    a = td.registers(i8, (16,))
    b = td.registers(i8, (8,))
    c = td.registers(i32, (4,))
    if threadIdx.x < 16:
        td.mma_m16n8k32(a, b, c)  # E_DIVERGENT


@td.kernel(block=32)
def ldmatrix8_trans(X: f32[4]):
    s = td.shared(i8, (16, 32))
    a = td.registers(i8, (16,))
    td.ldmatrix(a, s[threadIdx.x % 16, 0], trans=True)  # E_LDM_TRANS


@td.kernel(block=32)
def ldmatrix8_size(X: f32[4]):
    s = td.shared(u8, (16, 32))
    a = td.registers(u8, (8,))
    td.ldmatrix(a, s[threadIdx.x % 16, 0])
    b = td.registers(u8, (2, 3))
    td.ldmatrix(b, s[threadIdx.x % 16, 0])  # E_LDM_SIZE


@pytest.mark.parametrize("kernel, tag, fragment", [
    (mma8_misuse(f16, 16, f16, 8, f32), "E_MMA8",
     "the a fragment must hold i8 or u8 or f8e4m3 or f8e5m2 elements; 'a' holds f16"),
    (mma8_misuse(i8, 16, f8e4m3, 8, i32), "E_MMA8", "the b fragment must hold i8 or u8 elements; 'b' holds f8e4m3"),
    (mma8_misuse(u8, 16, u8, 8, f32), "E_MMA8", "the c fragment must hold i32 elements; 'c' holds f32"),
    (mma8_misuse(f8e5m2, 16, f8e5m2, 4, f32), "E_MMA8", "the b fragment must be a fragment of 8 elements, got 4"),
    (mma8_misuse(i8, 8, i8, 8, i32), "E_MMA8", "the a fragment must be a fragment of 16 elements, got 8"),
    (mma8_divergent, "E_DIVERGENT", "'mma_m16n8k32()' inside a branch or loop that differs between the lanes"),
    (ldmatrix8_trans, "E_LDM_TRANS", "ldmatrix's trans= transposes 16-bit elements, not 8-bit ones"),
    (ldmatrix8_size, "E_LDM_SIZE", "must be a fragment of 4 or 8 or 16 elements, got 6"),
])
def test_misuse_is_a_dsl_error_at_the_line(kernel, tag, fragment):
    assert_dsl_error_at(MARKS, kernel, tag, fragment)
