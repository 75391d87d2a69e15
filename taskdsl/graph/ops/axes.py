"""Axis arguments: negative axes, tuples of axes, and the errors for invalid ones."""
from __future__ import annotations

import numpy as np


def normalize_axis(axis, ndim: int, what: str) -> int:
    """A possibly negative axis as an index in [0, ndim) (ValueError / TypeError naming `what`)."""
    if isinstance(axis, bool) or not isinstance(axis, (int, np.integer)):
        raise TypeError(f"{what}: an axis must be an int, got {axis!r}")
    if not -ndim <= axis < ndim:
        raise ValueError(f"{what}: axis {axis} is out of range for a {ndim}-d tensor")
    return int(axis) % ndim


def normalize_axes(axes, ndim: int, what: str) -> tuple:
    """Sorted distinct axes in [0, ndim) from an int, a sequence, or None (= every axis)."""
    if axes is None:
        return tuple(range(ndim))
    axes = (axes,) if isinstance(axes, (int, np.integer)) else tuple(axes)
    out = tuple(sorted(normalize_axis(a, ndim, what) for a in axes))
    if len(set(out)) != len(out):
        raise ValueError(f"{what}: repeated axis in {axes!r}")
    return out
