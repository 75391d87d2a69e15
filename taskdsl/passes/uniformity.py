"""Which values can differ between the threads of a block (the uniformity analysis).

Levels: UNIFORM (same in every thread: constants, sizes, scalar params, blockIdx, values
computed only from these, loads at uniform addresses), WARP (same within a warp:
`threadIdx.x // 32k`, `threadIdx.x < 32k`, threadIdx.y/z when blockDim.x is a multiple of 32)
and THREAD. A variable's level is the highest of its assigned values and of the control
flow its assignments sit under; a loop left by a `break` under a divergent condition is
itself divergent from then on.
"""
from __future__ import annotations

from .. import ir

UNIFORM, WARP, THREAD = 0, 1, 2
WARP_FUNCS = ("shfl_xor", "shfl_down", "shfl_up", "shfl_idx")


class Uniformity:
    """Per-variable and per-expression uniformity levels of one kernel."""

    def __init__(self, fn: ir.Function):
        self.block = fn.block
        self.var_level: dict = {}
        self.loop_level: dict = {}   # id(loop stmt) -> level of its trip count
        changed = True
        while changed:
            self._changed = False
            self._walk(fn.body, UNIFORM, None)
            changed = self._changed

    # -------------------------------------------------------------- expressions
    def level(self, e: ir.Expr) -> int:
        if isinstance(e, ir.Const):
            return UNIFORM
        if isinstance(e, ir.Var):
            return UNIFORM if e.kind in ("size", "param") else self.var_level.get(e.uid, UNIFORM)
        if isinstance(e, ir.SpecialReg):
            if e.name != "threadIdx":
                return UNIFORM
            if e.axis == "x":
                return THREAD
            return WARP if self.block[0] % 32 == 0 else THREAD
        if isinstance(e, ir.Binary):
            if self._warp_pattern(e):
                return WARP
            return max(self.level(e.a), self.level(e.b))
        if isinstance(e, ir.Load):
            if e.buffer.scope == "register":
                return THREAD
            return max((self.level(i) for i in e.indices), default=UNIFORM)
        if isinstance(e, ir.Atomic):
            return THREAD
        if isinstance(e, ir.Call) and e.func in WARP_FUNCS:
            return THREAD
        children = [getattr(e, f) for f in ("a", "b", "cond", "value") if hasattr(e, f)]
        children += list(getattr(e, "args", ()))
        return max((self.level(c) for c in children), default=UNIFORM)

    def _warp_pattern(self, e: ir.Binary) -> bool:
        """threadIdx.x // (32k) and threadIdx.x compared with a multiple of 32 are warp-uniform."""
        if self.block[0] % 32 != 0:
            return False
        tid_x = lambda x: isinstance(x, ir.SpecialReg) and x.name == "threadIdx" and x.axis == "x"
        multiple = lambda x: isinstance(x, ir.Const) and x.dtype.is_integer and x.value % 32 == 0
        if e.op == "//":
            return tid_x(e.a) and multiple(e.b)
        if e.op in ("<", "<=", ">", ">="):
            return (tid_x(e.a) and multiple(e.b)) or (tid_x(e.b) and multiple(e.a))
        return False

    # -------------------------------------------------------------- statements
    def _set(self, var: ir.Var, level: int) -> None:
        if level > self.var_level.get(var.uid, UNIFORM):
            self.var_level[var.uid] = level
            self._changed = True

    def _walk(self, s, ctl: int, loop) -> None:
        if s is None:
            return
        if isinstance(s, ir.Seq):
            for x in s.stmts:
                self._walk(x, ctl, loop)
        elif isinstance(s, ir.Assign):
            self._set(s.var, max(ctl, self.level(s.value)))
        elif isinstance(s, ir.For):
            level = max(ctl, self.level(s.start), self.level(s.stop), self.loop_level.get(id(s), UNIFORM))
            self._set(s.var, level)
            self._walk(s.body, level, s)
        elif isinstance(s, ir.While):
            level = max(ctl, self.level(s.cond), self.loop_level.get(id(s), UNIFORM))
            self._walk(s.body, level, s)
        elif isinstance(s, ir.If):
            level = max(ctl, self.level(s.cond))
            self._walk(s.then, level, loop)
            self._walk(s.orelse, level, loop)
        elif isinstance(s, (ir.Break, ir.Continue)) and loop is not None:
            if ctl > self.loop_level.get(id(loop), UNIFORM):
                self.loop_level[id(loop)] = ctl
                self._changed = True

    def control_levels(self, fn: ir.Function):
        """Yield (statement, level of the control flow around it) for every statement."""
        yield from self._control(fn.body, UNIFORM)

    def _control(self, s, ctl):
        if s is None:
            return
        yield s, ctl
        if isinstance(s, ir.Seq):
            for x in s.stmts:
                yield from self._control(x, ctl)
        elif isinstance(s, ir.For):
            yield from self._control(s.body, max(ctl, self.level(s.start), self.level(s.stop),
                                                 self.loop_level.get(id(s), UNIFORM)))
        elif isinstance(s, ir.While):
            yield from self._control(s.body, max(ctl, self.level(s.cond), self.loop_level.get(id(s), UNIFORM)))
        elif isinstance(s, ir.If):
            level = max(ctl, self.level(s.cond))
            yield from self._control(s.then, level)
            yield from self._control(s.orelse, level)
