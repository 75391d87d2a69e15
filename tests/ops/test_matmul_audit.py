"""Audit of the public matmul operators (stdlib_ops.matmul, batch_matmul, linear): regressions of the defects it
fixed, and the edge cases it checked, each against numpy: sizes 0, 1 and primes in M, N, K and batch dims, 1-D
operands on either side, 0-d operands, batch broadcasting, shapes that do not fit; f32, f16, bf16, mixed types,
big-endian floats, and the dtypes it refuses (f64, integers, bool); NaN / inf; long K in f16 (f32 sums,
split-k included); transposed, stepped, reversed, Fortran-order and read-only operands (results never alias
or change them); linear's PyTorch layout, bias and errors; `packed=` panels; `tune=` on the cpu.

Each test runs on the cpu and, as a cuda twin, on a GPU (or on the simulated one with TASKDSL_SIMULATED_GPU=1),
where its arrays go in as td.DeviceArrays (`put`) and results come back through `host`. Fixes of device-only
paths also have a test on the `simulated_gpu` fixture, which runs everywhere.
"""
import dataclasses
import re

import ml_dtypes
import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

import stdlib_ops as ops
import taskdsl as td
from stdlib_ops import gemm
from taskdsl.schedule.space import Space

from . import FEW, SEEDS, put, rand, same

GPU_TWINS = True


def exact(a, b) -> np.ndarray:
    """numpy's a @ b computed in float64 and rounded once to the type numpy gives the pair (the oracle)."""
    with np.errstate(invalid="ignore", over="ignore"):      # inf * 0, inf - inf: NaN as the kernels give it
        return np.asarray(np.matmul(a.astype(np.float64), b.astype(np.float64))).astype(np.result_type(a, b))


TOL = {np.dtype(np.float32): dict(rtol=1e-5, atol=1e-5), np.dtype(np.float16): dict(rtol=2e-3, atol=2e-3)}


def _cpu_only(reason: str):
    if td.get_target() == "cuda":
        pytest.skip(reason)


# ---------------------------------------------------------------- regressions
def test_big_endian_operands_are_their_native_type():
    """'>f4' and '>f2' arrays (as read from files) were refused: "matmul supports float32 and float16 operands,
    got >f4"; the other operators take them. Host arrays on either target (DeviceArrays are native)."""
    a, b = rand((7, 13), 0), rand((13, 5), 1)
    big_a, big_b = a.astype(">f4"), b.astype(">f2")
    same(ops.matmul(big_a, big_b), exact(a, b.astype(np.float16)), **TOL[np.dtype(np.float32)])
    same(ops.linear(big_a, b.T.astype(">f4"), rand((5,), 2).astype(">f4")), exact(a, b) + rand((5,), 2), rtol=1e-5,
         atol=1e-5)
    with pytest.raises(TypeError, match="got float64"):     # the refused type named natively
        ops.matmul(a.astype(">f8"), b)


def test_operands_of_two_types_on_the_device(simulated_gpu, twin_target):
    """A float16 DeviceArray times a float32 one (and linear's bias of another type) was a TypeError on a GPU, "a
    DeviceArray of float16 was given where float32 is needed", where numpy arrays compute in float32; now a cast
    kernel converts it. On the simulated GPU, so it runs without one (the cpu twin: the cuda twin repeats it)."""
    if twin_target == "cuda":
        pytest.skip("the cpu twin ran it on the simulated GPU")
    a, b = rand((7, 13), 0).astype(np.float16), rand((13, 5), 1)
    same(ops.matmul(td.to_device(a), td.to_device(b)), exact(a, b), rtol=1e-5, atol=1e-5)
    same(ops.matmul(td.to_device(b.T.copy()), td.to_device(a.T.copy())), exact(b.T, a.T), rtol=1e-5, atol=1e-5)
    x, w, bias = rand((2, 3, 13), 2), rand((5, 13), 3), rand((5,), 4).astype(np.float16)
    y = ops.linear(td.to_device(x), td.to_device(w), td.to_device(bias))
    same(y, exact(x, w.T) + bias.astype(np.float32), rtol=1e-5, atol=1e-5)


