"""The cpu register-tile matmul template: its space, its kernels on the cpu and with NVRTC.

Oracle: numpy's matmul in float64. Sizes are symbolic, so one compiled kernel per schedule
point serves every shape hypothesis draws.
"""
import dataclasses
import re

import ml_dtypes
import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

import taskdsl as td
from stdlib_ops import gemm
from stdlib_ops import matmul_cpu as cpu
from stdlib_ops import matmul_simt as simt
from taskdsl.backend.cpu import vectors
from taskdsl.ir.types import numpy_dtype

from ..cuda_checks import assert_builds_for_sm80_and_sm90

OPTIMIZED = True   # the unrolled, vectorized micro-kernel this template exists for, not td.fast_compile
DIMS = st.sampled_from([1, 2, 5, 16, 17, 31, 48, 49, 65, 97, 130])

SMALL = cpu.space().point(micro=(4, 8), block=(24, 64), bk=128)
# both widths' defaults, whatever the host: a CI machine without AVX-512 still runs the 4x64 kernels; and the
# narrow tiles the defaults take for products of few columns, and the 64-row blocks for 128 rows (`matmul_cpu.fitted`)
POINTS = [cpu.default_point(unit=vectors.AVX512), cpu.default_point(unit=vectors.AVX2), SMALL,
          cpu.default_point(unit=vectors.AVX512, n=96), cpu.default_point(unit=vectors.AVX2, n=16),
          cpu.default_point(unit=vectors.AVX512, m=128)]


def _run(p, a, b, split=1, dtype=td.f32, packed_b=False, transposed_a=False, copy_a=False, rows_first=False):
    """C = a @ b for 2-D operands through the template kernel at point `p` (split-k partials summed; with
    `packed_b`, the kernel that reads B as `pack_b` packs it; with `transposed_a`, the one reading a.T, which
    `copy_a` copies block by block; with `rows_first`, its blocks in row-major order)."""
    out_dtype = td.f32 if split > 1 else dtype
    c = np.full((split, a.shape[0], b.shape[1]), np.nan, numpy_dtype(out_dtype))    # every element must be written
    operand = cpu.pack_b(p, b[None]) if packed_b else b[None]
    kernel = cpu.tile_matmul_kernel(p, dtype, out_dtype, packed_b, transposed_a, copy_a, rows_first=rows_first)
    kernel(np.ascontiguousarray(a.T)[None] if transposed_a else a[None], operand, c,
           simt.batch_index((), (), (), split), split)
    return c.sum(axis=0, dtype=np.float64)


@pytest.mark.parametrize("unit, valid, registers", [(vectors.AVX2, 72, 96), (vectors.AVX512, 168, 0)])
def test_space_size_and_pruning_match_the_docs(unit, valid, registers):
    space = cpu.space(unit=unit)
    assert (space.raw_size, len(space.points())) == (192, valid)
    too_many = {f"micro-tile needs more than {unit.registers} vector registers": registers} if registers else {}
    assert space.pruned() == {"block tile not a multiple of the micro-tile": 24, **too_many}
    for p in space.points():
        bm, bn, threads = cpu.tile_shape(p)
        assert threads == 1 and bm % p.micro[0] == 0 and bn % p.micro[1] == 0
    with pytest.raises(ValueError, match="multiple of the micro-tile"):
        space.point(micro=(6, 16), block=(64, 64), bk=256)
    assert "vector registers" in cpu.check(space.points()[0].replace(micro=(8, 16) if registers else (16, 32)),
                                           unit=unit)
    assert "unrolls" in cpu.check(space.points()[0].replace(micro=(4, 80), block=(48, 80)), unit=vectors.AVX512)
    assert "KiB" in cpu.check(space.points()[0].replace(block=(96, 128), bk=1024), unit=unit)
    assert "cache line" in cpu.check(space.points()[0].replace(micro=(6, 8), block=(48, 8)), unit=unit)
    assert cpu.check(cpu.default_point(unit=unit), unit=unit) is None


AVX2_ON_AVX512 = vectors.VectorUnit(256, 32)     # an AVX-512 host capped to 256 bits (TASKDSL_CPU_VECTOR_BITS)


