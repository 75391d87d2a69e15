"""Reductions: sum / mean / max / min over any axes (td.reduce), argmax / argmin (DSL kernels).

    from stdlib_ops import reduce as R
    R.sum(x, axis=(0, 2), keepdims=True); R.argmax(x, axis=1)

The input is put in a canonical form first: axes of size 1 are dropped and neighbouring
axes that are both kept or both reduced are merged, so (N, C, H, W) reduced over (2, 3) is
a (NC, HW) reduction over its last axis. On the cpu, reduced groups that stay apart, as in (N, C, HW) over (0, 2),
are reduced one after the other (`_staged`: the innermost first where it is long). Every canonical dim is a size
symbol: an Op is built once per (operation, kept/reduced pattern, dtype) and serves every size. The rule scheduler
picks a thread / warp / block / split strategy from the sizes of each call.

Dtypes: sum / max / min keep the input dtype (floats accumulate in at least f32, integers
in at least i32, so an int8 sum wraps like numpy's `sum(dtype=int8)`), except that a sum
of bools counts them in i64, as numpy's does, and `sum(x, dtype=...)` sums in that type, as
numpy's does (each element converted: 8-bit integers into int32, no widened copy); mean of
integers and bools gives f32.
argmax / argmin give int64 indices of the first extreme element, like numpy: a NaN is the
extreme (the first NaN wins), so `x[argmax(x)]` is `max(x)`, which keeps NaNs too. On the cpu,
along a contiguous axis, they run `arg_rows_kernel` (vector instructions, chunks of a row in
parallel); elsewhere `arg_kernel`, a thread per output.
"""
# ruff: noqa: F821 - the argmax kernels' bodies use their size symbols AO, AR, AI, AC as names
# No `from __future__ import annotations`: the argmax kernel's annotations use closure dtypes.
import functools
import math

import numpy as np

import taskdsl as td
from taskdsl import blockIdx, threadIdx
from taskdsl.ir.types import as_dtype, numpy_dtype
from taskdsl.runtime.arrays import empty_like_operands, on_device
from taskdsl.runtime.config import fast_compile_enabled, get_target
from taskdsl.schedule.rules import CPU_ROW, UNROLL_REDUCED

from . import rowwise
from .elementwise import Plan, cached_op, contiguous, flag, normalize_axis, reshaper, tdtype

__all__ = ["argmax", "argmin", "max", "mean", "min", "sum"]

_OPS = ("sum", "mean", "max", "min")


def _axes(axis, ndim: int) -> tuple:
    if axis is None:
        return tuple(range(ndim))
    axes = axis if isinstance(axis, (tuple, list)) else (axis,)
    axes = tuple(normalize_axis(a, ndim) for a in axes)
    if len(set(axes)) != len(axes):
        raise ValueError(f"repeated axis in {axis!r}")
    return axes


def reduce_canon(shape: tuple, axes: tuple) -> tuple[tuple, tuple]:
    """(pattern, canonical shape): pattern[g] is True for a reduced group, False for a kept one."""
    groups: list = []
    for a, n in enumerate(shape):
        if n == 1:
            continue
        red = a in axes
        if groups and groups[-1][0] == red:
            groups[-1][1] *= n
        else:
            groups.append([red, n])
    if not any(not r for r, _ in groups):
        groups.insert(0, [False, 1])       # at least one kept axis (a 0-d output is a 1-element one)
    if not any(r for r, _ in groups):
        groups.append([True, 1])           # at least one reduced axis
    return tuple(r for r, _ in groups), tuple(n for _, n in groups)


