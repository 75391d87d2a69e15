"""Constant folding and the algebraic identities index arithmetic needs.

Folds operations on literals (with the DSL's Python semantics: `//` and `%` floor), drops
`x + 0`, `x * 1`, `x // 1`, removes `% c` and `// c` when the operand's range makes them
no-ops, picks the side of an integer `min` / `max` that the operands' ranges decide, and
keeps only the taken branch of an `if` on a constant.
"""
from __future__ import annotations

import dataclasses
import math
import operator

import numpy as np

from .. import ir
from .bounds import int_range

_FOLD = {"+": operator.add, "-": operator.sub, "*": operator.mul, "/": operator.truediv, "//": operator.floordiv,
         "%": operator.mod, "<": operator.lt, "<=": operator.le, ">": operator.gt, ">=": operator.ge,
         "==": operator.eq, "!=": operator.ne, "&": operator.and_, "|": operator.or_, "^": operator.xor,
         "<<": operator.lshift, ">>": operator.rshift}
# numpy's f32 // and % are Python's float divmod computed in f32, as the cpu and cuda targets compute them
_F32_FOLD = {"+": np.add, "-": np.subtract, "*": np.multiply, "/": np.true_divide, "//": np.floor_divide,
             "%": np.mod}


def simplify(fn: ir.Function) -> ir.Function:
    """`fn` with constant expressions folded and trivial arithmetic removed."""
    return dataclasses.replace(fn, body=_Simplifier(fn.block, single_assignments(fn.body)).visit(fn.body))


def simplify_within(e: ir.Expr, ranges: dict) -> ir.Expr:
    """Expression `e` simplified knowing the inclusive (lo, hi) range of each variable in `ranges` (uid -> range)."""
    return _Simplifier((1, 1, 1), set(), ranges).visit(e)


def single_assignments(body: ir.Stmt) -> set:
    """Uids of the variables assigned exactly once (their range is their value's range)."""
    counts: dict = {}
    for a in ir.collect(body, ir.Assign, expressions=False):
        counts[a.var.uid] = counts.get(a.var.uid, 0) + 1
    return {uid for uid, n in counts.items() if n == 1}


def _fold_value(op: str, a, b, dtype):
    if op in ("and", "or"):
        return (a and b) if op == "and" else (a or b)
    if dtype.is_float and dtype.bits <= 32 and op in _F32_FOLD:    # in f32, as the kernel computes it
        with np.errstate(all="ignore"):     # an overflow is not folded: the caller keeps the op
            return float(_F32_FOLD[op](np.float32(a), np.float32(b)))
    return _FOLD[op](a, b)


