"""Replace cp_async, its commits and waits by plain IR that lands each copy as late as PTX allows.

A `cp_async` may complete at any moment before the wait that covers its group; the cpu target
completes it at that wait. So a kernel that reads a destination before waiting for it (or
waits for too few groups, or forgets to commit) reads stale shared memory on the cpu, as it
may on a GPU, and its test fails there instead of only on a device.

Each thread keeps, per destination buffer, a ring of its pending copies (`QUEUE` entries in
per-block scratch, indexed by the thread): the destination element's indices, the copied
elements (read from the source at issue, zeros where the predicate is false), their count and
the commit group the copy belongs to. `cp_async_commit` counts the thread's groups;
`cp_async_wait(n)` completes, oldest first, every pending copy of a group older than the
newest `n` committed ones. A thread with `QUEUE` copies pending completes its oldest at the
next issue: early, which PTX allows too. Runs before `emulate_tensor_cores`, on n-d IR in debug mode and
on flattened IR otherwise (an entry then holds one linear index, and numba compiles a third less code). In
debug mode a copy also reads the first and last elements of its destination run where it is issued, so an index
past the buffer is reported at the `cp_async`, not at the wait that lands it (a read, which no correct kernel
races with: another thread writing there races with the copy itself).

With `early` (`td.cp_async_early`) each copy lands when it is issued instead, the other end of what PTX
allows, and commits and waits do nothing: a copy that overwrites what another thread still reads then
shows, where landing late hides it.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from .. import ir
from ..ir import types as T

QUEUE = 32    # pending copies a thread holds per destination buffer (the tensor-core template: up to 3 x 8)


@dataclass(frozen=True)
class _Queue:
    """A thread's copies into `buffer` that no wait has completed yet: entries [head, tail) of a ring."""

    buffer: ir.Buffer
    rank: int               # indices a destination has: 1 on flattened IR
    indices: ir.Buffer      # an entry's destination indices (`rank` of them)
    values: ir.Buffer       # its elements (`width` slots: 16 bytes' worth)
    counts: ir.Buffer       # how many of them
    groups: ir.Buffer       # the commit group it belongs to
    head: ir.Var
    tail: ir.Var

    @property
    def width(self) -> int:
        return _width(self.buffer.dtype)