def _build(op: str, pattern: tuple, dtype: td.ir.types.DataType, few: int | None = None,
           sum_dtype: td.ir.types.DataType | None = None, staged: str | None = None) -> td.Op:
    """The reduction `op` of a canonical `pattern`; `few`: the size of its one reduced group where that is built in
    (`_few`), else None (a size symbol); `sum_dtype`: a sum's type, its elements converted to it (`sum`'s dtype);
    `staged`: the reduced groups reduced one after the other, the "inner" or "outer" one first (`_staged`)."""
    dims = tuple(few if few is not None and r else f"RD{g}" for g, r in enumerate(pattern))
    x = td.placeholder("x", dtype, dims)
    out_dtype = td.f32 if op == "mean" and not dtype.is_float else dtype   # 16-bit floats: stored as the input
    if op == "sum" and dtype.is_bool:
        out_dtype = td.i64                 # a count, as numpy's sum of bools (a bool sum would be an `or`)
    # partials keep x's values exactly (max, min) or as the final reduction accumulates them (in f32 from 16 bits)
    partial_dtype = dtype if op in ("max", "min") else sum_dtype or (td.f32 if dtype.computes_in_f32 else dtype)
    source, convert = x, sum_dtype
    while staged and pattern.count(True) > 1:
        first = _innermost(pattern) if staged == "inner" else pattern.index(True)
        source, dims = _reduction(f"reduce_{op}_partial", source, dims, tuple(g == first for g in range(len(dims))),
                                  op, partial_dtype, convert)
        pattern, convert = pattern[:first] + pattern[first + 1:], None
    out, _ = _reduction(f"reduce_{op}", source, dims, pattern, op, sum_dtype or out_dtype, convert)
    return td.op([x], [out], name=f"reduce_{op}")


def _reduction(name: str, source, dims: tuple, reducing: tuple, op: str, dtype, convert=None) -> tuple:
    """(the td.reduce of `source`, of `dims`, over the dims `reducing` marks, its dims): each element converted to
    `convert` first where that is a type."""
    kept = tuple(d for d, r in zip(dims, reducing) if not r)
    reduced = tuple(d for d, r in zip(dims, reducing) if r)

    def fcompute(*ix):
        k_ix, r_ix = list(ix[:len(kept)]), list(ix[len(kept):])
        value = source[tuple(r_ix.pop(0) if r else k_ix.pop(0) for r in reducing)]
        return value if convert is None else td.cast(value, convert)

    return td.reduce(name, kept, reduced, fcompute, op=op, dtype=dtype), kept


STAGED_MIN = 1 << 16   # elements of x, at least, for staged reductions: below, the second launch costs more
STAGED_REDUCED = 64    # elements an output reduces, at least: fewer are cheap enough to gather


def _staged(name: str, pattern: tuple, canon: tuple, dtype) -> str | None:
    """Whether the cpu reduces the groups of `pattern` one after the other, and which first: "inner", the innermost,
    where it is a row of CPU_ROW or more, else "outer" (its outputs' rows then hold the inner groups: a sum of
    (4096, 64, 2) over (0, 2), innermost first, made a stage of 262144 sums of 2, 0.61 -> 0.79-0.89 ms). With two or
    more reduced groups, one reduction reads a strided gather an element (a sum of (64, 256, 64) over axes (0, 2) took
    20x onnxruntime's time; batch statistics of (8, 64, 56, 56) over (0, 2, 3), 1.6 ms against 0.1 staged), where
    each stage reads rows or columns; below STAGED_MIN elements, or STAGED_REDUCED an output, one launch is cheaper
    (a sum of (64, 3, 64, 3) over (1, 3): 0.08 ms, 0.12 staged; of (3, 100000, 3) over (0, 2): 0.95-1.06, 1.20-1.67
    staged). A float sum's terms then add in another order, by groups; integer means (divided once) and counts of
    bools keep one reduction."""
    reduced = math.prod(n for n, r in zip(canon, pattern) if r)
    if not (get_target() == "cpu" and pattern.count(True) > 1 and math.prod(canon) >= STAGED_MIN
            and reduced >= STAGED_REDUCED and not dtype.is_bool and (dtype.is_float or name != "mean")):
        return None
    return "inner" if canon[_innermost(pattern)] >= CPU_ROW else "outer"


def _innermost(pattern: tuple) -> int:
    """The position of a canonical pattern's last reduced group."""
    return len(pattern) - 1 - pattern[::-1].index(True)


def _few(reduced: list) -> int | None:
    """The size of a canonical reduction's one reduced group to build into its kernel, or None: 1 (the axes reduced
    all have size 1: each output is a copy; as a size, a reduction loop an output, 4M of them took 15x numpy's
    time), and outside `td.fast_compile` up to UNROLL_REDUCED, whose loop then unrolls (sums of (524288, 4) over
    the last axis: 1.62 -> 0.46 ms; a kernel per such size)."""
    if len(reduced) != 1 or not 1 <= reduced[0] <= UNROLL_REDUCED or (reduced[0] > 1 and fast_compile_enabled()):
        return None
    return reduced[0]


