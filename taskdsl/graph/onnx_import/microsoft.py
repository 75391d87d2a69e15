"""Converters of onnxruntime's operators in the `com.microsoft` domain: the quantized ones its quantizer writes into a
model of QOperator format (`quantize_static(..., quant_format=QuantFormat.QOperator)`): QLinearAdd, QLinearMul,
QLinearSigmoid, QLinearLeakyRelu, QLinearSoftmax, QLinearGlobalAveragePool, QLinearAveragePool, QLinearConcat, QGemm,
and those of its dynamically quantized transformers (MatMulIntegerToFloat, DynamicQuantizeMatMul, QAttention); and the
fused ones its transformer optimizer writes (`onnxruntime.transformers.optimizer`): Gelu, BiasGelu, FastGelu, QuickGelu,
FusedMatMul, SkipLayerNormalization, SkipSimplifiedLayerNormalization, EmbedLayerNormalization and Attention, each the
default domain's operators it stands for.

Each quantized one but QGemm and the integer products (the exact product of MatMulInteger, scaled) is its float operator
between a dequantization of its 8-bit inputs and a quantization of the result, as the operators' definitions say: x = (q
- zero_point) * scale per input, y = saturate(round(f(x...) / y_scale) + y_zero_point) (halves to even), scales and zero
points per tensor. The float operator is the default domain's own converter (`float_operator`), so QLinearAveragePool
pools exactly as AveragePool does. onnxruntime computes some of them in fixed point or by tables, one step apart from
the definition at times (the tests allow that step).
"""
from __future__ import annotations

import numpy as np
from onnx import helper

from .. import ops
from ..tensor import constant
from .errors import OnnxImportError
from .node import CONVERTERS, Node, converts
from .quantize import QUANTIZED, requantized, saturated

MICROSOFT = "com.microsoft"
WINDOW_ATTRS = ("auto_pad", "kernel_shape", "pads", "strides", "ceil_mode", "count_include_pad")


def dequantized(node: Node, k: int):
    """Input k (8-bit integers) as f32 values, by its scale (input k + 1) and optional zero point (k + 2)."""
    q = node.input(k)
    if q.dtype.name not in QUANTIZED:
        raise node.error(f"data type {q.dtype.name} is not supported for input {k} (int8, uint8)")
    scale, zero = _per_tensor(node, k + 1, k + 2)
    centred = ops.cast(q, "float32") if zero is None else ops.sub(ops.cast(q, "float32"), ops.cast(zero, "float32"))
    return ops.mul(centred, scale)


def quantized(node: Node, value, k: int, like):
    """`value` (f32) quantized by the scale of input k and the optional zero point of input k + 1, into the zero
    point's type (without one, the type of `like`, the first quantized input)."""
    scale, zero = _per_tensor(node, k, k + 1)
    return saturated(ops.div(value, scale), zero, (like if zero is None else zero).dtype.name)


def _per_tensor(node: Node, k_scale: int, k_zero: int) -> tuple:
    """(the f32 scale of input k_scale, the zero point of input k_zero or None), each one element as a scalar."""
    scale = node.input(k_scale)
    zero = node.input(k_zero, required=False)
    if not scale.dtype.is_float or scale.size != 1:
        raise node.error(f"input {k_scale} (a scale) must be one float, got {scale.dtype.name}{list(scale.shape)}",
                         OnnxImportError)
    if zero is not None and (zero.size != 1 or zero.dtype.name not in QUANTIZED):
        raise node.error(f"input {k_zero} (a zero point) must be one int8 or uint8, got "
                         f"{zero.dtype.name}{list(zero.shape)} (per-tensor quantization only)", OnnxImportError)
    return (ops.cast(ops.reshape(scale, ()), "float32"),
            None if zero is None else ops.reshape(zero, ()))


def float_operator(node: Node, op_type: str, inputs: list, opset: int | None = None, outputs: int = 1, **attrs):
    """The default domain's `op_type` with `attrs` applied to the graph tensors `inputs` (None: left out), by its
    own converter: its first output, or with `outputs` > 1 that many."""
    names = ["" if t is None else f"{node.name}/{op_type}/{k}" for k, t in enumerate(inputs)]
    results = [f"{node.name}/{op_type}:{k}" for k in range(outputs)]
    proto = helper.make_node(op_type, names, results, name=node.name, **attrs)
    env = {name: t for name, t in zip(names, inputs) if t is not None}
    converted = CONVERTERS[op_type].fn(Node(proto, env, opset or node.opset))
    return converted[0] if outputs == 1 else converted[:outputs]


