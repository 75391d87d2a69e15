"""Post-scheduling fusion (Hidet, section 5.2): fuse definitions into an already scheduled kernel.

A prologue replaces the anchor's loads of an input by the definition of that input:

    anchor:    ... A[99 - i] ...            prologue A = compute(lambda i: C[i] * 2.0)
    fused:     ... C[99 - i] * 2.0 ...

An epilogue replaces the anchor's stores to an output by a definition that reads it:

    anchor:    out[i] = v                   epilogue D = compute((2, 50), lambda a, b: out[a * 50 + b] * 3.0)
    fused:     D[i // 50, i % 50] = v * 3.0

The anchor is any kernel (written in the DSL or generated), specialized to the shapes of
example arguments. What may fuse is checked, and a request that cannot be honoured is
refused with a `FusionError` that says why: a prologue must be a compute (not a
reduction) the anchor only reads; an epilogue must be a compute that reads the anchor's
output at one index, through a bijective index map (any composition of reshapes and transposes) of an
output the anchor only writes.
"""
from __future__ import annotations

import dataclasses
import math

import numpy as np

from .. import ir
from ..compute import Tensor, _Evaluator, _OWNER, check_fixed_reads, topological
from ..passes import bind_sizes, simplify_within
from ..runtime.kernel import Kernel
from .inline import inline_injective
from .rules import _unravel, size_function


class FusionError(ValueError):
    """A fusion request that the rules do not allow; the message says which rule."""


def fuse(anchor: Kernel, *args, prologues: dict | None = None, epilogues: dict | None = None,
         constants: tuple = ()) -> Kernel:
    """The anchor kernel, specialized to `args`, with prologue and epilogue definitions fused in.

    prologues: {anchor input parameter name: compute Tensor defining it from other tensors}.
    epilogues: {anchor output parameter name: compute Tensor reading that output through a
               placeholder of the same name}.
    constants: names of scalar parameters whose values in `args` become compile-time constants
               (a conv's stride, say: index arithmetic folds, and unit-stride loops vectorize).
    The fused kernel takes, in order, the anchor's remaining parameters, the prologues' and
    epilogues' other inputs, then the epilogues' outputs.
    """
    for what, given in (("prologues", prologues), ("epilogues", epilogues)):
        if given is not None and not isinstance(given, dict):
            raise TypeError(f"fuse: {what} must be a dict of parameter name -> compute definition, got "
                            f"{type(given).__name__}")
    binding = anchor.bind(anchor.arguments(args, {}))      # (scalar defaults applied, as a call does)
    fn = bind_sizes(anchor._frontend_ir(binding.block), binding.sizes)
    params = {p.name: p for p in fn.params}
    new_inputs: dict = {}
    values = dict(zip((p.name for p in fn.params), binding.values))
    built_in = {name: _param(params, name, anchor, ir.Var) for name in constants}
    body = ir.substitute(fn.body, {v.uid: ir.const(values[name], v.dtype) for name, v in built_in.items()})
    replaced, outputs = {v.uid for v in built_in.values()}, []
    for name, definition in (prologues or {}).items():
        param = _param(params, name, anchor)
        body = _fuse_prologue(body, param, definition, new_inputs)
        replaced.add(param.uid)
    for name, definition in (epilogues or {}).items():
        param = _param(params, name, anchor)
        body = _fuse_epilogue(body, param, definition, new_inputs)
        replaced.add(param.uid)
        outputs.append(definition.buffer)
    kept = tuple(p for p in fn.params if p.uid not in replaced)
    # (their shapes are concrete by now) a read outside its tensor, which `td.op` refuses, would run out of bounds
    check_fixed_reads(topological([*(prologues or {}).values(), *(epilogues or {}).values()]), {})
    _refuse_reads_of_written(body, new_inputs, prologues, epilogues)
    extra = tuple(b for b in new_inputs.values() if b.uid not in {p.uid for p in kept})
    all_params = kept + extra + tuple(outputs)
    names = [p.name for p in all_params]
    twice = next((n for k, n in enumerate(names) if n in names[:k]), None)
    if twice is not None:       # a call by keyword could not say which; a placeholder is no anchor parameter
        raise FusionError(f"the fused kernel would have two parameters named {twice!r}: a definition's placeholder "
                          f"is named like another tensor of '{anchor.name}' or of the definitions; give it a name of "
                          "its own")
    sizes = {d.uid: d for b in all_params if isinstance(b, ir.Buffer) for d in b.shape if isinstance(d, ir.Var)}
    fused = dataclasses.replace(fn, name=f"{fn.name}_fused", params=all_params, sizes=tuple(sizes.values()),
                                body=body)
    kernel = Kernel.from_ir(fused, _launch_grid(anchor, binding, [p.name for p in kept if isinstance(p, ir.Var)]))
    kernel.serial_below = anchor.serial_below
    kernel.shareable = not constants    # its sizes were fixed for fusion's sake, not its speed's: one compile may
    return kernel                       # serve its other shapes (`runtime.sharing`)


