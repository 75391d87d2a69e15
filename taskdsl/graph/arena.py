"""The memory plan made real: one arena per compiled graph, each operator's outputs at their planned offsets.

The executor runs every operator inside `runtime.arrays.results_in(arena.slots(step))`, so the
results the operator library allocates land in the arena (host memory on the cpu target, GPU
memory on cuda), and activations whose lifetimes do not overlap share memory
(`passes.plan_memory`; on the cpu a fused residual sum's output takes its shortcut's memory, where its kernel
computes it in place). The graph's outputs are not placed there (the plan is made without
them): the caller keeps them after the call, while the next call reuses the arena.

Runners are free to allocate as they like, so after each operator `check` confirms that every
result that took a slot is the output the slot was planned for, and that no other output lies
in the arena (an output aliasing an input's memory where the plan did not put it, say). If one does not, the executor
turns the arena off for the graph and runs the call again without it.
"""
from __future__ import annotations

import numpy as np

from ..runtime.arrays import address
from ..runtime.device_array import DeviceArray, carve
from ..runtime.device_array import empty as device_empty
from ..runtime.host import empty_aligned
from .graph import Graph
from .passes import MemoryPlan, plan_memory
from .printer import format_bytes


class Misplaced(Exception):
    """An operator's results are not where the memory plan put them (the reason is the message)."""


def plans_in_place(gpu: bool) -> bool:
    """Whether the memory plan puts a fused residual sum over its shortcut: on the cpu only (the GPU's kernels have
    not been run in place)."""
    return not gpu


class Arena:
    """One block of memory holding the planned activations of a graph, on the host or on the GPU."""

    def __init__(self, graph: Graph, gpu: bool):
        # outputs outlive the call: not in the arena
        plan = plan_memory(graph, place_outputs=False, in_place=plans_in_place(gpu))
        placed = [[t if self._placed(t, plan) else None for t in op.outputs] for op in graph.nodes]
        offset = lambda t: plan.offsets[id(plan.storage[id(t)])]     # noqa: E731 (an output in place: its input's)
        self.nbytes = max((offset(t) + t.nbytes for ts in placed for t in ts if t is not None), default=0)
        self.gpu = gpu
        self.memory = device_empty((self.nbytes,), np.uint8) if gpu else empty_aligned((self.nbytes,), np.uint8)
        self._slots = [[None if t is None else self._slot(offset(t), t) for t in ts] for ts in placed]
        self._claimable = [[slot for slot in slots if slot is not None] for slots in self._slots]

    @staticmethod
    def _placed(t, plan: MemoryPlan) -> bool:
        root = plan.storage.get(id(t))
        return (root is t or id(t) in plan.in_place) and id(root) in plan.offsets and t.size > 0

    def _slot(self, offset: int, t):
        """A 1-d array of `t`'s dtype and element count at `offset` in the arena."""
        if self.gpu:
            return carve(self.memory, offset, (t.size,), t.numpy_dtype)
        return self.memory[offset:offset + t.nbytes].view(t.numpy_dtype)

    def slots(self, step: int) -> list:
        """The slots of operator `step`'s outputs that the plan placed in the arena (results_in copies it)."""
        return self._claimable[step]

    def _inside(self, array) -> bool:
        start = address(self.memory)
        return (isinstance(array, DeviceArray) == self.gpu and array.size > 0
                and start <= address(array) < start + self.nbytes)

    def check(self, step: int, op, outputs: list, claimed: list) -> None:
        """Raise Misplaced unless each output is in its own slot or outside the arena (a view may be
        anywhere: the plan gave it its input's storage), and every claimed slot holds its output."""
        used = set()
        for k, (slot, out) in enumerate(zip(self._slots[step], outputs)):
            if slot is not None and isinstance(out, type(slot)) and address(out) == address(slot):
                used.add(id(slot))
            elif not op.is_view and self._inside(out):
                raise Misplaced(f"output {k} of {op.kind} (step {step}) is in arena memory the plan did not give it")
        if any(id(slot) not in used for slot in claimed):
            raise Misplaced(f"{op.kind} (step {step}) allocated something other than its output in the "
                            "output's slot")

    def summary(self) -> str:
        """Where the arena is and how large."""
        return f"on ({format_bytes(self.nbytes)} of {'GPU' if self.gpu else 'host'} memory)"
