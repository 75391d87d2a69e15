"""Kernel operands wherever they live: numpy arrays in host memory, `td.DeviceArray`s on the GPU.

The operator library (stdlib_ops) and the graph executor allocate each result where its
operands are, so a chain of operators on DeviceArrays stays on the GPU with no copies
between kernels (the graph executor on the cuda target), while numpy operands keep
giving numpy results.

`results_in(slots)` lets a caller decide where those results go: the graph executor hands
each operator the slots its memory plan gave the operator's outputs in one arena.
"""
from __future__ import annotations

import math
import threading
from contextlib import contextmanager

import numpy as np

from ..backend.cpu.launch import note_host_work
from ..backend.cuda.launch import DL_CPU
from ..ir.types import ML_DTYPES_NAMES
from .device_array import DeviceArray, to_device
from .device_array import empty as device_empty
from .host import empty_aligned


def on_device(*values) -> bool:
    """Whether any of `values` is a td.DeviceArray."""
    return any(isinstance(v, DeviceArray) for v in values)


def as_array(value):
    """`value` as an array: a DeviceArray as it is, another library's host array as a numpy view of its memory
    (`host_view`), anything else through np.asarray."""
    if isinstance(value, DeviceArray):
        return value
    view = host_view(value)
    return np.asarray(value) if view is None else view


def host_view(value) -> np.ndarray | None:
    """`value` as a numpy array over its memory (no copy: a kernel's writes reach it) where it is another library's
    host array with DLPack (a torch CPU tensor, ...): bf16, for which DLPack gives numpy no type, through its bits
    (np.asarray refused torch's bf16 tensors); None for anything else (numpy and GPU arrays, lists, scalars)."""
    if isinstance(value, (np.ndarray, DeviceArray)) or not hasattr(value, "__dlpack_device__"):
        return None
    if int(value.__dlpack_device__()[0]) != DL_CPU:
        return None
    try:
        if str(getattr(value, "dtype", "")) == "torch.bfloat16":
            import ml_dtypes
            import torch
            return np.from_dlpack(value.view(torch.int16)).view(ml_dtypes.bfloat16)
        return np.from_dlpack(value)
    except (BufferError, RuntimeError, TypeError) as e:     # e.g. a torch tensor that requires grad
        raise TypeError(f"a {type(value).__name__} could not be read as a numpy array through DLPack ({e}); pass a "
                        "numpy array (a torch tensor: x.detach().numpy())") from None


def conversion(value, dtype) -> str:
    """How to make `value` (an array, a DeviceArray, a list...) an array of numpy `dtype`, for an error message."""
    name = np.dtype(dtype).name
    name = f"ml_dtypes.{name}" if name in ML_DTYPES_NAMES.values() else f"np.{name}"
    if isinstance(value, DeviceArray):
        return f"stdlib_ops.cast(x, {name})"
    return f".astype({name})" if isinstance(value, np.ndarray) else f"np.asarray(x, {name})"


def contiguous(value, dtype=None):
    """`value` as a C-contiguous array of `dtype` (default: its own, in native byte order): a DeviceArray as it
    is (always contiguous; TypeError for another dtype, which would need a cast kernel), anything else as a
    numpy array (0-d stays 0-d, unlike np.ascontiguousarray)."""
    if isinstance(value, DeviceArray):
        if dtype is not None and np.dtype(dtype) != value.dtype:
            raise TypeError(f"a DeviceArray of {value.dtype} was given where {np.dtype(dtype)} is needed; "
                            "convert it before the call (stdlib_ops.cast)")
        return value
    a = np.asarray(value, dtype=dtype)
    if not a.dtype.isnative:        # big-endian data: kernels read native numbers
        a = a.astype(a.dtype.newbyteorder("="))
    if not a.flags.c_contiguous:
        a = np.ascontiguousarray(a)
    if a is not value and isinstance(value, np.ndarray) and a.base is not value:
        note_host_work("an operand was copied to be contiguous or of another dtype")
    return a


def empty_like_operands(shape, dtype, *operands):
    """An uninitialized result array: a DeviceArray if any operand is one, else a cache-line aligned
    numpy array (or a slot given to `results_in`)."""
    gpu = on_device(*operands)
    slot = _claim(shape, dtype, gpu)
    if slot is not None:
        return slot
    return device_empty(shape, dtype) if gpu else host_empty(shape, dtype)


SMALL_RESULT_BYTES = 4096   # host results below a page come from numpy as they are (16-byte aligned)


