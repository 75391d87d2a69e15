"""ONNX MaxUnpool against onnxruntime: a MaxPool's values and Indices unpooled (1-2 spatial axes, kernels, strides
that overlap the windows or not, pads), to the pooling's inverse shape or an output_shape input; refusals.
Every kernel the tests launch is also compiled for CUDA by NVRTC (tests/conftest.py)."""
import numpy as np
import pytest
from hypothesis import assume, given, note, settings
from hypothesis import strategies as st
from onnx import TensorProto, helper

import taskdsl.graph as tg
from taskdsl.graph.onnx_import import OnnxImportError

from . import assert_close, make_model, rand, run_onnxruntime

pytest.importorskip("onnxruntime")


@settings(max_examples=8, deadline=None)
@given(data=st.data(), rank=st.sampled_from([1, 2]), n=st.sampled_from([1, 2]), c=st.sampled_from([1, 3]),
       seed=st.integers(0, 99))
def test_max_unpool_matches_onnxruntime(data, rank, n, c, seed):
    """Each pooled maximum written back at its index, zeros elsewhere, in the pooling's inverse shape (given as the
    output_shape input where drawn). The input is drawn the size the inverse gives (the indices count over the
    input, and the spec writes them into the inverse: where the two differ, onnxruntime refuses the indices past
    the inverse's end)."""
    kernel = data.draw(st.lists(st.sampled_from([1, 2, 3]), min_size=rank, max_size=rank), label="kernel")
    strides = data.draw(st.lists(st.sampled_from([1, 2, 3]), min_size=rank, max_size=rank), label="strides")
    pads = [data.draw(st.integers(0, k - 1), label="pad") for k in kernel + kernel]
    pooled = data.draw(st.lists(st.integers(1, 3), min_size=rank, max_size=rank), label="pooled sizes")
    spatial = [(p - 1) * s - pads[a] - pads[a + rank] + k for a, (p, s, k) in enumerate(zip(pooled, strides, kernel))]
    assume(all(n >= k for n, k in zip(spatial, kernel)))
    shape = [n, c] + spatial
    given = data.draw(st.booleans(), label="output_shape given")
    note(f"kernel {kernel}, strides {strides}, pads {pads}, shape {shape}")
    attrs = {"kernel_shape": kernel, "strides": strides, "pads": pads}
    nodes = [helper.make_node("MaxPool", ["x"], ["p", "i"], **attrs),
             helper.make_node("MaxUnpool", ["p", "i"] + (["s"] if given else []), ["y"], **attrs)]
    inits = {"s": np.array(shape, np.int64)} if given else {}
    model = make_model(nodes, [("x", shape)], [("y", [None] * len(shape))], inits, opset=11)
    x = rand(shape, seed)
    got = tg.from_onnx(model).compile()({"x": x})[0]
    assert_close(got, run_onnxruntime(model, {"x": x})[0])


def test_max_unpool_refusals():
    """Indices of another shape than X and attributes for another number of spatial axes are import errors; an
    output_shape other than the unpooled shape, where onnxruntime and onnx's reference disagree, is refused."""
    for i_shape, kernel, output_shape, match in (
            ([1, 1, 3], [2], None, "I must be integer indices of X's shape"),
            ([1, 1, 2], [2, 2], None, "need one value"),
            ([1, 1, 2], [2], [1, 1, 5], r"output_shape \(1, 1, 5\) other than the unpooled shape \(1, 1, 4\)")):
        node = helper.make_node("MaxUnpool", ["x", "i"] + (["s"] if output_shape else []), ["y"], kernel_shape=kernel,
                                strides=[2] * len(kernel), name="up")
        inits = {"s": np.array(output_shape, np.int64)} if output_shape else {}
        model = make_model([node], [("x", [1, 1, 2]), ("i", i_shape, TensorProto.INT64)], [("y", [None] * 3)], inits,
                           opset=11)
        with pytest.raises(OnnxImportError, match=rf"node 'up' \(MaxUnpool\): .*{match}"):
            tg.from_onnx(model)


def test_max_unpool_refuses_an_index_past_the_output():
    """An index past the unpooled tensor is an IndexError at run time, as onnxruntime's is an error (its value was
    dropped: no output element found it)."""
    node = helper.make_node("MaxUnpool", ["x", "i"], ["y"], kernel_shape=[2], strides=[2])
    model = make_model([node], [("x", [1, 1, 2]), ("i", [1, 1, 2], TensorProto.INT64)], [("y", [None] * 3)], opset=11)
    run = tg.from_onnx(model).compile()
    x = np.array([[[3.0, 5.0]]], np.float32)
    np.testing.assert_array_equal(run({"x": x, "i": np.array([[[1, 2]]], np.int64)})[0], [[[0, 3, 5, 0]]])
    with pytest.raises(IndexError, match="index 4 is out of range for axis 0 of size 4"):
        run({"x": x, "i": np.array([[[1, 4]]], np.int64)})
