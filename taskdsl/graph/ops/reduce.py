"""Reductions over any axes: sum, mean, max, min, prod (keepdims optional), and global average pooling."""
from __future__ import annotations

import math

import numpy as np

from stdlib_ops.elementwise import flag

from ...compute import compute
from ...compute import reduce as reduction
from ...ir import Cast, Select, binary, const, convert
from ...ir import types as T
from ..operator import Operator, dims
from .axes import normalize_axes, normalize_axis
from .elementwise import cast
from .transform import reshape

REDUCTIONS = ("sum", "mean", "max", "min", "prod")


def reduced_shape(shape: tuple, axes: tuple, keepdims: bool) -> tuple:
    """The shape left after reducing `axes` of `shape` (reduced axes kept as 1s with keepdims)."""
    return tuple(1 if a in axes else n for a, n in enumerate(shape) if keepdims or a not in axes)


class Reduce(Operator):
    """`op` over `axes` of the input; the result keeps the input's dtype, but for a sum given a `dtype` (its
    elements converted to it: 8-bit integers summed in int32 with no widened copy). attrs: op, axes, keepdims and,
    optional, dtype."""

    kind_attr = "op"
    generic = True

    @property
    def kind(self) -> str:
        return f"reduce_{self.attrs['op']}"

    def check(self):
        x, op = self.inputs[0], self.attrs["op"]
        if len(self.inputs) != 1:
            raise TypeError(f"{self.kind} takes one input, got {len(self.inputs)}")
        if op not in REDUCTIONS:
            raise ValueError(f"unknown reduction {op!r}; use one of {', '.join(REDUCTIONS)}")
        if x.dtype.is_bool and op not in ("max", "min"):
            raise TypeError(f"reduce_{op} is not defined on bool tensors; cast them first")
        if self.attrs.get("dtype") is not None:
            if op != "sum":
                raise TypeError(f"{self.kind}: dtype= is for sums only")
            self.attrs["dtype"] = T.as_dtype(self.attrs["dtype"], f"{self.kind}'s dtype").name
        self.attrs["axes"] = normalize_axes(self.attrs["axes"], x.ndim, self.kind)

    def define(self, x):
        shape, axes, keepdims = dims(x), self.attrs["axes"], self.attrs["keepdims"]
        out_shape = reduced_shape(shape, axes, keepdims)
        boolean = x.dtype.is_bool
        value_dtype = T.i32 if boolean else T.as_dtype(self.attrs.get("dtype") or x.dtype)

        def fcompute(*ix):
            kept, red = list(ix[:len(out_shape)]), list(ix[len(out_shape):])
            index = []
            for a in range(len(shape)):
                if a in axes:
                    index.append(red.pop(0))
                    if keepdims:
                        kept.pop(0)
                else:
                    index.append(kept.pop(0))
            value = x[tuple(index)]
            return value if value_dtype == x.dtype else Cast(value, value_dtype)

        name = self.kind
        r = reduction(name, out_shape, tuple(shape[a] for a in axes), fcompute, op=self.attrs["op"],
                      dtype=value_dtype)
        if boolean:    # max = any, min = all; `> 0` maps the empty identities (INT_MIN / INT_MAX) to False / True
            return [compute(f"{name}_bool", out_shape, lambda *ix: r[ix] > 0)]
        return [r]


def _reduce(op: str, x, axis, keepdims: bool, dtype=None):
    keepdims = flag(keepdims, f"{op}: keepdims")
    if axis is not None and np.ndim(axis) == 1 and len(axis) == 0:
        return x if dtype is None else cast(x, dtype)
    attrs = {"op": op, "axes": axis, "keepdims": keepdims}
    return Reduce([x], attrs if dtype is None else dict(attrs, dtype=dtype)).outputs[0]


def sum(x, axis=None, keepdims: bool = False, dtype=None):
    """The sum over `axis` (an int, a sequence, or None for every axis); `dtype`, as numpy's: the sum's type, each
    element converted to it first."""
    return _reduce("sum", x, axis, keepdims, dtype)


def mean(x, axis=None, keepdims: bool = False):
    """The mean over `axis`."""
    return _reduce("mean", x, axis, keepdims)


def max(x, axis=None, keepdims: bool = False):
    """The maximum over `axis`."""
    return _reduce("max", x, axis, keepdims)


def min(x, axis=None, keepdims: bool = False):
    """The minimum over `axis`."""
    return _reduce("min", x, axis, keepdims)


def prod(x, axis=None, keepdims: bool = False):
    """The product over `axis`."""
    return _reduce("prod", x, axis, keepdims)


