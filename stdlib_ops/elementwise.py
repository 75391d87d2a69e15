"""Elementwise operators with numpy broadcasting, each a compute definition scheduled by `td.op`.

    from stdlib_ops import add, gelu, where
    y = gelu(add(x, bias))                       # numpy arrays in, numpy arrays out

Every function takes numpy arrays (Python scalars where natural) and returns a new array.
Internally the operands are put in a canonical form before an Op is built: output axes of
size 1 are dropped and neighbouring axes along which every operand is either full or
broadcast in the same way are merged (a same-shape `add` of any rank is a 1-d kernel, a
bias add over (N, C, H, W) + (C, 1, 1) a 3-d one). Every canonical dim is a size symbol,
so an Op is built (and its kernel compiled) once per (function, broadcast pattern, dtypes,
parameters) and reused for every size; the Ops live in a process-wide cache.

Dtypes: 16-bit floats are computed in f32 and stored back in the input dtype. Mixing
dtypes follows PyTorch rather than numpy: any float operand makes the result the widest
float among the array operands (f16 with f32 gives f32, int32 with f32 gives f32), Python
scalars adopt the array's dtype (a float scalar with an integer array gives f32; an int scalar with a
bool array gives i64, as in numpy and PyTorch; a lone one, as in exp(2.0), is f32, where a lone
numpy scalar keeps its dtype), and the
float-only functions (div, pow, exp, log, sqrt, rsqrt, erf, tanh, sigmoid, silu, gelu) give
f32 on integer inputs.

`op_for(name, *args, **kwargs)` returns the `Plan` a call would run (the Op, the canonical
input arrays, and how outputs become the result); tests compare `plan.run()` with
`plan.reference()` (the compute definition's numpy evaluation).
"""
from __future__ import annotations

import functools
import math
import operator
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

import taskdsl as td
from taskdsl import ir
from taskdsl.ir import types as T
from taskdsl.runtime.arrays import as_array, contiguous
from taskdsl.runtime.kernel import remember

__all__ = ["add", "cast", "clip", "div", "erf", "exp", "gelu", "log", "maximum", "minimum", "mul", "pow", "relu",
           "rsqrt", "sigmoid", "silu", "sqrt", "sub", "tanh", "where"]


# ---------------------------------------------------------------- shared machinery (used by the sibling modules)
@dataclass
class Plan:
    """What one call runs: `op` on `arrays`, then `finalize` turns the op's outputs into the result."""

    op: td.Op
    arrays: tuple
    finalize: Callable

    def run(self):
        return self.finalize(self.op(*self.arrays))

    def reference(self):
        """The same result computed by the numpy evaluation of the op's definitions."""
        return self.finalize(self.op.reference(*self.arrays))


_OPS: dict = {}
OPS_KEPT = 256      # Ops kept for reuse; some keys hold shapes (a pooling's input), so a program of many shapes is bounded


def cached_op(key: tuple, build: Callable[[], td.Op]) -> td.Op:
    """The Op for `key`, built by `build()` on first use (Ops and their kernels are reused across calls)."""
    op = _OPS.get(key)
    if op is None:
        op = build()
        remember(_OPS, key, op, OPS_KEPT)
    return op


def tdtype(dtype) -> T.DataType:
    """The taskdsl type of a numpy dtype (or a taskdsl type, returned as is)."""
    return dtype if isinstance(dtype, T.DataType) else T.from_numpy(dtype)


def reshaper(shape: tuple) -> Callable:
    """A finalize function: the op's single output reshaped to `shape` (a view of the fresh output)."""
    shape = tuple(int(n) for n in shape)
    return lambda outputs: outputs[0].reshape(shape)


def shape_carrier(shape: tuple) -> np.ndarray:
    """A zero-stride int8 array of `shape`, passed as an op input that no kernel reads.

    Its placeholder's size symbols name output sizes that no real input has (a slice's or a
    pad's output extent), so the op needs no rebuild when they change.
    """
    return _shape_carrier(tuple(int(n) for n in shape))


@functools.lru_cache(maxsize=1024)
def _shape_carrier(shape: tuple) -> np.ndarray:
    return np.broadcast_to(np.zeros((), np.int8), shape)    # (read-only: one array serves every call; 5 us to make)


