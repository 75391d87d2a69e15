"""Calling a generated cpu kernel: flat views of the tensors, blocks split over a thread pool.

`recording()` collects the launches of a block of code as `RecordedLaunch`es (each can be issued
again as it was), and `note_host_work` the work the host did meanwhile that a replay of the
launches alone would not redo (copies of non-contiguous operands, zero fills): the graph
executor's cpu replay (`graph/replay.py`) is built on both.
"""
from __future__ import annotations

import concurrent.futures
import contextlib
import copy
import functools
import os
import threading
from dataclasses import dataclass, field

import numpy as np

from ...runtime.config import env_count
from . import call_types, threads
from .codegen import CpuSource
from .compile import apart_twin
from .parallel import PACK, PARALLEL_FAILURE, compiled, entry_address, launch, launcher_signature
from .vectors import widen_slp_vectors


@contextlib.contextmanager
def compiler_settings(opt_level: int):
    """numba's LLVM settings for a generated kernel: the SLP vectorizer on (numba leaves it off; unrolled
    register tiles need it, as wide as the host's vectors: `vectors`) and optimization level `opt_level`
    (a source's `opt_level`), with numba's call typing memoized (`call_types`).

    numba's per-function passes, run on each function as it joins the module, run at a low level: the module
    pipeline that follows, at `opt_level`, optimizes every function again. Under `td.fast_compile` (below level
    3) they run at level 0, next to nothing: running both was 12% of numba's time on fast kernels
    (tests/ops/test_conv.py; 4% less CPU over the suite's zoo and cpu matmul tests, with no slower runs).
    Optimized kernels run them at level 1: at level 3 they were a third of a tile matmul's compile, and at 0
    BERT's GELU epilogue stayed scalar (its matmuls 16% slower); at 1 the zoo runs as fast (docs/benchmarks.md,
    session 64)."""
    from numba.core import config
    from numba.core.registry import cpu_target
    widen_slp_vectors()
    codegen = cpu_target.target_context.codegen()
    saved = config.SLP_VECTORIZE, config.OPT, codegen.__dict__.get("_function_pass_manager")
    config.SLP_VECTORIZE, config.OPT = 1, config._OptLevel(opt_level)
    codegen._function_pass_manager = functools.partial(type(codegen)._function_pass_manager, codegen,
                                                       opt=1 if opt_level >= 3 else 0)
    try:
        with call_types.memoized():
            yield
    finally:
        config.SLP_VECTORIZE, config.OPT, manager = saved
        if manager is None:
            codegen.__dict__.pop("_function_pass_manager", None)
        else:           # a compile inside another one's settings (a kernel compiling a helper) gives them back
            codegen._function_pass_manager = manager


def num_threads() -> int:
    """Worker threads for block-parallel launches ($TASKDSL_NUM_THREADS, default: the CPU count)."""
    return env_count("TASKDSL_NUM_THREADS", _cpu_count())


@functools.cache
def _cpu_count() -> int:
    return os.cpu_count() or 1     # 10+ us a call: read once


@functools.cache
def _pool(workers: int) -> concurrent.futures.ThreadPoolExecutor:
    return concurrent.futures.ThreadPoolExecutor(workers, thread_name_prefix="taskdsl-cpu")


def check_writeable(values: list, written: dict, kernel: str) -> None:
    """A ValueError for a read-only numpy array passed where the kernel writes (`written`: index -> name)."""
    for index, name in written.items():
        v = values[index]
        if isinstance(v, np.ndarray) and not v.flags.writeable:
            raise ValueError(f"kernel '{kernel}': argument '{name}' is a read-only numpy array, but the kernel "
                             "writes to it; pass a writable one (np.array(x) copies)")


def written_pairs(values: list, written) -> list:
    """(position of an array the kernel writes, position of another array) for each pair of a call's arguments
    that `arrays_apart` tests (`written`: the written positions)."""
    arrays = [k for k, v in enumerate(values) if isinstance(v, np.ndarray)]
    return [(w, k) for w in written if w in arrays for k in arrays if k != w]


def arrays_apart(values: list, pairs: list) -> bool:
    """Whether the arrays of no pair of `written_pairs` share memory: such a call may run the kernel's
    `apart_twin`, whose arrays numba marks `noalias`. Bounds decide (np.may_share_memory: about 0.4 us a pair),
    so interleaved views count as overlapping."""
    return not any(np.may_share_memory(values[w], values[k]) for w, k in pairs)


