"""Axis arguments: negative axes, tuples of axes, and the errors for invalid ones."""
from __future__ import annotations

import operator

import numpy as np


def normalize_axis(axis, ndim: int, what: str) -> int:
    """A possibly negative axis as an index in [0, ndim) (ValueError / TypeError naming `what`)."""
    axis = as_int(axis, f"{what}: an axis")
    if not -ndim <= axis < ndim:
        raise ValueError(f"{what}: axis {axis} is out of range for a {ndim}-d tensor")
    return axis % ndim


def as_int(value, what: str) -> int:
    """`value`, an integer (a numpy one, a 0-d integer array), as a Python int; TypeError naming `what` for a
    bool, a float or anything else (`int()` would truncate 1.5 and take "1")."""
    try:
        if isinstance(value, (bool, np.bool_)):
            raise TypeError
        return operator.index(value)
    except TypeError:
        raise TypeError(f"{what} must be an int, got {value!r}") from None


def normalize_axes(axes, ndim: int, what: str) -> tuple:
    """Sorted distinct axes in [0, ndim) from an int, a sequence, or None (= every axis)."""
    if axes is None:
        return tuple(range(ndim))
    axes = (axes,) if np.ndim(axes) == 0 else tuple(axes)
    out = tuple(sorted(normalize_axis(a, ndim, what) for a in axes))
    if len(set(out)) != len(out):
        raise ValueError(f"{what}: repeated axis in {axes!r}")
    return out
