"""`td.dot4`: four-byte dot products of u8 and i8 into i32 lanes (x86's vpdpbusd on the cpu, plain arithmetic on
a GPU, in debug mode and on a cpu without the instruction).

Oracle: numpy's int64 products, wrapped to int32 as the instruction wraps; the CUDA C++ also runs on the host.
"""
import functools
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

import taskdsl as td
from taskdsl import blockIdx, i8, i32, u8

from .cuda_on_host import host_compiler, run_on_host
from .markers import Markers

OPTIMIZED = True     # unrolled register arrays, which the cpu keeps in locals but where dot4 names them
MARKS = Markers(__file__)
SCOPES = ("global", "shared", "registers")


@functools.cache
def row_dots(lanes: int, scope: str):
    """C[m, l] += sum over s of A[m, 4s : 4s + 4] . B[s, 4l : 4l + 4], a block per row m, the operands read where
    `scope` says: global memory, B staged in shared memory, or A's four bytes staged in registers."""
    @td.kernel(grid=lambda M: M, block=1, name=f"row_dots_{lanes}_{scope}")
    def kernel(A: u8["M", "K"], B: i8["S", 4 * lanes], C: i32["M", lanes]):
        m = blockIdx.x
        acc = td.registers(i32, (lanes,))
        a4 = td.registers(u8, (4,))
        staged = td.shared(i8, (1, 4 * lanes))
        for lane in td.unroll(lanes):
            acc[lane] = C[m, lane]
        for s in range(S):
            if scope == "global":
                td.dot4(acc[0], A[m, 4 * s], B[s, 0], lanes)
            elif scope == "shared":
                for q in range(4 * lanes):
                    staged[0, q] = B[s, q]
                td.dot4(acc[0], A[m, 4 * s], staged[0, 0], lanes)
            else:
                for q in td.unroll(4):
                    a4[q] = A[m, 4 * s + q]
                td.dot4(acc[0], a4[0], B[s, 0], lanes)
        for lane in range(lanes):
            C[m, lane] = acc[lane]

    return kernel


def expected(a: np.ndarray, b: np.ndarray, c: np.ndarray) -> np.ndarray:
    """C + the dot products, in int64, wrapped to int32."""
    m, lanes = c.shape
    steps = b.shape[0]
    sums = np.einsum("msq,slq->ml", a.astype(np.int64).reshape(m, steps, 4),
                     b.astype(np.int64).reshape(steps, lanes, 4))
    return (c.astype(np.int64) + sums).astype(np.uint32).view(np.int32)   # numpy's casts wrap


def operands(rng, m: int, steps: int, lanes: int, near_limit: bool) -> tuple:
    """Full-range bytes, and starting sums near the top of int32 where `near_limit` (the sums wrap)."""
    a = rng.integers(0, 256, (m, 4 * steps), dtype=np.uint8)
    b = rng.integers(-128, 128, (steps, 4 * lanes), dtype=np.int8)
    low = 2**31 - 200_000 if near_limit else -2**20
    c = rng.integers(low, low + 2**20, (m, lanes)).astype(np.int32)
    return a, b, c


@settings(max_examples=12, deadline=None)
@given(lanes=st.sampled_from([4, 8, 16]), scope=st.sampled_from(SCOPES), m=st.sampled_from([1, 2, 3, 5]),
       steps=st.sampled_from([0, 1, 2, 7]), near_limit=st.booleans(), seed=st.integers(0, 2**16))
def test_dot4_adds_four_byte_dot_products_to_each_lane(lanes, scope, m, steps, near_limit, seed):
    a, b, c = operands(np.random.default_rng(seed), m, steps, lanes, near_limit)
    want = expected(a, b, c)
    row_dots(lanes, scope)(a, b, c)
    np.testing.assert_array_equal(c, want)


@pytest.mark.fast_compile      # (loops left in loops, the register arrays indexed at run time)
@pytest.mark.parametrize("scope", SCOPES)
def test_dot4_under_fast_compile(scope):
    a, b, c = operands(np.random.default_rng(7), 3, 5, 16, True)
    want = expected(a, b, c)
    row_dots(16, scope)(a, b, c)
    np.testing.assert_array_equal(c, want)


def test_dot4_in_debug_mode_is_checked_and_exact():
    a, b, c = operands(np.random.default_rng(1), 3, 5, 8, True)
    want = expected(a, b, c)
    td.debug(True)
    try:
        row_dots(8, "shared")(a, b, c)
    finally:
        td.debug(False)
    np.testing.assert_array_equal(c, want)


@td.kernel(grid=1, block=1)
def dots_past_the_end(A: u8[8], B: i8[60], C: i32[16]):
    acc = td.registers(i32, (16,))
    for lane in range(16):
        acc[lane] = 0
    td.dot4(acc[0], A[4], B[0], 16)    # PAST_THE_END (64 bytes of b from a tensor of 60)
    for lane in range(16):
        C[lane] = acc[lane]


def test_debug_mode_reports_an_operand_read_past_its_tensor():
    args = np.zeros(8, np.uint8), np.zeros(60, np.int8), np.zeros(16, np.int32)
    td.debug(True)
    try:
        MARKS.expect_error(lambda: dots_past_the_end(*args), "PAST_THE_END", r"out-of-bounds read of 'B': index 60")
    finally:
        td.debug(False)


