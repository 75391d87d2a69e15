"""The tensor-core matmul template on 8-bit operands (mma m16n8k32): E4M3 / E5M2 into f32, s8 / u8 into s32.

B comes k-major, as BT (batch, N, K). As for 16-bit operands (test_matmul_tc.py): the cpu target emulates the
warp-wide instructions by the PTX layouts at one small point; the CUDA sources of any point of the space run on
the host; every point builds with NVRTC where the instruction exists (integers on sm_80, 8-bit floats on sm_89+);
@gpu tests run the pairwise-covering points on a GPU. The oracle is numpy: int64 products of the integers, exact;
f64 products of the 8-bit floats (exact), against f32 sums.
"""
import math

import ml_dtypes
import numpy as np
import pytest
from hypothesis import example, given, settings, strategies as st

import taskdsl as td
from stdlib_ops import matmul_simt as simt
from stdlib_ops import matmul_tc as tc
from taskdsl.backend.cuda.nvrtc import combine_sources, compile_cubin, resource_usage
from taskdsl.schedule.space import Space

from . import pairwise_covering

INTEGERS, FLOATS = (td.i8, td.u8), (td.f8e4m3, td.f8e5m2)
PAIRS = [(a, b) for kind in (INTEGERS, FLOATS) for a in kind for b in kind]
NUMPY = {"f8e4m3": ml_dtypes.float8_e4m3fn, "f8e5m2": ml_dtypes.float8_e5m2, "i8": np.int8, "u8": np.uint8}
SMALL = Space("tc8_small", {"warps": ((1, 1),), "warp_tiles": ((1, 4),), "bk": (32,), "stages": (2,)},
              lambda p: tc.check(p, bits=8)).points()[0]
HOPPER_SMEM = 227 * 1024


def operand(rng, dtype, shape) -> np.ndarray:
    """Integers over their whole range; 8-bit floats normal at scales 0.01 to 10 (subnormals among them)."""
    if not dtype.is_float:
        lo, hi = dtype.limits
        return rng.integers(lo, hi + 1, shape).astype(NUMPY[dtype.name])
    return (rng.standard_normal(shape) * 10.0 ** rng.integers(-2, 2, shape)).astype(NUMPY[dtype.name])


def accumulator(dtype):
    return td.f32 if dtype.is_float else td.i32


def run(p, a, bt, vec: int, split: int = 1, b_dtype=None) -> np.ndarray:
    """C (batch, M, N) = A (batch, M, K) @ BT (batch, N, K).T by the template's kernel at point `p`: split-k
    partials summed here (in f64 or int64)."""
    a_type = td.ir.types.from_numpy(a.dtype)
    b_type = b_dtype or td.ir.types.from_numpy(bt.dtype)
    batch, m, n = a.shape[0], a.shape[1], bt.shape[1]
    out = accumulator(a_type)
    kernel = tc.tc_matmul_kernel(p, a_type, out, vec, b_dtype=b_type)
    partials = np.zeros((batch * split, m, n), out.numpy)
    kernel(a, bt, partials, simt.batch_index((batch,), (batch,), (batch,), split), split)
    wide = np.float64 if a_type.is_float else np.int64
    return partials.astype(wide).reshape(batch, split, m, n).sum(1)


def check(c, a, bt, k):
    """`c` against numpy's A @ BT.T: exact for integers; for 8-bit floats within f32 sums' rounding."""
    if a.dtype.kind in "iu":
        np.testing.assert_array_equal(c, a.astype(np.int64) @ bt.astype(np.int64).transpose(0, 2, 1))
    else:
        want = a.astype(np.float64) @ bt.astype(np.float64).transpose(0, 2, 1)
        scale = np.abs(a.astype(np.float64)) @ np.abs(bt.astype(np.float64)).transpose(0, 2, 1)
        bound = (k + 2) * 2.0**-24 * scale      # f32 sums of k exact products, in any order
        assert np.all(np.abs(c - want) <= bound), np.abs(c - want).max()