@pytest.mark.parametrize("unit", [vectors.AVX512, AVX2_ON_AVX512, vectors.AVX2, vectors.SSE])
def test_the_default_tile_is_fitted_to_short_and_narrow_products(unit):
    wide = cpu.default_point(unit=unit)
    sixteen = unit is vectors.AVX2      # 4x16 tiles in 64-row blocks (6x16 took 20 of its 16 registers)
    assert (wide.micro, wide.block) == (((4, 16), (64, 64)) if sixteen else (wide.micro, (48, 64)))
    tall = unit is vectors.AVX512        # 64-row blocks where they compute 8% fewer rows than 48-row ones
    one_block = (49, 72) if not sixteen else (72, 73, 96)   # one row block, not a second one at most half used
    for n in (None, 64, 128, 1000, 50257, 288):       # last column block full, more than half used, or shortfall small
        for m in (None, 1, 48, 73, 96, 196, 289, 3136):
            if m not in one_block:
                assert cpu.default_point(unit=unit, m=m, n=n) == wide
        for m in (97, 100, 128, 256):
            p = cpu.default_point(unit=unit, m=m, n=n)
            assert p == (wide.replace(block=(64, 64)) if tall else wide)
            assert cpu.check(p, unit=unit) is None
        for m in one_block:
            assert cpu.default_point(unit=unit, m=m, n=n) == wide.replace(block=(96, 64))
    for n, width in ((1, 16), (16, 16), (17, 32), (24, 32), (32, 32), (96, 32), (160, 32)):
        for m in (None, 49, 3136):
            p = cpu.default_point(unit=unit, m=m, n=n)
            assert p.block == (96, width) and p.micro[1] <= width and cpu.check(p, unit=unit) is None, (n, p)
    fitted = cpu.default_point(unit=unit, m=49, n=16)
    td.fast_compile(True)
    try:        # the same tile: left in loops, it computes in registers all the same (`codegen.STACK_BYTES`)
        assert cpu.default_point(unit=unit, m=49, n=16) == fitted
    finally:
        td.fast_compile(False)


def test_the_host_vector_unit_follows_numbas_cpu_and_the_cap(monkeypatch):
    from numba.core import config
    monkeypatch.setattr(config, "CPU_NAME", "skylake-avx512")
    for features, unit in (("+avx2,+avx512f,+fma", vectors.AVX512), ("+avx2,-avx512f", vectors.AVX2), ("", vectors.SSE)):
        monkeypatch.setattr(config, "CPU_FEATURES", features)
        vectors.host.cache_clear()
        assert vectors.host() == unit
    monkeypatch.setattr(config, "CPU_FEATURES", "+avx512f")
    monkeypatch.setenv("TASKDSL_CPU_VECTOR_BITS", "256")
    vectors.host.cache_clear()
    assert vectors.host() == vectors.VectorUnit(256, 32)     # AVX-512's 32 registers hold ymm vectors too
    monkeypatch.setenv("TASKDSL_CPU_VECTOR_BITS", "384")
    vectors.host.cache_clear()
    with pytest.raises(ValueError, match="128, 256 or 512"):
        vectors.host()
    monkeypatch.delenv("TASKDSL_CPU_VECTOR_BITS")
    vectors.host.cache_clear()       # the next test's host() is the real one again (monkeypatch undoes config)


# (packed_b, transposed_a, copy_a) per point: the variants the graph ops use (matmul, linear, NCHW conv; those
# of many pixels copy A, `matmul_cpu.copies_a`), and for the small point the one only users call (each variant
# of a point is a compile of a big unrolled kernel)
GRAPH_VARIANTS = [(False, False, False), (True, False, False), (True, True, False), (True, True, True)]
PACKED_VARIANTS = [(True, False, False), (True, True, False)]      # linear and NCHW convolutions by constant weights
VARIANTS = [GRAPH_VARIANTS, GRAPH_VARIANTS[:3], GRAPH_VARIANTS + [(False, True, True)], PACKED_VARIANTS,
            PACKED_VARIANTS, GRAPH_VARIANTS[:2]]     # the last: BERT's and GPT-2's 128-token products


@pytest.mark.parametrize("point, variants", [pytest.param(p, v, id="x".join(map(str, p.block)) + "_m" + "x".join(map(str, p.micro)))
                                              for p, v in zip(POINTS, VARIANTS)])
