"""Fully unroll loops with constant bounds and small, branch-poor bodies that index register tiles.

The CUDA compiler does this itself; the cpu target needs it done in the IR so that
register-tile indices become constants (the cpu code generator then keeps those elements
in locals) and LLVM's SLP vectorizer sees straight-line code. A loop whose variable reaches no
register tile's index stays a loop (unless written `td.unroll`): LLVM vectorizes it as one,
where its unrolled copies, a fused epilogue's selects and stores, defeated the SLP vectorizer
(a depthwise conv's clipped 28-column store ran 1.7x slower unrolled). Each copy gets its own
variables for the values it defines (when nothing outside the loop reads them): names
assigned once kept numba's SSA reconstruction, then a large share of its compile time, cheap
(the cpu target now compiles kernels without it: `backend/cpu/support.KernelCompiler`).
"""
from __future__ import annotations

import dataclasses
import math
from collections import Counter

from .. import ir

MAX_COPIES = 256   # statements one unrolled loop nest may produce
MAX_BRANCHES = 8   # `if`s it may produce: each is a few basic blocks, and numba's compile time
                   # grows faster than linearly in blocks (a fused 8x8 epilogue of guarded
                   # stores, unrolled, took 60 s to compile instead of 20 s, and ran no faster)
# Statements that count as an `if`: this pass runs before the cpu target emulates them, and each emulation is
# loops or an `if` (and, for mma and ldmatrix, a warp exchange: a fission region). A 16-step k loop of ldmatrix
# and mma, unrolled, took 64 s to compile instead of 5.
BRANCHING = (ir.If, ir.Mma, ir.LdMatrix, ir.CpAsync)
MAX_TILE = 1024    # elements of the largest register buffer that counts as a tile (the cpu code
                   # generator can keep in locals): a bigger one is a scratch array, indexed at run time
MAX_NODES = 4096   # expression nodes it may produce: a few statements can hold big expressions (a 3-d
                   # average pool's 120 window elements, each with its bounds and count, made 26k nodes
                   # and a 75 s compile); the zoo models' largest unrolled nest has 1.4k


def unroll_loops(fn: ir.Function, max_copies: int = MAX_COPIES) -> ir.Function:
    """`fn` with each For of constant bounds replaced by copies of its body, up to `max_copies` statements."""
    return dataclasses.replace(fn, body=_Unroller(max_copies, _var_counts(fn.body), _tiles(fn)).visit(fn.body))


def mark_tile_loops(fn: ir.Function) -> ir.Function:
    """`fn` with each For of constant bounds whose variable reaches a register tile's index marked `unroll`.

    For the CUDA compiler: a register array indexed at run time lives in local memory (a SIMT matmul's
    accumulators were, at a 320-byte stack frame), so these loops must be unrolled by it, not left to its
    heuristics.
    """
    tiles = _tiles(fn)

    class Marker(ir.Rewriter):
        def visit_For(self, s: ir.For):
            body = self.visit(s.body)
            trips = _constant_trips(s)
            marks = not s.unroll and trips is not None and _indexes_tiles(s, tiles) and \
                trips * _unrolled_size(body) <= MAX_MARKED
            if body is s.body and not marks:
                return s
            return dataclasses.replace(s, body=body, unroll=s.unroll or marks)

    return dataclasses.replace(fn, body=Marker().visit(fn.body))


MAX_MARKED = 1024   # statements a loop nest marked for the CUDA compiler to unroll may become


def _unrolled_size(s) -> int:
    """Statements `s` becomes once its loops marked `unroll` (with constant bounds) are unrolled."""
    if isinstance(s, ir.Seq):
        return sum(_unrolled_size(x) for x in s.stmts)
    if isinstance(s, ir.If):
        return 1 + _unrolled_size(s.then) + (_unrolled_size(s.orelse) if s.orelse is not None else 0)
    if isinstance(s, ir.For):
        trips = _constant_trips(s) if s.unroll else None
        return (1 if trips is None else trips) * _unrolled_size(s.body)
    if isinstance(s, ir.While):
        return _unrolled_size(s.body)
    return 1


def _constant_trips(loop: ir.For) -> int | None:
    """The trip count of a For with constant bounds and step, else None."""
    if all(isinstance(x, ir.Const) for x in (loop.start, loop.stop, loop.step)):
        return len(range(loop.start.value, loop.stop.value, loop.step.value))
    return None