def test_batches_beyond_the_grid_z_limit_on_a_gpu(simulated_gpu, twin_target):
    """A GPU grid's y and z axes hold 65535 blocks, and the GPU matmul kernels launched a z-slice per product
    (times split-k): 70001 small products were a launch error on a GPU ("grid.z is 70001 blocks"), never seen on
    the cpu. The simulated GPU now checks each launch's dimensions as a GPU does; here with y and z limited to 1
    block, so that small batches show it: a batched split-k product (the SIMT template, then the partials' sum)
    and the copy into padded rows run their z-slices along x. The tensor-core template launches the same
    `batch_grid` (its z-slices' indexing is tested on the cpu: split-k, grouped convolutions)."""
    if twin_target == "cuda":
        pytest.skip("the cpu twin ran it on the simulated GPU")
    from stdlib_ops import matmul_tc as tc
    from taskdsl.backend.cuda import launch
    simulated_gpu.limits = launch.LaunchLimits(grid=(2**31 - 1, 1, 1))
    a, b = rand((2, 16, 600), 7), rand((600, 8), 8)
    assert gemm.plan(a.shape, b.shape, td.f32, "cuda").split > 1
    same(ops.matmul(td.to_device(a), td.to_device(b)), exact(a, b), rtol=1e-5, atol=1e-4)
    x, padded = rand((3, 5, 3), 9), td.to_device(np.full((3, 8, 8), np.nan, np.float32))
    tc.padded_copy_kernel(td.f32)(td.to_device(x), padded)
    same(padded, np.pad(x, ((0, 0), (0, 3), (0, 5))))
    kernel = tc.tc_matmul_kernel(tc.default_point(16, 8), td.f16, td.f32, 8)
    assert kernel.grid_spec(M=16, N=8, BZ=70_001) == (70_001, 1, 1)


def test_mixed_types_on_either_target():
    """The same products as the test above, through `put` (numpy arrays on the cpu; DeviceArrays on cuda)."""
    a, b = rand((7, 13), 0).astype(np.float16), rand((13, 5), 1)
    same(ops.matmul(put(a), put(b)), exact(a, b), rtol=1e-5, atol=1e-5)
    same(ops.matmul(put(b[:, 0]), put(a.T.copy())), exact(b[:, 0], a.T), rtol=1e-5, atol=1e-5)
    x, w, bias = rand((2, 3, 13), 2), rand((5, 13), 3), rand((5,), 4).astype(np.float16)
    same(ops.linear(put(x), put(w), put(bias)), exact(x, w.T) + bias.astype(np.float32), rtol=1e-5, atol=1e-5)


def test_packed_panels_of_another_type_are_refused():
    """Panels of the right shape but not f32 (what pack_b gives for any operand type) went to the kernel, whose
    error named its internals ("kernel 'tile_matmul_16x64x256_m2x8_packed': argument 'B' must have dtype
    float32"), and a list failed there as "must be a numpy array"; the op's check names `packed`."""
    a, b = rand((7, 13), 0), rand((13, 5), 1)
    if td.get_target() == "cuda":
        with pytest.raises(ValueError, match="takes no packed B: call matmul without packed="):
            ops.matmul(put(a), put(b), packed=np.zeros((13, 64), np.float32))
        return
    panels = gemm.plan(a.shape, b.shape, td.f32, "cpu").pack_b(b)
    same(ops.matmul(a, b, packed=panels), exact(a, b), rtol=1e-5, atol=1e-5)
    for bad, named in ((panels.astype(np.float16), "float16"), (panels.astype(np.float64), "float64"),
                       (panels.tolist(), "list")):
        with pytest.raises(ValueError, match=f"packed B must be a numpy array of float32, got {named}; pack it"):
            ops.matmul(a, b, packed=bad)
    with pytest.raises(ValueError, match=rf"packed B must have shape \({panels.shape[0]}, {panels.shape[1]}\)"):
        ops.matmul(a, b, packed=panels[:, :8].copy())
    # f16 operands multiply by f32 panels (pack_b's for them), and mixed operands by the f32 plan's
    a16, b16 = a.astype(np.float16), b.astype(np.float16)
    same(ops.matmul(a16, b16, packed=gemm.plan(a.shape, b.shape, td.f16, "cpu").pack_b(b16)), exact(a16, b16),
         **TOL[np.dtype(np.float16)])
    same(ops.matmul(a16, b, packed=panels), exact(a16, b), rtol=1e-5, atol=1e-5)


