"""ONNX DynamicQuantizeLinear, MatMulInteger, QLinearMatMul, ConvInteger and QLinearConv against onnxruntime:
hypothesis-drawn shapes (size 1, odd and prime sizes), int8 and uint8 operands, zero points and scales per tensor and
per column / output channel, full-range values (exact int32 accumulators, saturated outputs); refusals. Where
onnxruntime refuses a valid model (mixed int8/uint8 QLinearMatMul, a per-channel ConvInteger zero point), onnx's
reference implementation is the oracle."""
import numpy as np
import pytest
from hypothesis import assume, given, note, settings
from hypothesis import strategies as st
from onnx import TensorProto, helper
from onnx.reference import ReferenceEvaluator

import taskdsl.graph as tg
from taskdsl.graph.onnx_import import OnnxImportError, UnsupportedOnnxError

from ..ops.test_matmul_8bit import large_terms
from . import make_model, onnxruntime_saturates, run_onnxruntime

pytest.importorskip("onnxruntime")

ELEMS = {np.int8: TensorProto.INT8, np.uint8: TensorProto.UINT8}
SIZES = st.sampled_from([1, 2, 3, 5, 7])


def full_range(shape, dtype, rng) -> np.ndarray:
    """Random values over the whole range of the 8-bit `dtype`."""
    info = np.iinfo(dtype)
    return rng.integers(info.min, info.max + 1, shape).astype(dtype)


def check(model, feeds: dict, oracle=run_onnxruntime) -> None:
    """taskdsl's outputs equal the oracle's, onnxruntime's by default (type, shape and value)."""
    got = tg.from_onnx(model).compile()(feeds)
    want = oracle(model, feeds)
    assert len(got) == len(want)
    for g, w in zip(got, want):
        assert g.dtype == w.dtype and g.shape == w.shape
        np.testing.assert_array_equal(g, w)


def run_reference(model, feeds: dict) -> list:
    """The model's outputs computed by onnx's reference implementation (the spec)."""
    return ReferenceEvaluator(model).run(None, feeds)


def run_exact(model, feeds: dict) -> list:
    """The outputs of a model of 8-bit products by onnxruntime, or by onnx's reference where onnxruntime saturates
    full-range products (`onnxruntime_saturates`: x86 without VNNI)."""
    return (run_reference if onnxruntime_saturates() else run_onnxruntime)(model, feeds)


def dynamic_quantize_model(shape: list):
    """A one-node DynamicQuantizeLinear model (opset 13)."""
    node = helper.make_node("DynamicQuantizeLinear", ["x"], ["y", "scale", "zero"])
    return make_model([node], [("x", shape)], [("y", shape, TensorProto.UINT8), ("scale", [], TensorProto.FLOAT),
                                               ("zero", [], TensorProto.UINT8)], opset=13)


@settings(max_examples=3, deadline=None)
@given(shape=st.lists(SIZES, min_size=1, max_size=3), kind=st.sampled_from(["mixed", "positive", "negative"]),
       seed=st.integers(0, 99))
def test_dynamic_quantize_linear_matches_onnxruntime(shape, kind, seed):
    """y, scale and zero point, x of both signs or of only one."""
    x = np.random.default_rng(seed).uniform(-3.0, 5.0, shape).astype(np.float32)
    x = {"mixed": x, "positive": np.abs(x), "negative": -np.abs(x)}[kind]
    check(dynamic_quantize_model(shape), {"x": x})


def test_dynamic_quantize_linear_of_zeros():
    """An all-zero x: y and the zero point 0, the scale the reference's 1 / 255 (onnxruntime's is 1)."""
    x = np.zeros([3, 2], np.float32)
    got = tg.from_onnx(dynamic_quantize_model([3, 2])).compile()({"x": x})
    np.testing.assert_array_equal(got[0], np.zeros([3, 2], np.uint8))
    assert got[1] == np.float32(1 / 255) and got[2] == 0


@st.composite
def matmul_case(draw) -> tuple:
    """(a's shape, b's shape, a's type, b's type, per-column b parameters)."""
    batch = draw(st.lists(SIZES, max_size=1))
    m, k, n = draw(SIZES), draw(SIZES), draw(SIZES)
    return batch + [m, k], [k, n], draw(st.sampled_from([np.uint8, np.int8])), \
        draw(st.sampled_from([np.uint8, np.int8])), draw(st.booleans())


