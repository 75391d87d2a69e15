"""Barrier fission: a block's body as a sequence of per-thread regions and block-level steps.

The MCUDA / work-item-loop technique. Statements are split at every `syncthreads()`,
`syncwarp()` and warp shuffle; each maximal barrier-free run becomes a `Region` (later a
loop over the block's threads). Control flow that contains a split point must be uniform
across the block and stays outside, at block level, with only its body split; a
warp-uniform `if` around shuffles becomes a per-thread predicate guarding each region of
its body.
Variables the block-level steps read (loop bounds, conditions) are block variables and
are assigned once per block; variables used by several regions become per-thread arrays.

A shuffle `x = shfl_*(v, lane)` splits like a barrier: the region before it ends with
every thread publishing `v` (ShflPut), the region after it starts with every thread
reading its source lane's value (ShflGet).
"""
from __future__ import annotations

import dataclasses
import functools
import itertools
from collections import Counter
from dataclasses import dataclass, field

from ... import ir
from ...ir import types as T
from ...errors import DSLError
from ...passes.uniformity import BLOCK_MAX, UNIFORM, WARP, WARP_FUNCS, Uniformity



# ------------------------------------------------------------------ block program
@dataclass(eq=False)
class Region:
    """Statements every thread runs, in thread order (no barrier inside)."""

    stmts: list
    guards: list = field(default_factory=list)   # per-thread predicates (warp-uniform ifs)
    in_block_loop: bool = False
    live: set = field(default_factory=set)       # uids read before the region surely assigns them
    assigned: set = field(default_factory=set)   # uids the region assigns
    surely: set = field(default_factory=set)     # uids every thread that reaches its end has assigned


@dataclass(eq=False)
class Barrier:
    """A `syncthreads()` or `syncwarp()` between regions; `emulated`: a tensor-core emulation's (see `ir.SyncWarp`)."""

    loc: object
    emulated: bool = False


@dataclass(eq=False)
class BlockAssign:
    """A block variable's assignment, done once per block."""

    stmt: ir.Assign


@dataclass(eq=False)
class BlockFor:
    """A uniform for loop at block level around split items."""
    loop: ir.For
    body: list


@dataclass(eq=False)
class BlockWhile:
    """A uniform while loop at block level around split items."""
    loop: ir.While
    body: list


@dataclass(eq=False)
class BlockIf:
    """A uniform if at block level around split items."""
    cond: ir.Expr
    then: list
    orelse: list


@dataclass(eq=False)
class BlockJump:
    """A uniform `break` / `continue` of a block-level loop."""

    stmt: ir.Stmt


@dataclass(frozen=True, eq=False)
class ShflPut(ir.Stmt):
    """Thread publishes `value` for shuffle `site`."""

    site: int
    value: ir.Expr
    loc: object = None


@dataclass(frozen=True, eq=False)
class ShflGet(ir.Stmt):
    """Thread reads shuffle `site`'s value from the lane `func` selects, into `var`."""

    site: int
    var: ir.Var
    func: str
    lane: ir.Expr
    width: int
    loc: object = None


@dataclass(eq=False)
class BlockMax:
    """A block variable set to the maximum of shuffle `site`'s values, which the threads running it have just
    published; every slot then returns to the least value of its storage, so a thread that skips a later maximum
    of the site (a warp outside its branch) takes no part in it with what it published here."""

    site: int
    var: ir.Var


@dataclass
class BlockProgram:
    """The fissioned body plus what the code generator must allocate."""

    items: list
    block_vars: set           # Var uids assigned at block level
    thread_arrays: dict       # Var uid -> Var: per-thread arrays
    shuffle_sites: dict       # site -> dtype
    block_max_sites: set = field(default_factory=set)   # the sites of `BlockMax`es (slots start at the least value)


# ------------------------------------------------------------------ helpers
def _flatten(s) -> list:
    if s is None:
        return []
    return [x for y in s.stmts for x in _flatten(y)] if isinstance(s, ir.Seq) else [s]


def _assigns_call(s, funcs: tuple) -> bool:
    return isinstance(s, ir.Assign) and isinstance(s.value, ir.Call) and s.value.func in funcs


def _is_shuffle_assign(s) -> bool:
    return _assigns_call(s, WARP_FUNCS)


