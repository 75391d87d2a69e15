"""The tensor-core matmul template: its space, NVRTC builds of every point, and its meaning on the cpu.

On the cpu target mma / ldmatrix / cp_async are emulated lane by lane with the PTX layouts, so
the template's fragment indexing, swizzle and pipeline are checked against numpy here. The
emulation is slow to compile, so the cpu runs use one small point of the same template
(1 warp, a 16x32 block tile: two pairs of B fragments, two k steps a tile, 2 stages); the NVRTC check covers
every point of the space.
"""
import math

import ml_dtypes
import numpy as np
import pytest
from hypothesis import example, given, settings, strategies as st

import taskdsl as td
from stdlib_ops import conv, gemm
from stdlib_ops import matmul_simt as simt
from stdlib_ops import matmul_tc as tc
from stdlib_ops.conv_geometry import geometry
from taskdsl.backend.cuda.nvrtc import combine_sources, resource_usage
from taskdsl.schedule.space import Space

from ..cuda_checks import assert_builds_for_sm80_and_sm90
from . import pairwise_covering
from .test_conv import reference

SMALL = Space("tc_small", {"warps": ((1, 1),), "warp_tiles": ((1, 4),), "bk": (32,), "stages": (2,)},
              tc.check).points()[0]


def _run(p, a, b, vec):
    kernel = tc.tc_matmul_kernel(p, td.f16, td.f32, vec)
    c = np.full((1, a.shape[0], b.shape[1]), np.nan, np.float32)
    kernel(a[None], b[None], c, simt.batch_index((), (), ()), 1)
    return c[0]


HOPPER_SMEM, ADA_SMEM = 227 * 1024, 99 * 1024     # the shared memory a block may have on sm_90, on sm_86 and sm_89


def _tiles(points) -> set:
    return {(tc.tile_shape(p)[:2], p.bk, p.stages) for p in points}


def test_space_size_and_pruning():
    """What docs/templates.md says of the space: off a device 151 of 168 points, on a Hopper GPU two more (4-stage
    256x128 and 128x256 tiles of bk 64), on an sm_86 or sm_89 one 136; every point within its shared memory."""
    space = tc.space()
    assert (space.raw_size, len(space.points())) == (168, 151)
    assert space.pruned() == {"shared memory above 160 KiB": 2, "a tile the threads cannot load evenly": 15}
    assert min(bm * bn for bm, bn, _ in map(tc.tile_shape, space.points())) == 32 * 32
    hopper, ada = tc.space(HOPPER_SMEM), tc.space(ADA_SMEM)
    assert hopper.pruned() == {"a tile the threads cannot load evenly": 15}
    assert _tiles(set(hopper.points()) - set(space.points())) == {((256, 128), 64, 4), ((128, 256), 64, 4)}
    assert len(ada.points()) == 136 and ada.pruned()["shared memory above 99 KiB"] == 17
    for limit, s in ((tc.MAX_SMEM, space), (HOPPER_SMEM, hopper), (ADA_SMEM, ada)):
        for p in s.points():
            bm, bn, threads = tc.tile_shape(p)
            assert p.stages * (bm + bn) * p.bk * 2 <= limit and threads <= 256
        assert {tc.default_point(), tc.default_point(4096, 4096), tc.default_point(64, 64)} <= set(s.points())


@pytest.mark.parametrize("limit, size", [(None, 151), (HOPPER_SMEM, 153), (ADA_SMEM, 136)])
def test_the_tuner_searches_what_the_device_holds(simulated_gpu, limit, size):
    """The matmul and conv tuners' space on cuda stops at the device's shared memory a block (160 KiB where the
    device does not say); on the cpu target it is the space off a device."""
    from taskdsl.backend.cuda import launch
    launch.device_state().limits = launch.LaunchLimits(max_shared=limit)
    assert len(gemm.TENSOR_CORE.space("cuda", 2).points()) == size
    assert len(gemm.TENSOR_CORE.space("cpu", 2).points()) == 151


def _covering() -> list:
    """The points of the space that hold every pair of axis values between them, the largest warp tiles first."""
    return pairwise_covering(tc.space().points(), lambda p: (math.prod(p.warp_tiles), p.bk, p.stages))


