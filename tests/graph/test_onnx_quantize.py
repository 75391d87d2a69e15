"""ONNX QuantizeLinear and DequantizeLinear against onnxruntime: hypothesis-drawn shapes (size-1 and prime axes),
scales per tensor, per axis and per block (opset 21), zero points of every 8- and 16-bit integer type or none,
values on rounding ties and past the type's range (saturation); a QDQ pair around a convolution; refusals.
Every kernel the tests launch is also compiled for CUDA by NVRTC (tests/conftest.py)."""
import numpy as np
import pytest
from hypothesis import assume, given, note, settings
from hypothesis import strategies as st
from onnx import TensorProto, helper

import taskdsl.graph as tg
from taskdsl.graph.onnx_import import OnnxImportError

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


def one_node(op_type: str, shape: list, x_elem: int, out_elem: int, axis: int, block: int, inits: dict):
    """A one-node Q or DQ model (opset 21) over x of `shape`, its scale and zero point as initializers."""
    names = ["x", "scale"] + (["zero"] if "zero" in inits else [])
    attrs = {"axis": axis} | ({"block_size": block} if block else {})
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
    """Halves (x / scale on a tie rounds to even) and values past the type's range (saturated)."""
    axis, block, param_shape = data.draw(granularity(shape), label="granularity")
    rng = np.random.default_rng(seed)
    scale = rng.choice(np.array([0.5, 0.25, 2.0, 0.1], np.float32), param_shape)
    info = np.iinfo(INTEGERS[elem])
    inits = {"scale": scale}
    if zero:
        inits["zero"] = rng.integers(info.min // 2, info.max // 2 + 1, param_shape).astype(INTEGERS[elem])
    else:
        assume(elem == TensorProto.UINT8)       # (without a zero point the output is uint8)
    halves = rng.integers(-600, 600, shape) * 0.5          # ties at scale 1
    x = (halves * np.broadcast_to(_expanded(scale, shape, axis, block), shape)).astype(np.float32)
    x.flat[::3] *= 300.0                                     # past the range: saturated
    note(f"x = {x!r}")
    check(one_node("QuantizeLinear", shape, TensorProto.FLOAT, elem, axis, block, inits), x, exact=True)


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
    """A per-axis scale of the wrong length, a blocked one of the wrong shape, and float x for DequantizeLinear are
    clear errors."""
    with pytest.raises(OnnxImportError, match=r"the scale of shape \[3\] must be a scalar or have shape \[4\]"):
        tg.from_onnx(one_node("QuantizeLinear", [2, 4], TensorProto.FLOAT, TensorProto.UINT8, 1, 0,
                              {"scale": np.ones(3, np.float32)}))
    with pytest.raises(OnnxImportError, match=r"must have shape \[2, 2\] \(blocks of 3 along axis 1\)"):
        tg.from_onnx(one_node("QuantizeLinear", [2, 4], TensorProto.FLOAT, TensorProto.UINT8, 1, 3,
                              {"scale": np.ones((2, 1), np.float32)}))
