"""Random control flow: hypothesis writes kernels of nested statements; Python runs the same program as the oracle.

A program is a random nest of statements over per-thread variables `x0`..`x3` (i64), block-uniform
variables `u0`, `u1` (i64), a register array `r` (indexed by constants and by run-time values) and a
float accumulator `f` that starts as an int and is widened by the first float added to it:
assignments, augmented assignments, stores of intermediate values, `if`/`elif`/`else`
(block-uniform, warp-uniform and per-thread conditions), `for` loops over `range` and `td.unroll`
(negative steps, bounds computed at run time, bounds that differ between warps around shuffles) and over
compile-time tuples (unrolled by the translator; a
`return` may leave them), `while` loops (conditions that differ between warps around shuffles), `break`,
`continue` (a warp may leave a loop around shuffles), early `return`, calls of device functions with early returns and
loops (also in conditions), warp shuffles, exchanges through shared memory between barriers, and
variables `p*` that a warp-uniform branch sets from uniform values, may loop around a shuffle on,
and leaves for the threads to read after it. Barriers and shuffles are placed only where the
DSL's rules allow them (a barrier under block-uniform control flow, a shuffle under warp-uniform
control flow, no `break` or `return` more divergent than that before them), so every program must
compile.

The oracle is Python itself: the kernel's body is run as a generator per thread, which yields at
each barrier and at each shuffle (`x = (yield ("xor", v, 4, 32))`); a scheduler runs each warp's
lanes in lockstep from shuffle to shuffle and the block's threads from barrier to barrier. Its
integers check that they stay within i64 (an example that leaves it is dropped); `f` only ever
holds multiples of 1/4 far below 2**24, which f32 represents exactly. On the cpu target, with a host
C++ compiler, the kernel's CUDA source also runs on the host (tests/cuda_on_host.py) against the
same oracle: the CUDA generator's semantics, checked without a GPU.

This exercises the translator's control flow and variable typing (the widening restart), the
uniformity analysis, loop unrolling and simplification, the cpu backend's barrier and shuffle
fission of loops and branches, device-function inlining, and both code generators (the conftest
also builds each kernel's CUDA source with NVRTC).
"""
from __future__ import annotations

import operator
from dataclasses import dataclass, replace

import numpy as np
from hypothesis import HealthCheck, Phase, assume, given, settings
from hypothesis import strategies as st

import taskdsl as td

from .cuda_on_host import host_compiler, run_on_host
from .program_files import load_program

GPU_TWINS = True   # every example also runs as a @gpu twin on the cuda target (conftest.py)

THREADS, BLOCKS, SLOTS, STATEMENTS, REGISTERS = 64, 2, 6, 22, 4
XS, US = ("x0", "x1", "x2", "x3"), ("u0", "u1")
OUTPUTS = XS + US + tuple(f"r[{q}]" for q in range(REGISTERS))

HELPERS = '''
{decorator}
def bend(v: i64, w: i64) -> i64:
    if v < w:
        return v - w
    if v % 3 == 0:
        return w
    return v // 2 + w


{decorator}
def steps(v: i64, n: i64) -> i64:
    acc = v % 1009
    for k in range(min(max(n, 0), 4)):
        acc = (acc * 7 + k) % 1009
        if acc % 5 == 0:
            break
    return acc
'''

PROLOGUE = '''    x0: i64 = A[b, t]
    x1: i64 = t * 3 - 50
    x2: i64 = A[b, (t + 1) % {threads}]
    x3: i64 = b - t
    u0: i64 = B[b]
    u1: i64 = b * 2 + 1
    f = 0
    for q in range({registers}):
        r[q] = q * 7 - t
'''

EPILOGUE = "".join(f"    OUT[b, t, {k}] = {name}\n" for k, name in enumerate(OUTPUTS)) + "    F[b, t] = f\n"


# ------------------------------------------------------------------ the program writer
UNIFORM, WARP, THREAD = 0, 1, 2   # how much the control flow around a statement may differ between threads