def _program(points: list) -> tuple[list, set]:
    """(the CUDA sources of the template's kernels at `points` and of the default's variants: 1-element loads,
    f16 out, bf16 in; the kernel names of `points`)."""
    a = np.zeros((1, 64, 64), np.float16)
    c = np.zeros((1, 64, 64), np.float32)
    index = np.zeros((1, 2), np.int32)
    kernels = [tc.tc_matmul_kernel(p, td.f16, td.f32, 8) for p in points]
    names = {k.name for k in kernels}
    assert len(names) == len(kernels)
    sources = [k.source(a, a, c, index, 1, target="cuda") for k in kernels]
    variants = [(tc.tc_matmul_kernel(tc.default_point(), td.f16, td.f32, 1), a, c, "_aligned1"),
                (tc.tc_matmul_kernel(tc.default_point(), td.f16, td.f16, 8), a, a, "_f16out"),
                (tc.tc_matmul_kernel(tc.default_point(), td.bf16, td.f32, 8), a.view(np.uint16), c, "_bf16")]
    for kernel, operand, out, suffix in variants:     # renamed: a variant's name may be a point's
        sources.append(kernel.source(operand, operand, out, index, 1, target="cuda").replace(kernel.name,
                                                                                              kernel.name + suffix))
    return sources, names


def test_every_point_compiles_with_nvrtc():
    """Every point and variant builds for sm_80 and sm_90 in fast mode (the check is that they build); the
    optimized build is test_the_space_keeps_its_fragments_in_registers's."""
    sources, names = _program(tc.space(HOPPER_SMEM).points())
    unit = combine_sources(sources)
    assert "mma.sync.aligned.m16n8k16" in unit and "ldmatrix.sync.aligned.m8n8.x4.trans" in unit and "cp.async" in unit
    assert_builds_for_sm80_and_sm90(sources, names, "tc_space")


def test_the_space_keeps_its_fragments_in_registers():
    """ptxas, optimizing for sm_90, gives no point a stack frame (a fragment indexed at run time lives in local
    memory). Checked on points that hold every pair of axis values between them, the largest warp tiles first
    (`pairwise_covering`: 28 of the 151; all of them took 46 s of NVRTC here), and on the default's variants."""
    points = _covering()
    sources, names = _program(points)
    report = resource_usage(combine_sources(sources))
    assert names < set(report) and len(report) == len(names) + 3
    # a few points spill a word or two (ptxas's choice under register pressure): stack beyond that is an array
    assert {name: r for name, r in report.items() if r["stack_bytes"] >= r["spill_store_bytes"] + 8} == {}


def test_the_parts_of_the_k_loop_keep_what_they_name():
    """`parts` (for `bench tc-parts`): "copies" keeps the 16-byte copies and drops every ldmatrix and mma,
    "math" the reverse; both keep the waits and barriers. "mma" keeps the mma alone in the k loop: its ldmatrix
    are the two fragment sets' loads before it, and its only wait and barrier the prologue's. Anything else is
    refused. (The simulated-GPU test of the benchmark runs all four.)"""
    a, index = np.zeros((1, 64, 64), np.float16), np.zeros((1, 2), np.int32)
    count = {}
    for parts in tc.PARTS:
        source = tc.tc_matmul_kernel(tc.default_point(), td.f16, td.f16, 8, parts).source(a, a, a, index, 1,
                                                                                          target="cuda")
        body = source[source.index("__global__"):]
        count[parts] = [body.count(op) for op in ("mma.sync", "ldmatrix", "cp.async.cg", "cp.async.wait", "__syncthreads")]
    assert min(count["all"]) > 0
    assert count["copies"] == [0, 0] + count["all"][2:]
    assert count["math"] == count["all"][:2] + [0] + count["all"][3:]
    # "mma": the two fragment sets' loads before the loop (a loop of A's ldmatrix and one of B's each), the
    # prologue's wait and barrier and the final wait
    assert count["mma"] == [count["all"][0], 4, 0, count["all"][3] - 1, count["all"][4] - 1]
    with pytest.raises(ValueError, match="parts must be one of all, copies, math, mma"):
        tc.tc_matmul_kernel(tc.default_point(), td.f16, td.f16, 8, "ldmatrix")


