"""Normalizations as compute definitions: softmax, log_softmax, layer_norm, rms_norm, batch_norm.

    from stdlib_ops import softmax, layer_norm
    p = softmax(logits, axis=-1)
    y = layer_norm(x, weight, bias, eps=1e-5)          # over the last weight.ndim axes

Each operator is one `td.op` of reductions (materialized, one kernel each) and an
injective output definition; softmax / log_softmax, layer_norm and rms_norm over the last axis use
the fused row kernels of `rowwise.py` instead. Inputs are
viewed in a canonical form with size-symbol dims ((outer, axis, inner) for softmax, (rows,
normalized) for the norms, (N, C, spatial) for batch_norm), so an op is built once per dtype /
variant / eps and reused for any size.
Statistics are computed in f32 (f64 for f64 inputs); 16-bit inputs give 16-bit outputs.
"""
from __future__ import annotations

import math

import numpy as np

import taskdsl as td
from taskdsl import ir
from taskdsl.ir.types import is_float_dtype
from taskdsl.runtime.arrays import as_array

from .elementwise import Plan, cached_op, contiguous, int_tuple, normalize_axis, real, reshaper, tdtype
from .rowwise import applies as rows_apply
from .rowwise import layer_norm_rows, softmax_rows

__all__ = ["batch_norm", "layer_norm", "log_softmax", "rms_norm", "softmax"]


def _stat_dtype(dtype) -> td.ir.types.DataType:
    return td.f64 if dtype == td.f64 else td.f32


# ---------------------------------------------------------------- softmax / log_softmax
def _softmax_op(log: bool, inner: bool, dtype) -> td.Op:
    """Softmax over axis 1 of X (O, R, I) (`inner`) or (O, R)."""
    sdt = _stat_dtype(dtype)
    dims = ("SO", "SR", "SI") if inner else ("SO", "SR")
    x = td.placeholder("x", dtype, dims)

    def load(o, r, i):
        return ir.convert(x[(o, r, i) if inner else (o, r)], sdt)

    out_dims = dims[:1] + dims[2:]
    m = td.reduce("row_max", out_dims, ("SR",),
                  (lambda o, i, r: load(o, r, i)) if inner else (lambda o, r: load(o, r, None)), op="max")

    def shifted(o, r, i):
        return load(o, r, i) - (m[o, i] if inner else m[o])

    s = td.reduce("row_sum", out_dims, ("SR",),
                  (lambda o, i, r: td.exp(shifted(o, r, i))) if inner else
                  (lambda o, r: td.exp(shifted(o, r, None))), op="sum")

    def value(o, r, i):
        total = s[o, i] if inner else s[o]
        return shifted(o, r, i) - td.log(total) if log else td.exp(shifted(o, r, i)) / total

    name = "log_softmax" if log else "softmax"
    y = td.compute(name, dims, (lambda o, r, i: value(o, r, i)) if inner else (lambda o, r: value(o, r, None)),
                   dtype=dtype)
    return td.op([x], [y], name=name)


def _softmax_plan(log: bool, x, axis: int = -1) -> Plan:
    x = contiguous(x)
    if not is_float_dtype(x.dtype):
        raise TypeError(f"{'log_softmax' if log else 'softmax'} needs a float array, got {x.dtype}")
    axis = normalize_axis(axis, x.ndim)
    outer, n, inner = math.prod(x.shape[:axis]), x.shape[axis], math.prod(x.shape[axis + 1:])
    dtype = tdtype(x.dtype)
    has_inner = inner != 1
    op = cached_op(("softmax", log, has_inner, dtype), lambda: _softmax_op(log, has_inner, dtype))
    canon = (outer, n, inner) if has_inner else (outer, n)
    return Plan(op, (x.reshape(canon),), reshaper(x.shape))


def _on_rows(x, axis: int) -> bool:
    """Whether the hand-written row kernels (stdlib_ops/rowwise.py) apply: last axis, a float type, non-empty."""
    # the axis is checked first: 1.0 == 1 would take the row kernels where 0.0 is a TypeError
    return x.ndim >= 1 and normalize_axis(axis, x.ndim) == x.ndim - 1 and rows_apply(x.dtype) and x.size > 0


def softmax(x, axis: int = -1):
    """exp(x - max) / sum(exp(x - max)) along `axis`."""
    x = as_array(x)
    if _on_rows(x, axis):   # one fused kernel per row, the schedule chosen for the target
        return softmax_rows(x)
    return _softmax_plan(False, x, axis).run()


