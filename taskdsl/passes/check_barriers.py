"""Reject barriers and warp-wide operations that not every thread (of the block / warp) reaches."""
from __future__ import annotations

from .. import ir
from ..errors import DSLError
from .uniformity import THREAD, UNIFORM, WARP_FUNCS, Uniformity


def _warp_calls(s: ir.Stmt) -> list:
    """Warp shuffles evaluated by the statement itself (not by nested statements)."""
    fields = [getattr(s, f) for f in ("value", "expr", "cond", "start", "stop") if hasattr(s, f)]
    fields += list(getattr(s, "indices", ()))
    found = []
    for f in fields:
        if isinstance(f, ir.Expr):
            found += [c for c in ir.collect(f, ir.Call) if c.func in WARP_FUNCS]
    return found


def _warp_stmt_name(s: ir.Stmt) -> str | None:
    """The language's name of `s` if every lane of a warp executes it together, else None."""
    if isinstance(s, ir.Mma):
        return f"mma_m16n8k{s.k}"
    return {ir.SyncWarp: "syncwarp", ir.LdMatrix: "ldmatrix"}.get(type(s))


def check_barriers(fn: ir.Function) -> ir.Function:
    """Raise DSLError for a barrier under thread-dependent control flow, or a shuffle, syncwarp, mma
    or ldmatrix under lane-dependent control flow, or a shuffle in a while condition; return `fn` unchanged
    otherwise."""
    uniformity = Uniformity(fn)
    for s, level in uniformity.control_levels(fn):
        if isinstance(s, ir.SyncThreads) and level > UNIFORM:
            raise DSLError("'syncthreads()' inside a branch or loop that depends on threadIdx", s.loc,
                           "A barrier must be reached by every thread of the block.")
        name = _warp_stmt_name(s)
        if name is not None and level >= THREAD:
            raise DSLError(f"'{name}()' inside a branch or loop that differs between the lanes of a warp", s.loc,
                           "Every lane of a warp must reach it together.")
        if isinstance(s, (ir.Mma, ir.LdMatrix)) and fn.num_threads % 32:
            raise DSLError(f"'{name}()' needs whole warps, but the block has {fn.num_threads} threads", s.loc,
                           "Use a block whose thread count is a multiple of 32.")
        if isinstance(s, ir.While) and _warp_calls(s):    # rerun each iteration, by the lanes still in the loop
            raise DSLError("a warp shuffle in a while condition is not supported", s.loc,
                           "Compute it into a variable before the loop and at the end of its body.")
        if level >= THREAD and _warp_calls(s):
            raise DSLError(f"'{_warp_calls(s)[0].func}()' inside a branch or loop that differs between the lanes "
                           "of a warp", s.loc, "Every lane of a warp must reach a shuffle together.")
    return fn