def test_the_cpu_source_calls_the_instruction_on_a_stack_accumulator_and_cuda_has_its_arithmetic():
    a, b, c = operands(np.random.default_rng(2), 2, 3, 16, False)
    cpu = row_dots(16, "global").source(a, b, c, target="cpu")
    assert "rt.dot4(acc, " in cpu and "rt.stack_array(" in cpu
    cuda = row_dots(16, "global").source(a, b, c, target="cuda")
    body = cuda[cuda.index("__global__"):]
    assert "dot4" not in body.replace("test_dot4.py", "") and "(int)(B[" in body


@pytest.mark.skipif(host_compiler() is None, reason="no host C++ compiler")
@pytest.mark.parametrize("scope", SCOPES)
def test_the_cuda_source_computes_the_same_sums(scope):
    a, b, c = operands(np.random.default_rng(3), 3, 4, 8, True)
    want = expected(a, b, c)
    run_on_host(row_dots(8, scope), a, b, c)
    np.testing.assert_array_equal(c, want)


def test_a_cpu_without_the_instruction_runs_the_plain_arithmetic(tmp_path):
    """numba compiling for a generic x86-64 (no AVX-512 VNNI): `rt.dot4` adds lane by lane, the same sums."""
    script = tmp_path / "generic.py"
    script.write_text(f"""
import numpy as np
from taskdsl.backend.cpu import vectors
from tests.test_dot4 import expected, operands, row_dots
assert not vectors.dot4_lanes(), vectors.dot4_lanes()
a, b, c = operands(np.random.default_rng(4), 3, 6, 16, True)
want = expected(a, b, c)
row_dots(16, "global")(a, b, c)
assert np.array_equal(c, want)
print("exact")
""")
    env = dict(os.environ, NUMBA_CPU_NAME="x86-64", NUMBA_CPU_FEATURES="", TASKDSL_CACHE_DIR=str(tmp_path / "cache"),
               PYTHONPATH=str(Path(__file__).resolve().parents[1]))
    run = subprocess.run([sys.executable, str(script)], env=env, capture_output=True, text=True, timeout=600)
    assert run.returncode == 0 and "exact" in run.stdout, run.stderr[-3000:]


@td.kernel(grid=1, block=1)
def five_lanes(A: u8[4], B: i8[20], C: i32[5]):
    acc = td.registers(i32, (5,))
    td.dot4(acc[0], A[0], B[0], 5)    # FIVE_LANES


@td.kernel(grid=1, block=1)
def signed_a(A: td.i8[4], B: i8[64], C: i32[16]):
    acc = td.registers(i32, (16,))
    td.dot4(acc[0], A[0], B[0], 16)    # SIGNED_A


@td.kernel(grid=1, block=1)
def shared_accumulator(A: u8[4], B: i8[64], C: i32[16]):
    acc = td.shared(i32, (16,))
    td.dot4(acc[0], A[0], B[0], 16)    # SHARED_ACC


@td.kernel(grid=1, block=1)
def three_arguments(A: u8[4], B: i8[64], C: i32[16]):
    acc = td.registers(i32, (16,))
    td.dot4(acc[0], A[0], B[0])    # THREE_ARGUMENTS


@pytest.mark.parametrize("kernel, tag, pattern", [
    (five_lanes, "FIVE_LANES", "4, 8 or 16 lanes"),
    (signed_a, "SIGNED_A", "a operand must hold u8 elements; 'A' holds i8"),
    (shared_accumulator, "SHARED_ACC", "accumulator must be in register memory"),
    (three_arguments, "THREE_ARGUMENTS", "takes an i32 register element"),
])
def test_misuse_is_reported_at_the_call(kernel, tag, pattern):
    n = 5 if kernel is five_lanes else 16
    args = np.zeros(4, np.int8 if kernel is signed_a else np.uint8), np.zeros(4 * n, np.int8), np.zeros(n, np.int32)
    MARKS.expect_error(lambda: kernel(*args), tag, pattern)


def test_fusion_refuses_a_prologue_of_an_operand_dot4_reads_and_fuses_one_staged_by_loads():
    """dot4 reads its operands' bytes in memory, which a prologue's computed values are not: fused into B, which
    the "global" kernel reads by dot4, a prologue is refused; into A of the "registers" kernel, which stages A's
    four bytes by plain loads first, it computes what the unfused pair does."""
    a, b, c = operands(np.random.default_rng(6), 2, 3, 8, False)
    source = td.placeholder("S", i8, b.shape)
    doubled = td.compute("B2", b.shape, lambda s, q: source[s, q] // 2)
    with pytest.raises(td.FusionError, match="reads 'B' by td.dot4"):
        td.fuse(row_dots(8, "global"), a, b, c, prologues={"B": doubled})
    flipped = td.placeholder("F", u8, a.shape)
    fused = td.fuse(row_dots(8, "registers"), a, b, c, prologues={"A": td.compute(
        "A2", a.shape, lambda m, k: 255 - flipped[m, k])})
    want = expected(255 - a, b, c)
    assert [name for name, _ in fused.params] == ["B", "C", "F"]
    fused(b, c, a)
    np.testing.assert_array_equal(c, want)
