"""2-d pooling on NCHW arrays as reductions over the window: max_pool2d, avg_pool2d, global_avg_pool2d.

    from stdlib_ops import max_pool2d, avg_pool2d
    y = max_pool2d(x, 3, stride=2, padding=1)
    z = avg_pool2d(x, 2, count_include_pad=False)

A pooled element is a `td.reduce` over the (KH, KW) window whose body reads the input
through a bounds check (padding is -inf for max, 0 for average). Window, stride, padding
and the input shape are compile-time constants of the op (one compile per shape): with
constant sizes, splitting each output's index into (n, c, oh, ow) is a multiply and shift
instead of a 64-bit division. Semantics follow PyTorch (floor mode, padding at most half the
window; avg divides by KH*KW, or with count_include_pad=False by the number of window
elements inside the input).

On the cpu, f32 max and average pooling run `rows_kernel` instead: one block per (channel, image)
keeps a chunk of an output row's running maxima (sums) in registers, window tap by window tap, over
whole chunks of the columns whose window lies inside the row (no bounds checks, a constant trip count);
the edges' columns go one at a time. `pool_rows` gives the graph layer the same kernel with
the layer's window built in (ResNet-50's max pool: 1.7 ms as a reduce; a 3x3 average pool of
(1, 64, 112, 112) 6.6 ms as a reduce, 17x onnxruntime's time).
"""
from __future__ import annotations

import functools
import math

import numpy as np

import taskdsl as td
from taskdsl import blockIdx, ir
from taskdsl.ir.types import is_float_dtype
from taskdsl.runtime.arrays import as_array
from taskdsl.runtime.config import fast_compile_enabled, get_target

from . import reduce as _reduce
from .conv_geometry import end_inside, first_inside
from .elementwise import Plan, cached_op, contiguous, flag, int_tuple, tdtype

__all__ = ["avg_pool2d", "global_avg_pool2d", "max_pool2d"]


def _pool_op(kind: str, kernel: tuple, stride: tuple, padding: tuple, include_pad: bool, dtype,
             shape: tuple, out_hw: tuple) -> td.Op:
    (kh, kw), (sh, sw), (ph, pw) = kernel, stride, padding
    acc = td.f64 if dtype == td.f64 else td.f32
    x = td.placeholder("x", dtype, shape)
    height, width = shape[2:]

    def window(oh, ow, r, s):
        h, w = oh * sh - ph + r, ow * sw - pw + s
        inside = ir.binary("and", ir.binary("and", h >= 0, h < height), ir.binary("and", w >= 0, w < width))
        return h, w, inside

    if kind == "max":
        def body(n, c, oh, ow, r, s):
            h, w, inside = window(oh, ow, r, s)
            return ir.Select(inside, ir.convert(x[n, c, h, w], acc), ir.const(-math.inf, acc), acc)
        op = "max"
    elif include_pad:
        def body(n, c, oh, ow, r, s):
            h, w, inside = window(oh, ow, r, s)
            return ir.Select(inside, ir.convert(x[n, c, h, w], acc), ir.const(0.0, acc), acc)
        op = "mean"
    else:
        def body(n, c, oh, ow, r, s):
            h, w, inside = window(oh, ow, r, s)
            h0, w0 = oh * sh - ph, ow * sw - pw
            rows = td.min(h0 + kh, height) - td.max(h0, 0)
            cols = td.min(w0 + kw, width) - td.max(w0, 0)
            value = ir.Select(inside, ir.convert(x[n, c, h, w], acc), ir.const(0.0, acc), acc)
            return value / ir.Cast(rows * cols, acc)
        op = "sum"
    name = f"{kind}_pool2d"
    y = td.reduce(name, shape[:2] + out_hw, (kh, kw), body, op=op, dtype=dtype)
    return td.op([x], [y], name=name)


