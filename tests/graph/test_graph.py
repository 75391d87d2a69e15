"""Graph IR: tensors, operators and their definitions, graphs from traced outputs, the printer, user errors."""
import numpy as np
import pytest

import taskdsl as td
import taskdsl.graph as tg
from taskdsl.graph import ops

from . import rand


def mlp():
    x = tg.input("x", (4, 8))
    w1 = tg.constant(rand((16, 8), 1), name="w1")
    h = ops.relu(ops.linear(x, w1, rand((16,), 2)))
    y = ops.softmax(ops.linear(h, rand((3, 16), 3)))
    return x, y


def test_tensor_and_operator_basics():
    x, y = mlp()
    assert x.is_input and not x.is_constant and x.shape == (4, 8) and x.dtype == td.f32
    assert y.shape == (4, 3) and y.producer.kind == "softmax" and not y.producer.is_injective
    mm = y.producer.inputs[0].producer
    assert mm.kind == "matmul" and mm.is_anchor and not mm.is_injective
    add = mm.inputs[0].producer.inputs[0].producer         # relu(add(matmul(x, w1.T), b1))
    assert add.kind == "add" and add.is_injective and not add.is_anchor
    # the definitions are ordinary compute definitions with a numpy meaning
    a, b = rand((4, 16), 4), rand((16, 3), 5)
    np.testing.assert_allclose(mm.reference(a, b)[0], a @ b, rtol=1e-5)
    assert [d.kind for d in mm.definitions] == ["reduce"]


def test_graph_from_traced_outputs_and_printer():
    x, y = mlp()
    g = tg.Graph([x], [y], name="mlp")
    assert [op.kind for op in g.nodes] == ["transpose", "matmul", "add", "relu", "transpose", "matmul", "softmax"]
    assert len(g.constants) == 3
    text = str(g)
    assert text.splitlines()[0] == "graph mlp(x: f32[4, 8])"
    assert "constants: 3" in text and "= matmul(x, " in text and "softmax(" in text and "axis=1" in text
    assert text.splitlines()[-1].startswith("  return ")
    traced = tg.trace(lambda t: ops.relu(t) * 2.0, tg.input("t", (3,)))
    assert [op.kind for op in traced.nodes] == ["relu", "mul"] and traced.name == "<lambda>"


def test_graph_reference_matches_numpy():
    x, y = mlp()
    g = tg.Graph([x], [y])
    xa = rand((4, 8), 9)
    h = np.maximum(xa @ rand((16, 8), 1).T + rand((16,), 2), 0)
    logits = h @ rand((3, 16), 3).T
    e = np.exp(logits - logits.max(1, keepdims=True))
    np.testing.assert_allclose(g.reference(xa)[0], e / e.sum(1, keepdims=True), rtol=1e-5)


def test_clone_infers_types_again():
    x = tg.input("x", (2, 3))
    op = ops.sum(x, 1).producer
    other = op.clone([tg.input("z", (5, 3, 4), "float64")])
    assert other.outputs[0].shape == (5, 4) and other.outputs[0].dtype == td.f64


def test_user_errors_say_what_to_do():
    x, i = tg.input("x", (2, 3)), tg.input("i", (2, 3), "int32")
    with pytest.raises(ValueError, match=r"shapes \(2, 3\), \(4,\) do not broadcast"):
        ops.add(x, tg.input("y", (4,)))
    with pytest.raises(TypeError, match="ops.cast"):
        ops.add(x, i)
    with pytest.raises(TypeError, match="cast the tensor first"):
        ops.mul(i, 0.5)
    with pytest.raises(TypeError, match="needs float tensors"):
        ops.exp(i)
    with pytest.raises(ValueError, match="K = 3 vs 4"):
        ops.matmul(x, tg.input("w", (4, 2)))
    with pytest.raises(ValueError, match="cannot reshape"):
        ops.reshape(x, (4, 2))
    with pytest.raises(ValueError, match="out of range"):
        ops.softmax(x, axis=2)
    with pytest.raises(ValueError, match="groups=2 do not match"):
        ops.conv2d(tg.input("img", (1, 3, 5, 5)), rand((4, 3, 3, 3), 0), groups=2)
    with pytest.raises(ValueError, match="not one of the graph inputs"):
        tg.Graph([x], [ops.add(x, tg.input("forgotten", (2, 3)))])
    with pytest.raises(ValueError, match="two graph inputs are called 'x'"):
        tg.Graph([x, tg.input("x", (1,))], [x])
    with pytest.raises(TypeError, match="unknown type name 'float8'"):
        tg.input("q", (1,), "float8")
    with pytest.raises(ValueError, match="non-negative ints"):
        tg.input("q", (2, -1))


def test_read_only_constants_compile_the_kernels_of_writable_ones(monkeypatch):
    """A read-only weight (an ONNX initializer is one) is stored as a writable copy: numba types read-only arrays
    apart, and each kernel reading the weight would otherwise compile a second time."""
    import taskdsl.backend.cpu.launch as launch
    weight, bias = rand((5, 7), 1), rand((5,), 2)
    frozen = weight.copy()
    frozen.setflags(write=False)
    c = tg.constant(frozen)
    assert c.value.flags.writeable and not np.shares_memory(c.value, frozen)
    layouts = []
    original = launch._compile
    monkeypatch.setattr(launch, "_compile", lambda fn, src, args, *rest: (
        layouts.append([(a.ndim, a.flags.c_contiguous, a.flags.writeable) for a in args if isinstance(a, np.ndarray)]),
        original(fn, src, args, *rest))[1])
    x = tg.input("x", (3, 7))
    g = tg.Graph([x], [ops.relu(ops.linear(x, c, bias))])
    xa = rand((3, 7), 3)
    np.testing.assert_allclose(g.compile("cpu")(xa)[0], np.maximum(xa @ weight.T + bias, 0), rtol=1e-5, atol=1e-6)
    assert layouts and all(writable for shapes in layouts for _, _, writable in shapes)
