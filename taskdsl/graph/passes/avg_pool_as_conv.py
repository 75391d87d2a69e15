"""2-D average pooling as a depthwise convolution by ones, times a constant (an exact rewrite).

    avg_pool(x)  =>  conv(x, ones(C, 1, KH, KW), groups=C) * r        r = avg_pool(1) / conv(1, ones)

Both sum the same input elements per window (zeros in the padding); only the divisor differs
by position, and `r` holds it per output pixel, computed here once by the two operators'
numpy references on an all-ones input (so count_include_pad, ceil_mode and dilation keep
their exact meaning: a ceil-mode output past the conv's own size gets end padding). On the
cpu the convolution runs the direct-rows kernel with `* r` fused into its stores; as a
thread-per-output reduction with a per-output window count, Inception-V3's nine 3x3 average
pools took 23 ms.

Under `td.fast_compile` (tests, prototyping) the pass leaves the graph alone: each pooling
shape would compile a kernel of its own, where one generic pooling kernel serves them all. On the
cpu it leaves an f32 channels-first pool alone too: `stdlib_ops.pool`'s row kernel runs it, in
0.5-0.6x the convolution's time (a (1, 64, 112, 112) 3x3 stride-2 pool: 0.07 ms against 0.17).
16-bit float pools stay pools: they sum in f32 (`stat_dtype`), where the convolution's sum is
16-bit (2000s averaged over a 7x7 window overflowed f16 to inf).
"""
from __future__ import annotations

import numpy as np

from ...runtime.config import fast_compile_enabled
from ..graph import Graph
from ..ops import Conv, Pool, mul
from ..ops.norm import stat_dtype
from ..tensor import constant


def _conv_attrs(op: Pool) -> dict:
    """The depthwise convolution's attributes: the pool's, with end pads grown to give ceil mode's size."""
    a = op.attrs
    spatial, out = op.spatial_dims(op.inputs[0].shape), a["out"]
    pads = list(a["pads"])
    for i, (n, k, s, d) in enumerate(zip(spatial, a["kernel"], a["strides"], a["dilations"])):
        span = d * (k - 1) + 1
        pads[2 + i] = max(pads[2 + i], (out[i] - 1) * s + span - n - pads[i])
    return {"strides": a["strides"], "pads": tuple(pads), "dilations": a["dilations"],
            "groups": op.channels(op.inputs[0].shape), "channels_last": a["channels_last"]}


def _rewritten(op: Pool, x):
    """conv(x, ones) * r for average pool `op` reading `x`, or None when a window holds no input element."""
    channels = op.channels(x.shape)
    ones_w = np.ones((channels, 1) + tuple(op.attrs["kernel"]), x.numpy_dtype)
    conv = Conv([x, constant(ones_w, x.dtype)], _conv_attrs(op))
    ones_x = np.ones(x.shape, np.float64)
    count = conv.reference(ones_x, ones_w.astype(np.float64))[0]
    if count.shape != op.outputs[0].shape or not np.all(count > 0):
        return None
    ratio = op.reference(ones_x)[0] / count        # the same for every image and channel: keep one of each
    spatial = (slice(None),) * (x.ndim - 2)
    one = (slice(0, 1), *spatial, slice(0, 1)) if op.attrs["channels_last"] else (slice(0, 1), slice(0, 1))
    return mul(conv.outputs[0], constant(np.ascontiguousarray(ratio[one]), x.dtype))


def avg_pool_as_conv(graph: Graph) -> Graph:
    """The graph with each 2-D f32 / f64 average pooling rewritten (see the module docstring)."""
    if fast_compile_enabled():
        return graph

    def rewritten(op, inputs):
        x = inputs[0]
        if isinstance(op, Pool) and op.attrs["mode"] == "avg" and x.ndim == 4 and x.dtype.is_float \
                and stat_dtype(x.dtype) == x.dtype and not op.on_rows:
            y = _rewritten(op, x)
            return None if y is None else [y]
        return None

    return graph.transform(rewritten)
