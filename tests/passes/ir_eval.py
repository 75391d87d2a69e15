"""A tiny reference interpreter of lowered IR (one thread at a time), used as a test oracle."""
from __future__ import annotations

import operator

from taskdsl import ir

_OPS = {"+": operator.add, "-": operator.sub, "*": operator.mul, "//": operator.floordiv, "%": operator.mod,
        "/": operator.truediv, "<": operator.lt, "<=": operator.le, ">": operator.gt, ">=": operator.ge,
        "==": operator.eq, "!=": operator.ne, "and": lambda a, b: a and b, "or": lambda a, b: a or b}


def evaluate(e, env: dict, thread: tuple):
    """The value of `e` for one thread; integer results wrap to their type as in C."""
    value = _value(e, env, thread)
    return e.dtype.wrap(value) if e.dtype.is_integer and not isinstance(e, ir.Const) else value


def _value(e, env: dict, thread: tuple):
    if isinstance(e, ir.Const):
        return e.value
    if isinstance(e, ir.Var):
        return env[e.uid]
    if isinstance(e, ir.SpecialReg):
        assert e.name == "threadIdx"
        return thread["xyz".index(e.axis)]
    if isinstance(e, ir.Binary):
        return _OPS[e.op](evaluate(e.a, env, thread), evaluate(e.b, env, thread))
    if isinstance(e, ir.Cast):
        return evaluate(e.value, env, thread)
    if isinstance(e, ir.Call) and e.func in ("min", "max"):
        return (min if e.func == "min" else max)(evaluate(a, env, thread) for a in e.args)
    raise NotImplementedError(type(e).__name__)


def run(s, env: dict, thread: tuple, trace: list) -> None:
    """Execute `s`; every Store appends (buffer name, index values, stored value) to `trace`."""
    if s is None:
        return
    if isinstance(s, ir.Seq):
        for x in s.stmts:
            run(x, env, thread, trace)
    elif isinstance(s, ir.Assign):
        env[s.var.uid] = evaluate(s.value, env, thread)
    elif isinstance(s, ir.Store):
        trace.append((s.buffer.name, tuple(evaluate(i, env, thread) for i in s.indices),
                      evaluate(s.value, env, thread)))
    elif isinstance(s, ir.For):
        for v in range(evaluate(s.start, env, thread), evaluate(s.stop, env, thread), evaluate(s.step, env, thread)):
            env[s.var.uid] = v
            run(s.body, env, thread, trace)
    elif isinstance(s, ir.If):
        run(s.then if evaluate(s.cond, env, thread) else s.orelse, env, thread, trace)
    elif not isinstance(s, ir.Allocate):     # an allocation does nothing to trace
        raise NotImplementedError(type(s).__name__)
