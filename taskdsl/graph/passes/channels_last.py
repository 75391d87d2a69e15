"""Layout pass (ALT's layout propagation): 2-D convolution stacks run channels-last (NHWC).

    conv(x) -> add(., c) -> relu -> conv        (NCHW, as imported)
      =>  transpose(x, NHWC) -> conv' -> add(., c') -> relu -> conv' -> transpose(., NCHW)

Each 2-D convolution (of floats, or of 8-bit integers: a quantized model's) stacked with another
(not a lone one between channels-first tensors, `_stacked`, but on the cpu one that `_gains_alone`)
becomes its channels-last form, and the layout then propagates forward through pooling, concat,
elementwise operators and pads of the spatial axes (a quantized convolution's input padded with its
zero point): one that reads a channels-last tensor computes channels-last too. A reduction over the
spatial axes of one (a global pool) reduces its channels-last form: the channels are then the
contiguous axis of its output rows;
one over every axis (a dynamic quantization's max and min) reads it as it is. A concat joins along
the same axis, where it now lies; an elementwise operator's other operands are transposed to match
(constants here, once; a lower-rank broadcast operand is first padded to rank 4). Every other
operator keeps the original layout, and a tensor crossing back gets one transpose, made once however
many read it; the graph's inputs and outputs keep their layout. A transpose whose axes longer than 1
keep their order (a per-channel (1, C, 1, 1) operand) is a reshape, which moves no data. Transposes
at a convolution's input or output are fused into its kernel by `partition` like any other prologue
or epilogue.

Why: with channels contiguous, the im2col of a convolution copies runs of C floats and a
convolution's GEMM writes its output rows in place (cpu and GPU alike), and tensor cores want
the reduction axis (channels) innermost.
"""
from __future__ import annotations

import numpy as np

from ...runtime.config import get_target
from ..graph import Graph
from ..ops import Concat, Conv, Elementwise, IntegerConv, Pad, Pool
from ..ops.reduce import Reduce
from ..ops.transform import reshape, transpose
from ..tensor import constant

TO_LAST = (0, 2, 3, 1)        # NCHW -> NHWC
TO_FIRST = (0, 3, 1, 2)       # NHWC -> NCHW


def _converts(op) -> bool:
    """A channels-first 2-D convolution (of floats, or of 8-bit integers: a quantized model's)."""
    return isinstance(op, (Conv, IntegerConv)) and op.inputs[0].ndim == 4 and not op.attrs["channels_last"]


LONE_MIN_CHANNELS = 32      # input channels from which a lone convolution runs channels-last on the cpu


def _gains_alone(op) -> bool:
    """Whether a lone channels-first convolution runs faster channels-last, its two transposes fused into it: on
    the cpu, a float one of one group whose window is more than a pixel, reading LONE_MIN_CHANNELS channels or
    more. Its NHWC im2col copies runs of C channels where NCHW's copies runs of output columns (36 lone
    convolutions on 2 cores, session 109: 0.26-0.94x the NCHW time from 32 channels, 0.72-1.10x at 16, and
    0.9-3.9x from 3 channels at 224 x 224; a 1x1 256 -> 64 at 56 x 56, which reads NCHW as its columns, 1.4x)."""
    x, w = op.inputs[:2]
    return (get_target() == "cpu" and isinstance(op, Conv) and x.dtype.is_float and op.attrs["groups"] == 1
            and w.shape[2] * w.shape[3] > 1 and x.shape[1] >= LONE_MIN_CHANNELS)


