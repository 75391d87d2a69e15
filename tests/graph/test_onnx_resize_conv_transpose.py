"""ONNX Resize and ConvTranspose against onnxruntime: one-node models over hypothesis-drawn shapes (odd, prime and
size-1 axes) and attributes, in f32 and f16, refusals where the definitions disagree, and a ConvTranspose -> Relu
-> Resize model compiled with the default passes (fusion on). Every kernel the tests launch is also compiled for
CUDA by NVRTC (tests/conftest.py).

Where onnxruntime departs from the operator's definition the draws leave the case out, and say why: onnxruntime
copies the input when a Resize's output shape equals its input's (whatever the scales), reads an axis of scale 1
as the identity (a tf_crop_and_resize roi there is ignored).
"""
import warnings

import numpy as np
import onnx
import pytest
from hypothesis import HealthCheck, assume, given, note, settings
from hypothesis import strategies as st
from onnx import TensorProto, helper

import taskdsl.graph as tg
from taskdsl.graph import passes
from taskdsl.graph.fusion import INTERLEAVED_APART, FusedAnchor
from taskdsl.graph.onnx_import import ConstantRequiredError, OnnxImportError, UnsupportedOnnxError

from . import assert_close, make_model, rand, run_onnxruntime

pytest.importorskip("onnxruntime")

n = helper.make_node
UNFUSED = [passes.infer_shapes, passes.fold_constants, passes.eliminate_dead_code]
SIZES = [1, 2, 3, 5, 7]
SCALES = [0.34, 0.5, 0.6, 1.0, 1.5, 2.0, 3.0]
FLOATS = {TensorProto.FLOAT: np.float32, TensorProto.FLOAT16: np.float16}
TOLERANCES = {np.float32: {"rtol": 1e-4, "atol": 1e-5}, np.float16: {"rtol": 1e-2, "atol": 4e-3}}
COORDINATE_MODES = ["half_pixel", "half_pixel_symmetric", "pytorch_half_pixel", "align_corners", "asymmetric",
                    "tf_crop_and_resize"]
NEAREST_MODES = ["round_prefer_floor", "round_prefer_ceil", "floor", "ceil"]
PROFILE = settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def run_both(model: onnx.ModelProto, feeds: dict, graph_passes=UNFUSED) -> tuple:
    """(taskdsl's output, onnxruntime's output) of a one-output model on `feeds`."""
    graph = tg.from_onnx(model)
    got = graph.compile(passes=graph_passes)({t.name: feeds[t.name] for t in graph.inputs})[0]
    return got, run_onnxruntime(model, feeds)[0]