def _width(dtype: T.DataType) -> int:
    """Elements of `dtype` in 16 bytes: the most one cp_async copies."""
    return max(1, 16 // (dtype.bits // 8))


def emulate_async_copies(fn: ir.Function, flat: bool = False, early: bool = False) -> ir.Function:
    """`fn` with every cp_async, commit and wait replaced by per-thread copy queues (see the module's doc), or with
    `early` by copies at issue; `flat`: `fn` was flattened (`flatten_buffers`)."""
    if early:
        return dataclasses.replace(fn, body=_AtIssue(flat).visit(fn.body))
    copies = ir.collect(fn.body, ir.CpAsync, expressions=False)
    emulator = _Emulator(fn, {c.dst.buffer.uid: c.dst.buffer for c in copies}.values(), flat)
    body = emulator.visit(fn.body)
    queues = emulator.queues.values()
    if not queues:      # commits and waits with no copy to wait for (a template whose copies a prologue replaced)
        return dataclasses.replace(fn, body=body)
    setup = [ir.Allocate(b) for q in queues for b in (q.indices, q.values, q.counts, q.groups)]
    setup += [ir.Assign(v, ir.const(0), None) for q in queues for v in (q.head, q.tail)]
    setup.append(ir.Assign(emulator.committed, ir.const(0), None))
    return dataclasses.replace(fn, body=ir.seq(setup + [body]))


def linear_thread_index(fn: ir.Function) -> ir.Expr:
    """The thread's index in its block, x fastest: the row of its per-thread scratch."""
    bx, by, bz = fn.block
    tid = ir.SpecialReg("threadIdx", "x")
    if by > 1:
        tid = tid + ir.SpecialReg("threadIdx", "y") * bx
    if bz > 1:
        tid = tid + ir.SpecialReg("threadIdx", "z") * (bx * by)
    return tid


def _source_indices(s: ir.CpAsync, pred: ir.Expr, out: list) -> tuple:
    """The source indices of copy `s`, each computed into a variable (appended to `out`) unless trivial: computed
    only where `pred` holds, as CUDA's copy computes them (an im2col prologue's may be out of bounds elsewhere),
    and once, not in each element's load."""
    always = isinstance(pred, ir.Const) and pred.value
    src = []
    for i in s.src.indices:
        if isinstance(i, (ir.Const, ir.Var, ir.SpecialReg)):
            src.append(i)
            continue
        index = ir.Var("cp_src", i.dtype)
        out.append(ir.Assign(index, i if always else ir.Select(pred, i, ir.const(0, i.dtype), i.dtype), s.loc))
        src.append(index)
    return tuple(src)


def _copied_element(s: ir.CpAsync, pred: ir.Expr, src: tuple, k: ir.Var, flat: bool) -> ir.Expr:
    """Element `k` of copy `s`: the source's where `pred` holds, else zero."""
    return ir.Select(pred, ir.Load(s.src.buffer, ir.Ref(s.src.buffer, src).element(k, flat)),
                     ir.const(0, s.dst.dtype), s.dst.dtype)


def _once(pred: ir.Expr, loc, out: list) -> ir.Expr:
    """`pred` as a constant or a variable (assigned in `out`): computed once, not in each element's select."""
    if isinstance(pred, (ir.Const, ir.Var)):
        return pred
    var = ir.Var("cp_pred", T.boolean)
    out.append(ir.Assign(var, pred, loc))
    return var


class _AtIssue(ir.Rewriter):
    """Each copy stored into its destination where it is issued; commits and waits removed."""

    statements_only = True

    def __init__(self, flat: bool):
        self.flat = flat

    def visit_CpAsync(self, s: ir.CpAsync) -> ir.Stmt:
        out = []
        pred = _once(s.pred, s.loc, out)
        src = _source_indices(s, pred, out)
        k = ir.Var("cp_k", T.i32)
        store = ir.Store(s.dst.buffer, s.dst.element(k, self.flat), _copied_element(s, pred, src, k, self.flat), s.loc)
        return ir.seq(out + [ir.For(k, ir.const(0), ir.const(s.count), ir.const(1), store, loc=s.loc)])

    def visit_CpAsyncCommit(self, s: ir.CpAsyncCommit) -> ir.Stmt:
        return ir.Seq(())

    def visit_CpAsyncWait(self, s: ir.CpAsyncWait) -> ir.Stmt:
        return ir.Seq(())


class _Emulator(ir.Rewriter):
    statements_only = True

    def __init__(self, fn: ir.Function, destinations, flat: bool):
        self.first_entry = linear_thread_index(fn) * QUEUE     # the thread's ring starts here in each queue's scratch
        self.committed = ir.Var("cp_groups", T.i32)    # the thread's commits so far
        self.flat = flat
        self.queues = {b.uid: self._queue(b, 1 if flat else len(b.shape), fn.num_threads) for b in destinations}

    @staticmethod
    def _queue(buffer: ir.Buffer, rank: int, threads: int) -> _Queue:
        entries = threads * QUEUE
        scratch = lambda what, dtype, per_entry: ir.Buffer(f"cpq_{what}_{buffer.name}", dtype,
                                                           (ir.const(entries * per_entry),), "shared")
        return _Queue(buffer, rank, scratch("indices", T.i32, rank),
                      scratch("values", buffer.dtype, _width(buffer.dtype)),
                      scratch("counts", T.i32, 1), scratch("groups", T.i32, 1),
                      ir.Var(f"cpq_head_{buffer.name}", T.i32), ir.Var(f"cpq_tail_{buffer.name}", T.i32))

    def _entry(self, position: ir.Expr) -> ir.Expr:
        return self.first_entry + position % QUEUE

    def _complete_oldest(self, q: _Queue, loc) -> list:
        """Statements that store the oldest pending copy of `q` into its destination and drop it."""
        entry = ir.Var("cpq_entry", T.i32)
        start = ir.Ref(q.buffer, tuple(ir.Load(q.indices, (entry * q.rank + d,)) for d in range(q.rank)))
        k = ir.Var("cpq_k", T.i32)
        store = ir.Store(q.buffer, start.element(k, self.flat), ir.Load(q.values, (entry * q.width + k,)), loc)
        return [ir.Assign(entry, self._entry(q.head), loc),
                ir.For(k, ir.const(0), ir.Load(q.counts, (entry,)), ir.const(1), store, loc=loc),
                ir.Assign(q.head, q.head + 1, loc)]

    def visit_CpAsync(self, s: ir.CpAsync) -> ir.Stmt:
        q = self.queues[s.dst.buffer.uid]
        out = [ir.If(ir.binary("==", q.tail - q.head, QUEUE), ir.seq(self._complete_oldest(q, s.loc)), None, s.loc)]
        pred = _once(s.pred, s.loc, out)
        entry = ir.Var("cpq_entry", T.i32)
        out.append(ir.Assign(entry, self._entry(q.tail), s.loc))
        out += [ir.Store(q.indices, (entry * q.rank + d,), ir.convert(i, T.i32), s.loc)
                for d, i in enumerate(s.dst.indices)]
        if not self.flat:       # debug mode: the run's ends read here, so a bad index is reported at this copy
            out += [ir.Assign(ir.Var("cp_probe", s.dst.buffer.dtype),
                              ir.Load(s.dst.buffer, s.dst.element(ir.const(k), False)), s.loc)
                    for k in sorted({0, s.count - 1})]
        src = _source_indices(s, pred, out)
        k = ir.Var("cp_k", T.i32)
        value = _copied_element(s, pred, src, k, self.flat)
        out += [ir.For(k, ir.const(0), ir.const(s.count), ir.const(1),
                       ir.Store(q.values, (entry * q.width + k,), value, s.loc), loc=s.loc),
                ir.Store(q.counts, (entry,), ir.const(s.count), s.loc),
                ir.Store(q.groups, (entry,), self.committed, s.loc),
                ir.Assign(q.tail, q.tail + 1, s.loc)]
        return ir.seq(out)

    def visit_CpAsyncCommit(self, s: ir.CpAsyncCommit) -> ir.Stmt:
        return ir.Assign(self.committed, self.committed + 1, s.loc) if self.queues else ir.Seq(())

    def visit_CpAsyncWait(self, s: ir.CpAsyncWait) -> ir.Stmt:
        out = []
        for q in self.queues.values():
            oldest_done = ir.binary("<", ir.Load(q.groups, (self._entry(q.head),)), self.committed - s.pending)
            out.append(ir.While(ir.binary("and", q.head < q.tail, oldest_done), ir.seq(self._complete_oldest(q, s.loc)),
                                s.loc))
        return ir.seq(out)
