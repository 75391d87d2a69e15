"""Converters of activation functions and elementwise math beyond elementwise.py's tables.

Those that read x more than once in a common network (HardSwish, Swish, Softplus, Mish, the Elu family, PRelu) are
one elementwise operator each (ops.FUNCTIONS), which a convolution's or matmul's epilogue takes; the others are
compositions of elementwise ops. A 16-bit float input is computed in f32 and rounded once (`in_f32`).
"""
from __future__ import annotations

import numpy as np

from .. import ops
from ..ops.elementwise import broadcast_shape
from .elementwise import in_f32
from .errors import OnnxImportError
from .node import Node, converts

FLOOR_MOD_OF_FLOATS_SINCE = 28      # Mod's fmod=0 on floats; before, fmod must be 1 for them
SIGNED_BIT_SHIFT_SINCE = 28


@converts("HardSigmoid", attrs=("alpha", "beta"))
def hard_sigmoid(node: Node) -> list:
    """HardSigmoid: max(0, min(1, alpha x + beta))."""
    alpha, beta = _real_attr(node, "alpha", 0.2), _real_attr(node, "beta", 0.5)
    # (a chain of operators each read once: an epilogue takes it whole)
    return [in_f32(lambda x: ops.clip(ops.add(ops.mul(x, alpha), beta), 0.0, 1.0), _float_input(node))]


def _real_attr(node: Node, name: str, default: float) -> float:
    """A float attribute, or its default as ONNX holds one (a float32: HardSigmoid's 0.2 is 0.20000000298)."""
    return float(np.float32(node.attr(name, default)))


def _float_input(node: Node):
    """Input 0, which the operator's schema allows only as a float tensor."""
    x = node.input(0)
    if not x.dtype.is_float:
        raise node.error(f"needs a float tensor, got {x.dtype.name}", OnnxImportError)
    return x


@converts("HardSwish")
def hard_swish(node: Node) -> list:
    """HardSwish: x HardSigmoid(x) with alpha 1/6 and beta 1/2 (ops' hard_swish, one operator)."""
    return [ops.elementwise("hard_swish", _float_input(node))]


@converts("Elu", attrs=("alpha",))
def elu(node: Node) -> list:
    """Elu: x, or alpha (e^x - 1) below 0 (ops' elu, one operator)."""
    return [ops.elementwise("elu", _float_input(node), alpha=_real_attr(node, "alpha", 1.0))]


@converts("Selu", attrs=("alpha", "gamma"))
def selu(node: Node) -> list:
    """Selu: gamma x, or gamma alpha (e^x - 1) below 0."""
    alpha, gamma = _real_attr(node, "alpha", 1.6732632423543772), _real_attr(node, "gamma", 1.0507009873554805)
    return [ops.elementwise("elu", _float_input(node), alpha=alpha, gamma=gamma)]


@converts("Celu", attrs=("alpha",))
def celu(node: Node) -> list:
    """Celu: max(0, x) + min(0, alpha (e^(x / alpha) - 1)), that is x, or alpha (e^(x / alpha) - 1) below 0."""
    alpha = _real_attr(node, "alpha", 1.0)
    if alpha == 0:
        raise node.error("alpha 0 is not supported (the formula divides by it)")
    return [ops.elementwise("elu", _float_input(node), alpha=alpha, celu=True)]


@converts("Softplus", "Mish")
def softplus(node: Node) -> list:
    """Softplus log(1 + e^x), and Mish x tanh(softplus(x)): one operator each (ops' softplus and mish)."""
    return [ops.elementwise(node.op_type.lower(), _float_input(node))]


@converts("Swish", attrs=("alpha",))
def swish(node: Node) -> list:
    """Swish (opset 24): x sigmoid(alpha x), as its definition computes it (NaN at -inf, where ops.silu gives -0)."""
    return [ops.elementwise("swish", _float_input(node), alpha=_real_attr(node, "alpha", 1.0))]


@converts("Softsign")
def softsign(node: Node) -> list:
    """Softsign: x / (1 + |x|)."""
    return [in_f32(lambda x: ops.div(x, ops.add(ops.elementwise("abs", x), 1.0)), _float_input(node))]


@converts("ThresholdedRelu", attrs=("alpha",))
def thresholded_relu(node: Node) -> list:
    """ThresholdedRelu: x above alpha, else 0."""
    alpha = _real_attr(node, "alpha", 1.0)
    return [in_f32(lambda x: ops.where(ops.greater(x, alpha), x, 0.0), _float_input(node))]


@converts("PRelu")
def prelu(node: Node) -> list:
    """PRelu: x, or slope x below 0; the slope broadcasts to x's shape (never the other way)."""
    x, slope = node.input(0), node.input(1)
    if broadcast_shape([x.shape, slope.shape], "PRelu") != tuple(x.shape):
        raise node.error(f"the slope of shape {slope.shape} does not broadcast to X's shape {x.shape}",
                         OnnxImportError)
    return [ops.elementwise("prelu", x, slope)]


