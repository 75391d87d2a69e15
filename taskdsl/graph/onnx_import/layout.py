"""Converters of data-movement operators: tiling, depth/space rearrangement, element gathers and scans.

Tile, DepthToSpace and SpaceToDepth are exact compositions of reshapes (views), an expand or a transpose;
GatherElements, ScatterElements, ScatterND, TensorScatter, CumSum, CumProd and TopK are graph ops of their own;
InstanceNormalization is a layer norm over the spatial axes with a per-channel scale and shift
(`ops.instance_norm`); GroupNormalization a layer norm over each group of channels with their spatial axes, then a
per-channel scale and shift; MeanVarianceNormalization centers x over its axes and divides by the standard deviation.
"""
from __future__ import annotations

import numpy as np

from .. import ops
from ..ops.axes import normalize_axes
from .elementwise import in_f32
from .errors import OnnxImportError
from .node import Node, converts

BLOCK_MODES = ("DCR", "CRD")
# the axes of x viewed as (N, blocksize, blocksize, C', H, W) (DCR) or (N, C', blocksize, blocksize, H, W) (CRD)
# as DepthToSpace permutes them into (N, C', H, blocksize, W, blocksize)
DEPTH_TO_SPACE_PERMS = {"DCR": (0, 3, 4, 1, 5, 2), "CRD": (0, 1, 4, 2, 5, 3)}
# the axes of x viewed as (N, C, H', blocksize, W', blocksize) as SpaceToDepth permutes them: its inverse
SPACE_TO_DEPTH_PERMS = {"DCR": (0, 3, 5, 1, 2, 4), "CRD": (0, 1, 3, 5, 2, 4)}


@converts("Tile")
def tile(node: Node) -> list:
    """Tile by constant repeats: x viewed with a 1 before each repeated axis, expanded to the repeats, then
    each (repeat, axis) pair merged (numpy.tile's layout)."""
    x, repeats = node.input(0), [int(r) for r in np.asarray(node.const(1)).reshape(-1)]
    if len(repeats) != x.ndim or any(r < 0 for r in repeats):
        raise node.error(f"repeats {repeats} need one non-negative count per axis of the input's shape {x.shape}",
                         OnnxImportError)
    split, expanded = [], []
    for r, n in zip(repeats, x.shape):
        split += [n] if r == 1 else [1, n]
        expanded += [n] if r == 1 else [r, n]
    tiled = ops.expand(ops.reshape(x, split), expanded)
    return [ops.reshape(tiled, tuple(r * n for r, n in zip(repeats, x.shape)))]


def _block_layout(node: Node) -> tuple:
    """(x, blocksize, mode) of a DepthToSpace / SpaceToDepth node, checked: x (N, C, H, W), blocksize >= 1."""
    x, blocksize, mode = node.input(0), node.attr("blocksize"), node.attr("mode", "DCR")
    if blocksize is None or blocksize < 1:
        raise node.error(f"blocksize must be given and positive, got {blocksize}", OnnxImportError)
    if mode not in BLOCK_MODES:
        raise node.error(f"mode={mode!r} is not supported ({', '.join(BLOCK_MODES)})")
    if x.ndim != 4:
        raise node.error(f"needs an (N, C, H, W) input, got shape {x.shape}", OnnxImportError)
    return x, blocksize, mode


def _rearranged(x, split: tuple, perm: tuple, shape: tuple):
    """x viewed as `split`, its axes permuted by `perm`, viewed as `shape`: one transpose between two views."""
    return ops.reshape(ops.transpose(ops.reshape(x, split), perm), shape)


@converts("DepthToSpace", attrs=("blocksize", "mode"))
def depth_to_space(node: Node) -> list:
    """DepthToSpace in DCR (default) or CRD mode: channel blocks moved into blocksize x blocksize pixels."""
    x, b, mode = _block_layout(node)
    n, c, h, w = x.shape
    if c % (b * b):
        raise node.error(f"the channels of shape {x.shape} are not a multiple of blocksize^2 = {b * b}",
                         OnnxImportError)
    depth = c // (b * b)
    split = (n, b, b, depth, h, w) if mode == "DCR" else (n, depth, b, b, h, w)
    return [_rearranged(x, split, DEPTH_TO_SPACE_PERMS[mode], (n, depth, h * b, w * b))]


