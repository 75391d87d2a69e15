"""GPU timing with CUDA events: warm-up, L2 flush, median of N (the interface of `time_cpu`)."""
from __future__ import annotations

import statistics

FLUSH_BYTES = 256 * 1024 * 1024     # written between runs: larger than any GPU's L2 (H100: 50 MiB)


def _flush_buffer(state):
    """The device's L2-flush buffer (allocated once): at least FLUSH_BYTES and twice the L2 size."""
    if state.flush_buffer is None:
        size = max(FLUSH_BYTES, 2 * int(state.l2_bytes or 0))
        state.flush_buffer = state.device.allocate(size, stream=state.stream)
    return state.flush_buffer


def time_cuda(fn, *, warmup: int = 3, repeat: int = 20, flush_l2: bool = True, min_seconds: float = 0.0) -> float:
    """Median GPU time of `fn()` in seconds, after `warmup` untimed calls.

    Each call is bracketed by CUDA events on taskdsl's launch stream, so the time is the
    GPU time of the work `fn` queues there (taskdsl kernels; also torch / cupy work on the
    legacy default stream, which that blocking stream is ordered with). With `flush_l2`,
    a buffer larger than the L2 cache is overwritten before each call, so every run starts
    cold. Repeats at least `repeat` times and until `min_seconds` of samples accumulate.
    """
    from cuda.bindings import driver
    from cuda.core import EventOptions

    from ..backend.cuda.launch import check, device_state

    state = device_state("time_cuda")
    stream = state.stream
    for _ in range(warmup):
        fn()
    stream.sync()
    timing = EventOptions(timing_enabled=True)
    flush = _flush_buffer(state) if flush_l2 else None
    samples: list = []
    while len(samples) < max(1, repeat) or sum(samples) < min_seconds:
        if flush is not None:
            check(driver.cuMemsetD8Async(int(flush.handle), len(samples) & 0xFF, flush.size, stream.handle))
        start = stream.record(options=timing)
        fn()
        end = stream.record(options=timing)
        end.sync()
        samples.append((end - start) / 1e3)     # Event subtraction gives milliseconds
    return statistics.median(samples)


__all__ = ["time_cuda", "FLUSH_BYTES"]
