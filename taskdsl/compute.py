"""Tensor expressions (TVM style): what an operator computes, independent of how it is scheduled.

    A = td.placeholder("A", f32, ("M", "K"))
    Y = td.compute("Y", ("M", "K"), lambda i, j: td.exp(A[i, j]))
    S = td.reduce("S", ("M",), ("K",), lambda i, k: Y[i, k], op="sum")

A definition's body is an ordinary IR expression over its axis variables, in which reading
another tensor is a `Load` of that tensor's buffer. Shapes are ints or size-symbol names;
a symbol names the same size wherever it appears. `evaluate` is the numpy meaning of a
set of definitions: the oracle every schedule is tested against.
"""
from __future__ import annotations

import dataclasses
import functools
import inspect
import math
import operator
import weakref
from dataclasses import dataclass, field

import numba
import numpy as np

from . import ir
from .ir import types as T
from .ir.types import numpy_dtype

REDUCE_OPS = ("sum", "max", "min", "prod", "mean")
# Index grids above this many elements are evaluated frugally (a reduction of a product as an einsum, loads
# through narrowed indices); below it numpy's per-call costs outweigh the memory saved
BIG_GRID = 1 << 16
_SIZE_VARS: dict = {}


def size_var(name: str) -> ir.Var:
    """The size symbol called `name` (one Var per name, shared by every definition)."""
    if name not in _SIZE_VARS:
        _SIZE_VARS[name] = ir.Var(name, T.i32, kind="size")
    return _SIZE_VARS[name]


def _dims(shape, what: str) -> tuple:
    if not isinstance(shape, (int, str, tuple, list, np.integer)):
        raise ValueError(f"{what}: the shape must be a tuple of non-negative ints or size-symbol names, got {shape!r}")
    shape = (shape,) if isinstance(shape, (int, str, np.integer)) else tuple(shape)
    dims = []
    for d in shape:
        if isinstance(d, str):
            dims.append(size_var(d))
        elif isinstance(d, (int, np.integer)) and not isinstance(d, bool) and d >= 0:
            dims.append(ir.const(int(d)))
        elif isinstance(d, ir.Expr) and d.dtype.is_integer and \
                all(v.kind == "size" for v in ir.collect(d, ir.Var)):
            dims.append(d)          # a size computed from size symbols, e.g. cdiv(N, 32)
        else:
            raise ValueError(f"{what}: dims must be non-negative ints or size-symbol names, got {d!r}")
    return tuple(dims)


@dataclass(eq=False)
class Tensor:
    """A placeholder (an input) or the result of a compute / reduce definition."""

    name: str
    dtype: T.DataType
    shape: tuple
    kind: str = "placeholder"                 # 'placeholder', 'compute' or 'reduce'
    axes: tuple = ()
    body: ir.Expr | None = None
    reduce_axes: tuple = ()
    reduce_shape: tuple = ()
    op: str | None = None
    gather_runs: int = 1    # a compute promises: each aligned run of this many elements along its last axis is
                            # one placeholder's consecutive elements (aligned likewise) or zeros, by one condition
    overwrites: "Tensor | None" = None      # a compute computed in place over this placeholder (`in_place`)
    buffer: ir.Buffer = field(init=False)

    def __post_init__(self):
        self.buffer = ir.Buffer(self.name, self.dtype, self.shape, "global")
        # a definition reading the buffer keeps the tensor alive (`_OWNER` does not): an attribute, not a field of
        # the frozen Buffer, which IR walkers and structural keys would visit
        object.__setattr__(self.buffer, "_owner", self)
        _OWNER[self.buffer.uid] = self

    @property
    def ndim(self) -> int:
        return len(self.shape)

    @property
    def inputs(self) -> list:
        """The tensors this definition reads, in first-use order."""
        if self.body is None:
            return []
        seen: dict = {}
        for load in ir.collect(self.body, ir.Load):
            seen.setdefault(load.buffer.uid, _OWNER[load.buffer.uid])
        return list(seen.values())

    @property
    def is_injective(self) -> bool:
        """Whether each element is computed on its own (a compute, not a reduce or an input)."""
        return self.kind == "compute"

    def __iter__(self):
        # without this, Python iterates through __getitem__ with 0, 1, 2, ... forever (nothing bounds a symbolic axis)
        raise TypeError(f"tensor '{self.name}' is not iterable; read elements as {self.name}[i, ...] in a definition, "
                        "and pass tensors to td.op as lists")

    def __getitem__(self, index) -> ir.Load:
        index = index if isinstance(index, tuple) else (index,)
        if len(index) != self.ndim:
            raise IndexError(f"'{self.name}' has {self.ndim} dimension(s) but is indexed with {len(index)}")
        if any(isinstance(i, slice) or i is Ellipsis for i in index):
            raise TypeError(f"'{self.name}' is indexed with a slice; a definition reads one element at a time: give "
                            f"the result the slice's shape and read {self.name}[start + i, ...]")
        exprs = tuple(ir.as_expr(i) for i in index)
        for e in exprs:
            if not (e.dtype.is_integer or e.dtype.is_bool):
                raise TypeError(f"indices of '{self.name}' must be integers, got {e.dtype.name}")
        return ir.Load(self.buffer, exprs)

    def __repr__(self) -> str:
        dims = ", ".join(ir.expr_str(d) for d in self.shape)
        return f"<{self.kind} {self.name}: {self.dtype.name}[{dims}]>"


