"""ONNX NegativeLogLikelihoodLoss and SoftmaxCrossEntropyLoss against onnxruntime: hypothesis-drawn shapes (N, C)
and (N, C, d1..dk) with size-1 and prime axes, reductions, class weights, ignore_index inside and outside the
classes, int32 and int64 targets, opsets 12/13/22, the optional log_prob output; f16 inputs; an ignored
target at an infinite input; a target outside the classes that is not ignored; refusals. Every kernel the tests
launch is also compiled for CUDA by NVRTC (tests/conftest.py)."""
import numpy as np
import pytest
from hypothesis import given, note, settings
from hypothesis import strategies as st
from onnx import TensorProto, helper

import taskdsl.graph as tg
from taskdsl.graph.onnx_import import OnnxImportError

from . import assert_close, make_model, run_onnxruntime

pytest.importorskip("onnxruntime")

# (N, C, d1..dk)
SHAPES = st.lists(st.sampled_from([1, 2, 3, 5, 7]), min_size=2, max_size=3)
FLOATS = {TensorProto.FLOAT: np.float32, TensorProto.FLOAT16: np.float16}
TARGETS = {TensorProto.INT64: np.int64, TensorProto.INT32: np.int32}
TOLERANCE = {np.float16: 2e-3, np.float32: 1e-5}


def loss_model(op: str, shape: list, elem: int, target_elem: int, weighted: bool, opset: int, log_prob: bool = False,
               **attrs):
    """A one-node model of `op` on input x of `shape`, target t and, when `weighted`, weight w."""
    inputs = [("x", shape, elem), ("t", shape[:1] + shape[2:], target_elem)] + ([("w", shape[1:2], elem)] * weighted)
    loss_rank = len(shape) - 1 if attrs.get("reduction", "mean") == "none" else 0
    outputs = [("loss", [None] * loss_rank, elem)] + [("log_prob", [None] * len(shape), elem)] * log_prob
    node = helper.make_node(op, [name for name, *_ in inputs], [name for name, *_ in outputs], **attrs)
    return make_model([node], inputs, outputs, opset=opset)


def draw_feeds(shape: list, elem: int, target_elem: int, weighted: bool, ignore_index, seed: int) -> dict:
    """Inputs with targets in [0, C), some of them (when there is one) ignore_index; positive weights."""
    rng = np.random.default_rng(seed)
    dtype = FLOATS[elem]
    target = rng.integers(0, shape[1], shape[:1] + shape[2:])
    if ignore_index is not None:
        target = np.where(rng.random(target.shape) < 0.3, ignore_index, target)
    feeds = {"x": rng.uniform(-4, 4, shape).astype(dtype), "t": target.astype(TARGETS[target_elem])}
    if weighted:
        feeds["w"] = rng.uniform(0.25, 2, shape[1]).astype(dtype)
    return feeds


def check(model, feeds: dict) -> None:
    """taskdsl's outputs equal onnxruntime's within the input type's tolerance, dtype and shape included."""
    got = tg.from_onnx(model).compile()(feeds)
    want = run_onnxruntime(model, feeds)
    rtol = TOLERANCE[feeds["x"].dtype.type]
    for g, w in zip(got, want, strict=True):
        assert_close(g, w, rtol=rtol, atol=rtol)


# f32 inputs: f16 kernels are compiled by test_float16 only (CI time)
LOSS_CASES = dict(shape=SHAPES, target_elem=st.sampled_from(list(TARGETS)), weighted=st.booleans(),
                  reduction=st.sampled_from(["none", "sum", "mean"]),
                  ignore=st.sampled_from([None, "class", -1, -100, 9]), seed=st.integers(0, 99))


def ignore_index_of(ignore, shape: list):
    """The drawn ignore_index: None, one of the classes, or a value outside them."""
    return shape[1] - 1 if ignore == "class" else ignore


@settings(max_examples=4, deadline=None)
@given(opset=st.sampled_from([12, 13, 22]), **LOSS_CASES)
def test_negative_log_likelihood_loss_matches_onnxruntime(opset, shape, target_elem, weighted, reduction, ignore,
                                                          seed):
    """-x[n, t, d...] weighted by class, with ignored targets (inside or outside [0, C)) contributing and weighing
    0; mean divides by the summed weights of the targets kept."""
    ignore_index = ignore_index_of(ignore, shape)
    attrs = {"reduction": reduction} | ({} if ignore_index is None else {"ignore_index": ignore_index})
    model = loss_model("NegativeLogLikelihoodLoss", shape, TensorProto.FLOAT, target_elem, weighted, opset, **attrs)
    feeds = draw_feeds(shape, TensorProto.FLOAT, target_elem, weighted, ignore_index, seed)
    note(f"feeds = {feeds!r}")
    check(model, feeds)


