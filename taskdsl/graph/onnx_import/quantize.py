"""Converters of QuantizeLinear, DequantizeLinear, DynamicQuantizeLinear and the integer operators (MatMulInteger,
ConvInteger, QLinearMatMul, QLinearConv): a quantized model runs in float, quantized values rounded (halves to even)
and saturated exactly where the model says.

The scale and zero point apply per tensor (scalars), per axis (1-d, one per index along `axis`) or, from opset
21, per block of `block_size` indices along it (x's rank, the axis `block_size` times shorter): each becomes a
tensor that broadcasts against x (a blocked one repeated along the axis by a constant gather). DequantizeLinear also
reads 4-bit integer constants (node.FourBitTensor: block-wise quantized weights), their values held in 8 bits.

The integer operators accumulate exactly: a matmul multiplies the 8-bit operands as they are into int32
(`integer_matmul`: on a GPU, 8-bit tensor cores) and subtracts the zero points' share after:
(a - za) @ (b - zb) = a @ b - za * colsum(b) - zb * rowsum(a) + K * za * zb. A convolution likewise
(`integer_conv`), x first padded with its zero point so that every window is whole: the sums of w's channels and x's
sums over each window of a group (`_window_sums`) stand for colsum(b) and rowsum(a). QLinear* then requantize
the accumulator in f64 by the f32 multiplier x_scale * w_scale / y_scale, as the reference does. The second
operand's scale and zero point may be per column (matmul) or per output channel (conv); the first's are per tensor.
"""
from __future__ import annotations

import math
from typing import NamedTuple

import numpy as np

from ...compute import numpy_dtype
from ...ir.types import as_dtype
from .. import ops
from ..ops import Elementwise, Reshape, Transpose
from ..ops.axes import normalize_axis
from ..passes.fold_constants import constant_value
from ..tensor import Tensor, constant
from .elementwise import cast_to
from .errors import OnnxImportError
from .node import FourBitTensor, Node, converts, dtype_of
from .windows import WINDOW_ATTRS, window

QUANTIZED = ("i8", "u8")     # the 8-bit types the integer operators take


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


def _parameters(node: Node, x, zero=None) -> tuple:
    """(scale, zero point or None), each broadcastable against x, as the node's axis and block_size say (`zero`:
    the zero point already read, else input 2)."""
    block_size = int(node.attr("block_size", 0))
    if block_size < 0:
        raise node.error(f"block_size must not be negative, got {block_size}", OnnxImportError)
    axis = node.attr("axis", 1)
    scale = _broadcastable(node, node.input(1), x, axis, block_size, "the scale")
    if zero is None:
        zero = node.input(2, required=False) if node.num_inputs > 2 else None
    return scale, None if zero is None else _broadcastable(node, zero, x, axis, block_size, "the zero point")


def _unpacked(node: Node, k: int):
    """Input k, a tensor, or a 4-bit integer constant's 8-bit values (None where absent)."""
    value = node.value(k, required=False) if k < node.num_inputs else None
    return value.tensor if isinstance(value, FourBitTensor) else None if value is None else node.input(k)


@converts("DequantizeLinear", attrs=("axis", "block_size", "output_dtype"))
def dequantize_linear(node: Node) -> list:
    """DequantizeLinear: (x - zero_point) * scale in the scale's type (x - zero_point exact: in the scale's float
    type for 8-bit float and up to 16-bit integer x, in int64 for wider integers); x and the zero point may be 4-bit
    integer constants (quantized weights)."""
    x = _unpacked(node, 0)
    if not (x.dtype.is_integer or x.dtype.bits == 8):
        raise node.error(f"data type {x.dtype.name} is not supported for x (integers, 8-bit floats)")
    if node.attr("output_dtype", 0):
        raise node.error("output_dtype is not supported (the output has the scale's type)")
    return [dequantize(x, *_parameters(node, x, _unpacked(node, 2)))]


