"""Kernels that differ only in integer constants, made one kernel over size symbols (anti-unification).

A model's fused convolutions are one template at many shapes: fusion fixes each to its own sizes, so
their IRs differ only in constants (M = 3136 or 784, an epilogue's 64 or 128 channels). Compiled
apart, each costs seconds of numba. `generalize` groups such functions and gives each group one
function in which every constant that differs across the group is a size symbol:

    f(x) = A[3136 * x + 64]        g(x) = A[784 * x + 64]
    shared(x) = A[lifted_0 * x + 64]       f: {lifted_0: 3136}     g: {lifted_0: 784}

A constant that takes the same values at two places in every member becomes the same symbol, so
`(i // 56) * 56 + i % 56` stays foldable. The shared function with a member's values bound is that
member's function, exactly: sharing changes which code runs, never what it computes.

Only i32 constants of zero or more, as sizes are, become symbols; constants that passes and code
generators need as numbers keep a member apart: the shapes of shared and register buffers (they are
allocated by size), the bounds of `td.unroll` loops, loop steps, and the shape of a tensor of more than 2^31 - 1
elements (flattening indexes it in i64 because its shape says so).
"""
from __future__ import annotations

import dataclasses
import math
from collections import defaultdict

from .. import ir
from ..ir import types as T
from .specialize import _BufferRewriter

LIFTED = "lifted_"      # the prefix of the size symbols generalize makes (not "shared": that is a memory scope)
_HOLE = ir.Var("#", T.i32, kind="size")     # every liftable constant, in the text that groups functions


class _Constants(_BufferRewriter):
    """Replaces the liftable constants in visiting order: the k-th by `fill(k, const)`."""

    def __init__(self, fill):
        super().__init__()
        self.fill = fill
        self.count = 0

    def visit_Const(self, c: ir.Const):
        if c.dtype != T.i32 or c.value < 0:
            return c
        self.count += 1
        return self.fill(self.count - 1, c)

    def visit_For(self, s: ir.For):
        if s.unroll:        # its bounds: numbers the unrolling needs
            return dataclasses.replace(s, body=self.visit(s.body))
        # its step stays a number: passes read it (the loop's direction and trip count, in `simplify`)
        return dataclasses.replace(s, start=self.visit(s.start), stop=self.visit(s.stop), body=self.visit(s.body))

    def new_buffer(self, b: ir.Buffer) -> ir.Buffer:
        if b.scope != "global" or _wide(b):     # allocated by its size; or indexed in i64 for its size
            return b
        return dataclasses.replace(b, shape=tuple(self.visit(d) for d in b.shape))


def _wide(b: ir.Buffer) -> bool:
    """Whether `b` has more elements than an i32 counts: flattening indexes it in i64 for its constant shape."""
    dims = [d.value for d in b.shape if isinstance(d, ir.Const)]
    return len(dims) == len(b.shape) and not T.i32.holds(math.prod(dims))


def holes(fn: ir.Function) -> tuple | None:
    """(the function's text with every liftable constant a hole, those constants' values in order), or None where
    the function cannot be spelled. Functions of one text differ only in those values."""
    values: list = []
    masked = _Constants(lambda k, c: values.append(c.value) or _HOLE).run(fn)
    try:
        return ir.structural_text(masked), tuple(values)
    except (ir.Unspellable, RecursionError):
        return None


def shared_form(fn: ir.Function, members: list) -> tuple:
    """(`fn` over size symbols, {symbol name: value} per member) for a group of functions of `fn`'s `holes` text
    whose hole values are `members` (a tuple each): every constant that differs across them is a symbol, one per
    column of values. Where they all agree, `fn` itself and empty dicts."""
    columns = list(zip(*members))       # per constant, its value in each member
    varying = sorted({column for column in columns if len(set(column)) > 1}, key=lambda column: (max(column), column))
    symbols: dict = {}                  # a column of values -> its size symbol
    values: dict = {}                   # a column of values -> what stands for it: its symbol, or a product of two
    for column in varying:
        pair = _factors(column, symbols)
        if pair is None:
            values[column] = symbols[column] = ir.Var(f"{LIFTED}{len(symbols)}", T.i32, kind="size")
        else:
            values[column] = symbols[pair[0]] * symbols[pair[1]]
    if not symbols:
        return fn, [{} for _ in members]
    shared = _Constants(lambda k, c: values.get(columns[k], c)).run(fn)
    shared = dataclasses.replace(shared, sizes=fn.sizes + tuple(symbols.values()))
    return shared, [{v.name: column[position] for column, v in symbols.items()} for position in range(len(members))]


def _factors(column: tuple, symbols: dict) -> tuple | None:
    """Two columns of `symbols` whose values multiply to `column`'s in every member, or None. Written as that
    product, a constant keeps its relation to its factors (an image's H * W pixels beside its H and W), so that
    `simplify` can still join the row-major index of a dimension split in three."""
    for a in symbols:
        for b in symbols:
            if all(x * y == z for x, y, z in zip(a, b, column)):
                return a, b
    return None


def generalize(functions: list) -> list:
    """For each function, (the function it shares with the others of its group, {size symbol name: value} that
    makes it this one); a function alone in its group, or equal to all of its group, comes back as it is."""
    results = [(fn, {}) for fn in functions]
    groups = defaultdict(list)      # text -> [(index, values)]
    for k, fn in enumerate(functions):
        found = holes(fn)
        if found is not None:
            groups[found[0]].append((k, found[1]))
    for members in groups.values():
        shared, sizes = shared_form(functions[members[0][0]], [values for _, values in members])
        for (k, _), own in zip(members, sizes):
            if own:
                results[k] = (shared, own)
    return results
