"""Kernel operands wherever they live: numpy arrays in host memory, `td.DeviceArray`s on the GPU.

The operator library (stdlib_ops) and the graph executor allocate each result where its
operands are, so a chain of operators on DeviceArrays stays on the GPU with no copies
between kernels (the graph executor on the cuda target), while numpy operands keep
giving numpy results.
"""
from __future__ import annotations

import numpy as np

from .device_array import DeviceArray, to_device
from .device_array import empty as device_empty
from .host import empty_aligned


def on_device(*values) -> bool:
    """Whether any of `values` is a td.DeviceArray."""
    return any(isinstance(v, DeviceArray) for v in values)


def as_array(value):
    """`value` as an array: a DeviceArray as it is, anything else through np.asarray."""
    return value if isinstance(value, DeviceArray) else np.asarray(value)


def contiguous(value, dtype=None):
    """`value` as a C-contiguous array of `dtype` (default: its own): a DeviceArray as it is (always
    contiguous; TypeError for another dtype, which would need a cast kernel), anything else as a numpy
    array (0-d stays 0-d, unlike np.ascontiguousarray)."""
    if isinstance(value, DeviceArray):
        if dtype is not None and np.dtype(dtype) != value.dtype:
            raise TypeError(f"a DeviceArray of {value.dtype} was given where {np.dtype(dtype)} is needed; "
                            "convert it before the call (stdlib_ops.cast)")
        return value
    a = np.asarray(value, dtype=dtype)
    return a if a.flags.c_contiguous else np.ascontiguousarray(a)


def empty_like_operands(shape, dtype, *operands):
    """An uninitialized result array: a DeviceArray if any operand is one, else a cache-line aligned
    numpy array."""
    return device_empty(shape, dtype) if on_device(*operands) else empty_aligned(shape, dtype)


def zeros_like_operands(shape, dtype, *operands):
    """A zero-filled result array, where `empty_like_operands` would put it."""
    out = empty_like_operands(shape, dtype, *operands)
    if isinstance(out, DeviceArray):
        return out.zero()
    out.fill(0)
    return out


def on_host(value):
    """A DeviceArray's contents as a numpy array (a copy: waits for the GPU); anything else as it is."""
    return value.numpy() if isinstance(value, DeviceArray) else value


def placed_like(operand, host: np.ndarray):
    """`host` (made on the host from `operand`'s values, say packed weights) where `operand` lives: a copy
    on the GPU for a DeviceArray operand, else `host` itself."""
    return to_device(host) if isinstance(operand, DeviceArray) else host


__all__ = ["on_device", "as_array", "contiguous", "empty_like_operands", "zeros_like_operands", "on_host", "placed_like"]
