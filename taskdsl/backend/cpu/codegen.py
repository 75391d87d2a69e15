"""IR -> Python source for numba: a function over a range of blocks, each region a loop over threads.

Generated shape (see fission.py for how regions come about):

    @njit(nogil=True, cache=True)
    def kernel(A, B, C, launch_ints, block_begin, block_end):
        M = launch_ints[np.uint64(0)]      # sizes and grid: M, N, K, grid_x, grid_y, grid_z
        ...
        sa = np.empty((64, 8), float32)  # shared memory, one block's (reused by the next)
        acc = np.empty((256, 4, 4), float32)  # registers: one row per thread
        for block_id in range(block_begin, block_end):
            bx, by, bz = ...               # blockIdx
            for tid in range(256):         # region 1
                ...
            for k0 in range(0, K, 8):      # uniform loop around a barrier
                for tid in range(256): ... # region 2

A block of one thread has no thread loop (`tid = 0`), and assignments of indices nothing reads are left out.
Under `td.fast_compile` the loops of step 1 are `while` loops (`counted_loop`): numba compiles them faster.

The launcher runs ranges of blocks on the calling thread and helper threads (`threads.py`; the function releases
the GIL; this compiles much faster than numba's parallel=True on large unrolled bodies). Blocks run
serially when the kernel does atomics on global memory (which makes those atomics exact)
or debug mode is on. In debug mode every access goes through a checking
helper, and shared accesses also feed the race detector.
"""
from __future__ import annotations

import math
import re
from collections import Counter
from dataclasses import dataclass

import numpy as np

from ... import ir
from ...passes.bounds import int_range
from ..naming import NameTable, identifier
from . import fission as F

_MATH = {"exp": "math.exp", "log": "math.log", "log2": "math.log2", "sqrt": "math.sqrt", "sin": "math.sin",
         "cos": "math.cos", "tanh": "math.tanh", "asin": "math.asin", "acos": "math.acos", "atan": "math.atan",
         "sinh": "math.sinh", "cosh": "math.cosh", "asinh": "math.asinh", "acosh": "math.acosh",
         "atanh": "math.atanh", "erf": "math.erf", "floor": "np.floor", "ceil": "np.ceil",
         "rint": "np.rint",
         "pow": "rt.pow", "abs": "abs", "max": "max", "min": "min", "rsqrt": "rt.rsqrt", "exp2": "rt.exp2",
         "sigmoid": "rt.sigmoid", "fma": "rt.fma"}
_F32_MATH = {"erf": "rt.erf_f32", "tanh": "rt.tanh_f32", "exp": "rt.exp_f32",     # vectorizable approximations
             "log": "rt.log_f32", "sigmoid": "rt.sigmoid_f32",                      # (support.py)
             "sin": "rt.sin_f32", "cos": "rt.cos_f32"}                              # (trig.py)
# Python's max / min on floats depend on the argument order when one is a NaN; these keep it
_FLOAT_MATH = {"max": "rt.fmax", "min": "rt.fmin"}
# `v = max(v, x)` of floats: LLVM's own maximum, which it vectorizes as a reduction (support.running_max)
_RUNNING = {"max": "rt.running_max", "min": "rt.running_min"}
_NP_TYPES = {"f16": "np.uint16", "bf16": "np.uint16", "f8e4m3": "np.uint8", "f8e5m2": "np.uint8", "f32": "np.float32",
             "f64": "np.float64", "i8": "np.int8", "i16": "np.int16", "i32": "np.int32", "i64": "np.int64",
             "u8": "np.uint8", "u16": "np.uint16", "u32": "np.uint32", "u64": "np.uint64", "bool": "np.bool_"}
_PY_OPS = {"and": "and", "or": "or"}
_EAGER_OPS = {"and": "&", "or": "|"}     # for operands `plain`: both evaluated, no branch


def plain(e: ir.Expr, locals_: dict | None = None) -> bool:
    """Whether `e` is a boolean of integer arithmetic (no division, no shift) and comparisons on variables (of
    floats: of variables and constants only), the register elements held in locals (`locals_`, keyed by (buffer
    uid, element)) counting as variables:
    cheap, and safe to evaluate when a short-circuit would not (a guard such as `s < 32 and (m >> s) & 1`
    keeps its `and`). `a and b` of such operands is emitted as `a & b`: Python's `and` is a branch, and a
    branch in a loop body stops LLVM from vectorizing it (a depthwise conv's taps' bounds tests,
    `ih >= 0 and ih < H and iw >= 0 and iw < W`, left its channel loop scalar: 15x slower)."""
    return e.dtype.name == "bool" and _plain_value(e, locals_ or {})


_UNSAFE_OPS = ("//", "%", "/", "<<", ">>")   # a zero divisor, or a shift count past the width: undefined
_COMPARISONS = ("<", "<=", ">", ">=", "==", "!=")
# under `td.fast_compile`, register and shared buffers of up to this many bytes in all live in the stack frame of
# a kernel's call (`rt.stack_array`, registers first), where LLVM knows they alias no argument and, where its own
# unrolling leaves every index constant, keeps them in registers: a register tile left in loops then computes in
# registers as an unrolled one does (the 6x32 tile matmul at 1024^3: 98 GFLOP/s, 18 with its tile on the heap,
# 101 optimized). Optimized kernels, whose tiles the IR unrolls, keep numpy arrays: with their buffers on the stack
# ResNet-50 ran 1.8% slower (one process, 20 rounds), MobileNet-V2 no faster. Deeper frames could overflow the
# stacks of numba's worker threads.
STACK_BYTES = 64 * 1024


def _plain_value(e: ir.Expr, locals_: dict) -> bool:
    if isinstance(e, (ir.Const, ir.Var, ir.SpecialReg)):
        return True
    if isinstance(e, ir.Load):
        return len(e.indices) == 1 and isinstance(e.indices[0], ir.Const) and \
            (e.buffer.uid, e.indices[0].value) in locals_
    if isinstance(e, ir.Binary) and e.a.dtype.is_float:     # a comparison of float variables (a NaN test, say)
        return e.op in _COMPARISONS and all(isinstance(x, (ir.Const, ir.Var)) for x in (e.a, e.b))
    if isinstance(e, ir.Binary):
        return e.op not in _UNSAFE_OPS and _plain_value(e.a, locals_) and _plain_value(e.b, locals_)
    if isinstance(e, ir.Unary):
        return e.op != "~" and _plain_value(e.a, locals_)        # numba's ~ of a bool is an int
    return False


def speculable(e: ir.Select) -> bool:
    """Whether both operands of `e` may be computed at every element, as one select (`rt.select`) computes them: no
    load but of a constant element (`ir.Load.at_constant_element`) or one its condition makes anyway (a padding's
    `x[i] if 0 <= i < n else 0` keeps its branch), no integer division (x86 traps), no call but pure math; or a
    select a library made `eager` (its loads at clamped indices)."""
    if e.eager:
        return True
    made = _MadeLoads.of(e.cond)
    for operand in (e.a, e.b):
        for x in ir.collect(operand, (ir.Load, ir.Binary, ir.Call, ir.Atomic)):
            if isinstance(x, ir.Load) and not x.at_constant_element and \
                    not any(ir.structurally_equal(x, m) for m in made):
                return False
            if isinstance(x, ir.Binary) and x.divides_integers:
                return False
            if isinstance(x, ir.Atomic) or (isinstance(x, ir.Call) and x.func not in _MATH):
                return False
    return True


