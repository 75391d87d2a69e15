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


def captured(fn):
    """The taskdsl launches `fn` makes, captured once into a CUDA graph (after a call that compiles and loads
    them outside the capture): the graph's replay, a function of no arguments."""
    from ..backend.cuda.graphs import CudaGraph
    from ..backend.cuda.launch import recording
    fn()
    with recording() as record:
        fn()
    return CudaGraph(record.launches).replay


def time_cuda_replayed(fn, **options) -> float:
    """Median GPU time of the taskdsl launches `fn` makes, captured once into a CUDA graph and timed as its
    replays (`time_cuda`'s options): the kernels' time without the host's launch cost, which for a
    microsecond kernel called with torch tensors is most of a call."""
    return time_cuda(captured(fn), **options)


def time_torch_replayed(fn, **options) -> float:
    """`time_cuda_replayed` for torch work (a cuBLAS or cuDNN peer): `fn` captured into a torch CUDA graph,
    timed as its replays."""
    import torch
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):   # warm-up off the capture: library handles, workspaces, algorithm choice
        fn()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        fn()
    return time_cuda(graph.replay, **options)


__all__ = ["time_cuda", "captured", "time_cuda_replayed", "time_torch_replayed", "FLUSH_BYTES"]
