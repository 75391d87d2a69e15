"""Calling a generated cpu kernel: flat views of the tensors, blocks split over a thread pool."""
from __future__ import annotations

import concurrent.futures
import contextlib
import functools
import os
import threading

import numpy as np

from .codegen import CpuSource


@contextlib.contextmanager
def slp_vectorizer():
    """numba leaves LLVM's SLP vectorizer off by default; unrolled register tiles need it."""
    from numba.core import config
    saved = config.SLP_VECTORIZE
    config.SLP_VECTORIZE = 1
    try:
        yield
    finally:
        config.SLP_VECTORIZE = saved


def num_threads() -> int:
    """Worker threads for block-parallel launches ($TASKDSL_NUM_THREADS, default: the CPU count)."""
    return max(1, int(os.environ.get("TASKDSL_NUM_THREADS") or _cpu_count()))


@functools.cache
def _cpu_count() -> int:
    return os.cpu_count() or 1     # 10+ us a call: read once


_warm: dict = {}      # dispatcher -> argument layouts it has been called with (compiled for)


@functools.cache
def _pool(workers: int) -> concurrent.futures.ThreadPoolExecutor:
    return concurrent.futures.ThreadPoolExecutor(workers, thread_name_prefix="taskdsl-cpu")


def call_args(src: CpuSource, values: list) -> tuple[list, list]:
    """(the arguments for the generated function, (array, copy) pairs to copy back after the call).

    In flat mode each array goes in as a 1-D view; a non-contiguous one is copied into a
    contiguous buffer and copied back afterwards, so callers still see in-place writes.
    """
    args, copy_back = [], []
    for v in values:
        if isinstance(v, np.ndarray) and v.dtype == np.float16:
            v = v.view(np.uint16)   # numba has no float16: kernels read and write the bits
        if src.flat and isinstance(v, np.ndarray):
            if v.flags.c_contiguous:
                args.append(v.reshape(-1))
            else:
                tmp = np.ascontiguousarray(v)
                if v.flags.writeable:   # a read-only input cannot have been written
                    copy_back.append((v, tmp))
                args.append(tmp.reshape(-1))
        else:
            args.append(v)
    return args, copy_back


def signature(src: CpuSource, values: list, sizes: list, grid: tuple) -> tuple:
    """The numba types of the arguments `launch_cpu` passes (block range included), for compiling ahead."""
    from numba import typeof
    args, _ = call_args(src, values)
    return tuple(typeof(a) for a in args) + tuple(typeof(int(n)) for n in (*sizes, *grid, 0, 0))


def launch_cpu(run, src: CpuSource, values: list, sizes: list, grid: tuple, parallel=None) -> None:
    """Run the dispatcher `run` on `values` (arrays and scalars), `sizes` and the `grid` of blocks; blocks
    in parallel through `parallel` (the module's `parallel_entry`) where given, else a thread pool."""
    args, copy_back = call_args(src, values)
    blocks = grid[0] * grid[1] * grid[2]
    workers = min(num_threads(), blocks) if src.parallel else 1
    layouts = tuple((a.ndim, a.flags.c_contiguous, a.flags.writeable) for a in args if isinstance(a, np.ndarray))
    _compile(run, layouts, args, sizes, grid)
    if workers <= 1:
        run(*args, *sizes, *grid, 0, blocks)
    elif parallel is not None and threading.current_thread() is threading.main_thread():
        # numba's threads (another thread's launch, concurrent with this one, takes the pool below: some
        # threading layers do not take parallel regions from two threads at once)
        _compile(parallel, layouts, args, sizes, grid)
        parallel(*args, *sizes, *grid, workers, blocks)
    else:   # the calling thread runs the first share itself: one thread hand-off fewer per launch
        bounds = [blocks * w // workers for w in range(workers + 1)]
        futures = [_pool(workers - 1).submit(run, *args, *sizes, *grid, lo, hi)
                   for lo, hi in zip(bounds[1:-1], bounds[2:])]
        try:
            run(*args, *sizes, *grid, bounds[0], bounds[1])
        finally:
            for f in futures:    # every share has finished writing before this returns or raises
                f.exception()
        for f in futures:
            f.result()
    for original, tmp in copy_back:
        np.copyto(original, tmp)


def _compile(fn, layouts: tuple, args: list, sizes: list, grid: tuple) -> None:
    """Compile (or load) `fn` for these argument layouts once, with the SLP vectorizer on: a call that runs
    no block (an entry's empty block range, or a parallel entry's zero chunks)."""
    if layouts not in _warm.setdefault(fn, set()):     # what numba's types of these arguments depend on
        with slp_vectorizer():
            fn(*args, *sizes, *grid, 0, 0)
        _warm[fn].add(layouts)
