"""The host's inline PTX (tests/ptx_on_host.py) and shared memory (tests/cuda_on_host.py) fail what a GPU would.

The emulation's meaning is checked elsewhere against numpy models of the PTX ISA (test_tensor_core.py's and
test_tensor_core_8bit.py's host twins) and the tensor-core template (test_matmul_tc.py). Here: it runs an asm
statement's operands as the template names them, not as the generator meant them; a warp-wide instruction needs the
warp's 32 lanes, at the same instruction; addresses must be aligned and inside a shared array; a copy lands only at
the wait that retires it; shared memory starts poisoned, and the order threads run in exposes a missing barrier.
"""
from __future__ import annotations

import numpy as np
import pytest

from taskdsl import f16, i8, u8

from . import test_tensor_core as k16
from . import test_tensor_core_8bit as k32
from .cuda_on_host import UnsupportedSource, host_compiler, run_source
from .ptx_on_host import Unsupported, translate

pytestmark = pytest.mark.skipif(host_compiler() is None,
                                reason="no host C++ compiler ($CXX, g++ or clang++) to run CUDA sources on the host")


def run(body: str, params: str, values: list, block: int = 32, grid: int = 1) -> None:
    """Run a one-dimensional launch of a kernel whose parameters are `params` and body is `body`."""
    source = f'extern "C" __global__ void __launch_bounds__({block}) k({params}) {{\n{body}\n}}\n'
    run_source(source, (grid, 1, 1), (block, 1, 1), values, "k")


LDMATRIX = ('asm volatile("ldmatrix.sync.aligned.m8n8.x1.shared.b16 {%0}, [%1];" : "=r"(r) '
            ': "r"((unsigned)__cvta_generic_to_shared(&s[{row}])) : "memory");')
TILE = "  __shared__ __align__(16) __half s[64];\n  s[threadIdx.x % 64] = (__half)1.0f;\n  __syncthreads();\n"


# --------------------------------------------------------------------------- operands as written
def _mma_case(k: int, rng) -> tuple:
    """(kernel, A, B, C, layout tables, A B in f64) of test_tensor_core's (k 16, f16) or test_tensor_core_8bit's
    (k 32, s8 by u8) one-mma kernel."""
    if k == 16:
        a, b = (rng.standard_normal((1, 16, n)).astype(np.float16) for n in (16, 8))
        tables = [k16.layout_table(k16.a_position, 8), k16.layout_table(k16.b_position, 4),
                  k16.layout_table(k16.c_position, 4)]
        return k16.mma_kernel(f16), a, b, np.zeros((1, 16, 8), np.float32), tables, a.astype(np.float64) @ b
    a, b = k32.random_operand(rng, i8, (1, 16, 32)), k32.random_operand(rng, u8, (1, 32, 8))
    c = np.zeros((1, 16, 8), np.int32)
    return k32.mma_kernel(i8, u8), a, b, c, k32.TABLES, k32.expected_product(a, b, c)


@pytest.mark.parametrize("k", [16, 32])
def test_an_mma_runs_its_operands_in_the_templates_order(k):
    """The mma kernel's CUDA source as generated matches numpy; with the template's A and B register lists
    swapped (a generator bug NVRTC would accept) it no longer does."""
    kernel, a, b, c0, tables, want = _mma_case(k, np.random.default_rng(1))
    results = []
    for swap in (False, True):
        c = c0.copy()
        args = kernel.arguments((a, b, c, *tables), {})
        source = kernel.source(*args, target="cuda")
        if swap:
            assert source.count("{%4, %5, %6, %7}, {%8, %9}") == 1
            source = source.replace("{%4, %5, %6, %7}, {%8, %9}", "{%6, %7, %4, %5}, {%8, %9}")
        binding = kernel.bind(args, "cuda")
        run_source(source, binding.grid, binding.block, binding.values)
        results.append(np.allclose(c, want, rtol=1e-5, atol=1e-4))
    assert results == [True, False]


