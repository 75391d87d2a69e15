"""The cpu's top-k of a few elements from long rows (`topk_rows`): a vocabulary's 50 best logits.

The graph's TopK operator ranks every element against every other (graph/ops/sort.py): n^2 comparisons a row,
466 ms for the 50 best of GPT-2's 50257 logits on a 2-core Xeon. Here one block per row keeps the k best so far in
the outputs themselves, with the slot of the one that comes last among them: an element enters only when it comes
before that one, so a row costs about n comparisons plus k per entry (each entry looks for the new last), and
insertion-sorts its k at the end. Order as the operator's: larger (or, not `largest`, smaller) first, NaN above
every number, equal elements in index order. An element scanned later never ties its way in: its index is larger.
"""
# ruff: noqa: F821 - the kernel's body uses its size symbols TO, TN, TI, TK as names
# No `from __future__ import annotations`: the kernel's annotations use closure dtypes.
import functools

import numpy as np

import taskdsl as td
from taskdsl import blockIdx

from .elementwise import tdtype

MAX_K = 128     # beyond, the insertion sort (k^2 / 2) and the worst case's entries (k a row element) weigh


@functools.cache
def topk_rows_kernel(dtype, largest: bool) -> td.Kernel:
    """The top-k kernel for x (outer, n, inner) of `dtype`: block (o, c) selects along n into values and indices
    (outer, k, inner), k <= n."""
    is_float = dtype.is_float

    @td.func
    def ahead(a, b):
        """Whether value a comes before value b: a NaN before (largest) or after any number, NaNs equal."""
        if is_float:
            if largest:
                return (a > b) | ((a != a) & (b == b))
            return (a < b) | ((b != b) & (a == a))
        return a > b if largest else a < b

    @td.func
    def before(a, i, b, j):
        """Whether the element (value a, index i) comes before (b, j): ahead, or equal and first in the row."""
        return ahead(a, b) | (not ahead(b, a) and i < j)

    @td.func
    def last_slot(values, indices, o, c) -> td.i32:
        """The slot of the candidate that comes after the others."""
        last = 0
        for s in range(1, values.shape[1]):
            if before(values[o, last, c], indices[o, last, c], values[o, s, c], indices[o, s, c]):
                last = s
        return last

    @td.kernel(grid=lambda TO, TI: TO * TI, block=1, name=f"topk_rows_{'largest' if largest else 'smallest'}")
    def topk_rows(X: dtype["TO", "TN", "TI"], Values: dtype["TO", "TK", "TI"], Indices: td.i64["TO", "TK", "TI"]):
        o = blockIdx.x // TI
        c = blockIdx.x % TI
        for j in range(TK):
            Values[o, j, c] = X[o, j, c]
            Indices[o, j, c] = td.cast(j, td.i64)
        last = last_slot(Values, Indices, o, c)
        bar = Values[o, last, c]
        for j in range(TK, TN):
            x = X[o, j, c]
            if ahead(x, bar):
                Values[o, last, c] = x
                Indices[o, last, c] = td.cast(j, td.i64)
                last = last_slot(Values, Indices, o, c)
                bar = Values[o, last, c]
        for r in range(1, TK):           # insertion sort of the k, by `before`
            v = Values[o, r, c]
            i = Indices[o, r, c]
            s = r
            while s > 0:
                if not before(v, i, Values[o, s - 1, c], Indices[o, s - 1, c]):
                    break
                Values[o, s, c] = Values[o, s - 1, c]
                Indices[o, s, c] = Indices[o, s - 1, c]
                s -= 1
            Values[o, s, c] = v
            Indices[o, s, c] = i

    return topk_rows


def topk_rows(x: np.ndarray, values: np.ndarray, indices: np.ndarray, largest: bool) -> td.Kernel:
    """Write the top-k of x (outer, n, inner), a cpu array, along axis 1 into `values` and `indices` (outer, k,
    inner), 1 <= k <= min(n, MAX_K); returns the kernel launched."""
    if not 1 <= values.shape[1] <= min(x.shape[1], MAX_K):
        raise ValueError(f"topk_rows takes 1 <= k <= min(n, {MAX_K}), got k={values.shape[1]} for n={x.shape[1]}")
    kernel = topk_rows_kernel(tdtype(x.dtype), bool(largest))
    kernel(x, values, indices)
    return kernel
