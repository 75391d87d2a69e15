"""recognize_norms: layer and RMS norms written out in ONNX operators (exports before opset 17, LLaMA's RMSNorm)
run as one LayerNorm. Oracle: onnxruntime on the same model; the graph's numpy reference for traced graphs."""
import numpy as np
import pytest
from hypothesis import given, settings, strategies as st
from onnx import TensorProto, helper

import taskdsl as td
import taskdsl.graph as tg
from taskdsl.graph import ops

from . import assert_close, make_model, rand, run_onnxruntime

pytest.importorskip("onnxruntime")
node = helper.make_node


def written_out_norm(shape, axes=(-1,), rms=False, square="pow", inverse="div", weight=True, bias=True,
                     elem=TensorProto.FLOAT):
    """An ONNX model (opset 13) of a layer norm, or an RMS norm, of x over `axes`, as exports write it out."""
    k = len(axes)
    norm_shape = list(shape[-k:])
    nodes, inits = [], {"eps": np.array(1e-5, np.float32), "two": np.array(2.0, np.float32)}
    d = "x"
    if not rms:
        nodes += [node("ReduceMean", ["x"], ["m"], axes=list(axes)), node("Sub", ["x", "m"], ["d"])]
        d = "d"
    nodes.append(node("Pow", [d, "two"], ["sq"]) if square == "pow" else node("Mul", [d, d], ["sq"]))
    nodes += [node("ReduceMean", ["sq"], ["v"], axes=list(axes)), node("Add", ["v", "eps"], ["ve"]),
              node("Sqrt", ["ve"], ["s"])]
    if inverse == "div":
        nodes.append(node("Div", [d, "s"], ["n"]))
    else:
        nodes += [node("Reciprocal", ["s"], ["r"]), node("Mul", ["r", d], ["n"])]
    out = "n"
    if weight:
        inits["w"] = rand(norm_shape, 1, low=0.5, high=1.5)
        nodes.append(node("Mul", ["n", "w"], ["nw"]))
        out = "nw"
    if bias and not rms:
        inits["b"] = rand(norm_shape, 2)
        nodes.append(node("Add", [out, "b"], ["y"]))
        out = "y"
    nodes.append(node("Identity", [out], ["out"]))
    return make_model(nodes, [("x", list(shape), elem)], [("out", list(shape), elem)], inits, opset=13)


def _compiled(model):
    td.set_target("cpu")
    return tg.from_onnx(model).compile()


@pytest.mark.parametrize("rms", [False, True])
@pytest.mark.parametrize("square, inverse", [("pow", "div"), ("mul", "reciprocal")])
@pytest.mark.parametrize("weight, bias", [(True, True), (True, False), (False, False)])
def test_a_written_out_norm_is_one_operator(rms, square, inverse, weight, bias):
    """One operator, which runs one row kernel with or without its weight and bias (an absent one's ones or zeros
    made once: the calls replay)."""
    shape = (2, 7, 33)
    model = written_out_norm(shape, rms=rms, square=square, inverse=inverse, weight=weight, bias=bias)
    cg = _compiled(model)
    assert [op.kind for op in cg.graph.nodes] == ["rms_norm" if rms else "layer_norm"]
    x = rand(shape, 3)
    assert_close(cg(x)[0], run_onnxruntime(model, {"x": x})[0], rtol=1e-4, atol=1e-5)
    assert [len(kernels) for kernels, _ in cg._records] == [1] and cg.replay.startswith("on"), cg.replay
    x2 = rand(shape, 4)
    assert_close(cg(x2)[0], run_onnxruntime(model, {"x": x2})[0], rtol=1e-4, atol=1e-5)


@settings(max_examples=10, deadline=None)
@given(batch=st.sampled_from([(1,), (3,), (2, 5)]), norm=st.sampled_from([(1,), (2,), (13,), (4, 7), (1, 9)]),
       rms=st.booleans())
def test_norms_over_the_trailing_axes_match_onnxruntime(batch, norm, rms):
    shape = batch + norm
    axes = tuple(range(-len(norm), 0))
    model = written_out_norm(shape, axes, rms=rms)
    cg = _compiled(model)
    assert [op.kind for op in cg.graph.nodes] == ["rms_norm" if rms else "layer_norm"]
    x = rand(shape, 4)
    assert_close(cg(x)[0], run_onnxruntime(model, {"x": x})[0], rtol=1e-4, atol=1e-5)


def test_what_is_not_a_norm_stays_as_written():
    """A centred value that is also a graph output, a mean over a leading axis, and a 16-bit norm (written out, it
    rounds every step to 16 bits) keep their operators, and compute what they did."""
    x = tg.input("x", (4, 6))
    m = ops.mean(x, -1, keepdims=True)
    d = ops.sub(x, m)
    y = ops.div(d, ops.sqrt(ops.add(ops.mean(ops.mul(d, d), -1, keepdims=True), 1e-5)))
    g = tg.Graph([x], [y, d])
    cg = g.compile()
    assert "layer_norm" not in [op.kind for op in cg.graph.nodes]
    data = rand((4, 6), 5)
    for got, want in zip(cg(data), g.reference(data)):
        assert_close(got, want, rtol=1e-5, atol=1e-6)

    leading = written_out_norm((5, 3), axes=(0,))
    cg = _compiled(leading)
    assert "layer_norm" not in [op.kind for op in cg.graph.nodes]
    data = rand((5, 3), 6)
    assert_close(cg(data)[0], run_onnxruntime(leading, {"x": data})[0], rtol=1e-4, atol=1e-5)

    h = tg.input("h", (3, 8), td.f16)
    hm = ops.sub(h, ops.mean(h, -1, keepdims=True))
    half = tg.Graph([h], [ops.div(hm, ops.sqrt(ops.add(ops.mean(ops.mul(hm, hm), -1, keepdims=True), 1e-3)))])
    assert "layer_norm" not in [op.kind for op in half.compile().graph.nodes]


@pytest.mark.usefixtures("elementwise_fusion")
def test_two_bert_style_layers_are_two_matmuls_and_a_norm_each():
    """Written-out layer norms after residual adds of matmuls with the GELU written out too (`bench written-out`'s
    model): per layer two fused matmuls and one layer norm (elementwise fusion takes the GELU and the residual add)."""
    from taskdsl.bench.written_out import bert_ffn
    model, data = bert_ffn(seq=5, hidden=16, inner=40, layers=2)
    cg = _compiled(model)
    assert [op.kind for op in cg.graph.nodes] == ["fused", "fused", "layer_norm"] * 2
    assert_close(cg(data)[0], run_onnxruntime(model, {"x": data})[0], rtol=1e-4, atol=1e-5)
