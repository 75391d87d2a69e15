"""Converters of operators whose output shape depends on values: NonZero, Unique and Compress.

Shapes are static, so the values that fix the shape must be known at import time (a ConstantRequiredError names
the graph inputs to give with `from_onnx(constants=...)`, as for a Reshape's shape). NonZero and Unique of a
constant are constants computed with numpy, as onnxruntime computes them; Compress takes a constant condition and
any data, and becomes a slice (the selected entries are one run) or one gather.
"""
from __future__ import annotations

import numpy as np

from .. import ops
from ..ops.axes import normalize_axis
from ..tensor import constant
from .errors import OnnxImportError
from .node import Node, converts


@converts("NonZero")
def nonzero(node: Node) -> list:
    """NonZero of a constant: the (rank, count) int64 indices of its nonzero elements, in row-major order (NaN
    counts as nonzero; a scalar as a one-element vector, as onnxruntime takes it)."""
    x = np.atleast_1d(node.const(0))
    return [constant(np.array(np.nonzero(x), np.int64).reshape(x.ndim, -1))]


@converts("Unique", attrs=("axis", "sorted"))
def unique(node: Node) -> list:
    """Unique of a constant (flattened, or its slices along `axis`): the unique values, sorted or in order of first
    occurrence, with each one's first index, every element's index into them, and their counts. -0.0 and 0.0 are
    one value (the first one met is kept); NaN is refused, where onnxruntime's result is undefined."""
    x = np.atleast_1d(node.const(0))
    axis = node.attr("axis")
    if x.dtype.kind in "fc" and np.isnan(x).any():
        raise node.error("the input holds NaN, which Unique does not order (onnxruntime's result is undefined there)")
    if axis is None:
        items = x.reshape(-1)
    else:
        axis = normalize_axis(axis, x.ndim, f"node {node.name!r} (Unique): axis")
        items = np.moveaxis(x, axis, 0)
        if items.size == 0 and len(items):
            raise node.error(f"slices of no elements (an input of shape {x.shape} along axis {axis}) are not "
                             "supported (onnxruntime aborts on them)")
    # the slices compared by value: numpy compares the slices along an axis by their bytes, where -0.0 != 0.0
    keys = items + np.zeros((), items.dtype) if items.dtype.kind in "fc" else items
    _, first, inverse, counts = np.unique(keys, return_index=True, return_inverse=True, return_counts=True,
                                          axis=None if axis is None else 0)
    inverse = inverse.reshape(-1)
    if not node.flag("sorted", 1):      # in order of first occurrence
        order = np.argsort(first, kind="stable")
        rank = np.empty_like(order)
        rank[order] = np.arange(len(order))
        first, counts, inverse = first[order], counts[order], rank[inverse]
    values = items[first] if axis is None else np.moveaxis(items[first], 0, axis)
    return [constant(np.ascontiguousarray(values))] + [constant(a.astype(np.int64)) for a in (first, inverse, counts)]


@converts("Compress", attrs=("axis",))
def compress(node: Node) -> list:
    """Compress by a constant condition: the data's slices along `axis` (of the flattened data without one) where
    the condition holds; entries past the condition's length are dropped, ones past the axis must be false."""
    data, condition = node.input(0), np.asarray(node.const(1))
    if condition.ndim != 1:
        raise node.error(f"condition must be 1-D, got shape {condition.shape}", OnnxImportError)
    if node.has_attr("axis"):
        axis = normalize_axis(node.attr("axis"), data.ndim, f"node {node.name!r} (Compress): axis")
    else:
        data, axis = ops.reshape(data, [-1]), 0
    n = data.shape[axis]
    selected = np.flatnonzero(condition)
    if len(selected) and selected[-1] >= n:
        raise node.error(f"the condition selects index {selected[-1]}, past the {n} entries of the compressed axis",
                         OnnxImportError)
    if len(selected) and selected[-1] - selected[0] == len(selected) - 1:     # one run: a slice
        return [ops.slice(data, [int(selected[0])], [int(selected[-1]) + 1], [axis])]
    return [ops.gather(data, constant(selected.astype(np.int64)), axis)]