@dataclass(frozen=True)
class Scope:
    """Where a statement is written: which names it may read and what control flow surrounds it."""

    level: int                # UNIFORM: every thread of the block gets here (a barrier is allowed); WARP: every
                              # lane of a warp (a shuffle is allowed); THREAD: anything
    loop: int | None          # the level a `break` or `continue` may be at in the innermost runtime loop
    depth: int
    uniform_names: tuple
    thread_names: tuple
    unrolled: bool = False    # the innermost loop is over a compile-time tuple: no break or continue, a return
                              # only outside runtime loops, and where `returns`
    returns: bool = True


class ProgramWriter:
    """Draws one random kernel body, a line at a time, with its oracle's version of each line."""

    def __init__(self, draw):
        self.draw = draw
        self.kernel_lines: list = []
        self.oracle_lines: list = []
        self.names = 0            # loop and counter variables made so far
        self.slots = 0            # LOG slots used
        self.budget = STATEMENTS
        self.diverged = UNIFORM   # the level of the `return`s so far: what follows them is at least that

    def body(self) -> tuple:
        """The kernel's body and the oracle's."""
        top = Scope(UNIFORM, None, 1, ("b",) + US, ("t",) + XS)
        while self.budget > 0:
            self.statement(top)
        return "\n".join(self.kernel_lines) + "\n", "\n".join(self.oracle_lines) + "\n"

    def emit(self, scope: Scope, text: str, oracle: str | None = None):
        self.kernel_lines.append("    " * scope.depth + text)
        self.oracle_lines.append("    " * scope.depth + (text if oracle is None else oracle))

    def level(self, scope: Scope) -> int:
        return max(scope.level, self.diverged)

    def block(self, scope: Scope):
        """One to three statements, then maybe a jump out (`break`, `continue`, `return`)."""
        for _ in range(self.draw(st.integers(1, 3))):
            self.statement(scope)
        jumps = self._jumps(scope)
        if jumps and self.draw(st.integers(0, 3)) == 0:
            jump = self.draw(st.sampled_from(jumps))
            self.emit(scope, jump)
            if jump == "return":
                self.diverged = self.level(scope)

    def _jumps(self, scope: Scope) -> list:
        if scope.unrolled:
            return ["return"] if scope.loop is None and scope.returns else []
        if scope.loop is None:
            return ["return"] if scope.depth > 1 else []    # `return` is not supported inside loops
        allowed = scope.loop == THREAD or self.level(scope) <= scope.loop
        return ["break", "continue"] if allowed else []

    def statement(self, scope: Scope):
        self.budget -= 1
        kinds = ["assign", "augment", "store", "float", "register"]
        if self.level(scope) == UNIFORM:
            kinds += ["uniform_assign", "exchange"]
        if self.level(scope) <= WARP:
            kinds += ["shuffle"]
        if self.budget > 0 and scope.depth < 4:
            kinds += ["if", "for", "while"]
        getattr(self, "_" + self.draw(st.sampled_from(kinds)))(scope)

    # ----------------------------------------------------------- simple statements
    def _assign(self, scope: Scope):
        self.emit(scope, f"{self.draw(st.sampled_from(XS))} = {self.bounded(scope.thread_names)}")

    def _augment(self, scope: Scope):
        op = self.draw(st.sampled_from(["+=", "-=", "^=", "|=", "&=", "*="]))
        value = self.draw(st.integers(-3, 3)) if op == "*=" else self.bounded(scope.thread_names)
        self.emit(scope, f"{self.draw(st.sampled_from(XS))} {op} {value}")

    def _store(self, scope: Scope):
        slot = self.slots % SLOTS
        self.slots += 1
        self.emit(scope, f"LOG[b, t, {slot}] = {self.expr(scope.thread_names)}")

    def _float(self, scope: Scope):
        value = self.bounded(scope.thread_names, limit=4096)
        self.emit(scope, self.draw(st.sampled_from([f"f += {value} * 0.5", f"f = max(f, {value} * 0.25)"])))

    def _register(self, scope: Scope):
        op = self.draw(st.sampled_from(["=", "+="]))
        self.emit(scope, f"r[{self.register_index(scope.thread_names)}] {op} {self.bounded(scope.thread_names)}")

    def _uniform_assign(self, scope: Scope):
        self.emit(scope, f"{self.draw(st.sampled_from(US))} = {self.bounded(scope.uniform_names)}")

    def _exchange(self, scope: Scope):
        """Every thread publishes a value, and after a barrier reads another thread's (or a fixed) one."""
        step, shift = self.draw(st.sampled_from([1, 3, 5, 63])), self.draw(st.integers(0, THREADS - 1))
        self.emit(scope, f"s[t] = {self.expr(scope.thread_names)}")
        self.emit(scope, "td.syncthreads()", "yield")
        if self.draw(st.booleans()):
            self.emit(scope, f"{self.draw(st.sampled_from(XS))} = s[(t * {step} + {shift}) % {THREADS}]")
        else:   # a load at a uniform index is uniform
            self.emit(scope, f"{self.draw(st.sampled_from(US))} = s[{shift}]")
        self.emit(scope, "td.syncthreads()", "yield")

    def _shuffle(self, scope: Scope):
        """A warp shuffle; the oracle yields it to the scheduler, which sends back the value read."""
        kind, width = self.draw(st.sampled_from(["xor", "down", "up", "idx"])), self.draw(st.sampled_from([32, 32, 8, 4]))
        lane = self.expr(scope.thread_names, 2) if kind == "idx" else self.draw(st.integers(0, 33))
        value, target = self.bounded(scope.thread_names), self.draw(st.sampled_from(XS))
        op = self.draw(st.sampled_from(["=", "+="]))
        option = "" if width == 32 else f", width={width}"
        self.emit(scope, f"{target} {op} td.shfl_{kind}({value}, {lane}{option})",
                  f"{target} {op} (yield ('{kind}', {value}, {lane}, {width}))")

    # ----------------------------------------------------------- compound statements
    def _if(self, scope: Scope):
        level = self.level(scope)
        private = None      # a variable the first branch, if warp-uniform, sets from uniform values
        for keyword in ["if"] + ["elif"] * self.draw(st.integers(0, 1)):
            cond, cond_level = self.scoped_condition(scope)
            level = max(level, cond_level)     # an `elif` or `else` runs where the conditions before are false
            inner = replace(scope, level=level, depth=scope.depth + 1)
            if keyword == "if" and level == WARP and self.draw(st.booleans()):
                # inside the branch it may bound loops around shuffles (block-level there); after it, each
                # thread reads its own value (the cpu target gives the branch a copy of it, also each copy of the
                # branch an unrolled tuple loop makes: seed 936)
                private = self._fresh("p")
                self.emit(scope, f"{private} = 0")
                self.emit(scope, f"{keyword} {cond}:")
                self.emit(inner, f"{private} = {self.bounded(scope.uniform_names)}")
                inner = replace(inner, uniform_names=inner.uniform_names + (private,))
                if self.draw(st.booleans()):     # a shuffle loop it bounds
                    var = self._fresh("j")
                    self.emit(inner, f"for {var} in range(min(max({private}, -3), 3)):")
                    body = self._loop_scope(inner, UNIFORM, var)
                    (self._shuffle if self.level(body) <= WARP else self.statement)(body)
            else:
                self.emit(scope, f"{keyword} {cond}:")
            self.block(inner)
        if self.draw(st.booleans()):
            self.emit(scope, "else:")
            self.block(replace(scope, level=level, depth=scope.depth + 1))
        if private is not None:
            x = self.draw(st.sampled_from(XS))
            self.emit(scope, f"{x} = min(max({x} + {private}, -5000), 5000)")

    def _for(self, scope: Scope):
        var = self._fresh("j")
        if self.draw(st.integers(0, 3)) == 0:     # over a compile-time tuple: unrolled, left only by a return
            values = tuple(self.draw(st.lists(st.integers(-3, 3), min_size=1, max_size=3)))
            # a return in one iteration comes before the barriers and shuffles of the next (the body's text before
            # it): none from here on. A tuple loop inside one that may not return may not either: its return would
            # come before the outer loop's next iteration (seed 804), which could not know it at its start
            returns = self.draw(st.booleans()) and scope.returns
            if returns and len(values) > 1:
                self.diverged = THREAD
            self.emit(scope, f"for {var} in {values!r}:")
            self.block(replace(scope, depth=scope.depth + 1, unrolled=True, returns=returns,
                               uniform_names=scope.uniform_names + (var,)))
            return
        names, level = self._names(scope, warp_bounds=True)
        step = self.draw(st.sampled_from([1, 1, 2, -1, -2]))
        if self.draw(st.booleans()):      # constant bounds: the unroll pass may unroll it
            start, stop = self.draw(st.integers(-2, 3)), self.draw(st.integers(-2, 5))
            loop = self.draw(st.sampled_from(["range", "td.unroll"]))
        else:
            bound = self.warp_bound if level == WARP else self.trip_bound
            start, stop, loop = bound(names), bound(names), "range"
        start, stop = (stop, start) if step < 0 else (start, stop)
        arguments = f"{start}, {stop}, {step}" if step != 1 or self.draw(st.booleans()) else f"{start}, {stop}"
        self.emit(scope, f"for {var} in {loop}({arguments}):", f"for {var} in range({arguments}):")
        body = self._loop_scope(scope, level, var)
        if body.loop == WARP and self.level(body) <= WARP and self.draw(st.booleans()):
            self._shuffle(body)           # a shuffle loop that a warp leaves, or skips a trip of
            self.emit(body, f"if {self.warp_condition(body)}:")
            self.emit(replace(body, depth=body.depth + 1), self.draw(st.sampled_from(["break", "continue"])))
        self.block(body)

    def _while(self, scope: Scope):
        """A while loop that counts its trips first, so that `continue` cannot make it endless; its condition may
        differ between warps."""
        counter = self._fresh("w")
        names, level = self._names(scope, warp_bounds=True)
        condition = self.warp_bound(names) + " > 0" if level == WARP else self.condition(names)
        self.emit(scope, f"{counter} = 0")
        self.emit(scope, f"while {counter} < {self.draw(st.integers(1, 4))} and ({condition}):")
        inner = self._loop_scope(scope, level, None)
        self.emit(inner, f"{counter} += 1")
        self.block(inner)

    def _loop_scope(self, scope: Scope, bounds_level: int, var: str | None) -> Scope:
        """The scope of a loop body: a `break` or `continue` more divergent than the loop makes the whole body
        per-thread."""
        level = max(bounds_level, self.level(scope))
        jumps = level if level < THREAD and self.draw(st.booleans()) else THREAD
        if jumps == UNIFORM and self.draw(st.booleans()):
            jumps = WARP      # a warp may leave the loop: no barrier inside then, shuffles still
        names = {"uniform_names": scope.uniform_names + (var,)} if level == UNIFORM and var else \
            {"thread_names": scope.thread_names + ((var,) if var else ())}
        return replace(scope, level=max(level, jumps), loop=jumps, depth=scope.depth + 1, unrolled=False, **names)

    def _names(self, scope: Scope, warp_bounds: bool = False) -> tuple:
        """The names a loop bound may read, and their level (`warp_bounds`: a `for` loop's bounds may differ
        between warps, the warp index `t // 32` one of the names)."""
        if self.level(scope) <= WARP:
            choice = self.draw(st.integers(0, 2 if warp_bounds else 1))
            if choice == 0:
                return scope.uniform_names, UNIFORM
            if choice == 2:
                return scope.uniform_names + ("(t // 32)",), WARP
        return scope.uniform_names + scope.thread_names, THREAD

    def scoped_condition(self, scope: Scope) -> tuple:
        """An `if` condition, and its level: warp-uniform ones test the warp index."""
        choice = self.draw(st.integers(0, 2))
        if choice == 0:
            warp = self.warp_condition(scope)
            return (warp, WARP) if self.draw(st.booleans()) else \
                (f"({warp}) {self.draw(st.sampled_from(['and', 'or']))} ({self.condition(scope.uniform_names)})", WARP)
        if choice == 1:
            return self.condition(scope.uniform_names), UNIFORM
        return self.condition(scope.uniform_names + scope.thread_names), THREAD

    def warp_condition(self, scope: Scope) -> str:
        """A condition that tests the warp index (the same in every lane of a warp)."""
        u = self.expr(scope.uniform_names, 2)
        return self.draw(st.sampled_from([f"t // 32 == ({u}) % 2", f"t // 32 != ({u}) % 2", "t < 32", "t >= 32"]))

    def _fresh(self, prefix: str) -> str:
        self.names += 1
        return f"{prefix}{self.names}"

    # ----------------------------------------------------------- expressions
    def expr(self, names: tuple, size: int | None = None) -> str:
        """A random integer expression of about `size` leaves over `names`."""
        size = self.draw(st.integers(1, 4)) if size is None else size
        if size <= 1:
            return self.leaf(names)
        kind = self.draw(st.sampled_from(["bin", "bin", "div", "unary", "minmax", "select", "call"]))
        left = self.draw(st.integers(1, size - 1))
        a, b = self.expr(names, left), self.expr(names, size - left)
        if kind == "bin":
            return f"({a} {self.draw(st.sampled_from(['+', '-', '*', '&', '|', '^']))} {b})"
        if kind == "div":
            divisor = self.draw(st.integers(-9, 9).filter(bool)) if self.draw(st.booleans()) else f"({b} % 7 + 1)"
            return f"({a} {self.draw(st.sampled_from(['//', '%']))} {divisor})"
        if kind == "unary":
            return self.draw(st.sampled_from([f"(-{a})", f"abs({a})"]))
        if kind == "minmax":
            return f"{self.draw(st.sampled_from(['min', 'max']))}({a}, {b})"
        if kind == "select":
            return f"({a} if {self.condition(names, 1)} else {b})"   # leaves only: trees stay small
        return f"{self.draw(st.sampled_from(['bend', 'steps']))}({a}, {b})"

    def leaf(self, names: tuple) -> str:
        choice = self.draw(st.integers(0, 5))
        if choice == 0:
            return str(self.draw(st.integers(-9, 9)))
        if choice == 1:
            index = f"(t + {self.draw(st.integers(0, 9))}) % {THREADS}" if "t" in names else self.draw(st.integers(0, 63))
            return self.draw(st.sampled_from([f"A[b, {index}]", f"B[(b + {self.draw(st.integers(0, 3))}) % 4]"]))
        if choice == 2 and "t" in names:     # registers are per-thread
            return f"r[{self.register_index(names)}]"
        return self.draw(st.sampled_from(names))

    def register_index(self, names: tuple) -> str:
        """A constant index (the cpu target keeps such elements in locals) or one computed at run time."""
        if self.draw(st.booleans()):
            return str(self.draw(st.integers(0, REGISTERS - 1)))
        return f"{self.draw(st.sampled_from(names))} % {REGISTERS}"

    def bounded(self, names: tuple, limit: int = 5000) -> str:
        """An expression kept within +-`limit`, so that values do not grow from statement to statement."""
        e = self.expr(names)
        return self.draw(st.sampled_from([f"min(max({e}, {-limit}), {limit})", f"({e} % {2 * limit - 1} - {limit - 1})"]))

    def trip_bound(self, names: tuple) -> str:
        return f"min(max({self.expr(names, 2)}, -3), 5)"

    def warp_bound(self, names: tuple) -> str:
        """A bound that may differ between warps: the warp index and a uniform leaf (no @td.func call, whose
        inlined variables, shared with its calls in the loop, the cpu target could not give copies)."""
        names = tuple(n for n in names if n != "(t // 32)")
        return f"min(max((t // 32) {self.draw(st.sampled_from(['+', '-', '*']))} {self.leaf(names)}, -3), 5)"

    def condition(self, names: tuple, size: int | None = None) -> str:
        """A random condition over `names`; its expressions have about `size` leaves."""
        kind = self.draw(st.integers(0, 5))
        if kind <= 1:
            compare = self.draw(st.sampled_from(['<', '<=', '>', '>=', '==', '!=']))
            return f"{self.expr(names, size)} {compare} {self.expr(names, size)}"
        if kind == 2:
            return f"{self.expr(names, 1)} <= {self.expr(names, size)} < {self.expr(names, 1)}"
        if kind == 3:
            logic = self.draw(st.sampled_from(['and', 'or']))
            return f"({self.condition(names, size)}) {logic} ({self.condition(names, size)})"
        if kind == 4:
            return f"not ({self.condition(names, size)})"
        return f"{self.expr(names, size)} % 3"       # a number as a condition: compared with zero