# ---------------------------------------------------------------- Resize
@st.composite
def resize_cases(draw, modes: tuple, ranks: tuple) -> dict:
    """A Resize node's shape, opset, inputs and attributes; linear and cubic resize only the last two axes of a
    4-d input (onnxruntime's NCHW kernels)."""
    rank = draw(st.sampled_from(ranks))
    shape = draw(st.lists(st.sampled_from(SIZES), min_size=rank, max_size=rank))
    mode = draw(st.sampled_from(modes))
    opset = draw(st.sampled_from([11, 13, 18, 19]))
    resizable = list(range(rank - 2, rank)) if mode != "nearest" and rank == 4 else list(range(rank))
    coordinates = [m for m in COORDINATE_MODES if m != "half_pixel_symmetric" or opset >= 19]     # (opset 19's)
    attrs = {"mode": mode, "coordinate_transformation_mode": draw(st.sampled_from(coordinates))}
    if mode == "nearest":
        attrs["nearest_mode"] = draw(st.sampled_from(NEAREST_MODES))
    if mode == "cubic":
        attrs.update(cubic_coeff_a=draw(st.sampled_from([-0.75, -0.5])), exclude_outside=draw(st.sampled_from([0, 1])))
    if opset >= 18 and mode != "nearest" and draw(st.booleans()):   # (opset 18's) the kernel widened where it shrinks
        attrs["antialias"] = 1
    axes = list(range(rank))
    if opset >= 18 and draw(st.booleans()):
        axes = draw(st.permutations(resizable))[:draw(st.integers(1, len(resizable)))]
        attrs["axes"] = axes
    if draw(st.booleans()):
        scales = [draw(st.sampled_from(SCALES)) if a in resizable else 1.0 for a in axes]
        values = {"scales": np.array(scales, np.float32)}
        unit = [s == 1.0 for s in scales]
    else:
        sizes = [draw(st.integers(1, 9)) if a in resizable else shape[a] for a in axes]
        values = {"sizes": np.array(sizes, np.int64)}
        unit = [z == shape[a] for z, a in zip(sizes, axes)]
        cropped = attrs["coordinate_transformation_mode"] == "tf_crop_and_resize"
        if opset >= 18 and mode == "nearest" and not cropped and draw(st.booleans()):
            attrs["keep_aspect_ratio_policy"] = draw(st.sampled_from(["not_larger", "not_smaller"]))
            unit = [False] * len(axes)      # (the scales are the policy's)
    if attrs["coordinate_transformation_mode"] == "tf_crop_and_resize":   # onnxruntime: scale 1 ignores the roi
        starts = [0.0 if u else draw(st.sampled_from([-0.2, 0.0, 0.1, 0.3])) for u in unit]
        ends = [1.0 if u else draw(st.sampled_from([0.6, 0.9, 1.0, 1.2])) for u in unit]
        values["roi"] = np.array(starts + ends, np.float32)
        attrs["extrapolation_value"] = draw(st.sampled_from([0.0, -3.5]))
    return {"shape": shape, "opset": opset, "attrs": attrs, "values": values, "unit": all(unit),
            "elem": draw(st.sampled_from(sorted(FLOATS))), "seed": draw(st.integers(0, 99))}


def resize_model(case: dict) -> onnx.ModelProto:
    """The one-node model of a `resize_cases` case (roi, scales and sizes as initializers; opset 11's required roi
    and scales empty where they are not given)."""
    values = dict(case["values"])
    if case["opset"] == 11:
        values = {"roi": np.zeros(0, np.float32), "scales": np.zeros(0, np.float32), **values}
    names = [name if name in values else "" for name in ("roi", "scales", "sizes")]
    node = n("Resize", ["x", *names], ["y"], **case["attrs"])
    rank = len(case["shape"])
    return make_model([node], [("x", case["shape"], case["elem"])], [("y", [None] * rank, case["elem"])],
                      values, opset=case["opset"])


def check_resize(case: dict) -> None:
    """taskdsl's Resize against onnxruntime's, or a refusal of fractional output sizes (see _check_whole_sizes)."""
    note(case)
    dtype = FLOATS[case["elem"]]
    x = rand(case["shape"], case["seed"], dtype)
    model = resize_model(case)
    try:
        got, want = run_both(model, {"x": x})
    except UnsupportedOnnxError as e:
        assert "fractional output sizes" in str(e)
        return
    assume(want.shape != x.shape or case["unit"])     # onnxruntime copies x when the shape stays
    if case["attrs"]["mode"] == "nearest":
        np.testing.assert_array_equal(got, want)
    else:
        assert_close(got, want, **TOLERANCES[dtype])


@PROFILE
@given(case=resize_cases(("nearest",), (1, 2, 3, 4)))
def test_resize_nearest_matches_onnxruntime(case):
    """Nearest resizing of 1-4 axes by scales or sizes (keep_aspect_ratio_policy, axes), every nearest_mode and
    coordinate mode."""
    check_resize(case)


@PROFILE
@given(case=resize_cases(("linear", "cubic"), (2, 4)))
def test_resize_linear_and_cubic_match_onnxruntime(case):
    """Bilinear and bicubic resizing (cubic_coeff_a, exclude_outside, antialias) in every coordinate mode, by scales
    or sizes."""
    check_resize(case)