def _pool_plan(kind: str, x, kernel_size, stride=None, padding=0, count_include_pad: bool = True) -> Plan:
    x, kernel, stride, padding, out_hw = _window(kind, x, kernel_size, stride, padding)
    include_pad = flag(count_include_pad, f"{kind}_pool2d: count_include_pad") if kind == "avg" else True
    dtype = tdtype(x.dtype)
    key = ("pool2d", kind, kernel, stride, padding, include_pad, dtype, x.shape)
    op = cached_op(key, lambda: _pool_op(kind, kernel, stride, padding, include_pad, dtype, x.shape, out_hw))
    return Plan(op, (x,), lambda outputs: outputs[0])


def _check_nchw_float(x, what: str) -> None:
    """A ValueError for an array that is not 4-d (N, C, H, W), a TypeError for one that is not float."""
    if x.ndim != 4:
        raise ValueError(f"{what} needs an NCHW array (4-d), got shape {x.shape}")
    if not is_float_dtype(x.dtype):
        raise TypeError(f"{what} needs a float array, got {x.dtype}; convert it first (x.astype(np.float32))")


def _window(kind: str, x, kernel_size, stride, padding) -> tuple:
    """(contiguous x, kernel, stride, padding, (OH, OW)) of a pooling call, validated (clear ValueErrors)."""
    x = contiguous(x)
    _check_nchw_float(x, f"{kind}_pool2d")
    kernel = int_tuple(kernel_size, "kernel_size", 2)
    stride = kernel if stride is None else int_tuple(stride, "stride", 2)
    padding = int_tuple(padding, "padding", 2)
    if min(kernel) < 1 or min(stride) < 1 or min(padding) < 0:
        raise ValueError(f"invalid pooling window {kernel}, stride {stride}, padding {padding}")
    if any(2 * p > k for p, k in zip(padding, kernel)):
        raise ValueError(f"padding {padding} must be at most half the kernel size {kernel}")
    h, w = x.shape[2:]
    oh = (h + 2 * padding[0] - kernel[0]) // stride[0] + 1
    ow = (w + 2 * padding[1] - kernel[1]) // stride[1] + 1
    if oh < 1 or ow < 1:
        raise ValueError(f"input {h}x{w} is smaller than the pooling window {kernel} (padding {padding})")
    return x, kernel, stride, padding, (oh, ow)


ROW_CHUNKS = (32, 16, 8)    # output columns whose running maxima (or sums) a block keeps in registers at once:
                            # the widest that a row's interior holds (64 ran 3x slower than 32)


