"""Converters of indexing operators: GatherND, EyeLike, ReverseSequence and CenterCropPad.

GatherND is one gather along the first axis of data viewed as (batches x gathered elements, rest...): each
index tuple becomes a linear index by elementwise operators and a sum (an index out of range becomes one past the
axis, which the gather refuses). EyeLike is a constant. ReverseSequence, with constant sequence lengths, is one
gather of (batch, time) rows at constant source rows; CenterCropPad, with a constant shape, a slice and a pad.
"""
from __future__ import annotations

import math

import numpy as np

from .. import ops
from ..ops.axes import normalize_axis
from ..passes.fold_constants import constant_value
from ..tensor import constant
from .errors import OnnxImportError
from .node import Node, converts, dtype_of


@converts("GatherND", attrs=("batch_dims",))
def gather_nd(node: Node) -> list:
    """GatherND (batch_dims; negative indices count from the end): data's slices at the index tuples along the
    last axis of indices, per batch of the first batch_dims axes."""
    data, indices = node.input(0), node.input(1)
    b = node.attr("batch_dims", 0)
    if not indices.dtype.is_integer:
        raise node.error(f"indices must be integers, got {indices.dtype.name}", OnnxImportError)
    if not 0 <= b < min(data.ndim, indices.ndim):
        raise node.error(f"batch_dims={b} must be below the ranks of data {data.shape} and indices "
                         f"{indices.shape}", OnnxImportError)
    m = indices.shape[-1]
    if not 1 <= m <= data.ndim - b or indices.shape[:b] != data.shape[:b]:
        raise node.error(f"indices of shape {indices.shape} do not fit data of shape {data.shape} with "
                         f"batch_dims={b}: the batch axes must match, and the last axis hold 1 to {data.ndim - b} "
                         "indices", OnnxImportError)
    picked, rest = data.shape[b:b + m], data.shape[b + m:]
    batches, elements = math.prod(data.shape[:b]), math.prod(picked)
    value = constant_value(indices)
    if value is not None:      # refused at import with the offending index, not at run time by the gather
        value = np.asarray(value).reshape(-1, m)
        bad = (value < -np.array(picked)) | (value >= np.array(picked))
        if bad.any():
            row, axis = np.argwhere(bad)[0]
            raise node.error(f"index {value[row, axis]} is out of range for axis {b + axis} of data's shape "
                             f"{data.shape}", OnnxImportError)
    k = ops.reshape(ops.cast(indices, "int64"), (-1, m))       # the index tuples, the batches' one after another
    sizes = constant(np.array(picked, np.int64))
    k = ops.where(ops.less(k, 0), ops.add(k, sizes), k)
    inside = ops.elementwise("logical_and", ops.elementwise("greater_equal", k, 0), ops.less(k, sizes))
    strides = constant(np.array([math.prod(picked[a + 1:]) for a in range(m)], np.int64))
    # an index out of range adds batches * elements: the linear index is past the axis, and the gather refuses it
    linear = ops.sum(ops.where(inside, ops.mul(k, strides), constant(np.int64(batches * elements))), -1)
    if batches > 1:     # each tuple's batch's first row
        linear = ops.add(linear, constant(np.repeat(np.arange(batches, dtype=np.int64) * elements,
                                                    math.prod(indices.shape[b:-1]))))
    rows = ops.reshape(data, (batches * elements,) + rest)
    return [ops.reshape(ops.gather(rows, linear, 0), indices.shape[:-1] + rest)]


@converts("EyeLike", attrs=("dtype", "k"))
def eye_like(node: Node) -> list:
    """EyeLike: a constant matrix of the input's shape with ones on diagonal k (default 0) and zeros elsewhere,
    of type `dtype` (default: the input's)."""
    x = node.input(0)
    if x.ndim != 2:
        raise node.error(f"needs a matrix, got shape {x.shape}", OnnxImportError)
    dtype = dtype_of(node.attr("dtype"), f"node {node.name!r} (EyeLike) 'dtype'") if node.has_attr("dtype") \
        else x.dtype
    return [constant(np.eye(*x.shape, k=node.attr("k", 0)), dtype)]


@converts("ReverseSequence", attrs=("batch_axis", "time_axis"))
def reverse_sequence(node: Node) -> list:
    """ReverseSequence: in each batch b, the first sequence_lens[b] (a constant) steps along the time axis
    reversed, the others kept; batch_axis and time_axis are 1 and 0 (the default) or 0 and 1."""
    x = node.input(0)
    batch_axis, time_axis = node.attr("batch_axis", 1), node.attr("time_axis", 0)
    if {batch_axis, time_axis} != {0, 1}:
        raise node.error(f"batch_axis={batch_axis} and time_axis={time_axis} must be 0 and 1, one each",
                         OnnxImportError)
    if x.ndim < 2:
        raise node.error(f"needs a tensor of rank 2 or more, got shape {x.shape}", OnnxImportError)
    lens = np.asarray(node.const(1))
    batch, steps = x.shape[batch_axis], x.shape[time_axis]
    if lens.shape != (batch,) or lens.dtype.kind not in "iu":
        raise node.error(f"sequence_lens must be {batch} integers (one per batch), got {lens.dtype}"
                         f"{list(lens.shape)}", OnnxImportError)
    if lens.size and (lens.min() < 0 or lens.max() > steps):
        raise node.error(f"sequence_lens {lens.tolist()} must lie in [0, {steps}], the time axis's size",
                         OnnxImportError)
    if (lens <= 1).all():        # nothing is reversed
        return [x]
    lens, t = lens.astype(np.int64)[:, None], np.arange(steps)
    source = np.where(t < lens, lens - 1 - t, t)      # (batch, time): the step each output step reads
    # the flat index of each (axis 0, axis 1) pair of x viewed with those two axes merged
    b = np.arange(batch)[:, None]
    flat = b * steps + source if batch_axis == 0 else (source * batch + b).T
    rows = ops.reshape(x, (batch * steps,) + x.shape[2:])
    return [ops.gather(rows, constant(flat), 0)]


@converts("CenterCropPad", attrs=("axes",))
def center_crop_pad(node: Node) -> list:
    """CenterCropPad: each axis of `axes` (default: all) cropped or zero-padded to its size in `shape` (a
    constant) around its center, the odd element cut or added at the end: a slice, then a pad."""
    x = node.input(0)
    shape = np.asarray(node.const(1))
    axes = node.attr("axes")
    axes = list(range(x.ndim)) if axes is None else [normalize_axis(a, x.ndim, "CenterCropPad") for a in axes]
    if len(set(axes)) != len(axes):
        raise node.error(f"axes {node.attr('axes')} name an axis twice", OnnxImportError)
    if shape.dtype.kind not in "iu" or shape.shape != (len(axes),) or (shape < 0).any():
        raise node.error(f"shape must be {len(axes)} non-negative integers (one per axis of {axes}), got "
                         f"{shape.dtype}{list(shape.shape)}: {shape.tolist()}", OnnxImportError)
    starts, ends, cropped, pads = [], [], [], [0] * 2 * x.ndim
    for a, target in zip(axes, shape.tolist()):
        n = x.shape[a]
        if target < n:
            start = (n - target) // 2
            starts, ends, cropped = starts + [start], ends + [start + target], cropped + [a]
        else:
            pads[a], pads[x.ndim + a] = (target - n) // 2, target - n - (target - n) // 2
    y = ops.slice(x, starts, ends, cropped) if cropped else x
    return [ops.pad(y, pads)]
