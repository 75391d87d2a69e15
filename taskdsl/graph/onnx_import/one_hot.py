"""Converters of the operators whose outputs are one-hot along an axis: OneHot and Hardmax.

Both compare an index per position with the positions along the new (OneHot) or reduced (Hardmax) axis, a
constant arange that broadcasts, and select: one elementwise operator after the index (a cast, an argmax).
"""
from __future__ import annotations

import numpy as np

from .. import ops
from ..ops.axes import normalize_axis
from ..tensor import constant
from .errors import OnnxImportError
from .node import Node, converts


def _positions(n: int, after: int):
    """0..n-1 along an axis followed by `after` axes (shaped (n, 1, ..., 1)), to broadcast against indices."""
    return constant(np.arange(n, dtype=np.int64).reshape((n,) + (1,) * after))


@converts("OneHot", attrs=("axis",))
def one_hot(node: Node) -> list:
    """OneHot: values[1] where the position along the new axis `axis` is the index (negative indices count from
    the end; float indices truncate, as onnxruntime casts them), values[0] elsewhere; depth a constant."""
    indices, values = node.input(0), node.input(2)
    depth = np.asarray(node.const(1))
    if depth.size != 1 or depth.dtype.kind not in "iuf":
        raise node.error(f"depth must be one number, got {depth.dtype}{list(depth.shape)}", OnnxImportError)
    depth = int(depth.reshape(-1)[0])
    if depth < 1:
        raise node.error(f"depth must be at least 1, got {depth}", OnnxImportError)
    if values.shape != (2,):
        raise node.error(f"values must be [off_value, on_value], got shape {list(values.shape)}", OnnxImportError)
    if indices.dtype.is_bool:
        raise node.error("data type bool is not supported for indices (numbers)")
    axis = normalize_axis(node.attr("axis", -1), indices.ndim + 1, "OneHot")
    index = ops.cast(indices, "int64")
    index = ops.unsqueeze(ops.where(ops.less(index, 0), ops.add(index, depth), index), axis)
    hit = ops.equal(index, _positions(depth, indices.ndim - axis))
    off, on = (ops.reshape(ops.slice(values, [k], [k + 1]), ()) for k in (0, 1))
    return [ops.where(hit, on, off)]


@converts("Hardmax", attrs=("axis",))
def hardmax(node: Node) -> list:
    """Hardmax: 1 at the first largest element along `axis` (from opset 13; before, over the axes from `axis` on,
    flattened), 0 elsewhere; a NaN counts as the largest, as in ArgMax."""
    x = node.input(0)
    if not x.dtype.is_float:
        raise node.error(f"data type {x.dtype.name} is not supported (floats)")
    if node.opset >= 13:
        return [_hardmax(x, normalize_axis(node.attr("axis", -1), x.ndim, "Hardmax"))]
    axis = normalize_axis(node.attr("axis", 1), x.ndim, "Hardmax")    # opset < 13: over all axes from axis
    return [ops.reshape(_hardmax(ops.flatten(x, axis), 1), x.shape)]


def _hardmax(x, axis: int):
    """1 (in x's dtype) at the first largest element of x along `axis`, 0 elsewhere."""
    first = ops.argmax(x, axis, keepdims=True)
    return ops.cast(ops.equal(first, _positions(x.shape[axis], x.ndim - 1 - axis)), x.dtype)
