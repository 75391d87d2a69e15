"""Data movement as injective compute definitions: transpose, reshape, slice, concat, pad, gather, expand.

    from stdlib_ops import transpose, concat, pad
    y = transpose(x, (0, 2, 1)); z = concat([a, b], axis=1); p = pad(x, ((0, 0), (1, 2)), value=-1.0)

Each returns a new array computed by a kernel (never a numpy view); on the cpu a transpose that swaps two axes
(NCHW <-> NHWC, a matrix's) runs `transpose_tiles` instead, one that interleaves rows (DepthToSpace, a
ConvTranspose's phases) `interleave`. Shapes are canonical
and symbolic so an op is built once per structure and reused for every size:
transpose drops size-1 axes and merges axes that stay neighbours; reshape of a row-major
array is a flat copy; concat and gather view arrays as (outer, axis, inner); expand merges
axes like the elementwise operators. Per-call numbers that are not sizes (slice starts and
steps, pad widths, the pad value) are passed as small input arrays, and output sizes that
no input has are bound by a zero-stride "shape carrier" input that no kernel reads.
"""
from __future__ import annotations

import builtins
import functools
import math

import numpy as np

import taskdsl as td
from taskdsl import ir
from taskdsl.compute import size_var
from taskdsl.runtime.arrays import check_indices, on_device
from taskdsl.runtime.config import get_target

from . import interleave, transpose_tiles
from .elementwise import (
    Plan,
    broadcast_canon,
    cached_op,
    contiguous,
    int_tuple,
    normalize_axis,
    reshaper,
    result_dtype,
    shape_carrier,
    tdtype,
)

__all__ = ["concat", "expand", "gather", "pad", "permute", "reshape", "slice", "transpose"]


def _all(conds: list) -> ir.Expr:
    out = conds[0]
    for c in conds[1:]:
        out = ir.binary("and", out, c)
    return out


# ---------------------------------------------------------------- transpose
@functools.lru_cache(maxsize=1024)
def transpose_canon(shape: tuple, perm: tuple) -> tuple[tuple, tuple]:
    """(canonical input shape, canonical perm): size-1 axes dropped, axes that stay neighbours merged (remembered:
    graphs ask for the same shapes at every run)."""
    keep = [a for a in range(len(shape)) if shape[a] != 1]
    rank = {a: k for k, a in enumerate(keep)}
    groups: list = []          # in output order, each a run of consecutive (kept) input axes
    for r in (rank[a] for a in perm if shape[a] != 1):
        if groups and groups[-1][-1] + 1 == r:
            groups[-1].append(r)
        else:
            groups.append([r])
    if not groups:
        return (1,), (0,)
    by_input = sorted(range(len(groups)), key=lambda g: groups[g][0])
    canon_shape = tuple(math.prod([shape[keep[r]] for r in groups[g]]) for g in by_input)
    position = {g: k for k, g in enumerate(by_input)}
    return canon_shape, tuple(position[g] for g in range(len(groups)))


def _transpose_op(perm: tuple, dtype) -> td.Op:
    dims = tuple(f"T{k}" for k in range(len(perm)))
    x = td.placeholder("x", dtype, dims)

    def fcompute(*axes):
        index = [None] * len(perm)
        for j, a in enumerate(perm):
            index[a] = axes[j]
        return x[tuple(index)]

    y = td.compute("transpose", tuple(dims[a] for a in perm), fcompute)
    return td.op([x], [y], name="transpose")


def _permutation(x, axes) -> tuple:
    perm = tuple(reversed(range(x.ndim))) if axes is None else \
        tuple(normalize_axis(a, x.ndim) for a in int_tuple(axes, "transpose: axes"))
    if sorted(perm) != list(range(x.ndim)):
        raise ValueError(f"axes {axes!r} are not a permutation of {x.ndim} axes")
    return perm


def _transpose_plan(x, axes=None) -> Plan:
    x = contiguous(x)
    perm = _permutation(x, axes)
    canon_shape, cperm = transpose_canon(x.shape, perm)
    dtype = tdtype(x.dtype)
    op = cached_op(("transpose", cperm, dtype), lambda: _transpose_op(cperm, dtype))
    return Plan(op, (x.reshape(canon_shape),), reshaper(tuple(x.shape[a] for a in perm)))


def transposes_by_kernel(x, perm: tuple) -> bool:
    """Whether transposing x by `perm` runs a kernel of its own (the cpu, a host array) instead of the definitions':
    `transpose_tiles` for a canonical swap of the last two axes, `interleave` for rows interleaved."""
    return _own_kernel(x, perm) is not None


