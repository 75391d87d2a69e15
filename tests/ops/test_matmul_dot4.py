"""The cpu's dot4 matmul template (8-bit integers into exact i32 on byte dot products: u8 by s8 as they are, the
other pairs offset into them): its space, its kernels on the cpu (on a host without vpdpbusd, dot4's plain
arithmetic) and with NVRTC, and the plans that choose it.

Oracle: numpy's matmul in int64 (exact). Sizes are symbolic, so one compiled kernel per schedule point and form
serves every shape hypothesis draws.
"""
import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

import stdlib_ops
import taskdsl as td
from stdlib_ops import gemm
from stdlib_ops import matmul_cpu as cpu
from stdlib_ops import matmul_dot4 as dot4
from stdlib_ops import matmul_simt as simt
from taskdsl.backend.cpu import vectors
from taskdsl.ir.types import from_numpy

from ..cuda_checks import assert_builds_for_sm80_and_sm90
from .test_matmul_8bit import large_terms

OPTIMIZED = True   # the unrolled micro-kernel this template exists for, not td.fast_compile (but where marked)
DIMS = st.sampled_from([1, 2, 3, 5, 16, 17, 31, 49, 97, 130])
DEPTHS = st.sampled_from([0, 1, 3, 4, 5, 17, 64, 257, 1031])     # K past a multiple of 4, past a k block
SPACE = dot4.space(16, 32)
POINTS = [dot4.default_point(), SPACE.point(micro=(4, 16), block=(24, 128), bk=256),
          SPACE.point(micro=(8, 16), block=(64, 64), bk=256)]
PAIRS = [(np.uint8, np.int8), (np.uint8, np.uint8), (np.int8, np.int8), (np.int8, np.uint8)]


def point_id(p) -> str:
    return f"{p.block[0]}x{p.block[1]}_m{p.micro[0]}x{p.micro[1]}"


def product(p, a3, b3, batch_index, packed_b: bool) -> np.ndarray:
    """C = A @ B (3-D operands, z-slices by `batch_index`) by the kernel at point `p`; every element written."""
    c = np.full((len(batch_index), a3.shape[1], b3.shape[2]), -7, np.int32)
    kernel = dot4.dot4_matmul_kernel(p, td.i32, packed_b, from_numpy(a3.dtype), from_numpy(b3.dtype))
    kernel(a3, dot4.pack_b(p, b3) if packed_b else b3, c, batch_index, 1)
    return c


def full_range(rng, shape, dtype) -> np.ndarray:
    info = np.iinfo(dtype)
    return rng.integers(info.min, info.max + 1, shape).astype(dtype)


def exact(a, b) -> np.ndarray:
    return np.matmul(a.astype(np.int64), b.astype(np.int64))


# each (pair, packed B) of a point is a compile of a big unrolled kernel: the middle point's eight are compiled by
# the module's other tests anyway, the other points take two each, between them every pair and both forms of B
VARIANTS = [[(PAIRS[2], False), (PAIRS[0], True)], [(t, packed) for t in PAIRS for packed in (False, True)],
            [(PAIRS[1], False), (PAIRS[3], True)]]


@pytest.mark.parametrize("point, variants", [pytest.param(p, v, id=point_id(p)) for p, v in zip(POINTS, VARIANTS)])
@settings(max_examples=4, deadline=None)
@given(m=DIMS, n=DIMS, k=DEPTHS, data=st.data(), seed=st.integers(0, 2**16))
def test_template_points_are_exact_for_every_pair(point, variants, m, n, k, data, seed):
    types, packed_b = data.draw(st.sampled_from(variants), label="(types, packed_b)")
    rng = np.random.default_rng(seed)
    a, b = full_range(rng, (1, m, k), types[0]), full_range(rng, (1, k, n), types[1])
    got = product(point, a, b, np.zeros((1, 2), np.int32), packed_b)
    np.testing.assert_array_equal(got, exact(a, b))


