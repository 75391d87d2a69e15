"""Graph passes: shape inference, constant folding, dead-code elimination, memory planning, the pipeline."""
import numpy as np
from onnx import TensorProto, helper

import taskdsl.graph as tg
from taskdsl.graph import ops, passes

from . import assert_close, make_model, rand


def test_fold_weight_only_subgraphs():
    x = tg.input("x", (2, 4))
    w = tg.constant(rand((3, 4), 1), name="w")
    scale = ops.sqrt(ops.add(tg.constant(rand((3,), 2, low=1, high=2)), 1.0))      # constants only
    y = ops.mul(ops.linear(x, w), scale)
    g = tg.Graph([x], [y])
    assert [op.kind for op in g.nodes] == ["transpose", "matmul", "add", "sqrt", "mul"]
    folded = passes.fold_constants(g)
    assert [op.kind for op in folded.nodes] == ["matmul", "mul"]            # transpose(w) and sqrt(c + 1) folded
    assert all(t.is_constant for t in folded.nodes[0].inputs[1:] + folded.nodes[1].inputs[1:])
    xa = rand((2, 4), 3)
    assert_close(folded(xa)[0], g.reference(xa)[0])


def test_folded_values_equal_bit_for_bit_are_one_constant():
    """An unrolled recurrence slices its weights anew each step: the folded slices are one constant (read by one
    packed copy), where values that differ, in a bit or in dtype, stay apart."""
    x = tg.input("x", (2, 4))
    w = tg.constant(rand((4, 6), 1), name="w")
    zeros = tg.constant(np.zeros((2, 4), np.float32))
    h, outputs = x, []
    for _ in range(3):
        h = ops.tanh(ops.matmul(h, ops.slice(w, [0], [4], axes=[1])))
        outputs.append(h)
    wide = ops.cast(ops.slice(w, [0], [4], axes=[1]), "float64")
    outputs += [ops.matmul(x, ops.slice(w, [2], [6], axes=[1])), ops.matmul(ops.cast(x, "float64"), wide),
                ops.add(x, ops.neg(zeros)), ops.add(x, zeros)]
    g = tg.Graph([x], outputs)
    folded = passes.fold_constants(g)
    assert all(op.kind != "slice" for op in folded.nodes)
    steps = [op.inputs[1] for op in folded.nodes if op.kind == "matmul"]
    assert steps[0] is steps[1] is steps[2] is not steps[3] and steps[4].dtype.name == "f64"
    adds = [op.inputs[1] for op in folded.nodes if op.kind == "add"]
    assert adds[0] is not adds[1] and adds[0].value.tobytes() != adds[1].value.tobytes()      # -0.0 and 0.0
    xa = rand((2, 4), 3)
    for got, want in zip(folded(xa), g.reference(xa)):
        assert_close(got, want)


def test_fold_shape_arithmetic_from_onnx():
    """Shape -> Gather -> Unsqueeze -> Concat -> Reshape: the target shape is known at import, nothing runs."""
    n = helper.make_node
    nodes = [n("Shape", ["x"], ["s"]), n("Gather", ["s", "i0"], ["d0"], axis=0),
             n("Unsqueeze", ["d0", "ax"], ["d0u"]), n("Mul", ["d0u", "two"], ["d0x2"]),
             n("Concat", ["d0x2", "minus1"], ["target"], axis=0), n("Reshape", ["x", "target"], ["y"])]
    inits = {"i0": np.array(0, np.int64), "ax": np.array([0], np.int64), "two": np.array([2], np.int64),
             "minus1": np.array([-1], np.int64)}
    model = make_model(nodes, [("x", [4, 6])], [("y", [8, 3])], inits)
    g = tg.from_onnx(model)
    assert [op.kind for op in g.nodes] == ["gather", "reshape", "mul", "concat", "reshape"]  # Shape: a constant
    cg = g.compile()
    assert [op.kind for op in cg.graph.nodes] == ["reshape"] and cg.kernels == []   # a view: no kernel
    xa = rand((4, 6), 1)
    np.testing.assert_array_equal(cg(xa)[0], xa.reshape(8, 3))