def dequantize(x, scale, zero):
    """(x - zero) * scale in the scale's type, zero (None: 0) and scale broadcasting against x."""
    wide = "float64" if scale.dtype.name == "f64" else "float32"
    if x.dtype.is_float or x.dtype.bits <= 16:     # (an f32's 24 bits hold a difference of 16-bit integers)
        centred = x if zero is None else ops.sub(ops.cast(x, wide), ops.cast(zero, wide))
    else:
        centred = x if zero is None else ops.sub(ops.cast(x, "int64"), ops.cast(zero, "int64"))
    return ops.cast(ops.mul(ops.cast(centred, wide), ops.cast(scale, wide)), scale.dtype)


@converts("QuantizeLinear", attrs=("axis", "block_size", "output_dtype", "saturate", "precision"))
def quantize_linear(node: Node) -> list:
    """QuantizeLinear: round(x / scale) (halves to even) + zero_point, saturated to the output type: the zero
    point's, or output_dtype's (opset 21), uint8 without either; computed in f32 (f64 for f64 x). To an 8-bit
    float (its zero point a constant 0), x / scale converted as Cast converts (`saturate`)."""
    x = node.input(0)
    if not x.dtype.is_float:
        raise node.error(f"data type {x.dtype.name} is not supported for x (floats)")
    if node.attr("precision", 0):
        raise node.error("precision is not supported (x / scale is computed in f32, or f64 for f64 x)")
    scale, zero = _parameters(node, x)
    out = as_dtype("uint8") if zero is None else zero.dtype
    if node.attr("output_dtype", 0):
        named = as_dtype(dtype_of(node.attr("output_dtype"), f"node {node.name!r} (QuantizeLinear) 'output_dtype'"))
        if zero is not None and named != out:
            raise node.error(f"output_dtype {named.name} differs from the zero point's type {out.name}",
                             OnnxImportError)
        out = named
    if not (out.is_integer or out.bits == 8):
        raise node.error(f"data type {out.name} is not supported for the output (integers, 8-bit floats)")
    same = _as_quantized(x, scale, zero, out)
    if same is not None:
        return [same]
    wide = "float64" if x.dtype.name == "f64" else "float32"
    quotient = ops.div(ops.cast(x, wide), ops.cast(scale, wide))
    if out.is_float:
        if zero is not None and np.any(node.const(2) != 0):      # the operator's definition: none is added
            raise node.error("an 8-bit float zero point must be 0", OnnxImportError)
        return [cast_to(quotient, out, node.flag("saturate", 1))]
    return [saturated(quotient, zero, out.name)]


class Dequantized(NamedTuple):
    """(q - zero) * scale: 8-bit integers q, an f32 scale and a zero point of q's type (or None) that broadcast
    against q."""
    q: Tensor
    scale: Tensor
    zero: Tensor | None

    def varies_along(self, axis: int | None) -> bool:
        """Whether the scale and the zero point are one value (axis None), or one per index of q's `axis`."""
        q = self.q
        return all(p is None or p.size == 1 or (axis is not None and p.ndim >= q.ndim - axis
                                                 and p.shape[axis - q.ndim] == p.size == q.shape[axis])
                   for p in (self.scale, self.zero))

    @property
    def largest(self) -> int:
        """A bound on |q - zero|."""
        return 128 if self.zero is None and self.q.dtype.name == "i8" else 255

    def int32_zero(self):
        """The zero point as an int32 scalar or vector (one per index of the axis it varies along); None where
        there is none or it is a constant 0."""
        zero = self.zero
        if zero is None or _constant_zero(zero):
            return None
        return ops.reshape(ops.cast(zero, "int32"), () if zero.size == 1 else (zero.size,))


def _elementwise(t, fn: str):
    """t's producer where it is the elementwise operator `fn`, else None."""
    op = t.producer
    return op if type(op) is Elementwise and op.attrs["fn"] == fn else None