@pytest.mark.fast_compile      # (the prefetches' addresses, not the micro-kernel's speed)
@settings(max_examples=5, deadline=None)
@given(m=DIMS, n=DIMS, k=st.sampled_from([1, 4, 17, 255, 256, 257, 1031]), seed=st.integers(0, 2**16))
def test_packed_b_is_prefetched_inside_its_panels(m, n, k, seed):
    """The packed-B kernel prefetches the rows after each k block's: debug mode checks each prefetch, so none may
    pass the end of packed B (the last panel's last k block, a block of few rows, K below a k block)."""
    rng = np.random.default_rng(seed)
    a, b = full_range(rng, (1, m, k), np.uint8), full_range(rng, (1, k, n), np.int8)
    td.debug(True)
    try:
        got = product(POINTS[1], a, b, np.zeros((1, 2), np.int32), packed_b=True)
    finally:
        td.debug(False)
    np.testing.assert_array_equal(got, exact(a, b))
    source = dot4.dot4_matmul_kernel(POINTS[1], td.i32, True).source(a, dot4.pack_b(POINTS[1], b), got,
                                                                     np.zeros((1, 2), np.int32), 1, target="cpu")
    assert "rt.prefetch(B, " in source.split("# ---- outlined function")[1]


@pytest.mark.fast_compile      # (the stores, not the micro-kernel's speed)
@pytest.mark.parametrize("packed_b", [False, True])
def test_blocks_stored_a_column_at_a_time_are_exact(packed_b):
    """`columns_outer` (the store for an epilogue that lays C's rows together): every pair, odd sizes, a batch."""
    rng = np.random.default_rng(6)
    for (a_type, b_type), (m, k, n) in zip(PAIRS, [(49, 17, 130), (5, 64, 3), (97, 5, 16), (1, 3, 31)]):
        a, b = full_range(rng, (2, m, k), a_type), full_range(rng, (2, k, n), b_type)
        kernel = dot4.dot4_matmul_kernel(POINTS[1], td.i32, packed_b, from_numpy(a.dtype), from_numpy(b.dtype),
                                         columns_outer=True)
        c = np.full((2, m, n), -7, np.int32)
        kernel(a, dot4.pack_b(POINTS[1], b) if packed_b else b, c, simt.batch_index((2,), (2,), (2,)), 1)
        np.testing.assert_array_equal(c, exact(a, b))


@pytest.mark.fast_compile      # (the offsets' corrections, not the micro-kernel's speed)
@pytest.mark.parametrize("types", PAIRS, ids=lambda t: f"{t[0].__name__}_{t[1].__name__}")
@pytest.mark.parametrize("packed_b", [False, True])
def test_sums_far_past_2_to_the_24_and_broadcast_batches_are_exact(types, packed_b):
    """Large terms of one sign (sums past 2^24, where f32 would round; the offsets' corrections too), and a batch
    of 3 A's by one B and 2 B's (`simt.batch_index`'s broadcasting)."""
    rng = np.random.default_rng(5)
    a, b = large_terms(rng, (3, 7, 2000), types[0]), large_terms(rng, (1, 2000, 37), types[1])
    want = exact(a, b)
    assert np.abs(want).min() > 2**24
    np.testing.assert_array_equal(product(dot4.default_point(), a, b, simt.batch_index((3,), (3,), (1,)), packed_b),
                                  want)
    a2, b2 = full_range(rng, (1, 4, 9), types[0]), full_range(rng, (2, 9, 5), types[1])
    np.testing.assert_array_equal(product(POINTS[1], a2, b2, simt.batch_index((2,), (1,), (2,)), packed_b),
                                  exact(a2, b2))


