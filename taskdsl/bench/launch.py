"""`python -m taskdsl.bench launch`: what calling a kernel costs, on the current target.

An (almost) empty kernel with three tensor arguments: its cold compile (an empty compile
cache: frontend, lowering, code generation, NVRTC or numba, load, first launch), its first call in
a new process with that cache on disk (what a program's start pays; `python -c`, timed inside), its
first call as a second Kernel object of this process (the in-memory caches), and the host time per
launch once it is compiled (the Python launch path: binding, argument packing, the launch
call; `--sizes N` launches, default 20000). On cuda the arguments are td.DeviceArrays and
launches are asynchronous: the time includes one sync at the end, spread over N launches. Then the
same per launch for a kernel whose body reads four module-level names, which each call checks (a kernel is
built again once one is rebound, as a Python function reads its globals at each call).
"""
from __future__ import annotations

import os
import subprocess
import sys
import tempfile
import time

import numpy as np

import taskdsl as td
from taskdsl import f32, threadIdx


def empty3(A: f32["N"], B: f32["N"], C: f32["N"]):  # noqa: F821 - N: the DSL's size symbol
    """A kernel body of three array arguments that does no work: what a launch costs, alone."""
    if threadIdx.x >= N + 32:  # noqa: F821 - never true: a launch does no work
        C[0] = A[0] + B[0]


def _empty_kernel():
    """A fresh Kernel object (empty in-memory caches) of `empty3`."""
    return td.kernel(grid=1, block=32)(empty3)


# module-level names `reads4` reads: a call checks that each is still bound to what the kernel was built with
LIMIT, SCALE, SHIFT = 32, 2.0, 1.0


@td.func
def _scaled(x: f32) -> f32:
    return x * SCALE


@td.kernel(grid=1, block=32)
def reads4(A: f32["N"], B: f32["N"], C: f32["N"]):  # noqa: F821 - N: the DSL's size symbol
    """As `empty3`, reading three module-level names and calling a `td.func`: what checking them costs."""
    if threadIdx.x >= N + LIMIT:  # noqa: F821 - never true, as in empty3
        C[0] = _scaled(A[0]) + B[0] + SHIFT


_NEW_PROCESS = """
import taskdsl as td
from taskdsl.bench.launch import _arguments, _empty_kernel, _first_call_seconds
args, sync = _arguments(td.get_target())
print(_first_call_seconds(_empty_kernel(), args, sync))
"""


def _arguments(target: str) -> tuple:
    """(the three arguments on `target`, the function that waits for its launches)."""
    host = [np.zeros(64, np.float32) for _ in range(3)]
    if target == "cuda":
        from ..backend.cuda.launch import synchronize
        return [td.to_device(a) for a in host], synchronize
    return host, (lambda: None)


def _new_process_seconds(target: str):
    """The empty kernel's first call in a new process on the current cache (seconds), or why it was not timed."""
    env = dict(os.environ, TASKDSL_TARGET=target)
    done = subprocess.run([sys.executable, "-c", _NEW_PROCESS], env=env, capture_output=True, text=True)
    if done.returncode:
        return (done.stderr.strip().splitlines() or ["no output"])[-1]
    return float(done.stdout.strip().splitlines()[-1])


def _per_launch_seconds(kernel, args, sync, launches: int) -> float:
    kernel(*args)
    sync()
    start = time.perf_counter()
    for _ in range(launches):
        kernel(*args)
    sync()
    return (time.perf_counter() - start) / launches


def _first_call_seconds(kernel, args, sync) -> float:
    start = time.perf_counter()
    kernel(*args)
    sync()
    return time.perf_counter() - start


def run(sizes=(20000,)) -> dict:
    """Print and return the cold compile, cached load and per-launch seconds of the empty kernel."""
    target = td.get_target()
    launches = sizes[0]
    args, sync = _arguments(target)
    previous = os.environ.get("TASKDSL_CACHE_DIR")
    with tempfile.TemporaryDirectory() as cache:
        os.environ["TASKDSL_CACHE_DIR"] = cache        # an empty cache: a cold compile
        try:
            cold = _first_call_seconds(_empty_kernel(), args, sync)
            new_process = _new_process_seconds(target)
            cached = _first_call_seconds(_empty_kernel(), args, sync)
        finally:
            if previous is None:
                os.environ.pop("TASKDSL_CACHE_DIR")
            else:
                os.environ["TASKDSL_CACHE_DIR"] = previous
    kernel = _empty_kernel()
    per_launch = _per_launch_seconds(kernel, args, sync, launches)
    with_reads = _per_launch_seconds(reads4, args, sync, launches)
    floor = _cuda_core_launch_seconds(kernel, args, launches) if target == "cuda" else None
    arrays = "td.DeviceArray" if target == "cuda" else "numpy"
    print(f"target {target}: an empty kernel with 3 tensor arguments ({arrays})")
    print(f"  cold compile and first launch   {cold * 1e3:9.1f} ms")
    if isinstance(new_process, float):
        print(f"  new process, cache on disk      {new_process * 1e3:9.1f} ms  (numba's start in a process included)")
    else:
        print(f"  new process, cache on disk      not timed ({new_process})")
    print(f"  another Kernel, same process    {cached * 1e3:9.1f} ms  ({cold / cached:.0f}x faster)")
    print(f"  launch overhead                 {per_launch * 1e6:9.2f} us per launch (mean of {launches})")
    if floor is not None:
        print(f"    of which cuda.core's launch   {floor * 1e6:9.2f} us (the same launch issued directly)")
    print(f"  the same, reading 4 globals     {with_reads * 1e6:9.2f} us per launch (each call checks they are "
          "unchanged)")
    return {"target": target, "cold": cold, "new_process": new_process, "cached": cached, "launch": per_launch,
            "cuda_core_launch": floor, "launch_reading_globals": with_reads}


def _cuda_core_launch_seconds(kernel, args, launches: int) -> float:
    """Seconds per launch of the kernel's prepared launch issued straight to cuda.core (the floor under
    taskdsl's own launch path); None when the kernel has no prepared launch (on a simulated GPU)."""
    from ..backend.cuda.launch import synchronize
    prepared = next(iter(kernel._cuda_launches.values()), None)
    if prepared is None:
        return None
    values = prepared.arguments(args)
    start = time.perf_counter()
    for _ in range(launches):
        prepared.launch(prepared.stream, prepared.config, prepared.kernel, *values)
    synchronize()
    return (time.perf_counter() - start) / launches
