"""ONNX QuantizeLinear and DequantizeLinear against onnxruntime: hypothesis-drawn shapes (size-1 and prime axes),
scales per tensor, per axis and per block (opset 21), zero points of every 8- and 16-bit integer type or none,
values on rounding ties and past the type's range (saturation); a QDQ pair around a convolution; 4-bit integer
weights (INT4, UINT4 constants) dequantized per tensor, per axis or per block into a matmul, as LLM weights are;
refusals.
Every kernel the tests launch is also compiled for CUDA by NVRTC (tests/conftest.py)."""
import numpy as np
import pytest
from hypothesis import assume, given, note, settings
from hypothesis import strategies as st
import onnx
from onnx import TensorProto, helper

import taskdsl.graph as tg
from taskdsl.graph.onnx_import import OnnxImportError, UnsupportedOnnxError

from . import assert_close, make_model, rand, run_onnxruntime

pytest.importorskip("onnxruntime")

INTEGERS = {TensorProto.UINT8: np.uint8, TensorProto.INT8: np.int8, TensorProto.UINT16: np.uint16,
            TensorProto.INT16: np.int16}
SIZES = st.sampled_from([1, 2, 3, 5, 8])


def drawn_cases(test):
    """`test` over drawn shapes, integer types, with or without a zero point, and seeds (10 examples)."""
    cases = given(data=st.data(), shape=st.lists(SIZES, min_size=1, max_size=3), elem=st.sampled_from(sorted(INTEGERS)),
                  zero=st.booleans(), seed=st.integers(0, 99))
    return settings(max_examples=10, deadline=None)(cases(test))


