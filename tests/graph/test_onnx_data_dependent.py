"""ONNX NonZero, Unique and Compress against onnxruntime: the values that fix their output shapes are given at
import (`from_onnx(constants=...)`) and fed to onnxruntime as inputs. Hypothesis draws shapes (size 1, primes,
empty axes, scalars), dtypes, densities and axes; refusals name what to do.
Every kernel the tests launch is also compiled for CUDA by NVRTC (tests/conftest.py)."""
import numpy as np
import pytest
from hypothesis import given, note, settings
from hypothesis import strategies as st
from onnx import TensorProto, helper

import taskdsl.graph as tg
from taskdsl.graph.onnx_import import ConstantRequiredError, OnnxImportError, UnsupportedOnnxError

from . import make_model, rand, run_onnxruntime

pytest.importorskip("onnxruntime")

SIZES = st.sampled_from([0, 1, 2, 3, 5, 7])
NONEMPTY = st.sampled_from([1, 2, 3, 5, 7])
TYPES = {np.float32: TensorProto.FLOAT, np.int32: TensorProto.INT32, np.bool_: TensorProto.BOOL,
         np.float16: TensorProto.FLOAT16, np.int64: TensorProto.INT64}


def sparse(shape, seed: int, dtype, density: float) -> np.ndarray:
    """Values of `dtype` that are zero but for about `density` of the elements (small integers: many repeats)."""
    rng = np.random.default_rng(seed)
    values = rng.integers(-3, 4, size=shape) * (rng.random(shape) < density)
    return np.asarray(values, dtype)


def outputs(model, feeds: dict, constants: dict) -> tuple:
    """(taskdsl's outputs with `constants` fixed at import, onnxruntime's)."""
    graph = tg.from_onnx(model, constants=constants)
    got = graph.compile()({t.name: feeds[t.name] for t in graph.inputs})
    return got, run_onnxruntime(model, {**feeds, **constants})


def assert_same(got: list, want: list) -> None:
    assert len(got) == len(want)
    for g, w in zip(got, want):
        assert g.dtype == w.dtype and g.shape == w.shape, (g.dtype, g.shape, w.dtype, w.shape)
        np.testing.assert_array_equal(g, w)


@settings(max_examples=8, deadline=None)
@given(shape=st.lists(SIZES, max_size=3), dtype=st.sampled_from(list(TYPES)), density=st.sampled_from([0, 0.3, 1]),
       seed=st.integers(0, 99))
def test_nonzero_of_a_constant_matches_onnxruntime(shape, dtype, density, seed):
    """NonZero of a constant (a scalar and empty tensors too) is its (rank, count) index matrix; the masked
    elements of a data input are then a GatherND by its transpose, a kernel of the graph."""
    mask = sparse(shape, seed, dtype, density)
    data = rand(mask.shape, seed)
    note(f"mask = {mask!r}")
    nodes = [helper.make_node("NonZero", ["m"], ["nz"]), helper.make_node("Transpose", ["nz"], ["ix"]),
             helper.make_node("GatherND", ["x", "ix"], ["y"])]
    if not shape:       # GatherND takes no scalar data
        nodes = nodes[:1]
    model = make_model(nodes, [("m", list(mask.shape), TYPES[dtype]), ("x", list(mask.shape))],
                       [("nz", [None, None], TensorProto.INT64)] + ([("y", [None])] if shape else []), opset=13)
    assert_same(*outputs(model, {"x": data}, {"m": mask}))


@settings(max_examples=10, deadline=None)
@given(data=st.data(), shape=st.lists(NONEMPTY, min_size=1, max_size=3), dtype=st.sampled_from([np.float32, np.int64]),
       is_sorted=st.booleans(), seed=st.integers(0, 99))