def _channels_first(node: Node, x, op_type: str, **attrs):
    """`op_type` over x, whose channels are last where the node's `channels_last` says so (then moved there and
    back around the operator)."""
    if not node.flag("channels_last"):
        return float_operator(node, op_type, [x], **attrs)
    last = list(range(x.ndim))
    first = [0, x.ndim - 1] + last[1:-1]
    y = float_operator(node, op_type, [ops.transpose(x, first)], **attrs)
    return ops.transpose(y, [0] + last[2:] + [1])


@converts("QLinearAdd", "QLinearMul", domain=MICROSOFT)
def qlinear_binary(node: Node) -> list:
    """QLinearAdd / QLinearMul (A, its scale and zero point, B, its, C's): A + B or A * B, broadcast."""
    a = node.input(0)
    total = float_operator(node, node.op_type[len("QLinear"):], [dequantized(node, 0), dequantized(node, 3)])
    return [quantized(node, total, 6, a)]


@converts("QLinearSigmoid", "QLinearLeakyRelu", attrs=("alpha",), domain=MICROSOFT)
def qlinear_activation(node: Node) -> list:
    """QLinearSigmoid / QLinearLeakyRelu (alpha, default 0.01) of X (X, its scale and zero point, Y's)."""
    attrs = {"alpha": float(node.attr("alpha", 0.01))} if node.op_type == "QLinearLeakyRelu" else {}
    y = float_operator(node, node.op_type[len("QLinear"):], [dequantized(node, 0)], **attrs)
    return [quantized(node, y, 3, node.input(0))]


@converts("QLinearSoftmax", attrs=("axis", "opset"), domain=MICROSOFT)
def qlinear_softmax(node: Node) -> list:
    """QLinearSoftmax: Softmax of the opset its `opset` attribute names (before 13: over the axes from `axis` on)."""
    opset = node.attr("opset")
    if opset is None:
        raise node.error("attribute 'opset' is required (the Softmax semantics it follows)", OnnxImportError)
    y = float_operator(node, "Softmax", [dequantized(node, 0)], opset=int(opset),
                       **({"axis": int(node.attr("axis"))} if node.attr("axis") is not None else {}))
    return [quantized(node, y, 3, node.input(0))]


@converts("QLinearGlobalAveragePool", attrs=("channels_last",), domain=MICROSOFT)
def qlinear_global_average_pool(node: Node) -> list:
    """QLinearGlobalAveragePool, channels first (NCHW) or, with channels_last, last (NHWC)."""
    y = _channels_first(node, dequantized(node, 0), "GlobalAveragePool")
    return [quantized(node, y, 3, node.input(0))]


@converts("QLinearAveragePool", attrs=WINDOW_ATTRS + ("channels_last",), domain=MICROSOFT)
def qlinear_average_pool(node: Node) -> list:
    """QLinearAveragePool: AveragePool's windows (pads, strides, ceil mode, count_include_pad), channels first or
    last."""
    attrs = {name: node.attr(name) for name in WINDOW_ATTRS if node.attr(name) is not None}
    y = _channels_first(node, dequantized(node, 0), "AveragePool", **attrs)
    return [quantized(node, y, 3, node.input(0))]


@converts("QLinearConcat", attrs=("axis",), domain=MICROSOFT)
def qlinear_concat(node: Node) -> list:
    """QLinearConcat (Y's scale and zero point, then each input with its scale and zero point) along `axis`."""
    if node.num_inputs < 5 or (node.num_inputs - 2) % 3:
        raise node.error(f"takes Y's scale and zero point, then (tensor, scale, zero point) triples; got "
                         f"{node.num_inputs} inputs", OnnxImportError)
    parts = [dequantized(node, k) for k in range(2, node.num_inputs, 3)]
    y = float_operator(node, "Concat", parts, axis=int(node.attr("axis")))
    return [quantized(node, y, 0, node.input(2))]


