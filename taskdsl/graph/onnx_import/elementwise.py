"""Converters of elementwise operators, reductions and softmax."""
from __future__ import annotations

import math

import ml_dtypes
import numpy as np

from ...ir.types import DataType, as_dtype, numpy_dtype
from .. import ops
from ..ops.axes import normalize_axes, normalize_axis
from ..ops.reduce import reduced_shape
from ..tensor import constant
from .errors import OnnxImportError
from .node import Node, converts, dtype_of

BINARY = {"Add": "add", "Sub": "sub", "Mul": "mul", "Div": "div", "Pow": "pow", "Equal": "equal", "Less": "less",
          "LessOrEqual": "less_equal", "Greater": "greater", "GreaterOrEqual": "greater_equal", "And": "logical_and",
          "Or": "logical_or", "Xor": "logical_xor", "BitwiseAnd": "bitwise_and", "BitwiseOr": "bitwise_or",
          "BitwiseXor": "bitwise_xor"}
UNARY = {"Relu": "relu", "Sigmoid": "sigmoid", "Tanh": "tanh", "Erf": "erf", "Exp": "exp", "Log": "log", "Sqrt": "sqrt",
         "Neg": "neg", "Abs": "abs", "Reciprocal": "reciprocal", "Floor": "floor", "Ceil": "ceil", "Sin": "sin",
         "Cos": "cos", "Asin": "asin", "Acos": "acos", "Atan": "atan", "Sinh": "sinh", "Cosh": "cosh",
         "Asinh": "asinh", "Acosh": "acosh", "Atanh": "atanh", "Not": "logical_not", "BitwiseNot": "bitwise_not"}
VARIADIC = {"Sum": "add", "Max": "maximum", "Min": "minimum"}


@converts(*BINARY)
def binary(node: Node) -> list:
    """Add, Sub, Mul, Div, Pow, comparisons and logic: one broadcast elementwise op."""
    return [ops.elementwise(BINARY[node.op_type], node.input(0), node.input(1))]


@converts(*UNARY)
def unary(node: Node) -> list:
    """Relu, Sigmoid, Tanh, Erf, Exp, Log, Sqrt, Neg, Abs, ... : one elementwise op."""
    return [ops.elementwise(UNARY[node.op_type], node.input(0))]


@converts(*VARIADIC)
def variadic(node: Node) -> list:
    """Sum / Max / Min of one or more broadcast inputs."""
    xs = node.inputs()
    return [xs[0] if len(xs) == 1 else ops.elementwise(VARIADIC[node.op_type], *xs)]


@converts("Mean")
def mean(node: Node) -> list:
    """Mean of one or more broadcast inputs (their sum divided by their count)."""
    xs = node.inputs()
    if len(xs) == 1:
        return xs
    return [in_f32(lambda *wide: ops.div(ops.elementwise("add", *wide), float(len(xs))), *xs)]


def in_f32(compute, *xs):
    """`compute(*xs)` computed in f32 where the `xs` are 16-bit floats, its result rounded back once: as one kernel
    computes them (docs/graph.md), where the operators a node becomes would round each intermediate result
    (Mean(60000, 60000) overflowed in its sum)."""
    dtype = xs[0].dtype
    if not dtype.computes_in_f32:
        return compute(*xs)
    return ops.cast(compute(*(ops.cast(x, "float32") for x in xs)), dtype)


@converts("LeakyRelu", attrs=("alpha",))
def leaky_relu(node: Node) -> list:
    """LeakyRelu with its alpha."""
    return [ops.elementwise("leaky_relu", node.input(0), alpha=float(node.attr("alpha", 0.01)))]


@converts("Gelu", attrs=("approximate",))
def gelu(node: Node) -> list:
    """Gelu (opset 20), exact or with the tanh approximation."""
    approximate = node.attr("approximate", "none")
    if approximate not in ("none", "tanh"):
        raise node.error(f"approximate={approximate!r} is not supported (none, tanh)")
    return [ops.gelu(node.input(0), approximate)]


@converts("Clip")
def clip(node: Node) -> list:
    """Clip with optional scalar min / max inputs (not necessarily constant). A float bound left out is the type's
    lowest / highest finite value, as the operator defines it: -inf and inf become finite (as onnxruntime gives)."""
    x = node.input(0)
    lo, hi = (_scalar_bound(node, k) for k in (1, 2))
    if x.dtype.is_float:
        limits = ml_dtypes.finfo(x.numpy_dtype)
        lo, hi = (constant(np.array(v, x.numpy_dtype)) if bound is None else bound
                  for bound, v in ((lo, limits.min), (hi, limits.max)))
    return [ops.clip(x, lo, hi)]


