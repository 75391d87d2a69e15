"""Converters of Resize / Upsample, ConvTranspose and Col2Im.

Shapes are static, so the source coordinate of each output index along each resized axis is a constant:
a nearest Resize is a gather per resized axis, a linear or cubic one an `ops.resample` per axis (a gather
of 2 or 4 taps, or with antialias 2 / s or 4 / s where the axis shrinks by s, weighted by constant weights).
Coordinates are computed in f32, as onnxruntime computes them, so that nearest ties (within 1e-6 of a half) round
as there. Upsample (opsets 7-9) reaches no
converter: the importer converts models before opset 11 to opset 13, where onnx.version_converter has made
it a Resize (and model.py gives it back the coordinates and rounding it had, which the conversion drops).

ConvTranspose is a convolution by the weights flipped spatially with their channel axes swapped per group: of the
input itself, with one output channel per channel and output phase (dilation 1), the phases then interleaved;
with a dilation, of the input with stride - 1 zeros between its elements. Col2Im, the sum of blocks a transposed
convolution makes, adds up one shifted copy of the blocks per block offset, stride - 1 zeros between their elements.
"""
from __future__ import annotations

import functools
import itertools
import math

import numpy as np

from .. import ops
from ..ops.axes import normalize_axis
from .errors import OnnxImportError
from .windows import WINDOW_ATTRS, window
from .node import Node, converts


# ---------------------------------------------------------------- Resize
def _crop_and_resize(x, scale, n_in, n_out, roi):
    """tf_crop_and_resize's source coordinates: the output spans roi (start, end), fractions of the axis."""
    start, end = roi
    if n_out == 1:
        return np.full_like(x, 0.5 * (float(start) + float(end)) * (n_in - 1))
    return start * (n_in - 1) + x * (end - start) * (n_in - 1) / (n_out - 1)


def _half_pixel_symmetric(x, scale, n_in, n_out, roi):
    """half_pixel_symmetric's source coordinates: half_pixel's, centred where floor() trimmed the output (the
    offset in f32, the rest in f64, as onnxruntime computes them)."""
    offset = np.float32(n_in) / 2 * (1 - np.float32(n_out) / (scale * np.float32(n_in)))
    return (np.float64(offset) + (x.astype(np.float64) + 0.5) / np.float64(scale) - 0.5).astype(np.float32)


# coordinate_transformation_mode -> the source coordinates (f32) of output indices x (an f32 arange)
COORDINATE_MODES = {
    "half_pixel": lambda x, scale, n_in, n_out, roi: (x + 0.5) / scale - 0.5,
    "half_pixel_symmetric": _half_pixel_symmetric,
    "pytorch_half_pixel": lambda x, scale, n_in, n_out, roi: (x + 0.5) / scale - 0.5 if n_out > 1 else 0 * x,
    "align_corners": lambda x, scale, n_in, n_out, roi: x * (n_in - 1) / (n_out - 1) if n_out > 1 else 0 * x,
    "asymmetric": lambda x, scale, n_in, n_out, roi: x / scale,
    "tf_half_pixel_for_nn": lambda x, scale, n_in, n_out, roi: (x + 0.5) / scale,     # opset 11 only
    "tf_crop_and_resize": _crop_and_resize,
}
# a coordinate within this of a half is a tie, as onnxruntime (1.2x on) takes it: the f32 coordinate of an exact
# half such as 1 / f32(2/7) = 3.4999998 then rounds the way the mode prefers
TIE_TOLERANCE = 1e-6


def _round_half(prefer_ceil: bool):
    """Round to the nearest index (in f64, where x - floor(x) is exact for an f32 x), near-ties up or down."""
    def nearest(x):
        below = np.floor(x)
        tie = np.abs(x - below - 0.5) <= TIE_TOLERANCE
        return np.where(tie, below + prefer_ceil, np.floor(x + 0.5))
    return nearest


# nearest_mode -> the index nearest each coordinate
NEAREST_MODES = {
    "round_prefer_floor": _round_half(prefer_ceil=False),
    "round_prefer_ceil": _round_half(prefer_ceil=True),
    "floor": np.floor,
    "ceil": np.ceil,
}
# the nearest_mode the importer gives the Resize nodes onnx.version_converter makes of an Upsample (opsets 7-9)
# or an opset-10 Resize (model.py): their rounding, as onnxruntime reads them: floor where the axis grows, ceil
# where it shrinks
BEFORE_OPSET_11 = "taskdsl:before-opset-11"
ASPECT_RATIO_POLICIES = {"not_larger": np.min, "not_smaller": np.max}


