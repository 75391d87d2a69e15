"""Replaying a compiled graph's launches: a call without the executor's and the runners' Python.

A run of a compiled graph with static shapes launches the same kernels on the same buffers
every time; only the values differ. After its warm-up run, the executor records the
launches of one more run and, where that is safe, replays them on later calls:

- cuda: the launches captured as one CUDA graph (`CudaReplay`, `backend/cuda/graphs.py`);
- cpu: the launches (`backend.cpu.launch.recording`) issued again in order, each with its
  arguments and thread split as recorded (`CpuReplay`), each run of them between value checks by one
  native loop (`launch.NativeReplay`). What a call saves is the Python around each kernel: choosing its
  plan, binding its arguments, the arena's bookkeeping (about 40 us an operator on a 2-core Xeon, see
  docs/benchmarks.md), and calling its launcher (0.46 us a launch).

A cpu replay hands the launches the caller's input arrays in place of the buffers the recording
read them from (`_Bound`: kernels only read a graph's inputs; a copy was half the time of a
one-operator graph), or copies them in where a launch reads one through a non-contiguous view or
an output shares its memory (`_CopiedIn`); it gives each output a fresh array where the recorded
launches are its only writers (else copies the recorded one out), and calls the operators' value
checks (gather's index range) where the run called them. It is refused, with the reason in
`CompiledGraph.replay`, when the host computed part of the recorded run (a copy of a non-contiguous
operand, a zero fill, packing of weights that are not constants: `launch.note_host_work`), when a
run and two replays on other inputs (`probe_inputs`; where the graph rejects the probe's negative integers with
an IndexError, as RoiAlign's batch indices, its integers at 0) disagree in any bit (`disagreement`): the
check that catches host work nobody noted, and when those replays change their inputs. The
executor checks a CUDA graph the same way.

The recording marks where each operator's launches end (`StepEnds`), so a cpu replay can also time each
operator's share of a whole run (`CpuReplay.operator_seconds`, `CompiledGraph.summary(timing=True)`).
"""
from __future__ import annotations

import math
import time
from dataclasses import dataclass

import numpy as np
from numpy.lib.array_utils import byte_bounds

from ..backend.cpu.launch import NativeReplay, RecordedLaunch, recording_active
from ..runtime.arrays import host_empty
from .operator import Operator


@dataclass
class CudaReplay:
    """A CUDA graph of one whole run, with the buffers it reads its inputs from and writes its outputs to."""

    graph: object        # backend.cuda.graphs.CudaGraph
    inputs: list         # DeviceArrays, one per graph input
    outputs: list        # per graph output: the DeviceArray the graph writes, or a constant's value

    def run(self, arrays: list) -> list:
        """Copy `arrays` into the input buffers, queue the graph, and return the output buffers."""
        for buffer, a in zip(self.inputs, arrays):
            buffer.copy_from(a)
        self.graph.replay()
        return self.outputs


@dataclass
class RecordedCheck:
    """An operator's check of its input values, at its place among a recording's launches."""

    op: Operator
    args: list           # the operator's input arrays

    def __call__(self) -> None:
        self.op.check_values(self.args)

    def set_arg(self, index: int, value) -> None:
        """Check `value` as input `index` from now on (a replay binds a call's arrays so: `RecordedLaunch.set_arg`)."""
        self.args[index] = value


def record_check(op: Operator, arrays: list) -> None:
    """Add the check of `op`'s input values to this thread's cpu recording, if any and if `op` checks values."""
    record = recording_active()
    if record is not None and type(op).check_values is not Operator.check_values:
        record.launches.append(RecordedCheck(op, list(arrays)))


def disagreement(run, replay, probe: list) -> str | None:
    """Why a replay cannot stand in for `run` (the executor's operator-by-operator path), or None: the outputs
    of `run(probe)` and of two `replay(probe)`s (host arrays) must be equal bit for bit (NaN included), and the
    replays must leave their inputs as they were (a replay reads the caller's arrays)."""
    expected = [np.asarray(a) for a in run(probe)]
    kept = [np.array(a) for a in probe]
    for attempt in ("a replay", "a second replay"):
        got = replay(probe)
        if not all(np.array_equal(a, k, equal_nan=a.dtype.kind in "fc") for a, k in zip(probe, kept)):
            return f"{attempt} on probe inputs wrote into them"
        for k, (e, g) in enumerate(zip(expected, got)):
            if e.shape != g.shape or e.dtype != g.dtype or not np.array_equal(e, g, equal_nan=e.dtype.kind in "fc"):
                return f"{attempt} on probe inputs gave another output {k} than a run: the host computes part of a run"
    return None


