"""Fusion partitioning: each anchor (matmul, 2-D convolution) with the injective operators around it
becomes one `FusedAnchor` node, run as one kernel by post-scheduling fusion (`td.fuse`).
(Grouped convolutions fuse where stdlib_ops.conv runs them as its direct-rows kernel: the cpu. A product or a 2-D
convolution of 8-bit integers, `IntegerMatMul` / `IntegerConv`, takes an epilogue on the cpu, whose float kernels
run it.)

    partition(graph):  for each anchor, in order
      epilogue: follow the anchor's output while it has exactly one reader (and is not a graph
                output) and that reader is injective with as many elements out as in
                (elementwise with broadcast operands, batch norm, reshape, transpose);
      prologue: an operand produced by an injective operator read only by the anchor is computed
                inside the anchor's loads (conv input, matmul operands); a matmul's, where its blocks load
                an element more than once, only if it is cheap (no transcendental call: `CHEAP_CALLS`).

The template is scheduled for the anchor alone (stdlib_ops.gemm / stdlib_ops.conv); its loads of
the operands are then replaced by the prologue definitions (for a convolution: im2col of the
input, composed with the input's producer) and its stores by the epilogue chain. A fused node's
meaning is the composition of its members' compute definitions, so it keeps a numpy reference.
"""
from __future__ import annotations

import functools

import numpy as np

import taskdsl as td
from stdlib_ops import conv as conv_lib
from stdlib_ops import gemm, interleave
from stdlib_ops.transform import transpose_canon

from .. import ir
from ..compute import in_place, placeholder, topological
from ..runtime.arrays import contiguous, copy_into, empty_like_operands, results_in, same_memory, unplanned
from ..schedule.fusion import FusionError
from .graph import Graph
from .operator import Operator, external_inputs
from .ops import BatchNorm, Conv, Elementwise, IntegerConv, IntegerMatMul, MatMul, Reshape, Transpose
from .ops.transform import view_index
from .runners import TEMPLATE_FLOATS, conv_geometry, packed_b, packed_weight, run, runs

EPILOGUE_KINDS = (Elementwise, BatchNorm, Reshape, Transpose)
INTEGER_ANCHORS = (IntegerMatMul, IntegerConv)   # their operands are quantizations, rounded: an epilogue only
CONV_ANCHORS = (Conv, IntegerConv)
PROLOGUE_KINDS = (Elementwise, BatchNorm, Reshape, Transpose)
# From this many elements an interleaving transpose runs after an anchor, not in its epilogue (`_stored_apart`): an
# epilogue's scattered stores cost about 0.75 ns an element more (0.15 ms of 200704), the launch of its own a few us
INTERLEAVED_APART = 1 << 14


class FusedAnchor(Operator):
    """An anchor with its prologue and epilogue operators, computed by one kernel."""

    kind = "fused"

    def __init__(self, anchor: Operator, prologues: dict, epilogue: list):
        self.anchor, self.prologues, self.epilogue = anchor, dict(prologues), list(epilogue)
        super().__init__(external_inputs(self.members),
                         {"anchor": anchor.kind, "epilogue": tuple(k for m in self.epilogue for k in m.kinds)})

    @property
    def members(self) -> list:
        return list(self.prologues.values()) + [self.anchor] + self.epilogue

    def define(self, *holders):
        """The members' definitions composed: each member defined over its producers' definitions."""
        value = {id(t): h for t, h in zip(self.inputs, holders)}
        for m in self.members:
            for t, d in zip(m.outputs, m.define(*(value[id(t)] for t in m.inputs))):
                value[id(t)] = d
        return [value[id(self.epilogue[-1].outputs[0] if self.epilogue else self.anchor.outputs[0])]]

    def overwritable_input(self) -> int | None:
        """An input of the output's shape and type that one epilogue member reads, elementwise, with only elementwise
        members of the output's shape after it: each output element is computed from its own element of that input
        (a residual block's shortcut, which the kernel's stores can then overwrite: no second pass over memory)."""
        return self._overwritable

    @functools.cached_property
    def _overwritable(self) -> int | None:      # (asked at every run: the members never change)
        out = self.outputs[0]
        for k, t in enumerate(self.inputs):
            readers = [m for m in self.members for x in m.inputs if x is t]
            if (t.shape != out.shape or t.dtype != out.dtype or len(readers) != 1
                    or not any(m is readers[0] for m in self.epilogue)):
                continue
            chain = self.epilogue[next(i for i, m in enumerate(self.epilogue) if m is readers[0]):]
            if all(isinstance(m, Elementwise) and m.outputs[0].shape == out.shape for m in chain):
                return k
        return None

    def clone(self, inputs: list) -> "FusedAnchor":
        """The same fusion over other external inputs (members rebuilt in order)."""
        return FusedAnchor.over(self.anchor, self.prologues, self.epilogue,
                                {id(old): new for old, new in zip(self.inputs, inputs)})

    @staticmethod
    def over(anchor: Operator, prologues: dict, epilogue: list, mapping: dict) -> "FusedAnchor":
        """The fusion of these members with their inputs replaced as `mapping` (id(tensor) -> tensor) says:
        a member that reads a replaced tensor is rebuilt (and its outputs replace its old ones), the others
        are kept."""
        mapping = dict(mapping)

        def rebuilt(m):
            inputs = [mapping.get(id(t), t) for t in m.inputs]
            if all(a is b for a, b in zip(inputs, m.inputs)):
                return m
            new = m.clone(inputs)
            mapping.update({id(old): t for old, t in zip(m.outputs, new.outputs)})
            return new

        prologues = {k: rebuilt(m) for k, m in prologues.items()}
        anchor = rebuilt(anchor)
        return FusedAnchor(anchor, prologues, [rebuilt(m) for m in epilogue])