@converts("QGemm", attrs=("alpha", "transA", "transB"), domain=MICROSOFT)
def qgemm(node: Node) -> list:
    """QGemm (A, its scale and zero point, B, its (per tensor or per column), the optional int32 bias C, Y's
    optional scale and zero point): alpha * (A - za) @ (B - zb) * a_scale * b_scale, C added to the exact int32
    product (C's scale is a_scale * b_scale); f32 without Y's scale, else requantized as QLinearMatMul is."""
    a, b = (node.input(k) for k in (0, 3))
    if a.ndim != 2 or b.ndim != 2:
        raise node.error(f"A and B must be 2-D, got shapes {list(a.shape)} and {list(b.shape)}", OnnxImportError)
    a, b = (ops.transpose(t) if node.flag(flag) else t for t, flag in ((a, "transA"), (b, "transB")))
    product = float_operator(node, "MatMulInteger", [a, b, node.input(2, required=False),
                                                     node.input(5, required=False)])
    product = ops.cast(_plus(product, node.input(6, required=False)), "float64")
    alpha = float(node.attr("alpha", 1.0))
    product = product if alpha == 1.0 else ops.mul(product, alpha)
    y_scale = node.input(7, required=False)
    if y_scale is not None:
        y_zero = node.input(8, required=False)
        return [requantized(node, product, (node.input(1), node.input(4), y_scale), -1,
                            y_zero, "uint8" if y_zero is None else y_zero.dtype.name)]
    return [ops.cast(ops.mul(product, _product_scale(node, node.input(1), node.input(4))), "float32")]


# ---------------------------------------------------------------- the transformer optimizer's fused operators
@converts("Gelu", "BiasGelu", "FastGelu", domain=MICROSOFT)
def gelu(node: Node) -> list:
    """Gelu (exact, by erf), BiasGelu (Gelu of A + B) and FastGelu (the tanh approximation, of X + the optional
    bias), as onnxruntime's transformer optimizer fuses them."""
    x, bias = node.input(0), node.input(1, required=False)
    if node.op_type != "Gelu" and bias is not None:
        x = ops.add(x, bias)
    approximate = "tanh" if node.op_type == "FastGelu" else "none"
    return [float_operator(node, "Gelu", [x], opset=20, approximate=approximate)]


@converts("QuickGelu", attrs=("alpha",), domain=MICROSOFT)
def quick_gelu(node: Node) -> list:
    """QuickGelu: x * sigmoid(alpha * x) (alpha 1.702 by default)."""
    x = node.input(0)
    return [ops.mul(x, ops.sigmoid(ops.mul(x, float(node.attr("alpha", 1.702)))))]


@converts("FusedMatMul", attrs=("alpha", "transA", "transB", "transBatchA", "transBatchB"), domain=MICROSOFT)
def fused_matmul(node: Node) -> list:
    """FusedMatMul: alpha * A @ B, A or B transposed in its last two axes (transA / transB)."""
    if node.flag("transBatchA") or node.flag("transBatchB"):
        raise node.error("transBatchA / transBatchB are not supported (transA and transB are)")
    a, b = node.input(0), node.input(1)

    def last_two_swapped(t, flag: str):
        if not node.flag(flag) or t.ndim < 2:
            return t
        return ops.transpose(t, list(range(t.ndim - 2)) + [t.ndim - 1, t.ndim - 2])
    y = float_operator(node, "MatMul", [last_two_swapped(a, "transA"), last_two_swapped(b, "transB")])
    alpha = float(node.attr("alpha", 1.0))
    return [y if alpha == 1.0 else ops.mul(y, alpha)]


@converts("SkipLayerNormalization", "SkipSimplifiedLayerNormalization", attrs=("epsilon",), domain=MICROSOFT)
def skip_layer_norm(node: Node) -> list:
    """SkipLayerNormalization (input, skip, gamma, beta, bias) / SkipSimplifiedLayerNormalization (input, skip,
    gamma, bias): input + skip (+ bias) normalized over the last axis, by a layer norm (beta added) or an RMS norm;
    outputs the normalized sum, its mean and 1 / standard deviation (the layer norm's), and the sum."""
    simplified = node.op_type == "SkipSimplifiedLayerNormalization"
    bias_at = 3 if simplified else 4
    total = _plus(ops.add(node.input(0), node.input(1)), node.input(bias_at, required=False))
    eps, stats = float(node.attr("epsilon", 1e-12)), node.wanted(1) or node.wanted(2)
    if simplified and stats:
        raise node.error("outputs mean and inv_std_var are not supported (output and input_skip_bias_sum are)")
    if simplified:
        return [float_operator(node, "RMSNormalization", [total, node.input(2)], opset=23, epsilon=eps), None, None,
                total]
    normed = float_operator(node, "LayerNormalization", [total, node.input(2), node.input(3, required=False)],
                            outputs=3 if stats else 1, epsilon=eps)
    return (normed if stats else [normed, None, None]) + [total]