@settings(max_examples=10, deadline=None)
@given(shape=st.tuples(st.sampled_from([1, 13, 31]), st.sampled_from([2, 17, 40])),
       mode=st.sampled_from(["linear", "cubic"]), out=st.tuples(st.integers(1, 6), st.integers(1, 6)),
       exclude_outside=st.sampled_from([0, 1]), seed=st.integers(0, 9))
def test_antialiased_resize_shrinking_many_times_matches_onnxruntime(shape, mode, out, exclude_outside, seed):
    """Antialias (opset 18) where an axis shrinks up to 40 times: the kernel spans up to 160 inputs."""
    x = rand((1, 2) + shape, seed)
    node = n("Resize", ["x", "", "", "sizes"], ["y"], mode=mode, antialias=1, exclude_outside=exclude_outside)
    model = make_model([node], [("x", [1, 2, *shape])], [("y", [1, 2, *out])],
                       {"sizes": np.array([1, 2, *out], np.int64)}, opset=18)
    got, want = run_both(model, {"x": x})
    assert_close(got, want)


@settings(max_examples=10, deadline=None)
@given(shape=st.lists(st.sampled_from(SIZES), min_size=3, max_size=3), scales=st.lists(
    st.sampled_from([0.5, 1.5, 2.0]), min_size=3, max_size=3), mode=st.sampled_from(["half_pixel", "align_corners"]))
def test_trilinear_resize_matches_onnxruntime(shape, scales, mode):
    """Linear resizing of three axes (a resample per axis)."""
    case = {"shape": shape, "opset": 13, "attrs": {"mode": "linear", "coordinate_transformation_mode": mode},
            "values": {"scales": np.array(scales, np.float32)}, "unit": False, "elem": TensorProto.FLOAT, "seed": 1}
    check_resize(case)


@pytest.mark.parametrize("nearest_mode, coordinates, n_in, n_out", [
    ("round_prefer_ceil", "asymmetric", 7, 2),      # 1 / f32(2/7) = 3.4999998: a tie, rounded up
    ("round_prefer_floor", "asymmetric", 7, 38),    # 19 / f32(38/7) = 3.5000002: a tie, rounded down
    ("round_prefer_ceil", "half_pixel", 14, 1),     # 6.4999995
    ("round_prefer_floor", "half_pixel", 14, 19),   # 6.5000005
    ("round_prefer_ceil", "asymmetric", 26, 28),    # 19.499998 at 21 is 1.9e-6 off a half: no tie, rounded down
])
def test_nearest_rounds_f32_near_ties_as_ties(nearest_mode, coordinates, n_in, n_out):
    """An f32 coordinate within 1e-6 of a half (the exact coordinate's tie, off by the rounding of the scale) is
    a tie, rounded the way nearest_mode prefers, as onnxruntime takes it."""
    case = {"shape": [1, n_in], "opset": 13, "values": {"sizes": np.array([1, n_out])}, "elem": TensorProto.FLOAT,
            "attrs": {"mode": "nearest", "coordinate_transformation_mode": coordinates, "nearest_mode": nearest_mode}}
    x = np.arange(n_in, dtype=np.float32).reshape(1, n_in)
    got, want = run_both(resize_model(case), {"x": x})
    np.testing.assert_array_equal(got, want)


@pytest.mark.parametrize("scales, kinds", [([1, 1, 0.5, 0.5], ["slice"]), ([1, 1, 1 / 3, 2], ["slice", "gather"]),
                                          ([1, 1, 0.25, 0.2], ["slice"])])
