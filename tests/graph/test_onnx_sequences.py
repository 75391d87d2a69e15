"""ONNX sequences and optionals inside a model of tensor inputs and outputs, against onnxruntime: hypothesis-drawn
shapes (size 1, primes), axes, split sizes and positions (negative ones too) through SplitToSequence, SequenceAt,
SequenceInsert, SequenceErase, SequenceLength, ConcatFromSequence and SequenceMap; a list appended to in a Loop (an
exporter's pattern); optionals with and without a value; the refusals of sequence-typed graph inputs and outputs
and of positions outside the sequence. Every kernel the tests launch is also compiled for CUDA by NVRTC
(tests/conftest.py)."""
import numpy as np
import onnx
import pytest
from hypothesis import given, note, settings
from hypothesis import strategies as st
from onnx import TensorProto, helper

import taskdsl.graph as tg
from taskdsl.graph.onnx_import import OnnxImportError, UnsupportedOnnxError

from . import assert_close, make_model, rand, run_onnxruntime

pytest.importorskip("onnxruntime")

SIZES = st.sampled_from([1, 2, 3, 5])


def check(model, feeds: dict) -> None:
    graph = tg.from_onnx(model)
    got = graph.compile()({t.name: feeds[t.name] for t in graph.inputs})
    for g, w in zip(got, run_onnxruntime(model, feeds)):
        assert_close(g, w, rtol=1e-6, atol=1e-6)


def scalar(name: str, value: int) -> onnx.NodeProto:
    """A Constant node of an int64 scalar."""
    return helper.make_node("Constant", [], [name], value=helper.make_tensor(name, TensorProto.INT64, [], [value]))