def _is_block_max(s) -> bool:
    return _assigns_call(s, (BLOCK_MAX,))


def _vars_read(e) -> set:
    return {v.uid for v in ir.collect(e, ir.Var)} if e is not None else set()


def _own_jumps(s) -> bool:
    """Whether `s` holds a break/continue that leaves a loop enclosing `s`."""
    if isinstance(s, (ir.Break, ir.Continue)):
        return True
    if isinstance(s, (ir.For, ir.While)):
        return False
    if isinstance(s, ir.Seq):
        return any(_own_jumps(x) for x in s.stmts)
    if isinstance(s, ir.If):
        return _own_jumps(s.then) or (s.orelse is not None and _own_jumps(s.orelse))
    return False


class _Hoister(ir.Rewriter):
    """Moves each warp shuffle out of its expression into `tmp = shfl(...)` before the statement."""

    def __init__(self):
        self.pending: list = []

    def visit_Call(self, e):
        e = self.generic_visit(e)
        if e.func not in WARP_FUNCS:
            return e
        tmp = ir.Var(f"{e.func}_v", e.dtype)
        self.pending.append(ir.Assign(tmp, e))
        return tmp

    def stmt_list(self, stmts) -> list:
        out = []
        for s in stmts:
            if isinstance(s, (ir.For, ir.While, ir.If)):
                if isinstance(s, ir.While) and any(c.func in WARP_FUNCS for c in ir.collect(s.cond, ir.Call)):
                    raise DSLError("a warp shuffle in a while condition is not supported", s.loc,
                                   "Compute it into a variable before the loop and at the end of its body.")
                head = {f: self.visit(getattr(s, f)) for f in ("start", "stop", "cond") if hasattr(s, f)}
                out.extend(self._take())
                bodies = {f: self.block(getattr(s, f)) for f in ("body", "then", "orelse") if hasattr(s, f)}
                out.append(dataclasses.replace(s, **head, **bodies))
            elif _is_shuffle_assign(s):
                value = ir.Call(s.value.func, tuple(self.visit(a) for a in s.value.args), s.value.dtype)
                out.extend(self._take())
                out.append(ir.Assign(s.var, value, s.loc))
            else:
                new = self.visit(s)
                out.extend(ir.Assign(p.var, p.value, s.loc) for p in self._take())
                out.append(new)
        return out

    def block(self, s):
        return None if s is None else ir.seq(self.stmt_list(_flatten(s))) if _flatten(s) else ir.Seq(())

    def _take(self) -> list:
        taken, self.pending = self.pending, []
        return taken


