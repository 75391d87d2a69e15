"""Layer and RMS normalizations written out as reductions and elementwise operators become one LayerNorm.

ONNX exports before opset 17 (LayerNormalization) and LLaMA-style RMSNorm write them out:

    m = mean(x); d = x - m; v = mean(d ^ 2)        (RMS: d = x, no mean)
    n = d / sqrt(v + eps)  or  d * (1 / sqrt(v + eps))
    y = n * weight + bias                          (each optional; RMS: no bias)

with the means over the last axes (keepdims) and eps, weight and bias constants. Run as written they
are two reductions and three or four elementwise kernels with the full-size `d` stored in between;
the LayerNorm runs one row kernel (stdlib_ops.rowwise). The rewrite is exact up to rounding: the
operator computes the same mean and variance, in f32 for 16-bit inputs, so it is made for f32 and
f64 inputs only (a 16-bit written-out norm rounds every step to 16 bits).

A match needs every intermediate read only inside the pattern (`d` by its square and the division,
the others once) and none a graph output.
"""
from __future__ import annotations

import numpy as np

from ..graph import Graph
from ..ops import Elementwise, Reduce, layer_norm, rms_norm
from ..tensor import constant


class _Match:
    """Reads a pattern off the graph: each step checks one producer and records the tensors it passes through."""

    def __init__(self, users: dict, outputs: set):
        self.users, self.outputs, self.inner = users, outputs, []

    def producer(self, t, *fns):
        """t's producer when it is an elementwise operator of one of `fns` and t is an intermediate (not a graph
        output), else None."""
        op = t.producer
        if type(op) is Elementwise and op.attrs["fn"] in fns and id(t) not in self.outputs:
            self.inner.append(t)
            return op
        return None

    def mean(self, t):
        """(its input, axes) where t is a keepdims mean over trailing axes of an intermediate, else None."""
        op = t.producer
        if not (isinstance(op, Reduce) and op.attrs["op"] == "mean" and op.attrs["keepdims"]) or id(t) in self.outputs:
            return None
        x, axes = op.inputs[0], tuple(op.attrs["axes"])
        if not axes or axes != tuple(range(x.ndim - len(axes), x.ndim)):
            return None
        self.inner.append(t)
        return x, axes

    def private(self, final) -> bool:
        """Whether every recorded intermediate is read only by operators of the pattern (whose outputs are the
        intermediates and `final`)."""
        inside = {id(t.producer) for t in self.inner} | {id(final.producer)}
        return all(all(id(r) in inside for r in self.users.get(id(t), [])) for t in self.inner)


def _scalar(t) -> float | None:
    """The value of a one-element constant tensor, else None."""
    return float(np.asarray(t.value).reshape(-1)[0]) if t.is_constant and t.size == 1 else None


def _other(op, t):
    """The operand of binary `op` that is not `t` (None when both are, or neither is, or `op` has other than two
    operands: add and mul take any number)."""
    if len(op.inputs) != 2:
        return None
    a, b = op.inputs
    return b if a is t and b is not t else a if b is t and a is not t else None


def _denominator(match: _Match, n):
    """(d, the variance tensor, eps) where n = d / sqrt(v + eps) or d * (1 / sqrt(v + eps)), else None."""
    op = n.producer     # (n may be a graph output: it is the norm's result where no weight follows)
    if type(op) is not Elementwise or op.attrs["fn"] not in ("div", "mul") or len(op.inputs) != 2:
        return None
    candidates = [tuple(op.inputs)] if op.attrs["fn"] == "div" else [tuple(op.inputs), tuple(op.inputs)[::-1]]
    for d, s in candidates:
        probe = _Match(match.users, match.outputs)
        root = probe.producer(s, "sqrt") if op.attrs["fn"] == "div" else probe.producer(s, "reciprocal")
        if root is not None and op.attrs["fn"] == "mul":
            root = probe.producer(root.inputs[0], "sqrt")
        shifted = root is not None and probe.producer(root.inputs[0], "add")
        if not shifted or len(shifted.inputs) != 2:
            continue
        a, b = shifted.inputs
        var, eps = (a, _scalar(b)) if _scalar(b) is not None else (b, _scalar(a))
        if eps is not None:
            match.inner += probe.inner
            return d, var, eps
    return None


