"""The cpu's top-k along rows (`topk_rows`): a vocabulary's best logits, a row sorted.

The graph's TopK operator ranks every element against every other (graph/ops/sort.py): n^2 comparisons a row,
466 ms for the 50 best of GPT-2's 50257 logits on a 2-core Xeon. For a few of a long row (`keeps_best`), one
block per row keeps the k best so far in
the outputs themselves, with the slot of the one that comes last among them: an element enters only when it comes
before that one, so a row costs about n comparisons plus k per entry (each entry looks for the new last), and
insertion-sorts its k at the end. Where a row's elements are adjacent (the last axis), the scan tests CHUNK of them
against the k-th best at once, a vector compare, and looks at them one by one only where one enters: the 10 best of
each row of (256, 32000) 4.7-5.3 -> 1.5-1.9 ms, the 5 best of (512, 1000) 0.48-0.63 -> 0.33-0.39 ms (two threads).
Order as the operator's: larger (or, not `largest`, smaller) first, NaN above every number, equal elements in index
order. An element scanned later never ties its way in: its index is larger.

For more of a row (k > MAX_K or k^2 >= n; a row sorted whole: TopK with k = n is ONNX's sort) a quickselect
moves a row's k first to its front and those are merge-sorted (`topk_sorted_kernel`), in runs of 1, 2, 4, ...
between two halves of a work array, by the same order: about 2n + k log2 k comparisons (the 1000 best of each row
of (8, 4096) took 28.9 ms by the definitions, 78x onnxruntime's time; 0.4-0.5 ms so).
"""
# ruff: noqa: F821 - the kernels' bodies use their size symbols TO, TN, TI, TK, TB as names
# No `from __future__ import annotations`: the kernel's annotations use closure dtypes.
import functools

import numpy as np

import taskdsl as td
from taskdsl import blockIdx

from .elementwise import tdtype

# a step of the scan that keeps the k best, where a row's elements are adjacent: compared with the bar (the k-th best
# so far) together, and one by one only when one of them enters (rarely, past the row's first elements)
CHUNK = 16
MAX_K = 24      # beyond, or where k^2 reaches n, the entries (each looking through the k for the new last) weigh more
                # than the quickselect's pass: the 50 best of each row of (2, 50257) 0.15 ms so, 0.11 selected and
                # sorted; the 16 best of each row of (64, 256) 0.13 against 0.06 (the 16 of 50257: 0.06 against 0.10)


def _order(dtype, largest: bool) -> tuple:
    """The device functions (ahead, before) of the top-k order of `dtype`'s values."""
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

    return ahead, before


@functools.cache
def topk_rows_kernel(dtype, largest: bool, adjacent: bool = False) -> td.Kernel:
    """The top-k kernel for x (outer, n, inner) of `dtype`: block (o, c) selects along n into values and indices
    (outer, k, inner), k <= n. `adjacent`: inner is 1, a size the kernel is compiled with, so a row's elements are
    adjacent and the scan tests CHUNK of them against the bar in one vector compare."""
    ahead, before = _order(dtype, largest)
    inner = 1 if adjacent else "TI"

    @td.func
    def last_slot(values, indices, o, c) -> td.i32:
        """The slot of the candidate that comes after the others."""
        last = 0
        for s in range(1, values.shape[1]):
            if before(values[o, last, c], indices[o, last, c], values[o, s, c], indices[o, s, c]):
                last = s
        return last

    grid = (lambda TO: TO) if adjacent else (lambda TO, TI: TO * TI)

    @td.kernel(grid=grid, block=1, name=f"topk_rows_{'largest' if largest else 'smallest'}{'_rows' * adjacent}")
    def topk_rows(X: dtype["TO", "TN", inner], Values: dtype["TO", "TK", inner],
                  Indices: td.i64["TO", "TK", inner]):
        columns = X.shape[2]
        o = blockIdx.x // columns
        c = blockIdx.x % columns
        n, k = X.shape[1], Values.shape[1]
        for j in range(k):
            Values[o, j, c] = X[o, j, c]
            Indices[o, j, c] = td.cast(j, td.i64)
        last = last_slot(Values, Indices, o, c)
        bar = Values[o, last, c]
        j = k
        while j < n:        # adjacent: CHUNK elements a step, tested against the bar at once; else the row in one step
            stop = n
            hits = True
            if adjacent:
                stop = td.min(j + CHUNK, n)
                hits = stop - j < CHUNK     # (the row's last, shorter step: one by one)
                if not hits:
                    for v in td.unroll(CHUNK):
                        hits = hits | ahead(X[o, j + v, c], bar)
            if hits:                        # one by one
                for t in range(j, stop):
                    x = X[o, t, c]
                    if ahead(x, bar):
                        Values[o, last, c] = x
                        Indices[o, last, c] = td.cast(t, td.i64)
                        last = last_slot(Values, Indices, o, c)
                        bar = Values[o, last, c]
            j = stop
        for r in range(1, k):            # insertion sort of the k, by `before`
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


