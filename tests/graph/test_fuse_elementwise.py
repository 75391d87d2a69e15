"""Elementwise fusion (graph/passes/fuse_elementwise.py): connected elementwise operators become one kernel, also
as a convolution's or matmul's epilogue.

Oracle: the graph's numpy reference (each operator's compute definition evaluated alone, its intermediates
stored in their dtypes), and numpy formulas for the fused activations.
"""
import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

import taskdsl as td
import taskdsl.graph as tg
from taskdsl.graph import ops, passes
from taskdsl.graph.fusion import FusedAnchor
from taskdsl.graph.passes.fuse_elementwise import MAX_TREE, _tree_size

RNG = np.random.default_rng(0)
pytestmark = pytest.mark.usefixtures("elementwise_fusion")     # on under the tests' td.fast_compile too


def _compiled(g, *arrays, pipeline=None):
    """g compiled for the cpu (by the passes of `pipeline`, else the default NCHW ones) and run on `arrays`: (the
    compiled graph, its outputs)."""
    td.set_target("cpu")
    cg = g.compile(passes=pipeline) if pipeline else g.compile(channels_last=False)
    return cg, cg(*arrays)


def _softsign(t):
    return ops.div(t, ops.add(ops.elementwise("abs", t), 1.0))


def _erf_gelu(t):
    """GELU as torch's ONNX export writes it: five operators, x read twice."""
    return ops.mul(ops.mul(t, 0.5), ops.add(ops.erf(ops.div(t, 1.4142135)), 1.0))


def test_a_dag_read_twice_is_one_kernel_and_matches_the_operators_alone():
    x = tg.input("x", (7, 13))
    g = tg.Graph([x], [_erf_gelu(_softsign(x))])
    data = RNG.standard_normal((7, 13)).astype(np.float32) * 3
    cg, (got,) = _compiled(g, data)
    node, = cg.graph.nodes
    assert node.kind == "fused_elementwise" and node.kinds == ("abs", "add", "div", "mul", "div", "erf", "add", "mul")
    assert len(cg.kernels) == 1
    soft = data / (1 + np.abs(data))
    want = soft * 0.5 * (1 + np.vectorize(__import__("math").erf)(soft / 1.4142135))
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(got, g.reference(data)[0], rtol=1e-6, atol=1e-7)
    assert "computes='mul(mul(div(in0, add(abs(in0), in1)), in2)" in str(cg.graph)


@pytest.mark.parametrize("anchor", ["conv", "matmul"])
def test_an_activation_read_twice_fuses_into_the_anchors_epilogue(anchor):
    """Softsign and the decomposed GELU after a conv or a matmul (its output read twice by each): one kernel
    with the anchor (two for the cpu conv: its im2col copy)."""
    if anchor == "conv":
        x = tg.input("x", (2, 5, 9, 7))
        y = ops.conv2d(x, tg.constant(RNG.standard_normal((6, 5, 3, 3)).astype(np.float32) * 0.3), padding=1)
        data = RNG.standard_normal((2, 5, 9, 7)).astype(np.float32)
    else:
        x = tg.input("x", (3, 11, 17))
        y = ops.matmul(x, tg.constant(RNG.standard_normal((17, 19)).astype(np.float32) * 0.3))
        data = RNG.standard_normal((3, 11, 17)).astype(np.float32)
    g = tg.Graph([x], [_erf_gelu(_softsign(y))])
    cg, (got,) = _compiled(g, data)
    fused, = cg.graph.nodes
    assert isinstance(fused, FusedAnchor) and fused.attrs["epilogue"] == ("abs", "add", "div", "mul", "div", "erf",
                                                                          "add", "mul")
    assert len(cg.kernels) == (2 if anchor == "conv" else 1)
    np.testing.assert_allclose(got, g.reference(data)[0], rtol=1e-4, atol=1e-5)