def test_shape_errors_name_the_shapes_given():
    """An inner-dimension mismatch with a 1-D operand named the promoted shapes, "(..., 1, 3) @ (..., 4, 1)"; now
    the shapes as given. Batch dims that do not broadcast, 0-d operands (numpy's ValueError too) and
    batch_matmul without a batch dim are ValueErrors."""
    cases = [((3,), (4,)), ((2, 3), (4,)), ((3,), (4, 5)), ((2, 5, 3), (4, 6))]
    for sa, sb in cases:
        with pytest.raises(ValueError, match=re.escape(f"inner dimensions differ: {sa} @ {sb}; a's last dimension")):
            ops.matmul(put(rand(sa, 0)), put(rand(sb, 1)))
    with pytest.raises(ValueError, match=r"batch dimensions \(2,\) and \(3,\) do not broadcast"):
        ops.matmul(put(rand((2, 4, 5), 0)), put(rand((3, 5, 6), 1)))
    for sa, sb in (((), (3, 4)), ((3, 4), ())):
        with pytest.raises(ValueError, match="at least one dimension"):
            ops.matmul(put(rand(sa, 0)), put(rand(sb, 1)))
    with pytest.raises(ValueError, match="batch_matmul needs a batch dimension"):
        ops.batch_matmul(put(rand((2, 3), 0)), put(rand((3,), 1)))


def test_linear_takes_weights_in_pytorch_layout_and_says_so():
    """linear's weight is (out_features, in_features): a (K, N) weight was refused without saying which layout
    it wants; now the error says, and how to multiply by one."""
    x, w = rand((4, 13), 0), rand((13, 5), 1)
    with pytest.raises(ValueError, match=r"weight is \(out_features, in_features\) as in PyTorch.*matmul\(x, weight\)"):
        ops.linear(put(x), put(w))
    with pytest.raises(ValueError, match=r"linear needs x \(..., K\) and weight \(N, K\), got \(4, 13\) and \(13,\)$"):
        ops.linear(put(x), put(w[:, 0]))
    for bias in (rand((4,), 2), rand((1, 5), 2), np.float32(1.0)):
        with pytest.raises(ValueError, match=r"linear: bias must have shape \(5,\)"):
            ops.linear(put(x), put(w.T.copy()), put(np.asarray(bias)))


# ---------------------------------------------------------------- edge cases that were right (kept right)
LAYOUTS = {     # arrays with a's values in other memory layouts
    "contiguous": lambda a: a,
    "transposed": lambda a: np.ascontiguousarray(a.T).T,
    "stepped": lambda a: np.repeat(a, 2, axis=-1)[..., ::2],
    "reversed": lambda a: np.flip(np.flip(a).copy()),
    "fortran": np.asfortranarray,
    "read-only": lambda a: np.lib.stride_tricks.as_strided(a, writeable=False),
}
DIM = st.sampled_from([0, 1, 2, 3, 7, 13, 31, 37, 61])
BATCHES = st.sampled_from([((), ()), ((3,), ()), ((), (2,)), ((2, 1), (4,)), ((1,), (0,)), ((2, 3), (2, 1)),
                           ((0, 1), (1,))])


@FEW
@given(m=DIM, n=DIM, k=DIM, batches=BATCHES, ranks=st.sampled_from([(2, 2), (1, 2), (2, 1), (1, 1)]),
       layouts=st.tuples(st.sampled_from(list(LAYOUTS)), st.sampled_from(list(LAYOUTS))),
       f16=st.sampled_from([(False, False), (True, True), (True, False)]), seed=SEEDS)
def test_matmul_is_numpys(m, n, k, batches, ranks, layouts, f16, seed):
    """Shapes of sizes 0, 1 and primes, 1-D operands on either side, broadcast batch dims, f32 / f16 / mixed, each
    operand in another memory layout: numpy's result, with the inputs unchanged and not aliased."""
    shape_a = batches[0] + (m, k) if ranks[0] == 2 else (k,)
    shape_b = batches[1] + (k, n) if ranks[1] == 2 else (k,)
    a = rand(shape_a, seed).astype(np.float16 if f16[0] else np.float32)
    b = rand(shape_b, seed + 1).astype(np.float16 if f16[1] else np.float32)
    args = [LAYOUTS[name](x) for name, x in zip(layouts, (a, b))]
    saved = [x.copy() for x in args]
    want = exact(a, b)
    got = ops.matmul(*map(put, args))
    same(got, want, **TOL[want.dtype])
    for x, before in zip(args, saved):
        np.testing.assert_array_equal(x, before)
        assert not isinstance(got, np.ndarray) or not np.shares_memory(got, x)