class _MadeLoads(ir.Visitor):
    """The loads an expression makes whatever its values are: not those of the right side of an `and` / `or` (a
    guard such as `i < n and x[i] > 0`) nor of a select's sides."""

    def __init__(self):
        self.loads: list = []

    @classmethod
    def of(cls, e: ir.Expr) -> list:
        """The loads `e` always makes."""
        walker = cls()
        walker.visit(e)
        return walker.loads

    def visit_Load(self, e: ir.Load):
        self.loads.append(e)
        self.generic_visit(e)

    def visit_Binary(self, e: ir.Binary):
        if e.op in ("and", "or"):
            self.visit(e.a)
        else:
            self.generic_visit(e)

    def visit_Select(self, e: ir.Select):
        self.visit(e.cond)


@dataclass(frozen=True)
class DebugSite:
    """What a debug check number refers to: the statement, the buffer and the kind of access."""

    loc: object
    buffer: str
    access: str
    hidden_axes: int = 0   # registers carry a leading per-thread axis the user never wrote


@dataclass
class CpuSource:
    """Generated Python module text plus what the runtime needs to call and to explain errors."""

    text: str
    entry: str
    sites: list
    parallel: bool
    flat: bool      # tensors are passed as flat 1-D views
    opt_level: int = 3      # LLVM's, for numba (see `launch.compiler_settings`)
    outlined: tuple = ()    # the CpuSources of the functions the entry calls through addresses (`passes.outline`)
    addresses: tuple = ()   # their machine code's, once the runtime has compiled them (`cpu_modules`)

    def listing(self) -> str:
        """The module's text, then each outlined function's module, as `Kernel.source` shows them."""
        return "".join([self.text, *(f"\n# ---- outlined function {i} (its own module): `outlined_{i}` above\n"
                                     f"{o.text}" for i, o in enumerate(self.outlined))])


def np_type(dtype) -> str:
    """The numpy type numba holds `dtype` in (f16/bf16 as their uint16 bit patterns, 8-bit floats as uint8 ones)."""
    return _NP_TYPES[dtype.name]


def _held_as_bits(dtype) -> bool:
    return dtype.computes_in_f32


def emit_python(fn: ir.Function, debug: bool = False, fast: bool = False) -> CpuSource:
    """The numba module of a kernel prepared by `passes.lower_for_cpu(fn, debug)`.

    Its entry runs a range of blocks (a block-parallel kernel's blocks spread over threads:
    `parallel.launch`), called through its address. Under `fast` (`td.fast_compile`) the kernel calls the
    `support` helpers instead of inlining them and compiles at -O1, which together halve numba's time on a
    typical small kernel.

    Each of the kernel's `outlined` functions is a module of its own, emitted as a one-block kernel whose register
    buffers live on the stack; the entry reads their addresses after its sizes and grid in `launch_ints` and calls
    them through `rt.call_entry`, with the (1, 1, 1) grid in `outlined_ints`. Its module names its numba argument
    types in `SIGNATURE` (arrays as "float32[]"), which the runtime compiles it for.
    """
    src = _PythonEmitter(fn, debug, fast).emit()
    src.outlined = tuple(_PythonEmitter(f, debug, fast, outlined=True).emit() for f in fn.outlined)
    return src




_INDEX_NAMES = ("bx", "by", "bz", "tx", "ty", "tz", "tid")     # in the order one's assignment reads the next


def _without_unread(lines: list, names: tuple) -> list:
    """`lines` less the assignments of `names` (each assigned by the lines that start with it, and nowhere else:
    block and thread indices, hoisted bases) that no other line reads, in order (`by = ...` in a kernel of one grid
    axis, `tid = 0` of one thread): numba types and lowers each, and LLVM drops it anyway."""
    for name in names:
        assigned = f"{name} = "
        if not any(re.search(rf"\b{name}\b", line) for line in lines
                   if not line.lstrip().startswith((assigned, "#"))):
            lines = [line for line in lines if not line.lstrip().startswith(assigned)]
    return lines


def _register_accesses(stmts: list, registers: dict) -> list:
    """The loads, stores and atomics of register buffers in `stmts`, in visiting order (one walk)."""
    return [a for s in stmts for a in ir.collect(s, ir.ELEMENT_ACCESSES) if a.buffer.uid in registers]


def _read_before_written(stmts: list, key_of) -> set:
    """The keys (`key_of` an access: a promoted register element's key, or None) that some path through `stmts`
    may read before it writes them. A loop's body may run no times and a branch may be skipped: what they write
    counts after them only where both branches of an `if` write it."""
    early: set = set()

    def reads(node, written: set) -> None:
        for load in ir.collect(node, ir.Load):
            key = key_of(load)
            if key is not None and key not in written:
                early.add(key)

    def walk(s, written: set) -> set:      # the keys written after `s`
        if isinstance(s, ir.Seq):
            for x in s.stmts:
                written = walk(x, written)
        elif isinstance(s, ir.Store):
            reads(s.value, written)
            for index in s.indices:
                reads(index, written)
            key = key_of(s)
            written = written | {key} if key is not None else written
        elif isinstance(s, ir.If):
            reads(s.cond, written)
            written = walk(s.then, written) & (walk(s.orelse, written) if s.orelse is not None else written)
        elif isinstance(s, ir.For):
            for bound in (s.start, s.stop, s.step):
                reads(bound, written)
            walk(s.body, written)
        elif isinstance(s, ir.While):
            reads(s.cond, written)
            walk(s.body, written)
        else:      # any other statement writes nothing a later statement may count on
            reads(s, written)
        return written

    walk(ir.Seq(tuple(stmts)), set())
    return early


def _regions_per_register(items: list, registers: dict) -> Counter:
    """How many fission regions access each register buffer (by uid)."""
    counts: Counter = Counter()
    for region in F.regions(items):
        counts.update({a.buffer.uid for a in _register_accesses(region.stmts, registers)})
    return counts