def test_the_8_bit_space_is_the_16_bit_one():
    """A point's `bk` counts 16-bit columns, so an 8-bit k tile moves the same bytes: the same shared memory, and
    (here) the same even loads, so the same 151 points (153 on a Hopper GPU) pass the check for either width;
    `check` is asked with the operands' width all the same, as its load mappings differ."""
    for limit in (tc.MAX_SMEM, HOPPER_SMEM):
        eight, sixteen = tc.space(limit, bits=8), tc.space(limit)
        assert set(map(str, eight.points())) == set(map(str, sixteen.points()))
        assert eight.pruned() == sixteen.pruned()
    assert tc.operand_tiles(SMALL, 8) == ((16, 64), (32, 64)) and tc.operand_tiles(SMALL) == ((16, 32), (32, 32))


def test_the_kernel_refuses_what_it_cannot_run():
    with pytest.raises(TypeError, match="16-bit or 8-bit operands of one width, got f8e4m3 and f16"):
        tc.tc_matmul_kernel(SMALL, td.f8e4m3, td.f32, 16, b_dtype=td.f16)
    with pytest.raises(ValueError, match=r"vec must be 16 \(16-byte copies of i8\) or 1, got 8"):
        tc.tc_matmul_kernel(SMALL, td.i8, td.i32, 8)


@settings(max_examples=2, deadline=None)     # a numba build of the emulated kernel each: ~6 s
@given(pair=st.sampled_from(PAIRS), m=st.sampled_from([1, 16, 23]), n=st.sampled_from([8, 32, 40]),
       k=st.sampled_from([16, 48, 64, 144]), seed=st.integers(0, 2**16))
@example(pair=(td.i8, td.u8), m=23, n=40, k=144, seed=0)       # a partial tile in every dimension
def test_pipelined_copies_on_cpu(pair, m, n, k, seed):
    """K a multiple of 16: 16-byte cp.async copies of A and of BT, zero-filled past K within a tile."""
    rng = np.random.default_rng(seed)
    a, bt = operand(rng, pair[0], (1, m, k)), operand(rng, pair[1], (1, n, k))
    check(run(SMALL, a, bt, 16), a, bt, k)


@settings(max_examples=2, deadline=None)
@given(pair=st.sampled_from(PAIRS), m=st.sampled_from([1, 7, 17]), n=st.sampled_from([1, 5, 19]),
       k=st.sampled_from([1, 13, 37, 71]), seed=st.integers(0, 2**16))
def test_odd_sizes_use_element_loads_on_cpu(pair, m, n, k, seed):
    rng = np.random.default_rng(seed)
    a, bt = operand(rng, pair[0], (1, m, k)), operand(rng, pair[1], (1, n, k))
    check(run(SMALL, a, bt, 1), a, bt, k)


@pytest.mark.cuda_on_host
@settings(max_examples=12, deadline=None)
@given(point=st.sampled_from(tc.space(bits=8).points()), pair=st.sampled_from(PAIRS),
       m=st.sampled_from([1, 17, 131]), n=st.sampled_from([8, 19, 136]), k=st.sampled_from([13, 48, 400]),
       split=st.sampled_from([1, 3]), seed=st.integers(0, 2**16))
@example(point=tc.default_point(2048, 2048), pair=(td.f8e4m3, td.f8e5m2), m=131, n=136, k=400, split=3, seed=0)
def test_any_point_shape_and_type_on_the_host(point, pair, m, n, k, split, seed):
    """Any point of the space: several blocks, unaligned sizes (element loads where K is not a multiple of 16),
    the four operand pairs of each kind, split-k, a batch of two; the CUDA source on the host against numpy."""
    rng = np.random.default_rng(seed)
    a, bt = operand(rng, pair[0], (2, m, k)), operand(rng, pair[1], (2, n, k))
    check(run(point, a, bt, 16 if k % 16 == 0 else 1, split), a, bt, k)