# ------------------------------------------------------------------ fission
class _Fission:
    def __init__(self, fn: ir.Function, made_loops: frozenset = frozenset()):
        self.fn = fn
        self.made_loops = made_loops            # uids of the variables controlling the loops made per warp
        self.uniformity = Uniformity(fn)
        self.block_vars: set = set()
        self.sites: dict = {}
        self.block_max_sites: set = set()
        self.site_numbers = itertools.count()   # per kernel, so the generated source is deterministic
        self.block_loops: list = []             # the block-level loops around the statement being split

    def has_barrier(self, s) -> bool:
        return any(isinstance(x, ir.SyncThreads) for x in _walk_stmts(s))

    def has_split(self, s) -> bool:
        # (a block maximum too: a loop made per warp whose shuffles were dead code after a jump holds one)
        return any(isinstance(x, (ir.SyncThreads, ir.SyncWarp)) or _is_shuffle_assign(x) or _is_block_max(x)
                   for x in _walk_stmts(s))

    def is_block_level(self, s, in_block_loop: bool) -> bool:
        if self.has_split(s):
            return True
        if any(isinstance(x, ir.Assign) and x.var.uid in self.block_vars for x in _walk_stmts(s)):
            return True
        return in_block_loop and _own_jumps(s)

    def collect_block_vars(self, body) -> None:
        """Fixed point: variables read by block-level control flow, and by their assignments."""
        changed = True
        while changed:
            before = set(self.block_vars)
            self._scan(body, False)
            assigns = [a for a in ir.collect(body, ir.Assign, expressions=False) if a.var.uid in self.block_vars]
            for a in assigns:
                if not _is_block_max(a):      # its argument is each thread's own
                    self.block_vars |= _vars_read(a.value)
            changed = before != self.block_vars

    def _scan(self, s, in_block_loop, branches: tuple = ()) -> None:
        for x in _flatten(s):
            if not self.is_block_level(x, in_block_loop):
                continue
            if isinstance(x, ir.For):
                bounds = (x.start, x.stop)
                # (a loop made so whose bounds still differ is refused by `split`, once a break before it that
                # makes everything after it differ between warps has become a flag)
                if x.var.uid not in self.made_loops and not all(self.agreed(b, branches) for b in bounds) and \
                        not self.has_barrier(x) and \
                        max(self.uniformity.level(b) for b in bounds) == WARP:
                    raise _WarpTrips(x)
                self.block_vars |= _vars_read(x.start) | _vars_read(x.stop) | {x.var.uid}
                self._scan(x.body, True, branches)
            elif isinstance(x, ir.While):
                if not _vars_read(x.cond) & self.made_loops:     # (a loop made so is checked by `split`, once a
                    if not self.agreed(x.cond, branches) and not self.has_barrier(x) and \
                            self.uniformity.level(x.cond) == WARP:      # break before it has become a flag)
                        raise _WarpTrips(x)
                    # checked here, before `split` meets the assignments its condition reads: the loop is the cause
                    self.require_uniform(x.cond, x, "the condition of a loop containing a barrier or shuffle",
                                         branches)
                self.block_vars |= _vars_read(x.cond)
                self._scan(x.body, True, branches)
            elif isinstance(x, ir.If):
                at_block_level = self.agreed(x.cond, branches)
                if at_block_level:
                    self.block_vars |= _vars_read(x.cond)
                self._scan(x.then, in_block_loop, branches if at_block_level else branches + ((id(x), "then"),))
                self._scan(x.orelse, in_block_loop, branches if at_block_level else branches + ((id(x), "else"),))

    def agreed(self, e, branches: tuple) -> bool:
        """Whether every thread that reaches `e` has the same value, so block-level control flow may use it.

        Inside warp-uniform branches (`branches`, the (if, side) pairs around `e`, as the uniformity analysis
        names them), a value that every thread running the innermost agrees on will do: one computed from
        variables assigned only inside those branches. A variable assigned in another warp-uniform branch
        (a warp's `break` flag, say) differs between the warps that reach `e`.
        """
        return self.uniformity.level(e) == UNIFORM or (bool(branches) and self.uniformity.agreed_within(e, branches))

    def split(self, s, in_block_loop: bool, branches: tuple = ()) -> list:
        """Items for statement `s`; `branches`: the warp-uniform branches around it (regions get their predicates)."""
        items, current = [], []

        def flush():
            nonlocal current
            if current:
                items.append(Region(current, in_block_loop=in_block_loop))
            current = []

        for x in _flatten(s):
            if not self.is_block_level(x, in_block_loop):
                current.append(x)
            elif isinstance(x, (ir.SyncThreads, ir.SyncWarp)):   # a block-wide split is a legal schedule of a syncwarp
                flush()
                items.append(Barrier(x.loc, isinstance(x, ir.SyncWarp) and x.emulated))
            elif _is_shuffle_assign(x):
                site = next(self.site_numbers)
                value, lane, width = x.value.args
                self.sites[site] = value.dtype
                current.append(ShflPut(site, value, x.loc))
                flush()
                current.append(ShflGet(site, x.var, x.value.func, lane, width.value, x.loc))
            elif _is_block_max(x):
                site = next(self.site_numbers)
                self.sites[site] = x.var.dtype
                self.block_max_sites.add(site)
                current.append(ShflPut(site, x.value.args[0], x.loc))
                flush()
                items.append(BlockMax(site, x.var))
            elif isinstance(x, ir.Assign):
                self.require_uniform(x.value, x, "a variable that controls a barrier or shuffle", branches)
                flush()
                items.append(BlockAssign(x))
            elif isinstance(x, ir.For):
                self.require_uniform(x.start, x, "the bounds of a loop containing a barrier or shuffle", branches)
                self.require_uniform(x.stop, x, "the bounds of a loop containing a barrier or shuffle", branches)
                flush()
                self.block_loops.append(x)
                items.append(BlockFor(x, self.split(x.body, True, branches)))
                self.block_loops.pop()
            elif isinstance(x, ir.While):
                self.require_uniform(x.cond, x, "the condition of a loop containing a barrier or shuffle", branches)
                flush()
                self.block_loops.append(x)
                items.append(BlockWhile(x, self.split(x.body, True, branches)))
                self.block_loops.pop()
            elif isinstance(x, ir.If):
                level = self.uniformity.level(x.cond)
                if self.agreed(x.cond, branches):
                    flush()
                    items.append(BlockIf(x.cond, self.split(x.then, in_block_loop, branches),
                                         self.split(x.orelse, in_block_loop, branches)))
                elif level == WARP and not _own_jumps(x):
                    self.require_branch_local(x)
                    pred = ir.Var("warp_pred", x.cond.dtype)
                    current.append(ir.Assign(pred, x.cond, x.loc))
                    flush()
                    items += _guard(self.split(x.then, in_block_loop, branches + ((id(x), "then"),)), pred)
                    items += _guard(self.split(x.orelse, in_block_loop, branches + ((id(x), "else"),)),
                                    ir.Unary("not", pred, pred.dtype))
                elif level == WARP:
                    raise _WarpJump(x, self.block_loops[-1])
                else:
                    raise DSLError("a barrier or shuffle under a condition that differs between threads", x.loc,
                                   "Every thread of the block must reach a barrier (every lane of a warp a shuffle).")
            else:  # break / continue of a block-level loop
                flush()
                items.append(BlockJump(x))
        flush()
        return items

    @functools.cached_property
    def function_counts(self) -> tuple:
        """`_var_counts` of the whole kernel body, for `require_branch_local`."""
        return _var_counts(self.fn.body)

    def require_branch_local(self, s: ir.If) -> None:
        """Block variables assigned in a side of the warp-uniform `if` `s` are assigned once for the whole block
        (they control a loop or branch around a barrier or shuffle there), so nothing outside that side may read
        them: the warps outside `s`, and those running its other side, would see the value of the warps that ran
        it. Raises `_Privatize` with those that are read elsewhere."""
        mentions, assigns = self.function_counts
        shared: dict = {}
        for side in (s.then, s.orelse):
            if side is None:
                continue
            inner_mentions, inner_assigns = _var_counts(side)
            for a in ir.collect(side, ir.Assign, expressions=False):
                uid = a.var.uid
                if uid in self.block_vars and uid not in shared and \
                        mentions[uid] - inner_mentions[uid] > assigns[uid] - inner_assigns[uid]:
                    shared[uid] = a
        if shared:
            raise _Privatize(s, list(shared.values()))

    def require_uniform(self, e, s, what: str, branches: tuple) -> None:
        if self.agreed(e, branches):
            return
        if self.uniformity.level(e) == WARP and not self.has_barrier(s):   # legal CUDA the cpu target cannot run
            raise _per_warp_refusal(what, s.loc)
        raise DSLError(f"{what} must be the same in every thread of the block (it depends on threadIdx or on "
                       "per-thread data)", s.loc, "A barrier must be reached by every thread of the block.")