class _PythonEmitter:
    def __init__(self, fn: ir.Function, debug: bool, fast: bool, outlined: bool = False):
        self.fn = fn
        self.is_outlined = outlined     # (this is an outlined function; `fn.outlined` are the ones it calls)
        self.debug = debug
        self.fast = fast
        self.program = F.fission(fn)
        self.name = NameTable({"rt", "njit", "block_id", "block_begin", "block_end", "tid", "tx", "ty", "tz", "bx", "by", "bz",
                               "grid_x", "grid_y", "grid_z", "epoch", "launch_ints", "outlined_ints",
                               *(f"outlined_{i}" for i in range(len(fn.outlined)))})
        self.lines: list = []
        self.promoted = False   # inside a region body, thread-array variables are plain locals
        self.flat = not debug   # accesses were flattened to 1-D by lower_for_cpu
        self.sites: list = []
        self.loc = None
        self.threads = fn.num_threads
        allocations = ir.collect(fn.body, ir.Allocate, expressions=False)
        allocs = list({a.buffer.uid: a.buffer for a in allocations}.values())
        self.shared = [b for b in allocs if b.scope == "shared"]
        scratch = {a.buffer.uid for a in allocations if a.scratch}
        self.registers = {b.uid: b for b in allocs if b.scope == "register"}
        self.promoted_elements: dict = {}   # (buffer uid, element) -> local name, inside a region
        # who reads shared memory, for debug mode's race check: `tid` in a region; at block level (a loop bound)
        # every thread at once
        self.block_reader = "np.int64(-1)" if self.threads > 1 else "np.int64(0)"
        self.reader = self.block_reader
        self.shadows = {b.uid: self.name.derived((b.uid, "shadow"), f"shadow_{self.name(b)}") for b in self.shared
                        if b.uid not in scratch}
        self.register_regions = _regions_per_register(self.program.items, self.registers)
        self.on_stack = _stacked([*self.registers.values(), *self.shared], self.threads) \
            if (fast or outlined) and not debug else set()     # (an outlined function's are its frame's, per call)
        # dot4 reads its register operands in memory, never split into locals; its accumulators go on the
        # stack, where LLVM keeps them in vector registers
        dots = ir.collect(fn.body, ir.Dot4, expressions=False)
        self.dot4_operands = {r.buffer.uid for s in dots for r in (s.acc, s.a, s.b)}
        self.on_stack |= {s.acc.buffer.uid for s in dots} & self.registers.keys()
        self.constants: dict = {}      # module-level name -> numpy scalar constructor (see `constant`)
        self.bases: dict = {}          # index base text -> (its local, the uids it reads), in a straight run (`run`)
        self.loop_bases: list = []     # per enclosing loop, its `loop_level`
        self.hoisted: list = []        # the locals `loop_level` made (an access may take another base after all)

    # ------------------------------------------------------------------ module
    def emit(self) -> CpuSource:
        fn = self.fn
        global_atomics = any(a.buffer.scope == "global" for a in ir.collect(fn.body, ir.Atomic))
        parallel = not (global_atomics or self.debug)  # debug: serial blocks report the first error exactly
        args = [self.name(p) for p in fn.params] + ["launch_ints", "block_begin", "block_end"]
        entry = "kernel_" + self.name(ir.Var(fn.name, ir.types.i32))
        out = ["import math", "import numpy as np", "from numba import njit",
               f"import taskdsl.backend.cpu.{'support_calls' if self.fast else 'support'} as rt", "",
               f"# {fn.name}: generated by taskdsl from {fn.source_file}",
               "@njit(nogil=True, cache=True, error_model='numpy', fastmath={'contract'}, pipeline_class=rt.KernelCompiler,",
               "      no_cpython_wrapper=True, no_cfunc_wrapper=True)    # called through its address: parallel.py",
               f"def {entry}({', '.join(args)}):"]
        # the sizes and the grid come in one int64 array, so that a launcher (compiled per tuple of argument types)
        # serves kernels of any number of sizes; read element by element: numba lowers unpacking an array as an
        # iteration, a bounds-checked step per name (a small kernel compiled about 10% faster without), and by an
        # unsigned index, as every index here (a constant one is what numba's dropped rewrites would rewrite)
        ints = [self.name(v) for v in fn.sizes] + ["grid_x", "grid_y", "grid_z"] + \
            [f"outlined_{i}" for i in range(len(fn.outlined))]
        out.extend(f"    {name} = launch_ints[np.uint64({i})]" for i, name in enumerate(ints))
        self.lines = out
        # per-block scratch, allocated once per call: a block writes what it reads (np.empty's garbage either
        # way), and an allocation per block cost ~10 ns of a 7x7 depthwise block's ~75. Debug mode keeps one
        # per block, so that the shadows catch a block reading what an earlier one left.
        pad = "        " if self.debug else "    "
        # a `while` loop under fast compile (see `counted_loop`), where no `continue` can skip its increment
        counted = self.fast and not self.debug and not ir.collect(fn.body, ir.Continue, expressions=False)
        block_loop = ["    block_id = block_begin", "    while block_id < block_end:"] if counted else \
            ["    for block_id in range(block_begin, block_end):"]
        block_loop += ["        bx = block_id % grid_x",
                      "        by = (block_id // grid_x) % grid_y",
                      "        bz = block_id // (grid_x * grid_y)"]
        if self.debug:
            out.extend(block_loop)
        for b in self.shared:
            out.append(self.allocation(b, self.storage_shape(b.shape), pad))
            if self.debug and b.uid in self.shadows:
                out.append(f"{pad}{self.shadows[b.uid]} = rt.new_shadow({self.name(b)})")
        for b in self.registers.values():  # one row per thread
            shape = (ir.const(self.threads * math.prod(d.value for d in b.shape)),) if self.flat else \
                (ir.const(self.threads),) + b.shape
            out.append(self.allocation(b, shape, pad))
        for v in self.program.thread_arrays.values():
            out.append(f"{pad}{self.thread_array(v)} = np.empty({self.threads}, {np_type(v.dtype)})")
        if fn.outlined:
            out.append(f"{pad}outlined_ints = np.ones(3, np.int64)")     # their grid
        for site, dtype in self.program.shuffle_sites.items():   # a `BlockMax` reads the slots of threads that skip it
            start = self.least_stored(dtype) if site in self.program.block_max_sites else "0"
            out.append(f"{pad}{self.shuffle_array(site)} = np.full({self.threads}, {start}, {np_type(dtype)})")
        if not self.debug:
            out.extend(block_loop)
        pad = "        "
        if self.debug:
            out.append(f"{pad}epoch = 1")
        before = len(out)
        self.items(self.program.items, 2)
        if len(out) == before:
            out.append(f"{pad}pass")
        if counted:
            out.append(f"{pad}block_id += 1")
        header = out.index(f"# {fn.name}: generated by taskdsl from {fn.source_file}")
        out[header:header] = [f"{name} = {text}" for name, text in self.constants.items()]
        if self.is_outlined:
            out.insert(header, f"SIGNATURE = {self.signature()!r}")
        if not self.debug:
            out = _without_unread(out, _INDEX_NAMES + tuple(self.hoisted))
        return CpuSource("\n".join(out) + "\n", entry, self.sites, parallel, self.flat, 1 if self.fast else 3)

    def signature(self) -> tuple:
        """An outlined function's parameters as `SIGNATURE` names them: numpy type names, "[]" after arrays."""
        return tuple(np_type(p.dtype).removeprefix("np.") + ("[]" if isinstance(p, ir.Buffer) else "")
                     for p in self.fn.params)

    def shape(self, dims) -> str:
        return "(" + "".join(f"{self.expr(d)}, " for d in dims) + ")"

    def allocation(self, b: ir.Buffer, shape: tuple, pad: str) -> str:
        """The statement allocating buffer `b` (as `shape`): on the stack (`_stacked`) or the heap."""
        if b.uid in self.on_stack:
            return f"{pad}{self.name(b)} = rt.stack_array({shape[0].value}, {np_type(b.dtype)})"
        return f"{pad}{self.name(b)} = np.empty({self.shape(shape)}, {np_type(b.dtype)})"

    def storage_shape(self, dims) -> tuple:
        return (ir.const(math.prod(d.value for d in dims)),) if self.flat else dims

    # ------------------------------------------------------------------ block level
    def items(self, items: list, depth: int) -> None:
        pad = "    " * depth
        start = len(self.lines)
        for it in items:
            if isinstance(it, F.Region):
                self.region(it, depth)
            elif isinstance(it, F.Barrier):
                if self.debug and not it.emulated:
                    self.lines.append(f"{pad}epoch += 1  # syncthreads()")
            elif isinstance(it, F.BlockAssign):
                self.loc = it.stmt.loc
                self.lines.append(f"{pad}{self.name(it.stmt.var)} = {self.cast(it.stmt.value, it.stmt.var.dtype)}")
            elif isinstance(it, F.BlockFor):
                self.loc = it.loop.loc
                counted = self.counted_loop(it.loop, pad)
                self.items(it.body, depth + 1)
                if counted is not None:
                    self.lines.append(f"{pad}    {counted} += 1")
            elif isinstance(it, F.BlockWhile):
                self.loc = it.loop.loc
                self.lines.append(f"{pad}while {self.expr(it.loop.cond)}:")
                self.items(it.body, depth + 1)
            elif isinstance(it, F.BlockIf):
                self.lines.append(f"{pad}if {self.expr(it.cond)}:")
                self.items(it.then, depth + 1)
                if it.orelse:
                    self.lines.append(f"{pad}else:")
                    self.items(it.orelse, depth + 1)
            elif isinstance(it, F.BlockMax):
                slots = self.shuffle_array(it.site)
                self.lines.append(f"{pad}{self.name(it.var)} = {slots}.max()")
                self.lines.append(f"{pad}{slots}[:] = {self.least_stored(it.var.dtype)}")
            elif isinstance(it, F.BlockJump):
                self.lines.append(f"{pad}{'break' if isinstance(it.stmt, ir.Break) else 'continue'}")
        if len(self.lines) == start:
            self.lines.append(f"{pad}pass")

    def region(self, region: F.Region, depth: int) -> None:
        self.reader = "tid"
        pad = "    " * depth
        jumps = any(ir.collect(x, (ir.Break, ir.Continue), expressions=False) for x in region.stmts)
        counted = False
        if self.threads == 1 and not self.debug and not jumps:
            # one thread: no loop for numba to type and lower (a `break` or `continue` might be the loop's)
            self.lines.append(f"{pad}tid = 0")
            depth -= 1
        elif self.fast and not self.debug and not jumps:    # a `while` loop, as `counted_loop` makes
            self.lines += [f"{pad}tid = 0", f"{pad}while tid < {self.threads}:"]
            counted = True
        else:
            self.lines.append(f"{pad}for tid in range({self.threads}):")
        bx, by, _ = self.fn.block
        inner = "    " * (depth + 1)
        self.lines.append(f"{inner}tx = tid % {bx}")
        if self.fn.block[1] > 1 or self.fn.block[2] > 1:
            self.lines.append(f"{inner}ty = (tid // {bx}) % {by}")
            self.lines.append(f"{inner}tz = tid // {bx * by}")
        if region.guards:
            self.lines.append(f"{inner}if {' and '.join(self.expr(g) for g in region.guards)}:")
            depth += 1
        body_pad = "    " * (depth + 1)
        arrays = self.program.thread_arrays
        # a variable's value on entry: where the region reads it before assigning it, or may leave it unassigned
        # (its write-back stores that value); a region that jumps might skip its end: every one it assigns
        entry = region.live | region.assigned if jumps else region.live | (region.assigned - region.surely)
        for uid in sorted(entry & arrays.keys()):
            self.lines.append(f"{body_pad}{self.name(arrays[uid])} = {self.thread_array(arrays[uid])}[tid]")
        # written back in order, so consecutive stores let LLVM vectorize; only for a later region
        # to read (or this one again, in a block-level loop): dead stores would keep every last
        # value of a loop live, which costs spills and shuffles in the loop
        stored = [key for key in self.promote_register_elements(region)
                  if region.in_block_loop or self.register_regions[key[0]] > 1]
        entered = self.entered_elements(region, stored)
        for (uid, element), local in self.promoted_elements.items():
            if (uid, element) in entered:
                self.lines.append(f"{body_pad}{local} = {self.register_entry_value(region, uid, element)}")
        self.promoted = True
        self.stmts(region.stmts, depth + 1)
        self.promoted = False
        for uid in sorted(region.assigned & arrays.keys()):
            self.lines.append(f"{body_pad}{self.thread_array(arrays[uid])}[tid] = {self.name(arrays[uid])}")
        for key in stored:
            self.lines.append(f"{body_pad}{self.register_slot(*key)} = {self.promoted_elements[key]}")
        if counted:
            self.lines.append(f"{inner}tid += 1")
        self.promoted_elements = {}
        self.reader = self.block_reader

    def promote_register_elements(self, region: F.Region) -> list:
        """Keep the register elements a region indexes only by constants in locals; return those it stores."""
        if not self.flat:
            return []
        accesses = _register_accesses(region.stmts, self.registers)
        dynamic = {a.buffer.uid for a in accesses if isinstance(a, ir.Atomic) or not isinstance(a.indices[0], ir.Const)}
        dynamic |= self.dot4_operands      # dot4 reads (and writes) them in memory
        stored = []
        for a in accesses:
            if a.buffer.uid in dynamic:
                continue
            key = (a.buffer.uid, a.indices[0].value)
            if key not in self.promoted_elements:
                self.promoted_elements[key] = self.name.derived(key, f"{self.name(a.buffer)}_{key[1]}")
            if isinstance(a, ir.Store) and key not in stored:
                stored.append(key)
        return sorted(stored)

    def entered_elements(self, region: F.Region, stored: list) -> set:
        """The promoted elements whose value on entering the region may be read: in the region before it writes
        them, or by the write-back after it (`stored`). The others need no entry value (a 6x32 matmul micro-kernel
        wrote 230 dead ones, 18% of its module's lines)."""
        if not self.promoted_elements:
            return set()

        def key_of(access):
            if access.buffer.uid not in self.registers or not isinstance(access.indices[0], ir.Const):
                return None
            key = (access.buffer.uid, access.indices[0].value)
            return key if key in self.promoted_elements else None
        write_back = [ir.Evaluate(ir.Load(self.registers[uid], (ir.const(element),))) for uid, element in stored]
        return _read_before_written(list(region.stmts) + write_back, key_of)

    def register_entry_value(self, region: F.Region, uid: int, element: int) -> str:
        """What a promoted register element holds when the region starts: its slot, unless no region can have
        written it (this region alone accesses the buffer, and runs once per block): then the slot is
        `np.empty`'s garbage, and a zero is as good a value and spares numba a load per element (a 6x16
        register tile compiles ~15% faster)."""
        if region.in_block_loop or self.register_regions[uid] > 1:
            return self.register_slot(uid, element)
        return self.expr(ir.const(0, self.registers[uid].dtype))

    def register_slot(self, uid: int, element: int) -> str:
        numel = math.prod(d.value for d in self.registers[uid].shape)
        return f"{self.name(self.registers[uid])}[np.uint64(tid * {numel} + {element})]"

    # ------------------------------------------------------------------ thread level
    def stmts(self, stmts, depth: int) -> None:
        start = len(self.lines)
        self.sequence(_flattened(ir.Seq(tuple(stmts))), depth)
        if len(self.lines) == start:
            self.lines.append("    " * depth + "pass")

    def sequence(self, stmts: list, depth: int) -> None:
        """Statements in order, each run of consecutive assignments and stores through `run`."""
        run: list = []
        for x in stmts + [None]:
            if isinstance(x, (ir.Assign, ir.Store)):
                run.append(x)
                continue
            if run:
                self.run(run, depth)
                run = []
            if x is not None:
                self.stmt(x, depth)

    def stmt(self, s, depth: int) -> None:
        pad = "    " * depth
        if isinstance(s, ir.Seq):
            self.sequence(_flattened(s), depth)
            return
        self.loc = s.loc or self.loc
        if isinstance(s, ir.Assign):
            running = _running_extreme(s)
            value = f"{_RUNNING[s.value.func]}({self.var_ref(s.var)}, {self.cast(running, s.var.dtype)})" \
                if running is not None else self.cast(s.value, s.var.dtype)
            self.lines.append(f"{pad}{self.var_ref(s.var)} = {value}")
        elif isinstance(s, ir.Store):
            self.lines.append(pad + self.store(s))
        elif isinstance(s, ir.Evaluate):
            self.lines.append(f"{pad}{self.expr(s.expr)}")
        elif isinstance(s, ir.Prefetch):
            self.lines.append(pad + self.prefetch(s.src))
        elif isinstance(s, ir.Dot4):
            refs = ", ".join(f"{self.name(r.buffer)}, {self.index(r.buffer, r.indices)[0]}" for r in (s.acc, s.a, s.b))
            self.lines.append(f"{pad}rt.dot4({refs}, {s.lanes})")
        elif isinstance(s, ir.For):
            level = self.loop_level(s, pad)
            counted = self.counted_loop(s, pad)
            self.loop_bases.append(level)
            self.stmts([s.body], depth + 1)
            self.loop_bases.pop()
            if counted is not None:
                self.lines.append(f"{pad}    {counted} += 1")
        elif isinstance(s, ir.While):
            self.lines.append(f"{pad}while {self.expr(s.cond)}:")
            self.stmts([s.body], depth + 1)
        elif isinstance(s, ir.If):
            self.lines.append(f"{pad}if {self.expr(s.cond)}:")
            self.stmts([s.then], depth + 1)
            if s.orelse is not None:
                self.lines.append(f"{pad}else:")
                self.stmts([s.orelse], depth + 1)
        elif isinstance(s, ir.Break):
            self.lines.append(f"{pad}break")
        elif isinstance(s, ir.Continue):
            self.lines.append(f"{pad}continue")
        elif isinstance(s, F.ShflPut):
            self.lines.append(f"{pad}{self.shuffle_array(s.site)}[tid] = {self.cast(s.value, self.program.shuffle_sites[s.site])}")
        elif isinstance(s, F.ShflGet):
            src = f"rt.{s.func}_src(tid, {self.expr(s.lane)}, {s.width}, {self.threads})"
            self.lines.append(f"{pad}{self.var_ref(s.var)} = {self.shuffle_array(s.site)}[{src}]")
        elif isinstance(s, ir.CallOutlined):
            # scalars in exactly the parameter types compiled for (any 1-D array has one struct layout); arrays
            # borrowed: numba would count a reference to each in the argument tuple, atomically, every call
            args = [f"rt.borrowed({self.name(a)})" if isinstance(a, ir.Buffer)
                    else f"{np_type(a.dtype)}({self.cast(a, a.dtype)})" for a in s.args]
            self.lines.append(f"{pad}rt.call_entry(outlined_{s.index}, ({', '.join(args)}, "
                              "rt.borrowed(outlined_ints)), np.int64(0), np.int64(1))")
        elif isinstance(s, ir.Allocate):
            pass  # allocated per block / per thread at the top
        else:
            raise AssertionError(f"emit_python: unexpected statement {type(s).__name__}")

    def run(self, stmts: list, depth: int) -> None:
        """Straight-line assignments and stores, with each flat-index base that two or more of their accesses
        share computed once before them: `partial[np.uint64(((mi * 6 + 5) * 64) + (j + 29))]` becomes
        `partial[ix + k_uint64_29]` after `ix = np.uint64((mi * 6 + 5) * 64 + j)`. A base reading a variable the run
        assigns is computed after that assignment and serves the accesses up to the next one (an unrolled window's
        taps: `ih_1 = oh * 2`, then four loads at `((n * 56 + ih_1) * 56 + iw) * 144 + c` and steps of 288). An
        unrolled register tile's loads and stores are mostly such accesses, and numba's typing and lowering cost
        grows with the operations it sees (a 6x32 tile matmul: 3.7k operations, 1.5k of them in these indices)."""
        bases = _shared_bases(stmts, self.registers, self.expr) if self.flat and len(stmts) > 1 else {}
        pad = "    " * depth
        for position, x in enumerate([None, *stmts]):
            if x is not None:
                self.stmt(x, depth)
                if isinstance(x, ir.Assign):   # the bases reading its variable are stale now
                    self.bases = {k: v for k, v in self.bases.items() if x.var.uid not in v[1]}
            for key, reads in bases.get(position - 1, ()):
                name = self.name.derived(("index base", len(self.lines)), "ix")
                self.bases[key] = name, reads
                self.lines.append(f"{pad}{name} = np.uint64({key})")
        self.bases = {}

    def loop_level(self, loop: ir.For, pad: str) -> tuple:
        """(the variables `loop`'s body changes, {base text: local}) for the loop-invariant bases of the flat indices
        its accesses take (`_split_invariant`), each computed into a local before the loop (the lines added here),
        under `td.fast_compile`: LLVM's -O1 leaves an index's arithmetic in the loop where it holds a division, whose
        speculation it cannot prove safe, and the loop then does not vectorize (a pooling window's row: 4.1 ms of
        ResNet-50's max pool under fast compile, 0.33 with its base taken out of the loop)."""
        bases: dict = {}
        if not self.flat or not self.fast:    # -O3 takes them out itself (optimized kernels ran no faster so)
            return set(), bases
        changing = {loop.var.uid} | {x.var.uid for x in ir.collect(loop.body, ir.Stmt, expressions=False)
                                     if isinstance(getattr(x, "var", None), ir.Var)}
        for access in _accesses_of_this_level(loop.body):
            if access.buffer.uid in self.registers or len(access.indices) != 1:
                continue
            base, rest = _split_invariant(access.indices[0], changing)
            if base is None or rest is None or not isinstance(base, ir.Binary):
                continue
            key = self.expr(base)
            if key not in bases:
                bases[key] = name = self.name.derived(("loop base", len(self.lines), key), "lb")
                self.lines.append(f"{pad}{name} = {key}")
                self.hoisted.append(name)
        return changing, bases

    def from_loop_base(self, index: ir.Expr) -> str | None:
        """`index` as a loop-invariant base computed before an enclosing loop (`loop_level`) plus the rest, or None."""
        for changing, bases in reversed(self.loop_bases):
            if not bases:
                continue
            base, rest = _split_invariant(index, changing)
            name = bases.get(self.expr(base)) if base is not None and rest is not None else None
            if name is not None:
                return f"np.uint64({name} + {self.expr(rest)})"
        return None

    def constant(self, text: str) -> str:
        """A module-level name for the numpy scalar `text` (`np.float32(0.0)`): numba types a global as a
        constant, where it resolves each constructor call like any other call."""
        key = ("constant", text)
        name = self.name.derived(key, "k_" + identifier(text.replace("np.", "")).strip("_"))
        self.constants[name] = text
        return name

    def counted_loop(self, s: ir.For, pad: str):
        """The head of `s`: under `td.fast_compile`, a `while` loop over its variable (returned: the body's end
        increments it), for a loop of step 1 whose body has no `continue` (which would skip the increment);
        else a `range` loop (and None). numba lowers a `range` loop through an iterator object, a `while` loop as
        a compare and a branch (with the unread indices left out: 0.84x numba's time on the fast kernels of four
        test files, docs/benchmarks.md, session 76)."""
        var = self.var_ref(s.var)
        if not self.fast or self.debug or not (isinstance(s.step, ir.Const) and s.step.value == 1) \
                or s.var.dtype not in (ir.types.i32, ir.types.i64) or not var.isidentifier() \
                or ir.collect(s.body, ir.Continue, expressions=False):
            self.lines.append(f"{pad}for {var} in {self.range_of(s)}:")
            return None
        self.lines.append(f"{pad}{var} = {self.expr(s.start)}")
        stop = self.expr(s.stop)
        if not isinstance(s.stop, ir.Const):        # evaluated once, as `range` does (the body may change it)
            name = self.name.derived((s.var.uid, "stop"), f"{var}_stop")
            self.lines.append(f"{pad}{name} = {stop}")
            stop = name
        self.lines.append(f"{pad}while {var} < {stop}:")
        return var

    def range_of(self, s: ir.For) -> str:
        start, stop, step = self.expr(s.start), self.expr(s.stop), self.expr(s.step)
        if s.var.dtype == ir.types.u64 and isinstance(s.step, ir.Const) and s.step.value > 0 \
                and not ir.collect(s.start, ir.Atomic):
            # numba counts a range's trips in i64: from 2**64 - 2 to 1 it made 3 (stop - start, wrapped); an empty
            # range's stop is its start, which an unsigned max gives
            stop = f"max({start}, {stop})"
        return f"range({start}, {stop}, {step})"

    def var_ref(self, v: ir.Var) -> str:
        if v.uid in self.program.thread_arrays and not self.promoted:
            return f"{self.thread_array(v)}[tid]"
        return self.name(v)

    def thread_array(self, v: ir.Var) -> str:
        """The per-thread array that keeps `v` across the block's regions."""
        return self.name.derived((v.uid, "thread array"), f"{self.name(v)}_t")

    def shuffle_array(self, site: int) -> str:
        """The per-thread array a shuffle site exchanges its values through."""
        return self.name.derived(("shuffle", site), f"shfl_{site}")

    def least_stored(self, dtype) -> str:
        """What a block maximum's slot holds where no thread published: the least value numba's `max` can meet in
        the slots' storage (the block's threads that publish agree on their value, so any order will do: 16-bit
        floats compare as their bit patterns, from 0)."""
        if dtype.is_bool or _held_as_bits(dtype):
            return f"{np_type(dtype)}(0)"
        return self.expr(ir.const(dtype.lowest, dtype))

    # ------------------------------------------------------------------ memory
    def index(self, buf: ir.Buffer, indices) -> list:
        if self.flat:  # unsigned: no negative-index wrap-around, so LLVM sees plain address arithmetic
            if buf.uid in self.registers:
                return [f"np.uint64(tid * {math.prod(d.value for d in buf.shape)} + {self.expr(indices[0])})"]
            return [self.from_shared_base(indices[0]) or self.from_loop_base(indices[0])
                    or f"np.uint64({self.expr(indices[0])})"]
        return (["tid"] if buf.uid in self.registers else []) + [self.expr(i) for i in indices]

    def from_shared_base(self, index: ir.Expr) -> str | None:
        """`index` as the run's shared base (`run`) plus a constant, or None where it has none."""
        if not self.bases:
            return None
        base, offset = _split_offset(index)
        name = self.bases.get(self.expr(base), (None,))[0] if base is not None else None
        if name is None or offset == 0:
            return name
        return f"({name} {'+' if offset > 0 else '-'} {self.constant(f'np.uint64({abs(offset)})')})"

    def site(self, buf: ir.Buffer, access: str) -> str:
        """The number of a new debug-mode access site, as an int64 expression: numba types a bare literal as
        Literal[int](n) and compiles the checking helper once per site (355 compiles for one mma kernel)."""
        self.sites.append(DebugSite(self.loc, buf.name, access, 1 if buf.uid in self.registers else 0))
        return f"np.int64({len(self.sites) - 1})"

    def promoted_element(self, buf: ir.Buffer, indices) -> str | None:
        if self.promoted_elements and isinstance(indices[0], ir.Const):
            return self.promoted_elements.get((buf.uid, indices[0].value))
        return None

    def load(self, e: ir.Load) -> str:
        local = self.promoted_element(e.buffer, e.indices)
        if local is not None:
            return local
        idx = self.index(e.buffer, e.indices)
        name = self.name(e.buffer)
        if not self.debug:
            return f"{name}[{', '.join(idx)}]"
        if not idx and e.buffer.uid not in self.shadows:     # a 0-d tensor (debug mode keeps shapes): no bound
            return f"{name}[()]"
        tup = _index_tuple(idx)
        site = self.site(e.buffer, "read")
        if e.buffer.uid in self.shadows:
            return f"rt.load_shared_checked({name}, {tup}, {self.shadows[e.buffer.uid]}, {self.reader}, epoch, {site})"
        return f"rt.load_checked({name}, {tup}, {site})"

    def prefetch(self, ref: ir.Ref) -> str:
        """A prefetch of `ref`'s element; in debug mode the bounds check of a read there instead (an index outside
        the tensor is an error on every target: a GPU's prefetch must name a global address)."""
        idx = self.index(ref.buffer, ref.indices)
        if not self.debug:
            return f"rt.prefetch({self.name(ref.buffer)}, {idx[0]})"
        tup = _index_tuple(idx)
        return f"rt.check_index({self.name(ref.buffer)}, {tup}, {self.site(ref.buffer, 'prefetch')})"

    def store(self, s: ir.Store) -> str:
        value = self.cast(s.value, s.buffer.dtype)
        local = self.promoted_element(s.buffer, s.indices)
        if local is not None:
            return f"{local} = {value}"
        idx = self.index(s.buffer, s.indices)
        name = self.name(s.buffer)
        if not self.debug:
            return f"{name}[{', '.join(idx)}] = {value}"
        if not idx and s.buffer.uid not in self.shadows:
            return f"{name}[()] = {value}"
        tup = _index_tuple(idx)
        site = self.site(s.buffer, "write")
        if s.buffer.uid in self.shadows:
            return f"rt.store_shared_checked({name}, {tup}, {value}, {self.shadows[s.buffer.uid]}, tid, epoch, {site})"
        return f"rt.store_checked({name}, {tup}, {value}, {site})"

    def atomic(self, e: ir.Atomic) -> str:
        idx = self.index(e.buffer, e.indices)
        tup = _index_tuple(idx)
        name = self.name(e.buffer)
        if self.debug and e.buffer.uid in self.shadows:
            site = self.site(e.buffer, "atomic")
            tup = f"rt.atomic_shared_checked({name}, {tup}, {self.shadows[e.buffer.uid]}, tid, epoch, {site})"
        elif self.debug and idx:
            tup = f"rt.check_index({name}, {tup}, {self.site(e.buffer, 'atomic')})"
        return f"rt.atomic_{e.op}({name}, {tup}, {self.cast(e.value, e.dtype)})"

    # ------------------------------------------------------------------ expressions
    def cast(self, e: ir.Expr, dtype) -> str:
        text = self.expr(e)
        if e.dtype == dtype:
            return text
        if _held_as_bits(e.dtype):  # bits -> f32 first
            text = f"rt.{e.dtype.name}_to_f32({text})"
            if dtype == ir.types.f32:
                return text
        if _held_as_bits(dtype):   # rounded once, as CUDA does: f64s and ints past 2**24 would round twice through f32
            wide = "np.float32" if e.dtype.is_float and e.dtype.bits <= 32 else "np.float64"
            return f"rt.f32_to_{dtype.name}({wide}({text}))"
        if dtype.is_bool:
            return text if e.dtype.is_bool else f"({text} != 0)"
        if e.dtype.is_float and dtype.is_integer:     # saturating (DataType.saturate), never LLVM's poison
            return f"rt.float_to_int({text}, {dtype.bits}, {dtype.kind == 'int'})"
        if dtype.kind == "int" and dtype.bits >= e.dtype.bits >= 32 and e.dtype.kind == "int":
            # numba's binary arithmetic computes signed 32- and 64-bit ints in int64 anyway (its unary - and
            # abs do not: `expr` widens their operand); not narrower ones (which keep their type in - and ~),
            # nor unsigned ones (u32 >> 2 is a uint64, and min(-1, uint64) a float)
            return text
        return f"{np_type(dtype)}({text})"

    def may_overflow_division(self, e: ir.Binary) -> bool:
        """Whether `e.a // e.b` may be -2**31 // -1 (the divisor is mostly a positive constant or size)."""
        return _may_hold(e.b, self.fn.block, -1) and _may_hold(e.a, self.fn.block, -2**31)

    def expr(self, e: ir.Expr) -> str:
        if isinstance(e, ir.Const):
            if e.dtype.is_bool:
                return "True" if e.value else "False"
            if _held_as_bits(e.dtype):
                from . import support
                bits = getattr(support, "f32_to_" + e.dtype.name)(np.float32(e.value))
                return self.constant(f"{np_type(e.dtype)}({bits})")
            if e.dtype.is_float:
                value = e.value
                literal = repr(value) if math.isfinite(value) else f"np.{'nan' if math.isnan(value) else 'inf'}"
                if math.isinf(value) and value < 0:
                    literal = "-np.inf"
                return self.constant(f"{np_type(e.dtype)}({literal})")
            if e.dtype.kind == "uint" and e.dtype.bits == 64:   # numba would take u64 with an int64 to f64
                return self.constant(f"np.uint64({e.value})")
            return str(e.value) if e.value >= 0 else f"({e.value})"
        if isinstance(e, ir.Var):
            return self.var_ref(e)
        if isinstance(e, ir.SpecialReg):
            axis = "xyz".index(e.axis)
            if e.name == "threadIdx":   # ty / tz exist only in blocks that have those axes
                return ("tx", "ty", "tz")[axis] if axis == 0 or self.fn.block[axis] > 1 else "0"
            if e.name == "blockIdx":
                return ("bx", "by", "bz")[axis]
            if e.name == "blockDim":
                return str(self.fn.block[axis])
            return ("grid_x", "grid_y", "grid_z")[axis]
        if isinstance(e, ir.Binary):
            if e.dtype.is_float and e.op in ir.expr.ARITH_OPS:
                return f"({self.cast(e.a, e.dtype)} {e.op} {self.cast(e.b, e.dtype)})"
            if e.op == "//" and e.dtype.name == "i32" and self.may_overflow_division(e):
                return f"rt.floordiv_i32({self.expr(e.a)}, {self.expr(e.b)})"
            op = _EAGER_OPS[e.op] if e.op in _EAGER_OPS and plain(e.a, self.promoted_elements) and \
                plain(e.b, self.promoted_elements) else _PY_OPS.get(e.op, e.op)
            text = f"({self.expr(e.a)} {op} {self.expr(e.b)})"
            # Wrap-around CUDA defines (left shifts, unsigned arithmetic); signed +-* overflow is UB there.
            if e.dtype.is_integer and (e.op == "<<" or (e.dtype.kind == "uint" and e.op in ("+", "-", "*"))):
                return f"{np_type(e.dtype)}({text})"
            return text
        if isinstance(e, ir.Unary):
            if e.op == "-" and _held_as_bits(e.dtype):     # held as bit patterns: flip the sign bit
                return f"({self.expr(e.a)} ^ {np_type(e.dtype)}({1 << (e.dtype.bits - 1):#x}))"
            if e.op == "-" and e.dtype.name == "i64":     # numba negates an int32 in int32 (-(-2**31) wraps), and
                return f"(-np.int64({self.expr(e.a)}))"    # `cast` leaves an i32 -> i64 widening to numba
            text = f"({'not ' if e.op == 'not' else e.op}{self.expr(e.a)})"
            # numba negates an unsigned value into int64: wrap it back, as C does
            return f"{np_type(e.dtype)}({text})" if e.dtype.kind == "uint" else text
        if isinstance(e, ir.Select):
            kept = ir.nan_to_zero_operand(e)
            if kept is not None:
                return f"rt.nan_to_zero({self.expr(kept)})"
            a, b = self.cast(e.a, e.dtype), self.cast(e.b, e.dtype)
            if e.dtype.kind == "uint":      # numba unifies a uint64 branch with an int literal's int64 into float64
                a, b = f"{np_type(e.dtype)}({a})", f"{np_type(e.dtype)}({b})"
            if speculable(e):
                return f"rt.select({self.expr(e.cond)}, {a}, {b})"
            return f"({a} if {self.expr(e.cond)} else {b})"
        if isinstance(e, ir.Cast):
            return self.cast(e.value, e.dtype)
        if isinstance(e, ir.Load):
            return self.load(e)
        if isinstance(e, ir.Atomic):
            return self.atomic(e)
        if isinstance(e, ir.Call):
            if e.func == "abs" and e.dtype.is_integer:      # as `-` above: numba's abs keeps an int32's type
                return f"abs({np_type(e.dtype)}({self.expr(e.args[0])}))"
            if e.dtype.kind == "uint":      # as in selects: numba takes a uint64 (`u32 >> 2` is one) with an int
                args = ", ".join(f"{np_type(e.dtype)}({self.expr(a)})" for a in e.args)   # literal to float64
                return f"{_MATH[e.func]}({args})"
            args = ", ".join(self.cast(a, e.dtype) if e.dtype.is_float else self.expr(a) for a in e.args)
            fn = _FLOAT_MATH.get(e.func, _MATH[e.func]) if e.dtype.is_float else _MATH[e.func]
            fn = _F32_MATH.get(e.func, fn) if e.dtype.name == "f32" else fn
            call = f"{fn}({args})"
            return f"{np_type(e.dtype)}({call})" if e.dtype.is_float else call
        raise AssertionError(f"emit_python: unexpected expression {type(e).__name__}")


