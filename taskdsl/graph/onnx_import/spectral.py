"""Converters of the spectral operators: DFT, STFT, the windows HannWindow, HammingWindow, BlackmanWindow and
MelWeightMatrix.

A DFT of length L is one matmul: the signal, moved so that the transformed axis and the trailing real/imaginary axis
are last and flattened to (..., n * c), times a constant matrix (n * c, K * 2) of cosines and sines computed exactly
in float64 numpy at import and stored in the signal's float type; the product reshapes to (..., K, 2). dft_length
pads with zeros (which need no rows) or crops (zero rows for the samples cut off). STFT frames the signal with a
constant gather of frame indices and folds its window into the DFT matrix. Windows and mel filter banks are constants.
"""
from __future__ import annotations

import numpy as np
from onnx import TensorProto

from .. import ops
from ..tensor import constant
from .errors import OnnxImportError
from .node import Node, converts, dtype_of


def _dft_matrix(n: int, c: int, length: int, inverse: bool, onesided: bool, window=None) -> np.ndarray:
    """The (n * c, K * 2) float64 matrix taking n samples of c parts (1: real, 2: real and imaginary) to K complex
    frequencies, times `window` (or, inverse and onesided, the (n * c, length) matrix to `length` real samples)."""
    used = min(n, length)                                   # samples past `length` are cropped: zero rows
    weight = np.ones(used) if window is None else np.asarray(window, np.float64)[:used]
    sign = 1.0 if inverse else -1.0
    if inverse and onesided:
        # irfft: the one-sided spectrum stands for its Hermitian completion; interior bins count twice
        bins = min(n, length // 2 + 1)
        k = np.arange(bins)
        twice = np.where((k == 0) | (2 * k == length), 1.0, 2.0) / length
        theta = 2 * np.pi * np.outer(k, np.arange(length)) / length
        matrix = np.zeros((n, c, length, 1))
        matrix[:bins, 0, :, 0] = twice[:, None] * np.cos(theta)
        if c == 2:
            matrix[:bins, 1, :, 0] = -twice[:, None] * np.sin(theta)
        return matrix.reshape(n * c, length)
    freqs = length // 2 + 1 if onesided else length
    theta = 2 * np.pi * np.outer(np.arange(used), np.arange(freqs)) / length
    cos, sin = weight[:, None] * np.cos(theta), sign * weight[:, None] * np.sin(theta)
    scale = 1 / length if inverse else 1.0
    matrix = np.zeros((n, c, freqs, 2))
    # (re + i im)(cos + i sin): re part re cos - im sin, imaginary part re sin + im cos
    matrix[:used, 0, :, 0], matrix[:used, 0, :, 1] = cos * scale, sin * scale
    if c == 2:
        matrix[:used, 1, :, 0], matrix[:used, 1, :, 1] = -sin * scale, cos * scale
    return matrix.reshape(n * c, freqs * 2)


def _transform_last(x, matrix: np.ndarray, parts: int):
    """x (..., n, c) flattened to (..., n * c) times `matrix`, reshaped to (..., K, parts)."""
    y = ops.matmul(ops.reshape(x, x.shape[:-2] + (x.shape[-2] * x.shape[-1],)), constant(matrix, x.dtype))
    return ops.reshape(y, x.shape[:-2] + (matrix.shape[1] // parts, parts))


def _signal(node: Node, x):
    """Check that x is a float signal whose last axis holds 1 (real) or 2 (real, imaginary) parts."""
    if not x.dtype.is_float:
        raise node.error(f"data type {x.dtype.name} is not supported (floats)")
    if x.ndim < 2 or x.shape[-1] not in (1, 2):
        raise node.error(f"the input's last axis must hold 1 (real) or 2 (complex) parts, got shape {list(x.shape)}",
                         OnnxImportError)


def _length(node: Node, k: int, what: str, required: bool = False) -> int | None:
    """Input k, a constant positive integer (None where it is optional and absent)."""
    value = node.const_int(k, what, required)
    if value is not None and value < 1:
        raise node.error(f"{what} must be at least 1, got {value}", OnnxImportError)
    return value


@converts("DFT", attrs=("axis", "inverse", "onesided"))
def dft(node: Node) -> list:
    """DFT: the discrete Fourier transform of a real (..., 1) or complex (..., 2) signal along `axis` (an attribute
    up to opset 17, a constant input from 20), padded or cropped to dft_length; onesided keeps the first L // 2 + 1
    frequencies (inverse: the input is one-sided and the output real); inverse divides by L."""
    x = node.input(0)
    _signal(node, x)
    rank = x.ndim
    if node.opset >= 20:
        axis = node.const(2, required=False)
        axis = -2 if axis is None else int(np.asarray(axis).reshape(-1)[0])
    else:
        axis = node.attr("axis", 1)
    if not -rank <= axis < rank or axis % rank == rank - 1:
        raise node.error(f"axis {axis} must name a signal axis of a rank-{rank} input (not the last)", OnnxImportError)
    axis %= rank
    inverse, onesided = node.flag("inverse"), node.flag("onesided")
    n = x.shape[axis]
    length = _length(node, 1, "dft_length")
    if length is None:
        length = 2 * (n - 1) if inverse and onesided else n
        if length < 1:
            raise node.error("an inverse one-sided DFT of 1 bin needs dft_length", OnnxImportError)
    perm = [d for d in range(rank - 1) if d != axis] + [axis, rank - 1]
    moved = ops.transpose(x, perm) if axis != rank - 2 else x
    parts = 1 if inverse and onesided else 2
    y = _transform_last(moved, _dft_matrix(n, x.shape[-1], length, inverse, onesided), parts)
    return [ops.transpose(y, list(np.argsort(perm))) if axis != rank - 2 else y]


@converts("STFT", attrs=("onesided",))
def stft(node: Node) -> list:
    """STFT: frames of frame_length samples every frame_step (constants) of a (batch, length, 1 or 2) signal, each
    times the window (a constant) and transformed; output (batch, frames, K, 2), where onesided (the default) keeps
    K = frame_length // 2 + 1 frequencies."""
    x = node.input(0)
    _signal(node, x)
    if x.ndim != 3:
        raise node.error(f"the signal must be (batch, length, 1 or 2), got shape {list(x.shape)}", OnnxImportError)
    step = _length(node, 1, "frame_step")
    window = node.const(2, required=False)
    frame_length = _length(node, 3, "frame_length")
    if window is not None:
        if window.ndim != 1:
            raise node.error(f"the window must be 1-D, got shape {list(window.shape)}", OnnxImportError)
        if frame_length is not None and frame_length != window.shape[0]:
            raise node.error(f"frame_length {frame_length} differs from the window's length {window.shape[0]}",
                             OnnxImportError)
        frame_length = window.shape[0]
    if frame_length is None:
        frame_length = x.shape[1]
    if frame_length > x.shape[1]:
        raise node.error(f"frame_length {frame_length} exceeds the signal's length {x.shape[1]}", OnnxImportError)
    frames = 1 + (x.shape[1] - frame_length) // step
    starts = np.arange(frames, dtype=np.int64)[:, None] * step
    framed = ops.gather(x, constant(starts + np.arange(frame_length, dtype=np.int64)), 1)
    matrix = _dft_matrix(frame_length, x.shape[-1], frame_length, False, node.flag("onesided", 1), window)
    return [_transform_last(framed, matrix, 2)]


def _window(node: Node, size_of_period) -> list:
    """A window of the constant `size` as a constant of output_datatype: f(2 pi n / N) for n < size, where N is
    size (periodic, the default) or size - 1 (symmetric)."""
    size = _length(node, 0, "size", required=True)
    dtype = dtype_of(node.attr("output_datatype", TensorProto.FLOAT), f"node {node.name!r} output_datatype")
    period = size if node.flag("periodic", 1) else size - 1
    with np.errstate(divide="ignore", invalid="ignore"):     # a symmetric window of size 1 is NaN, as in the spec
        values = size_of_period(2 * np.pi * np.arange(size) / period)
    return [constant(values, dtype)]


@converts("HannWindow", attrs=("output_datatype", "periodic"))
def hann_window(node: Node) -> list:
    """HannWindow: 0.5 - 0.5 cos(2 pi n / N)."""
    return _window(node, lambda t: np.sin(t / 2) ** 2)


@converts("HammingWindow", attrs=("output_datatype", "periodic"))
def hamming_window(node: Node) -> list:
    """HammingWindow: 25/46 - 21/46 cos(2 pi n / N)."""
    return _window(node, lambda t: 25 / 46 - 21 / 46 * np.cos(t))


@converts("BlackmanWindow", attrs=("output_datatype", "periodic"))
def blackman_window(node: Node) -> list:
    """BlackmanWindow: 0.42 - 0.5 cos(2 pi n / N) + 0.08 cos(4 pi n / N)."""
    return _window(node, lambda t: 0.42 - 0.5 * np.cos(t) + 0.08 * np.cos(2 * t))


@converts("MelWeightMatrix", attrs=("output_datatype",))
def mel_weight_matrix(node: Node) -> list:
    """MelWeightMatrix: the constant (dft_length // 2 + 1, num_mel_bins) matrix of triangular filters spaced evenly on
    the mel scale between lower_edge_hertz and upper_edge_hertz (all inputs constants), as the onnx reference builds
    it (in the inputs' own types, so that the bin edges round alike)."""
    mels, length, rate, low, high = (np.asarray(node.const(k)).reshape(-1) for k in range(5))
    if any(v.size != 1 for v in (mels, length, rate, low, high)):
        raise node.error("every input must be one number", OnnxImportError)
    mels, length, rate, low, high = mels[0], length[0], rate[0], low[0], high[0]
    if mels.dtype.kind not in "iu" or length.dtype.kind not in "iu" or mels < 1 or length < 1:
        raise node.error(f"num_mel_bins and dft_length must be positive integers, got {mels} and {length}",
                         OnnxImportError)
    dtype = dtype_of(node.attr("output_datatype", TensorProto.FLOAT), f"node {node.name!r} output_datatype")
    low_mel, high_mel = (2595 * np.log1p(f / 700) / np.log(10) for f in (low, high))
    edges = np.arange(mels + 2) * ((high_mel - low_mel) / (mels + 2)) + low_mel
    edges = (((length + 1) * (700 * np.expm1(edges / 2595 * np.log(10)))) // rate).astype(np.int64)
    count = length // 2 + 1
    if edges[0] < 0 or edges[-2] >= count or edges[-1] > count:
        raise node.error(f"the mel filters span bins {edges[0]} to {edges[-1]}, outside the {count} bins of "
                         f"dft_length {length} at sample_rate {rate} (check lower/upper_edge_hertz)", OnnxImportError)
    bins = np.arange(count)[:, None]
    left, center, right = edges[:-2], edges[1:-1], edges[2:]
    with np.errstate(divide="ignore", invalid="ignore"):     # empty slopes are the single 1 at the center
        rising = np.where(center > left, (bins - left) / (center - left), 1.0)
        falling = (right - bins) / (right - center)
    weights = np.where((bins >= left) & (bins <= center), rising, 0.0)
    weights = np.where((bins >= center) & (bins < right) & (right > center), falling, weights)
    return [constant(weights, dtype)]
