"""Batch-norm folding: an inference BatchNorm with constant statistics becomes a per-channel
scale and shift, and the scale moves into the weights of a convolution before it.

    conv(x, W) -> batch_norm(mean, var, gamma, beta)   =>   conv(x, W * s) + (beta - mean * s)
    s = gamma / sqrt(var + eps)                             (any other f32 / f64 input: x * s + shift)

Unfolded, every output element pays an rsqrt and four loads of statistics in the fused
conv's epilogue (a third of a 1x1 ResNet conv's time on the cpu); folded, the epilogue is one
add. The conv's weights are folded only when they are constant and the conv's output feeds
nothing but this BatchNorm. Scale and shift are computed in float64, then stored in the
tensor's dtype; a 16-bit BatchNorm folds only into conv weights, where they fit. Either fold needs
a shift within rounding of the type's largest value, so that the scaled product, which is the
BatchNorm's output minus the shift, cannot overflow where that output does not (`_folded`).
"""
from __future__ import annotations

import ml_dtypes
import numpy as np

from ..graph import Graph
from ..ops import add, mul
from ..ops.linalg import Conv
from ..ops.norm import BatchNorm, stat_dtype
from ..tensor import constant
from .fold_constants import constant_value


def _scale_shift(op: BatchNorm) -> tuple | None:
    """(scale, shift) per channel in float64, or None when a statistic or parameter is not constant, or the scale is
    not finite (a zero variance with eps 0: the unfolded op's 0 / 0 and x / 0 are not a scale and shift's)."""
    values = [constant_value(t) for t in op.inputs[1:]]
    if any(v is None for v in values):
        return None
    mean, var, *params = (np.asarray(v, np.float64) for v in values)
    weight = params.pop(0) if op.attrs["has_weight"] else 1.0
    bias = params.pop(0) if op.attrs["has_bias"] else 0.0
    with np.errstate(divide="ignore", invalid="ignore"):
        scale = weight / np.sqrt(var + op.attrs["eps"])
    if not np.isfinite(scale).all():
        return None
    return scale, bias - mean * scale


def _foldable_conv(x, original, users: dict, outputs: set):
    """The Conv producing `x` and its constant weights, when they may absorb the scale (the conv's
    output, `original` in the input graph, feeds nothing else); else (None, None)."""
    conv = x.producer
    if (not isinstance(conv, Conv) or conv.attrs["channels_last"] or len(users.get(id(original), ())) != 1
            or id(original) in outputs):
        return None, None
    weight = constant_value(conv.inputs[1])
    return (conv, weight) if weight is not None else (None, None)


def _fits(arrays: tuple, dtype) -> bool:
    """Whether every value stays finite stored in `dtype`."""
    with np.errstate(over="ignore"):
        return all(np.isfinite(np.asarray(a).astype(dtype)).all() for a in arrays)


def _shift_within_rounding(shift: np.ndarray, dtype) -> bool:
    """Whether every |shift| is at most two units in the last place of `dtype`'s largest value."""
    info = ml_dtypes.finfo(dtype)
    return float(np.max(np.abs(shift), initial=0.0)) <= float(info.max) * float(info.eps)


def _folded(op: BatchNorm, x, scale: np.ndarray, shift: np.ndarray, users: dict, outputs: set):
    """The tensor replacing BatchNorm `op`'s output, computed from `x` (its input in the new graph), or None where
    folding could overflow where the BatchNorm does not. The folded product (x * scale, or conv(x, W * scale)) is the
    BatchNorm's output minus the shift, so the shift must be within rounding of the type's largest value (f16, a
    mean of 6000, a scale of 10: conv(x, W * 10) is inf where (x - mean) * 10 = 10000 is not). A 16-bit BatchNorm,
    which computes in f32, folds only into conv weights, and only where the scaled weights fit its type."""
    channels = (x.shape[1],) + (1,) * (x.ndim - 2)
    conv, weight = _foldable_conv(x, op.inputs[0], users, outputs)
    if (conv is None and stat_dtype(x.dtype) != x.dtype) or not _shift_within_rounding(shift, x.numpy_dtype):
        return None
    factor = scale.reshape(channels) if conv is None else weight * scale.reshape((-1,) + (1,) * (weight.ndim - 1))
    if not _fits((factor, shift), x.numpy_dtype):
        return None
    if conv is not None:
        x = Conv([conv.inputs[0], constant(factor, x.dtype)], conv.attrs).outputs[0]
    else:
        x = mul(x, constant(factor, x.dtype))
    return add(x, constant(shift.reshape(channels), x.dtype))


def fold_batch_norm(graph: Graph) -> Graph:
    """The graph with each constant-statistics BatchNorm folded (see the module docstring)."""
    users, outputs = graph.users(), {id(t) for t in graph.outputs}

    def folded(op, inputs):
        found = _scale_shift(op) if isinstance(op, BatchNorm) else None
        y = None if found is None else _folded(op, inputs[0], *found, users, outputs)
        return None if y is None else [y]

    return graph.transform(folded)