def _running_extreme(s: ir.Assign) -> ir.Expr | None:
    """The other operand x of `v = max(v, x)` or `min` (either order) of f32 or f64 values: a running extreme; else
    None."""
    e = s.value
    if not (isinstance(e, ir.Call) and e.func in _RUNNING and e.dtype == s.var.dtype and e.dtype.is_float
            and e.dtype.bits >= 32):
        return None
    for mine, other in ((0, 1), (1, 0)):
        if isinstance(e.args[mine], ir.Var) and e.args[mine].uid == s.var.uid:
            return e.args[other]
    return None


def _index_tuple(idx: list) -> str:
    """The tuple of int64 indices a debug-mode check takes, from an access's index expressions."""
    return "(" + "".join(f"np.int64({i}), " for i in idx) + ")"


def _may_hold(e: ir.Expr, block: tuple, value: int) -> bool:
    """Whether integer `e` may be `value`, as far as its range (`passes.bounds.int_range`) tells."""
    r = int_range(e, block, {})
    return r is None or r[0] <= value <= r[1]


def _flattened(s: ir.Seq) -> list:
    """The statements of nested sequences, in order."""
    return [y for x in s.stmts for y in (_flattened(x) if isinstance(x, ir.Seq) else [x])]


def _split_offset(e: ir.Expr) -> tuple:
    """Signed integer `e` as (base, c) with e == base + c, c an integer constant (base None where e is one)."""
    if isinstance(e, ir.Const) and e.dtype.kind == "int":
        return None, int(e.value)
    if isinstance(e, ir.Binary) and e.dtype.kind == "int":
        if e.op in ("+", "-"):
            (a, ca), (b, cb) = _split_offset(e.a), _split_offset(e.b)
            sign = 1 if e.op == "+" else -1
            if b is None:
                return a, ca + sign * cb
            if a is None and e.op == "+":
                return b, ca + cb
            if a is not None:
                return ir.binary(e.op, a, b), ca + sign * cb
        if e.op == "*":
            for p, q in ((e.a, e.b), (e.b, e.a)):
                if isinstance(q, ir.Const):
                    base, c = _split_offset(p)
                    return (None if base is None else ir.binary("*", base, q)), c * int(q.value)
    return e, 0


