"""Audit of the public convolution, stdlib_ops.conv2d: regressions of the defects it fixed, and the edge cases it
checked, each against a float64 numpy convolution (test_conv.reference) and, for ONNX Conv semantics (asymmetric
pads, dilations, groups, NaN weights over the padding), onnxruntime.

Covered: strides 1, 2, 3; padding as an int, (ph, pw) and asymmetric (top, left, bottom, right); dilation; kernels
larger than the input that the padding makes fit, a kernel the size of the padded input (a 1x1 output), 1x1 kernels
with and without stride; non-square, odd and prime sizes; batches 0, 1, 2, 3; one channel; groups 1, 2 (two and five
channels a group), depthwise with a channel multiplier; NCHW and NHWC (OIHW weights for both); bias and each
activation; f32, f16, f16 with f32, bf16, bf16 with f32, big-endian; the refused types (f64, integers, bool); NaN
and inf through inputs and weights, the zero padding adding exactly zero; transposed, reversed, strided and
read-only operands (never changed, results never shared); the argument errors. Each lowering takes part: on the cpu
the explicit-columns GEMM (NCHW and NHWC), the pointwise GEMM, the grouped implicit-im2col GEMM, the direct rows
kernels (NCHW and NHWC) and the depthwise plane kernel; on a GPU the implicit-im2col templates and the reduce.

Each test runs on the cpu and, as a cuda twin, on a GPU (or on the simulated one with TASKDSL_SIMULATED_GPU=1),
where its arrays go in as td.DeviceArrays (`put`) and results come back through `host`. Fixes of device-only
paths also have a test on the `simulated_gpu` fixture, which runs everywhere. Geometries are few and shared
between tests (each compiles its kernels once).
"""
import ml_dtypes
import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

import stdlib_ops as ops
import taskdsl as td
from stdlib_ops import conv, conv_direct
from stdlib_ops.conv_geometry import geometry, uses_direct

from ..graph import make_model, run_onnxruntime
from . import FEWER, SEEDS, host, put, rand, same
from .test_conv import reference

GPU_TWINS = True
ACTIVATIONS = {None: lambda v: v, "relu": lambda v: np.maximum(v, 0), "relu6": lambda v: np.clip(v, 0, 6),
               "sigmoid": lambda v: 1 / (1 + np.exp(-v))}
TOL = {np.dtype(np.float32): dict(rtol=1e-5, atol=1e-5), np.dtype(np.float16): dict(rtol=1e-2, atol=1e-2),
       np.dtype(ml_dtypes.bfloat16): dict(rtol=2**-7, atol=2**-7)}      # bf16: a last-bit rounding


def four(padding) -> tuple:
    """conv2d's padding argument as (top, left, bottom, right)."""
    if np.ndim(padding) == 0:
        return (padding,) * 4
    return tuple(padding) * 2 if len(padding) == 2 else tuple(padding)


def two(value) -> tuple:
    return (value,) * 2 if np.ndim(value) == 0 else tuple(value)


def expected(x, w, bias=None, stride=1, padding=0, dilation=1, groups=1, activation=None, dtype=None):
    """The NCHW convolution of NCHW `x` in float64 (test_conv.reference), activated, in the result's type."""
    with np.errstate(invalid="ignore", over="ignore"):      # inf - inf, 0 * inf: NaN, as the kernels give it
        y = ACTIVATIONS[activation](reference(x, w, bias, two(stride), four(padding), two(dilation), groups))
    return y.astype(dtype or np.result_type(x, w))


def conv2d(x, w, bias=None, layout="NCHW", **options):
    """ops.conv2d of NCHW `x` laid out as `layout` (OIHW weights either way), its result back in NCHW."""
    xin = x if layout == "NCHW" else x.transpose(0, 2, 3, 1)
    y = host(ops.conv2d(put(xin), put(w), None if bias is None else put(bias), layout=layout, **options))
    return y if layout == "NCHW" else y.transpose(0, 3, 1, 2)


