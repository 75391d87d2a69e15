"""Normalizations: softmax / log_softmax, layer_norm, rms_norm, batch_norm (inference), lrn.

Statistics are computed in f32 (f64 for f64 inputs); 16-bit inputs give 16-bit outputs.
"""
from __future__ import annotations

from stdlib_ops.elementwise import as_int, real

from ... import ir
from ...compute import compute
from ...compute import reduce as reduction
from ...ir import types as T
from ...lang import math_expr
from ..operator import Operator, dims
from ..tensor import as_tensor
from .axes import normalize_axis
from .elementwise import broadcast_index, broadcast_shape
from .transform import reshape


def stat_dtype(dtype: T.DataType) -> T.DataType:
    """The dtype statistics of `dtype` values are computed in."""
    return T.f64 if dtype == T.f64 else T.f32


def _float_input(op: Operator, what: str) -> None:
    if not op.inputs[0].dtype.is_float:
        raise TypeError(f"{what} needs a float tensor, got {op.inputs[0].dtype.name}; cast it first")


class Softmax(Operator):
    """Softmax (or log-softmax with attrs log=True) along `axis`."""

    generic = True

    kind_attr = "log"

    @property
    def kind(self) -> str:
        return "log_softmax" if self.attrs["log"] else "softmax"

    def check(self):
        _float_input(self, self.kind)
        self.attrs["axis"] = normalize_axis(self.attrs["axis"], self.inputs[0].ndim, self.kind)

    def define(self, x):
        shape, a = dims(x), self.attrs["axis"]
        sdt = stat_dtype(x.dtype)
        outer = shape[:a] + shape[a + 1:]

        def value(ix):                       # ix: a full index of x
            return ir.convert(x[ix], sdt)

        def row(ix):                         # ix: an index of the outer shape, then the reduced position
            return ix[:a] + (ix[-1],) + ix[a:-1]

        m = reduction("row_max", outer, (shape[a],), lambda *ix: value(row(ix)), op="max")

        def shifted(ix):
            return value(ix) - m[ix[:a] + ix[a + 1:]]

        s = reduction("row_sum", outer, (shape[a],), lambda *ix: math_expr("exp", [shifted(row(ix))]), op="sum")

        def out(*ix):
            total = s[ix[:a] + ix[a + 1:]]
            if self.attrs["log"]:
                return shifted(ix) - math_expr("log", [total])
            return math_expr("exp", [shifted(ix)]) / total

        return [compute(self.kind, shape, out, dtype=x.dtype)]