def int_tuple(values, what: str, length: int | None = None) -> tuple:
    """`values`, an integer or a sequence of them, as a tuple of Python ints: an integer stands for `length` equal
    ones, and a sequence must have `length` items, when `length` is given. A TypeError names `what` for anything
    but integers (`int()` would truncate a float size silently; numpy refuses one too), a ValueError for a
    wrong count."""
    if type(values) is tuple and all(type(n) is int for n in values):     # a numpy shape: nothing to convert
        scalar, items = False, values       # (the general path took a third of a small matmul's planning)
    elif type(values) is int:       # a conv's stride of 1, say (np.ndim alone costs a microsecond)
        scalar, items = True, (values,)
    else:
        scalar = np.ndim(values) == 0
        given = (values,) if scalar else tuple(values)
        try:
            items = tuple(as_int(n, what) for n in given)
        except TypeError:
            raise TypeError(f"{what} must be integers, got {values!r}") from None
    if length is not None and scalar:
        return items * length
    if length is not None and len(items) != length:
        raise ValueError(f"{what} must be an integer or {length} of them, got {values!r}")
    return items


def as_int(value, what: str) -> int:
    """`value`, an integer (a numpy one, a 0-d integer array), as a Python int; a TypeError naming `what` for a bool
    (True is no stride of 1), a float or anything else (`int()` would truncate 1.5 and take "1")."""
    try:
        if isinstance(value, (bool, np.bool_)):
            raise TypeError
        return operator.index(value)
    except TypeError:
        raise TypeError(f"{what} must be an int, got {value!r}") from None


def flag(value, what: str) -> bool:
    """`value`, a bool (or 0 / 1), as a bool: a TypeError names `what` for anything else (`keepdims="False"` is
    truthy, and was read as True)."""
    if isinstance(value, (bool, np.bool_)) or (isinstance(value, (int, np.integer)) and value in (0, 1)):
        return bool(value)
    raise TypeError(f"{what} must be True or False, got {value!r}")


def real(value, what: str) -> float:
    """`value`, a real number, as a float: a TypeError names `what` for anything else (`float("0.1")` took a
    string)."""
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, (int, float, np.integer, np.floating)):
        raise TypeError(f"{what} must be a number, got {value!r}")
    return float(value)


def normalize_axis(axis: int, ndim: int) -> int:
    """A possibly negative axis as an index in [0, ndim); TypeError/ValueError when invalid."""
    if not isinstance(axis, (int, np.integer)) or isinstance(axis, bool):
        raise TypeError(f"axis must be an int, got {axis!r}")
    if not -ndim <= axis < ndim:
        raise np.exceptions.AxisError(int(axis), ndim)
    return int(axis) % ndim


# ---------------------------------------------------------------- dtypes and operands
def _is_scalar(v) -> bool:
    return isinstance(v, (bool, int, float)) and not isinstance(v, np.ndarray)


def result_dtype(*values) -> np.dtype:
    """The dtype of an arithmetic result (PyTorch-style promotion, see the module docstring)."""
    arrays = [as_array(v).dtype for v in values if not _is_scalar(v)]
    floats = [d for d in arrays if T.is_float_dtype(d)]
    if floats:
        widest = max(d.itemsize for d in floats)
        kinds = {d for d in floats if d.itemsize == widest}
        return kinds.pop() if len(kinds) == 1 else np.dtype(np.float32)
    if any(isinstance(v, float) for v in values):
        return np.dtype(np.float32)
    if arrays:
        dtype = np.result_type(*arrays)
        if dtype.kind == "b" and any(_is_scalar(v) and not isinstance(v, bool) for v in values):
            return np.dtype(np.int64)     # bools with an int (True + 2 is 3): as numpy and PyTorch
        return dtype
    if all(isinstance(v, bool) for v in values):
        return np.dtype(np.bool_)
    return np.dtype(np.int32)


def _float_dtype(dtype: np.dtype) -> np.dtype:
    return dtype if T.is_float_dtype(dtype) else np.dtype(np.float32)


def _own_dtype(v) -> np.dtype:
    """The dtype a lone operand (of a unary function, clip) computes in: f32 for a Python number, its own for an
    array or a numpy scalar (np.float64 subclasses float, yet is a float64 to numpy)."""
    return np.dtype(np.float32) if _is_scalar(v) and not isinstance(v, np.generic) else as_array(v).dtype


def _operand(v, dtype: np.dtype) -> np.ndarray:
    """A contiguous array for `v`; a Python scalar becomes a 0-d array of `dtype`."""
    if _is_scalar(v):
        return np.asarray(v, dtype=dtype)
    a = contiguous(v)
    tdtype(a.dtype)     # a TypeError that lists the supported dtypes for strings, objects, complex numbers, ...
    return a