@settings(max_examples=5, deadline=None)
@given(case=matmul_case(), seed=st.integers(0, 99))
def test_matmul_integer_matches_onnxruntime(case, seed):
    """(a - a_zero) @ (b - b_zero) in int32, b's zero point per tensor or per column."""
    a_shape, b_shape, a_type, b_type, per_column = case
    rng = np.random.default_rng(seed)
    inits = {"az": full_range([], a_type, rng), "bz": full_range(b_shape[-1:] if per_column else [], b_type, rng)}
    node = helper.make_node("MatMulInteger", ["a", "b", "az", "bz"], ["y"])
    model = make_model([node], [("a", a_shape, ELEMS[a_type]), ("b", b_shape, ELEMS[b_type])],
                       [("y", a_shape[:-1] + b_shape[-1:], TensorProto.INT32)], inits, opset=13)
    check(model, {"a": full_range(a_shape, a_type, rng), "b": full_range(b_shape, b_type, rng)}, run_exact)


@settings(max_examples=6, deadline=None)
@given(a_shape=st.sampled_from([[7], [3, 7], [2, 3, 7]]), b_shape=st.sampled_from([[7], [7, 5], [2, 7, 5]]),
       a_type=st.sampled_from([np.uint8, np.int8]), b_type=st.sampled_from([np.uint8, np.int8]),
       zeros=st.sampled_from(["inputs", "zero constants", "none"]), seed=st.integers(0, 99))
def test_matmul_integer_of_any_rank_and_zero_points(a_shape, b_shape, a_type, b_type, zeros, seed):
    """MatMulInteger is the 8-bit product less the zero points' share: 1-d operands (numpy's rules), batches, zero
    points given at run time (graph inputs), constant zeros (left out of the graph) or none, against onnx's
    reference (onnxruntime takes 2-d zero points only in some of these)."""
    rng = np.random.default_rng(seed)
    out = np.matmul(np.zeros(a_shape), np.zeros(b_shape)).shape
    inputs = [("a", a_shape, ELEMS[a_type]), ("b", b_shape, ELEMS[b_type])]
    feeds = {"a": full_range(a_shape, a_type, rng), "b": full_range(b_shape, b_type, rng)}
    inits, names = {}, ["a", "b"]
    if zeros == "inputs":
        inputs += [("az", [], ELEMS[a_type]), ("bz", [], ELEMS[b_type])]
        feeds.update(az=full_range([], a_type, rng), bz=full_range([], b_type, rng))
        names += ["az", "bz"]
    elif zeros == "zero constants":
        inits = {"az": np.zeros([], a_type), "bz": np.zeros([], b_type)}
        names += ["az", "bz"]
    node = helper.make_node("MatMulInteger", names, ["y"])
    model = make_model([node], inputs, [("y", list(out), TensorProto.INT32)], inits, opset=13)
    check(model, feeds, run_reference)


@pytest.mark.parametrize("m, k, n, kernel", [(5, 3000, 7, "small_matmul"), (64, 1500, 96, "tile_matmul_"),
                                             (3, 2000, 50, "rows_matmul_3x")])
def test_integer_products_on_the_cpu_fuse_their_epilogue_exact_past_2_to_the_24(m, k, n, kernel, dot4_products):
    """On the cpu MatMulInteger's product is the last kernel, the zero points' share in its epilogue (after the
    kernels summing a's rows for it); its int32 sums, far past 2^24 (large terms of one sign), equal onnx's
    reference, for each cpu kernel (the small one split into exact z-slices, whose sum then carries the
    epilogue), or on the dot4 template for every size where the host has byte dot products."""
    kernel = "dot4_matmul" if dot4_products else kernel
    rng = np.random.default_rng(k)
    a = large_terms(rng, (m, k), np.uint8)
    inits = {"b": large_terms(rng, (k, n), np.int8), "az": np.uint8(3), "bz": np.int8(-2)}
    node = helper.make_node("MatMulInteger", ["a", "b", "az", "bz"], ["y"])
    model = make_model([node], [("a", [m, k], TensorProto.UINT8)], [("y", [m, n], TensorProto.INT32)], inits,
                       opset=13)
    compiled = tg.from_onnx(model).compile("cpu")
    want = run_reference(model, {"a": a})[0]
    assert np.abs(want).min() > 2**24
    np.testing.assert_array_equal(compiled({"a": a})[0], want)
    names = [kernel.name for kernel in compiled.kernels]
    product = next(i for i, name in enumerate(names) if name.startswith(kernel))
    assert names[product:] == [names[product]] + (["split_k_sum_i32_fused"] if kernel == "small_matmul" else [])
    assert names[-1].endswith("_fused"), names