SELECT_ROUNDS = 96     # partitions a row's selection takes at most (about log2 n + a few expected): then sort it all
SAMPLE = 64            # elements a long row's first pivot is chosen from (rows of SAMPLE^2 or more)


@functools.cache
def topk_sorted_kernel(dtype, largest: bool) -> td.Kernel:
    """The top-k kernel for x (outer, n, inner) of `dtype` by a merge sort of each row: block b = (o, c) copies the
    row's values and indices to Keys[b] and Work[b] (each two halves of n), moves the k first to the front by a
    quickselect (`select_front`, about 2n comparisons: the 1000 best of each row of (8, 4096) 1.35 -> 0.4 ms), merge
    sorts those k, then writes them into values and indices (outer, k, inner). A run longer than k keeps its first k
    only (where the selection gave up, the whole row is sorted). The values move with their indices, so comparisons
    read neighbours, not the row at random (2.7 -> 2.0 ms for the 1000 best of each row of (8, 4096), sorting the
    whole row); a merge without branches, by selects, took 2.9 ms: each step waited for the last comparison's
    loads."""
    _, before = _order(dtype, largest)

    @td.func
    def swap(Keys, Work, b, i, j):
        """Exchange elements i and j of the row's first half."""
        key = Keys[b, 0, i]
        index = Work[b, 0, i]
        Keys[b, 0, i] = Keys[b, 0, j]
        Work[b, 0, i] = Work[b, 0, j]
        Keys[b, 0, j] = key
        Work[b, 0, j] = index

    @td.func
    def comes_first(Keys, Work, b, i, j):
        """Whether element i of the row's first half comes before element j."""
        return before(Keys[b, 0, i], Work[b, 0, i], Keys[b, 0, j], Work[b, 0, j])

    @td.func
    def sampled_pivot(Keys, Work, b, lo, hi, k) -> td.i32:
        """A pivot for a long range [lo, hi) of the row's first half: of SAMPLE elements spread over it, the one that
        ranks one past where the range's 2(k - lo)-th would (the median where that is half the range or more). Where
        k is far below the range's length, the partition then sends most elements the same way, which the branch
        predictor learns (a median's took a misprediction an element in two: the 200 best of each row of
        (2, 50257) 0.62 -> 0.11 ms). The rank one past keeps the pivot from falling among the k first, which leaves
        most of the row to partition again: with the sample's first, one row in eight for the 100 best of 50257
        (0.43 ms for two rows), with its second under one in a hundred (0.11 ms). Every long range takes one."""
        step = (hi - lo) // SAMPLE
        rank = min(SAMPLE // 2, (2 * (k - lo) * SAMPLE) // (hi - lo) + 1)
        chosen = lo
        for s in range(SAMPLE):
            ahead_of_it = 0
            for t in range(SAMPLE):
                if comes_first(Keys, Work, b, lo + t * step, lo + s * step):
                    ahead_of_it += 1
            if ahead_of_it == rank:
                chosen = lo + s * step
        return chosen

    @td.func
    def select_front(Keys, Work, b, k, n) -> td.i32:
        """Reorder the row's first half so that its first k elements are the k first (in no order) by quickselect:
        Lomuto partitions around a sampled pivot (ranges of SAMPLE^2 or more) or a median of three; returns k, or n
        where SELECT_ROUNDS partitions did not do it (an adversarial row: it is then sorted whole). Invariant:
        [0, lo) are among the k first, [hi, n) not."""
        lo = 0
        hi = n
        rounds = 0
        while hi - lo > 1 and rounds < SELECT_ROUNDS:
            rounds += 1
            pivot = (lo + hi) // 2
            if hi - lo >= SAMPLE * SAMPLE:
                pivot = sampled_pivot(Keys, Work, b, lo, hi, k)
            else:
                if comes_first(Keys, Work, b, pivot, lo):      # lo, mid, hi - 1 in order: the median is mid's
                    swap(Keys, Work, b, pivot, lo)
                if comes_first(Keys, Work, b, hi - 1, lo):
                    swap(Keys, Work, b, hi - 1, lo)
                if comes_first(Keys, Work, b, hi - 1, pivot):
                    swap(Keys, Work, b, hi - 1, pivot)
            swap(Keys, Work, b, pivot, hi - 1)
            key = Keys[b, 0, hi - 1]
            index = Work[b, 0, hi - 1]
            store = lo
            for i in range(lo, hi - 1):
                if before(Keys[b, 0, i], Work[b, 0, i], key, index):
                    swap(Keys, Work, b, i, store)
                    store += 1
            swap(Keys, Work, b, store, hi - 1)                 # the pivot at store: [lo, store) come before it
            if store > k:
                hi = store
            elif store < k - 1:
                lo = store + 1
            else:
                lo = hi
        return k if hi - lo <= 1 else n

    @td.kernel(grid=lambda TB: TB, block=1, name=f"topk_sorted_{'largest' if largest else 'smallest'}")
    def topk_sorted(X: dtype["TO", "TN", "TI"], Values: dtype["TO", "TK", "TI"], Indices: td.i64["TO", "TK", "TI"],
                    Keys: dtype["TB", 2, "TN"], Work: td.i32["TB", 2, "TN"]):
        b = blockIdx.x
        o = b // TI
        c = b % TI
        for j in range(TN):
            Keys[b, 0, j] = X[o, j, c]
            Work[b, 0, j] = j
        m = select_front(Keys, Work, b, TK, TN) if TK < TN else TN     # the elements to sort: [0, m)
        src = 0
        width = 1
        while width < m:       # merge neighbouring runs of `width` from half src into the other
            for pair in range((m + 2 * width - 1) // (2 * width)):
                lo = pair * 2 * width
                mid = min(lo + min(width, TK), m)       # runs past k keep their first k (the rest can never count)
                right = min(lo + width, m)
                hi = min(right + min(width, TK), m)
                i = lo
                j = right
                for t in range(lo, lo + min(mid - lo + hi - right, TK)):
                    take_left = j >= hi
                    if i < mid and j < hi:
                        take_left = before(Keys[b, src, i], Work[b, src, i], Keys[b, src, j], Work[b, src, j])
                    if take_left:
                        Keys[b, 1 - src, t] = Keys[b, src, i]
                        Work[b, 1 - src, t] = Work[b, src, i]
                        i += 1
                    else:
                        Keys[b, 1 - src, t] = Keys[b, src, j]
                        Work[b, 1 - src, t] = Work[b, src, j]
                        j += 1
            src = 1 - src
            width *= 2
        for t in range(TK):
            Values[o, t, c] = Keys[b, src, t]
            Indices[o, t, c] = td.cast(Work[b, src, t], td.i64)

    return topk_sorted


def keeps_best(k: int, n: int) -> bool:
    """Whether the top k of rows of n run `topk_rows_kernel` (a pass keeping the k best): k <= MAX_K and k^2 < n."""
    return k <= MAX_K and k * k < n


def topk_rows(x: np.ndarray, values: np.ndarray, indices: np.ndarray, largest: bool) -> td.Kernel:
    """Write the top-k of x (outer, n, inner), a cpu array, along axis 1 into `values` and `indices` (outer, k,
    inner), 1 <= k <= n: a pass keeping the k best for a few of a long row (`keeps_best`), else a quickselect and a
    merge sort; returns the kernel launched."""
    outer, n, inner = x.shape
    if not 1 <= values.shape[1] <= n:
        raise ValueError(f"topk_rows takes 1 <= k <= n, got k={values.shape[1]} for n={n}")
    if n >= 2 ** 31:
        raise ValueError(f"topk_rows sorts rows of fewer than 2^31 elements, got {n}")
    if keeps_best(values.shape[1], n):
        kernel = topk_rows_kernel(tdtype(x.dtype), bool(largest), inner == 1)
        kernel(x, values, indices)
    else:
        kernel = topk_sorted_kernel(tdtype(x.dtype), bool(largest))
        kernel(x, values, indices, np.empty((outer * inner, 2, n), x.dtype), np.empty((outer * inner, 2, n), np.int32))
    return kernel
