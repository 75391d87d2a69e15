"""Compiling many cpu kernels at once, on every core.

numba compiles one function at a time on one core, and a model's graph has dozens of kernels
(each convolution geometry is its own SIMT-template kernel, 10-30 s to compile). A graph
compile therefore first *records* its launches without running them:

    with recording() as jobs:        # Kernel calls on the cpu target note (module, entry, types)
        run the graph once
    compile_all(jobs)                # worker processes compile them; numba's disk cache keeps the code

and then runs for real: each kernel loads its machine code from numba's cache instead of
compiling it. Recording never changes results; any failure falls back to compiling in turn.
"""
from __future__ import annotations

import concurrent.futures
import contextlib
import multiprocessing
import os
import sys
from dataclasses import dataclass
from pathlib import Path

_recording: list | None = None


@dataclass(frozen=True)
class Job:
    """One numba compilation: the generated module, its entry function and the argument types."""

    path: str
    entry: str
    signature: tuple      # numba types, in call order
    opt_level: int = 3    # the source's (see `launch.compiler_settings`)


def is_recording() -> bool:
    """Whether cpu launches are being recorded instead of run."""
    return _recording is not None


def record(job: Job) -> None:
    """Note one launch's compilation (duplicates are dropped)."""
    if job not in _recording:
        _recording.append(job)


@contextlib.contextmanager
def recording():
    """Inside the block, cpu kernel launches are recorded (not run): yields the list of Jobs."""
    global _recording
    saved, _recording = _recording, []
    try:
        yield _recording
    finally:
        _recording = saved


def workers() -> int:
    """Processes for parallel compiles ($TASKDSL_COMPILE_WORKERS, default: the CPU count)."""
    return max(1, int(os.environ.get("TASKDSL_COMPILE_WORKERS") or os.cpu_count() or 1))


def compile_job(job: Job) -> None:
    """Compile one job's function for its signature (numba's cache=True writes the machine code)."""
    from .compile import load_module_function
    from .launch import compiler_settings
    with compiler_settings(job.opt_level):
        load_module_function(Path(job.path), job.entry).compile(job.signature)


def pending(jobs: list) -> list:
    """The jobs whose function is neither compiled for that signature in this process nor in
    numba's disk cache (any cached signature counts: a new one compiles at its first launch)."""
    from .compile import load_module_function

    def compiled(job: Job) -> bool:
        path = Path(job.path)
        if job.signature in load_module_function(path, job.entry).signatures:
            return True
        return any((path.parent / "__pycache__").glob(f"{path.stem}.{job.entry}-*.nbi"))

    return [j for j in jobs if not compiled(j)]


def processes(jobs: list) -> int:
    """How many worker processes `compile_all` uses for `jobs`; 1 means none.

    With one job or one core, or off Linux (no fork), each kernel compiles at its first launch
    instead: a worker process would only add its start-up time.
    """
    return min(workers(), len(jobs)) if sys.platform.startswith("linux") else 1


def compile_all(jobs: list, progress=None) -> None:
    """Compile `jobs` in `processes(jobs)` worker processes (none if that is 1), stepping `progress`."""
    n = processes(jobs)
    if n <= 1:
        return
    # fork: a worker starts in milliseconds with numba already imported, and never re-runs the
    # user's script (spawn would, without an `if __name__ == "__main__"` guard). Nothing compiles
    # or launches while it forks, so the idle launch threads hold no lock the children need.
    context = multiprocessing.get_context("fork")
    with concurrent.futures.ProcessPoolExecutor(n, mp_context=context) as pool:
        for future in concurrent.futures.as_completed([pool.submit(compile_job, j) for j in jobs]):
            future.result()
            if progress is not None:
                progress.step()