def _per_warp_refusal(what: str, loc) -> DSLError:
    return DSLError(f"{what} differs between the warps of the block: on the cpu target such a loop or branch runs for "
                    "the whole block at once (a GPU runs it per warp)", loc,
                    "Give the loop the same trip count in every thread and put the per-warp part of its body under a "
                    "warp-uniform `if` (`for i in range(MAX): if i < count: ...`), which may hold shuffles.")


class _Privatize(Exception):
    """`split` met a warp-uniform `branch` whose block variables (the targets of `assignments`, their first
    assignments there) are also read outside it."""

    def __init__(self, branch: ir.If, assignments: list):
        super().__init__(branch, assignments)
        self.branch, self.variables = branch, [a.var for a in assignments]
        self.loc = assignments[0].loc

    def refusal(self) -> DSLError:
        """The error for a branch `_privatized` cannot give copies."""
        return DSLError(f"'{self.variables[0].name}' controls a loop or branch with a barrier or shuffle inside a "
                        "warp-uniform if, and is also read outside that if; the cpu target gives it a copy of its "
                        "own in the branch, but not when the branch reads the value from before the if or the "
                        "variable also controls a barrier or shuffle outside the branch", self.loc,
                        "Use a variable of its own inside the branch (other warps would see this value).")


def _privatized(body: ir.Stmt, branch: ir.If, variables: list):
    """`body` with `branch`'s block variables given copies of their own inside it, or None where a copy cannot do.

    Each side of the `if` works on fresh variables for those it assigns and hands their values back to the
    outer ones at its end, a per-thread assignment: the copies are block-level variables inside the branch (set
    once per block, by the warps that run it), and outside it each thread keeps its own value, as in CUDA (a
    side that only reads a variable reads that per-thread value). A side that reads a variable before assigning
    it, or may leave it unassigned (in a loop that can run no trip), starts its copy from the outer value: the
    block maximum of it over the threads running the side, which agree on it (the uniformity analysis made it a
    block variable there), so the outer variable stays per thread. None for a variable a block maximum assigns
    (a copy that started so, whose hand-back would be block-level: a nested branch that needs the copy's value).
    """
    uids = {v.uid for v in variables}
    maxima = {a.var.uid for a in ir.collect(body, ir.Assign, expressions=False) if _is_block_max(a)}
    if uids & maxima:
        return None
    outer = {}       # id(side) -> uids whose copies start from the outer value
    for side in (branch.then, branch.orelse):
        live, surely, assigned = set(), set(), set()
        _live_in(side, surely, live, assigned)
        mine = assigned & uids
        outer[id(side)] = live & mine | mine - surely

    def private(side):
        if side is None:
            return None
        assigned = {a.var.uid for a in ir.collect(side, ir.Assign, expressions=False)}
        copies = {v.uid: ir.Var(f"{v.name}_w", v.dtype) for v in variables if v.uid in assigned}
        starts = [ir.Assign(copies[v.uid], ir.Call(BLOCK_MAX, (v,), v.dtype), branch.loc) for v in variables
                  if v.uid in outer[id(side)]]
        return ir.seq(starts + [ir.substitute(side, copies)] +
                      [ir.Assign(v, copies[v.uid], branch.loc) for v in variables if v.uid in copies])

    return _with_replaced(body, branch, dataclasses.replace(branch, then=private(branch.then),
                                                            orelse=private(branch.orelse)))


