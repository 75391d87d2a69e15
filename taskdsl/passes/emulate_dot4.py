"""Replace dot4 by plain IR: its meaning on a GPU and in the cpu's debug mode, whose accesses are checked (an
optimized cpu kernel calls `rt.dot4`: vpdpbusd, or the same sums where the host lacks it).

Each lane l becomes `acc[l] = acc[l] + a[0] * b[4l] + ... + a[3] * b[4l + 3]` in i32, the bytes widened first
(u8 a, i8 b: every product and sum of four fits, and the accumulation wraps as the instruction's does).
"""
from __future__ import annotations

import dataclasses

from .. import ir
from ..ir import types as T


def emulate_dot4(fn: ir.Function, flat: bool = False) -> ir.Function:
    """`fn` with every dot4 replaced by loads and stores; `flat`: `fn` was flattened (each Ref's one index is
    linear)."""
    body = _Emulator(flat).visit(fn.body)
    return fn if body is fn.body else dataclasses.replace(fn, body=body)


class _Emulator(ir.Rewriter):
    statements_only = True

    def __init__(self, flat: bool):
        self.flat = flat

    def visit_Dot4(self, s: ir.Dot4) -> ir.Stmt:
        widened = lambda ref, k: ir.Cast(ir.Load(ref.buffer, ref.element(k, self.flat)), T.i32)    # noqa: E731
        stores = []
        for lane in range(s.lanes):
            index = s.acc.element(lane, self.flat)
            total = ir.Load(s.acc.buffer, index)
            for q in range(4):
                total = total + widened(s.a, q) * widened(s.b, 4 * lane + q)
            stores.append(ir.Store(s.acc.buffer, index, total, s.loc))
        return ir.seq(stores)
