"""Elementwise fusion: each connected group of elementwise operators of one output shape becomes one
`FusedElementwise` node, one kernel that keeps the intermediates in registers.

    a = div(x, 1.41); b = erf(a); c = add(b, 1); d = mul(x, 0.5); e = mul(d, c)
    =>  e = fused_elementwise(x, computes='mul(mul(in0, 0.5), add(erf(div(in0, 1.41)), 1))')

Groups grow backwards from their last operator: a producer joins when every reader of its output is
already a member (so the intermediate is needed nowhere else) and the output is not a graph output.
Read more than once (x above), a tensor is still one operand of the group. That is what lets
`partition` fuse such a DAG into a convolution's or matmul's epilogue, whose chain follows tensors
read once: ONNX's decomposed GELU, Softsign (x / (1 + |x|)), Swish, and a chain with no anchor
before it (one kernel instead of one per operator).

An operator that reads an anchor's output, as its only reader, stays out of other operators' groups (it
may end one): it is the head of that anchor's epilogue. Swallowed by a group that also read another
anchor's output (ResNet's two convolutions with their shifts, added), it would leave that anchor's
output stored bare and the group reading both.

Members share the group's output shape (none is computed for a broadcast and then recomputed per
element), and the body, an expression tree, stays under `MAX_TREE` nodes: a value read twice is
written out twice in the tree (the compilers' common-subexpression elimination computes it once).

Scalars are the exception: an elementwise operator of single elements (a quantization's scale and zero
point, computed from a max and a min) joins every group that reads it, as a copy, whoever else reads it.
Its kernel computes it once per span, ahead of its loop (`schedule.hoist`), where a kernel of its own cost
a launch (4.6 us on the cpu): a dynamically quantized MobileNet-V2 ran 621 kernels, 303 with the copies.

Under `td.fast_compile` (tests, prototyping) the pass leaves the graph alone: each group would compile a
kernel of its own, where one kernel of each elementwise function serves every graph (the test suite took a
tenth longer with the pass on).
"""
from __future__ import annotations

from ...runtime.config import fast_compile_enabled
from ..fusion import fusible_anchor
from ..graph import Graph
from ..operator import external_inputs
from ..ops import Elementwise
from ..ops.elementwise import FusedElementwise

MAX_TREE = 256      # nodes of a group's expression tree, a value counted once per read


def _tree_size(members: list, inputs: list) -> int:
    """The nodes of the expression tree of `members` (in order; the last is the output), inputs counted as 1."""
    size = {id(t): 1 for t in inputs}
    for m in members:
        size[id(m.outputs[0])] = 1 + sum(size[id(t)] for t in m.inputs)
    return size[id(members[-1].outputs[0])]


def _epilogue_heads(graph: Graph, users: dict, outputs: set) -> set:
    """The ids of the operators that read a fusible anchor's output as its only reader."""
    heads = set()
    for op in graph.nodes:
        readers = users.get(id(op.outputs[0]), []) if fusible_anchor(op) else []
        if len(readers) == 1 and id(op.outputs[0]) not in outputs:
            heads.add(id(readers[0]))
    return heads


def _scalar(op) -> bool:
    """Whether `op` is an elementwise operator of single elements (one out, one per input): a group that reads it
    computes its own copy, once per kernel span (`schedule.hoist`), instead of loading it from a kernel of its own."""
    return type(op) is Elementwise and all(t.size == 1 for t in [*op.inputs, *op.outputs])


def _groups(graph: Graph) -> tuple[list, set]:
    """The groups of two or more members, each a list of operators in graph order (the last: the output), and the
    ids of the scalar members copied into a group whose output is still needed elsewhere too (see `_scalar`)."""
    users = graph.users()
    outputs = {id(t) for t in graph.outputs}
    heads = _epilogue_heads(graph, users, outputs)
    order = {id(op): k for k, op in enumerate(graph.nodes)}
    taken: set = set()
    groups, copied = [], set()
    for sink in reversed(graph.nodes):
        if id(sink) in taken or type(sink) is not Elementwise:
            continue
        members, copies = {id(sink): sink}, set()
        grown = True
        while grown:
            grown = False
            for m in list(members.values()):
                for t in m.inputs:
                    p = t.producer
                    if type(p) is not Elementwise or id(p) in members or id(p) in heads:
                        continue
                    owned = (id(p) not in taken and id(t) not in outputs and p.outputs[0].shape == sink.outputs[0].shape
                             and all(id(r) in members for r in users[id(t)]))     # (else a scalar joins as a copy)
                    if not (owned or _scalar(p)):
                        continue
                    candidate = sorted([*members.values(), p], key=lambda op: order[id(op)])
                    if _tree_size(candidate, external_inputs(candidate)) <= MAX_TREE:
                        members[id(p)] = p
                        copies |= set() if owned else {id(p)}
                        grown = True
        if len(members) > 1:
            taken.update(members.keys() - copies)
            copied |= copies
            groups.append(sorted(members.values(), key=lambda op: order[id(op)]))
    return groups, copied


def fused(members: list, mapping: dict | None = None) -> FusedElementwise:
    """The FusedElementwise computing `members` (elementwise operators in order; the last is the output), over
    their external inputs replaced as `mapping` (id(tensor) -> tensor) says."""
    inputs = external_inputs(members)
    ref = {id(t): k for k, t in enumerate(inputs)}
    steps = []
    for j, m in enumerate(members):
        steps.append((m.attrs["fn"], tuple(sorted(m.params.items())), tuple(ref[id(t)] for t in m.inputs)))
        ref[id(m.outputs[0])] = len(inputs) + j
    mapping = mapping or {}
    return FusedElementwise([mapping.get(id(t), t) for t in inputs], {"steps": tuple(steps)})


def fuse_elementwise(graph: Graph) -> Graph:
    """The graph with each group of elementwise operators (see the module docstring) replaced by one operator."""
    if fast_compile_enabled():
        return graph
    groups, copied = _groups(graph)
    if not groups:
        return graph
    last = {id(g[-1]): g for g in groups}
    members = {id(m) for g in groups for m in g} - copied
    replaced: dict = {}     # id(tensor of `graph`) -> the tensor `transform` passes for it

    def replacement(op, inputs):
        replaced.update({id(old): new for old, new in zip(op.inputs, inputs) if old is not new})
        if id(op) in last:
            return fused(last[id(op)], replaced).outputs
        return op.outputs if id(op) in members else None    # (built with their group)

    return graph.transform(replacement)
