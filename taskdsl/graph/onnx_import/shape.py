"""Converters of shape and data-movement operators, and of the operators that make constants.

Shapes are static, so Shape, Size, ConstantOfShape and Range give constants, and the inputs
that fix a shape (Reshape's shape, Slice's starts, ...) must be computable at import time.
"""
from __future__ import annotations

import numpy as np

from .. import ops
from ..ops.axes import normalize_axis
from ..ops.transform import PAD_MODES
from ..passes.fold_constants import constant_value
from ..tensor import constant
from . import qdq
from .errors import OnnxImportError
from .node import Node, converts, imported_constant


def _ints(value) -> list:
    return [int(v) for v in np.asarray(value).reshape(-1)]


def _optional_ints(node: Node, k: int) -> list | None:
    """Input k's constant value as ints, or None when the input is absent."""
    return _ints(node.const(k)) if node.num_inputs > k and node.proto.input[k] else None


def _axes(node: Node, k: int, since: int) -> list | None:
    """Axes from input k (opset >= since) or from the 'axes' attribute (earlier opsets)."""
    if node.opset >= since:
        return _optional_ints(node, k)
    axes = node.attr("axes")
    return None if axes is None else [int(a) for a in axes]


@converts("Constant", attrs=("value", "value_float", "value_floats", "value_int", "value_ints", "value_string",
                             "value_strings", "sparse_value"))
def constant_node(node: Node) -> list:
    """Constant from a tensor (a 4-bit integer one too), float(s) or int(s) attribute."""
    tensor = next((a.t for a in node.proto.attribute if a.name == "value"), None)
    if tensor is not None:
        return [imported_constant(tensor, f"attribute 'value' of node {node.name!r}")]
    for name, dtype in (("value_float", np.float32), ("value_floats", np.float32), ("value_int", np.int64),
                        ("value_ints", np.int64)):
        if node.has_attr(name):
            return [constant(np.asarray(node.attr(name), dtype))]
    raise node.error("only tensor, float(s) and int(s) values are supported (not strings or sparse tensors)")


@converts("Shape", attrs=("start", "end"))
def shape(node: Node) -> list:
    """Shape (with start / end): a constant, since shapes are static."""
    dims = node.input(0).shape
    start, end = node.attr("start", 0), node.attr("end", len(dims))
    return [constant(np.array(dims[slice(start, end)], np.int64))]


@converts("Size")
def size(node: Node) -> list:
    """Size: a constant."""
    return [constant(np.array(node.input(0).size, np.int64))]


@converts("ConstantOfShape", attrs=("value",))
def constant_of_shape(node: Node) -> list:
    """ConstantOfShape: a constant filled with `value` (default float 0)."""
    value = node.attr("value")
    value = np.zeros(1, np.float32) if value is None else np.asarray(value)
    if value.size != 1:
        raise node.error(f"value must hold one element, got {value.size}", OnnxImportError)
    return [constant(np.full(_ints(node.const(0)), value.reshape(-1)[0], value.dtype))]


