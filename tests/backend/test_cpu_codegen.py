"""The cpu code generator's compile-time economies (shared index bases, module-level constants, while loops, no unread
indices, no dead loads on entering a region, no branch for a test of a register element), where it allocates
buffers (the stack or the heap), and its saturating float-to-integer conversions.

Oracle: numpy for the kernels' results; for `_split_offset`, Python's integer arithmetic on the
same expression tree.
"""
import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

import taskdsl as td
from taskdsl import blockIdx, f32, i32, ir, threadIdx
from taskdsl.backend.cpu.codegen import STACK_BYTES, _split_offset

OPTIMIZED = True   # not td.fast_compile: the register tiles below unroll into straight-line code


@td.kernel(grid=1, block=1)
def tile_rows(X: f32[4, 8], Y: f32[4, 8], r: i32):
    acc = td.registers(f32, (8,))
    for j in td.unroll(8):
        acc[j] = X[r, j] * 0.5
    for j in td.unroll(8):
        Y[r, j] = acc[j] + 1.0


def test_an_index_base_shared_by_a_run_of_accesses_is_computed_once():
    x = np.random.default_rng(0).standard_normal((4, 8)).astype(np.float32)
    y = np.zeros_like(x)
    source = tile_rows.source(x, y, 2, target="cpu")
    assert source.count("= np.uint64((r * 8))") == 1          # the loads and stores are one straight run
    assert "X[(ix + k_uint64_7)]" in source and "Y[(ix + k_uint64_7)]" in source
    assert "np.uint64(((r * 8) + 7))" not in source
    assert "k_float32_0_5 = np.float32(0.5)" in source      # constants are module globals, typed once
    tile_rows(x, y, 2)
    want = np.zeros_like(x)
    want[2] = x[2] * np.float32(0.5) + np.float32(1)
    np.testing.assert_array_equal(y, want)


@td.kernel(grid=1, block=1)
def moving_base(X: f32[16], Y: f32[16]):
    j = 1
    Y[j + 1] = X[j + 2]
    Y[j + 3] = X[j]
    j = 5                      # the same base variable, assigned inside the straight run
    Y[j + 1] = X[j + 2]
    Y[j + 3] = X[j]
    j = 9                      # one access after it: no base of its own, and not the stale one
    Y[j + 2] = 7.0


def test_a_base_whose_variable_the_run_assigns_is_computed_after_each_assignment():
    x = np.arange(16, dtype=np.float32)
    y = np.zeros(16, np.float32)
    lines = [line.strip() for line in moving_base.source(x, y, target="cpu").splitlines()]
    assert lines.index("ix = np.uint64(j)") == lines.index("j = 1") + 1
    assert lines.index("ix_1 = np.uint64(j)") == lines.index("j = 5") + 1
    assert sum(line.startswith("ix") for line in lines) == 2
    moving_base(x, y)
    want = np.zeros(16, np.float32)
    want[[2, 4, 6, 8]] = x[[3, 1, 7, 5]]
    want[11] = 7
    np.testing.assert_array_equal(y, want)


@td.kernel(grid=1, block=1)
def flagged(X: f32[4], Y: f32[4], n: i32):
    ok = td.registers(i32, 4)
    for p in td.unroll(4):
        ok[p] = p < n
    for p in td.unroll(4):
        Y[p] = X[p] if n > 1 and ok[p] != 0 else 0.0


@pytest.mark.parametrize("n", [0, 2, 3, 9])
def test_a_register_element_held_in_a_local_is_tested_without_a_branch(n):
    """An unrolled register element is a local: `n > 1 and ok[p] != 0` needs no short-circuit (a branch in a loop
    body keeps LLVM from vectorizing it, and numba types every branch's blocks)."""
    x = np.arange(1, 5, dtype=np.float32)
    y = np.full(4, -1, np.float32)
    source = flagged.source(x, y, n, target="cpu")
    assert "((n > 1) & (ok_0 != 0))" in source and " and " not in source
    flagged(x, y, n)
    np.testing.assert_array_equal(y, np.where((n > 1) & (np.arange(4) < n), x, 0))


VARIABLES = [ir.Var(name, td.i64) for name in "abc"]


