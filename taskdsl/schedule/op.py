"""`td.op(inputs, outputs)`: a callable operator scheduled from compute definitions.

Outputs and reductions are materialized; every other injective definition is inlined into
the kernels that read it (recomputed there, never stored). Each kernel's strategy is picked
from the sizes (and target) of a call, so an op keeps one plan per combination of strategies.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .. import ir
from ..compute import _OWNER, Tensor, bind_sizes, check_fixed_reads, evaluate, numpy_dtype, topological
from ..backend.cpu.launch import num_threads
from ..runtime.config import fast_compile_enabled, get_target
from ..runtime.arrays import as_array, conversion, empty_like_operands, unplanned
from ..runtime.device_array import DeviceArray
from ..runtime.kernel import Kernel, remember
from .rules import (BLOCK, CPU_THREAD_BLOCK, choose_strategy, evaluate_int, injective_strategy, numel, reads_rows,
                    schedule_injective, schedule_reduce, size_names, split_chunks, split_stages)

PREPARED_CALLS = 64     # remembered call signatures per op (forgotten all at once past this)


def _call_key(arrays: tuple):
    """What an op's checks and plan depend on when every argument is a numpy array or a td.DeviceArray:
    kinds, dtypes and shapes."""
    key = []
    for a in arrays:
        if not isinstance(a, (np.ndarray, DeviceArray)):
            return None
        key.append((type(a), a.dtype, a.shape))
    return tuple(key)


@dataclass
class Step:
    """One kernel launch: the kernel, the buffers among its parameters, and all its parameters."""

    kernel: Kernel
    buffers: tuple      # the ir.Buffer parameters
    params: tuple       # every parameter: ir.Buffer, or ir.Var (a size passed as a scalar)

    def arguments(self, arrays: dict, sizes: dict) -> list:
        return [arrays[p.uid] if isinstance(p, ir.Buffer) else sizes[p.name] for p in self.params]


class Op:
    """An operator: call it on arrays for its outputs; `.reference` is the numpy oracle."""

    def __init__(self, inputs: list, outputs: list, name: str | None = None):
        ir.allow_deep_trees()       # definitions are scheduled and evaluated by recursive walks of their expressions
        for what, tensors in (("inputs", inputs), ("outputs", outputs)):
            if not isinstance(tensors, (list, tuple)):
                raise TypeError(f"op {what} must be a list of tensors, got {tensors!r}; write td.op([A, B], [Y])")
        inputs, outputs = list(inputs), list(outputs)
        for t in inputs:
            if not isinstance(t, Tensor) or t.kind != "placeholder":
                raise TypeError(f"op inputs must be td.placeholder tensors, got {t!r}")
            if inputs.count(t) > 1:
                raise ValueError(f"op inputs list placeholder '{t.name}' twice; each input is one array")
        for t in outputs:
            if not isinstance(t, Tensor):
                raise TypeError(f"op outputs must be tensors, got {t!r}")
        self.inputs, self.outputs = inputs, outputs
        self.name = name or "_".join(t.name for t in outputs)
        self.order = topological(outputs)
        missing = [t.name for t in self.order if t.kind == "placeholder" and t not in inputs]
        if missing:
            raise ValueError(f"op {self.name!r}: the outputs read {', '.join(missing)}, which are not inputs")
        bound = set(size_names(*(d for t in inputs for d in t.shape)))
        for t in self.order:
            free = set(size_names(*t.shape, *t.reduce_shape)) - bound
            if free:
                raise ValueError(f"op {self.name!r}: size '{sorted(free)[0]}' of {t.name!r} is not determined by the "
                                 "shape of any input; give the op an input of that shape (a zero-stride array "
                                 "will do) or use a size an input has")
        out_ids = {id(t) for t in outputs}
        self.materialized = [t for t in self.order if t.kind == "reduce" or (t.kind == "compute" and id(t) in out_ids)]
        materialized_ids = {id(t) for t in self.materialized}
        self.inlined = {id(t) for t in self.order if t.kind == "compute" and id(t) not in materialized_ids}
        self._plans: dict = {}
        self._splits: dict = {}
        self._last: list | None = None
        self._prepared: dict = {}   # (_call_key(arrays), target, threads, fast) -> (steps, sizes, allocations)

    # ------------------------------------------------------------------ planning
    def _plan(self, sizes: dict, target: str | None = None) -> list:
        target, workers = target or get_target(), num_threads()

        def counts(t: Tensor) -> tuple:
            """(outputs, reduced elements per output) of reduction `t` at these sizes."""
            return evaluate_int(numel(t.shape), sizes), evaluate_int(numel(t.reduce_shape), sizes)

        def last(t: Tensor) -> int:
            """The outputs along `t`'s last axis."""
            return evaluate_int(t.shape[-1], sizes) if t.shape else 1

        steps = []
        for t in self.materialized:
            if t.kind == "compute":
                steps.append((t, injective_strategy(t, sizes, target)))
                continue
            outputs, reduced = counts(t)
            strategy = choose_strategy(t, outputs, reduced, target, workers, last=last(t))
            if strategy == "split":     # (on the cpu, a reduction by rows of outputs keeps its rows: chunks lead)
                leading = target == "cpu" and reads_rows(t, last(t), reduced)
                steps += [(s, choose_strategy(s, *counts(s), target, workers, may_split=False, last=last(s)))
                          for s in self._split(t, split_chunks(outputs, reduced, target), leading)]
            else:
                steps.append((t, strategy))
        compact = target == "cpu" and fast_compile_enabled()
        key = (target, compact, tuple((id(stage), strategy) for stage, strategy in steps))
        if key not in self._plans:
            self._plans[key] = [self._step(stage, strategy, target, compact) for stage, strategy in steps]
        return self._plans[key]

    def _split(self, t: Tensor, chunks: int, leading: bool) -> tuple:
        if (id(t), chunks, leading) not in self._splits:
            self._splits[id(t), chunks, leading] = split_stages(t, chunks, leading)
        return self._splits[id(t), chunks, leading]

    def _step(self, t: Tensor, strategy: str, target: str, compact: bool) -> Step:
        threads = CPU_THREAD_BLOCK if target == "cpu" else BLOCK
        kernel = schedule_injective(t, self.inlined, strategy) if t.kind == "compute" else \
            schedule_reduce(t, self.inlined, strategy, threads, compact)
        # the definitions' buffers, whose shapes the op's sizes give (a kernel may see a dim as a size of its own)
        params = tuple(_OWNER[p.uid].buffer if isinstance(p, ir.Buffer) else p
                       for p in kernel._frontend_ir(kernel.block_spec).params)
        return Step(kernel, tuple(p for p in params if isinstance(p, ir.Buffer)), params)

    # ------------------------------------------------------------------ running
    def _checked(self, arrays: tuple) -> list:
        """The input arrays, one per input, each of its input's dtype (TypeError otherwise)."""
        if len(arrays) != len(self.inputs):
            raise TypeError(f"op {self.name!r} takes {len(self.inputs)} arrays "
                            f"({', '.join(t.name for t in self.inputs)}), got {len(arrays)}")
        converted = []
        for t, given in zip(self.inputs, arrays):
            a = as_array(given)
            if a.dtype != numpy_dtype(t.dtype):
                wanted = numpy_dtype(t.dtype)
                raise TypeError(f"op {self.name!r}: input '{t.name}' must have dtype {wanted} ({t.dtype.name}), "
                                f"got {a.dtype}; convert it with {conversion(given, wanted)}")
            converted.append(a)
        return converted

    def _arrays(self, arrays: tuple) -> tuple[dict, dict]:
        converted = self._checked(arrays)
        sizes = bind_sizes(self.inputs, converted)
        check_fixed_reads(self.order, sizes)
        return {t.buffer.uid: a for t, a in zip(self.inputs, converted)}, sizes

    def __call__(self, *arrays) -> list:
        """The outputs for these input arrays (newly allocated), computed by the op's kernels."""
        key = _call_key(arrays)
        if key is not None:
            key = (key, get_target(), num_threads(), fast_compile_enabled())
        prepared = self._prepared.get(key)
        if prepared is None:
            buffers, sizes = self._arrays(arrays)
            steps = self._plan(sizes)
            allocations = {}       # the buffers a call allocates: intermediates and outputs
            for step in steps:
                for b in step.buffers:
                    if b.uid not in buffers and b.uid not in allocations:
                        allocations[b.uid] = (tuple(evaluate_int(d, sizes) for d in b.shape), numpy_dtype(b.dtype))
            prepared = (steps, sizes, tuple((uid, *alloc) for uid, alloc in allocations.items()))
            if key is not None:
                remember(self._prepared, key, prepared, PREPARED_CALLS)
        else:                      # the same dtypes and shapes as a checked call
            buffers = {t.buffer.uid: a for t, a in zip(self.inputs, arrays)}
        steps, sizes, allocations = prepared
        outputs = {t.buffer.uid for t in self.outputs}
        for uid, shape, dtype in allocations:       # the outputs first: a slot the caller planned is theirs
            if uid in outputs:
                buffers[uid] = empty_like_operands(shape, dtype, *arrays)
        with unplanned():       # (an intermediate of the output's shape took its slot: graph.arena's Misplaced)
            for uid, shape, dtype in allocations:
                if uid not in outputs:
                    buffers[uid] = empty_like_operands(shape, dtype, *arrays)
        for step in steps:
            step.kernel(*step.arguments(buffers, sizes))
        self._last = steps
        taken = {t.buffer.uid for t in self.inputs}     # an output that is an input, or listed again, is a copy
        results = []
        for t in self.outputs:
            array = buffers[t.buffer.uid]
            results.append(array.copy() if t.buffer.uid in taken else array)
            taken.add(t.buffer.uid)
        return results

    def reference(self, *arrays) -> list:
        """The outputs computed by the numpy evaluation of the definitions (the test oracle)."""
        return evaluate(self.inputs, self.outputs, [np.asarray(a) for a in self._checked(arrays)])

    @property
    def kernels(self) -> list:
        """The kernels of the latest call (a reduction's kernel depends on the call's sizes)."""
        if self._last is None:
            raise RuntimeError(f"op {self.name!r} has not been called yet: its kernels depend on the sizes of a "
                               "call; use op.kernels_for(*arrays)")
        return [s.kernel for s in self._last]

    def kernels_for(self, *arrays) -> list:
        """The kernels a call on these arrays launches, in order."""
        return [s.kernel for s in self._plan(self._arrays(arrays)[1])]

    def source(self, *arrays, target: str = "cuda") -> str:
        """The generated source of every kernel a call on these arrays launches on `target` (planned for it: a
        GPU's kernels are not the cpu's)."""
        buffers, sizes = self._arrays(arrays)
        texts = []
        for step in self._plan(sizes, target):
            for b in step.buffers:
                if b.uid not in buffers:
                    buffers[b.uid] = np.empty(tuple(evaluate_int(d, sizes) for d in b.shape), numpy_dtype(b.dtype))
            texts.append(step.kernel.source(*step.arguments(buffers, sizes), target=target))
        return "\n".join(texts)


def op(inputs: list, outputs: list, name: str | None = None) -> Op:
    """An operator computing `outputs` (compute definitions) from `inputs` (placeholders)."""
    return Op(inputs, outputs, name)
