"""The cpu's direct ("rows") convolutions: grouped ones and depthwise ones (`on_rows`).

No GEMM: one block per output channel or row accumulates its outputs in registers, tap by tap, and stores
them once, where a fused epilogue applies. NCHW convolutions run `direct_kernel` row by row, or
`plane_kernel` over phase planes where the padded input plane fits a local buffer (`grouped_plane_kernel` where
a group's input planes fit one, several output channels at once); a plain depthwise NHWC one
runs `depthwise_nhwc_kernel`, built for its geometry, other grouped NHWC ones `direct_nhwc_kernel`.
`lower_rows` fuses a prologue and an epilogue into them (`DirectRows`); 8-bit integers run on them as f32
where each output's sum is exact (`rows_sum_exactly`).
"""
import functools
from dataclasses import dataclass

import numpy as np

import taskdsl as td
from taskdsl import blockIdx
from taskdsl.ir.types import numpy_dtype
from taskdsl.runtime.config import fast_compile_enabled

from . import gemm as mm
from .conv_geometry import ConvGeometry, end_inside, first_inside, input_shape, uses_direct, window_scalars

DIRECT_CHUNK = 64           # output columns a direct-conv block accumulates in registers at once


@functools.lru_cache(maxsize=8)
def direct_kernel(dtype) -> td.Kernel:
    """A grouped NCHW convolution with a tiny reduction per output (depthwise), row by row.

    One block per (output channel, image). For each output row, a chunk of DIRECT_CHUNK columns
    accumulates in registers, tap by tap: for tap (c, kh, kw) the columns whose input pixel is
    inside the row are found first, so the multiply-add over them has no bounds checks (for
    stride 1, a vectorized loop over contiguous inputs). A row outside the input is skipped
    whole. The chunk is then stored once, where a fused epilogue (bias, activation) applies.
    The geometry comes in as scalars: one compile serves every convolution. A channel with an
    inf or NaN weight also adds what the skipped taps would, w * 0 (NaN), to the outputs they
    reach, as im2col's zeros do: found once per block, so finite weights skip it for free.
    """
    @td.kernel(grid=lambda O, N: (O, N), block=1, name=f"conv_direct_rows_{dtype.name}")
    def conv_direct_rows(X: dtype["N", "C", "H", "W"], Wt: dtype["O", "CG", "KH", "KW"],
                         Y: dtype["N", "O", "OH", "OW"], conv_sh: td.i32, conv_sw: td.i32, conv_pt: td.i32,
                         conv_pl: td.i32, conv_dh: td.i32, conv_dw: td.i32, conv_ocg: td.i32):
        o, n = blockIdx.x, blockIdx.y
        acc = td.registers(td.f32, DIRECT_CHUNK)
        group_base = o // conv_ocg * CG             # the group's first input channel
        poisoned = False                            # whether a weight of the channel is inf or NaN (w * 0 is NaN)
        for c in range(CG):
            for kh in range(KH):
                for kw in range(KW):
                    if Wt[o, c, kh, kw] * 0.0 != 0.0:
                        poisoned = True
        for oh in range(OH):
            for start in range(0, OW, DIRECT_CHUNK):
                width = min(DIRECT_CHUNK, OW - start)
                for j in range(DIRECT_CHUNK):
                    acc[j] = 0.0
                for kw in range(KW):     # a column tap's range of outputs first: two divisions, not one a tap
                    offset = start * conv_sw + kw * conv_dw - conv_pl     # iw = j * stride + offset
                    first = first_inside(offset, conv_sw, width)
                    end = end_inside(offset, conv_sw, width, W, first)
                    for c in range(CG):
                        for kh in range(KH):
                            ih = oh * conv_sh - conv_pt + kh * conv_dh
                            if ih >= 0 and ih < H:
                                tap = Wt[o, c, kh, kw]
                                for j in range(first, end):
                                    acc[j] += tap * X[n, group_base + c, ih, j * conv_sw + offset]
                if poisoned:    # the taps skipped above times the zero padding: NaN where the weight is inf or NaN
                    for kw in range(KW):
                        offset = start * conv_sw + kw * conv_dw - conv_pl
                        first = first_inside(offset, conv_sw, width)
                        end = end_inside(offset, conv_sw, width, W, first)
                        for c in range(CG):
                            for kh in range(KH):
                                ih = oh * conv_sh - conv_pt + kh * conv_dh
                                inside = ih >= 0 and ih < H
                                padded = Wt[o, c, kh, kw] * 0.0
                                for j in range(first if inside else width):
                                    acc[j] += padded
                                for j in range(end if inside else width, width):
                                    acc[j] += padded
                for j in range(width):
                    Y[n, o, oh, start + j] = acc[j]

    return conv_direct_rows