def log_softmax(x, axis: int = -1):
    """x - max - log(sum(exp(x - max))) along `axis`."""
    x = as_array(x)
    if _on_rows(x, axis):
        return softmax_rows(x, log=True)
    return _softmax_plan(True, x, axis).run()


# ---------------------------------------------------------------- layer_norm / rms_norm
def _norm_op(rms: bool, eps: float, dtype, has_weight: bool, has_bias: bool, wdtype) -> td.Op:
    """Normalization of each row of X (rows, D) over D, with optional weight (D,) and bias (D,)."""
    sdt = _stat_dtype(dtype)
    x = td.placeholder("x", dtype, ("LR", "LD"))
    inputs = [x]
    w = b = None
    if has_weight:
        w = td.placeholder("weight", wdtype, ("LD",))
        inputs.append(w)
    if has_bias:
        b = td.placeholder("bias", wdtype, ("LD",))
        inputs.append(b)

    def xv(r, d):
        return ir.convert(x[r, d], sdt)

    if rms:
        ms = td.reduce("mean_square", ("LR",), ("LD",), lambda r, d: xv(r, d) * xv(r, d), op="mean", dtype=sdt)
        centred = xv
        inv = lambda r: td.rsqrt(ms[r] + eps)
    else:
        # summed in f64, as the row kernels sum: an f32 sum's rounding leaves x - mean nonzero in a constant row,
        # which 1 / sqrt(eps) then scales (35 equal values normalized to 1e-4 where the exact result is 0)
        mean = td.reduce("mean", ("LR",), ("LD",), lambda r, d: ir.convert(x[r, d], td.f64), op="mean", dtype=sdt)
        centred = lambda r, d: xv(r, d) - mean[r]
        var = td.reduce("variance", ("LR",), ("LD",), lambda r, d: centred(r, d) * centred(r, d), op="mean",
                        dtype=sdt)
        inv = lambda r: td.rsqrt(var[r] + eps)

    def out(r, d):
        v = centred(r, d) * inv(r)
        if w is not None:
            v = v * ir.convert(w[d], sdt)
        if b is not None:
            v = v + ir.convert(b[d], sdt)
        return v

    name = "rms_norm" if rms else "layer_norm"
    y = td.compute(name, ("LR", "LD"), out, dtype=dtype)
    return td.op(inputs, [y], name=name)


