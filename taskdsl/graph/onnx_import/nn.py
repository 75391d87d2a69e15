"""Converters of network layers: Conv, Gemm, MatMul, normalizations, pooling and unpooling, LRN, Dropout,
Identity."""
from __future__ import annotations

import math

import numpy as np

from .. import ops
from ..ops.axes import normalize_axis
from ..ops.elementwise import broadcast_shape
from ..ops.norm import LayerNorm
from ..tensor import constant
from . import qdq
from .elementwise import in_f32
from .errors import OnnxImportError
from .node import Node, converts
from .windows import WINDOW_ATTRS, window


@converts("Conv", attrs=WINDOW_ATTRS + ("group",))
def conv(node: Node) -> list:
    """Conv (1-3 spatial axes, groups, dilations, auto_pad) with an optional bias (of dequantized 8-bit operands:
    `qdq.conv`)."""
    x, w, bias = node.input(0), node.input(1), node.input(2, required=False) if node.num_inputs > 2 else None
    kernel = tuple(node.attr("kernel_shape", w.shape[2:]))
    if kernel != w.shape[2:]:
        raise node.error(f"kernel_shape {kernel} does not match the weight's {w.shape[2:]}", OnnxImportError)
    strides, pads, dilations = window(node, x, kernel)
    return [qdq.conv(x, w, bias, strides, pads, dilations, node.attr("group", 1))]


@converts("Gemm", attrs=("alpha", "beta", "transA", "transB"))
def gemm(node: Node) -> list:
    """Gemm: alpha * A' @ B' + beta * C as transpose / matmul / mul / add ops."""
    a, b = node.input(0), node.input(1)
    c = node.input(2, required=False) if node.num_inputs > 2 else None
    if a.ndim != 2 or b.ndim != 2:
        raise node.error(f"A and B must be matrices, got shapes {a.shape} and {b.shape} (MatMul takes other ranks)",
                         OnnxImportError)
    a = ops.transpose(a) if node.flag("transA") else a
    b = ops.transpose(b) if node.flag("transB") else b
    product_shape = (a.shape[0], b.shape[1])
    if c is not None and broadcast_shape([c.shape, product_shape], "Gemm") != product_shape:
        raise node.error(f"C of shape {c.shape} does not broadcast to the result's shape {product_shape}",
                         OnnxImportError)
    alpha, beta = float(node.attr("alpha", 1.0)), float(node.attr("beta", 1.0))
    if a.dtype.is_integer:      # an integer Gemm (opset 13) scales by whole numbers, as integers
        if not (alpha.is_integer() and beta.is_integer()):
            raise node.error(f"an integer Gemm needs whole alpha and beta, got {alpha} and {beta}", OnnxImportError)
        alpha, beta = int(alpha), int(beta)
    c = c if beta != 0.0 else None

    def scaled(a, b, c=None):
        y = qdq.matmul(a, b)
        y = ops.mul(y, alpha) if alpha != 1.0 else y
        return y if c is None else ops.add(y, c if beta == 1.0 else ops.mul(c, beta))
    if alpha == 1.0:        # (a 16-bit A @ B that alpha scales into range would overflow before it: in f32 then)
        return [scaled(a, b, c)]
    return [in_f32(scaled, a, b, *([] if c is None else [c]))]


@converts("MatMul")
def matmul(node: Node) -> list:
    """MatMul with numpy semantics (of dequantized 8-bit operands: `qdq.matmul`)."""
    return [qdq.matmul(node.input(0), node.input(1))]


@converts("BatchNormalization", attrs=("epsilon", "momentum", "training_mode"))
def batch_norm(node: Node) -> list:
    """BatchNormalization; with training_mode=1, normalized by the batch's statistics (over every axis but the
    channels'), with the running mean and variance updated by `momentum` as outputs 1 and 2."""
    x, scale, bias, mean, var = (node.input(k) for k in range(5))
    eps = float(node.attr("epsilon", 1e-5))
    if not node.flag("training_mode"):
        return [ops.batch_norm(x, mean, var, scale, bias, eps)]
    axes = [a for a in range(x.ndim) if a != 1]
    batch_mean = ops.mean(x, axes, keepdims=True)
    centered = ops.sub(x, batch_mean)
    batch_var = ops.mean(ops.mul(centered, centered), axes)
    batch_mean = ops.reshape(batch_mean, (x.shape[1],))
    momentum = float(node.attr("momentum", 0.9))

    def running(old, new):
        return ops.add(ops.mul(old, momentum), ops.mul(new, 1.0 - momentum))

    return [ops.batch_norm(x, batch_mean, batch_var, scale, bias, eps), running(mean, batch_mean),
            running(var, batch_var)]


@converts("LayerNormalization", "RMSNormalization", attrs=("axis", "epsilon", "stash_type"))
def layer_norm(node: Node) -> list:
    """LayerNormalization (with the Mean and InvStdDev outputs when they are used) and RMSNormalization (opset 23)."""
    if node.attr("stash_type", 1) != 1:
        raise node.error(f"stash_type={node.attr('stash_type')} is not supported (1: statistics in float32)")
    rms = node.op_type == "RMSNormalization"
    x, scale = node.input(0), node.input(1)
    bias = node.input(2, required=False) if node.num_inputs > 2 and not rms else None
    axis = normalize_axis(node.attr("axis", -1), x.ndim, node.op_type)
    for what, p in (("Scale", scale), ("B", bias)):
        if p is not None and p.ndim > x.ndim:
            raise node.error(f"{what} has {p.ndim} axes, more than X's {x.ndim}", OnnxImportError)
    attrs = {"axis": axis, "eps": float(node.attr("epsilon", 1e-5)), "has_weight": True,
             "has_bias": bias is not None, "stats": not rms and (node.wanted(1) or node.wanted(2)), "rms": rms}
    if all(p is None or p.ndim <= x.ndim - axis for p in (scale, bias)):
        y, *stats = LayerNorm([t for t in (x, scale, bias) if t is not None], attrs).outputs
    else:   # Scale or B spans axes before `axis` too (per batch row): the definition's Mul and Add broadcast them
        y, *stats = LayerNorm([x], {**attrs, "has_weight": False, "has_bias": False}).outputs
        y = ops.mul(y, scale)
        y = ops.add(y, bias) if bias is not None else y
    # stash_type 1: Mean and InvStdDev are float32 whatever X's type (a double X computes them in double)
    return [y, *(ops.cast(t, "float32") for t in stats)]