def test_a_nearest_shrink_by_a_whole_factor_is_one_strided_slice(scales, kinds):
    """Nearest indices that step evenly along every such axis (a shrink by 2, by 3, to one pixel) are one strided
    slice of them all, not a gather per axis (1.4x onnxruntime's time at (1, 64, 56, 56) halved); an enlarged axis
    stays a gather."""
    model = make_model([n("Resize", ["x", "", "scales"], ["y"], mode="nearest")], [("x", [1, 3, 12, 5])],
                       [("y", [None] * 4)], {"scales": np.array(scales, np.float32)}, opset=13)
    graph = tg.from_onnx(model)
    assert [op.kind for op in graph.nodes] == kinds
    x = rand([1, 3, 12, 5], 4)
    np.testing.assert_array_equal(graph(x)[0], run_onnxruntime(model, {"x": x})[0])


def test_nearest_resize_of_integers_and_opset_11_modes():
    """Nearest takes every type (a gather); tf_half_pixel_for_nn is opset 11's."""
    for elem, dtype in ((TensorProto.UINT8, np.uint8), (TensorProto.INT32, np.int32)):
        x = rand((1, 2, 3, 5), 3, dtype, 0, 200)
        model = make_model([n("Resize", ["x", "r", "s"], ["y"], coordinate_transformation_mode="tf_half_pixel_for_nn")],
                           [("x", [1, 2, 3, 5], elem)], [("y", [None] * 4, elem)],
                           {"r": np.zeros(0, np.float32), "s": np.array([1, 1, 2.5, 0.6], np.float32)}, opset=11)
        got, want = run_both(model, {"x": x})
        np.testing.assert_array_equal(got, want)


def test_resize_refusals():
    """antialias in nearest, linear integers and fractional output sizes in size-dependent coordinate modes are
    refused; scales and sizes both, or neither, are an error; scales must be constants."""
    def model(*inputs, opset=19, elem=TensorProto.FLOAT, **attrs):
        inits = {"s": np.array([1, 1, 0.6, 0.6], np.float32), "z": np.array([1, 1, 2, 2], np.int64)}
        return make_model([n("Resize", ["x", *inputs], ["y"], **attrs)], [("x", [1, 1, 4, 4], elem)],
                          [("y", [None] * 4, elem)], {k: v for k, v in inits.items() if k in inputs}, opset=opset)
    for bad, match in ((model("", "s", antialias=1), "antialias=1 with mode='nearest' is not supported"),
                       (model("", "s", mode="linear", elem=TensorProto.INT32), "'linear' on int32 tensors"),
                       (model("", "s", coordinate_transformation_mode="align_corners"), "fractional output sizes")):
        with pytest.raises(UnsupportedOnnxError, match=match):
            tg.from_onnx(bad)
    with pytest.raises(OnnxImportError, match="exactly one of scales and sizes"):
        tg.from_onnx(model("", "s", "z"))
    dynamic = make_model([n("Resize", ["x", "", "s"], ["y"])], [("x", [1, 1, 4, 4]), ("s", [4])], [("y", [None] * 4)])
    with pytest.raises(ConstantRequiredError, match="input 's' must be a constant"):
        tg.from_onnx(dynamic)


@pytest.mark.parametrize("op_type, opset", [("Upsample", 9), ("Resize", 10)])
@pytest.mark.parametrize("mode", ["nearest", "linear"])
@pytest.mark.parametrize("scales", [(1, 1, 2, 3), (1, 1, 1.5, 2.5), (1, 1, 0.6, 1.7)])
def test_resize_before_opset_11_keeps_its_semantics(op_type, opset, mode, scales):
    """Upsample (opsets 7-9) and opset-10 Resize reach the converter as the opset-13 Resize onnx.version_converter
    makes of them, which would read them with half_pixel coordinates: they keep their asymmetric ones, and
    nearest rounds down where an axis grows and up where it shrinks, as onnxruntime reads them."""
    if op_type == "Upsample" and min(scales) < 1:
        pytest.skip("Upsample's scales are at least 1")
    shape = [1, 2, 5, 4]
    out = [int(np.floor(d * s)) for d, s in zip(shape, scales)]
    model = make_model([n(op_type, ["x", "s"], ["y"], mode=mode)], [("x", shape)], [("y", out)],
                       {"s": np.array(scales, np.float32)}, opset=opset)
    x = rand(shape)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        got, want = run_both(model, {"x": x})
    assert_close(got, want)


