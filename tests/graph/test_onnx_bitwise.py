"""ONNX BitwiseAnd / Or / Xor / Not against onnxruntime: every integer type over its whole range, broadcast
shapes, and a chain of them fused into one kernel. Every kernel the tests launch is also compiled for CUDA by
NVRTC (tests/conftest.py)."""
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from onnx import TensorProto, helper

import taskdsl.graph as tg

from . import make_model, run_onnxruntime

pytest.importorskip("onnxruntime")

TYPES = {TensorProto.INT8: np.int8, TensorProto.INT16: np.int16, TensorProto.INT32: np.int32,
         TensorProto.INT64: np.int64, TensorProto.UINT8: np.uint8, TensorProto.UINT16: np.uint16,
         TensorProto.UINT32: np.uint32, TensorProto.UINT64: np.uint64}
SHAPES = st.lists(st.sampled_from([1, 2, 3, 5]), min_size=1, max_size=3)


def full_range(shape, dtype, rng) -> np.ndarray:
    """Integers drawn over the type's whole range, its limits included."""
    info = np.iinfo(dtype)
    x = rng.integers(info.min, info.max, shape, dtype=dtype, endpoint=True)
    x.flat[:2] = [info.min, info.max][:x.size]
    return x


@settings(max_examples=10, deadline=None)
@given(data=st.data(), op=st.sampled_from(["BitwiseAnd", "BitwiseOr", "BitwiseXor", "BitwiseNot"]),
       elem=st.sampled_from(sorted(TYPES)), a=SHAPES, seed=st.integers(0, 99))
def test_bitwise_matches_onnxruntime(data, op, elem, a, seed):
    """Each operator on two operands, b broadcast against a's trailing axes (Not on one), bit for bit."""
    trailing = a[data.draw(st.integers(0, len(a) - 1), label="b's first axis of a"):]
    b = [1 if data.draw(st.booleans(), label=f"b's axis {k} broadcast") else n for k, n in enumerate(trailing)]
    inputs = [("a", a, elem)] + ([] if op == "BitwiseNot" else [("b", b, elem)])
    model = make_model([helper.make_node(op, [name for name, _, _ in inputs], ["y"])], inputs,
                       [("y", [None] * len(a), elem)], opset=18)
    rng = np.random.default_rng(seed)
    feeds = {name: full_range(shape, TYPES[elem], rng) for name, shape, _ in inputs}
    got, want = tg.from_onnx(model).compile()(feeds)[0], run_onnxruntime(model, feeds)[0]
    assert got.dtype == want.dtype
    np.testing.assert_array_equal(got, want)


def test_a_chain_of_bitwise_operators_fuses_into_one_kernel(elementwise_fusion):
    """Not(And(a, b) Xor c) on int32, one fused elementwise operator, bit for bit."""
    n = helper.make_node
    nodes = [n("BitwiseAnd", ["a", "b"], ["t"]), n("BitwiseXor", ["t", "c"], ["u"]), n("BitwiseNot", ["u"], ["y"])]
    inputs = [(name, [4, 5], TensorProto.INT32) for name in "abc"]
    model = make_model(nodes, inputs, [("y", [4, 5], TensorProto.INT32)], opset=18)
    rng = np.random.default_rng(3)
    feeds = {name: full_range((4, 5), np.int32, rng) for name in "abc"}
    compiled = tg.from_onnx(model).compile()
    assert "1 operators, 1 kernels" in compiled.summary().splitlines()[0]
    np.testing.assert_array_equal(compiled(feeds)[0], run_onnxruntime(model, feeds)[0])
