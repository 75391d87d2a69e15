"""Data movement: reshape (and flatten / squeeze / unsqueeze), transpose, concat, split, slice, gather,
gather_elements, resample, expand, pad, cumsum and cumprod."""
from __future__ import annotations

import math

import numpy as np

from stdlib_ops.elementwise import as_int, flag, int_tuple
from stdlib_ops.transform import part_at

from ... import ir
from ...ir import types as T
from ...compute import compute
from ...compute import reduce as reduction
from ...runtime.arrays import check_indices
from ..operator import Operator, dims
from ..tensor import Tensor, as_shape, as_tensor, number_for
from .axes import normalize_axes, normalize_axis
from .elementwise import broadcast_index, broadcast_shape


def _from_end(k: ir.Expr, n) -> ir.Expr:
    """Index `k` into an axis of size `n`, a negative one counting from the end."""
    return ir.Select(k < 0, k + n, k, k.dtype)


def _all(conds: list) -> ir.Expr:
    out = conds[0]
    for c in conds[1:]:
        out = ir.binary("and", out, c)
    return out


# a contiguous slice is a view where it starts at a multiple of this many bytes: kernels move 16-byte vectors
# (cp.async, ldmatrix) from operands they assume aligned as allocations are
VIEW_ALIGNMENT = 64


class Reshape(Operator):
    """x with another shape of the same size (row-major); executed as a view, without a kernel."""

    kind = "reshape"
    is_view = True

    def check(self):
        x, shape = self.inputs[0], as_shape(self.attrs["shape"], "reshape")
        if int(np.prod(shape, dtype=np.int64)) != x.size:
            raise ValueError(f"cannot reshape a tensor of shape {x.shape} ({x.size} elements) into {shape}")

    def define(self, x):
        shape, in_shape = self.attrs["shape"], self.inputs[0].shape
        return [compute("reshape", shape, lambda *ix: x[view_index(in_shape, shape, ix)])]


def axis_groups(src: tuple, dst: tuple) -> list:
    """(source axes, view axes) groups of equal size products, in order, e.g. (1, 12, 64) read as (12, 64):
    [([0, 1], [0]), ([2], [1])]; source axes of size 1 left over join the last group."""
    groups, i, j = [], 0, 0
    while i < len(src) and j < len(dst):
        s_axes, d_axes, ps, pd = [i], [j], src[i], dst[j]
        i, j = i + 1, j + 1
        while ps != pd:
            if ps < pd:
                s_axes.append(i)
                ps, i = ps * src[i], i + 1
            else:
                d_axes.append(j)
                pd, j = pd * dst[j], j + 1
        groups.append((s_axes, d_axes))
    if groups:
        groups[-1][0].extend(range(i, len(src)))
    return groups


def view_index(src: tuple, dst: tuple, ix: tuple) -> tuple:
    """The index into a row-major `src`-shaped tensor of the element at index `ix` of its reading as `dst` (as many
    elements). Axes go in groups of equal size (`axis_groups`): where a group has one source axis that is not 1,
    the index passes through, so a kernel's loads keep the operand's plain index, not a flattening undone by
    divisions, which the simplifier cannot remove without knowing the bounds (a GRU's input projection read its
    unsqueezed input with three divisions a multiply-add)."""
    groups = axis_groups(src, dst) if 0 not in src else [(list(range(len(src))), list(range(len(dst))))]
    index = [0] * len(src)
    for s_axes, d_axes in groups:
        flat = 0
        for a in d_axes:
            flat = flat * dst[a] + ix[a]
        live = [a for a in s_axes if src[a] != 1]
        if len(live) == 1:
            index[live[0]] = flat
            continue
        for a in reversed(s_axes):
            if src[a] != 1:
                index[a] = flat % src[a]
                flat = flat // src[a]
    return tuple(index)


class Transpose(Operator):
    """x with its axes permuted: output axis j is input axis perm[j]."""

    kind = "transpose"
    generic = True

    def check(self):
        x, perm = self.inputs[0], self.attrs["perm"]
        if sorted(perm) != list(range(x.ndim)):
            raise ValueError(f"transpose: {perm!r} is not a permutation of {x.ndim} axes")

    def define(self, x):
        perm = self.attrs["perm"]
        shape = tuple(dims(x)[a] for a in perm)

        def fcompute(*ix):
            index = [None] * len(perm)
            for j, a in enumerate(perm):
                index[a] = ix[j]
            return x[tuple(index)]

        return [compute("transpose", shape, fcompute)]