def _variance_of(match: _Match, var):
    """(d, axes) where var = mean(d ^ 2) or mean(d * d), else None."""
    found = match.mean(var)
    if found is None:
        return None
    square, axes = found
    op = match.producer(square, "pow", "mul")
    if op is None or len(op.inputs) != 2:
        return None
    a, b = op.inputs
    if (op.attrs["fn"] == "pow" and _scalar(b) == 2.0) or (op.attrs["fn"] == "mul" and a is b):
        return a, axes
    return None


def _param(t, k: int):
    """Constant `t` as a LayerNorm parameter of the `k` normalized axes (leading 1s dropped), else None."""
    if not t.is_constant:
        return None
    value = np.asarray(t.value)
    while value.ndim > k and value.shape[0] == 1:
        value = value[0]
    return constant(np.ascontiguousarray(value), t.dtype) if value.ndim <= k else None


def _affine(match: _Match, n, k: int, with_bias: bool):
    """(the last tensor, weight, bias) of n * weight + bias (each optional) that follow n, read once each."""
    weight = bias = None
    end = n
    for fn in ("mul", "add") if with_bias else ("mul",):
        readers = match.users.get(id(end), [])
        if len(readers) != 1 or id(end) in match.outputs or type(readers[0]) is not Elementwise \
                or readers[0].attrs["fn"] != fn:
            break
        other = _other(readers[0], end)
        param = None if other is None or readers[0].outputs[0].shape != end.shape else _param(other, k)
        if param is None:
            break
        match.inner.append(end)
        end = readers[0].outputs[0]
        weight, bias = (param, bias) if fn == "mul" else (weight, param)
    return end, weight, bias


def _norm_at(graph_users: dict, outputs: set, n):
    """(the tensor the norm's result replaces, the norm's input x, the builder of the result from x's tensor in
    the new graph) when `n` is the normalized value of a written-out layer or RMS norm, else None."""
    match = _Match(graph_users, outputs)
    found = _denominator(match, n)
    if found is None:
        return None
    d, var, eps = found
    variance = _variance_of(match, var)
    if variance is None or variance[0] is not d:
        return None
    axes = variance[1]
    centred = _Match(graph_users, outputs)
    sub = centred.producer(d, "sub")
    mean = sub is not None and centred.mean(sub.inputs[1])
    rms = not (mean and mean[0] is sub.inputs[0] and mean[1] == axes)
    if not rms:
        match.inner += centred.inner
    x = d if rms else sub.inputs[0]
    if x.dtype.name not in ("f32", "f64") or n.shape != x.shape:     # (a constant of higher rank broadcast it)
        return None
    end, weight, bias = _affine(match, n, len(axes), with_bias=not rms)
    if not match.private(end):
        return None
    axis = x.ndim - len(axes)
    if rms:
        return end, x, lambda new_x: rms_norm(new_x, weight, eps, axis)
    return end, x, lambda new_x: layer_norm(new_x, weight, bias, eps, axis)


def recognize_norms(graph: Graph) -> Graph:
    """The graph with each written-out layer or RMS norm (see the module docstring) replaced by a LayerNorm."""
    users = graph.users()
    outputs = {id(t) for t in graph.outputs}
    found = {}      # id(operator whose output the norm replaces) -> (the norm's input x, builder)
    for op in graph.nodes:
        if type(op) is Elementwise and op.attrs["fn"] in ("div", "mul"):
            norm = _norm_at(users, outputs, op.outputs[0])
            if norm is not None:
                end, x, build = norm
                found[id(end.producer)] = (x, build)
    if not found:
        return graph
    new: dict = {}

    def replacement(op, inputs):
        new.update({id(old): t for old, t in zip(op.inputs, inputs)})
        if id(op) not in found:
            return None
        x, build = found[id(op)]
        return [build(new.get(id(x), x))]

    return graph.transform(replacement)