# ---------------------------------------------------------------- the pass
def fusible_anchor(op: Operator) -> bool:
    """Whether `op` is an anchor the target's templates fuse (a matmul or 2-D convolution of f32 / f16 / bf16; on the
    cpu a matmul or 2-D convolution of 8-bit integers: a GPU's 8-bit kernels take B k-major, which the fused node
    does not make)."""
    if isinstance(op, IntegerMatMul):
        return td.get_target() == "cpu" and all(t.ndim >= 2 for t in op.inputs)
    if isinstance(op, IntegerConv):     # (the float convolutions' kernels, their sums exact in i32)
        return td.get_target() == "cpu" and op.inputs[0].ndim == 4
    if isinstance(op, MatMul):
        return all(t.ndim >= 2 for t in op.inputs) and op.inputs[0].dtype in TEMPLATE_FLOATS
    if isinstance(op, Conv):
        x = op.inputs[0]    # ungrouped: the matmul template; grouped: the cpu's direct rows or GEMMs (conv_lib.lower)
        return x.ndim == 4 and x.dtype in TEMPLATE_FLOATS and (op.attrs["groups"] == 1 or td.get_target() == "cpu")
    return False


# The calls a matmul's prologue makes however many blocks read its operand. A fused operand's element is computed by
# every block of outputs that loads it (for A, each of the N / BN column blocks: `MatmulPlan.operand_reads`), so a
# transcendental one is computed that many times: a GRU's sigmoid(...) * h in its matmul's A took 20 of the step's
# 24 us at hidden 256 (four column blocks); as a kernel of its own, 2 us.
CHEAP_CALLS = frozenset({"min", "max", "abs", "floor", "ceil", "rint"})


def _cheap(op: Operator) -> bool:
    """Whether `op`'s definitions call no function but CHEAP_CALLS (arithmetic, selects, casts, clamps)."""
    return all(c.func in CHEAP_CALLS for t in topological(op.definitions) if t.kind != "placeholder"
               for c in ir.collect(t.body, ir.Call))


# A prologue that a kernel computes into its copy of A's rows (`MatmulPlan.stages_a_rows`), once a block, may call
# any function while it computes at most this many elements in all (its elements times the blocks). A GRU's
# sigmoid(...) * h, 32 steps: hidden 128 (256 computed) 0.168 -> 0.149-0.158 ms; hidden 256 (1024) no faster, 512
# (4096) slower: about 1 ns an element against a launch's 1-1.5 us
STAGED_RECOMPUTES = 512


def _worth_recomputing(anchor: Operator, k: int, producer: Operator) -> bool:
    """Whether operand k's producer may be computed in the anchor's loads: cheap, loaded once per element (a
    convolution's: its im2col copy or loads read the input window by window either way), or a small A that the
    kernel stages (a GRU's sigmoid(...) * h: a launch of its own cost about 1.4 us a step)."""
    if not isinstance(anchor, MatMul) or _cheap(producer):
        return True
    ta, tb = anchor.inputs
    plan = gemm.plan(ta.shape, tb.shape, ta.dtype, td.get_target())
    reads = plan.operand_reads[k]
    staged = k == 0 and tb.is_constant and plan.stages_a_rows
    return reads == 1 or (staged and reads * ta.size <= STAGED_RECOMPUTES)


def _elementwise_like(op: Operator, source) -> bool:
    """Injective, one output with as many elements as `source`, which it reads once per output element."""
    return (isinstance(op, EPILOGUE_KINDS) and op.is_injective and len(op.outputs) == 1
            and op.outputs[0].size == source.size and sum(t is source for t in op.inputs) == 1)