def _stacked(graph: Graph) -> set:
    """The ids of the channels-first 2-D convolutions that stack with another: whose output reaches another's
    input, or meets another's output, through operators the layout propagates along (`_pools_last`, `_follows`).
    A lone convolution between channels-first tensors keeps its layout, unless it `_gains_alone`: converting it
    adds only its two transposes (fused into it), which can cost more than the layout saves (cpu, one thread: a
    1x1 256 -> 64 convolution at 56x56 1.19 ms NCHW, 1.83 ms so; a ConvNeXt-style block, its depthwise
    convolutions between a layer norm and a residual add, 4.9 / 7.8 ms)."""
    users = graph.users()
    stacked = set()
    reached_by: dict = {}        # id(tensor) -> the convolution whose output reached it first
    for conv in filter(_converts, graph.nodes):
        reached = {id(conv.outputs[0])}
        frontier = [conv.outputs[0]]
        while frontier:
            for op in users.get(id(frontier.pop()), []):
                if _converts(op) and id(op.inputs[0]) in reached:
                    stacked |= {id(conv), id(op)}
                elif (_pools_last(op, reached) or _follows(op, reached) or _pads_spatially(op, reached)) \
                        and id(op.outputs[0]) not in reached:
                    out = id(op.outputs[0])
                    if reached_by.setdefault(out, id(conv)) != id(conv):      # meets another's region
                        stacked |= {id(conv), reached_by[out]}
                    reached.add(out)
                    frontier.append(op.outputs[0])
        if _gains_alone(conv):
            stacked.add(id(conv))
    return stacked


def _pools_last(op, computed: set) -> bool:
    """A channels-first 2-D pooling of a tensor computed channels-last (without indices, which are NCHW ones)."""
    return (isinstance(op, Pool) and op.inputs[0].ndim == 4 and not op.attrs["channels_last"]
            and not op.attrs.get("indices") and id(op.inputs[0]) in computed)


def _follows(op, computed: set) -> bool:
    """An elementwise operator with a 4-D output, or a concat of 4-D tensors, that reads a 4-D tensor computed
    channels-last (not one transposed for an earlier reader: a graph input, a constant, an NCHW result)."""
    return (isinstance(op, (Elementwise, Concat)) and len(op.outputs) == 1 and op.outputs[0].ndim == 4
            and all(t.ndim <= 4 for t in op.inputs) and any(t.ndim == 4 and id(t) in computed for t in op.inputs))


def _pads_spatially(op, computed: set) -> bool:
    """A pad of the spatial axes alone of a 4-D tensor computed channels-last (a quantized convolution's input,
    padded with its zero point): its channels-last form pads axes 1 and 2."""
    pads = op.attrs["pads"] if isinstance(op, Pad) else None
    return (pads is not None and op.inputs[0].ndim == 4 and id(op.inputs[0]) in computed
            and not any(pads[k] or pads[4 + k] for k in (0, 1)))


def _reduces_everything(op, computed: set) -> bool:
    """A reduction of every axis of a 4-D tensor computed channels-last into a scalar (a dynamic quantization's
    max and min), the same in either layout."""
    return (isinstance(op, Reduce) and op.inputs[0].ndim == 4 and sorted(op.attrs["axes"]) == [0, 1, 2, 3]
            and not op.attrs["keepdims"] and id(op.inputs[0]) in computed)


def _reduces_spatial(op, computed: set) -> bool:
    """A reduction over exactly the spatial axes (2, 3) of a 4-D tensor computed channels-last: a global pool, whose
    channels-last form reduces axes (1, 2), each output row's channels contiguous (the cpu's 'columns' schedule).
    The convolution before it then stores its rows in place, not transposed to NCHW (on the cpu both pools take
    0.03 ms for 1280 x 7 x 7, and MobileNet-V2 measured the same either way; a GPU's transposed store is strided)."""
    return (isinstance(op, Reduce) and op.inputs[0].ndim == 4 and tuple(op.attrs["axes"]) == (2, 3)
            and id(op.inputs[0]) in computed)


def runs_channels_last(graph: Graph) -> bool:
    """Whether a 2-D convolution of `graph` (alone, or the anchor of a fused kernel) runs channels-last."""
    def conv(op):
        anchor = getattr(op, "anchor", None)
        return op if isinstance(op, (Conv, IntegerConv)) else conv(anchor) if anchor is not None else None
    return any(c is not None and c.inputs[0].ndim == 4 and c.attrs["channels_last"]
               for c in map(conv, graph.nodes))