class LayerNorm(Operator):
    """(x - mean) / sqrt(var + eps) * weight + bias over the axes from `axis` on.

    attrs: axis, eps, has_weight, has_bias, stats (also output the mean and 1/std, shaped with 1s
    on the normalized axes, as ONNX LayerNormalization does); rms=True gives RMS normalization
    (no centring, no bias); per_channel=True: weight and bias are per channel (axis 1, shaped (C, 1, ...),
    the normalized axes all after it: an instance norm's), applied in the same kernel as the normalization.
    """

    generic = True

    @property
    def kind(self) -> str:
        return "rms_norm" if self.attrs.get("rms") else "layer_norm"

    def check(self):
        _float_input(self, self.kind)
        x = self.inputs[0]
        self.attrs["axis"] = normalize_axis(self.attrs["axis"], x.ndim, self.kind)
        norm_shape = x.shape[self.attrs["axis"]:]
        if self.attrs.get("per_channel"):
            channel_shape = x.shape[1:2] + (1,) * (x.ndim - 2)
            if self.attrs["axis"] < 2 or any(p.shape != channel_shape for p in self.inputs[1:]):
                raise ValueError(f"{self.kind}: per-channel weight and bias must have shape {channel_shape} and the "
                                 f"normalized axes follow the channels (axis >= 2), got "
                                 f"{[p.shape for p in self.inputs[1:]]} and axis {self.attrs['axis']}")
            return
        for p in self.inputs[1:]:
            if broadcast_shape([p.shape, norm_shape], self.kind) != norm_shape or p.ndim > len(norm_shape):
                raise ValueError(f"{self.kind}: weight and bias must broadcast to the normalized shape {norm_shape}, "
                                 f"got {p.shape}")

    def define(self, x, *params):
        shape, a = dims(x), self.attrs["axis"]
        sdt = stat_dtype(x.dtype)
        k = len(shape) - a
        stat_shape = shape[:a] + (1,) * k
        params, shapes = list(params), [t.shape for t in self.inputs[1:]]
        weight, weight_shape = (params.pop(0), shapes.pop(0)) if self.attrs["has_weight"] else (None, None)
        bias, bias_shape = (params.pop(0), shapes.pop(0)) if self.attrs.get("has_bias") else (None, None)

        def full(ix):                  # a reduction's index (stat axes, then normalized axes) as an index of x
            return ix[:a] + ix[len(stat_shape):]

        def stat_index(ix):
            return ix[:a] + (ir.const(0),) * k

        if self.attrs.get("rms"):
            mean = None
            square = reduction("mean_square", stat_shape, shape[a:],
                               lambda *ix: ir.convert(x[full(ix)], sdt) * ir.convert(x[full(ix)], sdt), op="mean",
                               dtype=sdt)
            centred = lambda ix: ir.convert(x[ix], sdt)
            spread = square
        else:
            # summed in f64, as stdlib_ops.norm's definitions and row kernels sum (a constant row's x - mean is 0)
            mean = reduction("mean", stat_shape, shape[a:], lambda *ix: ir.convert(x[full(ix)], T.f64), op="mean",
                             dtype=sdt)
            centred = lambda ix: ir.convert(x[ix], sdt) - mean[stat_index(ix)]
            spread = reduction("variance", stat_shape, shape[a:],
                                    lambda *ix: centred(full(ix)) * centred(full(ix)), op="mean", dtype=sdt)
        inv = compute("inv_std_dev", stat_shape,
                              lambda *ix: math_expr("rsqrt", [spread[ix] + self.attrs["eps"]]), dtype=sdt)

        def out(*ix):
            v = centred(ix) * inv[stat_index(ix)]
            if weight is not None:
                v = v * ir.convert(weight[broadcast_index(ix, weight_shape)], sdt)
            if bias is not None:
                v = v + ir.convert(bias[broadcast_index(ix, bias_shape)], sdt)
            return v

        y = compute(self.kind, shape, out, dtype=x.dtype)
        return [y, mean, inv] if self.attrs.get("stats") else [y]


class BatchNorm(Operator):
    """Inference batch norm of x (N, C, ...) with per-channel mean, var and optional weight, bias (attrs eps)."""

    generic = True

    kind = "batch_norm"

    def check(self):
        _float_input(self, "batch_norm")
        x = self.inputs[0]
        if x.ndim < 2:
            raise ValueError(f"batch_norm needs an (N, C, ...) tensor, got shape {x.shape}")
        for p in self.inputs[1:]:
            if p.shape != (x.shape[1],) or not p.dtype.is_float:
                raise ValueError(f"batch_norm: mean, var, weight and bias must be float tensors of shape "
                                 f"({x.shape[1]},), got {p.dtype.name}{list(p.shape)}")

    def define(self, x, mean, var, *params):
        sdt = stat_dtype(x.dtype)
        params = list(params)
        weight = params.pop(0) if self.attrs["has_weight"] else None
        bias = params.pop(0) if self.attrs["has_bias"] else None

        def out(*ix):
            c = ix[1]
            inv_std = math_expr("rsqrt", [ir.convert(var[c], sdt) + self.attrs["eps"]])
            v = (ir.convert(x[ix], sdt) - ir.convert(mean[c], sdt)) * inv_std
            if weight is not None:
                v = v * ir.convert(weight[c], sdt)
            if bias is not None:
                v = v + ir.convert(bias[c], sdt)
            return v

        return [compute("batch_norm", dims(x), out, dtype=x.dtype)]