def _accesses_of_this_level(body: ir.Stmt) -> list:
    """The loads and stores of a loop's `body` outside the `for` loops nested in it: an access inside an inner one
    takes that loop's base (`loop_level`), computed there, and a base for it here would go unused."""
    found, stack = [], [body]
    while stack:
        s = stack.pop()
        if isinstance(s, ir.Seq):
            stack.extend(s.stmts)
        elif isinstance(s, ir.If):
            found += ir.collect(s.cond, ir.Load)
            stack += [s.then] + ([s.orelse] if s.orelse is not None else [])
        elif isinstance(s, ir.While):     # no bases of its own
            found += ir.collect(s.cond, ir.Load)
            stack.append(s.body)
        elif not isinstance(s, ir.For):
            found += ir.collect(s, ir.Load) + ([s] if isinstance(s, ir.Store) else [])
    return found


def _split_invariant(e: ir.Expr, changing: set) -> tuple:
    """Integer `e` as (base, rest), e == base + rest, the sum's terms that read no variable in `changing` (and no
    memory) in `base`; None for an empty side."""
    if isinstance(e, ir.Binary) and e.op == "+" and e.dtype.kind == "int":
        (a, ra), (b, rb) = _split_invariant(e.a, changing), _split_invariant(e.b, changing)
        join = lambda x, y: x if y is None else y if x is None else ir.binary("+", x, y)     # noqa: E731
        return join(a, b), join(ra, rb)
    return (e, None) if ir.invariant(e, changing) else (None, e)


