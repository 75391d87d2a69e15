"""Inlining injective definitions into their consumers (compute_inline)."""
from __future__ import annotations

from .. import ir
from ..compute import _OWNER


def inline_injective(body: ir.Expr, inline: set) -> ir.Expr:
    """`body` with every load of a tensor in `inline` (ids of injective Tensors) replaced by its definition."""
    return _Inliner(inline).visit(body)


class _Inliner(ir.Rewriter):
    def __init__(self, inline: set):
        self.inline = inline

    def visit_Load(self, e: ir.Load):
        e = self.generic_visit(e)
        producer = _OWNER.get(e.buffer.uid)
        if producer is None or id(producer) not in self.inline:
            return e
        return self.visit(ir.substitute(producer.body, {a.uid: i for a, i in zip(producer.axes, e.indices)}))