class _WarpJump(Exception):
    """`split` met a `break` or `continue` of the block-level `loop` under the warp-uniform `branch`."""

    def __init__(self, branch: ir.If, loop):
        super().__init__(branch, loop)
        self.branch, self.loop = branch, loop


def _jumps_lowered(stmts: list, left: ir.Var, skip: ir.Var) -> list:
    """`stmts` (a loop's body) with the loop's own `break`s setting `left` and `skip`, its `continue`s `skip`,
    and what follows a statement that may jump under `if not skip`."""
    true = ir.const(True)
    out = []
    for k, x in enumerate(stmts):
        if isinstance(x, (ir.Break, ir.Continue)):
            return out + ([ir.Assign(left, true, x.loc)] if isinstance(x, ir.Break) else []) + \
                [ir.Assign(skip, true, x.loc)]
        if isinstance(x, ir.If) and _own_jumps(x):
            orelse = None if x.orelse is None else ir.seq(_jumps_lowered(_flatten(x.orelse), left, skip))
            out.append(dataclasses.replace(x, then=ir.seq(_jumps_lowered(_flatten(x.then), left, skip)),
                                           orelse=orelse))
            rest = _jumps_lowered(stmts[k + 1:], left, skip)
            return out + ([ir.If(ir.Unary("not", skip, T.boolean), ir.seq(rest), None, x.loc)] if rest else [])
        out.append(x)
    return out