@settings(max_examples=8, deadline=None)
@given(m=DIMS, n=DIMS, k=DIMS, split=st.sampled_from([1, 1, 3]), data=st.data(), seed=st.integers(0, 2**16))
def test_template_points_on_cpu(point, variants, m, n, k, split, data, seed):
    td.set_target("cpu")
    packed_b, transposed_a, copy_a = data.draw(st.sampled_from(variants), label="(packed_b, transposed_a, copy_a)")
    rng = np.random.default_rng(seed)
    a = rng.standard_normal((m, k)).astype(np.float32)
    b = rng.standard_normal((k, n)).astype(np.float32)
    got = _run(point, a, b, split, packed_b=packed_b, transposed_a=transposed_a, copy_a=copy_a)
    np.testing.assert_allclose(got, a.astype(np.float64) @ b, rtol=1e-4, atol=1e-4)


@settings(max_examples=12, deadline=None)
@given(m=DIMS, n=DIMS, k=DIMS, split=st.sampled_from([1, 3]), variant=st.sampled_from(GRAPH_VARIANTS),
       seed=st.integers(0, 2**16))
def test_blocks_in_row_major_order_compute_the_same_product(m, n, k, split, variant, seed):
    """`rows_first` kernels (a row block's column panels one after the other) against numpy: partial blocks, one
    panel or several (SMALL's are 64 columns wide), split-k, each operand form."""
    td.set_target("cpu")
    packed_b, transposed_a, copy_a = variant
    rng = np.random.default_rng(seed)
    a, b = rng.standard_normal((m, k)).astype(np.float32), rng.standard_normal((k, n)).astype(np.float32)
    got = _run(SMALL, a, b, split, packed_b=packed_b, transposed_a=transposed_a, copy_a=copy_a, rows_first=True)
    np.testing.assert_allclose(got, a.astype(np.float64) @ b, rtol=1e-4, atol=1e-4)


def test_rows_first_where_a_is_large_and_b_small():
    """ResNet-50's 64 -> 256 1x1 convolutions at 56x56 take row-major blocks at batch 8 (A 1.6 Mi floats, B 16 Ki),
    not at batch 1 (A 200 Ki); its 128 -> 512 ones at batch 8 do not (B 64 Ki floats: re-read from L2 by every row
    block, they ran slower), nor does a product of one column panel."""
    p = cpu.default_point(unit=vectors.AVX512)
    assert cpu.rows_first(p, 8 * 56 * 56, 64, 256) and not cpu.rows_first(p, 56 * 56, 64, 256)
    assert not cpu.rows_first(p, 8 * 28 * 28, 128, 512) and not cpu.rows_first(p, 8 * 56 * 56, 64, p.block[1])
    assert not cpu.rows_first(p, None, 64, 256)
    assert cpu.tile_matmul_kernel(p, td.f32, td.f32, True, rows_first=True).name.endswith("_rows")


@pytest.mark.parametrize("packed_b, transposed_a, copy_a", GRAPH_VARIANTS)
@pytest.mark.parametrize("split", [1, 3])
def test_no_k_stores_zeros(packed_b, transposed_a, copy_a, split):
    """K = 0 (and split-k slices past K) run one empty k block: every element of C is stored, as zero."""
    a, b = np.zeros((7, 0), np.float32), np.zeros((0, 70), np.float32)
    np.testing.assert_array_equal(_run(SMALL, a, b, split, packed_b=packed_b, transposed_a=transposed_a,
                                       copy_a=copy_a), np.zeros((7, 70)))


def test_copying_a_refuses_more_columns_than_a_block_holds():
    """A block that copies A computes every column panel: at most WIDE_N columns (past them its sums would be
    written out of bounds; the process crashed: an audit's finding)."""
    a, b = np.ones((7, 3), np.float32), np.ones((3, cpu.WIDE_N + 1), np.float32)
    with pytest.raises(ValueError, match=f"at most {cpu.WIDE_N} columns, got N = {cpu.WIDE_N + 1}"):
        _run(SMALL, a, b, transposed_a=True, copy_a=True)
    b = np.ones((3, cpu.WIDE_N), np.float32)
    np.testing.assert_array_equal(_run(SMALL, a, b, transposed_a=True, copy_a=True), np.full((7, cpu.WIDE_N), 3))


