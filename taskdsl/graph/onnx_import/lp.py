"""Converters of the p-norm operators: LpNormalization, LpPool and GlobalLpPool, compositions of elementwise
operators with a reduction or a pooling.

LpNormalization divides x by its L1 or L2 norm along an axis (a sum with keepdims, a square root for L2), 0 where
the norm is 0. LpPool is (sum over each window of |x|^p)^(1/p), the window's positions in the padding adding
nothing: an average pool over the positions inside the input (count_include_pad off) times their number, a
constant per output position; GlobalLpPool is the sum over the spatial axes. 16-bit floats are computed in f32 and
rounded once.
"""
from __future__ import annotations

import numpy as np

from .. import ops
from ..ops.axes import normalize_axis
from ..tensor import constant
from .elementwise import in_f32
from .errors import OnnxImportError
from .windows import WINDOW_ATTRS, window
from .node import Node, converts


@converts("LpNormalization", attrs=("axis", "p"))
def lp_normalization(node: Node) -> list:
    """LpNormalization: x divided by its L1 (p=1) or L2 (p=2, the default) norm along `axis` (default -1); 0 where
    the norm is 0 (also where x*x underflows to 0), as onnxruntime gives."""
    x, p = node.input(0), node.attr("p", 2)
    if p not in (1, 2):
        raise node.error(f"p={p} is not defined: the operator takes p=1 or p=2", OnnxImportError)
    if not x.dtype.is_float:
        raise node.error(f"data type {x.dtype.name} is not supported (floats)")
    axis = normalize_axis(node.attr("axis", -1), x.ndim, "LpNormalization")

    def normalized(x):
        if p == 1:
            norm = ops.sum(ops.elementwise("abs", x), axis, keepdims=True)
        else:
            norm = ops.sqrt(ops.sum(ops.mul(x, x), axis, keepdims=True))
        zero = constant(np.zeros((), x.numpy_dtype))
        return ops.where(ops.equal(norm, zero), zero, ops.div(x, norm))

    return [in_f32(normalized, x)]


@converts("LpPool", attrs=WINDOW_ATTRS + ("ceil_mode", "p"))
def lp_pool(node: Node) -> list:
    """LpPool (opsets 11 and 18: 1-3 spatial axes, strides, pads or auto_pad, dilations, ceil_mode, an integer
    p >= 1): (sum over each window of |x|^p)^(1/p), the padding adding nothing."""
    x = node.input(0)
    if x.ndim < 3:
        raise node.error(f"needs an (N, C, spatial...) input, got shape {x.shape}", OnnxImportError)
    if x.ndim > 5:
        raise node.error(f"{x.ndim - 2} spatial axes are not supported (1-3)")
    kernel = tuple(node.attr("kernel_shape", ()))
    if len(kernel) != x.ndim - 2:
        raise node.error(f"kernel_shape {kernel} needs one value per spatial axis of {x.shape}", OnnxImportError)
    strides, pads, dilations = window(node, x, kernel)
    p, ceil_mode = node.attr("p", 2), node.flag("ceil_mode")
    if p < 1:       # (onnxruntime gives inf for p=0; a negative p is no norm)
        raise node.error(f"p={p} is not supported (a p-norm with an integer p >= 1)")

    def pooled(x):
        # ops.pool has no sum mode: the sum is the average over the window's positions inside the input times
        # their number (a number where every window has the same count, else a constant per output position)
        mean = ops.pool(_power(x, p), "avg", kernel, strides, pads, dilations, ceil_mode, count_include_pad=False)
        counts = _inside_counts(x.shape[2:], mean.shape[2:], kernel, strides, pads, dilations)
        uniform = bool(np.all(counts == counts.flat[0]))
        total = ops.mul(mean, float(counts.flat[0]) if uniform else constant(counts.astype(x.numpy_dtype)))
        return _root(total, p)

    return [in_f32(pooled, x)]


@converts("GlobalLpPool", attrs=("p",))
def global_lp_pool(node: Node) -> list:
    """GlobalLpPool (an integer p >= 1, default 2): (sum over all spatial positions of |x|^p)^(1/p), a reduction."""
    x, p = node.input(0), node.attr("p", 2)
    if x.ndim < 3:
        raise node.error(f"needs an (N, C, spatial...) input, got shape {x.shape}", OnnxImportError)
    if p < 1:
        raise node.error(f"p={p} is not supported (a p-norm with an integer p >= 1)")

    def pooled(x):
        return _root(ops.sum(_power(x, p), tuple(range(2, x.ndim)), keepdims=True), p)

    return [in_f32(pooled, x)]


def _root(total, p: int):
    """total^(1/p) (a square root for p=2)."""
    return total if p == 1 else ops.sqrt(total) if p == 2 else ops.pow(total, 1.0 / p)


def _power(x, p: int):
    """|x|^p (x*x for p=2: no abs, no pow)."""
    if p == 2:
        return ops.mul(x, x)
    magnitude = ops.elementwise("abs", x)
    return magnitude if p == 1 else ops.pow(magnitude, float(p))


def _inside_counts(spatial: tuple, out: tuple, kernel: tuple, strides: tuple, pads: tuple,
                   dilations: tuple) -> np.ndarray:
    """How many positions of each window (shaped `out`) lie inside the input, not in its padding: the divisor of
    an average pool without count_include_pad."""
    counts = np.ones((), np.int64)
    for i, (n, m, k, s, d) in enumerate(zip(spatial, out, kernel, strides, dilations)):
        taps = np.arange(m)[:, None] * s - pads[i] + np.arange(k)[None, :] * d
        counts = np.multiply.outer(counts, ((taps >= 0) & (taps < n)).sum(axis=1))
    return counts