def test_batch_broadcasting_and_promotion_examples():
    """(2,1,5,3) @ (4,3,6); 1-D operands against 4-D ones; a vector dot product is 0-d; batch_matmul with one
    batched side; empty batches and K = 0 (zeros) with f16."""
    cases = [((2, 1, 5, 3), (4, 3, 6)), ((5,), (2, 3, 5, 6)), ((2, 3, 5, 6), (6,)), ((13,), (13,)),
             ((0, 1, 3, 4), (2, 4, 5)), ((2, 3, 0), (0, 5)), ((0,), (0,))]
    for i, (sa, sb) in enumerate(cases):
        a, b = rand(sa, i), rand(sb, i + 10)
        same(ops.matmul(put(a), put(b)), exact(a, b), rtol=1e-5, atol=1e-5)
    a, b = rand((3, 7, 13), 1), rand((13, 5), 2)
    same(ops.batch_matmul(put(a), put(b)), exact(a, b), rtol=1e-5, atol=1e-5)
    same(ops.batch_matmul(put(b[:, 0]), put(a.transpose(0, 2, 1).copy())), exact(b[:, 0], a.transpose(0, 2, 1)),
         rtol=1e-5, atol=1e-5)
    z = np.zeros((3, 0), np.float16)
    same(ops.matmul(put(z), put(np.zeros((0, 4), np.float16))), np.zeros((3, 4), np.float16))


def test_refused_types_say_what_to_do():
    """numpy multiplies f64, integers and bools; matmul is documented for f32, f16, bf16, the two 8-bit floats and
    8-bit integers and refuses the others with a TypeError naming the operand's type (not the pair's promotion) and
    the conversion."""
    b = rand((3, 4), 1)
    for bad in (rand((2, 3), 0, np.float64), rand((2, 3), 0, np.int32), rand((2, 3), 0, np.int64),
                rand((2, 3), 0) > 0):
        for a_, b_ in ((bad, b), (b.T.copy(), bad.T.copy())):
            with pytest.raises(TypeError, match=r"supports float32, float16, bfloat16, float8_e4m3fn, float8_e5m2, "
                                                rf"int8 and uint8 operands, got {bad.dtype}; "
                                                r"convert with np\.asarray\(x, np\.float32\), or stdlib_ops\.cast\(x, "
                                                r"np\.float32\) for a td\.DeviceArray"):
                ops.matmul(put(a_), put(b_))
        with pytest.raises(TypeError, match=f"got {bad.dtype}"):
            ops.linear(put(bad), put(rand((4, 3), 2)))
    # Python lists are float64 arrays to numpy: the advice works for them too (a list has no .astype, which it gave)
    lists = ([[1.0, 2.0, 3.0]], b.tolist())
    with pytest.raises(TypeError, match=r"got float64; convert with np\.asarray\(x, np\.float32\)"):
        ops.matmul(*lists)
    same(ops.matmul(*(put(np.asarray(x, np.float32)) for x in lists)), exact(np.float32([[1, 2, 3]]), b), rtol=1e-6,
         atol=1e-6)


def test_bfloat16_products():
    """bf16 operands (ml_dtypes.bfloat16 arrays) were refused although the templates take them: they multiply in
    f32 and round once to bf16 (numpy with ml_dtypes gives f32); bf16 with f16 or f32 computes in f32 (numpy
    cannot promote bf16 with f16). Broadcast batches, linear with a bias, and on the cpu B's packed panels."""
    bf16 = ml_dtypes.bfloat16
    a, b = rand((2, 7, 13), 0).astype(bf16), rand((13, 5), 1).astype(bf16)
    want = exact(a.astype(np.float32), b.astype(np.float32))
    same(ops.matmul(put(a), put(b)), want.astype(bf16), rtol=1e-2, atol=1e-2)
    for other in (np.float16, np.float32):
        same(ops.matmul(put(a), put(b.astype(other))), exact(a.astype(np.float32), b.astype(other)),
             rtol=1e-5, atol=1e-5)
    x, w, bias = rand((3, 13), 2).astype(bf16), rand((4, 13), 3).astype(bf16), rand((4,), 4).astype(bf16)
    want = exact(x.astype(np.float32), w.T.astype(np.float32)) + bias.astype(np.float32)
    same(ops.linear(put(x), put(w), put(bias)), want.astype(bf16), rtol=2e-2, atol=2e-2)
    if td.get_target() == "cpu":
        panels = gemm.plan((2, 7, 13), (13, 5), td.bf16, "cpu").pack_b(b)
        same(ops.matmul(a, b, packed=panels), exact(a.astype(np.float32), b.astype(np.float32)).astype(bf16),
             rtol=1e-2, atol=1e-2)


