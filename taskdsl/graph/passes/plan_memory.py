"""Memory planning: where each activation lives in one arena, reusing memory by liveness.

An activation (an operator's output) is live from the step that computes it to the last
step that reads it; graph outputs live to the end. A view (a reshape, a contiguous slice) shares its input's
storage, so it extends that storage's life instead of taking memory; so does, with `in_place`, an output
that its operator computes over an input read last there (`_overwritten`: a residual block's sum over its
shortcut). Storages are placed greedily, largest first, at the lowest offset that overlaps no storage live at
the same time (the greedy-by-size planner of TFLite). `peak_bytes` is the arena size: the peak
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
    in_place: set = field(default_factory=set)       # id(output) stored over an input (`overwritable_input`)
    peak_bytes: int = 0
    unshared_bytes: int = 0

    def summary(self) -> str:
        """One line: the peak activation memory, with and without reuse."""
        saved = 1 - self.peak_bytes / self.unshared_bytes if self.unshared_bytes else 0.0
        return (f"peak activation memory {format_bytes(self.peak_bytes)} (without reuse "
                f"{format_bytes(self.unshared_bytes)}, {saved:.0%} saved)")


def _aligned(n: int) -> int:
    return (n + ALIGNMENT - 1) // ALIGNMENT * ALIGNMENT


def _overwritten(op, step: int, plan: MemoryPlan, ends: dict, outputs: set):
    """The storage `op`'s first output takes over, or None: that of its `overwritable_input`, where the storage
    is an activation's (no graph input or constant) of the output's size (the input starts it: a view of all of it,
    or an output in place over it), nothing reads it after this step nor in it through another input, and the
    output is no graph output (`outputs`: their ids)."""
    k = op.overwritable_input()
    if k is None:
        return None
    root_of = lambda t: plan.storage.get(id(t), t)      # noqa: E731
    root, out = root_of(op.inputs[k]), op.outputs[0]
    if root.producer is None or root.nbytes != out.nbytes or ends.get(id(root)) != step or id(out) in outputs:
        return None
    if any(root_of(t) is root for j, t in enumerate(op.inputs) if j != k):
        return None
    return root


def plan_memory(graph: Graph, place_outputs: bool = True, in_place: bool = False) -> MemoryPlan:
    """The memory plan of the graph's activations over its node order; with `place_outputs=False` the
    storages of the graph's outputs get no offset (the executor's arena: outputs are allocated per call);
    with `in_place`, an operator's output takes the storage of its `overwritable_input` where it can
    (`_overwritten`)."""
    plan = MemoryPlan()
    step_of = {id(op): k for k, op in enumerate(graph.nodes)}
    for step, op in enumerate(graph.nodes):
        for t in op.inputs:
            plan.last_use[id(t)] = step
    for t in graph.outputs:
        plan.last_use[id(t)] = len(graph.nodes)
    outputs = {id(t) for t in graph.outputs}
    ends: dict = {}         # id(storage) -> the last step reading a tensor in it, of those stored so far
    for step, op in enumerate(graph.nodes):
        for t in op.outputs:
            plan.storage[id(t)] = plan.storage.get(id(op.inputs[0]), op.inputs[0]) if op.is_view else t
        overwritten = _overwritten(op, step, plan, ends, outputs) if in_place else None
        if overwritten is not None:
            plan.storage[id(op.outputs[0])] = overwritten
            plan.in_place.add(id(op.outputs[0]))
        for t in op.outputs:
            root = id(plan.storage[id(t)])
            ends[root] = max(ends.get(root, step), plan.last_use.get(id(t), step))
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
            if id(t) in plan.in_place:      # (without reuse, it would have a buffer of its own)
                plan.unshared_bytes += _aligned(t.nbytes)
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