def _scalar_bound(node: Node, k: int):
    """Clip's bound input k as a 0-d tensor (None when absent): a scalar, or one value in a 1-d tensor."""
    bound = node.input(k, required=False) if node.num_inputs > k else None
    if bound is None:
        return None
    if bound.size != 1 or bound.ndim > 1:
        raise node.error(f"the bound {node.proto.input[k]!r} must be a scalar, got shape {bound.shape}",
                         OnnxImportError)
    return ops.reshape(bound, ())


@converts("Where")
def where(node: Node) -> list:
    """Where(cond, x, y) with broadcasting."""
    if not node.input(0).dtype.is_bool:
        raise node.error(f"the condition must be a bool tensor, got {node.input(0).dtype.name}", OnnxImportError)
    return [ops.elementwise("where", node.input(0), node.input(1), node.input(2))]


@converts("Trilu", attrs=("upper",))
def trilu(node: Node) -> list:
    """Trilu: the upper (default) or lower triangle of the last two axes above / below diagonal k (a constant
    input, default 0), zeros elsewhere: a `where` against a constant mask (shapes are static)."""
    x = node.input(0)
    if x.ndim < 2:
        raise node.error(f"needs a tensor of rank 2 or more, got shape {x.shape}", OnnxImportError)
    k = node.const(1, required=False)
    if k is not None and np.size(k) != 1:
        raise node.error(f"k must be a scalar, got shape {np.shape(k)}", OnnxImportError)
    k = 0 if k is None else int(np.asarray(k).reshape(-1)[0])
    triangle = np.triu if node.flag("upper", 1) else np.tril
    mask = triangle(np.ones(x.shape[-2:], bool), k)
    return [ops.elementwise("where", constant(mask), x, constant(np.zeros((), x.numpy_dtype)))]


@converts("Cast", attrs=("to", "saturate", "round_mode"))
def cast(node: Node) -> list:
    """Cast to the 'to' data type (float to int truncates; to an 8-bit float as `saturate` says)."""
    return [cast_to(node.input(0), as_dtype(dtype_of(node.attr("to"), f"node {node.name!r} (Cast) 'to'")),
                    node.flag("saturate", 1))]


@converts("CastLike", attrs=("saturate", "round_mode"))
def cast_like(node: Node) -> list:
    """CastLike: Cast to the second input's dtype."""
    return [cast_to(node.input(0), node.input(1).dtype, node.flag("saturate", 1))]


def cast_to(x, dtype: DataType, saturate: bool):
    """x converted to `dtype`. To an 8-bit float the conversion saturates (infinities too) unless `saturate` is
    false: then a magnitude that rounds past the largest finite value gives the pattern past it, of x's sign (E4M3's
    NaN, E5M2's inf), as ml_dtypes converts."""
    y = ops.cast(x, dtype)
    if saturate or dtype.bits != 8 or x.dtype == dtype:
        return y
    threshold, tie_rounds_past = dtype.overflow_threshold
    magnitude = ops.elementwise("abs", ops.cast(x, "float64"))     # f64 holds every value of the types cast from
    past = ops.elementwise("greater_equal" if tie_rounds_past else "greater", magnitude,
                           constant(np.array(threshold, np.float64)))
    beyond = dtype.narrow_bits(math.inf) + 1      # the largest finite value's pattern, and one
    values = np.array([beyond, 0x80 | beyond], np.uint8).view(numpy_dtype(dtype))
    special = ops.where(ops.less(x, constant(np.zeros((), x.numpy_dtype))), constant(values[1]), constant(values[0]))
    return ops.where(past, special, y)


@converts("Softmax", "LogSoftmax", attrs=("axis",))
def softmax(node: Node) -> list:
    """Softmax / LogSoftmax: along one axis from opset 13, over the axes from `axis` on before."""
    x = node.input(0)
    fn = ops.softmax if node.op_type == "Softmax" else ops.log_softmax
    if node.opset >= 13:
        return [fn(x, node.attr("axis", -1))]
    axis = normalize_axis(node.attr("axis", 1), x.ndim, node.op_type)   # opset < 13: over all axes from axis
    rows = ops.flatten(x, axis)
    return [ops.reshape(fn(rows, 1), x.shape)]