# ------------------------------------------------------------------ the kernel and the oracle
def kernel_source(body: str) -> str:
    """The kernel around a random body, with the device functions it calls."""
    return ("import taskdsl as td\nfrom taskdsl import f32, i64, threadIdx, blockIdx\n"
            + HELPERS.format(decorator="@td.func") + "\n\n"
            f"@td.kernel(grid={BLOCKS}, block={THREADS})\n"
            f"def random_control_flow(A: i64[{BLOCKS}, {THREADS}], B: i64[4], LOG: i64[{BLOCKS}, {THREADS}, {SLOTS}], "
            f"OUT: i64[{BLOCKS}, {THREADS}, {len(OUTPUTS)}], F: f32[{BLOCKS}, {THREADS}]):\n"
            f"    s = td.shared(i64, ({THREADS},))\n    t = threadIdx.x\n    b = blockIdx.x\n"
            f"    r = td.registers(i64, ({REGISTERS},))\n"
            + PROLOGUE.format(threads=THREADS, registers=REGISTERS) + body + EPILOGUE)


def oracle_source(body: str) -> str:
    """The same program as a Python generator of one thread, yielding at each barrier and shuffle."""
    return ("from taskdsl import i64\n" + HELPERS.format(decorator="") + "\n\n"
            "def thread(t, b, s, A, B, LOG, OUT, F):\n    if False:\n        yield\n"
            f"    r = Memory(np.zeros({REGISTERS}, np.int64))\n"
            + PROLOGUE.format(threads=THREADS, registers=REGISTERS) + body + EPILOGUE)