class _Simplifier(ir.Rewriter):
    def __init__(self, block: tuple, single: set, ranges: dict | None = None):
        self.block = block
        self.single = single
        self.ranges: dict = dict(ranges or {})

    def visit_Assign(self, s: ir.Assign):
        s = self.generic_visit(s)
        if s.var.uid in self.single:
            r = self._range(s.value)
            if r is not None:
                self.ranges[s.var.uid] = r
        return s

    def _range(self, e):
        return int_range(e, self.block, self.ranges)

    def visit_For(self, s: ir.For):
        start, stop = self.visit(s.start), self.visit(s.stop)
        lo, hi = self._range(start), self._range(stop)
        step = s.step.value
        if lo is not None and hi is not None and step > 0:
            self.ranges[s.var.uid] = (lo[0], max(lo[0], hi[1] - 1))
        body = self.visit(s.body)
        return dataclasses.replace(s, start=start, stop=stop, body=body)

    def visit_Outlined(self, s: ir.Outlined):
        # an outlined body is compiled once for all its calls: what the ranges around one call say must not fold
        # into it (a matmul's row clamps, folded in a kernel of one row block, made it a function of its own)
        around, self.ranges = self.ranges, {}
        try:
            return self.generic_visit(s)
        finally:
            self.ranges = around

    def visit_If(self, s: ir.If):
        cond = self.visit(s.cond)
        if isinstance(cond, ir.Const):
            chosen = s.then if cond.value else s.orelse
            return self.visit(chosen) if chosen is not None else ir.Seq(())
        return dataclasses.replace(s, cond=cond, then=self.visit(s.then), orelse=self.visit(s.orelse))

    def visit_Select(self, e: ir.Select):
        cond = self.visit(e.cond)
        if isinstance(cond, ir.Const):
            return self.visit(e.a if cond.value else e.b)
        return dataclasses.replace(e, cond=cond, a=self.visit(e.a), b=self.visit(e.b))

    def visit_Cast(self, e: ir.Cast):
        value = self.visit(e.value)
        if isinstance(value, ir.Const) and not (e.dtype.is_integer and value.dtype.is_float):
            return ir.const(value.value, e.dtype)
        return value if value.dtype == e.dtype else dataclasses.replace(e, value=value)

    def visit_Unary(self, e: ir.Unary):
        a = self.visit(e.a)
        if isinstance(a, ir.Const):
            value = {"-": operator.neg, "not": operator.not_, "~": operator.invert}[e.op](a.value)
            return ir.const(value, e.dtype)
        return e if a is e.a else dataclasses.replace(e, a=a)

    def visit_Call(self, e: ir.Call):
        e = self.generic_visit(e)
        if e.func not in ("min", "max") or not e.dtype.is_integer:
            return e
        a, b = e.args
        ra, rb = self._range(a), self._range(b)
        if ra is None or rb is None:
            return e
        low, high = (a, b) if e.func == "min" else (b, a)      # the operand chosen when a <= b, and the other
        if ra[1] <= rb[0]:
            return low
        if rb[1] <= ra[0]:
            return high
        return e

    def visit_Binary(self, e: ir.Binary):
        a, b = self.visit(e.a), self.visit(e.b)
        op = e.op
        if isinstance(a, ir.Const) and isinstance(b, ir.Const):
            if not (op in ("//", "%", "/") and b.value == 0) and not _undefined_shift(op, b.value, e.dtype):
                value = _fold_value(op, a.value, b.value, a.dtype if op in ir.expr.COMPARE_OPS else e.dtype)
                if not (isinstance(value, float) and not math.isfinite(value)):
                    return ir.const(value, e.dtype)
        if e.dtype.is_integer:
            simpler = self._integer_identity(op, a, b)
            if simpler is not None:
                return simpler
        if a is e.a and b is e.b:
            return e
        return dataclasses.replace(e, a=a, b=b)

    def _integer_identity(self, op, a, b):
        if op == "+":
            for p, q in ((a, b), (b, a)):
                joined = _join_floor_remainder(p, q)
                if joined is not None:
                    return self.visit(joined)
        bv = b.value if isinstance(b, ir.Const) else None
        av = a.value if isinstance(a, ir.Const) else None
        if (op in ("+", "-") and bv == 0) or (op in ("*", "//") and bv == 1):
            return a
        if (op == "+" and av == 0) or (op == "*" and av == 1):
            return b
        if op == "*" and (av == 0 or bv == 0) and not _has_atomics(b if av == 0 else a):
            return ir.const(0, a.dtype if av == 0 else b.dtype)
        # only where arithmetic does not wrap: unsigned q*c + r is taken modulo 2**bits, and that
        # modulus is no multiple of c (signed overflow is undefined, so signed arithmetic may assume none)
        if op in ("%", "//") and bv is not None and bv != 0 and isinstance(a, ir.Binary) and a.op in ("+", "*") \
                and a.dtype.kind == "int":
            split = _split_multiple(a, bv)
            if split is not None and (op == "//" or not _has_atomics(split[0])):
                # floor semantics: (q*c + r) % c == r % c and (q*c + r) // c == q + r // c
                q, r = split
                rest = self.visit(ir.binary(op, r, b)) if r is not None else ir.const(0, a.dtype)
                return rest if op == "%" else self.visit(ir.binary("+", q, rest))
        if op in ("%", "//") and bv is not None and bv > 0:
            r = self._range(a)
            if r is not None and 0 <= r[0] and r[1] < bv:
                return a if op == "%" else ir.const(0, a.dtype)
        if op == "%" and bv == 1 and not _has_atomics(a):
            return ir.const(0, a.dtype)
        return None


