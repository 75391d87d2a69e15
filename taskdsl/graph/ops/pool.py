"""Max / average pooling over 1-3 spatial axes of (N, C, spatial...) tensors, as reductions over the window.

Pads are (begin..., end...) per spatial axis, as in ONNX; ceil_mode rounds the output size
up (a window must still start inside the input or its begin padding); an average divides by
the window positions inside the padded input (count_include_pad) or inside the input.
"""
from __future__ import annotations


import numpy as np

from stdlib_ops import pool as pool_lib
from stdlib_ops.elementwise import int_tuple

from ... import ir
from ...ir import types as T
from ...runtime.config import fast_compile_enabled, get_target
from ...compute import compute
from ...compute import reduce as reduction
from ...lang import math_expr
from ..operator import Operator, dims
from .norm import stat_dtype
from .window import ChannelsLast, pads_of, positions_inside, window_input, window_positions


NOT_FOUND = ir.const(np.iinfo(np.int64).max, T.i64)      # a window's index before one is found (the min's start)


class Pool(ChannelsLast, Operator):
    """attrs: mode ('max' / 'avg'), kernel, strides, pads, dilations, ceil_mode, count_include_pad,
    channels_last ((N, spatial..., C) tensors), and for max pooling `indices` (0: none; 1 / 2: a second, int64
    output with the flat (N, C, spatial...) index of each window's first maximum, its spatial axes in row-major /
    column-major order: ONNX MaxPool's Indices with storage_order 0 / 1)."""

    kind_attr = "mode"
    size_attrs = ("kernel", "strides", "pads", "dilations", "out")   # symbols in the generic definitions
    derived_attrs = ("out",)          # the output's spatial size: a plain size symbol in the generic definitions

    @property
    def generic(self) -> bool:
        """One kernel for every window shape under `td.fast_compile` (tests, prototyping: one compile);
        otherwise specialized to this layer's shapes: the scheduler unrolls a small window, and
        constant offsets, strides and sizes fold each element's index arithmetic (ResNet-50's max
        pool: 5.2 ms generic, 1.7 ms specialized)."""
        return fast_compile_enabled()

    @property
    def kind(self) -> str:
        return f"{self.attrs['mode']}_pool"

    @property
    def on_rows(self) -> bool:
        """Whether `stdlib_ops.pool`'s row kernel runs this pooling on the current target: a 2-D channels-first
        one with no indices, of a dtype it takes (f32 on the cpu)."""
        x, a = self.inputs[0], self.attrs
        return (x.ndim == 4 and not a["channels_last"] and not a.get("indices")
                and pool_lib.on_rows(x.numpy_dtype, get_target()))

    def check(self):
        self.set_layout()
        x, a = self.inputs[0], self.attrs
        rank = x.ndim - 2
        if not 1 <= rank <= 3:
            raise ValueError(f"{self.kind} needs an (N, C, spatial...) tensor with 1-3 spatial axes, got {x.shape}")
        if a["mode"] not in ("max", "avg"):
            raise ValueError(f"pooling mode must be 'max' or 'avg', got {a['mode']!r}")
        if a["mode"] == "avg" and not x.dtype.is_float:
            raise TypeError(f"avg_pool needs a float tensor, got {x.dtype.name}")
        indices = a.get("indices", 0)
        if indices not in (0, 1, 2) or (indices and a["mode"] != "max"):
            raise ValueError(f"{self.kind}: indices must be 0, or 1 / 2 (row- / column-major) for max pooling, "
                             f"got {indices!r}")
        if indices and a["channels_last"]:
            raise ValueError("max_pool: indices are those of a channels-first input; pool channels-first")
        for key, length, low in (("kernel", rank, 1), ("strides", rank, 1), ("dilations", rank, 1),
                                 ("pads", 2 * rank, 0)):
            v = a[key]
            if len(v) != length or any(not isinstance(n, int) or n < low for n in v):
                raise ValueError(f"{self.kind}: {key} must be {length} ints >= {low}, got {v!r}")
        self.attrs["out"] = self._spatial(x.shape)
        if any(n < 1 for n in self.attrs["out"]):
            raise ValueError(f"{self.kind}: the window {a['kernel']} (dilations {a['dilations']}) does not fit the "
                             f"padded input {self.spatial_dims(x.shape)} (pads {a['pads']})")

    def _spatial(self, shape: tuple) -> tuple:
        spatial = self.spatial_dims(shape)
        rank = len(spatial)
        kernel, strides, pads, dilations = (self.size(k) for k in ("kernel", "strides", "pads", "dilations"))
        return tuple(window_positions(spatial[i], kernel[i], strides[i], pads[i], pads[rank + i], dilations[i],
                                      self.attrs["ceil_mode"]) for i in range(rank))

    def define(self, x):
        a, shape = self.attrs, dims(x)
        rank = len(shape) - 2
        spatial = self.spatial_dims(shape)
        kernel, strides, pads, dilations = (self.size(k) for k in ("kernel", "strides", "pads", "dilations"))
        acc = stat_dtype(x.dtype) if x.dtype.is_float else x.dtype

        def value(ix, pad_value):
            n, c, out = self.split_index(ix[:rank + 2])
            pos, ok = window_input(out, ix[rank + 2:], strides, pads, dilations, spatial)
            v = x[self.join_index(n, c, pos)]
            v = ir.convert(v, acc)
            return ir.Select(ok, v, ir.const(pad_value, acc), acc)

        out_shape = self.join_index(shape[0], self.channels(shape), self.size("out"))
        if a["mode"] == "max":
            pooled = reduction("max_pool", out_shape, kernel, lambda *ix: value(ix, acc.lowest), op="max",
                               dtype=x.dtype)
            return [pooled] + ([self._indices(x, pooled)] if a.get("indices") else [])

        def average(*ix):
            count, out = None, self.split_index(ix[:rank + 2])[2]
            for i in range(rank):
                start = out[i] * strides[i] - pads[i]
                lo, hi = (0 - pads[i], spatial[i] + pads[rank + i]) if a["count_include_pad"] else (0, spatial[i])
                n = positions_inside(start, kernel[i], dilations[i], lo, hi)
                count = n if count is None else count * n
            return value(ix, 0.0) / ir.Cast(math_expr("max", [count, 1]), acc)   # a window all padding: 0, not 0/0

        return [reduction("avg_pool", out_shape, kernel, average, op="sum", dtype=x.dtype)]

    def _indices(self, x, pooled):
        """The flat input index of each window's first element (in window order) equal to its maximum (NaN equal
        to NaN); column-major (`indices` 2) converted from the row-major one, whose minimum is the first."""
        shape = dims(x)
        rank = len(shape) - 2
        in_dims = self.spatial_dims(shape)
        spatial = [ir.Cast(ir.as_expr(d), T.i64) for d in in_dims]
        kernel, strides, pads, dilations = (self.size(k) for k in ("kernel", "strides", "pads", "dilations"))

        def position(*ix):
            out = ix[:rank + 2]
            n, c, spots = self.split_index(out)
            pos, ok = window_input(spots, ix[rank + 2:], strides, pads, dilations, in_dims)
            v, top = x[self.join_index(n, c, pos)], pooled[out]
            hit = ir.binary("==", v, top)
            if x.dtype.is_float:
                hit = ir.binary("or", hit, ir.binary("and", ir.binary("!=", v, v), ir.binary("!=", top, top)))
            flat = ir.Cast(n, T.i64) * ir.Cast(ir.as_expr(shape[1]), T.i64) + ir.Cast(c, T.i64)
            for i in range(rank):
                flat = flat * spatial[i] + ir.Cast(pos[i], T.i64)
            return ir.Select(ir.binary("and", ok, hit), flat, NOT_FOUND, T.i64)

        first = reduction("max_pool_indices_found", pooled.shape, kernel, position, op="min", dtype=T.i64)

        def found(ix, index):   # -1 where a window lies wholly in the padding (dilated), as onnxruntime gives
            return ir.Select(ir.binary("==", first[ix], NOT_FOUND), ir.const(-1, T.i64), index, T.i64)

        if self.attrs["indices"] == 1:
            return compute("max_pool_indices", pooled.shape, lambda *ix: found(ix, first[ix]))

        def column_major(*ix):
            rest, coords = first[ix], []
            for d in reversed(spatial):
                coords.append(rest % d)
                rest = rest // d
            for d, coord in zip(reversed(spatial), coords):     # from the (n, c) plane, the last axis first
                rest = rest * d + coord
            return found(ix, rest)

        return compute("max_pool_indices_cm", pooled.shape, column_major)


