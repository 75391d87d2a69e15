"""Converters of GridSample and AffineGrid.

GridSample denormalizes the grid into pixel coordinates (an elementwise composition on every grid point) and samples
X there with the graph's GridSample operator (`ops.grid_sample`: the modes, paddings and align_corners of onnx's).
The padding applies to each tap's index, as onnxruntime and PyTorch do it, where onnx's reference implementation
first clamps or reflects the coordinate itself: the same values but for cubic sampling with border padding near the
edges, where onnxruntime is followed.

AffineGrid is theta applied to the homogeneous coordinates of a constant base grid: a product broadcast over
the grid's positions, summed over the last axis.
"""
from __future__ import annotations

import math

import numpy as np

from .. import ops
from ..ops.sample import PADDINGS, TAPS
from ..tensor import constant
from .elementwise import in_f32
from .errors import OnnxImportError
from .node import Node, converts

# the mode names of opsets 16-19 and of opset 20 on, each the same order as TAPS's keys
MODE_NAMES = {16: ("bilinear", "nearest", "bicubic"), 20: ("linear", "nearest", "cubic")}
# coordinate dtype -> the limit coordinates, in pixels, are clamped to: past it every float is whole, and whole
# ones stay exact, their int64 indices far from overflowing. A NaN coordinate stays NaN: its index is 0 (casts
# saturate, NaN giving 0), its weights NaN.
COORDINATE_LIMIT = {"f32": 2.0 ** 22, "f64": 2.0 ** 51}


# ---------------------------------------------------------------- GridSample
def _mode(node: Node) -> str:
    """The interpolation mode as TAPS names it (the name the node's opset gives it checked)."""
    names = MODE_NAMES[16 if node.opset < 20 else 20]
    name = node.attr("mode", names[0])
    if name not in names:
        raise node.error(f"mode={name!r} is not one of opset {node.opset}'s modes {', '.join(names)}", OnnxImportError)
    return tuple(TAPS)[names.index(name)]


def _check_inputs(node: Node, x, grid, mode: str) -> None:
    """OnnxImportError where the shapes do not match, UnsupportedOnnxError for the types not taken."""
    rank = x.ndim - 2
    if rank < 1 or grid.shape != (x.shape[0],) + grid.shape[1:-1] + (rank,) or grid.ndim != x.ndim:
        raise node.error(f"X {x.shape} and grid {grid.shape} do not match: X is (N, C, D1, ..., Dr) with r >= 1, "
                         "grid (N, D1_out, ..., Dr_out, r)", OnnxImportError)
    if not grid.dtype.is_float:
        raise node.error(f"the grid must be floats, got {grid.dtype.name}", OnnxImportError)
    if mode != "nearest" and not x.dtype.is_float:
        raise node.error(f"mode {mode!r} on {x.numpy_dtype} inputs is not supported (floats; nearest takes every "
                         "type)")
    if 0 in x.shape[2:]:
        raise node.error(f"an input with an empty spatial axis (shape {x.shape}) is not supported: there is no "
                         "pixel to sample")


def _coordinates(grid, spatial: tuple, align_corners: bool):
    """The pixel coordinates (N, points, r) the grid gives, last spatial axis first as the grid lists them, in
    the grid's dtype (f32 for 16-bit grids): (g + 1) * scale - shift, the value onnxruntime's ((g + 1) * n - 1) / 2
    (or (g + 1) / 2 * (n - 1) with align_corners) rounds to, as the halving is exact; clamped to
    COORDINATE_LIMIT."""
    g = ops.reshape(grid, (grid.shape[0], math.prod(grid.shape[1:-1]), grid.shape[-1]))
    if grid.dtype.computes_in_f32:
        g = ops.cast(g, "float32")
    sizes = np.array(spatial[::-1], np.float64)
    if align_corners:       # [-1, 1] -> [0, n - 1]
        x = ops.mul(ops.add(g, 1.0), constant((sizes - 1) / 2, g.dtype))
    else:                   # [-1, 1] -> [-0.5, n - 0.5]
        x = ops.sub(ops.mul(ops.add(g, 1.0), constant(sizes / 2, g.dtype)), 0.5)
    limit = COORDINATE_LIMIT[g.dtype.name]
    return ops.clip(x, -limit, limit)