def _given(node: Node, k: int) -> np.ndarray | None:
    """Input k's constant value, flattened, or None where it is absent or empty (how a Resize leaves out
    scales or roi)."""
    value = node.const(k, required=False)
    return None if value is None or value.size == 0 else np.asarray(value).reshape(-1)


def _resized_axes(node: Node, x) -> list:
    """The axes that roi, scales and sizes give values for, in their order (opset 18's `axes`; default all)."""
    axes = node.attr("axes")
    if axes is None:
        return list(range(x.ndim))
    axes = [normalize_axis(a, x.ndim, "Resize") for a in axes]
    if len(set(axes)) != len(axes):
        raise node.error(f"axes {node.attr('axes')} repeat an axis", OnnxImportError)
    return axes


def _scales_and_sizes(node: Node, x, axes: list) -> tuple:
    """(scale (f32), output size) of each resized axis, from the scales or the sizes (keep_aspect_ratio_policy
    applied), as onnxruntime computes them."""
    scales, sizes = _given(node, 2), _given(node, 3)
    if (scales is None) == (sizes is None):
        raise node.error("exactly one of scales and sizes must be given (a non-empty constant)", OnnxImportError)
    given = scales if sizes is None else sizes
    if given.size != len(axes):
        raise node.error(f"{'scales' if sizes is None else 'sizes'} {given.tolist()} need one value per resized "
                         f"axis {axes}", OnnxImportError)
    n = np.array([x.shape[a] for a in axes], np.float32)
    if sizes is None:
        if any(scales <= 0):
            raise node.error(f"scales {scales.tolist()} must be positive", OnnxImportError)
        scales = scales.astype(np.float32)
        return scales, (scales * n).astype(np.int64)      # floor(scale * n), in f32
    if any(sizes < 0):
        raise node.error(f"sizes {sizes.tolist()} must not be negative", OnnxImportError)
    scales = np.where(n > 0, sizes.astype(np.float32) / np.maximum(n, 1), np.float32(1))
    policy = node.attr("keep_aspect_ratio_policy", "stretch")
    if policy == "stretch":
        return scales, sizes.astype(np.int64)
    if policy not in ASPECT_RATIO_POLICIES:
        raise node.error(f"keep_aspect_ratio_policy={policy!r} is not supported (stretch, not_larger, not_smaller)")
    scales = np.full_like(scales, ASPECT_RATIO_POLICIES[policy](scales))
    return scales, np.floor((scales * n).astype(np.float64) + 0.5).astype(np.int64)     # rounded half up


def _rois(node: Node, axes: list) -> list:
    """The (start, end) region of each resized axis (f32): roi's for tf_crop_and_resize, else the whole axis."""
    whole = [np.float32([0, 1])] * len(axes)
    if node.attr("coordinate_transformation_mode", "half_pixel") != "tf_crop_and_resize":
        return whole
    roi = _given(node, 1)
    if roi is None or roi.size != 2 * len(axes):
        raise node.error(f"tf_crop_and_resize needs a roi of 2 values (start, end) per resized axis {axes}, got "
                         f"{None if roi is None else roi.tolist()}", OnnxImportError)
    roi = roi.astype(np.float32)
    return [roi[[k, len(axes) + k]] for k in range(len(axes))]


def _linear_taps(x: np.ndarray, n: int) -> tuple:
    """(indices, weights) of the 2 inputs around each coordinate, which is clamped to the axis."""
    x = np.clip(x, 0, n - 1)
    low = np.floor(x)
    return np.stack([low, np.minimum(low + 1, n - 1)]).astype(np.int64), np.stack([low + 1 - x, x - low])


def _keys_kernel(d: np.ndarray, a: float) -> np.ndarray:
    """Keys' cubic convolution kernel at distances 0 <= d <= 2, with coefficient `a`."""
    return np.where(d <= 1, ((a + 2) * d - (a + 3)) * d * d + 1, ((a * d - 5 * a) * d + 8 * a) * d - 4 * a)


