"""onnxruntime's `com.microsoft` operators (graph/onnx_import/microsoft.py) against two oracles: numpy's evaluation of
their definitions and onnxruntime. The quantized ones (dequantize, the float operator, quantize with halves to even,
saturate; onnxruntime computes some in fixed point or by tables, a quantization step apart at times) over
hypothesis-drawn shapes (size 1, odd and prime), both 8-bit types, and zero points or none; the transformer
optimizer's fused ones (Gelus, FusedMatMul, skip layer norms, Attention, EmbedLayerNormalization); QGemm and the
integer products of dynamically quantized transformers; refusals.
Every kernel the tests launch is also compiled for CUDA by NVRTC (tests/conftest.py)."""
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from onnx import TensorProto, helper, numpy_helper

import taskdsl.graph as tg
from taskdsl.graph.onnx_import import OnnxImportError, UnsupportedOnnxError

from . import make_model, onnxruntime_saturates, run_onnxruntime, tensor_info

pytest.importorskip("onnxruntime")

TYPES = {TensorProto.UINT8: np.uint8, TensorProto.INT8: np.int8}
SIZES = st.sampled_from([1, 2, 3, 5, 7])


def microsoft_model(node, inputs: list, inits: dict, out_elem: int):
    """A one-node model of an operator of another domain (com.microsoft), unchecked: onnx's checker knows no contrib
    schema."""
    graph = helper.make_graph([node], "test", [tensor_info(*i) for i in inputs],
                              [helper.make_tensor_value_info("y", out_elem, None)],
                              [numpy_helper.from_array(np.asarray(v), name=k) for k, v in inits.items()])
    return helper.make_model(graph, ir_version=8, opset_imports=[helper.make_opsetid("", 17),
                                                                 helper.make_opsetid(node.domain, 1)])