# ---------------------------------------------------------------- canonical broadcasting
def broadcast_canon(shapes: list) -> tuple[tuple, tuple, tuple]:
    """(out_shape, pattern, canonical input shapes) of a broadcast of `shapes` (remembered: graphs ask
    for the same shapes at every run)."""
    return _broadcast_canon(tuple(tuple(s) for s in shapes))


@functools.lru_cache(maxsize=1024)
def _broadcast_canon(shapes: tuple) -> tuple[tuple, tuple, tuple]:
    """`broadcast_canon`.

    pattern[g][k] says whether operand k is full (True) or broadcast (False) along merged
    axis group g; the canonical output shape is one dim per group.
    """
    out_shape = np.broadcast_shapes(*shapes)
    nd = len(out_shape)
    padded = [(1,) * (nd - len(s)) + tuple(s) for s in shapes]
    groups: list = []      # [status tuple, size]
    for axis, n in enumerate(out_shape):
        if n == 1:
            continue
        status = tuple(p[axis] == n for p in padded)
        if groups and groups[-1][0] == status:
            groups[-1][1] *= n
        else:
            groups.append([status, n])
    if not groups:
        groups = [[tuple(True for _ in shapes), 1]]
    pattern = tuple(g[0] for g in groups)
    canon_out = tuple(g[1] for g in groups)
    canon_in = tuple(tuple(n if st[k] else 1 for st, n in zip(pattern, canon_out)) for k in range(len(shapes)))
    return tuple(out_shape), pattern, canon_in


def _broadcast_op(name: str, pattern: tuple, in_dtypes: tuple, body: Callable, out_dtype: T.DataType,
                  load_dtypes: tuple, sym: str = "E") -> td.Op:
    """Op computing `body(*loads)` over canonical operands (loads cast to `load_dtypes`, None = as stored)."""
    dims = tuple(f"{sym}{g}" for g in range(len(pattern)))
    holders = [td.placeholder(f"x{k}", dt, tuple(d if st[k] else 1 for st, d in zip(pattern, dims)))
               for k, dt in enumerate(in_dtypes)]

    def fcompute(*axes):
        loads = []
        for k, (p, ld) in enumerate(zip(holders, load_dtypes)):
            load = p[tuple(a if st[k] else 0 for st, a in zip(pattern, axes))]
            loads.append(load if ld is None else ir.convert(load, ld))
        return body(*loads)

    # "_out": an output called like a math function (exp, erf, pow, ...) would shadow it in the CUDA source
    out = td.compute(f"{name}_out", dims, fcompute, dtype=out_dtype)
    return td.op(holders, [out], name=name)


def _elementwise_plan(name: str, values: list, body: Callable, out_dtype, load_dtypes, params=()) -> Plan:
    """The plan of an elementwise function of `values` (arrays / scalars already typed by the caller)."""
    arrays = [contiguous(v) for v in values]
    out_shape, pattern, canon = broadcast_canon([a.shape for a in arrays])
    in_dtypes = tuple(tdtype(a.dtype) for a in arrays)
    out_t = tdtype(out_dtype)
    loads = tuple(None if ld is None else tdtype(ld) for ld in load_dtypes)
    key = ("elementwise", name, pattern, in_dtypes, out_t, loads, params)
    op = cached_op(key, lambda: _broadcast_op(name, pattern, in_dtypes, body, out_t, loads))
    return Plan(op, tuple(a.reshape(s) for a, s in zip(arrays, canon)), reshaper(out_shape))


# ---------------------------------------------------------------- the operators
_SQRT1_2 = 1.0 / math.sqrt(2.0)
_SQRT_2_PI = math.sqrt(2.0 / math.pi)

_BINARY = {
    "add": lambda a, b: a + b,
    "sub": lambda a, b: a - b,
    "mul": lambda a, b: a * b,
    "div": lambda a, b: a / b,
    "pow": lambda a, b: td.pow(a, b),
    "maximum": lambda a, b: td.max(a, b),
    "minimum": lambda a, b: td.min(a, b),
}
_FLOAT_BINARY = ("div", "pow")


_F32_LOWEST = float(np.finfo(np.float32).min)


def _finite_below(x):
    """x with -inf raised to f32's lowest value: x * Phi(x) and x * sigmoid(x) at -inf are then -inf * 0, NaN,
    no more, but lowest * 0 = -0, their limit (a NaN stays one: td.max keeps it)."""
    return td.max(x, _F32_LOWEST)


