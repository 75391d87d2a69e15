"""ONNX OneHot and Hardmax against onnxruntime: hypothesis-drawn shapes (size-1 and prime axes), axes, depths,
index and value types, negative and out-of-range indices; ties and the opset-11 flattened Hardmax; refusals.
Every kernel the tests launch is also compiled for CUDA by NVRTC (tests/conftest.py)."""
import numpy as np
import pytest
from hypothesis import given, note, settings
from hypothesis import strategies as st
from onnx import TensorProto, helper

import taskdsl.graph as tg
from taskdsl.graph.onnx_import import OnnxImportError

from . import make_model, run_onnxruntime

pytest.importorskip("onnxruntime")

SHAPES = st.lists(st.sampled_from([1, 2, 3, 5, 7]), min_size=1, max_size=3)
NUMPY = {TensorProto.INT64: np.int64, TensorProto.INT32: np.int32, TensorProto.FLOAT: np.float32}
I64, I32, F32 = TensorProto.INT64, TensorProto.INT32, TensorProto.FLOAT
# (indices, values, depth) types onnxruntime has a OneHot kernel for
ONNXRUNTIME_TYPES = [(I64, I64, I64), (I64, I32, F32), (I64, F32, I64), (I64, F32, I32), (I64, F32, F32),
                     (I32, F32, I32), (I32, F32, F32), (F32, I64, I64), (F32, F32, F32)]


def check(model, feeds: dict) -> None:
    """taskdsl's output equals onnxruntime's, dtype and shape included."""
    got = tg.from_onnx(model).compile()(feeds)[0]
    want = run_onnxruntime(model, feeds)[0]
    assert got.dtype == want.dtype and got.shape == want.shape
    np.testing.assert_array_equal(got, want)


@settings(max_examples=10, deadline=None)
@given(data=st.data(), shape=SHAPES, depth=st.sampled_from([1, 2, 5, 7]), types=st.sampled_from(ONNXRUNTIME_TYPES),
       seed=st.integers(0, 99))
def test_one_hot_matches_onnxruntime(data, shape, depth, types, seed):
    """Indices from -depth - 1 to depth (negative ones count from the end, those past either end are all off);
    float indices truncate."""
    axis = data.draw(st.integers(-len(shape) - 1, len(shape)), label="axis")
    index_elem, value_elem, depth_elem = types
    rng = np.random.default_rng(seed)
    indices = rng.integers(-depth - 1, depth + 1, shape).astype(NUMPY[index_elem])
    if index_elem == TensorProto.FLOAT:
        indices = indices + np.float32(0.25) * np.sign(indices)     # truncated toward zero: the same index
    note(f"indices = {indices!r}")
    values = np.array([-3, 9], NUMPY[value_elem])
    node = helper.make_node("OneHot", ["indices", "depth", "values"], ["y"], axis=axis)
    model = make_model([node], [("indices", shape, index_elem)], [("y", [None] * (len(shape) + 1), value_elem)],
                       {"depth": np.array(depth, NUMPY[depth_elem]), "values": values}, opset=11)
    check(model, {"indices": indices})


@settings(max_examples=10, deadline=None)
@given(data=st.data(), shape=SHAPES, opset=st.sampled_from([11, 13]), seed=st.integers(0, 99))
def test_hardmax_matches_onnxruntime(data, shape, opset, seed):
    """1 at the first largest element (few distinct values: ties), along an axis (opset 13) or over the axes
    from it on (opset 11)."""
    axis = data.draw(st.integers(-len(shape), len(shape) - 1), label="axis")
    x = np.random.default_rng(seed).integers(-2, 3, shape).astype(np.float32)
    note(f"x = {x!r}")
    model = make_model([helper.make_node("Hardmax", ["x"], ["y"], axis=axis)], [("x", shape)], [("y", shape)],
                       opset=opset)
    check(model, {"x": x})


def test_one_hot_refusals():
    """A depth below 1 or of several values, and values not of two elements, are clear errors."""
    def model(depth, values=np.array([0, 1], np.float32)):
        node = helper.make_node("OneHot", ["i", "d", "v"], ["y"])
        return make_model([node], [("i", [3], TensorProto.INT64)], [("y", [None, None])],
                          {"d": np.asarray(depth, np.int64), "v": values}, opset=11)
    for bad, match in ((model(0), "depth must be at least 1, got 0"), (model([2, 3]), "depth must be one number"),
                       (model(3, np.zeros(3, np.float32)), r"values must be \[off_value, on_value\]")):
        with pytest.raises(OnnxImportError, match=match):
            tg.from_onnx(bad)