@settings(max_examples=8, deadline=None)
@given(m=st.sampled_from([1, 8, 16, 24, 40]), n=st.sampled_from([8, 16, 24, 40]), k=st.sampled_from([8, 16, 24, 48]),
       seed=st.integers(0, 2**16))
def test_pipelined_copies_on_cpu(m, n, k, seed):
    """K and N multiples of 8: 16-byte cp.async copies, zero-filled at the tile edges."""
    td.set_target("cpu")
    rng = np.random.default_rng(seed)
    a = rng.standard_normal((m, k)).astype(np.float16)
    b = rng.standard_normal((k, n)).astype(np.float16)
    np.testing.assert_allclose(_run(SMALL, a, b, 8), a.astype(np.float64) @ b.astype(np.float64), rtol=1e-3, atol=1e-3)


ON_HOST = pytest.mark.cuda_on_host


@pytest.mark.parametrize("m, n, k, split, bk, stages, early", [
    pytest.param(32, 64, 160, 1, 32, 3, False, marks=ON_HOST),
    pytest.param(17, 40, 200, 2, 32, 3, False, marks=ON_HOST),
    pytest.param(20, 24, 456, 1, 64, 4, False, marks=ON_HOST),
    (20, 24, 456, 1, 64, 4, True)])
def test_deep_pipelines_and_their_tails(m, n, k, split, bk, stages, early):
    """Several k steps a tile (bk 32: A's and B's copies after the first step's mma; bk 64: A's after the first,
    B's after the second), three and four stages, with more k tiles than stages: the copies stop at the last
    tile while the ring drains. Sizes that are multiples of the tile (their bounds checks fold away) and sizes
    that are not; split-k starts the pipeline at a later tile. Without `early` the template's CUDA source runs
    on the host (a numba build each would take seconds), where each copy lands at the wait that retires it: a
    wait for one group too few fails this test (as it fails `emulate_async_copies`' cpu runs). With `early`, on
    the cpu, each lands at issue (`td.cp_async_early`): a copy into a ring slot some lane still reads fails it."""
    td.set_target("cpu")
    point = Space("tc_deep", {"warps": ((1, 1),), "warp_tiles": ((1, 4),), "bk": (bk,), "stages": (stages,)},
                  tc.check).points()[0]
    rng = np.random.default_rng(k)
    a = rng.standard_normal((1, m, k)).astype(np.float16)
    b = rng.standard_normal((1, k, n)).astype(np.float16)
    td.cp_async_early(early)
    try:
        c = gemm.MatmulPlan(point, td.f16, (1,), (1,), (1,), m, n, k, split, gemm.TENSOR_CORE)(a, b)
    finally:
        td.cp_async_early(False)
    want = a[0].astype(np.float64) @ b[0].astype(np.float64)
    np.testing.assert_allclose(c[0].astype(np.float64), want, rtol=2e-2, atol=2e-2)


@settings(max_examples=6, deadline=None)
@given(m=st.sampled_from([1, 7, 17, 33]), n=st.sampled_from([1, 5, 19]), k=st.sampled_from([1, 13, 37]),
       seed=st.integers(0, 2**16))
def test_odd_sizes_use_element_loads_on_cpu(m, n, k, seed):
    td.set_target("cpu")
    rng = np.random.default_rng(seed)
    a = rng.standard_normal((m, k)).astype(np.float16)
    b = rng.standard_normal((k, n)).astype(np.float16)
    np.testing.assert_allclose(_run(SMALL, a, b, 1), a.astype(np.float64) @ b.astype(np.float64), rtol=1e-3, atol=1e-3)


@settings(max_examples=1, deadline=None)    # a fused kernel is specialized to its shapes: ~20 s of numba each
@given(m=st.sampled_from([1, 24]), n=st.sampled_from([8, 24]), k=st.sampled_from([16, 40]),
       seed=st.integers(0, 2**16))