def gelu_formula(x, approximate: str = "none"):
    """GELU of a value (an IR value or a number): x * Phi(x), with the exact erf or the tanh approximation."""
    if approximate == "tanh":
        return 0.5 * _finite_below(x) * (1.0 + td.tanh(_SQRT_2_PI * (x + 0.044715 * (x * x * x))))
    return 0.5 * _finite_below(x) * (1.0 + td.erf(x * _SQRT1_2))


def silu_formula(x):
    """SiLU of a value (an IR value or a number): x * sigmoid(x)."""
    return _finite_below(x) * td.sigmoid(x)


_UNARY = {
    "relu": (lambda x: td.max(x, 0), False),
    "gelu": (gelu_formula, True),
    "gelu_tanh": (lambda x: gelu_formula(x, "tanh"), True),
    "silu": (silu_formula, True),
    "sigmoid": (lambda x: td.sigmoid(x), True),
    "tanh": (lambda x: td.tanh(x), True),
    "exp": (lambda x: td.exp(x), True),
    "log": (lambda x: td.log(x), True),
    "sqrt": (lambda x: td.sqrt(x), True),
    "rsqrt": (lambda x: td.rsqrt(x), True),
    "erf": (lambda x: td.erf(x), True),
}


def _binary_plan(name, a, b) -> Plan:
    dtype = result_dtype(a, b)
    if name == "sub" and dtype.kind == "b":
        raise TypeError("sub of two bool operands is not defined (numpy refuses it too); use a logical xor "
                        "(where(a, ~b, b)) or cast them to an integer type first")
    if name in _FLOAT_BINARY:
        dtype = _float_dtype(dtype)
    values = [_operand(a, dtype), _operand(b, dtype)]
    return _elementwise_plan(name, values, _BINARY[name], dtype, (dtype, dtype))


def _unary_plan(name, x) -> Plan:
    x = _operand(x, _own_dtype(x))
    fn, float_only = _UNARY[name]
    dtype = _float_dtype(x.dtype) if float_only else x.dtype
    if not float_only and dtype.kind == "b":
        raise TypeError(f"{name} is not defined on bool arrays")
    return _elementwise_plan(name, [x], fn, dtype, (dtype,))


def _clip_plan(x, lo=None, hi=None) -> Plan:
    if lo is None and hi is None:
        raise ValueError("clip needs at least one of lo, hi")
    x = _operand(x, _own_dtype(x))
    dtype = x.dtype
    values = [x] + [_operand(v, dtype) for v in (lo, hi) if v is not None]
    has = (lo is not None, hi is not None)

    def body(v, *bounds):
        bounds = list(bounds)
        if has[0]:
            v = td.max(v, bounds.pop(0))
        if has[1]:
            v = td.min(v, bounds.pop(0))
        return v

    return _elementwise_plan("clip", values, body, dtype, (dtype,) * len(values), params=has)


def _where_plan(cond, a, b) -> Plan:
    dtype = result_dtype(a, b)
    c = _operand(cond, np.dtype(np.bool_))
    values = [c, _operand(a, dtype), _operand(b, dtype)]
    def body(c, x, y):
        test = c if c.dtype.is_bool else ir.binary("!=", c, ir.const(0, c.dtype))
        return ir.Select(test, x, y, x.dtype)

    # Loads keep 16-bit floats as stored: the select picks a value, no arithmetic.
    return _elementwise_plan("where", values, body, dtype, (None, dtype, dtype))


def _cast_plan(x, dtype) -> Plan:
    x = _operand(x, as_array(x).dtype)   # a Python number exactly (through f32, 16777217.0 became 16777216)
    target = tdtype(dtype)    # a TypeError for numpy dtypes the DSL has no type for

    def body(v):
        return v

    return _elementwise_plan("cast", [x], body, target, (None,))


def custom_plan(name: str, values: list, body: Callable, out_dtype, params: tuple = ()) -> Plan:
    """The Plan of any elementwise `body` (a function of the operands as stored) over broadcast arrays.

    Ops are cached by (name, params, broadcast pattern, dtypes), so `name` and `params` must identify `body`.
    """
    return _elementwise_plan(name, [contiguous(v) for v in values], body, out_dtype, (None,) * len(values), params)


