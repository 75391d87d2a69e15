"""Constant folding: operators whose value inputs are all constant become constants.

This covers weight-only sub-graphs (a transposed or reshaped weight, a folded scale) and
shape arithmetic (ONNX Shape -> Gather -> Concat -> Reshape chains: shapes are static, so
`Shape` is a constant already). Values come from the operators' numpy references
(`Operator.reference`, the evaluation of their compute definitions). An operator whose
reference would evaluate more than `MAX_FOLD_ELEMENTS` index points (a big weight-only
matmul) is left to run as kernels.
"""
from __future__ import annotations

import hashlib

import numpy as np

from ...compute import topological
from ..graph import Graph
from ..operator import Operator
from ..tensor import Tensor, constant

MAX_FOLD_ELEMENTS = 1 << 24


def _work(op: Operator) -> int:
    """Index points the reference evaluates (a reduction's grid covers outputs x reduced elements)."""
    total = 0
    for t in topological(op.definitions):
        if t.kind != "placeholder":
            dims = [int(d.value) for d in t.shape + t.reduce_shape]
            total += int(np.prod(dims, dtype=np.int64))
    return total


def constant_value(t: Tensor) -> np.ndarray | None:
    """`t`'s value if it depends on constants only (evaluated once per operator), else None."""
    if t.is_constant:
        return t.value
    op = t.producer
    if op is None:
        return None
    cached = op.__dict__.get("_folded")
    if cached is None:
        arrays = []
        read = set(op.value_inputs)
        for k, x in enumerate(op.inputs):
            if k not in read:     # only its shape matters: a zero-stride stand-in
                arrays.append(np.broadcast_to(np.zeros((), x.numpy_dtype), x.shape))
                continue
            v = constant_value(x)
            if v is None:
                op._folded = False
                return None
            arrays.append(v)
        op._folded = cached = op.reference(*arrays) if _work(op) <= MAX_FOLD_ELEMENTS else False
    return None if cached is False else cached[t.index]


def fold_constants(graph: Graph) -> Graph:
    """The graph with every constant-computable operator replaced by constants; folded values equal bit for bit
    are one constant (an unrolled recurrence slices its weights anew each step: a GRU of 32 steps held 24 MiB of
    copies, and each copy's matmul packed panels of its own)."""
    replace, seen = {}, {}      # seen: (dtype, shape, digest of the bytes) -> the constant
    for op in graph.nodes:
        for t in op.outputs:
            value = constant_value(t)
            if value is None:
                continue
            key = (t.dtype, t.shape, hashlib.blake2b(np.ascontiguousarray(value).view(np.uint8)).digest())
            if key not in seen:
                seen[key] = constant(value, t.dtype, name=t.name)
            replace[id(t)] = seen[key]
    return graph.rewrite(replace) if replace else graph