def runs_apart(src: CpuSource, values: list, written) -> bool:
    """Whether a `PreparedLaunch` call on `values` runs the kernel's `apart_twin` (flat, contiguous arrays, none
    written overlapping another), as compile-ahead jobs record it."""
    contiguous = all(v.flags.c_contiguous for v in values if isinstance(v, np.ndarray))
    return src.flat and contiguous and arrays_apart(values, written_pairs(values, written))


def view_key(a: np.ndarray) -> tuple:
    """What makes two arrays one view of memory: data address, shape, strides and dtype."""
    return a.__array_interface__["data"][0], a.shape, a.strides, a.dtype


def check_copies_apart(values: list, written: dict, kernel: str, names) -> None:
    """A ValueError where an array the kernel writes and another argument share memory and one of them is not
    C-contiguous (`names`: the parameters'): the cpu target copies such an array, so the kernel would see two arrays
    where the caller has one, its writes through one unseen through the other (or lost when the other's copy went
    back last)."""
    for w, k in written_pairs(values, written):
        a, b = values[w], values[k]
        if (a.flags.c_contiguous and b.flags.c_contiguous) or view_key(a) == view_key(b):     # one view: copied once
            continue
        if np.shares_memory(a, b):
            raise ValueError(f"kernel '{kernel}': arguments '{names[w]}' (written) and '{names[k]}' share memory "
                             "and one of them is not C-contiguous; the cpu target runs such an array on a "
                             "contiguous copy, so the kernel would see two arrays where there is one: pass arrays "
                             "that do not overlap, or the same view for both")


def call_args(src: CpuSource, values: list, written=None) -> tuple[list, list]:
    """(the arguments for the generated function, (array, copy) pairs to copy back after the call).

    In flat mode each array goes in as a 1-D view; a non-contiguous one is copied into a
    contiguous buffer and copied back afterwards (those at positions in `written`, the arrays the
    kernel writes; None: every writable one), so callers still see in-place writes. One view
    passed for several parameters is copied once, so the kernel sees one array, as it would the view.
    """
    args, copy_back, copies = [], [], {}
    for k, v in enumerate(values):
        v = _half_bits(v)
        if src.flat and isinstance(v, np.ndarray):
            if v.flags.c_contiguous:
                args.append(v.reshape(-1))
                continue
            view = view_key(v)
            if view not in copies:
                copies[view] = np.ascontiguousarray(v)
                note_host_work("a non-contiguous operand was copied for a kernel")
            # a read-only input cannot have been written; nor an input the kernel only reads, whose copy, going
            # back, could undo writes made through another view of its memory
            if v.flags.writeable and (written is None or k in written) and \
                    all(original is not v for original, _ in copy_back):
                copy_back.append((v, copies[view]))
            args.append(copies[view].reshape(-1))
        else:
            args.append(v)
    return args, copy_back


_BIT_PATTERNS = {np.dtype(np.float16): np.uint16, np.dtype(np.uint16): np.uint16, np.dtype(np.uint8): np.uint8}


def _half_bits(value):
    """An f16 array or scalar as its uint16 bit patterns (numba has no float16: kernels read and write the bits);
    any other value as it is."""
    return value.view(np.uint16) if isinstance(value, (np.ndarray, np.float16)) and value.dtype == np.float16 else value


def signatures(src: CpuSource, values: list, sizes: list, grid: tuple) -> tuple[tuple, tuple]:
    """The numba types of the arguments `launch_cpu` passes the entry (block range included), and the signature of
    the launcher it calls: what compiling ahead compiles."""
    args, _ = call_args(src, values)
    tail = launch_ints(src, sizes, grid)
    return _entry_types(args, tail), launcher_signature((*byte_views(src, args), tail))


def launch_ints(src: CpuSource, sizes: list, grid: tuple) -> np.ndarray:
    """The sizes, the grid and the outlined functions' addresses as an entry takes them: one int64 array, so that
    one launcher (compiled per tuple of argument types, ~0.15 s) serves kernels of any number of sizes."""
    return np.array((*sizes, *grid, *src.addresses), np.int64)


def _entry_types(args: list, tail: np.ndarray) -> tuple:
    from numba import typeof
    return tuple(typeof(a) for a in args) + (typeof(tail), typeof(0), typeof(0))