def _cubic_taps(x: np.ndarray, n: int, a: float, exclude_outside: bool) -> tuple:
    """(indices, weights) of the 4 inputs around each coordinate; those outside the axis read its edge, or with
    `exclude_outside` weigh 0 (the others renormalized)."""
    low = np.floor(x)
    t = (x - low).astype(np.float64)
    weights = np.stack([_keys_kernel(d, a) for d in (1 + t, t, 1 - t, 2 - t)])
    indices = low.astype(np.int64) + np.arange(-1, 3)[:, None]
    if exclude_outside:
        weights = np.where((indices >= 0) & (indices < n), weights, 0.0)
        weights /= weights.sum(axis=0)
    return np.clip(indices, 0, n - 1), weights


def _antialias_taps(x: np.ndarray, n: int, scale: float, mode: str, a: float, exclude_outside: bool) -> tuple:
    """(indices, weights) of a shrinking axis (scale < 1) with antialias: the linear (tent) or cubic kernel widened
    by 1 / scale, as onnx's reference computes it: the taps around each coordinate, the kernel at their distances
    times the scale, normalized to sum 1; taps outside the axis read its edge, or with `exclude_outside` weigh 0."""
    x = x.astype(np.float64)
    base = np.floor(x)
    ratio = np.where(x == base, 1.0, x - base)      # a whole coordinate: the tap on its left is the base
    base = x - ratio
    reach = 1 if mode == "linear" else 2            # the kernel's support, in input steps at scale 1
    start = math.floor(-reach / scale) + 1
    offsets = np.arange(start, 2 - start)[:, None]
    d = np.abs((offsets - ratio) * scale)
    weights = np.clip(1 - d, 0, 1) if mode == "linear" else np.where(d < 2, _keys_kernel(d, a), 0.0)
    indices = (base + offsets).astype(np.int64)
    if exclude_outside:
        weights = np.where((indices >= 0) & (indices < n), weights, 0.0)
    return np.clip(indices, 0, n - 1), weights / weights.sum(axis=0)


def _taps(node: Node, mode: str, scale: float):
    """The (coordinates, axis size) -> (indices, weights) function of a linear or cubic Resize along an axis
    scaled by `scale`."""
    a, exclude_outside = float(node.attr("cubic_coeff_a", -0.75)), node.flag("exclude_outside")
    if node.flag("antialias") and scale < 1:
        return functools.partial(_antialias_taps, scale=float(scale), mode=mode, a=a, exclude_outside=exclude_outside)
    if mode == "linear":
        return _linear_taps
    return functools.partial(_cubic_taps, a=a, exclude_outside=exclude_outside)


def _nearest_indices(node: Node, x: np.ndarray, n: int) -> np.ndarray:
    """The input indices a nearest Resize reads along an axis of n at the source coordinates `x` (f32)."""
    nearest_mode = node.attr("nearest_mode", "round_prefer_floor")
    if nearest_mode == BEFORE_OPSET_11:
        rounding = np.floor if len(x) >= n else np.ceil
    else:
        rounding = NEAREST_MODES[nearest_mode]
    return np.clip(rounding(x.astype(np.float64)), 0, n - 1).astype(np.int64)


def _as_slice(indices: np.ndarray) -> tuple | None:
    """(start, stop, step) where `indices` are an increasing arithmetic sequence (a whole-factor shrink, a crop), else
    None."""
    steps = np.diff(indices)
    if len(steps) and (steps[0] < 1 or (steps != steps[0]).any()):
        return None
    return int(indices[0]), int(indices[-1]) + 1, int(steps[0]) if len(steps) else 1


def _resized_along(node: Node, y, axis: int, x: np.ndarray, scale: float, weight_dtype):
    """y resized along `axis` (by `scale`) to the source coordinates `x` (f32), as the node's mode says."""
    n, mode = y.shape[axis], node.attr("mode", "nearest")
    if mode == "nearest":
        return ops.gather(y, _nearest_indices(node, x, n), axis)
    indices, weights = _taps(node, mode, scale)(x, n)       # (taps, outputs)
    return ops.resample(y, indices.T, weights.T.astype(weight_dtype), axis)