@st.composite
def granularity(draw, shape: list) -> tuple:
    """(axis, block_size, the scale's and zero point's shape): per tensor, per axis, or per block."""
    kind = draw(st.sampled_from(["tensor", "axis", "block"]))
    if kind == "tensor":
        return 1, 0, []
    axis = draw(st.integers(0, len(shape) - 1))
    if kind == "axis":
        return axis, 0, [shape[axis]]
    block = draw(st.sampled_from([1, 2, 3]))
    blocked = shape[:axis] + [-(-shape[axis] // block)] + shape[axis + 1:]
    assume(np.prod(blocked) > 1)        # (onnxruntime reads one scale as per tensor, and refuses a block_size)
    return axis, block, blocked


def one_node(op_type: str, shape: list, x_elem: int, out_elem: int, axis: int, block: int, inits: dict, **attrs):
    """A one-node Q or DQ model (opset 21) over x of `shape`, its scale and zero point as initializers."""
    names = ["x", "scale"] + (["zero"] if "zero" in inits else [])
    attrs = attrs | {"axis": axis} | ({"block_size": block} if block else {})
    node = helper.make_node(op_type, names, ["y"], **attrs)
    return make_model([node], [("x", shape, x_elem)], [("y", shape, out_elem)], inits, opset=21)


def check(model, x: np.ndarray, exact: bool) -> None:
    """taskdsl's output against onnxruntime's: equal (quantized), or within f32 rounding (dequantized)."""
    got = tg.from_onnx(model).compile()({"x": x})[0]
    want = run_onnxruntime(model, {"x": x})[0]
    assert got.dtype == want.dtype and got.shape == want.shape
    if exact:
        np.testing.assert_array_equal(got, want)
    else:
        assert_close(got, want, rtol=1e-6, atol=0)


@drawn_cases
def test_quantize_linear_matches_onnxruntime(data, shape, elem, zero, seed):
    """Halves (x / scale on a tie rounds to even) and values past the type's range (saturated); the output type
    the zero point's, or without one output_dtype's (or uint8)."""
    axis, block, param_shape = data.draw(granularity(shape), label="granularity")
    rng = np.random.default_rng(seed)
    scale = rng.choice(np.array([0.5, 0.25, 2.0, 0.1], np.float32), param_shape)
    info = np.iinfo(INTEGERS[elem])
    inits, attrs = {"scale": scale}, {}
    if zero:
        inits["zero"] = rng.integers(info.min // 2, info.max // 2 + 1, param_shape).astype(INTEGERS[elem])
    elif elem != TensorProto.UINT8:     # (without a zero point the output is uint8, or output_dtype's type)
        attrs["output_dtype"] = elem
    halves = rng.integers(-600, 600, shape) * 0.5          # ties at scale 1
    x = (halves * np.broadcast_to(_expanded(scale, shape, axis, block), shape)).astype(np.float32)
    x.flat[::3] *= 300.0                                     # past the range: saturated
    note(f"x = {x!r}")
    check(one_node("QuantizeLinear", shape, TensorProto.FLOAT, elem, axis, block, inits, **attrs), x, exact=True)


@drawn_cases
def test_dequantize_linear_matches_onnxruntime(data, shape, elem, zero, seed):
    """(x - zero point) * scale over the whole integer range."""
    axis, block, param_shape = data.draw(granularity(shape), label="granularity")
    rng = np.random.default_rng(seed)
    info = np.iinfo(INTEGERS[elem])
    inits = {"scale": rng.uniform(0.01, 2.0, param_shape).astype(np.float32)}
    if zero:
        inits["zero"] = rng.integers(info.min, info.max + 1, param_shape).astype(INTEGERS[elem])
    x = rng.integers(info.min, info.max + 1, shape).astype(INTEGERS[elem])
    check(one_node("DequantizeLinear", shape, elem, TensorProto.FLOAT, axis, block, inits), x, exact=False)


@pytest.mark.parametrize("elem", sorted(INTEGERS))
def test_dequantize_linear_is_exact_at_the_extremes(elem):
    """x - zero point, from one end of the type's range to the other (65535 for 16 bits), is exact in f32: the
    result is the exact product rounded once, as numpy's f64 product of the two rounds to f32."""
    info = np.iinfo(INTEGERS[elem])
    x = np.array([info.max, info.min, info.max, info.min, 0], INTEGERS[elem])
    zero = np.array([info.min, info.max, info.max, info.min, info.max], INTEGERS[elem])
    scale = np.array([0.1, 3.7, 1e-3, 7.0, 0.3], np.float32)
    model = one_node("DequantizeLinear", [5], elem, TensorProto.FLOAT, 0, 0, {"scale": scale, "zero": zero})
    got = tg.from_onnx(model).compile()({"x": x})[0]
    want = ((x.astype(np.float64) - zero) * scale).astype(np.float32)
    np.testing.assert_array_equal(got, want)


def _expanded(param: np.ndarray, shape: list, axis: int, block: int) -> np.ndarray:
    """A scale of `granularity` as an array that broadcasts against x of `shape`."""
    if param.ndim == 0:
        return param
    if block:
        return np.repeat(param, block, axis=axis).take(np.arange(shape[axis]), axis=axis)
    return param.reshape((-1,) + (1,) * (len(shape) - 1 - axis))


def test_a_qdq_convolution_matches_onnxruntime():
    """A QDQ-quantized convolution (activations per tensor, weights per output channel) as exported by a
    quantization tool: the quantized values round and saturate where onnxruntime's do."""
    rng = np.random.default_rng(0)
    w = rng.standard_normal((4, 3, 3, 3)).astype(np.float32)
    w_scale = (np.abs(w).reshape(4, -1).max(axis=1) / 127).astype(np.float32)
    inits = {"s": np.float32(0.05), "z": np.uint8(128), "w": np.clip(np.round(w / w_scale[:, None, None, None]),
                                                                     -127, 127).astype(np.int8),
             "ws": w_scale, "wz": np.zeros(4, np.int8)}
    n = helper.make_node
    nodes = [n("QuantizeLinear", ["x", "s", "z"], ["xq"]), n("DequantizeLinear", ["xq", "s", "z"], ["xd"]),
             n("DequantizeLinear", ["w", "ws", "wz"], ["wd"], axis=0), n("Conv", ["xd", "wd"], ["y"], pads=[1] * 4)]
    model = make_model(nodes, [("x", [1, 3, 7, 7])], [("y", [1, 4, 7, 7])], inits, opset=21)
    x = rand((1, 3, 7, 7), 1, np.float32, -8, 8)
    got, want = tg.from_onnx(model).compile()({"x": x})[0], run_onnxruntime(model, {"x": x})[0]
    assert_close(got, want, rtol=1e-4, atol=1e-4)


def test_quantize_refusals():
    """A per-axis scale of the wrong length, a blocked one of the wrong shape, and an output_dtype other than the
    zero point's type are clear errors."""
    with pytest.raises(OnnxImportError, match=r"the scale of shape \[3\] must be a scalar or have shape \[4\]"):
        tg.from_onnx(one_node("QuantizeLinear", [2, 4], TensorProto.FLOAT, TensorProto.UINT8, 1, 0,
                              {"scale": np.ones(3, np.float32)}))
    with pytest.raises(OnnxImportError, match=r"must have shape \[2, 2\] \(blocks of 3 along axis 1\)"):
        tg.from_onnx(one_node("QuantizeLinear", [2, 4], TensorProto.FLOAT, TensorProto.UINT8, 1, 3,
                              {"scale": np.ones((2, 1), np.float32)}))
    with pytest.raises(OnnxImportError, match="output_dtype i16 differs from the zero point's type u8"):
        tg.from_onnx(one_node("QuantizeLinear", [2, 4], TensorProto.FLOAT, TensorProto.UINT8, 1, 0,
                              {"scale": np.ones((), np.float32), "zero": np.zeros((), np.uint8)},
                              output_dtype=TensorProto.INT16))


FOUR_BIT = {TensorProto.INT4: (-8, 7), TensorProto.UINT4: (0, 15)}


def four_bit_matmul(k: int, n: int, elem: int, axis: int, block: int, scale: np.ndarray, weights: np.ndarray,
                    zero: np.ndarray | None):
    """x (2, k) @ DequantizeLinear(4-bit weights (k, n), scale, zero) (opset 21), the weights initializers."""
    names = ["w", "scale"] + ["zero"] * (zero is not None)
    attrs = {"axis": axis} | ({"block_size": block} if block else {})
    nodes = [helper.make_node("DequantizeLinear", names, ["wd"], **attrs), helper.make_node("MatMul", ["x", "wd"], ["y"])]
    inits = [helper.make_tensor("w", elem, [k, n], weights.ravel().tolist()),
             onnx.numpy_helper.from_array(scale, "scale")]
    if zero is not None:
        inits.append(helper.make_tensor("zero", elem, list(zero.shape), zero.ravel().tolist()))
    graph = helper.make_graph(nodes, "int4", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, k])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, n])], initializer=inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21)])
    model.ir_version = 10
    onnx.checker.check_model(model)
    return model