def op_for(name: str, *args, **kwargs) -> Plan:
    """The Plan a call of elementwise function `name` runs (for tests and introspection)."""
    if name in _BINARY:
        return _binary_plan(name, *args, **kwargs)
    if name == "gelu":
        approximate = kwargs.pop("approximate", "none")
        if approximate not in ("none", "tanh"):
            raise ValueError(f"gelu: approximate must be 'none' or 'tanh', got {approximate!r}")
        return _unary_plan("gelu_tanh" if approximate == "tanh" else "gelu", *args, **kwargs)
    if name in _UNARY:
        return _unary_plan(name, *args, **kwargs)
    if name == "clip":
        return _clip_plan(*args, **kwargs)
    if name == "where":
        return _where_plan(*args, **kwargs)
    if name == "cast":
        return _cast_plan(*args, **kwargs)
    raise ValueError(f"unknown elementwise function {name!r}")


def add(a, b):
    """a + b with broadcasting."""
    return _binary_plan("add", a, b).run()


def sub(a, b):
    """a - b with broadcasting."""
    return _binary_plan("sub", a, b).run()


def mul(a, b):
    """a * b with broadcasting."""
    return _binary_plan("mul", a, b).run()


def div(a, b):
    """a / b (true division; integer operands give f32) with broadcasting."""
    return _binary_plan("div", a, b).run()


def pow(a, b):  # the operator's name shadows the builtin here
    """a ** b (computed in floating point; integer operands give f32) with broadcasting."""
    return _binary_plan("pow", a, b).run()


def maximum(a, b):
    """The elementwise maximum with broadcasting."""
    return _binary_plan("maximum", a, b).run()


def minimum(a, b):
    """The elementwise minimum with broadcasting."""
    return _binary_plan("minimum", a, b).run()


def relu(x):
    """max(x, 0); keeps integer dtypes."""
    return _unary_plan("relu", x).run()


def gelu(x, approximate: str = "none"):
    """GELU: x * Phi(x) with the exact erf form, or the tanh approximation with `approximate="tanh"`."""
    return op_for("gelu", x, approximate=approximate).run()


def silu(x):
    """x * sigmoid(x)."""
    return _unary_plan("silu", x).run()


def sigmoid(x):
    """1 / (1 + exp(-x))."""
    return _unary_plan("sigmoid", x).run()


def tanh(x):
    """Hyperbolic tangent, elementwise."""
    return _unary_plan("tanh", x).run()


def exp(x):
    """e ** x, elementwise."""
    return _unary_plan("exp", x).run()


def log(x):
    """Natural logarithm, elementwise."""
    return _unary_plan("log", x).run()


def sqrt(x):
    """Square root, elementwise."""
    return _unary_plan("sqrt", x).run()


def rsqrt(x):
    """1 / sqrt(x)."""
    return _unary_plan("rsqrt", x).run()


def erf(x):
    """The error function, elementwise."""
    return _unary_plan("erf", x).run()


def clip(x, lo=None, hi=None):
    """x clamped to [lo, hi] (either bound may be None; bounds broadcast and take x's dtype)."""
    return _clip_plan(x, lo, hi).run()


def where(cond, a, b):
    """a where cond else b, with broadcasting of all three (cond: bool, or nonzero for other dtypes)."""
    return _where_plan(cond, a, b).run()


def cast(x, dtype):
    """x converted to `dtype` (a numpy dtype or a taskdsl type); float to int truncates toward zero."""
    return _cast_plan(x, dtype).run()


# Elements from which a numpy array of one of ml_dtypes' types converts by the `cast` kernel: ml_dtypes converts
# one element at a time (a (1024, 1024) E4M3 operand to f32: 5.8 ms; the kernel, 0.65 ms; session 87)
ML_DTYPES_CAST_FROM = 1 << 14


def converted(x, dtype):
    """`x` (an operand of matmul or conv) as a contiguous array of numpy `dtype`: a DeviceArray of another type
    through `cast`, where `contiguous` would refuse it, so f16 with f32 computes in f32 on either target; numpy
    arrays on the host, by numpy, or on the cpu target by `cast` for large ones of ml_dtypes' types (bf16, the
    8-bit floats)."""
    if isinstance(x, td.DeviceArray) and x.dtype != dtype:
        return cast(x, dtype)
    if (isinstance(x, np.ndarray) and x.dtype != dtype and x.size >= ML_DTYPES_CAST_FROM and td.get_target() == "cpu"
            and (x.dtype.kind == "V" or x.dtype.itemsize == 1) and x.dtype.name in T.ML_DTYPES_NAMES.values()):
        return cast(x, dtype)
    return contiguous(x, dtype)