def onnx_conv(x, w, bias=None, stride=1, padding=0, dilation=1, groups=1):
    """onnxruntime's Conv (NCHW, float32): pads are (top, left, bottom, right) as conv2d's."""
    from onnx import helper
    names = ["x", "w"] + (["b"] if bias is not None else [])
    node = helper.make_node("Conv", names, ["y"], strides=list(two(stride)), pads=list(four(padding)),
                            dilations=list(two(dilation)), group=groups)
    model = make_model([node], [(name, a.shape) for name, a in zip(names, (x, w, bias))], [("y", ["n", "c", "h", "w"])],
                       name="conv")
    return run_onnxruntime(model, dict(zip(names, (x, w, bias))))[0]


# The geometries the tests share: (x NCHW shape, OIHW weight shape, options), each a different lowering.
ODD = ((2, 3, 7, 11), (5, 3, 4, 3), dict(stride=(2, 3), padding=(0, 2, 3, 1), dilation=(2, 1)))   # columns GEMM
# grouped: NCHW the phase planes of a group's channels (`conv_direct.grouped_plane_kernel`), NHWC columns (implicit);
# rows: two channels a group, K = 18: NCHW the planes too, NHWC direct rows
GROUPED = ((1, 10, 6, 5), (4, 5, 3, 3), dict(stride=(1, 2), padding=(2, 1), groups=2))
ROWS = ((2, 4, 5, 6), (6, 2, 3, 3), dict(padding=1, groups=2))
DEPTHWISE = ((1, 3, 7, 8), (6, 1, 3, 2), dict(stride=(1, 2), padding=(1, 0, 2, 1), dilation=(2, 1), groups=3))

CPU_ROUTES = {   # (the case's input shape, layout) -> the first kernel of its cpu lowering
    (ODD[0], "NCHW"): "im2col_f32", (ODD[0], "NHWC"): "pad_nhwc_f32",
    (GROUPED[0], "NCHW"): "conv_grouped_plane_", (GROUPED[0], "NHWC"): "pad_nhwc_f32",
    (ROWS[0], "NCHW"): "conv_grouped_plane_", (ROWS[0], "NHWC"): "conv_direct_nhwc_",
    (DEPTHWISE[0], "NCHW"): "conv_direct_plane_", (DEPTHWISE[0], "NHWC"): "conv_direct_nhwc_"}


def operands(case, seed: int, dtype=np.float32) -> tuple:
    x_shape, w_shape, options = case
    return rand(x_shape, seed, dtype), rand(w_shape, seed + 1, dtype), rand(w_shape[:1], seed + 2, dtype), options


# ---------------------------------------------------------------- regressions
def test_groups_that_do_not_divide_the_channels_are_named():
    """groups=3 with 4 input channels said "need a weight of shape (3, 1, KH, KW), got (3, 1, 3, 3)": the weight
    it asked for was the one given. A weight of the wrong shape still names the one wanted."""
    x = put(np.zeros((1, 4, 5, 5), np.float32))
    for w_shape, groups in (((3, 1, 3, 3), 3), ((3, 2, 3, 3), 2), ((8, 0, 3, 3), 8), ((4, 4, 3, 3), 0)):
        with pytest.raises(ValueError, match=rf"groups must be >= 1 and divide both the 4 input channels and the "
                                             rf"{w_shape[0]} output channels .*got groups={groups}"):
            ops.conv2d(x, put(np.zeros(w_shape, np.float32)), groups=groups)
    with pytest.raises(ValueError, match=r"4 input channels in 2 group\(s\) need a weight of shape \(4, 2, KH, KW\) "
                                         r"\(OIHW, whatever the layout\), got \(4, 4, 3, 3\)"):
        ops.conv2d(x, put(np.zeros((4, 4, 3, 3), np.float32)), groups=2)


def test_groups_is_one_integer():
    """groups=(2,) or [1] was taken as 2 or 1 (a one-item sequence); stride and dilation are the pairs."""
    x, w = put(np.zeros((1, 4, 5, 5), np.float32)), put(np.zeros((4, 2, 3, 3), np.float32))
    for groups in ((2,), [1], np.array([2])):
        with pytest.raises(TypeError, match="conv2d: groups must be an integer"):
            ops.conv2d(x, w, groups=groups)


