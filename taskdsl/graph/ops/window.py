"""Sliding-window arithmetic shared by convolution and pooling, on ints and on IR size expressions alike."""
from __future__ import annotations

import numpy as np

from stdlib_ops.elementwise import int_tuple

from ... import ir
from ...lang import math_expr

BIG = 1 << 30


class ChannelsLast:
    """For window operators over (N, C, spatial...) tensors that also take (N, spatial..., C): the
    `channels_last` attribute (False unless given; printed only when set) and the axes it moves."""

    def set_layout(self) -> None:
        """Default `channels_last` to False (call first thing in `check`)."""
        self.attrs["channels_last"] = bool(self.attrs.get("channels_last", False))

    def spatial_dims(self, shape: tuple) -> tuple:
        """The spatial dims of an input or output shape."""
        return tuple(shape[1:-1]) if self.attrs["channels_last"] else tuple(shape[2:])

    def channels(self, shape: tuple):
        """The channel dim of an input or output shape."""
        return shape[-1] if self.attrs["channels_last"] else shape[1]

    def split_index(self, ix: tuple) -> tuple:
        """(n, channel, spatial indices) of an output index."""
        return (ix[0], ix[-1], tuple(ix[1:-1])) if self.attrs["channels_last"] else (ix[0], ix[1], tuple(ix[2:]))

    def join_index(self, n, channel, spatial: tuple) -> tuple:
        """The index (or shape) of batch n, `channel` and the spatial indices, in this layout."""
        return (n, *spatial, channel) if self.attrs["channels_last"] else (n, channel, *spatial)

    def shown_attrs(self) -> dict:
        shown = super().shown_attrs()
        if not shown["channels_last"]:
            del shown["channels_last"]      # the default
        return shown


def pads_of(padding, rank: int) -> tuple:
    """(begin..., end...) pads from an int, one int per spatial axis, or (begin..., end...)."""
    if np.ndim(padding) == 0:
        return int_tuple(padding, "padding", 2 * rank)
    pads = int_tuple(padding, "padding")
    if len(pads) not in (rank, 2 * rank):
        raise ValueError(f"padding must be an integer, {rank} of them (one per spatial axis) or {2 * rank} "
                         f"(begin..., end...), got {padding!r}")
    return pads * 2 if len(pads) == rank else pads


def window_positions(n, k: int, stride: int, begin: int, end: int, dilation: int, ceil_mode: bool = False):
    """How many positions a window of `k` (dilated) takes with `stride` over an axis of `n` padded by begin/end.

    With ceil_mode the count rounds up, but the last window must start inside the input or its
    begin padding. `(x + BIG) // BIG` is [x >= 0] for |x| < BIG: a comparison written with + - * //
    only, so the result stays a size expression that kernels and `ir.evaluate_int` understand.
    """
    span = n + begin + end - (dilation * (k - 1) + 1)
    if not ceil_mode:
        return span // stride + 1
    out = (span + stride - 1) // stride + 1
    return out - ((out - 1) * stride - (n + begin) + BIG) // BIG


def positions_inside(start, k, dilation: int, lo, hi) -> ir.Expr:
    """How many of start, start + d, ..., start + (k-1)d lie in [lo, hi) (an IR expression)."""
    # the first in range: ceil((lo - start) / d), written as -floor((start - lo) / d)
    first = math_expr("max", [ir.const(0), ir.binary("-", 0, ir.binary("//", start - lo, dilation))])
    last = math_expr("min", [ir.as_expr(k - 1), ir.binary("//", hi - 1 - start, dilation)])
    return math_expr("max", [ir.const(0), last - first + 1])


def inside(index, n) -> ir.Expr:
    """0 <= index < n."""
    return ir.binary("and", index >= 0, index < n)


def window_input(out_ix: tuple, win_ix: tuple, strides, pads, dilations, in_dims: tuple) -> tuple:
    """(input positions, whether all are inside the input) of window element `win_ix` of output `out_ix`.

    Positions are out * stride - pad_begin + k * dilation per spatial axis; pads are (begin..., end...).
    """
    positions, ok = [], None
    for i, (o, k, n) in enumerate(zip(out_ix, win_ix, in_dims)):
        h = o * strides[i] - pads[i] + k * dilations[i]
        positions.append(h)
        ok = inside(h, n) if ok is None else ir.binary("and", ok, inside(h, n))
    return tuple(positions), ok
