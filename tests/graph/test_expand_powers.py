"""passes.expand_powers: a pow of an f32 / f64 base by a constant 2 or 3 of its type becomes products of the base.
Oracles: numpy's power (within an ulp or two: the product rounds at each multiply), the graph run without the
pass (bit for bit: the cpu's pow multiplies for those exponents too) and onnxruntime for GPT-2's ONNX GELU; each
test also asserts whether the pass rewrote the pow."""
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import taskdsl as td
import taskdsl.graph as tg
from taskdsl.graph import ops, passes

from . import make_model, rand, run_onnxruntime

WITHOUT = [p for p in passes.PIPELINE if p is not passes.expand_powers]


def kinds(graph) -> list:
    """The operator kinds of `graph` after the pass."""
    return [op.kind for op in passes.expand_powers(graph).nodes]


@settings(max_examples=10, deadline=None)
@given(shape=st.lists(st.sampled_from([1, 2, 3, 7, 13]), max_size=3), exponent=st.sampled_from([2, 3]),
       dtype=st.sampled_from(["float32", "float64"]), as_array=st.booleans(), seed=st.integers(0, 99))
def test_squares_and_cubes_become_products(shape, exponent, dtype, as_array, seed):
    """x ** 2 and x ** 3 by a number or a constant array of that number (broadcast into x's shape): products, the
    graph's result the unexpanded graph's bit for bit and numpy's power within 2 ulps."""
    x = tg.input("x", tuple(shape), dtype)
    e = tg.constant(np.full(shape[-1:], exponent, dtype)) if as_array else float(exponent)
    g = tg.Graph([x], [ops.mul(ops.pow(x, e), 0.5)])
    assert kinds(g).count("mul") == exponent and "pow" not in kinds(g)
    data = rand(tuple(shape), seed, dtype, -30, 30)
    got = g.compile(channels_last=False)(data)[0]
    np.testing.assert_array_equal(got, g.compile(passes=WITHOUT)(data)[0])
    np.testing.assert_array_max_ulp(got, np.power(data, exponent) * 0.5, maxulp=2)


def test_other_powers_stay_pows():
    """Kept: another exponent, one not the same everywhere, an exponent of another type (an integer exponent makes
    an f32 power in f64), a 16-bit base (its square would round to f16 first), a runtime exponent, and an exponent
    whose broadcast grows the base's shape."""
    x, h, e = tg.input("x", (4, 3)), tg.input("h", (4, 3), "float16"), tg.input("e", (), "float32")
    kept = [([x], ops.pow(x, 2.5)), ([x], ops.pow(x, tg.constant(np.array([2, 3, 2], np.float32)))),
            ([x], ops.pow(x, tg.constant(np.int32(2)))), ([h], ops.pow(h, 2.0)), ([x, e], ops.pow(x, e)),
            ([x], ops.pow(x, tg.constant(np.full((2, 4, 3), 3, np.float32))))]
    for inputs, y in kept:
        assert kinds(tg.Graph(inputs, [y])) == ["pow"], y.producer


def test_onnx_tanh_gelu_matches_onnxruntime():
    """GPT-2's exported GELU, 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 Pow(x, 3)))) with the exponent an initializer:
    its Pow becomes products, and the compiled graph (fused into one kernel where fusion is on) matches onnxruntime."""
    from onnx import helper
    names = [("Pow", ["x", "three"], "p"), ("Mul", ["p", "k"], "pk"), ("Add", ["x", "pk"], "s"),
             ("Mul", ["s", "r"], "sr"), ("Tanh", ["sr"], "t"), ("Add", ["t", "one"], "t1"),
             ("Mul", ["x", "half"], "xh"),
             ("Mul", ["xh", "t1"], "y")]
    nodes = [helper.make_node(kind, inputs, [out]) for kind, inputs, out in names]
    constants = {"three": 3.0, "k": 0.044715, "r": np.sqrt(2 / np.pi), "one": 1.0, "half": 0.5}
    model = make_model(nodes, [("x", [16, 97])], [("y", [16, 97])],
                       {k: np.array(v, np.float32) for k, v in constants.items()})
    graph = tg.from_onnx(model)
    assert "pow" in [op.kind for op in graph.nodes] and "pow" not in kinds(graph)
    x = rand((16, 97), 5, low=-6, high=6)
    for fast in (True, False):
        td.fast_compile(fast)
        np.testing.assert_allclose(graph.compile()({"x": x})[0], run_onnxruntime(model, {"x": x})[0],
                                   rtol=2e-6, atol=2e-6)


@pytest.mark.parametrize("exponent", [2.0, 3.0])
def test_an_exponent_computed_from_constants_counts(exponent):
    """An exponent folded from constants (1 + 1, or a Shape's arithmetic) is a constant too."""
    x = tg.input("x", (5,))
    e = ops.add(tg.constant(np.float32(exponent - 1)), tg.constant(np.float32(1)))
    graph = passes.fold_constants(tg.Graph([x], [ops.pow(x, e)]))
    assert "pow" not in kinds(graph)
