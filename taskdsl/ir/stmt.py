"""Statements of the tensor IR. Each carries the user's source location for errors and `#line`."""
from __future__ import annotations

from dataclasses import dataclass

from ..errors import SourceLoc
from .expr import Buffer, Expr, Var


class Stmt:
    """Base class of statements; subclasses are frozen dataclasses whose last field is `loc`."""

    loc: SourceLoc | None


@dataclass(frozen=True, eq=False)
class Seq(Stmt):
    """Statements run in order."""

    stmts: tuple
    loc: SourceLoc | None = None


@dataclass(frozen=True, eq=False)
class Outlined(Seq):
    """The body of a `@td.func(outline=True)` called as a statement: a Seq to every pass (so each sees the body
    as inlined code), which the cpu target then compiles once as a function of its own and calls
    (`passes.outline`)."""

    name: str = ""


@dataclass(frozen=True, eq=False)
class Assign(Stmt):
    """`var = value` (locals are function-wide, as in Python)."""

    var: Var
    value: Expr
    loc: SourceLoc | None = None


@dataclass(frozen=True, eq=False)
class Store(Stmt):
    """`buffer[indices] = value`."""

    buffer: Buffer
    indices: tuple
    value: Expr
    loc: SourceLoc | None = None


@dataclass(frozen=True, eq=False)
class Allocate(Stmt):
    """Declares a shared or register buffer (per block / per thread); `scratch`: the cpu emulation's exchange
    buffer of warp-wide instructions, which debug mode does not check for races."""

    buffer: Buffer
    loc: SourceLoc | None = None
    scratch: bool = False


@dataclass(frozen=True, eq=False)
class For(Stmt):
    """`for var in range(start, stop, step)`; `unroll` asks the backend to unroll it."""

    var: Var
    start: Expr
    stop: Expr
    step: Expr
    body: Stmt
    unroll: bool = False
    loc: SourceLoc | None = None


@dataclass(frozen=True, eq=False)
class ForMapping(Stmt):
    """`for vars in mapping(worker)`: runs body on each task of `worker` (see expand_mappings)."""

    vars: tuple
    mapping: object
    worker: Expr
    body: Stmt
    loc: SourceLoc | None = None


@dataclass(frozen=True, eq=False)
class If(Stmt):
    """`if cond: then else: orelse` (orelse may be None)."""

    cond: Expr
    then: Stmt
    orelse: Stmt | None = None
    loc: SourceLoc | None = None


@dataclass(frozen=True, eq=False)
class While(Stmt):
    """`while cond: body`."""

    cond: Expr
    body: Stmt
    loc: SourceLoc | None = None


@dataclass(frozen=True, eq=False)
class Break(Stmt):
    """Leaves the innermost loop."""

    loc: SourceLoc | None = None


@dataclass(frozen=True, eq=False)
class Continue(Stmt):
    """Goes to the next iteration of the innermost loop."""

    loc: SourceLoc | None = None


@dataclass(frozen=True, eq=False)
class SyncThreads(Stmt):
    """A barrier of all the threads of a block (`__syncthreads()`)."""

    loc: SourceLoc | None = None


@dataclass(frozen=True, eq=False)
class SyncWarp(Stmt):
    """A barrier of the lanes of a warp (`__syncwarp()`); `emulated`: one of the cpu emulation of a warp-wide
    instruction, which debug mode does not count as ordering the kernel's own accesses (the GPU has none)."""

    loc: SourceLoc | None = None
    emulated: bool = False


@dataclass(frozen=True, eq=False)
class Mma(Stmt):
    """Warp-wide `c += a @ b` on tensor-core fragments (`Ref`s to register arrays): m16n8k16 for 16-bit operands,
    m16n8k32 for 8-bit ones; either way a lane holds four 32-bit registers of a, two of b and four elements of c."""

    a: Expr
    b: Expr
    c: Expr
    loc: SourceLoc | None = None

    @property
    def k(self) -> int:
        """The depth of the product: 16 for 16-bit operands, 32 for 8-bit ones."""
        return 256 // self.a.dtype.bits


@dataclass(frozen=True, eq=False)
class Dot4(Stmt):
    """`acc[l] += a[0] * b[4l] + a[1] * b[4l + 1] + a[2] * b[4l + 2] + a[3] * b[4l + 3]` for each lane l < `lanes`:
    four-byte dot products of u8 `a` (the same four bytes for every lane) and i8 `b` into the i32 lanes of `acc`
    (`Ref`s to their first elements; the sums wrap as i32 do). x86's vpdpbusd (AVX-512 VNNI) on the cpu."""

    acc: Expr
    a: Expr
    b: Expr
    lanes: int
    loc: SourceLoc | None = None


@dataclass(frozen=True, eq=False)
class LdMatrix(Stmt):
    """Warp-wide load of `num` 8x8 b16 matrices (8 rows of 16 bytes) from shared memory into the fragment `frag`.

    Lane 8j + r gives in `src` the address of row r of matrix j; see `passes/emulate_tensor_cores.py`.
    """

    frag: Expr
    src: Expr
    num: int
    trans: bool
    loc: SourceLoc | None = None


@dataclass(frozen=True, eq=False)
class CpAsync(Stmt):
    """Asynchronous copy of `count` contiguous elements from global `src` to shared `dst`; zeros unless `pred`."""

    dst: Expr
    src: Expr
    count: int
    pred: Expr
    loc: SourceLoc | None = None


@dataclass(frozen=True, eq=False)
class CpAsyncCommit(Stmt):
    """Closes the group of this thread's cp_asyncs issued since the last commit."""

    loc: SourceLoc | None = None


@dataclass(frozen=True, eq=False)
class CpAsyncWait(Stmt):
    """Waits until at most `pending` of this thread's committed cp_async groups are unfinished."""

    pending: int
    loc: SourceLoc | None = None


@dataclass(frozen=True, eq=False)
class Prefetch(Stmt):
    """A hint to bring the cache line of global element `src` nearer, for a read soon after; no effect on values."""

    src: Expr
    loc: SourceLoc | None = None


@dataclass(frozen=True, eq=False)
class Evaluate(Stmt):
    """An expression run for its effect (an atomic whose old value is unused)."""

    expr: Expr
    loc: SourceLoc | None = None


@dataclass(frozen=True, eq=False)
class CallOutlined(Stmt):
    """A call of the kernel's outlined function number `index` (the cpu target, after `passes.outline`) on `args`,
    its parameters' values in order: Buffers and expressions."""

    index: int
    args: tuple
    loc: SourceLoc | None = None


def seq(stmts) -> Stmt:
    """A Seq of `stmts` with nested Seqs flattened (a single statement is returned as is; an Outlined body stays
    one statement)."""
    flat = []
    for s in stmts:
        flat.extend(s.stmts if type(s) is Seq else [s])
    return flat[0] if len(flat) == 1 else Seq(tuple(flat))