def _check_supported(node: Node, x) -> None:
    """Refuse the modes and attribute values the converter does not support."""
    mode = node.attr("mode", "nearest")
    if mode not in ("nearest", "linear", "cubic"):
        raise node.error(f"mode={mode!r} is not supported (nearest, linear, cubic)")
    if node.flag("antialias") and mode == "nearest":
        raise node.error("antialias=1 with mode='nearest' is not supported: the operator defines it for linear and "
                         "cubic (onnx's reference and onnxruntime refuse it too)")
    for name, modes in (("coordinate_transformation_mode", COORDINATE_MODES),
                        ("nearest_mode", [*NEAREST_MODES, BEFORE_OPSET_11])):
        if node.has_attr(name) and node.attr(name) not in modes:
            raise node.error(f"{name}={node.attr(name)!r} is not supported ({', '.join(modes)})")
    if mode != "nearest" and not x.dtype.is_float:    # onnxruntime rounds 8-bit results its own fixed-point way
        raise node.error(f"mode={mode!r} on {x.numpy_dtype} tensors is not supported (only on floats; nearest "
                         "takes every type)")


def _check_whole_sizes(node: Node, scales: np.ndarray, sizes: np.ndarray, n: list) -> None:
    """Refuse scales that make a fractional output size (scale * n) where the coordinates depend on the output's
    size: onnx's reference implementation (and its test data) compute with the fractional size, onnxruntime
    and the operator's text with the whole one."""
    mode = node.attr("coordinate_transformation_mode", "half_pixel")
    widths = scales.astype(np.float64) * n
    fractional = ~np.isclose(widths, sizes)
    if mode == "pytorch_half_pixel":
        fractional &= sizes == 1        # there the size only tells whether the output is a single element
    if mode in ("align_corners", "pytorch_half_pixel", "tf_crop_and_resize") and fractional.any():
        raise node.error(f"coordinate_transformation_mode={mode!r} with scales {scales.tolist()} that make "
                         f"fractional output sizes {widths.tolist()} (of {sizes.tolist()}) is not supported: onnx's "
                         "reference implementation and onnxruntime disagree on them")


@converts("Resize", attrs=("antialias", "axes", "coordinate_transformation_mode", "cubic_coeff_a", "exclude_outside",
                           "extrapolation_value", "keep_aspect_ratio_policy", "mode", "nearest_mode"))
def resize(node: Node) -> list:
    """Resize (opsets 11-19) with constant scales or sizes: nearest (every nearest_mode), linear and cubic
    (cubic_coeff_a, exclude_outside, antialias), every coordinate_transformation_mode, keep_aspect_ratio_policy,
    axes. Each resized axis in turn, the most shrunk first (less work for the others)."""
    x = node.input(0)
    _check_supported(node, x)
    axes = _resized_axes(node, x)
    scales, sizes = _scales_and_sizes(node, x, axes)
    _check_whole_sizes(node, scales, sizes, [x.shape[a] for a in axes])
    transform = COORDINATE_MODES[node.attr("coordinate_transformation_mode", "half_pixel")]
    # 16-bit floats are resampled in f32 (rounded once, at the end)
    weight_dtype = np.float64 if x.numpy_dtype == np.float64 else np.float32
    rois, outside, sources = _rois(node, axes), np.zeros((1,) * x.ndim, bool), {}
    for k in range(len(axes)):
        axis, n, size = axes[k], x.shape[axes[k]], int(sizes[k])    # (Python ints keep the arithmetic in f32)
        source = transform(np.arange(size, dtype=np.float32), scales[k], n, size, rois[k])
        if size == n and np.array_equal(source, np.arange(n)):
            continue                    # the identity (every mode reads each input where the coordinate is whole)
        sources[k] = source
        shape = [-1 if a == axis else 1 for a in range(x.ndim)]
        outside = outside | ((source < 0) | (source > n - 1)).reshape(shape)
    # nearest: the axes whose indices step evenly (a whole-factor shrink) are one strided slice, the others gathers
    nearest = node.attr("mode", "nearest") == "nearest"
    runs = {k: run for k, source in sources.items()
            if nearest and (run := _as_slice(_nearest_indices(node, source, x.shape[axes[k]]))) is not None}
    y = x
    if runs:
        starts, stops, steps = zip(*runs.values())
        y = ops.slice(x, list(starts), list(stops), [axes[k] for k in runs], list(steps))
    for k in sorted(set(sources) - set(runs), key=lambda k: sizes[k] / max(x.shape[axes[k]], 1)):
        y = _resized_along(node, y, axes[k], sources[k], scales[k], weight_dtype)
    if node.attr("coordinate_transformation_mode") == "tf_crop_and_resize" and outside.any():
        value = np.asarray(node.attr("extrapolation_value", 0.0)).astype(y.numpy_dtype)
        y = ops.where(outside, value[()], y)
    return [ops.cast(y, x.dtype)]


