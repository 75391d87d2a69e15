"""Rule-based scheduling: a kernel for any injective or reduce definition, built as IR.

Injective: one thread per output element (4 per thread, in a `repeat(4) * spatial(256)`
layout over the flattened output so consecutive threads touch consecutive elements).

Reduce, by the sizes of the call (O outputs, R reduced elements each):
  - 'thread':  a thread per output, looping over R (R small, or the reduced axis is not the
               contiguous one, so that neighbouring threads read neighbouring elements);
  - 'warp':    a warp per output, lanes striding over R, then a shuffle reduction;
  - 'block':   a block per output, threads striding over R, shuffles then shared memory;
  - 'split':   two reduce definitions when there are few outputs and many reduced elements:
               chunks of R reduced into partials, then the partials (each scheduled as above; a
               'thread' chunk loops over its elements inside R, with no test per element);
  - 'columns': (the cpu) a block per COLUMNS neighbouring outputs along the last axis, where that axis is
               the contiguous one of the loads (a sum over axis 0): each reduced element is a row of up to
               COLUMNS contiguous values added into as many accumulators.
Generated kernels are ordinary kernels: their IR prints, their CUDA compiles, they run on
the cpu target.
"""
from __future__ import annotations

import dataclasses
import inspect

from .. import ir
from ..compute import Tensor, accumulator_dtype, reduction_identity, size_var
from ..ir import evaluate_int
from ..ir import types as T
from ..lang import math_expr
from ..lang.intrinsics import blockIdx, gridDim, threadIdx
from ..runtime.kernel import Kernel
from .hoist import hoist_invariants
from .inline import inline_injective

BLOCK = 256
PER_THREAD = 4          # elements per thread in elementwise kernels
SPAN = 4096             # elements per block (one thread) in the cpu's elementwise kernels
CPU_ROW = 16            # the cpu's shortest row walked as a row (shorter: flat spans, coordinates carried); rows
                        # of 16 f32 as rows: (65536, 16) + (16,) 1.1-1.5 -> 0.5 ms, its sum over axis 0 0.47-0.75 ->
                        # 0.26-0.30 ('columns'); rows of 8 sliced from (131072, 64) ran slower as rows (1.7 -> 2.6)
LANES = 8               # interleaved accumulators of a sequential ('thread') reduction
UNROLL_REDUCED = 16     # a 'thread' reduction of at most this many (constant) elements is unrolled
SUM_CHAIN = 128         # terms each partial sum of a 'thread' float sum adds before it goes into an f64 total
COLUMNS = 1024          # neighbouring outputs per block of a 'columns' reduction (8 KiB of f64 accumulators)
WARPS = BLOCK // 32
# ---------------------------------------------------------------- shared helpers
def _constant(e: ir.Expr) -> int | None:
    """The value of an integer expression of constants only, else None."""
    return None if ir.collect(e, ir.Var) else ir.evaluate_int(e, {})


def numel(shape: tuple) -> ir.Expr:
    """The element count of a shape, as an IR expression."""
    total = ir.const(1)
    for d in shape:
        total = total * d
    return total


def size_function(expr_of_sizes, names: list):
    """A callable with parameters named `names` that evaluates `expr_of_sizes(env)` (a grid callable)."""
    def fn(*values):
        return expr_of_sizes(dict(zip(names, values)))

    fn.__signature__ = inspect.Signature([inspect.Parameter(n, inspect.Parameter.POSITIONAL_OR_KEYWORD)
                                          for n in names])
    return fn


def size_names(*exprs) -> list:
    """The names of the size symbols in `exprs` (IR expressions; ints have none), each once, in order."""
    names = []
    for e in exprs:
        for v in ir.collect(e, ir.Var) if isinstance(e, ir.Expr) else ():
            if v.kind == "size" and v.name not in names:
                names.append(v.name)
    return names


def _function(name: str, out: Tensor, body: ir.Stmt, block=BLOCK) -> ir.Function:
    """An IR Function whose parameters are the global buffers `body` reads, then the output,
    then (as i32 scalars) any size the body uses that no parameter's shape determines."""
    inputs: dict = {}
    for load in ir.collect(body, ir.Load):
        if load.buffer.scope == "global" and load.buffer.uid != out.buffer.uid:
            inputs.setdefault(load.buffer.uid, load.buffer)
    params, body = _bindable(tuple(inputs.values()) + (out.buffer,), body)
    sizes = {v.uid: v for b in params for d in b.shape for v in ir.collect(d, ir.Var) if v.kind == "size"}
    loose = {v.uid: v for v in ir.collect(body, ir.Var) if v.kind == "size" and v.uid not in sizes}
    scalars = {uid: ir.Var(v.name, v.dtype, kind="param") for uid, v in loose.items()}
    if scalars:
        body = ir.substitute(body, scalars)
    return ir.Function(name, params + tuple(scalars.values()), tuple(sizes.values()), body, (block, 1, 1))


