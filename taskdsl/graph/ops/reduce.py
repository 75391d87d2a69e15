"""Reductions over any axes: sum, mean, max, min, prod (keepdims optional), and global average pooling."""
from __future__ import annotations

from ...compute import compute
from ...compute import reduce as reduction
from ...ir import Cast
from ...ir import types as T
from ..operator import Operator, dims
from .axes import normalize_axes

REDUCTIONS = ("sum", "mean", "max", "min", "prod")


def reduced_shape(shape: tuple, axes: tuple, keepdims: bool) -> tuple:
    """The shape left after reducing `axes` of `shape` (reduced axes kept as 1s with keepdims)."""
    return tuple(1 if a in axes else n for a, n in enumerate(shape) if keepdims or a not in axes)


class Reduce(Operator):
    """`op` over `axes` of the input; the result keeps the input's dtype. attrs: op, axes, keepdims."""

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
        self.attrs["axes"] = normalize_axes(self.attrs["axes"], x.ndim, self.kind)

    def define(self, x):
        shape, axes, keepdims = dims(x), self.attrs["axes"], self.attrs["keepdims"]
        out_shape = reduced_shape(shape, axes, keepdims)
        boolean = x.dtype.is_bool

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
            return Cast(value, T.i32) if boolean else value

        name = self.kind
        r = reduction(name, out_shape, tuple(shape[a] for a in axes), fcompute, op=self.attrs["op"],
                           dtype=T.i32 if boolean else x.dtype)
        if boolean:    # max = any, min = all; `> 0` maps the empty identities (INT_MIN / INT_MAX) to False / True
            return [compute(f"{name}_bool", out_shape, lambda *ix: r[ix] > 0)]
        return [r]


def _reduce(op: str, x, axis, keepdims: bool):
    if axis is not None and not isinstance(axis, int) and len(tuple(axis)) == 0:
        return x
    return Reduce([x], {"op": op, "axes": axis, "keepdims": bool(keepdims)}).outputs[0]


def sum(x, axis=None, keepdims: bool = False):
    """The sum over `axis` (an int, a sequence, or None for every axis)."""
    return _reduce("sum", x, axis, keepdims)


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
