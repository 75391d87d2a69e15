"""ONNX LpNormalization, LpPool and GlobalLpPool against onnxruntime: hypothesis-drawn shapes (size-1 and prime
axes), axes, p, rows of zeros; LpPool's windows with strides, explicit pads or auto_pad, dilations and ceil_mode
(opset 18) or opset 11's attributes, f16 computed in f32; refusals.
Every kernel the tests launch is also compiled for CUDA by NVRTC (tests/conftest.py)."""
import numpy as np
import pytest
from hypothesis import assume, given, note, settings
from hypothesis import strategies as st
from onnx import TensorProto, helper

import taskdsl.graph as tg
from taskdsl.graph.onnx_import import OnnxImportError, UnsupportedOnnxError

from . import assert_close, make_model, rand, run_onnxruntime

pytest.importorskip("onnxruntime")

SIZES = st.sampled_from([1, 2, 3, 5, 7])
F16 = TensorProto.FLOAT16


def check(model, feeds: dict, rtol: float = 1e-5) -> None:
    """taskdsl's output matches onnxruntime's, dtype and shape included."""
    got = tg.from_onnx(model).compile()(feeds)[0]
    assert_close(got, run_onnxruntime(model, feeds)[0], rtol=rtol)


@settings(max_examples=4, deadline=None)
@given(data=st.data(), shape=st.lists(SIZES, min_size=1, max_size=3), p=st.sampled_from([1, 2]),
       seed=st.integers(0, 99))
def test_lp_normalization_matches_onnxruntime(data, shape, p, seed):
    """x / its L1 or L2 norm along an axis; a line of zeros along it (norm 0) gives zeros."""
    axis = data.draw(st.integers(-len(shape), len(shape) - 1), label="axis")
    x = rand(shape, seed)
    if len(shape) > 1:
        x[tuple(slice(None) if a == axis % len(shape) else 0 for a in range(len(shape)))] = 0
    note(f"x = {x!r}")
    node = helper.make_node("LpNormalization", ["x"], ["y"], axis=axis, p=p)
    check(make_model([node], [("x", shape)], [("y", shape)]), {"x": x})


@st.composite
def windows(draw, opset: int):
    """(input shape, LpPool attributes) of a window that fits: 2 x 3 channels of 1 or 2 spatial axes, explicit
    pads below the kernel (onnxruntime's bound) or an auto_pad, and from opset 18 ceil_mode and dilations. SAME
    padding goes without dilations and with strides up to the kernel: onnxruntime computes its pads for the
    undilated window (against the output size the operator defines), and pads a window shorter than the stride
    by a negative amount (its MaxPool and AveragePool refuse that; taskdsl pads by 0)."""
    rank = draw(st.integers(1, 2), label="spatial axes")
    spatial = draw(st.lists(SIZES, min_size=rank, max_size=rank), label="spatial")
    kernel = draw(st.lists(st.integers(1, 3), min_size=rank, max_size=rank), label="kernel")
    auto_pad = draw(st.sampled_from(["NOTSET", "VALID", "SAME_UPPER", "SAME_LOWER"]), label="auto_pad")
    same = auto_pad.startswith("SAME")
    attrs = {"kernel_shape": kernel, "strides": [draw(st.integers(1, k if same else 3)) for k in kernel],
             "p": draw(st.sampled_from([1, 2, 3]), label="p")}
    pads, dilations = [0] * 2 * rank, [1] * rank
    if opset >= 18:
        attrs["ceil_mode"] = draw(st.integers(0, 1), label="ceil_mode")
        if not same:
            dilations = attrs["dilations"] = draw(st.lists(st.integers(1, 2), min_size=rank, max_size=rank))
    if auto_pad == "NOTSET":
        pads = attrs["pads"] = [draw(st.integers(0, k - 1)) for k in kernel * 2]
    else:
        attrs["auto_pad"] = auto_pad
    assume(same or all(n + pads[i] + pads[rank + i] >= (k - 1) * d + 1
                       for i, (n, k, d) in enumerate(zip(spatial, kernel, dilations))))
    return [2, 3] + spatial, attrs


@settings(max_examples=8, deadline=None)
@given(data=st.data(), opset=st.sampled_from([11, 18]), seed=st.integers(0, 99))
def test_lp_pool_matches_onnxruntime(data, opset, seed):
    """(sum over each window of |x|^p)^(1/p), the padding adding nothing."""
    shape, attrs = data.draw(windows(opset), label="window")
    x = rand(shape, seed)
    note(f"x = {x!r}")
    node = helper.make_node("LpPool", ["x"], ["y"], **attrs)
    check(make_model([node], [("x", shape)], [("y", [None] * len(shape))], opset=opset), {"x": x})


def test_lp_pool_f16_in_f32():
    """16-bit floats computed in f32 and rounded once: within an f16 unit of onnxruntime's."""
    x = rand((2, 3, 7, 5), 1, np.float16)
    node = helper.make_node("LpPool", ["x"], ["y"], kernel_shape=[3, 2], pads=[1, 1, 1, 1], p=3)
    model = make_model([node], [("x", x.shape, F16)], [("y", [None] * 4, F16)], opset=18)
    check(model, {"x": x}, rtol=2e-3)


@settings(max_examples=6, deadline=None)
@given(shape=st.lists(SIZES, min_size=3, max_size=5), p=st.sampled_from([1, 2, 3]), f16=st.booleans(),
       seed=st.integers(0, 99))
def test_global_lp_pool_matches_onnxruntime(shape, p, f16, seed):
    """(sum over every spatial position of |x|^p)^(1/p), 1-3 spatial axes; 16-bit floats computed in f32."""
    x = rand(shape, seed, np.float16 if f16 else np.float32)
    node = helper.make_node("GlobalLpPool", ["x"], ["y"], p=p)
    elem = F16 if f16 else TensorProto.FLOAT
    model = make_model([node], [("x", shape, elem)], [("y", shape[:2] + [1] * (len(shape) - 2), elem)], opset=18)
    check(model, {"x": x}, rtol=2e-3 if f16 else 1e-5)


def test_refusals():
    """LpNormalization's p other than 1 and 2, LpPool's p below 1, and pads with an auto_pad are clear errors."""
    def model(op_type, opset=18, **attrs):
        return make_model([helper.make_node(op_type, ["x"], ["y"], **attrs)], [("x", [1, 2, 5])],
                          [("y", [None] * 3)], opset=opset)
    with pytest.raises(OnnxImportError, match="p=3 is not defined: the operator takes p=1 or p=2"):
        tg.from_onnx(model("LpNormalization", p=3))
    with pytest.raises(UnsupportedOnnxError, match=r"p=0 is not supported \(a p-norm with an integer p >= 1\)"):
        tg.from_onnx(model("LpPool", kernel_shape=[2], p=0))
    with pytest.raises(OnnxImportError, match="pads .* and auto_pad='VALID' are both given"):
        tg.from_onnx(model("LpPool", kernel_shape=[2], pads=[1, 1], auto_pad="VALID"))