@pytest.mark.parametrize("types", [PAIRS[0], PAIRS[2]], ids=lambda t: f"{t[0].__name__}_{t[1].__name__}")
def test_an_indirect_a_is_copied_run_by_run_across_k_blocks(types):
    """A read through an index table (`indirect`, a convolution's im2col in place): each k block's taps copied in
    runs of consecutive offsets, found once for all rows; runs of random lengths, crossing the k blocks of 256."""
    rng = np.random.default_rng(9)
    m, k, n = 29, 601, 40
    flat = full_range(rng, (1, 5000), types[0])
    rows, taps = rng.integers(0, 2000, m), []
    while len(taps) < k:
        start = int(rng.integers(0, 2500))
        taps += range(start, start + int(rng.integers(1, 70)))
    taps = np.array(taps[:k])
    table = cpu.indirect_index(np.zeros((1, 2), np.int32), rows, taps)
    b = full_range(rng, (1, k, n), types[1])
    p = POINTS[1]
    kernel = dot4.dot4_matmul_kernel(p, td.i32, True, from_numpy(flat.dtype), from_numpy(b.dtype), indirect=True)
    c = np.full((1, m, n), -7, np.int32)
    kernel(flat, dot4.pack_b(p, b), c, table, 1)
    np.testing.assert_array_equal(c[0], exact(flat[0][rows[:, None] + taps[None, :]], b[0]))
    with pytest.raises(ValueError, match="an indirect A goes with packed B"):
        dot4.dot4_matmul_kernel(p, td.i32, False, indirect=True)


def test_kernels_of_other_epilogues_and_shapes_share_one_outlined_sweep():
    """The k block's column sums and micro-tiles are an outlined function: two kernels fused with other epilogues (a
    requantization, a scaled cast) and specialized to other shapes generate one module for it, which each calls from
    one place, and compute the product exactly (numpy's in int64)."""
    p = dot4.default_point()
    kernel = dot4.dot4_matmul_kernel(p, td.i32, False, td.i8, td.i8)
    rng = np.random.default_rng(7)
    texts = set()
    for (m, n, k), requantized in (((13, 70, 33), True), ((50, 129, 300), False)):
        a, b = rng.integers(-128, 128, (1, m, k)).astype(np.int8), rng.integers(-128, 128, (1, k, n)).astype(np.int8)
        c = td.placeholder("C", td.i32, (1, m, n))
        if requantized:     # round(C / 7), saturated to int8
            out = td.compute("Q", (1, m, n), lambda z, i, j: td.cast(td.rint(td.cast(c[z, i, j], td.f32) / 7.0), td.i8))
            want = np.clip(np.rint(np.float32(a[0].astype(np.int64) @ b[0]) / np.float32(7)), -128, 127)
        else:
            out = td.compute("Q", (1, m, n), lambda z, i, j: td.cast(c[z, i, j], td.f32) * 2.0)
            want = 2.0 * (a[0].astype(np.int64) @ b[0])
        index = np.zeros((1, 2), np.int32)
        fused = td.fuse(kernel, a, b, np.zeros((1, m, n), np.int32), index, 1, epilogues={"C": out})
        got = np.zeros((1, m, n), out.dtype.numpy)
        fused(a, b, index, 1, got)
        np.testing.assert_array_equal(got[0], want)
        module, *outlined = fused.source(a, b, index, 1, got, target="cpu").split("# ---- outlined function")
        assert len(outlined) == 1 and module.count("rt.call_entry(outlined_0, (") == 1
        texts.add(outlined[0].split("\n", 1)[1])
    assert len(texts) == 1 and "def kernel_sweep(" in texts.pop()


@pytest.mark.parametrize("width, registers, valid, too_many", [(16, 32, 171, 0), (8, 32, 126, 45), (8, 16, 42, 129)])
def test_space_size_and_pruning_match_the_docs(width, registers, valid, too_many):
    space = dot4.space(width, registers)
    assert (space.raw_size, len(space.points())) == (192, valid)
    wanted = {"block tile not a multiple of the micro-tile": 21}
    if too_many:
        wanted[f"micro-tile needs more than {registers} vector registers"] = too_many
    assert space.pruned() == wanted
    for p in space.points():
        bm, bn, threads = dot4.tile_shape(p)
        assert threads == 1 and bm % p.micro[0] == 0 and bn % p.micro[1] == 0 and p.micro[1] % width == 0
    assert "lanes of a dot4" in dot4.check(space.points()[0].replace(micro=(6, 12)), width, registers)
    assert "KiB" in dot4.check(space.points()[0].replace(block=(96, 1024), bk=1024), width, registers)