def probe_inputs(tensors: list, seed: int = 0, negative: bool = True) -> list:
    """Inputs unlike the warm-up's zeros, for checking a replay against a run: normal floats, signed integers
    in {-1, 0} (0 where not `negative`) and unsigned in {0, 1} (indices valid for any axis that takes negative
    ones), random booleans."""
    rng = np.random.default_rng(seed)
    arrays = []
    for t in tensors:
        dtype = np.dtype(t.numpy_dtype)
        if dtype.kind == "f":
            a = rng.standard_normal(t.shape)
        elif dtype.kind in "iu":
            a = rng.integers(0, 2, t.shape) * (-int(negative) if dtype.kind == "i" else 1)
        else:
            a = rng.random(t.shape) < 0.5
        arrays.append(np.asarray(a, dtype))
    return arrays


@dataclass
class _Slot:
    """Where a recorded action reads or writes a graph input's or output's memory: its argument `index`, a
    contiguous array of this dtype and shape (f16 travels as uint16 bits, a flat launch's as bytes) starting
    `offset` bytes into that memory."""

    action: object
    index: int
    dtype: np.dtype
    shape: tuple
    offset: int = 0

    def __post_init__(self):
        self.nbytes = self.dtype.itemsize * math.prod(self.shape)
        self.as_bytes = self.dtype == np.uint8 and len(self.shape) == 1     # a flat launch's: the bytes as they are

    def bind(self, memory: np.ndarray | None) -> None:
        """Point the action at `memory` (None: at nothing, so the action keeps no caller's array alive)."""
        if memory is None:
            self.action.set_arg(self.index, None)
            return
        if not self.offset and memory.dtype == self.dtype and memory.shape == self.shape:     # the whole array
            self.action.set_arg(self.index, memory)
            return
        flat = memory.reshape(-1).view(np.uint8)
        if self.offset or flat.size != self.nbytes:
            flat = flat[self.offset:self.offset + self.nbytes]
        self.action.set_arg(self.index, flat if self.as_bytes else flat.view(self.dtype).reshape(self.shape))


@dataclass
class _Bound:
    """A graph input the recorded actions read through `slots`: the caller's array is bound in its place."""

    slots: list

    def feed(self, a: np.ndarray | None) -> None:
        for slot in self.slots:
            slot.bind(a)

    def release(self) -> None:
        self.feed(None)


@dataclass
class _CopiedIn:
    """A graph input copied into the buffer the recording read it from."""

    buffer: np.ndarray

    def feed(self, a: np.ndarray) -> None:
        np.copyto(self.buffer, a)

    def release(self) -> None:
        pass


class _Output:
    """How a replay gives one graph output: `prepare` before the launches, `result` after them (given the
    results of the outputs before it)."""

    def prepare(self) -> None:
        pass

    def result(self, earlier: list) -> np.ndarray:
        raise NotImplementedError

    def release(self) -> None:
        """Drop what the replay holds of the result it gave (the caller owns it now)."""


@dataclass
class _Rebound(_Output):
    """An output that the recorded launches alone write, through `slots`: a fresh array a call. (Only dtype
    and shape are kept: the recorded array is freed.)"""

    dtype: np.dtype
    shape: tuple
    slots: list

    def prepare(self) -> None:
        self.fresh = host_empty(self.shape, self.dtype)
        for slot in self.slots:
            slot.bind(self.fresh)

    def result(self, earlier: list) -> np.ndarray:
        return self.fresh

    def release(self) -> None:
        self.fresh = None
        for slot in self.slots:
            slot.bind(None)


@dataclass
class _Copied(_Output):
    """An output copied after the launches: recorded memory others share, or a constant's value."""

    value: object

    def result(self, earlier: list) -> np.ndarray:
        return np.array(self.value)


@dataclass
class _Again(_Output):
    """An output that is an earlier output's tensor again: a copy of that result."""

    index: int

    def result(self, earlier: list) -> np.ndarray:
        return np.array(earlier[self.index])


class CpuReplay:
    """A cpu run's recorded launches and value checks, issued again on new inputs."""

    def __init__(self, actions: list, inputs: list, graph, outputs: list, step_ends: list):
        self.actions = actions
        self.step_ends = step_ends         # per operator of the graph: the count of actions up to its last
        uses = _uses(actions)
        self._inputs = _input_plans(uses, inputs, outputs)
        self._outputs = _output_plans(uses, inputs, graph, outputs)
        self._issues = _native_runs(actions, self._inputs + self._outputs)

    def __len__(self) -> int:
        return sum(not isinstance(a, RecordedCheck) for a in self.actions)

    def run(self, arrays: list) -> list:
        """The graph's outputs for input `arrays` (checked, contiguous), as new numpy arrays."""
        self._prepare(arrays)
        for issue in self._issues:
            issue()
        return self._results()

    def operator_seconds(self, arrays: list) -> np.ndarray:
        """Each operator's share of a replay on `arrays`: the seconds its launches and checks took, in order
        among the others' (so with the caches the whole run leaves them), without the executor's Python. Each
        launch goes through its launcher here, to be timed apart: about 0.4 us more than in the native loop."""
        self._prepare(arrays)
        clock = time.perf_counter
        ends = np.empty(len(self.actions) + 1)
        ends[0] = clock()
        for k, action in enumerate(self.actions):
            action()
            ends[k + 1] = clock()
        self._results()
        marks = np.array([0] + list(self.step_ends))
        return ends[marks[1:]] - ends[marks[:-1]]

    def _prepare(self, arrays: list) -> None:
        for plan, a in zip(self._inputs, arrays):
            plan.feed(a)
        for plan in self._outputs:
            plan.prepare()

    def _results(self) -> list:
        """The outputs, after which the launches hold neither the caller's inputs nor the outputs (a replay kept
        a call's arrays alive until the next call)."""
        results = []
        for plan in self._outputs:
            results.append(plan.result(results))
        for plan in self._inputs + self._outputs:
            plan.release()
        return results


