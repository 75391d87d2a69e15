"""Scatters: scatter_elements (ONNX ScatterElements, torch.scatter), scatter_nd (ONNX ScatterND) and
tensor_scatter (ONNX TensorScatter, a KV cache's update).

Each output element looks for the updates that land on it: a reduction over the updates that could (along the
axis for scatter_elements, all of them for scatter_nd), of those whose index is the element's. With reduction
'none' the last such update wins (onnxruntime applies them in order; the operators leave duplicates undefined);
'add', 'mul', 'max' and 'min' combine the element with all of them. The cost is one comparison per (output
element, candidate update): cheap for the few updates these operators usually carry (a cache's new positions),
heavy for a scatter of millions of updates into millions of elements. scatter_nd without a reduction looks once
per slice its index tuples address (a KV cache's rows), not per element (64x fewer comparisons for rows of 64).
On the cpu both scatters run `stdlib_ops.scatter` instead, which applies the updates in order (graph/runners.py).
tensor_scatter writes a run of steps per batch, so each cache element knows the one step it may take: no search.
"""
from __future__ import annotations

import math

import numpy as np
from stdlib_ops.scatter import REDUCTIONS

from ... import ir
from ...compute import compute
from ...compute import reduce as reduction
from ...ir import types as T
from ...lang import math_expr
from ...runtime.arrays import check_indices
from ..operator import Operator, dims
from ..tensor import Tensor, as_tensor
from .axes import normalize_axis
from .transform import reshape

_COMBINE = {"add": ("sum", "+"), "mul": ("prod", "*"), "max": ("max", "max"), "min": ("min", "min")}


def _i64(n) -> ir.Expr:
    """A size (an int or a size symbol's expression) as an i64 expression."""
    return ir.const(n, T.i64) if isinstance(n, int) else ir.convert(n, T.i64)


def _normalized(index: ir.Expr, n) -> ir.Expr:
    """An i64 index into an axis of size `n`, a negative one counting from the end."""
    index, n = ir.convert(index, T.i64), _i64(n)
    return ir.Select(index < 0, index + n, index, T.i64)


def _scattered(kind: str, data, shape: tuple, count, hit, update, op: str, key_rank: int | None = None):
    """data's elements combined, as `op` says, with the updates `update(p, j)` for the j < count where `hit(p, j)`
    (p an output index, of which `hit` reads the first `key_rank` axes: all by default)."""
    if op == "none":        # the last update that lands here, or -1: found once per key (a scatter_nd's slice)
        key = len(shape) if key_rank is None else key_rank
        last = reduction(f"{kind}_last", shape[:key], (count,),
                         lambda *ix: ir.Select(hit(ix[:-1], ix[-1]), ir.convert(ix[-1], T.i64), ir.const(-1, T.i64),
                                               T.i64), op="max", dtype=T.i64)
        def out(*p):        # (the update read at 0 where none lands: a select may read both of its sides)
            landed = last[p[:key]] >= 0
            j = ir.convert(ir.Select(landed, last[p[:key]], ir.const(0, T.i64), T.i64), T.i32)
            return ir.Select(landed, update(p, j), data[p], data.dtype)

        return compute(kind, shape, out, dtype=data.dtype)
    reduce_op, combine = _COMBINE[op]
    acc = T.f32 if data.dtype.computes_in_f32 else data.dtype
    identity = {"sum": 0, "prod": 1, "max": acc.lowest, "min": -acc.lowest if acc.is_float else acc.limits[1]}
    neutral = ir.const(identity[reduce_op], acc)
    combined = reduction(f"{kind}_{op}", shape, (count,),
                         lambda *ix: ir.Select(hit(ix[:-1], ix[-1]), ir.convert(update(ix[:-1], ix[-1]), acc), neutral,
                                               acc), op=reduce_op, dtype=acc)

    def out(*p):
        element = ir.convert(data[p], acc)
        if combine in ("max", "min"):
            value = math_expr(combine, [element, combined[p]])
        else:
            value = ir.binary(combine, element, combined[p])
        return ir.convert(value, data.dtype)

    return compute(kind, shape, out, dtype=data.dtype)