@st.composite
def integer_trees(draw, depth=4):
    """(IR expression, the same expression as a function of the variables' values)."""
    kind = draw(st.sampled_from(["var", "const"] + (["+", "-", "*c", "c*"] if depth else [])))
    if kind == "var":
        k = draw(st.integers(0, len(VARIABLES) - 1))
        return VARIABLES[k], lambda env, k=k: env[k]
    if kind == "const":
        c = draw(st.integers(-50, 50))
        return ir.const(c, td.i64), lambda env, c=c: c
    a, fa = draw(integer_trees(depth=depth - 1))
    if kind in ("*c", "c*"):
        c = draw(st.integers(-9, 9))
        const = ir.const(c, td.i64)
        expr = ir.binary("*", a, const) if kind == "*c" else ir.binary("*", const, a)
        return expr, lambda env: fa(env) * c
    b, fb = draw(integer_trees(depth=depth - 1))
    if kind == "+":
        return ir.binary("+", a, b), lambda env: fa(env) + fb(env)
    return ir.binary("-", a, b), lambda env: fa(env) - fb(env)


def _evaluate(e, env) -> int:
    if e is None:
        return 0
    if isinstance(e, ir.Const):
        return int(e.value)
    if isinstance(e, ir.Var):
        return env[[v.uid for v in VARIABLES].index(e.uid)]
    ops = {"+": int.__add__, "-": int.__sub__, "*": int.__mul__}
    return ops[e.op](_evaluate(e.a, env), _evaluate(e.b, env))


@settings(max_examples=300, deadline=None)
@given(tree=integer_trees(), env=st.lists(st.integers(-1000, 1000), min_size=3, max_size=3))
def test_split_offset_keeps_the_value_and_leaves_no_constant_term_in_a_sum(tree, env):
    expr, value = tree
    base, offset = _split_offset(expr)
    assert _evaluate(base, env) + offset == value(env)
    assert not (isinstance(base, ir.Binary) and base.op == "+" and isinstance(base.b, ir.Const))


@td.kernel(grid=1, block=1)
def padded_window(X: f32["N"], Y: f32["N"], shift: i32):
    for i in range(N):
        j = i + shift
        inside = j >= 0 and j < N and not (j == 3)          # arithmetic and comparisons: both sides evaluated
        Y[i] = X[td.min(td.max(j, 0), N - 1)] if inside else 0.0
        if j >= 0 and j < N and X[td.min(td.max(j, 0), N - 1)] > 0.0:     # a load: Python's short-circuit stays
            Y[i] += 1.0
        if shift >= 0 and shift < 31 and ((i >> shift) & 1) == 1:      # a shift: its count is guarded
            Y[i] += 2.0


def test_and_of_plain_comparisons_is_branch_free():
    """`a and b` of integer comparisons is emitted as `a & b` (a branch in a loop body keeps LLVM from vectorizing
    it); with a load or a shift on either side it stays Python's `and`, which evaluates that only when it may."""
    x = np.random.default_rng(1).standard_normal(23).astype(np.float32)
    for shift in (-5, 0, 4):
        y = np.zeros_like(x)
        source = padded_window.source(x, y, shift, target="cpu")
        assert "inside = (((j >= 0) & (j < N)) & (not (j == 3)))" in source
        assert "if (((j >= 0) & (j < N)) and (X[" in source
        assert "(((shift >= 0) & (shift < 31)) and" in source
        padded_window(x, y, shift)
        j = np.arange(23) + shift
        inside = (j >= 0) & (j < 23) & (j != 3)
        shifted = x[np.clip(j, 0, 22)]
        want = np.where(inside, shifted, 0) + ((j >= 0) & (j < 23) & (shifted > 0))
        want += 2 * ((np.arange(23) >> max(shift, 0)) & 1) if shift >= 0 else 0
        np.testing.assert_array_equal(y, want.astype(np.float32))


BIG = STACK_BYTES // 4 + 1      # floats: more than the stack's budget alone


@td.kernel(grid=2, block=4)
def weighted_rows(X: f32[2, 4, 16], Y: f32[2, 4], n: i32):
    """Thread t of block b: its row of X reversed into registers indexed at run time, weighted and summed; then
    Y[b, t] = its neighbour's sum (through a small shared buffer) + twice its own (through one too big for the
    stack)."""
    row = td.registers(f32, (16,))
    small = td.shared(f32, (4,))
    big = td.shared(f32, (BIG,))
    t, b = threadIdx.x, blockIdx.x
    for k in range(n):          # a bound known at run time only: `row` stays an array
        row[k] = X[b, t, n - 1 - k]
    acc = 0.0
    for k in range(n):
        acc += row[k] * (k + 1)
    small[t] = acc
    big[BIG - 1 - t] = acc * 2.0
    td.syncthreads()
    Y[b, t] = small[3 - t] + big[BIG - 1 - t]


