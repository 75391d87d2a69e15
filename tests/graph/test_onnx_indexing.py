"""ONNX GatherND, EyeLike, ReverseSequence and CenterCropPad against onnxruntime: hypothesis-drawn shapes
(size-1 and prime axes), batch_dims, negative indices, diagonals and dtypes, batch and time axes, crops and pads
along chosen axes; indices out of range at run time and at import; refusals.
Every kernel the tests launch is also compiled for CUDA by NVRTC (tests/conftest.py)."""
import numpy as np
import pytest
from hypothesis import given, note, settings
from hypothesis import strategies as st
from onnx import TensorProto, helper

import taskdsl.graph as tg
from taskdsl.graph.onnx_import import OnnxImportError, UnsupportedOnnxError

from . import make_model, rand, run_onnxruntime

pytest.importorskip("onnxruntime")

SIZES = st.sampled_from([1, 2, 3, 5, 7])
I64 = TensorProto.INT64
# the EyeLike output types onnxruntime has a kernel for
EYE_TYPES = {TensorProto.FLOAT: np.float32, TensorProto.DOUBLE: np.float64, TensorProto.INT32: np.int32,
             TensorProto.INT64: np.int64, TensorProto.UINT64: np.uint64}


def check(model, feeds: dict) -> None:
    """taskdsl's output equals onnxruntime's, dtype and shape included."""
    graph = tg.from_onnx(model)
    got = graph.compile()({t.name: feeds[t.name] for t in graph.inputs})[0]
    want = run_onnxruntime(model, feeds)[0]
    assert got.dtype == want.dtype and got.shape == want.shape, (got.dtype, got.shape, want.dtype, want.shape)
    np.testing.assert_array_equal(got, want)


@settings(max_examples=6, deadline=None)
@given(data=st.data(), batch=st.lists(SIZES, max_size=2), shape=st.lists(SIZES, min_size=1, max_size=3),
       seed=st.integers(0, 99))
def test_gather_nd_matches_onnxruntime(data, batch, shape, seed):
    """Index tuples of 1 to all the axes after the batch axes, each index from -n to n - 1 (negative ones count
    from the end), indices of any rank; data and indices graph inputs."""
    m = data.draw(st.integers(1, len(shape)), label="index length")
    middle = data.draw(st.lists(SIZES, max_size=2), label="indices' middle axes")
    rng = np.random.default_rng(seed)
    x = rand(batch + shape, seed)
    indices = np.stack([rng.integers(-n, n, batch + middle) for n in shape[:m]], axis=-1)
    note(f"indices = {indices!r}")
    node = helper.make_node("GatherND", ["x", "i"], ["y"], batch_dims=len(batch))
    out_rank = len(batch) + len(middle) + len(shape) - m
    model = make_model([node], [("x", x.shape), ("i", indices.shape, I64)], [("y", [None] * out_rank)], opset=13)
    check(model, {"x": x, "i": indices})


def test_gather_nd_out_of_range():
    """An index out of range is an IndexError at run time (onnxruntime's INVALID_ARGUMENT), an import error when
    the indices are constant."""
    node = helper.make_node("GatherND", ["x", "i"], ["y"])
    x = rand((3, 4), 0)
    model = make_model([node], [("x", [3, 4]), ("i", [2, 2], I64)], [("y", [None])], opset=13)
    run = tg.from_onnx(model).compile()
    np.testing.assert_array_equal(run({"x": x, "i": np.array([[-3, 3], [2, -4]])})[0], [x[0, 3], x[2, 0]])
    with pytest.raises(IndexError, match="out of range"):
        run({"x": x, "i": np.array([[0, 0], [0, 4]])})
    constant = make_model([node], [("x", [3, 4])], [("y", [None])], {"i": np.array([[0, 0], [-4, 1]])}, opset=13)
    with pytest.raises(OnnxImportError, match=r"index -4 is out of range for axis 0 of data's shape \(3, 4\)"):
        tg.from_onnx(constant)


@settings(max_examples=15, deadline=None)
@given(data=st.data(), rows=SIZES, columns=SIZES, elem=st.sampled_from(sorted(EYE_TYPES)),
       with_dtype=st.booleans())
