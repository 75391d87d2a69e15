"""Which values can differ between the threads of a block (the uniformity analysis).

Levels: UNIFORM (same in every thread: constants, sizes, scalar params, blockIdx, values
computed only from these, loads at uniform addresses), WARP (same within a warp:
`threadIdx.x // 32k`, `threadIdx.x < 32k`, threadIdx.y/z when blockDim.x is a multiple of 32)
and THREAD. A variable's level is the highest of its assigned values and of the control
flow its assignments sit under; a loop left by a `break` under a divergent condition is
itself divergent from then on, and the rest of a trip after a `continue` under a warp-uniform
condition is warp-uniform (a thread-level `continue` makes the whole loop divergent).

`agreed_within` answers a second question, for code that runs under warp-uniform branches:
is a value the same in every thread that runs the innermost of them? (A variable assigned
only inside those branches, from values their threads agree on, is; one copied from a variable
another branch assigns is not, and neither is one a loop assigns that its threads leave at
different trips: a warp-uniform head, or a `break` under a warp-uniform branch of its own.)
"""
from __future__ import annotations

from .. import ir
from ..ir.visitor import field_names

UNIFORM, WARP, THREAD = 0, 1, 2
WARP_FUNCS = ("shfl_xor", "shfl_down", "shfl_up", "shfl_idx")
BLOCK_MAX = "block_max"     # the cpu fission's maximum over the block's threads (of per-warp trip counts): uniform
_MIRRORED = {"<": ">", "<=": ">=", ">": "<", ">=": "<="}    # c op t is t mirrored-op c