def transpose_by_kernel(x: np.ndarray, perm: tuple, y: np.ndarray) -> td.Kernel:
    """Write x transposed by `perm` into y (x's transposed shape) by its own kernel (where `transposes_by_kernel`);
    returns the kernel launched."""
    return _own_kernel(x, perm).transpose(contiguous(x), transpose_canon(x.shape, perm)[0], y)


def _own_kernel(x, perm: tuple):
    """The module (`transpose_tiles`, `interleave`) whose kernel transposes x by `perm`, or None."""
    if get_target() != "cpu" or on_device(x):
        return None
    canon = transpose_canon(x.shape, perm)
    return next((module for module in (transpose_tiles, interleave) if module.applies(*canon)), None)


def transpose(x, axes=None):
    """x with its axes permuted (`axes[j]` is the input axis of output axis j; None reverses them)."""
    x = contiguous(x)
    perm = _permutation(x, axes)
    if transposes_by_kernel(x, perm):
        y = np.empty(tuple(x.shape[a] for a in perm), x.dtype)
        transpose_by_kernel(x, perm, y)
        return y
    return _transpose_plan(x, perm).run()


def permute(x, dims):
    """PyTorch's name for `transpose(x, dims)`."""
    return transpose(x, dims)


# ---------------------------------------------------------------- reshape
def _copy_op(dtype) -> td.Op:
    x = td.placeholder("x", dtype, ("F0",))
    y = td.compute("copy", ("F0",), lambda i: x[i])
    return td.op([x], [y], name="copy")


