"""`python -m taskdsl.bench cpu-matmul`: the DESIGN matmul on the cpu target against numpy."""
from __future__ import annotations

import os
import subprocess
import sys
import tempfile
import time

import numpy as np

from .accuracy import rel_err, shown
from .timing import time_cpu

_LOAD_FROM_DISK = """
import time, numpy as np
t0 = time.perf_counter()
from stdlib_ops.design_matmul import matmul_kernel
a = np.ones((8, 8), np.float32); c = np.empty((8, 8), np.float32)
t1 = time.perf_counter()
matmul_kernel(a, a, c)
print(time.perf_counter() - t1)
"""


def _compile_times() -> tuple[float, float, float]:
    """(cold first call, first call in a new process with a warm disk cache, steady call) at 8x8."""
    from stdlib_ops.design_matmul import matmul_kernel

    a = np.ones((8, 8), np.float32)
    c = np.empty((8, 8), np.float32)
    with tempfile.TemporaryDirectory() as cache:
        os.environ["TASKDSL_CACHE_DIR"] = cache
        matmul_kernel._cpu.clear()
        start = time.perf_counter()
        matmul_kernel(a, a, c)
        cold = time.perf_counter() - start
        env = dict(os.environ, TASKDSL_TARGET="cpu")
        out = subprocess.run([sys.executable, "-c", _LOAD_FROM_DISK], env=env, capture_output=True, text=True,
                             check=True)
        disk = float(out.stdout.strip().splitlines()[-1])
    steady = time_cpu(lambda: matmul_kernel(a, a, c), repeat=20)
    return cold, disk, steady


def run(sizes=(512, 1024)) -> list[dict]:
    """Benchmark rows: GFLOP/s of the DESIGN matmul (cpu target) and numpy at each size."""
    import taskdsl as td
    from stdlib_ops.design_matmul import matmul_kernel

    td.set_target("cpu")
    saved_cache = os.environ.get("TASKDSL_CACHE_DIR")
    cold, disk, steady = _compile_times()
    if saved_cache is None:
        os.environ.pop("TASKDSL_CACHE_DIR", None)
    else:
        os.environ["TASKDSL_CACHE_DIR"] = saved_cache
    print(f"compile: first call {cold:.2f} s (cold cache), first call in a new process {disk * 1e3:.1f} ms "
          f"(disk cache), cached call {steady * 1e6:.0f} us (8x8x8)")
    rng = np.random.default_rng(0)
    rows = []
    print(f"{'size':>6} {'taskdsl GFLOP/s':>16} {'numpy GFLOP/s':>14} {'ratio':>7} {'max rel err':>12}")
    for n in sizes:
        a = rng.standard_normal((n, n), dtype=np.float32)
        b = rng.standard_normal((n, n), dtype=np.float32)
        c = np.empty((n, n), np.float32)
        t_td = time_cpu(lambda: matmul_kernel(a, b, c), repeat=3)
        t_np = time_cpu(lambda: a @ b, repeat=5)
        flops = 2.0 * n ** 3
        err = rel_err(c, a @ b)
        row = {"size": n, "taskdsl_gflops": flops / t_td / 1e9, "numpy_gflops": flops / t_np / 1e9,
               "ratio": t_np / t_td, "rel_err": err}
        rows.append(row)
        print(f"{n:>6} {row['taskdsl_gflops']:>16.2f} {row['numpy_gflops']:>14.2f} {row['ratio']:>7.3f} "
              f"{shown(err, 'f32', f'matmul {n}')}")
    return rows