def _launch_grid(anchor: Kernel, binding, scalars: list):
    """The fused kernel's grid: the call's, or, where the anchor's grid callable reads scalar parameters the fused
    kernel keeps, a callable of those (its sizes fixed at the call's). A block that depends on a kept scalar is
    refused: the kernel body was built for the call's block."""
    read = {what: [n for n in anchor._callable_args[what] or () if n in scalars] for what in ("grid", "block")}
    if read["block"]:
        raise FusionError(f"the block of kernel '{anchor.name}' depends on scalar {read['block'][0]!r}; fuse with "
                          f"constants=({read['block'][0]!r},) to build its value in")
    if not read["grid"]:
        return binding.grid
    known = {**binding.sizes, **{name: value for name, value in zip((n for n, _ in anchor.params), binding.values)}}
    return size_function(lambda env: anchor._evaluate(anchor.grid_spec, {**known, **env}, {}, "grid"), read["grid"])


def _param(params: dict, name: str, anchor: Kernel, kind: type = ir.Buffer):
    """The anchor's parameter `name`, a tensor (ir.Buffer) or a scalar (ir.Var): else a FusionError."""
    param = params.get(name)
    if not isinstance(param, kind):
        what = "tensor" if kind is ir.Buffer else "scalar"
        raise FusionError(f"kernel '{anchor.name}' has no {what} parameter '{name}' "
                          f"(its {what}s: {', '.join(n for n, p in params.items() if isinstance(p, kind))})")
    return param


def _concrete(shape: tuple, what: str) -> tuple:
    if not all(isinstance(d, ir.Const) for d in shape):
        raise FusionError(f"{what} has a symbolic shape; fusion works on definitions with concrete shapes")
    return tuple(int(d.value) for d in shape)


def _reads_and_writes(body: ir.Stmt, buffer: ir.Buffer) -> tuple[bool, bool]:
    reads = writes = False
    for x in ir.collect(body, (ir.Load, ir.Atomic, ir.CpAsync, ir.Store)):
        source = x.src.buffer if isinstance(x, ir.CpAsync) else x.buffer    # an asynchronous copy reads its source
        reads = reads or (not isinstance(x, ir.Store) and source.uid == buffer.uid)
        writes = writes or (isinstance(x, (ir.Store, ir.Atomic)) and x.buffer.uid == buffer.uid)
    return reads, writes


def _refuse_reads_of_written(body: ir.Stmt, new_inputs: dict, prologues: dict | None, epilogues: dict | None):
    """A FusionError where a prologue or epilogue reads (through a placeholder of its name) a tensor the fused
    kernel writes: the anchor's other outputs are being written by the same kernel, so their values are not
    there to read."""
    written = {x.buffer.name for x in ir.collect(body, (ir.Store, ir.Atomic)) if x.buffer.scope == "global"}
    for buffer in new_inputs.values():
        if buffer.name in written:
            users = [d.name for d in {**(prologues or {}), **(epilogues or {})}.values()
                     if any(t.buffer.uid == buffer.uid for t in _reads(d))]
            raise FusionError(f"'{users[0] if users else '?'}' reads '{buffer.name}', which the fused kernel writes: "
                              "its values are not known while the kernel runs; compute it by a kernel of its own "
                              "after the anchor")


def _reads(definition: Tensor) -> list:
    """The placeholders `definition` reads, through the computes it reads."""
    return [_OWNER[x.buffer.uid] for x in ir.collect(_inline_all(definition), ir.Load)
            if _OWNER.get(x.buffer.uid) is not None]