@example(m=1, n=24, k=40, seed=0)           # a partial tile in every dimension
def test_prologues_replace_the_async_copies_of_their_operand(m, n, k, seed):
    """A prologue on A (scaled) and on B (read transposed): their cp.asyncs become stores of the computed values,
    zero-filled at the tile edges; the fused kernel matches numpy on the cpu and compiles with NVRTC."""
    td.set_target("cpu")
    rng = np.random.default_rng(seed)
    a = rng.standard_normal((1, m, k)).astype(np.float16)
    bt = rng.standard_normal((1, n, k)).astype(np.float16)
    x = td.placeholder("x", td.f16, a.shape)
    y = td.placeholder("y", td.f16, bt.shape)
    pa = td.compute("pa", a.shape, lambda z, i, j: x[z, i, j] * 2.0)
    pb = td.compute("pb", (1, k, n), lambda z, i, j: y[z, j, i])
    anchor = tc.tc_matmul_kernel(SMALL, td.f16, td.f32, 8)
    index = simt.batch_index((), (), ())
    c = np.full((1, m, n), np.nan, np.float32)
    fused = td.fuse(anchor, a, np.empty((1, k, n), np.float16), c, index, 1, prologues={"A": pa, "B": pb})
    assert [name for name, _ in fused.params] == ["C", "batch_index", "split", "x", "y"]
    fused(c, index, 1, a, bt)
    want = (2.0 * a[0].astype(np.float64)) @ bt[0].T.astype(np.float64)
    np.testing.assert_allclose(c[0], want, rtol=2e-3, atol=2e-3)
    source = fused.source(c, index, 1, a, bt, target="cuda")
    assert source.count("cp.async.cg") == 0 and "mma.sync" in source


# (x shape, w shape, pad, groups, stride, dilation)
NHWC_CASES = [((1, 5, 6, 16), (8, 16, 3, 3), 1, 1, 1, 1), ((2, 4, 5, 16), (16, 8, 3, 3), 2, 2, 1, 1),
              ((1, 9, 8, 8), (8, 8, 3, 2), 1, 1, 2, 2), ((2, 9, 8, 16), (16, 8, 3, 2), 2, 2, 2, 2)]


@settings(max_examples=1, deadline=None)    # a fused kernel is specialized to its shapes: ~20 s of numba each
@given(case=st.sampled_from(NHWC_CASES), seed=st.integers(0, 2**16))
# two images, two groups, a wide padding, stride 2, dilation 2 and a 3x2 kernel: one example (one compile)
@example(case=NHWC_CASES[3], seed=0)
def test_an_nhwc_im2col_prologue_keeps_the_async_copies_from_the_input(case, seed):
    """conv's NHWC im2col of 8-channel runs (`gather_runs`): the fused kernel copies each run of A from X itself
    by cp.async, zero-filled in the padding, instead of computing element stores; matches numpy on the cpu."""
    td.set_target("cpu")
    _check_nhwc_im2col(SMALL, case, seed)


def _check_nhwc_im2col(point, case, seed: int) -> None:
    """The template at `point` with conv's NHWC im2col of `case` fused as A's prologue, against numpy."""
    x_shape, w_shape, pad, groups, stride, dilation = case
    rng = np.random.default_rng(seed)
    x = rng.standard_normal(x_shape).astype(np.float16)
    w = rng.standard_normal(w_shape).astype(np.float16)
    g = geometry(x_shape, w_shape, stride, pad, dilation, groups, layout="NHWC")
    a = conv.im2col(g, td.placeholder("X", td.f16, x_shape))
    assert a.gather_runs == 8
    n_groups, m, k, n = g.gemm
    anchor = tc.tc_matmul_kernel(point, td.f16, td.f32, 8)
    index = simt.batch_index((n_groups,), (n_groups,), (n_groups,))
    c = np.full((n_groups, m, n), np.nan, np.float32)
    b = conv.pack_weight(g, w)
    fused = td.fuse(anchor, np.empty((n_groups, m, k), np.float16), b, c, index, 1, prologues={"A": a})
    source = fused.source(b, c, index, 1, x, target="cuda")
    # issue_a and issue_b are inlined twice each (pipeline prologue, main loop): A's copies from X, and B's
    assert source.count("cp.async.cg") == 4 and source.count("(const void*)&X[") == 2
    fused(b, c, index, 1, x)
    want = reference(x.transpose(0, 3, 1, 2), w, None, (stride,) * 2, (pad,) * 4, (dilation,) * 2, groups)
    got = c.reshape(n_groups, x_shape[0], g.oh, g.ow, n).transpose(1, 0, 4, 2, 3).reshape(want.shape)
    np.testing.assert_allclose(got, want, rtol=2e-3, atol=2e-3, err_msg=f"{point}, {case}")