class ScatterElements(Operator):
    """data with updates[q] written (or combined, attr reduction) at q with q[axis] replaced by indices[q]
    (negative indices count from the end); indices and updates have data's rank and no larger a shape.
    attrs: axis, reduction."""

    kind = "scatter_elements"
    generic = True

    def check(self):
        data, indices, updates = self.inputs
        axis = self.attrs["axis"] = normalize_axis(self.attrs["axis"], data.ndim, "scatter_elements")
        _check_common(data, indices, updates, self.attrs["reduction"], "scatter_elements")
        if indices.shape != updates.shape or indices.ndim != data.ndim:
            raise ValueError(f"scatter_elements: indices {indices.shape} and updates {updates.shape} need one shape, "
                             f"of data's rank {data.ndim}")
        if any(m > n for a, (m, n) in enumerate(zip(indices.shape, data.shape)) if a != axis):
            raise ValueError(f"scatter_elements: indices of shape {indices.shape} are longer than data's shape "
                             f"{data.shape} on an axis other than {axis}")
        if indices.is_constant:
            self.check_values([None, indices.value, None])

    def check_values(self, arrays):
        """IndexError for an index outside [-n, n) (no output element would find its update: it would be lost)."""
        axis = self.attrs["axis"]
        check_indices(arrays[1], self.inputs[0].shape[axis], axis, self.kind)

    def define(self, data, indices, updates):
        shape, ishape, axis = dims(data), dims(indices), self.attrs["axis"]

        def at(p, j):       # update j along the axis for output p; past the updates' extent, their last (masked)
            return tuple(j if a == axis else math_expr("min", [p[a], ishape[a] - 1]) for a in range(len(shape)))

        def hit(p, j):
            inside = [p[a] < ishape[a] for a in range(len(shape)) if a != axis]    # a row the updates reach
            same = ir.binary("==", _normalized(indices[at(p, j)], shape[axis]), ir.convert(p[axis], T.i64))
            for condition in inside:
                same = ir.binary("and", condition, same)
            return same

        return [_scattered(self.kind, data, shape, ishape[axis], hit, lambda p, j: updates[at(p, j)],
                           self.attrs["reduction"])]


class ScatterND(Operator):
    """data with each update slice updates[u] written (or combined, attr reduction) at data[indices[u]]:
    indices (U, q) (negative ones count from the end), updates (U,) + data.shape[q:]. attrs: reduction."""

    kind = "scatter_nd"
    generic = True
    derived_attrs = ("q",)      # the index tuples' length: the comparisons each update takes (in generic's key)

    def check(self):
        data, indices, updates = self.inputs
        _check_common(data, indices, updates, self.attrs["reduction"], "scatter_nd")
        if indices.ndim != 2 or not 1 <= indices.shape[1] <= data.ndim:
            raise ValueError(f"scatter_nd: indices must be (updates, q) with 1 <= q <= data's rank {data.ndim}, got "
                             f"shape {indices.shape}; use ops.scatter_nd")
        q = self.attrs["q"] = indices.shape[1]
        if updates.shape != indices.shape[:1] + data.shape[q:]:
            raise ValueError(f"scatter_nd: updates must have shape {indices.shape[:1] + data.shape[q:]}, got "
                             f"{updates.shape}")
        if indices.is_constant:
            self.check_values([None, indices.value, None])

    def check_values(self, arrays):
        """IndexError for an index tuple with an element outside [-n, n) of its axis (its update would be lost)."""
        indices = np.asarray(arrays[1])
        for axis in range(self.attrs["q"]):
            check_indices(indices[:, axis], self.inputs[0].shape[axis], axis, self.kind)

    def define(self, data, indices, updates):
        shape, count, q = dims(data), dims(indices)[0], self.attrs["q"]

        def hit(p, u):
            same = None
            for k in range(q):
                match = ir.binary("==", _normalized(indices[u, k], shape[k]), ir.convert(p[k], T.i64))
                same = match if same is None else ir.binary("and", same, match)
            return same

        return [_scattered(self.kind, data, shape, count, hit, lambda p, u: updates[(u,) + tuple(p[q:])],
                           self.attrs["reduction"], key_rank=q)]


