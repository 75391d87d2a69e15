"""ONNX import audit: attribute and input rules where the importer disagreed with onnxruntime, crashed with an
internal error, or silently accepted a node onnxruntime refuses. Values are checked against onnxruntime; a node
refused here is also refused by onnxruntime."""
import numpy as np
import onnx
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from onnx import TensorProto, helper

import taskdsl as td
import taskdsl.graph as tg
from taskdsl.graph import OnnxImportError, ops, passes

from . import assert_close, make_model, rand, run_onnxruntime

pytest.importorskip("onnxruntime")

n = helper.make_node
UNFUSED = [passes.infer_shapes, passes.fold_constants, passes.eliminate_dead_code]
I64, F64 = TensorProto.INT64, TensorProto.DOUBLE


@pytest.fixture(autouse=True)
def _cpu_target_and_nvrtc():
    """The cpu target with fast compilation, without the NVRTC compile of each launched kernel that
    tests/conftest.py adds: these tests check the importer's semantics."""
    td.set_target("cpu")
    td.fast_compile(True)
    yield
    td.fast_compile(False)


def run_both(model: onnx.ModelProto, feeds: dict) -> tuple:
    """(taskdsl's outputs, onnxruntime's outputs) of `model` on `feeds`."""
    graph = tg.from_onnx(model)
    got = graph.compile(passes=UNFUSED)({t.name: feeds[t.name] for t in graph.inputs})
    return got, run_onnxruntime(model, feeds)


def refused_by_both(model: onnx.ModelProto, feeds: dict, match: str) -> None:
    """onnxruntime fails on `model`, and from_onnx raises an OnnxImportError matching `match`."""
    with pytest.raises(Exception):
        run_onnxruntime(model, feeds)
    with pytest.raises(OnnxImportError, match=match):
        tg.from_onnx(model)


# ---------------------------------------------------------------- values that differed from onnxruntime
@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(base=st.sampled_from([0, 2**53, 2**60 + 1, -(2**62)]), offsets=st.tuples(*[st.integers(-9, 9)] * 2),
       delta=st.integers(-4, 4).filter(bool))
def test_range_of_large_int64_bounds_is_exact(base, offsets, delta):
    """Range's element count was computed in float64: bounds 3 apart near 2**60 gave an empty tensor."""
    start, limit = np.int64(base + offsets[0]), np.int64(base + offsets[1])
    inits = {"s": np.array(start), "l": np.array(limit), "d": np.array(delta, np.int64)}
    model = make_model([n("Range", ["s", "l", "d"], ["y"])], [], [("y", [None], I64)], inits)
    got, want = run_both(model, {})
    assert_close(got[0], want[0])


def test_clip_of_a_scalar_with_one_element_bounds_stays_a_scalar():
    """Clip's bounds may be 1-element vectors (onnxruntime reads them as scalars); broadcasting them made a 0-d
    input's result shape (1,)."""
    inits = {"lo": np.array([-0.5], np.float32), "hi": np.array([0.25], np.float32)}
    model = make_model([n("Clip", ["x", "lo", "hi"], ["y"])], [("x", [])], [("y", [])], inits)
    for value in (-2.0, 0.1, 3.0):
        got, want = run_both(model, {"x": np.array(value, np.float32)})
        assert_close(got[0], want[0])


def test_clip_bounds_must_be_scalars():
    model = make_model([n("Clip", ["x", "lo"], ["y"])], [("x", [3])], [("y", [3])], {"lo": np.zeros(3, np.float32)})
    refused_by_both(model, {"x": rand((3,))}, r"\(Clip\): the bound 'lo' must be a scalar, got shape \(3,\)")


@pytest.mark.parametrize("axis", [-1, 1])
def test_layer_norm_of_doubles_gives_float32_statistics(axis):
    """stash_type 1 (the default) makes Mean and InvStdDev float32 whatever X's type; they came out float64 and a
    model declaring them FLOAT was refused."""
    shape, stat_shape = (2, 3, 4), (2, 1, 1) if axis == 1 else (2, 3, 1)
    inits = {"s": rand(shape[axis % 3:], 1, np.float64), "b": rand(shape[axis % 3:], 2, np.float64)}
    model = make_model([n("LayerNormalization", ["x", "s", "b"], ["y", "m", "r"], axis=axis)],
                       [("x", list(shape), F64)],
                       [("y", list(shape), F64), ("m", list(stat_shape)), ("r", list(stat_shape))], inits)
    got, want = run_both(model, {"x": rand(shape, 0, np.float64)})
    for g, w in zip(got, want):
        assert_close(g, w, rtol=1e-6)