def _inline_all(definition: Tensor) -> ir.Expr:
    """The definition's body with every compute it reads inlined (down to placeholders and reductions)."""
    producers = set()

    def visit(t: Tensor):
        for x in t.inputs:
            if x.kind == "compute" and id(x) not in producers:
                producers.add(id(x))
                visit(x)

    visit(definition)
    return inline_injective(definition.body, producers)


def _record_inputs(expr: ir.Expr, new_inputs: dict, skip: ir.Buffer | None = None) -> None:
    for load in ir.collect(expr, ir.Load):
        owner = _OWNER.get(load.buffer.uid)
        if owner is not None and owner.kind == "reduce":
            raise FusionError(f"'{owner.name}' is a reduction: it must be computed by its own kernel, not fused")
        if skip is None or load.buffer.uid != skip.uid:
            new_inputs.setdefault(load.buffer.uid, load.buffer)


# ---------------------------------------------------------------- prologue
def _require_compute(definition, role: str, param: ir.Buffer) -> None:
    if not isinstance(definition, Tensor) or not definition.is_injective:
        kind = getattr(definition, "kind", type(definition).__name__)
        raise FusionError(f"the {role} of '{param.name}' must be an injective compute definition, got a {kind}")


def _fuse_prologue(body: ir.Stmt, param: ir.Buffer, definition: Tensor, new_inputs: dict) -> ir.Stmt:
    _require_compute(definition, "prologue", param)
    reads, writes = _reads_and_writes(body, param)
    if writes:
        raise FusionError(f"the anchor writes '{param.name}', so it cannot be replaced by a prologue")
    if _concrete(definition.shape, f"prologue '{definition.name}'") != _concrete(param.shape, f"'{param.name}'"):
        raise FusionError(f"prologue '{definition.name}' has shape {_concrete(definition.shape, '')} but "
                          f"'{param.name}' has {_concrete(param.shape, '')}")
    value = _inline_all(definition)
    _record_inputs(value, new_inputs)
    axes = definition.axes

    class _Prologue(ir.Rewriter):
        def visit_Load(self, e):
            e = self.generic_visit(e)
            if e.buffer.uid != param.uid:
                return e
            loaded = ir.substitute(value, {a.uid: i for a, i in zip(axes, e.indices)})
            return ir.convert(loaded, param.dtype)

        def visit_CpAsync(self, s):
            if s.src.buffer.uid != param.uid:
                return self.generic_visit(s)
            gathered = self.gathered_copy(s)
            if gathered is not None:
                return gathered
            # computed values have no memory to copy asynchronously from: the copy becomes plain stores of
            # the prologue's values (zeros where the copy's predicate is false, as cp_async fills)
            zero = ir.const(0, s.dst.dtype)
            return ir.seq([ir.Store(s.dst.buffer, s.dst.element(k),
                                    ir.Select(s.pred, self.visit(ir.Load(param, s.src.element(k))), zero, s.dst.dtype),
                                    s.loc) for k in range(s.count)])

        def visit_Prefetch(self, s):
            return _without_prefetch_of(self.generic_visit(s), param)     # its index may read the prologue's tensor

        def visit_Dot4(self, s):
            if param.uid in (s.a.buffer.uid, s.b.buffer.uid):
                raise FusionError(f"the anchor reads '{param.name}' by td.dot4, whose bytes must be in memory: a "
                                  "prologue's computed values are not; stage them in shared or register memory by "
                                  "plain loads first, or compute the prologue by a kernel of its own")
            return self.generic_visit(s)

        def gathered_copy(self, s):
            """The copy from the placeholder itself where the definition gathers aligned runs of its elements
            (`gather_runs`; a cp_async run starts at a multiple of its length, as its alignment requires), else
            None: x[index of the run's first element], under the copy's predicate and the run's condition."""
            if definition.gather_runs % s.count:
                return None
            first = self.visit(ir.Load(param, s.src.element(0)))
            cond, load = (first.cond, first.a) if isinstance(first, ir.Select) else (ir.const(True), first)
            if isinstance(first, ir.Select) and not (isinstance(first.b, ir.Const) and first.b.value == 0):
                return None
            owner = _OWNER.get(load.buffer.uid) if isinstance(load, ir.Load) else None
            if owner is None or owner.kind != "placeholder" or load.dtype != s.dst.dtype:
                return None
            return ir.CpAsync(s.dst, ir.Ref(load.buffer, load.indices), s.count, ir.binary("and", s.pred, cond), s.loc)

    return _Prologue().visit(body)