# buffer uid -> the Tensor it belongs to, while the Tensor lives: an op holding it, or a definition reading its buffer,
# keeps it alive; a program making ops and dropping them kept them all
_OWNER: weakref.WeakValueDictionary = weakref.WeakValueDictionary()


def _name(name, what: str) -> str:
    if not isinstance(name, str) or not name:
        raise TypeError(f"{what}: the name must be a non-empty string, got {name!r}")
    return name


def placeholder(name: str, dtype: T.DataType, shape) -> Tensor:
    """An input tensor of the given dtype and shape (ints or size-symbol names)."""
    what = f"placeholder {_name(name, 'placeholder')!r}"
    dims = _dims(shape, what)
    for d in dims:
        if not isinstance(d, (ir.Const, ir.Var)):     # an input's shape binds symbols: N, not N * 2
            raise ValueError(f"{what}: dims must be ints or size symbols, got {ir.expr_str(d)} (an input's shape "
                             "gives a symbol its value; a size computed from symbols has none to take): give the "
                             "axis a symbol of its own and compute the others from it in the definitions")
    return Tensor(name, T.as_dtype(dtype, what), dims)


def _axis_vars(prefix: str, dims: tuple) -> tuple:
    return tuple(ir.Var(f"{prefix}{k}", T.i32, kind="axis") for k in range(len(dims)))


def _call(fcompute, axes: tuple, what: str, takes: str):
    """`fcompute(*axes)`, after checking that it is a function of that many arguments."""
    if not callable(fcompute):
        raise TypeError(f"{what}: expected a function of {takes}, got {type(fcompute).__name__} {fcompute!r}")
    try:
        signature = inspect.signature(fcompute)
    except (TypeError, ValueError):     # a builtin without a signature: call it as it is
        signature = None
    if signature is not None:
        try:
            signature.bind(*axes)
        except TypeError:
            raise TypeError(f"{what}: the function must take {len(axes)} argument(s) ({takes}), but its "
                            f"signature is {signature}") from None
    with ir.elementwise_equality():
        return fcompute(*axes)


def _body(value, dtype, what: str) -> ir.Expr:
    if not isinstance(value, ir.Expr):
        if isinstance(value, (bool, int, float, np.number, np.bool_)):
            value = ir.as_expr(value)
        else:
            raise TypeError(f"{what}: the function must return an expression, got {type(value).__name__}")
    if dtype is not None and value.dtype != dtype:
        value = ir.Cast(value, dtype)
    return value


def compute(name: str, shape, fcompute, dtype: T.DataType | None = None, gather_runs: int = 1) -> Tensor:
    """A tensor whose element at `axes` is `fcompute(*axes)` (an injective definition).

    `gather_runs` > 1 promises that every run of that many elements along the last axis, starting at a
    multiple of it, is `x[..., j:j + gather_runs]` of one placeholder `x` with `j` a multiple of it, or zeros,
    as one condition decides (an NHWC im2col's runs of channels): a fused asynchronous copy of such a run
    then stays one copy from `x`. An untrue promise gives wrong results."""
    what = f"compute {_name(name, 'compute')!r}"
    if isinstance(gather_runs, bool) or not isinstance(gather_runs, (int, np.integer)) or gather_runs < 1:
        raise ValueError(f"{what}: gather_runs must be a positive int, got {gather_runs!r}")
    dims = _dims(shape, what)
    axes = _axis_vars("i", dims)
    value = _call(fcompute, axes, what, "one index per output axis")
    body = _body(value, None if dtype is None else T.as_dtype(dtype, what), what)
    return Tensor(name, body.dtype, dims, "compute", axes, body, gather_runs=gather_runs)