@pytest.mark.cuda_on_host
def test_every_nhwc_im2col_case_runs_its_cuda_source_on_the_host():
    """Each case above, where the cpu can afford one, at the small point and the default one (2 x 2 warps)."""
    for point in (SMALL, tc.default_point()):
        for seed, case in enumerate(NHWC_CASES):
            _check_nhwc_im2col(point, case, seed)


def test_a_three_channel_im2col_loads_its_elements_with_no_branch():
    """A stem-like convolution (3 channels: no 16-byte runs, K = 27 not a multiple of 8): element loads of A
    through the im2col, at clamped pixels under an eager select, so the CUDA has no branch around each load;
    padding, stride and the k edge still read zeros (the emulated template against numpy)."""
    td.set_target("cpu")
    rng = np.random.default_rng(5)
    x = rng.standard_normal((1, 9, 9, 3)).astype(np.float16)
    w = rng.standard_normal((8, 3, 3, 3)).astype(np.float16)
    g = geometry(x.shape, w.shape, 2, 1, layout="NHWC")
    a = conv.im2col(g, td.placeholder("X", td.f16, x.shape))
    _, m, k, n = g.gemm
    anchor = tc.tc_matmul_kernel(SMALL, td.f16, td.f32, 1)
    index = simt.batch_index((), (), ())
    c = np.full((1, m, n), np.nan, np.float32)
    b = conv.pack_weight(g, w)
    fused = td.fuse(anchor, np.empty((1, m, k), np.float16), b, c, index, 1, prologues={"A": a})
    source = fused.source(b, c, index, 1, x, target="cuda")
    assert source.count("td_select<__half>(") == 2 and "? X[" not in source    # prologue and main loop
    fused(b, c, index, 1, x)
    want = reference(x.transpose(0, 3, 1, 2), w, None, (2, 2), (1, 1, 1, 1), (1, 1), 1)
    np.testing.assert_allclose(c[0].reshape(g.oh, g.ow, n).transpose(2, 0, 1)[None], want, rtol=2e-3, atol=2e-3)


def test_planner_picks_tensor_cores_for_16_bit_floats_on_gpus_only():
    assert gemm.template_for(td.f16, "cuda") is gemm.TENSOR_CORE
    assert gemm.template_for(td.bf16, "cuda") is gemm.TENSOR_CORE
    assert gemm.template_for(td.f32, "cuda") is gemm.SIMT
    assert gemm.template_for(td.f16, "cpu") is gemm.CPU_TILE and gemm.template_for(td.f32, "cpu") is gemm.CPU_TILE
    def vec(m, n, k):
        return gemm.MatmulPlan(tc.default_point(), td.f16, (1,), (1,), (1,), m, n, k, 1, gemm.TENSOR_CORE).vec
    assert vec(2039, 2039, 2039) == 1 and vec(64, 64, 64) == 8 and vec(64, 64, 60) == 1


def test_default_tile_grows_with_the_output():
    """16x64 block tiles below 2^20 output elements (fewer 128x64 tiles than SMs), 128x64 up to 2^22 (and without
    sizes), 128x128 with 64x64 warp tiles from there."""
    assert tc.tile_shape(tc.default_point()) == tc.tile_shape(tc.default_point(1024, 1024)) == (128, 64, 128)
    small = tc.default_point(128, 768)
    assert tc.tile_shape(small) == (16, 64, 128) and (small.bk, small.stages) == (64, 4) and tc.check(small) is None
    assert tc.tile_shape(tc.default_point(1023, 1024)) == (16, 64, 128)
    large = tc.default_point(2048, 2048)
    assert tc.tile_shape(large) == (128, 128, 128) and large.warp_tiles == (4, 8) and large.bk == 64
    assert gemm.TENSOR_CORE.default("cuda", 2, 4096, 4096) == large