@converts("SpaceToDepth", attrs=("blocksize", "mode"))
def space_to_depth(node: Node) -> list:
    """SpaceToDepth (mode from opset 28: DCR, the default, or CRD): blocksize x blocksize pixels moved into
    channels, DepthToSpace's inverse."""
    x, b, mode = _block_layout(node)
    n, c, h, w = x.shape
    if h % b or w % b:
        raise node.error(f"the height and width of shape {x.shape} are not multiples of blocksize {b}",
                         OnnxImportError)
    split = (n, c, h // b, b, w // b, b)
    return [_rearranged(x, split, SPACE_TO_DEPTH_PERMS[mode], (n, c * b * b, h // b, w // b))]


@converts("GatherElements", attrs=("axis",))
def gather_elements(node: Node) -> list:
    """GatherElements along `axis` (indices may be any tensor; negative ones count from the end)."""
    return [ops.gather_elements(node.input(0), node.input(1), node.attr("axis", 0))]


@converts("CumSum", "CumProd", attrs=("exclusive", "reverse"))
def cumulative(node: Node) -> list:
    """CumSum / CumProd along a constant axis (a scalar, or one value in a 1-d tensor), exclusive and / or
    reversed."""
    x, axis = node.input(0), np.asarray(node.const(1))
    if axis.size != 1 or axis.ndim > 1 or axis.dtype.kind not in "iu":
        raise node.error(f"the axis must be one integer, got {axis.dtype}{list(axis.shape)}", OnnxImportError)
    if not (x.dtype.is_float or x.dtype.is_integer):
        raise node.error(f"data type {x.dtype.name} is not supported (integers and floats)")
    fn = ops.cumsum if node.op_type == "CumSum" else ops.cumprod
    return [fn(x, int(axis.reshape(-1)[0]), node.flag("exclusive"), node.flag("reverse"))]


@converts("ScatterElements", attrs=("axis", "reduction"))
def scatter_elements(node: Node) -> list:
    """ScatterElements: data with updates written (or, opsets 16 and 18, combined: add, mul, max, min) where
    indices point along `axis` (negative ones count from the end); of duplicates the last update wins."""
    data, indices, updates = (node.input(k) for k in range(3))
    return [ops.scatter_elements(data, indices, updates, node.attr("axis", 0), _scatter_reduction(node))]


@converts("ScatterND", attrs=("reduction",))
def scatter_nd(node: Node) -> list:
    """ScatterND: data with each update slice written (or combined) at the index tuple indices[u...]."""
    data, indices, updates = (node.input(k) for k in range(3))
    return [ops.scatter_nd(data, indices, updates, _scatter_reduction(node))]


@converts("TensorScatter", attrs=("axis", "mode"))
def tensor_scatter(node: Node) -> list:
    """TensorScatter (opset 24, a KV cache's update): past_cache with update's steps along `axis` (default -2)
    written from write_indices[b] (default 0) on in each batch b, wrapped around the axis in mode 'circular'."""
    cache, update, starts = node.input(0), node.input(1), node.input(2, required=False)
    return [ops.tensor_scatter(cache, update, starts, node.attr("axis", -2), node.attr("mode", "linear"))]


def _scatter_reduction(node: Node) -> str:
    """The node's reduction attribute, refused where its opset does not define it (ops.scatter checks the rest)."""
    op = node.attr("reduction", "none")
    if op in ("max", "min") and node.opset < 18 or op in ("add", "mul") and node.opset < 16:
        raise node.error(f"reduction {op!r} is opset {18 if op in ('max', 'min') else 16}'s, the model's opset is "
                         f"{node.opset}", OnnxImportError)
    return op


@converts("TopK", attrs=("axis", "largest", "sorted"))
def top_k(node: Node) -> list:
    """TopK: the k largest (or, largest=0, smallest) elements along `axis` and their int64 indices, sorted (with
    sorted=0 the order is the operator's choice: sorted too); K a constant input (opset 1's attribute k is one
    after the conversion to opset 13, model.py)."""
    k = np.asarray(node.const(1))
    if k.size != 1 or k.dtype.kind not in "iu":
        raise node.error(f"K must be one integer, got {k.dtype}{list(k.shape)}", OnnxImportError)
    return list(ops.topk(node.input(0), int(k.reshape(-1)[0]), int(node.attr("axis", -1)), node.flag("largest", 1)))


@converts("InstanceNormalization", attrs=("epsilon",))
def instance_norm(node: Node) -> list:
    """InstanceNormalization: x normalized over its spatial axes per instance and channel (a layer norm from axis
    2, statistics in f32, or f64 for f64 x), then scaled and shifted per channel; 16-bit x computed in f32 and
    rounded once."""
    return [_normalized_per_channel(node, None, "B")]


@converts("GroupNormalization", attrs=("epsilon", "num_groups", "stash_type"))
def group_norm(node: Node) -> list:
    """GroupNormalization (opset 21; opset 18's, with a scale and bias per group, is deprecated and refused by onnx's
    checker): x's channels split into num_groups groups, each group of each instance normalized over its channels
    and spatial positions (a layer norm of x viewed as (N, groups, rest), statistics in f32), then scaled and shifted
    per channel; 16-bit x computed in f32 and rounded once."""
    if node.attr("stash_type", 1) != 1:
        raise node.error(f"stash_type={node.attr('stash_type')} is not supported (1: statistics in float32)")
    groups = node.attr("num_groups")
    if groups is None or groups < 1 or node.input(0).ndim < 2 or node.input(0).shape[1] % groups:
        raise node.error(f"num_groups={groups} must divide the channels of X {node.input(0).shape}", OnnxImportError)
    return [_normalized_per_channel(node, groups, "bias")]


@converts("MeanVarianceNormalization", attrs=("axes",))
def mean_variance_norm(node: Node) -> list:
    """MeanVarianceNormalization: (x - mean) / (std + 1e-9) over `axes` (default 0, 2, 3), the variance that of the
    centered values (ONNX's function body takes E[x^2] - E[x]^2, which loses f32's digits where the mean is large
    against the spread: 7e-4 off onnxruntime at two elements); 16-bit x computed in f32 and rounded once."""
    x = node.input(0)
    if not x.dtype.is_float:
        raise node.error(f"data type {x.dtype.name} is not supported (floats)")
    axes = normalize_axes(node.attr("axes", [0, 2, 3]), x.ndim, f"node {node.name!r} (MeanVarianceNormalization)")

    def normalized(x):
        centered = ops.sub(x, ops.mean(x, axes, keepdims=True))
        std = ops.sqrt(ops.mean(ops.mul(centered, centered), axes, keepdims=True))
        return ops.div(centered, ops.add(std, 1e-9))

    return [in_f32(normalized, x)]


def _normalized_per_channel(node: Node, groups: int | None, bias_name: str):
    """x (N, C, spatial...) normalized per instance, over each channel's spatial positions (`groups` None) or each
    group's channels and positions, then scaled and shifted per channel by inputs 1 and 2."""
    x, scale, bias = (node.input(k) for k in range(3))
    if x.ndim < 3:
        raise node.error(f"needs an (N, C, D1, ...) input, got shape {x.shape}", OnnxImportError)
    if not x.dtype.is_float:
        raise node.error(f"data type {x.dtype.name} is not supported (floats)")
    for what, p in (("scale", scale), (bias_name, bias)):
        if p.shape != (x.shape[1],):
            raise node.error(f"{what} must have shape ({x.shape[1]},), one value per channel, got {p.shape}",
                             OnnxImportError)
    per_channel = (x.shape[1],) + (1,) * (x.ndim - 2)
    eps = float(node.attr("epsilon", 1e-5))

    def normalized(x, scale, bias):
        if groups is None:      # the scale and shift in the normalization's own kernel
            return ops.instance_norm(x, scale, bias, eps)
        y = ops.reshape(ops.layer_norm(ops.reshape(x, (x.shape[0], groups, -1)), eps=eps, axis=2), x.shape)
        return ops.add(ops.mul(y, ops.reshape(scale, per_channel)), ops.reshape(bias, per_channel))

    return in_f32(normalized, x, scale, bias)
