"""stdlib_ops.conv2d on 8-bit operands: E4M3 / E5M2 into an f32 output, s8 / u8 into an exact i32 one (the input
and the weights may differ within their kind).

On the cuda target the 8-bit tensor-core template runs them with the implicit im2col in its loads of A and the
weights as its k-major B (OIHW as they are, for NCHW), a grouped convolution of tiny reductions (`uses_direct`)
as a reduce; here on a simulated GPU whose launches run their CUDA C++ on the host, and as @gpu tests on a GPU.
On the cpu the 8-bit floats' f32 values convolve, and the integers on the float convolutions' GEMMs, whose k blocks
sum them exactly in f32, the blocks' sums added in i32. The oracle is test_conv's f64 reference: exact for the
integers, and for the floats up to the f32 sums' rounding.
"""
import ml_dtypes
import numpy as np
import pytest
from hypothesis import example, given, strategies as st

import stdlib_ops as ops
import taskdsl as td
from stdlib_ops import conv, conv_direct, gemm
from stdlib_ops.conv_geometry import geometry

from .test_conv import reference
from .test_matmul_8bit import FEW, PAIRS, large_terms, operand, target  # noqa: F401 (target: the fixture)

E4M3 = ml_dtypes.float8_e4m3fn
GEOMETRIES = [   # n, c, h, w, oc, (kh, kw), stride, padding (t, l, b, r), dilation, groups
    (2, 8, 9, 7, 12, (3, 3), (1, 1), (1, 1, 1, 1), (1, 1), 1),
    (1, 6, 11, 13, 4, (3, 2), (2, 1), (0, 1, 2, 0), (2, 1), 2),
    (1, 16, 5, 6, 16, (1, 1), (1, 1), (0, 0, 0, 0), (1, 1), 1),     # pointwise: NHWC's input is the GEMM's A
    (1, 4, 8, 8, 4, (3, 3), (1, 1), (1, 1, 1, 1), (1, 1), 4),       # depthwise: a GPU's reduce, the cpu's rows
    (1, 3, 13, 11, 5, (7, 7), (2, 2), (3, 3, 3, 3), (1, 1), 1),     # a stem: K = 147, no multiple of 16
    (1, 32, 4, 4, 8, (3, 3), (1, 1), (1, 1, 1, 1), (1, 1), 1),      # K = 288: whole 16-element copies of B
]


def assert_convolution(y, x, w, bias=None, activation=None, **options):
    """`y` is the NCHW convolution of x by w (`reference`) plus the bias, then the activation: exactly, in i32,
    for integers; for 8-bit floats up to f32 sums' rounding, (K + 2) 2^-24 times the sum of |x||w| and |bias|."""
    want = reference(x, w, bias, **options)
    if activation == "relu":
        want = np.maximum(want, 0)
    if x.dtype.kind in "iu":
        assert y.dtype == np.int32
        np.testing.assert_array_equal(y, want.astype(np.int64))
        return
    scale = reference(np.abs(x.astype(np.float64)), np.abs(w.astype(np.float64)),
                      None if bias is None else np.abs(bias), **options)
    k = w[0].size
    assert y.dtype == np.float32 and y.shape == want.shape
    assert np.all(np.abs(y - want) <= (k + 2) * 2.0**-24 * scale + 1e-6), np.abs(y - want).max()


def _options(stride, padding, dilation, groups) -> dict:
    return dict(stride=stride, padding=padding, dilation=dilation, groups=groups)


@FEW
@given(case=st.sampled_from(GEOMETRIES), layout=st.sampled_from(["NCHW", "NHWC"]), types=st.sampled_from(PAIRS),
       fused=st.booleans(), seed=st.integers(0, 2**16))