@settings(max_examples=4, deadline=None)
@given(opset=st.sampled_from([12, 13]), log_prob=st.booleans(), **LOSS_CASES)
def test_softmax_cross_entropy_loss_matches_onnxruntime(opset, log_prob, shape, target_elem, weighted, reduction,
                                                        ignore, seed):
    """The loss of log_softmax over the classes, and the log-probabilities when the second output is present."""
    ignore_index = ignore_index_of(ignore, shape)
    attrs = {"reduction": reduction} | ({} if ignore_index is None else {"ignore_index": ignore_index})
    model = loss_model("SoftmaxCrossEntropyLoss", shape, TensorProto.FLOAT, target_elem, weighted, opset, log_prob,
                       **attrs)
    feeds = draw_feeds(shape, TensorProto.FLOAT, target_elem, weighted, ignore_index, seed)
    note(f"feeds = {feeds!r}")
    check(model, feeds)


@pytest.mark.parametrize("op", ["NegativeLogLikelihoodLoss", "SoftmaxCrossEntropyLoss"])
def test_float16(op):
    """f16, weighted, with ignored targets: the loss computed in f32 and rounded once, as onnxruntime; the
    log-probabilities of SoftmaxCrossEntropyLoss in f16. (f64 is the f32 composition in f64; its kernels are left
    out for CI time.)"""
    shape = [5, 7, 3]
    feeds = draw_feeds(shape, TensorProto.FLOAT16, TensorProto.INT64, True, 2, seed=0)
    for reduction in ("none", "mean"):
        log_prob = op == "SoftmaxCrossEntropyLoss"
        model = loss_model(op, shape, TensorProto.FLOAT16, TensorProto.INT64, True, 13, log_prob, reduction=reduction,
                           ignore_index=2)
        check(model, feeds)


@pytest.mark.parametrize("reduction", ["none", "sum", "mean"])
def test_ignored_target_at_an_infinite_input(reduction):
    """An ignored target outside the classes reads class 0, here -inf: it is discarded, not multiplied by its 0
    weight (a NaN); every target ignored makes the mean 0 / 0 (NaN), as in onnxruntime."""
    x = np.array([[-np.inf, 0.5, 1.5], [-np.inf, 2.0, -1.0]], np.float32)
    model = loss_model("NegativeLogLikelihoodLoss", [2, 3], TensorProto.FLOAT, TensorProto.INT64, True, 13,
                       reduction=reduction, ignore_index=-7)
    weight = np.array([1.0, 2.0, 0.5], np.float32)
    check(model, {"x": x, "t": np.array([-7, 2]), "w": weight})
    check(model, {"x": x, "t": np.array([-7, -7]), "w": weight})


def test_target_outside_the_classes_is_an_index_error():
    """A target outside [-C, C) that is not ignore_index is the gather's IndexError at run time, not a read of
    another class."""
    model = loss_model("SoftmaxCrossEntropyLoss", [2, 3], TensorProto.FLOAT, TensorProto.INT32, False, 13,
                       ignore_index=-100)
    compiled = tg.from_onnx(model).compile()
    with pytest.raises(IndexError, match="index 3 is out of range for axis 1 of size 3"):
        compiled({"x": np.zeros((2, 3), np.float32), "t": np.array([-100, 3], np.int32)})


def test_loss_refusals():
    """A reduction that is not none/sum/mean, a target not of the input's shape without its class axis, a weight
    not of the classes and a 1-d input are clear errors."""
    def model(shape=(3, 5), target=(3,), weight=(5,), **attrs):
        node = helper.make_node("NegativeLogLikelihoodLoss", ["x", "t", "w"], ["y"], **attrs)
        return make_model([node], [("x", shape), ("t", target, TensorProto.INT64), ("w", weight)], [("y", [])])
    for bad, match in ((model(reduction="max"), "reduction='max' is not one of none, sum, mean"),
                       (model(target=(3, 2)), r"the target's shape \[3, 2\] must be the input's \[3, 5\] without"),
                       (model(weight=(4,)), r"the weight must be a f32 vector of the 5 classes, got f32\[4\]"),
                       (model(shape=(5,), target=(), weight=(5,)), r"the input must be \(N, C\)")):
        with pytest.raises(OnnxImportError, match=match):
            tg.from_onnx(bad)
