"""Graph passes, in the order `optimize` runs them. A pass is a function Graph -> Graph.

    infer_shapes -> fold_constants -> fold_batch_norm -> eliminate_dead_code -> avg_pool_as_conv
        -> crop_padding_taps -> recognize_norms -> drop_exact_round_trips -> expand_powers -> fuse_elementwise
        -> partition

`crop_padding_taps` crops a convolution's edge taps that read only padding (an atrous convolution over a small map);
`recognize_norms` makes a layer or RMS norm written out in reductions and elementwise operators one
LayerNorm; `drop_exact_round_trips` replaces a float cast to an integer type and back where the value already is
such an integer (a quantize-dequantize pair); `expand_powers` writes a power by a constant 2 or 3 as products;
`fuse_elementwise` makes each connected group of elementwise
operators one operator (one kernel); `partition` (taskdsl/graph/fusion.py) replaces each anchor and the
injective operators around it by one FusedAnchor node (one kernel, by post-scheduling fusion).
`channels_last` (optional: `pipeline(channels_last=True)`, `g.compile(channels_last=True)`)
runs 2-D convolution stacks in NHWC, after batch norms are folded into NCHW weights.
`plan_memory` is an analysis of the final graph, which the
executor runs after the pipeline.
"""
from __future__ import annotations

from ..graph import Graph
from .avg_pool_as_conv import avg_pool_as_conv
from .channels_last import channels_last
from .crop_padding_taps import crop_padding_taps
from .eliminate_dead_code import eliminate_dead_code
from .exact_round_trips import drop_exact_round_trips
from .expand_powers import expand_powers
from .fold_batch_norm import fold_batch_norm
from .fold_constants import constant_value, fold_constants
from .fuse_elementwise import fuse_elementwise
from .infer_shapes import infer_shapes
from .plan_memory import MemoryPlan, plan_memory
from .recognize_norms import recognize_norms

from ..fusion import partition  # noqa: E402 - after the passes it builds on

LAYOUT_PASS = channels_last       # (named apart: `pipeline`'s flag shares the pass's name)
PIPELINE = [infer_shapes, fold_constants, fold_batch_norm, eliminate_dead_code, avg_pool_as_conv, crop_padding_taps,
            recognize_norms, drop_exact_round_trips, expand_powers, fuse_elementwise, partition]


def pipeline(channels_last: bool = False) -> list:
    """The default passes; with `channels_last`, the layout pass too (after fold_batch_norm)."""
    if not channels_last:
        return list(PIPELINE)
    k = PIPELINE.index(eliminate_dead_code)
    return PIPELINE[:k] + [LAYOUT_PASS] + PIPELINE[k:]


def optimize(graph: Graph, passes: list | None = None) -> Graph:
    """The graph after each pass of `passes` (default: PIPELINE), in order."""
    for graph_pass in PIPELINE if passes is None else passes:
        graph = graph_pass(graph)
    return graph


__all__ = ["PIPELINE", "pipeline", "optimize", "channels_last", "avg_pool_as_conv", "crop_padding_taps", "infer_shapes",
           "fold_constants", "constant_value", "fold_batch_norm", "eliminate_dead_code", "recognize_norms",
           "drop_exact_round_trips", "expand_powers", "fuse_elementwise", "plan_memory", "MemoryPlan", "partition"]