def _jumps_as_flags(body: ir.Stmt, loop) -> ir.Stmt:
    """`body` with the `break`s and `continue`s of the block-level `loop` made per-thread flags.

    A for loop runs all its trips at block level; a thread whose warp left it skips the rest (`left`), and one
    whose warp continued skips the rest of the trip (`skip`): both are warp-uniform guards, so fission turns
    them into predicates on the regions. (The loop variable is the loop's own: nothing reads it after the loop.)
    (A while loop runs while a warp is still in it instead: `_uniform_while`.)
    """
    left = ir.Var(f"{loop.var.name}_left", T.boolean)
    skip = ir.Var(f"{loop.var.name}_skip", T.boolean)
    false = ir.const(False)
    guarded = ir.If(ir.Unary("not", left, T.boolean), ir.seq(_jumps_lowered(_flatten(loop.body), left, skip)),
                    None, loop.loc)
    rewritten = dataclasses.replace(loop, body=ir.seq([ir.Assign(skip, false, loop.loc), guarded]))
    return _with_replaced(body, loop, ir.seq([ir.Assign(left, false, loop.loc), rewritten]))


def _uniform_while(body: ir.Stmt, loop: ir.While) -> tuple:
    """(`body` with the while `loop`, whose condition differs between warps (or which a warp may leave by a
    `break`), run at block level while a warp is still in it, a warp that left it skipping the trips, and the uid
    of the variable the new loop's condition reads):

        on = <cond>
        while block_max(on) > 0:
            if on:                          # warp-uniform: fission makes it a predicate on the regions
                left, skip = False, False
                <body, a break setting left and skip, a continue skip; what follows under `if not skip`>
                on = False if left else <cond>
    """
    loc, false = loop.loc, ir.const(False)
    on, most = ir.Var("while_on", T.boolean), ir.Var("while_most", T.i32)
    left, skip = ir.Var("while_left", T.boolean), ir.Var("while_skip", T.boolean)

    def counted():      # (a statement object appears once in the tree: analyses key on identity)
        return ir.Assign(most, ir.Call(BLOCK_MAX, (ir.convert(on, T.i32),), T.i32), loc)

    again = ir.If(left, ir.Assign(on, false, loc), ir.Assign(on, loop.cond, loc), loc)
    trip = ir.If(on, ir.seq([ir.Assign(left, false, loc), ir.Assign(skip, false, loc),
                             *_jumps_lowered(_flatten(loop.body), left, skip), again]), None, loc)
    uniform = ir.While(most > ir.const(0, T.i32), ir.seq([trip, counted()]), loc)
    return _with_replaced(body, loop, ir.seq([ir.Assign(on, loop.cond, loc), counted(), uniform])), most.uid


class _WarpTrips(Exception):
    """`_scan` met a `loop` around shuffles whose trip count differs between warps (and is the same within one)."""

    def __init__(self, loop: ir.For | ir.While):
        super().__init__(loop)
        self.loop = loop


def _uniform_trips(body: ir.Stmt, loop: ir.For) -> tuple:
    """(`body` with `loop`, whose trip count is per warp, run for the block's largest trip count, each warp's
    trips past its own skipped under a warp-uniform `if` (which fission makes a predicate on the regions):

        start, trips = <start>, <the warp's trip count>
        for t in range(block_max(trips)):
            if t < trips:
                i = start + t * step
                <body>

    and the uid of the new loop's variable)."""
    var, step, loc = loop.var, loop.step.value, loop.loc
    start, trips, t = (ir.Var(f"{var.name}_{what}", var.dtype) for what in ("start", "trips", "t"))
    distance = loop.stop - start if step > 0 else start - loop.stop
    span = distance if abs(step) == 1 else (distance + (abs(step) - 1)) // abs(step)
    count = ir.Call("max", (span, ir.const(0, span.dtype)), span.dtype)
    most = ir.Var(f"{var.name}_most", var.dtype)
    trip = ir.If(t < trips, ir.seq([ir.Assign(var, start + t * step, loc), loop.body]), None, loc)
    uniform = ir.For(t, ir.const(0, var.dtype), most, ir.const(1, var.dtype), trip, False, loc)
    return _with_replaced(body, loop, ir.seq([
        ir.Assign(start, loop.start, loc), ir.Assign(trips, ir.convert(count, var.dtype), loc),
        ir.Assign(most, ir.Call(BLOCK_MAX, (trips,), var.dtype), loc), uniform])), t.uid