def _norm_plan(rms: bool, x, weight, bias, eps: float, ndim: int | None) -> Plan:
    what = "rms_norm" if rms else "layer_norm"
    x = contiguous(x)
    if not is_float_dtype(x.dtype):
        raise TypeError(f"{what} needs a float array, got {x.dtype}")
    k = int_tuple(ndim, f"{what}: ndim")[0] if ndim is not None else (np.ndim(weight) if weight is not None else 1)
    if not 1 <= k <= x.ndim:
        raise ValueError(f"{what}: cannot normalize over the last {k} axes of a {x.ndim}-d array")
    norm_shape = x.shape[x.ndim - k:]
    params = []
    for what_p, p in (("weight", weight), ("bias", bias)):
        if p is not None:
            p = contiguous(p)
            if p.shape != norm_shape:
                raise ValueError(f"{what}: {what_p} must have shape {norm_shape} (the normalized axes), got {p.shape}")
            params.append(p.reshape(-1))
    if len(params) == 2 and params[0].dtype != params[1].dtype:
        raise TypeError(f"{what}: weight and bias must have the same dtype, got {params[0].dtype}, {params[1].dtype}")
    wdtype = tdtype(params[0].dtype) if params else None
    dtype = tdtype(x.dtype)
    eps = real(eps, f"{what}: eps")
    key = (what, eps, dtype, weight is not None, bias is not None, wdtype)
    op = cached_op(key, lambda: _norm_op(rms, eps, dtype, weight is not None, bias is not None, wdtype))
    d = math.prod(norm_shape)
    return Plan(op, (x.reshape(math.prod(x.shape) // d if d else 0, d), *params), reshaper(x.shape))


def _on_row_kernel(x, weight, bias, ndim, what: str) -> bool:
    """Whether `what` (a layer or RMS norm) runs the row kernel: over the last axis of `x`, any weight and bias of
    its length and dtype (anything else goes through `_norm_plan`, whose checks name a wrong shape or dtype)."""
    if ndim is not None and int_tuple(ndim, f"{what}: ndim")[0] != 1 or not _on_rows(x, -1):
        return False
    params = [as_array(p) for p in (weight, bias) if p is not None]
    return all(p.shape == x.shape[-1:] and p.dtype == x.dtype for p in params)


def layer_norm(x, weight=None, bias=None, eps: float = 1e-5, ndim: int | None = None):
    """(x - mean) / sqrt(var + eps) * weight + bias over the last `ndim` axes (default: weight.ndim, else 1).

    weight and bias (optional) have the shape of the normalized axes; the variance is the
    biased one (divided by the count), as in PyTorch.
    """
    x = as_array(x)
    if _on_row_kernel(x, weight, bias, ndim, "layer_norm"):     # one fused kernel per row
        return layer_norm_rows(x, weight, bias, real(eps, "layer_norm: eps"))
    return _norm_plan(False, x, weight, bias, eps, ndim).run()


def rms_norm(x, weight=None, eps: float = 1e-6, ndim: int | None = None):
    """x / sqrt(mean(x^2) + eps) * weight over the last `ndim` axes (default: weight.ndim, else 1)."""
    x = as_array(x)
    if _on_row_kernel(x, weight, None, ndim, "rms_norm"):
        return layer_norm_rows(x, weight, None, real(eps, "rms_norm: eps"), rms=True)
    return _norm_plan(True, x, weight, None, eps, ndim).run()


# ---------------------------------------------------------------- batch_norm (inference)
def _batch_norm_op(eps: float, dtype, pdtype, has_weight: bool, has_bias: bool) -> td.Op:
    sdt = _stat_dtype(dtype)
    x = td.placeholder("x", dtype, ("BN", "BC", "BS"))
    mean = td.placeholder("running_mean", pdtype, ("BC",))
    var = td.placeholder("running_var", pdtype, ("BC",))
    inputs = [x, mean, var]
    w = td.placeholder("weight", pdtype, ("BC",)) if has_weight else None
    b = td.placeholder("bias", pdtype, ("BC",)) if has_bias else None
    inputs += [t for t in (w, b) if t is not None]

    def out(n, c, s):
        v = (ir.convert(x[n, c, s], sdt) - ir.convert(mean[c], sdt)) * td.rsqrt(ir.convert(var[c], sdt) + eps)
        if w is not None:
            v = v * ir.convert(w[c], sdt)
        if b is not None:
            v = v + ir.convert(b[c], sdt)
        return v

    y = td.compute("batch_norm", ("BN", "BC", "BS"), out, dtype=dtype)
    return td.op(inputs, [y], name="batch_norm")


def _batch_norm_plan(x, mean, var, weight=None, bias=None, eps: float = 1e-5) -> Plan:
    x = contiguous(x)
    if x.ndim < 2 or not is_float_dtype(x.dtype):
        raise ValueError(f"batch_norm needs a float array of shape (N, C, ...), got {x.dtype} {x.shape}")
    c = x.shape[1]
    if mean is None or var is None:
        raise TypeError(f"batch_norm needs the running mean and var, arrays of shape ({c},)")
    params = [contiguous(p) for p in (mean, var, weight, bias) if p is not None]
    for p in params:
        if p.shape != (c,):
            raise ValueError(f"batch_norm: mean, var, weight and bias must have shape ({c},), got {p.shape}")
        if p.dtype != params[0].dtype or not is_float_dtype(p.dtype):
            raise TypeError("batch_norm: mean, var, weight and bias must share one float dtype")
    dtype, pdtype, eps = tdtype(x.dtype), tdtype(params[0].dtype), real(eps, "batch_norm: eps")
    key = ("batch_norm", eps, dtype, pdtype, weight is not None, bias is not None)
    op = cached_op(key, lambda: _batch_norm_op(eps, dtype, pdtype, weight is not None, bias is not None))
    return Plan(op, (x.reshape(x.shape[0], c, math.prod(x.shape[2:])), *params), reshaper(x.shape))


def batch_norm(x, mean, var, weight=None, bias=None, eps: float = 1e-5):
    """Inference batch norm of x (N, C, ...) with per-channel running mean / var, weight, bias."""
    return _batch_norm_plan(x, mean, var, weight, bias, eps).run()


def op_for(name: str, *args, **kwargs) -> Plan:
    """The Plan a call of `name` runs, with that function's arguments (for tests and introspection)."""
    plans = {"softmax": lambda x, axis=-1: _softmax_plan(False, x, axis),
             "log_softmax": lambda x, axis=-1: _softmax_plan(True, x, axis),
             "layer_norm": lambda x, weight=None, bias=None, eps=1e-5, ndim=None:
                 _norm_plan(False, x, weight, bias, eps, ndim),
             "rms_norm": lambda x, weight=None, eps=1e-6, ndim=None: _norm_plan(True, x, weight, None, eps, ndim),
             "batch_norm": _batch_norm_plan}
    if name not in plans:
        raise ValueError(f"unknown normalization {name!r}")
    return plans[name](*args, **kwargs)