@pytest.mark.parametrize("c, groups, kernel, zeros", [(300, 1, "tile_matmul", ("xz", "wz")),
                                                      (6, 6, "conv_direct", ("xz",))])
def test_integer_convolutions_on_the_cpu_fuse_their_epilogue(c, groups, kernel, zeros, dot4_products):
    """On the cpu ConvInteger's convolution (the GEMM, on byte dot products where the host has them, or a depthwise
    one's direct rows) is the last kernel, the zero points' shares fused into its stores (with w's zero point, the
    window sums' convolution runs before it); exact, the GEMM's raw sums past 2^24 (an inner window: 2700 products
    of at least 193 x 97, large terms)."""
    kernel = "dot4_matmul" if dot4_products and kernel == "tile_matmul" else kernel
    rng = np.random.default_rng(c)
    x_shape, w_shape = [1, c, 7, 6], [c, c // groups, 3, 3]
    x = large_terms(rng, x_shape, np.uint8)
    attrs = {"pads": [1, 0, 1, 2], "strides": [1, 1], "group": groups}
    model, _ = conv_integer_model(x_shape, w_shape, attrs, np.uint8, large_terms(rng, w_shape, np.int8),
                                  {k: v for k, v in (("xz", np.uint8(200)), ("wz", np.int8(-100))) if k in zeros},
                                  False)
    compiled = tg.from_onnx(model).compile("cpu")
    want = run_reference(model, {"x": x})[0]
    np.testing.assert_array_equal(compiled({"x": x})[0], want)
    names = [k.name for k in compiled.kernels]
    assert names[-1].startswith(kernel) and names[-1].endswith("_fused"), names


@pytest.mark.parametrize("a_shape, b_shape", [([2, 9, 40], [40, 24]), ([2, 9, 40], [2, 40, 24]), ([9, 40], [40])])
def test_matmul_integer_runs_8_bit_tensor_cores_on_a_gpu(simulated_gpu, a_shape, b_shape):
    """On the cuda target MatMulInteger's product is the 8-bit tensor-core kernel's (u8 by s8, the weight's zero
    point per column where it has columns), the zero points' share after it; the same int32 as onnx's reference,
    run after run; the constant weight (a matrix, a batch of them, a vector) is transposed for the kernel once, not
    at every run."""
    rng = np.random.default_rng(5)
    inits = {"az": np.uint8(131), "bz": full_range(b_shape[-1:] if len(b_shape) > 1 else [], np.int8, rng),
             "b": full_range(b_shape, np.int8, rng)}
    out = list(np.matmul(np.zeros(a_shape), np.zeros(b_shape)).shape)
    node = helper.make_node("MatMulInteger", ["a", "b", "az", "bz"], ["y"])
    model = make_model([node], [("a", a_shape, TensorProto.UINT8)], [("y", out, TensorProto.INT32)], inits,
                       opset=13)
    feeds = {"a": full_range(a_shape, np.uint8, rng)}
    compiled, want = tg.from_onnx(model).compile(), run_reference(model, feeds)
    launched = [kernel.name for kernel, _ in simulated_gpu.launches]     # the compile's runs (and its recording)
    assert sum(name.startswith("tc_matmul_") for name in launched) > 1, launched
    assert sum(name.startswith("transpose") for name in launched) <= 1, launched   # the constant B, transposed once
    for _ in range(2):
        np.testing.assert_array_equal(compiled(feeds)[0], want[0])


@settings(max_examples=3, deadline=None)
@given(case=matmul_case(), seed=st.integers(0, 99))
def test_qlinear_matmul_matches_onnxruntime(case, seed):
    """Requantized products, b's scale and zero point per tensor or per column; some outputs saturate (mixed
    int8 and uint8 operands, which onnxruntime refuses, against the reference)."""
    a_shape, b_shape, a_type, b_type, per_column = case
    rng = np.random.default_rng(seed)
    b_params = b_shape[-1:] if per_column else []
    inits = {"as": np.float32(0.05), "az": full_range([], a_type, rng) // 4,
             "bs": rng.uniform(0.01, 0.1, b_params).astype(np.float32), "bz": full_range(b_params, b_type, rng) // 4,
             "ys": np.float32(rng.uniform(0.05, 0.5)), "yz": full_range([], a_type, rng) // 2}
    node = helper.make_node("QLinearMatMul", ["a", "as", "az", "b", "bs", "bz", "ys", "yz"], ["y"])
    model = make_model([node], [("a", a_shape, ELEMS[a_type]), ("b", b_shape, ELEMS[b_type])],
                       [("y", a_shape[:-1] + b_shape[-1:], ELEMS[a_type])], inits, opset=21)
    check(model, {"a": full_range(a_shape, a_type, rng), "b": full_range(b_shape, b_type, rng)},
          run_exact if a_type == b_type else run_reference)


@st.composite
def conv_case(draw) -> tuple:
    """(x's shape, w's shape, attributes) of a 1-d or 2-d convolution, with groups, strides, pads, dilations."""
    rank, groups = draw(st.integers(1, 2)), draw(st.sampled_from([1, 2]))
    c, o = groups * draw(st.integers(1, 2)), groups * draw(st.integers(1, 3))
    kernel = draw(st.lists(st.integers(1, 3), min_size=rank, max_size=rank))
    spatial = [draw(st.integers(k, k + 4)) for k in kernel]
    attrs = {"group": groups, "strides": draw(st.lists(st.integers(1, 2), min_size=rank, max_size=rank)),
             "pads": draw(st.lists(st.integers(0, 1), min_size=2 * rank, max_size=2 * rank))}
    return [draw(st.integers(1, 2)), c] + spatial, [o, c // groups] + kernel, attrs


def conv_output(x_shape: list, w_shape: list, attrs: dict) -> list:
    """The output shape of a convolution."""
    rank = len(x_shape) - 2
    dilations = attrs.get("dilations", [1] * rank)
    return x_shape[:1] + w_shape[:1] + [
        (n + attrs["pads"][i] + attrs["pads"][rank + i] - d * (k - 1) - 1) // attrs["strides"][i] + 1
        for i, (n, k, d) in enumerate(zip(x_shape[2:], w_shape[2:], dilations))]


@settings(max_examples=3, deadline=None)
@given(case=conv_case(), per_channel=st.booleans(), seed=st.integers(0, 99))
def test_conv_integer_matches_onnxruntime(case, per_channel, seed):
    """The exact int32 convolution of uint8 x and w (onnxruntime's types), w's zero point per tensor or per output
    channel (which onnxruntime refuses: against the reference then, whose per-channel zero point is 2-d only)."""
    x_shape, w_shape, attrs = case
    assume(not per_channel or len(x_shape) == 4)
    rng = np.random.default_rng(seed)
    inits = {"w": full_range(w_shape, np.uint8, rng), "xz": full_range([], np.uint8, rng),
             "wz": full_range(w_shape[:1] if per_channel else [], np.uint8, rng)}
    node = helper.make_node("ConvInteger", ["x", "w", "xz", "wz"], ["y"], **attrs)
    model = make_model([node], [("x", x_shape, TensorProto.UINT8)],
                       [("y", conv_output(x_shape, w_shape, attrs), TensorProto.INT32)], inits, opset=13)
    check(model, {"x": full_range(x_shape, np.uint8, rng)}, run_reference if per_channel else run_onnxruntime)


def conv_integer_model(x_shape, w_shape, attrs, x_type, w, zeros: dict, zeros_as_inputs: bool):
    """A one-node ConvInteger model of x (an input) by the constant w, with the zero points `zeros` ({"xz": ...,
    "wz": ...}, absent ones left out) as constants or graph inputs; and its feeds but x."""
    names = ["x", "w"] + (["xz"] if "xz" in zeros or "wz" in zeros else []) + (["wz"] if "wz" in zeros else [])
    inputs, inits, feeds = [("x", x_shape, ELEMS[x_type])], {"w": w}, {}
    for name in names[2:]:
        value = zeros.get(name, np.zeros([], x_type))      # a missing x zero point before w's: a zero one
        if zeros_as_inputs:
            inputs.append((name, list(value.shape), ELEMS[value.dtype.type]))
            feeds[name] = value
        else:
            inits[name] = value
    node = helper.make_node("ConvInteger", names, ["y"], **attrs)
    model = make_model([node], inputs, [("y", conv_output(x_shape, w_shape, attrs), TensorProto.INT32)], inits,
                       opset=13)
    return model, feeds


@settings(max_examples=8, deadline=None)
@given(case=conv_case(), dilated=st.booleans(), x_type=st.sampled_from([np.uint8, np.int8]),
       w_type=st.sampled_from([np.uint8, np.int8]), zeros=st.sampled_from(["x", "w", "both", "none"]),
       per_channel=st.booleans(), as_inputs=st.booleans(), seed=st.integers(0, 99))
def test_conv_integer_of_any_zero_points(case, dilated, x_type, w_type, zeros, per_channel, as_inputs, seed):
    """ConvInteger is the 8-bit operands' convolution (x padded with its zero point) less the zero points' share:
    either zero point or both, w's per tensor or per output channel (a group's share of x's window sums per
    channel), constants or graph inputs, dilated windows, against onnx's reference (whose per-channel zero point is
    2-d only)."""
    x_shape, w_shape, attrs = case
    assume(not per_channel or len(x_shape) == 4)
    if dilated:
        attrs["dilations"] = [2] * (len(x_shape) - 2)
        assume(min(conv_output(x_shape, w_shape, attrs)[2:]) >= 1)
    rng = np.random.default_rng(seed)
    given_zeros = {"xz": full_range([], x_type, rng), "wz": full_range(w_shape[:1] if per_channel else [], w_type,
                                                                       rng)}
    chosen = {"x": ["xz"], "w": ["wz"], "both": ["xz", "wz"], "none": []}[zeros]
    model, feeds = conv_integer_model(x_shape, w_shape, attrs, x_type, full_range(w_shape, w_type, rng),
                                      {k: given_zeros[k] for k in chosen}, as_inputs)
    check(model, dict(feeds, x=full_range(x_shape, x_type, rng)), run_reference)


@pytest.mark.parametrize("channels", [65793, 65794])
def test_weight_zero_point_window_sums_are_exact_at_f32s_edge(channels):
    """w's zero point takes zw times each window's sum of x: summed in f32 (the channels, then the windows) up to
    65793 taps of 255 (below 2^24), by an integer convolution of ones from 65794 on; x all 255 but one 254, so the
    sum is odd, which f32 rounds past 2^24."""
    x = np.full((1, channels, 1, 1), 255, np.uint8)
    x[0, 7] = 254
    w = np.ones((2, channels, 1, 1), np.uint8)
    model, _ = conv_integer_model(list(x.shape), list(w.shape), {"pads": [0] * 4, "strides": [1, 1]}, np.uint8, w,
                                  {"xz": np.uint8(0), "wz": np.uint8(3)}, False)
    check(model, {"x": x}, run_reference)


def test_qlinear_conv_on_the_cpu_is_im2col_and_the_template_gemm_replayed():
    """On the cpu an integer convolution is im2col columns and the register-tile GEMM, exact in int32 (no reduce
    over windows: it took 1.5 s for a 64 -> 64 3x3 layer at 56x56); the compiled graph replays its launches, run
    after run on new inputs, each the reference's output."""
    rng = np.random.default_rng(3)
    x_shape, w_shape = [1, 8, 9, 9], [16, 8, 3, 3]
    inits = {"xs": np.float32(0.05), "xz": np.uint8(128), "w": full_range(w_shape, np.int8, rng),
             "ws": rng.uniform(0.01, 0.1, 16).astype(np.float32), "wz": np.zeros(16, np.int8),
             "ys": np.float32(0.5), "yz": np.uint8(100), "b": rng.integers(-5000, 5000, 16).astype(np.int32)}
    attrs = {"pads": [1, 1, 1, 1], "strides": [1, 1]}
    node = helper.make_node("QLinearConv", ["x", "xs", "xz", "w", "ws", "wz", "ys", "yz", "b"], ["y"], **attrs)
    model = make_model([node], [("x", x_shape, TensorProto.UINT8)],
                       [("y", conv_output(x_shape, w_shape, attrs), TensorProto.UINT8)], inits, opset=13)
    compiled = tg.from_onnx(model).compile("cpu")
    names = [kernel.name for kernel in compiled.kernels]
    assert "im2col_u8" in names and names[names.index("im2col_u8") + 1].startswith("tile_matmul_"), names
    for _ in range(4):
        feeds = {"x": full_range(x_shape, np.uint8, rng)}
        np.testing.assert_array_equal(compiled(feeds)[0], run_reference(model, feeds)[0])
    assert compiled.replay.startswith("on"), compiled.replay


@pytest.mark.parametrize("groups, pads", [(1, [1, 1, 1, 1]), (2, [0, 1, 2, 0])])
def test_conv_integer_runs_8_bit_tensor_cores_on_a_gpu(simulated_gpu, groups, pads):
    """On the cuda target ConvInteger's convolution is the 8-bit tensor-core kernel's (u8 by s8, implicit im2col,
    x padded with its zero point), the zero points' share after it: the same int32 as onnx's reference, run after
    run."""
    rng = np.random.default_rng(groups)
    x_shape, w_shape = [2, 8, 7, 6], [6, 8 // groups, 3, 3]
    zeros = {"xz": np.uint8(131), "wz": full_range(w_shape[:1], np.int8, rng)}
    attrs = {"group": groups, "pads": pads, "strides": [1, 2]}
    model, _ = conv_integer_model(x_shape, w_shape, attrs, np.uint8, full_range(w_shape, np.int8, rng), zeros, False)
    feeds = {"x": full_range(x_shape, np.uint8, rng)}
    compiled, want = tg.from_onnx(model).compile(), run_reference(model, feeds)
    launched = [kernel.name for kernel, _ in simulated_gpu.launches]
    assert sum(name.startswith("tc_matmul_") for name in launched) > 1, launched
    for _ in range(2):
        np.testing.assert_array_equal(compiled(feeds)[0], want[0])


@settings(max_examples=3, deadline=None)
@given(case=conv_case(), x_type=st.sampled_from([np.uint8, np.int8]), per_channel=st.booleans(),
       seed=st.integers(0, 99))
def test_qlinear_conv_matches_onnxruntime(case, x_type, per_channel, seed):
    """Requantized convolutions with an int32 bias, int8 w's scale per tensor or output channel (zero point 0)."""
    x_shape, w_shape, attrs = case
    assume(not (onnxruntime_saturates() and per_channel and len(x_shape) == 3))   # `run_exact`'s reference: 2-d only
    rng = np.random.default_rng(seed)
    channels = w_shape[:1] if per_channel else []
    inits = {"xs": np.float32(0.05), "xz": full_range([], x_type, rng) // 4, "w": full_range(w_shape, np.int8, rng),
             "ws": rng.uniform(0.01, 0.1, channels).astype(np.float32), "wz": np.zeros(channels, np.int8),
             "ys": np.float32(rng.uniform(0.1, 1.0)), "yz": full_range([], x_type, rng) // 2,
             "b": rng.integers(-5000, 5000, w_shape[:1]).astype(np.int32)}
    node = helper.make_node("QLinearConv", ["x", "xs", "xz", "w", "ws", "wz", "ys", "yz", "b"], ["y"], **attrs)
    model = make_model([node], [("x", x_shape, ELEMS[x_type])],
                       [("y", conv_output(x_shape, w_shape, attrs), ELEMS[x_type])], inits, opset=13)
    x = full_range(x_shape, x_type, rng)
    note(f"x = {x!r}")
    check(model, {"x": x}, run_exact)


def test_per_row_zero_point_is_refused():
    """A per-row zero point of a (onnxruntime takes only a scalar one) is unsupported."""
    node = helper.make_node("MatMulInteger", ["a", "b", "az"], ["y"])
    model = make_model([node], [("a", [3, 2], TensorProto.UINT8), ("b", [2, 4], TensorProto.UINT8)],
                       [("y", [3, 4], TensorProto.INT32)], {"az": np.array([1, 2, 3], np.uint8)}, opset=13)
    with pytest.raises(UnsupportedOnnxError, match="per tensor only"):
        tg.from_onnx(model)


def test_mismatched_scale_is_an_error():
    """A per-channel w_scale with the wrong number of channels is an invalid model."""
    inits = {"xs": np.float32(1), "xz": np.uint8(0), "ws": np.ones(3, np.float32), "wz": np.uint8(0),
             "ys": np.float32(1), "yz": np.uint8(0), "w": np.ones([2, 1, 1], np.uint8)}
    node = helper.make_node("QLinearConv", ["x", "xs", "xz", "w", "ws", "wz", "ys", "yz"], ["y"])
    model = make_model([node], [("x", [1, 1, 4], TensorProto.UINT8)], [("y", [1, 2, 4], TensorProto.UINT8)], inits,
                       opset=13)
    with pytest.raises(OnnxImportError, match=r"scale of shape \[3\]"):
        tg.from_onnx(model)