class Outside(Exception):
    """An integer of the oracle left i64: the example cannot be checked."""


class Checked(int):
    """A Python int that must stay within i64 through every operation."""

    def __new__(cls, value):
        if not -2**63 <= value < 2**63:
            raise Outside(value)
        return super().__new__(cls, value)


def _checked(value):
    return Checked(value) if isinstance(value, int) and not isinstance(value, bool) else value


for _name in ("add", "sub", "mul", "floordiv", "mod", "and", "or", "xor"):
    _op = getattr(operator, _name + "_") if _name in ("and", "or") else getattr(operator, _name)
    setattr(Checked, f"__{_name}__", lambda self, other, op=_op: _checked(op(int(self), other)))
    setattr(Checked, f"__r{_name}__", lambda self, other, op=_op: _checked(op(other, int(self))))
Checked.__neg__ = lambda self: Checked(-int(self))
Checked.__abs__ = lambda self: Checked(abs(int(self)))


class Memory:
    """A tensor of the oracle: reads give checked ints (or floats), writes convert nothing."""

    def __init__(self, array: np.ndarray):
        self.array = array

    def __getitem__(self, index):
        value = self.array[index]
        return Checked(int(value)) if self.array.dtype.kind == "i" else float(value)

    def __setitem__(self, index, value):
        self.array[index] = value