PLANE = 16384               # floats of the phase planes `plane_kernel` copies its input to (the sums take as many)
STRIDED_PLANE = 4096        # a strided convolution's phase planes take at most this (see `uses_plane`)
COPY_RUN = mm.cpu.COPY_RUN  # input columns `plane_kernel` copies at once (a shorter row: one at a time)
SPAN_ALIGN = 64             # sums `plane_kernel` keeps in registers at once (4 AVX-512 vectors); its span's multiple


@td.func
def copy_phase_planes(X, buf, n, channel, at, hq, wq, height, width, conv_sh, conv_sw, conv_pt, conv_pl, conv_plane):
    """Channel `channel` of image n, zero-padded and split into its stride_h x stride_w phase planes (`plane_kernel`),
    into buf[at:at + conv_plane] (zeros past the planes)."""
    for j in range(conv_plane):
        buf[at + j] = 0.0
    for ph in range(conv_sh):
        for pw in range(conv_sw):
            base = at + (ph * conv_sw + pw) * hq * wq
            first = first_inside(pw - conv_pl, conv_sw, wq)      # the columns b whose input column
            end = end_inside(pw - conv_pl, conv_sw, wq, width, first)   # b*sw + pw - pl is in [0, width)
            for a in range(hq):
                h = a * conv_sh + ph - conv_pt
                if h >= 0 and h < height:
                    row, src = base + a * wq, pw - conv_pl
                    if end - first >= COPY_RUN:   # whole chunks (a constant trip count: vectorized), the
                        for step in range(first, end, COPY_RUN):      # last one overlapping the one before
                            b = min(step, end - COPY_RUN)
                            for l in range(COPY_RUN):
                                buf[row + b + l] = X[n, channel, h, (b + l) * conv_sw + src]
                    else:
                        for b in range(first, end):
                            buf[row + b] = X[n, channel, h, b * conv_sw + src]


@td.func
def tap_shift(kh, kw, conv_dh, conv_dw, conv_sh, conv_sw, hq, wq):
    """Where tap (kh, kw) reads the phase planes (`copy_phase_planes`) for the output at flat position 0: its phase
    plane's start plus its shift within that plane."""
    rh, rw = kh * conv_dh, kw * conv_dw
    return ((rh % conv_sh) * conv_sw + rw % conv_sw) * hq * wq + rh // conv_sh * wq + rw // conv_sw