def test_a_kernel_of_no_taps_is_refused():
    """A (4, 4, 0, 3) weight gave a (1, 4, 6, 3) output holding the bias alone (a kernel 0 rows tall)."""
    x = put(np.zeros((1, 4, 5, 5), np.float32))
    for w_shape in ((4, 4, 0, 3), (4, 4, 3, 0)):
        with pytest.raises(ValueError, match=r"kernel must be at least 1x1, got a weight of shape \(4, 4, "):
            ops.conv2d(x, put(np.zeros(w_shape, np.float32)), put(np.ones(4, np.float32)))


def test_activation_is_checked_before_anything_runs():
    """activation=["relu"] was "unhashable type: 'list'" (from the plan cache), and an unknown activation went
    unnoticed on an empty batch."""
    w = put(np.zeros((4, 3, 3, 3), np.float32))
    with pytest.raises(TypeError, match=r"activation must be one of None, 'relu', 'relu6', 'sigmoid', got \['relu'\]"):
        ops.conv2d(put(np.zeros((1, 3, 5, 5), np.float32)), w, activation=["relu"])
    with pytest.raises(ValueError, match="unknown activation 'swish'; choose one of None, 'relu'"):
        ops.conv2d(put(np.zeros((0, 3, 5, 5), np.float32)), w, activation="swish")
    with pytest.raises(ValueError, match="unknown activation 'Relu'"):
        conv.plan(geometry((1, 3, 5, 5), (4, 3, 3, 3)), td.f32, "cpu", False, "Relu")


def test_nan_and_infinite_weights_times_the_zero_padding():
    """A NaN or inf weight times the zero padding is NaN (as onnxruntime, numpy and the im2col GEMMs give it): the
    cpu's direct rows kernel (two channels a group, NCHW) skipped the taps in the padding, so the border outputs
    were finite (8, 12, ...) where every other lowering gave NaN. Depthwise (the plane kernel) and GEMM agree.
    NCHW here (NHWC depthwise: test_conv.py); the cpu's grouped NHWC kernel still skips those taps
    (conv_direct.direct_nhwc_kernel)."""
    for case, activation in ((ROWS, "relu"), (DEPTHWISE, "sigmoid"), (ODD, "relu6")):
        x, w, bias, options = operands(case, 0)
        w[:, 0, 0, 0] = np.inf
        w[1::2, 0, -1, -1] = np.nan
        want = expected(x, w, bias, activation=activation, **options)
        assert np.isnan(want).any() and np.isfinite(want).any()
        same(conv2d(x, w, bias, activation=activation, **options), want, **TOL[np.dtype(np.float32)])
        with np.errstate(invalid="ignore"):
            onnx = ACTIVATIONS[activation](onnx_conv(x, w, bias, **options).astype(np.float64))
        np.testing.assert_allclose(onnx, want, rtol=1e-5, atol=1e-5)


def test_operands_of_two_types_on_the_device(simulated_gpu, twin_target):
    """A float16 DeviceArray with a float32 weight (or bias) was a TypeError on a GPU, "a DeviceArray of float16 was
    given where float32 is needed", where numpy arrays compute in float32; now a cast kernel converts it. On the
    simulated GPU, so it runs without one (the cpu twin: the cuda twin repeats it)."""
    if twin_target == "cuda":
        pytest.skip("the cpu twin ran it on the simulated GPU")
    x, w, bias, options = operands(DEPTHWISE, 9)
    for xt, wt, bt in ((np.float16, np.float32, np.float32), (np.float32, np.float16, np.float16)):
        a, b, c = x.astype(xt), w.astype(wt), bias.astype(bt)
        y = ops.conv2d(td.to_device(a), td.to_device(b), td.to_device(c), activation="sigmoid", **options)
        want = expected(a, b, c.astype(np.float32), activation="sigmoid", dtype=np.float32, **options)
        same(y, want, **TOL[np.dtype(np.float32)])


