"""The cpu launches' helper threads: a fork-join in which the launching thread never waits for a helper to wake.

A parallel launch cuts its blocks into chunks, publishes them as a job, and claims and runs chunks itself until none
is left; it then waits only for the chunks helpers claimed, which are running. A helper that has not been scheduled
yet (the cores busy with another process, or pytest's other worker) claims nothing and holds nothing up: the launch
takes about what one thread would. numba's fork-join (`prange`, until session 83) ends at a barrier every thread
must reach, and on a loaded machine each launch waited for the system to give its second thread a turn, 4 ms at a
time: ResNet-50 ran at 141-205 ms on two threads beside another busy process, about 104 on one, 85-91 with this.

The job lives in one array of int64 words (`Pool.state`), each field on a cache line of its own (the job's five
fields, written together, share one); the code that reads and writes it is compiled by numba (`_run_job`, `_help`)
and runs without the GIL. A chunk is claimed by a compare-and-swap of one word holding the job's generation and the
next chunk's index. A new job closes that word (its generation, no chunk left) before it writes its fields, so a
helper that read some of them as they changed claims nothing (a stress run, three threads launching for 30 s,
found that race: a helper ran a chunk of the new job on the old one's count of chunks, and a launch returned
before its chunks had). Helpers spin a little while between jobs, yielding their core now and then, then sleep on a
futex of the generation word (Linux); `pool()` is None elsewhere and launches share their blocks out through Python
threads.
"""
from __future__ import annotations

import atexit
import ctypes
import os
import platform
import sys
import threading

import numpy as np
from llvmlite import ir as llvm
from numba import njit, types
from numba.core import cgutils
from numba.extending import intrinsic

_I64 = llvm.IntType(64)
LINE = 8                    # words a cache line: every field on a line of its own
GEN, OWNER, CLAIM, DONE, FAILED, SLEEPERS = (LINE * k for k in range(6))
SHARE, PACK, BEGIN, END, CHUNKS = (LINE * 6 + k for k in range(5))     # the job: written together, read together
RUNNER, HELPERS, FUTEX, YIELD, STOP = (LINE * 7 + k for k in range(5))    # set by Python: the runner's address, ...
WORDS = LINE * 8
INDEX_BITS = 24             # a claim word: generation << INDEX_BITS | the next chunk
GEN_MASK = (1 << 32) - 1    # the generation is what the futex compares: the low 32 bits of its word
SPINS = 20000               # pauses a helper spins for before it sleeps (~0.5 ms): launches come in runs
YIELD_SPINS = 1024          # pauses a spinning thread spins for between yields of its core
_SYSCALLS = {"x86_64": (202, 24), "aarch64": (98, 124)}     # Linux's numbers of (futex, sched_yield)
FUTEX_WAIT, FUTEX_WAKE = 128, 129                            # the _PRIVATE forms: one process
MAX_CHUNKS = 1 << INDEX_BITS
# a share function: (the packed block, first block, end block) -> 1 if the kernel raised, else 0
SHARE_TYPE = llvm.FunctionType(llvm.IntType(32), [llvm.IntType(8).as_pointer(), _I64, _I64])


def _word(builder, state, index):
    return builder.gep(builder.inttoptr(state, _I64.as_pointer()), [index])


@intrinsic
def _load(typingctx, state, index):
    """Word `index` of the state at `state` (sequentially consistent, as every access here)."""
    def codegen(context, builder, signature, values):
        return builder.load_atomic(_word(builder, *values), "seq_cst", 8)
    return types.int64(state, index), codegen


@intrinsic
def _store(typingctx, state, index, value):
    """Set word `index` of the state at `state` to `value`."""
    def codegen(context, builder, signature, values):
        builder.store_atomic(values[2], _word(builder, values[0], values[1]), "seq_cst", 8)
        return context.get_dummy_value()
    return types.none(state, index, value), codegen


@intrinsic
def _add(typingctx, state, index, value):
    """Add `value` to word `index` of the state at `state`."""
    def codegen(context, builder, signature, values):
        builder.atomic_rmw("add", _word(builder, values[0], values[1]), values[2], "seq_cst")
        return context.get_dummy_value()
    return types.none(state, index, value), codegen