# ---------------------------------------------------------------- models onnxruntime refuses
def test_reshape_zero_past_the_input_rank():
    """A 0 (copy the input's dim) where the input has no dim was an IndexError ('tuple index out of range')."""
    model = make_model([n("Reshape", ["x", "s"], ["y"])], [("x", [6])], [("y", [6, 1])],
                       {"s": np.array([6, 0], np.int64)})
    refused_by_both(model, {"x": rand((6,))}, r"\(Reshape\): shape \[6, 0\] has a 0 .* past the input's rank 1")


def test_slice_with_more_starts_than_axes():
    """Without `axes`, starts name axes 0, 1, ...: one past the rank was an IndexError."""
    model = make_model([n("Slice", ["x", "s", "e"], ["y"])], [("x", [4])], [("y", [1])],
                       {"s": np.array([0, 0], np.int64), "e": np.array([2, 2], np.int64)})
    refused_by_both(model, {"x": rand((4,))}, r"\(Slice\): slice: axis 1 is out of range for a 1-d tensor")


@pytest.mark.parametrize("a_shape, b_shape", [([4], [4, 5]), ([2, 3, 4], [4, 5]), ([3, 4], [4])])
def test_gemm_operands_must_be_matrices(a_shape, b_shape):
    """Gemm took MatMul's numpy rules (1-d and batched operands) instead of refusing them."""
    rank = max(len(a_shape), len(b_shape))
    model = make_model([n("Gemm", ["a", "b"], ["y"])], [("a", a_shape), ("b", b_shape)], [("y", [None] * rank)])
    feeds = {"a": rand(a_shape), "b": rand(b_shape, 1)}
    refused_by_both(model, feeds, r"\(Gemm\): A and B must be matrices")


def test_gemm_bias_must_broadcast_to_the_result():
    """A C larger than A' @ B' made a larger result (C is broadcast to (M, N), never the other way)."""
    model = make_model([n("Gemm", ["a", "b", "c"], ["y"])], [("a", [1, 4]), ("b", [4, 5]), ("c", [3, 5])],
                       [("y", [None, None])])
    feeds = {"a": rand((1, 4)), "b": rand((4, 5), 1), "c": rand((3, 5), 2)}
    refused_by_both(model, feeds, r"\(Gemm\): C of shape \(3, 5\) does not broadcast to the result's shape \(1, 5\)")


def test_concat_of_one_input_checks_its_axis():
    model = make_model([n("Concat", ["a"], ["y"], axis=5)], [("a", [2, 3])], [("y", [2, 3])])
    refused_by_both(model, {"a": rand((2, 3))}, r"\(Concat\): concat: axis 5 is out of range for a 2-d tensor")


def test_split_sizes_must_match_the_outputs():
    """Three sizes for two outputs dropped the third part silently."""
    model = make_model([n("Split", ["x", "s"], ["a", "b"])], [("x", [4])], [("a", [None]), ("b", [None])],
                       {"s": np.array([1, 2, 1], np.int64)}, opset=13)
    refused_by_both(model, {"x": rand((4,))}, r"\(Split\): split gives 3 sizes \[1, 2, 1\] but the node has 2 outputs")


@pytest.mark.parametrize("pads, axes", [([1, 1, 1, 1], [0]), ([1], [0]), ([1, 1, 2, 2], [0, -2])])
def test_pad_needs_two_pads_per_distinct_axis(pads, axes):
    """Pads for `axes` with the wrong count were read at the wrong offsets (or raised IndexError)."""
    model = make_model([n("Pad", ["x", "p", "", "a"], ["y"])], [("x", [3, 4])], [("y", [None, None])],
                       {"p": np.array(pads, np.int64), "a": np.array(axes, np.int64)}, opset=18)
    refused_by_both(model, {"x": rand((3, 4))}, r"\(Pad\): pads .* need 2 values \(begin, end\) for each of the "
                                                r"distinct axes")


def test_conv_bias_needs_one_value_per_output_channel():
    """A bias of 3 values on a 1-channel conv broadcast the output to 3 channels."""
    model = make_model([n("Conv", ["x", "w", "b"], ["y"])], [("x", [1, 1, 4, 4])], [("y", [None] * 4)],
                       {"w": rand((1, 1, 3, 3)), "b": rand((3,))})
    refused_by_both(model, {"x": rand((1, 1, 4, 4))}, r"\(Conv\): conv: the bias must have one value per output "
                                                      r"channel, shape \(1,\), got \(3,\)")
    x = tg.input("x", (1, 2, 5, 5))
    with pytest.raises(ValueError, match="one value per output channel"):
        ops.conv(x, tg.constant(rand((4, 2, 3, 3))), tg.constant(rand((2, 2))), channels_last=False)


def test_trilu_k_must_be_a_scalar():
    model = make_model([n("Trilu", ["x", "k"], ["y"])], [("x", [3, 4])], [("y", [3, 4])],
                       {"k": np.array([1, 2], np.int64)}, opset=14)
    refused_by_both(model, {"x": rand((3, 4))}, r"\(Trilu\): k must be a scalar, got shape \(2,\)")
