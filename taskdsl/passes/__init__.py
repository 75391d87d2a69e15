"""The lowering pipeline, read top to bottom.

Common to every target:  expand_mappings -> simplify -> check_barriers -> check_loops.
CUDA then specializes:   bind_sizes -> mark_tile_loops -> flatten_buffers -> emulate_dot4 -> simplify -> check_loops
                         (sizes may fold a loop's test; loops indexing register tiles are marked for unrolling;
                         dot4, the cpu's byte dot products, becomes plain arithmetic).
Both targets end with split_deep_expressions (generated code must nest within its compilers' limits).
The cpu target keeps sizes symbolic (one numba compile serves every shape) and gives async-copy and
tensor-core instructions their plain meaning on flattened IR (one linear index where n-d addressing would
carry several through their exchanges: numba's compile time grows with code size):
                         unroll_loops -> outline -> simplify -> flatten_buffers -> simplify
                         -> emulate_async_copies -> emulate_tensor_cores -> simplify -> check_loops
(outline: the bodies of `@td.func(outline=True)` calls become functions of their own, lowered on alike; before
the kernel is simplified, so that facts of its fixed sizes leave the bodies of kernels of other shapes alike), except
in debug mode, which keeps n-d accesses so each index can be checked per axis (it only emulates and inlines, dot4
too), and with fast compilation, which skips unroll_loops. Otherwise dot4 stays for the code generator
(`rt.dot4`: vpdpbusd where the host has it, its plain arithmetic elsewhere). CUDA inlines outlined bodies first.
Blocks are then split at barriers in `backend/cpu/fission.py`.
"""
from __future__ import annotations

import dataclasses

from .. import ir
from .check_barriers import check_barriers
from .check_loops import check_loops
from .emulate_async_copies import emulate_async_copies
from .emulate_dot4 import emulate_dot4
from .emulate_tensor_cores import emulate_tensor_cores
from .expand_mappings import expand_mappings
from .outline import inline_outlined, outline
from .simplify import simplify, simplify_within
from .specialize import bind_sizes, flatten_buffers
from .split_deep import split_deep_expressions
from .unroll import mark_tile_loops, unroll_loops

COMMON_PIPELINE = (expand_mappings, simplify, check_barriers, check_loops)


def lower(fn: ir.Function) -> ir.Function:
    """The target-independent lowering of a kernel."""
    for p in COMMON_PIPELINE:
        fn = p(fn)
    return fn


def lower_for_cuda(fn: ir.Function, sizes: dict) -> ir.Function:
    """A lowered kernel fixed to `sizes` with 1-D addressing, as the CUDA code generator wants it."""
    fn = mark_tile_loops(bind_sizes(inline_outlined(fn), sizes))
    return split_deep_expressions(check_loops(simplify(emulate_dot4(flatten_buffers(fn), flat=True))))


def lower_for_cpu(fn: ir.Function, debug: bool, unroll: bool = True, early_copies: bool = False) -> ir.Function:
    """A lowered kernel prepared for the numba code generator (n-d accesses kept in debug mode); `early_copies`:
    cp_async copies land at issue (`td.cp_async_early`)."""
    if debug:
        return split_deep_expressions(emulate_dot4(emulate_tensor_cores(emulate_async_copies(
            inline_outlined(fn), early=early_copies))))
    fn = simplify(outline(unroll_loops(fn) if unroll else fn))
    return dataclasses.replace(_flat_for_cpu(fn, early_copies),
                               outlined=tuple(_flat_for_cpu(f, early_copies) for f in fn.outlined))


def _flat_for_cpu(fn: ir.Function, early_copies: bool) -> ir.Function:
    fn = simplify(flatten_buffers(fn))
    emulated = emulate_tensor_cores(emulate_async_copies(fn, flat=True, early=early_copies), flat=True)
    if emulated.body is not fn.body:    # folds the emulation's thread and lane arithmetic
        fn = simplify(emulated)
    return split_deep_expressions(check_loops(fn))