def op_for(name: str, x, axis=None, keepdims: bool = False, dtype=None) -> Plan:
    """The Plan a call of reduction `name` ('sum', 'mean', 'max', 'min') runs; `dtype`: a sum's type (see `sum`)."""
    if name not in _OPS:
        raise ValueError(f"unknown reduction {name!r}; use one of {', '.join(_OPS)}")
    if dtype is not None and name != "sum":
        raise TypeError(f"{name}: dtype= is for sums only")
    x = contiguous(x)
    axes = _axes(axis, x.ndim)
    if name in ("max", "min") and any(x.shape[a] == 0 for a in axes):
        raise ValueError(f"zero-size array to reduction operation {name} which has no identity")
    x_dtype, sum_dtype = tdtype(x.dtype), None if dtype is None else as_dtype(dtype, f"{name}'s dtype")
    pattern, canon = reduce_canon(x.shape, axes)
    few, staged = _few([n for r, n in zip(pattern, canon) if r]), _staged(name, pattern, canon, x_dtype)
    op = cached_op(("reduce", name, pattern, x_dtype, few, sum_dtype, staged),
                   lambda: _build(name, pattern, x_dtype, few, sum_dtype, staged))
    if flag(keepdims, f"{name}: keepdims"):
        out_shape = tuple(1 if a in axes else n for a, n in enumerate(x.shape))
    else:
        out_shape = tuple(n for a, n in enumerate(x.shape) if a not in axes)
    return Plan(op, (x.reshape(canon),), reshaper(out_shape))


def sum(x, axis=None, keepdims: bool = False, dtype=None):  # numpy's name (shadows the builtin in this module)
    """The sum over `axis` (int, tuple or None for all), in x's own type by default (an integer sum wraps there,
    where numpy's widens to 64 bits); `dtype`, as numpy's: the sum's type, each element converted to it first
    (8-bit integers summed in int32 with no widened copy of them)."""
    return op_for("sum", x, axis, keepdims, dtype).run()


def mean(x, axis=None, keepdims: bool = False):
    """The mean over `axis` (integers give f32)."""
    return op_for("mean", x, axis, keepdims).run()


def max(x, axis=None, keepdims: bool = False):
    """The maximum over `axis`."""
    return op_for("max", x, axis, keepdims).run()


def min(x, axis=None, keepdims: bool = False):
    """The minimum over `axis`."""
    return op_for("min", x, axis, keepdims).run()


# ---------------------------------------------------------------- argmax / argmin
ARG_BLOCK = 256


@functools.cache
def arg_kernel(dtype, is_max: bool):
    """The argmax (is_max) / argmin kernel for inputs of `dtype`: X viewed as (outer, axis, inner)."""
    sign = 1 if is_max else -1   # argmin is the argmax of the negated comparison

    @td.kernel(grid=lambda AO, AI: td.cdiv(AO * AI, ARG_BLOCK), block=ARG_BLOCK,
               name="argmax" if is_max else "argmin")
    def kernel(X: dtype["AO", "AR", "AI"], Y: td.i64["AO", "AI"]):
        t = blockIdx.x * ARG_BLOCK + threadIdx.x
        if t < AO * AI:
            o = t // AI
            i = t % AI
            best = X[o, 0, i]
            index = 0
            for r in range(1, AR):
                v = X[o, r, i]
                # v != v: a NaN beats any number (as in numpy), so the first NaN is kept
                if (v > best if sign > 0 else v < best) or (v != v and best == best):
                    best = v
                    index = r
            Y[o, i] = td.cast(index, td.i64)

    return kernel


# the cpu's argmax / argmin along a contiguous axis: `arg_rows_kernel`
ARG_CHUNK = 16384       # elements of a row one block searches; a longer row's chunks' results are combined after