def _stored_apart(op: Operator) -> bool:
    """Whether the cpu runs `op` faster after an anchor than in its epilogue: a transpose that interleaves rows
    (`stdlib_ops.interleave`) of INTERLEAVED_APART elements or more, which an epilogue stores one by one, each in
    another row. A 2x2 ConvTranspose of stride 2, 64 channels at 28x28, its phases interleaved: 0.326 ms in the
    epilogue, 0.174 + 0.052 apart (docs/benchmarks.md, session 114)."""
    return (isinstance(op, Transpose) and td.get_target() == "cpu" and op.outputs[0].size >= INTERLEAVED_APART
            and interleave.applies(*transpose_canon(op.inputs[0].shape, op.attrs["perm"])))


def _broadcast_operand_producers(member: Operator, chained, owned) -> list:
    """The producers an epilogue member's other operands may be computed by inside its loads: cheap elementwise
    operators of fewer elements than the member's output, `owned` by it (read by it alone, in no other group). A
    quantized product's zero point times its operand's sums, say ([1, 12, 128, 1] into QK^T's [1, 12, 128, 128]):
    a kernel of its own cost a launch and a store, where the epilogue adds a multiply per element."""
    return [t.producer for t in member.inputs if t is not chained
            and isinstance(t.producer, Elementwise) and len(t.producer.outputs) == 1
            and t.size < member.outputs[0].size and owned(t, member) and _cheap(t.producer)]


def _groups(graph: Graph) -> list:
    """(anchor, prologues, epilogue) of each anchor with something to fuse, in order; an operator joins the
    first group that can take it."""
    users = graph.users()
    outputs = {id(t) for t in graph.outputs}
    taken: set = set()

    def free_sole_reader(t):
        readers = users.get(id(t), [])
        one = readers[0] if len(readers) == 1 and id(t) not in outputs else None
        return one if one is not None and id(one) not in taken else None

    def owned(t, member) -> bool:
        return free_sole_reader(t) is member and id(t.producer) not in taken

    groups = []
    for op in graph.nodes:
        if id(op) in taken or not fusible_anchor(op):
            continue
        epilogue, tail = [], op.outputs[0]
        while (nxt := free_sole_reader(tail)) is not None and _elementwise_like(nxt, tail) and not _stored_apart(nxt):
            epilogue += [*_broadcast_operand_producers(nxt, tail, owned), nxt]
            tail = nxt.outputs[0]
        prologues = {}
        for k in () if isinstance(op, INTEGER_ANCHORS) else (0,) if isinstance(op, Conv) else (0, 1):
            producer = op.inputs[k].producer
            if (isinstance(producer, PROLOGUE_KINDS) and id(producer) not in taken and producer.is_injective
                    and len(producer.outputs) == 1 and free_sole_reader(op.inputs[k]) is op
                    and _worth_recomputing(op, k, producer)):
                prologues[k] = producer
        if epilogue or prologues:
            groups.append((op, prologues, epilogue))
            taken.update(id(m) for m in [op, *prologues.values(), *epilogue])
    return groups


def partition(graph: Graph) -> Graph:
    """The graph with every fusible anchor and its prologues / epilogue chain replaced by a FusedAnchor.

    The groups are found on the graph as it is (`_groups`); then one `Graph.transform` builds the
    new graph: a FusedAnchor where a group's last member was, and every other operator that reads
    a replaced tensor rebuilt over the new one.
    """
    groups = _groups(graph)
    members = {id(m) for anchor, prologues, epilogue in groups for m in [anchor, *prologues.values(), *epilogue]}
    last_member = {id(epilogue[-1] if epilogue else anchor): (anchor, prologues, epilogue)
                   for anchor, prologues, epilogue in groups}
    replaced: dict = {}     # id(tensor of `graph`) -> its replacement, from the inputs `transform` passes

    def replacement(op, inputs):
        replaced.update({id(old): new for old, new in zip(op.inputs, inputs) if old is not new})
        if id(op) in last_member:
            return FusedAnchor.over(*last_member[id(op)], replaced).outputs
        return op.outputs if id(op) in members else None    # (kept as they are: built with their group)

    return graph.transform(replacement)


# ---------------------------------------------------------------- building and running the kernel
def _view(t, shape: tuple, name: str):
    """A compute reading `t` (any shape with as many elements) as row-major `shape` (`view_index`)."""
    src = tuple(int(d.value) for d in t.shape)
    return td.compute(name, shape, lambda *ix: t[view_index(src, shape, ix)])