def dequantized(t) -> Dequantized | None:
    """t as (q - zero) * scale of 8-bit q, as `dequantize` computes it (an f32 t; also a transpose of one, or a
    reshape of one with a scale and zero point per tensor), else None."""
    if type(t.producer) in (Transpose, Reshape):
        inner = dequantized(t.producer.inputs[0])
        if inner is None:
            return None
        if type(t.producer) is Transpose:
            return _transposed(inner, t.producer.attrs["perm"])
        return inner._replace(q=ops.reshape(inner.q, t.shape)) if inner.varies_along(None) else None
    product = _elementwise(t, "mul")
    if t.dtype.name != "f32" or product is None or len(product.inputs) != 2:
        return None
    centred, scale = product.inputs
    difference = _elementwise(centred, "sub")
    parts = difference.inputs if difference is not None and len(difference.inputs) == 2 else [centred]
    casts = [_elementwise(p, "cast") for p in parts]
    if None in casts:
        return None
    q, zero = casts[0].inputs[0], casts[1].inputs[0] if len(casts) == 2 else None
    if q.dtype.name not in QUANTIZED or q.shape != t.shape or scale.dtype.name != "f32" \
            or (zero is not None and zero.dtype != q.dtype):
        return None
    return Dequantized(q, scale, zero)


def _transposed(d: Dequantized, perm: tuple) -> Dequantized:
    """d with q's axes permuted by `perm`, its scale and zero point with them."""
    def moved(p):
        if p is None or p.size == 1:
            return p
        return ops.transpose(ops.reshape(p, (1,) * (d.q.ndim - p.ndim) + p.shape), perm)
    return Dequantized(ops.transpose(d.q, perm), moved(d.scale), moved(d.zero))


def _as_quantized(x, scale, zero, out):
    """The integers x dequantizes where quantizing x by `scale` and `zero` (None: 0) into `out` gives them back:
    x = (q - z) * s of 8-bit q of type `out` (through transposes and reshapes), s and z per tensor and equal to the
    constants `scale` and `zero` (QDQ models requantize every reshape and transpose), else None. Exact: x / s is
    q - z to within 255 * 2^-23, far from a rounding step."""
    d = dequantized(x)
    if d is None or d.q.dtype != out or not d.varies_along(None) or any(
            p is not None and p.size != 1 for p in (scale, zero)):
        return None
    s, s_d, z, z_d = (np.zeros(()) if p is None else constant_value(p) for p in (scale, d.scale, zero, d.zero))
    if any(v is None for v in (s, s_d, z, z_d)) or s.item() != s_d.item() or z.item() != z_d.item():
        return None
    return d.q


def saturated(q, zero, out: str):
    """round(q) (halves to even) + zero (None: 0), saturated to the integer type `out` and cast to it."""
    q = ops.elementwise("rint", q)
    if zero is not None:
        q = ops.add(q, ops.cast(zero, q.dtype))
    limits = np.iinfo(numpy_dtype(as_dtype(out)))
    return ops.cast(ops.clip(q, float(limits.min), float(limits.max)), out)


@converts("DynamicQuantizeLinear")
def dynamic_quantize_linear(node: Node) -> list:
    """DynamicQuantizeLinear: uint8 y, its scale (max(x, 0) - min(x, 0)) / 255 (1 / 255 for an all-zero x) and
    zero point round(-min(x, 0) / scale), all in f32."""
    x = node.input(0)
    if x.dtype.name != "f32":
        raise node.error(f"data type {x.dtype.name} is not supported for x (float32)")
    high, low = ops.maximum(ops.max(x), 0.0), ops.minimum(ops.min(x), 0.0)
    scale = ops.div(ops.where(ops.equal(high, low), 1.0, ops.sub(high, low)), 255.0)
    zero = saturated(ops.neg(ops.div(low, scale)), None, "uint8")
    return [saturated(ops.div(x, scale), zero, "uint8"), scale, zero]