@functools.lru_cache(maxsize=8)
def plane_kernel(dtype) -> td.Kernel:
    """`direct_kernel` for an NCHW depthwise convolution whose padded input fits a local buffer (`uses_plane`).

    Short rows make short loops: a 14x14 plane's taps are 14-element loops, mostly loop overhead, and a
    stride-2 tap reads every other input. So the block first splits its zero-padded input plane into
    stride_h x stride_w *phase planes* (phase (ph, pw) holds the padded pixels (a*sh + ph, b*sw + pw)),
    each Hq x Wq, in a local buffer; for stride 1 there is one, the padded plane itself. The outputs live
    on the same flat grid: output (oh, ow) is sum[oh * Wq + ow], and tap (kh, kw) reads one phase plane,
    shifted, for every output at once: sum[j] += w * phase[j + (kh*dh // sh) * Wq + kw*dw // sw], without
    bounds checks (the Wq - OW columns past each row are computed and dropped). The grid is swept
    SPAN_ALIGN sums at a time, held in registers over a run-time loop of all the taps (one load and one
    FMA per tap and vector). The sums are then compacted to OH x OW and stored by one flat loop: the fused
    epilogue vectorizes over the whole plane (over rows of 7 or 14 it ran scalar: 1.5x slower for 7x7
    planes). `conv_span`, `conv_plane`, `conv_out` and `conv_taps` (the flat output span, the phase
    planes' total size, OH * OW and KH * KW) stay runtime arguments, so those loops stay loops.
    """
    @td.kernel(grid=lambda O, N: (O, N), block=1, name=f"conv_direct_plane_{dtype.name}")
    def conv_direct_plane(X: dtype["N", "C", "H", "W"], Wt: dtype["O", "CG", "KH", "KW"],
                          Y: dtype["N", "O", "OH", "OW"], conv_sh: td.i32, conv_sw: td.i32, conv_pt: td.i32,
                          conv_pl: td.i32, conv_dh: td.i32, conv_dw: td.i32, conv_ocg: td.i32,
                          conv_span: td.i32, conv_plane: td.i32, conv_out: td.i32, conv_taps: td.i32):
        o, n = blockIdx.x, blockIdx.y
        buf = td.registers(td.f32, 2 * PLANE)     # the phase planes, then the sums (one allocation)
        hq = OH + (KH - 1) * conv_dh // conv_sh
        wq = OW + (KW - 1) * conv_dw // conv_sw
        copy_phase_planes(X, buf, n, o // conv_ocg, 0, hq, wq, H, W, conv_sh, conv_sw, conv_pt, conv_pl, conv_plane)
        acc = td.registers(td.f32, SPAN_ALIGN)
        for j0 in range(0, conv_span, SPAN_ALIGN):      # SPAN_ALIGN sums in registers over all the taps
            for l in range(SPAN_ALIGN):
                acc[l] = 0.0
            for t in range(conv_taps):
                kh, kw = t // KW, t % KW
                tap = Wt[o, 0, kh, kw]
                shift = tap_shift(kh, kw, conv_dh, conv_dw, conv_sh, conv_sw, hq, wq)
                for l in range(SPAN_ALIGN):
                    acc[l] += tap * buf[j0 + l + shift]
            for l in range(SPAN_ALIGN):
                buf[PLANE + j0 + l] = acc[l]
        for oh in range(OH):        # the sums, compacted to the output's layout in the phase planes' place
            for ow in range(OW):
                buf[oh * OW + ow] = buf[PLANE + oh * wq + ow]
        for j in range(conv_out):   # one flat loop, a fused epilogue's vectorized
            Y[n, o, j // OW, j % OW] = buf[j]

    return conv_direct_plane


def _phase_plane(g: ConvGeometry) -> tuple:
    """(Hq, Wq): the extent of each of `plane_kernel`'s stride_h x stride_w phase planes."""
    return (g.oh + (g.kh - 1) * g.dilation[0] // g.stride[0], g.ow + (g.kw - 1) * g.dilation[1] // g.stride[1])


def _plane_scalars(g: ConvGeometry) -> dict:
    """`plane_kernel`'s runtime extents: the flat output span, the phase planes' total size, the outputs and the
    taps."""
    hq, wq = _phase_plane(g)
    span = -(-((g.oh - 1) * wq + g.ow) // SPAN_ALIGN) * SPAN_ALIGN
    return dict(conv_span=span, conv_plane=g.stride[0] * g.stride[1] * hq * wq + SPAN_ALIGN, conv_out=g.oh * g.ow,
                conv_taps=g.kh * g.kw)


def uses_plane(g: ConvGeometry) -> bool:
    """Whether `plane_kernel` runs direct convolution `g`: NCHW, one input channel per output channel, and
    phase planes that fit its buffer; for a strided one, STRIDED_PLANE floats (splitting a bigger input
    into phases cost more than `direct_kernel`'s strided reads: 112x112 -> 56x56 took 319 us, not 211)."""
    limit = PLANE if g.stride == (1, 1) else STRIDED_PLANE
    return g.layout == "NCHW" and g.c == g.groups and _plane_scalars(g)["conv_plane"] <= limit


# Grouped NCHW convolutions of several channels a group (`uses_grouped_planes`: ResNeXt's, RegNet's, ShuffleNet's)
# are tiny GEMMs, one per group (ResNeXt's 3x3 of 8 channels a group: 8 x 72 weights by 72 x 784 columns), whose tiles
# ran half empty after an explicit im2col: (1, 256, 28, 28) at 32 groups took 1.1 ms, 2.5x onnxruntime's time, and
# (1, 64, 112, 112) at 16 groups 7.3 ms, 7.1x. `grouped_plane_kernel` copies the phase planes of its group's channels
# as `plane_kernel` copies one, then sums GROUP_OUTPUTS output channels at once, GROUP_LANES sums each: every vector
# of inputs loaded feeds that many multiply-adds. Those two took 0.20-0.23 and 0.39 ms so (docs/benchmarks.md,
# session 115); 64 sums a channel (16 vectors of sums) took 1.6-4x as long, 8 channels of 32 sums 2-10x.
GROUP_OUTPUTS = 4       # output channels a block sums at once (four weights, written out)
GROUP_LANES = 32        # sums of each output channel it keeps in registers: 8 AVX-512 vectors in all
GROUP_PLANES = 65536    # floats of the phase planes of a group's input channels (256 KiB: in a Zen 4 core's L2)
GROUP_SPAN = 16384      # sums each output channel keeps: its flat output span (112 x 114 fits)


@functools.lru_cache(maxsize=8)
def grouped_plane_kernel(dtype) -> td.Kernel:
    """A grouped NCHW convolution whose group's phase planes fit GROUP_PLANES: one block per (group, image), which
    copies the planes once and sums the group's output channels GROUP_OUTPUTS at a time. The geometry comes as
    `plane_kernel`'s scalars."""
    @td.kernel(grid=lambda O, N, conv_ocg: (O // conv_ocg, N), block=1, name=f"conv_grouped_plane_{dtype.name}")
    def conv_grouped_plane(X: dtype["N", "C", "H", "W"], Wt: dtype["O", "CG", "KH", "KW"],
                           Y: dtype["N", "O", "OH", "OW"], conv_sh: td.i32, conv_sw: td.i32, conv_pt: td.i32,
                           conv_pl: td.i32, conv_dh: td.i32, conv_dw: td.i32, conv_ocg: td.i32,
                           conv_span: td.i32, conv_plane: td.i32, conv_out: td.i32, conv_taps: td.i32):
        group, n = blockIdx.x, blockIdx.y
        planes = td.registers(td.f32, GROUP_PLANES)
        sums = td.registers(td.f32, (GROUP_OUTPUTS, GROUP_SPAN))
        acc = td.registers(td.f32, (GROUP_OUTPUTS, GROUP_LANES))
        hq = OH + (KH - 1) * conv_dh // conv_sh
        wq = OW + (KW - 1) * conv_dw // conv_sw
        for c in range(CG):
            copy_phase_planes(X, planes, n, group * CG + c, c * conv_plane, hq, wq, H, W, conv_sh, conv_sw, conv_pt,
                              conv_pl, conv_plane)
        for o0 in range(group * conv_ocg, (group + 1) * conv_ocg, GROUP_OUTPUTS):
            count = min(GROUP_OUTPUTS, (group + 1) * conv_ocg - o0)
            for j0 in range(0, conv_span, GROUP_LANES):      # GROUP_OUTPUTS x GROUP_LANES sums over all the taps
                for b in range(GROUP_OUTPUTS):
                    for l in range(GROUP_LANES):
                        acc[b, l] = 0.0
                for c in range(CG):
                    for t in range(conv_taps):
                        kh, kw = t // KW, t % KW
                        shift = c * conv_plane + tap_shift(kh, kw, conv_dh, conv_dw, conv_sh, conv_sw, hq, wq)
                        # the chunk's weights (past the group's last channel, that one's again: its sums are dropped)
                        w0 = Wt[o0, c, kh, kw]
                        w1 = Wt[o0 + min(1, count - 1), c, kh, kw]
                        w2 = Wt[o0 + min(2, count - 1), c, kh, kw]
                        w3 = Wt[o0 + min(3, count - 1), c, kh, kw]
                        for l in range(GROUP_LANES):
                            value = planes[j0 + l + shift]
                            acc[0, l] += w0 * value
                            acc[1, l] += w1 * value
                            acc[2, l] += w2 * value
                            acc[3, l] += w3 * value
                for b in range(GROUP_OUTPUTS):
                    for l in range(GROUP_LANES):
                        sums[b, j0 + l] = acc[b, l]
            for b in range(count):
                for oh in range(OH):        # the sums compacted to the output's layout, in place (forwards)
                    for ow in range(OW):
                        sums[b, oh * OW + ow] = sums[b, oh * wq + ow]
                for j in range(conv_out):   # one flat loop, a fused epilogue's vectorized
                    Y[n, o0 + b, j // OW, j % OW] = sums[b, j]

    return conv_grouped_plane


def uses_grouped_planes(g: ConvGeometry) -> bool:
    """Whether `grouped_plane_kernel` runs convolution `g`: NCHW, grouped, several input channels a group, whose
    phase planes fit GROUP_PLANES and flat output span GROUP_SPAN."""
    if g.layout != "NCHW" or not 1 < g.groups < g.c:
        return False
    scalars = _plane_scalars(g)
    return g.c // g.groups * scalars["conv_plane"] <= GROUP_PLANES and scalars["conv_span"] <= GROUP_SPAN


@functools.lru_cache(maxsize=8)
def direct_nhwc_kernel(dtype) -> td.Kernel:
    """`direct_kernel` for NHWC (a plain depthwise convolution runs `depthwise_nhwc_kernel`): one block per
    (output row, image); for each output pixel a chunk of DIRECT_CHUNK output channels accumulates in registers
    over the taps inside the input. The weights come packed as (KH, KW, CG, O), so a tap's weights for
    consecutive channels are contiguous. Unlike `direct_kernel` it skips the taps in the padding even for an inf
    or NaN weight (whose product with the zero padding is NaN on the other routes): it has no pass adding w * 0
    for them, as `direct_kernel` has."""
    @td.kernel(grid=lambda OH, N: (OH, N), block=1, name=f"conv_direct_nhwc_{dtype.name}")
    def conv_direct_pixels(X: dtype["N", "H", "W", "C"], Wt: dtype["KH", "KW", "CG", "O"],
                           Y: dtype["N", "OH", "OW", "O"], conv_sh: td.i32, conv_sw: td.i32, conv_pt: td.i32,
                           conv_pl: td.i32, conv_dh: td.i32, conv_dw: td.i32, conv_ocg: td.i32):
        oh, n = blockIdx.x, blockIdx.y
        acc = td.registers(td.f32, DIRECT_CHUNK)
        for ow in range(OW):
            for start in range(0, O, DIRECT_CHUNK):
                width = min(DIRECT_CHUNK, O - start)
                for j in range(DIRECT_CHUNK):
                    acc[j] = 0.0
                for kh in range(KH):
                    ih = oh * conv_sh - conv_pt + kh * conv_dh
                    for kw in range(KW):
                        iw = ow * conv_sw - conv_pl + kw * conv_dw
                        if ih >= 0 and ih < H and iw >= 0 and iw < W:
                            for c in range(CG):
                                for j in range(width):
                                    ci = (start + j) // conv_ocg * CG + c
                                    acc[j] += Wt[kh, kw, c, start + j] * X[n, ih, iw, ci]
                for j in range(width):
                    Y[n, oh, ow, start + j] = acc[j]

    return conv_direct_pixels


DEPTHWISE_PIXELS = 4        # output pixels `depthwise_nhwc_kernel` sums at once (2, 3, 5, 6 or 8 were slower)
DEPTHWISE_TAPS = 9          # taps of the biggest window whose taps it unrolls all (3x3); a bigger one's, row by row
ROW_BUFFER = 4096           # floats of the sums `depthwise_nhwc_kernel` keeps for its pixels' channels


def whole_window(g: ConvGeometry) -> bool:
    """Whether `depthwise_nhwc_kernel` unrolls all of `g`'s taps (3x3 and smaller) where they lie inside the
    input, or a window row's everywhere."""
    return g.kh * g.kw <= DEPTHWISE_TAPS


@td.func
def add_tap(sums, X, n, row, row_inside, w, cols, inside, kw, c, pixels):
    """sums[p] += w * X[n, row, cols[kw * pixels + p], c] for each of the `pixels`, or w * 0 where the tap lies
    outside the input (`row_inside`, `inside[kw * pixels + p]`; `row` and `cols` are clamped into it)."""
    for p in range(pixels):
        x = X[n, row, cols[kw * pixels + p], c]
        sums[p] += w * (x if row_inside and inside[kw * pixels + p] != 0 else 0.0)


@td.func
def add_inner_tap(sums, X, n, ih, w, first_iw, conv_sw, c, pixels):
    """sums[p] += w * X[n, ih, first_iw + p * conv_sw, c] for each of the `pixels`, all inside the input."""
    for p in range(pixels):
        sums[p] += w * X[n, ih, first_iw + p * conv_sw, c]


@functools.lru_cache(maxsize=32)
def depthwise_nhwc_kernel(dtype, whole: bool, compact: bool, window_width: int) -> td.Kernel:
    """A plain depthwise NHWC convolution (one input channel per output channel), for a geometry built in (`fuse`
    with its scalars as constants): one block per (output row, image), DEPTHWISE_PIXELS output pixels at a time.

    The loop over channels is the one LLVM vectorizes. Where the pixels' windows lie inside the input and the
    window is `whole` (3x3 or smaller), it sums each channel's taps unrolled, in registers, one independent
    chain of FMAs per pixel, each tap's weight loaded once for all of them. At the borders, and for a bigger
    window, it sums the taps of a window row, adding to the sums of the rows before, kept in a local buffer; a
    tap in the padding reads a clamped pixel and adds w * 0, as the zero padding gives it (NaN for an inf or NaN
    weight, as on the other routes), and the last group of pixels repeats the row's last pixel; each tap's clamped
    column and bounds test per pixel are computed once per group of pixels, before the rows' loops (in registers:
    `window_width`, the window's width, sizes them): computed at each tap of each channel, they gave LLVM the
    same loop to make, from 5% more code for numba to type and lower (192 channels at 28x28: 1.11 -> 1.05 s, the
    median of 16 compiles in one process). The sums go to
    the local buffer, and a second loop stores them to the output, where a fused epilogue applies: so the loop
    over channels stores to no tensor that might overlap its inputs (on the output, 36 tap loads made too many
    run-time overlap checks for LLVM, which left the loop scalar).

    The borders once ran the unrolled window too, with each tap's bounds test: LLVM turned the 36 selects into
    branches inside the vector loop, with every loaded vector spilled to the stack. With no bounds tests inside and
    window rows at the borders (two threads, session 61): 768 channels at 17x17 0.123 -> 0.076 ms, 192 at 35x35 0.074
    -> 0.056 (Inception-V3's average pools), 2048 at 8x8 0.063 -> 0.041, 96 at 112x112 stride 2 0.100 ->
    0.085; and a geometry compiles in 1.3 s, not 1.8. Summing a tap at a time over a row's pixels into a buffer
    instead (3 loads and a store per FMA) took, on one thread: 144 channels at 56x56 0.44 ms (0.14 with the
    unrolled window), 960 at 7x7 0.051 (0.035), a 7x7 window over 96 at 28x28 0.38 (0.13); 32 channels at
    112x112 took 0.58 ms over flat rows (`flat_depthwise_kernel`, removed), 0.17 with the unrolled window.

    `compact` (`td.fast_compile`, where the IR's loops stay loops) sums the inner pixels that way all the same,
    a tap at a time over a pixel's channels into the buffer: -O1 vectorizes that loop, and not a loop over
    channels holding the window's loops (MobileNet-V2's depthwise layers under fast compile: 5.05 -> 2.04 ms,
    0.95 optimized)."""
    @td.kernel(grid=lambda OH, N: (OH, N), block=1, name=f"conv_depthwise_nhwc_{dtype.name}")
    def conv_depthwise_pixels(X: dtype["N", "H", "W", "C"], Wt: dtype["KH", "KW", "CG", "C"],
                              Y: dtype["N", "OH", "OW", "C"], conv_sh: td.i32, conv_sw: td.i32, conv_pt: td.i32,
                              conv_pl: td.i32, conv_dh: td.i32, conv_dw: td.i32):
        oh, n = blockIdx.x, blockIdx.y
        pixels = DEPTHWISE_PIXELS
        sums = td.registers(td.f32, pixels)
        buffer = td.registers(td.f32, ROW_BUFFER)
        cols = td.registers(td.i32, window_width * pixels)      # the border taps' input columns, clamped,
        inside = td.registers(td.i32, window_width * pixels)    # and whether each lies inside the input
        span = td.min(C, ROW_BUFFER // pixels)          # channels a piece sums at once
        for ow0 in range(0, OW, pixels):
            last = OW - 1 - ow0                         # pixels past it repeat it
            inner = (oh * conv_sh - conv_pt >= 0 and oh * conv_sh - conv_pt + (KH - 1) * conv_dh < H    # all the
                     and ow0 * conv_sw - conv_pl >= 0 and ow0 + pixels <= OW                            # pixels'
                     and (ow0 + pixels - 1) * conv_sw - conv_pl + (KW - 1) * conv_dw < W)               # taps inside
            for piece in range(td.cdiv(C, span)):
                c0 = piece * span
                width = td.min(span, C - c0)
                if whole and inner and compact:
                    for j in range(pixels * span):
                        buffer[j] = 0.0
                    for kh in range(KH):
                        for kw in range(KW):
                            for p in range(pixels):
                                ih = oh * conv_sh - conv_pt + kh * conv_dh
                                iw = ow0 * conv_sw - conv_pl + kw * conv_dw + p * conv_sw
                                for c in range(width):
                                    buffer[p * span + c] += Wt[kh, kw, 0, c0 + c] * X[n, ih, iw, c0 + c]
                elif whole and inner and not compact:     # (`not compact`: no dead copy in the fast kernel,
                    for c in range(c0, c0 + width):       # which numba would compile all the same)
                        for p in range(pixels):
                            sums[p] = 0.0
                        for kh in td.unroll(KH):
                            for kw in td.unroll(KW):
                                add_inner_tap(sums, X, n, oh * conv_sh - conv_pt + kh * conv_dh, Wt[kh, kw, 0, c],
                                              ow0 * conv_sw - conv_pl + kw * conv_dw, conv_sw, c, pixels)
                        for p in range(pixels):
                            buffer[p * span + c - c0] = sums[p]
                else:
                    for j in range(pixels * span):
                        buffer[j] = 0.0
                    for kw in td.unroll(KW):        # each tap's input column for each pixel, clamped into the
                        for p in range(pixels):     # input, and whether it lies inside (the same every row)
                            iw = ow0 * conv_sw - conv_pl + kw * conv_dw + td.min(p, last) * conv_sw
                            cols[kw * pixels + p] = td.min(td.max(iw, 0), W - 1)
                            inside[kw * pixels + p] = iw >= 0 and iw < W
                    for kh in range(KH):
                        ih = oh * conv_sh - conv_pt + kh * conv_dh
                        row, row_inside = td.min(td.max(ih, 0), H - 1), ih >= 0 and ih < H
                        for c in range(c0, c0 + width):
                            for p in range(pixels):
                                sums[p] = buffer[p * span + c - c0]
                            for kw in td.unroll(KW):
                                add_tap(sums, X, n, row, row_inside, Wt[kh, kw, 0, c], cols, inside, kw, c, pixels)
                            for p in range(pixels):
                                buffer[p * span + c - c0] = sums[p]
                for p in range(td.min(pixels, OW - ow0)):     # each pixel once (a fused epilogue may read
                    for c in range(width):                      # the element it stores: `td.in_place`)
                        Y[n, oh, ow0 + p, c0 + c] = buffer[p * span + c]

    return conv_depthwise_pixels


def _direct_scalars(g: ConvGeometry) -> dict:
    return dict(**window_scalars(g), conv_ocg=g.oc // g.groups)


def on_rows(g: ConvGeometry, target: str) -> bool:
    """Whether `direct_kernel` (NCHW) or `direct_nhwc_kernel` runs the convolution on the cpu: a direct one
    (`uses_direct`), or a depthwise one (one input channel a group) of any window, whose GEMMs would be a
    column or two wide: a 7x7 depthwise layer of 96 channels at 28x28 took 2.4 ms (NCHW) and 6.9 ms (NHWC) on
    columns, 0.20 and 0.76 ms direct; or a grouped one `grouped_plane_kernel` takes. (GPUs keep the
    rule-scheduled reduce of `uses_direct`, whose threads share a row's work, and the template for the rest.)"""
    return target == "cpu" and (uses_direct(g) or g.groups == g.c > 1 or uses_grouped_planes(g))


def rows_sum_exactly(g: ConvGeometry, target: str, dtype, b_dtype=None) -> bool:
    """Whether the cpu's direct kernels (`on_rows`) run convolution `g` of `dtype` operands: floats, or 8-bit
    integers (as f32, widened in the loads and converted to i32 in the stores) whose outputs sum at most
    `gemm.exact_k` products, exact in f32. As a reduce summing in i32, a 3x3 depthwise ConvInteger over 144 channels
    at 56x56 took 3.7-4.3 ms, on the rows 0.4-0.7 ms."""
    if not on_rows(g, target):
        return False
    return dtype.is_float or g.c // g.groups * g.kh * g.kw <= mm.exact_k(dtype, b_dtype)


@dataclass(frozen=True)
class DirectRows:
    """A direct convolution as `direct_kernel` / `direct_nhwc_kernel`, its prologue and epilogue fused.
    `run` as `Lowered.run`."""

    geometry: ConvGeometry
    kernel: td.Kernel
    x_name: str | None          # the input's placeholder, when the input is one (no prologue)
    output: str                 # the kernel's output parameter: Y, or the fused epilogue's output

    def weight_operand(self, weight: np.ndarray) -> np.ndarray:
        """The OIHW weights as the kernel reads them: as they are (NCHW), (KH, KW, CG, O) for NHWC; in the kernel's
        type (8-bit integers' as f32)."""
        weight = weight.transpose(2, 3, 1, 0) if self.geometry.layout == "NHWC" else weight
        return np.ascontiguousarray(weight, numpy_dtype(dict(self.kernel.params)["Wt"].dtype))

    @functools.cached_property
    def _call(self) -> tuple:
        """The generic kernel's geometry scalars (a fused kernel has them built in) and its parameter names."""
        return (dict(**_direct_scalars(self.geometry), **_plane_scalars(self.geometry)),
                [name for name, _ in self.kernel.params])

    def run(self, arrays: dict, weight: np.ndarray, out: np.ndarray) -> None:
        """out = the convolution (with its fused prologue and epilogue) of `arrays` and the weight operand."""
        scalars, names = self._call
        args = dict(arrays, Wt=weight, **scalars)
        args[self.output] = out
        if self.x_name is not None:
            x = arrays[self.x_name]
            args["X"] = x
        self.kernel(*[args[name] for name in names])

    @property
    def kernels(self) -> list:
        return [self.kernel]


def lower_rows(g: ConvGeometry, dtype, x: td.Tensor, epilogue) -> DirectRows:
    """The layout's direct kernel with `x`'s definition in its loads (unless a placeholder) and `epilogue`
    in its stores. A plain depthwise NHWC convolution's kernel is always built for its geometry: its taps unroll."""
    y = td.placeholder("Y", dtype, g.out_shape)
    z = epilogue(y)
    x_name = x.name if x.kind == "placeholder" else None
    nchw = g.layout == "NCHW"
    grouped = uses_grouped_planes(g)
    plane = grouped or uses_plane(g)
    depthwise = not nchw and g.groups == g.c == g.oc
    if depthwise:
        kernel = depthwise_nhwc_kernel(dtype, whole_window(g), fast_compile_enabled(), g.kw)
        scalars = window_scalars(g)
    else:
        kernel = (grouped_plane_kernel(dtype) if grouped else plane_kernel(dtype) if plane else direct_kernel(dtype)
                  if nchw else direct_nhwc_kernel(dtype))
        scalars = _direct_scalars(g)
    # The generic kernels serve every geometry with one compile (under td.fast_compile, as the tests build them),
    # but fusion, and an optimized build, specialize them to the geometry's scalars: with a constant stride, a row's
    # taps are unit-stride loops that vectorize (a 3x3 depthwise convolution without a bias to fuse ran 3-5x slower).
    if depthwise or z is not y or x_name is None or not fast_compile_enabled():
        w_shape = (g.oc, g.c // g.groups, g.kh, g.kw) if nchw else (g.kh, g.kw, g.c // g.groups, g.oc)
        examples = [np.empty(s, dtype.numpy) for s in (input_shape(g), w_shape, g.out_shape)]
        extents = _plane_scalars(g) if plane else {}
        kernel = td.fuse(kernel, *examples, *scalars.values(), *extents.values(), prologues={} if x_name else {"X": x},
                         epilogues={"Y": z} if z is not y else {}, constants=tuple(scalars))
    return DirectRows(g, kernel, x_name, "Y" if z is y else z.name)
