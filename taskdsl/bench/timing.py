"""Timing helpers shared by the benchmarks: warm-up, then the median of repeated runs."""
from __future__ import annotations

import statistics
import time


def time_cpu(fn, *, warmup: int = 1, repeat: int = 5, min_seconds: float = 0.0) -> float:
    """Median wall time of `fn()` in seconds, after `warmup` untimed calls.

    Repeats at least `repeat` times and until `min_seconds` of measurements have accumulated.
    """
    for _ in range(warmup):
        fn()
    samples: list = []
    while len(samples) < repeat or sum(samples) < min_seconds:
        start = time.perf_counter()
        fn()
        samples.append(time.perf_counter() - start)
    return statistics.median(samples)