def launch_cpu(run, src: CpuSource, values: list, sizes: list, grid: tuple, written=None) -> None:
    """Run the dispatcher `run` on `values` (arrays and scalars), `sizes` and the `grid` of blocks; blocks
    in parallel on this thread and helper threads (`_issue`). Copies of non-contiguous arrays go back where the
    kernel writes them (`written` positions; None: every writable one)."""
    args, copy_back = call_args(src, values, written)
    blocks, tail = grid[0] * grid[1] * grid[2], launch_ints(src, sizes, grid)
    address, entry = _compile(run, src, args, tail)
    _run_blocks(run, address, byte_views(src, args), tail, blocks, _workers(src, blocks), entry)
    for original, tmp in copy_back:
        np.copyto(original, tmp)


class PreparedLaunch:
    """`launch_cpu` with one binding's function, scalars, sizes and grid decided: a repeated call with
    arrays of the same dtypes and shapes (and the same scalars) only makes the arrays' flat views.

    Called with the kernel's arguments as the user passed them; arrays that are not C-contiguous
    take `launch_cpu`'s copying path.
    """

    def __init__(self, run, src: CpuSource, values: list, sizes: list, grid: tuple, written: dict, kernel: str,
                 serial_below: int = 0, names: tuple = ()):
        self.run, self.src = run, src
        self.written, self.kernel = written, kernel      # the arrays the kernel stores to (index -> name)
        self.names = names                               # the parameters' names, for messages
        # the binding's scalars, reused as they are; not its arrays, which each call replaces (kept, they would
        # stay alive as long as the kernel's launch cache)
        self.values = [None if isinstance(v, np.ndarray) else _half_bits(v) for v in values]
        self.sizes, self.grid = list(sizes), grid
        self.tail = launch_ints(src, sizes, grid)
        self.blocks = grid[0] * grid[1] * grid[2]
        # the thread count as of the first such call; one on fewer bytes than the kernel's `serial_below`
        serial = sum(v.nbytes for v in values if isinstance(v, np.ndarray)) < serial_below
        self.workers = 1 if serial else _workers(src, self.blocks)
        self.built: dict = {}       # (the arrays' writeable flags, apart) -> `_compile`'s (address, entry) for them
        # arrays by position, and the type of the bit patterns they may travel as (f16; bf16 and the 8-bit floats,
        # bound as uint16 and uint8 bits), or None
        self.arrays = [(i, _BIT_PATTERNS.get(v.dtype)) for i, v in enumerate(values) if isinstance(v, np.ndarray)]
        self.pairs = written_pairs(values, written)     # the arrays `arrays_apart` tests at each call

    def with_scalars(self, scalars: dict) -> "PreparedLaunch":
        """This launch with other values of its scalars ({position: bound value}), sharing its compiled entries."""
        launch = copy.copy(self)
        launch.values = self.values[:]
        for k, value in scalars.items():
            launch.values[k] = _half_bits(value)
        return launch

    def __call__(self, args: tuple) -> None:
        values = self.values[:]
        contiguous = self.src.flat
        writeable = []
        for i, bits in self.arrays:
            a = args[i].view(bits) if bits else args[i]
            flags = a.flags
            contiguous = contiguous and flags.c_contiguous
            writeable.append(flags.writeable)
            values[i] = a
        if not contiguous:
            check_writeable(values, self.written, self.kernel)
            check_copies_apart(values, self.written, self.kernel, self.names)
            launch_cpu(self.run, self.src, values, self.sizes, self.grid, self.written)
            return
        # 1-D and contiguous, the arrays' numba types differ only in read-only inputs; the entry takes their bytes
        views = values[:]
        for i, _ in self.arrays:
            a = values[i]
            if a.ndim != 1:
                a = values[i] = a.reshape(-1)
            views[i] = a.view(np.uint8)     # (`byte_views`, made here, where the arrays are known)
        apart = arrays_apart(values, self.pairs)
        run = apart_twin(self.run) if apart else self.run
        key = (tuple(writeable), apart)
        built = self.built.get(key)
        if built is None:       # a new combination of read-only arrays: none may be one the kernel writes
            check_writeable(values, self.written, self.kernel)
            # (a later call's arrays have these types: the launch's dtypes and shapes, this key's flags)
            built = self.built[key] = _compile(run, self.src, values, self.tail)
        address, entry = built
        _run_blocks(run, address, views, self.tail, self.blocks, self.workers, entry)


# A launch of a kernel whose work is its arrays' bytes (a rule-based operator's, whose `Kernel.serial_below` this is)
# that touches fewer bytes than this runs on one thread: sharing its blocks costs more than they take. Unloaded, the
# hand-off to numba's threads is a few microseconds; with the cores busy (a second process, pytest's workers) a thread
# waits for its turn: a sum of (64, 64) took 35-543 us (median; 8 ms at the 90th percentile) on two threads, 18.6 us
# on one.
SERIAL_BYTES = 64 * 1024