def test_dead_code_elimination():
    x = tg.input("x", (3,))
    used = ops.relu(x)
    dead = ops.exp(ops.neg(x))
    g = tg.Graph([x], [used], nodes=[dead.producer, used.producer])
    assert [op.kind for op in g.nodes] == ["neg", "exp", "relu"]
    assert [op.kind for op in passes.eliminate_dead_code(g).nodes] == ["relu"]
    n = helper.make_node
    model = make_model([n("Relu", ["x"], ["y"]), n("Exp", ["x"], ["unused"])], [("x", [3])], [("y", [3])])
    imported = tg.from_onnx(model)
    assert [op.kind for op in imported.nodes] == ["relu", "exp"]
    assert [op.kind for op in imported.compile().graph.nodes] == ["relu"]


def test_memory_plan_reuse_halves_a_chain():
    """x -> a -> b -> c -> d: at most two activations are live at once, so two buffers serve four."""
    x = tg.input("x", (64, 64))
    t = x
    for _ in range(4):
        t = ops.tanh(t)
    plan = passes.plan_memory(tg.Graph([x], [t]))
    size = 64 * 64 * 4
    assert plan.unshared_bytes == 4 * size
    assert plan.peak_bytes == 2 * size            # reuse halves peak activation memory
    assert len(set(plan.offsets.values())) == 2
    assert "peak activation memory 32.0 KiB (without reuse 64.0 KiB, 50% saved)" == plan.summary()


def test_memory_plan_views_share_storage_and_outputs_stay_live():
    x = tg.input("x", (8, 8))
    a = ops.exp(x)
    v = ops.reshape(a, (64,))                 # a view of a: no memory of its own, keeps a alive
    b = ops.tanh(x)
    y = ops.add(v, ops.reshape(b, (64,)))
    g = tg.Graph([x], [y, a])
    plan = passes.plan_memory(g)
    assert plan.storage[id(v)] is a and id(v) not in plan.live
    assert plan.live[id(a)] == (0, len(g.nodes))       # a is an output: live to the end
    assert plan.offsets[id(a)] != plan.offsets[id(b)]  # a and b are live together
    np.testing.assert_allclose(g(rand((8, 8), 1))[0], g.reference(rand((8, 8), 1))[0], rtol=1e-6)


def test_infer_shapes_and_custom_pipeline():
    x = tg.input("x", (2, 5))
    y = ops.sum(ops.exp(x), 1, keepdims=True)
    g = tg.Graph([x], [y])
    inferred = passes.infer_shapes(g)
    assert [t.shape for op in inferred.nodes for t in op.outputs] == [(2, 5), (2, 1)]
    assert inferred.nodes[0] is not g.nodes[0]           # rebuilt from the definitions
    assert passes.PIPELINE[:4] == [passes.infer_shapes, passes.fold_constants, passes.fold_batch_norm,
                                   passes.eliminate_dead_code]
    calls = []

    def record(graph):
        calls.append(len(graph.nodes))
        return graph

    cg = g.compile(passes=passes.PIPELINE + [record])   # where a partition pass will go
    assert calls == [2] and len(cg.kernels) == 2


def test_folded_outputs_are_returned():
    """A graph whose output depends on constants only: folded, returned as a fresh array."""
    x = tg.input("x", (2,))
    c = ops.exp(tg.constant(np.array([0.0, 1.0], np.float32)))
    g = tg.Graph([x], [ops.add(x, c), c])
    cg = g.compile()
    out = cg(np.zeros(2, np.float32))
    np.testing.assert_allclose(out[1], np.exp([0.0, 1.0]), rtol=1e-6)
    out[1][0] = 5.0
    assert cg(np.zeros(2, np.float32))[1][0] == 1.0


