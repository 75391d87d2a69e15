"""Graph operators: nodes whose meaning is a set of compute definitions (taskdsl.compute).

An Operator subclass validates its inputs and attributes (`check`) and says what it
computes (`define`: compute / reduce definitions over placeholders of its inputs' shapes
and dtypes). Output shapes and dtypes are read off the definitions, so shape inference,
the numpy reference (`reference`) and the kernels all come from one description.
"""
from __future__ import annotations

import itertools

import numpy as np

from .. import ir
from ..compute import evaluate, placeholder, topological
from ..ir import types as T
from .tensor import Tensor

_ids = itertools.count()


def dims(x) -> tuple:
    """A definition tensor's dims: ints where static, IR expressions of size symbols where symbolic."""
    return tuple(int(d.value) if isinstance(d, ir.Const) else d for d in x.shape)


def _as_shape(size) -> tuple:
    return size if isinstance(size, tuple) else (size,)


def external_inputs(members: list) -> list:
    """The tensors operators `members` read that none of them produces, in order of first read (a fused node's
    inputs)."""
    produced = {id(t) for m in members for t in m.outputs}
    seen: dict = {}
    for m in members:
        for t in m.inputs:
            if id(t) not in produced:
                seen.setdefault(id(t), t)
    return list(seen.values())


def freeze(value):
    """An attribute value in hashable form (lists -> tuples, numpy scalars -> Python numbers)."""
    if isinstance(value, (list, tuple)):
        return tuple(freeze(v) for v in value)
    if isinstance(value, np.generic):
        return value.item()
    if isinstance(value, np.ndarray):
        return freeze(value.tolist())
    return value