@converts("GridSample", attrs=("align_corners", "mode", "padding_mode"))
def grid_sample(node: Node) -> list:
    """GridSample with any number of spatial axes (opset 16 defines 2-D only; onnxruntime samples 3-D there too,
    as taskdsl does): nearest (halves to even), linear and cubic sampling, zeros, border and reflection padding,
    align_corners; linear and cubic take float inputs, nearest every type. 16-bit floats are computed in f32 and
    rounded once."""
    x, grid = node.input(0), node.input(1)
    mode = _mode(node)
    padding = node.attr("padding_mode", "zeros")
    if padding not in PADDINGS:
        raise node.error(f"padding_mode={padding!r} is not one of {', '.join(PADDINGS)}", OnnxImportError)
    align_corners = node.flag("align_corners")
    _check_inputs(node, x, grid, mode)
    y = ops.grid_sample(x, _coordinates(grid, x.shape[2:], align_corners), mode, padding, align_corners)
    return [ops.cast(ops.reshape(y, x.shape[:2] + grid.shape[1:-1]), x.dtype)]


# ---------------------------------------------------------------- AffineGrid
def _base_positions(n: int, align_corners: bool) -> np.ndarray:
    """The n normalized positions along an axis (f64, as onnx's reference computes them): the pixel centres from
    -1 to 1 with align_corners, else the centres of n equal pixels spanning [-1, 1] (none for n = 0)."""
    step = 2.0 / (n - 1) if align_corners else 2.0 / max(n, 1)
    start = -1.0 if align_corners else -1.0 + step / 2
    return start + np.arange(n) * step


@converts("AffineGrid", attrs=("align_corners",))
def affine_grid(node: Node) -> list:
    """AffineGrid (2-D and 3-D, align_corners) with a constant size: theta (N, r, r + 1) times the homogeneous
    base coordinates (x, y[, z], 1) of each of the grid's positions."""
    theta, size = node.input(0), np.asarray(node.const(1))
    if size.ndim != 1 or size.dtype.kind not in "iu" or size.size not in (4, 5):
        raise node.error(f"size must be (N, C, H, W) or (N, C, D, H, W) integers, got {size.dtype}"
                         f"{list(size.shape)}", OnnxImportError)
    if any(n < 0 for n in size):
        raise node.error(f"size {size.tolist()} must not be negative", OnnxImportError)
    rank, spatial = size.size - 2, tuple(int(n) for n in size[2:])
    if theta.shape != (int(size[0]), rank, rank + 1):
        raise node.error(f"theta must have shape {(int(size[0]), rank, rank + 1)} for size {size.tolist()}, got "
                         f"{theta.shape}", OnnxImportError)
    if not theta.dtype.is_float:
        raise node.error(f"theta must be floats, got {theta.dtype.name}", OnnxImportError)
    align_corners = node.flag("align_corners")
    if align_corners and 1 in spatial:
        raise node.error(f"align_corners=1 with a spatial size of 1 ({size.tolist()}) is not supported: its "
                         "position is undefined (the operator's function divides by zero; onnxruntime takes 1, "
                         "PyTorch -1)")
    # (positions, r + 1): x (along the last axis) first, then y[, z], then 1
    mesh = np.meshgrid(*(_base_positions(n, align_corners) for n in spatial), indexing="ij")
    base = np.stack([m.reshape(-1) for m in reversed(mesh)] + [np.ones(math.prod(spatial))], axis=-1)

    def transformed(theta):
        rows = ops.reshape(theta, (theta.shape[0], 1, rank, rank + 1))
        homogeneous = constant(base.reshape(1, -1, 1, rank + 1), theta.dtype)
        return ops.sum(ops.mul(rows, homogeneous), axis=-1)                 # (N, positions, r)

    grid = in_f32(transformed, theta)
    return [ops.reshape(grid, (theta.shape[0],) + spatial + (rank,))]