def test_cast_input_is_folded_by_onnx_constant_nodes():
    n = helper.make_node
    model = make_model([n("Constant", [], ["c"], value=helper.make_tensor("v", TensorProto.INT64, [2], [1, 2])),
                        n("Cast", ["c"], ["cf"], to=TensorProto.FLOAT), n("Add", ["x", "cf"], ["y"])],
                       [("x", [2])], [("y", [2])])
    g = tg.from_onnx(model).compile()
    assert [op.kind for op in g.graph.nodes] == ["add"]
    np.testing.assert_array_equal(g(np.ones(2, np.float32))[0], [2.0, 3.0])


def _batch_norm_params(c: int, seed: int) -> list:
    mean, weight, bias = (tg.constant(rand((c,), seed + k)) for k in range(3))
    var = tg.constant(rand((c,), seed + 3, low=0.5, high=2.0))
    return [mean, var, weight, bias]


def test_fold_batch_norm_into_conv_weights_and_elsewhere_into_scale_shift():
    """conv -> bn: the scale goes into the weights (no BatchNorm, no extra conv); a bn on an input, or on a
    conv whose output has a second reader, becomes x * scale + shift; the values match the unfolded graph."""
    x = tg.input("x", (2, 3, 7, 5))
    w = tg.constant(rand((4, 3, 3, 3), 1), name="w")
    folded_conv = ops.batch_norm(ops.conv2d(x, w, padding=1), *_batch_norm_params(4, 10))
    shared = ops.conv2d(x, w, stride=2)
    kept_conv = ops.add(ops.batch_norm(shared, *_batch_norm_params(4, 20)), shared)     # conv read twice
    on_input = ops.batch_norm(x, *_batch_norm_params(3, 30), eps=1e-3)
    g = tg.Graph([x], [ops.relu(folded_conv), kept_conv, on_input])
    out = passes.fold_batch_norm(g)
    kinds = [op.kind for op in out.nodes]
    assert "batch_norm" not in kinds and kinds.count("conv2d") == 2
    first = next(op for op in out.nodes if op.kind == "conv2d" and op.attrs["strides"] == (1, 1))
    assert first.inputs[1].is_constant and not np.array_equal(first.inputs[1].value, w.value)   # scaled weights
    xa = rand((2, 3, 7, 5), 5)
    for got, want in zip(out.reference(xa), g.reference(xa)):
        assert_close(got, want, rtol=1e-5)
    for got, want in zip(g.compile()(xa), g.reference(xa)):
        assert_close(got, want, rtol=1e-4)


def test_fold_batch_norm_leaves_non_constant_statistics():
    x, mean = tg.input("x", (2, 3, 4)), tg.input("mean", (3,))
    y = ops.batch_norm(x, mean, tg.constant(np.ones(3, np.float32)))
    g = tg.Graph([x, mean], [y])
    assert passes.fold_batch_norm(g) is g


def test_fold_batch_norm_leaves_an_infinite_scale():
    """A zero variance with eps 0 divides by zero: the unfolded op gives +-inf and NaN where the reference does; a
    folded scale and shift would make 0 * inf = NaN of the infinities."""
    x = tg.input("x", (1, 2, 4, 5))
    conv = ops.conv2d(x, tg.constant(rand((3, 2, 3, 3), 1)), padding=1)
    var = np.array([0, 1e-30, 1], np.float32)
    g = tg.Graph([x], [ops.batch_norm(conv, np.zeros(3, np.float32), var, np.ones(3, np.float32),
                                      np.zeros(3, np.float32), eps=0.0)])
    assert passes.fold_batch_norm(g) is g
    feed = rand((1, 2, 4, 5), 2)
    with np.errstate(divide="ignore", invalid="ignore"):
        want = g.reference(feed)[0]
    got = g.compile(target="cpu")(feed)[0]
    assert np.isinf(want[0, 0]).all() and np.array_equal(np.isnan(got), np.isnan(want))
    np.testing.assert_allclose(got, want, rtol=1e-4)