@example(case=GEOMETRIES[4], layout="NHWC", types=(np.uint8, np.int8), fused=True, seed=0)
@example(case=GEOMETRIES[1], layout="NCHW", types=(E4M3, ml_dtypes.float8_e5m2), fused=False, seed=0)
@example(case=GEOMETRIES[5], layout="NHWC", types=(np.int8, np.uint8), fused=False, seed=0)   # runs of 8 channels
def test_convolutions_of_8_bit_operands(target, case, layout, types, fused, seed, dot4_products):
    """Every geometry kind, either layout, every operand pair; a bias in the output's type and relu fused; on the
    cpu, integers with and without byte dot products (NHWC's GEMMs on the dot4 template or the register-tile one)."""
    n, c, h, w, oc, (kh, kw), stride, padding, dilation, groups = case
    rng = np.random.default_rng(seed)
    x, wt = operand(rng, (n, c, h, w), types[0]), operand(rng, (oc, c // groups, kh, kw), types[1])
    out = np.int32 if x.dtype.kind in "iu" else np.float32
    bias = rng.integers(-5000, 5000, oc).astype(out) if fused else None
    activation = "relu" if fused else None
    xin = x if layout == "NCHW" else np.ascontiguousarray(x.transpose(0, 2, 3, 1))
    y = ops.conv2d(xin, wt, bias, stride, padding, dilation, groups, layout, activation)
    got = y if layout == "NCHW" else y.transpose(0, 3, 1, 2)
    assert_convolution(got, x, wt, bias, activation, **_options(stride, padding, dilation, groups))


def test_the_gpu_lowering_is_the_8_bit_tensor_core_gemm(simulated_gpu):
    """On a GPU: the 8-bit template with im2col in its loads (one kernel), the weights as its k-major B, which for
    NCHW are the OIHW weights as they are; a depthwise convolution is a reduce summing in i32."""
    g = geometry((1, 16, 6, 6), (8, 16, 3, 3), padding=1)
    low = conv.plan(g, td.i8, "cuda", False, None, td.u8).lowered
    assert low.matmul.template.name == "tc_matmul" and low.matmul.k_major_b and low.kernels == [low.kernel]
    assert dict(low.kernel.params)["B"].dtype == td.u8 and "X" in dict(low.kernel.params)
    w = np.arange(8 * 16 * 9, dtype=np.uint8).reshape(8, 16, 3, 3)
    np.testing.assert_array_equal(low.weight_operand(w), w.reshape(1, 8, 144))
    depthwise = conv.plan(geometry((1, 8, 8, 4), (4, 1, 3, 3), padding=1, groups=4, layout="NHWC"), td.i8,
                          "cuda", False, None)
    assert depthwise.direct is not None and depthwise.out_dtype == np.int32


def test_8_bit_gpu_convolutions_are_tuned_on_their_own_kernels(simulated_gpu, monkeypatch):
    """Tuning an 8-bit convolution on a GPU: the tensor-core space of 1-byte operands, keyed by both operands'
    types, candidates checked on the i32 output, each the convolution itself on its k-major weights."""
    seen = {}

    def record(space, build, args, **options):
        seen.update(space=space, build=build, args=args, **options)
        return options["default"]
    monkeypatch.setattr(conv, "tune", record)
    monkeypatch.setenv("TASKDSL_TUNE", "1")
    conv._plan.cache_clear()
    g = geometry((1, 16, 6, 6), (8, 16, 3, 3), padding=1)
    low = conv.plan(g, td.u8, "cuda", False, None, td.i8).lowered
    assert seen["op"] == "conv_tc_matmul" and seen["dtypes"] == ("u8", "i8") and seen["outputs"] == {2: td.i32}
    assert seen["space"].name == gemm.template_for(td.u8, "cuda").space("cuda", 1).name
    x_example, weight, out = seen["args"]
    assert (x_example.dtype, weight.shape, out.dtype) == (np.uint8, (1, 8, 144), np.int32)
    rng = np.random.default_rng(6)
    x, w = operand(rng, (1, 16, 6, 6), np.uint8), operand(rng, (8, 16, 3, 3), np.int8)
    candidate = seen["build"](low.matmul.point)
    y = td.to_device(np.zeros(g.out_shape, np.int32))
    candidate(td.to_device(x), td.to_device(candidate.lowered.weight_operand(w)), y)
    assert_convolution(y.numpy(), x, w, **_options((1, 1), (1, 1, 1, 1), (1, 1), 1))


@pytest.mark.parametrize("dot4_products", [False], indirect=True)
def test_the_cpu_lowering_is_the_float_gemm_summing_in_i32(dot4_products):
    """On the cpu an integer convolution takes a float one's GEMM (here NHWC's, reading its im2col in place), its
    k blocks no longer than `gemm.exact_k`, its output i32, its weights the template's f32 panels; a depthwise one
    the f32 direct kernels, x widened in their loads, the sums converted to i32 in their stores, the weights f32."""
    g = geometry((2, 6, 6, 8), (8, 4, 3, 3), padding=1, groups=2, layout="NHWC")
    low = conv.plan(g, td.u8, "cpu", True, "relu6", td.i8).lowered
    assert low.indirect and low.matmul.template is gemm.CPU_TILE and low.matmul.point.bk <= gemm.exact_k(td.u8, td.i8)
    assert dict(low.kernel.params)["A"].dtype == td.u8 and low.matmul.out_dtype == td.i32
    w = np.arange(8 * 4 * 9, dtype=np.int8).reshape(8, 4, 3, 3)
    panels = low.weight_operand(w)
    assert panels.dtype == np.float32 and np.array_equal(panels, low.matmul.pack_b(conv._weight_as_b(g, w)))
    depthwise = conv.plan(geometry((1, 4, 8, 8), (4, 1, 3, 3), padding=1, groups=4), td.u8, "cpu", False, None)
    assert isinstance(depthwise.lowered, conv_direct.DirectRows) and depthwise.out_dtype == np.int32
    assert dict(depthwise.lowered.kernel.params)["X"].dtype == td.u8
    assert depthwise.lowered.weight_operand(np.ones((4, 1, 3, 3), np.uint8)).dtype == np.float32


@pytest.mark.parametrize("layout", ["NHWC", "NCHW"])
@pytest.mark.parametrize("kernel, groups", [(1, 1), (3, 1), (3, 3)], ids=["pointwise", "indirect", "grouped"])
def test_nhwc_integer_convolutions_are_dot4_gemms_where_the_host_has_them(layout, kernel, groups, dot4_products):
    """NHWC's GEMMs read the input in place: a pointwise convolution's as A, the others' through an index table
    (`conv._lower_indirect`, batched over the groups); on byte dot products where the host has them (the dot4
    template, its int8 panels, a 64-column block for 33 channels), exact with a bias and relu fused. NCHW's read
    it transposed, which only the register-tile template does; a grouped one sums on its groups' phase planes
    (`conv_direct.grouped_plane_kernel`: 117 terms an output, exact in f32)."""
    c, oc, pad = 39, 33, (kernel - 1) // 2
    g = geometry((2, c, 9, 7) if layout == "NCHW" else (2, 9, 7, c), (oc, c // groups, kernel, kernel),
                 padding=pad, groups=groups, layout=layout)
    low = conv.plan(g, td.u8, "cpu", True, "relu", td.i8).lowered
    on_dot4 = dot4_products and layout == "NHWC"
    if layout == "NCHW" and groups > 1:
        assert isinstance(low, conv_direct.DirectRows) and low.kernel.name.startswith("conv_grouped_plane_f32")
    else:
        assert (low.matmul.template is gemm.DOT4) == on_dot4 and low.indirect == (layout == "NHWC" and kernel == 3)
        assert low.kernel.name.startswith("dot4_matmul" if on_dot4 else "tile_matmul")
        assert not on_dot4 or low.matmul.point.block[1] == (32 if groups > 1 else 64)      # 11 / 33 columns
    rng = np.random.default_rng(8)
    x, w = operand(rng, (2, c, 9, 7), np.uint8), operand(rng, (oc, c // groups, kernel, kernel), np.int8)
    bias = rng.integers(-50000, 50000, oc).astype(np.int32)
    xin = x if layout == "NCHW" else np.ascontiguousarray(x.transpose(0, 2, 3, 1))
    y = ops.conv2d(xin, w, bias, padding=pad, groups=groups, layout=layout, activation="relu")
    assert_convolution(y if layout == "NCHW" else y.transpose(0, 3, 1, 2), x, w, bias, "relu",
                       **_options((1, 1), (pad,) * 4, (1, 1), groups))


@pytest.mark.parametrize("kernel", [(2, 257), (5, 103)])
def test_integer_depthwise_convolutions_sum_on_the_cpus_rows_up_to_exact_k(kernel):
    """u8 by s8: a depthwise window of `gemm.exact_k` (514) taps runs on the direct kernels' f32 sums, one of 515 on
    the GEMM (k blocks of f32 sums added in i32); both exact where 515 terms of 255 x -128 (one -127) sum past 2^24
    to an odd number, which an f32 sum cannot hold."""
    x = np.full((1, 2) + kernel, 255, np.uint8)
    w = np.full((2, 1) + kernel, -128, np.int8)
    w[:, 0, 0, 0] = -127
    g = geometry(x.shape, w.shape, groups=2)
    rows = isinstance(conv.plan(g, td.u8, "cpu", False, None, td.i8).lowered, conv_direct.DirectRows)
    assert rows == (kernel[0] * kernel[1] <= gemm.exact_k(td.u8, td.i8))
    assert_convolution(ops.conv2d(x, w, groups=2), x, w, **_options((1, 1), (0, 0, 0, 0), (1, 1), 2))


# Each cpu lowering (NCHW: columns, the window kernel's own im2col (512+ pixels, rows of 32+), a pointwise input as
# the columns, groups; NHWC: the input read in place, pointwise, groups, a few pixels), K past every pair's `exact_k`
LONG_K = [   # n, c, h, w, oc, (kh, kw), stride, padding, groups
    (1, 130, 5, 6, 9, (3, 3), 1, 1, 1),
    (1, 120, 16, 36, 5, (3, 3), 1, 1, 1),
    (2, 1100, 3, 4, 7, (1, 1), 1, 0, 1),
    (1, 260, 4, 5, 6, (3, 3), 2, 1, 2),
    (1, 1030, 1, 2, 4, (1, 1), 1, 0, 1),      # NHWC: two rows of A, `gemv.packed_rows_kernel`
]


@pytest.mark.parametrize("case", LONG_K)
@pytest.mark.parametrize("layout", ["NCHW", "NHWC"])
def test_long_integer_reductions_are_exact_on_the_cpu(case, layout):
    """Sums far past 2^24, many odd (which no f32 holds: a sum that went through f32 fails), exact in every cpu
    lowering."""
    n, c, h, w, oc, kernel, stride, padding, groups = case
    rng = np.random.default_rng(3)
    x = large_terms(rng, (n, c, h, w), np.uint8)
    wt = large_terms(rng, (oc, c // groups) + kernel, np.int8)
    options = dict(stride=(stride, stride), padding=(padding,) * 4, dilation=(1, 1), groups=groups)
    want = reference(x, wt, None, **options)
    assert np.mean((np.abs(want) > 2**24) & (want % 2 == 1)) > 0.25
    xin = x if layout == "NCHW" else np.ascontiguousarray(x.transpose(0, 2, 3, 1))
    y = ops.conv2d(xin, wt, None, stride, padding, 1, groups, layout)
    np.testing.assert_array_equal(y if layout == "NCHW" else y.transpose(0, 3, 1, 2), want.astype(np.int64))


def test_mixed_and_refused_operands(target):
    """An 8-bit integer with a float convolves in f32; sigmoid on an integer convolution is a ValueError, a float
    bias a TypeError (converting it would truncate it); empty batches give an empty output of the product's
    type."""
    rng = np.random.default_rng(1)
    x, w = operand(rng, (1, 4, 5, 5), np.int8), rng.standard_normal((3, 4, 3, 3)).astype(np.float32)
    y = ops.conv2d(x, w, padding=1)
    assert y.dtype == np.float32
    np.testing.assert_allclose(y, reference(x, w, None, (1, 1), (1, 1, 1, 1), (1, 1), 1), rtol=1e-5, atol=1e-3)
    with pytest.raises(ValueError, match="sigmoid of an integer convolution"):
        ops.conv2d(x, w.astype(np.int8), activation="sigmoid")
    with pytest.raises(TypeError, match="conv2d: the bias of an integer result must be integers"):
        ops.conv2d(x, w.astype(np.int8), np.full(3, 0.5, np.float32))
    empty = ops.conv2d(np.zeros((0, 4, 5, 5), np.uint8), w.astype(np.int8))
    assert empty.shape == (0, 3, 3, 3) and empty.dtype == np.int32


@pytest.mark.gpu
@pytest.mark.parametrize("types", PAIRS)
def test_8_bit_convolutions_on_a_gpu(types):
    """The 8-bit tensor-core convolutions on a GPU (E4M3 / E5M2 need sm_89+), device arrays in and out."""
    td.set_target("cuda")
    n, c, h, w, oc, kernel, stride, padding, dilation, groups = GEOMETRIES[0]
    rng = np.random.default_rng(2)
    x, wt = operand(rng, (n, c, h, w), types[0]), operand(rng, (oc, c // groups, *kernel), types[1])
    y = ops.conv2d(td.to_device(x), td.to_device(wt), None, stride, padding, dilation, groups).numpy()
    assert_convolution(y, x, wt, **_options(stride, padding, dilation, groups))