class LRN(Operator):
    """Local response normalization across channels of x (N, C, ...): attrs size, alpha, beta, bias."""

    generic = True
    size_attrs = ("size",)

    kind = "lrn"

    def check(self):
        _float_input(self, "lrn")
        if self.inputs[0].ndim < 3 or self.attrs["size"] < 1:
            raise ValueError(f"lrn needs an (N, C, spatial...) tensor and size >= 1, got shape "
                             f"{self.inputs[0].shape}, size {self.attrs['size']}")

    def define(self, x):
        shape, size = dims(x), self.size("size")
        sdt = stat_dtype(x.dtype)
        before = (size - 1) // 2

        def square(*ix):
            c = ix[1] - before + ix[-1]
            inside = ir.binary("and", c >= 0, c < shape[1])
            v = ir.convert(x[(ix[0], c) + ix[2:-1]], sdt)
            return ir.Select(inside, v * v, ir.const(0.0, sdt), sdt)

        sums = reduction("square_sum", shape, (size,), square, op="sum", dtype=sdt)
        alpha, beta, bias = self.attrs["alpha"], self.attrs["beta"], self.attrs["bias"]
        return [compute("lrn", shape, lambda *ix: ir.convert(x[ix], sdt) / math_expr(
            "pow", [bias + (alpha / size) * sums[ix], ir.const(beta, sdt)]), dtype=x.dtype)]


def softmax(x, axis: int = -1):
    """exp(x - max) / sum(exp(x - max)) along `axis`."""
    return Softmax([x], {"axis": axis, "log": False}).outputs[0]


def log_softmax(x, axis: int = -1):
    """x - max - log(sum(exp(x - max))) along `axis`."""
    return Softmax([x], {"axis": axis, "log": True}).outputs[0]


def layer_norm(x, weight=None, bias=None, eps: float = 1e-5, axis: int | None = None):
    """Layer norm over the axes from `axis` on (default: the last weight.ndim axes, else the last axis)."""
    weight, bias = (None if p is None else as_tensor(p) for p in (weight, bias))
    if axis is None:
        axis = -(weight.ndim if weight is not None and weight.ndim else 1)
    params = [p for p in (weight, bias) if p is not None]
    attrs = {"axis": axis, "eps": real(eps, "layer_norm: eps"), "has_weight": weight is not None,
             "has_bias": bias is not None}
    return LayerNorm([x, *params], attrs).outputs[0]


def instance_norm(x, weight, bias, eps: float = 1e-5):
    """x (N, C, spatial...) normalized over its spatial axes per instance and channel, then scaled and shifted
    per channel: a layer norm from axis 2 whose weight and bias (C,) are applied in its own kernel."""
    x, weight, bias = (as_tensor(t) for t in (x, weight, bias))
    if x.ndim < 3 or weight.shape != x.shape[1:2] or bias.shape != x.shape[1:2]:
        raise ValueError(f"instance_norm needs x (N, C, spatial...) and a weight and bias of shape (C,), one per "
                         f"channel; got x {x.shape}, weight {weight.shape}, bias {bias.shape}")
    per_channel = x.shape[1:2] + (1,) * (x.ndim - 2)
    params = [reshape(p, per_channel) for p in (weight, bias)]
    attrs = {"axis": 2, "eps": real(eps, "instance_norm: eps"), "has_weight": True, "has_bias": True,
             "per_channel": True}
    return LayerNorm([x, *params], attrs).outputs[0]


def rms_norm(x, weight=None, eps: float = 1e-6, axis: int = -1):
    """x / sqrt(mean(x^2) + eps) * weight over the axes from `axis` on."""
    params = [as_tensor(weight)] if weight is not None else []
    attrs = {"axis": axis, "eps": real(eps, "rms_norm: eps"), "has_weight": weight is not None, "rms": True}
    return LayerNorm([x, *params], attrs).outputs[0]


def batch_norm(x, mean, var, weight=None, bias=None, eps: float = 1e-5):
    """Inference batch norm: (x - mean) / sqrt(var + eps) * weight + bias per channel (axis 1)."""
    if mean is None or var is None:
        raise TypeError("batch_norm needs the running mean and variance (inference batch norm)")
    params = [as_tensor(p) for p in (mean, var, weight, bias) if p is not None]
    attrs = {"eps": real(eps, "batch_norm: eps"), "has_weight": weight is not None, "has_bias": bias is not None}
    return BatchNorm([x, *params], attrs).outputs[0]


def lrn(x, size: int, alpha: float = 1e-4, beta: float = 0.75, bias: float = 1.0):
    """Local response normalization over `size` neighbouring channels (AlexNet / ONNX LRN)."""
    attrs = {"size": as_int(size, "lrn: size"), "alpha": real(alpha, "lrn: alpha"), "beta": real(beta, "lrn: beta"),
             "bias": real(bias, "lrn: bias")}
    return LRN([x], attrs).outputs[0]