# ---------------------------------------------------------------- ConvTranspose
def _transposed_geometry(node: Node, x, kernel: tuple, strides: tuple, pads: tuple, dilations: tuple) -> tuple:
    """(begin pads, output sizes) per spatial axis of a ConvTranspose, as onnxruntime computes them: the output
    is the full transposed convolution (output_padding added at the end) less the pads, or output_shape / input
    size * stride (auto_pad SAME_*) taken from it with the pads split as auto_pad says."""
    rank = len(kernel)
    adjustments = tuple(node.attr("output_padding", [0] * rank))
    if len(adjustments) != rank or any(not 0 <= a < max(s, d) for a, s, d in zip(adjustments, strides, dilations)):
        raise node.error(f"output_padding {adjustments} needs {rank} values, each less than its axis's stride or "
                         f"dilation (strides {strides}, dilations {dilations})", OnnxImportError)
    if any(p < 0 for p in pads):
        raise node.error(f"pads {pads} must not be negative", OnnxImportError)
    full = [(n - 1) * s + (k - 1) * d + 1 + a
            for n, k, s, d, a in zip(x.shape[2:], kernel, strides, dilations, adjustments)]
    out = _requested_size(node, x, strides, full, adjustments)
    if out is None:
        return pads[:rank], [f - b - e for f, b, e in zip(full, pads[:rank], pads[rank:])]
    totals = [max(f - o, 0) for f, o in zip(full, out)]     # (a longer output_shape: zeros at the end)
    return [t // 2 if node.attr("auto_pad") == "SAME_UPPER" else t - t // 2 for t in totals], out


def _requested_size(node: Node, x, strides: tuple, full: list, adjustments: tuple) -> list | None:
    """The output's spatial size that output_shape or auto_pad SAME_* ask for (None: the pads decide it)."""
    if node.has_attr("output_shape"):
        out = list(node.attr("output_shape"))
        extent = [f - a for f, a in zip(full, adjustments)]
        if len(out) != len(strides) or any(o - e >= s for o, e, s in zip(out, extent, strides)):
            raise node.error(f"output_shape {out} needs one size per spatial axis (not N or C), each less than its "
                             f"stride {strides} past the transposed convolution's extent {extent} (without "
                             "output_padding)", OnnxImportError)
        return out
    auto_pad = node.attr("auto_pad", "NOTSET")
    if auto_pad not in ("SAME_UPPER", "SAME_LOWER"):
        return None
    out = [n * s for n, s in zip(x.shape[2:], strides)]
    if any(o > f for o, f in zip(out, full)):
        raise node.error(f"auto_pad={auto_pad!r} with a kernel shorter than the stride is not supported: the "
                         f"operator's text makes the output {out}, onnxruntime the transposed convolution's extent "
                         f"{full}")
    return out


def _zeros_between(x, strides: tuple):
    """x (N, C, spatial...) with stride - 1 zeros after each element along each spatial axis (size n * stride)."""
    if all(s == 1 for s in strides):
        return x
    rank = len(strides)
    interleaved = ops.reshape(x, x.shape[:2] + tuple(v for n in x.shape[2:] for v in (n, 1)))
    padded = ops.pad(interleaved, [0] * (2 + 2 * rank) + [0, 0] + [p for s in strides for p in (0, s - 1)])
    return ops.reshape(padded, x.shape[:2] + tuple(n * s for n, s in zip(x.shape[2:], strides)))


def _cropped(x, pads: list) -> tuple:
    """(x cropped along its spatial axes where `pads` (begin..., end...) are negative, the pads left)."""
    rank = x.ndim - 2
    starts = [max(-p, 0) for p in pads[:rank]]
    ends = [n - max(-p, 0) for n, p in zip(x.shape[2:], pads[rank:])]
    return ops.slice(x, starts, ends, list(range(2, x.ndim))), [max(p, 0) for p in pads]


def _conv_weights(w, group: int):
    """ConvTranspose's weights (C, M / group, kernel...) as a convolution's (M, C / group, kernel...), flipped."""
    c, m, kernel = w.shape[0], w.shape[1], w.shape[2:]
    rank = len(kernel)
    swapped = ops.transpose(ops.reshape(w, (group, c // group, m) + kernel), (0, 2, 1) + tuple(range(3, 3 + rank)))
    w = ops.reshape(swapped, (group * m, c // group) + kernel)
    return ops.slice(w, [-1] * rank, [-k - 1 for k in kernel], list(range(2, 2 + rank)), [-1] * rank)


def _by_phases(x, weights, bias, strides: tuple, begins: list, out: list, group: int):
    """ConvTranspose with dilation 1 as one convolution of x without inserted zeros, whose output channels hold
    every output phase. Along an axis of stride s, the outputs o with (o + begin) % s == r, at q = (o + begin) // s,
    are y[q] = sum over m of x[q - m] * w[r + m * s]: a correlation with the kernel's taps r, r + s, ... flipped,
    which are the flipped kernel's every s-th tap from s - 1 - r once zeros before it make its length a multiple
    of s (one tap count for every phase: a phase with fewer multiplies the zeros). The phases are then
    interleaved, and each computes q over the span of them all: what lies outside the output is cropped."""
    kernel, rank, n_out = weights.shape[2:], len(strides), weights.shape[0] // group
    spatial = list(range(2, 2 + rank))
    taps = [-(-k // s) for k, s in zip(kernel, strides)]
    spans = [(b // s, (b + o - 1) // s) for b, o, s in zip(begins, out, strides)]
    front = [t * s - k for t, s, k in zip(taps, strides, kernel)]
    padded = ops.pad(weights, [0, 0] + front + [0] * (2 + rank)) if any(front) else weights
    phases = list(itertools.product(*(range(s) for s in strides)))
    shape = (group, 1, n_out, weights.shape[1]) + tuple(taps)
    subs = [ops.reshape(ops.slice(padded, [s - 1 - r for r, s in zip(phase, strides)],
                                  [s - 1 - r + (t - 1) * s + 1 for r, s, t in zip(phase, strides, taps)],
                                  spatial, list(strides)), shape) for phase in phases]
    channels = group * len(phases) * n_out      # ordered (group, phase, output channel)
    stacked = ops.reshape(ops.concat(subs, 1) if len(subs) > 1 else subs[0], (channels,) + shape[3:])
    if bias is not None:
        bias = ops.reshape(ops.expand(ops.reshape(bias, (group, 1, n_out)), (group, len(phases), n_out)), (channels,))
    before = [t - 1 - lo for t, (lo, _) in zip(taps, spans)]
    after = [hi - lo + t - n - b for t, (lo, hi), n, b in zip(taps, spans, x.shape[2:], before)]
    source, pads = _cropped(x, before + after)
    y = ops.conv(source, stacked, bias, 1, pads, 1, group)
    q = y.shape[2:]
    y = ops.reshape(y, (x.shape[0], group) + tuple(strides) + (n_out,) + q)
    y = ops.transpose(y, (0, 1, 2 + rank) + tuple(v for a in range(rank) for v in (3 + rank + a, 2 + a)))
    y = ops.reshape(y, (x.shape[0], group * n_out) + tuple(n * s for n, s in zip(q, strides)))
    starts = [b - lo * s for b, (lo, _), s in zip(begins, spans, strides)]
    return ops.slice(y, starts, [st + o for st, o in zip(starts, out)], spatial)


@converts("ConvTranspose", attrs=WINDOW_ATTRS + ("group", "output_padding", "output_shape"))
def conv_transpose(node: Node) -> list:
    """ConvTranspose (1-3 spatial axes, groups, dilations, output_padding, output_shape, auto_pad) with an
    optional bias, as a convolution of the input with zeros between its elements."""
    x, w, bias = node.input(0), node.input(1), node.input(2, required=False)
    kernel = tuple(node.attr("kernel_shape", w.shape[2:]))
    group = node.attr("group", 1)
    if kernel != w.shape[2:]:
        raise node.error(f"kernel_shape {kernel} does not match the weight's {w.shape[2:]}", OnnxImportError)
    if w.ndim != x.ndim or x.ndim < 3 or w.shape[0] != x.shape[1] or group < 1 or w.shape[0] % group:
        raise node.error(f"X {x.shape}, W {w.shape} and group={group} do not match (W is (C, M / group, "
                         "kernel...) for X (N, C, spatial...), C a multiple of group)", OnnxImportError)
    strides, pads, dilations = window(node, x, kernel)    # (its SAME pads are a Conv's: replaced below)
    begins, out = _transposed_geometry(node, x, kernel, strides, pads, dilations)
    if any(n < 1 for n in out):
        raise node.error(f"the output's spatial size {out} is empty", OnnxImportError)
    weights = _conv_weights(w, group)
    if all(d == 1 for d in dilations) and any(s > 1 for s in strides):
        return [_by_phases(x, weights, bias, strides, begins, out, group)]
    # Output o reads the zero-inserted input at o + begin - (k - 1) * d + j * d for the flipped kernel's j: a
    # convolution padded by (k - 1) * d - begin. With a stride, it does prod(strides) times the needed work (most
    # products are with the inserted zeros): the phases above avoid that where the dilation is 1.
    upsampled = _zeros_between(x, strides)
    pads = [(k - 1) * d - b for k, d, b in zip(kernel, dilations, begins)]
    pads += [o - n * s + b for o, n, s, b in zip(out, x.shape[2:], strides, begins)]
    upsampled, pads = _cropped(upsampled, pads)
    return [ops.conv(upsampled, weights, bias, 1, pads, dilations, group)]


# ---------------------------------------------------------------- Col2Im
@converts("Col2Im", attrs=("dilations", "pads", "strides"))
def col2im(node: Node) -> list:
    """Col2Im (opset 18): input (N, C * prod(block_shape), L), the L blocks of an image's im2col, summed back into
    images (N, C, image_shape...) (a constant image_shape and block_shape; 1 or more spatial axes): for each block
    offset, its value of every block, stride - 1 zeros between them, shifted to the offset's place, added up."""
    x = node.input(0)
    image, block = (np.asarray(node.const(k)).reshape(-1).tolist() for k in (1, 2))
    rank = len(image)
    strides, dilations = node.attr("strides", [1] * rank), node.attr("dilations", [1] * rank)
    pads = node.attr("pads", [0] * 2 * rank)
    if not rank or len(block) != rank or len(strides) != rank or len(dilations) != rank or len(pads) != 2 * rank:
        raise node.error(f"image_shape {image}, block_shape {block}, strides {strides}, dilations {dilations} and "
                         f"pads {pads} need one value per spatial axis (pads two), for 1 or more axes", OnnxImportError)
    if min(image + block + strides + dilations) < 1 or min(pads) < 0:
        raise node.error(f"image_shape {image}, block_shape {block}, strides {strides} and dilations {dilations} must "
                         f"be positive, pads {pads} non-negative", OnnxImportError)
    counts = [(n + b + e - d * (k - 1) - 1) // s + 1
              for n, k, s, d, b, e in zip(image, block, strides, dilations, pads[:rank], pads[rank:])]
    size = math.prod(block)
    if x.ndim != 3 or x.shape[1] % size or min(counts) < 1 or x.shape[2] != math.prod(counts):
        raise node.error(f"input {x.shape} does not hold the blocks of image_shape {image}: it must be (N, C * "
                         f"{size}, {math.prod(max(c, 0) for c in counts)}) for block_shape {block}, strides "
                         f"{strides}, dilations {dilations} and pads {pads}", OnnxImportError)
    batch, channels = x.shape[0], x.shape[1] // size
    blocks = ops.reshape(x, (batch, channels, size) + tuple(counts))
    total = None
    for k, offset in enumerate(itertools.product(*(range(b) for b in block))):
        part = ops.reshape(ops.slice(blocks, [k], [k + 1], [2]), (batch, channels) + tuple(counts))
        begins = [o * d - b for o, d, b in zip(offset, dilations, pads[:rank])]
        ends = [n - b - c * s for n, b, c, s in zip(image, begins, counts, strides)]
        part, place = _cropped(_zeros_between(part, tuple(strides)), begins + ends)
        part = ops.pad(part, [0, 0] + place[:rank] + [0, 0] + place[rank:])
        total = part if total is None else ops.add(total, part)
    return [total]