def reduce(name: str, shape, reduce_shape, fcompute, op: str = "sum", dtype: T.DataType | None = None) -> Tensor:
    """A tensor whose element at `axes` combines `fcompute(*axes, *reduce_axes)` over `reduce_shape` with `op`."""
    what = f"reduce {_name(name, 'reduce')!r}"
    if op not in REDUCE_OPS:
        raise ValueError(f"{what}: op must be one of {', '.join(REDUCE_OPS)}, got {op!r}")
    dims, rdims = _dims(shape, what), _dims(reduce_shape, what)
    axes, raxes = _axis_vars("i", dims), _axis_vars("r", rdims)
    value = _call(fcompute, axes + raxes, what, "the output indices, then the reduction indices")
    body = _body(value, None, what)
    if dtype is not None:
        dtype = T.as_dtype(dtype, what)
    else:
        dtype = T.f32 if body.dtype.computes_in_f32 else body.dtype
        dtype = T.f32 if op == "mean" and not dtype.is_float else dtype
        dtype = T.i32 if op in ("sum", "prod") and dtype.is_bool else dtype    # a count, as C promotes bools
    return Tensor(name, dtype, dims, "reduce", axes, body, raxes, rdims, op)


def in_place(definition: Tensor, source: Tensor) -> Tensor:
    """`definition`, to be computed in the memory that holds placeholder `source` when its kernel starts (a
    residual block's sum over its shortcut): a fused kernel (`td.fuse`, as an epilogue) then reads `source`
    there, and has no parameter for it. The definition must read `source` only at its own element; the kernel
    reads that element before it stores it, so its anchor must store each element once. The values are the same."""
    if definition.kind != "compute" or source.kind != "placeholder":
        raise TypeError(f"in_place: a compute over a placeholder, got {definition.kind} {definition.name!r} over "
                        f"{source.kind} {source.name!r}")
    if not ir.structurally_equal(source.shape, definition.shape) or source.dtype != definition.dtype:
        raise ValueError(f"in_place: {definition!r} can take the memory of a placeholder of its own shape and type "
                         f"only, not of {source!r}")
    return dataclasses.replace(definition, overwrites=source)      # (a tensor of its own: a buffer of its own)


# ---------------------------------------------------------------- topology
def topological(outputs: list) -> list:
    """Every tensor the outputs depend on, producers before consumers."""
    order, seen = [], set()

    def visit(t: Tensor):
        if id(t) in seen:
            return
        seen.add(id(t))
        for x in t.inputs:
            visit(x)
        order.append(t)

    for t in outputs:
        visit(t)
    return order


# ---------------------------------------------------------------- the numpy reference
def _floor_divide(a, b):
    """numpy's `//`, with `MIN // -1` of a signed integer type 0 as on the cpu target (numpy wraps it to MIN)."""
    quotient = np.floor_divide(a, b)
    if quotient.dtype.kind == "i":
        quotient = np.where((np.asarray(b) == -1) & (np.asarray(a) == np.iinfo(quotient.dtype).min), 0, quotient)
    return quotient


def _picked(larger: bool):
    """`td.max` (`td.min`) on arrays as kernels compute it, IEEE 754's maximum (minimum): a NaN if either operand is
    one, else the larger (smaller), -0.0 below 0.0 (numpy's maximum gives either of two zeros by their order)."""
    def pick(a, b):
        a, b = np.asarray(a), np.asarray(b)
        picked = np.maximum(a, b) if larger else np.minimum(a, b)
        if picked.dtype.kind != "f":
            return picked
        zeros = (a == 0) & (b == 0)
        signed = np.signbit(a) & np.signbit(b) if larger else np.signbit(a) | np.signbit(b)
        zero = np.zeros((), picked.dtype)
        return np.where(zeros, np.where(signed, -zero, zero), picked)
    return pick


_NP_BINARY = {"+": np.add, "-": np.subtract, "*": np.multiply, "/": np.true_divide, "//": _floor_divide,
              "%": np.mod, "<": np.less, "<=": np.less_equal, ">": np.greater, ">=": np.greater_equal,
              "==": np.equal, "!=": np.not_equal, "and": np.logical_and, "or": np.logical_or,
              "&": np.bitwise_and, "|": np.bitwise_or, "^": np.bitwise_xor, "<<": np.left_shift,
              ">>": np.right_shift}