# ---------------------------------------------------------------- epilogue
def _fuse_epilogue(body: ir.Stmt, param: ir.Buffer, definition: Tensor, new_inputs: dict) -> ir.Stmt:
    _require_compute(definition, "epilogue", param)
    reads, writes = _reads_and_writes(body, param)
    if not writes:
        raise FusionError(f"the anchor never writes '{param.name}': an epilogue replaces the stores of an output")
    if reads:
        raise FusionError(f"the anchor reads its output '{param.name}' (e.g. accumulates into it), so its stores "
                          "cannot be replaced by an epilogue")
    value = _inline_all(definition)
    stand_ins = [x for x in ir.collect(value, ir.Load) if _OWNER.get(x.buffer.uid) is not None
                 and _OWNER[x.buffer.uid].kind == "placeholder" and x.buffer.name == param.name]
    if not stand_ins or any(not ir.structurally_equal(x.indices, stand_ins[0].indices) for x in stand_ins):
        raise FusionError(f"epilogue '{definition.name}' must read the anchor output at exactly one index (through "
                          f"a placeholder named '{param.name}'), found {len(stand_ins)} different reads")
    stand_in = stand_ins[0]
    out_shape = _concrete(param.shape, f"'{param.name}'")
    epi_shape = _concrete(definition.shape, f"epilogue '{definition.name}'")
    if _concrete(stand_in.buffer.shape, f"placeholder '{param.name}'") != out_shape:
        raise FusionError(f"placeholder '{param.name}' in the epilogue has a different shape than the anchor's output")
    if stand_in.buffer.dtype != param.dtype:
        raise FusionError(f"placeholder '{param.name}' in the epilogue is {stand_in.buffer.dtype.name}, but the "
                          f"anchor's output is {param.dtype.name}: declare it {param.dtype.name}")
    inverse = _invert(definition.axes, stand_in.indices, epi_shape, out_shape, definition.name)
    if definition.overwrites is not None:
        value = _read_in_place(value, definition, new_inputs)
    _record_inputs(value, new_inputs, skip=stand_in.buffer)
    new_inputs.pop(definition.buffer.uid, None)     # (read in place: the output parameter)

    class _Epilogue(ir.Rewriter):
        def visit_Prefetch(self, s):
            return _without_prefetch_of(self.generic_visit(s), param)

        def visit_Store(self, s):
            s = self.generic_visit(s)
            if s.buffer.uid != param.uid:
                return s
            index = inverse(s.indices)
            anchor_value = ir.Var(f"{param.name}_value", s.value.dtype)   # computed once, however often read
            stored = _at_store(_replace_loads(value, stand_in.buffer, anchor_value), s.indices)
            if stored.dtype != definition.dtype:
                stored = ir.Cast(stored, definition.dtype)
            return ir.seq([ir.Assign(anchor_value, s.value, s.loc), ir.Store(definition.buffer, tuple(index), stored, s.loc)])

    def _at_store(stored: ir.Expr, indices: tuple) -> ir.Expr:
        """The epilogue's value at the anchor's store to `indices`, its index arithmetic simplified knowing that the
        store is in bounds: a transpose-and-reshape epilogue (attention's heads merged) read its other operands at
        `(z + (j0 + j) // 64) % 12` for head z, where 0 <= j0 + j < 64 makes that z (a division and a remainder an
        element, which kept the loop scalar)."""
        at = [ir.Var(f"{param.name}_at{k}", i.dtype) for k, i in enumerate(indices)]
        stored = ir.substitute(stored, {a.uid: i for a, i in zip(definition.axes, inverse(tuple(at)))})
        if all(out_shape):
            stored = simplify_within(stored, {v.uid: (0, n - 1) for v, n in zip(at, out_shape)})
        return ir.substitute(stored, {v.uid: i for v, i in zip(at, indices)})

    return _Epilogue().visit(body)