def _stacked(buffers: list, threads: int) -> set:
    """Uids of the `buffers` (registers: one row per thread) that go on the stack, in order, within STACK_BYTES."""
    chosen, total = set(), 0
    for b in buffers:
        if not all(isinstance(d, ir.Const) for d in b.shape):
            continue
        size = math.prod(d.value for d in b.shape) * (threads if b.scope == "register" else 1) * b.dtype.bits // 8
        if total + size <= STACK_BYTES:
            chosen.add(b.uid)
            total += size
    return chosen


def _shared_bases(stmts: list, registers: dict, text) -> dict:
    """{position: [(base text, uids of the variables it reads)]}: the flat-index bases (`_split_offset`) that two or
    more accesses of `stmts` outside register buffers share between assignments of the base's variables, each
    to be computed after statement `position` (-1: before the run), the last one assigning one of them; bases that
    load memory are left alone."""
    latest: dict = {}         # var uid -> index of the last statement so far assigning it
    uses: dict = {}           # (position, base text) -> [accesses, uids the base reads]
    for i, s in enumerate(stmts):
        for access in ir.collect(s, ir.Load) + ([s] if isinstance(s, ir.Store) else []):
            if access.buffer.uid in registers or len(access.indices) != 1:
                continue
            base, _ = _split_offset(access.indices[0])
            if base is None or ir.collect(base, ir.Load):
                continue
            uids = frozenset(v.uid for v in ir.collect(base, ir.Var))
            key = max((latest.get(uid, -1) for uid in uids), default=-1), text(base)
            uses.setdefault(key, [0, uids])[0] += 1
        if isinstance(s, ir.Assign):
            latest[s.var.uid] = i
    found: dict = {}
    for (position, key), (n, uids) in uses.items():
        if n > 1:
            found.setdefault(position, []).append((key, uids))
    return found