def test_the_default_block_leaves_the_fewest_columns_unused():
    """128 columns a block, but 64 or 32 where N leaves fewer of the last block's columns unused (ties: wider)."""
    for n, width in ((None, 128), (768, 128), (3072, 128), (200, 32), (320, 64), (64, 64), (33, 64), (192, 64),
                     (11, 32), (16, 32), (1, 32), (96, 32)):
        p = dot4.default_point(n=n)
        assert p.block[1] == width and SPACE.check(p) is None, (n, p)


def test_the_default_block_is_64_rows_where_they_fill_it_and_48_rows_do_not():
    """8x32 micro-tiles in 64-row blocks where M is a multiple of 64 but not of 48 (AVX-512 VNNI); 6x32 in 48 else."""
    for n in (None, 768, 64):
        wide = dot4.default_point(n=n)
        for m in (64, 128, 256, 320, 512, 3136):
            p = dot4.default_point(m=m, n=n)
            if 16 in vectors.dot4_lanes():       # (elsewhere 8x32 needs more registers than the host has)
                assert p == wide.replace(micro=(8, 32), block=(64, wide.block[1])) and SPACE.check(p) is None, (m, p)
            else:
                assert p == wide
        for m in (None, 1, 48, 49, 96, 100, 192, 196, 384, 3120):
            assert dot4.default_point(m=m, n=n) == wide, m
    assert dot4.default_point(m=128, n=32).block == (96, 32)      # narrow blocks keep their rows


@pytest.mark.parametrize("dtype", [np.int8, np.uint8])
def test_packed_b_groups_four_k_per_column_zero_padded(dtype):
    """s8 B as it is, u8 B less 128 (B'), four k of a column together, zeros past K and N."""
    p = SPACE.point(micro=(4, 16), block=(24, 128), bk=256)
    b = full_range(np.random.default_rng(0), (2, 6, 130), dtype)
    panels = dot4.pack_b(p, b)
    assert panels.shape == dot4.packed_b_shape(p, b.shape) == (2 * 2 * 2, 512) and panels.ctypes.data % 64 == 0
    assert panels.dtype == np.int8
    grouped = panels.reshape(2, 2, 2, 128, 4)        # (batch, column block, group of 4 k, column, k in group)
    padded = np.zeros((2, 8, 256), np.int64)
    padded[:, :6, :130] = b.astype(np.int64) - (128 if dtype == np.uint8 else 0)
    for z, j, g, col, q in [(0, 0, 0, 0, 0), (1, 1, 1, 1, 1), (0, 1, 0, 1, 3), (1, 0, 1, 127, 2)]:
        assert grouped[z, j, g, col, q] == padded[z, 4 * g + q, 128 * j + col]
    assert not grouped[:, :, 1, :, 2:].any() and not grouped[:, 1, :, 2:].any()     # past K, past N


@pytest.mark.parametrize("shapes", [((5, 3000), (3000, 7)), ((2, 3, 40), (40, 50)), ((17,), (17, 3)), ((4, 0), (0, 6))])
@pytest.mark.fast_compile      # (the plans and calls, not the micro-kernel's speed)
@pytest.mark.parametrize("types", PAIRS[:2], ids=lambda t: f"{t[0].__name__}_{t[1].__name__}")
def test_stdlib_matmul_and_linear_of_integers_plan_on_it_where_the_host_has_dot4(shapes, types, dot4_products):
    td.set_target("cpu")
    rng = np.random.default_rng(1)
    a, b = full_range(rng, shapes[0], types[0]), full_range(rng, shapes[1], types[1])
    p = gemm.plan((1,) + a.shape[-1:] if a.ndim == 1 else a.shape, b.shape, from_numpy(a.dtype), "cpu",
                  b_dtype=from_numpy(b.dtype))
    assert (p.template is gemm.DOT4) == dot4_products
    got = stdlib_ops.matmul(a, b)
    assert got.dtype == np.int32
    np.testing.assert_array_equal(got, exact(a, b))
    np.testing.assert_array_equal(stdlib_ops.linear(a, np.ascontiguousarray(b.T)), exact(a, b))
    if not p.small and 0 not in a.shape + b.shape:       # by panels packed once
        np.testing.assert_array_equal(stdlib_ops.matmul(a, b, packed=p.pack_b(b)), exact(a, b))