def _read_in_place(value: ir.Expr, definition: Tensor, new_inputs: dict) -> ir.Expr:
    """`value` reading the placeholder that `definition` overwrites (`compute.in_place`) from the definition's own
    memory, which holds it when the kernel starts: each element's own, which the store reads before it writes."""
    source = definition.overwrites.buffer
    if source.uid in new_inputs:
        raise FusionError(f"epilogue '{definition.name}' is computed in place over '{source.name}', which a prologue "
                          "reads too: the kernel would read elements it may have overwritten")

    def own(i: ir.Expr, axis: ir.Var, size: ir.Expr) -> bool:      # (an axis of one element: read at 0, say)
        return ir.structurally_equal(i, axis) or (isinstance(size, ir.Const) and size.value == 1)

    class _Own(ir.Rewriter):
        def visit_Load(self, e):
            if e.buffer.uid != source.uid:
                return self.generic_visit(e)
            if not all(own(i, a, n) for i, a, n in zip(e.indices, definition.axes, definition.shape)):
                raise FusionError(f"epilogue '{definition.name}' is computed in place over '{source.name}' but reads "
                                  "it at another element than its own, which the kernel may have overwritten by then")
            return ir.Load(definition.buffer, e.indices)
    return _Own().visit(value)


def _without_prefetch_of(s: ir.Prefetch, param: ir.Buffer) -> ir.Stmt:
    """`s`, or nothing where it prefetches `param`: a fused prologue's or epilogue's values have no memory."""
    return ir.Seq(()) if s.src.buffer.uid == param.uid else s


def _replace_loads(expr: ir.Expr, buffer: ir.Buffer, value: ir.Expr) -> ir.Expr:
    class _Sub(ir.Rewriter):
        def visit_Load(self, e):
            return value if e.buffer.uid == buffer.uid else self.generic_visit(e)
    return _Sub().visit(expr)


def _invert(axes: tuple, index: tuple, epi_shape: tuple, out_shape: tuple, name: str):
    """For the epilogue map axes -> output index, the inverse as a function of IR index tuples.

    The map must be a bijection; the inverses fusion can express are digit permutations:
    write the output's linear index in some mixed radix, permute (and re-weight) its digits
    and read the result as the epilogue's linear index. That covers reshapes, transposes and
    any composition of them (e.g. split heads, transpose, merge heads). The digits are read
    off the inverse table greedily and then checked on every element.
    """
    size = math.prod(epi_shape)
    if size != math.prod(out_shape):
        raise FusionError(f"epilogue '{name}' has {size} elements but the anchor output has {math.prod(out_shape)}: "
                          "the index map is not bijective")
    if size == 0:                          # no element is stored: any map will do
        return lambda idx: [ir.const(0)] * len(epi_shape)
    if any(ir.collect(i, ir.Load) for i in index):
        raise FusionError(f"epilogue '{name}' reads the anchor output at an index computed from tensor values; an "
                          "epilogue's index must be a fixed function of its axes")
    evaluator = _Evaluator({}, {})
    grid = {a.uid: np.arange(n).reshape([-1 if k == j else 1 for j in range(len(axes))])
            for k, (a, n) in enumerate(zip(axes, epi_shape))}
    coords = [np.broadcast_to(np.asarray(evaluator.eval(i, grid), np.int64), epi_shape) for i in index]
    if any(((c < 0) | (c >= n)).any() for c, n in zip(coords, out_shape)):
        raise FusionError(f"epilogue '{name}' reads the anchor output out of its bounds")
    forward = np.ravel_multi_index(coords, out_shape).reshape(-1)    # epilogue element -> output element
    reached = np.zeros(size, bool)
    reached[forward] = True               # as many elements as the output: onto means one-to-one
    if not reached.all():
        raise FusionError(f"epilogue '{name}' reads some output elements more than once: its index map is not "
                          "bijective")
    inverse = np.empty(size, np.int64)
    inverse[forward] = np.arange(size)                               # output element -> epilogue element
    digits = _digits(inverse)
    if digits is None:
        raise FusionError(f"epilogue '{name}': its index map is bijective, but not a permutation of the digits of "
                          "the output's linear index in some mixed radix, which is what fusion can invert (reshapes "
                          "and transposes whose dimensions split or merge evenly)")
    return lambda idx: _inverse_expr(idx, out_shape, epi_shape, digits)