@converts("MaxPool", "AveragePool", attrs=WINDOW_ATTRS + ("ceil_mode", "count_include_pad", "storage_order"))
def pool(node: Node) -> list:
    """MaxPool (and its Indices, in either storage_order) / AveragePool (1-3 spatial axes, ceil_mode, dilations,
    count_include_pad, auto_pad)."""
    x = node.input(0)
    kernel = tuple(node.attr("kernel_shape", ()))
    if len(kernel) != x.ndim - 2:
        raise node.error(f"kernel_shape {kernel} needs one value per spatial axis of {x.shape}", OnnxImportError)
    strides, pads, dilations = window(node, x, kernel)
    if node.wanted(1):
        return list(ops.max_pool_with_indices(x, kernel, strides, pads, dilations, node.flag("ceil_mode"),
                                              column_major=node.flag("storage_order")))
    mode = "max" if node.op_type == "MaxPool" else "avg"
    return [ops.pool(x, mode, kernel, strides, pads, dilations, node.flag("ceil_mode"),
                     node.flag("count_include_pad"))]


@converts("MaxUnpool", attrs=("kernel_shape", "pads", "strides"))
def max_unpool(node: Node) -> list:
    """MaxUnpool: zeros of the pooling's inverse shape ((in - 1) * stride - pad begin - pad end + kernel along each
    spatial axis) with X's values written at I, MaxPool's Indices (flat, row-major over the whole tensor: one
    scatter into the flattened output); an output_shape input must give that shape."""
    x, indices = node.input(0), node.input(1)
    kernel = tuple(node.attr("kernel_shape", ()))
    rank = x.ndim - 2
    strides, pads = tuple(node.attr("strides", [1] * rank)), tuple(node.attr("pads", [0] * 2 * rank))
    if rank < 1 or len(kernel) != rank or len(strides) != rank or len(pads) != 2 * rank:
        raise node.error(f"kernel_shape {kernel}, strides {strides} and pads {pads} need one value (pads two) per "
                         f"spatial axis of {x.shape}", OnnxImportError)
    if indices.shape != x.shape or not indices.dtype.is_integer:
        raise node.error(f"I must be integer indices of X's shape {x.shape}, got "
                         f"{indices.dtype.name}{list(indices.shape)}", OnnxImportError)
    inferred = x.shape[:2] + tuple((n - 1) * s - pads[a] - pads[a + rank] + k
                                   for a, (n, s, k) in enumerate(zip(x.shape[2:], strides, kernel)))
    zeros = ops.expand(constant(np.zeros(1, x.numpy_dtype)), (math.prod(inferred),))
    unpooled = ops.reshape(ops.scatter_elements(zeros, ops.reshape(indices, (-1,)), ops.reshape(x, (-1,))), inferred)
    given = node.const(2, required=False)
    shape = inferred if given is None else tuple(int(n) for n in np.asarray(given).reshape(-1))
    if shape != inferred:
        raise node.error(f"output_shape {shape} other than the unpooled shape {inferred} is not supported: "
                         "onnxruntime writes the indices into it flat, onnx's reference pads the unpooled tensor")
    return [unpooled]


@converts("GlobalAveragePool", "GlobalMaxPool")
def global_pool(node: Node) -> list:
    """GlobalAveragePool / GlobalMaxPool."""
    fn = ops.global_avg_pool if node.op_type == "GlobalAveragePool" else ops.global_max_pool
    return [fn(node.input(0))]


@converts("LRN", attrs=("alpha", "beta", "bias", "size"))
def lrn(node: Node) -> list:
    """LRN across channels."""
    if not node.has_attr("size"):
        raise node.error("the 'size' attribute is required", OnnxImportError)
    return [ops.lrn(node.input(0), node.attr("size"), node.attr("alpha", 1e-4), node.attr("beta", 0.75),
                    node.attr("bias", 1.0))]


@converts("Dropout", attrs=("ratio", "seed"))
def dropout(node: Node) -> list:
    """Dropout for inference: the input itself (and an all-true mask); random dropout is refused."""
    x = node.input(0)
    training = node.num_inputs > 2 and node.proto.input[2] and bool(np.asarray(node.const(2)).reshape(-1)[0])
    if training:
        ratio = node.const(1) if node.num_inputs > 1 and node.proto.input[1] else node.attr("ratio", 0.5)
        if float(np.asarray(ratio).reshape(-1)[0]) != 0.0:
            raise node.error("random dropout (training_mode=1 with a ratio > 0) is not supported; "
                             "export the model for inference")
    mask = constant(np.ones(x.shape, np.bool_)) if node.wanted(1) else None
    return [x, mask]


@converts("Identity")
def identity(node: Node) -> list:
    """Identity: the input itself (a tensor, a sequence or an optional)."""
    return [node.value(0)]