_NP_MATH = {"exp": np.exp, "exp2": np.exp2, "log": np.log, "log2": np.log2, "sqrt": np.sqrt,
            "rsqrt": lambda x: 1.0 / np.sqrt(x), "sin": np.sin, "cos": np.cos, "tanh": np.tanh,
            "asin": np.arcsin, "acos": np.arccos, "atan": np.arctan, "sinh": np.sinh, "cosh": np.cosh,
            "asinh": np.arcsinh, "acosh": np.arccosh, "atanh": np.arctanh,
            "abs": np.abs, "floor": np.floor, "ceil": np.ceil, "rint": np.rint, "max": _picked(True),
            "min": _picked(False),
            "pow": np.power, "fma": lambda a, b, c: a * b + c, "sigmoid": lambda x: 1.0 / (1.0 + np.exp(-x))}


def _extreme(larger: bool):
    """A max (min) reduction over `axis` as kernels compute it, IEEE 754's maximum (minimum): numpy's, NaN kept, but
    a zero result is 0.0 where any element is 0.0 (-0.0 where any is -0.0, for min), whatever their order."""
    def reduce(value, axis):
        value = np.asarray(value)
        picked = (np.max if larger else np.min)(value, axis=axis)
        if value.dtype.kind != "f":
            return picked
        sign_wins = (value == 0) & (~np.signbit(value) if larger else np.signbit(value))
        wins = np.any(sign_wins, axis=axis)
        zero = np.zeros((), value.dtype)
        chosen = np.where(wins, zero if larger else -zero, -zero if larger else zero)
        return np.where(picked == 0, chosen, picked)
    return reduce


_NP_REDUCE = {"sum": np.sum, "max": _extreme(True), "min": _extreme(False), "prod": np.prod, "mean": np.mean}


def _rounded(value: np.ndarray, dtype: T.DataType) -> np.ndarray:
    """`value` as the reference computes values of `dtype`: rounded to `dtype` first where that is a 16- or 8-bit
    float (held in f32 afterwards, as kernels compute with them), once (ml_dtypes rounds f64 and integers to bf16
    through f32, twice), the 8-bit ones saturated."""
    value = np.asarray(value)
    wider_than_f32 = value.dtype.itemsize > (4 if value.dtype.kind == "f" else 2)     # (i16's values f32 holds)
    if dtype == T.bf16 and value.dtype.kind in "iuf" and wider_than_f32:
        value = _rounded_to_odd_f32(value.astype(np.float64))
    if dtype.bits == 8 and dtype.is_float:     # saturated, as kernels convert (ml_dtypes gives NaN or inf past it)
        largest = T.FLOAT8_FORMATS[dtype.name][2]
        value = _rounded_to_odd_f32(np.clip(value.astype(np.float64), -largest, largest))
    if dtype.computes_in_f32:
        value = value.astype(numpy_dtype(dtype))
    return value.astype(_compute_dtype(dtype))


def _rounded_to_odd_f32(x: np.ndarray) -> np.ndarray:
    """f64 values as f32 rounded to odd (toward zero, the last bit set where inexact): rounding those to a float
    of 8 or more bits fewer rounds as from the f64 values themselves."""
    with np.errstate(over="ignore"):
        nearest = x.astype(np.float32)
    wide = nearest.astype(np.float64)
    inexact = np.isfinite(nearest) & (wide != x)
    bits = nearest.view(np.uint32) - (inexact & (np.abs(wide) > np.abs(x))).astype(np.uint32)    # toward zero
    return (bits | inexact.astype(np.uint32)).view(np.float32)


def _saturated(value: np.ndarray, dtype: T.DataType) -> np.ndarray:
    """Floats converted to the integer `dtype` as kernels convert them (`DataType.saturate`): truncated, clamped to
    the type's range, NaN giving 0."""
    low, high = dtype.limits
    out = np.zeros(value.shape, numpy_dtype(dtype))
    inside = (value >= low) & (value < high + 1.0)      # NaN is neither inside nor past a bound
    out[inside] = np.trunc(value[inside])
    out[value < low], out[value >= high + 1.0] = low, high
    return out


def accumulator_dtype(t: Tensor) -> T.DataType:
    """The type partial results are kept in: the wider of the values' and the result's (floats in at least f32,
    integers in at least i32), so a sum of i32 values into i64 does not wrap first."""
    values, result = t.body.dtype, t.dtype
    if values.is_float or (result.is_float and t.op != "mean"):
        return T.f64 if T.f64 in (values, result) else T.f32
    if t.op == "mean":      # of integers: summed exactly in i64 (an f32 sum lost 2**29 + 2's last bits), divided in
        return T.f64 if values.bits == 64 else T.i64      # f64; of 64-bit ones in f64, as onnxruntime: i64 would wrap
    return T.promote(T.promote(values, result), T.i32)


_IDENTITY = {"sum": 0, "mean": 0, "prod": 1, "max": -math.inf, "min": math.inf}