def _digits(inverse: np.ndarray):
    """[(block, radix, stride)] with inverse(i) = sum((i // block) % radix * stride), or None."""
    size = len(inverse)
    if size == 0 or inverse[0] != 0:
        return None
    digits, block = [], 1
    while block < size:
        stride = int(inverse[block])
        steps = inverse[::block]            # inverse(j * block), j = 0, 1, ...: the run is where j * stride stops
        mismatch = np.flatnonzero(steps != np.arange(len(steps)) * stride)
        run = int(mismatch[0]) if len(mismatch) else len(steps)
        while (size // block) % run:
            run -= 1
        if run == 1:
            return None
        digits.append((block, run, stride))
        block *= run
    i = np.arange(size)
    if not (sum(i // b % r * s for b, r, s in digits) == inverse).all():
        return None
    return digits


def _inverse_expr(index: tuple, out_shape: tuple, epi_shape: tuple, digits: list) -> list:
    """The epilogue coordinates of the anchor's output `index`.

    A digit lying within one output dimension reads that index alone (`i`, `i // b`, `i % r`),
    and one lying within one epilogue dimension adds to that coordinate alone, so a reshape
    that splits or merges dimensions costs a division or two instead of an unravel of the
    linear index (which the vectorizer cannot see through).
    """
    digits = _split_digits(digits, out_shape, epi_shape)
    linear = ir.const(0)
    for i, n in zip(index, out_shape):
        linear = linear * n + i
    terms = []                  # (digit value, stride in the epilogue, (axis, elements after it) or None)
    for block, radix, stride in digits:
        value = _digit_of_index(index, out_shape, block, radix)
        terms.append((linear // block % radix if value is None else value, stride,
                      _axis_holding(epi_shape, stride, radix)))
    if any(axis is None for _, _, axis in terms):   # a digit across epilogue dimensions: unravel their linear index
        epi_linear = ir.const(0)
        for value, stride, _ in terms:
            epi_linear = epi_linear + value * stride
        return list(_unravel(epi_linear, tuple(ir.const(n) for n in epi_shape)))
    coords = [ir.const(0)] * len(epi_shape)
    for value, stride, (axis, inner) in terms:
        coords[axis] = coords[axis] + value * (stride // inner)
    return coords


def _inner_sizes(shape: tuple) -> list:
    """Elements after each dimension of a row-major shape."""
    inner = [1] * len(shape)
    for d in reversed(range(len(shape) - 1)):
        inner[d] = inner[d + 1] * shape[d + 1]
    return inner


def _split_digits(digits: list, out_shape: tuple, epi_shape: tuple) -> list:
    """The digits cut at the dimension boundaries of both shapes, where the radix divides there."""
    out_bounds, epi_bounds = set(_inner_sizes(out_shape)), set(_inner_sizes(epi_shape))
    work, result = list(digits), []
    while work:
        block, radix, stride = work.pop()
        cuts = [b // block for b in out_bounds if b % block == 0 and block < b < block * radix]
        cuts += [b // stride for b in epi_bounds if b % stride == 0 and stride < b < stride * radix]
        cut = min((c for c in cuts if radix % c == 0), default=None)
        if cut is None:
            result.append((block, radix, stride))
        else:
            work += [(block, cut, stride), (block * cut, radix // cut, stride * cut)]
    return result


def _digit_of_index(index: tuple, shape: tuple, block: int, radix: int):
    """(linear // block) % radix as an expression of the one index holding that digit, or None."""
    for i, n, inner in zip(index, shape, _inner_sizes(shape)):
        # (L // inner) is i + n * (the outer indices): the digit is i's alone when its span divides n
        if inner <= block and block % inner == 0 and n % (block // inner * radix) == 0:
            value = i // (block // inner) if block > inner else i
            return value % radix if block // inner * radix < n else value
    return None


def _axis_holding(shape: tuple, stride: int, radix: int):
    """(axis, elements after it) of the dimension that a digit of this stride and radix lies in, or None."""
    for axis, (n, inner) in enumerate(zip(shape, _inner_sizes(shape))):
        if inner <= stride and stride % inner == 0 and stride * radix <= inner * n:
            return axis, inner
    return None