def parameters(rng, dtype, zero: bool, name: str) -> dict:
    """A scale and (with `zero`) a zero point, per tensor, named after `name`."""
    info = np.iinfo(dtype)
    params = {f"{name}_scale": np.float32(rng.choice([0.02, 0.05, 0.1, 0.37]))}
    if zero:
        params[f"{name}_zero"] = dtype(rng.integers(info.min // 2, info.max // 2 + 1))
    return params


def inputs_of(name: str, params: dict) -> list:
    """The node's inputs for a quantized tensor `name`: itself, its scale, its zero point ('' where none)."""
    return [name, f"{name}_scale", f"{name}_zero" if f"{name}_zero" in params else ""]


def dequantize(q: np.ndarray, params: dict, name: str) -> np.ndarray:
    zero = np.float32(params.get(f"{name}_zero", 0))
    return (q.astype(np.float32) - zero) * params[f"{name}_scale"]


def quantize(v: np.ndarray, params: dict, name: str, dtype) -> np.ndarray:
    info = np.iinfo(dtype)
    zero = np.float32(params.get(f"{name}_zero", 0))
    return np.clip(np.rint(v / params[f"{name}_scale"]) + zero, info.min, info.max).astype(dtype)


def check(model, feeds: dict, want: np.ndarray, steps: int) -> None:
    """taskdsl's output against the numpy definition and onnxruntime: within `steps` quantization steps of the
    definition (0: equal), and within one of onnxruntime, which runs the operators only with every zero point
    given (its type inference fails on a missing one, which the schema allows)."""
    got = tg.from_onnx(model).compile()(feeds)[0]
    assert got.dtype == want.dtype and got.shape == want.shape
    assert np.abs(got.astype(np.int32) - want).max(initial=0) <= steps
    if "" in model.graph.node[0].input:       # (a zero point left out)
        return
    ort = run_onnxruntime(model, feeds)[0]
    assert np.abs(got.astype(np.int32) - ort).max(initial=0) <= 1


def quantized_input(rng, shape, dtype) -> np.ndarray:
    info = np.iinfo(dtype)
    return rng.integers(info.min, info.max + 1, shape).astype(dtype)


@settings(max_examples=12, deadline=None)
@given(op=st.sampled_from(["QLinearAdd", "QLinearMul"]), shape=st.lists(SIZES, min_size=1, max_size=3),
       broadcast=st.sampled_from(["same", "scalar", "last"]), elem=st.sampled_from(sorted(TYPES)),
       zeros=st.tuples(st.booleans(), st.booleans(), st.booleans()), seed=st.integers(0, 99))
def test_qlinear_add_and_mul(op, shape, broadcast, elem, zeros, seed):
    """A + B / A * B of two quantized tensors, B broadcast, each with its own scale and zero point (or none)."""
    dtype, rng = TYPES[elem], np.random.default_rng(seed)
    other = {"same": shape, "scalar": [1], "last": shape[-1:]}[broadcast]
    a, b = quantized_input(rng, shape, dtype), quantized_input(rng, other, dtype)
    params = {**parameters(rng, dtype, zeros[0], "a"), **parameters(rng, dtype, zeros[1], "b"),
              **parameters(rng, dtype, zeros[2], "c")}
    node = helper.make_node(op, inputs_of("a", params) + inputs_of("b", params) + inputs_of("c", params)[1:], ["y"],
                            domain="com.microsoft")
    model = microsoft_model(node, [("a", shape, elem), ("b", other, elem)], params, elem)
    fn = np.add if op == "QLinearAdd" else np.multiply
    want = quantize(fn(dequantize(a, params, "a"), dequantize(b, params, "b")), params, "c", dtype)
    check(model, {"a": a, "b": b}, want, steps=0)


@settings(max_examples=10, deadline=None)
@given(op=st.sampled_from(["QLinearSigmoid", "QLinearLeakyRelu"]), shape=st.lists(SIZES, min_size=1, max_size=3),
       elem=st.sampled_from(sorted(TYPES)), zeros=st.tuples(st.booleans(), st.booleans()), seed=st.integers(0, 99))
def test_qlinear_activations(op, shape, elem, zeros, seed):
    """Sigmoid (a transcendental: one step from numpy's at a rounding tie) and LeakyRelu with its alpha."""
    dtype, rng = TYPES[elem], np.random.default_rng(seed)
    x = quantized_input(rng, shape, dtype)
    params = {**parameters(rng, dtype, zeros[0], "x"), **parameters(rng, dtype, zeros[1], "y")}
    attrs = {"alpha": 0.3} if op == "QLinearLeakyRelu" else {}
    node = helper.make_node(op, inputs_of("x", params) + inputs_of("y", params)[1:], ["y"], domain="com.microsoft",
                            **attrs)
    v = dequantize(x, params, "x")
    v = 1 / (1 + np.exp(-v.astype(np.float64))) if op == "QLinearSigmoid" else np.where(v >= 0, v, np.float32(0.3) * v)
    want = quantize(v.astype(np.float32), params, "y", dtype)
    check(microsoft_model(node, [("x", shape, elem)], params, elem), {"x": x}, want,
          steps=1 if op == "QLinearSigmoid" else 0)


@pytest.mark.parametrize("channels_last", [0, 1])
@pytest.mark.parametrize("elem", sorted(TYPES))
def test_qlinear_global_average_pool(channels_last, elem):
    """The mean over the spatial axes, channels first or last (onnxruntime rounds its mean in fixed point)."""
    dtype, rng = TYPES[elem], np.random.default_rng(3)
    shape = [2, 7, 5, 3] if channels_last else [2, 3, 7, 5]
    x = quantized_input(rng, shape, dtype)
    params = {**parameters(rng, dtype, True, "x"), **parameters(rng, dtype, True, "y")}
    node = helper.make_node("QLinearGlobalAveragePool", inputs_of("x", params) + inputs_of("y", params)[1:], ["y"],
                            domain="com.microsoft", channels_last=channels_last)
    axes = (1, 2) if channels_last else (2, 3)
    want = quantize(dequantize(x, params, "x").astype(np.float64).mean(axes, keepdims=True).astype(np.float32),
                    params, "y", dtype)
    check(microsoft_model(node, [("x", shape, elem)], params, elem), {"x": x}, want, steps=1)


@pytest.mark.parametrize("channels_last", [0, 1])
@pytest.mark.parametrize("count_include_pad", [0, 1])
def test_qlinear_average_pool(channels_last, count_include_pad):
    """3x3 windows, stride 2, padding 1, channels first or last; against the float AveragePool's mean."""
    dtype, rng = np.uint8, np.random.default_rng(5)
    x = quantized_input(rng, [1, 4, 9, 7], dtype)
    params = {**parameters(rng, dtype, True, "x"), **parameters(rng, dtype, True, "y")}
    window = {"kernel_shape": [3, 3], "strides": [2, 2], "pads": [1, 1, 1, 1], "count_include_pad": count_include_pad}
    node = helper.make_node("QLinearAveragePool", inputs_of("x", params) + inputs_of("y", params)[1:], ["y"],
                            domain="com.microsoft", channels_last=channels_last, **window)
    float_pool = make_model([helper.make_node("AveragePool", ["x"], ["y"], **window)], [("x", [1, 4, 9, 7])],
                            [("y", [1, 4, 5, 4])])
    pooled = run_onnxruntime(float_pool, {"x": dequantize(x, params, "x")})[0]
    want = quantize(pooled, params, "y", dtype)
    feed = x.transpose(0, 2, 3, 1).copy() if channels_last else x
    model = microsoft_model(node, [("x", list(feed.shape), TensorProto.UINT8)], params, TensorProto.UINT8)
    got = tg.from_onnx(model).compile()({"x": feed})[0]
    got = got.transpose(0, 3, 1, 2) if channels_last else got
    assert np.abs(got.astype(np.int32) - want).max() <= 1
    assert np.abs(got.astype(np.int32) - (run_onnxruntime(model, {"x": feed})[0].transpose(0, 3, 1, 2)
                                          if channels_last else run_onnxruntime(model, {"x": feed})[0])).max() <= 1


@pytest.mark.parametrize("opset, axis", [(13, 1), (11, 1), (13, -1)])
def test_qlinear_softmax(opset, axis):
    """Softmax by the semantics of its `opset` attribute (11: over the axes from `axis` on, flattened)."""
    dtype, rng = np.uint8, np.random.default_rng(7)
    x = quantized_input(rng, [2, 3, 5], dtype)
    params = {**parameters(rng, dtype, True, "x"), "y_scale": np.float32(1 / 256), "y_zero": np.uint8(0)}
    node = helper.make_node("QLinearSoftmax", inputs_of("x", params) + inputs_of("y", params)[1:], ["y"],
                            domain="com.microsoft", opset=opset, axis=axis)
    v = dequantize(x, params, "x").astype(np.float64)
    rows = v.reshape(2, 15) if opset == 11 else v
    e = np.exp(rows - rows.max(-1 if opset == 11 else axis, keepdims=True))
    soft = (e / e.sum(-1 if opset == 11 else axis, keepdims=True)).reshape(v.shape)
    want = quantize(soft.astype(np.float32), params, "y", dtype)
    check(microsoft_model(node, [("x", [2, 3, 5], TensorProto.UINT8)], params, TensorProto.UINT8), {"x": x}, want,
          steps=1)


@pytest.mark.parametrize("elem", sorted(TYPES))
def test_qlinear_concat(elem):
    """Three inputs, each with its scale and zero point, requantized by Y's along axis 1."""
    dtype, rng = TYPES[elem], np.random.default_rng(11)
    shapes = [[2, 3, 4], [2, 1, 4], [2, 5, 4]]
    xs = [quantized_input(rng, s, dtype) for s in shapes]
    params = parameters(rng, dtype, True, "y")
    names = []
    for k in range(3):
        params |= parameters(rng, dtype, k != 1, f"x{k}")
        names += inputs_of(f"x{k}", params)
    node = helper.make_node("QLinearConcat", ["y_scale", "y_zero"] + names, ["y"], domain="com.microsoft", axis=1)
    model = microsoft_model(node, [(f"x{k}", s, elem) for k, s in enumerate(shapes)], params, elem)
    want = quantize(np.concatenate([dequantize(x, params, f"x{k}") for k, x in enumerate(xs)], 1), params, "y", dtype)
    check(model, {f"x{k}": x for k, x in enumerate(xs)}, want, steps=0)


def test_refusals_name_what_is_supported():
    """An unknown domain, an unknown com.microsoft operator, a per-axis zero point, a QLinearSoftmax without opset,
    FusedMatMul's batch transposes, an RMS norm's mean, Attention's past state and its missing num_heads."""
    x = ("x", [2, 3], TensorProto.UINT8)
    scalar = {"s": np.float32(0.1), "z": np.uint8(3)}
    cases = [
        (helper.make_node("Foo", ["x"], ["y"], domain="org.example"), scalar,
         r"domain 'org.example' is not supported \(the default ONNX domain and com.microsoft are\)"),
        (helper.make_node("MatMulNBits", ["x"], ["y"], domain="com.microsoft"), scalar,
         r"operator MatMulNBits of domain 'com.microsoft' is not supported; supported operators of com.microsoft: "
         r"Attention, BiasGelu, "),
        (helper.make_node("QLinearSigmoid", ["x", "s", "zz", "s", "z"], ["y"], domain="com.microsoft"),
         {**scalar, "zz": np.array([1, 2, 3], np.uint8)}, r"input 2 \(a zero point\) must be one int8 or uint8"),
        (helper.make_node("QLinearSoftmax", ["x", "s", "z", "s", "z"], ["y"], domain="com.microsoft"), scalar,
         r"attribute 'opset' is required"),
        (helper.make_node("FusedMatMul", ["x", "x"], ["y"], domain="com.microsoft", transBatchA=1), scalar,
         r"transBatchA / transBatchB are not supported"),
        (helper.make_node("SkipSimplifiedLayerNormalization", ["x", "x", "x"], ["y", "mean"], domain="com.microsoft"),
         scalar, r"outputs mean and inv_std_var are not supported"),
        (helper.make_node("Attention", ["x", "x", "", "", "x"], ["y"], domain="com.microsoft", num_heads=1), scalar,
         r"input past is not supported \(no past state\)"),
        (helper.make_node("Attention", ["x", "x"], ["y"], domain="com.microsoft"), scalar,
         r"attribute 'num_heads' is required"),
    ]
    for node, inits, message in cases:
        with pytest.raises(UnsupportedOnnxError if "not supported" in message else OnnxImportError, match=message):
            tg.from_onnx(microsoft_model(node, [x], inits, TensorProto.UINT8))


# ---------------------------------------------------------------- the transformer optimizer's fused operators
def float_model(op: str, inputs: list, inits: dict | None = None, outputs: tuple = ("y",), **attrs):
    """A one-node model of com.microsoft's `op` over f32 inputs ((name, shape); '' for one left out), its outputs
    named `outputs` ('' for one left out; the first is y)."""
    node = helper.make_node(op, [name for name, _ in inputs], list(outputs), domain="com.microsoft", **attrs)
    model = microsoft_model(node, [(n, s, TensorProto.FLOAT) for n, s in inputs if n and n not in (inits or {})],
                            inits or {}, TensorProto.FLOAT)
    model.graph.output.extend(helper.make_tensor_value_info(n, TensorProto.FLOAT, None) for n in outputs[1:] if n)
    return model


def check_float(model, feeds: dict, want: list, rtol: float = 1e-5, eight_bit: bool = False) -> None:
    """taskdsl's outputs against numpy's `want` and onnxruntime's (not for `eight_bit` products where onnxruntime
    saturates them: `onnxruntime_saturates`)."""
    got = tg.from_onnx(model).compile()(feeds)
    ort = None if eight_bit and onnxruntime_saturates() else run_onnxruntime(model, feeds)
    for i, (g, w) in enumerate(zip(got, want)):
        np.testing.assert_allclose(g, w, rtol=rtol, atol=rtol)
        if ort is not None:
            np.testing.assert_allclose(g, ort[i], rtol=rtol, atol=rtol)


@pytest.mark.parametrize("op, bias", [("Gelu", False), ("BiasGelu", True), ("FastGelu", False), ("FastGelu", True),
                                      ("QuickGelu", False)])
def test_gelus(op, bias):
    """Gelu (erf), BiasGelu, FastGelu (tanh; with or without its bias) and QuickGelu (x * sigmoid(1.702 x))."""
    rng = np.random.default_rng(13)
    x, b = (rng.standard_normal((2, 3, 7)) * 3).astype(np.float32), rng.standard_normal(7).astype(np.float32)
    v = (x + b if bias else x).astype(np.float64)
    if op == "QuickGelu":
        want = v / (1 + np.exp(-1.702 * v))
    elif op == "FastGelu":
        want = 0.5 * v * (1 + np.tanh(np.sqrt(2 / np.pi) * (v + 0.044715 * v ** 3)))
    else:
        want = 0.5 * v * (1 + np.vectorize(__import__("math").erf)(v / np.sqrt(2)))
    model = float_model(op, [("x", [2, 3, 7])] + ([("b", [7])] if bias else []))
    check_float(model, {"x": x, **({"b": b} if bias else {})}, [want.astype(np.float32)])


@pytest.mark.parametrize("trans_a, trans_b, alpha", [(0, 0, 1.0), (1, 0, 0.5), (0, 1, 1.0), (1, 1, -2.0)])
def test_fused_matmul(trans_a, trans_b, alpha):
    """alpha * A @ B with A or B transposed in its last two axes; A batched (2, ...), B broadcast."""
    rng = np.random.default_rng(17)
    a = rng.standard_normal((2, 7, 5) if trans_a else (2, 5, 7)).astype(np.float32)
    b = rng.standard_normal((3, 7) if trans_b else (7, 3)).astype(np.float32)
    model = float_model("FusedMatMul", [("a", list(a.shape)), ("b", list(b.shape))], transA=trans_a,
                        transB=trans_b, alpha=alpha)
    want = alpha * np.matmul(a.transpose(0, 2, 1) if trans_a else a, b.T if trans_b else b)
    check_float(model, {"a": a, "b": b}, [want])


@pytest.mark.parametrize("op", ["SkipLayerNormalization", "SkipSimplifiedLayerNormalization"])
@pytest.mark.parametrize("with_beta, with_bias", [(True, True), (False, False), (True, False)])
def test_skip_layer_norms(op, with_beta, with_bias):
    """input + skip (+ bias) normalized over the last axis, times gamma (+ beta); the sum as output 3, and the layer
    norm's mean and 1 / standard deviation as outputs 1 and 2."""
    simplified = op == "SkipSimplifiedLayerNormalization"
    rng = np.random.default_rng(19)
    x, skip = (rng.standard_normal((2, 3, 16)).astype(np.float32) for _ in range(2))
    gamma, beta, bias = (rng.standard_normal(16).astype(np.float32) for _ in range(3))
    inits = {"gamma": gamma} | ({"beta": beta} if with_beta and not simplified else {}) | \
        ({"bias": bias} if with_bias else {})
    names = ["x", "skip", "gamma"] + ([] if simplified else ["beta" if "beta" in inits else ""]) + \
        (["bias"] if with_bias else [])
    outputs = ("y", "", "", "sum") if simplified else ("y", "mean", "inv_std", "sum")   # (the RMS norm has no mean)
    model = float_model(op, [(n, [2, 3, 16] if n in ("x", "skip") else [16]) for n in names], inits, outputs,
                        epsilon=1e-5)
    total = (x + skip + (bias if with_bias else 0)).astype(np.float64)
    if simplified:
        normed = total / np.sqrt((total ** 2).mean(-1, keepdims=True) + 1e-5) * gamma
        want = [normed, total]
    else:
        mean, var = total.mean(-1, keepdims=True), total.var(-1, keepdims=True)
        inv_std = 1 / np.sqrt(var + 1e-5)
        want = [(total - mean) * inv_std * gamma + (beta if "beta" in inits else 0), mean, inv_std, total]
    check_float(model, {"x": x, "skip": skip}, [w.astype(np.float32) for w in want], rtol=2e-5)


def _numpy_attention(x, w, b, heads: int, bias) -> np.ndarray:
    """Multi-head attention of x (B, S, hidden) by packed weights, with an additive (B, 1, S or 1, S) bias."""
    qkv = x.astype(np.float64) @ w + b
    batch, length, hidden = x.shape[0], x.shape[1], w.shape[1] // 3
    q, k, v = (qkv[..., i * hidden:(i + 1) * hidden].reshape(batch, length, heads, -1).transpose(0, 2, 1, 3)
               for i in range(3))
    scores = q @ k.transpose(0, 1, 3, 2) / np.sqrt(hidden // heads) + bias
    p = np.exp(scores - scores.max(-1, keepdims=True))
    y = (p / p.sum(-1, keepdims=True)) @ v
    return y.transpose(0, 2, 1, 3).reshape(batch, length, hidden)


@pytest.mark.parametrize("mask, unidirectional", [("none", 0), ("raw", 0), ("lengths", 0), ("raw", 1), ("none", 1)])
def test_attention(mask, unidirectional):
    """Packed QKV weights and bias, 2 heads, a raw (B, S) mask of 1 / 0 or valid lengths (B,), causal or not."""
    rng = np.random.default_rng(23)
    x = rng.standard_normal((2, 5, 8)).astype(np.float32)
    w, b = (rng.standard_normal((8, 24)) * 0.5).astype(np.float32), rng.standard_normal(24).astype(np.float32)
    lengths = np.array([5, 3], np.int32)
    valid = np.arange(5)[None, :] < lengths[:, None]
    feeds = {"x": x} | ({"m": valid.astype(np.int32)} if mask == "raw" else {"m": lengths} if mask == "lengths" else {})
    inputs = [("x", [2, 5, 8]), ("w", [8, 24]), ("b", [24])] + ([("m", list(feeds["m"].shape))] if "m" in feeds else [])
    node = helper.make_node("Attention", [n for n, _ in inputs], ["y"], domain="com.microsoft", num_heads=2,
                            unidirectional=unidirectional)
    graph_inputs = [(n, s, TensorProto.INT32 if n == "m" else TensorProto.FLOAT) for n, s in inputs if n in feeds]
    model = microsoft_model(node, graph_inputs, {"w": w, "b": b}, TensorProto.FLOAT)
    bias = np.where(valid, 0.0, -10000.0)[:, None, None, :] if mask != "none" else np.zeros((1, 1, 1, 5))
    if unidirectional:
        bias = bias + np.where(np.triu(np.ones((5, 5), bool), 1), -10000.0, 0.0)[None, None]
    check_float(model, feeds, [_numpy_attention(x, w, b, 2, bias).astype(np.float32)], rtol=1e-4)


@pytest.mark.parametrize("segments, mask", [(True, True), (False, False)])
def test_embed_layer_norm(segments, mask):
    """Word, position and segment embeddings added and layer-normalized; the mask's count per row."""
    rng = np.random.default_rng(29)
    ids = rng.integers(0, 11, (2, 6)).astype(np.int32)
    seg = rng.integers(0, 2, (2, 6)).astype(np.int32)
    m = (np.arange(6)[None, :] < np.array([[6], [4]])).astype(np.int32)
    tables = {"word": rng.standard_normal((11, 16)), "pos": rng.standard_normal((8, 16)),
              "segment": rng.standard_normal((2, 16)), "gamma": rng.standard_normal(16),
              "beta": rng.standard_normal(16)}
    tables = {k: v.astype(np.float32) for k, v in tables.items()}
    names = ["ids", "seg" if segments else "", "word", "pos", "segment" if segments else "", "gamma", "beta"] + \
        (["m"] if mask else [])
    node = helper.make_node("EmbedLayerNormalization", names, ["y", "count", "sum"], domain="com.microsoft",
                            epsilon=1e-5)
    feeds = {"ids": ids} | ({"seg": seg} if segments else {}) | ({"m": m} if mask else {})
    model = microsoft_model(node, [(n, [2, 6], TensorProto.INT32) for n in feeds], tables, TensorProto.FLOAT)
    model.graph.output.extend([helper.make_tensor_value_info("count", TensorProto.INT32, None),
                               helper.make_tensor_value_info("sum", TensorProto.FLOAT, None)])
    total = tables["word"][ids] + tables["pos"][np.arange(6)] + (tables["segment"][seg] if segments else 0)
    total = total.astype(np.float64)
    normed = (total - total.mean(-1, keepdims=True)) / np.sqrt(total.var(-1, keepdims=True) + 1e-5)
    got = tg.from_onnx(model).compile()(feeds)
    ort = run_onnxruntime(model, feeds)
    np.testing.assert_allclose(got[0], normed * tables["gamma"] + tables["beta"], rtol=1e-4, atol=1e-4)
    np.testing.assert_allclose(got[0], ort[0], rtol=1e-4, atol=1e-4)
    np.testing.assert_array_equal(got[1], m.sum(1) if mask else np.zeros(2))
    np.testing.assert_array_equal(got[1], ort[1])
    np.testing.assert_allclose(got[2], total, rtol=1e-6, atol=1e-6)
    np.testing.assert_allclose(got[2], ort[2], rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("trans_a, trans_b, quantized_y, per_column, bias, alpha",
                         [(0, 0, False, False, False, 1.0), (1, 1, False, True, True, 0.5),
                          (0, 1, True, False, True, 1.0), (1, 0, True, True, False, 2.0)])
def test_qgemm(trans_a, trans_b, quantized_y, per_column, bias, alpha):
    """alpha * (A - za) @ (B - zb) * a_scale * b_scale + C * a_scale * b_scale (C an int32 bias), f32 or requantized
    by Y's scale and zero point; B's scale and zero point per tensor or per column; A or B transposed."""
    rng = np.random.default_rng(31)
    m, k, n = 5, 7, 3
    a = rng.integers(0, 256, (k, m) if trans_a else (m, k)).astype(np.uint8)
    b = rng.integers(-128, 128, (n, k) if trans_b else (k, n)).astype(np.int8)
    inits = {"a_scale": np.float32(0.02), "a_zero": np.uint8(120),
             "b_scale": (rng.uniform(0.01, 0.05, n) if per_column else np.float32(0.03)).astype(np.float32),
             "b_zero": (rng.integers(-3, 4, n) if per_column else np.int8(2)).astype(np.int8),
             "c": rng.integers(-500, 500, n).astype(np.int32), "y_scale": np.float32(0.25), "y_zero": np.uint8(128)}
    names = ["a", "a_scale", "a_zero", "b", "b_scale", "b_zero", "c" if bias else ""] + \
        (["y_scale", "y_zero"] if quantized_y else [])
    node = helper.make_node("QGemm", names, ["y"], domain="com.microsoft", transA=trans_a, transB=trans_b, alpha=alpha)
    out = TensorProto.UINT8 if quantized_y else TensorProto.FLOAT
    model = microsoft_model(node, [("a", list(a.shape), TensorProto.UINT8), ("b", list(b.shape), TensorProto.INT8)],
                            {k: v for k, v in inits.items() if k in names}, out)
    at, bt = (a.T if trans_a else a).astype(np.int64), (b.T if trans_b else b).astype(np.int64)
    product = (at - 120) @ (bt - inits["b_zero"].astype(np.int64)) + (inits["c"] if bias else 0)
    value = alpha * product * (np.float32(0.02) * inits["b_scale"]).astype(np.float64)
    got = tg.from_onnx(model).compile()({"a": a, "b": b})[0]
    if quantized_y:
        np.testing.assert_array_equal(got, np.clip(np.rint(value / 0.25) + 128, 0, 255))
    else:
        np.testing.assert_allclose(got, value, rtol=1e-6, atol=1e-6)
    if onnxruntime_saturates():     # its full-range 8-bit products are no oracle on this host
        return
    ort = run_onnxruntime(model, {"a": a, "b": b})[0]
    if quantized_y:
        assert np.abs(got.astype(np.int32) - ort).max() <= 1
    else:
        np.testing.assert_allclose(got, ort, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("per_column, zeros", [(False, True), (True, True), (False, False)])
def test_integer_products_to_float(per_column, zeros):
    """MatMulIntegerToFloat (uint8 A, int8 B, their scales and zero points, a float bias) and DynamicQuantizeMatMul
    (float A quantized as DynamicQuantizeLinear quantizes it): the exact product, scaled."""
    rng = np.random.default_rng(41)
    a, a_float = rng.integers(0, 256, (2, 5, 7)).astype(np.uint8), rng.standard_normal((2, 5, 7)).astype(np.float32)
    b = rng.integers(-128, 128, (7, 3)).astype(np.int8)
    b_scale = (rng.uniform(0.01, 0.05, 3) if per_column else np.float32(0.03)).astype(np.float32)
    b_zero = (rng.integers(-3, 4, 3) if per_column else np.int8(2)).astype(np.int8)
    bias = rng.standard_normal(3).astype(np.float32)
    inits = {"b": b, "a_scale": np.float32(0.02), "a_zero": np.uint8(120), "b_scale": b_scale, "b_zero": b_zero,
             "bias": bias}
    zero_names = ["a_zero", "b_zero"] if zeros else ["", ""]
    node = helper.make_node("MatMulIntegerToFloat", ["a", "b", "a_scale", "b_scale"] + zero_names + ["bias"], ["y"],
                            domain="com.microsoft")
    model = microsoft_model(node, [("a", [2, 5, 7], TensorProto.UINT8)],
                            {k: v for k, v in inits.items() if k not in ("a_zero", "b_zero") or zeros},
                            TensorProto.FLOAT)
    za, zb = (120, b_zero.astype(np.int64)) if zeros else (0, 0)
    want = ((a.astype(np.int64) - za) @ (b.astype(np.int64) - zb)) * (np.float32(0.02) * b_scale).astype(np.float64)
    check_float(model, {"a": a}, [(want + bias).astype(np.float32)], rtol=1e-5, eight_bit=True)
    node = helper.make_node("DynamicQuantizeMatMul", ["a", "b", "b_scale", zero_names[1], "bias"], ["y"],
                            domain="com.microsoft")
    model = microsoft_model(node, [("a", [2, 5, 7], TensorProto.FLOAT)],
                            {k: inits[k] for k in ("b", "b_scale", "bias") + (("b_zero",) if zeros else ())},
                            TensorProto.FLOAT)
    high, low = max(a_float.max(), 0), min(a_float.min(), 0)
    scale = np.float32((high - low) / 255)
    zero = np.clip(np.rint(-low / scale), 0, 255)
    q = np.clip(np.rint(a_float / scale) + zero, 0, 255)
    want = ((q - zero) @ (b.astype(np.int64) - zb)) * (scale * b_scale).astype(np.float64)
    check_float(model, {"a": a_float}, [(want + bias).astype(np.float32)], rtol=1e-5, eight_bit=True)


def test_qattention():
    """QAttention: the 8-bit input and weight multiplied exactly, scaled, the bias added, attended with a raw mask."""
    rng = np.random.default_rng(43)
    x = rng.integers(0, 256, (2, 5, 8)).astype(np.uint8)
    w = rng.integers(-128, 128, (8, 24)).astype(np.int8)
    b = rng.standard_normal(24).astype(np.float32)
    lengths = np.array([5, 3])
    valid = np.arange(5)[None, :] < lengths[:, None]
    inits = {"w": w, "b": b, "x_scale": np.float32(0.01), "w_scale": np.float32(0.02), "x_zero": np.uint8(128),
             "w_zero": np.int8(0)}
    node = helper.make_node("QAttention", ["x", "w", "b", "x_scale", "w_scale", "m", "x_zero", "w_zero"], ["y"],
                            domain="com.microsoft", num_heads=2)
    model = microsoft_model(node, [("x", [2, 5, 8], TensorProto.UINT8), ("m", [2, 5], TensorProto.INT32)], inits,
                            TensorProto.FLOAT)
    xf = (x.astype(np.float64) - 128) * np.float32(0.01)
    wf = w.astype(np.float64) * np.float32(0.02)
    bias = np.where(valid, 0.0, -10000.0)[:, None, None, :]
    want = _numpy_attention(xf, wf, b, 2, bias)
    check_float(model, {"x": x, "m": valid.astype(np.int32)}, [want.astype(np.float32)], rtol=1e-4, eight_bit=True)