def _program(kernels: list) -> tuple[str, set]:
    """(one CUDA program of the template's kernels, each (point, dtype, vec); their kernel names)."""
    index = np.zeros((1, 2), np.int32)
    sources, names = [], set()
    for p, dtype, vec in kernels:
        a, c = np.zeros((1, 64, 64), NUMPY[dtype.name]), np.zeros((1, 64, 64), accumulator(dtype).numpy)
        kernel = tc.tc_matmul_kernel(p, dtype, accumulator(dtype), vec)
        names.add(kernel.name + dtype.name)
        sources.append(kernel.source(a, a, c, index, 1, target="cuda").replace(kernel.name, kernel.name + dtype.name))
    return combine_sources(sources), names


def test_every_point_compiles_with_nvrtc():
    """Every point of the Hopper space builds for sm_90 in fast mode, the four 8-bit types and the two copy
    widths taking turns over the points (a point's code differs by type only in the mma's type names and the
    element loads' zero); and the pairwise-covering points with integer operands for sm_80, where the 8-bit
    float mma does not exist (test_tensor_core_8bit.py checks that NVRTC refuses it there)."""
    types = INTEGERS + FLOATS
    kernels = [(p, types[i % 4], (16, 1)[i // 4 % 2]) for i, p in enumerate(tc.space(HOPPER_SMEM, 8).points())]
    unit, names = _program(kernels)
    assert "mma.sync.aligned.m16n8k32.row.col.s32.u8.u8.s32" in unit and ".f32.e5m2.e5m2.f32" in unit
    assert ".trans" not in unit                  # B's tile is k-major: ldmatrix without .trans
    cubin = compile_cubin(unit, "sm_90", "tc8_space", fast=True)
    assert all(name.encode() in cubin for name in names)
    unit, names = _program([(p, INTEGERS[i % 2], 16) for i, p in enumerate(_covering())])
    cubin = compile_cubin(unit, "sm_80", "tc8_covering", fast=True)
    assert all(name.encode() in cubin for name in names)


def _covering() -> list:
    return pairwise_covering(tc.space(bits=8).points(), lambda p: (math.prod(p.warp_tiles), p.bk, p.stages))


def test_the_space_keeps_its_fragments_in_registers():
    """ptxas, optimizing for sm_90, gives no pairwise-covering point a stack frame beyond a spilled word or two
    (as test_matmul_tc.py's check of the 16-bit kernels), E4M3 and s8 operands taking turns."""
    unit, names = _program([(p, (td.f8e4m3, td.i8)[i % 2], 16) for i, p in enumerate(_covering())])
    report = resource_usage(unit)
    assert names <= set(report)
    assert {name: r for name, r in report.items() if r["stack_bytes"] >= r["spill_store_bytes"] + 8} == {}


@pytest.mark.gpu
@pytest.mark.parametrize("pair", [(td.u8, td.i8), (td.f8e4m3, td.f8e5m2)])
def test_the_pipelines_of_the_space_on_gpu(pair):
    """The pairwise-covering points on a GPU against numpy, every other one split in three: the barriers against
    other warps' copies, which only a GPU checks."""
    from concurrent.futures import ThreadPoolExecutor
    td.set_target("cuda")
    rng = np.random.default_rng(1)
    a, bt = operand(rng, pair[0], (1, 200, 1024)), operand(rng, pair[1], (1, 136, 1024))
    out = accumulator(pair[0])
    launches = [(tc.tc_matmul_kernel(p, pair[0], out, 16, b_dtype=pair[1]),
                 (a, bt, np.zeros((split, 200, 136), out.numpy), simt.batch_index((1,), (1,), (1,), split), split))
                for p, split in zip(_covering(), (1, 3) * 14)]       # each point once, split or not in turn
    with ThreadPoolExecutor() as pool:      # NVRTC runs outside the GIL: the cubins build side by side
        list(pool.map(lambda launch: launch[0].compile(*launch[1], target="cuda"), launches))
    for kernel, args in launches:
        kernel(*args)
        wide = np.float64 if pair[0].is_float else np.int64
        check(args[2].astype(wide).sum(0)[None], a, bt, 1024)