def _workers(src: CpuSource, blocks: int) -> int:
    return min(num_threads(), blocks) if src.parallel else 1


def byte_views(src: CpuSource, args: list) -> list:
    """The arguments as the launcher takes them: in flat mode each (1-D) array as a view of its bytes. An entry
    reads a flat array through its data pointer alone, and numba's 1-D array structs have one layout whatever
    their element type, so one launcher (compiled per tuple of numba types, ~0.15 s) serves every element type:
    the onnx conformance cases compiled one per dtype of each arity. A debug kernel (not flat) checks its
    indices against its arrays' shapes: its arrays stay typed."""
    if not src.flat:
        return args
    return [a.view(np.uint8) if isinstance(a, np.ndarray) else a for a in args]


def _run_blocks(run, address: int, args: list, tail: np.ndarray, blocks: int, workers: int, entry) -> None:
    """`_issue` the launch (`args`: its `byte_views`; `entry`: the launcher's for them, `_compile`'s), and add it to
    this thread's `recording` if one is on."""
    record = recording_active()
    if record is not None:
        record.launches.append(RecordedLaunch(run, address, list(args), tail, blocks, workers, entry))
    _issue(address, args, tail, blocks, workers, entry)


def _issue(address: int, args: list, tail: np.ndarray, blocks: int, workers: int, entry) -> None:
    """Run blocks [0, blocks) of the generated function whose machine code is at `address` (compiled for these
    arguments: `_compile`) on `args` (`byte_views` and scalars) and `tail` (`launch_ints`: sizes and grid), on
    `workers` threads: this one and the pool's helpers (`threads`), which claim chunks of the blocks; where there
    is no pool (not Linux), this thread and a thread pool's, which take equal shares. `entry`: `parallel.launch`'s
    compiled entry for these argument types (`_compile`), which takes its star arguments as one tuple."""
    if workers <= 1:
        entry(0, address, 0, blocks, 1, (*args, tail))
        return
    pool = threads.pool()
    if pool is not None:
        entry(pool.engage(workers - 1), address, 0, blocks, chunk_count(blocks, workers), (*args, tail))
        return
    # the calling thread runs the first share itself: one thread hand-off fewer per launch
    bounds = [blocks * w // workers for w in range(workers + 1)]
    futures = [_pool(workers - 1).submit(launch, 0, address, lo, hi, 1, *args, tail)
               for lo, hi in zip(bounds[1:-1], bounds[2:])]
    try:
        launch(0, address, bounds[0], bounds[1], 1, *args, tail)
    finally:
        for f in futures:    # every share has finished writing before this returns or raises
            f.exception()
    for f in futures:
        f.result()


# Chunks a parallel launch cuts its blocks into, per thread: a helper that starts late still finds some to claim.
CHUNKS_PER_WORKER = 16


def chunk_count(blocks: int, workers: int) -> int:
    """The chunks a launch of `blocks` blocks on `workers` threads cuts them into (one: this thread runs them)."""
    return min(blocks, CHUNKS_PER_WORKER * workers) if workers > 1 else 1


_built: dict = {}      # (dispatcher, argument types) -> `_compile`'s (address, entry) for them


def _compile(fn, src: CpuSource, args: list, tail: np.ndarray) -> tuple:
    """Compile (or load) the generated function `fn` of `src` for these arguments once, with `compiler_settings`,
    and `parallel.launch` for their `byte_views` (now, under numba's cache lock, not at the call): (the address of
    fn's machine code, `parallel.entry_address`; the launcher's compiled entry). Called directly, the entry skips
    the dispatcher's typing of every argument, about a microsecond a launch; it checks the arrays' dtypes but not
    their layout or rank, so it serves calls whose arguments have these types (a replay swaps only their values)."""
    types = _entry_types(args, tail)
    done = _built.get((fn, types))
    if done is None:
        with compiler_settings(src.opt_level):
            address = entry_address(fn, types)
        entry = compiled(launch, launcher_signature((*byte_views(src, args), tail))).entry_point
        done = _built[fn, types] = address, entry
    return done


# ---------------------------------------------------------------------------------------- recording
@dataclass
class RecordedLaunch:
    """One launch as issued, to be issued again: what `recording` collects. `args` holds the flat array
    views and scalars as passed; a replay may swap an array for another of the same type and size."""

    run: object             # the generated function (numba dispatcher): kept, it keeps its machine code alive
    address: int            # its machine code for these argument types
    args: list
    tail: np.ndarray        # sizes and grid (`launch_ints`)
    blocks: int
    workers: int
    entry: object           # the launcher's compiled entry for the arguments' types (`_compile`)

    def __post_init__(self):
        # the entry's argument tuple, made once: a launch of a replay made it at each call, a fifth of its 0.5 us
        self.call_args = (*self.args, self.tail)
        self.packed = None      # `pack`'s copy of the arguments, and the share function that runs blocks of it
        self.share = 0

    def set_arg(self, index: int, value) -> None:
        """Issue the launch with `value` as argument `index` from now on (a replay binds a call's arrays so)."""
        self.args[index] = value
        self.call_args = (*self.args, self.tail)
        self.share = 0          # packed again at its next `pack`

    def pack(self) -> tuple:
        """(the share function's address, the address of its packed arguments): the launch as `NativeReplay`
        issues it (packed by the launcher, once, and again after a `set_arg`; the arrays are not referenced by the
        pack: `args` keeps them)."""
        if not self.share:
            if self.packed is None:     # numba's array struct: 5 words and 2 per dim; a scalar a word
                words = 2 + sum(5 + 2 * a.ndim if isinstance(a, np.ndarray) else 1 for a in self.call_args)
                self.packed = np.zeros(words, np.int64)
                self.packed_at = self.packed.ctypes.data    # (1 us a read: numpy makes a ctypes object for it)
            self.share = self.entry(0, self.address, self.packed_at, self.packed.nbytes, PACK, self.call_args)
            if not self.share:
                raise RuntimeError(f"the packed arguments of a replayed launch need more than {self.packed.nbytes} "
                                   "bytes: a bug of taskdsl's cpu launches")
        return self.share, self.packed_at

    def __call__(self) -> None:
        if self.workers <= 1:       # `_issue`'s first case, inline: a replay's launches are mostly small
            self.entry(0, self.address, 0, self.blocks, 1, self.call_args)
        else:
            _issue(self.address, self.args, self.tail, self.blocks, self.workers, self.entry)


class NativeReplay:
    """Recorded launches issued again by one native loop (`threads.replay`): a launch costs no Python (0.46 us
    through its launcher's entry). Where a replay binds a call's arrays, `rebound` lists the launches it binds,
    packed again before each issue."""

    def __init__(self, launches: list, rebound: set):
        self.launches = launches
        self.table = np.zeros((len(launches), 5), np.int64)     # share, pack, blocks, helpers, chunks
        for row, launch in enumerate(launches):
            self.table[row, :2] = launch.pack()
            self.table[row, 2:] = launch.blocks, launch.workers - 1, chunk_count(launch.blocks, launch.workers)
        self.rebound = [(row, launch) for row, launch in enumerate(launches) if id(launch) in rebound]
        self.helpers = max((launch.workers - 1 for launch in launches), default=0)

    @staticmethod
    def applies(launches: list) -> bool:
        """Whether `launches` can be issued so: one thread each, or helpers of a pool (Linux)."""
        return all(launch.workers <= 1 for launch in launches) or threads.pool() is not None

    def __call__(self) -> None:
        for row, launch in self.rebound:
            self.table[row, :2] = launch.pack()
        state = threads.pool().engage(self.helpers) if self.helpers else 0
        failed = threads.replay(state, self.table)
        if failed >= 0:             # issued again by its launcher, whose call raises the kernel's own exception
            self.launches[failed]()
            raise RuntimeError(PARALLEL_FAILURE)


@dataclass
class Recording:
    """The launches of a `recording()` block (and value checks a caller adds, in order: any callable), and
    what the host computed meanwhile that issuing them again would not redo."""

    launches: list = field(default_factory=list)
    host_work: list = field(default_factory=list)      # one line per kind of work, first occurrence first


_local = threading.local()


def recording_active() -> Recording | None:
    """The recording of this thread, or None outside `recording()`."""
    return getattr(_local, "recording", None)


@contextlib.contextmanager
def recording():
    """Collect every cpu launch of this thread (`RecordedLaunch`es, in order) while the block runs, besides
    running it: `with recording() as r: ...; r.launches`. The records keep their arrays alive."""
    previous, _local.recording = recording_active(), Recording()
    try:
        yield _local.recording
    finally:
        _local.recording = previous


def note_host_work(what: str) -> None:
    """Tell this thread's recording, if any, that the host computed something a replay would not redo."""
    record = recording_active()
    if record is not None and what not in record.host_work:
        record.host_work.append(what)
