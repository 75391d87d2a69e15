"""Compiling many cpu kernels at once, on every core.

numba compiles one function at a time on one core, and a model's graph has dozens of kernels
(each fused convolution is its own module, about 5 s of numba each). A graph compile therefore
first *records* its launches without running them, and compiles each recorded kernel in a
worker process as soon as it is recorded, while the recording goes on:

    with AheadCompiler() as ahead:
        with ahead.recording():       # Kernel calls on the cpu target note (module, entry, types);
            run the graph once        # each new job goes to a worker process at once
        ahead.wait(progress)          # numba's disk cache now holds every job's machine code

and then runs for real: each kernel loads its machine code from numba's cache instead of
compiling it. Recording never changes results; a kernel a worker did not compile compiles at
its first launch.
"""
from __future__ import annotations

import concurrent.futures
import contextlib
import ctypes
import multiprocessing
import os
import signal
import sys
import threading
import warnings
from dataclasses import dataclass
from pathlib import Path

from numba.core.compiler_lock import global_compiler_lock

from ...runtime.config import env_count

_local = threading.local()   # .recorder: this thread's _Recorder while it records (another thread's launches run)
_recording_threads = 0       # how many threads record: launches check this int first (no thread-local lookup)
_count_lock = threading.Lock()


@dataclass(frozen=True)
class Job:
    """One numba compilation: the generated module, its entry function and the argument types, and the signature
    of `parallel.launch` that launches it (compiled too: in the main process, after every worker had finished,
    the launchers took 0.9-1.07 s of a cold ResNet-50 or GPT-2 build of 9-11 s, one after another)."""

    path: str
    entry: str
    signature: tuple      # numba types, in call order
    opt_level: int = 3    # the source's (see `launch.compiler_settings`)
    apart: bool = False   # the entry's `apart_twin` (a call whose written arrays overlap no other argument)
    launcher: tuple = ()  # `parallel.launcher_signature` of its launches; none for an outlined function

    def function(self):
        """The numba dispatcher this job compiles."""
        from .compile import apart_twin, load_module_function
        entry = load_module_function(Path(self.path), self.entry)
        return apart_twin(entry) if self.apart else entry


class _Recorder:
    """The jobs recorded so far; `on_new(job)` is called for each job not seen before. With `kernels` (a list),
    launches note (kernel, block) there instead, and generate no code."""

    def __init__(self, on_new=None, kernels: list | None = None):
        self.jobs: list = []
        self.on_new = on_new
        self.kernels = kernels


def is_recording() -> bool:
    """Whether this thread's cpu launches are being recorded instead of run (a graph compiling in one thread left
    the kernels other threads called unrun, silently)."""
    return _recording_threads > 0 and getattr(_local, "recorder", None) is not None


def record(job: Job) -> None:
    """Note one launch's compilation (duplicates are dropped)."""
    recorder = _local.recorder
    if job not in recorder.jobs:
        recorder.jobs.append(job)
        if recorder.on_new is not None:
            recorder.on_new(job)


def collected(kernel, block: tuple) -> bool:
    """Whether this thread collects its launched kernels (`collecting`): then `kernel` (launched with `block`) is
    noted, and its launch does nothing else."""
    kernels = _local.recorder.kernels
    if kernels is not None:
        kernels.append((kernel, block))
    return kernels is not None


@contextlib.contextmanager
def _recording_into(recorder: _Recorder):
    global _recording_threads
    saved, _local.recorder = getattr(_local, "recorder", None), recorder
    with _count_lock:
        _recording_threads += 1
    try:
        yield recorder
    finally:
        _local.recorder = saved
        with _count_lock:
            _recording_threads -= 1


@contextlib.contextmanager
def recording():
    """Inside the block, cpu kernel launches are recorded (not run): yields the list of Jobs."""
    with _recording_into(_Recorder()) as recorder:
        yield recorder.jobs


@contextlib.contextmanager
def collecting():
    """Inside the block, cpu kernel launches are noted, not run nor compiled: yields the list of (kernel, block)
    launched (a kernel launched twice is there twice)."""
    with _recording_into(_Recorder(kernels=[])) as recorder:
        yield recorder.kernels


def workers() -> int:
    """Processes for parallel compiles ($TASKDSL_COMPILE_WORKERS, default: the CPU count)."""
    return env_count("TASKDSL_COMPILE_WORKERS", os.cpu_count() or 1)


def compile_job(job: Job) -> None:
    """Compile one job's entry for its signature, and its launcher (numba's cache=True writes the machine code)."""
    from .launch import compiler_settings
    from .parallel import compiled, launch
    with compiler_settings(job.opt_level):      # under the cache's lock and repair, as a launch compiles
        compiled(job.function(), job.signature)
    if job.launcher:
        compiled(launch, job.launcher)          # at numba's own settings, as `launch._compile` compiles it


