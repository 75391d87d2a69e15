"""Products with few rows on the cpu target (matrix-vector, vector-matrix, dot), as reductions.

The register-tile template computes whole micro-tiles of 6 rows and packs panels of B per block:
for one row that is six times the multiply-adds of a product whose cost is reading B once
(`(1, 768) @ (768, 3072)` took 1.9 ms, 16x numpy's time). As rule-based reductions, a product
with B as (K, N) runs as 'columns' (each of B's rows added, times a's element, into a row of
accumulators) and one with B given as (N, K) rows (linear's weight, or a column B as one row)
as a dot product per output, both reading B once, contiguously: 1.0 ms and 0.26 ms for that
product (one thread); the template wins from about 4 rows on.
"""
from __future__ import annotations

import numpy as np

import taskdsl as td

from .elementwise import cached_op

MAX_ROWS = 3        # rows (M) at most of a product computed as a reduction


def applies(m: int, n: int, batched: bool) -> bool:
    """Whether the cpu target computes a product of `m` rows and `n` columns (not batched) as a reduction."""
    return td.get_target() == "cpu" and not batched and (m <= MAX_ROWS or n == 1)


def _op(dtype: td.ir.types.DataType, rows_b: bool) -> td.Op:
    """C (M, N) = A (M, K) @ B, B as (K, N) or (`rows_b`) as (N, K); the products in f32 at least."""
    a = td.placeholder("a", dtype, ("M", "K"))
    b = td.placeholder("b", dtype, ("N", "K") if rows_b else ("K", "N"))
    wide = td.f64 if dtype == td.f64 else td.f32

    def term(m, n, k):
        return td.cast(a[m, k], wide) * td.cast(b[n, k] if rows_b else b[k, n], wide)

    c = td.reduce("rows_product", ("M", "N"), ("K",), term, op="sum", dtype=dtype)
    return td.op([a, b], [c], name="rows_product")


def product(a2: np.ndarray, b: np.ndarray, dtype, rows_b: bool = False) -> np.ndarray:
    """A (M, K) @ B for B (K, N), or (`rows_b`) B (N, K) @ ... as `a2 @ b.T` (contiguous arrays of `dtype`)."""
    if not rows_b and b.shape[1] == 1:
        b, rows_b = b.reshape(1, -1), True        # a column: the same elements as one row
    op = cached_op(("rows_product", dtype, rows_b), lambda: _op(dtype, rows_b))
    return op(a2, b)[0]