DONE, BARRIER = "done", None     # what a thread of the oracle is waiting at (else a shuffle's tuple)
WARPS = [range(w, w + 32) for w in range(0, THREADS, 32)]


def shuffled(requests: list) -> list:
    """The value each lane of a warp reads in one shuffle: the PTX ISA's `shfl.sync`, with the segment mask and
    clamp that CUDA's `__shfl_*_sync(mask, v, arg, width)` pass."""
    values = [value for _, value, _, _ in requests]
    out = []
    for lane, (kind, _, arg, width) in enumerate(requests):
        first = lane & (32 - width)
        last, offset = first | (width - 1), arg & 31      # only the low 5 bits of the lane argument count
        source = {"xor": lane ^ offset, "down": lane + offset, "up": lane - offset,
                  "idx": first | (arg & (width - 1))}[kind]
        inside = source >= first if kind == "up" else source <= last   # xor may read an earlier segment
        out.append(values[source] if inside else values[lane])
    return out


def run_oracle(thread, inputs: dict, outputs: dict):
    """Run every block's threads in lockstep: each warp from shuffle to shuffle, the block from barrier to barrier."""
    tensors = {name: Memory(x) for name, x in {**inputs, **outputs}.items()}
    for b in range(BLOCKS):
        shared = Memory(np.zeros(THREADS, np.int64))
        threads = [thread(t, b, shared, **tensors) for t in range(THREADS)]
        waiting = [_step(g, None) for g in threads]
        while any(w is not DONE for w in waiting):
            at_shuffle = [lanes for lanes in WARPS if any(isinstance(waiting[t], tuple) for t in lanes)]
            for lanes in at_shuffle:
                requests = [waiting[t] for t in lanes]
                assert all(isinstance(r, tuple) and r[0::3] == requests[0][0::3] for r in requests), \
                    "the writer put a shuffle where some lanes of the warp do not reach it"
                for t, value in zip(lanes, shuffled(requests)):
                    waiting[t] = _step(threads[t], value)
            if not at_shuffle:
                assert all(w is BARRIER for w in waiting), "the writer put a barrier where some threads do not reach it"
                waiting = [_step(g, None) for g in threads]


