"""CompiledGraph: a graph after the pass pipeline, with its memory plan, run operator by operator.

    cg = g.compile()                   # passes, memory plan, and every kernel compiled (a warm-up run;
                                       # on the cpu target its kernels first compile in parallel processes)
    g.compile(channels_last=False)     # the same, without the NHWC layout pass (on by default)
    y, = cg(x)                         # or cg({"x": x}); a list of numpy arrays
    cg.kernels                         # the kernels the last call launched, in order
    print(cg.summary(timing=True))     # one line per operator, with its time (`operator_times`)

On the cuda target the activations stay on the GPU: inputs are copied there once per call
(numpy) or read in place (td.DeviceArray), constants are copied once, and every operator's
result is a DeviceArray. After the warm-up run, the launches of one more run are recorded
and captured as a CUDA graph (`cuda_graph=True`, the default): a call then copies its
inputs into the graph's input buffers, replays the graph, and copies the outputs back.
`cuda_graph=False` runs operator by operator instead.

On the cpu target, the launches of one more run are recorded too, and a call issues them
again in order without the Python between them (graph/replay.py says when that is safe, and
how it is checked). `cg.replay` says whether replay is on, and if not, why; `replay=False`
(either target) runs operator by operator, as does a call in debug mode.

On both targets the activations live in one arena laid out by the memory plan
(`graph/arena.py`): activations whose lifetimes do not overlap share memory, and a call
allocates only its outputs. `arena=False` allocates every activation instead. A compiled
graph runs one call at a time (calls from several threads wait for each other).
"""
from __future__ import annotations

import threading
import time

import numpy as np

from ..backend.cpu import precompile
from ..backend.cpu.launch import recording as cpu_recording
from ..runtime.arrays import results_in
from ..runtime.config import debug_enabled, get_target, target_scope
from ..runtime.device_array import DeviceArray, to_device
from ..runtime.progress import Progress
from ..runtime.sharing import share_code
from . import runners
from .arena import Arena, Misplaced, plans_in_place
from .graph import Graph, bind_inputs
from .passes import LAYOUT_PASS, optimize, pipeline, plan_memory
from .passes.channels_last import runs_channels_last
from .printer import Namer, format_bytes
from .replay import CpuReplay, CudaReplay, StepEnds, disagreement, probe_inputs

PROGRESS_MIN_NODES = 20      # smaller graphs compile quickly: no progress bar
# 2-D convolutions run channels-last unless told otherwise, on every target. On cuda the tensor-core template fills
# its shared A tile from an NHWC input with 16-byte cp.async copies of 8 channels (`im2col`'s gather runs), and
# from an NCHW one element by element, each with its own index arithmetic and padding test (sm_90 SASS of
# ResNet-50's 3x3 layer: 12 LDGSTS against 66 LDG + 64 STS and 260 branches). On the cpu the NHWC GEMM stores
# its output tiles row by row where NCHW's are the output transposed, and reads its im2col in place: ResNet-50
# 96.1 -> 81.0 ms on one thread, MobileNet-V2 11.3 -> 10.2, Inception-V3 133.3 -> 114.0 (docs/benchmarks.md,
# session 58). The layout pass leaves lone convolutions alone (`passes.channels_last`).
CHANNELS_LAST = True


