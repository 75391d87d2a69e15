"""stdlib_ops.matmul / batch_matmul / linear on 8-bit operands: E4M3 / E5M2 into an f32 product, s8 / u8 into an
exact i32 one (the two operands may differ within their kind).

On the cuda target the 8-bit tensor-core kernel runs them (B transposed by a call, K padded where large and
unaligned, split-k for floats); here on a simulated GPU whose launches run their CUDA C++ on the host, and as @gpu
tests on a GPU. On the cpu the 8-bit floats' f32 values multiply (the same exact products, summed in f32), and the
integers on the same f32 kernels, exactly: k blocks of at most `gemm.exact_k` products, added up in i32. The
oracle is numpy: in f64 for floats (the products of 8-bit floats are exact, so the only error is the f32 sums'),
in int64 for integers (exact).
"""
import ml_dtypes
import numpy as np
import pytest
from hypothesis import HealthCheck, example, given, settings, strategies as st

import stdlib_ops
import taskdsl as td
from stdlib_ops import gemm

from ..cuda_on_host import unsupported

E4M3, E5M2 = ml_dtypes.float8_e4m3fn, ml_dtypes.float8_e5m2
PAIRS = [(E4M3, E4M3), (E5M2, E5M2), (E4M3, E5M2), (np.int8, np.int8), (np.uint8, np.uint8), (np.uint8, np.int8)]
FEW = settings(max_examples=8, deadline=None,     # the target fixture holds across the examples
               suppress_health_check=[HealthCheck.function_scoped_fixture])


def operand(rng, shape, dtype) -> np.ndarray:
    """Integers over their whole range; 8-bit floats normal, scaled by 4."""
    if np.dtype(dtype).kind in "iu":
        info = np.iinfo(dtype)
        return rng.integers(info.min, info.max + 1, shape).astype(dtype)
    return (rng.standard_normal(shape) * 4).astype(dtype)


def assert_product(c, a, b):
    """`c` is a @ b (numpy's rules): exactly, in i32, for integers; for 8-bit floats `assert_f32_product`."""
    if a.dtype.kind not in "iu":
        return assert_f32_product(c, a, b)
    assert c.dtype == np.int32
    np.testing.assert_array_equal(c, np.matmul(a.astype(np.int64), b.astype(np.int64)))


def assert_f32_product(c, a, b):
    """`c` is a @ b (numpy's rules) up to f32 sums' rounding: |error| <= (K + 2) 2^-24 sum |a||b|."""
    wide = lambda x: x.astype(np.float64)
    want, scale = wide(a) @ wide(b), np.abs(wide(a)) @ np.abs(wide(b))
    assert c.dtype == np.float32 and c.shape == want.shape
    k = a.shape[-1]
    assert np.all(np.abs(c - want) <= (k + 2) * 2.0**-24 * scale), np.abs(c - want).max()


@pytest.fixture(params=["cpu", "simulated cuda"])
def target(request, monkeypatch):
    """The cpu target, or the cuda target on a simulated GPU running the kernels' CUDA source on the host."""
    if request.param == "cpu":
        yield "cpu"
        return
    from ..cuda_on_host import host_compiler
    from ..simulated_gpu import install
    if host_compiler() is None:
        pytest.skip("no host C++ compiler to run CUDA sources on the host")
    install(monkeypatch, cuda_source=True)
    td.set_target("cuda")
    yield "cuda"
    td.set_target("cpu")


@FEW
@given(m=st.sampled_from([0, 1, 5, 33]), k=st.sampled_from([0, 1, 16, 37, 96]), n=st.sampled_from([1, 8, 23]),
       types=st.sampled_from(PAIRS), seed=st.integers(0, 2**16))
@example(m=33, k=37, n=23, types=(E4M3, E4M3), seed=0)
@example(m=33, k=96, n=23, types=(np.uint8, np.int8), seed=0)
def test_matmul_of_8_bit_operands(target, m, k, n, types, seed):
    rng = np.random.default_rng(seed)
    a, b = operand(rng, (m, k), types[0]), operand(rng, (k, n), types[1])
    assert_product(stdlib_ops.matmul(a, b), a, b)