def _branch_without_copies(body: ir.Stmt, variables: list, privatized: dict, uniformity: Uniformity):
    """The first innermost warp-uniform `if` of `body` that assigns one of `variables` and has not given them
    copies, or None."""
    uids = {v.uid for v in variables}

    def assigns(s) -> bool:
        return any(a.var.uid in uids for side in (s.then, s.orelse) if side is not None
                   for a in ir.collect(side, ir.Assign, expressions=False))
    candidates = [s for s in _walk_stmts(body) if isinstance(s, ir.If) and uniformity.level(s.cond) == WARP
                  and assigns(s) and not any((id(s.cond), uid) in privatized for uid in uids)]
    inner = [s for s in candidates if not any(c is not s and _contains(s, c) for c in candidates)]
    return inner[0] if inner else None


def _innermost_holding(branch: ir.If, variables: list, uniformity: Uniformity) -> ir.If:
    """The innermost warp-uniform `if` in `branch` (or `branch`) that holds every mention of `variables` in it:
    the copies go there, so that a branch nested in `branch` does not copy `branch`'s copies again (whose
    hand-back would be block-level)."""
    uids = {v.uid for v in variables}
    mentions = lambda s: sum(1 for v in ir.collect(s, ir.Var) if v.uid in uids)
    while True:
        total = mentions(branch)
        inner = [s for side in (branch.then, branch.orelse) for s in _flatten(side)
                 if isinstance(s, ir.If) and uniformity.level(s.cond) == WARP and mentions(s) == total > 0]
        if not inner:
            return branch
        branch = inner[0]


def _contains(outer: ir.Stmt, inner: ir.Stmt) -> bool:
    return any(x is inner for x in _walk_stmts(outer))


def _with_replaced(body: ir.Stmt, old: ir.Stmt, new: ir.Stmt) -> ir.Stmt:
    """`body` with the statement `old` (that very object) replaced by `new`."""
    class _Replace(ir.Rewriter):
        def visit(self, node):
            return new if node is old else super().visit(node)

    return _Replace().visit(body)


def _var_counts(s) -> tuple:
    """How often each variable is mentioned in `s`, and how often assigned."""
    return (Counter(v.uid for v in ir.collect(s, ir.Var)),
            Counter(a.var.uid for a in ir.collect(s, ir.Assign, expressions=False)))


def _walk_stmts(s):
    if s is None:
        return
    yield s
    for name in ("stmts",):
        for x in getattr(s, name, ()):
            yield from _walk_stmts(x)
    for name in ("body", "then", "orelse"):
        yield from _walk_stmts(getattr(s, name, None))


def _guard(items: list, pred: ir.Expr) -> list:
    out = []
    for it in items:
        if isinstance(it, Region):
            out.append(dataclasses.replace(it, guards=it.guards + [pred]))
        elif isinstance(it, BlockFor):
            out.append(BlockFor(it.loop, _guard(it.body, pred)))
        elif isinstance(it, BlockWhile):
            out.append(BlockWhile(it.loop, _guard(it.body, pred)))
        elif isinstance(it, BlockIf):
            out.append(BlockIf(it.cond, _guard(it.then, pred), _guard(it.orelse, pred)))
        else:
            out.append(it)
    return out


def regions(items):
    """Every Region of a block program's items, nested ones included, in program order."""
    for it in items:
        if isinstance(it, Region):
            yield it
        for name in ("body", "then", "orelse"):
            yield from regions(getattr(it, name, []))


def _live_in(s, defined: set, live: set, assigned: set) -> None:
    """Add to `live` the variables `s` reads before it surely assigned them; `defined` is updated."""
    if s is None:
        return
    reads = lambda e: {v.uid for v in ir.collect(e, ir.Var)} - defined if e is not None else set()
    if isinstance(s, ir.Seq):
        for x in s.stmts:
            _live_in(x, defined, live, assigned)
    elif isinstance(s, (ir.Assign, ShflGet)):
        live |= reads(s.value if isinstance(s, ir.Assign) else s.lane)
        defined.add(s.var.uid)
        assigned.add(s.var.uid)
    elif isinstance(s, ir.For):
        live |= reads(s.start) | reads(s.stop)
        assigned.add(s.var.uid)
        _live_in(s.body, defined | {s.var.uid}, live, assigned)
    elif isinstance(s, ir.While):
        live |= reads(s.cond)
        _live_in(s.body, set(defined), live, assigned)
    elif isinstance(s, ir.If):
        live |= reads(s.cond)
        then_defined, else_defined = set(defined), set(defined)
        _live_in(s.then, then_defined, live, assigned)
        _live_in(s.orelse, else_defined, live, assigned)
        defined |= then_defined & else_defined
    else:  # Store, Evaluate, ShflPut, Break, Continue, Allocate
        for name in ("indices", "value", "expr"):
            value = getattr(s, name, None)
            for e in (value if isinstance(value, tuple) else (value,)):
                live |= reads(e)


