"""Deep expressions split into temporaries, so the generated code nests within its compilers' limits.

A compute definition's function may fold hundreds of terms into one expression (`acc = acc + x[k] * w[k]` in
a Python loop), and a fused chain of operators nests each into the next. The code generators print a level
of parentheses per node, and Python's parser (the cpu target's module) takes at most 200 of them, clang's
(NVRTC) 256. A statement whose expressions nest deeper than MAX_DEPTH is preceded by assignments of
subexpressions of it to fresh locals, none deeper than SPLIT_DEPTH.

Only what the statement evaluates unconditionally moves out as it is. A select (or `and` / `or`) whose
branch is deep becomes an `if` assigning a fresh local, each branch split within its arm, so a read the
condition guards stays guarded. Nothing moves out of a `while` condition, which is evaluated at every
iteration: it keeps its depth.
"""
from __future__ import annotations

import dataclasses
import itertools

from .. import ir
from ..ir.visitor import field_names

MAX_DEPTH = 96
SPLIT_DEPTH = 32
_LAZY_OPS = ("and", "or")


def split_deep_expressions(fn: ir.Function) -> ir.Function:
    """`fn` with every statement's expressions at most about MAX_DEPTH deep where they can be split."""
    names = itertools.count()       # per function: the same kernel gives the same source (the compile cache's key)
    body = _split_stmt(fn.body, names)
    return fn if body is fn.body else dataclasses.replace(fn, body=body)


def _split_stmt(stmt: ir.Stmt, names) -> ir.Stmt:
    hoisted: list = []
    changes = {}
    for name in field_names(type(stmt)):
        value = getattr(stmt, name)
        keep = isinstance(stmt, ir.While) and name == "cond"
        new = value if keep else _split_value(value, hoisted, stmt.loc, names)
        if new is not value:
            changes[name] = new
    rebuilt = dataclasses.replace(stmt, **changes) if changes else stmt
    return ir.seq(hoisted + [rebuilt]) if hoisted else rebuilt


def _split_value(value, hoisted: list, loc, names):
    if isinstance(value, ir.Stmt):
        return _split_stmt(value, names)
    if isinstance(value, ir.Expr) and depth(value) > MAX_DEPTH:
        return _Hoister(hoisted, loc, names).rebuild(value, True)[0]
    if type(value) is tuple:
        new = tuple(_split_value(v, hoisted, loc, names) for v in value)
        return value if all(a is b for a, b in zip(new, value)) else new
    return value


def depth(expr: ir.Expr, memo: dict | None = None) -> int:
    """The nesting depth of `expr` (a leaf is 1); shared subtrees are measured once."""
    memo = {} if memo is None else memo
    key = id(expr)
    if key not in memo:
        memo[key] = 1 + max((depth(c, memo) for c in _children(expr)), default=0)
    return memo[key]


def _children(expr: ir.Expr):
    for name in field_names(type(expr)):
        value = getattr(expr, name)
        if isinstance(value, ir.Expr):
            yield value
        elif type(value) is tuple:
            yield from (v for v in value if isinstance(v, ir.Expr))


def _lazy_fields(expr: ir.Expr) -> tuple:
    """The operands (field names) `expr` evaluates only under a condition: a select's branches (unless it is
    eager), the right side of `and` / `or`."""
    if isinstance(expr, ir.Select) and not expr.eager:
        return ("a", "b")
    return ("b",) if isinstance(expr, ir.Binary) and expr.op in _LAZY_OPS else ()


class _Hoister:
    """Rebuilds an expression bottom-up, moving each unconditionally evaluated subexpression that reaches
    SPLIT_DEPTH into an assignment to a fresh local (appended to `hoisted`)."""

    def __init__(self, hoisted: list, loc, names):
        self.hoisted, self.loc, self.names, self.memo, self.depths = hoisted, loc, names, {}, {}

    def rebuild(self, expr, unconditional: bool) -> tuple:
        """(the expression, its depth after the moves)."""
        key = (id(expr), unconditional)
        if key not in self.memo:
            self.memo[key] = self._rebuild(expr, unconditional)
        return self.memo[key]

    def _rebuild(self, expr, unconditional: bool) -> tuple:
        lazy = _lazy_fields(expr)
        if unconditional and any(depth(getattr(expr, f), self.depths) >= SPLIT_DEPTH for f in lazy):
            return self._as_if(expr), 1
        changes, deepest = {}, 0
        for name in field_names(type(expr)):
            value = getattr(expr, name)
            now = unconditional and name not in lazy
            if isinstance(value, ir.Expr):
                new, d = self.rebuild(value, now)
            elif type(value) is tuple and any(isinstance(v, ir.Expr) for v in value):
                parts = [self.rebuild(v, now) if isinstance(v, ir.Expr) else (v, 0) for v in value]
                new, d = tuple(p for p, _ in parts), max(d for _, d in parts)
                new = value if all(a is b for a, b in zip(new, value)) else new
            else:
                continue
            deepest = max(deepest, d)
            if new is not value:
                changes[name] = new
        rebuilt = dataclasses.replace(expr, **changes) if changes else expr
        if unconditional and deepest + 1 >= SPLIT_DEPTH and not isinstance(rebuilt, ir.Ref):
            temp = self._temp(rebuilt.dtype)
            self.hoisted.append(ir.Assign(temp, rebuilt, self.loc))
            return temp, 1
        return rebuilt, deepest + 1

    def _temp(self, dtype) -> ir.Var:
        return ir.Var(f"deep{next(self.names)}", dtype)

    def _as_if(self, expr) -> ir.Var:
        """A fresh local holding `expr` (a select, `and` or `or`), set by an `if` whose arms are split apart."""
        temp = self._temp(expr.dtype)
        if isinstance(expr, ir.Select):
            cond = self.rebuild(expr.cond, True)[0]
            then, orelse = self._arm(expr.a, temp), self._arm(expr.b, temp)
        else:       # a and b: if a: t = b else: t = False; a or b: if a: t = True else: t = b
            self.hoisted.append(self._assign(temp, self.rebuild(expr.a, True)[0]))
            cond, rest = temp, self._arm(expr.b, temp)
            settled = self._assign(temp, ir.const(expr.op == "or", ir.types.boolean))
            then, orelse = (rest, settled) if expr.op == "and" else (settled, rest)
        self.hoisted.append(ir.If(cond, then, orelse, self.loc))
        return temp

    def _arm(self, expr, temp: ir.Var) -> ir.Stmt:
        """`temp = expr` with `expr` split into statements of its own (run only when the arm is taken)."""
        hoisted: list = []
        value = _Hoister(hoisted, self.loc, self.names).rebuild(expr, True)[0]
        return ir.seq(hoisted + [self._assign(temp, value)])

    def _assign(self, temp: ir.Var, value: ir.Expr) -> ir.Assign:
        return ir.Assign(temp, ir.convert(value, temp.dtype), self.loc)