@settings(max_examples=10, deadline=None)
@given(data=st.data(), shape=st.lists(SIZES, min_size=1, max_size=3), seed=st.integers(0, 99))
def test_split_edit_and_concat_a_sequence(data, shape, seed):
    """x split along an axis (by a size, by sizes, or into single elements), one part taken out and one put back
    at drawn positions, stacked or concatenated again; the length and one part are outputs too."""
    axis = data.draw(st.integers(-len(shape), len(shape) - 1), label="axis")
    n = shape[axis]
    how = data.draw(st.sampled_from(["size", "sizes", "single", "single, squeezed"]), label="split")
    nodes, inits = [], {}
    if how == "size":
        inits["split"] = np.array(data.draw(st.integers(1, n), label="size"), np.int64)
    elif how == "sizes":
        cuts = sorted(data.draw(st.lists(st.integers(0, n), max_size=3), label="cuts"))
        inits["split"] = np.diff([0] + cuts + [n]).astype(np.int64)
    split_inputs = ["x", "split"] if inits else ["x"]
    keepdims = {"keepdims": 0} if how == "single, squeezed" else {}
    nodes.append(helper.make_node("SplitToSequence", split_inputs, ["parts"], axis=axis, **keepdims))
    parts = len(inits["split"]) if how == "sizes" else -(-n // int(inits["split"])) if how == "size" else n
    erase = data.draw(st.none() | st.integers(-parts, parts - 1), label="erase at")     # None: the default, last
    insert = data.draw(st.none() | st.integers(-(parts - 1), parts - 1), label="insert at")    # None: at the end
    at = data.draw(st.integers(-parts, parts - 1), label="at")
    note(f"split {inits.get('split')}, {parts} parts")
    nodes += [scalar("erase", -1 if erase is None else erase), scalar("insert", insert or 0), scalar("at", at),
              helper.make_node("SequenceAt", ["parts", "at"], ["picked"]),
              helper.make_node("SequenceErase", ["parts"] + ["erase"] * (erase is not None), ["fewer"]),
              helper.make_node("SequenceAt", ["parts", "erase"], ["erased"]),
              helper.make_node("SequenceInsert", ["fewer", "erased"] + ["insert"] * (insert is not None), ["again"]),
              helper.make_node("SequenceLength", ["again"], ["length"])]
    rank = len(shape) - (how == "single, squeezed")         # of each part
    stacked = how == "single, squeezed" or data.draw(st.booleans(), label="stack")
    if stacked:     # parts of one shape stacked along a new axis (else the parts concatenated again)
        same = how.startswith("single") or how == "size" and n % int(inits["split"]) == 0
        nodes.append(helper.make_node("ConcatFromSequence", ["again" if same else "parts"], ["y"],
                                      axis=(axis % len(shape) + 1) % (rank + 1) if same else axis, new_axis=int(same)))
        stacked = same
    else:
        nodes.append(helper.make_node("ConcatFromSequence", ["again"], ["y"], axis=axis))
    dims = [f"d{a}" for a in range(rank + stacked)]       # (symbolic: the model declares ranks only)
    model = make_model(nodes, [("x", shape)], [("y", dims), ("length", [], TensorProto.INT64),
                                               ("picked", dims[:rank])], inits, opset=18)
    check(model, {"x": rand(shape, seed)})


@pytest.mark.parametrize("trips", [1, 4])
def test_a_list_appended_to_in_a_loop(trips):
    """SequenceEmpty, then a Loop whose body inserts a value computed from the iteration into the carried
    sequence, stacked at the end: a Python list built in a loop and torch.stack-ed, as exporters write it."""
    body = helper.make_graph(
        [helper.make_node("Cast", ["i"], ["fi"], to=TensorProto.FLOAT),
         helper.make_node("Mul", ["x", "fi"], ["value"]),
         helper.make_node("SequenceInsert", ["seq_in", "value"], ["seq_out"]),
         helper.make_node("Identity", ["cond_in"], ["cond_out"])], "body",
        [helper.make_tensor_value_info("i", TensorProto.INT64, []),
         helper.make_tensor_value_info("cond_in", TensorProto.BOOL, []),
         helper.make_tensor_sequence_value_info("seq_in", TensorProto.FLOAT, None)],
        [helper.make_tensor_value_info("cond_out", TensorProto.BOOL, []),
         helper.make_tensor_sequence_value_info("seq_out", TensorProto.FLOAT, None)])
    nodes = [helper.make_node("SequenceEmpty", [], ["empty"], dtype=TensorProto.FLOAT), scalar("trips", trips),
             helper.make_node("Loop", ["trips", "", "empty"], ["values"], body=body),
             helper.make_node("ConcatFromSequence", ["values"], ["y"], axis=0, new_axis=1)]
    model = make_model(nodes, [("x", [2, 3])], [("y", [trips, 2, 3])], opset=18)
    check(model, {"x": rand([2, 3], 1)})


def test_sequence_map_applies_its_body_to_each_element():
    """SequenceMap over a split (a sequence) and a tensor (the same at each element): the body's output per
    element, concatenated."""
    body = helper.make_graph(
        [helper.make_node("Mul", ["part", "scale"], ["scaled"]), helper.make_node("ReduceSum", ["scaled"], ["total"],
                                                                                    keepdims=1)], "body",
        [helper.make_tensor_value_info("part", TensorProto.FLOAT, None),
         helper.make_tensor_value_info("scale", TensorProto.FLOAT, [3])],
        [helper.make_tensor_value_info("scaled", TensorProto.FLOAT, None),
         helper.make_tensor_value_info("total", TensorProto.FLOAT, None)])
    nodes = [helper.make_node("SplitToSequence", ["x"], ["rows"], axis=0),
             helper.make_node("SequenceMap", ["rows", "scale"], ["scaled_rows", "totals"], body=body),
             helper.make_node("ConcatFromSequence", ["scaled_rows"], ["y"], axis=0),
             helper.make_node("ConcatFromSequence", ["totals"], ["t"], axis=0)]
    model = make_model(nodes, [("x", [5, 3]), ("scale", [3])], [("y", [5, 3]), ("t", [5, 1])], opset=18)
    check(model, {"x": rand([5, 3], 2), "scale": rand([3], 3)})


@pytest.mark.parametrize("has_value", [True, False])
def test_optionals(has_value):
    """Optional of a tensor (or of none), OptionalHasElement as an If's condition, OptionalGetElement."""
    element_type = helper.make_tensor_type_proto(TensorProto.FLOAT, [4])
    take = helper.make_graph([helper.make_node("OptionalGetElement", ["maybe"], ["got"])], "take", [],
                             [helper.make_tensor_value_info("got", TensorProto.FLOAT, [4])])
    zeros = helper.make_graph([helper.make_node("Mul", ["x", "zero"], ["none"])], "zeros", [],
                              [helper.make_tensor_value_info("none", TensorProto.FLOAT, [4])])
    nodes = [helper.make_node("Optional", ["x"] if has_value else [], ["maybe"], type=element_type),
             helper.make_node("OptionalHasElement", ["maybe"], ["has"]),
             helper.make_node("If", ["has"], ["y"], then_branch=take, else_branch=zeros)]
    model = make_model(nodes, [("x", [4])], [("y", [4]), ("has", [], TensorProto.BOOL)],
                       {"zero": np.zeros(4, np.float32)}, opset=18)
    check(model, {"x": rand([4], 4)})


def test_sequence_refusals():
    """Sequences as graph inputs or outputs, positions outside the sequence, a tensor where a sequence goes and
    the value of an empty optional are clear errors."""
    nodes = [helper.make_node("SplitToSequence", ["x"], ["parts"])]
    model = helper.make_model(helper.make_graph(nodes, "test", [helper.make_tensor_value_info("x", TensorProto.FLOAT,
                                                                                            [3, 2])],
                                                [helper.make_tensor_sequence_value_info("parts", TensorProto.FLOAT,
                                                                                        None)]),
                              opset_imports=[helper.make_opsetid("", 18)])
    with pytest.raises(UnsupportedOnnxError, match="graph output 'parts' is a sequence; only tensor outputs"):
        tg.from_onnx(model)
    at = make_model(nodes + [scalar("p", 3), helper.make_node("SequenceAt", ["parts", "p"], ["y"])],
                    [("x", [3, 2])], [("y", [1, 2])], opset=18)
    with pytest.raises(OnnxImportError, match=r"position 3 is outside the sequence of 3 tensors \(\[-3, 2\]\)"):
        tg.from_onnx(at)
    tensor = make_model([helper.make_node("SequenceLength", ["x"], ["y"])], [("x", [3])], [("y", [], TensorProto.INT64)],
                        opset=18)
    with pytest.raises(OnnxImportError, match=r"input 0 \('x'\) is a tensor, where the operator takes a sequence"):
        tg.from_onnx(tensor)
    element_type = helper.make_tensor_type_proto(TensorProto.FLOAT, [4])
    empty = make_model([helper.make_node("Optional", [], ["maybe"], type=element_type),
                        helper.make_node("OptionalGetElement", ["maybe"], ["y"])], [("x", [4])], [("y", [4])],
                       opset=18)
    with pytest.raises(OnnxImportError, match="the optional holds no value"):
        tg.from_onnx(empty)
