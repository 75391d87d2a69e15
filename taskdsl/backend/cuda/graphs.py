"""CUDA graphs: recorded launches issued again as one graph launch.

A graph replays its kernels with the arguments they were recorded with: the same device
pointers and scalars. Whoever records (the graph executor) keeps the memory behind those
pointers alive and writes new inputs into the same buffers before each replay. A replay
costs one launch call instead of one per kernel: the Python and driver overhead of a
model's hundreds of small kernels goes away.
"""
from __future__ import annotations

from .launch import LaunchRecord, device_state


class CudaGraph:
    """Launches (`launch.recording()`'s records) captured into an executable CUDA graph."""

    def __init__(self, launches: list):
        from cuda.core import launch
        if not launches:
            raise ValueError("a CUDA graph needs at least one recorded launch")
        if any(r.host_writes for r in launches):
            raise ValueError("a launch copied its numpy outputs back to the host: a graph replay cannot do that; "
                             "give the kernels td.DeviceArrays")
        state = device_state("a CUDA graph")
        builder = state.device.create_graph_builder()
        builder.begin_building()
        for r in launches:
            launch(builder, r.config, r.kernel, *r.args)
        builder.end_building()
        self._graph = builder.complete()
        self._launches: list[LaunchRecord] = launches     # their arrays and staging buffers stay alive
        self._stream = state.stream

    def __len__(self) -> int:
        return len(self._launches)

    def replay(self) -> None:
        """Queue the whole graph on taskdsl's stream (ordered after earlier copies and launches there)."""
        self._graph.launch(self._stream)


__all__ = ["CudaGraph"]
