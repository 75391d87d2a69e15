"""The lowering pipeline, read top to bottom.

Common to every target:  expand_mappings -> simplify -> check_barriers.
CUDA then specializes:   bind_sizes -> flatten_buffers -> simplify.
The cpu target keeps sizes symbolic and multi-dimensional accesses (numba indexes
n-d arrays directly), and splits blocks at barriers in `backend/cpu/fission.py`.
"""
from __future__ import annotations

from .. import ir
from .check_barriers import check_barriers
from .expand_mappings import expand_mappings
from .simplify import simplify
from .specialize import bind_sizes, flatten_buffers

COMMON_PIPELINE = (expand_mappings, simplify, check_barriers)


def lower(fn: ir.Function) -> ir.Function:
    """The target-independent lowering of a kernel."""
    for p in COMMON_PIPELINE:
        fn = p(fn)
    return fn


def lower_for_cuda(fn: ir.Function, sizes: dict) -> ir.Function:
    """A lowered kernel fixed to `sizes` with 1-D addressing, as the CUDA code generator wants it."""
    return simplify(flatten_buffers(bind_sizes(fn, sizes)))
