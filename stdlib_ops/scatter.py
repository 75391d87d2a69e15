"""The cpu's scatters: updates applied in order to a copy of the data (`scatter_rows`, `scatter_slices`).

The graph's scatter operators are definitions (graph/ops/scatter.py): each output element searches the updates for
those that land on it, one comparison per (element, update that could): on the cpu, 62-760x onnxruntime's time for a
thousand updates along rows of a thousand to a hundred thousand elements. Here the updates are applied one after
the other, as onnxruntime applies them: with reduction 'none' the last one to land wins; 'add', 'mul', 'max' and
'min' combine each with what is there (16-bit floats in f32, rounded at each store, as each update's own result).

- `scatter_rows` (ScatterElements where indices and updates span data on every axis but the scattered one): one
  block per row of x viewed as (outer, n, inner) copies the row, then writes the row's updates in order.
- `scatter_slices` (ScatterND): one block per chunk of a slice's elements copies that chunk of every slot, then
  applies the updates in order to it (each update's slot found from its index tuple).
"""
# ruff: noqa: F821 - the kernels' bodies use their size symbols as names
# No `from __future__ import annotations`: the kernels' annotations use closure dtypes.
import functools
import math

import numpy as np

import taskdsl as td
from taskdsl import blockIdx

from .elementwise import tdtype

REDUCTIONS = ("none", "add", "mul", "max", "min")     # also the graph's scatters' (graph/ops/scatter.py)
SLICE_CHUNK = 1024      # slice elements a `scatter_slices` block applies every update to


def _combine(reduction: str):
    """The device function giving what an element becomes when an update lands on it."""
    @td.func
    def combined(old, new):
        if reduction == "add":
            return old + new
        if reduction == "mul":
            return old * new
        if reduction == "max":
            return td.max(old, new)
        if reduction == "min":
            return td.min(old, new)
        return new

    return combined


@td.func
def normalized(index, n):
    """An index into an axis of n elements, a negative one counting from the end."""
    return index + n if index < 0 else index


@functools.cache
def scatter_rows_kernel(dtype, index_dtype, reduction: str) -> td.Kernel:
    """ScatterElements along axis 1 of x (outer, n, inner), indices and updates (outer, u, inner): into y."""
    combined = _combine(reduction)

    @td.kernel(grid=lambda SO, SI: SO * SI, block=1, name=f"scatter_rows_{reduction}")
    def scatter_rows(X: dtype["SO", "SN", "SI"], Indices: index_dtype["SO", "SU", "SI"],
                     Updates: dtype["SO", "SU", "SI"], Y: dtype["SO", "SN", "SI"]):
        o = blockIdx.x // SI
        c = blockIdx.x % SI
        for t in range(SN):
            Y[o, t, c] = X[o, t, c]
        for j in range(SU):
            k = normalized(Indices[o, j, c], SN)
            Y[o, k, c] = combined(Y[o, k, c], Updates[o, j, c])

    return scatter_rows


@functools.cache
def scatter_slices_kernel(dtype, index_dtype, reduction: str) -> td.Kernel:
    """ScatterND of x (slots, e) viewed from data (slot axes, slice axes), indices (u, q) into the slot axes (sizes
    `axes`, i64 (q,)), updates (u, e): into y."""
    combined = _combine(reduction)

    @td.kernel(grid=lambda SE: td.cdiv(SE, SLICE_CHUNK), block=1, name=f"scatter_slices_{reduction}")
    def scatter_slices(X: dtype["SS", "SE"], Indices: index_dtype["SU", "SQ"], Axes: td.i64["SQ"],
                       Updates: dtype["SU", "SE"], Y: dtype["SS", "SE"]):
        begin = blockIdx.x * SLICE_CHUNK
        end = td.min(begin + SLICE_CHUNK, SE)
        for s in range(SS):
            for e in range(begin, end):
                Y[s, e] = X[s, e]
        for u in range(SU):
            slot = td.cast(0, td.i64)
            for k in range(SQ):
                slot = slot * Axes[k] + normalized(td.cast(Indices[u, k], td.i64), Axes[k])
            for e in range(begin, end):
                Y[slot, e] = combined(Y[slot, e], Updates[u, e])

    return scatter_slices


def scatter_rows(x: np.ndarray, indices: np.ndarray, updates: np.ndarray, y: np.ndarray,
                 reduction: str) -> td.Kernel:
    """Write x (outer, n, inner) with updates (outer, u, inner) scattered along axis 1 at `indices` (in [-n, n))
    into y, a cpu array of x's shape; returns the kernel launched."""
    kernel = scatter_rows_kernel(tdtype(x.dtype), tdtype(indices.dtype), _reduction(reduction))
    kernel(x, indices, updates, y)
    return kernel


def scatter_slices(x: np.ndarray, indices: np.ndarray, updates: np.ndarray, y: np.ndarray,
                   reduction: str) -> td.Kernel:
    """Write x with the slices updates[u] scattered at x[indices[u]] (indices (u, q), in range on each axis; updates
    (u,) + x.shape[q:]) into y, a cpu array of x's shape; returns the kernel launched."""
    q = indices.shape[1]
    slots, elements = math.prod(x.shape[:q]), math.prod(x.shape[q:])
    kernel = scatter_slices_kernel(tdtype(x.dtype), tdtype(indices.dtype), _reduction(reduction))
    kernel(x.reshape(slots, elements), indices, np.array(x.shape[:q], np.int64),
           updates.reshape(len(indices), elements), y.reshape(slots, elements))
    return kernel


def _reduction(reduction: str) -> str:
    if reduction not in REDUCTIONS:
        raise ValueError(f"reduction must be one of {', '.join(REDUCTIONS)}, got {reduction!r}")
    return reduction
