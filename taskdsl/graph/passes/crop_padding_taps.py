"""A convolution's kernel taps that read only padding, at the kernel's edges, cropped away (an exact rewrite).

A tap (kernel offset) whose input position is in the padding for every output position adds `w * 0` to each output:
nothing, for a finite weight. Atrous convolutions over small maps are made mostly of such taps: DeepLab's ASPP
branch of dilation 36 over a 33x33 map reads the input with its centre tap alone (its other eight see padding
only), yet the 3x3 convolution computed all nine. Cropped, it is a 1x1 convolution. Per spatial axis, the taps
before the first live one and after the last one go, the begin padding shrinks by the dilated taps dropped before
(it must stay >= 0) and the end padding is what keeps the output's size. Interior dead taps (a stride larger than
the input can leave some) stay, as do taps whose weights are not all finite (`inf * 0` is NaN). Float
convolutions with constant weights only: an integer one's padding stands for its input's zero point.
"""
from __future__ import annotations

import numpy as np

from ..graph import Graph
from ..ops import Conv
from ..ops.window import window_positions
from ..tensor import constant
from .fold_constants import constant_value


def _live_span(n: int, k: int, stride: int, pad: int, dilation: int, out: int) -> tuple | None:
    """(first, last) live tap of one axis (a tap reading an input position for some output), or None if none is."""
    positions = np.arange(out)[:, None] * stride - pad + np.arange(k)[None, :] * dilation
    live = np.flatnonzero(((positions >= 0) & (positions < n)).any(axis=0))
    return (int(live[0]), int(live[-1])) if live.size else None


def _cropped(op: Conv, w: np.ndarray):
    """(cropped weights, new pads) for `op`, or None when no edge tap reads only padding (or cropping is not exact)."""
    a, rank = op.attrs, w.ndim - 2
    spatial = op.spatial_dims(op.inputs[0].shape)
    begins, ends, keep = [], [], [slice(None), slice(None)]
    for i in range(rank):
        k, s, d, p, out = w.shape[2 + i], a["strides"][i], a["dilations"][i], a["pads"][i], a["out"][i]
        span = _live_span(spatial[i], k, s, p, d, out)
        if span is None:
            return None
        first, last = span
        begin = p - first * d
        end = max(0, (out - 1) * s + (last - first) * d + 1 - spatial[i] - begin)
        if begin < 0 or window_positions(spatial[i], last - first + 1, s, begin, end, d) != out:
            return None
        begins.append(begin)
        ends.append(end)
        keep.append(slice(first, last + 1))
    cropped = w[tuple(keep)]
    if cropped.shape == w.shape:
        return None
    dropped = np.ones(w.shape, bool)
    dropped[tuple(keep)] = False
    if not np.isfinite(w[dropped]).all():
        return None
    return np.ascontiguousarray(cropped), tuple(begins + ends)


def crop_padding_taps(graph: Graph) -> Graph:
    """The graph with each float convolution's edge taps that read only padding cropped (see the module docstring)."""
    def rewritten(op, inputs):
        if not isinstance(op, Conv):
            return None
        w = constant_value(op.inputs[1])
        found = None if w is None else _cropped(op, np.asarray(w))
        if found is None:
            return None
        weights, pads = found
        return Conv([inputs[0], constant(weights, op.inputs[1].dtype)], dict(op.attrs, pads=pads)).outputs

    return graph.transform(rewritten)