def global_avg_pool(x):
    """The mean over every axis after the first two (N, C, ...) -> (N, C, 1, ...)."""
    if x.ndim < 3:
        raise ValueError(f"global_avg_pool needs an (N, C, spatial...) tensor, got shape {x.shape}")
    return _reduce("mean", x, tuple(range(2, x.ndim)), True)


def global_max_pool(x):
    """The maximum over every axis after the first two."""
    if x.ndim < 3:
        raise ValueError(f"global_max_pool needs an (N, C, spatial...) tensor, got shape {x.shape}")
    return _reduce("max", x, tuple(range(2, x.ndim)), True)


ARG_REDUCTIONS = {"argmax": "max", "argmin": "min"}


class ArgReduce(Operator):
    """The int64 index of the largest (argmax) / smallest (argmin) element along `axis`: the first one, or with
    `select_last_index` the last; NaN counts as the extreme, as in numpy. attrs: op, axis, keepdims,
    select_last_index."""

    kind_attr = "op"
    generic = True

    @property
    def kind(self) -> str:
        return self.attrs["op"]

    def check(self):
        x, op = self.inputs[0], self.attrs["op"]
        if len(self.inputs) != 1:
            raise TypeError(f"{op} takes one input, got {len(self.inputs)}")
        if op not in ARG_REDUCTIONS:
            raise ValueError(f"unknown arg reduction {op!r}; use argmax or argmin")
        if x.ndim == 0:
            raise ValueError(f"{op} needs a tensor with at least one axis")
        (self.attrs["axis"],) = normalize_axes(self.attrs["axis"], x.ndim, op)
        if x.shape[self.attrs["axis"]] == 0:
            raise ValueError(f"{op} over an empty axis {self.attrs['axis']} of shape {x.shape} has no index")

    def define(self, x):
        shape, axis, keepdims = dims(x), self.attrs["axis"], self.attrs["keepdims"]
        out_shape = reduced_shape(shape, (axis,), keepdims)
        n, last = shape[axis], self.attrs["select_last_index"]

        def element(ix, k):
            kept = list(ix)
            if keepdims:
                kept.pop(axis)
            return x[tuple(kept[:axis]) + (k,) + tuple(kept[axis:])]

        value_dtype = T.i32 if x.dtype.is_bool else x.dtype
        extreme = reduction(f"{self.kind}_value", out_shape, (n,),
                            lambda *ix: convert(element(ix[:-1], ix[-1]), value_dtype), op=ARG_REDUCTIONS[self.kind],
                            dtype=value_dtype)

        def position(*ix):
            out, k = ix[:-1], ix[-1]
            v, e = convert(element(out, k), value_dtype), extreme[out]
            hit = binary("==", v, e)
            if value_dtype.is_float:      # NaN is the extreme: max / min propagate it, and it equals itself here
                hit = binary("or", hit, binary("and", binary("!=", v, v), binary("!=", e, e)))
            k64 = Cast(k, T.i64)
            miss = const(-1, T.i64) if last else const(n, T.i64) if isinstance(n, int) else convert(n, T.i64)
            return Select(hit, k64, miss, T.i64)

        return [reduction(self.kind, out_shape, (n,), position, op="max" if last else "min", dtype=T.i64)]


def argmax(x, axis: int = 0, keepdims: bool = False, select_last_index: bool = False):
    """The int64 index of the first (or last) largest element along `axis`."""
    return _arg_reduce("argmax", x, axis, keepdims, select_last_index)


def argmin(x, axis: int = 0, keepdims: bool = False, select_last_index: bool = False):
    """The int64 index of the first (or last) smallest element along `axis`."""
    return _arg_reduce("argmin", x, axis, keepdims, select_last_index)


def _arg_reduce(op: str, x, axis: int, keepdims: bool, last: bool):
    """ArgReduce over the middle axis of x viewed as (outer, axis, inner), reshaped back: every axis and rank
    shares one pair of kernels (a reshape is a view)."""
    if x.ndim == 0:
        raise ValueError(f"{op} needs a tensor with at least one axis")
    axis = normalize_axis(axis, x.ndim, op)
    keepdims, last = flag(keepdims, f"{op}: keepdims"), flag(last, f"{op}: select_last_index")
    outer, inner = math.prod(x.shape[:axis]), math.prod(x.shape[axis + 1:])
    view = reshape(x, (outer, x.shape[axis], inner))
    y = ArgReduce([view], {"op": op, "axis": 1, "keepdims": True, "select_last_index": last}).outputs[0]
    return reshape(y, reduced_shape(x.shape, (axis,), keepdims))