class Concat(Operator):
    """The inputs joined along `axis` (other dims must match; one dtype)."""

    kind = "concat"
    generic = True

    def check(self):
        xs = self.inputs
        if not xs:
            raise ValueError("concat needs at least one tensor")
        if xs[0].ndim == 0:
            raise ValueError("concat: zero-dimensional tensors cannot be concatenated")
        axis = self.attrs["axis"] = normalize_axis(self.attrs["axis"], xs[0].ndim, "concat")
        base = xs[0].shape
        for t in xs:
            if t.dtype != xs[0].dtype:
                raise TypeError(f"concat: tensors have different dtypes ({t.dtype.name} vs {xs[0].dtype.name}); "
                                "cast them first")
            if t.ndim != len(base) or t.shape[:axis] != base[:axis] or t.shape[axis + 1:] != base[axis + 1:]:
                raise ValueError(f"concat along axis {axis}: shapes {[x.shape for x in xs]} do not match")

    def define(self, *xs):
        axis = self.attrs["axis"]
        sizes = [dims(x)[axis] for x in xs]
        offsets = [0]
        for n in sizes:
            offsets.append(offsets[-1] + n)
        base = dims(xs[0])
        shape = base[:axis] + (offsets[-1],) + base[axis + 1:]

        def fcompute(*ix):
            def part(k):
                return xs[k][ix[:axis] + (ix[axis] - offsets[k],) + ix[axis + 1:]]
            parts = [k for k, t in enumerate(self.inputs) if t.shape[axis]]     # empty inputs take no part
            if not parts:
                return xs[0][ix]
            return part_at(ix[axis], [offsets[k] for k in parts], lambda j: part(parts[j]), xs[0].dtype)

        return [compute("concat", shape, fcompute)]


class Slice(Operator):
    """Elements start + i * step along each axis: attrs starts, steps, sizes (one each per axis, resolved)."""

    kind = "slice"

    def check(self):
        x = self.inputs[0]
        if not len(self.attrs["starts"]) == len(self.attrs["steps"]) == len(self.attrs["sizes"]) == x.ndim:
            raise ValueError(f"slice: starts, steps and sizes need one entry per axis of {x.shape}")

    @property
    def view_offset(self) -> int | None:
        """The element offset of the output in x's row-major memory where it is one contiguous run of it that
        starts VIEW_ALIGNMENT-aligned (a part of the leading axis, say), else None."""
        x, (starts, steps, sizes) = self.inputs[0], (self.attrs[k] for k in ("starts", "steps", "sizes"))
        if 0 in sizes:
            return None
        offset, stride, partial = 0, 1, False
        for n, s, d, m in reversed(list(zip(x.shape, starts, steps, sizes))):
            if partial and m != 1:          # axes before the partial one are single
                return None
            if not (s == 0 and m == n and (d == 1 or m == 1)):
                if m > 1 and d != 1:        # a strided axis
                    return None
                partial = True              # axes after it are whole
            offset, stride = offset + s * stride, stride * n
        return offset if offset * np.dtype(x.numpy_dtype).itemsize % VIEW_ALIGNMENT == 0 else None

    @property
    def is_view(self) -> bool:
        return self.view_offset is not None

    def define(self, x):
        starts, steps, sizes = self.attrs["starts"], self.attrs["steps"], self.attrs["sizes"]
        return [compute("slice", sizes, lambda *ix: x[tuple(s + i * d for s, i, d in zip(starts, ix, steps))])]