def test_float16_direct_convolutions_stay_float16_on_a_gpu(simulated_gpu, twin_target):
    """On a GPU an f16 depthwise (or other direct, grouped) convolution returned float32: the reduce sums f16
    products in f32 and its output stayed f32. It is rounded once to f16 now, after the bias and activation, as on
    the cpu. On the simulated GPU (the cpu twin: the cuda twin repeats it)."""
    if twin_target == "cuda":
        pytest.skip("the cpu twin ran it on the simulated GPU")
    x, w, bias, options = operands(DEPTHWISE, 11, np.float16)
    for b, activation in ((None, None), (bias, "sigmoid")):
        y = ops.conv2d(td.to_device(x), td.to_device(w), None if b is None else td.to_device(b),
                       activation=activation, **options)
        same(y, expected(x, w, b, activation=activation, **options), **TOL[np.dtype(np.float16)])


# ---------------------------------------------------------------- edge cases that were right (kept right)
@pytest.mark.parametrize("layout", ["NCHW", "NHWC"])
@pytest.mark.parametrize("case,activation", [(ODD, "relu6"), (GROUPED, None), (ROWS, "relu"), (DEPTHWISE, "sigmoid")],
                         ids=["columns", "grouped", "rows", "depthwise"])
def test_every_lowering_against_numpy_and_onnxruntime(case, activation, layout):
    """Batch 2 and prime sizes, strides 2 and 3, asymmetric padding, dilation, non-square kernels, groups of two
    and five channels, a depthwise channel multiplier; with a bias and an activation; OIHW weights in both layouts."""
    x, w, bias, options = operands(case, 1)
    want = expected(x, w, bias, activation=activation, **options)
    same(conv2d(x, w, bias, layout, activation=activation, **options), want, **TOL[np.dtype(np.float32)])
    if td.get_target() == "cpu":     # the lowering the case is for
        x_shape = x.shape if layout == "NCHW" else x.transpose(0, 2, 3, 1).shape
        p = conv.plan(geometry(x_shape, w.shape, layout=layout, **options), td.f32, "cpu", True, activation)
        assert p.kernels[0].name.startswith(CPU_ROUTES[case[0], layout]), [k.name for k in p.kernels]
    if layout == "NCHW":
        onnx = ACTIVATIONS[activation](onnx_conv(x, w, bias, **options).astype(np.float64))
        np.testing.assert_allclose(onnx, want, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("x_shape,w_shape,options,layout", [
    ((1, 1, 3, 4), (3, 1, 5, 6), dict(padding=1), "NCHW"),                  # a kernel the size of the padded input
    ((1, 2, 2, 3), (3, 2, 4, 3), dict(padding=(1, 0)), "NHWC"),             # a kernel larger than the input
    ((3, 4, 5, 7), (6, 4, 1, 1), dict(stride=2), "NCHW"),                   # a strided 1x1 kernel
    ((1, 4, 5, 7), (6, 4, 1, 1), dict(), "NHWC"),                           # pointwise: the input is the GEMM's A
], ids=["output-1x1", "kernel-over-input", "1x1-stride-2", "pointwise"])
def test_kernels_as_large_as_the_input_and_one_by_one(x_shape, w_shape, options, layout):
    x, w = rand(x_shape, 2), rand(w_shape, 3)
    same(conv2d(x, w, layout=layout, **options), expected(x, w, **options), **TOL[np.dtype(np.float32)])


@FEWER
@given(n=st.sampled_from([0, 1, 2]), c=st.sampled_from([1, 3]), oc=st.sampled_from([1, 4]),
       hw=st.tuples(st.integers(1, 9), st.integers(1, 9)), k=st.tuples(st.sampled_from([1, 2, 3]), st.integers(1, 5)),
       stride=st.tuples(st.integers(1, 3), st.integers(1, 3)), dilation=st.tuples(st.integers(1, 2), st.integers(1, 2)),
       padding=st.tuples(*[st.integers(0, 2)] * 4), layout=st.sampled_from(["NCHW", "NHWC"]), seed=SEEDS)
def test_geometries_against_numpy(n, c, oc, hw, k, stride, dilation, padding, layout, seed):
    """Any stride, dilation and asymmetric padding of odd sizes (the bottom / right padding grown until the kernel
    fits), batches 0-2, one channel."""
    (h, w), (kh, kw) = hw, k
    top, left, bottom, right = padding
    bottom += max(0, dilation[0] * (kh - 1) + 1 - (h + top + bottom))
    right += max(0, dilation[1] * (kw - 1) + 1 - (w + left + right))
    padding = (top, left, bottom, right)
    x, wt = rand((n, c, h, w), seed), rand((oc, c, kh, kw), seed + 1)
    got = conv2d(x, wt, layout=layout, stride=stride, padding=padding, dilation=dilation)
    same(got, expected(x, wt, stride=stride, padding=padding, dilation=dilation), **TOL[np.dtype(np.float32)])


def test_padding_spellings_and_padding_that_adds_exactly_zero():
    """padding=1, (1, 1) and (1, 1, 1, 1) are one convolution; with all-ones inputs and weights of 2^-6 each output
    is (the taps inside the image) / 64 exactly: the padding adds exact zeros, the clamped reads nothing."""
    x, w, _, options = operands(ODD, 4)
    x, w = np.ones_like(x), np.full_like(w, 2.0 ** -6)
    zero = np.zeros(w.shape[0], np.float32)
    want = expected(x, w, zero, activation="relu6", **options)
    for layout in ("NCHW", "NHWC"):
        same(conv2d(x, w, zero, layout, activation="relu6", **options), want)     # exact
    x, w, bias, _ = operands(ROWS, 5)
    want = expected(x, w, bias, padding=1, groups=2, activation="relu")
    for padding in (1, (1, 1), [1, 1, 1, 1], np.int64(1)):
        same(conv2d(x, w, bias, padding=padding, groups=2, activation="relu"), want, **TOL[np.dtype(np.float32)])


def test_nan_and_infinite_inputs_reach_only_their_windows():
    """NaN, inf and -inf pixels (at a corner too) make NaN / inf exactly the outputs whose windows hold them, after
    the bias and the activation; the clamped reads of padding taps never carry them further."""
    for case, activation, layouts in ((ODD, "relu6", ("NCHW", "NHWC")), (DEPTHWISE, "sigmoid", ("NCHW", "NHWC")),
                                      (ROWS, "relu", ("NCHW", "NHWC"))):
        x, w, bias, options = operands(case, 7)
        x[0, 0, 0, 0], x[-1, -1, -1, -1], x[0, -1, 2, 1] = np.nan, np.inf, -np.inf
        want = expected(x, w, bias, activation=activation, **options)
        assert np.isnan(want).any() and np.isfinite(want).any()
        for layout in layouts:
            same(conv2d(x, w, bias, layout, activation=activation, **options), want, **TOL[np.dtype(np.float32)])


def test_float16_and_mixed_types():
    """f16 (sums in f32, one rounding: 5 channels of values about 3 stay exact to f16's precision), f16 with f32
    (computed in f32, as numpy promotes), and big-endian arrays (as read from files)."""
    x, w, bias, options = operands(DEPTHWISE, 8, np.float16)
    same(conv2d(x, w, bias, activation="sigmoid", **options), expected(x, w, bias, activation="sigmoid", **options),
         **TOL[np.dtype(np.float16)])
    x, w, bias, options = operands(GROUPED, 8, np.float16)
    y = conv2d(x, w, bias, "NHWC", **options)
    same(y, expected(x, w, bias, **options), **TOL[np.dtype(np.float16)])
    x, w, bias, options = operands(ODD, 8)
    want = expected(x.astype(np.float16), w, bias, activation="relu6", **options)
    same(conv2d(x.astype(np.float16), w, bias, activation="relu6", **options), want, **TOL[np.dtype(np.float32)])
    want = expected(x, w.astype(np.float16), bias.astype(np.float16), activation="relu6", dtype=np.float32, **options)
    got = conv2d(x, w.astype(np.float16), bias.astype(np.float16), activation="relu6", **options)
    same(got, want, **TOL[np.dtype(np.float32)])
    if td.get_target() == "cpu":        # host arrays (DeviceArrays are native)
        big = ops.conv2d(x.astype(">f4"), w.astype(">f4"), bias.astype(">f4"), activation="relu6", **options)
        same(big, expected(x, w, bias, activation="relu6", **options), **TOL[np.dtype(np.float32)])


def test_bfloat16_in_every_lowering():
    """bf16 in each lowering (the columns GEMM, the grouped one NHWC, the direct rows, the depthwise kernel; on a
    GPU the tensor-core template and the reduce): products summed in f32, rounded to bf16 once after the bias and
    activation, so equal to the float64 result rounded to bf16 but for a last bit; with f32, computed in f32. (The
    result of an empty batch and the bias were the uint16 of bf16's bits.)"""
    bf16 = np.dtype(ml_dtypes.bfloat16)
    for case, layout, activation in ((ODD, "NCHW", "relu6"), (GROUPED, "NHWC", None), (ROWS, "NCHW", "sigmoid"),
                                     (DEPTHWISE, "NHWC", "relu")):
        x, w, bias, options = operands(case, 9, bf16)
        want = expected(x, w, bias, activation=activation, **options)
        same(conv2d(x, w, bias, layout, activation=activation, **options), want, **TOL[bf16])
    same(conv2d(x[:0], w, bias, layout, **options), want[:0])        # an empty batch: bf16 too, not its bits
    x, w, bias, options = operands(ODD, 9)
    want = expected(x, w.astype(bf16), bias, dtype=np.float32, **options)
    same(conv2d(x, w.astype(bf16), bias, **options), want, **TOL[np.dtype(np.float32)])


def test_refused_types_say_what_to_do():
    """f64, wider integers and bool are TypeErrors naming the type and the fix (8-bit operands convolve:
    test_conv_8bit)."""
    x, w = np.zeros((1, 3, 5, 5), np.float32), np.zeros((4, 3, 3, 3), np.float32)
    for bad in (np.float64, np.int32, np.int16, np.bool_):
        name = np.dtype(bad).name
        for pair in ((x.astype(bad), w), (x, w.astype(bad))):
            with pytest.raises(TypeError, match=f"conv2d supports float32, float16, .* and uint8 operands, got "
                                                rf"{name}; convert with np\.asarray\(x, np\.float32\)"):
                ops.conv2d(*map(put, pair))


def test_views_and_read_only_operands_are_neither_changed_nor_shared():
    """Transposed, reversed (negative strides), stepped and Fortran-order views, read-only, as numpy arrays on
    either target (the cuda one copies them in); NHWC from an NCHW array's transposed view. Operands keep their
    values; two results are two arrays."""
    x, w, bias, options = operands(ODD, 10)
    want = expected(x, w, bias, activation="relu6", **options)
    views = [(np.ascontiguousarray(x.transpose(3, 2, 1, 0)).transpose(3, 2, 1, 0), np.asfortranarray(w), bias),
             (x[::-1, ::-1, ::-1].copy()[::-1, ::-1, ::-1], w[:, ::-1].copy()[:, ::-1], bias[::-1].copy()[::-1]),
             (np.repeat(x, 2, axis=-1)[..., ::2], np.repeat(w, 3, axis=0)[::3], np.repeat(bias, 2)[::2])]
    results = []
    for xv, wv, bv in views:
        for a in (xv, wv, bv):
            a.setflags(write=False)
        results.append(ops.conv2d(xv, wv, bv, activation="relu6", **options))
        same(results[-1], want, **TOL[np.dtype(np.float32)])
        np.testing.assert_array_equal(xv, x)
        np.testing.assert_array_equal(wv, w)
        np.testing.assert_array_equal(bv, bias)
    host(results[0])[...] = 0
    same(results[1], want, **TOL[np.dtype(np.float32)])
    nhwc = ops.conv2d(x.transpose(0, 2, 3, 1), w, bias, layout="NHWC", activation="relu6", **options)
    same(host(nhwc).transpose(0, 3, 1, 2), want, **TOL[np.dtype(np.float32)])


def test_empty_batches_and_channels():
    """A batch of 0 is an empty result of the output's shape; 0 output channels too; 0 input channels sum nothing
    (the bias, activated); an empty image all in the padding likewise."""
    bias = np.array([1.0, -2.0, 3.0, 0.5], np.float32)
    for layout, shape in (("NCHW", (0, 4, 4, 3)), ("NHWC", (0, 4, 3, 4))):
        x = np.zeros((0, 3, 6, 5), np.float32)
        y = ops.conv2d(put(x if layout == "NCHW" else x.transpose(0, 2, 3, 1)), put(np.zeros((4, 3, 3, 3), np.float32)),
                       put(bias), layout=layout, activation="relu")
        assert host(y).shape == shape and host(y).dtype == np.float32
    same(conv2d(rand((2, 3, 6, 5), 0), np.zeros((0, 3, 3, 3), np.float32)), np.zeros((2, 0, 4, 3), np.float32))
    relu_bias = np.broadcast_to(np.maximum(bias, 0)[None, :, None, None], (1, 4, 4, 3))
    same(conv2d(np.zeros((1, 0, 6, 5), np.float32), np.zeros((4, 0, 3, 3), np.float32), bias, activation="relu"),
         relu_bias)
    same(conv2d(np.zeros((1, 3, 0, 5), np.float32), np.ones((4, 3, 3, 3), np.float32), bias, activation="relu",
                padding=(2, 0)), np.broadcast_to(relu_bias[..., :1, :], (1, 4, 2, 3)))


def test_an_image_with_no_pixels_is_not_read():
    """All its taps are padding: the im2col reads no element of X (clamped into an image with no pixels, the read
    was of X's first element, past the end of an empty array), while one row of pixels is read."""
    for layout, shape, one_row in (("NCHW", (1, 3, 0, 5), (1, 3, 1, 5)), ("NHWC", (1, 0, 5, 3), (1, 1, 5, 3))):
        for x_shape, reads in ((shape, 0), (one_row, 1)):
            g = geometry(x_shape, (4, 3, 3, 3), 1, (2, 0), layout=layout)
            x = td.placeholder("X", td.f32, x_shape)
            assert len(conv.im2col(g, x).inputs) == reads, (layout, x_shape)


def test_argument_errors_say_what_to_do():
    """Every argument a user can get wrong is a ValueError or TypeError naming it."""
    x, w = put(np.zeros((1, 4, 5, 5), np.float32)), put(np.zeros((6, 4, 3, 3), np.float32))
    cases = [
        (ValueError, r"stride and dilation must be >= 1, got stride=0", dict(stride=0)),
        (ValueError, r"stride and dilation must be >= 1, got stride=\(1, -2\)", dict(stride=(1, -2))),
        (ValueError, r"stride and dilation must be >= 1, got stride=1, dilation=0", dict(dilation=0)),
        (ValueError, r"padding must be an int, \(ph, pw\) or \(top, left, bottom, right\) >= 0, got -1",
         dict(padding=-1)),
        (ValueError, r"padding must be an int, .* got \(1, 2, 3\)", dict(padding=(1, 2, 3))),
        (ValueError, r"padding must be an int, .* got \(0, -1\)", dict(padding=(0, -1))),
        (ValueError, r"stride must be an integer or 2 of them, got \(1, 1, 1\)", dict(stride=(1, 1, 1))),
        (TypeError, r"stride must be integers, got 2.0", dict(stride=2.0)),
        (TypeError, r"padding must be integers, got \(1.5, 1\)", dict(padding=(1.5, 1))),
        (TypeError, r"padding must be integers, got 'same'", dict(padding="same")),
        (TypeError, r"dilation must be integers, got None", dict(dilation=None)),
        (TypeError, r"groups must be integers, got 2.0", dict(groups=2.0)),
        (TypeError, r"stride must be integers, got True", dict(stride=True)),       # (they ran as 1)
        (TypeError, r"padding must be integers, got \(True, 0\)", dict(padding=(True, 0))),
        (TypeError, r"groups must be integers, got True", dict(groups=True)),
        (ValueError, r"layout must be 'NCHW' or 'NHWC', got 'nchw'", dict(layout="nchw")),
        (ValueError, r"layout must be 'NCHW' or 'NHWC', got None", dict(layout=None)),
        (ValueError, r"the kernel \(3x3, dilation \(3, 3\)\) is larger than the padded input \(5x5 with padding "
                     r"\(0, 0, 0, 0\)\)", dict(dilation=3)),
        (ValueError, r"bias must have shape \(6,\) \(one per output channel\), got \(6, 1\)",
         dict(bias=put(np.zeros((6, 1), np.float32)))),
        (ValueError, r"bias must have shape \(6,\) \(one per output channel\), got \(\)", dict(bias=1.0)),
    ]
    for error, message, options in cases:
        with pytest.raises(error, match="conv2d: " + message):
            ops.conv2d(x, w, **options)
    with pytest.raises(ValueError, match=r"4-D input and a 4-D OIHW weight, got \(4, 5, 5\) and \(6, 4, 3, 3\)"):
        ops.conv2d(put(np.zeros((4, 5, 5), np.float32)), w)
    with pytest.raises(ValueError, match=r"5 input channels in 1 group\(s\) need a weight of shape \(6, 5, KH, KW\)"):
        ops.conv2d(x, w, layout="NHWC")      # x read as NHWC has 5 channels; the weight stays OIHW


@pytest.mark.parametrize("channels", [1, 11])
def test_a_window_tap_left_of_the_input_by_more_than_a_row_pads_its_own_row(channels):
    """A dilated 1x3 window whose first tap lies left of the input by more than the output's width: the im2col
    kernel zero-filled past its row of columns into the next row, which another block copies the input into
    (intermittently wrong on the cpu, 5 calls in 200: the graph fuzzer's seed 1015). Debug mode reports any
    access past a row; the values must hold call after call."""
    rng = np.random.default_rng(3)
    x = rng.standard_normal((2, channels, 3, 1)).astype(np.float32)
    w = rng.standard_normal((4, channels, 1, 3)).astype(np.float32)
    expected = reference(x, w, None, (1, 1), (0, 2, 0, 2), (1, 2), 1)
    td.debug(True)
    try:
        same(ops.conv2d(x, w, padding=(0, 2), dilation=(1, 2)), expected.astype(np.float32), rtol=1e-5, atol=1e-5)
    finally:
        td.debug(False)
    for _ in range(20):
        same(ops.conv2d(x, w, padding=(0, 2), dilation=(1, 2)), expected.astype(np.float32), rtol=1e-5, atol=1e-5)


# n, c, h, w, oc, (kh, kw), stride, padding (t, l, b, r), dilation, groups: 33-576 terms a group
GROUPED_ON_COLUMNS = [
    (2, 12, 7, 9, 6, (3, 3), (1, 1), (1, 1, 1, 1), (1, 1), 2),
    (1, 15, 6, 5, 9, (3, 3), (2, 1), (0, 2, 1, 0), (1, 2), 3),
    (1, 66, 5, 5, 64, (1, 1), (1, 1), (0, 0, 0, 0), (1, 1), 2),      # pointwise: the input is the columns
    (1, 32, 9, 9, 32, (3, 3), (1, 1), (1, 1, 1, 1), (1, 1), 4),
]


@pytest.mark.parametrize("case", GROUPED_ON_COLUMNS)
def test_grouped_convolutions_run_on_columns(case, monkeypatch):
    """NCHW grouped convolutions (not depthwise) whose group's phase planes do not fit `grouped_plane_kernel`'s
    buffer (here: none do) take the explicit columns and a GEMM batched over image and group on the cpu (the
    implicit im2col's divisions per element: 4-10x onnxruntime's time); bias and relu fused into its stores, the
    output's channels group after group."""
    monkeypatch.setattr(conv_direct, "GROUP_PLANES", 0)
    n, c, h, w, oc, ks, stride, padding, dilation, groups = case
    rng = np.random.default_rng(oc)
    x = rng.standard_normal((n, c, h, w)).astype(np.float32)
    wt = rng.standard_normal((oc, c // groups) + ks).astype(np.float32)
    bias = rng.standard_normal(oc).astype(np.float32)
    g = geometry(x.shape, wt.shape, stride, padding, dilation, groups)
    p = conv.plan(g, td.f32, td.get_target(), True, "relu")
    if td.get_target() == "cpu":
        assert p.lowered is not None and p.lowered.on_columns and not uses_direct(g)
    expected = np.maximum(reference(x, wt, bias, stride, padding, dilation, groups), 0).astype(np.float32)
    same(ops.conv2d(x, wt, bias, stride, padding, dilation, groups, activation="relu"), expected, rtol=1e-4,
         atol=1e-4)
