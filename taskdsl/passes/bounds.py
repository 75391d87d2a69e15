"""Integer ranges of index expressions, for simplification and guard elision."""
from __future__ import annotations

from .. import ir


def int_range(e: ir.Expr, block: tuple, var_ranges: dict) -> tuple[int, int] | None:
    """Inclusive (lo, hi) of an integer expression, or None when unknown.

    `block` bounds threadIdx; `var_ranges` maps Var uid -> (lo, hi) for loop variables.
    Signed arithmetic is assumed not to overflow (C leaves that undefined); unsigned arithmetic
    and conversions wrap, so a range that leaves an unsigned result's or a conversion's type is
    unknown (`u32(t) - 1` is 4294967295 at t == 0, not -1).
    """
    r = _unbounded_range(e, block, var_ranges)
    wraps = isinstance(e, ir.Cast) or e.dtype.kind == "uint"
    if r is None or not wraps or (e.dtype.holds(r[0]) and e.dtype.holds(r[1])):
        return r
    return None


def _unbounded_range(e: ir.Expr, block: tuple, var_ranges: dict) -> tuple[int, int] | None:
    """int_range computed with unbounded integers, before the check against the type."""
    if isinstance(e, ir.Const):
        return (int(e.value), int(e.value)) if e.dtype.is_integer or e.dtype.is_bool else None
    if isinstance(e, ir.SpecialReg):
        extent = block["xyz".index(e.axis)]
        if e.name == "threadIdx":
            return 0, extent - 1
        if e.name == "blockDim":
            return extent, extent
        return (0, 2**31 - 1) if e.name == "blockIdx" else (1, 2**31 - 1)
    if isinstance(e, ir.Var):
        if e.kind == "size":
            return 0, 2**31 - 1
        return var_ranges.get(e.uid)
    if isinstance(e, ir.Cast) and e.dtype.is_integer and (e.value.dtype.is_integer or e.value.dtype.is_bool):
        return int_range(e.value, block, var_ranges)    # checked against the new type by the caller
    if isinstance(e, ir.Binary) and e.dtype.is_integer:
        a, b = int_range(e.a, block, var_ranges), int_range(e.b, block, var_ranges)
        if a is None or b is None:
            return None
        if e.op == "+":
            return a[0] + b[0], a[1] + b[1]
        if e.op == "-":
            return a[0] - b[1], a[1] - b[0]
        if e.op == "*":
            products = [x * y for x in a for y in b]
            return min(products), max(products)
        if e.op == "//" and b[0] > 0:
            return a[0] // b[1] if a[0] >= 0 else a[0] // b[0], a[1] // b[0] if a[1] >= 0 else a[1] // b[1]
        if e.op == "%" and b[0] > 0:
            if a[0] >= 0 and a[1] < b[0]:
                return a
            return 0, b[1] - 1
    return None