@converts("Range")
def range_node(node: Node) -> list:
    """Range of constant start / limit / delta: a constant."""
    start, limit, delta = (np.asarray(node.const(k)).reshape(-1)[0] for k in range(3))
    if delta == 0:
        raise node.error("delta must not be 0", OnnxImportError)
    if start.dtype.kind in "iu":    # exact: int64 bounds 1 apart may round to one float64
        count = max(-(-(int(limit) - int(start)) // int(delta)), 0)
    else:
        count = max(int(np.ceil((float(limit) - float(start)) / float(delta))), 0)
    return [constant(np.asarray(start + np.arange(count) * delta, start.dtype))]


@converts("Flatten", attrs=("axis",))
def flatten(node: Node) -> list:
    """Flatten at `axis` (negative axes count from the end)."""
    return [ops.flatten(node.input(0), node.attr("axis", 1))]


@converts("Reshape", attrs=("allowzero",))
def reshape(node: Node) -> list:
    """Reshape to a constant shape (0 copies the input dim unless allowzero)."""
    x, given = node.input(0), np.asarray(node.const(1))
    if given.ndim != 1:         # onnxruntime refuses another rank too
        raise node.error(f"the shape input must be 1-d, got an array of shape {given.shape}", OnnxImportError)
    shape = _ints(given)
    if not node.flag("allowzero"):
        if any(n == 0 for n in shape[x.ndim:]):
            raise node.error(f"shape {shape} has a 0 (copy the input's dim) at a position past the input's rank "
                             f"{x.ndim} (shape {x.shape})", OnnxImportError)
        shape = [x.shape[k] if n == 0 else n for k, n in enumerate(shape)]
    return [ops.reshape(x, shape)]


@converts("Transpose", attrs=("perm",))
def transpose(node: Node) -> list:
    """Transpose by perm (default: reversed axes)."""
    return [ops.transpose(node.input(0), node.attr("perm"))]


@converts("Squeeze", attrs=("axes",))
def squeeze(node: Node) -> list:
    """Squeeze the given (or every) size-1 axis."""
    return [ops.squeeze(node.input(0), _axes(node, 1, 13))]


@converts("Unsqueeze", attrs=("axes",))
def unsqueeze(node: Node) -> list:
    """Unsqueeze at the given axes."""
    axes = _axes(node, 1, 13)
    if axes is None:
        raise node.error("the axes are required", OnnxImportError)
    return [ops.unsqueeze(node.input(0), axes)]


@converts("Concat", attrs=("axis",))
def concat(node: Node) -> list:
    """Concat along `axis`."""
    return [ops.concat(node.inputs(), node.attr("axis"))]


@converts("Split", attrs=("axis", "split", "num_outputs"))
def split(node: Node) -> list:
    """Split by sizes, into equal parts, or into num_outputs parts (the last may be smaller)."""
    x = node.input(0)
    axis = normalize_axis(node.attr("axis", 0), x.ndim, "Split")
    sizes = _optional_ints(node, 1) if node.opset >= 13 else node.attr("split")   # an input from opset 13
    if sizes is not None and node.has_attr("num_outputs"):
        raise node.error("give either the split sizes or num_outputs, not both", OnnxImportError)
    if sizes is None:
        parts, n = len(node.proto.output), x.shape[axis]
        if node.has_attr("num_outputs"):
            if node.attr("num_outputs") != parts:
                raise node.error(f"num_outputs={node.attr('num_outputs')} but the node has {parts} outputs",
                                 OnnxImportError)
            chunk = -(-n // parts)                    # opset 18: the last part may be smaller
            if n - (parts - 1) * chunk < 0:
                raise node.error(f"num_outputs={parts} cannot split axis {axis} of size {n}: parts of {chunk} "
                                 f"({n} / {parts} rounded up) leave {n - (parts - 1) * chunk} for the last",
                                 OnnxImportError)
            sizes = [min(chunk, n - k * chunk) for k in range(parts)]
        else:
            sizes = parts
    elif len(sizes) != len(node.proto.output):
        raise node.error(f"split gives {len(sizes)} sizes {list(sizes)} but the node has {len(node.proto.output)} "
                         "outputs", OnnxImportError)
    return ops.split(x, sizes, axis)


@converts("Slice")
def slice_node(node: Node) -> list:
    """Slice with constant starts / ends / axes / steps."""
    x = node.input(0)
    for k in range(1, min(node.num_inputs, 5)):
        dtype = np.asarray(node.const(k)).dtype if node.proto.input[k] else None
        if dtype is not None and dtype.kind not in "iu":
            raise node.error(f"input {k} ({('starts', 'ends', 'axes', 'steps')[k - 1]}) must hold integers, got "
                             f"{dtype}", OnnxImportError)
    starts, ends = _ints(node.const(1)), _ints(node.const(2))
    return [ops.slice(x, starts, ends, _optional_ints(node, 3), _optional_ints(node, 4))]


@converts("Gather", attrs=("axis",))
def gather(node: Node) -> list:
    """Gather along `axis` (indices may be any tensor; of dequantized 8-bit data: `qdq.gather`)."""
    return [qdq.gather(node.input(0), node.input(1), node.attr("axis", 0))]


@converts("Expand")
def expand(node: Node) -> list:
    """Expand (bidirectional broadcast) to a constant shape."""
    return [ops.expand(node.input(0), _ints(node.const(1)))]


@converts("Pad", attrs=("mode",))
def pad(node: Node) -> list:
    """Pad (pads and the optional axes input constant; the value computed at run time or not): modes constant,
    edge, reflect, wrap."""
    x = node.input(0)
    mode = node.attr("mode", "constant")
    if mode not in PAD_MODES:
        raise node.error(f"mode={mode!r} is not supported (only {', '.join(PAD_MODES)})")
    pads = _ints(node.const(1))
    fill = node.input(2, required=False) if mode == "constant" else None
    if fill is not None and fill.size != 1:
        raise node.error(f"constant_value must be one element, got shape {list(fill.shape)}", OnnxImportError)
    known = None if fill is None else constant_value(fill)       # (None: computed at run time)
    value = 0 if fill is None else ops.reshape(fill, ()) if known is None else np.asarray(known).reshape(-1)[0].item()
    axes = _optional_ints(node, 3)
    if axes is not None:        # opset 18: pads given for these axes only
        pads = _pads_of_axes(node, pads, axes, x.ndim)
    if len(pads) != 2 * x.ndim:
        raise node.error(f"pads must have {2 * x.ndim} values (begin..., end...) for a {x.ndim}-d input, got {pads}",
                         OnnxImportError)
    if any(p < 0 for p in pads):    # negative pads crop, before the others pad (as onnxruntime does)
        n, crops, given = x.ndim, [max(-p, 0) for p in pads], pads
        starts, ends, pads = [], [], [max(p, 0) for p in pads]
        for a, size in enumerate(x.shape):
            if crops[a] + crops[n + a] <= size:
                starts.append(crops[a])
                ends.append(size - crops[n + a])
                continue
            # cropped past its end: in constant mode an axis of padding alone, as long as the pads leave it
            length = size + given[a] + given[n + a]
            if mode != "constant" or length < 0:
                raise node.error(f"pads {given} crop more than the shape {x.shape} has", OnnxImportError)
            starts.append(0)
            ends.append(0)
            pads[a], pads[n + a] = length, 0
        x = ops.slice(x, starts, ends)
    return [ops.pad(x, pads, value, mode)]


def _pads_of_axes(node: Node, pads: list, axes: list, ndim: int) -> list:
    """Pad's (begin..., end...) pads of every axis, from pads given for `axes` only (0 for the others)."""
    axes = [normalize_axis(a, ndim, "Pad") for a in axes]
    if len(pads) != 2 * len(axes) or len(set(axes)) != len(axes):
        raise node.error(f"pads {pads} need 2 values (begin, end) for each of the distinct axes {axes}",
                         OnnxImportError)
    full = [0] * 2 * ndim
    for k, a in enumerate(axes):
        full[a], full[ndim + a] = pads[k], pads[len(axes) + k]
    return full