@settings(max_examples=10, deadline=None)
@given(data=st.data(), k=st.sampled_from([1, 4, 7, 16]), n=st.sampled_from([1, 3, 8]),
       elem=st.sampled_from(sorted(FOUR_BIT)), zero=st.booleans(), seed=st.integers(0, 99))
def test_four_bit_weights_dequantized_into_a_matmul(data, k, n, elem, zero, seed):
    """INT4 / UINT4 weights over their whole range, a scale and zero point per tensor, per output column or per
    block of rows (block-wise quantized LLM weights), dequantized and multiplied: as numpy computes it in f64, and
    as onnxruntime does without its graph optimizations (with them, it fuses the pair into a kernel that rounds x
    to 8 bits: 1e-3 off)."""
    import onnxruntime as ort
    axis, block, param_shape = data.draw(granularity([k, n]), label="granularity")
    rng = np.random.default_rng(seed)
    low, high = FOUR_BIT[elem]
    weights = rng.integers(low, high + 1, (k, n))
    scale = rng.uniform(0.01, 0.5, param_shape).astype(np.float32)
    zeros = rng.integers(low, high + 1, param_shape) if zero else None
    model = four_bit_matmul(k, n, elem, axis, block, scale, weights, zeros)
    x = rand((2, k), seed, np.float32)
    got = tg.from_onnx(model).compile()({"x": x})[0]
    dequantized = (weights - (0 if zeros is None else _expanded(zeros, [k, n], axis, block))) * \
        _expanded(scale.astype(np.float64), [k, n], axis, block)
    assert_close(got, (x.astype(np.float64) @ dequantized).astype(np.float32), rtol=1e-5, atol=1e-6)
    options = ort.SessionOptions()
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    session = ort.InferenceSession(model.SerializeToString(), options, providers=["CPUExecutionProvider"])
    assert_close(got, session.run(None, {"x": x})[0], rtol=1e-5, atol=1e-6)


def test_four_bit_constants_go_to_dequantize_linear_only():
    """A 4-bit constant read by any other operator (where its values would wrap and saturate as 8-bit ones) is
    refused, naming what it is; a 4-bit graph input too."""
    weights = helper.make_tensor("w", TensorProto.INT4, [2], [-8, 7])
    graph = helper.make_graph([helper.make_node("Cast", ["w"], ["y"], to=TensorProto.FLOAT)], "int4", [],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2])], initializer=[weights])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21)])
    with pytest.raises(OnnxImportError, match=r"input 0 \('w'\) is a 4-bit integer tensor, where the operator takes a "
                                              r"tensor"):
        tg.from_onnx(model)
    node = helper.make_node("DequantizeLinear", ["x", "s"], ["y"])
    model = helper.make_model(helper.make_graph([node], "int4", [helper.make_tensor_value_info("x", TensorProto.INT4,
                                                                                                 [2])],
                                                [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2])],
                                                initializer=[onnx.numpy_helper.from_array(np.float32(0.5), "s")]),
                              opset_imports=[helper.make_opsetid("", 21)])
    with pytest.raises(UnsupportedOnnxError, match="graph input 'x': data type INT4 is not supported"):
        tg.from_onnx(model)
