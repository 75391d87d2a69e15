"""Reject `while` loops that can never end: a condition folded to true and no `break` in the body.

Such a loop hangs the GPU (and numba cannot compile the code after it), so it is reported where it
is written. It typically comes from a loop variable the body never updates (`while s > 0:` without
`s //= 2`), which constant folding turns into `while True:`.
"""
from __future__ import annotations

from .. import ir
from ..errors import DSLError


class _Breaks(ir.Visitor):
    """Finds a `break` of the loop being searched (not of loops nested in it)."""

    statements_only = True
    found = False

    def visit_Break(self, s: ir.Break):
        self.found = True

    def visit_For(self, s):       # a break in a nested loop leaves that loop only
        return None

    visit_While = visit_ForMapping = visit_For


class _EndlessLoops(ir.Visitor):
    statements_only = True

    def visit_While(self, s: ir.While):
        if isinstance(s.cond, ir.Const) and s.cond.value:
            breaks = _Breaks()
            breaks.visit(s.body)
            if not breaks.found:
                raise DSLError("this loop never ends: its condition is always true and its body has no 'break'",
                               s.loc, "Update the condition's variables in the body (e.g. 's //= 2'), or break.")
        self.generic_visit(s)


def check_loops(fn: ir.Function) -> ir.Function:
    """Raise DSLError for a `while` loop that never ends; return `fn` unchanged otherwise."""
    _EndlessLoops().visit(fn.body)
    return fn