@converts("Shrink", attrs=("bias", "lambd"))
def shrink(node: Node) -> list:
    """Shrink: x + bias below -lambd, x - bias above lambd, else 0. Integers are computed in f64 (exact for 32
    bits; onnxruntime computes in f32) and truncated back."""
    x = node.input(0)
    bias, lambd = _real_attr(node, "bias", 0.0), _real_attr(node, "lambd", 0.5)

    def formula(v):
        inside = ops.where(ops.greater(v, lambd), ops.sub(v, bias), 0.0)
        return ops.where(ops.less(v, -lambd), ops.add(v, bias), inside)

    if x.dtype.is_integer:
        return [ops.cast(formula(ops.cast(x, "float64")), x.dtype)]
    return [in_f32(formula, x)]


@converts("Sign")
def sign(node: Node) -> list:
    """Sign: 1 above 0, -1 below, else 0 (a float's NaN kept; -0.0 gives 0.0, as in numpy and onnxruntime)."""
    x = node.input(0)
    if x.dtype.is_bool:
        raise node.error("needs a numeric tensor, got bool", OnnxImportError)
    rest = ops.add(x, 0.0) if x.dtype.is_float else x     # -0.0 + 0.0 is 0.0, NaN + 0.0 NaN
    if x.dtype.kind != "uint":
        rest = ops.where(ops.less(x, 0), -1, rest)
    return [ops.where(ops.greater(x, 0), 1, rest)]


@converts("IsNaN")
def is_nan(node: Node) -> list:
    """IsNaN: x != x."""
    x = _float_input(node)
    return [ops.elementwise("logical_not", ops.equal(x, x))]


@converts("IsInf", attrs=("detect_negative", "detect_positive"))
def is_inf(node: Node) -> list:
    """IsInf: whether x is inf (if detect_positive, default 1) or -inf (if detect_negative, default 1)."""
    x = _float_input(node)
    positive, negative = node.flag("detect_positive", 1), node.flag("detect_negative", 1)
    if positive and negative:
        return [ops.equal(ops.elementwise("abs", x), np.inf)]
    if positive or negative:
        return [ops.equal(x, np.inf if positive else -np.inf)]
    return [ops.less(x, -np.inf)]       # nothing is: all False


@converts("Mod", attrs=("fmod",))
def mod(node: Node) -> list:
    """Mod: the remainder with the divisor's sign (fmod=0: floored) or the dividend's (fmod=1: C's fmod and %)."""
    a, b = node.input(0), node.input(1)
    truncated = node.flag("fmod")
    if a.dtype.is_float and not truncated and node.opset < FLOOR_MOD_OF_FLOATS_SINCE:
        raise node.error(f"fmod must be 1 for float inputs before opset {FLOOR_MOD_OF_FLOATS_SINCE}",
                         OnnxImportError)
    if truncated and a.dtype.kind != "uint":
        return [_truncated_mod(a, b)]
    return [ops.elementwise("mod", a, b)]


def _truncated_mod(a, b):
    """a - trunc(a / b) b, with a's sign. Of floats, the floored remainder of |a| and |b| given a's sign: exact,
    where a - trunc(a / b) b rounds."""
    if not a.dtype.is_float:
        return ops.sub(a, ops.mul(ops.div(a, b), b))
    remainder = ops.elementwise("mod", ops.elementwise("abs", a), ops.elementwise("abs", b))
    return ops.where(ops.less(a, 0.0), ops.neg(remainder), remainder)


@converts("Round")
def round_(node: Node) -> list:
    """Round: to the nearest integer, halves to the even one (`rint`; a zero keeps x's sign: Round(-0.25) is -0.0).
    Written out as floor, the fraction and the floor's parity, its fused kernel repeated the floor in every branch
    of its selects: a QLinearConv of 64x56x56 outputs took 2.67 ms on the cpu with it, 1.98 ms with `rint`."""
    return [in_f32(lambda x: ops.elementwise("rint", x), _float_input(node))]


@converts("Tan")
def tan(node: Node) -> list:
    """Tan: sin(x) / cos(x), within a few ulps of tan as both are within one."""
    return [in_f32(lambda x: ops.div(ops.elementwise("sin", x), ops.elementwise("cos", x)), _float_input(node))]


@converts("BitShift", attrs=("direction",))
def bit_shift(node: Node) -> list:
    """BitShift: X shifted by Y bits, direction 'LEFT' or 'RIGHT' (arithmetic for signed types, from opset 28)."""
    x, direction = node.input(0), node.attr("direction")
    if direction not in ("LEFT", "RIGHT"):
        raise node.error(f"direction must be 'LEFT' or 'RIGHT', got {direction!r}", OnnxImportError)
    if x.dtype.kind == "int" and node.opset < SIGNED_BIT_SHIFT_SINCE:
        raise node.error(f"signed integers are shifted from opset {SIGNED_BIT_SHIFT_SINCE}, got {x.dtype.name}",
                         OnnxImportError)
    return [ops.elementwise("bit_shift", x, node.input(1), direction=direction.lower())]