def _tiles(fn: ir.Function) -> set:
    """Uids of the register buffers small enough to be kept in registers (cuda) or locals (cpu)."""
    return {a.buffer.uid for a in ir.collect(fn.body, ir.Allocate, expressions=False)
            if a.buffer.scope == "register" and math.prod(d.value for d in a.buffer.shape) <= MAX_TILE}


def _indexes_tiles(loop: ir.For, tiles: set) -> bool:
    """Whether the loop's variable reaches an index of a register tile (`tiles`): directly or through
    variables the body assigns from it."""
    reaching = {loop.var.uid}
    assigns = ir.collect(loop.body, ir.Assign, expressions=False)
    grew = True
    while grew:
        grew = False
        for a in assigns:
            if a.var.uid not in reaching and any(v.uid in reaching for v in ir.collect(a.value, ir.Var)):
                reaching.add(a.var.uid)
                grew = True
    return any(v.uid in reaching for a in ir.collect(loop.body, ir.ELEMENT_ACCESSES) if a.buffer.uid in tiles
               for i in a.indices for v in ir.collect(i, ir.Var))


def _var_counts(s) -> Counter:
    return Counter(v.uid for v in ir.collect(s, ir.Var))


def _copies(s) -> int:
    """How many copies of its innermost statements an already unrolled tree holds (a size measure)."""
    return max(1, len(ir.collect(s, (ir.Store, ir.Assign), expressions=False)))


def _top_level(s) -> list:
    return [x for y in s.stmts for x in _top_level(y)] if isinstance(s, ir.Seq) else [s]


def _copy_locals(body, inside_only: set) -> list:
    """Variables of `body` that each unrolled copy may rename: assigned at its top level before any
    read, and never mentioned outside the loop (`inside_only`)."""
    defined, shared = {}, set()
    for st in _top_level(body):
        value = st.value if isinstance(st, ir.Assign) else st
        shared.update(v.uid for v in ir.collect(value, ir.Var) if v.uid not in defined)
        if isinstance(st, ir.Assign) and st.var.uid not in shared:
            defined.setdefault(st.var.uid, st.var)
    return [v for uid, v in defined.items() if uid in inside_only and uid not in shared]


class _Unroller(ir.Rewriter):
    statements_only = True

    def __init__(self, max_copies: int, counts: Counter, tiles: set):
        self.max_copies = max_copies
        self.counts = counts      # mentions of each variable in the whole function
        self.tiles = tiles        # uids of the register buffers small enough to live in locals
        self.fresh: set = set()   # variables made for unrolled copies: mentioned only in their copy

    def visit_For(self, s: ir.For):
        unrolls = _constant_trips(s) is not None and (s.unroll or _indexes_tiles(s, self.tiles))
        # counted on the body as written: copies of inner loops only multiply its mentions
        inside_only = {uid for uid, n in _var_counts(s.body).items() if n == self.counts[uid]} if unrolls else set()
        body = self.visit(s.body)
        s = s if body is s.body else dataclasses.replace(s, body=body)
        if not unrolls:
            return s
        inside_only |= self.fresh
        trips = range(s.start.value, s.stop.value, s.step.value)
        too_big = (len(trips) * _copies(body) > self.max_copies
                   or len(trips) * len(ir.collect(body, BRANCHING, expressions=False)) > MAX_BRANCHES
                   or len(trips) * len(ir.collect(body, ir.Expr)) > MAX_NODES)
        if too_big or any(isinstance(x, (ir.Break, ir.Continue)) for x in _loop_jumps(body)):
            return s
        local = _copy_locals(body, inside_only)

        def copy(t):
            fresh = {v.uid: ir.Var(v.name, v.dtype, v.kind) for v in local}
            self.fresh.update(v.uid for v in fresh.values())
            return ir.substitute(body, {s.var.uid: ir.const(t, s.var.dtype), **fresh})

        return ir.seq([copy(t) for t in trips]) if trips else ir.Seq(())


def _loop_jumps(s):
    """Break/continue statements of this loop level (not of nested loops)."""
    if isinstance(s, (ir.Break, ir.Continue)):
        yield s
    elif isinstance(s, ir.Seq):
        for x in s.stmts:
            yield from _loop_jumps(x)
    elif isinstance(s, ir.If):
        yield from _loop_jumps(s.then)
        if s.orelse is not None:
            yield from _loop_jumps(s.orelse)
