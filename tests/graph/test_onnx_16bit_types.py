"""ONNX models over UINT16 and BFLOAT16 tensors, imported and run on the cpu target, against numpy (and
ml_dtypes' bfloat16, which rounds to nearest even as ONNX's Cast does)."""
import ml_dtypes
import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st
from onnx import TensorProto
from onnx import helper as oh

import taskdsl.graph as tg

from . import make_model

SHAPES = [(1,), (7,), (3, 5), (2, 1, 13)]
UINT16_OPS = {"Add": np.add, "Sub": np.subtract, "Mul": np.multiply, "Div": np.floor_divide,
              "Max": np.maximum, "Min": np.minimum, "Equal": np.equal, "Less": np.less, "Greater": np.greater}


@settings(max_examples=12, deadline=None)
@given(shape=st.sampled_from(SHAPES), op=st.sampled_from(sorted(UINT16_OPS)), seed=st.integers(0, 1000))
def test_uint16_operators_wrap_as_numpy(shape, op, seed):
    """uint16 arithmetic over the whole range wraps modulo 2**16 (products too), and comparisons give bools."""
    rng = np.random.default_rng(seed)
    a = rng.integers(0, 1 << 16, shape).astype(np.uint16)
    b = rng.integers(1 if op == "Div" else 0, 1 << 16, shape).astype(np.uint16)
    want = UINT16_OPS[op](a, b)
    out_type = TensorProto.BOOL if want.dtype == np.bool_ else TensorProto.UINT16
    model = make_model([oh.make_node(op, ["a", "b"], ["y"])], [("a", list(shape), TensorProto.UINT16),
                                                                 ("b", list(shape), TensorProto.UINT16)],
                       [("y", list(shape), out_type)])
    got = tg.from_onnx(model)(a, b)[0]
    assert got.dtype == want.dtype
    np.testing.assert_array_equal(got, want)


@settings(max_examples=8, deadline=None)
@given(shape=st.sampled_from(SHAPES), seed=st.integers(0, 1000))
def test_bfloat16_model_rounds_as_numpy(shape, seed):
    """bf16 in, f32 arithmetic, bf16 out: relu and an add on bf16 tensors, a cast to f32 and back with a scale;
    every output bit pattern as ml_dtypes computes it."""
    rng = np.random.default_rng(seed)
    x = (rng.standard_normal(shape) * 10).astype(ml_dtypes.bfloat16)
    scale = np.float32(1.37)
    bf16, f32, dims = TensorProto.BFLOAT16, TensorProto.FLOAT, list(shape)
    nodes = [oh.make_node("Relu", ["x"], ["r"]), oh.make_node("Add", ["x", "r"], ["s"]),
             oh.make_node("Cast", ["x"], ["xf"], to=f32), oh.make_node("Mul", ["xf", "scale"], ["m"]),
             oh.make_node("Cast", ["m"], ["y"], to=bf16)]
    model = make_model(nodes, [("x", dims, bf16)], [("s", dims, bf16), ("y", dims, bf16), ("xf", dims, f32)],
                       {"scale": np.array(scale)})
    s, y, xf = tg.from_onnx(model)(x)
    xs = x.astype(np.float32)
    want_s = (xs + np.maximum(xs, 0)).astype(ml_dtypes.bfloat16)
    want_y = (xs * scale).astype(ml_dtypes.bfloat16)
    assert s.dtype == y.dtype == np.dtype(ml_dtypes.bfloat16) and xf.dtype == np.float32
    np.testing.assert_array_equal(s.view(np.uint16), want_s.view(np.uint16))
    np.testing.assert_array_equal(y.view(np.uint16), want_y.view(np.uint16))
    np.testing.assert_array_equal(xf, xs)


def _f16_model(nodes, inputs, output_shape, initializers=None):
    return make_model(nodes, [(name, shape, TensorProto.FLOAT16) for name, shape in inputs],
                      [("y", output_shape, TensorProto.FLOAT16)], initializers, opset=18)


def test_f16_operators_whose_intermediates_overflow_compute_in_f32():
    """ReduceL2, ReduceLogSum, Mean and Gemm with alpha became several operators whose f16 intermediates overflowed
    (300^2 + 400^2, 30000 + 40000, 60000 + 60000, 80000 before alpha) where the result fits: inf, where numpy
    computing in f32 and rounding once gives 500, 11.16, 60000 and 80."""
    x = np.array([[300, 400]], np.float16)
    axes = {"axes": np.array([1], np.int64)}
    y = tg.from_onnx(_f16_model([oh.make_node("ReduceL2", ["x", "axes"], ["y"], keepdims=0)],
                                [("x", [1, 2])], [1], axes))(x)[0]
    np.testing.assert_array_equal(y, [np.float16(500)])
    big = np.array([[30000, 40000]], np.float16)
    y = tg.from_onnx(_f16_model([oh.make_node("ReduceLogSum", ["x", "axes"], ["y"], keepdims=0)],
                                [("x", [1, 2])], [1], axes))(big)[0]
    np.testing.assert_array_equal(y, np.log(big.astype(np.float32).sum(1)).astype(np.float16))
    v = np.array([60000, -1], np.float16)
    y = tg.from_onnx(_f16_model([oh.make_node("Mean", ["a", "b"], ["y"])], [("a", [2]), ("b", [2])], [2]))(v, v)[0]
    np.testing.assert_array_equal(y, v)
    a, b = np.full((2, 100), 20, np.float16), np.full((100, 3), 40, np.float16)
    y = tg.from_onnx(_f16_model([oh.make_node("Gemm", ["a", "b"], ["y"], alpha=0.001)],
                                [("a", [2, 100]), ("b", [100, 3])], [2, 3]))(a, b)[0]
    np.testing.assert_array_equal(y, np.full((2, 3), np.float16(80)))


def test_a_reduction_naming_an_axis_twice_reduces_it_once():
    """axes [1, -1] of a matrix: onnxruntime reduces axis 1 once; it was refused as a repeated axis."""
    x = np.arange(6, dtype=np.float32).reshape(2, 3)
    model = make_model([oh.make_node("ReduceSum", ["x", "axes"], ["y"], keepdims=0)], [("x", [2, 3])], [("y", [2])],
                       {"axes": np.array([1, -1], np.int64)}, opset=18)
    np.testing.assert_array_equal(tg.from_onnx(model)(x)[0], x.sum(1))