def reduction_identity(op: str, dtype: T.DataType, values: T.DataType) -> ir.Const:
    """What a reduction `op` accumulated in `dtype` starts from (and gives over no elements): max and min of integer
    `values` start at their type's extremes, of bools False (any) and True (all), not at the accumulator's (INT_MIN
    stored to a bool is True)."""
    value = _IDENTITY[op]
    if (dtype.is_bool or values.is_bool) and math.isinf(value):
        return ir.const(value > 0 if dtype.is_bool else int(value > 0), dtype)
    if not dtype.is_float and math.isinf(value):    # the values' extremes: an i8 max starts at -128, not at its
        value = values.limits[0 if value < 0 else 1]  # i32 accumulator's INT_MIN, which an empty one wrapped to 0
    return ir.const(value, dtype)


def _stored(value, shape: tuple, dtype: T.DataType) -> np.ndarray:
    """A tensor's values of `shape` in its type, as a kernel stores them (floats into an integer type saturated)."""
    value = np.asarray(value)
    if dtype.is_integer and value.dtype.kind == "f":
        value = _saturated(value, dtype)
    return np.broadcast_to(value, shape).astype(numpy_dtype(dtype))


def _compute_dtype(dtype: T.DataType):
    """The dtype the reference computes an IR type in (16- and 8-bit floats are computed in f32, as in kernels)."""
    return np.float32 if dtype.computes_in_f32 else dtype.numpy


def _erf_scalar(x):
    return math.erf(x)


@functools.cache
def _erf():
    """math.erf as a ufunc (numpy has none), made on first use: numba compiles it once, then loads it from disk."""
    return numba.vectorize(["float64(float64)"], cache=True)(_erf_scalar)


