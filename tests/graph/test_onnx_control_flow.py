"""ONNX If, Loop and Scan against onnxruntime. If: a condition that folds at import (computed from shapes, as exporters
emit it) or given with `from_onnx(constants=...)`; branches that read the enclosing graph's tensors, hold
initializers of their own, nest, and have other shapes than each other. Loop: for-loops (a trip count), while-loops
(a condition each iteration recomputes from constants) and both, unrolled, with loop-carried values and scan
outputs. Scan: states and scan inputs along any axis, forwards or backwards, scan outputs stacked along any axis.
Refusals that say what to do.
Every kernel the tests launch is also compiled for CUDA by NVRTC (tests/conftest.py)."""
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from onnx import TensorProto, helper, numpy_helper

import taskdsl.graph as tg
from taskdsl.graph.onnx_import import ConstantRequiredError, OnnxImportError, UnsupportedOnnxError

from . import assert_close, make_model, rand, run_onnxruntime

pytest.importorskip("onnxruntime")

F32 = TensorProto.FLOAT


def branch(name: str, nodes: list, outputs: list, initializers: dict | None = None, inputs: list = ()):
    """A subgraph: `inputs` (name, elem type, shape), `outputs` (name, rank) of f32 (or (name, rank, elem type))."""
    return helper.make_graph(
        nodes, name, [helper.make_tensor_value_info(*i) for i in inputs],
        [helper.make_tensor_value_info(o[0], o[2] if len(o) > 2 else F32, [None] * o[1]) for o in outputs],
        initializer=[numpy_helper.from_array(v, k) for k, v in (initializers or {}).items()])


def rank_test_model(shape: tuple):
    """y = relu(x) + w if x is a matrix, else -x flattened: the condition computed from x's shape."""
    then = branch("then", [helper.make_node("Relu", ["x"], ["r"]), helper.make_node("Add", ["r", "w"], ["ty"])],
                  [("ty", len(shape))], {"w": np.float32([0.5])})
    other = branch("else", [helper.make_node("Neg", ["x"], ["n"]),
                            helper.make_node("Reshape", ["n", "flat"], ["ey"])], [("ey", 1)])
    nodes = [helper.make_node("Shape", ["x"], ["s"]), helper.make_node("Size", ["s"], ["rank"]),
             helper.make_node("Equal", ["rank", "two"], ["is_matrix"]),
             helper.make_node("If", ["is_matrix"], ["y"], then_branch=then, else_branch=other)]
    return make_model(nodes, [("x", list(shape))], [("y", [None] * (2 if len(shape) == 2 else 1))],
                      {"two": np.int64(2), "flat": np.array([-1], np.int64)}, opset=13)


def check(model, feeds: dict, constants: dict | None = None) -> None:
    graph = tg.from_onnx(model, constants=constants or {})
    got = graph.compile()({t.name: feeds[t.name] for t in graph.inputs})
    want = run_onnxruntime(model, {**feeds, **(constants or {})})
    assert len(got) == len(want)
    for g, w in zip(got, want):
        assert_close(g, w)      # dtype and shape included; exp and sqrt may differ from onnxruntime's in a last bit


@settings(max_examples=6, deadline=None)
@given(shape=st.lists(st.sampled_from([1, 2, 3, 7]), min_size=1, max_size=3), seed=st.integers(0, 99))
def test_a_condition_on_shapes_folds_and_imports_its_branch(shape, seed):
    """The branch taken depends on the input's rank, which is static: each shape imports one branch, whose nodes
    read the enclosing graph's x and constants and the branch's own initializer."""
    x = rand(shape, seed)
    check(rank_test_model(tuple(shape)), {"x": x})
    graph = tg.from_onnx(rank_test_model(tuple(shape)))
    functions = {op.attrs.get("fn") for op in graph.nodes}       # the other branch is not imported
    assert ("relu" in functions, "neg" in functions) == ((True, False) if len(shape) == 2 else (False, True))


