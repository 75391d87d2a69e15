"""Exact round trips: a float cast to an integer type and back to a float is the value itself where the value is
already an integer within the integer type's range (a QuantizeLinear's rounding and clamp, then DequantizeLinear),
but for a NaN, which the integer cast makes 0.

    cast(cast(v, u8), f32),  v = clip(i, 0, 255), i integral   =>   nan_to_zero(v) = v + 0 if v == v else 0

(`+ 0` makes a -0.0 the integer cast's 0.) The saturating conversions (compares, selects and two conversions an
element) were a third of a quantize-dequantize pair's time in a fused epilogue; the select is one compare (one
select on the cpu too: `codegen.speculable`). `nan_to_zero` is one operator reading v once: as `where(v == v, ...)`
three operators read v three times, and an epilogue, which follows values read once, stopped at v.

A round trip stays where something else reads the integers (a quantized activation that is the next product's
8-bit operand and, dequantized, a residual): there the integers are made anyway, and reading them back is a plain
conversion, where `nan_to_zero` would keep v too, a second reader of v (BERT-base in QDQ: 24 more kernels).
"""
from __future__ import annotations

import numpy as np

from ..graph import Graph
from ..ops import Elementwise, elementwise
from .fold_constants import constant_value

# functions whose result is an integer (or +-inf, or NaN) wherever their operands are
CLOSED = {"add", "sub", "mul", "neg", "abs", "maximum", "minimum", "clip"}
ROUNDING = {"rint", "floor", "ceil"}


def _function(t) -> str | None:
    """The elementwise function producing `t`, None for any other producer."""
    return t.producer.kind if isinstance(t.producer, Elementwise) else None


def _integral(t) -> bool:
    """Whether every value of float tensor `t` that is not a NaN is an integer or an infinity (f32 sums and products
    of integers are: past 2^24 every f32 is an integer). Walked without recursion and each tensor once: a chain
    of thousands of operators (an unrolled loop), or a DAG that reads each value twice, stays cheap."""
    known: dict = {}
    stack = [t]
    while stack:
        u = stack[-1]
        if id(u) not in known:
            verdict = _integral_alone(u)
            pending = [] if verdict is not None else [x for x in u.producer.inputs if id(x) not in known]
            if pending:
                stack.extend(pending)
                continue
            known[id(u)] = verdict if verdict is not None else all(known[id(x)] for x in u.producer.inputs)
        stack.pop()
    return known[id(t)]


def _integral_alone(t) -> bool | None:
    """`_integral(t)` where `t` itself decides it; None when its producer (one CLOSED over integers) leaves it to
    its inputs."""
    value = constant_value(t)
    if value is not None:
        value = np.asarray(value)
        return bool(np.all((value == np.round(value)) | np.isnan(value)))
    fn = _function(t)
    if fn in ROUNDING:
        return True
    if fn == "cast":
        return not t.producer.inputs[0].dtype.is_float
    return None if fn in CLOSED else False


def _clamped_within(v, low: int, high: int) -> bool:
    """Whether `v` is an integral float tensor clipped to constant bounds within [low, high]."""
    if _function(v) != "clip" or not (v.producer.attrs["has_min"] and v.producer.attrs["has_max"]):
        return False
    bounds = [constant_value(b) for b in v.producer.inputs[1:]]
    if any(b is None or np.size(b) != 1 for b in bounds):
        return False
    lo, hi = (float(np.asarray(b).reshape(())) for b in bounds)
    return low <= lo <= hi <= high and lo == round(lo) and hi == round(hi) and _integral(v.producer.inputs[0])


def _exact_value(op) -> object | None:
    """The integer-valued float that `op`, a cast to a float of a cast to an integer, converts back, or None."""
    if op.kind != "cast" or not op.outputs[0].dtype.is_float or _function(op.inputs[0]) != "cast":
        return None
    narrowed = op.inputs[0]
    v = narrowed.producer.inputs[0]
    if not (v.dtype == op.outputs[0].dtype and narrowed.dtype.is_integer):
        return None
    info = np.iinfo(narrowed.dtype.numpy)     # (an integral float within the range converts there and back exactly)
    return v if _clamped_within(v, int(info.min), int(info.max)) else None


def drop_exact_round_trips(graph: Graph) -> Graph:
    """The graph with each exact float -> integer -> float round trip replaced (see the module docstring), where
    the round trip alone reads the integers."""
    users, outputs = graph.users(), {id(t) for t in graph.outputs}

    def replaced(op, inputs):
        v = _exact_value(op) if isinstance(op, Elementwise) else None
        if v is None or len(users[id(op.inputs[0])]) > 1 or id(op.inputs[0]) in outputs:
            return None
        v = inputs[0].producer.inputs[0]        # (in the new graph)
        return [elementwise("nan_to_zero", v)]

    return graph.transform(replaced)