class Operator:
    """A node of a Graph: `outputs` computed from `inputs` as its compute definitions say."""

    kind = "operator"      # the name printed for the node ("conv2d", "add", ...)
    is_anchor = False      # matmul / conv: what fusion partitions are built around
    is_view = False        # the output is (part of) the input's memory: a reshape, a contiguous slice
    kind_attr = None       # the attribute `kind` is made from (not printed again)
    generic = False        # `define` reads sizes only from its placeholders' dims (never from self.inputs),
                           # so it also works on symbolic dims: one kernel then serves every size
    size_attrs = ()        # attributes that are sizes (a pooling window): symbolic in the generic definitions too,
                           # read in `define` through `self.size(name)`
    derived_attrs = ()     # attributes `check` computes (not printed; recomputed when the operator is cloned)

    def __init__(self, inputs: list, attrs: dict | None = None):
        self.inputs = list(inputs)
        self.attrs = {k: freeze(v) for k, v in (attrs or {}).items()}
        for t in inputs:
            if not isinstance(t, Tensor):
                raise TypeError(f"{type(self).__name__}: inputs must be graph Tensors (graph.input, graph.constant "
                                f"or an op's output), got {type(t).__name__}")
        self.id = next(_ids)
        self._symbolic: dict = {}
        self.check()
        self.placeholders = [placeholder(f"in{k}", t.dtype, t.shape) for k, t in enumerate(self.inputs)]
        self.definitions = list(self.define(*self.placeholders))
        self.outputs = [Tensor(tuple(ir.evaluate_int(d, {}) for d in o.shape), o.dtype, producer=self, index=k)
                        for k, o in enumerate(self.definitions)]

    # ------------------------------------------------------------------ what subclasses say
    def check(self) -> None:
        """Raise ValueError / TypeError when the inputs or attributes are invalid."""

    def check_values(self, arrays: list) -> None:
        """Raise when input values (host arrays, at run time) are invalid for the operator; most accept any."""

    def define(self, *xs) -> list:
        """The compute definitions of the outputs, over placeholders `xs` (compute tensors) of the inputs."""
        raise NotImplementedError(type(self).__name__)

    def overwritable_input(self) -> int | None:
        """The index of an input whose memory the first output may take (the memory plan then gives it that
        storage where the input is read by nothing later): one the operator's kernels read at the output's own
        elements only, each before they write it; None (the default) where no input is read so."""
        return None

    # ------------------------------------------------------------------ derived
    @property
    def name(self) -> str:
        """A name unique in the process: kind and a serial number."""
        return f"{self.kind}_{self.id}"

    @property
    def kinds(self) -> tuple:
        """The kinds of the operators the node computes: its own; a fused group's, its members' in order."""
        return (self.kind,)

    @property
    def is_injective(self) -> bool:
        """Whether every definition (outputs and intermediates) is a compute, i.e. no reduction."""
        return all(t.kind != "reduce" for t in topological(self.definitions))

    @property
    def value_inputs(self) -> list:
        """Indices of the inputs whose values the definitions read (not only their shapes)."""
        read = {id(t) for t in topological(self.definitions)}
        return [k for k, p in enumerate(self.placeholders) if id(p) in read]

    def signature(self) -> tuple:
        """What the operator computes, as a hashable key: kind, attributes, input shapes and dtypes."""
        return (type(self).__name__, tuple(sorted(self.attrs.items())),
                tuple((t.shape, t.dtype) for t in self.inputs))

    def size(self, name: str) -> tuple:
        """Size attribute `name`: its ints, or size symbols while the generic definitions are built."""
        return self._symbolic.get(name, self.attrs[name])

    def generic_signature(self) -> tuple:
        """The key of the generic definitions: kind, attributes but sizes, and per input its dtype and 1-dims."""
        return (type(self).__name__, tuple(sorted((k, v) for k, v in self.attrs.items() if k not in self.size_attrs)),
                tuple((t.dtype, tuple(n == 1 for n in t.shape)) for t in self.inputs))

    def generic_definitions(self) -> tuple:
        """(placeholders, definitions) over symbolic sizes: every input dim that is not 1 is a size symbol, and
        each size attribute is the shape of one more (int8, never read) placeholder: see `size_carriers`."""
        holders = [placeholder(f"in{k}", t.dtype, tuple(1 if n == 1 else f"{self.kind}_{k}_{a}"
                                                        for a, n in enumerate(t.shape)))
                   for k, t in enumerate(self.inputs)]
        carriers = [placeholder(f"{name}_shape", T.i8, tuple(f"{self.kind}_{name}{k}"
                                                             for k in range(len(_as_shape(self.attrs[name])))))
                    for name in self.size_attrs]
        self._symbolic = {name: dims(c) if isinstance(self.attrs[name], tuple) else dims(c)[0]
                          for name, c in zip(self.size_attrs, carriers)}
        try:
            return holders + carriers, list(self.define(*holders))
        finally:
            self._symbolic = {}

    def size_carriers(self) -> list:
        """The arrays the generic definitions' size placeholders take: zero-stride int8 arrays of the sizes."""
        return [np.broadcast_to(np.zeros((), np.int8), _as_shape(self.attrs[name])) for name in self.size_attrs]

    def reference(self, *arrays) -> list:
        """The outputs for these input arrays, by the numpy evaluation of the definitions (after the checks of the
        values that a compiled run makes: an index out of range is the same IndexError)."""
        self.check_values(list(arrays))
        return evaluate(self.placeholders, self.definitions, list(arrays))

    def clone(self, inputs: list) -> Operator:
        """The same operator on other inputs (shapes and dtypes are inferred again)."""
        return type(self)(inputs, self.attrs)

    def shown_attrs(self) -> dict:
        """The attributes a printed graph shows (those not already in `kind`)."""
        return {k: v for k, v in self.attrs.items() if k != self.kind_attr and k not in self.derived_attrs}

    def attrs_str(self) -> str:
        """The shown attributes as `k=v, ...`."""
        return ", ".join(f"{k}={v!r}" for k, v in self.shown_attrs().items())

    def __repr__(self) -> str:
        return f"<Operator {self.name}({self.attrs_str()})>"