def _quantized_input(node: Node, k: int):
    """Input k, which must be an 8-bit integer tensor."""
    q = node.input(k)
    if q.dtype.name not in QUANTIZED:
        raise node.error(f"data type {q.dtype.name} is not supported for input {k} (int8, uint8)")
    return q


def _zero(node: Node, k: int):
    """Optional input k (a zero point), or None."""
    return node.input(k, required=False) if node.num_inputs > k else None


def requantized(node: Node, accumulator, scales: tuple, w_axis: int, zero, out: str):
    """The f64 accumulator times x_scale * w_scale / y_scale (w_scale per tensor or along `w_axis` of the
    accumulator), quantized by y's zero point `zero` (None: 0) into the type `out`."""
    for s in scales:
        if not s.dtype.is_float:
            raise node.error(f"data type {s.dtype.name} is not supported for a scale (floats)", OnnxImportError)
    x_scale, w_scale, y_scale = scales
    if x_scale.size != 1 or y_scale.size != 1:
        raise node.error("per-axis scales are supported only for the second operand (the first's and y's are "
                         "per tensor)")
    w_scale = _broadcastable(node, w_scale, accumulator, w_axis, 0, "the second operand's scale")
    multiplier = ops.div(ops.mul(ops.reshape(x_scale, ()), w_scale), ops.reshape(y_scale, ()))
    if zero is not None and zero.size != 1:
        raise node.error(f"y's zero point of shape {list(zero.shape)} is not supported (per tensor only)")
    return saturated(ops.mul(accumulator, ops.cast(multiplier, "float64")),
                     None if zero is None else ops.reshape(zero, ()), out)


def _constant_zero(zero) -> bool:
    """Whether a zero point is constant and 0 everywhere (its share of a product is then 0)."""
    value = constant_value(zero)
    return value is not None and not np.any(value)


def _zero_point(node: Node, q, zero, axis: int | None, what: str):
    """A zero point of q as an int32 tensor that broadcasts against q: per tensor, or per index along `axis`
    (None: per tensor only); None where there is none or it is a constant 0."""
    if zero is None:
        return None
    if zero.dtype != q.dtype:
        raise node.error(f"{what} has type {zero.dtype.name}, its input {q.dtype.name}", OnnxImportError)
    if axis is None and zero.size != 1:
        raise node.error(f"{what} of shape {list(zero.shape)} is not supported (per tensor only)")
    if _constant_zero(zero):
        return None
    return ops.cast(_broadcastable(node, zero, q, 0 if axis is None else axis, 0, what), "int32")


def _matmul_integer(node: Node, a_k: int, b_k: int, a_zero, b_zero):
    """(a - a_zero) @ (b - b_zero) in int32 of inputs a_k and b_k, their zero points ONNX inputs (or None); b's per
    tensor or per column."""
    a, b = _quantized_input(node, a_k), _quantized_input(node, b_k)
    if b.ndim < 2 and b_zero is not None and b_zero.size != 1:
        raise node.error("a per-column zero point needs b of rank 2 or more", OnnxImportError)
    return centred_matmul(a, b, _zero_point(node, a, a_zero, None, "a's zero point"),
                          _zero_point(node, b, b_zero, -1, "b's zero point"))


def centred_matmul(a, b, za, zb):
    """(a - za) @ (b - zb) in int32, exact: a @ b of the 8-bit operands, less the zero points' share; za, zb int32
    zero points that broadcast against a (per tensor) and b (per tensor or per column), or None for 0."""
    product = ops.integer_matmul(a, b)
    keep = a.ndim > 1 and b.ndim > 1        # the sums keep their axis where the product has it (numpy's rules)
    if za is not None:      # - za * (the sums of b's columns)
        product = ops.sub(product, ops.mul(za, ops.sum(b, axis=-2 if b.ndim > 1 else -1, keepdims=keep,
                                                       dtype="int32")))
    if zb is not None:      # - zb * (the sums of a's rows)
        product = ops.sub(product, ops.mul(zb, ops.sum(a, axis=-1, keepdims=keep, dtype="int32")))
    if za is not None and zb is not None:
        product = ops.add(product, ops.mul(ops.mul(za, zb), constant(np.int32(a.shape[-1]))))
    return product