class CompiledGraph:
    """Call it on input arrays (positional, or one dict keyed by input name) for a list of output arrays."""

    def __init__(self, graph: Graph, target: str | None = None, passes: list | None = None,
                 channels_last: bool | None = None, cuda_graph: bool = True, arena: bool = True,
                 replay: bool = True):
        start = time.perf_counter()
        if passes is not None and channels_last is not None:
            raise ValueError("give either passes or channels_last, not both "
                             "(passes=taskdsl.graph.passes.pipeline(channels_last=True) is the default pipeline "
                             "with the layout pass)")
        self.source = graph
        self.target = target or get_target()
        if passes is not None and (isinstance(passes, (str, bytes)) or not all(callable(p) for p in passes)):
            raise TypeError(f"passes must be a list of graph passes (functions from a Graph to a Graph, as in "
                            f"taskdsl.graph.passes.PIPELINE), got {passes!r}")
        if passes is None:
            passes = pipeline(CHANNELS_LAST if channels_last is None else bool(channels_last))
        self._layout_pass = LAYOUT_PASS in passes
        with target_scope(self.target):       # partitioning asks what the target's kernels can fuse
            self.graph = optimize(graph, passes)
        self.channels_last = runs_channels_last(self.graph)      # whether 2-D convolutions run NHWC
        self.memory = plan_memory(self.graph, in_place=plans_in_place(gpu=self.target == "cuda"))   # as the arena's
        nodes = self.graph.nodes
        outputs = {id(t) for t in self.graph.outputs}
        self._free = [[] for _ in nodes]           # tensors whose last reader is step k
        for tid, step in self.memory.last_use.items():
            if step < len(nodes) and tid not in outputs:
                self._free[step].append(tid)
        self._last_inputs = [np.zeros(t.shape, t.numpy_dtype) for t in self.graph.inputs]
        self._records: list = []                   # (kernels, seconds) per step of the last call
        self._constants: dict = {}                 # id(constant) -> its value on the GPU (cuda target)
        self._replay: CudaReplay | CpuReplay | None = None
        self.cuda_graph = "off (cpu target)" if self.target == "cpu" else "off (cuda_graph=False)"
        self.replay = "off (replay=False)"
        self.shared_kernels = 0     # kernels running code shared with others of other shapes (cpu, `share_code`)
        self._lock = threading.RLock()
        show = None if len(nodes) >= PROGRESS_MIN_NODES else False
        with target_scope(self.target):
            self._arena = Arena(self.graph, gpu=self.target == "cuda") if arena else None
            self.arena = self._arena.summary() if arena else "off (arena=False)"
            if self.target == "cpu":
                self._compile_cpu_kernels_ahead(show)
            with Progress(len(nodes), f"compiling {graph.name}", show=show) as bar:
                self._execute(self._last_inputs, bar)      # compile every kernel now: a run on zeros
            if self.target == "cuda":
                if cuda_graph and replay:
                    self._capture()
                elif cuda_graph:
                    self.cuda_graph = "off (replay=False)"
                self.replay = self.cuda_graph
            elif replay:
                self._record_cpu()
        self.compile_seconds = time.perf_counter() - start

    def _compile_cpu_kernels_ahead(self, show) -> None:
        """Collect the kernels of a run and let those that differ only in constants share code (`share_code`);
        then record the warm-up run's cpu launches, worker processes compiling their kernels meanwhile. The bar of
        the compiles shows on a terminal whatever the graph's size: numba takes seconds a kernel."""
        with precompile.collecting() as launched:     # fusion builds the kernels; none is generated yet
            self._run_unwritten()
        self.shared_kernels = share_code(launched)
        label = f"generating the kernels of {self.graph.name}"
        with precompile.AheadCompiler() as ahead:
            with ahead.recording(), Progress(len(self.graph.nodes), label, show=show) as bar:
                self._run_unwritten(bar)
            if ahead.futures:
                n = len(ahead.futures)
                with Progress(n, f"compiling {n} kernels on {ahead.processes} processes") as bar:
                    ahead.wait(bar)

    def _run_unwritten(self, progress: Progress | None = None) -> None:
        """A run whose cpu launches are recorded or collected, not run: they write no outputs, so a runner reading
        them may fail; the warm-up run after this raises any real error."""
        try:
            self._execute(self._last_inputs, progress)
        except Exception:  # noqa: BLE001 - (see the docstring)
            pass

    def _execute(self, arrays: list, progress: Progress | None = None, sync: bool = False) -> list:
        return self._outputs(self._run(arrays, progress, sync), arrays)

    def _run(self, arrays: list, progress: Progress | None = None, sync: bool = False) -> dict:
        """Every operator in order; the values of the graph's outputs (and inputs) by tensor id. `sync`
        waits for each operator's kernels on the GPU, so that its time is what the operator took. If an
        operator's results are not where the arena planned them, the arena is turned off and the run redone."""
        try:
            return self._run_steps(arrays, progress, sync)
        except Misplaced as reason:
            self._arena, self.arena = None, f"off ({reason})"
            return self._run_steps(arrays, progress, sync)

    def _run_steps(self, arrays: list, progress: Progress | None, sync: bool) -> dict:
        gpu, arena = self.target == "cuda", self._arena
        values = {id(t): to_device(a) if gpu else a for t, a in zip(self.graph.inputs, arrays)}
        records = []
        for step, op in enumerate(self.graph.nodes):
            inputs = [self._constant(t) if t.is_constant else values[id(t)] for t in op.inputs]
            begin = time.perf_counter()
            with results_in(arena.slots(step) if arena else ()) as claimed:
                outs, kernels = runners.run(op, inputs)
            if arena:
                arena.check(step, op, outs, claimed)
            if sync and gpu:
                from ..backend.cuda.launch import synchronize
                synchronize()
            records.append((kernels, time.perf_counter() - begin))
            for t, a in zip(op.outputs, outs):
                values[id(t)] = a
            for tid in self._free[step]:
                values.pop(tid, None)
            if progress is not None:
                progress.step(note=op.kind)
        self._records = records
        return values

    def _constant(self, t):
        """A constant's value where the kernels read it: as it is on the cpu, a copy made once on the GPU."""
        if self.target == "cpu":
            return t.value
        value = self._constants.get(id(t))
        if value is None:
            value = self._constants[id(t)] = to_device(t.value)
        return value

    def _capture(self) -> None:
        """Record a run on the warm-up inputs and capture its launches as a CUDA graph (`self._replay`), where
        the run is replayable; `self.cuda_graph` says whether it is on, and why not."""
        from ..backend.cuda.graphs import CudaGraph
        from ..backend.cuda.launch import recording
        inputs = [to_device(a) for a in self._last_inputs]
        with recording() as record:
            values = self._run(inputs)
        outputs = self._output_values(values)
        on_host = [t.name for t, a in zip(self.graph.outputs, outputs)
                   if not t.is_constant and not isinstance(a, DeviceArray)]
        if record.host_reads:
            self.cuda_graph = (f"off (the run read GPU memory back to the host {record.host_reads} time(s): "
                               "work a replay would not redo, such as laying out weights given as a graph input)")
        elif record.memory_ops:
            self.cuda_graph = (f"off (the run filled or copied GPU memory outside kernels {record.memory_ops} "
                               "time(s): work a replay would not redo)")
        elif any(r.host_writes for r in record.launches):
            self.cuda_graph = "off (a kernel wrote to host memory)"
        elif on_host:
            self.cuda_graph = f"off (outputs {on_host} are computed on the host)"
        elif not record.launches:
            self.cuda_graph = "off (no kernels to replay)"
        else:
            self._replay = CudaReplay(CudaGraph(record.launches), inputs, outputs)
            why = self._replay_disagreement()
            self.cuda_graph = f"off ({why})" if why else f"on ({len(record.launches)} kernels in one CUDA graph)"

    def _record_cpu(self) -> None:
        """Record the cpu launches of a run on the warm-up inputs as a `CpuReplay` (`self._replay`) where a
        replay is sure to give what a run gives; `self.replay` says whether it is on, and why not."""
        inputs = [np.array(a) for a in self._last_inputs]     # buffers of the replay's own
        with cpu_recording() as record:
            steps = StepEnds(record)
            try:
                values = self._run_steps(inputs, steps, False)
            except Misplaced as reason:
                self.replay = f"off (the arena's plan did not hold: {reason})"
                return
        if record.host_work:
            self.replay = f"off (the host computed part of a run: {record.host_work[0]})"
            return
        replay = CpuReplay(record.launches, inputs, self.graph, self._output_values(values), steps.ends)
        if not len(replay):
            self.replay = "off (no kernels to replay)"
            return
        self._replay = replay
        why = self._replay_disagreement()
        self.replay = f"off ({why})" if why else f"on ({len(replay)} cpu launches replayed)"

    def _replay_disagreement(self) -> str | None:
        """Why `self._replay` cannot stand in for a run (it is then dropped), or None: `replay.disagreement` on
        probe inputs. It catches host work nobody noted, and on cuda a capture that lost something."""
        try:
            try:
                why = disagreement(self._execute, self._replayed, probe_inputs(self.graph.inputs))
            except IndexError:      # an index input that may not be negative (RoiAlign's batch indices): at 0
                why = disagreement(self._execute, self._replayed, probe_inputs(self.graph.inputs, negative=False))
        except Exception as exc:  # noqa: BLE001 - a probe the graph rejects leaves replay off, not the build broken
            why = f"a run on probe inputs failed: {type(exc).__name__}: {exc}"
        if why:
            self._replay = None
        return why

    def _replayed(self, arrays: list) -> list:
        """The outputs of a replay on `arrays`, as new numpy arrays."""
        outputs = self._replay.run(arrays)
        if isinstance(self._replay, CpuReplay):
            return outputs
        return [a.numpy() if isinstance(a, DeviceArray) else np.array(a) for a in outputs]

    def _outputs(self, values: dict, arrays: list) -> list:
        """The graph's outputs among a run's `values`, as numpy arrays of their own (device ones copied back)."""
        return [a.numpy() if isinstance(a, DeviceArray) else a for a in self._handed_out(values)]

    def __call__(self, *args, **named) -> list:
        """The outputs for these inputs (numpy arrays; td.DeviceArrays too on cuda; positional, one dict keyed by
        input name, or by keyword), as a list of numpy arrays."""
        arrays = bind_inputs(self.graph, args, named)
        with self._lock, target_scope(self.target):
            if self._replay is not None and not (self.target == "cpu" and debug_enabled()):
                outputs = self._replayed(arrays)
            else:
                outputs = self._execute(arrays)
            self._last_inputs = arrays          # those of a call that ran (summary(timing=True) times them)
            return outputs

    def run_on_device(self, *args, **named) -> list:
        """cuda only: the outputs left on the GPU, as td.DeviceArrays (a constant output as its numpy value),
        queued but not waited for. With CUDA graph replay they are the graph's own output buffers, which the
        next call overwrites: copy what you keep (`.numpy()`)."""
        if self.target != "cuda":
            raise ValueError(f"run_on_device needs a graph compiled for the cuda target (this one is for "
                             f"{self.target}); call the compiled graph for numpy outputs")
        arrays = bind_inputs(self.graph, args, named)
        with self._lock, target_scope(self.target):
            if isinstance(self._replay, CudaReplay):
                outputs = list(self._replay.run(arrays))
                self._last_inputs = arrays
                return outputs
            outputs = self._handed_out(self._run(arrays))
            self._last_inputs = arrays
            # an output computed on the host (an empty tensor's) goes to the GPU like the others
            return [to_device(a) if isinstance(a, np.ndarray) and not t.is_constant else a
                    for t, a in zip(self.graph.outputs, outputs)]

    def _output_values(self, values: dict) -> list:
        """The graph's outputs among a run's `values` (a constant output as its value), as they are."""
        return [t.value if t.is_constant else values[id(t)] for t in self.graph.outputs]

    def _handed_out(self, values: dict) -> list:
        """The graph's outputs among a run's `values` as a caller gets them: a constant's value (or a view of one),
        an output in the caller's input memory (an input, or a view of one) and one in an earlier output's memory
        (a repeated output, or a view of another) as copies; the others as they are."""
        results, seen = [], set()
        for t, a in zip(self.graph.outputs, self._output_values(values)):
            root = self.memory.storage.get(id(t), t)
            if t.is_constant or root.is_constant or root.is_input or id(root) in seen:
                a = a.copy() if isinstance(a, DeviceArray) else np.array(a)
            seen.add(id(root))
            results.append(a)
        return results

    @property
    def kernels(self) -> list:
        """The kernels the last call launched, in launch order (after compile: those of the warm-up run)."""
        return [k for kernels, _ in self._records for k in kernels]

    @property
    def cpu_modules(self) -> int:
        """How many generated cpu modules those kernels run, their outlined functions' included (fewer than the
        kernels where kernels of other shapes share one, `share_code`, and kernels share an outlined function)."""
        sources = [src for k in self.kernels for _, src, _ in k._cpu.values()]
        return len({src.text for src in sources} | {o.text for src in sources for o in src.outlined})

    def _layout_summary(self) -> str:
        if self.channels_last:
            return "on (2-D convolutions NHWC)"
        return "on (no 2-D convolution to convert, or lone ones only)" if self._layout_pass else "off"

    def summary(self, timing: bool = False, repeat: int = 3) -> str:
        """A table of the operators, their output types and kernels; with `timing`, each operator's time, the best
        of `repeat` runs of the last call's inputs (`operator_times`)."""
        times = None
        if timing:
            times, how = self.operator_times(repeat)
        name = Namer()
        for t in self.graph.inputs:
            name(t)
        rows = [("#", "operator", "output", "kernels") + (("ms",) if timing else ())]
        for step, (op, (kernels, _)) in enumerate(zip(self.graph.nodes, self._records)):
            out = ", ".join(f"{name(t)}: {t.type_str()}" for t in op.outputs)
            row = (str(step), op.kind, out, " ".join(k.name for k in kernels) or "-")
            rows.append(row + ((f"{times[step] * 1e3:.3f}",) if timing else ()))
        widths = [max(len(r[c]) for r in rows) for c in range(len(rows[0]))]
        lines = [f"CompiledGraph {self.graph.name}: {len(self.graph.nodes)} operators, {len(self.kernels)} kernels, "
                 f"target {self.target}, compiled in {self.compile_seconds:.1f}s",
                 f"{self.memory.summary()}; arena {self.arena}; "
                 f"constants {format_bytes(sum(t.nbytes for t in self.graph.constants))}"]
        lines.append((f"CUDA graph replay: {self.cuda_graph}" if self.target == "cuda" else f"replay: {self.replay}")
                     + f"; layout pass {self._layout_summary()}")
        lines += ["  " + "  ".join(c.ljust(w) for c, w in zip(r, widths)).rstrip() for r in rows]
        if timing:
            lines.append(f"  total {times.sum() * 1e3:.3f} ms ({how})")
        return "\n".join(lines)

    def operator_times(self, repeat: int = 3) -> tuple:
        """(each operator's seconds, the best of `repeat` runs of the last call's inputs; how they were taken).
        On the cpu with replay on, an operator's time is its launches' inside replays of the whole graph: its
        kernels with the caches the operators before it leave, and no Python between them (an operator without
        kernels takes 0). Otherwise the operators run one by one through the executor, each timed with its
        Python (and on the GPU waited for): a small operator's row is then mostly that path."""
        repeat = max(repeat, 1)
        with self._lock, target_scope(self.target):
            if isinstance(self._replay, CpuReplay) and not debug_enabled():
                runs = [self._replay.operator_seconds(self._last_inputs) for _ in range(repeat)]
                how = f"best of {repeat} replays, each operator's launches"
            else:
                runs = []
                for _ in range(repeat):
                    self._execute(self._last_inputs, sync=True)
                    runs.append([seconds for _, seconds in self._records])
                how = (f"best of {repeat} runs operator by operator, each with the executor's Python"
                       + (", waited for" if self.target == "cuda" else ""))
        return np.min(np.array(runs), axis=0), how

    def __repr__(self) -> str:
        return f"<CompiledGraph {self.graph.name}: {len(self.graph.nodes)} operators, target {self.target}>"
