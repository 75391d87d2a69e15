"""A traced graph replayed as PyTorch functions, operator by operator: the PyTorch eager (and torch.compile)
baseline of `python -m models bench` on a GPU. Imported only where torch is installed.
"""
from __future__ import annotations

import functools

import numpy as np
import torch
import torch.nn.functional as F

from taskdsl.graph import Graph, as_dtype, ops
from taskdsl.ir.types import numpy_dtype

TORCH_OPS: dict = {}      # Operator class -> fn(op, *tensors) -> tensor


def replays(cls):
    """Register the decorated function as the torch version of Operator class `cls`."""
    def register(fn):
        TORCH_OPS[cls] = fn
        return fn
    return register


def _fold(fn):
    return lambda *xs, **_: functools.reduce(fn, xs)


ELEMENTWISE = {
    "add": _fold(torch.add), "mul": _fold(torch.mul), "maximum": _fold(torch.maximum), "minimum": _fold(torch.minimum),
    "sub": lambda a, b, **_: a - b, "pow": lambda a, b, **_: torch.pow(a, b).to(a.dtype),
    "div": lambda a, b, **_: torch.div(a, b, rounding_mode=None if a.is_floating_point() else "trunc"),
    "equal": lambda a, b, **_: a == b, "less": lambda a, b, **_: a < b, "less_equal": lambda a, b, **_: a <= b,
    "greater": lambda a, b, **_: a > b, "greater_equal": lambda a, b, **_: a >= b,
    "logical_and": lambda a, b, **_: a & b, "logical_or": lambda a, b, **_: a | b,
    "logical_xor": lambda a, b, **_: a ^ b, "logical_not": lambda a, **_: ~a,
    "neg": lambda a, **_: -a, "abs": lambda a, **_: a.abs(), "relu": lambda a, **_: F.relu(a),
    "sigmoid": lambda a, **_: a.sigmoid(), "tanh": lambda a, **_: a.tanh(), "exp": lambda a, **_: a.exp(),
    "log": lambda a, **_: a.log(), "sqrt": lambda a, **_: a.sqrt(), "rsqrt": lambda a, **_: a.rsqrt(),
    "erf": lambda a, **_: torch.erf(a), "sin": lambda a, **_: a.sin(), "cos": lambda a, **_: a.cos(),
    "asin": lambda a, **_: a.asin(), "acos": lambda a, **_: a.acos(), "atan": lambda a, **_: a.atan(),
    "sinh": lambda a, **_: a.sinh(), "cosh": lambda a, **_: a.cosh(), "asinh": lambda a, **_: a.asinh(),
    "acosh": lambda a, **_: a.acosh(), "atanh": lambda a, **_: a.atanh(),
    "floor": lambda a, **_: a.floor(), "ceil": lambda a, **_: a.ceil(), "reciprocal": lambda a, **_: a.reciprocal(),
    "gelu": lambda a, approximate="none", **_: F.gelu(a, approximate=approximate),
    "silu": lambda a, **_: F.silu(a), "leaky_relu": lambda a, alpha=0.01, **_: F.leaky_relu(a, alpha),
    "where": lambda c, a, b, **_: torch.where(c.bool(), a, b),
    "cast": lambda a, to=None, **_: a.to(getattr(torch, numpy_dtype(as_dtype(to)).name)),   # bfloat16, not its bits
}


@replays(ops.Elementwise)
def _elementwise(op, *xs):
    if op.attrs["fn"] == "clip":
        bounds = list(xs[1:])
        lo = bounds.pop(0) if op.attrs["has_min"] else None
        return torch.clamp(xs[0], lo, bounds.pop(0) if op.attrs["has_max"] else None)
    return ELEMENTWISE[op.attrs["fn"]](*xs, **op.params)


@replays(ops.MatMul)
def _matmul(op, a, b):
    return torch.matmul(a, b)


def _symmetric(pads: tuple, what: str) -> tuple:
    rank = len(pads) // 2
    if pads[:rank] != pads[rank:]:
        raise NotImplementedError(f"{what} with asymmetric pads {pads} has no torch replay")
    return pads[:rank]


@replays(ops.Conv)
def _conv(op, x, w):
    a = op.attrs
    conv = (F.conv1d, F.conv2d, F.conv3d)[x.ndim - 3]
    return conv(x, w, None, a["strides"], _symmetric(a["pads"], op.name), a["dilations"], a["groups"])


@replays(ops.Softmax)
def _softmax(op, x):
    return (torch.log_softmax if op.attrs["log"] else torch.softmax)(x, dim=op.attrs["axis"])