@converts("MatMulInteger")
def matmul_integer(node: Node) -> list:
    """MatMulInteger: (a - a_zero_point) @ (b - b_zero_point) in int32 (8-bit a and b; a's zero point per tensor,
    b's per tensor or per column)."""
    return [_matmul_integer(node, 0, 1, _zero(node, 2), _zero(node, 3))]


@converts("QLinearMatMul")
def qlinear_matmul(node: Node) -> list:
    """QLinearMatMul: MatMulInteger's exact product requantized by a_scale * b_scale / y_scale into y's zero
    point's type (b's scale and zero point per tensor or per column)."""
    product = _matmul_integer(node, 0, 3, node.input(2), node.input(5))
    y_zero = node.input(7)
    scales = (node.input(1), node.input(4), node.input(6))
    return [requantized(node, ops.cast(product, "float64"), scales, -1, y_zero, y_zero.dtype.name)]


def _conv_integer(node: Node, x_k: int, w_k: int, x_zero, w_zero):
    """The convolution of x - x_zero by w - w_zero in int32 of inputs x_k and w_k, their zero points ONNX inputs
    (or None); w's per tensor or per output channel."""
    x, w = _quantized_input(node, x_k), _quantized_input(node, w_k)
    if x.ndim < 3:
        raise node.error(f"x must have a batch, a channel and a spatial axis, got shape {list(x.shape)}",
                         OnnxImportError)
    kernel = tuple(node.attr("kernel_shape", w.shape[2:]))
    if kernel != w.shape[2:]:
        raise node.error(f"kernel_shape {kernel} does not match the weight's {w.shape[2:]}", OnnxImportError)
    strides, pads, dilations = window(node, x, kernel)
    return centred_conv(x, w, _zero_point(node, x, x_zero, None, "x's zero point"),
                        _zero_point(node, w, w_zero, 0, "w's zero point"), strides, pads, dilations,
                        node.attr("group", 1))