# --------------------------------------------------------------------------- what a GPU does not allow
@pytest.mark.parametrize("body, block, error", [
    # lane 31 has returned: .aligned instructions need every lane of the warp
    ("  if (threadIdx.x == 31) return;\n  unsigned r;\n" + LDMATRIX.replace("{row}", "threadIdx.x % 8 * 8"), 32,
     "ldmatrix with 31 of the warp's 32 lanes"),
    ("  unsigned r;\n" + LDMATRIX.replace("{row}", "threadIdx.x % 8 * 8"), 16, "ldmatrix with 16 of the warp's 32"),
    # half the warp at an x1, half at an x2
    ("  unsigned r, q[2];\n  if (threadIdx.x < 16) {\n    " + LDMATRIX.replace("{row}", "threadIdx.x % 8 * 8")
     + "\n  } else {\n    asm volatile(\"ldmatrix.sync.aligned.m8n8.x2.shared.b16 {%0, %1}, [%2];\" : \"=r\"(q[0]), "
       "\"=r\"(q[1]) : \"r\"((unsigned)__cvta_generic_to_shared(&s[0])) : \"memory\");\n  }", 32,
     "lanes of a warp are at different warp-wide instructions"),
    # rows 2 bytes past a 16-byte boundary
    ("  unsigned r;\n" + LDMATRIX.replace("{row}", "threadIdx.x % 8 * 8 + 1"), 32, "not aligned to 16 bytes"),
    # the last row runs past the shared array's end
    ("  unsigned r;\n" + LDMATRIX.replace("{row}", "threadIdx.x % 8 * 8 + 8"), 32,
     "16 bytes at a shared address outside every shared array"),
    # a copy into a thread's own registers (a local array), not shared memory
    ("  __align__(16) float local[4];\n  asm volatile(\"cp.async.cg.shared.global [%0], [%1], 16, %2;\" :: "
     "\"r\"((unsigned)__cvta_generic_to_shared(&local[0])), \"l\"((const void*)&X[0]), \"r\"(16) : \"memory\");", 32,
     "cp.async: 16 bytes at a shared address outside every shared array"),
    # .cg caches 16-byte copies only
    ("  asm volatile(\"cp.async.cg.shared.global [%0], [%1], 8, %2;\" :: \"r\"((unsigned)__cvta_generic_to_shared("
     "&s[0])), \"l\"((const void*)&X[0]), \"r\"(8) : \"memory\");", 32, "cp.async.cg copies 16 bytes"),
])
def test_what_a_gpu_does_not_allow_stops_the_launch(body, block, error):
    with pytest.raises(RuntimeError, match=error):
        run(TILE + body, "const float* __restrict__ X", [np.zeros(64, np.float32)], block)


def test_inline_ptx_without_an_emulation_is_refused():
    with pytest.raises(Unsupported, match="inline PTX 'bar.sync 0'"):
        translate('asm volatile("bar.sync 0;" ::: "memory");')
    with pytest.raises(Unsupported, match="a shared address not taken by __cvta_generic_to_shared"):
        translate('asm volatile("cp.async.ca.shared.global [%0], [%1], 4, %2;" :: "r"(addr), "l"(p), "r"(4));')
    with pytest.raises(Unsupported, match="a global address not taken by __cvta_generic_to_global"):
        translate('asm volatile("prefetch.global.L2 [%0];" :: "l"(&X[1]));')
    assert translate('asm volatile("prefetch.global.L2 [%0];" :: "l"(__cvta_generic_to_global(&X[i + 1])));') == \
        "{ (void)((const void*)(&X[i + 1])); }"     # a hint: nothing to run
    for types in ("f32.s8.s8.f32", "s32.e4m3.e4m3.s32", "f32.e4m3.s8.f32"):     # no such instruction
        with pytest.raises(Unsupported, match=f"inline PTX 'mma.sync.aligned.m16n8k32.row.col.{types}"):
            translate(f'asm volatile("mma.sync.aligned.m16n8k32.row.col.{types} {{%0, %1, %2, %3}}, '
                      '{%4, %5, %6, %7}, {%8, %9}, {%0, %1, %2, %3};" : '
                      + ", ".join(f'"+f"(c[{r}])' for r in range(4)) + " : "
                      + ", ".join(f'"r"(a[{r}])' for r in range(6)) + ");")
    with pytest.raises(UnsupportedSource, match="inline PTX 'membar.gl'"):
        run('  asm volatile("membar.gl;" ::: "memory");', "int* __restrict__ OUT", [np.zeros(1, np.int32)])