class _Evaluator:
    """Vectorized numpy evaluation of definition bodies over whole index grids."""

    def __init__(self, arrays: dict, sizes: dict):
        self.arrays = arrays        # buffer uid -> ndarray
        self.sizes = sizes          # size name -> int

    def dim(self, d) -> int:
        unbound = [v.name for v in ir.collect(d, ir.Var) if v.kind == "size" and v.name not in self.sizes]
        if unbound:
            raise ValueError(f"size '{unbound[0]}' is not determined by the shape of any input")
        try:
            return ir.evaluate_int(d, self.sizes)       # in Python's ints: N * N of i32 sizes would wrap
        except TypeError:                               # (min, max, ...: as the kernels compute them)
            return int(self.eval(d, {}))

    def dims(self, t: Tensor, dims: tuple) -> tuple:
        """The values of `dims`, sizes of `t` (ValueError where one is negative: the inputs are too small for it; or
        past 2^31 - 1, which no axis may hold: sizes are i32)."""
        values = tuple(self.dim(d) for d in dims)
        for d, n in zip(dims, values):
            bound = ", ".join(f"{k}={v}" for k, v in self.sizes.items())
            if n < 0:
                raise ValueError(f"'{t.name}' would have a negative size: {ir.expr_str(d)} = {n} for {bound}; "
                                 "its inputs are too small for the definition")
            if n > T.i32.limits[1]:
                raise ValueError(f"'{t.name}' would have an axis of {ir.expr_str(d)} = {n} elements for {bound}, "
                                 f"past the {T.i32.limits[1]} an axis may hold (sizes are i32)")
        return values

    def eval(self, e, env: dict, live=None):
        """The value of `e` over the index grid `env`; `live` (None: everywhere) marks where it is used, which a
        select's branches and the right operand of `and` / `or` narrow (the kernels evaluate them only there)."""
        if isinstance(e, ir.Const):
            return np.asarray(e.value, dtype=_compute_dtype(e.dtype))
        if isinstance(e, ir.Var):
            return env[e.uid] if e.kind != "size" else np.int32(self.sizes[e.name])
        if isinstance(e, ir.Load):
            return self._load(e, env, live)
        if isinstance(e, ir.Binary):
            a = self.eval(e.a, env, live)
            if e.op in ("and", "or"):
                taken = np.asarray(a, bool) if e.op == "and" else ~np.asarray(a, bool)
                b = self.eval(e.b, env, taken if live is None else live & taken)
            else:
                b = self.eval(e.b, env, live)
            with np.errstate(all="ignore"):
                return np.asarray(_NP_BINARY[e.op](a, b)).astype(_compute_dtype(e.dtype), copy=False)
        if isinstance(e, ir.Unary):
            a = self.eval(e.a, env, live)
            return {"-": operator.neg, "not": np.logical_not, "~": np.invert}[e.op](a)
        if isinstance(e, ir.Select):
            cond = np.asarray(self.eval(e.cond, env, live), bool)
            a = self.eval(e.a, env, cond if live is None else live & cond)
            b = self.eval(e.b, env, ~cond if live is None else live & ~cond)
            return _rounded(np.where(cond, a, b), e.dtype)
        if isinstance(e, ir.Cast):
            value = np.asarray(self.eval(e.value, env, live))
            if e.dtype.is_integer and value.dtype.kind == "f":
                value = _saturated(value, e.dtype)
            return _rounded(value, e.dtype)
        if isinstance(e, ir.Call):
            args = [self.eval(a, env, live) for a in e.args]
            fn = _erf() if e.func == "erf" else _NP_MATH[e.func]
            with np.errstate(all="ignore"):
                return np.asarray(fn(*args)).astype(_compute_dtype(e.dtype))
        raise TypeError(f"the reference evaluator cannot evaluate {type(e).__name__}")

    def _load(self, e: ir.Load, env: dict, live):
        """`e`'s elements; an index outside the tensor where the value is used is an error (a kernel would read out
        of bounds), elsewhere it is clipped into range (an untaken branch, which numpy evaluates too)."""
        array = self.arrays[e.buffer.uid]
        raw = [np.asarray(self.eval(i, env, live)).astype(np.int64) for i in e.indices]
        if math.prod(np.broadcast_shapes(*(i.shape for i in raw))) > BIG_GRID:
            raw = [_narrowest(i) for i in raw]
        outside = np.zeros((), bool)
        for i, n in zip(raw, array.shape):
            outside = outside | (i < 0) | (i >= n)
        if live is not None and outside.any():     # (only then: `live` may broadcast `outside` to a big shape)
            outside = outside & live
        if outside.any():
            at = tuple(int(np.broadcast_to(i, outside.shape)[outside][0]) for i in raw)
            raise ValueError(f"a definition reads {e.buffer.name}{list(at)}, outside its shape {array.shape}; guard "
                             f"the read with a select (taskdsl.ir.Select(i < n, x[i], 0.0, dtype)) where it can leave "
                             "the tensor")
        index = tuple(np.clip(i, 0, max(n - 1, 0)) for i, n in zip(raw, array.shape))
        return array[index].astype(_compute_dtype(e.buffer.dtype)) if array.size else \
            np.zeros(np.broadcast(*index).shape, _compute_dtype(e.buffer.dtype))

    def grid(self, axes: tuple, dims: tuple) -> dict:
        """Broadcastable index arrays, one per axis."""
        n = len(axes)
        return {a.uid: np.arange(self.dim(d), dtype=np.int64).reshape([-1 if k == j else 1 for j in range(n)])
                for k, (a, d) in enumerate(zip(axes, dims))}

    def tensor(self, t: Tensor) -> np.ndarray:
        shape = self.dims(t, t.shape)
        if t.kind == "compute":
            value = self.eval(t.body, self.grid(t.axes, t.shape))
        else:
            all_axes, all_dims = t.axes + t.reduce_axes, t.shape + t.reduce_shape
            full = self.dims(t, all_dims)
            product = _product_of(t) if 0 not in full and math.prod(full) > BIG_GRID else None
            value = self._contraction(t, *product, full) if product else None
            if value is not None:
                return _stored(value, shape, t.dtype)
            value = np.broadcast_to(self.eval(t.body, self.grid(all_axes, all_dims)), full)
            # accumulated in the wider of the values' and the result's types, as the kernels do, then converted
            value = value.astype(np.float64 if t.op == "mean" else _compute_dtype(accumulator_dtype(t)))
            axes = tuple(range(len(t.axes), len(all_axes)))
            if 0 in full and t.op in ("max", "min"):   # the identity: what kernels start from
                value = np.full(shape, reduction_identity(t.op, accumulator_dtype(t), t.body.dtype).value, value.dtype)
            else:
                value = _NP_REDUCE[t.op](value, axis=axes)
        return _stored(value, shape, t.dtype)

    def _contraction(self, t: Tensor, guard, factors: list, full: tuple):
        """A sum or mean of a product (`_product_of`) by numpy's einsum, which never holds the whole domain of
        the reduction (a matmul's (M, N, K), a convolution's output times its window); None where a factor is
        not finite where the guard leaves it out (0 * inf is NaN, but the guarded sum skips the term)."""
        env = self.grid(t.axes + t.reduce_axes, t.shape + t.reduce_shape)
        live = None if guard is None else np.asarray(self.eval(guard, env), bool)
        # einsum sums some factors before it multiplies by others, which can overflow where the products in
        # order do not (a * a * scale): more than two factors are multiplied in f64
        accumulator = np.float64 if t.op == "mean" or len(factors) > 2 else \
            np.result_type(_compute_dtype(t.body.dtype), _compute_dtype(t.dtype))
        operands = [np.asarray(self.eval(f, env, live)).astype(accumulator, copy=False) for f in factors]
        if live is not None:
            if not all(np.isfinite(x).all() for x in operands):
                return None
            operands.append(live.astype(accumulator))
        total = _einsum_sum(operands, full, len(t.axes))
        return total / math.prod(full[len(t.axes):]) if t.op == "mean" else total