@intrinsic
def _swap(typingctx, state, index, expected, new):
    """Set word `index` of the state at `state` to `new` if it holds `expected`: whether it did."""
    def codegen(context, builder, signature, values):
        pair = builder.cmpxchg(_word(builder, values[0], values[1]), values[2], values[3], "seq_cst", "seq_cst")
        return builder.extract_value(pair, 1)
    return types.boolean(state, index, expected, new), codegen


@intrinsic
def _pause(typingctx):
    """A spin-wait hint (x86's `pause`): the loop waiting leaves the core's resources to its sibling."""
    def codegen(context, builder, signature, values):
        if platform.machine() in ("x86_64", "AMD64"):
            pause = cgutils.get_or_insert_function(builder.module, llvm.FunctionType(llvm.VoidType(), []),
                                                   "llvm.x86.sse2.pause")
            builder.call(pause, [])
        return context.get_dummy_value()
    return types.none(), codegen


@intrinsic
def _syscall(typingctx, number, first, second, third):
    """Linux's system call `number` on three integer arguments, the rest 0 (libc's `syscall`, which passes on six:
    futex's fourth is its timeout, a null pointer for none)."""
    def codegen(context, builder, signature, values):
        fn = cgutils.get_or_insert_function(builder.module, llvm.FunctionType(_I64, [_I64], var_arg=True), "syscall")
        return builder.call(fn, [*values, _I64(0), _I64(0), _I64(0)])
    return types.int64(number, first, second, third), codegen


@intrinsic
def _share_succeeds(typingctx, share, pack, begin, end):
    """Call the share function at `share` on the packed arguments at `pack` and blocks [begin, end): whether
    the kernel returned without raising."""

    def codegen(context, builder, signature, values):
        share_value, pack_value, begin_value, end_value = values
        fn = builder.inttoptr(share_value, SHARE_TYPE.as_pointer())
        failed = builder.call(fn, [builder.inttoptr(pack_value, llvm.IntType(8).as_pointer()), begin_value, end_value])
        return builder.icmp_unsigned("==", failed, failed.type(0))

    return types.boolean(share, pack, begin, end), codegen