# where com.microsoft's Attention and QAttention take their mask and past state, and what they call them
ATTENTION_INPUTS = {"Attention": {"mask_index": 3, "past": 4, "attention_bias": 5, "past_sequence_length": 6},
                    "QAttention": {"mask_index": 5, "past": 8}}


@converts("Attention", attrs=("num_heads", "unidirectional", "qkv_hidden_sizes", "mask_filter_value", "scale",
                              "do_rotary"), domain=MICROSOFT)
def attention(node: Node) -> list:
    """com.microsoft's Attention: input (B, S, hidden) @ weights (+ bias) split into Q, K and V (qkv_hidden_sizes,
    else thirds), num_heads heads each, attended by the default domain's Attention with an additive mask built as
    onnxruntime builds it: mask_filter_value (-10000) where mask_index (a (B, S) or (B, S, S) raw mask of 1 / 0, or
    (B,) valid lengths) masks, and after the query's position where unidirectional, attention_bias added. No past
    state (past, past_sequence_length, present) and no rotary embedding."""
    heads = _attention_heads(node)
    qkv = float_operator(node, "MatMul", [node.input(0), node.input(1)])
    return _attended(node, heads, _plus(qkv, node.input(2, required=False)))


@converts("QAttention", attrs=("num_heads", "unidirectional", "mask_filter_value", "scale", "do_rotary"),
          domain=MICROSOFT)
def qattention(node: Node) -> list:
    """QAttention: Attention whose 8-bit input and weight (input_scale, weight_scale, zero points) are multiplied
    exactly (`MatMulIntegerToFloat`), the float bias added."""
    heads = _attention_heads(node)
    qkv = _integer_product_in_float(node, node.input(0), node.input(1), node.input(3), node.input(4),
                                    node.input(6, required=False), node.input(7, required=False))
    return _attended(node, heads, ops.add(qkv, node.input(2)))


def _attention_heads(node: Node) -> int:
    """com.microsoft's (Q)Attention's num_heads, once what it does not support is refused."""
    inputs = ATTENTION_INPUTS[node.op_type]
    for name in ("past", "past_sequence_length"):
        if name in inputs and node.input(inputs[name], required=False) is not None:
            raise node.error(f"input {name} is not supported (no past state)")
    if node.wanted(1) or node.attr("do_rotary", 0):
        raise node.error("the present output and do_rotary are not supported (no past state, no rotary embedding)")
    if node.attr("num_heads") is None:
        raise node.error("attribute 'num_heads' is required", OnnxImportError)
    return int(node.attr("num_heads"))