@pytest.mark.parametrize("outer, inner", [(True, True), (True, False), (False, True), (False, False)])
def test_nested_ifs_with_conditions_given_at_import(outer, inner):
    """Conditions that are graph inputs are given with constants=; an If inside a branch reads the outer graph's
    tensors and the branch's; branches give outputs of other shapes."""
    inner_if = helper.make_node(
        "If", ["d"], ["iy"],
        then_branch=branch("inner_then", [helper.make_node("Mul", ["x", "k"], ["m"])], [("m", 2)],
                           {"k": np.float32([[3.0]])}),
        else_branch=branch("inner_else", [helper.make_node("ReduceSum", ["x"], ["rs"], keepdims=0)], [("rs", 0)]))
    then = branch("then", [helper.make_node("Exp", ["x"], ["e"]), inner_if,
                           helper.make_node("Identity", ["iy"], ["o1"])], [("e", 2), ("o1", 2)])
    other = branch("else", [helper.make_node("Abs", ["x"], ["a"]), helper.make_node("Sqrt", ["a"], ["q"]),
                            helper.make_node("Transpose", ["a"], ["t"])], [("q", 2), ("t", 2)])
    node = helper.make_node("If", ["c"], ["y1", "y2"], then_branch=then, else_branch=other)
    model = make_model([node], [("x", [2, 3]), ("c", [], TensorProto.BOOL), ("d", [1], TensorProto.BOOL)],
                       [("y1", [None, None]), ("y2", [None, None])], opset=13)
    check(model, {"x": rand((2, 3), 4)}, {"c": np.array(outer), "d": np.array([inner])})


def test_refusals_say_what_to_do():
    """A condition that depends on an input's values asks for them at import; a condition of two elements is an
    import error naming the node."""
    then = branch("then", [helper.make_node("Relu", ["x"], ["r"])], [("r", 1)])
    other = branch("else", [helper.make_node("Neg", ["x"], ["n"])], [("n", 1)])
    node = helper.make_node("If", ["c"], ["y"], then_branch=then, else_branch=other, name="choose")
    model = make_model([node], [("x", [3]), ("c", [1], TensorProto.BOOL)], [("y", [3])], opset=13)
    with pytest.raises(ConstantRequiredError, match=r"node 'choose' \(If\).*constants=\{'c'"):
        tg.from_onnx(model)
    wide = make_model([node], [("x", [3]), ("c", [2], TensorProto.BOOL)], [("y", [3])], opset=13)
    with pytest.raises(OnnxImportError, match=r"node 'choose' \(If\): the condition must hold one element"):
        tg.from_onnx(wide, constants={"c": np.array([True, False])})


I64, BOOL = TensorProto.INT64, TensorProto.BOOL
LOOP_INPUTS = [("i", I64, []), ("cond_in", BOOL, [])]


def counting_loop(trips: int | None, until: int | None, shape: tuple):
    """A Loop over x (carried) and a running sum s: x = x * 0.5 + i each iteration, s += x, and x scanned. With
    `trips`, a trip count; with `until`, a condition input (true) that the body recomputes as i + 1 < until."""
    nodes = [helper.make_node("Cast", ["i"], ["fi"], to=F32), helper.make_node("Mul", ["x_in", "half"], ["h"]),
             helper.make_node("Add", ["h", "fi"], ["x_out"]), helper.make_node("Add", ["s_in", "x_out"], ["s_out"]),
             helper.make_node("Identity", ["x_out"], ["scan"])]
    if until is None:
        nodes.append(helper.make_node("Identity", ["cond_in"], ["cond_out"]))
    else:
        nodes += [helper.make_node("Add", ["i", "one"], ["next"]),
                  helper.make_node("Less", ["next", "until"], ["cond_out"])]
    rank = len(shape)
    body = branch("body", nodes, [("cond_out", 0, BOOL), ("x_out", rank), ("s_out", rank), ("scan", rank)],
                  {"half": np.float32(0.5), "one": np.int64(1)},
                  LOOP_INPUTS + [("x_in", F32, list(shape)), ("s_in", F32, list(shape))])
    loop = helper.make_node("Loop", ["M" if trips is not None else "", "go" if until is not None else "", "x", "s0"],
                            ["x_final", "s_final", "xs"], body=body)
    inits = {"s0": np.zeros(shape, np.float32), "until": np.int64(until or 0)}
    inits.update({"M": np.int64(trips)} if trips is not None else {})
    inits.update({"go": np.bool_(True)} if until is not None else {})
    return make_model([loop], [("x", list(shape))],
                      [("x_final", [None] * len(shape)), ("s_final", [None] * len(shape)),
                       ("xs", [None] * (len(shape) + 1))], inits, opset=13)


@settings(max_examples=8, deadline=None)
@given(trips=st.sampled_from([None, 1, 2, 5]), until=st.sampled_from([None, 1, 3, 9]),
       shape=st.lists(st.sampled_from([1, 2, 3, 7]), max_size=2), seed=st.integers(0, 99))
def test_loops_unroll_as_onnxruntime_runs_them(trips, until, shape, seed):
    """For-loops, while-loops and both: the final carried values and the stacked scan output; the body's outputs
    computed from the iteration number and constants fold, so each iteration's condition is known at import."""
    if trips is None and until is None:
        trips = 3
    check(counting_loop(trips, until, tuple(shape)), {"x": rand(shape, seed)})