def _narrowest(index: np.ndarray) -> np.ndarray:
    """`index` with the axes along which it does not change cut to 1 (a grouped convolution's channel
    `o // (O / groups) * C + c` with one group does not depend on o): what is loaded through it is no bigger."""
    for axis, n in enumerate(index.shape):
        if n > 1:
            first = index[(slice(None),) * axis + (slice(0, 1),)]
            if (index == first).all():
                index = first
    return index


def _product_of(t: Tensor) -> tuple | None:
    """(guard or None, factors) where `t` is a float sum or mean of a product, possibly under a select that gives
    0 where its guard fails (a convolution's padding); None otherwise."""
    body, guard = t.body, None
    if isinstance(body, ir.Select) and isinstance(body.b, ir.Const) and body.b.value == 0:
        body, guard = body.a, body.cond
    if t.op not in ("sum", "mean") or not (isinstance(body, ir.Binary) and body.op == "*" and body.dtype.is_float):
        return None     # (an integer product wraps in its type: the general path multiplies in it)
    factors, pending = [], [body]
    while pending:
        e = pending.pop()
        if isinstance(e, ir.Binary) and e.op == "*" and e.dtype == body.dtype:
            pending += [e.a, e.b]
        else:
            factors.append(e)
    return guard, factors


def _einsum_sum(operands: list, full: tuple, kept: int) -> np.ndarray:
    """The sum over axes kept.. of the product of `operands`, each broadcastable to `full`, shaped to broadcast to
    full[:kept]. Axes of size 1 in an operand are left out of its subscripts, so that numpy contracts only what
    each operand depends on (a reduction axis no operand depends on multiplies the sum by its size)."""
    letters, arrays, subscripts = "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ", [], []
    for x in operands:
        x = x.reshape((1,) * (len(full) - x.ndim) + x.shape)
        axes = [k for k, n in enumerate(x.shape) if n != 1]
        arrays.append(x.reshape([x.shape[k] for k in axes]))
        subscripts.append("".join(letters[k] for k in axes))
    used = set("".join(subscripts))
    out = [k for k in range(kept) if letters[k] in used]
    with np.errstate(all="ignore"):      # inf * 0 is NaN, as in the general path, without a warning
        total = np.einsum(",".join(subscripts) + "->" + "".join(letters[k] for k in out), *arrays, optimize=True)
    unused = math.prod(n for k, n in enumerate(full[kept:], kept) if letters[k] not in used)
    return (total * unused).reshape([full[k] if k in out else 1 for k in range(kept)])


def bind_sizes(placeholders: list, arrays: list) -> dict:
    """Size-symbol values from the input arrays' shapes (ValueError on any mismatch)."""
    sizes: dict = {}
    for p, a in zip(placeholders, arrays):
        if a.ndim != p.ndim:
            raise ValueError(f"input '{p.name}' must be {p.ndim}-d, got shape {a.shape}")
        for axis, (d, n) in enumerate(zip(p.shape, a.shape)):
            if isinstance(d, ir.Const):
                if d.value != n:
                    raise ValueError(f"axis {axis} of input '{p.name}' must be {d.value}, got shape {a.shape}")
            elif sizes.setdefault(d.name, n) != n:
                raise ValueError(f"size '{d.name}' is {sizes[d.name]} from an earlier input but {n} in "
                                 f"'{p.name}' (shape {a.shape})")
    return sizes


CHECKED_DOMAIN = 1 << 20     # definitions of up to this many (output x reduction) elements have every read checked


