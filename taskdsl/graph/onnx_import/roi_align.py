"""Converter of RoiAlign: each region of interest's output bins averaged (or maxed) over a grid of bilinear samples.

The regions are an input (a detector's proposals), so the samples' places are computed by elementwise operators
from them. Each output bin takes sampling_ratio x sampling_ratio samples; with sampling_ratio 0, ceil(region size /
bins) along each axis, which must then be known at import (the regions constant: a ConstantRequiredError names the
inputs to fix otherwise), the bins of smaller regions masking the samples they do not take. A sample is the
bilinear interpolation of its 4 neighbouring pixels as onnxruntime computes it: one past the edge by more than a
pixel reads 0, one within a pixel of it the edge. Mode avg is then one resample of X viewed as a table (C, N * H * W),
4 taps a sample, its weights divided by the bin's count; mode max takes, as onnxruntime and onnx's reference do, the
largest over the samples of each one's largest weighted corner: a gather of every corner, then maxima.
"""
from __future__ import annotations

import math

import numpy as np

from .. import ops
from ..tensor import constant
from .errors import OnnxImportError
from .node import Node, converts

MAX_SAMPLES = 64    # samples a bin may take (resample taps: 4 each)


def _grid(node: Node, rois, ratio: int, bins: tuple, wide: str) -> np.ndarray:
    """(R, 2): the samples each region's bins take along (h, w): the ratio, or for ratio 0 ceil(size / bins) of
    the constant regions."""
    if ratio > 0:
        return np.full((rois.shape[0], 2), ratio, np.int64)
    boxes = np.asarray(node.const(1), wide) * np.asarray(node.attr("spatial_scale", 1.0), wide)
    half_pixel = node.attr("coordinate_transformation_mode", "half_pixel") == "half_pixel"
    sizes = boxes[:, 2:][:, ::-1] - boxes[:, :2][:, ::-1]       # (h, w): the offset cancels
    if not half_pixel:
        sizes = np.maximum(sizes, 1)
    return np.ceil(sizes / np.array(bins, wide)).astype(np.int64)


def _axis_taps(y, n: int):
    """For sample coordinates y along an axis of n pixels: (the indices of the low and high neighbours, their
    weights, each (..., 2); whether the sample lies past the edge by more than a pixel)."""
    outside = ops.elementwise("logical_or", ops.less(y, -1.0), ops.greater(y, float(n)))
    y = ops.maximum(y, 0.0)
    low = ops.elementwise("floor", y)
    at_end = ops.elementwise("greater_equal", low, float(n - 1))
    low = ops.where(at_end, float(n - 1), low)
    y = ops.where(at_end, low, y)
    high = ops.where(at_end, low, ops.add(low, 1.0))
    fraction = ops.sub(y, low)
    index = ops.cast(ops.concat([ops.unsqueeze(low, -1), ops.unsqueeze(high, -1)], -1), "int64")
    weight = ops.concat([ops.unsqueeze(ops.sub(1.0, fraction), -1), ops.unsqueeze(fraction, -1)], -1)
    return index, weight, outside


@converts("RoiAlign", attrs=("coordinate_transformation_mode", "mode", "output_height", "output_width",
                             "sampling_ratio", "spatial_scale"))
