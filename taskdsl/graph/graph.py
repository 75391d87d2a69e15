"""Graph: inputs, outputs and the operators between them, in topological order.

    x = graph.input("x", (2, 8))
    y = ops.relu(ops.matmul(x, graph.constant(w)))
    g = graph.Graph([x], [y])          # or graph.trace(fn, x)
    print(g); y_np, = g(x_np)          # compiled on first call
"""
from __future__ import annotations

from collections.abc import Callable

import numpy as np

from ..ir.types import is_number_dtype
from ..runtime.arrays import as_array, contiguous, conversion
from .operator import Operator
from .tensor import Tensor


def topological_nodes(outputs: list, extra: list = ()) -> list:
    """The `extra` operators and those the outputs depend on, producers before consumers (else in `extra`'s order)."""
    order, state = [], {}

    def visit(node: Operator):
        stack = [(node, False)]
        while stack:                 # iterative: graphs can be deeper than Python's recursion limit
            op, done = stack.pop()
            if done:
                state[id(op)] = 2
                order.append(op)
                continue
            if state.get(id(op)) == 2:
                continue
            if state.get(id(op)) == 1:
                raise ValueError(f"the graph has a cycle through {op.name}")
            state[id(op)] = 1
            stack.append((op, True))
            for t in reversed(op.inputs):
                if t.producer is not None and state.get(id(t.producer)) != 2:
                    stack.append((t.producer, False))

    for op in list(extra) + [t.producer for t in outputs if t.producer is not None]:
        if state.get(id(op)) != 2:
            visit(op)
    return order


class Graph:
    """A computation graph: call it on arrays (compiled on first call) or `compile()` it explicitly."""

    def __init__(self, inputs: list, outputs: list, nodes: list | None = None, name: str = "graph"):
        self.inputs, self.outputs, self.name = list(inputs), list(outputs), name
        names = set()
        for t in self.inputs:
            if not isinstance(t, Tensor) or not t.is_input:
                raise ValueError(f"graph inputs must be tensors made by graph.input(), got {t!r}")
            if t.name in names:
                raise ValueError(f"two graph inputs are called {t.name!r}")
            names.add(t.name)
        if not self.outputs:
            raise ValueError("a graph needs at least one output (the tensors it computes, as a list)")
        for t in self.outputs:
            if not isinstance(t, Tensor):
                raise TypeError(f"graph outputs must be graph Tensors, got {type(t).__name__}")
        self.nodes = topological_nodes(self.outputs, nodes or ())
        known = {id(t) for t in self.inputs}
        for op in self.nodes:
            for t in op.inputs:
                if t.is_input and id(t) not in known:
                    raise ValueError(f"{op.name} reads {t!r}, which is not one of the graph inputs; "
                                     "add it to the inputs")
        for t in self.outputs:
            if t.is_input and id(t) not in known:
                raise ValueError(f"output {t!r} is a tensor that is not one of the graph inputs")
        self._compiled = None

    @property
    def constants(self) -> list:
        """The constant tensors the operators read, in first-use order."""
        seen: dict = {}
        for op in self.nodes:
            for t in op.inputs:
                if t.is_constant:
                    seen.setdefault(id(t), t)
        return list(seen.values())

    def users(self) -> dict:
        """id(tensor) -> the operators that read it, in topological order."""
        found: dict = {}
        for op in self.nodes:
            for t in op.inputs:
                found.setdefault(id(t), []).append(op)
        return found

    def rewrite(self, replace: dict, rebuild: bool = False) -> Graph:
        """A graph where each tensor in `replace` (id(tensor) -> Tensor) is replaced; operators that read a
        replaced tensor (every operator, with `rebuild`) are rebuilt, their outputs' types inferred again."""
        replace = dict(replace)
        nodes = []
        for op in self.nodes:
            if all(id(t) in replace for t in op.outputs):
                continue                     # every output was replaced: the operator is gone
            inputs = [replace.get(id(t), t) for t in op.inputs]
            if not rebuild and all(a is b for a, b in zip(inputs, op.inputs)):
                nodes.append(op)
                continue
            new = op.clone(inputs)
            for old, t in zip(op.outputs, new.outputs):
                t.name = old.name
                replace.setdefault(id(old), t)
            nodes.append(new)
        return Graph(self.inputs, [replace.get(id(t), t) for t in self.outputs], nodes, self.name)

    def transform(self, replacement: Callable) -> Graph:
        """A graph where each operator `op` for which `replacement(op, inputs)` (`inputs`: op's inputs in the
        new graph) returns tensors, one per output, is replaced by them; the other operators are rebuilt
        where an input changed. The same graph when nothing is replaced."""
        new: dict = {}              # id(tensor of this graph) -> its tensor in the new graph
        changed = False
        for op in self.nodes:       # in order, so a replacement is built on the new graph's tensors
            inputs = [new.get(id(t), t) for t in op.inputs]
            results = replacement(op, inputs)
            if results is not None:
                changed = True
            elif any(a is not b for a, b in zip(inputs, op.inputs)):
                results = op.clone(inputs).outputs
            else:
                continue
            for old, t in zip(op.outputs, results):
                t.name = old.name
                new[id(old)] = t
        if not changed:
            return self
        return Graph(self.inputs, [new.get(id(t), t) for t in self.outputs], name=self.name)

    def compile(self, target: str | None = None, passes: list | None = None, channels_last: bool | None = None,
                cuda_graph: bool = True, arena: bool = True, replay: bool = True):
        """The CompiledGraph of this graph for `target` ('cpu' / 'cuda'; default: the current target);
        `channels_last` runs its 2-D convolutions in NHWC (the layout pass, passes.channels_last; default: on,
        see executor.CHANNELS_LAST; ignored when `passes` are given); `replay`
        issues each call's recorded launches again without the Python between them (on cuda as one CUDA graph,
        which `cuda_graph=False` turns off too); `arena` places the activations by the memory plan (see
        taskdsl.graph.executor and taskdsl.graph.replay)."""
        from .executor import CompiledGraph
        return CompiledGraph(self, target=target, passes=passes, channels_last=channels_last, cuda_graph=cuda_graph,
                             arena=arena, replay=replay)

    def __call__(self, *args, **named) -> list:
        """The outputs for these input arrays (positional, one dict keyed by input name, or by keyword)."""
        if self._compiled is None:
            self._compiled = self.compile()
        return self._compiled(*args, **named)

    def reference(self, *args, **named) -> list:
        """The outputs computed by each operator's numpy reference (the test oracle of the whole graph)."""
        values = {id(t): a for t, a in zip(self.inputs, bind_inputs(self, args, named))}
        for op in self.nodes:
            arrays = [t.value if t.is_constant else values[id(t)] for t in op.inputs]
            for t, a in zip(op.outputs, op.reference(*arrays)):
                values[id(t)] = a
        return [np.array(t.value) if t.is_constant else np.array(values[id(t)]) for t in self.outputs]

    def __str__(self) -> str:
        from .printer import graph_str
        return graph_str(self)

    def __repr__(self) -> str:
        return (f"<Graph {self.name}: {len(self.inputs)} inputs, {len(self.nodes)} operators, "
                f"{len(self.outputs)} outputs>")