def pool(x, mode: str, kernel, stride=None, padding=0, dilation=1, ceil_mode: bool = False,
         count_include_pad: bool = True, channels_last: bool = False):
    """Max ('max') or average ('avg') pooling of x (N, C, spatial...), or (N, spatial..., C) with channels_last;
    padding is an int, one per axis, or (begin..., end...)."""
    attrs = {**_attrs(x, mode, kernel, stride, padding, dilation, ceil_mode),
             "count_include_pad": bool(count_include_pad), "channels_last": bool(channels_last)}
    return Pool([x], attrs).outputs[0]


def max_pool_with_indices(x, kernel, stride=None, padding=0, dilation=1, ceil_mode: bool = False,
                          column_major: bool = False) -> tuple:
    """(max pooling of x (N, C, spatial...), the int64 flat index in x of each window's first maximum): ONNX
    MaxPool with its Indices output; `column_major` orders the spatial axes last-first (storage_order 1)."""
    attrs = _attrs(x, "max", kernel, stride, padding, dilation, ceil_mode)
    return tuple(Pool([x], {**attrs, "count_include_pad": True, "indices": 2 if column_major else 1}).outputs)


def _attrs(x, mode: str, kernel, stride, padding, dilation, ceil_mode: bool) -> dict:
    """The window attributes of a pooling of x; stride defaults to the window."""
    rank = x.ndim - 2
    kernel, pads = int_tuple(kernel, "kernel_size", rank), pads_of(padding, rank)
    dilations = int_tuple(dilation, "dilation", rank)
    extents = tuple((k - 1) * d + 1 for k, d in zip(kernel, dilations))
    if any(p >= e for p, e in zip(pads, extents + extents)):
        raise ValueError(f"{mode} pooling: the padding {pads} (begins, ends) must be smaller than the window's extent "
                         f"{extents} (kernel {kernel}, dilations {dilations}) at each side: a window wholly in the "
                         "padding holds no element (onnxruntime and PyTorch refuse it too)")
    return {"mode": mode, "kernel": kernel,
            "strides": int_tuple(stride if stride is not None else kernel, "stride", rank),
            "pads": pads, "dilations": dilations, "ceil_mode": bool(ceil_mode)}


def max_pool2d(x, kernel_size, stride=None, padding=0, dilation=1, ceil_mode: bool = False):
    """The maximum over each window of x (N, C, H, W); stride defaults to the window (PyTorch semantics)."""
    _check_2d(x, "max_pool2d")
    return pool(x, "max", kernel_size, stride, padding, dilation, ceil_mode)


def avg_pool2d(x, kernel_size, stride=None, padding=0, ceil_mode: bool = False, count_include_pad: bool = True):
    """The mean over each window of x (N, C, H, W)."""
    _check_2d(x, "avg_pool2d")
    return pool(x, "avg", kernel_size, stride, padding, 1, ceil_mode, count_include_pad)


def _check_2d(x, what: str) -> None:
    if x.ndim != 4:
        raise ValueError(f"{what} needs an (N, C, H, W) tensor, got shape {x.shape}")