def test_each_anchor_keeps_the_head_of_its_epilogue():
    """ResNet's downsampling block: relu(conv(x) + shift + conv'(x) + shift'). Each add of a shift is its
    convolution's epilogue head; the residual add and the ReLU are one group in the first convolution's
    epilogue. (Had the group swallowed both shifts, the second convolution would store its output bare.)"""
    x = tg.input("x", (1, 4, 6, 6))

    def conv_shift(k):
        w = tg.constant(RNG.standard_normal((8, 4, k, k)).astype(np.float32) * 0.3)
        shift = tg.constant(RNG.standard_normal((1, 8, 1, 1)).astype(np.float32))
        return ops.add(ops.conv2d(x, w, padding=k // 2), shift)

    g = tg.Graph([x], [ops.relu(ops.add(conv_shift(3), conv_shift(1)))])
    data = RNG.standard_normal((1, 4, 6, 6)).astype(np.float32)
    cg, (got,) = _compiled(g, data)
    assert sorted(op.attrs["epilogue"] for op in cg.graph.nodes) == [("add",), ("add", "add", "relu")]
    np.testing.assert_allclose(got, g.reference(data)[0], rtol=1e-5, atol=1e-5)


def test_groups_stop_where_an_intermediate_is_needed_elsewhere():
    """A group ends at a tensor that two groups read, at a graph output, at a tensor a reduction also reads, and
    at a change of shape (a per-row value broadcast over a row is not recomputed per element)."""
    x = tg.input("x", (6, 10))
    a = ops.relu(ops.sub(x, 0.5))             # read by two groups: stored
    b = ops.exp(ops.neg(a))                   # a graph output: stored
    c = ops.add(ops.mul(b, 2.0), a)           # read by the reduction too: stored
    row = ops.sqrt(ops.add(ops.sum(c, 1, keepdims=True), 1.0))    # (6, 1): a group of its own
    out = ops.div(ops.mul(c, 3.0), row)
    g = tg.Graph([x], [out, b])
    data = RNG.standard_normal((6, 10)).astype(np.float32)
    cg, got = _compiled(g, data)
    assert [op.kinds for op in cg.graph.nodes] == [("sub", "relu"), ("neg", "exp"), ("mul", "add"), ("reduce_sum",),
                                                   ("add", "sqrt"), ("mul", "div")]
    for have, want in zip(got, g.reference(data)):
        np.testing.assert_allclose(have, want, rtol=1e-6, atol=1e-7)


def test_scalar_chains_are_computed_by_each_group_that_reads_them():
    """DynamicQuantizeLinear's pattern: a scale and a zero point computed from two reductions, read by two full-size
    groups and a per-channel one. Each group computes its own copy of the scalar chain (once per span), so the
    scalars take no kernel; a scalar that is also a graph output keeps its own kernel beside the copies."""
    x = tg.input("x", (3, 7, 11))
    high, low = ops.maximum(ops.max(x), 0.0), ops.minimum(ops.min(x), 0.0)
    scale = ops.div(ops.where(ops.equal(high, low), 1.0, ops.sub(high, low)), 255.0)
    zero = ops.cast(ops.clip(ops.elementwise("rint", ops.neg(ops.div(low, scale))), 0.0, 255.0), "uint8")
    quantized = ops.add(ops.elementwise("rint", ops.div(x, scale)), ops.cast(zero, "float32"))
    restored = ops.mul(ops.sub(quantized, ops.cast(zero, "float32")), scale)
    per_channel = ops.mul(tg.constant(np.arange(1, 8, dtype=np.float32).reshape(7, 1)), scale)
    data = RNG.standard_normal((3, 7, 11)).astype(np.float32) * 4
    # (the second graph's quantized values are read by `restored` alone: one group)
    for outputs, scalar_kernels in (([quantized, restored, per_channel], 0), ([restored, per_channel, scale], 1)):
        g = tg.Graph([x], outputs)
        cg, got = _compiled(g, data)
        assert sorted(op.kind for op in cg.graph.nodes) == ["fused_elementwise"] * 3 + ["reduce_max", "reduce_min"]
        assert sum(op.outputs[0].size == 1 for op in cg.graph.nodes) == 2 + scalar_kernels
        for have, want in zip(got, g.reference(data)):
            np.testing.assert_allclose(have, want, rtol=1e-6, atol=1e-6)


def test_a_tree_that_would_grow_past_the_bound_is_split():
    """x squared 12 times: each step reads the last twice, so one body would be a tree of 2^12 nodes; the groups
    stay under MAX_TREE nodes and still compute x^4096."""
    x = tg.input("x", (9,))
    t = x
    for _ in range(12):
        t = ops.mul(t, t)
    g = tg.Graph([x], [t])
    data = np.linspace(0.999, 1.001, 9).astype(np.float32)
    cg, (got,) = _compiled(g, data)
    assert len(cg.graph.nodes) > 1
    assert all(_tree_size(*_members_of(op)) <= MAX_TREE for op in cg.graph.nodes)
    np.testing.assert_allclose(got, g.reference(data)[0], rtol=1e-5)


def _members_of(op) -> tuple:
    """A FusedElementwise's steps as stand-in members for `_tree_size` (which reads inputs and outputs only)."""
    class Member:
        def __init__(self, inputs):
            self.inputs, self.outputs = inputs, [object()]
    values = list(op.inputs)
    members = []
    for _, _, refs in op.attrs["steps"]:
        members.append(Member([values[r] for r in refs]))
        values.append(members[-1].outputs[0])
    return members, op.inputs


def test_16_bit_intermediates_round_as_the_operators_alone_do():
    """f16 steps are computed in f32 and rounded to f16 between steps, as each operator's stored output is: the
    fused graph equals the graph run without the pass bit for bit."""
    x = tg.input("x", (4, 33), td.f16)
    y = ops.add(ops.mul(ops.sigmoid(x), x), ops.cast(ops.greater(x, 0.25), td.f16))
    g = tg.Graph([x], [ops.div(y, ops.add(ops.mul(y, y), 3.0))])
    data = (RNG.standard_normal((4, 33)) * 4).astype(np.float16)
    cg, (got,) = _compiled(g, data)
    assert len(cg.graph.nodes) == 1
    without = [p for p in passes.PIPELINE if p is not passes.fuse_elementwise]
    _, (alone,) = _compiled(g, data, pipeline=without)
    np.testing.assert_array_equal(got, alone)
    np.testing.assert_allclose(got.astype(np.float32), g.reference(data)[0].astype(np.float32), rtol=2e-3)


_UNARY = ["relu", "sigmoid", "tanh", "neg", "abs", "exp"]
_BINARY = ["add", "sub", "mul", "maximum", "minimum"]


@st.composite
def _programs(draw):
    """A random elementwise DAG over two inputs (one broadcast), with its input shapes: each step applies a unary
    or binary function to earlier values; some values are also graph outputs."""
    shape = (draw(st.sampled_from([1, 2, 3, 5])), draw(st.sampled_from([1, 7, 11, 16])))
    other = draw(st.sampled_from([shape, (shape[1],), (1, 1), (), (shape[0], 1)]))
    steps = []
    for k in range(draw(st.integers(1, 9))):
        available = 2 + k
        if draw(st.booleans()):
            steps.append((draw(st.sampled_from(_UNARY)), (draw(st.integers(0, available - 1)),)))
        else:
            steps.append((draw(st.sampled_from(_BINARY)), (draw(st.integers(0, available - 1)),
                                                           draw(st.integers(0, available - 1)))))
    outputs = draw(st.sets(st.integers(0, len(steps) - 1), max_size=2)) | {len(steps) - 1}
    return shape, other, steps, sorted(outputs)


@settings(max_examples=25, deadline=None)
@given(_programs())
def test_random_elementwise_dags_match_the_reference(program):
    shape, other, steps, outputs = program
    x, y = tg.input("x", shape), tg.input("y", other)
    values = [x, y]
    for fn, refs in steps:
        values.append(ops.elementwise(fn, *(values[r] for r in refs)))
    results = [values[2 + k] for k in outputs]
    g = tg.Graph([x, y], results)
    data = [RNG.uniform(-2, 2, shape).astype(np.float32), RNG.uniform(-2, 2, other).astype(np.float32)]
    _, got = _compiled(g, *data)
    for have, want in zip(got, g.reference(*data)):
        np.testing.assert_allclose(have, want, rtol=1e-5, atol=1e-6)


def test_fused_elementwise_on_the_cuda_target(simulated_gpu):
    """The fused group's kernel on the cuda target (a simulated GPU) and as a GPU matmul's epilogue."""
    x = tg.input("x", (5, 24))
    w = tg.constant(RNG.standard_normal((24, 8)).astype(np.float32) * 0.3)
    g = tg.Graph([x], [_softsign(x), _erf_gelu(ops.matmul(x, w))])
    data = RNG.standard_normal((5, 24)).astype(np.float32)
    cg = g.compile(target="cuda")
    assert sorted(op.kind for op in cg.graph.nodes) == ["fused", "fused_elementwise"]
    for have, want in zip(cg(data), g.reference(data)):
        np.testing.assert_allclose(have, want, rtol=1e-4, atol=1e-5)


def test_onnx_expanded_elementwise_functions_pass_their_node_cases_fused():
    """onnx's node cases of functions expanded into elementwise operators (Softsign, Selu, HardSwish, Mish, ...),
    compiled with the default passes, so their operators run as fused groups; the conformance test runs them
    unfused."""
    from .test_onnx_conformance import MULTI_NODE, cases_by_group, run_case
    elementwise = {"Abs", "Add", "Sub", "Mul", "Div", "Exp", "Log", "Neg", "Sigmoid", "Tanh", "Softplus", "Max",
                   "Min", "Relu", "Less", "Greater", "Where", "Cast", "CastLike", "Constant", "Sqrt", "Pow", "Erf",
                   "Sign", "Floor", "Round", "Clip", "HardSigmoid", "Reciprocal", "Not", "And", "Or", "Equal"}
    cases = [c for c in cases_by_group().get(MULTI_NODE, []) if "expanded" in c.name
             and {n.op_type for n in c.model.graph.node} <= elementwise]
    results = {c.name: run_case(c, passes.PIPELINE) for c in cases}
    assert len(results) >= 40 and all(r == "passed" for r in results.values()), results