def centred_conv(x, w, zx, zw, strides, pads, dilations, groups: int):
    """The convolution of x - zx by w - zw in int32, exact: the 8-bit operands' convolution, less the zero points'
    share (x padded with its zero point: the centred input's padding is 0); zx, zw int32 zero points that broadcast
    against x (per tensor) and w (per tensor or per output channel), or None for 0."""
    per_channel = (w.shape[0],) + (1,) * (w.ndim - 2)      # broadcasts against y (N, O, ...)
    if zw is not None and zw.ndim:
        zw = ops.reshape(zw, per_channel)
    if zx is not None and any(pads):
        x, pads = _padded_with(x, pads, ops.cast(ops.reshape(zx, ()), x.dtype)), 0
    y = ops.integer_conv(x, w, strides, pads, dilations, groups)
    if zx is not None:      # - zx * (the sum of each output channel's weights): every window is whole
        y = ops.sub(y, ops.mul(zx, ops.reshape(ops.sum(w, axis=tuple(range(1, w.ndim)), dtype="int32"),
                                               per_channel)))
    if zw is not None:
        y = ops.sub(y, _weight_zero_share(x, w, zw, strides, pads, dilations, groups))
    if zx is not None and zw is not None:
        y = ops.add(y, ops.mul(ops.mul(zx, zw), constant(np.int32(w.size // w.shape[0]))))
    return y


def _padded_with(x, pads: tuple, value):
    """x (N, C, spatial...) with its spatial axes padded by `pads` ((begin..., end...)) with `value` (a scalar
    tensor of x's type; a number where it is a constant)."""
    rank = x.ndim - 2
    pads = (0, 0) + tuple(pads[:rank]) + (0, 0) + tuple(pads[rank:])
    known = constant_value(value)
    return ops.pad(x, pads, value if known is None else known.item())


def _weight_zero_share(x, w, zw, strides, pads, dilations, groups: int):
    """zw (per tensor, or (O, 1...) per output channel) times the sums of x over each output position's window of
    its channel's group: what w's zero point takes from the convolution of x by w."""
    sums = _window_sums(x, w.shape[1:], strides, pads, dilations, groups)
    if groups == 1:
        return ops.mul(zw, sums)        # (N, 1, ...) broadcasts over the channels
    n, spatial, channels = sums.shape[0], sums.shape[2:], w.shape[0]
    per_channel = ops.reshape(ops.expand(zw, (channels,) + (1,) * len(spatial)),
                              (groups, channels // groups) + (1,) * len(spatial))
    share = ops.mul(ops.reshape(sums, (n, groups, 1) + spatial), per_channel)
    return ops.reshape(share, (n, channels) + spatial)


def _window_sums(x, window: tuple, strides, pads, dilations, groups: int):
    """The int32 sums of 8-bit x (N, C, spatial...) over each output position's window of each group's channels
    (`window`: a group's (channels, kernel...)), (N, groups, out...). Where they are exact in f32 (below 2^24), each
    group's channels are summed first, then the windows of those planes by a depthwise f32 convolution of ones;
    else by a convolution of x by ones (one output channel a group), which adds every channel again at every tap: a
    64 -> 64 QLinearConv at 56x56 with a per-channel weight zero point spent 0.58 of its 2.69 ms in it."""
    n, channels, spatial = x.shape[0], x.shape[1], x.shape[2:]
    if 255 * math.prod(window) >= 1 << 24:
        return ops.integer_conv(x, constant(np.ones((groups,) + window, np.uint8)), strides, pads, dilations, groups)
    planes = ops.cast(x, "float32")
    if channels > groups:       # (depthwise: the planes are x's channels)
        planes = ops.sum(ops.reshape(planes, (n, groups, channels // groups) + spatial), axis=2)
    ones = constant(np.ones((groups, 1) + window[1:], np.float32))
    return ops.cast(ops.conv(planes, ones, stride=strides, padding=pads, dilation=dilations, groups=groups), "int32")


@converts("ConvInteger", attrs=WINDOW_ATTRS + ("group",))
def conv_integer(node: Node) -> list:
    """ConvInteger: Conv of x - x_zero_point by w - w_zero_point in int32 (8-bit x and w; x's zero point per
    tensor, w's per tensor or per output channel)."""
    return [_conv_integer(node, 0, 1, _zero(node, 2), _zero(node, 3))]


@converts("QLinearConv", attrs=WINDOW_ATTRS + ("group",))
def qlinear_conv(node: Node) -> list:
    """QLinearConv: ConvInteger's exact result plus the int32 bias, requantized by x_scale * w_scale / y_scale
    into y's zero point's type (w's scale and zero point per tensor or per output channel)."""
    accumulator = _conv_integer(node, 0, 3, node.input(2), node.input(5))
    bias = node.input(8, required=False) if node.num_inputs > 8 else None
    if bias is not None:
        if bias.dtype.name != "i32":
            raise node.error(f"the bias has type {bias.dtype.name}, not int32", OnnxImportError)
        if bias.shape != accumulator.shape[1:2]:
            raise node.error(f"the bias must have one value per output channel, shape {list(accumulator.shape[1:2])}, "
                             f"got {list(bias.shape)}", OnnxImportError)
        accumulator = ops.add(accumulator, ops.reshape(bias, bias.shape + (1,) * (accumulator.ndim - 2)))
    y_zero = node.input(7)
    scales = (node.input(1), node.input(4), node.input(6))
    return [requantized(node, ops.cast(accumulator, "float64"), scales, 1, y_zero, y_zero.dtype.name)]
