"""Passes that fix a kernel to one call's shapes and flatten its tensors (the CUDA path)."""
from __future__ import annotations

import dataclasses
import math

from .. import ir
from ..ir import types as T
from .simplify import simplify_within


class _BufferRewriter(ir.Rewriter):
    """A Rewriter that maps each Buffer to a replacement once, so identity is preserved."""

    def __init__(self):
        self.buffers: dict = {}

    def new_buffer(self, b: ir.Buffer) -> ir.Buffer:
        return b

    def visit_buffer(self, b: ir.Buffer) -> ir.Buffer:
        if b.uid not in self.buffers:
            self.buffers[b.uid] = self.new_buffer(b)
        return self.buffers[b.uid]

    def run(self, fn: ir.Function) -> ir.Function:
        params = tuple(self.visit_buffer(p) if isinstance(p, ir.Buffer) else p for p in fn.params)
        return dataclasses.replace(fn, params=params, body=self.visit(fn.body))


class _BindSizes(_BufferRewriter):
    def __init__(self, sizes: dict):
        super().__init__()
        self.sizes = sizes

    def visit_Var(self, v: ir.Var):
        return ir.const(self.sizes[v.name], v.dtype) if v.kind == "size" else v

    def new_buffer(self, b):
        # a dim computed from symbols (`generalize`'s product of two) becomes its number
        return dataclasses.replace(b, shape=tuple(simplify_within(self.visit(d), {}) for d in b.shape))


def bind_sizes(fn: ir.Function, sizes: dict) -> ir.Function:
    """`fn` with each size symbol replaced by its value in `sizes` (name -> int), and the buffers' dims computed
    from them folded to numbers."""
    return dataclasses.replace(_BindSizes(sizes).run(fn), sizes=())


def linear_index(b: ir.Buffer, indices: tuple) -> ir.Expr:
    """The row-major linear index of `b[indices]`; missing trailing indices are 0 (a sub-tensor's first element).
    In i64 when `b`'s shape is known and it has more than 2^31 - 1 elements (an i32 index would overflow)."""
    indices = tuple(indices) + (0,) * (len(b.shape) - len(indices))
    if not indices:          # a 0-d tensor: its single element
        return ir.const(0)
    linear = ir.as_expr(indices[0])
    if all(isinstance(d, ir.Const) for d in b.shape) and not T.i32.holds(math.prod(d.value for d in b.shape)):
        linear = ir.convert(linear, T.i64)
    for dim, i in zip(b.shape[1:], indices[1:]):
        linear = linear * dim + i
    return linear


class _Flatten(ir.Rewriter):
    def _linear(self, b: ir.Buffer, indices: tuple) -> tuple:
        return (linear_index(b, indices),)

    def visit_Load(self, e):
        e = self.generic_visit(e)
        return dataclasses.replace(e, indices=self._linear(e.buffer, e.indices))

    def visit_Store(self, s):
        s = self.generic_visit(s)
        return dataclasses.replace(s, indices=self._linear(s.buffer, s.indices))

    def visit_Atomic(self, e):
        e = self.generic_visit(e)
        return dataclasses.replace(e, indices=self._linear(e.buffer, e.indices))

    def visit_Ref(self, e):
        e = self.generic_visit(e)
        return dataclasses.replace(e, indices=self._linear(e.buffer, e.indices))


def flatten_buffers(fn: ir.Function) -> ir.Function:
    """`fn` with every tensor access turned into a row-major linear index (1-D addressing)."""
    return dataclasses.replace(fn, body=_Flatten().visit(fn.body))