class _Build:
    """The fused kernel of one FusedAnchor and how to call it from the node's input arrays."""

    def __init__(self, op: FusedAnchor, overwrites: int | None = None):
        self.op, self.overwrites = op, overwrites   # the input whose memory the output takes (`overwritable_input`)
        self._packed: dict = {}   # a constant conv weight as its lowering's operand (made on first run)
        holders = [placeholder(f"x{k}", t.dtype, t.shape) for k, t in enumerate(op.inputs)]
        self.value = {id(t): h for t, h in zip(op.inputs, holders)}
        for m in op.prologues.values():
            self._define(m)
        anchor = op.anchor
        if isinstance(anchor, CONV_ANCHORS):
            self._conv(anchor)
        else:
            self._matmul(anchor)
        self.index_of = {h.name: k for k, h in enumerate(holders)}

    def _define(self, m, replaced: dict | None = None):
        values = [(replaced or {}).get(id(t), self.value.get(id(t))) for t in m.inputs]
        for t, d in zip(m.outputs, m.define(*values)):
            self.value[id(t)] = d

    def _epilogue(self, anchor_out, y) -> object:
        self.value[id(anchor_out)] = y
        for m in self.op.epilogue:
            self._define(m)
        z = self.value[id(self.op.epilogue[-1].outputs[0])] if self.op.epilogue else y
        return z if self.overwrites is None else in_place(z, self.value[id(self.op.inputs[self.overwrites])])

    def _conv(self, anchor: Conv | IntegerConv) -> None:
        x, w = anchor.inputs
        out = anchor.outputs[0]     # a grouped GEMM's output has its channel axis split: (group, channel) views it
        self.conv = conv_lib.lower(conv_geometry(anchor), x.dtype, td.get_target(), self.value[id(x)],
                                   lambda y: self._epilogue(out, y if y.ndim == 4 else _view(y, out.shape, "conv_out")),
                                   None if w.dtype == x.dtype else w.dtype)
        self.weight, self.kernels = w, self.conv.kernels

    def _matmul(self, anchor: MatMul) -> None:
        ta, tb = anchor.inputs
        self.plan = plan = gemm.plan(ta.shape, tb.shape, ta.dtype, td.get_target(), b_dtype=tb.dtype)
        a_shape, b_shape, c_shape = plan.operand_shapes()
        prologues = {}
        for k, (name, shape) in enumerate((("A", a_shape), ("B", b_shape))):
            if k in self.op.prologues:
                prologues[name] = _view(self.value[id(anchor.inputs[k])], shape, name)
        c = placeholder("C", plan.out_dtype, c_shape)
        y = _view(c, anchor.outputs[0].shape, "matmul_out")
        z = self._epilogue(anchor.outputs[0], y)
        # constant weights (no prologue) are packed once, for the kernel that reads them packed
        self.b_panels = None if 1 in self.op.prologues else packed_b(plan, tb, tb.value)
        # with split-k (a GPU with too few output tiles to fill it), the kernel writes partials and `finish`
        # sums them with the epilogue fused in
        costly_a = 0 in self.op.prologues and not _cheap(self.op.prologues[0])     # (`_worth_recomputing`)
        self.kernel, self.finish = plan.fused(prologues, z, packed_b=self.b_panels is not None,
                                              columns_outer=self._columns_together(plan.m, plan.n), staged_a=costly_a)
        self.kernels = [k for k in (self.kernel, self.finish) if k is not None]
        self.batch_index = plan.batch_index(plan.fusion_split)

    def _columns_together(self, m: int, n: int) -> bool:
        """Whether the epilogue stores the anchor's (M, N) rows next to each other and its columns apart (a
        transpose of the product's last two axes among its reshapes, as attention's K^T): its elements (0, 0),
        (0, 1) and (1, 0) followed through the chain's reshapes and transposes to their offsets in the output."""
        if m < 2 or n < 2:
            return False
        tail, shape = self.op.anchor.outputs[0], self.op.anchor.outputs[0].shape
        points = [np.unravel_index(flat, shape) for flat in (0, 1, n)]
        for member in self.op.epilogue:
            if not any(t is tail for t in member.inputs):
                continue        # (a producer of an operand the chain reads beside it)
            out_shape = member.outputs[0].shape
            if isinstance(member, Transpose):
                points = [tuple(p[a] for a in member.attrs["perm"]) for p in points]
            else:               # as many elements, in the same order (a reshape, an elementwise operator)
                points = [np.unravel_index(np.ravel_multi_index(p, shape), out_shape) for p in points]
            tail, shape = member.outputs[0], out_shape
        first, right, below = (int(np.ravel_multi_index(p, shape)) for p in points)
        return abs(right - first) != 1 and abs(below - first) == 1

    def run(self, arrays: list, out) -> np.ndarray:
        """`out`, the fused node's output for its input arrays (one kernel launch; two for a cpu conv with im2col);
        built to overwrite an input, `out` is that input's memory."""
        if isinstance(self.op.anchor, CONV_ANCHORS):
            named = {name: contiguous(arrays[k]) for name, k in self.index_of.items()}
            weight = arrays[self._weight_index]
            self.conv.run(named, packed_weight(self.conv, self.weight, weight, self._packed), out)
            return out
        kernel_args, finish_args = self._arguments
        if self.finish is None:
            self.kernel(*self._values(kernel_args, arrays, None), out)
            return out
        partials = empty_like_operands(self.plan.partials_shape, np.float32, *arrays)
        self.kernel(*self._values(kernel_args, arrays, partials))
        self.finish(*self._values(finish_args, arrays, partials), out)
        return out

    @staticmethod
    def _values(how: list, arrays: list, partials) -> list:
        """A kernel's arguments from `_arguments`' recipe: fixed values, the node's inputs, the split-k partials."""
        return [partials if k == "partials" else value if k is None else
                contiguous(arrays[k]).reshape(shape) if shape else contiguous(arrays[k]) for value, k, shape in how]

    @functools.cached_property
    def _weight_index(self) -> int:
        return self._input_index(self.weight)

    @functools.cached_property
    def _arguments(self) -> tuple:
        """How the arguments of the matmul kernel and of split-k's finishing kernel (but their final outputs) come
        from the node's input arrays: (a fixed value, None, None), (None, input index, the 3-D operand shape
        for A and B, else None), or (None, "partials", None) for split-k's partials."""
        anchor = self.op.anchor
        a_shape, b_shape, _ = self.plan.operand_shapes()
        how = {"batch_index": (self.batch_index, None, None), "split": (self.plan.fusion_split, None, None),
               "C": (None, "partials", None), "P": (None, "partials", None)}
        for k, (name, shape) in enumerate((("A", a_shape), ("B", b_shape))):
            if k not in self.op.prologues:
                how[name] = (None, self._input_index(anchor.inputs[k]), shape)
        if self.b_panels is not None:
            how["B"] = (self.b_panels, None, None)

        def recipe(kernel, with_output: bool) -> list:
            names = [name for name, _ in kernel.params][:None if with_output else -1]
            return [how[n] if n in how else (None, self.index_of[n], None) for n in names]
        return recipe(self.kernel, self.finish is not None), recipe(self.finish, False) if self.finish else []

    def _input_index(self, t) -> int:
        return next(k for k, x in enumerate(self.op.inputs) if x is t)


