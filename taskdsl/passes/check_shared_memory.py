"""Reject a kernel whose blocks need more shared memory than any GPU gives a block.

Block and grid sizes are checked on every target, since a kernel tried on the cpu is meant to launch on a GPU;
this is the same check for shared memory, which the cpu target has without limit. A typo such as
`td.shared(f32, (1024, 1024))` for `(32, 32)` (4 MiB) would pass every cpu test and fail only at a GPU launch.
The limit is the largest any GPU has (sm_90's 227 KiB); a smaller GPU's own limit is checked at its launch.
"""
from __future__ import annotations

import math

from .. import ir
from ..errors import DSLError

MAX_SHARED_BYTES = 227 * 1024       # the opt-in shared memory per block of sm_90 (sm_80: 163 KiB, sm_86/89: 99 KiB)


def shared_bytes(buffer: ir.Buffer) -> int:
    """Bytes `buffer` takes in shared memory, rounded up to 16 as the CUDA code generator places buffers."""
    return -(-math.prod(d.value for d in buffer.shape) * max(1, buffer.dtype.bits // 8) // 16) * 16


def check_shared_memory(fn: ir.Function) -> ir.Function:
    """`fn`, or a DSLError at the `td.shared` call that takes its shared memory past MAX_SHARED_BYTES."""
    total = 0
    for alloc in ir.collect(fn.body, ir.Allocate, expressions=False):
        buffer = alloc.buffer
        if buffer.scope == "shared":
            total += shared_bytes(buffer)
            if total > MAX_SHARED_BYTES:
                shape = ", ".join(str(d.value) for d in buffer.shape)
                raise DSLError(f"the block's shared memory reaches {total} bytes here ({buffer.name}: "
                               f"{buffer.dtype.name}[{shape}]), past the {MAX_SHARED_BYTES} bytes (227 KiB) a block "
                               "can have on any GPU", alloc.loc)
    return fn