@given(n=st.integers(0, 16), fast=st.booleans(), debug=st.booleans())
@settings(max_examples=8, deadline=None)
def test_small_buffers_of_fast_compiles_live_on_the_stack_and_large_ones_on_the_heap(n, fast, debug):
    """Under `td.fast_compile`, registers (one row per thread) and shared buffers of STACK_BYTES in all go on the
    stack (`rt.stack_array`), where LLVM knows they alias no argument; a larger one, every buffer in debug mode and
    those of optimized kernels, on the heap."""
    x = np.random.default_rng(n).standard_normal((2, 4, 16)).astype(np.float32)
    y = np.full((2, 4), np.nan, np.float32)
    td.fast_compile(fast)
    td.debug(debug)
    try:
        source = weighted_rows.source(x, y, n, target="cpu")
        weighted_rows(x, y, n)
    finally:
        td.debug(False)
        td.fast_compile(False)
    stacked = fast and not debug
    on_stack = ["rt.stack_array(64, np.float32)", "rt.stack_array(4, np.float32)"]    # 4 threads x 16; 4
    assert all((line in source) == stacked for line in on_stack)
    assert f"rt.stack_array({BIG}," not in source and (not stacked or f"np.empty(({BIG}, ), np.float32)" in source)
    sums = (x[:, :, :n][:, :, ::-1].astype(np.float64) * np.arange(1, n + 1)).sum(axis=2)
    np.testing.assert_allclose(y, sums[:, ::-1] + 2 * sums, rtol=1e-5, atol=1e-5)


def test_fast_compiles_call_the_costly_helpers_and_inline_the_tiny_ones():
    """`support_calls` (the helpers of `td.fast_compile` kernels) calls the helpers numba would type again at every
    use (erf, tanh, exp), compiled once; the few selects of fmax / fmin and floordiv's division stay inlined, so
    that loops using them can vectorize and hoist their arguments."""
    from taskdsl.backend.cpu import support, support_calls
    for name in support_calls.STAY_INLINED:
        assert getattr(support_calls, name) is getattr(support, name)
        assert getattr(support, name).targetoptions.get("inline") == "always"
    for name in ("erf_f32", "tanh_f32", "exp_f32"):
        called = getattr(support_calls, name)
        assert called is not getattr(support, name) and called.targetoptions.get("inline") != "always"
    x = np.array([[1.0, np.nan, -2.0, 7.0], [-5.0, 3.0, np.inf, -np.inf]], np.float32)
    out = np.empty(2, np.float32)
    td.fast_compile(True)
    try:
        row_max(x, out)
    finally:
        td.fast_compile(False)
    np.testing.assert_array_equal(out, [np.nan, np.inf])


def _source_and_run(kernel, args: tuple, fast: bool) -> str:
    """`kernel`'s cpu source for `args`, after running it on them, built with `td.fast_compile(fast)`."""
    td.fast_compile(fast)
    try:
        source = kernel.source(*args, target="cpu")
        kernel(*args)
    finally:
        td.fast_compile(False)
    return source


@td.kernel(grid=lambda R: R, block=1)
def row_max(X: td.f32["R", "C"], out: td.f32["R"]):
    best = X[blockIdx.x, 0]
    for c in range(1, C):
        best = td.max(best, X[blockIdx.x, c])
    out[blockIdx.x] = best


