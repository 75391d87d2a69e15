"""Hoisting an element's invariant subexpressions out of a generated kernel's loops.

An elementwise value such as a quantization's `rint(x[i] / scale) + zero`, where `scale` and `zero` are
computed from broadcast scalars (`where(hi == lo, 1, hi - lo) / 255`), repeats the same arithmetic at every
element. LLVM cannot move it out of the loop on its own: it would have to know that the loop's stores never
alias the scalars' loads. The schedule knows (the kernel writes one buffer), so it computes each such
subexpression once, into a local, ahead of the loops:

    invariant0 = where(hi[0] == lo[0], 1.0, hi[0] - lo[0]) / 255.0
    for i in span: out[i] = rint(x[i] / invariant0) + ...
"""
from __future__ import annotations

import dataclasses

from .. import ir
from ..passes.uniformity import WARP_FUNCS


def hoist_invariants(value: ir.Expr, written: ir.Buffer) -> tuple[list, ir.Expr]:
    """(assignments of the invariant subexpressions of `value` to fresh locals, `value` reading those locals).

    Invariant: no loop, thread or local variable (sizes and scalar parameters are fine), and loads only of
    constant indices inside constant shapes (a size-1 operand's element) of buffers other than `written`: the
    assignments run even where the loops run no element (a GPU block's threads past the end, an empty output),
    so they read nothing a loop would not. In a select's branches or the right operand of `and` / `or`, which
    only some elements evaluate, no integer division moves either (x86 traps on INT_MIN // -1): a zero point in a
    padding's border costs a select, not a division per element."""
    hoister = _Hoister(written)
    return hoister.assigns, hoister.visit(value)


def _invariant(e: ir.Expr, written: ir.Buffer, conditional: bool) -> bool:
    """Whether `e` has the same value at every element of a kernel that writes `written` and may be computed
    ahead of its loops (see above; `conditional`: in a branch only some elements take)."""
    for x in ir.collect(e, (ir.Var, ir.SpecialReg, ir.Load, ir.Call, ir.Binary)):
        if isinstance(x, ir.SpecialReg) or (isinstance(x, ir.Var) and x.kind not in ("size", "param")):
            return False
        if isinstance(x, ir.Load) and (x.buffer.uid == written.uid or not x.at_constant_element):
            return False
        if isinstance(x, ir.Call) and x.func in WARP_FUNCS:
            return False
        if conditional and isinstance(x, ir.Binary) and x.divides_integers:
            return False
    return True


class _Hoister(ir.Rewriter):
    def __init__(self, written: ir.Buffer):
        self.written = written
        self.assigns: list = []
        self.conditional = False      # inside a select's branch or the right operand of `and` / `or`

    def visit(self, node):
        if isinstance(node, ir.Expr) and _worth_hoisting(node) and _invariant(node, self.written, self.conditional):
            local = ir.Var(f"invariant{len(self.assigns)}", node.dtype)
            self.assigns.append(ir.Assign(local, node))
            return local
        return super().visit(node)

    def visit_Select(self, e: ir.Select):
        cond = self.visit(e.cond)
        a, b = self._conditionally(e.a), self._conditionally(e.b)
        return e if cond is e.cond and a is e.a and b is e.b else dataclasses.replace(e, cond=cond, a=a, b=b)

    def visit_Binary(self, e: ir.Binary):
        a = self.visit(e.a)
        b = self._conditionally(e.b) if e.op in ("and", "or") else self.visit(e.b)
        return e if a is e.a and b is e.b else dataclasses.replace(e, a=a, b=b)

    def _conditionally(self, e: ir.Expr) -> ir.Expr:
        """`e` rewritten as a value only some elements evaluate."""
        outer, self.conditional = self.conditional, True
        try:
            return self.visit(e)
        finally:
            self.conditional = outer


def _worth_hoisting(e: ir.Expr) -> bool:
    """Whether `e` reads memory: what LLVM cannot move out of the loop itself (a load may alias the loop's stores).
    Arithmetic of sizes alone stays where it is, in the index expressions the passes and codegen analyze."""
    return bool(ir.collect(e, ir.Load))
