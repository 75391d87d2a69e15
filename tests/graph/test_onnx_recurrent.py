"""ONNX RNN, GRU and LSTM against onnxruntime: hypothesis-drawn sizes (size-1 ones included), directions,
layouts, biases, initial states, sequence lengths, peepholes, clip, linear_before_reset, input_forget and
activations with their alphas and betas; refusals. Every kernel the tests launch is also compiled for CUDA by
NVRTC (tests/conftest.py)."""
import numpy as np
import pytest
from hypothesis import given, note, settings
from hypothesis import strategies as st
from onnx import helper

import taskdsl.graph as tg
from taskdsl.graph.onnx_import import OnnxImportError, UnsupportedOnnxError

from . import assert_close, make_model, rand, run_onnxruntime

pytest.importorskip("onnxruntime")

GATES = {"RNN": 1, "GRU": 3, "LSTM": 4}
SLOTS = {"RNN": 1, "GRU": 2, "LSTM": 3}
ACTIVATIONS = ["Tanh", "Sigmoid", "Relu", "LeakyRelu", "HardSigmoid", "Softsign", "Affine", "ScaledTanh", "Elu"]


@st.composite
def recurrent_cases(draw) -> dict:
    """An RNN / GRU / LSTM node's sizes, attributes and which optional inputs it has."""
    kind = draw(st.sampled_from(sorted(GATES)))
    directions = draw(st.sampled_from(["forward", "reverse", "bidirectional"]))
    case = {"kind": kind, "direction": directions, "seq": draw(st.sampled_from([1, 2, 5])),
            "batch": draw(st.sampled_from([1, 3])), "input": draw(st.sampled_from([1, 4])),
            "hidden": draw(st.sampled_from([1, 3, 5])), "layout": draw(st.sampled_from([0, 1])),
            "bias": draw(st.booleans()), "initial": draw(st.booleans()), "lengths": draw(st.booleans()),
            "seed": draw(st.integers(0, 99)), "attrs": {}}
    count = 2 if directions == "bidirectional" else 1
    if draw(st.booleans()):
        names = [draw(st.sampled_from(ACTIVATIONS)) for _ in range(SLOTS[kind] * count)]
        case["attrs"].update(activations=names, activation_alpha=[0.3, 0.7, 0.2, 1.1], activation_beta=[0.4, 0.9])
    if draw(st.booleans()):
        case["attrs"]["clip"] = 0.8
    if kind == "GRU":
        case["attrs"]["linear_before_reset"] = draw(st.sampled_from([0, 1]))
    if kind == "LSTM":
        case["peepholes"] = draw(st.booleans())
        case["attrs"]["input_forget"] = draw(st.sampled_from([0, 1]))
    return case


def recurrent_model(case: dict, layout: int):
    """The one-node model of a case in `layout` (weights and sequence_lens as initializers) and its feeds (the same
    values in either layout)."""
    kind, seq, batch, hidden = case["kind"], case["seq"], case["batch"], case["hidden"]
    d = 2 if case["direction"] == "bidirectional" else 1
    rng = np.random.default_rng(case["seed"])

    def weights(*shape):
        return (rng.standard_normal(shape) * 0.6).astype(np.float32)

    g = GATES[kind] * hidden
    inits = {"W": weights(d, g, case["input"]), "R": weights(d, g, hidden)}
    names = ["X", "W", "R", "", "", ""]
    if case["bias"]:
        inits["B"], names[3] = weights(d, 2 * g), "B"
    if case["lengths"]:
        inits["L"], names[4] = rng.integers(1, seq + 1, batch).astype(np.int32), "L"
    feeds = {"X": rand([seq, batch, case["input"]], case["seed"])}
    if case["initial"]:
        feeds["H"], names[5] = rand([d, batch, hidden], case["seed"] + 1), "H"
    if kind == "LSTM":
        names += ["C" if case["initial"] else "", "P" if case["peepholes"] else ""]
        if case["initial"]:
            feeds["C"] = rand([d, batch, hidden], case["seed"] + 2)
        if case["peepholes"]:
            inits["P"] = weights(d, 3 * hidden)
    while names[-1] == "":
        names.pop()
    outputs = ["Y", "Y_h"] + (["Y_c"] if kind == "LSTM" else [])
    if layout:          # (seq, batch, ...) -> (batch, seq, ...); the states (d, batch, ...) -> (batch, d, ...)
        feeds = {k: np.ascontiguousarray(v.swapaxes(0, 1)) for k, v in feeds.items()}
    inputs = [(k, list(v.shape)) for k, v in feeds.items()]
    node = helper.make_node(kind, names, outputs, direction=case["direction"], hidden_size=hidden, layout=layout,
                            **case["attrs"])
    model = make_model([node], inputs, [(o, [None] * (4 if o == "Y" else 3)) for o in outputs], inits, opset=14)
    return model, feeds