class _IndexedRead(Operator):
    """An operator reading x at integer indices along `axis` (negative ones count from the end): the checks of the
    indices, which kernels would clamp to the axis instead of refusing."""

    generic = True

    def check(self):
        x, idx = self.inputs
        if not idx.dtype.is_integer:
            raise TypeError(f"{self.kind}: indices must be integers, got {idx.dtype.name}")
        axis = self.attrs["axis"] = normalize_axis(self.attrs["axis"], x.ndim, self.kind)
        self.check_shapes(x, idx, axis)
        if idx.is_constant:
            self.check_values([None, idx.value])
        elif idx.size and not x.shape[axis]:
            raise IndexError(f"{self.kind}: indices of shape {idx.shape} into axis {axis} of size 0")

    def check_shapes(self, x, idx, axis: int) -> None:
        """ValueError where the indices' shape does not fit x's (any shape fits by default)."""

    def check_values(self, arrays):
        """IndexError for an index outside [-n, n) (the kernels would clamp it to the axis instead)."""
        axis = self.attrs["axis"]
        check_indices(arrays[1], self.inputs[0].shape[axis], axis, self.kind)


class Gather(_IndexedRead):
    """numpy.take(x, indices, axis): x's slices at integer `indices` (negative ones count from the end)."""

    kind = "gather"

    def define(self, x, idx):
        axis, rank = self.attrs["axis"], self.inputs[1].ndim
        dx = dims(x)
        shape = dx[:axis] + dims(idx) + dx[axis + 1:]

        def fcompute(*ix):
            k = _from_end(idx[ix[axis:axis + rank]], dx[axis])
            return x[ix[:axis] + (k,) + ix[axis + rank:]]

        return [compute("gather", shape, fcompute)]


class GatherElements(_IndexedRead):
    """torch.gather(x, axis, indices): out[i] is x at i with i[axis] replaced by indices[i] (negative indices count
    from the end); indices have x's rank and are no longer than x along the other axes."""

    kind = "gather_elements"

    def check_shapes(self, x, idx, axis: int) -> None:
        if idx.ndim != x.ndim:
            raise ValueError(f"gather_elements: indices of shape {idx.shape} need the rank of x's shape {x.shape}")
        if any(m > n for a, (m, n) in enumerate(zip(idx.shape, x.shape)) if a != axis):
            raise ValueError(f"gather_elements: indices of shape {idx.shape} are longer than x's shape {x.shape} "
                             f"on an axis other than {axis}")

    def define(self, x, idx):
        axis, n = self.attrs["axis"], dims(x)[self.attrs["axis"]]

        def fcompute(*ix):
            return x[ix[:axis] + (_from_end(idx[ix], n),) + ix[axis + 1:]]

        return [compute("gather_elements", dims(idx), fcompute)]


class Resample(Operator):
    """x resampled along `axis` with precomputed taps: output slice o is the sum over t of weights[o, t] * x's
    slice indices[o, t] (negative indices count from the end). Inputs: x, indices (outputs, taps) of an integer
    type, weights (outputs, taps) of a float type. Computed in, and given as, the weights' dtype: f32 weights
    resample a 16-bit x with one rounding, at the end.

    Up to UNROLLED_TAPS taps (linear, cubic, RoiAlign's corners) are one sum written out, its kernel
    specialized to their number; more (an antialiased shrink, RoiAlign's samples) are a reduction over the taps,
    whose kernel serves any number: 160 taps written out took a kernel about 3 s of numba to compile."""

    kind = "resample"
    generic = True
    derived_attrs = ("unrolled",)

    UNROLLED_TAPS = 16

    def check(self):
        if len(self.inputs) != 3:
            raise ValueError(f"resample: needs x, indices and weights, got {len(self.inputs)} inputs")
        x, indices, weights = self.inputs
        self.attrs["axis"] = normalize_axis(self.attrs["axis"], x.ndim, "resample")
        if not (x.dtype.is_float and indices.dtype.is_integer and weights.dtype.is_float):
            raise TypeError(f"resample: needs a float x, integer indices and float weights, got {x.dtype.name}, "
                            f"{indices.dtype.name} and {weights.dtype.name}")
        if indices.ndim != 2 or indices.shape != weights.shape:
            raise ValueError(f"resample: indices and weights must be 2-d, (outputs, taps), of one shape, got "
                             f"{indices.shape} and {weights.shape}")
        taps = indices.shape[1]
        self.attrs["unrolled"] = taps if 0 < taps <= self.UNROLLED_TAPS else 0
        self.check_values([None, indices.value, None])

    def check_values(self, arrays):
        """IndexError for an index outside [-n, n) (the kernels would clamp it to the axis instead)."""
        if arrays[1] is not None:
            check_indices(arrays[1], self.inputs[0].shape[self.attrs["axis"]], self.attrs["axis"], "resample")

    def define(self, x, indices, weights):
        axis, dx, taps = self.attrs["axis"], dims(x), self.attrs["unrolled"]
        shape = dx[:axis] + dims(indices)[:1] + dx[axis + 1:]

        def term(ix, t):
            o = ix[axis]
            return weights[o, t] * x[ix[:axis] + (_from_end(indices[o, t], dx[axis]),) + ix[axis + 1:]]

        if taps:
            return [compute("resample", shape, lambda *ix: sum((term(ix, t) for t in range(1, taps)), term(ix, 0)),
                            dtype=weights.dtype)]
        return [reduction("resample", shape, dims(indices)[1:], lambda *ix: term(ix[:-1], ix[-1]),
                          dtype=weights.dtype)]


