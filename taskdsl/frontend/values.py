"""The translator's two kinds of values: compile-time Python values and runtime IR expressions."""
from __future__ import annotations

from .. import ir


def is_runtime(value) -> bool:
    """True for values only known when the kernel runs (IR expressions)."""
    return isinstance(value, ir.Expr)


def describe(value) -> str:
    """A value as an error message names it: a tensor by name, with how to read its elements."""
    if isinstance(value, ir.Buffer):
        return f"the whole tensor '{value.name}' (index it, {value.name}[i], for an element)"
    if isinstance(getattr(value, "x", None), ir.SpecialReg):      # threadIdx, blockIdx, blockDim, gridDim
        return f"{value!r} itself (use {value!r}.x, .y or .z)"
    if isinstance(value, ir.Expr):
        return f"the runtime value {ir.expr_str(value)} ({value.dtype.name})"
    return "None (no value)" if value is None else type(value).__name__


def is_number(value) -> bool:
    """True for Python and numpy scalars: compile-time numbers."""
    return isinstance(value, (bool, int, float)) or (hasattr(value, "dtype") and hasattr(value, "item")
                                                   and getattr(value, "shape", None) == ())