@settings(max_examples=5, deadline=None)
@given(case=recurrent_cases())
def test_recurrent_matches_onnxruntime(case):
    """Y, Y_h (and Y_c) equal onnxruntime's within its approximations of tanh and sigmoid."""
    note(case)
    model, feeds = recurrent_model(case, case["layout"])
    got = tg.from_onnx(model).compile()(feeds)
    want = run_onnxruntime(*recurrent_model(case, 0))       # onnxruntime takes layout 0 only
    if case["layout"]:      # Y (seq, d, batch, hidden) -> (batch, seq, d, hidden); the states -> (batch, d, hidden)
        want = [want[0].transpose(2, 0, 1, 3)] + [w.swapaxes(0, 1) for w in want[1:]]
    for g, w in zip(got, want):
        assert g.shape == w.shape and g.dtype == w.dtype
        assert_close(g, w, rtol=1e-4, atol=2e-5)


def test_recurrent_refusals():
    """An unknown activation, a wrong count of them, and sequence lengths past the sequence are clear errors."""
    def model(lengths=3, **attrs):
        node = helper.make_node("RNN", ["X", "W", "R", "", "L"], ["Y"], hidden_size=2, **attrs)
        return make_model([node], [("X", [3, 1, 2])], [("Y", [None] * 4)],
                          {"W": np.ones((1, 2, 2), np.float32), "R": np.ones((1, 2, 2), np.float32),
                           "L": np.array([lengths], np.int32)})
    with pytest.raises(UnsupportedOnnxError, match="activation 'Gelu' is not one of"):
        tg.from_onnx(model(activations=["Gelu"]))
    with pytest.raises(OnnxImportError, match=r"activations \['Tanh', 'Tanh'\] need 1 names a direction"):
        tg.from_onnx(model(activations=["Tanh", "Tanh"]))
    with pytest.raises(OnnxImportError, match=r"sequence_lens \[4\] must hold 1 lengths between 0 and 3"):
        tg.from_onnx(model(lengths=4))


@pytest.mark.parametrize("kind", sorted(GATES))
@pytest.mark.parametrize("batch", [1, 2])
def test_input_projection_of_every_step_at_once(kind, batch):
    """At batch 1 the steps' input projections are one product, (seq, input) @ (input, G hidden), per direction;
    larger batches project per gate. Both match onnxruntime, W given as a graph input (projected at each call) too."""
    case = {"kind": kind, "direction": "bidirectional", "seq": 7, "batch": batch, "input": 5, "hidden": 3,
            "layout": 0, "bias": True, "initial": True, "lengths": False, "seed": 3, "attrs": {}, "peepholes": False}
    model, feeds = recurrent_model(case, 0)
    want = run_onnxruntime(model, feeds)
    w = next(i for i in model.graph.initializer if i.name == "W")
    model.graph.input.append(helper.make_tensor_value_info("W", w.data_type, list(w.dims)))
    weights = {"W": np.frombuffer(w.raw_data, np.float32).reshape(w.dims)}
    del model.graph.initializer[[i.name for i in model.graph.initializer].index("W")]
    graph = tg.from_onnx(model)
    products = [op.outputs[0].shape for op in graph.nodes if op.kind == "matmul"]
    g = GATES[kind] * case["hidden"]
    assert products.count((7, g)) == (2 if batch == 1 else 0)
    got = graph.compile()({**feeds, **weights})
    for a, b in zip(got, want):
        assert_close(a, b, rtol=1e-4, atol=2e-5)