def _native_runs(actions: list, plans: list) -> list:
    """`actions` with each run of launches between value checks issued by one `NativeReplay` (where it applies),
    which packs again the launches that `plans` bind to a call's arrays."""
    rebound = {id(slot.action) for plan in plans for slot in getattr(plan, "slots", ())}
    issues, run = [], []
    for action in [*actions, None]:
        if isinstance(action, RecordedLaunch):
            run.append(action)
            continue
        if run:
            issues += [NativeReplay(run, rebound)] if NativeReplay.applies(run) else run
            run = []
        if action is not None:
            issues.append(action)
    return issues


class StepEnds:
    """The count of a recording's actions after each operator: given as a run's `progress` (`step` is called
    after each operator), it marks where each operator's launches end."""

    def __init__(self, recording):
        self.recording, self.ends = recording, []

    def step(self, note: str | None = None) -> None:
        """Mark the end of an operator's actions."""
        self.ends.append(len(self.recording.launches))


def _uses(actions: list) -> list:
    """(byte extent, array, `_Slot`) of every non-empty array among the recorded actions' arguments."""
    return [(_extent(v), v, _Slot(action, i, v.dtype, v.shape)) for action in actions
            for i, v in enumerate(action.args) if isinstance(v, np.ndarray) and v.nbytes]


def _input_plans(uses: list, inputs: list, outputs: list) -> list:
    """Per graph input buffer of the recording, how a replay feeds it (`_Bound`, `_CopiedIn`). An input is bound
    when every recorded argument in its memory is a contiguous view of it and no output shares its memory (an
    output that is the input, or a view of it, is copied from the buffer)."""
    out_extents = [_extent(a) for a in outputs if isinstance(a, np.ndarray) and a.nbytes]
    plans = []
    for buffer in inputs:
        e = _extent(buffer)
        touching = [(extent, v, slot) for extent, v, slot in uses if buffer.nbytes and _overlap(extent, e)]
        if not buffer.nbytes or any(_overlap(x, e) for x in out_extents) or \
                not all(v.flags.c_contiguous for _, v, _ in touching):
            plans.append(_CopiedIn(buffer))
            continue
        for extent, _, slot in touching:
            slot.offset = extent[0] - e[0]
        plans.append(_Bound([slot for _, _, slot in touching]))
    return plans


def _output_plans(uses: list, inputs: list, graph, outputs: list) -> list:
    """Per graph output, how a replay gives it (`_Rebound`, `_Copied`, `_Again`). An output is rebound when
    every recorded argument that overlaps its memory is exactly its memory, and it shares none with the
    input buffers, the constants or another output."""
    fixed = [_extent(a) for a in inputs if a.nbytes] + [_extent(t.value) for t in graph.constants if t.nbytes]
    extents = {id(t): _extent(a) for t, a in zip(graph.outputs, outputs)
               if not t.is_constant and isinstance(a, np.ndarray) and a.nbytes}
    plans, first = [], {}
    for k, (t, a) in enumerate(zip(graph.outputs, outputs)):
        if id(t) in first:
            plans.append(_Again(first[id(t)]))
            continue
        first[id(t)] = k
        e = extents.get(id(t))
        if e is None or not a.flags.c_contiguous:
            plans.append(_Copied(t.value if t.is_constant else a))
            continue
        touching = [(extent, v, slot) for extent, v, slot in uses if _overlap(extent, e)]
        shared = any(_overlap(x, e) for x in fixed) or any(
            _overlap(x, e) for tid, x in extents.items() if tid != id(t))
        exact = all(extent == e and v.flags.c_contiguous for extent, v, _ in touching)
        rebound = touching and exact and not shared
        plans.append(_Rebound(a.dtype, a.shape, [s for _, _, s in touching]) if rebound else _Copied(a))
    return plans


def _extent(a) -> tuple:
    """The byte range [start, end) an array's elements span."""
    return byte_bounds(np.asarray(a))


def _overlap(x: tuple, y: tuple) -> bool:
    return x[0] < y[1] and y[0] < x[1]
