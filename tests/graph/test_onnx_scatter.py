"""ONNX ScatterElements and ScatterND against onnxruntime: hypothesis-drawn shapes (size-1 and prime axes), axes,
index tuples of every length, negative and duplicate indices, every reduction (none, add, mul from opset 16, max
and min from 18), element types (f16 against onnxruntime's f32 on the same values); the refusals. Every kernel
the tests launch is also compiled for CUDA by NVRTC (tests/conftest.py)."""
import numpy as np
import pytest
from hypothesis import given, note, settings
from hypothesis import strategies as st
from onnx import TensorProto, helper

import taskdsl.graph as tg
from taskdsl.graph import ops
from taskdsl.graph.onnx_import import OnnxImportError

from . import make_model, run_onnxruntime

pytest.importorskip("onnxruntime")

TYPES = {TensorProto.FLOAT: np.float32, TensorProto.FLOAT16: np.float16, TensorProto.INT32: np.int32,
         TensorProto.INT64: np.int64}
SIZES = st.sampled_from([1, 2, 3, 5, 7])
REDUCTIONS = st.sampled_from(["none", "add", "mul", "max", "min"])


def check(op_type: str, data: np.ndarray, indices: np.ndarray, updates: np.ndarray, elem: int, **attrs) -> None:
    """taskdsl's scatter equals onnxruntime's (opset 18; a 16-bit one against onnxruntime's f32 scatter of the same,
    exactly representable, values)."""
    def model(elem_type):
        node = helper.make_node(op_type, ["data", "indices", "updates"], ["y"], **attrs)
        return make_model([node], [("data", list(data.shape), elem_type), ("indices", list(indices.shape),
                                   TensorProto.INT64), ("updates", list(updates.shape), elem_type)],
                          [("y", list(data.shape), elem_type)], opset=18)
    feeds = {"data": data, "indices": indices, "updates": updates}
    got = tg.from_onnx(model(elem)).compile()(feeds)[0]
    if elem == TensorProto.FLOAT16:
        wide = {k: v.astype(np.float32) if v.dtype == np.float16 else v for k, v in feeds.items()}
        want = run_onnxruntime(model(TensorProto.FLOAT), wide)[0].astype(np.float16)
    else:
        want = run_onnxruntime(model(elem), feeds)[0]
    assert got.dtype == want.dtype and got.shape == want.shape
    np.testing.assert_array_equal(got, want)


def small_values(rng, shape, elem: int) -> np.ndarray:
    """Small integers (sums and products stay exact in every type)."""
    return rng.integers(-3, 4, shape).astype(TYPES[elem])


@settings(max_examples=10, deadline=None)
@given(data=st.data(), shape=st.lists(SIZES, min_size=1, max_size=3), elem=st.sampled_from(sorted(TYPES)),
       reduction=REDUCTIONS, seed=st.integers(0, 99))
def test_scatter_elements_matches_onnxruntime(data, shape, elem, reduction, seed):
    """Indices no longer than data on each axis, duplicates along the axis (the last wins, or all combine)."""
    axis = data.draw(st.integers(-len(shape), len(shape) - 1), label="axis")
    index_shape = [data.draw(st.integers(1, n), label=f"indices' axis {a}") for a, n in enumerate(shape)]
    rng = np.random.default_rng(seed)
    n = shape[axis]
    indices = rng.integers(-n, n, index_shape).astype(np.int64)
    note(f"indices = {indices!r}")
    check("ScatterElements", small_values(rng, shape, elem), indices, small_values(rng, index_shape, elem), elem,
          axis=axis, reduction=reduction)


@settings(max_examples=10, deadline=None)
@given(data=st.data(), shape=st.lists(SIZES, min_size=1, max_size=3), elem=st.sampled_from(sorted(TYPES)),
       reduction=REDUCTIONS, batch=st.lists(st.sampled_from([1, 2, 3]), min_size=0, max_size=2),
       seed=st.integers(0, 99))
def test_scatter_nd_matches_onnxruntime(data, shape, elem, reduction, batch, seed):
    """Index tuples of every length (elements to whole slices), batches of them, duplicates."""
    q = data.draw(st.integers(1, len(shape)), label="q")
    rng = np.random.default_rng(seed)
    indices = np.stack([rng.integers(-n, n, batch) for n in shape[:q]], axis=-1).astype(np.int64)
    note(f"indices = {indices!r}")
    updates = small_values(rng, batch + shape[q:], elem)
    check("ScatterND", small_values(rng, shape, elem), indices, updates, elem, reduction=reduction)


def test_no_updates_leave_data_as_it_is():
    """Empty indices and updates scatter nothing (and no kernel reads an update that is not there)."""
    x = np.arange(12, dtype=np.float32).reshape(4, 3)
    graph = tg.trace(lambda d: [ops.scatter_nd(d, np.zeros((0, 1), np.int64), np.zeros((0, 3), np.float32)),
                                ops.scatter_elements(d, np.zeros((0, 3), np.int64), np.zeros((0, 3), np.float32))],
                     tg.input("d", (4, 3)))
    for got in graph.compile()({"d": x}):
        np.testing.assert_array_equal(got, x)


def test_scatter_refusals():
    """Reductions before their opsets, an unknown one, mismatched shapes and types are clear errors."""
    def model(op_type, opset, **attrs):
        node = helper.make_node(op_type, ["d", "i", "u"], ["y"], **attrs)
        return make_model([node], [("d", [4]), ("i", [2], TensorProto.INT64), ("u", [2])], [("y", [4])], opset=opset)
    with pytest.raises(OnnxImportError, match="reduction 'max' is opset 18's, the model's opset is 16"):
        tg.from_onnx(model("ScatterElements", 16, reduction="max"))
    with pytest.raises(OnnxImportError, match="reduction 'min' is opset 18's, the model's opset is 17"):
        tg.from_onnx(model("ScatterND", 17, reduction="min"))
    with pytest.raises(ValueError, match="reduction must be one of none, add, mul, max, min, got 'sum'"):
        ops.scatter_elements(tg.input("d", (4,)), np.zeros(2, np.int64), tg.input("u", (2,)), reduction="sum")
    with pytest.raises(ValueError, match=r"updates must have shape \(2,\), got \(3,\)"):
        ops.scatter_nd(tg.input("d", (4,)), np.zeros((2, 1), np.int64), tg.input("u", (3,)))
    with pytest.raises(TypeError, match="indices must be integers"):
        ops.scatter_elements(tg.input("d", (4,)), np.zeros(2, np.float32), tg.input("u", (2,)))
    with pytest.raises(TypeError, match="updates must have data's dtype f32, got f16"):
        ops.scatter_elements(tg.input("d", (4,)), np.zeros(2, np.int64), tg.input("u", (2,), "float16"))
