"""Selection: topk, the k largest (or smallest) elements along an axis and their indices, sorted.

An element's place in the order is its rank, the count of the elements that come before it along the axis; the
output's slot r then holds the element of rank r. Each rank is a reduction over the axis, so a row of n elements
costs n^2 comparisons: cheap for the short rows of a mixture of experts' routing over 8 experts or a detector's few
hundred boxes, slow for a vocabulary of 50 000, where the cpu runs `stdlib_ops.topk` instead (a few of a long row:
about n comparisons a row; more: a quickselect and a merge sort of the k, about 2n + k log2 k; graph/runners.py).
"""
from __future__ import annotations

from stdlib_ops.elementwise import flag

from ...compute import compute
from ...compute import reduce as reduction
from ...ir import Cast, Select, binary, const
from ...ir import types as T
from ..operator import Operator, dims
from ..tensor import Tensor
from .axes import normalize_axis
from .transform import axis_view, reshape


class TopK(Operator):
    """The k largest (attrs largest=True) or smallest elements along axis 1 of x (outer, n, inner), sorted, and
    their int64 indices: equal elements in index order, NaN above every number (as numpy sorts and onnxruntime
    selects). attrs: k, largest."""

    kind = "topk"
    generic = True
    size_attrs = ("k",)

    def check(self):
        x, k = self.inputs[0], self.attrs["k"]
        if x.ndim != 3:
            raise ValueError(f"TopK works on x viewed as (outer, n, inner), got shape {x.shape}; use ops.topk")
        if x.dtype.is_bool:
            raise TypeError("topk is not defined on bool tensors; cast them first")
        if not 0 <= k <= x.shape[1]:
            raise ValueError(f"topk: k must be between 0 and the axis's length {x.shape[1]}, got {k}")

    def define(self, x):
        outer, n, inner = dims(x)
        k, largest = self.size("k"), self.attrs["largest"]

        def before(o, j, i, c):     # whether element j comes before element i of row (o, c)
            a, b = x[o, j, c], x[o, i, c]
            ahead = binary(">" if largest else "<", a, b)
            same = binary("==", a, b)
            if x.dtype.is_float:    # NaN above every number; NaNs equal to each other
                a_nan, b_nan = binary("!=", a, a), binary("!=", b, b)
                nan_first = binary("and", a_nan, binary("==", b, b)) if largest else \
                    binary("and", b_nan, binary("==", a, a))
                ahead = binary("or", nan_first, binary("and", ahead, binary("==", a_nan, b_nan)))
                same = binary("or", same, binary("and", a_nan, b_nan))
            return binary("or", ahead, binary("and", same, j < i))

        rank = reduction("topk_rank", (outer, n, inner), (n,),
                         lambda o, i, c, j: Select(before(o, j, i, c), const(1, T.i32), const(0, T.i32), T.i32),
                         op="sum", dtype=T.i32)
        index = reduction("topk_index", (outer, k, inner), (n,),
                          lambda o, r, c, i: Select(binary("==", rank[o, i, c], r), Cast(i, T.i64), const(0, T.i64),
                                                    T.i64), op="sum", dtype=T.i64)
        values = compute("topk_values", (outer, k, inner), lambda o, r, c: x[o, Cast(index[o, r, c], T.i32), c])
        return [values, index]


def topk(x: Tensor, k: int, axis: int = -1, largest: bool = True) -> tuple:
    """(values, int64 indices) of the k largest (or, `largest` False, smallest) elements of x along `axis`, sorted
    from the first on (ONNX TopK with sorted=1; torch.topk): equal elements in index order, NaN above every number.
    Computed on x viewed as (outer, n, inner): every rank and axis share one kernel (a reshape is a view)."""
    if x.ndim == 0:
        raise ValueError("topk needs a tensor with at least one axis")
    axis = normalize_axis(axis, x.ndim, "topk")
    op = TopK([axis_view(x, axis)], {"k": int(k), "largest": flag(largest, "topk: largest")})
    out_shape = x.shape[:axis] + (int(k),) + x.shape[axis + 1:]
    return tuple(reshape(t, out_shape) for t in op.outputs)