# ---------------------------------------------------------------- ConvTranspose
@st.composite
def conv_transpose_cases(draw) -> dict:
    """A ConvTranspose node's shapes and attributes (pads only where auto_pad is NOTSET)."""
    rank = draw(st.sampled_from([1, 2, 2, 3]))
    group = draw(st.integers(1, 2))
    spatial = draw(st.lists(st.sampled_from(SIZES[:4] if rank == 3 else SIZES), min_size=rank, max_size=rank))
    kernel = draw(st.lists(st.integers(1, 3), min_size=rank, max_size=rank))
    strides = draw(st.lists(st.integers(1, 3), min_size=rank, max_size=rank))
    dilations = draw(st.lists(st.integers(1, 2), min_size=rank, max_size=rank))
    attrs = {"strides": strides, "dilations": dilations, "group": group,
             "output_padding": [draw(st.integers(0, s - 1)) for s in strides],     # (onnxruntime: < stride)
             "auto_pad": draw(st.sampled_from(["NOTSET", "NOTSET", "SAME_UPPER", "SAME_LOWER", "VALID"]))}
    full = [(m - 1) * s + (k - 1) * d + 1 + a
            for m, k, s, d, a in zip(spatial, kernel, strides, dilations, attrs["output_padding"])]
    if attrs["auto_pad"] == "NOTSET":
        attrs["pads"] = draw(st.lists(st.integers(0, 2), min_size=2 * rank, max_size=2 * rank))
        assume(all(f - b - e >= 1 for f, b, e in zip(full, attrs["pads"][:rank], attrs["pads"][rank:])))
    if draw(st.integers(0, 3)) == 0:
        attrs["output_shape"] = [draw(st.integers(max(f - 3, 1), f - a + s - 1))     # (at most stride - 1 past)
                                 for f, a, s in zip(full, attrs["output_padding"], strides)]
    channels, features = group * draw(st.integers(1, 3)), group * draw(st.integers(1, 3))
    return {"x": [draw(st.integers(1, 2)), channels, *spatial], "w": [channels, features // group, *kernel],
            "attrs": attrs, "bias": draw(st.booleans()), "weights_constant": draw(st.booleans()),
            "elem": draw(st.sampled_from(sorted(FLOATS))), "seed": draw(st.integers(0, 99))}


def conv_transpose_model(case: dict) -> tuple:
    """(the one-node model of a `conv_transpose_cases` case, its feeds): weights an initializer or an input."""
    dtype, elem, rank = FLOATS[case["elem"]], case["elem"], len(case["x"])
    values = {"x": rand(case["x"], case["seed"], dtype), "w": rand(case["w"], case["seed"] + 1, dtype, -1, 1),
              "b": rand([case["w"][1] * case["attrs"]["group"]], case["seed"] + 2, dtype)}
    names = ["x", "w", "b"] if case["bias"] else ["x", "w"]
    inits = {k: values[k] for k in names[1:]} if case["weights_constant"] else {}
    inputs = [(k, list(values[k].shape), elem) for k in names if k not in inits]
    model = make_model([n("ConvTranspose", names, ["y"], **case["attrs"])], inputs, [("y", [None] * rank, elem)],
                       inits)
    return model, {k: values[k] for k, *_ in inputs}


@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.too_slow])   # ~2 s an example
@given(case=conv_transpose_cases())
def test_conv_transpose_matches_onnxruntime(case):
    """ConvTranspose of 1-3 spatial axes: strides, pads, dilations, groups, output_padding, output_shape,
    auto_pad, bias; constant weights (transposed and flipped by folded ops) or weights given at run time."""
    note(case)
    model, feeds = conv_transpose_model(case)
    try:
        got, want = run_both(model, feeds)
    except UnsupportedOnnxError as e:     # SAME_* where the kernel is shorter than the stride
        assert "kernel shorter than the stride" in str(e)
        return
    assert_close(got, want, **TOLERANCES[FLOATS[case["elem"]]])


