"""Converters of GridSample and AffineGrid.

GridSample reads X at positions that the grid, an input, gives: a composition of elementwise operators around
gathers, on every grid point at once (N * points rows). Along each spatial axis a point's coordinate is
denormalized and split into a whole base and a fraction; each tap of the mode (nearest: 1, linear: 2, cubic: 4)
then has an index, made valid by the padding mode (border: clamped; reflection: folded into the axis's symmetric
extension; zeros: an index past the table's end where it is outside), and a weight. A gather of the taps gives
each corner of them (one tap per axis) its flattened index into X viewed as a table (C, N * pixels), with one
zero column at its end for zeros padding, and the product of its weights; one resample of the table then reads
every channel at the corners' indices and sums their weighted values (nearest: one gather). The padding applies to each
tap's index, as onnxruntime and PyTorch do it, where onnx's reference implementation first clamps or reflects
the coordinate itself: the same values but for cubic sampling with border padding near the edges, where
onnxruntime is followed.

AffineGrid is theta applied to the homogeneous coordinates of a constant base grid: a product broadcast over
the grid's positions, summed over the last axis.
"""
from __future__ import annotations

import itertools
import math

import numpy as np

from .. import ops
from ..tensor import constant
from .elementwise import in_f32
from .errors import OnnxImportError
from .node import Node, converts

# the mode names of opsets 16-19 and of opset 20 on, each the same order as TAPS's keys
MODE_NAMES = {16: ("bilinear", "nearest", "bicubic"), 20: ("linear", "nearest", "cubic")}
# mode -> the offsets of its taps from the base index along an axis
TAPS = {"linear": (0, 1), "nearest": (0,), "cubic": (-1, 0, 1, 2)}
PADDING_MODES = ("zeros", "border", "reflection")
CUBIC_A = -0.75     # Keys' coefficient, as onnxruntime and PyTorch fix it
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
    """The pixel coordinates (N * points, r) the grid gives, last spatial axis first as the grid lists them, in
    the grid's dtype (f32 for 16-bit grids): (g + 1) * scale - shift, the value onnxruntime's ((g + 1) * n - 1) / 2
    (or (g + 1) / 2 * (n - 1) with align_corners) rounds to, as the halving is exact; clamped to
    COORDINATE_LIMIT."""
    g = ops.reshape(grid, (math.prod(grid.shape[:-1]), grid.shape[-1]))
    if grid.dtype.computes_in_f32:
        g = ops.cast(g, "float32")
    sizes = np.array(spatial[::-1], np.float64)
    if align_corners:       # [-1, 1] -> [0, n - 1]
        x = ops.mul(ops.add(g, 1.0), constant((sizes - 1) / 2, g.dtype))
    else:                   # [-1, 1] -> [-0.5, n - 0.5]
        x = ops.sub(ops.mul(ops.add(g, 1.0), constant(sizes / 2, g.dtype)), 0.5)
    limit = COORDINATE_LIMIT[g.dtype.name]
    return ops.clip(x, -limit, limit)


def _tap_weights(t, mode: str):
    """The weights (rows, r, taps) of the taps at distances |t - offset| from the coordinates, t their fractions
    (rows, r, 1): linear 1 - d; cubic Keys' kernel with onnxruntime's formulas."""
    d = ops.elementwise("abs", ops.sub(t, constant(np.array(TAPS[mode], np.float64), t.dtype)))
    if mode == "linear":
        return ops.sub(1.0, d)
    a = CUBIC_A
    near = ops.add(ops.mul(ops.mul(ops.sub(ops.mul(d, a + 2), a + 3), d), d), 1.0)                # d <= 1
    far = ops.sub(ops.mul(ops.add(ops.mul(ops.sub(ops.mul(d, a), 5 * a), d), 8 * a), d), 4 * a)   # 1 < d <= 2
    return ops.where(constant(np.array([k in (0, 1) for k in TAPS[mode]])), near, far)


def _tap_indices(i, spatial: tuple, padding: str, align_corners: bool, outside: int):
    """The flattened offsets into X's pixels (rows, r, taps) of the int64 tap indices i along each axis: border
    clamps i to the axis; reflection folds it into the axis mirrored about its borders (the pixel centres 0 and
    n - 1 with align_corners, the edges -0.5 and n - 0.5 without), which is onnxruntime's GsReflect on whole
    indices; zeros makes the offset of an index outside the axis `outside`, so that every corner with such a tap
    lies at or past `outside`."""
    n = np.array(spatial[::-1], np.int64).reshape(-1, 1)
    strides = constant(np.array([math.prod(spatial[a + 1:]) for a in range(len(spatial))][::-1],
                                np.int64).reshape(-1, 1))
    if padding == "reflection":     # (an axis of one pixel: period 1, every index 0)
        period = np.maximum(2 * (n - 1) if align_corners else 2 * n, 1)
        m = ops.elementwise("mod", i, constant(period))
        folded = ops.where(ops.less(m, constant(n)), m, ops.sub(constant(period - (0 if align_corners else 1)), m))
        return ops.mul(folded, strides)
    clamped = ops.clip(i, constant(np.zeros_like(n)), constant(n - 1))
    if padding == "border":
        return ops.mul(clamped, strides)
    return ops.where(ops.equal(clamped, i), ops.mul(clamped, strides), outside)


