"""Memory planning: where each activation lives in one arena, reusing memory by liveness.

An activation (an operator's output) is live from the step that computes it to the last
step that reads it; graph outputs live to the end. A view (a reshape, a contiguous slice) shares its input's
storage, so it extends that storage's life instead of taking memory. Storages are placed
greedily, largest first, at the lowest offset that overlaps no storage live at the same
time (the greedy-by-size planner of TFLite). `peak_bytes` is the arena size: the peak
activation memory with reuse; `unshared_bytes` is what one buffer per activation needs.
"""
from __future__ import annotations

from dataclasses import dataclass, field

from ..graph import Graph
from ..printer import format_bytes

ALIGNMENT = 64


@dataclass
class MemoryPlan:
    """Offsets of activation storages in one arena, their live ranges, and the peak."""

    offsets: dict = field(default_factory=dict)      # id(storage tensor) -> byte offset
    live: dict = field(default_factory=dict)         # id(storage tensor) -> (first step, last step)
    storage: dict = field(default_factory=dict)      # id(tensor) -> its storage tensor (itself, or a view's root)
    last_use: dict = field(default_factory=dict)     # id(tensor) -> last step reading it (outputs: len(nodes))
    peak_bytes: int = 0
    unshared_bytes: int = 0

    def summary(self) -> str:
        """One line: the peak activation memory, with and without reuse."""
        saved = 1 - self.peak_bytes / self.unshared_bytes if self.unshared_bytes else 0.0
        return (f"peak activation memory {format_bytes(self.peak_bytes)} (without reuse "
                f"{format_bytes(self.unshared_bytes)}, {saved:.0%} saved)")


def _aligned(n: int) -> int:
    return (n + ALIGNMENT - 1) // ALIGNMENT * ALIGNMENT


def plan_memory(graph: Graph, place_outputs: bool = True) -> MemoryPlan:
    """The memory plan of the graph's activations over its node order; with `place_outputs=False` the
    storages of the graph's outputs get no offset (the executor's arena: outputs are allocated per call)."""
    plan = MemoryPlan()
    step_of = {id(op): k for k, op in enumerate(graph.nodes)}
    for step, op in enumerate(graph.nodes):
        for t in op.inputs:
            plan.last_use[id(t)] = step
        for t in op.outputs:
            plan.storage[id(t)] = plan.storage.get(id(op.inputs[0]), op.inputs[0]) if op.is_view else t
    for t in graph.outputs:
        plan.last_use[id(t)] = len(graph.nodes)
    roots = {}
    outside = set() if place_outputs else {id(plan.storage.get(id(t), t)) for t in graph.outputs}
    for step, op in enumerate(graph.nodes):
        for t in op.outputs:
            root = plan.storage[id(t)]
            if root.producer is None:         # a view of a graph input or a constant: no activation memory
                continue
            if id(root) in outside:
                continue
            first = step_of[id(root.producer)]
            last = max(plan.last_use.get(id(t), step), plan.live.get(id(root), (first, first))[1])
            plan.live[id(root)], roots[id(root)] = (first, last), root
    placed: list = []                         # (offset, size, first step, last step)
    for rid in sorted(roots, key=lambda r: (-_aligned(roots[r].nbytes), plan.live[r][0])):
        size, (first, last) = _aligned(roots[rid].nbytes), plan.live[rid]
        offset = 0
        for o, s, _, _ in sorted(p for p in placed if p[2] <= last and first <= p[3]):
            if offset + size <= o:
                break                         # fits in the gap below this storage
            offset = max(offset, o + s)
        placed.append((offset, size, first, last))
        plan.offsets[rid] = offset
        plan.peak_bytes = max(plan.peak_bytes, offset + size)
        plan.unshared_bytes += size
    return plan
