"""ONNX ScatterElements and ScatterND against onnxruntime: hypothesis-drawn shapes (size-1 and prime axes), axes,
index tuples of every length, negative and duplicate indices, every reduction (none, add, mul from opset 16, max
and min from 18), element types (f16 against onnxruntime's f32 on the same values); the refusals. TensorScatter
(a KV cache's update) against onnxruntime: both modes, any sequence axis, per-batch write indices (wrapping ones in
mode 'circular'), without them, and the indices onnxruntime refuses. Every kernel the tests launch is also compiled
for CUDA by NVRTC (tests/conftest.py)."""
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


UFUNCS = {"add": np.add, "mul": np.multiply, "max": np.maximum, "min": np.minimum}


def scattered_in_order(x: np.ndarray, pairs: np.ndarray, updates: np.ndarray, reduction: str) -> np.ndarray:
    """numpy's ScatterND applying the updates one after the other (ufunc.at is unbuffered; 'none': the last wins)."""
    y, index = x.copy(), tuple(pairs.T)
    if reduction != "none":
        UFUNCS[reduction].at(y, index, updates)
        return y
    for u, slot in enumerate(zip(*index)):
        y[slot] = updates[u]
    return y


@settings(max_examples=8, deadline=None)
@given(rows=st.sampled_from([1, 3, 64]), n=st.sampled_from([1, 97, 1024]), per_row=st.sampled_from([1, 13, 1000]),
       elem=st.sampled_from([TensorProto.FLOAT, TensorProto.DOUBLE, TensorProto.INT64]), reduction=REDUCTIONS,
       seed=st.integers(0, 99))
def test_many_updates_apply_in_order(rows, n, per_row, elem, reduction, seed):
    """Thousands of updates of random values with duplicates, applied in order, so that floats agree bit for bit:
    ScatterElements along rows of n and along the first axis against onnxruntime; ScatterND of the same as (row,
    index) pairs and as whole rows against numpy applying them in order (onnxruntime writes a large ScatterND's
    updates in parallel: its duplicates race, and sums lose terms)."""
    rng = np.random.default_rng(seed)
    dtype = TYPES.get(elem, np.float64)

    def draw(shape):
        return rng.integers(-50, 50, shape).astype(dtype) if dtype == np.int64 else \
            rng.standard_normal(shape).astype(dtype)

    x = draw((rows, n))
    indices = rng.integers(-n, n, (rows, per_row)).astype(np.int64)
    updates = draw((rows, per_row))
    check("ScatterElements", x, indices, updates, elem, axis=1, reduction=reduction)
    check("ScatterElements", x.T.copy(), indices.T.copy(), updates.T.copy(), elem, axis=0, reduction=reduction)
    pairs = np.stack([np.repeat(np.arange(rows), per_row), indices.reshape(-1)], axis=1)
    whole_rows = rng.integers(-rows, rows, (per_row, 1)).astype(np.int64)
    row_updates = draw((per_row, n))
    for where, values in ((pairs, updates.reshape(-1)), (whole_rows, row_updates)):
        d = tg.input("d", x.shape, dtype)
        graph = tg.Graph([d], [ops.scatter_nd(d, tg.constant(where), tg.constant(values), reduction)])
        np.testing.assert_array_equal(graph.compile()(x)[0], scattered_in_order(x, where, values, reduction))


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


def test_scatters_refuse_indices_onnxruntime_refuses():
    """An index outside [-n, n) is an IndexError at run time, as onnxruntime's is an error (its update was dropped:
    no output element found it), and refused at import as a constant; [-n, n) itself scatters as onnxruntime does."""
    data = np.zeros((3, 5), np.float32)

    def model(op_type, index_shape, update_shape, constants=None, **attrs):
        node = helper.make_node(op_type, ["d", "i", "u"], ["y"], **attrs)
        inputs = [("d", [3, 5])] + [("i", index_shape, TensorProto.INT64)] * (constants is None) + [("u", update_shape)]
        return make_model([node], inputs, [("y", [3, 5])], constants, opset=18)

    elements = tg.from_onnx(model("ScatterElements", [1, 2], [1, 2], axis=1)).compile()
    updates = np.array([[1.0, 2.0]], np.float32)
    for bad in (5, -6):
        with pytest.raises(IndexError, match=f"scatter_elements: index {bad} is out of range for axis 1 of size 5"):
            elements({"d": data, "i": np.array([[bad, 1]], np.int64), "u": updates})
    check("ScatterElements", data, np.array([[-5, 4]], np.int64), updates, TensorProto.FLOAT, axis=1)
    nd = tg.from_onnx(model("ScatterND", [2, 2], [2])).compile()
    with pytest.raises(IndexError, match="scatter_nd: index 3 is out of range for axis 0 of size 3"):
        nd({"d": data, "i": np.array([[0, 1], [3, 0]], np.int64), "u": np.ones(2, np.float32)})
    with pytest.raises(IndexError, match="scatter_nd: index -6 is out of range for axis 1 of size 5"):
        nd({"d": data, "i": np.array([[0, -6]], np.int64).repeat(2, 0), "u": np.ones(2, np.float32)})
    with pytest.raises(OnnxImportError, match="scatter_elements: index 7 is out of range for axis 1 of size 5"):
        tg.from_onnx(model("ScatterElements", [1, 2], [1, 2], {"i": np.array([[7, 1]], np.int64)}, axis=1))