def _step(thread, value):
    """Run `thread` to its next barrier or shuffle, sending it `value` (what its last shuffle read)."""
    try:
        return thread.send(value)
    except StopIteration:
        return DONE


def _outputs() -> dict:
    return {"LOG": np.full((BLOCKS, THREADS, SLOTS), -777, np.int64),
            "OUT": np.zeros((BLOCKS, THREADS, len(OUTPUTS)), np.int64),
            "F": np.zeros((BLOCKS, THREADS), np.float32)}


# No shrinking: a failure prints the kernel and the first wrong value, and shrinking means compiling a kernel
# per attempt (minutes of CI).
@settings(max_examples=12, deadline=None, phases=[Phase.explicit, Phase.reuse, Phase.generate],
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(data=st.data(), seed=st.integers(0, 2**16), fast=st.booleans())
def test_random_control_flow_matches_python(data, seed, fast):
    td.fast_compile(fast)   # the optimized path unrolls constant loops and simplifies after
    body, oracle_body = ProgramWriter(data.draw).body()
    rng = np.random.default_rng(seed)
    inputs = {"A": rng.integers(-1000, 1001, (BLOCKS, THREADS)), "B": rng.integers(-6, 7, 4)}
    expected = _outputs()
    namespace: dict = {"Memory": Memory, "np": np}
    exec(compile(oracle_source(oracle_body), "<oracle>", "exec"), namespace)
    try:
        run_oracle(namespace["thread"], inputs, expected)
    except Outside:
        assume(False)
    text = kernel_source(body)
    kernel = load_program(text, "random_control_flow").random_control_flow
    runs = {td.get_target(): _outputs()}
    try:
        kernel(*inputs.values(), *runs[td.get_target()].values())
    except td.DSLError as error:   # every program the writer makes is legal
        raise AssertionError(f"{error}\n{text}") from error
    if td.get_target() == "cpu" and host_compiler() is not None:    # the cuda twin runs the CUDA source itself
        runs["cuda on host"] = _outputs()
        run_on_host(kernel, *inputs.values(), *runs["cuda on host"].values())
    for target, got in runs.items():
        for name, want in expected.items():
            wrong = np.argwhere(got[name] != want)
            assert not wrong.size, (f"{target}: {name}{tuple(wrong[0])}: got {got[name][tuple(wrong[0])]}, expected "
                                    f"{want[tuple(wrong[0])]} ({len(wrong)} wrong)\n{text}")