@settings(max_examples=10, deadline=None)
@given(batch=st.sampled_from([1, 2, 3]), k=DIMS, n=DIMS, seed=st.integers(0, 2**16))
def test_packed_b_holds_each_panel_row_after_row_aligned_and_zero_padded(batch, k, n, seed):
    p = SMALL
    bn = p.block[1]
    b = np.random.default_rng(seed).standard_normal((batch, k, n)).astype(np.float32)
    panels = cpu.pack_b(p, b)
    count = -(-n // bn)
    assert panels.shape == cpu.packed_b_shape(p, b.shape) == (batch * count * k, bn)
    assert panels.ctypes.data % 64 == 0 and panels.flags.c_contiguous
    padded = np.zeros((batch, k, count * bn), np.float32)
    padded[:, :, :n] = b
    for z in range(batch):
        for j in range(count):
            rows = slice((z * count + j) * k, (z * count + j + 1) * k)
            np.testing.assert_array_equal(panels[rows], padded[z, :, j * bn:(j + 1) * bn])


def test_plans_multiply_by_packed_weights_with_batches_and_f16():
    td.set_target("cpu")
    rng = np.random.default_rng(3)
    a = rng.standard_normal((2, 3, 29, 131)).astype(np.float32)
    w = rng.standard_normal((3, 131, 67)).astype(np.float32)      # batch dims broadcast (1 -> 2)
    p = gemm.plan(a.shape, w.shape, td.f32, "cpu")
    assert p.packs_b and p.kernel(packed_b=True).name.endswith("_packed")
    got = gemm.matmul(a, w, packed=p.pack_b(w))
    np.testing.assert_allclose(got, a.astype(np.float64) @ w, rtol=1e-4, atol=1e-4)
    a16, w16 = a[0, 0].astype(np.float16), w[0].astype(np.float16)
    p16 = gemm.plan(a16.shape, w16.shape, td.f16, "cpu")
    got16 = gemm.matmul(a16, w16, packed=p16.pack_b(w16))
    assert got16.dtype == np.float16
    np.testing.assert_allclose(got16, a16.astype(np.float64) @ w16.astype(np.float64), rtol=1e-2, atol=5e-2)
    with pytest.raises(ValueError, match="no kernel for packed B or transposed A"):
        dataclasses.replace(p, template=gemm.SIMT).kernel(packed_b=True)


def test_long_k_crosses_k_blocks_and_f16_accumulates_in_f32():
    td.set_target("cpu")
    rng = np.random.default_rng(1)
    a = rng.standard_normal((37, 2039)).astype(np.float32)
    b = rng.standard_normal((2039, 41)).astype(np.float32)
    np.testing.assert_allclose(_run(cpu.default_point(), a, b), a.astype(np.float64) @ b, rtol=1e-4, atol=1e-3)
    a16, b16 = a[:, :300].astype(np.float16), b[:300].astype(np.float16)
    got = _run(cpu.default_point(), a16, b16, dtype=td.f16)
    np.testing.assert_allclose(got, a16.astype(np.float64) @ b16.astype(np.float64), rtol=1e-2, atol=5e-2)


@pytest.mark.fast_compile     # the copy of A is the same code unrolled or not
@settings(max_examples=8, deadline=None)
@given(m=DIMS, n=DIMS, k=DIMS, split=st.sampled_from([1, 3]), variant=st.sampled_from(GRAPH_VARIANTS),
       dtype=st.sampled_from([td.f16, td.bf16]), seed=st.integers(0, 2**16))
def test_16_bit_a_is_copied_to_f32_a_block_at_a_time(m, n, k, split, variant, dtype, seed):
    """16-bit A is converted to f32 a block and k block at a time (`matmul_cpu.stages_a`), in place or transposed:
    rows past M, k blocks past the first and split-k slices read the right elements."""
    td.set_target("cpu")
    assert cpu.stages_a(dtype) and not cpu.stages_a(td.f32)
    host = np.float16 if dtype is td.f16 else ml_dtypes.bfloat16
    rng = np.random.default_rng(seed)
    a, b = (rng.standard_normal(shape).astype(host) for shape in ((m, k), (k, n)))
    packed_b, transposed_a, copy_a = variant
    got = _run(SMALL, a, b, split, dtype, packed_b, transposed_a, copy_a)
    want = a.astype(np.float64) @ b.astype(np.float64)
    np.testing.assert_allclose(got, want, rtol=1e-2, atol=1e-2 * max(1, np.abs(want).max(initial=0)))


def test_the_cpu_plans_use_this_template_and_split_only_long_k():
    td.set_target("cpu")
    p = gemm.plan((96, 300), (300, 64), td.f32, "cpu")
    assert p.template is gemm.CPU_TILE and p.point == cpu.default_point(m=96, n=64) and p.split == 1
    block = "x".join(map(str, p.point.block))
    assert p.anchor.name.startswith(f"tile_matmul_{block}x256")
    td.fast_compile(True)
    try:        # fast compile: the same tile, and plans cached per mode
        fast = gemm.plan((96, 300), (300, 64), td.f32, "cpu")
        assert fast is not p and fast.anchor.name.startswith(f"tile_matmul_{block}x256")
    finally:
        td.fast_compile(False)
    point = cpu.default_point()
    split = gemm.choose_split(point, 1, 4, 4, 1 << 16, "cpu", gemm.CPU_TILE)     # one block: split k over threads
    assert 1 < split <= gemm.num_threads() or gemm.num_threads() == 1
    assert gemm.choose_split(point, 1, 4, 4, 256, "cpu", gemm.CPU_TILE) == 1
    assert gemm.choose_split(point, 8, 1024, 1024, 1 << 16, "cpu", gemm.CPU_TILE) == 1


def test_plans_copy_a_transposed_a_of_many_rows():
    """An A-transposed kernel copies A block by block from M = COPY_A_ROWS on (3x3 convolutions of 28x28 pixels
    and more) where a block can compute every column panel from its copy (N <= WIDE_N), and reads it in place
    otherwise; a plain A is always read in place."""
    for m, n, copied in ((cpu.COPY_A_ROWS - 1, 64, False), (cpu.COPY_A_ROWS, 64, True), (3136, 64, True),
                         (3136, cpu.WIDE_N, True), (3136, cpu.WIDE_N + 1, False)):
        p = gemm.plan((1, m, 64), (1, 64, n), td.f32, "cpu")
        assert p.kernel(packed_b=True, transposed_a=True).name.endswith("_at_copied") == copied
        assert not p.kernel(packed_b=True).name.endswith("_copied")


@settings(max_examples=6, deadline=None)
@given(m=DIMS, n=DIMS, k=st.sampled_from([1, 17, 127, 128, 129, 300]), seed=st.integers(0, 2**16))
def test_packed_b_is_prefetched_inside_its_panels(m, n, k, seed):
    """The packed-B kernel prefetches the rows after each k block's: debug mode checks each prefetch, so none may
    pass the end of packed B (the last panel's last k block, a block of few rows, K below a k block)."""
    td.set_target("cpu")
    rng = np.random.default_rng(seed)
    a = rng.standard_normal((m, k)).astype(np.float32)
    b = rng.standard_normal((k, n)).astype(np.float32)
    td.debug(True)
    try:
        got = _run(SMALL, a, b, packed_b=True)
    finally:
        td.debug(False)
    np.testing.assert_allclose(got, a.astype(np.float64) @ b, rtol=1e-4, atol=1e-4)
    operand = cpu.pack_b(SMALL, b[None])
    source = cpu.tile_matmul_kernel(SMALL, td.f32, td.f32, True).source(a[None], operand, a[None, :, :1],
                                                                         np.zeros((1, 2), np.int32), 1, target="cpu")
    assert "rt.prefetch(B, " in source


def test_every_point_compiles_with_nvrtc():
    """The kernels are ordinary DSL kernels: every point builds for sm_80 and sm_90 (`assert_builds_for_sm80_and_sm90`).
    The packed-B, A-transposed and A-copying variants change only the operands' addressing: eight points of each."""
    a = np.zeros((1, 64, 64), np.float32)
    index = np.zeros((1, 2), np.int32)
    points = cpu.space().points()
    kernels = [(cpu.tile_matmul_kernel(p, td.f32, td.f32), a) for p in points]
    kernels += [(cpu.tile_matmul_kernel(p, td.f32, td.f32, True), cpu.pack_b(p, a)) for p in points[:8]]
    kernels += [(cpu.tile_matmul_kernel(p, td.f32, td.f32, False, True), a) for p in points[:8]]   # the A-transposed
    kernels += [(cpu.tile_matmul_kernel(p, td.f32, td.f32, True, True), cpu.pack_b(p, a)) for p in points[:8]]
    kernels += [(cpu.tile_matmul_kernel(p, td.f32, td.f32, True, True, True), cpu.pack_b(p, a)) for p in points[:8]]
    sources = [k.source(a, b, a, index, 1, target="cuda") for k, b in kernels]
    assert_builds_for_sm80_and_sm90(sources, [k.name for k, _ in kernels], "tile_space")


def test_a_large_product_packs_b_once_per_call(monkeypatch):
    td.set_target("cpu")
    shapes = []
    pack_b = gemm.MatmulPlan.pack_b
    monkeypatch.setattr(gemm.MatmulPlan, "pack_b", lambda self, b: shapes.append(b.shape) or pack_b(self, b))
    monkeypatch.setattr(gemm, "PACK_PER_CALL_MACS", 140 * 60 * 50)     # rows past `matmul_small`'s
    rng = np.random.default_rng(5)
    b = rng.standard_normal((60, 50)).astype(np.float32)
    for m, packs in ((140, True), (139, False)):
        a = rng.standard_normal((m, 60)).astype(np.float32)
        shapes.clear()
        np.testing.assert_allclose(gemm.matmul(a, b), a.astype(np.float64) @ b, rtol=1e-4, atol=1e-4)
        assert shapes == ([(60, 50)] if packs else [])


@pytest.mark.parametrize("point", [cpu.default_point(unit=vectors.AVX512, n=16), cpu.default_point(unit=vectors.AVX512),
                                   SMALL])
def test_fast_compile_loops_over_a_tiles_columns_outside_its_rows_where_a_row_is_one_vector(point):
    """Left in loops (fast compile), the micro-kernel's multiply-adds loop over the tile's columns outside its rows
    where a tile row is one of the host's vectors or less (`matmul_cpu.columns_outside`), else rows outside: LLVM
    unrolls a short inner loop first and vectorizes the one around it (rows outside, it vectorized AVX-512's 6x16
    tile across its rows, by gathers: MobileNet-V2's 16-channel layer ran 5.4 ms instead of 0.2). The product
    against numpy too."""
    td.set_target("cpu")
    rng = np.random.default_rng(1)
    a, b = rng.standard_normal((50, 37)).astype(np.float32), rng.standard_normal((37, 16)).astype(np.float32)
    c = np.full((1, 50, 16), np.nan, np.float32)
    kernel = cpu.tile_matmul_kernel(point, td.f32, td.f32)
    td.fast_compile(True)
    try:
        source = kernel.source(a[None], b[None], c, simt.batch_index((), (), ()), 1, target="cpu")
        kernel(a[None], b[None], c, simt.batch_index((), (), ()), 1)
    finally:
        td.fast_compile(False)
    np.testing.assert_allclose(c[0], a.astype(np.float64) @ b, rtol=1e-4, atol=1e-4)
    lines = source.splitlines()
    at = next(n for n, line in enumerate(lines) if "fa[" in line and "fb[" in line and "c[" in line)
    loops = []      # the loop variables around the multiply-add, innermost first
    depth = len(lines[at]) - len(lines[at].lstrip())
    for line in reversed(lines[:at]):
        indent = len(line) - len(line.lstrip())
        header = re.match(r"\s*(?:for (\w+) in|while (\w+) <)", line)
        if header and indent < depth:
            loops.append(header.group(1) or header.group(2))
            depth = indent
    inner, outer = loops[:2]
    columns, rows = (outer, inner) if cpu.columns_outside(point.micro[1]) else (inner, outer)
    assert re.search(rf"fa\[[^]]*\b{rows}\b", lines[at]) and re.search(rf"fb\[[^]]*\b{columns}\b", lines[at]), source


def test_kernels_of_other_shapes_and_blocks_share_one_outlined_sweep():
    """The sweep of a block's micro-tiles is an outlined function: the kernels a graph fixes to other shapes (M in
    one row block, where the kernel's sizes prove its row clamps never bind, or in several) and of other block
    heights and widths generate one module for it, the unrolled tile compiled once for them all; the kernels call
    it."""
    from taskdsl.backend.cpu.codegen import emit_python
    from taskdsl.passes import bind_sizes, lower, lower_for_cpu
    texts, calls = set(), []
    for block in ((48, 64), (96, 64), (96, 32)):
        fn = cpu.tile_matmul_kernel(cpu.default_point(unit=vectors.AVX512).replace(block=block), td.f32, td.f32,
                                    packed_b=True)._frontend_ir((1, 1, 1))
        for m in (48, 100):     # the sizes fixed before every pass, as a graph fixes them
            sizes = {"BA": 1, "M": m, "K": 64, "RB": 64, "BZ": 1, "N": 64}
            src = emit_python(lower_for_cpu(lower(bind_sizes(fn, sizes)), debug=False))
            texts |= {o.text for o in src.outlined}
            calls.append(src.text.count("rt.call_entry(outlined_0, ("))
    assert len(texts) == 1 and calls == [1] * 6
    assert "def kernel_sweep(" in texts.pop()