REDUCTIONS = {"ReduceSum": "sum", "ReduceMean": "mean", "ReduceMax": "max", "ReduceMin": "min", "ReduceProd": "prod",
              "ReduceSumSquare": "sum", "ReduceL1": "sum", "ReduceL2": "sum", "ReduceLogSum": "sum",
              "ReduceLogSumExp": "sum"}
AXES_INPUT_SINCE = {"ReduceSum": 13}       # the others take axes as an input from opset 18


@converts("ArgMax", "ArgMin", attrs=("axis", "keepdims", "select_last_index"))
def arg_reduce(node: Node) -> list:
    """ArgMax / ArgMin: int64 indices along one axis, the first extreme or (select_last_index) the last."""
    fn = ops.argmax if node.op_type == "ArgMax" else ops.argmin
    return [fn(node.input(0), int(node.attr("axis", 0)), node.flag("keepdims", 1), node.flag("select_last_index"))]


@converts(*REDUCTIONS, attrs=("axes", "keepdims", "noop_with_empty_axes"))
def reduce(node: Node) -> list:
    """Reduce* with axes as an attribute or (opset 13 for ReduceSum, 18 for the others) an input."""
    x, op_type = node.input(0), node.op_type
    if node.opset >= AXES_INPUT_SINCE.get(op_type, 18):
        axes = node.const(1, required=False) if node.num_inputs > 1 else None
        if node.has_attr("axes"):
            raise node.error(f"'axes' is an input of {op_type} in opset {node.opset}, not an attribute",
                             OnnxImportError)
    else:
        axes = node.attr("axes")
    keepdims = node.flag("keepdims", 1)
    if axes is None or len(axes) == 0:
        if node.flag("noop_with_empty_axes"):   # no axis is reduced, but each element is still mapped
            return [_noop_reduce(op_type, x)]
        axes = None
    if axes is not None:        # an axis named twice (1 and -1 of a matrix) is reduced once, as onnxruntime does
        axes = list(dict.fromkeys(int(a) + (x.ndim if -x.ndim <= a < 0 else 0) for a in np.asarray(axes).reshape(-1)))
    fn = getattr(ops, REDUCTIONS[op_type])
    if op_type in ("ReduceSumSquare", "ReduceL1"):
        return [fn(_noop_reduce(op_type, x), axes, keepdims)]
    if op_type in FLOATING_REDUCTIONS:
        if x.dtype.is_float:       # (f16's x * x and sums overflow where the result does not)
            return [in_f32(lambda v: _floating_reduce(op_type, v, axes, keepdims), x)]
        # integers (the schema allows them): computed in f64 and truncated back once (onnxruntime's ReduceL2 and
        # ReduceLogSum agree; its ReduceLogSumExp truncates its intermediates: docs/graph.md)
        return [ops.cast(_floating_reduce(op_type, ops.cast(x, "float64"), axes, keepdims), x.dtype)]
    return [fn(x, axes, keepdims)]


FLOATING_REDUCTIONS = ("ReduceL2", "ReduceLogSum", "ReduceLogSumExp")


def _noop_reduce(op_type: str, x):
    """Reduce* `op_type` over no axis: each element as the reduction maps it (x^2, |x|, log x; x for the others)."""
    if op_type == "ReduceSumSquare":
        return ops.mul(x, x)
    if op_type in ("ReduceL1", "ReduceL2"):
        return ops.elementwise("abs", x)
    if op_type == "ReduceLogSum":
        return ops.log(x) if x.dtype.is_float else ops.cast(ops.log(ops.cast(x, "float64")), x.dtype)
    return x


def _floating_reduce(op_type: str, x, axes, keepdims: bool):
    """ReduceL2 / ReduceLogSum / ReduceLogSumExp of a float tensor."""
    if op_type == "ReduceL2":
        return ops.sqrt(ops.sum(ops.mul(x, x), axes, keepdims))
    if op_type == "ReduceLogSum":
        return ops.log(ops.sum(x, axes, keepdims))
    # log(sum(exp(x - m))) + m with m the row's max, or 0 where that is infinite: inf - inf would be NaN
    # where onnxruntime gives inf (a row with +inf) or -inf (a row of -inf, log(0))
    top = ops.max(x, axes, True)
    infinite = constant(np.array(np.inf, x.numpy_dtype))
    shift = ops.where(ops.less(ops.elementwise("abs", top), infinite), top, constant(np.zeros((), x.numpy_dtype)))
    total = ops.log(ops.sum(ops.exp(ops.sub(x, shift)), axes, True))
    shape = reduced_shape(x.shape, normalize_axes(axes, x.ndim, op_type), keepdims)
    return ops.reshape(ops.add(total, shift), shape)
