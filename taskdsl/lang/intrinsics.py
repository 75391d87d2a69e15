"""What kernel bodies may call: index registers, memory, barriers, math, casts, atomics, warp ops,
tensor cores (mma, ldmatrix) and asynchronous copies (cp_async).

Each entry is a marker the frontend recognises; math functions also work on plain Python
numbers outside kernels, so host code and tests can share formulas with kernels.
"""
from __future__ import annotations

import functools
import math
from dataclasses import dataclass

import numpy as np

from ..ir import types as T
from ..ir.expr import Call, Expr, SpecialReg, as_expr, const, convert


class _Dim3:
    """`threadIdx` / `blockIdx` / `blockDim` / `gridDim`: `.x`, `.y`, `.z` are IR index registers."""

    def __init__(self, name: str):
        self._name = name
        self.x, self.y, self.z = (SpecialReg(name, axis) for axis in "xyz")

    def __repr__(self) -> str:
        return self._name


threadIdx, blockIdx, blockDim, gridDim = (_Dim3(n) for n in ("threadIdx", "blockIdx", "blockDim", "gridDim"))
warp_size = 32


@dataclass(frozen=True)
class Intrinsic:
    """A function kernels may call; `kind` says how the frontend lowers it."""

    name: str
    kind: str          # 'math', 'memory', 'barrier', 'cast', 'atomic', 'warp', 'loop', 'tensor'
    host: object = None

    def __call__(self, *args, **kwargs):
        if self.host is None:
            raise RuntimeError(f"td.{self.name}() can only be used inside a @td.kernel or @td.func body")
        if self.kind == "math" and any(isinstance(a, Expr) for a in args):
            return math_expr(self.name, list(args))   # e.g. inside a td.compute definition
        return self.host(*args, **kwargs)

    def __repr__(self) -> str:
        return f"td.{self.name}"


def _ieee(function):
    """`function` (numpy's) on Python numbers in f64, giving inf or nan where Python's math would raise, as kernels do."""
    def host(*args):
        with np.errstate(all="ignore"):
            return float(function(*(np.float64(a) for a in args)))
    return host


def _pick(larger: bool):
    """max (min): the larger (smaller) operand, a NaN if either is one, the first of equal ones (numpy's
    maximum / minimum; Python's max depends on the argument order with a NaN)."""
    def host(a, b):
        if a != a:
            return a
        return b if b != b or (b > a if larger else b < a) else a
    return host


_MATH_HOST = {
    "exp": _ieee(np.exp), "exp2": _ieee(np.exp2), "log": _ieee(np.log), "log2": _ieee(np.log2),
    "sqrt": _ieee(np.sqrt), "rsqrt": _ieee(lambda x: 1.0 / np.sqrt(x)), "sin": _ieee(np.sin), "cos": _ieee(np.cos),
    "tanh": _ieee(np.tanh), "erf": _ieee(math.erf), "floor": _ieee(np.floor), "ceil": _ieee(np.ceil),
    "pow": _ieee(np.power), "fma": _ieee(lambda a, b, c: a * b + c), "sigmoid": _ieee(lambda x: 1.0 / (1.0 + np.exp(-x))),
    "abs": abs, "max": _pick(True), "min": _pick(False),
}
MATH_ARITY = {"max": 2, "min": 2, "pow": 2, "fma": 3}
MATH = {name: Intrinsic(name, "math", fn) for name, fn in _MATH_HOST.items()}

shared = Intrinsic("shared", "memory")
registers = Intrinsic("registers", "memory")
syncthreads = Intrinsic("syncthreads", "barrier")
cast = Intrinsic("cast", "cast")
unroll = Intrinsic("unroll", "loop")
ATOMICS = {f"atomic_{op}": Intrinsic(f"atomic_{op}", "atomic") for op in ("add", "sub", "max", "min", "exch")}
WARP_OPS = {name: Intrinsic(name, "warp") for name in ("shfl_xor", "shfl_down", "shfl_up", "shfl_idx")}
syncwarp = Intrinsic("syncwarp", "barrier")
# Tensor-core fragments and asynchronous global -> shared copies (sm_80+); see docs/dsl-reference.md.
TENSOR_OPS = {name: Intrinsic(name, "tensor") for name in
              ("mma_m16n8k16", "ldmatrix", "cp_async", "cp_async_commit", "cp_async_wait")}


def math_expr(name: str, args: list) -> Expr:
    """The typed IR call of math function `name` on `args` (IR values and Python numbers).

    Types promote as in arithmetic; transcendental functions of integers, and all math on
    16-bit floats, are computed in f32; max/min/abs keep integer types.
    """
    arity = MATH_ARITY.get(name, 1)
    if len(args) != arity:
        raise TypeError(f"td.{name}() takes {arity} argument{'s' if arity > 1 else ''}, got {len(args)}")
    dtype = functools.reduce(T.promote, [a.dtype for a in args if isinstance(a, Expr)])
    for a in args:   # an int literal the typed arguments cannot hold takes part with its own type, as in arithmetic
        if type(a) is int and dtype.is_integer and not dtype.holds(a):
            dtype = T.promote(dtype, const(a).dtype)
    if any(isinstance(a, float) for a in args) and not dtype.is_float:
        dtype = T.f32   # a Python float with an integer value: as in arithmetic, the float wins
    if (name not in ("max", "min", "abs") and not dtype.is_float) or (dtype.is_float and dtype.bits == 16):
        dtype = T.f32
    if dtype.is_bool or (dtype.is_integer and dtype.bits < 32):
        dtype = T.i32       # C's integer promotion, as in arithmetic (abs(i8(-128)) is 128)
    exprs = [convert(as_expr(a, dtype), dtype) for a in args]
    if name == "abs" and dtype.kind == "uint":
        return exprs[0]     # C++ has no abs of unsigned types (an ambiguous overload)
    return Call(name, tuple(exprs), dtype)


def cdiv(a, b):
    """Ceiling division, on ints (host code, grid lambdas) and IR values (kernel bodies)."""
    return (a + b - 1) // b