def _undefined_shift(op: str, count, dtype) -> bool:
    """Whether `x op count` is a shift by a count outside 0 .. bits - 1 (undefined at run time: kept, not folded)."""
    return op in ("<<", ">>") and not 0 <= count < dtype.bits


def _has_atomics(e: ir.Expr) -> bool:
    """Whether evaluating `e` updates memory (an atomic): an identity may then not drop or merge it."""
    return bool(ir.collect(e, ir.Atomic))


def _is_op(e, op: str) -> bool:
    return isinstance(e, ir.Binary) and e.op == op


def _join_floor_remainder(p: ir.Expr, q: ir.Expr):
    """x for p + q == (x // c) * c + x % c, and u * c + x for ((u + x // c) * c) + x % c (floor
    semantics; the second is a reshape's row-major index of a split dimension), else None. x // c may also
    read y // (b * c) for x = y // b (`_is_floor_of`): the index of a dimension split in three, as a batch's
    (image, row, column) from a flat pixel index, joins back a level at a time."""
    if not (_is_op(p, "*") and _is_op(q, "%") and ir.structurally_equal(p.b, q.b)):
        return None
    x, c = q.a, q.b
    if _has_atomics(x):      # p and q each update memory once: both updates must stay
        return None
    if _is_floor_of(p.a, x, c):
        return x
    if _is_op(p.a, "+"):
        for u, v in ((p.a.a, p.a.b), (p.a.b, p.a.a)):
            if _is_floor_of(v, x, c):
                return u * c + x
    return None


def _is_floor_of(v: ir.Expr, x: ir.Expr, c: ir.Expr) -> bool:
    """Whether v == x // c: v is x // c, or y // (b * c) where x is y // b, with b and c positive constants or size
    symbols (floor division by positive numbers composes: (y // b) // c == y // (b * c), negative y too; a size is
    never negative, and where it is zero, x or x % c divides by zero already)."""
    if not _is_op(v, "//"):
        return False
    if ir.structurally_equal(v.a, x) and ir.structurally_equal(v.b, c):
        return True
    if not (_is_op(x, "//") and ir.structurally_equal(v.a, x.a)):
        return False
    b, d = x.b, v.b
    if all(isinstance(k, ir.Const) for k in (b, c, d)):
        return b.value > 0 and c.value > 0 and d.value == b.value * c.value
    return (_is_op(d, "*") and all(_is_size(k) for k in (b, c))
            and any(ir.structurally_equal(f, b) and ir.structurally_equal(g, c) for f, g in ((d.a, d.b), (d.b, d.a))))


def _is_size(e: ir.Expr) -> bool:
    """Whether `e` is a positive constant or a size symbol (never negative)."""
    return (isinstance(e, ir.Const) and e.value > 0) or (isinstance(e, ir.Var) and e.kind == "size")


def _split_multiple(e: ir.Expr, c: int):
    """(q, r) with e == q * c + r for a sum of terms some of which are multiples of c, else None."""
    if isinstance(e, ir.Binary) and e.op == "*":
        for x, y in ((e.a, e.b), (e.b, e.a)):
            if isinstance(y, ir.Const) and y.value % c == 0:
                return (x * (y.value // c) if y.value != c else x), None
            if isinstance(y, ir.Const) and y.value > 0 and c % y.value == 0:
                # (q * c/y + r) * y == q * c + r * y: a task mapping's nested index, say
                split = _split_multiple(x, c // y.value)
                if split is not None:
                    q, r = split
                    return q, (None if r is None else r * y)
        return None
    if isinstance(e, ir.Binary) and e.op == "+":
        for x, y in ((e.a, e.b), (e.b, e.a)):
            split = _split_multiple(x, c)
            if split is not None:
                q, r = split
                return q, (y if r is None else r + y)
    return None