def test_unique_of_a_constant_matches_onnxruntime(data, shape, dtype, is_sorted, seed):
    """Unique's four outputs, flattened or along an axis (negative ones too), sorted or in order of first
    occurrence, on values with many repeats (whole repeated slices along the axis included)."""
    x = sparse(shape, seed, dtype, 0.5)
    axis = data.draw(st.none() | st.integers(-len(shape), len(shape) - 1), label="axis")
    if axis is not None and data.draw(st.booleans(), label="repeat slices"):
        x = np.concatenate([x, x], axis=axis)
    note(f"x = {x!r}")
    attrs = {"sorted": int(is_sorted)} | ({} if axis is None else {"axis": axis})
    node = helper.make_node("Unique", ["x"], ["y", "first", "inverse", "counts"], **attrs)
    model = make_model([node], [("x", list(x.shape), TYPES[dtype])],
                       [("y", [None] * (1 if axis is None else x.ndim), TYPES[dtype])] +
                       [(name, [None], TensorProto.INT64) for name in ("first", "inverse", "counts")], opset=11)
    assert_same(*outputs(model, {}, {"x": x}))


def test_unique_takes_signed_zeros_as_one_value_and_refuses_nan():
    """-0.0 and 0.0 are one value, flattened or as slices (numpy compares slices by their bytes); NaN is refused."""
    x = np.array([[0.0, 1.0], [-0.0, 1.0], [2.0, -0.0]], np.float32)
    for attrs in ({}, {"axis": 0}):
        node = helper.make_node("Unique", ["x"], ["y", "first", "inverse", "counts"], **attrs)
        model = make_model([node], [("x", [3, 2])], [("y", [None] * (2 if attrs else 1))] +
                           [(name, [None], TensorProto.INT64) for name in ("first", "inverse", "counts")], opset=11)
        got, want = outputs(model, {}, {"x": x})
        assert_same(got, want)
        assert len(got[0]) == (3 if not attrs else 2)
    with pytest.raises(UnsupportedOnnxError, match="NaN"):
        tg.from_onnx(model, constants={"x": np.array([[np.nan, 1]] * 3, np.float32)})


@settings(max_examples=10, deadline=None)
@given(data=st.data(), shape=st.lists(SIZES, min_size=1, max_size=3), seed=st.integers(0, 99))
def test_compress_by_a_constant_condition_matches_onnxruntime(data, shape, seed):
    """Compress along an axis (negative ones too) or of the flattened data, by a condition that selects nothing,
    one run (a slice), or scattered entries, shorter than the axis or longer with false entries past it."""
    x = rand(shape, seed)
    axis = data.draw(st.none() | st.integers(-len(shape), len(shape) - 1), label="axis")
    n = x.size if axis is None else shape[axis]
    length = data.draw(st.integers(0, n + 2), label="condition length")
    kind = data.draw(st.sampled_from(["random", "run", "none"]), label="selection")
    condition = np.zeros(length, np.bool_)
    if kind == "random":
        condition[:n] = np.random.default_rng(seed).random(min(length, n)) < 0.5
    elif kind == "run" and min(length, n):
        start = data.draw(st.integers(0, min(length, n) - 1), label="run start")
        condition[start:data.draw(st.integers(start + 1, min(length, n)), label="run end")] = True
    note(f"condition = {condition!r}")
    node = helper.make_node("Compress", ["x", "c"], ["y"], **({} if axis is None else {"axis": axis}))
    model = make_model([node], [("x", shape), ("c", [length], TensorProto.BOOL)],
                       [("y", [None] * (1 if axis is None else len(shape)))], opset=11)
    assert_same(*outputs(model, {"x": x}, {"c": condition}))


def test_refusals_say_what_to_do():
    """A NonZero of a graph input asks for its value at import; a condition that selects past the axis, or is not
    1-D, is an import error naming the node."""
    model = make_model([helper.make_node("NonZero", ["m"], ["y"], name="nz")], [("m", [4])],
                       [("y", [None, None], TensorProto.INT64)], opset=13)
    with pytest.raises(ConstantRequiredError, match=r"node 'nz' \(NonZero\).*constants=\{'m'"):
        tg.from_onnx(model)
    for condition, match in ((np.array([0, 0, 0, 1], np.bool_), "selects index 3, past the 3 entries"),
                             (np.ones((1, 2), np.bool_), "must be 1-D")):
        node = helper.make_node("Compress", ["x", "c"], ["y"], axis=1, name="pick")
        model = make_model([node], [("x", [2, 3]), ("c", list(condition.shape), TensorProto.BOOL)],
                           [("y", [None, None])], opset=11)
        with pytest.raises(OnnxImportError, match=rf"node 'pick' \(Compress\): .*{match}"):
            tg.from_onnx(model, constants={"c": condition})