def test_loop_refusals_say_what_to_do():
    """A condition the body computes from an input's values asks for them; a loop with no trip count or
    condition, one that would unroll past the limit, and one of no iteration with scan outputs are refused."""
    body = branch("body", [helper.make_node("ReduceMax", ["x_in"], ["m"], keepdims=0),
                           helper.make_node("Less", ["m", "ten"], ["cond_out"]),
                           helper.make_node("Add", ["x_in", "x_in"], ["x_out"])],
                  [("cond_out", 0, BOOL), ("x_out", 1)], {"ten": np.float32(10)}, LOOP_INPUTS + [("x_in", F32, [3])])
    loop = helper.make_node("Loop", ["", "go", "x"], ["y"], body=body, name="grow")
    model = make_model([loop], [("x", [3])], [("y", [3])], {"go": np.bool_(True)}, opset=13)
    with pytest.raises(ConstantRequiredError, match=r"node 'grow' \(Loop\): the condition of iteration 0 must be a "
                                                    r"constant.*constants=\{'x'"):
        tg.from_onnx(model)
    assert isinstance(tg.from_onnx(model, constants={"x": np.float32([1, 2, 3])}), tg.Graph)   # 1, 2, 4, 8: 16
    endless = make_model([helper.make_node("Loop", ["", "", "x"], ["y"], body=body, name="grow")], [("x", [3])],
                         [("y", [3])], opset=13)
    with pytest.raises(OnnxImportError, match="neither a trip count nor a condition never ends"):
        tg.from_onnx(endless)
    for trips, match in ((10**6, "1000000 iterations of its 6 body nodes are more than the 20000 nodes"),
                         (0, "runs no iteration")):
        with pytest.raises(UnsupportedOnnxError, match=match):
            tg.from_onnx(counting_loop(trips, None, (2,)))


@settings(max_examples=8, deadline=None)
@given(length=st.sampled_from([1, 2, 5]), width=st.sampled_from([1, 3]), in_axis=st.sampled_from([0, 1, -1]),
       out_axis=st.sampled_from([0, 1, -2]), directions=st.tuples(st.booleans(), st.booleans(), st.booleans()),
       seed=st.integers(0, 99))
def test_scans_unroll_as_onnxruntime_runs_them(length, width, in_axis, out_axis, directions, seed):
    """A running sum and product of two scan inputs (one along `in_axis`, one along axis 0), each direction drawn;
    the state's sums scanned out along `out_axis`, the products along 0, each forwards or backwards."""
    a_shape = [length, width] if in_axis == 0 else [width, length]
    nodes = [helper.make_node("Add", ["s_in", "a_t"], ["s_out"]), helper.make_node("Mul", ["s_out", "b_t"], ["p"]),
             helper.make_node("Identity", ["s_out"], ["y"])]
    body = branch("body", nodes, [("s_out", 1), ("y", 1), ("p", 1)],
                  inputs=[("s_in", F32, [width]), ("a_t", F32, [width]), ("b_t", F32, [width])])
    node = helper.make_node("Scan", ["s0", "a", "b"], ["s", "ys", "ps"], body=body, num_scan_inputs=2,
                            scan_input_axes=[in_axis, 0], scan_input_directions=[int(directions[0]), 0],
                            scan_output_axes=[out_axis, 0], scan_output_directions=[int(directions[1]),
                                                                                   int(directions[2])])
    model = make_model([node], [("s0", [width]), ("a", a_shape), ("b", [length, width])],
                       [("s", [width]), ("ys", [None, None]), ("ps", [None, None])], opset=16)
    check(model, {"s0": rand([width], seed), "a": rand(a_shape, seed + 1), "b": rand([length, width], seed + 2)})


def test_an_opset_8_scan_is_refused_not_misread():
    """Opset 8's Scan has a batch axis and sequence_lens, which onnx's version converter keeps as they are."""
    body = branch("body", [helper.make_node("Add", ["s_in", "a_t"], ["s_out"])], [("s_out", 1)],
                  inputs=[("s_in", F32, [2]), ("a_t", F32, [2])])
    node = helper.make_node("Scan", ["", "s0", "a"], ["s"], body=body, num_scan_inputs=1)
    model = make_model([node], [("s0", [1, 2]), ("a", [1, 3, 2])], [("s", [1, 2])], opset=8)
    with pytest.raises(UnsupportedOnnxError, match="opset 8's Scan .* is not supported"):
        tg.from_onnx(model)