@pytest.mark.parametrize("dtype", [E5M2, np.int8])
def test_batched_and_one_dimensional_operands(target, dtype):
    rng = np.random.default_rng(2)
    a, b = operand(rng, (2, 3, 20, 32), dtype), operand(rng, (3, 32, 9), dtype)
    assert_product(stdlib_ops.batch_matmul(a, b), a, b)
    v = operand(rng, (32,), dtype)
    assert_product(stdlib_ops.matmul(a, v), a, v)
    assert_product(stdlib_ops.matmul(v, b), v, b)


@pytest.mark.parametrize("types", [(E4M3, E4M3), (np.uint8, np.int8)])
def test_linear_of_8_bit_operands(target, types):
    rng = np.random.default_rng(3)
    x, w = operand(rng, (4, 7, 48), types[0]), operand(rng, (24, 48), types[1])
    assert_product(stdlib_ops.linear(x, w), x, w.T)
    if x.dtype.kind not in "iu":      # a bias adds in the product's type (ml_dtypes' floats are of kind "V")
        bias = rng.standard_normal(24).astype(np.float32)
        want = x.astype(np.float64) @ w.astype(np.float64).T
        np.testing.assert_allclose(stdlib_ops.linear(x, w, bias) - bias, want, rtol=1e-5,
                                   atol=1e-5 * np.abs(want).max())
    else:                        # an integer bias adds exactly; a float one is refused, not truncated
        bias = rng.integers(-2**20, 2**20, 24).astype(np.int32)
        assert_product(stdlib_ops.linear(x, w, bias) - bias, x, w.T)
        with pytest.raises(TypeError, match="linear: the bias of an integer result must be integers"):
            stdlib_ops.linear(x, w, bias + 0.5)
        for wide in (bias.astype(np.int64) + 2**40, np.full(24, 2**32 - 1, np.uint32)):    # (wrapped, silently)
            with pytest.raises(ValueError, match=r"linear: the bias holds values outside the result's type int32"):
                stdlib_ops.linear(x, w, wide)


INTEGER_PAIRS = [(np.int8, np.int8), (np.uint8, np.int8), (np.uint8, np.uint8)]


def large_terms(rng, shape, dtype) -> np.ndarray:
    """Integers of the top quarter of `dtype`'s magnitudes, one sign: long sums of their products pass 2^24."""
    return (rng.integers(193, 256, shape) if dtype == np.uint8 else rng.integers(-128, -96, shape)).astype(dtype)


@pytest.mark.parametrize("types", INTEGER_PAIRS)
def test_exact_k_is_the_longest_exact_f32_sum(types):
    """`exact_k` products of the largest magnitude sum to at most 2^24 (every partial sum an f32 integer), one more
    past it."""
    largest = [max(abs(np.iinfo(t).min), np.iinfo(t).max) for t in types]
    k = gemm.exact_k(*map(gemm.tdtype, types))
    assert k * largest[0] * largest[1] <= 2**24 < (k + 1) * largest[0] * largest[1]


@settings(max_examples=12, deadline=None)
@given(m=st.sampled_from([1, 2, 3, 5, 40, 130]), k=st.sampled_from([1500, 2100, 2600]),
       n=st.sampled_from([1, 7, 70]), types=st.sampled_from(INTEGER_PAIRS), packed=st.booleans(),
       seed=st.integers(0, 2**16))