class _Layouts:
    """Each tensor of the input graph in the new graph: in its own layout, channels-last, or both."""

    def __init__(self):
        self.first: dict = {}     # id(tensor) -> the new graph's tensor in the original layout
        self.last: dict = {}      # id(tensor) -> the new graph's tensor holding it channels-last
        self.computed: set = set()    # ids of the tensors computed channels-last (not transposed for a reader)

    def as_first(self, t):
        """`t` in its original layout (a transpose back, made once, when it only exists channels-last)."""
        if id(t) not in self.first:
            # a graph input or constant is itself in every graph; its channels-last form may be padded to rank 4
            self.first[id(t)] = _permuted(self.last[id(t)], TO_FIRST) if id(t) in self.computed else t
        return self.first[id(t)]

    def as_last(self, t):
        """`t` (rank <= 4, broadcast against a 4-D tensor) channels-last: rank-4 first, then transposed."""
        if id(t) not in self.last:
            if t.ndim == 0:
                self.last[id(t)] = self.as_first(t)    # a scalar broadcasts the same in every layout
            elif t.is_constant:
                value = np.asarray(t.value).reshape((1,) * (4 - t.ndim) + t.shape)
                self.last[id(t)] = constant(np.ascontiguousarray(value.transpose(TO_LAST)), t.dtype)
            else:
                x = self.as_first(t)
                self.last[id(t)] = _permuted(reshape(x, (1,) * (4 - x.ndim) + x.shape), TO_LAST)
        return self.last[id(t)]


def _permuted(x, perm: tuple):
    """x transposed by `perm`; reshaped where its axes longer than 1 keep their order (a per-channel (1, C, 1, 1)
    operand, a global pool's (1, 1, 1, C)), which moves no data: no transpose kernel."""
    moved = [k for k in perm if x.shape[k] != 1]      # the axes longer than 1, in their new order
    if moved == sorted(moved):
        return reshape(x, tuple(x.shape[k] for k in perm))
    return transpose(x, perm)


def channels_last(graph: Graph) -> Graph:
    """The graph with its stacked 2-D convolutions (`_stacked`), and the pooling, concat and elementwise operators
    after them, channels-last (see the module docstring)."""
    stacked = _stacked(graph)
    if not stacked:
        return graph
    layouts = _Layouts()
    for op in graph.nodes:
        if id(op) in stacked or _pools_last(op, layouts.computed):
            inputs = [layouts.as_last(op.inputs[0])] + [layouts.as_first(t) for t in op.inputs[1:]]   # conv: weights
            results, into = type(op)(inputs, dict(op.attrs, channels_last=True)).outputs, layouts.last
        elif _reduces_spatial(op, layouts.computed):     # without keepdims, (N, C) in either layout
            results = Reduce([layouts.as_last(op.inputs[0])], dict(op.attrs, axes=(1, 2))).outputs
            into = layouts.last if op.attrs["keepdims"] else layouts.first
        elif _reduces_everything(op, layouts.computed):
            results, into = op.clone([layouts.as_last(op.inputs[0])]).outputs, layouts.first
        elif _pads_spatially(op, layouts.computed):     # (a pad's value, if a tensor, is one element)
            pads = op.attrs["pads"]
            inputs = [layouts.as_last(op.inputs[0])] + [layouts.as_first(t) for t in op.inputs[1:]]
            results = Pad(inputs, dict(op.attrs, pads=tuple(pads[k] for k in TO_LAST) +
                                       tuple(pads[4 + k] for k in TO_LAST))).outputs
            into = layouts.last
        elif _follows(op, layouts.computed):
            inputs = [layouts.as_last(t) for t in op.inputs]
            if isinstance(op, Concat):       # the same axis, where it now lies
                results = Concat(inputs, dict(op.attrs, axis=TO_LAST.index(op.attrs["axis"]))).outputs
            else:
                results = op.clone(inputs).outputs
            into = layouts.last
        else:
            inputs = [layouts.as_first(t) for t in op.inputs]
            same = all(a is b for a, b in zip(inputs, op.inputs))
            results, into = op.outputs if same else op.clone(inputs).outputs, layouts.first
        for old, new in zip(op.outputs, results):
            new.name = old.name
            into[id(old)] = new
            if into is layouts.last:
                layouts.computed.add(id(old))
    return Graph(graph.inputs, [layouts.as_first(t) for t in graph.outputs], name=graph.name)
