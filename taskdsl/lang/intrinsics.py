"""What kernel bodies may call: index registers, memory, barriers, math, casts, atomics, warp ops,
tensor cores (mma, ldmatrix), byte dot products (dot4), asynchronous copies (cp_async) and cache hints (prefetch).

Each entry is a marker the frontend recognises; math functions also work on plain Python
numbers outside kernels, so host code and tests can share formulas with kernels.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from ..ir.expr import Expr, SpecialReg, as_expr, convert
from ..ir.expr import math_expr as ir_math_expr
from ..ir.types import as_dtype, numpy_dtype


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
    kind: str          # 'math', 'memory', 'barrier', 'cast', 'atomic', 'warp', 'loop', 'tensor', 'hint'
    host: object = None

    def __call__(self, *args, **kwargs):
        if self.host is None:
            raise RuntimeError(f"td.{self.name}() can only be used inside a @td.kernel or @td.func body")
        if self.kind == "math" and any(isinstance(a, Expr) for a in args):
            return ir_math_expr(self.name, list(args))   # e.g. inside a td.compute definition
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
    """max (min): the larger (smaller) operand, a NaN if either is one, -0.0 below 0.0: IEEE 754's maximum / minimum
    (Python's max depends on the argument order with a NaN or two zeros)."""
    def host(a, b):
        if a != a:
            return a
        if b != b or (b > a if larger else b < a):
            return b
        if a == 0 and b == 0:
            negative = math.copysign(1, a) < 0
            return b if negative == larger else a
        return a
    return host


_MATH_HOST = {
    "exp": _ieee(np.exp), "exp2": _ieee(np.exp2), "log": _ieee(np.log), "log2": _ieee(np.log2),
    "sqrt": _ieee(np.sqrt), "rsqrt": _ieee(lambda x: 1.0 / np.sqrt(x)), "sin": _ieee(np.sin), "cos": _ieee(np.cos),
    "tanh": _ieee(np.tanh), "asin": _ieee(np.arcsin), "acos": _ieee(np.arccos), "atan": _ieee(np.arctan),
    "sinh": _ieee(np.sinh), "cosh": _ieee(np.cosh), "asinh": _ieee(np.arcsinh), "acosh": _ieee(np.arccosh),
    "atanh": _ieee(np.arctanh), "erf": _ieee(math.erf), "floor": _ieee(np.floor), "ceil": _ieee(np.ceil),
    "rint": _ieee(np.rint),
    "pow": _ieee(np.power), "fma": _ieee(lambda a, b, c: a * b + c), "sigmoid": _ieee(lambda x: 1.0 / (1.0 + np.exp(-x))),
    "abs": abs, "max": _pick(True), "min": _pick(False),
}
MATH = {name: Intrinsic(name, "math", fn) for name, fn in _MATH_HOST.items()}


def math_expr(name: str, args: list):
    """The typed IR call of math function `name` on `args` (IR values and Python numbers; of numbers only, the
    number, as td.exp(1.0) gives it); an unknown name is a ValueError."""
    if name not in MATH:
        raise ValueError(f"td.math_expr: no math function {name!r}; the functions are {', '.join(sorted(MATH))}")
    return MATH[name](*args)

shared = Intrinsic("shared", "memory")
registers = Intrinsic("registers", "memory")
syncthreads = Intrinsic("syncthreads", "barrier")
prefetch = Intrinsic("prefetch", "hint")
def _cast_expr(value, dtype):
    """td.cast outside a kernel: an IR value (a td.compute definition's) as `dtype` (a type, its name or a numpy
    dtype); a number as the numpy scalar a kernel's cast gives (float to int saturates)."""
    dtype = as_dtype(dtype, "td.cast")
    if isinstance(value, (bool, int, float, np.bool_, np.integer, np.floating)):
        return np.asarray(convert(as_expr(value), dtype).value, numpy_dtype(dtype))[()]
    if not isinstance(value, Expr):
        raise RuntimeError("td.cast() can only be used inside a @td.kernel or @td.func body, on the values of a "
                           "td.compute definition, or on a number; convert arrays with numpy (.astype)")
    return convert(value, dtype)


cast = Intrinsic("cast", "cast", _cast_expr)
unroll = Intrinsic("unroll", "loop")
ATOMICS = {f"atomic_{op}": Intrinsic(f"atomic_{op}", "atomic") for op in ("add", "sub", "max", "min", "exch")}
WARP_OPS = {name: Intrinsic(name, "warp") for name in ("shfl_xor", "shfl_down", "shfl_up", "shfl_idx")}
syncwarp = Intrinsic("syncwarp", "barrier")
# Tensor-core fragments, asynchronous global -> shared copies (sm_80+) and the cpu's byte dot products (dot4); see
# docs/dsl-reference.md.
TENSOR_OPS = {name: Intrinsic(name, "tensor") for name in
              ("mma_m16n8k16", "mma_m16n8k32", "ldmatrix", "cp_async", "cp_async_commit", "cp_async_wait", "dot4")}


def cdiv(a, b):
    """Ceiling division, on ints (host code, grid lambdas) and IR values (kernel bodies)."""
    if isinstance(a, str) or isinstance(b, str):     # a size symbol's name, in a definition's shape
        raise TypeError(f"td.cdiv({a!r}, {b!r}): a size symbol in an expression is td.size_var(name) (or a "
                        f"placeholder's shape[k]): td.cdiv(td.size_var({(a if isinstance(a, str) else b)!r}), ...)")
    return (a + b - 1) // b