@replays(ops.LayerNorm)
def _layer_norm(op, x, *params):
    a, params = op.attrs, list(params)
    weight = params.pop(0) if a["has_weight"] else None
    if a.get("rms"):
        y = x * torch.rsqrt(x.float().pow(2).mean(tuple(range(a["axis"], x.ndim)), keepdim=True) + a["eps"]).to(x.dtype)
        return y * weight if weight is not None else y
    bias = params.pop(0) if a.get("has_bias") else None
    return F.layer_norm(x, x.shape[a["axis"]:], weight, bias, a["eps"])


@replays(ops.BatchNorm)
def _batch_norm(op, x, mean, var, *params):
    params = list(params)
    weight = params.pop(0) if op.attrs["has_weight"] else None
    bias = params.pop(0) if op.attrs["has_bias"] else None
    return F.batch_norm(x, mean, var, weight, bias, training=False, eps=op.attrs["eps"])


@replays(ops.Pool)
def _pool(op, x):
    a = op.attrs
    rank = x.ndim - 2
    pads = _symmetric(a["pads"], op.name)
    if a["mode"] == "max":
        pool = (F.max_pool1d, F.max_pool2d, F.max_pool3d)[rank - 1]
        return pool(x, a["kernel"], a["strides"], pads, a["dilations"], a["ceil_mode"])
    pool = (F.avg_pool1d, F.avg_pool2d, F.avg_pool3d)[rank - 1]
    return pool(x, a["kernel"], a["strides"], pads, a["ceil_mode"], a["count_include_pad"])


@replays(ops.Reduce)
def _reduce(op, x):
    a = op.attrs
    if a["op"] == "prod":
        for axis in sorted(a["axes"], reverse=True):
            x = torch.prod(x, axis, keepdim=a["keepdims"])
        return x
    fn = {"sum": torch.sum, "mean": torch.mean, "max": torch.amax, "min": torch.amin}[a["op"]]
    return fn(x, dim=a["axes"], keepdim=a["keepdims"])


@replays(ops.Reshape)
def _reshape(op, x):
    return x.reshape(op.attrs["shape"])


@replays(ops.Transpose)
def _transpose(op, x):
    return x.permute(op.attrs["perm"]).contiguous()


@replays(ops.Concat)
def _concat(op, *xs):
    return torch.cat(xs, dim=op.attrs["axis"])


@replays(ops.Slice)
def _slice(op, x):
    a = op.attrs
    if any(d < 0 for d in a["steps"]):
        raise NotImplementedError(f"{op.name}: negative slice steps have no torch replay")
    return x[tuple(slice(s, s + n * d, d) for s, n, d in zip(a["starts"], a["sizes"], a["steps"]))]


@replays(ops.Gather)
def _gather(op, x, idx):
    axis = op.attrs["axis"]
    flat = torch.remainder(idx.reshape(-1), x.shape[axis])
    out = x.index_select(axis, flat)
    return out.reshape(x.shape[:axis] + idx.shape + x.shape[axis + 1:])


@replays(ops.Expand)
def _expand(op, x):
    return x.broadcast_to(op.outputs[0].shape).contiguous()


@replays(ops.Pad)
def _pad(op, x):
    pads, n = op.attrs["pads"], x.ndim
    order = [p for k in reversed(range(n)) for p in (pads[k], pads[n + k])]    # torch: last axis first
    return F.pad(x, order, value=op.attrs["value"])


def as_torch(array: np.ndarray, device: str) -> torch.Tensor:
    """A numpy array as a torch tensor on `device`; bf16 (ml_dtypes', which torch.from_numpy refuses) by its bits."""
    if array.dtype.name == "bfloat16":
        return torch.from_numpy(np.ascontiguousarray(array).view(np.int16)).view(torch.bfloat16).to(device)
    return torch.from_numpy(array).to(device)


def torch_function(graph: Graph, feeds: dict, device: str) -> tuple:
    """(fn, inputs): fn(*inputs) computes the graph's outputs with torch on `device` (constants moved there once)."""
    for op in graph.nodes:
        if type(op) not in TORCH_OPS:
            raise NotImplementedError(f"{op.name}: operators of type {type(op).__name__} have no torch replay")
    constants = {id(t): as_torch(np.array(t.value), device) for t in graph.constants}
    inputs = [as_torch(np.asarray(feeds[t.name]), device) for t in graph.inputs]

    def fn(*arrays):
        values = dict(constants)
        values.update({id(t): a for t, a in zip(graph.inputs, arrays)})
        for op in graph.nodes:
            out = TORCH_OPS[type(op)](op, *(values[id(t)] for t in op.inputs))
            values[id(op.outputs[0])] = out
        return [values[id(t)] for t in graph.outputs]

    return fn, inputs