def pending(jobs: list) -> list:
    """The jobs whose function is neither compiled for that signature in this process nor in
    numba's disk cache (any cached signature counts: a new one compiles at its first launch)."""
    from .compile import APART

    def compiled(job: Job) -> bool:
        path = Path(job.path)
        if job.signature in job.function().signatures:
            return True
        entry = job.entry + (APART if job.apart else "")
        return any((path.parent / "__pycache__").glob(f"{path.stem}.{entry}-*.nbi"))

    return [j for j in jobs if not compiled(j)]


# No job finishing for this long means stuck workers, not slow ones (a kernel compiles in seconds): a forked
# worker once waited forever on a lock after onnxruntime's threads had run in the parent
STALL_SECONDS = 600.0


def _max_processes() -> int:
    return workers() if sys.platform.startswith("linux") else 1


def _end_with_parent(parent: int) -> None:
    """A worker's start: ask Linux to end it when its parent process ends (killed, the workers stayed for good)."""
    try:
        # SIGKILL: a SIGTERM ignored where the process started (some CI runners) is ignored in the workers too
        ctypes.CDLL(None).prctl(1, signal.SIGKILL)     # PR_SET_PDEATHSIG
    except (OSError, AttributeError):                   # not Linux: the executor's own shutdown stops them
        return
    if os.getppid() != parent:      # the parent ended before the request was made: no signal will come
        os._exit(0)


class AheadCompiler:
    """Worker processes that compile jobs while the caller goes on: `with AheadCompiler() as ahead:`, then
    `with ahead.recording(): ...` submits each new recorded job, and `ahead.wait()` waits for them all.
    Leaving the `with` stops the workers."""

    def __init__(self, processes: int | None = None):
        self.processes = _max_processes() if processes is None else processes
        self.futures: dict = {}       # future -> its job
        self._pool = None

    def recording(self):
        """A context in which cpu launches are recorded (not run), each new job submitted at once."""
        return _recording_into(_Recorder(self.submit))

    def submit(self, job: Job) -> None:
        """Start compiling `job` in a worker, unless its code is cached already (or there are no workers)."""
        if self.processes <= 1 or not pending([job]):
            return
        if self._pool is None:
            # fork: a worker starts in milliseconds with numba already imported, and never re-runs the
            # user's script (spawn would, without an `if __name__ == "__main__"` guard). Workers fork
            # from a submit, when nothing compiles or launches here: the idle launch threads hold no
            # lock the children need.
            self._pool = concurrent.futures.ProcessPoolExecutor(
                self.processes, mp_context=multiprocessing.get_context("fork"), initializer=_end_with_parent,
                initargs=(os.getpid(),))
        # a submit may fork a worker: under numba's compiler lock, which another thread compiling a kernel would
        # otherwise hold in the child for good (its compiles then waited out STALL_SECONDS)
        with global_compiler_lock:
            self.futures[self._pool.submit(compile_job, job)] = job

    def wait(self, progress=None, stall_seconds: float = STALL_SECONDS) -> None:
        """Wait for every submitted job, stepping `progress` as each one finishes; a worker's error is raised.
        Workers that finish no job for `stall_seconds` are stopped, with a warning: what they had left
        compiles at its first launch."""
        remaining = set(self.futures)
        while remaining:
            done, remaining = concurrent.futures.wait(remaining, stall_seconds, concurrent.futures.FIRST_COMPLETED)
            if not done:
                warnings.warn(f"the compile workers finished nothing in {stall_seconds:.0f} s and were stopped; "
                              f"{len(remaining)} kernels compile at their first launch instead "
                              "(TASKDSL_COMPILE_WORKERS=1 compiles in this process)", RuntimeWarning, stacklevel=2)
                self._stop()
                return
            for future in done:
                try:
                    future.result()
                except FileNotFoundError:   # the cache was cleared or evicted meanwhile: compiled at first launch
                    pass
                if progress is not None:
                    progress.step()

    def _stop(self) -> None:
        """End the worker processes now, whatever they are doing."""
        for process in list(self._pool._processes.values()):     # (the executor has no public way to kill them)
            process.kill()          # not terminate: a SIGTERM ignored where this process started is ignored there
        self._pool.shutdown(wait=True, cancel_futures=True)
        self._pool = None

    def __enter__(self) -> "AheadCompiler":
        return self

    def __exit__(self, kind, value, traceback) -> None:
        if self._pool is None:
            return
        if kind is not None and issubclass(kind, KeyboardInterrupt):   # an interrupt of this process alone (an IDE's,
            self._stop()                                              # a debugger's) waited for the running jobs
        else:       # jobs not started yet are dropped: they compile at their first launch
            self._pool.shutdown(wait=True, cancel_futures=True)