def roi_align(node: Node) -> list:
    """RoiAlign (opsets 10-22; coordinate_transformation_mode half_pixel or output_half_pixel, opset 10's), modes
    avg and max, on float inputs; 16-bit ones computed in f32 and rounded once."""
    x, rois, batch_indices = node.input(0), node.input(1), node.input(2)
    mode = node.attr("mode", "avg")
    transform = node.attr("coordinate_transformation_mode", "half_pixel" if node.opset >= 16 else "output_half_pixel")
    bins = (node.attr("output_height", 1), node.attr("output_width", 1))
    ratio = node.attr("sampling_ratio", 0)
    if x.ndim != 4 or rois.ndim != 2 or rois.shape[1] != 4 or batch_indices.shape != rois.shape[:1]:
        raise node.error(f"X {x.shape}, rois {rois.shape} and batch_indices {batch_indices.shape} do not match: X is "
                         "(N, C, H, W), rois (R, 4), batch_indices (R,)", OnnxImportError)
    if mode not in ("avg", "max") or transform not in ("half_pixel", "output_half_pixel") or min(bins) < 1 \
            or ratio < 0:
        raise node.error(f"mode={mode!r}, coordinate_transformation_mode={transform!r}, output size {bins} or "
                         f"sampling_ratio={ratio} is not valid", OnnxImportError)
    if not (x.dtype.is_float and rois.dtype.is_float and batch_indices.dtype.is_integer):
        raise node.error(f"X and rois must be floats, batch_indices integers, got {x.dtype.name}, {rois.dtype.name} "
                         f"and {batch_indices.dtype.name}")
    wide = "float32" if x.dtype.computes_in_f32 else str(x.numpy_dtype)
    (batch, channels, height, width), regions = x.shape, rois.shape[0]
    grid = _grid(node, rois, ratio, bins, wide)
    most = tuple(int(g) for g in grid.max(axis=0, initial=1))
    if most[0] * most[1] > MAX_SAMPLES:
        raise node.error(f"a bin takes {most[0]} x {most[1]} samples, more than the {MAX_SAMPLES} supported: give "
                         "the model a sampling_ratio")
    # each region's start and bin size along (h, w), in pixels
    boxes = ops.mul(ops.cast(rois, wide), float(node.attr("spatial_scale", 1.0)))
    if transform == "half_pixel":
        boxes = ops.sub(boxes, 0.5)
    start = ops.slice(boxes, [1], [-5], [1], [-1])          # (y1, x1)
    size = ops.sub(ops.slice(boxes, [3], [1], [1], [-1]), start)
    if transform == "output_half_pixel":
        size = ops.maximum(size, 1.0)
    step = ops.div(size, constant(np.array(bins, wide)))
    taps = []
    for axis, (n, extent) in enumerate(((height, bins[0]), (width, bins[1]))):
        first, bin_size = (ops.reshape(ops.slice(t, [axis], [axis + 1], [1]), (regions, 1, 1)) for t in (start, step))
        offsets = (np.arange(most[axis])[None, :] + 0.5) / np.maximum(grid[:, axis:axis + 1], 1)    # (R, samples)
        y = ops.add(first, ops.mul(bin_size, ops.add(constant(np.arange(extent, dtype=wide)[None, :, None]),
                                                     constant(offsets[:, None, :].astype(wide)))))
        taps.append(_axis_taps(y, n))      # each (R, bins, samples[, 2])
    (yi, yw, y_out), (xi, xw, x_out) = taps
    # corners (R, OH, OW, Gh, Gw, 2, 2): the y part varies along OH, Gh and its pair, the x part along the others
    def spread(t, axis: int, pair: bool):
        shape = (regions, bins[0], 1, most[0], 1) if axis == 0 else (regions, 1, bins[1], 1, most[1])
        return ops.reshape(t, shape + (((2, 1) if axis == 0 else (1, 2)) if pair else (1, 1)))
    start_of = ops.cast(batch_indices, "int64")
    start_of = ops.where(ops.less(start_of, 0), batch, start_of)    # (negative: past the table, an IndexError)
    index = ops.add(ops.add(ops.mul(spread(yi, 0, True), width), spread(xi, 1, True)),
                    ops.reshape(ops.mul(start_of, height * width), (regions,) + (1,) * 6))
    inside = ops.elementwise("logical_not", ops.elementwise("logical_or", spread(y_out, 0, False),
                                                            spread(x_out, 1, False)))
    weight = ops.mul(ops.mul(spread(yw, 0, True), spread(xw, 1, True)), ops.cast(inside, wide))
    # (R, Gh, Gw): the samples each region's bins take (all, but for sampling_ratio 0)
    sampled = (np.arange(most[0])[None, :, None] < grid[:, 0].reshape(-1, 1, 1)) & \
        (np.arange(most[1])[None, None, :] < grid[:, 1].reshape(-1, 1, 1))
    rows, corners = regions * bins[0] * bins[1], most[0] * most[1] * 4
    index = ops.reshape(ops.where(inside, index, 0), (rows, corners))
    table = ops.reshape(ops.transpose(ops.reshape(x, (batch, channels, height * width)), (1, 0, 2)),
                        (channels, batch * height * width))
    if mode == "avg":
        count = np.maximum(grid[:, 0] * grid[:, 1], 1).reshape(-1, 1, 1)
        share = (sampled / count).astype(wide)[:, None, None, :, :, None, None]
        y = ops.resample(table, index, ops.reshape(ops.mul(weight, constant(share)), (rows, corners)), 1)
    else:
        values = ops.mul(ops.gather(ops.cast(table, wide), index, 1), ops.reshape(weight, (rows, corners)))
        best = ops.max(ops.reshape(values, (channels, rows, most[0] * most[1], 4)), axis=-1)
        taken = np.broadcast_to(sampled[:, None, None], (regions,) + bins + most).reshape(rows, -1)
        best = ops.where(constant(taken), best, -math.inf)
        y = ops.where(constant(taken.any(axis=-1)), ops.max(best, axis=-1), 0.0)
    y = ops.transpose(ops.reshape(y, (channels, regions) + bins), (1, 0, 2, 3))
    return [ops.cast(y, x.dtype)]