class _FixedReads(ir.Visitor):
    """Finds a read outside its tensor that no condition keeps out: at an index no axis moves (X[i, 5], X[N]), which
    every element makes; and, over a domain of up to CHECKED_DOMAIN elements, at an index an axis moves (X[i + 1]),
    evaluated for every element. A select's branches and the right side of `and` / `or` are read where their
    condition (of the indices and sizes) picks them; a condition that reads memory may guard its reads anywhere. A
    kernel would read out of bounds there, silently."""

    def __init__(self, t: Tensor, evaluator: "_Evaluator", domain: tuple):
        self.t, self.evaluator, self.guarded, self.domain = t, evaluator, 0, domain      # domain: the axes' sizes
        self.size = math.prod(domain)
        small = self.size <= CHECKED_DOMAIN
        self.grid = evaluator.grid(t.axes + t.reduce_axes, t.shape + t.reduce_shape) if small else None
        self.live = None        # where the reads visited now are made: None everywhere, else a mask of the domain

    def visit_Select(self, e: ir.Select):
        self.visit(e.cond)
        picked = self._mask(e.cond)
        if picked is None:
            self._guarded(e.a, e.b)
        else:
            self._where(picked, e.a)
            self._where(~picked, e.b)

    def visit_Binary(self, e: ir.Binary):
        if e.op not in ("and", "or"):
            return self.generic_visit(e)
        self.visit(e.a)
        decided = self._mask(e.a)       # `b` is read where `a` does not decide
        if decided is None:
            self._guarded(e.b)
        else:
            self._where(decided if e.op == "and" else ~decided, e.b)

    def _mask(self, cond: ir.Expr):
        """Where `cond` holds over the domain, or None: a condition that reads memory (unknown here), or a domain
        too large to evaluate."""
        if self.grid is None or ir.collect(cond, ir.Load):
            return None
        return np.broadcast_to(np.asarray(self.evaluator.eval(cond, self.grid), bool), self.domain)

    def _where(self, mask, e: ir.Expr):
        outer = self.live
        self.live = mask if outer is None else outer & mask
        self.visit(e)
        self.live = outer

    def _guarded(self, *exprs):
        self.guarded += 1
        for x in exprs:
            self.visit(x)
        self.guarded -= 1

    def visit_Load(self, e: ir.Load):
        self.generic_visit(e)
        if self.guarded:
            return
        for axis, (i, d) in enumerate(zip(e.indices, e.buffer.shape)):
            moved = any(v.kind != "size" for v in ir.collect(i, ir.Var))
            if ir.collect(i, ir.Load) or moved and self.grid is None:
                continue
            values, n = np.asarray(self.evaluator.eval(i, self.grid if moved else {})), self.evaluator.dim(d)
            outside = (values < 0) | (values >= n)
            counted = moved or self.live is not None
            if self.live is not None:
                values = np.broadcast_to(values, self.domain)
                outside = np.broadcast_to(outside, self.domain) & self.live
            if outside.any():
                at = ", ".join(ir.expr_str(x) for x in e.indices)
                count = int(np.broadcast_to(outside, self.domain).sum()) if counted else 0
                where = f"for {count} of its {self.size} elements" if counted else "for every element"
                raise ValueError(f"{self.t.kind} {self.t.name!r} reads {e.buffer.name}[{at}]: index "
                                 f"{int(values[outside].flat[0])} on axis {axis} is outside [0, {n}) {where} (negative "
                                 "indices do not count from the end); use an index inside the tensor, or guard the "
                                 "read with a select (taskdsl.ir.Select(i < n, x[i], 0.0, dtype))")


def check_fixed_reads(definitions: list, sizes: dict) -> None:
    """ValueError for an unguarded read outside its tensor in any non-empty definition (`_FixedReads`), which
    kernels of it would make out of bounds, silently."""
    evaluator = _Evaluator({}, sizes)
    for t in definitions:
        if t.body is None:
            continue
        domain = evaluator.dims(t, t.shape + t.reduce_shape)
        if 0 not in domain:
            _FixedReads(t, evaluator, domain).visit(t.body)


def evaluate(inputs: list, outputs: list, arrays: list) -> list:
    """The numpy reference: the values of `outputs` for the given input arrays."""
    if len(arrays) != len(inputs):
        raise TypeError(f"expected {len(inputs)} input arrays ({', '.join(t.name for t in inputs)}), got {len(arrays)}")
    arrays = [np.asarray(a) for a in arrays]
    evaluator = _Evaluator({p.buffer.uid: a for p, a in zip(inputs, arrays)}, bind_sizes(inputs, arrays))
    for t in topological(outputs):
        if t.kind == "placeholder":
            if t.buffer.uid not in evaluator.arrays:
                raise ValueError(f"'{t.name}' is used by the outputs but is not one of the inputs")
            continue
        evaluator.arrays[t.buffer.uid] = evaluator.tensor(t)
    return [evaluator.arrays[t.buffer.uid] for t in outputs]
