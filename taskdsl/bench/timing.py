"""Timing helpers shared by the benchmarks: warm-up, then the median of repeated runs."""
from __future__ import annotations

import statistics
import time


SETTLE_SECONDS = 0.3
# what the tables' "ratio" columns are (issue targets such as ">= 0.25x numpy" read them so)
RATIO_LEGEND = "ratio: peer time / taskdsl time (above 1: taskdsl is faster)"


def settle() -> None:
    """Wait until the worker threads of what ran before (numpy's OpenBLAS, onnxruntime) stop spinning.

    Idle BLAS and onnxruntime threads spin for up to ~0.1 s after their last call before they
    sleep. On a 2-core machine they take whole time slices from the next timed code: after a numpy
    matmul, a cpu kernel's 1.1 ms calls took 5-8 ms for about 0.1 s (docs/benchmarks.md, session 22).
    """
    time.sleep(SETTLE_SECONDS)


def time_cpu(fn, *, warmup: int = 1, repeat: int = 5, min_seconds: float = 0.0) -> float:
    """Median wall time of `fn()` in seconds, after `settle()` and `warmup` untimed calls.

    Repeats at least `repeat` times and until `min_seconds` of measurements have accumulated.
    """
    settle()
    for _ in range(warmup):
        fn()
    samples: list = []
    while len(samples) < repeat or sum(samples) < min_seconds:
        start = time.perf_counter()
        fn()
        samples.append(time.perf_counter() - start)
    return statistics.median(samples)