def test_conv_transpose_errors():
    """An output_shape a stride or more past the transposed convolution, output_padding of the stride, and
    channels W does not take are errors (onnxruntime refuses them too)."""
    def model(x_shape=(1, 2, 4), **attrs):
        return make_model([n("ConvTranspose", ["x", "w"], ["y"], **attrs)], [("x", list(x_shape))], [("y", [None] * 3)],
                          {"w": rand((2, 3, 3))})
    for bad, match in ((model(strides=[2], output_shape=[11]), "output_shape \\[11\\] needs"),
                       (model(strides=[2], output_padding=[2]), "output_padding \\(2,\\) needs"),
                       (model(x_shape=(1, 3, 4)), "do not match")):
        with pytest.raises(OnnxImportError, match=match):
            tg.from_onnx(bad)


# ---------------------------------------------------------------- a model, fused
def test_conv_transpose_relu_resize_model_fuses():
    """ConvTranspose (stride 2, bias) -> Relu -> bilinear Resize compiled with the default passes: the bias and
    the interleaving of the output phases run in the convolution's kernel (the Relu follows the crop of the pads;
    the output is below `fusion.INTERLEAVED_APART`), and the whole matches onnxruntime."""
    inits = {"w": rand((4, 3, 3, 3), 1, low=-1, high=1), "b": rand((3,), 2), "s": np.array([1, 1, 1.5, 0.5],
                                                                                             np.float32)}
    nodes = [n("ConvTranspose", ["x", "w", "b"], ["t"], strides=[2, 2], pads=[1, 1, 1, 1], output_padding=[1, 1]),
             n("Relu", ["t"], ["r"]), n("Resize", ["r", "", "s"], ["y"], mode="linear")]
    model = make_model(nodes, [("x", [1, 4, 5, 7])], [("y", [1, 3, 15, 7])], inits)
    x = rand((1, 4, 5, 7))
    graph = tg.from_onnx(model)
    compiled = graph.compile()
    fused = [op for op in compiled.graph.nodes if isinstance(op, FusedAnchor)]
    assert len(fused) == 1 and [m.kind for m in fused[0].epilogue] == ["add", "reshape", "transpose", "reshape"]
    assert_close(compiled(x)[0], run_onnxruntime(model, {"x": x})[0])


def test_a_large_conv_transposes_phases_interleave_after_its_kernel_on_the_cpu():
    """From `fusion.INTERLEAVED_APART` elements the cpu interleaves a ConvTranspose's output phases after the
    convolution's kernel, by `stdlib_ops.interleave` (an epilogue stores them one by one, each in another row); the
    bias stays in the epilogue, and the whole matches onnxruntime."""
    inits = {"w": rand((8, 6, 2, 2), 3, low=-1, high=1), "b": rand((6,), 4)}
    model = make_model([n("ConvTranspose", ["x", "w", "b"], ["y"], strides=[2, 2])], [("x", [1, 8, 37, 31])],
                       [("y", [1, 6, 74, 62])], inits)
    x = rand((1, 8, 37, 31), 5)
    compiled = tg.from_onnx(model).compile()
    assert 6 * 74 * 62 >= INTERLEAVED_APART
    fused = [op for op in compiled.graph.nodes if isinstance(op, FusedAnchor)]
    assert len(fused) == 1 and [m.kind for m in fused[0].epilogue] == ["add", "reshape"]
    assert_close(compiled(x)[0], run_onnxruntime(model, {"x": x})[0])
    assert [k.name for k in compiled.kernels if "interleave" in k.name] == ["interleave_2"]