def test_every_integer_pair_plans_on_it_but_convolutions_forms_and_floats_do_not(dot4_products):
    for a_type, b_type in ((td.u8, td.i8), (td.i8, td.i8), (td.u8, td.u8), (td.i8, td.u8)):
        template = gemm.plan((64, 64), (64, 64), a_type, "cpu", b_dtype=b_type).template
        assert template is (gemm.DOT4 if dot4_products else gemm.CPU_TILE)
    assert gemm.plan((64, 64), (64, 64), td.f32, "cpu").template is gemm.CPU_TILE
    assert gemm.plan((64, 64), (64, 64), td.u8, "cpu", b_dtype=td.i8, dot4_products=False).template is gemm.CPU_TILE
    assert gemm.plan((64, 64), (64, 64), td.u8, "cuda", b_dtype=td.i8).template is gemm.TENSOR_CORE


@pytest.mark.parametrize("dot4_products", [True], indirect=True)
def test_a_dot4_plan_refuses_the_register_tile_templates_forms_and_its_panels(dot4_products):
    p = gemm.plan((64, 64), (64, 64), td.u8, "cpu", b_dtype=td.i8)
    with pytest.raises(ValueError, match="not transposed: plan with dot4_products=False"):
        p.kernel(packed_b=True, transposed_a=True)
    with pytest.raises(ValueError, match="packed B must be a numpy array of int8, got float32"):
        p.check_packed(np.zeros(p.template.packed_b_shape(p.point, (1, 64, 64)), np.float32))


@pytest.mark.fast_compile      # (which kernel a call launches, not its speed)
def test_large_calls_leave_b_to_the_blocks_where_the_register_tile_template_packs_it_first(dot4_products,
                                                                                            monkeypatch):
    """From PACK_PER_CALL_MACS (lowered to this product) a call of the register-tile template packs B on the host
    and launches its packed-B kernel; the dot4 template's blocks pack their panels faster than that pass, so its
    call launches the kernel that takes B as it is. Both exact."""
    td.set_target("cpu")
    monkeypatch.setattr(gemm, "PACK_PER_CALL_MACS", 1)
    launched, call = [], td.Kernel.__call__
    monkeypatch.setattr(td.Kernel, "__call__", lambda self, *args: (launched.append(self.name), call(self, *args))[1])
    rng = np.random.default_rng(3)
    a, b = full_range(rng, (2, 100, 301), np.uint8), full_range(rng, (301, 130), np.int8)
    np.testing.assert_array_equal(stdlib_ops.matmul(a, b), exact(a, b))
    assert len(launched) == 1 and launched[0].endswith("_packed") != dot4_products, launched


def test_every_point_compiles_with_nvrtc():
    """Every point of AVX-512's space builds for sm_80 and sm_90 (dot4 as plain arithmetic), and the packed-B
    kernels of eight, and the kernels of the other pairs (their offsets and corrections) of one."""
    a, b, c = np.zeros((1, 64, 64), np.uint8), np.zeros((1, 64, 64), np.int8), np.zeros((1, 64, 64), np.int32)
    index = np.zeros((1, 2), np.int32)
    points = SPACE.points()
    kernels = [(dot4.dot4_matmul_kernel(p, td.i32), b) for p in points]
    kernels += [(dot4.dot4_matmul_kernel(p, td.i32, True), dot4.pack_b(p, b)) for p in points[:8]]
    kernels = [(k, a, operand) for k, operand in kernels]
    for a_type, b_type in PAIRS[1:]:
        ao, bo = np.zeros((1, 64, 64), a_type), np.zeros((1, 64, 64), b_type)
        kernels += [(dot4.dot4_matmul_kernel(p, td.i32, False, from_numpy(ao.dtype), from_numpy(bo.dtype)), ao, bo)
                    for p in points[:1]]
    sources = [k.source(x, operand, c, index, 1, target="cuda") for k, x, operand in kernels]
    assert_builds_for_sm80_and_sm90(sources, [k.name for k, _, _ in kernels], "dot4_space")