def trace(fn, *inputs: Tensor, name: str | None = None) -> Graph:
    """The Graph of `fn(*inputs)` (graph inputs in, a tensor or a list/tuple of tensors out)."""
    outputs = fn(*inputs)
    outputs = list(outputs) if isinstance(outputs, (list, tuple)) else [outputs]
    return Graph(list(inputs), outputs, name=name or getattr(fn, "__name__", "graph"))


def _ready(a, t) -> bool:
    """Whether `a` is already what a call binds for input `t`: a writable C-contiguous numpy array of its shape and
    (native) dtype (the checks below, done for the common case in a few attribute reads)."""
    return type(a) is np.ndarray and a.dtype == t.numpy_dtype and a.shape == t.shape and a.flags.c_contiguous \
        and a.flags.writeable and a.dtype.isnative


def bind_inputs(graph: Graph, args: tuple, named: dict | None = None) -> list:
    """The input arrays of a call (positional, one dict keyed by input name, or by keyword: `named`), checked
    against the graph; read-only ones copied (numba would compile each kernel again for them)."""
    if named:
        if args:
            raise TypeError("give a graph's inputs positionally, as one dict, or by keyword, not mixed")
        args = (named,)
    names = [t.name for t in graph.inputs]
    if len(args) == 1 and isinstance(args[0], dict):
        given = args[0]
        unknown = sorted(set(given) - set(names))
        missing = [n for n in names if n not in given]
        if unknown or missing:
            problems = ([f"missing {missing}"] if missing else []) + ([f"unknown {unknown}"] if unknown else [])
            fixed = [n for n in unknown if n in {t.name for t in graph.constants}]
            if fixed:   # an ONNX input with an initializer: imported as the initializer's value
                problems.append(f"{fixed} are constants of the graph (an ONNX input with an initializer is); give "
                                "other values when importing: from_onnx(model, constants={name: array})")
            raise ValueError(f"graph {graph.name!r} takes inputs {names}; {', '.join(problems)}")
        args = tuple(given[n] for n in names)
    if len(args) != len(graph.inputs):
        noun = "input array" if len(names) == 1 else "input arrays"
        raise TypeError(f"graph {graph.name!r} takes {len(names)} {noun} ({', '.join(names)}), got {len(args)}")
    arrays = []
    for t, a in zip(graph.inputs, args):
        if _ready(a, t):
            arrays.append(a)
            continue
        given = a
        try:
            a = as_array(a)
        except ValueError:                  # ragged lists numpy refuses
            a = np.asarray(None)
        if not is_number_dtype(a.dtype):     # None, a string, ragged lists: not an array of numbers
            raise TypeError(f"input {t.name!r} must be an array of shape {t.shape} and dtype {t.numpy_dtype}, "
                            f"got {type(given).__name__} {str(given)[:40]!r}")
        if a.shape != t.shape:
            raise ValueError(f"input {t.name!r} must have shape {t.shape}, got {a.shape}")
        if a.dtype.newbyteorder("=") != t.numpy_dtype:      # big-endian data is converted on the way in
            raise TypeError(f"input {t.name!r} must have dtype {t.numpy_dtype}, got {a.dtype}; "
                            f"convert it with {conversion(given, t.numpy_dtype)}")
        a = contiguous(a)
        arrays.append(a.copy() if isinstance(a, np.ndarray) and not a.flags.writeable else a)
    return arrays
