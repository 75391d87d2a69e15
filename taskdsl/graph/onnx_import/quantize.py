"""Converters of QuantizeLinear and DequantizeLinear: a QDQ model runs in float, quantized values rounded and
saturated exactly where the model says.

The scale and zero point apply per tensor (scalars), per axis (1-d, one per index along `axis`) or, from opset
21, per block of `block_size` indices along it (x's rank, the axis `block_size` times shorter): each becomes a
tensor that broadcasts against x (a blocked one repeated along the axis by a constant gather).
"""
from __future__ import annotations

import numpy as np

from .. import ops
from ..ops.axes import normalize_axis
from ..tensor import constant
from .activations import round_half_to_even
from .errors import OnnxImportError
from .node import Node, converts


def _broadcastable(node: Node, param, x, axis: int, block_size: int, what: str):
    """A scale or zero point `param` as a tensor that broadcasts against x: per tensor, per axis or per block."""
    if param.ndim == 0 or (param.ndim == 1 and param.shape[0] == 1 and block_size == 0):
        return ops.reshape(param, ())
    axis = normalize_axis(axis, x.ndim, node.op_type)      # (read only here: a per-tensor one may be out of range)
    n = x.shape[axis]
    if block_size > 0:
        blocks = -(-n // block_size)
        expected = x.shape[:axis] + (blocks,) + x.shape[axis + 1:]
        if param.shape != expected:
            raise node.error(f"{what} of shape {list(param.shape)} must have shape {list(expected)} (blocks of "
                             f"{block_size} along axis {axis})", OnnxImportError)
        return ops.gather(param, constant(np.arange(n, dtype=np.int64) // block_size), axis)
    if param.shape != (n,):
        raise node.error(f"{what} of shape {list(param.shape)} must be a scalar or have shape [{n}] (axis {axis})",
                         OnnxImportError)
    return ops.reshape(param, (n,) + (1,) * (x.ndim - 1 - axis))


def _parameters(node: Node, x) -> tuple:
    """(scale, zero point or None), each broadcastable against x, as the node's axis and block_size say."""
    block_size = int(node.attr("block_size", 0))
    if block_size < 0:
        raise node.error(f"block_size must not be negative, got {block_size}", OnnxImportError)
    axis = node.attr("axis", 1)
    scale = _broadcastable(node, node.input(1), x, axis, block_size, "the scale")
    zero = node.input(2, required=False) if node.num_inputs > 2 else None
    return scale, None if zero is None else _broadcastable(node, zero, x, axis, block_size, "the zero point")


@converts("DequantizeLinear", attrs=("axis", "block_size", "output_dtype"))
def dequantize_linear(node: Node) -> list:
    """DequantizeLinear: (x - zero_point) * scale in the scale's type (x - zero_point exact, in integers)."""
    x = node.input(0)
    if not x.dtype.is_integer:
        raise node.error(f"data type {x.dtype.name} is not supported for x (integers)")
    if node.attr("output_dtype", 0):
        raise node.error("output_dtype is not supported (the output has the scale's type)")
    scale, zero = _parameters(node, x)
    centred = x if zero is None else ops.sub(ops.cast(x, "int64"), ops.cast(zero, "int64"))
    wide = "float64" if scale.dtype.name == "f64" else "float32"
    return [ops.cast(ops.mul(ops.cast(centred, wide), ops.cast(scale, wide)), scale.dtype)]


@converts("QuantizeLinear", attrs=("axis", "block_size", "output_dtype", "saturate", "precision"))
def quantize_linear(node: Node) -> list:
    """QuantizeLinear: round(x / scale) (halves to even) + zero_point, saturated to the zero point's integer type
    (uint8 without one), computed in f32 (f64 for f64 x)."""
    x = node.input(0)
    if not x.dtype.is_float:
        raise node.error(f"data type {x.dtype.name} is not supported for x (floats)")
    if node.attr("output_dtype", 0) or node.attr("precision", 0):
        raise node.error("output_dtype and precision are not supported (the output has the zero point's type)")
    scale, zero = _parameters(node, x)
    out = "uint8" if zero is None else zero.dtype.name
    if not (zero is None or zero.dtype.is_integer):
        raise node.error(f"data type {out} is not supported for the zero point (integers)")
    wide = "float64" if x.dtype.name == "f64" else "float32"
    q = round_half_to_even(ops.div(ops.cast(x, wide), ops.cast(scale, wide)))
    if zero is not None:
        q = ops.add(q, ops.cast(zero, wide))
    limits = np.iinfo(np.uint8 if zero is None else zero.numpy_dtype)
    return [ops.cast(ops.clip(q, float(limits.min), float(limits.max)), out)]