@example(m=2, k=2100, n=70, types=(np.uint8, np.int8), packed=True, seed=0)      # the packed rows kernel
@example(m=5, k=2100, n=7, types=(np.uint8, np.uint8), packed=False, seed=0)     # the small kernel, split
@example(m=130, k=1500, n=70, types=(np.int8, np.int8), packed=False, seed=0)    # the register-tile kernel
def test_long_integer_products_are_exact_on_the_cpu(m, k, n, types, packed, seed):
    """Sums past 2^24 of large terms, odd ones among several (no f32 holds those: a sum that went through f32 fails),
    exact in i32 by every cpu kernel: small (split so each z-slice sums `exact_k` products at most, the slices added
    in i32), register-tile, and with B packed once, the rows kernel of few rows."""
    rng = np.random.default_rng(seed)
    a, b = large_terms(rng, (m, k), types[0]), large_terms(rng, (k, n), types[1])
    want = a.astype(np.int64) @ b.astype(np.int64)
    assert np.abs(want).min() > 2**24 and (want.size < 8 or np.any(want % 2))
    if packed:
        p = gemm.plan(a.shape, b.shape, gemm.tdtype(a.dtype), "cpu", b_dtype=gemm.tdtype(b.dtype))
        got = stdlib_ops.matmul(a, b, packed=p.pack_b(b))
    else:
        got = stdlib_ops.matmul(a, b)
    np.testing.assert_array_equal(got, want)
    assert_product(stdlib_ops.linear(a, np.ascontiguousarray(b.T)), a, b)


@pytest.mark.parametrize("dot4_products", [False], indirect=True)
def test_integer_plans_on_the_cpu(dot4_products):
    """On a cpu without byte dot products (`matmul_dot4`), the register-tile space for u8 by u8 has no k block past
    its 258 exact products (a point with one is refused); s8 by s8 keeps 512; a small product of a long k is split
    into z-slices of 258 products at most. (A float point its space's check rejects is refused as well.)"""
    u8_space = gemm.cpu.space(1, k_block_at_most=gemm.exact_k(td.u8, td.u8))
    assert {p.bk for p in u8_space.points()} == {128, 256}
    assert "k block above the 258 products" in "".join(u8_space.pruned())
    wide = gemm.cpu.default_point(1).replace(bk=512)
    with pytest.raises(ValueError, match="cannot run this u8 matmul: k block above the 258 products"):
        gemm.plan((8, 600), (600, 8), td.u8, "cpu", point=wide)
    assert gemm.plan((8, 600), (600, 8), td.i8, "cpu", point=wide).point.bk == 512
    ragged = gemm.cpu.default_point(4).replace(micro=(6, 32), block=(16, 64))      # (a float one crashed the process)
    with pytest.raises(ValueError, match="cannot run this f32 matmul: block tile not a multiple of the micro-tile"):
        gemm.plan((37, 127), (127, 61), td.f32, "cpu", point=ragged)
    small = gemm.plan((5, 3000), (3000, 7), td.u8, "cpu")
    assert small.small and small.split == 12 and small.out_dtype == td.i32


@pytest.mark.parametrize("dtype", [E4M3, E5M2, ml_dtypes.bfloat16])
def test_large_operands_widen_by_the_cast_kernel(dtype):
    """On the cpu a large operand of ml_dtypes' types widens by the `cast` kernel, not ml_dtypes' elementwise
    conversion: the same f32 values, every bit pattern of the 8-bit types (NaNs as NaNs)."""
    from stdlib_ops.elementwise import ML_DTYPES_CAST_FROM, converted
    rng = np.random.default_rng(7)
    bits = rng.integers(0, 2**16, ML_DTYPES_CAST_FROM + 3).astype(np.uint16)
    x = (bits.astype(np.uint8) if np.dtype(dtype).itemsize == 1 else bits).view(dtype)
    got, want = converted(x, np.dtype(np.float32)), x.astype(np.float32)
    np.testing.assert_array_equal(np.isnan(got), np.isnan(want))
    np.testing.assert_array_equal(got[~np.isnan(want)], want[~np.isnan(want)])
    if np.dtype(dtype).itemsize == 1:
        a, b = operand(rng, (160, 128), dtype), operand(rng, (128, 130), dtype)
        assert_f32_product(stdlib_ops.matmul(a, b), a, b)