def _attended(node: Node, heads: int, qkv) -> list:
    """(Attention's output, None for its present state) from the projected (B, S, Q + K + V) `qkv`."""
    inputs = ATTENTION_INPUTS[node.op_type]
    sizes = node.attr("qkv_hidden_sizes") or [qkv.shape[-1] // 3] * 3
    if len(sizes) != 3 or sum(sizes) != qkv.shape[-1]:
        raise node.error(f"qkv_hidden_sizes {list(sizes)} must be three sizes adding up to the weights' "
                         f"{qkv.shape[-1]} columns", OnnxImportError)
    starts = np.cumsum([0] + list(sizes))
    q, k, v = (ops.slice(qkv, [int(starts[i])], [int(starts[i + 1])], [qkv.ndim - 1]) for i in range(3))
    bias = _attention_bias(node, inputs, qkv.shape[0], qkv.shape[1])
    attrs = {"scale": float(node.attr("scale"))} if node.attr("scale") else {}
    return [float_operator(node, "Attention", [q, k, v, bias], opset=23, q_num_heads=heads, kv_num_heads=heads,
                           **attrs), None]


def _attention_bias(node: Node, inputs: dict, batch: int, length: int):
    """The additive (B or 1, 1 or heads, S, S) bias of com.microsoft's Attention (see `attention`), or None."""
    fill = float(node.attr("mask_filter_value", -10000.0))
    terms = []
    mask = node.input(inputs["mask_index"], required=False)
    if mask is not None:
        if mask.ndim == 1 and mask.shape[0] == batch:       # valid lengths: keys from the length on are masked
            keys = constant(np.arange(length, dtype=np.int64).reshape(1, length))
            valid = ops.less(keys, ops.reshape(ops.cast(mask, "int64"), (batch, 1)))
        elif mask.ndim in (2, 3) and mask.shape[0] == batch and mask.shape[-1] == length:
            valid = ops.greater(mask, constant(np.zeros((), mask.numpy_dtype)))
        else:
            raise node.error(f"mask_index of shape {list(mask.shape)} is not supported ((B,) valid lengths, or a "
                             f"(B, S) or (B, S, S) raw mask)")
        valid = ops.reshape(valid, (batch, 1, 1 if valid.ndim == 2 else length, length))
        terms.append(ops.where(valid, constant(np.float32(0)), constant(np.float32(fill))))
    if node.attr("unidirectional", 0):
        later = np.triu(np.ones((length, length), bool), 1)
        terms.append(constant(np.where(later, np.float32(fill), np.float32(0)).reshape(1, 1, length, length)))
    if "attention_bias" in inputs and node.input(inputs["attention_bias"], required=False) is not None:
        terms.append(node.input(inputs["attention_bias"]))
    bias = terms[0] if terms else None
    for term in terms[1:]:
        bias = ops.add(bias, term)
    return bias


def _integer_product_in_float(node: Node, a, b, a_scale, b_scale, a_zero, b_zero):
    """(a - a_zero) @ (b - b_zero), exact in int32 (MatMulInteger), times a_scale * b_scale (b's per tensor or per
    column) in f64, as f32."""
    product = ops.cast(float_operator(node, "MatMulInteger", [a, b, a_zero, b_zero]), "float64")
    return ops.cast(ops.mul(product, _product_scale(node, a_scale, b_scale)), "float32")


def _product_scale(node: Node, a_scale, b_scale):
    """a_scale * b_scale (a's one value, b's per tensor or per column), in f32, as f64."""
    if a_scale.size != 1:
        raise node.error(f"the first operand's scale must be one value, got shape {list(a_scale.shape)}",
                         OnnxImportError)
    return ops.cast(ops.mul(ops.cast(ops.reshape(a_scale, ()), "float32"), ops.cast(b_scale, "float32")), "float64")


def _plus(x, addend):
    """x + addend, or x where the optional addend is left out (None)."""
    return x if addend is None else ops.add(x, addend)


@converts("MatMulIntegerToFloat", domain=MICROSOFT)
def matmul_integer_to_float(node: Node) -> list:
    """MatMulIntegerToFloat (A, B, a_scale, b_scale, zero points, float bias): the exact 8-bit product, scaled."""
    y = _integer_product_in_float(node, node.input(0), node.input(1), node.input(2), node.input(3),
                                  node.input(4, required=False), node.input(5, required=False))
    return [_plus(y, node.input(6, required=False))]


@converts("DynamicQuantizeMatMul", domain=MICROSOFT)
def dynamic_quantize_matmul(node: Node) -> list:
    """DynamicQuantizeMatMul (float A, 8-bit B, b_scale, b_zero_point, bias): A quantized as DynamicQuantizeLinear
    quantizes it, then MatMulIntegerToFloat."""
    a, a_scale, a_zero = float_operator(node, "DynamicQuantizeLinear", [node.input(0)], outputs=3)
    y = _integer_product_in_float(node, a, node.input(1), a_scale, node.input(2), a_zero,
                                  node.input(3, required=False))
    return [_plus(y, node.input(4, required=False))]


@converts("EmbedLayerNormalization", attrs=("epsilon", "mask_index_type"), domain=MICROSOFT)
def embed_layer_norm(node: Node) -> list:
    """EmbedLayerNormalization: the word, position (position_ids, else 0..S-1) and optional segment embeddings of
    (B, S) ids added and layer-normalized (gamma, beta; epsilon 1e-12); outputs the result, mask_index (the
    mask's count of nonzero entries per batch row, int32; zeros without a mask) and the embeddings' sum."""
    ids = node.input(0)
    batch, length = ids.shape
    segments, positions, mask = (node.input(k, required=False) for k in (1, 8, 7))
    if positions is None:
        positions = constant(np.arange(length, dtype=np.int64).reshape(1, length))
    total = ops.add(ops.gather(node.input(2), ids), ops.gather(node.input(3), positions))
    if segments is not None:
        total = ops.add(total, ops.gather(node.input(4), segments))
    y = float_operator(node, "LayerNormalization", [total, node.input(5), node.input(6, required=False)],
                       epsilon=float(node.attr("epsilon", 1e-12)))
    count = (constant(np.zeros(batch, np.int32)) if mask is None else
             ops.sum(ops.cast(ops.greater(mask, constant(np.zeros((), mask.numpy_dtype))), "int32"), 1))
    return [y, count, total]