def test_eye_like_matches_onnxruntime(data, rows, columns, elem, with_dtype):
    """Ones on diagonal k (from below the first row to past the last column), of the input's type or `dtype`."""
    k = data.draw(st.integers(-rows - 1, columns + 1), label="k")
    attrs = {"k": k, **({"dtype": elem} if with_dtype else {})}
    in_elem = TensorProto.INT32 if with_dtype else elem
    model = make_model([helper.make_node("EyeLike", ["x"], ["y"], **attrs)], [("x", [rows, columns], in_elem)],
                       [("y", [rows, columns], elem)], opset=13)
    check(model, {"x": np.zeros((rows, columns), EYE_TYPES[in_elem])})


@settings(max_examples=8, deadline=None)
@given(data=st.data(), shape=st.lists(SIZES, min_size=2, max_size=3), batch_axis=st.integers(0, 1),
       seed=st.integers(0, 99))
def test_reverse_sequence_matches_onnxruntime(data, shape, batch_axis, seed):
    """The first sequence_lens[b] steps of each batch reversed, lengths from 0 to the time axis's size."""
    batch, steps = shape[batch_axis], shape[1 - batch_axis]
    lens = np.array(data.draw(st.lists(st.integers(0, steps), min_size=batch, max_size=batch), label="lens"))
    node = helper.make_node("ReverseSequence", ["x", "lens"], ["y"], batch_axis=batch_axis, time_axis=1 - batch_axis)
    model = make_model([node], [("x", shape)], [("y", shape)], {"lens": lens})
    check(model, {"x": rand(shape, seed)})


@settings(max_examples=5, deadline=None)
@given(data=st.data(), shape=st.lists(SIZES, min_size=1, max_size=3), seed=st.integers(0, 99))
def test_center_crop_pad_matches_onnxruntime(data, shape, seed):
    """Each chosen axis (all, or `axes` with negative ones) cropped or padded around its center to 1-8."""
    axes = data.draw(st.none() | st.permutations(range(len(shape))).flatmap(
        lambda p: st.integers(1, len(p)).map(lambda n: [a - len(shape) * (a % 2) for a in p[:n]])), label="axes")
    target = data.draw(st.lists(st.integers(1, 8), min_size=len(axes or shape), max_size=len(axes or shape)),
                       label="shape")
    node = helper.make_node("CenterCropPad", ["x", "shape"], ["y"], **({} if axes is None else {"axes": axes}))
    model = make_model([node], [("x", shape)], [("y", [None] * len(shape))],
                       {"shape": np.array(target, np.int64)}, opset=18)
    check(model, {"x": rand(shape, seed)})


def test_refusals():
    """Inconsistent attributes and constant inputs are clear errors, as is an EyeLike type taskdsl has not."""
    def model(op_type, inputs, initializers, out_rank=2, opset=18, **attrs):
        node = helper.make_node(op_type, [name for name, *_ in inputs] + list(initializers), ["y"], **attrs)
        return make_model([node], inputs, [("y", [None] * out_rank)], initializers, opset=opset)
    x = [("x", [3, 4])]
    bad = [(model("ReverseSequence", x, {"lens": np.array([5, 1, 0, 2])}), OnnxImportError,
            r"sequence_lens \[5, 1, 0, 2\] must lie in \[0, 3\]"),
           (model("ReverseSequence", x, {"lens": np.array([1, 1, 1])}, batch_axis=0, time_axis=0), OnnxImportError,
            "batch_axis=0 and time_axis=0 must be 0 and 1, one each"),
           (model("ReverseSequence", x, {"lens": np.array([1, 1])}, batch_axis=0, time_axis=1), OnnxImportError,
            "sequence_lens must be 3 integers"),
           (model("CenterCropPad", x, {"s": np.array([2, 2])}, axes=[1, -1]), OnnxImportError,
            "name an axis twice"),
           (model("CenterCropPad", x, {"s": np.array([2, 2])}, axes=[1]), OnnxImportError,
            r"shape must be 1 non-negative integers"),
           (model("GatherND", [("x", [3, 4]), ("i", [2, 2], I64)], {}, batch_dims=1), OnnxImportError,
            "the batch axes must match"),
           (model("EyeLike", x, {}, dtype=TensorProto.STRING), UnsupportedOnnxError,
            "'dtype': data type STRING is not supported")]
    for m, error, match in bad:
        with pytest.raises(error, match=match):
            tg.from_onnx(m)