@functools.cache
def arg_rows_kernel(dtype, is_max: bool):
    """The cpu's argmax (is_max) / argmin kernel along the contiguous axis of X (rows, AR): block (chunk, row) finds
    the first extreme element of its ARG_CHUNK elements of the row, as Best[row, chunk] and Index[row, chunk].

    The per-output kernel (`arg_kernel`) keeps a running best and its index, a loop with a branch per element that
    LLVM does not vectorize (9-11x numpy's time over rows of 1024). This one reads its chunk twice. First the extreme
    value m (`rowwise.row_extreme`: vector instructions, a NaN kept). Then it compares `rowwise.LANES` elements a
    step with m, or tests them for a NaN (there is one exactly when m is NaN), until a step holds one, and finds its
    first in those: the first extreme, as numpy's. (Kept as the least index over
    lanes of a branch-free select instead, LLVM vectorized the loop across steps, reading with gathers: 7x slower.)
    The row is in L1 for the second read, which stops at the first hit."""
    lane_type = _lane_type(dtype)

    @td.kernel(grid=lambda AO, AC: (AC, AO), block=1, name="argmax_rows" if is_max else "argmin_rows")
    def kernel(X: dtype["AO", "AR"], Best: lane_type["AO", "AC"], Index: td.i64["AO", "AC"]):
        c, o = blockIdx.x, blockIdx.y
        begin = c * ARG_CHUNK
        n = td.min(AR - begin, ARG_CHUNK)
        full = n // rowwise.LANES * rowwise.LANES
        m = rowwise.row_extreme(X, o, begin, n, td.cast(X[o, begin], lane_type), is_max)  # (an element: no wrong start)
        at = 0
        while at < full:        # to the first LANES elements holding m (or a NaN): a vector compare a step
            hits = False
            for v in td.unroll(rowwise.LANES):
                x = td.cast(X[o, begin + at + v], lane_type)
                hits = hits | (x == m) | (x != x)
            if hits:
                break
            at += rowwise.LANES
        index = n
        for j in range(at, n):
            x = td.cast(X[o, begin + j], lane_type)
            if (x == m) | (x != x):
                index = j
                break
        Best[o, c] = m
        Index[o, c] = td.cast(begin + index, td.i64)

    return kernel


def _lane_type(dtype):
    """The type `arg_rows_kernel` compares elements of `dtype` in: f16 and bf16 as f32, others as themselves."""
    return dtype if not dtype.is_float or dtype.bits >= 32 else td.f32


def _arg_rows(x: np.ndarray, is_max: bool) -> np.ndarray:
    """argmax / argmin along the last axis of a contiguous 2-d cpu array (`arg_rows_kernel`)."""
    rows, length = x.shape
    chunks = -(-length // ARG_CHUNK)
    dtype = tdtype(x.dtype)
    best = np.empty((rows, chunks), numpy_dtype(_lane_type(dtype)))
    index = np.empty((rows, chunks), np.int64)
    arg_rows_kernel(dtype, is_max)(x, best, index)
    if chunks == 1:
        return index[:, 0]
    # the first chunk holding the row's extreme (or its first NaN), as numpy's own argmax / argmin finds it
    winner = (np.argmax if is_max else np.argmin)(best, axis=1)
    return index[np.arange(rows), winner]


def _arg(x, axis, keepdims: bool, is_max: bool):
    x = contiguous(x)
    what = "argmax" if is_max else "argmin"
    keepdims = flag(keepdims, f"{what}: keepdims")
    if axis is None:
        out_shape = (1,) * x.ndim if keepdims else ()
        x, axis = x.reshape(-1), 0
    else:
        axis = normalize_axis(axis, x.ndim)
        out_shape = x.shape[:axis] + ((1,) if keepdims else ()) + x.shape[axis + 1:]
    if x.shape[axis] == 0:
        raise ValueError(f"attempt to get {what} of an empty sequence")
    outer = math.prod(x.shape[:axis])
    inner = math.prod(x.shape[axis + 1:])
    if inner == 1 and x.dtype != np.bool_ and get_target() == "cpu" and not on_device(x):
        return _arg_rows(x.reshape(outer, x.shape[axis]), is_max).reshape(out_shape)
    y = empty_like_operands((outer, inner), np.int64, x)
    arg_kernel(tdtype(x.dtype), is_max)(x.reshape(outer, x.shape[axis], inner), y)
    return y.reshape(out_shape)


def argmax(x, axis=None, keepdims: bool = False):
    """Indices (int64) of the first maximum along `axis` (None: of the flattened array)."""
    return _arg(x, axis, keepdims, True)


def argmin(x, axis=None, keepdims: bool = False):
    """Indices (int64) of the first minimum along `axis` (None: of the flattened array)."""
    return _arg(x, axis, keepdims, False)

