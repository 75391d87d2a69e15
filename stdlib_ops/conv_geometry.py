"""The sizes of a convolution and what its GEMM and direct lowerings (`conv`, `conv_direct`) both take from them.

`ConvGeometry` (validated by `geometry`) with the input's shape in its layout; the scalar arguments of the
generic conv kernels (`window_scalars`); the output columns whose tap lies inside an input row, found without a
division per tap (`first_inside`, `end_inside`, which the pooling kernels use too); and which grouped
convolutions have reductions too tiny for a GEMM (`uses_direct`).
"""
from dataclasses import dataclass

import numpy as np

import taskdsl as td

from .elementwise import int_tuple

DIRECT_MAX_REDUCTION = 32     # grouped convs with per-output reductions up to this use the direct (reduce) schedule


@dataclass(frozen=True)
class ConvGeometry:
    """Sizes of one convolution; padding is (top, left, bottom, right)."""

    n: int
    c: int
    h: int
    w: int
    oc: int
    kh: int
    kw: int
    stride: tuple
    padding: tuple
    dilation: tuple
    groups: int
    layout: str

    @property
    def oh(self) -> int:
        return (self.h + self.padding[0] + self.padding[2] - self.dilation[0] * (self.kh - 1) - 1) // self.stride[0] + 1

    @property
    def ow(self) -> int:
        return (self.w + self.padding[1] + self.padding[3] - self.dilation[1] * (self.kw - 1) - 1) // self.stride[1] + 1

    @property
    def out_shape(self) -> tuple:
        if self.layout == "NCHW":
            return (self.n, self.oc, self.oh, self.ow)
        return (self.n, self.oh, self.ow, self.oc)

    @property
    def gemm(self) -> tuple:
        """(G, M, K, N) of the GEMM view."""
        g = self.groups
        return g, self.n * self.oh * self.ow, self.c // g * self.kh * self.kw, self.oc // g


def geometry(x_shape, w_shape, stride=1, padding=0, dilation=1, groups=1, layout="NCHW") -> ConvGeometry:
    """Validate a convolution's arguments (clear ValueErrors) and return its sizes."""
    if layout not in ("NCHW", "NHWC"):
        raise ValueError(f"conv2d: layout must be 'NCHW' or 'NHWC', got {layout!r}")
    if len(x_shape) != 4 or len(w_shape) != 4:
        raise ValueError(f"conv2d needs a 4-D input and a 4-D OIHW weight, got {tuple(x_shape)} and {tuple(w_shape)}")
    # Python ints: numpy ones would key the geometry's tuning record apart (`repr`)
    x_shape, w_shape = int_tuple(x_shape, "conv2d: shapes"), int_tuple(w_shape, "conv2d: shapes")
    n, c, h, w = x_shape if layout == "NCHW" else (x_shape[0], x_shape[3], x_shape[1], x_shape[2])
    oc, cg, kh, kw = w_shape
    groups = _groups(groups, c, oc)
    if cg != c // groups:
        raise ValueError(f"conv2d: {c} input channels in {groups} group(s) need a weight of shape "
                         f"({oc}, {c // groups}, KH, KW) (OIHW, whatever the layout), got {tuple(w_shape)}")
    if kh < 1 or kw < 1:
        raise ValueError(f"conv2d: the kernel must be at least 1x1, got a weight of shape {tuple(w_shape)}")
    pad = int_tuple(padding, "conv2d: padding")
    if np.ndim(padding) == 0:
        pad = pad * 4
    elif len(pad) == 2:
        pad = (pad[0], pad[1], pad[0], pad[1])
    if len(pad) != 4 or min(pad) < 0:
        raise ValueError("conv2d: padding must be an int, (ph, pw) or (top, left, bottom, right) >= 0, "
                         f"got {padding!r}")
    g = ConvGeometry(n, c, h, w, oc, kh, kw, int_tuple(stride, "conv2d: stride", 2), pad,
                     int_tuple(dilation, "conv2d: dilation", 2), groups, layout)
    if min(g.stride + g.dilation) < 1:
        raise ValueError(f"conv2d: stride and dilation must be >= 1, got stride={stride!r}, dilation={dilation!r}")
    if g.oh < 1 or g.ow < 1:
        raise ValueError(f"conv2d: the kernel ({kh}x{kw}, dilation {g.dilation}) is larger than the padded input "
                         f"({h}x{w} with padding {g.padding})")
    return g


def _groups(groups, c: int, oc: int) -> int:
    """`groups` as a Python int that divides both channel counts (a TypeError or ValueError saying what to pass)."""
    if np.ndim(groups) != 0:      # int_tuple would take a one-item sequence
        raise TypeError(f"conv2d: groups must be an integer, got {groups!r}")
    groups, = int_tuple(groups, "conv2d: groups", 1)
    if groups < 1 or c % groups or oc % groups:
        raise ValueError(f"conv2d: groups must be >= 1 and divide both the {c} input channels and the {oc} output "
                         f"channels (the weight's first axis), got groups={groups}")
    return groups


def input_shape(g: ConvGeometry) -> tuple:
    """The shape of convolution `g`'s input, in its layout."""
    return (g.n, g.c, g.h, g.w) if g.layout == "NCHW" else (g.n, g.h, g.w, g.c)


@td.func
def first_inside(offset, stride, count):
    """The first j >= 0 whose input column j * stride + offset is >= 0 (no division for stride 1), at most `count`
    (past the last of `count` outputs: a window tap left of the input by more than the row, with dilation, made
    the im2col zero-fill run into the next row, which another block was writing)."""
    return td.min(count, td.max(0, -offset) if stride == 1 else td.max(0, -(offset // stride)))


@td.func
def end_inside(offset, stride, count, width, first):
    """One past the last j < count whose input column j * stride + offset is < width; at least `first`."""
    return td.min(count, td.max(first, width - offset if stride == 1 else -((offset - width) // stride)))


def window_scalars(g: ConvGeometry) -> dict:
    """Stride, top/left padding and dilation: the scalar arguments every generic conv kernel takes."""
    return dict(conv_sh=g.stride[0], conv_sw=g.stride[1], conv_pt=g.padding[0], conv_pl=g.padding[1],
                conv_dh=g.dilation[0], conv_dw=g.dilation[1])


def uses_direct(g: ConvGeometry) -> bool:
    """Whether `g` is a direct convolution, no GEMM: a grouped (depthwise) convolution with a tiny
    reduction per output, where each group's GEMM would be a few rows. Ungrouped convolutions always take the
    matmul template, whose short-k GEMM beats a thread-per-output reduce by far (MobileNet-V2's 1x1
    convolutions over 16-32 channels: 2 GFLOP/s as reductions)."""
    return g.groups > 1 and g.gemm[2] <= DIRECT_MAX_REDUCTION