def test_the_cuda_plan_runs_tensor_cores_on_b_transposed(simulated_gpu):
    """On a GPU an E4M3 product plans the 8-bit tensor-core kernel: B (K, N) is copied to (N, K), the kernel's
    operand; a large product of unaligned K pads K to a multiple of 16 (16-byte copies); a few output tiles split
    K, the f32 partials summed by the split-k kernel."""
    rng = np.random.default_rng(4)
    aligned = gemm.plan((64, 96), (96, 40), td.f8e4m3, "cuda", False)
    assert aligned.template is gemm.TENSOR_CORE and aligned.k_major_b and aligned.vec == 16
    assert aligned.operand_shapes()[1] == (1, 40, 96) and aligned.out_dtype == td.f32
    source = aligned.kernel().source(*aligned.examples(), target="cuda")
    assert "mma.sync.aligned.m16n8k32.row.col.f32.e4m3.e4m3.f32" in source
    unaligned = gemm.plan((1024, 1030), (1030, 1024), td.f8e4m3, "cuda", False)
    assert unaligned.pads and unaligned.operand_shapes(padded=True)[:2] == ((1, 1024, 1040), (1, 1024, 1040))
    split = gemm.plan((16, 4096), (4096, 64), td.f8e5m2, "cuda", False)
    assert split.split > 1
    a, b = operand(rng, (16, 4096), E5M2), operand(rng, (4096, 64), E5M2)
    assert_f32_product(stdlib_ops.matmul(a, b), a, b)
    launched = [kernel.name for kernel, _ in simulated_gpu.launches]
    assert launched[-1] == "split_k_sum_f32" and launched[-2].startswith("tc_matmul_"), launched
    assert unsupported(source) is None          # the launches ran the CUDA source on the host
    with pytest.raises(ValueError, match="f8e4m3 operands run on tensor cores .* on the cpu, stdlib_ops.matmul "
                                         "multiplies them"):
        gemm.plan((4, 4), (4, 4), td.f8e4m3, "cpu", False)


def test_integer_and_mixed_plans(simulated_gpu):
    """s8 by u8 plans the integer kernel (`.s32.s8.u8.s32`), B's type beside A's; integer products are never split
    (a few output tiles of a long K split a float product); two types that do not mix in one instruction are
    refused."""
    mixed = gemm.plan((16, 4096), (4096, 64), td.i8, "cuda", False, b_dtype=td.u8)
    assert mixed.split == 1 and mixed.out_dtype == td.i32 and mixed.b_type == td.u8
    assert "mma.sync.aligned.m16n8k32.row.col.s32.s8.u8.s32" in mixed.kernel().source(*mixed.examples(),
                                                                                         target="cuda")
    assert gemm.plan((16, 4096), (4096, 64), td.f8e4m3, "cuda", False, b_dtype=td.f8e5m2).split > 1
    rng = np.random.default_rng(8)
    a, b = operand(rng, (16, 4096), np.int8), operand(rng, (4096, 64), np.uint8)
    assert_product(stdlib_ops.matmul(a, b), a, b)
    with pytest.raises(TypeError, match="only 8-bit operands of one kind .* mix"):
        gemm.plan((4, 4), (4, 4), td.i8, "cuda", False, b_dtype=td.f8e4m3)


def test_linear_passes_its_weight_as_the_kernels_b(simulated_gpu):
    """linear's weight (N, K) is the k-major B the 8-bit kernel takes: no transposes on the way."""
    rng = np.random.default_rng(6)
    x, w = operand(rng, (2, 9, 64), E4M3), operand(rng, (40, 64), E4M3)
    y = stdlib_ops.linear(td.to_device(x), td.to_device(w))
    assert [kernel.name.startswith("tc_matmul_") for kernel, _ in simulated_gpu.launches] == [True]
    np.testing.assert_allclose(y.numpy(), x.astype(np.float64) @ w.astype(np.float64).T, rtol=1e-5, atol=1e-4)
    with pytest.raises(ValueError, match="b_k_major: this plan's kernel takes B"):
        gemm.plan((4, 8), (8, 4), td.f16, "cuda", False)(np.zeros((1, 4, 8), np.float16),
                                                          np.zeros((1, 4, 8), np.float16), b_k_major=True)


@pytest.mark.parametrize("a_type, b_type, numpy_types, out", [(td.f8e4m3, None, (E4M3, E4M3), td.f32),
                                                              (td.u8, td.i8, (np.uint8, np.int8), td.i32)])
