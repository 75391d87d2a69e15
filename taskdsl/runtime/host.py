"""Host memory for kernel operands: numpy arrays aligned to cache lines.

numpy aligns its allocations to 16 bytes only. A cpu kernel's 32-byte vector loads from an
array at 16 mod 32 split a cache line every other load, which cost the cpu matmul a fifth of
its speed (docs/benchmarks.md, session 9): outputs and packed operands that kernels read
with vector loads are allocated here instead.
"""
from __future__ import annotations

import ctypes
import math

import numpy as np

CACHE_LINE = 64


def empty_aligned(shape, dtype) -> np.ndarray:
    """An uninitialized C-contiguous array whose first element starts a 64-byte cache line."""
    shape = (shape,) if isinstance(shape, (int, np.integer)) else tuple(shape)
    dtype = np.dtype(dtype)
    if any(n < 0 for n in shape):
        raise ValueError(f"negative dimensions are not allowed: {shape}")     # numpy's own words
    raw = np.empty(math.prod(shape) * dtype.itemsize + CACHE_LINE, np.uint8)
    # the address through ctypes' buffer view (0.4 us), not `raw.ctypes.data` (1 us); one constructor, not a slice,
    # a view and a reshape: a small graph's output took 3.3 us here, 1.2 now
    start = -ctypes.addressof(ctypes.c_char.from_buffer(raw)) % CACHE_LINE
    return np.ndarray(shape, dtype, raw, start)


__all__ = ["empty_aligned", "CACHE_LINE"]