def host_empty(shape, dtype) -> np.ndarray:
    """A host result: cache-line aligned (`empty_aligned`) unless small, where a split line costs a few loads at
    most, and aligning costs 2-3 us of a tiny operator call's ~20."""
    dtype = np.dtype(dtype)
    small = math.prod((shape,) if isinstance(shape, (int, np.integer)) else shape) * dtype.itemsize < SMALL_RESULT_BYTES
    return np.empty(shape, dtype) if small else empty_aligned(shape, dtype)


def zeros_like_operands(shape, dtype, *operands):
    """A zero-filled result array, where `empty_like_operands` would put it."""
    out = empty_like_operands(shape, dtype, *operands)
    if isinstance(out, DeviceArray):
        return out.zero()
    if out.size:
        note_host_work("a result was zero-filled")
    out.fill(0)
    return out


_planned = threading.local()      # .slots: the unclaimed slots of the innermost results_in; .claimed


@contextmanager
def results_in(slots: list):
    """Inside, each result allocated by `empty_like_operands` / `zeros_like_operands` takes the first
    unclaimed array of `slots` (1-d numpy arrays or DeviceArrays) with its dtype, element count and
    placement, reshaped; other results are allocated as usual. Yields the list of claimed slots."""
    previous = getattr(_planned, "slots", None), getattr(_planned, "claimed", None)
    _planned.slots, _planned.claimed = list(slots), []
    try:
        yield _planned.claimed
    finally:
        _planned.slots, _planned.claimed = previous


@contextmanager
def unplanned():
    """Inside, results are allocated as usual, not in the slots of the enclosing `results_in` (intermediate
    results of an operator that runs as several)."""
    slots = getattr(_planned, "slots", None)
    _planned.slots = None
    try:
        yield
    finally:
        _planned.slots = slots


def _claim(shape, dtype, gpu: bool):
    """The slot of `results_in` that a result of this shape, dtype and placement takes, or None."""
    slots = getattr(_planned, "slots", None)
    if not slots:
        return None
    shape = (int(shape),) if isinstance(shape, (int, np.integer)) else tuple(int(n) for n in shape)
    dtype, size = np.dtype(dtype), math.prod(shape)
    for k, slot in enumerate(slots):
        if slot.dtype == dtype and slot.size == size and isinstance(slot, DeviceArray) == gpu:
            del slots[k]
            _planned.claimed.append(slot)
            return slot.reshape(shape)
    return None


def address(value) -> int:
    """The address of an array's first element: in GPU memory for a DeviceArray, else in host memory."""
    return value.ptr if isinstance(value, DeviceArray) else np.asarray(value).__array_interface__["data"][0]


def same_memory(a, b) -> bool:
    """Whether two arrays (numpy, DeviceArray) are one block of memory, element for element: contiguous, at one
    address, of one size (an output the memory plan put over an input, `plan_memory(in_place=True)`)."""
    if isinstance(a, DeviceArray) != isinstance(b, DeviceArray):
        return False
    contiguous = isinstance(a, DeviceArray) or (a.flags.c_contiguous and b.flags.c_contiguous)
    return contiguous and a.nbytes == b.nbytes and address(a) == address(b)


def copy_into(out, value) -> None:
    """Copy `value` (of `out`'s shape and dtype) into `out`, on the host or the GPU."""
    if isinstance(out, DeviceArray):
        out.copy_from(value)
    else:
        np.copyto(out, on_host(value))


def on_host(value):
    """A DeviceArray's contents as a numpy array (a copy: waits for the GPU); anything else as it is."""
    return value.numpy() if isinstance(value, DeviceArray) else value


def placed_like(operand, host: np.ndarray):
    """`host` (made on the host from `operand`'s values, say packed weights) where `operand` lives: a copy
    on the GPU for a DeviceArray operand, else `host` itself."""
    return to_device(host) if isinstance(operand, DeviceArray) else host


def check_indices(indices: np.ndarray, n: int, axis: int, what: str) -> None:
    """IndexError when host `indices` into an axis of size `n` hold one outside [-n, n) (negative ones count
    from the end); kernels would clamp it to the axis instead."""
    if indices.size and (indices.max() >= n or (indices.dtype.kind == "i" and indices.min() < -n)):
        bad = indices.max() if indices.max() >= n else indices.min()
        raise IndexError(f"{what}: index {bad} is out of range for axis {axis} of size {n}")


__all__ = ["note_host_work", "on_device", "as_array", "conversion", "contiguous", "empty_like_operands",
           "zeros_like_operands", "results_in", "unplanned", "address", "on_host", "placed_like", "check_indices"]