def _region_vars(region: Region) -> tuple[set, set, set]:
    """(uids the region reads before surely assigning them, uids it assigns, uids it surely assigns)."""
    live, assigned, surely = set(), set(), set()
    for g in region.guards:
        live |= {v.uid for v in ir.collect(g, ir.Var)}
    _live_in(ir.seq(region.stmts) if region.stmts else None, surely, live, assigned)
    return live, assigned, surely


def fission(fn: ir.Function) -> BlockProgram:
    """Split the body of a lowered kernel into regions and block-level steps."""
    hoisted = _Hoister().block(fn.body)
    privatized: dict = {}         # (id of a branch's condition, variable uid) -> the condition, for each copy given
                                  # (kept alive: its id names the branch across rewrites, which keep the condition)
    made_loops: set = set()       # uids of the variables controlling the loops made per warp
    branches = sum(1 for s in _walk_stmts(hoisted) if isinstance(s, ir.If))
    while True:
        fn = ir.Function(fn.name, fn.params, fn.sizes, hoisted, fn.block, fn.source_file)
        f = _Fission(fn, frozenset(made_loops))
        try:
            f.collect_block_vars(fn.body)
            items = f.split(fn.body, False)
            break
        except (_WarpTrips, _WarpJump) as w:    # each round runs one loop per warp, or makes its jumps flags
            if isinstance(w, _WarpJump) and isinstance(w.loop, ir.For):
                hoisted = _jumps_as_flags(hoisted, w.loop)
            else:
                hoisted, made = (_uniform_while if isinstance(w.loop, ir.While) else _uniform_trips)(hoisted, w.loop)
                made_loops.add(made)
        except _Privatize as p:     # each round gives one branch its own copies
            branch = p.branch
            if any((id(branch.cond), v.uid) in privatized for v in p.variables):
                # the copy's hand-back is block-level: another branch bounds a loop by the variable (the copies
                # of one branch an unrolled loop makes): that one gets copies too, or none is left to
                branch = _branch_without_copies(hoisted, p.variables, privatized, f.uniformity)
            branch = branch and _innermost_holding(branch, p.variables, f.uniformity)
            too_many = len(privatized) > 4 * branches    # (a copy's copy of a copy...: refused, not endless)
            hoisted = None if branch is None or too_many else _privatized(hoisted, branch, p.variables)
            if hoisted is None:
                raise p.refusal() from None
            privatized.update({(id(branch.cond), v.uid): branch.cond for v in p.variables})
    # A variable lives in a per-thread array when a region reads a value of it that another region
    # (or the same region, in an earlier iteration of a block-level loop) assigned.
    all_regions = list(regions(items))
    for r in all_regions:
        r.live, r.assigned, r.surely = _region_vars(r)
    info = [(r, r.live, r.assigned) for r in all_regions]
    local_vars = {v.uid: v for v in ir.collect(hoisted, ir.Var) if v.kind not in ("size", "param")}
    local_vars.update({g.var.uid: g.var for r in all_regions for g in r.stmts if isinstance(g, ShflGet)})
    for r in all_regions:
        for g in r.guards:
            local_vars.update({v.uid: v for v in ir.collect(g, ir.Var)})
    carried = set()         # uids whose values a region reads from another region (or an earlier trip)
    for region, live, _ in info:
        for uid in live - f.block_vars:
            writers = [r for r, _, assigned in info if uid in assigned]
            if any(w is not region or region.in_block_loop for w in writers):
                carried.add(uid)
    # in the kernel's order (uids number variables in the order this process made them): the same source each time
    arrays = {uid: v for uid, v in local_vars.items() if uid in carried}
    return BlockProgram(items, f.block_vars, arrays, f.sites, f.block_max_sites)