def test_nan_and_infinity_propagate_as_numpys():
    """NaN and inf anywhere, inf * 0 and inf - inf (NaN), at the last row and column of tiles and past them (the
    kernels' padding must not turn an inf of a valid row into NaN); f16 sums past 65504 are inf."""
    a, b = rand((37, 61), 0), rand((61, 31), 1)
    a[0, 3], a[5, 60], a[36, 60], a[17, 0] = np.nan, np.inf, -np.inf, np.inf
    b[3, 30], b[60, 0], b[0, 7] = np.inf, np.inf, 0.0
    b[:, 9] = 0.0           # inf * 0 in row 17 and 5 / 36 of column 9
    for x, y in ((a, b), (a[:, :1], b[:1]), (a[-1:], b)):
        same(ops.matmul(put(x), put(y)), exact(x, y), rtol=1e-4, atol=1e-4)
    h = np.full((2, 4), 200, np.float16)
    same(ops.matmul(put(h), put(h.T.copy())), np.full((2, 2), np.inf, np.float16))


@pytest.fixture
def many_workers(monkeypatch, twin_target):
    """The cpu plans split k as on a machine of 8 threads (the simulated GPU splits on its 4 SMs anyway)."""
    if twin_target == "cpu":
        monkeypatch.setattr(gemm, "num_threads", lambda: 8)
    gemm._plan.cache_clear()        # plans are cached without the thread count: none made with 8 outlives the test
    yield
    gemm._plan.cache_clear()


def test_long_k_sums_in_f32_split_or_not(many_workers):
    """K = 8191 of f16 values about 0.5: an f16 running sum would stall near 1024 (its ulp 1 there); sums in f32
    round once. Split-k (a few z-slices of partial sums) with a broadcast batch, NaN and inf in some rows; 131
    rows, past those of the cpu's kernel for small matrices (`matmul_small`), which never splits."""
    a = rand((131, 8191), 2, low=0.25, high=0.75).astype(np.float16)
    b = rand((2, 8191, 5), 3, low=0.25, high=0.75).astype(np.float16)
    a[1, 100], b[1, 8190, 4] = np.inf, np.nan
    assert gemm.plan(a.shape, b.shape, td.f16, td.get_target()).split > 1
    same(ops.matmul(put(a), put(b)), exact(a, b), rtol=2e-3)
    a32, b32 = a.astype(np.float32), b.astype(np.float32)
    same(ops.matmul(put(a32), put(b32)), exact(a32, b32), rtol=1e-5)


def test_linear_against_numpy():
    """y = x @ weight.T + bias with weight (out, in): with and without bias, batch dims in x (bias broadcast
    over them), a 1-D x, K = 0 (the bias alone), no rows, f16."""
    w, bias = rand((5, 13), 1), rand((5,), 2)
    for shape in ((4, 13), (2, 3, 13), (13,), (0, 13)):
        x = rand(shape, 0)
        same(ops.linear(put(x), put(w)), exact(x, w.T), rtol=1e-5, atol=1e-5)
        same(ops.linear(put(x), put(w), put(bias)), exact(x, w.T) + bias, rtol=1e-5, atol=1e-5)
    same(ops.linear(put(rand((3, 0), 0)), put(rand((5, 0), 1)), put(bias)), np.broadcast_to(bias, (3, 5)))
    x16, w16, b16 = rand((2, 3, 13), 0, np.float16), w.astype(np.float16), bias.astype(np.float16)
    same(ops.linear(put(x16), put(w16), put(b16)), (exact(x16, w16.T) + b16).astype(np.float16), rtol=3e-3, atol=3e-3)


def test_tune_on_the_cpu_for_a_tiny_product(tmp_path, monkeypatch):
    """tune=True on the cpu (opt-in there) times the space and runs the winner: here a one-point space, so it
    compiles nothing the other tests did not."""
    _cpu_only("on a GPU tuning is the default; the GPU tests run at the default schedules")
    monkeypatch.setenv("TASKDSL_CACHE_DIR", str(tmp_path))
    point = gemm.CPU_TILE.default("cpu", 4, 3, 5)
    small = Space("tile_matmul_cpu_audit", {name: (value,) for name, value in point.values})
    monkeypatch.setattr(gemm, "CPU_TILE", dataclasses.replace(gemm.CPU_TILE, space=lambda target, itemsize: small))
    gemm._plan.cache_clear()
    try:
        a, b = rand((3, 7), 0), rand((7, 5), 1)
        same(ops.matmul(a, b, tune=True), exact(a, b), rtol=1e-5, atol=1e-5)
        same(ops.linear(a, b.T.copy(), tune=True), exact(a, b), rtol=1e-5, atol=1e-5)
        assert list((tmp_path / "tune").iterdir())        # a winner was stored
    finally:
        gemm._plan.cache_clear()