def _corners(taps, combine: str):
    """taps (rows, r, K) combined over the K^r corners, each taking one tap per axis (`combine`: sum or prod):
    (rows, K^r)."""
    rows, rank, k = taps.shape
    if rank == 1:
        return ops.reshape(taps, (rows, k))
    # corner c takes the tap at column a * K + (digit a of c in base K) of taps viewed as (rows, r * K)
    columns = np.array([[a * k + digit for a, digit in enumerate(c)] for c in itertools.product(range(k), repeat=rank)])
    gathered = ops.gather(ops.reshape(taps, (rows, rank * k)), constant(columns), 1)    # (rows, K^r, r)
    return (ops.sum if combine == "sum" else ops.prod)(gathered, axis=-1)


def _swap_leading(x):
    """x with its first two axes swapped: a view where one of them has size 1."""
    if 1 in x.shape[:2]:
        return ops.reshape(x, (x.shape[1], x.shape[0]) + x.shape[2:])
    return ops.transpose(x, (1, 0) + tuple(range(2, x.ndim)))


@converts("GridSample", attrs=("align_corners", "mode", "padding_mode"))
def grid_sample(node: Node) -> list:
    """GridSample with any number of spatial axes (opset 16 defines 2-D only; onnxruntime samples 3-D there too,
    as taskdsl does): nearest (halves to even), linear and cubic sampling, zeros, border and reflection padding,
    align_corners; linear and cubic take float inputs, nearest every type. 16-bit floats are computed in f32 and
    rounded once."""
    x, grid = node.input(0), node.input(1)
    mode = _mode(node)
    padding = node.attr("padding_mode", "zeros")
    if padding not in PADDING_MODES:
        raise node.error(f"padding_mode={padding!r} is not one of {', '.join(PADDING_MODES)}", OnnxImportError)
    align_corners = node.flag("align_corners")
    _check_inputs(node, x, grid, mode)
    (batch, channels), spatial, out_spatial = x.shape[:2], x.shape[2:], grid.shape[1:-1]
    y = sample(x, _coordinates(grid, spatial, align_corners), mode, padding, align_corners)     # (C, rows)
    y = ops.reshape(_swap_leading(ops.reshape(y, (channels, batch, math.prod(out_spatial)))),
                    (batch, channels) + out_spatial)
    return [ops.cast(y, x.dtype)]


def sample(x, coordinates, mode: str, padding: str, align_corners: bool):
    """x (N, C, spatial...) sampled at pixel `coordinates` (N * points, r), each batch's points in turn, the last
    spatial axis's coordinate first: (C, N * points), in f32 for 16-bit floats."""
    (batch, channels), spatial = x.shape[:2], x.shape[2:]
    pixels, points = math.prod(spatial), coordinates.shape[0] // batch
    coordinates = ops.unsqueeze(coordinates, 2)        # (rows, r, 1)
    if mode == "nearest":       # onnxruntime's nearbyint: halves to even
        base, weights = ops.elementwise("rint", coordinates), None
    else:
        base = ops.elementwise("floor", coordinates)
        weights = _corners(_tap_weights(ops.sub(coordinates, base), mode), "prod")
    taps = ops.add(ops.cast(base, "int64"), constant(np.array(TAPS[mode], np.int64)))
    index = _corners(_tap_indices(taps, spatial, padding, align_corners, batch * pixels), "sum")
    if batch > 1:       # each batch's pixels start batch * pixels into the table's rows
        index = ops.add(index, constant(np.repeat(np.arange(batch, dtype=np.int64) * pixels, points)[:, None]))
    # X as a table (C, N * pixels): one gather along axis 1 reads every channel; zeros padding reads the zero
    # column appended at N * pixels for every corner with a tap outside
    table = ops.reshape(_swap_leading(ops.reshape(x, (batch, channels, pixels))), (channels, batch * pixels))
    if padding == "zeros":
        table = ops.pad(table, [0, 0, 0, 1], False if x.dtype.is_bool else 0)
        index = ops.clip(index, hi=batch * pixels)
    if weights is None:
        return ops.gather(table, ops.reshape(index, (batch * points,)), 1)
    # the corners summed by one resample, which reads each value where it lies (a gather of the corners, a product
    # and a sum wrote and read every corner's value once more: 3x onnxruntime's time)
    return ops.resample(table, index, ops.cast(weights, "f32" if x.dtype.computes_in_f32 else x.dtype.name), 1)


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
