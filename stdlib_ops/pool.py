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
"""
from __future__ import annotations

import math

import numpy as np

import taskdsl as td
from taskdsl import ir

from . import reduce as _reduce
from .elementwise import Plan, cached_op, cast_to, contiguous, tdtype

__all__ = ["avg_pool2d", "global_avg_pool2d", "max_pool2d"]


def _pair(v, what: str) -> tuple:
    pair = (v, v) if isinstance(v, (int, np.integer)) else tuple(v)
    if len(pair) != 2 or not all(isinstance(n, (int, np.integer)) for n in pair):
        raise ValueError(f"{what} must be an int or a pair of ints, got {v!r}")
    return int(pair[0]), int(pair[1])


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
            return ir.Select(inside, cast_to(x[n, c, h, w], acc), ir.const(-math.inf, acc), acc)
        op = "max"
    elif include_pad:
        def body(n, c, oh, ow, r, s):
            h, w, inside = window(oh, ow, r, s)
            return ir.Select(inside, cast_to(x[n, c, h, w], acc), ir.const(0.0, acc), acc)
        op = "mean"
    else:
        def body(n, c, oh, ow, r, s):
            h, w, inside = window(oh, ow, r, s)
            h0, w0 = oh * sh - ph, ow * sw - pw
            rows = td.min(h0 + kh, height) - td.max(h0, 0)
            cols = td.min(w0 + kw, width) - td.max(w0, 0)
            value = ir.Select(inside, cast_to(x[n, c, h, w], acc), ir.const(0.0, acc), acc)
            return value / ir.Cast(rows * cols, acc)
        op = "sum"
    name = f"{kind}_pool2d"
    y = td.reduce(name, shape[:2] + out_hw, (kh, kw), body, op=op, dtype=dtype)
    return td.op([x], [y], name=name)


def _pool_plan(kind: str, x, kernel_size, stride=None, padding=0, count_include_pad: bool = True) -> Plan:
    x = contiguous(x)
    if x.ndim != 4 or x.dtype.kind != "f":
        raise ValueError(f"{kind}_pool2d needs a float NCHW array, got {x.dtype} {x.shape}")
    kernel = _pair(kernel_size, "kernel_size")
    stride = kernel if stride is None else _pair(stride, "stride")
    padding = _pair(padding, "padding")
    if min(kernel) < 1 or min(stride) < 1 or min(padding) < 0:
        raise ValueError(f"invalid pooling window {kernel}, stride {stride}, padding {padding}")
    if any(2 * p > k for p, k in zip(padding, kernel)):
        raise ValueError(f"padding {padding} must be at most half the kernel size {kernel}")
    h, w = x.shape[2:]
    oh = (h + 2 * padding[0] - kernel[0]) // stride[0] + 1
    ow = (w + 2 * padding[1] - kernel[1]) // stride[1] + 1
    if oh < 1 or ow < 1:
        raise ValueError(f"input {h}x{w} is smaller than the pooling window {kernel} (padding {padding})")
    include_pad = bool(count_include_pad) if kind == "avg" else True
    dtype = tdtype(x.dtype)
    key = ("pool2d", kind, kernel, stride, padding, include_pad, dtype, x.shape)
    op = cached_op(key, lambda: _pool_op(kind, kernel, stride, padding, include_pad, dtype, x.shape, (oh, ow)))
    return Plan(op, (x,), lambda outputs: outputs[0])


def max_pool2d(x, kernel_size, stride=None, padding=0):
    """The maximum over each (KH, KW) window of x (N, C, H, W); stride defaults to the window."""
    return _pool_plan("max", x, kernel_size, stride, padding).run()


def avg_pool2d(x, kernel_size, stride=None, padding=0, count_include_pad: bool = True):
    """The mean over each window; with count_include_pad=False padded positions are not counted."""
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
        x = np.asarray(x)
        if x.ndim != 4:
            raise ValueError(f"global_avg_pool2d needs an NCHW array, got shape {x.shape}")
        return _reduce.op_for("mean", x, axis=(2, 3), keepdims=True)
    raise ValueError(f"unknown pooling {name!r}")