class Uniformity:
    """Per-variable and per-expression uniformity levels of one kernel."""

    def __init__(self, fn: ir.Function):
        self.block = fn.block
        self.var_level: dict = {}
        self.relaxed_level: dict = {}  # as var_level, but ignoring warp-uniform control flow
        self.branches: dict = {}       # var uid -> warp-uniform branches its assignments (or their sources) sit in
        self.loop_level: dict = {}     # id(loop stmt) -> level of its trip count
        self.loop_branches: dict = {}  # id(loop stmt) -> the warp-uniform branches around it
        self.split_trips: set = set()  # ids of loops left under warp-uniform branches of their own: the threads
        #                                running such a loop disagree on its trip count (relaxed level WARP)
        self.tid_aliases = self._tid_aliases(fn)
        self.control: dict = {}        # id(statement) -> level of the control flow around it
        changed = True
        while changed:
            self._changed = False
            self._walk(fn.body, UNIFORM, None, UNIFORM, ())
            changed = self._changed

    @staticmethod
    def _tid_aliases(fn: ir.Function) -> set:
        """Variables assigned once, to threadIdx.x (or to another such variable)."""
        assigns: dict = {}
        for a in ir.collect(fn.body, ir.Assign, expressions=False):
            assigns.setdefault(a.var.uid, []).append(a.value)
        aliases: set = set()
        changed = True
        while changed:
            changed = False
            for uid, values in assigns.items():
                v = values[0]
                is_tid = (isinstance(v, ir.SpecialReg) and v.name == "threadIdx" and v.axis == "x") or \
                    (isinstance(v, ir.Var) and v.uid in aliases)
                if len(values) == 1 and is_tid and uid not in aliases:
                    aliases.add(uid)
                    changed = True
        return aliases

    # -------------------------------------------------------------- expressions
    def agreed_within(self, e: ir.Expr, branches) -> bool:
        """Whether `e` is the same in every thread running the innermost of the nested warp-uniform `branches`
        it is used in ((id of the if, side) pairs, as `_walk` names them)."""
        local = [v for v in ir.collect(e, ir.Var) if v.kind not in ("size", "param")]
        return all(self.branches.get(v.uid, set()) <= set(branches) for v in local) and \
            self.level(e, self.relaxed_level) == UNIFORM

    def level(self, e: ir.Expr, var_level: dict | None = None) -> int:
        var_level = self.var_level if var_level is None else var_level
        if isinstance(e, ir.Const):
            return UNIFORM
        if isinstance(e, ir.Var):
            return UNIFORM if e.kind in ("size", "param") else var_level.get(e.uid, UNIFORM)
        if isinstance(e, ir.SpecialReg):
            if e.name != "threadIdx":
                return UNIFORM
            if e.axis == "x":
                return THREAD
            return WARP if self.block[0] % 32 == 0 else THREAD
        if isinstance(e, ir.Binary):
            if self._warp_pattern(e):
                return WARP
            return max(self.level(e.a, var_level), self.level(e.b, var_level))
        if isinstance(e, ir.Load):
            if e.buffer.scope == "register":
                return THREAD
            return max((self.level(i, var_level) for i in e.indices), default=UNIFORM)
        if isinstance(e, ir.Atomic):
            return THREAD
        if isinstance(e, ir.Call) and e.func in WARP_FUNCS:
            return THREAD
        if isinstance(e, ir.Call) and e.func == BLOCK_MAX:
            return UNIFORM
        children = [getattr(e, f) for f in ("a", "b", "cond", "value") if hasattr(e, f)]
        children += list(getattr(e, "args", ()))
        return max((self.level(c, var_level) for c in children), default=UNIFORM)

    def _warp_pattern(self, e: ir.Binary) -> bool:
        """threadIdx.x // (32k), k > 0, threadIdx.x >> k, k >= 5, and threadIdx.x compared with a warp boundary are
        warp-uniform."""
        if self.block[0] % 32 != 0:
            return False
        tid_x = lambda x: (isinstance(x, ir.SpecialReg) and x.name == "threadIdx" and x.axis == "x") or \
            (isinstance(x, ir.Var) and x.uid in self.tid_aliases)
        constant = lambda x: isinstance(x, ir.Const) and x.dtype.is_integer
        if e.op == "//":    # t // -32 is 0 at t == 0 but -1 at t == 1
            return tid_x(e.a) and constant(e.b) and e.b.value > 0 and e.b.value % 32 == 0
        if e.op == ">>":    # CUDA's warp index idiom, t >> 5: the lane is t's low 5 bits
            return tid_x(e.a) and constant(e.b) and e.b.value >= 5
        if e.op not in _MIRRORED:
            return False
        if tid_x(e.a):
            op, c = e.op, e.b
        elif tid_x(e.b):
            op, c = _MIRRORED[e.op], e.a
        else:
            return False
        if not constant(c):
            return False
        # t < b and t >= b split the threads at b; t <= c and t > c at c + 1 (t <= 32 holds for lane 0 of warp 1 only)
        boundary = c.value if op in ("<", ">=") else c.value + 1
        return boundary % 32 == 0

    # -------------------------------------------------------------- statements
    def _set(self, var: ir.Var, level: int, relaxed: int, branches: tuple, value: ir.Expr | None = None) -> None:
        for table, new in ((self.var_level, level), (self.relaxed_level, relaxed)):
            if new > table.get(var.uid, UNIFORM):
                table[var.uid] = new
                self._changed = True
        # a value copied from a variable some branch assigns is as local to that branch (`n = c` before a later
        # `if warp: c += 1` agrees only where `c` does)
        sources = set(branches[-1:]).union(*(self.branches.get(v.uid, ()) for v in _copied_vars(value)))
        if not sources <= self.branches.setdefault(var.uid, set()):
            self.branches[var.uid] |= sources
            self._changed = True

    def _walk(self, s, ctl: int, loop, rctl: int, branches: tuple) -> int:
        """`ctl`: level of the control flow around `s`; `rctl`: the same counting only thread-level
        conditions; `branches`: the warp-uniform if-branches around `s`, outermost first. Returns WARP where
        `s` holds a `continue` of `loop` under warp-uniform control flow: the statements after `s`, to the end
        of the trip, run in the warps that did not continue."""
        if s is None:
            return UNIFORM
        self.control[id(s)] = ctl
        relaxed = lambda e: self.level(e, self.relaxed_level)
        if isinstance(s, ir.Seq):
            skipped = UNIFORM
            for x in s.stmts:
                skipped = max(skipped, self._walk(x, max(ctl, skipped), loop, rctl, branches))
            return skipped
        if isinstance(s, ir.Assign):
            around = rctl   # a block maximum is the same in every thread that runs it (warps out of a loop: none)
            if isinstance(s.value, ir.Call) and s.value.func == BLOCK_MAX:
                around = THREAD if rctl == THREAD else UNIFORM
            self._set(s.var, max(ctl, self.level(s.value)), max(around, relaxed(s.value)), branches, s.value)
        elif isinstance(s, (ir.For, ir.While)):
            heads = (s.start, s.stop) if isinstance(s, ir.For) else (s.cond,)
            trips = self.loop_level.get(id(s), UNIFORM)
            level = max([ctl, trips] + [self.level(h) for h in heads])
            rlevel = max([rctl] + [THREAD if max(trips, relaxed(h)) == THREAD else UNIFORM for h in heads])
            if id(s) in self.split_trips or any(not self.agreed_within(h, branches) for h in heads):
                rlevel = max(rlevel, WARP)  # its threads leave it at different trips: what it assigns differs
            self.loop_branches[id(s)] = branches
            if isinstance(s, ir.For):
                self._set(s.var, level, rlevel, branches)
            self._walk(s.body, level, s, rlevel, branches)     # (its own continues end with its trips)
        elif isinstance(s, ir.If):
            cond = self.level(s.cond)
            level, rlevel = max(ctl, cond), max(rctl, THREAD if cond == THREAD else UNIFORM)
            # a warp-uniform condition that every thread running the enclosing branch agrees on (an inlined
            # function's early-return test on its arguments, say) opens no new branch
            divergent = cond == WARP and not (branches and self.agreed_within(s.cond, branches))
            inner = lambda side: branches + ((id(s), side),) if divergent else branches
            return max(self._walk(s.then, level, loop, rlevel, inner("then")),
                       self._walk(s.orelse, level, loop, rlevel, inner("else")))
        elif isinstance(s, ir.Continue) and loop is not None and ctl == WARP:
            return WARP
        elif isinstance(s, (ir.Break, ir.Continue)) and loop is not None:
            if ctl > self.loop_level.get(id(loop), UNIFORM):
                self.loop_level[id(loop)] = ctl
                self._changed = True
            if isinstance(s, ir.Break) and len(branches) > len(self.loop_branches[id(loop)]) and \
                    id(loop) not in self.split_trips:
                self.split_trips.add(id(loop))
                self._changed = True
        return UNIFORM

    def control_levels(self, fn: ir.Function):
        """Yield (statement, level of the control flow around it) for every statement of `fn` (the function
        this analysis was made of)."""
        for s in _statements(fn.body):
            yield s, self.control[id(s)]


def _copied_vars(e) -> list:
    """The variables whose values expression `e` passes on: all it reads but under a BLOCK_MAX (every thread's
    maximum is the block's, whichever branches its argument came from)."""
    if isinstance(e, ir.Var):
        return [e]
    if not isinstance(e, ir.Expr) or (isinstance(e, ir.Call) and e.func == BLOCK_MAX):
        return []
    fields = [getattr(e, name) for name in field_names(type(e))]
    return [v for f in fields for x in (f if type(f) is tuple else (f,)) for v in _copied_vars(x)]


def _statements(s):
    """`s` and the statements nested in it, in program order (as `_walk` visits them)."""
    if s is None:
        return
    yield s
    if isinstance(s, ir.Seq):
        inner = s.stmts
    elif isinstance(s, (ir.For, ir.While)):
        inner = (s.body,)
    else:
        inner = (s.then, s.orelse) if isinstance(s, ir.If) else ()
    for x in inner:
        yield from _statements(x)