def test_the_tuner_times_the_8_bit_kernels_on_b_transposed(simulated_gpu, monkeypatch, a_type, b_type, numpy_types,
                                                           out):
    """Tuning an 8-bit product on a GPU: the 8-bit space, operands as the kernels take them (B k-major, of its own
    type; normal values, not random bits), outputs checked in the accumulators' type; and each candidate computes
    the product (here, three of them run)."""
    seen = {}

    def tune(space, build, args, *, outputs, default, dtypes, **options):
        seen.update(space=space, args=args, outputs=outputs, dtypes=dtypes)
        for point in space.points()[:: len(space.points()) // 2]:
            args[2][:] = -1     # an element left unwritten shows
            build(point)(*args)
            assert_product(args[2][0], args[0][0].view(numpy_types[0]), args[1][0].view(numpy_types[1]).T)
        return default
    monkeypatch.setattr(gemm, "tune", tune)
    monkeypatch.setattr(gemm, "_plan", gemm._plan.__wrapped__)
    gemm.plan((24, 64), (64, 40), a_type, "cuda", do_tune=True, b_dtype=b_type)
    assert seen["space"].name == "tc_matmul_8bit" and seen["outputs"] == {2: out}
    assert seen["dtypes"] == (a_type.name,) + ((b_type.name,) if b_type else ())    # the tuning records' key
    a, bt, c = seen["args"][:3]
    assert a.shape == (1, 24, 64) and bt.shape == (1, 40, 64) and c.dtype == out.numpy
    values = bt.view(numpy_types[1]).astype(np.float64)
    assert np.isfinite(values).all() and 0.5 < values.std() < 2        # normal values, not random bits


def test_tuning_an_integer_product_on_the_cpu_times_exact_kernels(monkeypatch, dot4_products):
    """Tuning a u8 by u8 product on the cpu: the dot4 template's space where the host has byte dot products, else
    the register-tile space of k blocks of at most 258 products; outputs checked in i32, and each candidate exact
    on sums past 2^24 (here, three of them run)."""
    seen = {}

    def tune(space, build, args, *, outputs, default, **options):
        seen.update(space=space, outputs=outputs)
        rng = np.random.default_rng(4)
        a, b = large_terms(rng, args[0].shape, np.uint8), large_terms(rng, args[1].shape, np.uint8)
        for point in space.points()[:: len(space.points()) // 2]:
            c = np.full(args[2].shape, -1, np.int32)
            build(point)(a, b, c, *args[3:])
            np.testing.assert_array_equal(c[0], a[0].astype(np.int64) @ b[0].astype(np.int64))
        return default
    monkeypatch.setattr(gemm, "tune", tune)
    monkeypatch.setattr(gemm, "_plan", gemm._plan.__wrapped__)
    gemm.plan((40, 1100), (1100, 24), td.u8, "cpu", do_tune=True)
    assert seen["outputs"] == {2: td.i32}
    if dot4_products:
        assert seen["space"].name == "dot4_matmul"
    else:
        assert {p.bk for p in seen["space"].points()} == {128, 256}


def test_device_arrays_stay_on_the_device(simulated_gpu):
    """td.DeviceArrays in, a td.DeviceArray out: B's transpose made on the device."""
    rng = np.random.default_rng(5)
    a, b = operand(rng, (24, 64), E4M3), operand(rng, (64, 40), E4M3)
    c = stdlib_ops.matmul(td.to_device(a), td.to_device(b))
    assert isinstance(c, td.DeviceArray)
    assert_f32_product(c.numpy(), a, b)


@pytest.mark.gpu
@pytest.mark.parametrize("types", [(E4M3, E4M3), (E4M3, E5M2), (np.uint8, np.int8)])
def test_8_bit_matmul_on_gpu(types):
    td.set_target("cuda")
    rng = np.random.default_rng(0)
    for size in (256, 2039):
        a, b = operand(rng, (size, size), types[0]), operand(rng, (size, size), types[1])
        assert_product(stdlib_ops.matmul(a, b), a, b)
        assert_product(stdlib_ops.matmul(a[:1], b), a[:1], b)
