"""Converter of DeformConv: a convolution whose taps read the input at learned offsets (deformable convolution, DCN
v1, and v2 with a mask).

Each output position's tap reads X at its place in the window moved by the position's offset (an input), by
bilinear interpolation with zeros outside (GridSample's, with align_corners: onnx's reference samples so), scaled
by the mask (an input; ones without it). The samples of every tap at every position are the input's im2col
(N, C * taps, positions), sampled at once for every offset group by `ops.grid_sample`; the convolution is then a
batched matmul per batch and group, plus the bias: of the weights by the samples as they lie where the image is
wide for its channels (`WIDE_IMAGE`), else of the samples transposed, (positions, C / group * taps), by the weights,
which as the constant second operand are packed once.
"""
from __future__ import annotations

import math

import numpy as np

from .. import ops
from ..tensor import constant
from .errors import OnnxImportError
from .grid_sample import COORDINATE_LIMIT
from .windows import window
from .node import Node, converts

# output positions per output channel from which the samples are the product's second operand as they lie, the
# weights its first, and the output comes out channels first: where the image is wide for its channels, the
# transpose of the samples cost more than the weights' packing saves (3x3, 64 -> 64 channels at 56x56: 4.2-5.3 ->
# 3.3-3.7 ms; 512 -> 512 at 7x7: 1.5-1.8 -> 1.8-2.1 ms; docs/benchmarks.md, session 115)
WIDE_IMAGE = 2


def _sample_places(kernel: tuple, out: list, strides: tuple, pads: tuple, dilations: tuple) -> np.ndarray:
    """(kh, kw, OH, OW, 2): each tap's place at each output position before its offset, in pixels (w, h)."""
    i, j, oh, ow = np.meshgrid(*(np.arange(n) for n in kernel + tuple(out)), indexing="ij")
    h = oh * strides[0] - pads[0] + i * dilations[0]
    w = ow * strides[1] - pads[1] + j * dilations[1]
    return np.stack([w, h], axis=-1).astype(np.float64)


@converts("DeformConv", attrs=("dilations", "group", "kernel_shape", "offset_group", "pads", "strides"))
def deform_conv(node: Node) -> list:
    """DeformConv (opset 19; 2 spatial axes, as onnx's reference defines it): groups, offset groups, strides, pads,
    dilations, an optional bias and mask; 16-bit floats computed in f32 and rounded once."""
    x, w, offset = node.input(0), node.input(1), node.input(2)
    bias, mask = node.input(3, required=False), node.input(4, required=False)
    if x.ndim != 4:
        raise node.error(f"an input of shape {x.shape} is not supported: 2 spatial axes (N, C, H, W), as onnx's "
                         "reference defines the operator")
    if not x.dtype.is_float:
        raise node.error(f"data type {x.dtype.name} is not supported (floats)")
    kernel = tuple(node.attr("kernel_shape", w.shape[2:]))
    group, offset_group = node.attr("group", 1), node.attr("offset_group", 1)
    strides, pads, dilations = window(node, x, kernel)
    (batch, channels), (oc, taps) = x.shape[:2], (w.shape[0], math.prod(kernel))
    out = [(n + b + e - d * (k - 1) - 1) // s + 1
           for n, k, s, d, b, e in zip(x.shape[2:], kernel, strides, dilations, pads[:2], pads[2:])]
    if w.ndim != 4 or kernel != w.shape[2:] or group < 1 or offset_group < 1 or channels != w.shape[1] * group \
            or oc % group or channels % offset_group or min(out) < 1:
        raise node.error(f"X {x.shape}, W {w.shape}, kernel_shape {kernel}, group={group} and offset_group="
                         f"{offset_group} do not match (W is (M, C / group, kH, kW) for X (N, C, H, W), M a "
                         "multiple of group, C of both), or leave no output position", OnnxImportError)
    expected = {"offset": (offset, (batch, offset_group * 2 * taps, *out)),
                "mask": (mask, (batch, offset_group * taps, *out)), "B": (bias, (oc,))}
    for name, (t, shape) in expected.items():
        if t is not None and t.shape != shape:
            raise node.error(f"{name} must have shape {shape}, got {t.shape}", OnnxImportError)
    wide = "f32" if x.dtype.computes_in_f32 else x.dtype.name
    positions = math.prod(out)
    # each (batch, offset group, tap, position)'s sampling place, in pixels (w, h): a row of the samples
    moved = ops.transpose(ops.reshape(ops.cast(offset, wide), (batch, offset_group) + kernel + (2,) + tuple(out)),
                          (0, 1, 2, 3, 5, 6, 4))
    places = ops.add(ops.slice(moved, [-1], [-3], [6], [-1]),       # (h, w) -> (w, h)
                     constant(_sample_places(kernel, out, strides, pads, dilations), wide))
    places = ops.clip(ops.reshape(places, (batch, offset_group * taps * positions, 2)), -COORDINATE_LIMIT[wide],
                      COORDINATE_LIMIT[wide])
    samples = ops.reshape(ops.grid_sample(x, places, "linear", "zeros", True),
                          (batch, channels, offset_group, taps, positions))
    if mask is not None:
        samples = ops.mul(samples, ops.reshape(ops.cast(mask, wide), (batch, 1, offset_group, taps, positions)))
    per_group = channels // offset_group     # each offset group's channels take its samples
    columns = ops.concat([ops.slice(samples, [g * per_group, g], [(g + 1) * per_group, g + 1], [1, 2])
                          for g in range(offset_group)], 1) if offset_group > 1 else samples
    columns = ops.reshape(columns, (batch, group, channels // group * taps, positions))
    weights = ops.reshape(ops.cast(w, wide), (group, oc // group, channels // group * taps))
    if positions >= WIDE_IMAGE * (oc // group):
        # (M x C * taps) @ (C * taps x positions) per batch and group: the samples in their own order
        y = ops.matmul(weights, columns)
        if bias is not None:
            y = ops.add(y, ops.reshape(ops.cast(bias, wide), (group, oc // group, 1)))
    else:
        # (positions x C * taps) @ (C * taps x M): the samples transposed, the constant weights packed once
        y = ops.matmul(ops.transpose(columns, (0, 1, 3, 2)), ops.transpose(weights, (0, 2, 1)))
        if bias is not None:
            y = ops.add(y, ops.reshape(ops.cast(bias, wide), (group, 1, oc // group)))
        y = ops.transpose(y, (0, 1, 3, 2))
    y = ops.reshape(y, (batch, oc) + tuple(out))
    return [ops.cast(y, x.dtype)]
