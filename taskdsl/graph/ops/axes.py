"""Axis arguments: negative axes, tuples of axes, and the errors for invalid ones."""
from __future__ import annotations

import numpy as np

from stdlib_ops.elementwise import as_int


def normalize_axis(axis, ndim: int, what: str) -> int:
    """A possibly negative axis as an index in [0, ndim) (ValueError / TypeError naming `what`)."""
    axis = as_int(axis, f"{what}: an axis")
    if not -ndim <= axis < ndim:
        raise ValueError(f"{what}: axis {axis} is out of range for a {ndim}-d tensor")
    return axis % ndim


def normalize_axes(axes, ndim: int, what: str) -> tuple:
    """Sorted distinct axes in [0, ndim) from an int, a sequence, or None (= every axis)."""
    if axes is None:
        return tuple(range(ndim))
    axes = (axes,) if np.ndim(axes) == 0 else tuple(axes)
    out = tuple(sorted(normalize_axis(a, ndim, what) for a in axes))
    if len(set(out)) != len(out):
        raise ValueError(f"{what}: repeated axis in {axes!r}")
    return out