@td.kernel(grid=lambda R: R, block=1)
def shifted_rows(X: f32["R", "C"], Y: f32["R", "C"], Z: f32["R", "C"], k: i32):
    r = blockIdx.x
    for c in range(C):     # the row read is the same for every c: its base is computed before the loop
        Y[r, c] = X[(r * 7 + k) // 3 % R, c] * 2.0
    s = 0
    for c in range(C):     # the row read changes inside the loop: nothing to take out
        Z[r, c] = X[(r + s) % R, c]
        s = s + k


@given(rows=st.integers(1, 7), cols=st.sampled_from([1, 2, 17, 64]), k=st.integers(0, 5), fast=st.booleans())
@settings(max_examples=10, deadline=None)
def test_loop_invariant_index_bases_are_computed_before_their_loop(rows, cols, k, fast):
    """Under `td.fast_compile`, a flat index's terms that no statement of the loop changes (here with a division,
    which -O1 leaves in the loop, unvectorized) go into a local before the loop, and the loop adds its own terms;
    optimized kernels leave that to -O3. A row that changes inside the loop keeps its index whole. numpy is the
    oracle."""
    x = np.random.default_rng(rows * 100 + cols).standard_normal((rows, cols)).astype(np.float32)
    y, z = np.full_like(x, np.nan), np.full_like(x, np.nan)
    source = _source_and_run(shifted_rows, (x, y, z, k), fast)
    lines = [line.strip() for line in source.splitlines()]
    first_loop = next(i for i, line in enumerate(lines) if line.startswith(("for c in range", "while c <")))
    hoisted = any(line.startswith("lb") and "// 3" in line for line in lines[:first_loop])
    assert hoisted == fast and any(line.startswith("Y[np.uint64(lb") for line in lines) == fast, source
    np.testing.assert_array_equal(y, 2 * x[[(r * 7 + k) // 3 % rows for r in range(rows)]])
    np.testing.assert_array_equal(z, np.stack([x[[(r + c * k) % rows for c in range(cols)], np.arange(cols)]
                                               for r in range(rows)]))


@td.kernel(grid=lambda N: N, block=1)
def row_steps(X: f32["N", "C"], Y: f32["N", "C"]):
    r = blockIdx.x
    for c in range(C):              # step 1: a while loop under fast compile
        Y[r, c] = X[r, c] * 2.0
    for c in range(1, C, 2):        # another step: a range loop
        Y[r, c] = Y[r, c] + 1.0


@td.kernel(grid=lambda N: N, block=1)
def row_skips(X: f32["N", "C"], Y: f32["N", "C"]):
    r = blockIdx.x
    for c in range(C):              # a `continue` would skip a while loop's increment: a range loop
        if c % 3 == 0:
            continue
        Y[r, c] = Y[r, c] - X[r, c]


@given(rows=st.integers(1, 4), cols=st.sampled_from([0, 1, 5, 17]), fast=st.booleans())
@settings(max_examples=8, deadline=None)
def test_loops_and_indices_numba_need_not_compile(rows, cols, fast):
    """One thread per block: no loop over threads, no assignment of an index nothing reads (`by`, `tx`). Under
    `td.fast_compile`, loops of step 1 are while loops; optimized kernels keep range loops. A `continue` keeps
    its loop a range loop, and the loop over threads around it (it might be the loop's). numpy is the oracle."""
    x = np.random.default_rng(rows * 10 + cols).standard_normal((rows, cols)).astype(np.float32)
    y = np.full_like(x, np.nan)
    sources = [_source_and_run(kernel, (x, y), fast) for kernel in (row_steps, row_skips)]
    steps, skips = ([line.strip() for line in source.splitlines()] for source in sources)
    assert not any(line.startswith(("by =", "bz =", "tx =")) for line in steps + skips)
    assert not any("tid" in line for line in steps) and "for tid in range(1):" in skips
    assert ("while c < c_stop:" in steps) == fast and ("for c in range(0, C, 1):" in steps) != fast
    assert "for c_1 in range(1, C, 2):" in steps and "for c in range(0, C, 1):" in skips
    assert ("block_id = block_begin" in steps) == fast and ("block_id = block_begin" in skips) is False
    want = 2 * x
    want[:, 1::2] += 1
    keep = np.arange(cols) % 3 != 0
    want[:, keep] -= x[:, keep]
    np.testing.assert_array_equal(y, want)


@td.kernel(grid=lambda N: td.cdiv(N, 4), block=4)
def chunk_sums(X: f32["N", "K"], Out: f32["N"]):
    sm = td.shared(f32, (4,))
    t = threadIdx.x
    r = blockIdx.x * 4 + t
    acc = 0.0
    for k0 in range(0, K, 1):       # a block-level loop (a barrier in it) of step 1
        sm[t] = X[r, k0] if r < N else 0.0
        td.syncthreads()
        acc += sm[t] * 2.0
        td.syncthreads()
    if r < N:
        Out[r] = acc


@given(rows=st.integers(1, 9), cols=st.sampled_from([0, 1, 3, 17]), fast=st.booleans())
@settings(max_examples=6, deadline=None)
def test_fast_compile_loops_over_threads_and_block_loops_are_while_loops(rows, cols, fast):
    """Under `td.fast_compile` the loop over a block's threads (each region's) and a block-level loop of step 1
    are while loops, as other loops of step 1 (numba lowers a range loop through an iterator object); optimized
    kernels keep range loops. numpy is the oracle."""
    x = np.random.default_rng(rows * 10 + cols).standard_normal((rows, cols)).astype(np.float32)
    out = np.full(rows, np.nan, np.float32)
    lines = [line.strip() for line in _source_and_run(chunk_sums, (x, out), fast).splitlines()]
    assert ("while tid < 4:" in lines) == fast and ("for tid in range(4):" in lines) != fast
    assert ("while k0 < k0_stop:" in lines) == fast and ("for k0 in range(0, K, 1):" in lines) != fast
    np.testing.assert_allclose(out, 2 * x.sum(axis=1, dtype=np.float64), rtol=1e-5, atol=1e-5)


@td.kernel(grid=lambda N: td.cdiv(N, 4), block=4)
def carried(X: f32["N"], Out: f32["N"]):
    sm = td.shared(f32, (4,))
    t = threadIdx.x
    r = blockIdx.x * 4 + t
    v = X[r] if r < N else 0.0      # region 1 surely assigns v and w
    w = 1.0
    sm[t] = v
    td.syncthreads()
    u = sm[(t + 1) % 4]
    if u > 0.0:                     # region 2 may leave w as region 1 set it
        w = 3.0
    td.syncthreads()
    if r < N:
        Out[r] = u * w + v


@pytest.mark.parametrize("fast", [True, False])
def test_a_region_loads_only_the_values_it_may_read_or_leave_unassigned(fast):
    """A region loads a variable kept across regions from its per-thread array where it reads the value before
    assigning it, or may leave it unassigned (its write-back stores the value it came in with); one it surely
    assigns first is not loaded (numba would type and lower a dead load). numpy is the oracle."""
    x = np.random.default_rng(5).standard_normal(11).astype(np.float32)
    out = np.full_like(x, np.nan)
    source = _source_and_run(carried, (x, out), fast)
    head = "while tid < 4:" if fast else "for tid in range(4):"
    regions = [part.splitlines() for part in source.split(head)[1:]]
    loads = [{line.strip().split(" = ")[0] for line in region if line.strip().endswith("_t[tid]")}
             for region in regions]
    assert len(regions) == 3 and not loads[0] & {"v", "w"} and "w" in loads[1] and {"v", "w"} <= loads[2]
    padded = np.concatenate([x, np.zeros(1, np.float32)])
    u = np.concatenate([padded[4 * b:4 * b + 4][[1, 2, 3, 0]] for b in range(3)])[:11]
    want = u * np.where(u > 0, 3.0, 1.0) + x
    np.testing.assert_allclose(out, want, rtol=1e-6)


def test_borrowed_arrays_view_the_same_data_shape_and_strides():
    """`rt.borrowed` (an outlined function's call passes its arrays so: no reference count to change) gives a view
    of the same memory: a write through it lands in the array, and its shape and strides are the array's."""
    from numba import njit
    from taskdsl.backend.cpu import support

    @njit
    def write_through(a):
        view = support.borrowed(a)
        view[3] = 7.0
        return view.shape[0], view.strides[0], view.ctypes.data == a.ctypes.data

    a = np.zeros(5, np.float32)
    assert write_through(a) == (5, 4, True)
    np.testing.assert_array_equal(a, [0, 0, 0, 7, 0])


def _float_to_int_kernel(source, target):
    """Out[i] = td.cast(X[i], target) over a loop LLVM vectorizes (its remainder scalar)."""
    @td.kernel(grid=1, block=1)
    def convert(X: source["N"], Out: target["N"]):
        for i in range(N):
            Out[i] = td.cast(X[i], target)
    return convert


@pytest.mark.parametrize("source", [td.f32, td.f64])
@pytest.mark.parametrize("target", [td.i8, td.u8, td.i16, td.u16, td.i32, td.u32, td.i64, td.u64])
def test_float_to_int_saturates_at_every_edge(source, target):
    """A float converted to an integer type truncates toward zero, clamps to the type's range and gives 0 for NaN
    (`DataType.saturate`, PTX's cvt.rzi), vectorized or not: at the range's bounds and one float either side of
    them, zeros, fractions, infinities, NaN and random values of every magnitude (the cpu's selects around a plain
    conversion, not LLVM's fpto[su]i.sat)."""
    low, high = target.limits
    edges = [float("nan"), float("inf"), -float("inf"), 0.0, -0.0, 0.5, -0.5, 0.99, -0.99, 1.5, -1.5]
    for bound in (low, high, low - 1, high + 1, 2.0 ** target.bits):
        value, float_type = source.numpy.type(bound), source.numpy.type
        edges += [value, np.nextafter(value, float_type(np.inf)), np.nextafter(value, float_type(-np.inf))]
    rng = np.random.default_rng(target.bits)
    magnitudes = 2.0 ** rng.uniform(-3, target.bits + 2, 300)
    x = np.concatenate([np.array(edges), magnitudes * rng.choice([-1, 1], 300)]).astype(source.numpy)
    out = np.zeros(len(x), target.numpy)
    _float_to_int_kernel(source, target)(x, out)
    np.testing.assert_array_equal(out, np.array([target.saturate(float(v)) for v in x], dtype=target.numpy))