class TensorScatter(Operator):
    """A cache (batch, ..., length, ...) with the steps of `update` (its shape but `steps` <= length along
    `axis`) written from step write_indices[b] on in each batch b; mode 'circular' wraps them around the axis, mode
    'linear' needs them to fit. attrs: axis (not 0, the batch axis), mode."""

    kind = "tensor_scatter"
    generic = True
    MODES = ("linear", "circular")

    def check(self):
        cache, update, starts = self.inputs
        axis = self.attrs["axis"] = normalize_axis(self.attrs["axis"], cache.ndim, self.kind)
        if axis == 0:
            raise ValueError(f"tensor_scatter: axis 0 of the cache {cache.shape} is its batch axis; the sequence axis "
                             "must be another")
        if self.attrs["mode"] not in self.MODES:
            raise ValueError(f"tensor_scatter: mode must be 'linear' or 'circular', got {self.attrs['mode']!r}")
        if update.dtype != cache.dtype:
            raise TypeError(f"tensor_scatter: the update must have the cache's dtype {cache.dtype.name}, got "
                            f"{update.dtype.name}")
        if update.ndim != cache.ndim or update.shape[axis] > cache.shape[axis] or \
                any(m != n for a, (m, n) in enumerate(zip(update.shape, cache.shape)) if a != axis):
            raise ValueError(f"tensor_scatter: the update {update.shape} must have the cache's shape {cache.shape} "
                             f"but along axis {axis}, where it may be shorter")
        if not starts.dtype.is_integer or starts.shape != cache.shape[:1]:
            raise TypeError(f"tensor_scatter: write_indices must be {cache.shape[0]} integers (one per batch), got "
                            f"{starts.dtype.name}{list(starts.shape)}")
        if starts.is_constant:
            self.check_values([None, None, starts.value])

    def check_values(self, arrays):
        """IndexError for a negative write index, or in mode 'linear' one whose steps run past the cache's end."""
        starts, axis = arrays[2], self.attrs["axis"]
        steps, length = self.inputs[1].shape[axis], self.inputs[0].shape[axis]
        for b, start in enumerate(np.asarray(starts).reshape(-1).tolist()):
            if start < 0:
                raise IndexError(f"tensor_scatter: write index {start} of batch {b} is negative")
            if self.attrs["mode"] == "linear" and start + steps > length:
                raise IndexError(f"tensor_scatter: write index {start} of batch {b} and the update's {steps} steps run "
                                 f"past the cache's length {length} along axis {axis}; mode 'circular' wraps them")

    def define(self, cache, update, starts):
        shape, axis = dims(cache), self.attrs["axis"]
        length, steps = _i64(shape[axis]), _i64(dims(update)[axis])

        def out(*p):        # the update's step s that lands on p, if one does
            s = ir.convert(p[axis], T.i64) - ir.convert(starts[p[0]], T.i64)
            if self.attrs["mode"] == "circular":    # (IR's % is Python's: non-negative here)
                s = s % length
            landed = ir.binary("and", s >= 0, s < steps)
            step = ir.convert(ir.Select(landed, s, ir.const(0, T.i64), T.i64), T.i32)
            return ir.Select(landed, update[p[:axis] + (step,) + p[axis + 1:]], cache[p], cache.dtype)

        return [compute(self.kind, shape, out, dtype=cache.dtype)]


def _check_common(data, indices, updates, op: str, what: str) -> None:
    """The checks both scatters share: index and update types, the reduction."""
    if not indices.dtype.is_integer:
        raise TypeError(f"{what}: indices must be integers, got {indices.dtype.name}")
    if updates.dtype != data.dtype:
        raise TypeError(f"{what}: updates must have data's dtype {data.dtype.name}, got {updates.dtype.name}")
    if op not in REDUCTIONS:
        raise ValueError(f"{what}: reduction must be one of {', '.join(REDUCTIONS)}, got {op!r}")
    if op != "none" and data.dtype.is_bool:
        raise TypeError(f"{what}: reduction {op!r} is not defined on bool tensors; cast them first")


def scatter_elements(data, indices, updates, axis: int = 0, reduction: str = "none") -> Tensor:
    """torch.scatter / ONNX ScatterElements: data with updates[q] written at q with q[axis] replaced by
    indices[q], or combined with it ('add', 'mul', 'max', 'min'); with 'none' a later duplicate wins."""
    op = ScatterElements([as_tensor(data), as_tensor(indices), as_tensor(updates)],
                         {"axis": axis, "reduction": reduction})
    return op.inputs[0] if op.inputs[2].size == 0 else op.outputs[0]      # (no update: the kernel would read one)


def scatter_nd(data, indices, updates, reduction: str = "none") -> Tensor:
    """ONNX ScatterND: data with the slice updates[u...] written at data[indices[u...]] (indices (..., q), updates
    indices.shape[:-1] + data.shape[q:]), or combined with it; with 'none' a later duplicate wins."""
    data, indices, updates = as_tensor(data), as_tensor(indices), as_tensor(updates)
    if indices.ndim == 0:
        raise ValueError("scatter_nd: indices need at least one axis (the index tuples along the last)")
    q = indices.shape[-1]
    count = math.prod(indices.shape[:-1])
    flat_updates = reshape(updates, (count,) + tuple(updates.shape[indices.ndim - 1:])) if \
        updates.shape[:indices.ndim - 1] == indices.shape[:-1] else updates     # (else check() says what is wrong)
    op = ScatterND([data, reshape(indices, (count, q)), flat_updates], {"reduction": reduction})
    return data if count == 0 else op.outputs[0]      # (no update: the kernel would read one)


def tensor_scatter(cache, update, write_indices=None, axis: int = -2, mode: str = "linear") -> Tensor:
    """ONNX TensorScatter (a KV cache's update): cache with update's steps along `axis` written from step
    write_indices[b] (default 0) on in each batch b; mode 'circular' wraps them around the axis."""
    cache, update = as_tensor(cache), as_tensor(update)
    if write_indices is None:
        write_indices = np.zeros(cache.shape[:1], np.int64)
    op = TensorScatter([cache, update, as_tensor(write_indices)], {"axis": axis, "mode": mode})
    return cache if update.size == 0 else op.outputs[0]       # (no step: the kernel would read one)