def _bindable(params: tuple, body: ir.Stmt) -> tuple[tuple, ir.Stmt]:
    """`params` (and `body`, reading them) with each dim computed from a size that no parameter has as a dim of its
    own (cdiv(N, 4) of an intermediate, when no parameter is N long) made a size symbol of its own: a launch binds
    sizes from its arguments' shapes, so it could not know N there (N then comes as a scalar, if the body uses it)."""
    whole = {d.uid for b in params for d in b.shape if isinstance(d, ir.Var)}
    symbols: dict = {}      # the dim's text -> its symbol: equal dims of two parameters stay one size
    renamed = {}
    for b in params:
        shape = list(b.shape)
        for axis, d in enumerate(shape):
            if not isinstance(d, ir.Const) and any(v.uid not in whole for v in ir.collect(d, ir.Var)):
                text = ir.expr_str(d)
                if text not in symbols:
                    symbols[text] = ir.Var(f"{b.name}_dim{axis}_{len(symbols)}", T.i32, kind="size")
                shape[axis] = symbols[text]
        if any(a is not d for a, d in zip(shape, b.shape)):
            renamed[b.uid] = dataclasses.replace(b, shape=tuple(shape))   # the same uid: the op passes the same array
    if not renamed:
        return params, body
    return tuple(renamed.get(b.uid, b) for b in params), _Rebuffer(renamed).visit(body)


class _Rebuffer(ir.Rewriter):
    def __init__(self, buffers: dict):
        self.buffers = buffers

    def visit_buffer(self, buffer: ir.Buffer) -> ir.Buffer:
        return self.buffers.get(buffer.uid, buffer)


# ---------------------------------------------------------------- injective
def injective_strategy(out: Tensor, sizes: dict, target: str = "cuda") -> str:
    """'rows' when the last axis is long enough to fill a block, else 'flat'; on the cpu their one-thread
    forms 'row_spans' (for rows of CPU_ROW or more) and 'spans' (a block's threads run one after another
    there: 256 strided walks that LLVM cannot vectorize, where one contiguous loop over a span it can)."""
    last = evaluate_int(out.shape[-1], sizes) if out.ndim >= 2 else 0
    if target == "cpu":     # shorter rows too where their loops split by ranges (a pad of (N, 16): 11.4 -> 1.9 ms)
        return "row_spans" if last >= CPU_ROW or (last > 1 and _selects_along_rows(out)) else "spans"
    return "rows" if last >= BLOCK else "flat"


def _selects_along_rows(out: Tensor) -> bool:
    """Whether `out`'s definition selects by ranges of its last axis (`_ranged_loop`: a pad, a concatenation)."""
    ranges = [_ranges_of(s.cond, out.axes[-1], out.buffer) for s in ir.collect(out.body, ir.Select)]
    return any(r is not None and (r[1] or r[2]) for r in ranges)