@td.func
def taps_inside(start, k, dilation, lo, hi):
    """How many of start, start + dilation, ..., start + (k - 1) dilation lie in [lo, hi)."""
    first = max(0, -((start - lo) // dilation))
    last = min(k - 1, (hi - 1 - start) // dilation)
    return max(0, last - first + 1)


@functools.lru_cache(maxsize=8)
def rows_kernel(dtype, kind: str = "max") -> td.Kernel:
    """2-d max (or `kind` "avg") pooling of an NCHW array, row by row: one block per (channel, image).

    The columns of an output row whose window lies inside the input row (its interior) go in chunks of the
    widest of ROW_CHUNKS that the interior holds, kept in registers: each starts at -inf (0) and takes
    the maximum (sum) over the window's taps, with no bounds checks and a constant trip count, so LLVM
    vectorizes the whole chunk (a loop over the columns inside, of a length known only at run time, ran in the
    vectorizer's scalar remainder). The last chunk ends at the interior's end, overlapping the one before. The
    few columns at the edges, and an interior shorter than the narrowest, go one at a time with bounds checks.
    A window row outside the input is skipped. The window comes in as scalars, so one compile serves every
    window (the output's shape says where the windows end). An average divides by its window's taps inside the
    padded input (`pool_all`: ONNX's count_include_pad, with ceil mode's windows past the end padding) or inside
    the input.

    A maximum keeps the first of equal values (a NaN wins), as PyTorch's pools do, not `td.max`'s IEEE rule: its
    test for zeros at every element took ResNet-50's and Inception-V3's max pools 12-60% longer, for nothing but
    the sign of a zero maximum. Written as a compare and select (`larger`), LLVM makes it a vmaxps."""
    is_max = kind == "max"
    start_value = -math.inf if is_max else 0.0

    @td.func
    def take(m, v):
        """The running maximum (sum) `m` with the next tap's `v`."""
        if is_max:
            larger = v if v > m else m
            return larger if m == m and v == v else m + v
        return m + v

    @td.func
    def finish(total, count):
        """An output from its window's maximum (sum): an average divides by its `count` of taps (0 counts as 1)."""
        if is_max:
            return total
        return total / td.cast(max(count, 1), dtype)

    @td.kernel(grid=lambda C, N: (C, N), block=1, name=f"{kind}_pool_rows_{dtype.name}")
    def pool_rows(X: dtype["N", "C", "H", "W"], Y: dtype["N", "C", "OH", "OW"], pool_kh: td.i32,
                  pool_kw: td.i32, pool_sh: td.i32, pool_sw: td.i32, pool_pt: td.i32, pool_pl: td.i32,
                  pool_dh: td.i32, pool_dw: td.i32, pool_pb: td.i32, pool_pr: td.i32, pool_all: td.i32):
        c, n = blockIdx.x, blockIdx.y
        acc = td.registers(dtype, ROW_CHUNKS[0])
        lo = min(OW, (pool_pl + pool_sw - 1) // pool_sw)            # the interior: columns [lo, hi)
        right = W - 1 + pool_pl - (pool_kw - 1) * pool_dw            # the last window start inside the row
        hi = max(lo, min(OW, right // pool_sw + 1)) if right >= 0 else lo
        if hi - lo < ROW_CHUNKS[-1]:
            hi = lo
        h_lo, w_lo = -pool_pt * pool_all, -pool_pl * pool_all         # the taps an average counts
        h_hi, w_hi = H + pool_pb * pool_all, W + pool_pr * pool_all
        for oh in range(OH):
            ih0 = oh * pool_sh - pool_pt
            rows = taps_inside(ih0, pool_kh, pool_dh, h_lo, h_hi)
            for wider, chunk in zip((None,) + ROW_CHUNKS, ROW_CHUNKS):
                if hi - lo >= chunk and (wider is None or hi - lo < wider):
                    for step in range(lo, hi, chunk):
                        start = min(step, hi - chunk)
                        for j in range(chunk):
                            acc[j] = start_value
                        for kh in range(pool_kh):
                            ih = ih0 + kh * pool_dh
                            if ih >= 0 and ih < H:
                                for kw in range(pool_kw):
                                    offset = start * pool_sw + kw * pool_dw - pool_pl     # iw = j * stride + offset
                                    for j in range(chunk):
                                        acc[j] = take(acc[j], X[n, c, ih, j * pool_sw + offset])
                        for j in range(chunk):
                            Y[n, c, oh, start + j] = finish(acc[j], rows * pool_kw)
            for left in (True, False):          # the edges' columns, one at a time
                for ow in range(0 if left else hi, lo if left else OW):
                    iw0 = ow * pool_sw - pool_pl
                    total = td.cast(start_value, dtype)
                    for kh in range(pool_kh):
                        ih = ih0 + kh * pool_dh
                        if ih >= 0 and ih < H:
                            for kw in range(pool_kw):
                                iw = iw0 + kw * pool_dw
                                if iw >= 0 and iw < W:
                                    total = take(total, X[n, c, ih, iw])
                    Y[n, c, oh, ow] = finish(total, rows * taps_inside(iw0, pool_kw, pool_dw, w_lo, w_hi))

    return pool_rows


def _window_scalars(kernel, stride, pads, dilation, counts_all: bool = True) -> dict:
    return dict(pool_kh=kernel[0], pool_kw=kernel[1], pool_sh=stride[0], pool_sw=stride[1], pool_pt=pads[0],
                pool_pl=pads[1], pool_dh=dilation[0], pool_dw=dilation[1], pool_pb=pads[2], pool_pr=pads[3],
                pool_all=int(counts_all))


@functools.lru_cache(maxsize=64)
def _layer_kernel(dtype, kind: str, x_shape: tuple, out_shape: tuple, window: tuple) -> td.Kernel:
    """`rows_kernel` with one layer's shapes and window built in (index arithmetic folds)."""
    scalars = _window_scalars(*window)
    examples = (np.empty(x_shape, dtype.numpy), np.empty(out_shape, dtype.numpy))
    return td.fuse(rows_kernel(dtype, kind), *examples, *scalars.values(), constants=tuple(scalars))


def pool_rows(x: np.ndarray, out_hw: tuple, kernel, stride, pads, dilation=(1, 1), kind: str = "max",
             counts_all: bool = True) -> tuple:
    """(y, kernel): the (N, C, *out_hw) max (or `kind` "avg", dividing by the window's taps inside the padded
    input, or with `counts_all` False inside the input) pooling of contiguous NCHW `x` by `rows_kernel`, with
    `pads` (top, left, bottom, right). Under td.fast_compile the generic kernel runs (one compile), else one built
    for this layer."""
    dtype = tdtype(x.dtype)
    y = np.empty(x.shape[:2] + tuple(out_hw), x.dtype)
    window = (tuple(kernel), tuple(stride), tuple(pads), tuple(dilation), bool(counts_all))
    if fast_compile_enabled():
        k = rows_kernel(dtype, kind)
        k(x, y, *_window_scalars(*window).values())
    else:
        k = _layer_kernel(dtype, kind, x.shape, y.shape, window)
        k(x, y)
    return y, k


def on_rows(dtype, target: str) -> bool:
    """Whether 2-d max and average pooling of `dtype` run `rows_kernel`: f32 on the cpu (GPUs keep the
    reduce, whose threads share the work)."""
    return target == "cpu" and dtype == np.float32


def max_pool2d(x, kernel_size, stride=None, padding=0):
    """The maximum over each (KH, KW) window of x (N, C, H, W); stride defaults to the window."""
    if on_rows(as_array(x).dtype, get_target()):
        x, kernel, stride, padding, out_hw = _window("max", x, kernel_size, stride, padding)
        return pool_rows(x, out_hw, kernel, stride, padding * 2)[0]
    return _pool_plan("max", x, kernel_size, stride, padding).run()


def avg_pool2d(x, kernel_size, stride=None, padding=0, count_include_pad: bool = True):
    """The mean over each window; with count_include_pad=False padded positions are not counted."""
    if on_rows(as_array(x).dtype, get_target()):
        counts_all = flag(count_include_pad, "avg_pool2d: count_include_pad")
        x, kernel, stride, padding, out_hw = _window("avg", x, kernel_size, stride, padding)
        return pool_rows(x, out_hw, kernel, stride, padding * 2, kind="avg", counts_all=counts_all)[0]
    return _pool_plan("avg", x, kernel_size, stride, padding, count_include_pad).run()


def global_avg_pool2d(x):
    """The mean over H and W of x (N, C, H, W), shape (N, C, 1, 1)."""
    return op_for("global_avg_pool2d", x).run()


def op_for(name: str, *args, **kwargs) -> Plan:
    """The Plan a call of `name` runs, with that function's arguments (for tests and introspection)."""
    if name == "max_pool2d":
        return _pool_plan("max", *args, **kwargs)
    if name == "avg_pool2d":
        return _pool_plan("avg", *args, **kwargs)
    if name == "global_avg_pool2d":
        (x,) = args
        x = as_array(x)
        _check_nchw_float(x, "global_avg_pool2d")      # as the other pools (an int mean would be f32)
        return _reduce.op_for("mean", x, axis=(2, 3), keepdims=True)
    raise ValueError(f"unknown pooling {name!r}")