def _resolve_shape(size: int, shape) -> tuple:
    shape = int_tuple(shape, "reshape: the shape")
    unknown = [k for k, n in enumerate(shape) if n == -1]
    if len(unknown) > 1 or any(n < -1 for n in shape):
        raise ValueError(f"invalid shape {shape} for reshape")
    known = math.prod([n for n in shape if n != -1])
    if unknown:
        if known == 0 or size % known:
            raise ValueError(f"cannot reshape an array of size {size} into shape {shape}")
        shape = shape[:unknown[0]] + (size // known,) + shape[unknown[0] + 1:]
    if math.prod(shape) != size:
        raise ValueError(f"cannot reshape an array of size {size} into shape {shape}")
    return shape


def _reshape_plan(x, shape) -> Plan:
    x = contiguous(x)
    shape = _resolve_shape(x.size, shape)
    dtype = tdtype(x.dtype)
    op = cached_op(("copy", dtype), lambda: _copy_op(dtype))
    return Plan(op, (x.reshape(-1),), reshaper(shape))


def reshape(x, shape):
    """A copy of x with a new shape (row-major order; one dim may be -1)."""
    return _reshape_plan(x, shape).run()


# ---------------------------------------------------------------- slice
def _slice_op(ndim: int, dtype) -> td.Op:
    in_dims = tuple(f"SLI{k}" for k in range(ndim))
    out_dims = tuple(f"SLO{k}" for k in range(ndim))
    x = td.placeholder("x", dtype, in_dims)
    params = td.placeholder("start_step", td.i32, (2 * ndim,))     # start0, step0, start1, step1, ...
    carrier = td.placeholder("out_shape", td.i8, out_dims)
    y = td.compute("slice", out_dims,
                   lambda *axes: x[tuple(params[2 * k] + a * params[2 * k + 1] for k, a in enumerate(axes))])
    return td.op([x, params, carrier], [y], name="slice")


def _slice_plan(x, starts, stops, steps=None, axes=None) -> Plan:
    x = contiguous(x)
    if x.ndim == 0:
        raise ValueError("slice: a 0-d array has no axis to slice")
    given = [v for v in (starts, stops, steps, axes) if v is not None and np.ndim(v) > 0]
    count = len(given[0]) if given else 1

    def seq(v, what):   # an integer or None stands for the same value on every sliced axis
        values = [v] * count if v is None or np.ndim(v) == 0 else list(v)
        if any(n is not None and np.ndim(n) > 0 for n in values):       # ((1, 2),) is no start
            raise TypeError(f"slice: {what} must be integers (one per sliced axis), got {v!r}")
        return [None if n is None else int_tuple(n, f"slice: {what}")[0] for n in values]

    starts, stops, steps = seq(starts, "starts"), seq(stops, "stops"), seq(steps, "steps")
    if axes is None and count > x.ndim:
        raise ValueError(f"slice: {count} starts/stops for a {x.ndim}-d array; give at most {x.ndim}, or `axes`")
    axes = list(range(count)) if axes is None else [normalize_axis(a, x.ndim) for a in seq(axes, "axes")]
    if not len(starts) == len(stops) == len(steps) == len(axes) or len(set(axes)) != len(axes):
        raise ValueError("slice: starts, stops, steps and axes must have the same length (and distinct axes)")
    bounds = [(0, 1, n) for n in x.shape]          # (start, step, length) per axis
    for a, start, stop, step in zip(axes, starts, stops, steps):
        if step == 0:
            raise ValueError("slice step cannot be zero")
        s = builtins.slice(start, stop, step).indices(x.shape[a])
        length = len(range(*s))
        bounds[a] = (s[0], s[2] if length > 1 else 1, length)   # (a step past the axis takes one element: any fits)
    params = np.array([v for start, step, _ in bounds for v in (start, step)], np.int32).reshape(-1)
    out_shape = tuple(n for _, _, n in bounds)
    dtype = tdtype(x.dtype)
    op = cached_op(("slice", x.ndim, dtype), lambda: _slice_op(x.ndim, dtype))
    return Plan(op, (x, params, shape_carrier(out_shape)), reshaper(out_shape))


def slice(x, starts, stops, steps=None, axes=None):  # the operator's name (shadows the builtin in this module)
    """x[start:stop:step] along `axes` (default 0, 1, ...), Python slicing rules (negative, None, clamping)."""
    return _slice_plan(x, starts, stops, steps, axes).run()


# ---------------------------------------------------------------- pad
def _pad_op(ndim: int, dtype) -> td.Op:
    in_dims = tuple(f"PI{k}" for k in range(ndim))
    out_dims = tuple(f"PO{k}" for k in range(ndim))
    x = td.placeholder("x", dtype, in_dims)
    before = td.placeholder("before", td.i32, (ndim,))
    value = td.placeholder("value", dtype, (1,))
    carrier = td.placeholder("out_shape", td.i8, out_dims)

    def fcompute(*axes):
        src = [a - before[k] for k, a in enumerate(axes)]
        inside = _all([ir.binary("and", s >= 0, s < size_var(d)) for s, d in zip(src, in_dims)])
        return ir.Select(inside, x[tuple(src)], value[0], dtype)

    y = td.compute("pad", out_dims, fcompute)
    return td.op([x, before, value, carrier], [y], name="pad")


def _pad_widths(pad_width, ndim: int) -> list:
    """One (before, after) pair per axis: `pad_width` broadcast to (ndim, 2), as numpy.pad takes it."""
    if (isinstance(pad_width, (tuple, list)) and len(pad_width) == ndim      # one pair per axis, as a model gives
            and all(type(p) in (tuple, list) and len(p) == 2 and all(type(n) is int and n >= 0 for n in p)
                    for p in pad_width)):
        return [tuple(p) for p in pad_width]        # (numpy's broadcasting below costs ~8 us)
    w = np.asarray(pad_width)
    if w.dtype.kind not in "iu" and w.size:
        raise TypeError(f"pad widths must be integers, got {pad_width!r}")
    try:
        w = np.broadcast_to(w.astype(np.int64), (ndim, 2))
    except ValueError:
        raise ValueError(f"pad_width {pad_width!r} does not fit a {ndim}-d array: give an int, (before, after), "
                         f"or one (before, after) pair per axis") from None
    if (w < 0).any():
        raise ValueError("pad widths must be non-negative")
    return [(int(b), int(a)) for b, a in w]


def _pad_plan(x, pad_width, value=0) -> Plan:
    x = contiguous(x)
    if hasattr(value, "reshape") and not np.isscalar(value) and value.size == 1 and value.dtype == x.dtype:
        fill = value.reshape(1)     # a view: the plan reads the value when it runs (a graph's run-time zero point)
    elif np.ndim(value) != 0:
        raise TypeError(f"pad: value must be one number or a one-element array of x's dtype (per-axis or (before, "
                        f"after) values, as numpy.pad takes, are not supported), got {value!r}")
    else:
        fill = np.array([value], x.dtype)
    widths = _pad_widths(pad_width, x.ndim)
    if x.ndim == 0:         # nothing to pad (numpy.pad returns a copy): a 1-element copy
        one = _pad_plan(x.reshape(1), 0, fill)
        return Plan(one.op, one.arrays, reshaper(()))
    out_shape = _padded(x.shape, widths)
    shape, widths = _merged(x.shape, widths)
    x, dtype = x.reshape(shape), tdtype(x.dtype)
    op = cached_op(("pad", x.ndim, dtype), lambda: _pad_op(x.ndim, dtype))
    arrays = (x, np.array([b for b, _ in widths], np.int32), fill, shape_carrier(_padded(shape, widths)))
    return Plan(op, arrays, reshaper(out_shape))


def _padded(shape: tuple, widths: list) -> tuple:
    return tuple(n + b + a for n, (b, a) in zip(shape, widths))


def _merged(shape: tuple, widths: list) -> tuple[tuple, list]:
    """The same padding of fewer axes: an axis not padded joins the one before it (whose widths grow by its size),
    so an NHWC image padded along H and W is padded along H and W*C, and the kernel's rows (its last axis) are whole
    image rows, not one pixel's channels (a (1, 56, 56, 64) int8 image by 1: 67 -> 35 us; numpy 32)."""
    merged_shape, merged_widths = [], []
    for n, (b, a) in zip(shape, widths):
        if merged_shape and not (b or a):
            merged_shape[-1] *= n
            merged_widths[-1] = (merged_widths[-1][0] * n, merged_widths[-1][1] * n)
        else:
            merged_shape.append(n)
            merged_widths.append((b, a))
    return tuple(merged_shape), merged_widths


def pad(x, pad_width, value=0):
    """x padded with the constant `value` (a number, or a one-element array of x's dtype); pad_width as in numpy.pad
    (int, (before, after), or one pair per axis)."""
    return _pad_plan(x, pad_width, value).run()


# ---------------------------------------------------------------- concat
def part_at(position, starts: list, part, dtype):
    """`part(k)` for the part k whose span holds `position` (part k starts at `starts[k]`, ascending): a balanced
    tree of selects, log2(k) tests an element (a chain tested up to every part: 67x numpy's time for a
    concatenation of 64 arrays)."""
    def among(lo: int, hi: int):
        if hi - lo == 1:
            return part(lo)
        mid = (lo + hi) // 2
        return ir.Select(position < starts[mid], among(lo, mid), among(mid, hi), dtype)
    return among(0, len(starts))


def _concat_op(dtypes: tuple, out_dtype, last: bool) -> td.Op:
    """The concatenation of (KO, KC<k>, KI) arrays along their middle axis; `last`: of (KO, KC<k>) arrays along
    their last (the cpu walks the output's rows as rows, not as flat spans with a division per element: a
    concatenation along the last axis of two (2048, 2048) arrays took 10x numpy's time that way)."""
    dims = lambda middle: ("KO", middle) if last else ("KO", middle, "KI")
    xs = [td.placeholder(f"x{k}", dt, dims(f"KC{k}")) for k, dt in enumerate(dtypes)]
    carrier = td.placeholder("out_shape", td.i8, ("KT",))

    def fcompute(o, c, *inner):
        offsets, total = [], ir.const(0)
        for k in range(len(xs)):
            offsets.append(total)
            total = total + size_var(f"KC{k}")

        return part_at(c, offsets, lambda k: ir.convert(xs[k][(o, c - offsets[k], *inner)], out_dtype), out_dtype)

    y = td.compute("concat", dims("KT"), fcompute)
    return td.op(xs + [carrier], [y], name="concat")


def _concat_plan(arrays, axis: int = 0) -> Plan:
    arrays = [contiguous(a) for a in arrays]
    if not arrays:
        raise ValueError("concat needs at least one array")
    ndim = arrays[0].ndim
    if ndim == 0:
        raise ValueError("zero-dimensional arrays cannot be concatenated")
    axis = normalize_axis(axis, ndim)
    base = arrays[0].shape
    for a in arrays:
        if a.ndim != ndim or a.shape[:axis] != base[:axis] or a.shape[axis + 1:] != base[axis + 1:]:
            raise ValueError(f"concat along axis {axis}: shapes {[a.shape for a in arrays]} do not match")
    out_dtype = result_dtype(*arrays)
    dtypes = tuple(tdtype(a.dtype) for a in arrays)
    out_t = tdtype(out_dtype)
    outer, inner = math.prod(base[:axis]), math.prod(base[axis + 1:])
    total = builtins.sum(a.shape[axis] for a in arrays)
    last = inner == 1
    op = cached_op(("concat", dtypes, out_t, last), lambda: _concat_op(dtypes, out_t, last))
    canon = tuple(a.reshape((outer, a.shape[axis]) + (() if last else (inner,))) for a in arrays)
    out_shape = base[:axis] + (total,) + base[axis + 1:]
    return Plan(op, canon + (shape_carrier((total,)),), reshaper(out_shape))


def concat(arrays, axis: int = 0):
    """The arrays joined along `axis` (other dims must match; dtypes promote like the elementwise ops)."""
    return _concat_plan(arrays, axis).run()


# ---------------------------------------------------------------- gather
def _gather_op(dtype, idtype, last: bool) -> td.Op:
    inner = () if last else ("GI",)       # gathers along the last axis drop the inner axis of size 1: rows to walk
    x = td.placeholder("x", dtype, ("GO", "GA") + inner)
    idx = td.placeholder("indices", idtype, ("GJ",))

    def fcompute(o, j, *i):
        k, n = ir.Cast(idx[j], td.i64), size_var("GA")    # i64: a narrow index plus the axis length would wrap
        k = ir.Select(k < 0, k + n, k, k.dtype)
        # indices in GPU memory are not checked on the host: one out of range reads the nearest end of the
        # axis instead of memory outside the tensor
        return x[(o, ir.Select(k < 0, ir.const(0, k.dtype), ir.Select(k >= n, n - 1, k, k.dtype), k.dtype)) + i]

    y = td.compute("gather", ("GO", "GJ") + inner, fcompute)
    return td.op([x, idx], [y], name="gather")


def _gather_plan(x, indices, axis: int = 0) -> Plan:
    x = contiguous(x)
    if np.size(indices) == 0 and not hasattr(indices, "dtype"):
        indices = np.zeros(np.shape(indices), np.int64)     # an empty list, as numpy.take takes it (not float64)
    indices = contiguous(indices)
    if indices.dtype.kind not in "iu":
        raise TypeError(f"gather indices must be integers, got {indices.dtype}")
    axis = normalize_axis(axis, x.ndim)
    n = x.shape[axis]
    if not on_device(indices):
        check_indices(indices, n, axis, "gather")
    dtype, idtype = tdtype(x.dtype), tdtype(indices.dtype)
    inner = math.prod(x.shape[axis + 1:])
    last = inner == 1
    op = cached_op(("gather", dtype, idtype, last), lambda: _gather_op(dtype, idtype, last))
    canon = x.reshape((math.prod(x.shape[:axis]), n) + (() if last else (inner,)))
    out_shape = x.shape[:axis] + indices.shape + x.shape[axis + 1:]
    return Plan(op, (canon, indices.reshape(-1)), reshaper(out_shape))


def gather(x, indices, axis: int = 0):
    """numpy.take(x, indices, axis): x's slices at the (possibly negative) integer `indices` along `axis`
    (IndexError for one out of range; indices in GPU memory are clamped to the axis instead)."""
    return _gather_plan(x, indices, axis).run()


# ---------------------------------------------------------------- expand
def _expand_op(pattern: tuple, dtype) -> td.Op:
    dims = tuple(f"X{g}" for g in range(len(pattern)))
    x = td.placeholder("x", dtype, tuple(d if st[0] else 1 for st, d in zip(pattern, dims)))
    carrier = td.placeholder("out_shape", td.i8, dims)
    y = td.compute("expand", dims, lambda *axes: x[tuple(a if st[0] else 0 for st, a in zip(pattern, axes))])
    return td.op([x, carrier], [y], name="expand")


def _expand_plan(x, shape) -> Plan:
    x = contiguous(x)
    shape = int_tuple(shape, "expand: the shape")
    if len(shape) < x.ndim or np.broadcast_shapes(x.shape, shape) != shape:
        raise ValueError(f"cannot broadcast an array of shape {x.shape} to {shape}")
    out_shape, pattern, canon = broadcast_canon([x.shape, shape])
    dtype = tdtype(x.dtype)
    op = cached_op(("expand", pattern, dtype), lambda: _expand_op(pattern, dtype))
    return Plan(op, (x.reshape(canon[0]), shape_carrier(canon[1])), reshaper(out_shape))


def expand(x, shape):
    """numpy.broadcast_to(x, shape), materialized."""
    return _expand_plan(x, shape).run()


def op_for(name: str, *args, **kwargs) -> Plan:
    """The Plan a call of `name` runs, with that function's arguments (for tests and introspection)."""
    plans = {"transpose": _transpose_plan, "permute": _transpose_plan, "reshape": _reshape_plan,
             "slice": _slice_plan, "pad": _pad_plan, "concat": _concat_plan, "gather": _gather_plan,
             "expand": _expand_plan}
    if name not in plans:
        raise ValueError(f"unknown transform {name!r}")
    return plans[name](*args, **kwargs)