def schedule_injective(out: Tensor, inline: set, strategy: str = "flat") -> Kernel:
    """An elementwise kernel writing `out`, with the injective producers in `inline` computed in place.

    'flat': consecutive threads take consecutive elements of the flattened output.
    'rows': blocks walk the rows (all but the last axis, unravelled once per row, grid-stride
    over blockIdx.y) and chunks of PER_THREAD * BLOCK columns, so no element pays for a division.
    'spans' / 'row_spans' (the cpu): the same with one thread per block, which loops over a
    contiguous span of SPAN elements (of the flattened output, or of a row; rows shorter than SPAN in groups
    that make SPAN elements, their coordinates carried from row to row).
    In every form the element's invariant subexpressions that read memory are computed once, ahead of
    the loops (`hoist.hoist_invariants`).
    """
    body = inline_injective(out.body, inline)
    serial = strategy in ("spans", "row_spans")
    per_block = SPAN if serial else BLOCK * PER_THREAD
    r = ir.Var("r", T.i32, kind="loop")
    column = ir.Var("j", T.i32, kind="loop" if serial else "local")
    rows_per_grid = 65535                  # the grid's y limit
    if strategy in ("rows", "row_spans"):
        rows, width = numel(out.shape[:-1]), out.shape[-1]
        step, row = ir.Var("step", T.i32, kind="loop"), ir.Var("row", T.i32)
        row_index, row_coords = _coordinates(row, out.shape[:-1], "r")
        index, coords = row_index + [column], []
    else:
        rows, width = ir.const(1), numel(out.shape)
        index, coords = ([column], []) if len(out.shape) == 1 else _coordinates(column, out.shape, "i")
    invariants, value = hoist_invariants(ir.substitute(body, {a.uid: i for a, i in zip(out.axes, index)}),
                                         out.buffer)

    def store_of(value: ir.Expr) -> ir.Stmt:
        return ir.Store(out.buffer, tuple(index), ir.Cast(value, out.dtype) if value.dtype != out.dtype else value)
    store = store_of(value)
    if strategy == "row_spans" or (serial and len(out.shape) == 1):     # (a 1-d output is one row)
        start = blockIdx.x * per_block
        loop = _ranged_loop(column, start, ir.Call("min", (start + per_block, width), start.dtype), value, store_of,
                            out.buffer)
    elif serial:            # coordinates unravelled once per span, then carried: no division per element
        start = blockIdx.x * per_block
        first = [ir.Assign(c, e) for c, e in zip(index, _unravel(start, out.shape))]
        loop = ir.seq(first + [ir.For(column, start, ir.Call("min", (start + per_block, width), start.dtype),
                                      ir.const(1), ir.seq([store, _advance(index, out.shape)]))])
    else:
        loop = ir.For(r, ir.const(0), ir.const(PER_THREAD), ir.const(1), ir.seq([
            ir.Assign(column, blockIdx.x * per_block + r * BLOCK + threadIdx.x),
            ir.If(ir.binary("<", column, width), ir.seq(coords + [store]))]), unroll=True)
    if strategy == "rows":
        trips = (rows - blockIdx.y + gridDim.y - 1) // gridDim.y
        loop = ir.For(step, ir.const(0), trips, ir.const(1),
                      ir.seq([ir.Assign(row, blockIdx.y + step * gridDim.y)] + row_coords + [loop]))
    elif strategy == "row_spans":       # a block takes a group of rows, its coordinates unravelled once, then carried
        group, first, row = ir.Var("group", T.i32), ir.Var("first", T.i32), ir.Var("row", T.i32, kind="loop")
        rows_per_group = ir.Call("max", (ir.const(1), ir.const(SPAN) // width), T.i32)
        groups = (rows + rows_per_group - 1) // rows_per_group
        trips = (groups - blockIdx.y + gridDim.y - 1) // gridDim.y
        each_row = ir.For(row, first, ir.Call("min", (first + rows_per_group, rows), T.i32), ir.const(1),
                          ir.seq([loop, _advance(row_index, out.shape[:-1])]))
        loop = ir.For(step, ir.const(0), trips, ir.const(1), ir.seq(
            [ir.Assign(group, blockIdx.y + step * gridDim.y), ir.Assign(first, group * rows_per_group)]
            + [ir.Assign(c, e) for c, e in zip(row_index, _unravel(first, out.shape[:-1]))] + [each_row]))
    fn = _function(f"{out.name}_{strategy}", out, ir.seq(invariants + [loop]), block=1 if serial else BLOCK)
    names = size_names(rows, width)
    grid = size_function(lambda env: (-(-evaluate_int(width, env) // per_block),
                                      max(1, min(_row_groups(strategy, evaluate_int(rows, env),
                                                             evaluate_int(width, env)), rows_per_grid))), names)
    return Kernel.from_ir(fn, grid, streams=True)


def _row_groups(strategy: str, rows: int, width: int) -> int:
    """The groups of rows the blocks of a 'rows' or 'row_spans' kernel take: a row each on a GPU; on the cpu as many
    rows as make SPAN elements (rows of 64 took a block each: four divisions a row, for sixteen vector stores)."""
    if strategy != "row_spans":
        return rows
    per_group = max(1, SPAN // max(width, 1))
    return -(-rows // per_group)


def _advance(coords: list, shape: tuple) -> ir.Stmt:
    """Step row-major `coords` in `shape` to the next element: the last one counts up, and one that reaches its
    axis's size goes back to 0 and carries into the one before (a 0-d output's one element: nothing to step)."""
    if not coords:
        return ir.seq([])
    step = ir.Assign(coords[0], coords[0] + 1)
    for c, d in zip(coords[1:], shape[1:]):
        step = ir.seq([ir.Assign(c, c + 1), ir.If(ir.binary(">=", c, d), ir.seq([ir.Assign(c, ir.const(0)), step]))])
    return step


RANGE_SPLITS = 6        # nested selects a cpu row loop is split by, at most (a concatenation of 64 parts: 6)


def _ranged_loop(j: ir.Var, lo: ir.Expr, hi: ir.Expr, value: ir.Expr, stmt_of, written: ir.Buffer,
                 depth: int = 0) -> ir.Stmt:
    """`for j in [lo, hi): stmt_of(value)`, where `value` selects by ranges of j (a pad's border, a concatenation's
    parts along the row), as loops over those ranges, each on its selected operand: a copy or a fill per range,
    which LLVM vectorizes, instead of a test per element (a pad of (4096, 1024) by 1 took 1.9 ms, numpy 1.2).

    The first select whose test is a conjunction of `j + c < e`-like bounds (c, e the same all along the row) and of
    tests that do not depend on j splits the loop, recursively, RANGE_SPLITS deep at most; a test of the row alone
    chooses between two loops."""
    if depth < RANGE_SPLITS:
        for select in ir.collect(value, ir.Select):
            ranges = _ranges_of(select.cond, j, written)
            if ranges is None:
                continue
            fixed, lower, upper = ranges
            taken = _Branch(select, select.a).visit(value)
            other = _Branch(select, select.b).visit(value)

            def loop(a, b, v):
                return _ranged_loop(j, a, b, v, stmt_of, written, depth + 1)
            if not lower and not upper:     # a test of the row alone (a concatenation's part along an outer axis)
                return ir.If(fixed, loop(lo, hi, taken), loop(lo, hi, other))
            begin, end = ir.Var(f"begin{depth}", T.i32), ir.Var(f"end{depth}", T.i32)
            parts = [ir.Assign(begin, ir.Call("max", (lo, ir.Call("min", (hi, _bound("max", lower)), T.i32)), T.i32))
                     if lower else ir.Assign(begin, lo)]
            parts.append(ir.Assign(end, ir.Call("max", (begin, ir.Call("min", (hi, _bound("min", upper)), T.i32)),
                                                T.i32)) if upper else ir.Assign(end, hi))
            parts += ([loop(lo, begin, other)] if lower else []) + [loop(begin, end, taken)] + \
                ([loop(end, hi, other)] if upper else [])
            split = ir.seq(parts)
            return split if fixed is None else ir.If(fixed, split, loop(lo, hi, other))
    fresh = ir.Var(j.name, j.dtype, kind="loop")
    return ir.For(fresh, lo, hi, ir.const(1), ir.substitute(stmt_of(value), {j.uid: fresh}))


def _bound(op: str, bounds: list) -> ir.Expr:
    """The max (op 'max') or min of `bounds`."""
    out = bounds[0]
    for b in bounds[1:]:
        out = ir.Call(op, (out, b), T.i32)
    return out


def _ranges_of(cond: ir.Expr, j: ir.Var, written: ir.Buffer):
    """(the conjunction of `cond`'s terms that do not depend on j or None, lower bounds, upper bounds) where `cond`
    holds exactly for lower <= j < upper (every bound) and those terms; None where a term is neither (an
    expression of j other than j + c, a test of data)."""
    terms, stack = [], [cond]
    while stack:
        e = stack.pop()
        if isinstance(e, ir.Binary) and e.op == "and":
            stack += [e.b, e.a]
        else:
            terms.append(e)
    fixed, lower, upper = None, [], []
    for term in terms:
        if _steady(term, j, written):
            fixed = term if fixed is None else ir.binary("and", fixed, term)
            continue
        if not (isinstance(term, ir.Binary) and term.op in ("<", "<=", ">", ">=")):
            return None
        op, left, right = term.op, term.a, term.b
        if _offset(right, j, written) is not None:      # e < j + c  ->  j + c > e
            op, left, right = {"<": ">", "<=": ">=", ">": "<", ">=": "<="}[op], right, left
        c = _offset(left, j, written)
        if c is None or not _steady(right, j, written) or right.dtype != T.i32:
            return None
        edge = right - c
        if op in ("<=", ">"):
            edge = edge + 1
        (upper if op in ("<", "<=") else lower).append(edge)
    return fixed, lower, upper


def _offset(e: ir.Expr, j: ir.Var, written: ir.Buffer):
    """c where `e` is j + c (0 for j itself; c steady along the row), else None."""
    if isinstance(e, ir.Var) and e.uid == j.uid:
        return ir.const(0)
    if isinstance(e, ir.Binary) and e.op in ("+", "-") and e.dtype == T.i32:
        a = _offset(e.a, j, written)
        if a is not None and _steady(e.b, j, written):
            return a + e.b if e.op == "+" else a - e.b
        b = _offset(e.b, j, written) if e.op == "+" else None
        if b is not None and _steady(e.a, j, written):
            return b + e.a
    return None


def _steady(e: ir.Expr, j: ir.Var, written: ir.Buffer) -> bool:
    """Whether `e` is the same all along a row: it reads no j, and no memory but elements at constant indices of
    buffers the kernel does not write (a pad's widths)."""
    for x in ir.collect(e, (ir.Load, ir.Var)):
        if isinstance(x, ir.Var) and x.uid == j.uid:
            return False
        if isinstance(x, ir.Load) and (x.buffer.uid == written.uid or
                                       not all(isinstance(i, ir.Const) for i in x.indices)):
            return False
    return True


def _coordinates(linear: ir.Expr, shape: tuple, prefix: str) -> tuple[list, list]:
    """(coordinate variables, their assignments) of a linear index in `shape`: each division by a
    (runtime) size is done once per element, not once per use of the coordinate."""
    coords = [ir.Var(f"{prefix}{n}", T.i32) for n in range(len(shape))]
    return coords, [ir.Assign(c, e) for c, e in zip(coords, _unravel(linear, shape))]


def _unravel(linear: ir.Expr, shape: tuple) -> list:
    """Row-major coordinates of a linear index in a (possibly symbolic) shape."""
    coords, stride = [], ir.const(1)
    for d in reversed(shape):
        coords.append(linear // stride % d if len(coords) < len(shape) - 1 else linear // stride)
        stride = stride * d
    return list(reversed(coords))


# ---------------------------------------------------------------- reduce
def combine(op: str, acc: ir.Expr, value: ir.Expr) -> ir.Expr:
    """`op`'s combination of an accumulator and a value."""
    if op in ("sum", "mean"):
        return ir.binary("+", acc, value)
    if op == "prod":
        return ir.binary("*", acc, value)
    return math_expr(op, [acc, value])


def choose_strategy(t: Tensor, outputs: int, reduced: int, target: str = "cuda", workers: int = 1,
                    may_split: bool = True, last: int = 1) -> str:
    """'thread', 'warp', 'block', 'split' or 'columns' for a reduction of `reduced` elements into each of
    `outputs` (`last` of them along the output's last axis).

    On a GPU the choice keeps memory accesses coalesced and the device full. On the cpu
    target, where a block's threads run one after another on one core, a thread per output
    streams through memory sequentially where the reduced axis is the contiguous one, and a
    block per COLUMNS outputs reads rows of them where the output's last axis is ('columns': a
    thread per output walked a column, a cache line and a page per element, 50x numpy's time for
    a sum over axis 0); a reduction whose blocks are fewer than the `workers` (CPU threads) is split, its reduced
    elements cut into chunks, where it has enough of them to pay for the split's second launch. The two stages of
    a split (`may_split=False`) are not split again.
    """
    may_split = may_split and (t.op != "mean" or accumulator_dtype(t).is_float)   # an integer mean divides once
    if target == "cpu":
        rows = reads_rows(t, last, reduced)
        blocks = outputs // max(last, 1) * -(-last // COLUMNS) if rows else -(-outputs // CPU_THREAD_BLOCK)
        work = outputs * reduced // (2 if rows else 1)
        if may_split and blocks < workers and work >= CPU_SPLIT_ELEMENTS and reduced >= CPU_SPLIT_CHUNKS:
            return "split"      # (a sum over axis 0 of (4096, 1024) ran as one block: one of two cores idle)
        return "columns" if rows else "thread"
    if reduced <= 16 or not _reads_contiguously_along(t, t.reduce_axes):
        return "thread"
    if reduced <= 512:
        return "warp"
    if may_split and outputs < 64 and reduced >= 32768:   # too few blocks to fill a GPU otherwise
        return "split"
    return "block"


def reads_rows(t: Tensor, last: int, reduced: int) -> bool:
    """Whether the cpu reduces `t` by 'columns' (a block adds rows of `last`-axis neighbours), or a split of it
    with its chunks as a leading axis (`split_stages`), each chunk's partials a row."""
    return last >= CPU_ROW and reduced > 1 and _walks_columns(t)


def _last_index_vars(load: ir.Load) -> set:
    """The uids of the variables a load's last index reads (none for a 0-d load)."""
    return {v.uid for v in ir.collect(load.indices[-1], ir.Var)} if load.indices else set()


def _reads_contiguously_along(t: Tensor, axes) -> bool:
    """Whether some load of `t`'s body has a last index that moves with one of `axes`."""
    uids = {a.uid for a in axes}
    return any(uids & _last_index_vars(load) for load in ir.collect(t.body, ir.Load))


def _walks_columns(t: Tensor) -> bool:
    """Whether `t`'s loads that move with its last output axis read contiguously along it and along no reduced
    axis (a load that does not move with it, such as the vector of a vector-matrix product, stays put along a
    row of outputs)."""
    if not t.axes:
        return False
    last, reduced = t.axes[-1].uid, {a.uid for a in t.reduce_axes}
    moving = [load for load in ir.collect(t.body, ir.Load)
              if any(v.uid == last for index in load.indices for v in ir.collect(index, ir.Var))]
    return bool(moving) and all(last in _last_index_vars(load) and not reduced & _last_index_vars(load)
                                for load in moving)


CPU_SPLIT_CHUNKS = 32       # chunks per output of a split on the cpu: work for every CPU thread
CPU_THREAD_BLOCK = 8        # outputs per block of a cpu 'thread' reduction: blocks are what the CPU threads share
CPU_SPLIT_ELEMENTS = 1 << 20    # elements in all, at least, of a cpu reduction split for threads its blocks leave idle
                                # (a split's second launch and partials cost ~20 us: a one-thread sum of 2^20 f32 took
                                # 94 us, split 72; of 2^19, 59 against 75; 'columns' break even at twice as many)
GPU_SPLIT_PARTIALS = 2048   # partial results of a split on a GPU, in all: a dozen blocks per SM of a large one
MIN_SPLIT_CHUNK = 4096      # elements per chunk on a GPU, at least: a block's loads in flight


def split_chunks(outputs: int, reduced: int, target: str = "cuda") -> int:
    """Into how many chunks a 'split' reduction cuts each output's `reduced` elements: on a GPU, enough
    partials to fill the device (32 chunks of a 67M-element sum ran on 32 SMs at 0.18 of peak bandwidth)."""
    if target == "cpu":
        return CPU_SPLIT_CHUNKS
    return max(2, min(-(-GPU_SPLIT_PARTIALS // max(outputs, 1)), reduced // MIN_SPLIT_CHUNK))


def _warp_reduce(op: str, acc: ir.Var, width: int = 32) -> list:
    stmts, offset = [], width // 2
    while offset:
        shuffled = ir.Call("shfl_xor", (acc, ir.const(offset), ir.const(32)), acc.dtype)
        stmts.append(ir.Assign(acc, combine(op, acc, shuffled)))
        offset //= 2
    return stmts


def _reduce_loop(t: Tensor, body: ir.Expr, out_index: list, acc: ir.Var, start, stop, step) -> ir.Stmt:
    """acc = combine(acc, body) for the reduced linear indices start, start+step, ... < stop."""
    r = ir.Var("k", T.i32, kind="loop")
    return ir.For(r, ir.as_expr(start), ir.as_expr(stop), ir.const(step),
                  ir.Assign(acc, combine(t.op, acc, _element(t, body, out_index, r, acc.dtype))))


def _element(t: Tensor, body: ir.Expr, out_index: list, linear: ir.Expr, dtype) -> ir.Expr:
    """The reduced element at reduced linear index `linear` of output `out_index`, as `dtype`."""
    values = {a.uid: i for a, i in zip(t.axes, out_index)}
    values.update({a.uid: i for a, i in zip(t.reduce_axes, _unravel(linear, t.reduce_shape))})
    value = ir.substitute(body, values)
    return ir.convert(value, dtype)


def _lanes_loop(t: Tensor, body: ir.Expr, out_index: list, acc: ir.Var, reduced: ir.Expr, lanes: int = LANES) -> list:
    """A sequential reduction over `lanes` interleaved accumulators; a float sum takes blocks of SUM_CHAIN terms per
    accumulator that way and adds each block's sum to an f64 total. A float max / min keeps one chain: the cpu's
    `td.max` is LLVM's NaN-keeping maximum, whose running value LLVM vectorizes itself (lanes of plain compares with
    their NaNs noted beside them stayed scalar: a max over the rows of (4096, 1024) f32 took 1.5-1.7x the time).

    Independent accumulators let a CPU add `lanes` elements per vector instruction. One running f32 sum of 4M
    elements of 0.1 drifted 0.35% from numpy's (each of 8 lanes added half a million terms); by blocks, no f32
    partial sum adds more than SUM_CHAIN terms, and the total is exact to f64's precision."""
    if t.op in ("max", "min") and acc.dtype.is_float:
        lanes = 1
    few, block = _constant(reduced), SUM_CHAIN * lanes
    if t.op not in ("sum", "mean") or not acc.dtype.is_float or (few is not None and few <= block):
        if lanes == 1:
            return [_reduce_loop(t, body, out_index, acc, 0, reduced, 1)]
        return _lanes(t, body, out_index, acc, acc.dtype, ir.const(0), reduced, lanes)
    total = ir.Var("total", T.f64) if acc.dtype.bits < 64 else acc
    b = ir.Var("block", T.i32, kind="loop")
    start = b * block
    count = ir.Call("min", (ir.const(block), reduced - start), T.i32)     # the last block may be short
    blocks = ir.For(b, ir.const(0), (reduced + (block - 1)) // block, ir.const(1), ir.seq(
        _lanes(t, body, out_index, total, acc.dtype, start, count, lanes)))     # (the body appears once)
    return [ir.Assign(total, ir.convert(acc, total.dtype)), blocks, ir.Assign(acc, ir.convert(total, acc.dtype))]


def _lanes(t: Tensor, body: ir.Expr, out_index: list, into: ir.Var, dtype, start: ir.Expr, count: ir.Expr,
           lanes: int) -> list:
    """`into` combined with the reduced elements start .. start + count - 1, taken in `lanes` interleaved partial
    results of `dtype` (combined pairwise at the end)."""
    chains = [ir.Var(f"lane{v}", dtype) for v in range(lanes)]
    r = ir.Var("k", T.i32, kind="loop")
    steps = [ir.Assign(lane, combine(t.op, lane, _element(t, body, out_index, start + r * lanes + v, dtype)))
             for v, lane in enumerate(chains)]
    main = ir.For(r, ir.const(0), count // lanes, ir.const(1), ir.seq(steps))
    identity = reduction_identity(t.op, dtype, t.body.dtype)
    stmts = [ir.Assign(lane, identity) for lane in chains] + [main]
    if lanes > 1:
        stmts.append(_reduce_loop(t, body, out_index, chains[0], start + count // lanes * lanes, start + count, 1))
    width = lanes // 2
    while width:    # pairwise: lane v += lane v + width
        stmts += [ir.Assign(chains[v], combine(t.op, chains[v], chains[v + width])) for v in range(width)]
        width //= 2
    return stmts + [ir.Assign(into, combine(t.op, into, ir.convert(chains[0], into.dtype)))]


def _inside_prefix(t: Tensor, body: ir.Expr, dtype, out_index: list) -> tuple | None:
    """(value, count) where `body` is `value if base + k < bound else <the identity>` over `t`'s one reduce axis k,
    base and bound free of k: a split's chunk (`split_stages`), whose last chunk runs past the reduced elements.
    The elements from k = bound - base on add the identity, so the reduction is that of `value` over the first
    count = min(extent, max(0, bound - base)) elements, with no test an element: tested, the cpu's loop stayed scalar
    (a max over 4M f32: 3.5x numpy's time). `out_index` gives the output coordinates count is computed at. Else None."""
    if len(t.reduce_axes) != 1 or not isinstance(body, ir.Select):
        return None
    k, cond, identity = t.reduce_axes[0], body.cond, reduction_identity(t.op, dtype, t.body.dtype)
    if not (isinstance(cond, ir.Binary) and cond.op == "<" and isinstance(cond.a, ir.Binary) and cond.a.op == "+"
            and isinstance(cond.a.b, ir.Var) and cond.a.b.uid == k.uid and ir.invariant(cond.a.a, {k.uid})
            and ir.invariant(cond.b, {k.uid}) and isinstance(body.b, ir.Const) and body.b.value == identity.value):
        return None
    outputs = {a.uid: i for a, i in zip(t.axes, out_index)}
    left = ir.substitute(ir.binary("-", cond.b, cond.a.a), outputs)
    count = ir.Call("min", (ir.as_expr(t.reduce_shape[0]), ir.Call("max", (ir.const(0), left), left.dtype)),
                    left.dtype)
    return body.a, count


def _finish(t: Tensor, acc: ir.Expr, reduced: ir.Expr) -> ir.Expr:
    if t.op == "mean":
        acc = acc if acc.dtype.is_float else ir.Cast(acc, T.f64)
        acc = ir.binary("/", acc, ir.Cast(reduced, acc.dtype))
    return ir.convert(acc, t.dtype)


def schedule_reduce(t: Tensor, inline: set, strategy: str, threads: int = BLOCK, compact: bool = False) -> Kernel:
    """A kernel computing reduction `t` with `strategy` ('thread', 'warp' or 'block').

    `threads`: the block size of the 'thread' strategy (small on the cpu target, where blocks
    are the unit of parallelism and a few outputs must still make several blocks).
    `compact`: a 'thread' reduction keeps one accumulator and a loop even over a small constant
    window, so its body appears once, not up to UNROLL_REDUCED times (`td.fast_compile`: the
    unrolled forms are most of numba's time on a pooling or a fused-input reduction)."""
    body = inline_injective(t.body, inline)
    if strategy == "columns":
        return _schedule_columns(t, body)
    outputs, reduced = numel(t.shape), numel(t.reduce_shape)
    dtype = accumulator_dtype(t)
    acc = ir.Var("acc", dtype)
    lane, warp = threadIdx.x % 32, threadIdx.x // 32
    if strategy == "thread":
        o = ir.Var("o", T.i32)
        head = [ir.Assign(o, blockIdx.x * threads + threadIdx.x)]
        guard, start, step, leader = ir.binary("<", o, outputs), 0, 1, None
    elif strategy == "warp":
        o = ir.Var("o", T.i32)
        head = [ir.Assign(o, blockIdx.x * WARPS + warp)]
        guard, start, step, leader = ir.binary("<", o, outputs), lane, 32, ir.binary("==", lane, 0)
    else:
        o, head, guard, start, step, leader = blockIdx.x, [], None, threadIdx.x, BLOCK, ir.binary("==", threadIdx.x, 0)
    out_index, coords = _coordinates(o, t.shape, "o")
    stmts = head + coords + [ir.Assign(acc, reduction_identity(t.op, dtype, t.body.dtype))]
    few = _constant(reduced)
    inside = _inside_prefix(t, body, dtype, out_index) if strategy == "thread" else None
    body, extent = inside or (body, reduced)     # a split's chunk: its elements past the reduced ones left out
    if strategy == "thread" and compact:
        loop = ir.seq(_lanes_loop(t, body, out_index, acc, extent, lanes=1))
    elif strategy == "thread" and few is not None and few <= UNROLL_REDUCED and inside is None:
        # a pooling window, say: constant reduced coordinates fold its index arithmetic away
        loop = ir.seq([ir.Assign(acc, combine(t.op, acc, _element(t, body, out_index, ir.const(k), dtype)))
                       for k in range(few)])
    elif strategy == "thread":
        loop = ir.seq(_lanes_loop(t, body, out_index, acc, extent))
    else:
        loop = _reduce_loop(t, body, out_index, acc, start, reduced, step)
    stmts.append(loop if guard is None else ir.If(guard, loop))
    if strategy == "warp":
        stmts += _warp_reduce(t.op, acc)
    elif strategy == "block":
        partials = ir.Buffer("warp_partials", dtype, (ir.const(WARPS),), "shared")
        stmts += [ir.Allocate(partials)] + _warp_reduce(t.op, acc) + [
            ir.If(ir.binary("==", lane, 0), ir.Store(partials, (warp,), acc)),
            ir.SyncThreads(),
            ir.If(ir.binary("==", warp, 0), ir.seq(
                [ir.Assign(acc, ir.Select(ir.binary("<", lane, WARPS), ir.Load(partials, (lane,)),
                                          reduction_identity(t.op, dtype, t.body.dtype), dtype))] + _warp_reduce(t.op, acc, 8)))]
    store = ir.Store(t.buffer, tuple(out_index), _finish(t, acc, reduced))
    cond = leader if guard is None else (guard if leader is None else ir.binary("and", guard, leader))
    stmts.append(store if cond is None else ir.If(cond, store))
    fn = _function(f"{t.name}_reduce_{strategy}", t, ir.seq(stmts), block=threads if strategy == "thread" else BLOCK)
    per_block = {"thread": threads, "warp": WARPS, "block": 1}[strategy]
    grid = size_function(lambda env: -(-evaluate_int(outputs, env) // per_block), size_names(outputs))
    return Kernel.from_ir(fn, grid, streams=True)


class _Branch(ir.Rewriter):
    """An expression with one Select (by identity) replaced by one of its operands."""

    def __init__(self, select: ir.Select, taken: ir.Expr):
        self.select, self.taken = select, taken

    def visit_Select(self, e: ir.Select) -> ir.Expr:
        return self.taken if e is self.select else self.generic_visit(e)


def _schedule_columns(t: Tensor, body: ir.Expr) -> Kernel:
    """The 'columns' kernel of `t` (see `choose_strategy`): a block of one thread reduces the outputs j0 ..
    j0 + COLUMNS - 1 of one row of the output's last axis into an array of accumulators, adding each reduced
    element's contiguous row of values to them (a loop LLVM vectorizes). A float sum of narrower floats
    accumulates in f64."""
    reduced, last = numel(t.reduce_shape), t.shape[-1]
    dtype = accumulator_dtype(t)
    if t.op in ("sum", "mean") and dtype.is_float and dtype.bits < 64:
        dtype = T.f64
    chunks = (last + (COLUMNS - 1)) // COLUMNS
    row_index, coords = _coordinates(blockIdx.x // chunks, t.shape[:-1], "o")
    j0, width = ir.Var("j0", T.i32), ir.Var("width", T.i32)
    r, j = ir.Var("k", T.i32, kind="loop"), ir.Var("j", T.i32, kind="loop")
    accs = ir.Buffer("columns", dtype, (ir.const(COLUMNS),), "register")

    def over_columns(stmt_of_j) -> ir.Stmt:
        return ir.For(j, ir.const(0), width, ir.const(1), stmt_of_j)

    element = _element(t, body, row_index + [j0 + j], r, dtype)
    stmts = [ir.Allocate(accs), *coords, ir.Assign(j0, blockIdx.x % chunks * COLUMNS),
             ir.Assign(width, ir.Call("min", (ir.const(COLUMNS), last - j0), T.i32)),
             over_columns(ir.Store(accs, (j,), reduction_identity(t.op, dtype, t.body.dtype))),
             ir.For(r, ir.const(0), reduced, ir.const(1), _ranged_loop(j, ir.const(0), width, element, lambda e:
                 ir.Store(accs, (j,), combine(t.op, ir.Load(accs, (j,)), e)), t.buffer)),
             over_columns(ir.Store(t.buffer, tuple(row_index + [j0 + j]), _finish(t, ir.Load(accs, (j,)), reduced)))]
    fn = _function(f"{t.name}_reduce_columns", t, ir.seq(stmts), block=1)
    work = numel(t.shape[:-1]) * chunks
    return Kernel.from_ir(fn, size_function(lambda env: evaluate_int(work, env), size_names(work)), streams=True)


def split_stages(t: Tensor, chunks: int, leading: bool = False) -> tuple[Tensor, Tensor]:
    """The two reduce definitions of a 'split' reduction: each output's elements cut into
    `chunks` chunks reduced into partials, then the partials reduced (each scheduled as usual).
    The partials' chunk axis is their last, or (`leading`) their first: where the cpu reduces `t` by rows of
    outputs ('columns'), both stages then do too."""
    from ..compute import reduce
    reduced = numel(t.reduce_shape)
    length = (reduced + chunks - 1) // chunks
    dtype = accumulator_dtype(t)

    def chunk(*ix):    # (*output axes, p, k) or (p, *output axes, k): element p * length + k of the output's elements
        p, out = (ix[0], ix[1:-1]) if leading else (ix[-2], ix[:-2])
        linear = p * length + ix[-1]
        value = _element(t, t.body, list(out), linear, dtype)
        return ir.Select(ir.binary("<", linear, reduced), value, reduction_identity(t.op, dtype, t.body.dtype), dtype)

    partial_op = "sum" if t.op == "mean" else t.op
    shape = (chunks,) + t.shape if leading else t.shape + (chunks,)
    partial = reduce(f"{t.name}_partials", shape, (length,), chunk, op=partial_op, dtype=dtype)
    count = ir.Cast(reduced, dtype)

    def partial_of(*ix):   # a mean is the sum of the partial sums, each divided by the count
        at = (ix[-1],) + ix[:-1] if leading else ix
        return ir.binary("/", partial[at], count) if t.op == "mean" else partial[at]

    final = reduce(t.name, t.shape, (chunks,), partial_of, op=partial_op, dtype=t.dtype)
    final.buffer = t.buffer
    return partial, final


__all__ = ["schedule_injective", "schedule_reduce", "choose_strategy", "reads_rows", "split_chunks", "split_stages",
           "size_var", "evaluate_int"]