def tensor_scatter_model(cache: list, steps: int, axis: int, mode: str, elem: int, starts: bool = True):
    """A TensorScatter model (opset 24): past_cache of shape `cache`, an update of `steps` along `axis`."""
    update = list(cache)
    update[axis] = steps
    node = helper.make_node("TensorScatter", ["past", "update"] + ["w"] * starts, ["present"], axis=axis, mode=mode)
    inputs = [("past", cache, elem), ("update", update, elem)] + [("w", cache[:1], TensorProto.INT64)] * starts
    return make_model([node], inputs, [("present", cache, elem)], opset=24)


@settings(max_examples=8, deadline=None)
@given(data=st.data(), cache=st.lists(SIZES, min_size=2, max_size=4), mode=st.sampled_from(["linear", "circular"]),
       elem=st.sampled_from([TensorProto.FLOAT, TensorProto.FLOAT16, TensorProto.INT64]), starts=st.booleans(),
       seed=st.integers(0, 99))
def test_tensor_scatter_matches_onnxruntime(data, cache, mode, elem, starts, seed):
    """The update's steps land from each batch's write index on (wrapping in mode 'circular', where the index may
    exceed the cache's length), or from step 0 without write indices."""
    axis = data.draw(st.integers(1, len(cache) - 1), label="axis")
    if data.draw(st.booleans(), label="axis from the end"):
        axis -= len(cache)
    length = cache[axis]
    steps = data.draw(st.integers(1, length), label="steps")
    last = length - steps if mode == "linear" else 3 * length
    rng = np.random.default_rng(seed)
    model = tensor_scatter_model(cache, steps, axis, mode, elem, starts)
    feeds = {"past": small_values(rng, cache, elem),
             "update": small_values(rng, [steps if a == axis % len(cache) else n for a, n in enumerate(cache)], elem)}
    if starts:
        feeds["w"] = rng.integers(0, last + 1, cache[:1]).astype(np.int64)
        note(f"write indices = {feeds['w']!r}")
    got = tg.from_onnx(model).compile()(feeds)[0]
    want = run_onnxruntime(model, feeds)[0]
    assert got.dtype == want.dtype and got.shape == want.shape
    np.testing.assert_array_equal(got, want)


def test_tensor_scatter_refuses_write_indices_onnxruntime_refuses():
    """A negative write index, or in mode 'linear' one whose steps run past the cache, is an IndexError at run
    time as onnxruntime's is an error; as a constant, it is refused at import."""
    compiled = tg.from_onnx(tensor_scatter_model([2, 5, 3], 2, 1, "linear", TensorProto.FLOAT)).compile()
    feeds = {"past": np.zeros((2, 5, 3), np.float32), "update": np.ones((2, 2, 3), np.float32)}
    with pytest.raises(IndexError, match="write index 4 of batch 1 and the update's 2 steps run past the cache's "
                                         "length 5 along axis 1; mode 'circular' wraps them"):
        compiled({**feeds, "w": np.array([3, 4], np.int64)})
    with pytest.raises(IndexError, match="write index -1 of batch 0 is negative"):
        compiled({**feeds, "w": np.array([-1, 0], np.int64)})
    model = tensor_scatter_model([2, 5, 3], 2, 1, "circular", TensorProto.FLOAT)
    with pytest.raises(OnnxImportError, match="write index -2 of batch 1 is negative"):
        tg.from_onnx(model, constants={"w": np.array([0, -2], np.int64)})
    with pytest.raises(OnnxImportError, match="axis 0 of the cache .* is its batch axis"):
        tg.from_onnx(tensor_scatter_model([2, 5, 3], 2, 0, "linear", TensorProto.FLOAT))


def test_tensor_scatter_of_no_steps_is_the_cache():
    """An update of no steps leaves the cache as it is (and no kernel reads a step that is not there)."""
    x = np.arange(12, dtype=np.float32).reshape(2, 6)
    graph = tg.trace(lambda c: ops.tensor_scatter(c, np.zeros((2, 0), np.float32), np.array([3, 1]), axis=1),
                     tg.input("c", (2, 6)))
    np.testing.assert_array_equal(graph.compile()({"c": x})[0], x)