class Expand(Operator):
    """x broadcast (numpy rules, in both directions as in ONNX Expand) with `shape`, materialized."""

    kind = "expand"

    def check(self):
        self.out_shape = broadcast_shape([self.inputs[0].shape, self.attrs["shape"]], "expand")

    def define(self, x):
        shape = self.inputs[0].shape
        return [compute("expand", self.out_shape, lambda *ix: x[broadcast_index(ix, shape)])]


class Cumulative(Operator):
    """Running sums (attr op 'sum') or products ('prod') of x along `axis` (in x's dtype; 16-bit floats in f32):
    element i combines the elements j <= i (j < i with `exclusive`; j >= i and j > i with `reverse`). attrs: op,
    axis, exclusive, reverse."""

    kind_attr = "op"
    generic = True

    @property
    def kind(self) -> str:
        return "cum" + self.attrs["op"]

    def check(self):
        x = self.inputs[0]
        if self.attrs["op"] not in ("sum", "prod"):
            raise ValueError(f"cumulative op must be 'sum' or 'prod', got {self.attrs['op']!r}")
        if x.dtype.is_bool:
            raise TypeError(f"{self.kind} is not defined on bool tensors; cast them first")
        if x.ndim == 0:
            raise ValueError(f"{self.kind} needs a tensor with at least one axis")
        self.attrs["axis"] = normalize_axis(self.attrs["axis"], x.ndim, self.kind)

    def define(self, x):
        shape, axis, op = dims(x), self.attrs["axis"], self.attrs["op"]
        n, block = shape[axis], SCAN_BLOCK
        exclusive, reverse = self.attrs["exclusive"], self.attrs["reverse"]
        acc = T.f32 if x.dtype.computes_in_f32 else x.dtype
        zero = ir.const(0 if op == "sum" else 1, acc)      # the identity (a masked-out element adds nothing)

        # A reduction's extent cannot depend on the output index (compute.reduce takes a fixed reduce_shape), so
        # the axis is scanned in blocks of `block` elements and super-blocks of `block` blocks: an element combines
        # the super-blocks before its own (their totals), the blocks before its own in its super-block, and its own
        # block's elements up to itself, each masked (a select, not a product by 0 / 1, so an inf or NaN outside
        # stays out): about 2 * block + n / block**2 terms an element, not a scan's 1 nor a masked axis's n.
        combine = "+" if op == "sum" else "*"

        def along(ix, k):   # ix with k on the axis (ix may carry a reduction index last, which is dropped)
            return ix[:axis] + (k,) + ix[axis + 1:len(shape)]

        def at(ix, p):      # ix with the element at scan position p (from the end when reversed) on the axis
            return along(ix, (n - 1 - p) if reverse else p)

        def position(ix):
            return (n - 1 - ix[axis]) if reverse else ix[axis]

        def masked(condition, value):
            return ir.Select(condition, value, zero, acc)

        def totals_of(name, values, count):
            """Block totals of `values(ix, k)` (k < count along the axis): a tensor of cdiv(count, block) blocks."""
            return reduction(f"{self.kind}_{name}", shape[:axis] + ((count + block - 1) // block,) + shape[axis + 1:],
                             (block,), lambda *ix: masked(ix[axis] * block + ix[-1] < count,
                                                          values(ix, ix[axis] * block + ix[-1])), op=op, dtype=acc)

        blocks = (n + block - 1) // block
        supers = (blocks + block - 1) // block
        totals = totals_of("blocks", lambda ix, p: ir.convert(x[at(ix, p)], acc), n)
        super_totals = totals_of("supers", lambda ix, c: totals[along(ix, c)], blocks)
        supers_before = reduction(f"{self.kind}_supers_before", shape[:axis] + (supers,) + shape[axis + 1:],
                                  (supers,), lambda *ix: masked(ix[-1] < ix[axis], super_totals[along(ix, ix[-1])]),
                                  op=op, dtype=acc)
        blocks_before = reduction(f"{self.kind}_blocks_before", shape[:axis] + (blocks,) + shape[axis + 1:],
                                  (block,), lambda *ix: masked((ix[axis] // block) * block + ix[-1] < ix[axis],
                                                               totals[along(ix, (ix[axis] // block) * block + ix[-1])]),
                                  op=op, dtype=acc)

        def own_term(*ix):
            i = position(ix[:-1])
            p = (i // block) * block + ix[-1]
            return masked(p < i if exclusive else p <= i, ir.convert(x[at(ix[:-1], p)], acc))

        own = reduction(f"{self.kind}_own", shape, (block,), own_term, op=op, dtype=acc)

        def out(*ix):
            i = position(ix)
            before = ir.binary(combine, supers_before[along(ix, i // block // block)],
                               blocks_before[along(ix, i // block)])
            return ir.convert(ir.binary(combine, before, own[ix]), x.dtype)

        return [compute(self.kind, shape, out, dtype=x.dtype)]


SCAN_BLOCK = 32         # elements of a cumsum block, blocks of a super-block (an element adds up about 64 terms)


PAD_MODES = ("constant", "edge", "reflect", "wrap")


class Pad(Operator):
    """x padded: attrs pads ((begin..., end...) per axis, non-negative), mode (numpy.pad's: `constant`
    with attr value, or with a second input, a one-element tensor of x's dtype; `edge`, `reflect`, `wrap`)."""

    kind = "pad"
    generic = True
    derived_attrs = ("wraps_once",)     # mode wrap, no pad wider than its axis: a select finds the source, not a %

    def check(self):
        x, pads, mode = self.inputs[0], self.attrs["pads"], self.attrs["mode"]
        if len(pads) != 2 * x.ndim or any(p < 0 for p in pads):
            raise ValueError(f"pad: pads must be {2 * x.ndim} non-negative ints (begin..., end...), got {pads!r}")
        if mode not in PAD_MODES:
            raise ValueError(f"pad: mode {mode!r} is not one of {', '.join(PAD_MODES)}")
        self.attrs["wraps_once"] = mode == "wrap" and all(max(pads[k], pads[x.ndim + k]) <= d
                                                          for k, d in enumerate(x.shape))
        if len(self.inputs) == 2:
            fill = self.inputs[1]
            if mode != "constant" or fill.size != 1 or fill.dtype != x.dtype:
                raise ValueError(f"pad: a tensor value must have one element of x's dtype ({x.dtype.name}) and "
                                 f"mode 'constant', got {fill.dtype.name}{list(fill.shape)} with mode {mode!r}")
        else:
            value = self.attrs["value"]
            if x.dtype.is_bool and isinstance(value, (int, np.integer)) and value in (0, 1):
                value = bool(value)         # the default 0 pads a bool tensor with False
            self.attrs["value"] = number_for(value, x, "pad: value")
        for k, d in enumerate(x.shape):
            widest = max(pads[k], pads[x.ndim + k])
            if mode != "constant" and widest and d == 0:
                raise ValueError(f"pad: mode {mode!r} cannot pad axis {k}, which is empty")
            if mode == "reflect" and widest >= d > 0:
                raise ValueError(f"pad: mode 'reflect' pads axis {k} of size {d} by {widest}; at most {d - 1}")

    def define(self, x, fill=None):
        shape, pads, mode = dims(x), self.attrs["pads"], self.attrs["mode"]
        n = len(shape)
        out = tuple(d + pads[k] + pads[n + k] for k, d in enumerate(shape))
        value = ir.const(self.attrs["value"], x.dtype) if fill is None else fill[(0,) * len(fill.shape)]

        def fcompute(*ix):
            src = [i - pads[k] for k, i in enumerate(ix)]
            if not src:
                return x[()]
            if mode != "constant":     # (an axis not padded reads its own index: no selects to split loops by)
                return x[tuple(pad_source(s, d, mode, self.attrs["wraps_once"]) if pads[k] or pads[n + k] else s
                               for k, (s, d) in enumerate(zip(src, shape)))]
            inside = _all([ir.binary("and", s >= 0, s < d) for s, d in zip(src, shape)])
            return ir.Select(inside, x[tuple(src)], value, x.dtype)

        return [compute("pad", out, fcompute)]


def pad_source(s, size, mode: str, wraps_once: bool = False) -> ir.Expr:
    """The index read for position `s` (negative before the axis, `size` or more after it) of a padded axis.

    Each mode is a select between the axis's three parts (before, inside, after), each part's index linear in `s`:
    the cpu's row loops split at the selects' bounds and read each part as a row, where a min / max (edge), the
    absolute values of a reflection or a division (wrap) kept them scalar (a reflect padding of (1, 64, 112, 112)
    by 3 took 2.2x onnxruntime's time; a (1000, 1000) array wrapped by 2, 2.7x numpy's). `wraps_once`: mode wrap
    by at most `size` at each side; a reflection pads by at most size - 1 (Pad.check), so it bounces once."""
    last = ir.binary("-", size, 1)
    if mode == "edge":
        before, after = ir.const(0, s.dtype), last
    elif mode == "reflect":               # -1 -> 1, size -> size - 2
        before, after = ir.binary("-", ir.const(0, s.dtype), s), ir.binary("-", ir.binary("+", last, last), s)
    elif wraps_once:
        before, after = s + size, s - size
    else:
        return ir.binary("%", s, size)
    return ir.Select(s < 0, before, ir.Select(s >= size, after, s, s.dtype), s.dtype)


# ---------------------------------------------------------------- the functions
def resolve_shape(size: int, shape, what: str = "reshape") -> tuple:
    """A target shape with its one -1 dim (if any) resolved for `size` elements."""
    shape = int_tuple(shape, f"{what}: the shape")
    unknown = [k for k, n in enumerate(shape) if n == -1]
    if len(unknown) > 1 or any(n < -1 for n in shape):
        raise ValueError(f"{what}: invalid shape {shape} (at most one -1, other dims >= 0)")
    if unknown:
        known = int(np.prod([n for n in shape if n != -1], dtype=np.int64))
        if known == 0 or size % known:
            raise ValueError(f"{what}: cannot reshape {size} elements into {shape}")
        shape = shape[:unknown[0]] + (size // known,) + shape[unknown[0] + 1:]
    return shape


def reshape(x, shape) -> Tensor:
    """x with a new shape (row-major; one dim may be -1)."""
    shape = resolve_shape(x.size, shape)
    if shape == x.shape:
        return x
    return Reshape([x], {"shape": shape}).outputs[0]


def flatten(x, axis: int = 1) -> Tensor:
    """x as a 2-d tensor: the axes before `axis` make the rows, the rest the columns."""
    axis = as_int(axis, "flatten: axis")
    if not -x.ndim <= axis <= x.ndim:
        raise ValueError(f"flatten: axis {axis} is out of range for a {x.ndim}-d tensor")
    axis = axis + x.ndim if axis < 0 else axis
    rows = int(np.prod(x.shape[:axis], dtype=np.int64))
    return reshape(x, (rows, int(np.prod(x.shape[axis:], dtype=np.int64))))


def squeeze(x, axis=None) -> Tensor:
    """x without the given size-1 axes (default: every size-1 axis)."""
    axes = tuple(a for a in range(x.ndim) if x.shape[a] == 1) if axis is None else \
        normalize_axes(axis, x.ndim, "squeeze")
    for a in axes:
        if x.shape[a] != 1:
            raise ValueError(f"squeeze: axis {a} of shape {x.shape} is not 1")
    return reshape(x, tuple(n for a, n in enumerate(x.shape) if a not in axes))


def unsqueeze(x, axis) -> Tensor:
    """x with new size-1 axes at positions `axis` (of the result)."""
    if axis is None:
        raise TypeError("unsqueeze: axis must be an int or a sequence of ints, got None")
    n = x.ndim + (1 if np.ndim(axis) == 0 else len(tuple(axis)))
    axes = normalize_axes(axis, n, "unsqueeze")
    dims = iter(x.shape)
    return reshape(x, tuple(1 if a in axes else next(dims) for a in range(n)))


def transpose(x, perm=None) -> Tensor:
    """x with its axes permuted (default: reversed)."""
    if perm is not None and np.ndim(perm) != 1:
        raise TypeError(f"transpose: perm must be a sequence of axes, got {perm!r}")
    perm = tuple(reversed(range(x.ndim))) if perm is None else tuple(normalize_axis(a, x.ndim, "transpose")
                                                                      for a in perm)
    if perm == tuple(range(x.ndim)):
        return x
    moved = [a for a in perm if x.shape[a] != 1]
    if moved == sorted(moved) and all(isinstance(d, int) for d in x.shape):
        # axes of length 1 alone move: the elements keep their order, a reshape (a view, no kernel)
        return reshape(x, tuple(x.shape[a] for a in perm))
    return Transpose([x], {"perm": perm}).outputs[0]


def concat(xs, axis: int = 0) -> Tensor:
    """The tensors joined along `axis`."""
    if isinstance(xs, (Tensor, np.ndarray)):
        raise TypeError("concat takes a list of tensors, got one tensor")
    xs = [as_tensor(t) for t in xs]
    if len(xs) == 1:        # nothing to join, but the axis must still be one of x's
        normalize_axis(axis, xs[0].ndim, "concat")
        return xs[0]
    return Concat(xs, {"axis": axis}).outputs[0]


def _slice_axis(n: int, start: int, end: int, step: int) -> tuple:
    """(first index, step, count) of start:end:step on an axis of n (ONNX Slice clamping)."""
    if step == 0:
        raise ValueError("slice: a step cannot be 0")
    start = start + n if start < 0 else start
    end = end + n if end < 0 else end
    if step > 0:
        start, end = min(max(start, 0), n), min(max(end, 0), n)
        count = max(0, -(-(end - start) // step))
    else:       # ONNX clamps a start below the axis to its first element (Python's slicing would give nothing)
        start, end = min(max(start, 0), n - 1), min(max(end, -1), n - 1)
        count = max(0, -(-(start - end) // -step))
    return start if count else 0, step, count


def slice(x, starts, ends, axes=None, steps=None) -> Tensor:
    """x[start:end:step] along `axes` (default 0, 1, ...); negative and out-of-range bounds clamp as in ONNX."""
    starts, ends = int_tuple(starts, "slice: starts"), int_tuple(ends, "slice: ends")
    axes = [normalize_axis(a, x.ndim, "slice") for a in (range(len(starts)) if axes is None else
                                                         int_tuple(axes, "slice: axes"))]
    steps = (1,) * len(starts) if steps is None else int_tuple(steps, "slice: steps")
    if not len(starts) == len(ends) == len(axes) == len(steps) or len(set(axes)) != len(axes):
        raise ValueError("slice: starts, ends, axes and steps must have one entry per (distinct) axis")
    bounds = [(0, 1, n) for n in x.shape]
    for a, s, e, d in zip(axes, starts, ends, steps):
        bounds[a] = _slice_axis(x.shape[a], s, e, d)
    if all(b == (0, 1, n) for b, n in zip(bounds, x.shape)):
        return x
    attrs = {"starts": tuple(b[0] for b in bounds), "steps": tuple(b[1] for b in bounds),
             "sizes": tuple(b[2] for b in bounds)}
    return Slice([x], attrs).outputs[0]


def split(x, sizes, axis: int = 0) -> list:
    """x cut along `axis` into pieces of the given sizes (an int: that many equal pieces)."""
    axis = normalize_axis(axis, x.ndim, "split")
    n = x.shape[axis]
    if np.ndim(sizes) == 0:
        parts = as_int(sizes, "split: sizes")
        if parts < 1 or n % parts:
            raise ValueError(f"split: axis {axis} of size {n} does not split into {parts} equal parts")
        sizes = [n // parts] * parts
    sizes = list(int_tuple(sizes, "split: sizes"))
    if sum(sizes) != n or any(s < 0 for s in sizes):
        raise ValueError(f"split: sizes {sizes} do not add up to {n}, the size of axis {axis}")
    offsets = np.concatenate([[0], np.cumsum(sizes)]).tolist()
    return [slice(x, [offsets[k]], [offsets[k + 1]], [axis]) for k in range(len(sizes))]


def gather(x, indices, axis: int = 0) -> Tensor:
    """numpy.take(x, indices, axis) (indices: an integer tensor or array)."""
    if isinstance(indices, (list, tuple)) and np.size(indices) == 0:
        indices = np.zeros(np.shape(indices), np.int64)      # numpy.take's empty indices (np.asarray([]) is float)
    return Gather([x, as_tensor(indices)], {"axis": axis}).outputs[0]


def gather_elements(x, indices, axis: int = 0) -> Tensor:
    """torch.gather(x, axis, indices) (ONNX GatherElements): x's elements at integer `indices` along `axis`."""
    return GatherElements([x, as_tensor(indices)], {"axis": axis}).outputs[0]


def cumsum(x, axis: int = 0, exclusive: bool = False, reverse: bool = False) -> Tensor:
    """numpy.cumsum along `axis` (ONNX CumSum): with `exclusive` each sum leaves its own element out, with
    `reverse` the sums run from the end. Computed on x viewed as (outer, axis, inner): every rank and axis share
    one kernel (a reshape is a view)."""
    return _cumulative("sum", x, axis, exclusive, reverse)


def cumprod(x, axis: int = 0, exclusive: bool = False, reverse: bool = False) -> Tensor:
    """numpy.cumprod along `axis` (ONNX CumProd), `exclusive` and `reverse` as cumsum's."""
    return _cumulative("prod", x, axis, exclusive, reverse)


def _cumulative(op: str, x, axis: int, exclusive: bool, reverse: bool) -> Tensor:
    """The running sums or products of x along `axis`, on x viewed as (outer, axis, inner)."""
    what = "cum" + op
    if x.ndim == 0:
        raise ValueError(f"{what} needs a tensor with at least one axis")
    axis = normalize_axis(axis, x.ndim, what)
    attrs = {"op": op, "axis": 1, "exclusive": flag(exclusive, f"{what}: exclusive"),
             "reverse": flag(reverse, f"{what}: reverse")}
    return reshape(Cumulative([axis_view(x, axis)], attrs).outputs[0], x.shape)


def axis_view(x, axis: int) -> Tensor:
    """x viewed as (outer, x.shape[axis], inner): an operator on its axis 1 then serves every rank and axis with
    one kernel (a reshape is a view)."""
    return reshape(x, (math.prod(x.shape[:axis]), x.shape[axis], math.prod(x.shape[axis + 1:])))


def resample(x, indices, weights, axis: int) -> Tensor:
    """x resampled along `axis`: output slice o is the sum over t of weights[o, t] * x's slice indices[o, t]
    (indices and weights: (outputs, taps); linear and cubic resizing, RoiAlign's corners), in the weights'
    dtype."""
    return Resample([x, as_tensor(indices), as_tensor(weights)], {"axis": axis}).outputs[0]


def expand(x, shape) -> Tensor:
    """x broadcast with `shape` (numpy rules), materialized."""
    shape = as_shape(shape, "expand")
    if broadcast_shape([x.shape, shape], "expand") == x.shape:
        return x
    return Expand([x], {"shape": shape}).outputs[0]


def pad(x, pads, value=0, mode: str = "constant") -> Tensor:
    """x padded as numpy.pad pads it: with `value` (mode `constant`; a number, or a one-element tensor of x's
    dtype: a zero point computed at run time), or by `edge`, `reflect` or `wrap`; pads: (begin..., end...) per
    axis, or numpy.pad's ((before, after), ...)."""
    if np.ndim(pads) == 2:
        rows = [int_tuple(row, "pad: each axis's (before, after)", 2) for row in pads]
        pads = tuple(row[0] for row in rows) + tuple(row[1] for row in rows)
    pads = int_tuple(pads, "pad: pads")
    if isinstance(value, Tensor):
        op = Pad([x, value], {"pads": pads, "value": None, "mode": mode})
    else:
        op = Pad([x], {"pads": pads, "value": value, "mode": mode})    # checked, even if all 0
    return op.outputs[0] if any(op.attrs["pads"]) else x