@settings(max_examples=4, deadline=None)
@given(m=st.sampled_from([1, 17, 33]), n=st.sampled_from([5, 19, 24]), k=st.sampled_from([13, 37]),
       batch=st.sampled_from([(), (2,)]), seed=st.integers(0, 2**16))
def test_unaligned_operands_are_padded_for_the_16_byte_copies(m, n, k, batch, seed):
    """A call whose rows are not multiples of 8 elements copies A and B into zero-padded rows and runs the
    cp.async kernel (from PAD_FROM_MACS multiply-adds; lowered here so the cpu emulation stays small)."""
    td.set_target("cpu")
    rng = np.random.default_rng(seed)
    a = rng.standard_normal(batch + (m, k)).astype(np.float16)
    b = rng.standard_normal((k, n)).astype(np.float16)
    p = gemm.MatmulPlan(SMALL, td.f16, batch or (1,), batch or (1,), (1,), m, n, k, 1, gemm.TENSOR_CORE)
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(gemm, "PAD_FROM_MACS", 0)
        assert p.pads and p.vec == 1
        a_pad, b_pad, _ = p.operand_shapes(padded=True)
        assert a_pad[-1] % 8 == 0 and b_pad[-2:] == (a_pad[-1], -(-n // 8) * 8)
        c = p(a.reshape((-1, m, k)), b[None])
    want = a.astype(np.float64) @ b.astype(np.float64)
    np.testing.assert_allclose(c.reshape(want.shape), want, rtol=2e-3, atol=2e-3)
    assert not p.pads and gemm.MatmulPlan(SMALL, td.f16, (1,), (1,), (1,), 4096, 2039, 2039, 1, gemm.TENSOR_CORE).pads
    assert not gemm.MatmulPlan(SMALL, td.f16, (1,), (1,), (1,), 4096, 4096, 4096, 1, gemm.TENSOR_CORE).pads
    assert not gemm.MatmulPlan(SMALL, td.f32, (1,), (1,), (1,), 4096, 2039, 2039, 1, gemm.SIMT).pads


# --------------------------------------------------------------------------- the CUDA source on the host
# The template's CUDA C++ itself, run on the host with its mma.sync, ldmatrix and cp.async emulated by the PTX ISA
# (tests/ptx_on_host.py): a block's threads run concurrently there, each copy lands at the wait that retires it,
# and shared memory starts as NaN. g++ builds a point in about a second where numba takes tens, so these reach
# the points and shapes the cpu emulation above cannot afford.
def one_block_shape(point) -> tuple:
    """(M, N, K) of one block with partial tiles in M and N, K through the whole ring of stages and past it."""
    bm, bn, _ = tc.tile_shape(point)
    return bm - 3, bn - 8, point.bk * (point.stages + 1) + 8


@pytest.mark.cuda_on_host
def test_the_covering_points_run_their_cuda_source_on_the_host():
    """The points that hold every pair of axis values, at `one_block_shape` (every point of the space:
    `tests/bench_host_runner.py --space`)."""
    _one_block_each(_covering())


@pytest.mark.cuda_on_host
def test_the_points_only_hopper_holds_run_on_the_host():
    """The 4-stage 256x128 and 128x256 tiles (192 KiB of shared memory: an sm_90 block's, not an sm_80 one's)."""
    _one_block_each(sorted(set(tc.space(HOPPER_SMEM).points()) - set(tc.space().points()), key=str))


def _one_block_each(points) -> None:
    """Each point's kernel at its `one_block_shape` against numpy."""
    for i, point in enumerate(points):
        m, n, k = one_block_shape(point)
        rng = np.random.default_rng(i)
        a = rng.standard_normal((m, k)).astype(np.float16)
        b = rng.standard_normal((k, n)).astype(np.float16)
        want = a.astype(np.float64) @ b.astype(np.float64)
        np.testing.assert_allclose(_run(point, a, b, 8), want, rtol=1e-3, atol=1e-3, err_msg=str(point))


@pytest.mark.cuda_on_host
@settings(max_examples=6, deadline=None)
@given(point=st.sampled_from(tc.space().points()), m=st.sampled_from([1, 17, 131]), n=st.sampled_from([8, 19, 136]),
       k=st.sampled_from([13, 40, 392]), dtype=st.sampled_from([td.f16, td.bf16]), split=st.sampled_from([1, 3]),
       seed=st.integers(0, 2**16))
@example(point=tc.default_point(2048, 2048), m=131, n=136, k=392, dtype=td.bf16, split=3, seed=0)
def test_any_point_shape_and_type_on_the_host(point, m, n, k, dtype, split, seed):
    """A plan at any point of the space: several blocks, unaligned sizes (element loads), bf16, split-k (f32
    partials, then their sum), a batch of two; its kernels' CUDA sources on the host against numpy."""
    rng = np.random.default_rng(seed)
    numpy_type = ml_dtypes.bfloat16 if dtype is td.bf16 else np.float16
    a = rng.standard_normal((2, m, k)).astype(numpy_type)
    b = rng.standard_normal((2, k, n)).astype(numpy_type)
    c = gemm.MatmulPlan(point, dtype, (2,), (2,), (2,), m, n, k, split, gemm.TENSOR_CORE)(a, b)
    want = a.astype(np.float64) @ b.astype(np.float64)
    np.testing.assert_allclose(c.astype(np.float64), want, rtol=2e-2, atol=2e-2 * math.sqrt(k), err_msg=str(point))


@pytest.mark.gpu
def test_tensor_core_matmul_on_gpu():
    td.set_target("cuda")
    rng = np.random.default_rng(0)
    for size in (256, 2039):
        a = rng.standard_normal((size, size)).astype(np.float16)
        b = rng.standard_normal((size, size)).astype(np.float16)
        p = gemm.plan(a.shape, b.shape, td.f16, "cuda", False)
        c = p(a[None], b[None])[0]
        np.testing.assert_allclose(c.astype(np.float64), a.astype(np.float64) @ b, rtol=2e-2, atol=5e-1)


@pytest.mark.gpu
@pytest.mark.parametrize("split", [1, 3])
def test_the_pipelines_of_the_space_on_gpu(split):
    """The points that hold every pair of axis values (`pairwise_covering`: every warp tile, bk and stage count) on
    a GPU against numpy: several k tiles, a partial last one, and split-k chunks starting the ring at a later tile.
    The cpu's emulation lands each copy at its wait (a wait for too few groups fails the cpu tests) but runs a
    block's threads one after another, so only a GPU checks the barriers against other warps' copies."""
    from concurrent.futures import ThreadPoolExecutor
    td.set_target("cuda")
    points = _covering()
    rng = np.random.default_rng(split)
    m, n, k = 200, 136, 1000                 # 1000 = 15 tiles of 64 and 40, or 31 of 32 and 8
    a = rng.standard_normal((1, m, k)).astype(np.float16)
    b = rng.standard_normal((1, k, n)).astype(np.float16)
    index = simt.batch_index((1,), (1,), (1,), split)
    kernels = [tc.tc_matmul_kernel(p, td.f16, td.f32, 8) for p in points]
    partials = np.zeros((split, m, n), np.float32)
    with ThreadPoolExecutor() as pool:      # NVRTC runs outside the GIL: the cubins build side by side
        list(pool.map(lambda kernel: kernel.compile(a, b, partials, index, split, target="cuda"), kernels))
    want = a[0].astype(np.float64) @ b[0].astype(np.float64)
    for point, kernel in zip(points, kernels):
        partials[:] = np.nan
        kernel(a, b, partials, index, split)
        np.testing.assert_allclose(partials.sum(0, dtype=np.float64), want, rtol=2e-2, atol=5e-1, err_msg=str(point))
