"""Products of dequantized 8-bit tensors as exact integer products, scaled once (QDQ models).

onnxruntime's static quantization writes by default (QuantFormat.QDQ) each quantized product as the float operator
between DequantizeLinear nodes, and leaves the runtime to find the pattern:

    Conv(DequantizeLinear(xq, sx, zx), DequantizeLinear(wq, sw, zw), bias)
    MatMul(DequantizeLinear(aq, sa, za), DequantizeLinear(bq, sb, zb))          (Gemm likewise)

Where the first operand's scale and zero point are per tensor and the second's per tensor or per output channel (a
matmul's b: per column), the scales factor out of the sums,

    sum_k (xq - zx) sx (wq - zw) sw  =  sx sw * sum_k (xq - zx) (wq - zw),

and the sum is the exact int32 product that ConvInteger and MatMulInteger compute (`centred_conv`,
`centred_matmul`: the cpu's byte dot products, a GPU's 8-bit tensor cores), scaled once in f32 where the float
product rounds every term; the two agree to that rounding. An operand is recognized by the operators
DequantizeLinear's converter builds, (cast(q) - cast(zero)) * scale (`quantize.dequantized`), also through a
transpose (Gemm's transA / transB) and, per tensor, a reshape. Any other operand, scales or zero points along
another axis, and a sum that could pass int32's range keep the float product.

Gather (`gather`) likewise picks rows of the integers and dequantizes those only: a quantized embedding table
(BERT's: 30522 x 768) is then never dequantized whole, which constant folding leaves to every call past its size
limit.
"""
from __future__ import annotations

from .. import ops
from .quantize import Dequantized, centred_conv, centred_matmul, dequantize, dequantized

INT32_MAX = 2 ** 31 - 1


def _fits_int32(a: Dequantized, b: Dequantized, terms: int) -> bool:
    """Whether a sum of `terms` products of a's and b's centred integers cannot pass int32's range."""
    return terms * a.largest * b.largest <= INT32_MAX


def _scale(first: Dequantized, second: Dequantized, shape: tuple):
    """first's scale (per tensor) times second's, per tensor or reshaped to `shape` (per output channel)."""
    per_channel = second.scale.size > 1
    return ops.mul(ops.reshape(first.scale, ()), ops.reshape(second.scale, shape if per_channel else ()))


def conv(x, w, bias, strides, pads, dilations, groups: int):
    """The convolution of x by w (+ bias): exact in int32 and scaled once where x and w are dequantized 8-bit
    tensors (x per tensor, w per tensor or per output channel), else `ops.conv`."""
    dx, dw = dequantized(x), dequantized(w)
    if dx is None or dw is None or not dx.varies_along(None) or not dw.varies_along(0) \
            or not _fits_int32(dx, dw, w.size // max(w.shape[0], 1)) \
            or (bias is not None and bias.shape != w.shape[:1]):      # (ops.conv says what is wrong)
        return ops.conv(x, w, bias, strides, pads, dilations, groups)
    per_channel = (w.shape[0],) + (1,) * (w.ndim - 2)       # broadcasts against y (N, O, ...)
    y = centred_conv(dx.q, dw.q, dx.int32_zero(), dw.int32_zero(), strides, pads, dilations, groups)
    y = ops.mul(ops.cast(y, "float32"), _scale(dx, dw, per_channel))
    return y if bias is None else ops.add(y, ops.reshape(bias, per_channel))


def matmul(a, b):
    """numpy.matmul(a, b): exact in int32 and scaled once where a and b are dequantized 8-bit tensors (a per
    tensor, b per tensor or per column), else `ops.matmul`."""
    if a.ndim == 0 or b.ndim == 0:        # (ops.matmul says what is wrong)
        return ops.matmul(a, b)
    da, db = dequantized(a), dequantized(b)
    if da is None or db is None or not da.varies_along(None) \
            or not db.varies_along(b.ndim - 1 if b.ndim > 1 else None) or not _fits_int32(da, db, a.shape[-1]):
        return ops.matmul(a, b)
    y = centred_matmul(da.q, db.q, da.int32_zero(), db.int32_zero())
    return ops.mul(ops.cast(y, "float32"), _scale(da, db, b.shape[-1:]))


def gather(data, indices, axis: int):
    """ops.gather(data, indices, axis), of dequantized 8-bit data (scale and zero point per tensor) the gathered
    integers dequantized: a quantized embedding table is not dequantized whole at every call."""
    d = dequantized(data)
    if d is None or not d.varies_along(None):
        return ops.gather(data, indices, axis)
    return dequantize(ops.gather(d.q, indices, axis), d.scale, d.zero)