# --------------------------------------------------------------------------- when copies land
COPY = ('  asm volatile("cp.async.ca.shared.global [%0], [%1], 4, %2;" :: "r"((unsigned)__cvta_generic_to_shared('
        '&s[t])), "l"((const void*)&X[t]), "r"(t < n ? 4 : 0) : "memory");\n')


def test_a_copy_lands_at_the_wait_that_retires_its_group():
    """Before its wait a copy's destination holds shared memory's poison (a NaN); the group committed after it
    lands at a wait for one group fewer; past src-size the destination is zero-filled."""
    body = ("  __shared__ __align__(16) float s[64];\n  int t = threadIdx.x;\n" + COPY
            + '  asm volatile("cp.async.commit_group;" ::: "memory");\n'
            + COPY.replace("&s[t]", "&s[32 + t]").replace("&X[t]", "&X[32 + t]")
            + '  asm volatile("cp.async.commit_group;" ::: "memory");\n'
            + "  OUT[t] = s[t];\n"
            + '  asm volatile("cp.async.wait_group 1;" ::: "memory");\n'
            + "  OUT[32 + t] = s[t]; OUT[64 + t] = s[32 + t];\n"
            + '  asm volatile("cp.async.wait_group 0;" ::: "memory");\n'
            + "  OUT[96 + t] = s[32 + t];")
    x = np.arange(1, 65, dtype=np.float32)
    out = np.zeros(128, np.float32)
    run(body, "const float* __restrict__ X, float* __restrict__ OUT, int n", [x, out, np.int32(20)])
    landed = np.where(np.arange(32) < 20, 1.0, 0.0)
    np.testing.assert_array_equal(out[:32], np.nan)
    np.testing.assert_array_equal(out[32:64], x[:32] * landed)
    np.testing.assert_array_equal(out[64:96], np.nan)
    np.testing.assert_array_equal(out[96:], x[32:] * landed)


# --------------------------------------------------------------------------- shared memory and the schedule
def test_each_block_starts_with_poisoned_shared_memory():
    """Shared memory a block reads before writing is NaN (or -1) in every block, not what the last block left."""
    body = ("  __shared__ __align__(16) float s[32];\n  __shared__ __align__(16) int n[32];\n"
            "  OUT[blockIdx.x * 32 + threadIdx.x] = s[threadIdx.x];\n"
            "  COUNT[blockIdx.x * 32 + threadIdx.x] = n[threadIdx.x];\n"
            "  __syncthreads();\n  s[threadIdx.x] = 1.0f; n[threadIdx.x] = 1;")
    out, count = np.zeros(64, np.float32), np.zeros(64, np.int32)
    run(body, "float* __restrict__ OUT, int* __restrict__ COUNT", [out, count], grid=2)
    np.testing.assert_array_equal(out, np.nan)
    np.testing.assert_array_equal(count, -1)


@pytest.mark.parametrize("neighbour", ["t + 1", "t + 31"])
def test_a_missing_barrier_shows_from_either_side(neighbour):
    """Each thread writes its slot and reads a neighbour's. Without the barrier, a thread that runs before its
    neighbour reads poison: the next thread's slot in the block run in ascending order, the previous one's in the
    other (blocks alternate)."""
    for barrier in (True, False):
        body = ("  __shared__ __align__(16) float s[32];\n  int t = threadIdx.x;\n  s[t] = (float)t;\n"
                + ("  __syncthreads();\n" if barrier else "")
                + f"  OUT[blockIdx.x * 32 + t] = s[({neighbour}) % 32];")
        out = np.zeros(64, np.float32)
        run(body, "float* __restrict__ OUT", [out], grid=2)
        want = np.tile((np.arange(32) + int(neighbour[-2:])) % 32, 2).astype(np.float32)
        if barrier:
            np.testing.assert_array_equal(out, want)
        else:
            assert np.isnan(out).any()