@njit(nogil=True)     # not cached itself: its callers' cached code holds it
def _work(state, generation) -> None:
    """Claim and run chunks of job `generation` until none is left (or another job has replaced it)."""
    share, pack, begin, chunks = _load(state, SHARE), _load(state, PACK), _load(state, BEGIN), _load(state, CHUNKS)
    blocks = _load(state, END) - begin
    while True:
        claim = _load(state, CLAIM)
        chunk = claim & (MAX_CHUNKS - 1)
        if claim >> INDEX_BITS != generation or chunk >= chunks:
            return
        if _swap(state, CLAIM, claim, claim + 1):
            if not _share_succeeds(share, pack, begin + blocks * chunk // chunks,
                                   begin + blocks * (chunk + 1) // chunks):
                _store(state, FAILED, 1)
            _add(state, DONE, 1)


@njit(nogil=True, cache=True)
def _run_job(state, share, pack, begin, end, chunks) -> bool:
    """Run blocks [begin, end) in `chunks` chunks, each by the share function at `share` on the packed arguments at
    `pack`, on this thread and the pool's helpers: whether every chunk succeeded. While another thread's launch
    holds the helpers, every chunk runs on this thread."""
    if not _swap(state, OWNER, 0, 1):
        return _share_succeeds(share, pack, begin, end)
    chunks = min(chunks, MAX_CHUNKS - 1)      # the index must not run into the claim word's generation
    generation = (_load(state, GEN) + 1) & GEN_MASK
    # closed first: a helper still in the last job that reads some of this job's fields as they change then sees
    # another generation here, and claims nothing (its count of chunks may be this job's)
    _store(state, CLAIM, generation << INDEX_BITS | (MAX_CHUNKS - 1))
    _store(state, SHARE, share)
    _store(state, PACK, pack)
    _store(state, BEGIN, begin)
    _store(state, END, end)
    _store(state, CHUNKS, chunks)
    _store(state, DONE, 0)
    _store(state, FAILED, 0)
    _store(state, CLAIM, generation << INDEX_BITS)
    _store(state, GEN, generation)
    if _load(state, SLEEPERS) > 0:
        _syscall(_load(state, FUTEX), state + GEN * 8, FUTEX_WAKE, _load(state, HELPERS))
    _work(state, generation)
    spins = 0
    while _load(state, DONE) < chunks:      # chunks helpers claimed, running
        _pause()
        spins += 1
        if spins % YIELD_SPINS == 0:        # a helper may be waiting for this core
            _syscall(_load(state, YIELD), 0, 0, 0)
    succeeded = _load(state, FAILED) == 0
    _store(state, OWNER, 0)
    return succeeded


@njit(nogil=True, cache=True)
def replay(state, table) -> int:
    """Issue the launches of `table` in order, each row (share function, packed arguments, blocks, helpers,
    chunks) as `parallel.launch` would (one chunk: on this thread; more: with `helpers` of the pool whose state is
    at `state`): -1, or the row of the first launch that failed (it and the launches after it did not all run)."""
    for row in range(table.shape[0]):
        share, pack, blocks, helpers, chunks = table[row, 0], table[row, 1], table[row, 2], table[row, 3], table[row, 4]
        if chunks <= 1:
            succeeded = _share_succeeds(share, pack, 0, blocks)
        else:
            _store(state, HELPERS, helpers)
            succeeded = _run_job(state, share, pack, 0, blocks, chunks)
        if not succeeded:
            return row
    return -1


@njit(nogil=True, cache=True)
def _help(state, helper) -> None:
    """Helper number `helper`'s life: wait for a job, claim its chunks, until the pool stops. A helper numbered past
    the pool's `HELPERS` (fewer threads asked for since it started) sits the jobs out."""
    seen = _load(state, GEN)        # the futex is the generation's low 32 bits (little-endian): its word's address
    while True:
        spins = 0
        while _load(state, GEN) == seen and not _load(state, STOP):     # (stopped before it started, too)
            if spins < SPINS:
                _pause()
                spins += 1
                if spins % YIELD_SPINS == 0:    # a thread of this process may be waiting for this core
                    _syscall(_load(state, YIELD), 0, 0, 0)
            else:
                _add(state, SLEEPERS, 1)
                _syscall(_load(state, FUTEX), state + GEN * 8, FUTEX_WAIT, seen)   # at once if a job came
                _add(state, SLEEPERS, -1)
        if _load(state, STOP):
            return
        seen = _load(state, GEN)
        if helper < _load(state, HELPERS):
            _work(state, seen)


class Pool:
    """The helper threads of this process and the state they share: `state_address` goes to `parallel.launch`."""

    def __init__(self):
        from .parallel import entry_address
        self.state = np.zeros(WORDS, np.int64)
        self.state_address = self.state.ctypes.data
        self.state[FUTEX], self.state[YIELD] = _syscall_numbers()
        self.state[RUNNER] = entry_address(_run_job, (types.int64,) * 6)
        entry_address(_help, (types.int64,) * 2)         # compiled (or loaded) here, not in a helper
        self.threads: list = []
        self._starting = threading.Lock()
        atexit.register(self.stop)

    def engage(self, helpers: int) -> int:
        """Start helpers up to `helpers` and let that many take part: the state's address."""
        if len(self.threads) < helpers:
            with self._starting:
                while len(self.threads) < helpers:
                    thread = threading.Thread(target=_help, args=(self.state_address, len(self.threads)),
                                              name=f"taskdsl-cpu-{len(self.threads) + 1}", daemon=True)
                    thread.start()
                    self.threads.append(thread)
        self.state[HELPERS] = helpers
        return self.state_address

    def stop(self) -> None:
        """End the helpers (at exit: before the interpreter and numba tear down the code they run)."""
        self.state[STOP] = 1
        self.state[GEN] = (self.state[GEN] + 1) & GEN_MASK
        ctypes.CDLL(None).syscall(ctypes.c_long(self.state[FUTEX]), ctypes.c_void_p(self.state_address + GEN * 8),
                                  ctypes.c_int(FUTEX_WAKE), ctypes.c_int(len(self.threads)))
        for thread in self.threads:
            thread.join(timeout=1)


_pools: list = []


def _syscall_numbers() -> tuple | None:
    """Linux's numbers of futex and sched_yield here, None elsewhere (not Linux on x86-64 or aarch64)."""
    return _SYSCALLS.get(platform.machine()) if sys.platform.startswith("linux") else None


def pool() -> Pool | None:
    """This process's pool of helper threads, None where they cannot sleep on a futex (`_syscall_numbers`)."""
    if not _pools and _syscall_numbers() is not None:
        _pools.append(Pool())
    return _pools[0] if _pools else None


def _forget_pools() -> None:
    """A forked child has none of the parent's threads: it starts a pool of its own when it needs one."""
    _pools.clear()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_forget_pools)