class _Members:
    """A FusedAnchor whose kernel fusion cannot build (an epilogue map it cannot invert, such as a reshape whose
    rows straddle the anchor's, then a transpose): its members run one after the other, as unfused operators."""

    def __init__(self, op: FusedAnchor):
        self.op, self.kernels = op, []

    def run(self, arrays: list, out):
        values = {id(t): a for t, a in zip(self.op.inputs, arrays)}
        self.kernels = []
        members = self.op.members
        for k, m in enumerate(members):
            inputs = [values[id(t)] for t in m.inputs]
            with unplanned() if k < len(members) - 1 else results_in([out.reshape(-1)]):    # the last's: in `out`
                outs, kernels = run(m, inputs)
            self.kernels += kernels
            values.update({id(t): a for t, a in zip(m.outputs, outs)})
        if not same_memory(outs[0], out):       # (a runner allocating as it likes, a view's)
            copy_into(out, outs[0])
        return out


@runs(FusedAnchor)
def run_fused(op: FusedAnchor, arrays: list) -> tuple:
    """One launch of the fused kernel (built on first use), or where fusion cannot build it, its members'. Where the
    output comes in the memory of its `overwritable_input` (the memory plan's), the kernel is one built in place."""
    out = empty_like_operands(op.outputs[0].shape, op.outputs[0].numpy_dtype, *arrays)
    k = op.overwritable_input()
    overwrites = k if k is not None and same_memory(out, arrays[k]) else None
    builds = op.__dict__.setdefault("_builds", {})
    key = (td.get_target(), overwrites)
    if key not in builds:
        try:
            builds[key] = _Build(op, overwrites)
        except FusionError:
            builds[key] = _Members(op)
    build = builds[key]
    return [build.run(arrays, out)], list(build.kernels)


__all__ = ["FusedAnchor", "fusible_anchor", "partition"]
