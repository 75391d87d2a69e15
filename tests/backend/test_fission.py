"""Barrier fission: how a block body is split, and which values become per-thread arrays."""
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import taskdsl as td
from taskdsl import f16, f32, i32, i64, threadIdx
from taskdsl.backend.cpu import fission as F
from taskdsl.passes import lower


@td.kernel(grid=1, block=64)
def rotate(X: f32[64], Y: f32[64]):
    s = td.shared(f32, (64,))
    t = threadIdx.x
    v = X[t] * 2.0            # lives across the barrier
    s[t] = v
    td.syncthreads()
    w = s[(t + 1) % 64]       # only used in this region
    Y[t] = w + v


def _program(kernel, *args):
    binding = kernel.bind(args)
    return F.fission(lower(kernel._frontend_ir(binding.block)))


def test_split_at_barrier_and_cross_barrier_values():
    x = np.arange(64, dtype=np.float32)
    program = _program(rotate, x, x)
    kinds = [type(it).__name__ for it in program.items]
    assert kinds == ["Region", "Barrier", "Region"]
    names = {v.name for v in program.thread_arrays.values()}
    assert names == {"t", "v"}                  # w never crosses a region boundary
    y = np.empty_like(x)
    rotate(x, y)
    np.testing.assert_array_equal(y, 2 * np.roll(x, -1) + 2 * x)


@td.kernel(grid=1, block=64)
def many_across(X: f32[64], Y: f32[64]):
    s = td.shared(f32, (64,))
    t = threadIdx.x
    a = X[t] + 1.0
    b = X[t] * 3.0
    c = a - b
    d = X[(t + 5) % 64]
    s[t] = a
    td.syncthreads()
    Y[t] = s[(t + 1) % 64] + a * b + c * d


def test_the_cpu_source_does_not_depend_on_the_variables_uids():
    """Per-thread arrays are declared in the kernel's order: IR built again later (its variables numbered
    anew, as in another process) generates the same module text, which is what keys the module cache."""
    from taskdsl.backend.cpu.codegen import emit_python
    from taskdsl.ir import expr
    from taskdsl.passes import lower_for_cpu
    x = np.arange(64, dtype=np.float32)
    block = many_across.bind((x, x)).block
    texts = set()
    for skip in (0, 1, 37, 1000):
        for _ in range(skip):
            next(expr._ids)
        fn = lower(many_across._build(block))
        assert {v.name for v in F.fission(fn).thread_arrays.values()} >= {"t", "a", "b", "c", "d"}
        texts.add(emit_python(lower_for_cpu(fn, False, unroll=False)).text)
    assert len(texts) == 1


@td.kernel(grid=1, block=64)
def loop_barrier(X: f32[64], n: td.i32):
    s = td.shared(f32, (64,))
    s[threadIdx.x] = X[threadIdx.x]
    step = 1
    for _ in range(n):        # uniform loop around a barrier: stays at block level
        td.syncthreads()
        v = s[(threadIdx.x + step) % 64]
        td.syncthreads()
        s[threadIdx.x] = v
        step *= 2
    td.syncthreads()
    X[threadIdx.x] = s[threadIdx.x]


def test_uniform_loop_with_barriers_stays_at_block_level():
    x = np.arange(64, dtype=np.float32)
    program = _program(loop_barrier, x, 3)
    loops = [it for it in program.items if isinstance(it, F.BlockFor)]
    assert len(loops) == 1
    assert [type(it).__name__ for it in loops[0].body] == ["Barrier", "Region", "Barrier", "Region"]
    # step is carried from one iteration of the block-level loop to the next, per thread
    assert "step" in {v.name for v in program.thread_arrays.values()}
    loop_barrier(x, 3)
    np.testing.assert_array_equal(x, np.roll(np.arange(64, dtype=np.float32), -(1 + 2 + 4)))


@td.kernel(grid=1, block=64)
def warp_guarded(X: f32[64], Y: f32[2]):
    v = X[threadIdx.x]
    if threadIdx.x // 32 == 1:          # warp-uniform: shuffles allowed
        for off in (16, 8, 4, 2, 1):
            v += td.shfl_down(v, off)
        if threadIdx.x % 32 == 0:
            Y[1] = v


def test_warp_uniform_branch_guards_each_region():
    x = np.arange(64, dtype=np.float32)
    program = _program(warp_guarded, x, np.zeros(2, np.float32))
    guarded = [it for it in program.items if isinstance(it, F.Region) and it.guards]
    assert len(guarded) == 6 and all(len(r.guards) == 1 for r in guarded)
    y = np.zeros(2, np.float32)
    warp_guarded(x, y)
    assert y[1] == x[32:].sum() and y[0] == 0


@td.kernel(grid=1, block=64)
def return_in_warp_branch(X: f32[64], Y: f32[64], n: td.i32):
    t = threadIdx.x
    v = X[t]
    if t // 32 == 0:
        if n > 0:        # uniform, but under a warp-uniform branch: only warp 0 returns
            return
    else:
        v = v * 2.0
    Y[t] = v + td.shfl_xor(v, 1)


def test_return_under_a_warp_uniform_branch_ends_only_that_warp():
    # The `returned` flag is assigned in one warp's branch: it is not one value for the block.
    x = np.arange(64, dtype=np.float32)
    for n in (0, 1):
        y = np.full(64, -1.0, np.float32)
        return_in_warp_branch(x, y, n)
        v = np.where(np.arange(64) < 32, x, 2 * x)
        want = v + v[np.arange(64) ^ 1]
        np.testing.assert_array_equal(y, np.where(np.arange(64) < 32, -1.0, want) if n > 0 else want)


@td.kernel(grid=1, block=64)
def bound_read_outside_warp_branch(X: f32[64], Y: f32[64]):
    t = threadIdx.x
    v = X[t]
    n = 1
    if t // 32 == 0:
        n = 3            # a loop bound around a shuffle: assigned once for the block on the cpu target
        for i in range(n):
            v += td.shfl_xor(v, 1)
    Y[t] = v + n         # ... so warp 1 would read 3 here


def _pair_sums(x: np.ndarray, mask: int) -> np.ndarray:
    return x + x[np.arange(x.size) ^ mask]


def test_block_variable_of_a_warp_branch_read_outside_it_gets_a_copy_in_the_branch():
    # the loop bound is a block-level value inside the branch; after it, each thread reads its own n
    x = np.arange(64, dtype=np.float32)
    y = np.zeros(64, np.float32)
    bound_read_outside_warp_branch(x, y)
    warp0 = 4 * _pair_sums(x, 1) + 3          # three xor-1 exchanges double the pair sum twice, then n = 3
    np.testing.assert_array_equal(y, np.where(np.arange(64) < 32, warp0, x + 1))


@td.kernel(grid=1, block=64)
def bounds_on_both_sides(X: f32[64], Y: f32[64]):
    t = threadIdx.x
    v = X[t]
    if t // 32 == 0:
        n = 2
        for i in range(n):
            v += td.shfl_xor(v, 1)
    else:
        n = 3
        for i in range(n):
            v += td.shfl_xor(v, 2)
    Y[t] = v * 10.0 + n


def test_each_side_of_a_warp_branch_gets_its_own_copy():
    x = np.arange(64, dtype=np.float32)
    y = np.zeros(64, np.float32)
    bounds_on_both_sides(x, y)
    want = np.where(np.arange(64) < 32, 20 * _pair_sums(x, 1) + 2, 40 * _pair_sums(x, 2) + 3)
    np.testing.assert_array_equal(y, want)


@td.kernel(grid=2, block=64)
def bound_read_by_the_other_side(X: f32[64], B: td.i32[2], Y: f32[2, 64]):
    t = threadIdx.x
    b = td.blockIdx.x
    v = X[t]
    n = 0
    if t < 32:
        n = B[b] + 1          # the same in every thread of the block, but only warp 0 assigns it
        for i in range(min(n, 3)):
            v += td.shfl_down(v, 18)
        Y[b, t] = v
        return
    Y[b, t] = v + n           # warp 1 reads its own n: 0 (the statements after the return are the if's else)


def test_block_variable_of_a_warp_branch_read_by_its_other_side_gets_a_copy():
    # found by test_random_control_flow: the else side read the value the branch had set for the whole block
    x = np.arange(64, dtype=np.float32)
    y = np.zeros((2, 64), np.float32)
    bound_read_by_the_other_side(x, np.array([4, 0], np.int32), y)
    lanes = np.arange(32)
    want = np.tile(x, (2, 1))
    for b, trips in enumerate([3, 1]):
        v = x[:32].copy()
        for _ in range(trips):
            v = v + v[np.where(lanes + 18 < 32, lanes + 18, lanes)]
        want[b, :32] = v
    np.testing.assert_array_equal(y, want)


@td.kernel(grid=1, block=64)
def bound_from_before_the_branch(X: f32[64], Y: f32[64], m: td.i32):
    t = threadIdx.x
    v = X[t]
    n = m
    if t // 32 == 0:
        n = n + 1         # the copy starts from the value before the if
        for i in range(n):
            v += td.shfl_xor(v, 1)
    Y[t] = v + n


@td.kernel(grid=1, block=64)
def bound_maybe_unassigned(X: f32[64], Y: f32[64], m: td.i32):
    t = threadIdx.x
    v = X[t]
    n = 1
    if t // 32 == 0:
        for k in range(m):    # m = 0 leaves n as it was
            n = k + 2
            for i in range(n):
                v += td.shfl_xor(v, 1)
    Y[t] = v + n


def _pairs_summed(v, times):
    for _ in range(times):
        v = v + v[np.arange(v.size) ^ 1]
    return v


@pytest.mark.parametrize("m", [0, 1, 3])
def test_block_variable_of_a_warp_branch_that_needs_the_outer_value_starts_from_it(m):
    """Refused before ("the branch reads the value from before the if"): the copy in the branch now starts from
    the block maximum of the outer value over the threads running the branch, which agree on it."""
    x = np.arange(64, dtype=np.float32)
    y = np.zeros(64, np.float32)
    bound_from_before_the_branch(x, y, m)
    want = x.copy()
    want[:32] = _pairs_summed(x[:32], m + 1)
    np.testing.assert_array_equal(y, want + np.where(np.arange(64) < 32, m + 1, m))
    bound_maybe_unassigned(x, y, m)
    want, n = x.copy(), 1
    for k in range(m):
        n = k + 2
        want[:32] = _pairs_summed(want[:32], n)
    np.testing.assert_array_equal(y, want + np.where(np.arange(64) < 32, n, 1))


@td.kernel(grid=1, block=64)
def counter_a_nested_branch_needs(OUT: i64[64]):
    t = threadIdx.x
    x: i64 = t
    c = 0
    for i in range(4):
        if i > t // 32:
            break
        c += 1
        for j in range(c):
            x = td.shfl_xor(x, 1) + j
    OUT[t] = x + c


def test_a_counter_a_nested_warp_branch_needs_gets_its_copy_there():
    """The warp's `break` makes two nested warp-uniform branches (`if not i_left`, `if not i_skip`), and only the
    inner one mentions `c`: its copy goes there. Copying it in the outer one too, then the outer copy again in the
    inner, handed the inner copy back to a block-level variable the threads outside the inner branch share (a
    first version of the copies' starts gave INT_MIN + 1 there, from a maximum no thread took part in)."""
    out = np.zeros(64, np.int64)
    counter_a_nested_branch_needs(out)
    np.testing.assert_array_equal(out, _counted_shuffles(lambda warp: warp + 1))   # warp w leaves at trip w + 1


def _counted_shuffles(trips):
    """What the two warps of a counting loop write: `trips(warp)` trips, trip c (from 1) swapping lane pairs and
    adding j for j < c, then the count added."""
    want = np.arange(64, dtype=np.int64)
    for warp in range(2):
        v, c = want[warp * 32:(warp + 1) * 32], 0
        for _ in range(trips(warp)):
            c += 1
            for j in range(c):
                v[:] = v[np.arange(32) ^ 1] + j
        v += c
    return want


@td.kernel(grid=1, block=64)
def warp_break_in_shuffle_loop(X: f32[64], Y: f32[64]):
    t = threadIdx.x
    v = X[t]
    for i in range(4):
        v += td.shfl_xor(v, 1)
        if t // 32 == i:   # warp 0 leaves after one trip, warp 1 after two
            break
    Y[t] = v


def test_break_under_a_warp_uniform_condition_in_a_shuffle_loop_leaves_that_warp():
    x = np.arange(64, dtype=np.float32)
    y = np.zeros(64, np.float32)
    warp_break_in_shuffle_loop(x, y)
    v, active = x.copy(), np.ones(64, bool)          # the lockstep oracle: warp w leaves after trip w
    for i in range(4):
        v = np.where(active, v + v[np.arange(64) ^ 1], v)
        active &= np.arange(64) // 32 != i
    np.testing.assert_array_equal(y, v)


@td.kernel(grid=1, block=64)
def warp_break_then_uniform_shuffle_branch(X: f32[64], Y: f32[64], cut: td.i32, gate: td.i32):
    t = threadIdx.x
    v = X[t]
    for i in range(3):
        w = td.shfl_down(v, 3, width=8)
        if t // 32 == cut:       # one warp leaves: its break flag differs between the warps ...
            break
        if gate > 0:             # ... so this block-uniform branch, with a shuffle, stays under that flag
            v += td.shfl_down(w, 20)
    Y[t] = v


@pytest.mark.parametrize("cut,gate", [(0, 1), (1, 1), (1, 0), (2, 1)])
def test_a_warp_break_flag_guards_a_later_uniform_branch_with_a_shuffle(cut, gate):
    """Found by test_random_control_flow: the break flag was taken as agreed by the threads of the loop's guard
    (it is only agreed inside the branch that sets it), and the kernel was refused."""
    x = np.arange(64, dtype=np.float32) * 0.5
    y = np.zeros(64, np.float32)
    warp_break_then_uniform_shuffle_branch(x, y, cut, gate)
    lanes = np.arange(64)

    def down(a, delta, width=32):   # shfl_down: the lane delta above within a segment of `width`, else its own
        src = np.where(lanes % width + delta < width, lanes + delta, lanes)
        return a[src]
    v, active = x.copy(), lanes // 32 != cut        # the lockstep oracle: warp `cut` leaves in the first trip
    for _ in range(3):
        w = down(v, 3, 8)
        if gate > 0:
            v = np.where(active, v + down(w, 20), v)
    np.testing.assert_array_equal(y, v)


@td.kernel(grid=1, block=64)
def warp_continue_in_shuffle_loop(X: f32[64], Y: f32[64], n: td.i32):
    t = threadIdx.x
    v = X[t]
    count = 0
    for i in range(n):
        if t // 32 == i % 2:     # warp 0 sits out the even trips, warp 1 the odd ones
            count += 1
            continue
        v += td.shfl_xor(v, 2)
        if i == 5:               # a uniform break after the warp-uniform continue
            break
        v = v * 0.5
    Y[t] = v + count * 1000.0


def test_continue_under_a_warp_uniform_condition_in_a_shuffle_loop_skips_that_trip():
    x = np.arange(64, dtype=np.float32)
    warp, lanes = np.arange(64) // 32, np.arange(64)
    for n in (0, 3, 8):
        y = np.zeros(64, np.float32)
        warp_continue_in_shuffle_loop(x, y, n)
        v, count, active = x.copy(), np.zeros(64), np.ones(64, bool)
        for i in range(n):
            sits = active & (warp == i % 2)
            count += sits
            runs = active & ~sits
            v = np.where(runs, v + v[lanes ^ 2], v)
            if i == 5:
                active &= ~runs
            v = np.where(runs & active, v * np.float32(0.5), v)
        np.testing.assert_array_equal(y, (v + count * 1000).astype(np.float32))


@td.kernel(grid=1, block=64)
def warp_break_in_shuffle_while(X: f32[64], Y: f32[64], n: td.i32):
    t = threadIdx.x
    v = X[t]
    i = 0
    while i < n:
        v += td.shfl_xor(v, 1)
        if t // 32 == i:
            break
        i += 1
    Y[t] = v


@td.kernel(grid=1, block=64)
def warp_break_in_warp_branch_while(X: f32[64], Y: f32[64], n: td.i32):
    t = threadIdx.x
    v = X[t]
    if t < 32:                   # the loop runs in warp 0 alone: its bound only has to agree there
        i = 0
        while i < n:
            v += td.shfl_xor(v, 1)
            if t // 32 == 1:     # never true in warp 0, but warp-uniform, not block-uniform
                break
            i += 1
    Y[t] = v


@td.kernel(grid=1, block=64)
def per_warp_while_through_an_alias(X: f32[64], Y: f32[64], n: td.i32):
    t = threadIdx.x          # a thread-level alias the warp index is computed from
    warp = t // 32
    v = X[t]
    i = 0
    while i < n + warp:
        v += td.shfl_xor(v, 1)
        i += 1
    Y[t] = v


@pytest.mark.parametrize("kernel, trips", [
    (warp_break_in_shuffle_while, lambda warp, n: min(warp + 1, n)),
    (warp_break_in_warp_branch_while, lambda warp, n: n if warp == 0 else 0),
    (per_warp_while_through_an_alias, lambda warp, n: n + warp),
])
@pytest.mark.parametrize("n", [0, 1, 3])
def test_while_loops_around_shuffles_that_warps_leave_apart_run_per_warp(kernel, trips, n):
    """A while loop around a shuffle whose condition differs between warps, or that a warp leaves by a `break`,
    was refused on the cpu target (legal CUDA): it runs at block level while a warp is still in it."""
    x = np.random.default_rng(n).integers(-9, 9, 64).astype(np.float32)
    y = np.zeros(64, np.float32)
    kernel(x, y, n)
    t, v = np.arange(64), x.copy()
    for trip in range(max(trips(w, n) for w in (0, 1))):
        v = np.where(trip < np.array([trips(w, n) for w in (0, 1)])[t // 32], v + v[t ^ 1], v)
    np.testing.assert_array_equal(y, v)


@td.kernel(grid=1, block=32)
def two_tiles(X: f32[32, 4], Y: f32[32, 4], Z: f32[32, 4]):
    t = threadIdx.x
    acc = td.registers(f32, (4,))     # accessed in one region only
    kept = td.registers(f32, (4,))    # written before the barrier, read after it
    for j in td.unroll(4):
        acc[j] = X[t, j] * 2.0
        acc[j] += 1.0
        kept[j] = X[t, j] - 3.0
        Y[t, j] = acc[j]
    td.syncthreads()
    for j in td.unroll(4):
        Z[t, j] = kept[j] * kept[j]


@td.kernel(grid=1, block=32)
def branch_tile(X: f32[32, 2], Y: f32[32, 2]):
    t = threadIdx.x
    r = td.registers(f32, (2,))     # one region: r[0] written on both paths before it is read, r[1] on one
    if X[t, 0] > 0.0:
        r[0] = X[t, 0]
        r[1] = X[t, 1]
    else:
        r[0] = -X[t, 0]
    Y[t, 0] = r[0]
    if X[t, 0] > 0.0:
        Y[t, 1] = r[1]


def test_a_register_tile_of_one_region_never_reads_its_slot():
    """A promoted element is given a value on entering its region only where the region may read it before
    writing it, and then a zero, not its slot (no other region writes the slot)."""
    td.fast_compile(False)        # unrolled: the tiles' elements are promoted to locals
    x = np.random.default_rng(0).standard_normal((32, 4)).astype(np.float32)
    y, z = np.empty_like(x), np.empty_like(x)
    source = two_tiles.source(x, y, z, target="cpu")
    assert "acc_0 =" in source and "acc[" not in source         # np.empty's garbage is never read
    assert "acc_0 = k_float32_0_0" not in source                  # nor a zero written first
    assert "kept_0 = kept[np.uint64(tid * 4 + 0)]" in source      # the value the first region wrote
    a = np.random.default_rng(1).standard_normal((32, 2)).astype(np.float32)
    b = np.zeros_like(a)
    source = branch_tile.source(a, b, target="cpu")
    assert "r_0 = k_float32_0_0" not in source and "r_1 = k_float32_0_0" in source and "r[" not in source
    branch_tile(a, b)
    np.testing.assert_array_equal(b, np.stack([np.abs(a[:, 0]), np.where(a[:, 0] > 0, a[:, 1], 0)], axis=1))
    two_tiles(x, y, z)
    np.testing.assert_array_equal(y, x * np.float32(2) + np.float32(1))
    np.testing.assert_array_equal(z, (x - np.float32(3)) ** 2)


@td.func
def bend(v: td.i64, w: td.i64) -> td.i64:
    if v < w:
        return v - w
    return v // 2 + w


@td.kernel(grid=1, block=64)
def inlined_bound_in_warp_branch(A: td.i64[64], B: td.i64[1], Y: td.i64[64]):
    t = threadIdx.x
    x = A[t]
    if t >= 32:
        for j in range(bend(B[0], B[0]), 3):    # the inlined function's early-return test opens no new branch
            x += td.shfl_xor(x, 1)
    Y[t] = x


def test_a_loop_bound_from_an_inlined_function_in_a_warp_branch_is_block_level():
    # found by the random control-flow test: refused as "must be the same in every thread" before
    a = np.arange(64, dtype=np.int64)
    y = np.zeros(64, np.int64)
    for u, trips in ((1, 2), (4, 0), (-3, 8)):       # bend(u, u) = u // 2 + u: loops from 1, 6, -5 to 3
        inlined_bound_in_warp_branch(a, np.array([u]), y)
        pair_doubled = (a + (a ^ 1)) * 2 ** (trips - 1) if trips else a
        np.testing.assert_array_equal(y, np.where(np.arange(64) >= 32, pair_doubled, a))


@td.kernel(grid=1, block=96)
def per_warp_trips(X: td.i64[96], O: td.i64[96]):
    warp = threadIdx.x // 32
    v = X[threadIdx.x]
    for s in range(warp + 1):           # legal CUDA: a trip count per warp
        v += td.shfl_xor(v, 1 << s)
    O[threadIdx.x] = v


def test_a_loop_around_a_shuffle_with_a_trip_count_per_warp():
    """Legal CUDA that the cpu target refused: it now runs the loop for the block's largest trip count, each
    warp skipping the trips past its own under a predicate, and computes what a GPU would."""
    x, out = np.arange(96, dtype=np.int64), np.zeros(96, np.int64)
    per_warp_trips(x, out)
    want = x.copy()
    for warp in range(3):
        v = x[warp * 32:(warp + 1) * 32].copy()
        for s in range(warp + 1):
            v = v + v[np.arange(32) ^ (1 << s)]
        want[warp * 32:(warp + 1) * 32] = v
    np.testing.assert_array_equal(out, want)
    assert "__shfl_xor_sync" in per_warp_trips.source(x, out, target="cuda")
    kinds = [type(it).__name__ for it in _program(per_warp_trips, x, out).items]
    assert kinds == ["Region", "BlockMax", "BlockFor", "Region"], kinds


@td.func
def warp_row_sum(X, row, lane):
    v = 0.0
    for c in range(lane, X.shape[1], 32):
        v += X[row, c]
    for k in range(5):
        v += td.shfl_xor(v, 16 >> k)
    return v


@td.kernel(grid=1, block=128)
def row_sums_by_warp(X: f32["R", "C"], S: f32["R"], last: td.i32, down: td.i32):
    """A row per warp, the warps taking turns (the usual softmax / layernorm schedule), in either direction; a
    warp stops past row `last` (a break under a warp-uniform condition) and skips the rows 3 modulo 5."""
    warp, lane = threadIdx.x // 32, threadIdx.x % 32
    if down == 0:
        for row in range(warp, R, 4):
            if row > last:
                break
            if row % 5 != 3:
                v = warp_row_sum(X, row, lane)
                if lane == 0:
                    S[row] = v
    else:
        for row in range(R - 1 - warp, -1, -4):
            if row < last:
                break
            if row % 5 == 3:
                continue
            v = warp_row_sum(X, row, lane)
            if lane == 0:
                S[row] = v


@settings(max_examples=12, deadline=None)
@given(rows=st.sampled_from([0, 1, 3, 4, 7, 13, 31]), cols=st.sampled_from([1, 5, 32, 37]),
       last=st.integers(-1, 32), down=st.booleans())
def test_warps_taking_turns_over_rows_compute_numpy_row_sums(rows, cols, last, down):
    x = np.random.default_rng(rows * 100 + cols).standard_normal((rows, cols)).astype(np.float32)
    got = np.full(rows, np.nan, np.float32)
    row_sums_by_warp(x, got, last, int(down))
    want = x.sum(axis=1)
    for r in range(rows):
        warp = r % 4 if not down else (rows - 1 - r) % 4
        order = range(warp, rows, 4) if not down else range(rows - 1 - warp, -1, -4)
        stopped = next((q for q in order if (q > last if not down else q < last)), None)
        passed = stopped is None or (r < stopped if not down else r > stopped)
        if r % 5 == 3 or not passed:
            want[r] = np.nan
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)


@td.kernel(grid=1, block=96)
def per_warp_trips_in_a_warp_branch(X: td.i64[96], O: td.i64[96], first: td.i32):
    warp = threadIdx.x // 32
    v = X[threadIdx.x]
    if warp >= first:
        for s in range(warp + 1):
            v += td.shfl_xor(v, 1 << s)
    O[threadIdx.x] = v


@pytest.mark.parametrize("first", [0, 1, 2, 3])
def test_a_per_warp_trip_count_inside_a_warp_uniform_branch(first):
    """The warps outside the branch publish no trip count: the block's largest is of those inside it."""
    x, out = np.arange(96, dtype=np.int64) * 3 - 50, np.zeros(96, np.int64)
    per_warp_trips_in_a_warp_branch(x, out, first)
    want = x.copy()
    for warp in range(first, 3):
        v = x[warp * 32:(warp + 1) * 32].copy()
        for s in range(warp + 1):
            v = v + v[np.arange(32) ^ (1 << s)]
        want[warp * 32:(warp + 1) * 32] = v
    np.testing.assert_array_equal(out, want)


@td.kernel(grid=1, block=64)
def per_warp_trips_around_a_barrier(X: f32[64], O: f32[64]):
    s = td.shared(f32, (64,))
    v = X[threadIdx.x]
    for k in range(threadIdx.x // 32 + 1):
        s[threadIdx.x] = v
        td.syncthreads()
        v += s[(threadIdx.x + 1) % 64]
        td.syncthreads()
    O[threadIdx.x] = v


def test_a_per_warp_trip_count_around_a_barrier_is_refused_as_on_a_gpu():
    x = np.zeros(64, np.float32)
    with pytest.raises(td.DSLError, match="inside a branch or loop that depends on threadIdx"):
        per_warp_trips_around_a_barrier(x, x)


@td.kernel(grid=1, block=64)
def one_bound_in_two_warp_branches(B: td.i64[2], O: td.i64[64]):
    t = threadIdx.x
    x = t * 1
    for j in (0, 1):            # unrolled: two copies of the branch assign `p`
        p = 0
        if t >= 32:
            p = B[j]
            for k in range(p):
                x += td.shfl_xor(x, 1)
        x = x + p
    O[t] = x


def test_a_loop_bound_assigned_in_two_warp_uniform_branches_gets_a_copy_in_each():
    """The second branch's copy was refused (the first's hand-back had made the variable block-level again)."""
    b, out = np.array([2, 1], np.int64), np.zeros(64, np.int64)
    one_bound_in_two_warp_branches(b, out)
    want = np.arange(64, dtype=np.int64)
    for j in (0, 1):
        for _ in range(b[j]):
            high = want[32:].copy()
            want[32:] = high + high[np.arange(32) ^ 1]
        want[32:] += b[j]
    np.testing.assert_array_equal(out, want)


@td.kernel(grid=1, block=64)
def warp_break_before_a_per_warp_loop(B: td.i64[2], O: td.i64[64]):
    t = threadIdx.x
    x = t * 1
    for j in range(3):
        x += td.shfl_xor(x, 1)
        if t // 32 == B[0]:
            break
        for s in range(t // 32, 2):
            x += td.shfl_xor(x, 2)
    O[t] = x


def test_a_per_warp_loop_after_a_warp_break_in_the_same_loop():
    """Everything after a warp's break reads as differing between warps until the break becomes a flag: the loop
    made for the per-warp trip count was refused as not making progress."""
    for stop_warp in (0, 1, 5):
        b, out = np.array([stop_warp, 0], np.int64), np.zeros(64, np.int64)
        warp_break_before_a_per_warp_loop(b, out)
        want = np.arange(64, dtype=np.int64)
        for w in range(2):
            v = want[w * 32:(w + 1) * 32].copy()
            for _ in range(3):
                v = v + v[np.arange(32) ^ 1]
                if w == stop_warp:
                    break
                for _ in range(w, 2):
                    v = v + v[np.arange(32) ^ 2]
            want[w * 32:(w + 1) * 32] = v
        np.testing.assert_array_equal(out, want)


# ------------------------------------------------------------------ a warp's continue ends its trip only
@td.kernel(grid=2, block=64)
def uniform_loop_before_a_warp_continue(B: i64[2], OUT: i64[2, 64]):
    t = threadIdx.x
    b = td.blockIdx.x
    x1: i64 = t * 3 - 50
    x3: i64 = b - t
    for j1 in range(2):
        p2 = 0
        if B[b] % 3:
            p2 = b + 1
            for j3 in range(p2):       # its bound is set before the warps' continue: the same in every warp
                x3 = td.shfl_up(x3 + 1, 7, width=8)
        elif t < 32:
            x3 += td.shfl_idx(x1, 3)
            continue
        x1 = x1 + p2
    OUT[b, t] = x1 * 1000 + x3


def test_a_warp_continue_leaves_what_comes_before_it_in_later_trips_uniform():
    """A loop bound assigned before a warp-uniform `continue` (in a later trip) was taken for a per-warp one: the
    whole loop counted as divergent, and the kernel was refused (random control-flow seed 1204)."""
    B = np.array([0, 1], np.int64)
    out = np.zeros((2, 64), np.int64)
    uniform_loop_before_a_warp_continue(B, out)
    t = np.arange(64)
    for b in range(2):
        x1, x3 = t * 3 - 50, b - t
        for _ in range(2):
            p2 = 0
            if B[b] % 3:
                p2 = b + 1
                for _ in range(p2):
                    x3 = (x3 + 1)[np.where(t % 8 >= 7, t - 7, t)]
                x1 = x1 + p2
            else:
                stays = t < 32
                x3 = np.where(stays, x3 + x1[(t // 32) * 32 + 3], x3)
                x1 = np.where(stays, x1, x1 + p2)
        np.testing.assert_array_equal(out[b], x1 * 1000 + x3)


@td.kernel(grid=1, block=64)
def barriers_before_a_warp_continue(X: f32[64], Y: f32[64]):
    s = td.shared(f32, (64,))
    t = threadIdx.x
    v = X[t]
    for i in range(3):
        s[t] = v                       # every thread reaches these barriers in every trip
        td.syncthreads()
        v = s[63 - t] + 1.0
        td.syncthreads()
        if t // 32 == i % 2:
            continue
        v = v * 2.0
    Y[t] = v


@td.kernel(grid=1, block=64)
def barrier_after_a_warp_continue(X: f32[64], Y: f32[64]):
    t = threadIdx.x
    v = X[t]
    for i in range(3):
        if t // 32 == i % 2:
            continue
        td.syncthreads()               # the warp that continued skips it
        v = v * 2.0
    Y[t] = v


def test_barriers_before_a_warp_continue_are_reached_by_every_thread():
    """They were refused as under divergent control flow; one after the continue still is."""
    x = np.arange(64, dtype=np.float32)
    y = np.zeros(64, np.float32)
    barriers_before_a_warp_continue(x, y)
    t, v = np.arange(64), x.copy()
    for i in range(3):
        v = v[63 - t] + np.float32(1)
        v = np.where(t // 32 == i % 2, v, v * np.float32(2))
    np.testing.assert_array_equal(y, v)
    assert "__syncthreads()" in barriers_before_a_warp_continue.source(x, y, target="cuda")
    with pytest.raises(td.DSLError, match="'syncthreads\\(\\)' inside a branch or loop that depends on threadIdx"):
        barrier_after_a_warp_continue(x, y)


@td.kernel(grid=1, block=96)
def per_warp_whiles_with_jumps(X: i64[96], LIM: i64[3], Y: i64[96]):
    t = threadIdx.x
    warp = t // 32
    v = X[t]
    i = 0
    while i < LIM[warp]:
        i += 1
        if (i + warp) % 3 == 0:
            continue
        v += td.shfl_down(v, 1)
        j = 0
        while j < warp + i % 2:         # nested, per warp too
            v = td.shfl_xor(v, 2) - j
            j += 1
        if LIM[warp] - i == 4:
            break
        v = v % 1000
    Y[t] = v * 100 + i


def _per_warp_whiles_with_jumps(x: np.ndarray, lim: np.ndarray) -> np.ndarray:
    """The kernel, one warp at a time (its conditions are warp-uniform): 32 lanes as a vector."""
    out, lanes = np.zeros_like(x), np.arange(32)
    for warp in range(3):
        v, i = x[warp * 32:(warp + 1) * 32].copy(), 0
        while i < lim[warp]:
            i += 1
            if (i + warp) % 3 == 0:
                continue
            v = v + v[np.minimum(lanes + 1, 31)]
            j = 0
            while j < warp + i % 2:
                v = v[lanes ^ 2] - j
                j += 1
            if lim[warp] - i == 4:
                break
            v = v % 1000
        out[warp * 32:(warp + 1) * 32] = v * 100 + i
    return out


@settings(max_examples=12, deadline=None)
@given(lim=st.lists(st.integers(-1, 9), min_size=3, max_size=3), seed=st.integers(0, 2**16))
def test_per_warp_while_loops_with_continue_break_and_nesting_match_a_warp_by_warp_run(lim, seed):
    x = np.random.default_rng(seed).integers(-500, 500, 96)
    lim = np.array(lim, np.int64)
    y = np.zeros(96, np.int64)
    per_warp_whiles_with_jumps(x, lim, y)
    np.testing.assert_array_equal(y, _per_warp_whiles_with_jumps(x, lim))


# ------------------------------------------------------------------ per-warp loops a per-warp fuzzer found
@td.func
def _two_swaps(x: i64) -> i64:
    j = 0
    while j < 2:                     # the same in every warp that runs it
        j += 1
        x = td.shfl_xor(x, 1) + 1
    return x


@td.kernel(block=64)
def shuffle_while_after_a_warp_jump(OUT: i64[64], leave: td.i32):
    t = threadIdx.x
    x: i64 = t
    for i in range(3):
        if t // 32 == i:             # warp 0 at i == 0, warp 1 at i == 1: leaves the loop, or skips the trip
            if leave:
                break
            continue
        x = _two_swaps(x)
    OUT[t] = x


@td.kernel(block=64)
def shuffle_while_in_a_while_a_warp_breaks(OUT: i64[64]):
    t = threadIdx.x
    x: i64 = t
    i = 0
    while True:
        i += 1
        if i > t // 32 + 1:
            break
        j = 0
        while j < 2:                 # written out: not only an inlined call's loop
            j += 1
            x = td.shfl_xor(x, 1) + 1
    OUT[t] = x


@td.kernel(block=64)
def dead_shuffle_after_a_break(OUT: i64[64]):
    t = threadIdx.x
    x: i64 = t
    i = 0
    while i < t // 32 + 1:
        i += 1
        x += 1
        break
        x = td.shfl_xor(x, 1)        # never runs: the loop holds no shuffle once the break is a flag
    OUT[t] = x


@pytest.mark.parametrize("kernel, args, trips", [
    (shuffle_while_after_a_warp_jump, (1,), lambda warp: warp),
    (shuffle_while_after_a_warp_jump, (0,), lambda warp: 2),
    (shuffle_while_in_a_while_a_warp_breaks, (), lambda warp: warp + 1),
    (dead_shuffle_after_a_break, (), None),
])
def test_while_loops_around_shuffles_nested_in_loops_warps_leave(kernel, args, trips):
    """The inner while was made per warp again at each round of fission, for good (the compile never ended); a
    loop whose only shuffle was dead code after a break kept its block maximum in a region (KeyError)."""
    out = np.zeros(64, np.int64)
    kernel(out, *args)
    t = np.arange(64)
    if trips is None:
        np.testing.assert_array_equal(out, t + 1)
        return
    expected = t.copy()
    for warp in (0, 1):
        x = t[warp * 32:(warp + 1) * 32]
        for _ in range(2 * trips(warp)):
            x = x[np.arange(32) ^ 1] + 1
        expected[warp * 32:(warp + 1) * 32] = x
    np.testing.assert_array_equal(out, expected)


@td.kernel(grid=1, block=128)
def counter_of_a_loop_warps_leave_apart(A: i64[128], OUT: i64[128, 2]):
    t = threadIdx.x
    wv = t // 32
    x = A[t]
    wc = 0
    while True:
        wc += 1
        if wc > wv:         # each warp leaves after its own number of trips
            break
        if wv > 0:
            if wc != 2:     # warp-uniform: the counter is one warp's
                x = td.shfl_xor(x, 1) + wc
    OUT[t, 0] = x
    OUT[t, 1] = wc          # read after the loop: the branch's copy starts from each trip's value


@td.kernel(grid=1, block=128)
def bound_a_later_warp_branch_assigns(A: i64[128], OUT: i64[128, 2], n: i64):
    t = threadIdx.x
    wv = t // 32
    x = A[t]
    c = n
    if wv > 0:
        p = c               # the same in every thread here: the later branch has not run yet
        for k in range(p):
            x = td.shfl_xor(x, 1) + k
    if wv > 1:
        c = c + 1
    OUT[t, 0] = x
    OUT[t, 1] = c


def test_the_counter_of_a_loop_warps_leave_apart_is_one_warps_in_a_nested_warp_branch():
    """The uniformity analysis took the counter for the block's inside the branches (the threads of a warp-uniform
    branch agree on values assigned outside every branch), so `wc += 1` was refused as a block variable that
    differs between warps (a fuzzer's seeds 3011, 3389, 3482). A loop its threads leave under warp-uniform
    branches of its own now makes what it assigns per warp."""
    a, out = np.arange(128, dtype=np.int64) * 7 - 300, np.zeros((128, 2), np.int64)
    counter_of_a_loop_warps_leave_apart(a, out)
    want = a.copy()
    for warp in range(4):
        v = a[warp * 32:(warp + 1) * 32].copy()
        for wc in range(1, warp + 1):
            if warp > 0 and wc != 2:
                v = v[np.arange(32) ^ 1] + wc
        want[warp * 32:(warp + 1) * 32] = v
    np.testing.assert_array_equal(out[:, 0], want)
    np.testing.assert_array_equal(out[:, 1], np.arange(128) // 32 + 1)


@pytest.mark.parametrize("n", [0, 3])
def test_a_loop_bound_copied_before_a_later_warp_branch_assigns_it(n):
    """`p = c` in a warp branch was taken as agreed (`c` from outside every branch) though a later warp-uniform
    branch assigns `c`, and refused there (seeds 3038, 3328); a copy is now as local to a branch as its source."""
    a, out = np.arange(128, dtype=np.int64) * 5 - 100, np.zeros((128, 2), np.int64)
    bound_a_later_warp_branch_assigns(a, out, n)
    want = a.copy()
    for warp in range(1, 4):
        v = want[warp * 32:(warp + 1) * 32]
        for k in range(n):
            v[:] = v[np.arange(32) ^ 1] + k
    np.testing.assert_array_equal(out[:, 0], want)
    np.testing.assert_array_equal(out[:, 1], np.where(np.arange(128) // 32 > 1, n + 1, n))


@td.kernel(grid=1, block=64)
def carried_bound_in_a_per_warp_loop(OUT: i64[64]):
    t = threadIdx.x
    x: i64 = t
    c = 0
    for i in range(t // 32 + 2):    # warp 0: 2 trips, warp 1: 3
        c += 1
        for j in range(c):          # bounded by what the loop carries from trip to trip
            x = td.shfl_xor(x, 1) + j
    OUT[t] = x + c


def test_a_variable_a_per_warp_loop_carries_bounds_a_shuffle_loop_inside_it():
    """Refused before (the made loop's warp-uniform `if` read `c` from the trip before): its copy starts there."""
    out = np.zeros(64, np.int64)
    carried_bound_in_a_per_warp_loop(out)
    np.testing.assert_array_equal(out, _counted_shuffles(lambda warp: warp + 2))


@td.kernel(grid=1, block=64)
def carried_half_bound_in_a_per_warp_loop(OUT: f32[64]):
    t = threadIdx.x
    x: f32 = t
    c: f16 = -1.5
    for i in range(t // 32 + 2):    # warp 0: 2 trips, warp 1: 3
        c = c + td.cast(1.0, f16)
        for j in range(td.cast(c, i32) + 2):
            x = td.shfl_xor(x, 1) + j
    OUT[t] = x + td.cast(c, f32)


@td.kernel(grid=1, block=64)
def carried_flag_in_a_per_warp_loop(OUT: i64[64]):
    t = threadIdx.x
    x: i64 = t
    on = False
    for i in range(t // 32 + 2):
        on = not on
        if on:
            x = td.shfl_xor(x, 1) + i
    OUT[t] = x * 2 + (1 if on else 0)


def test_a_half_or_bool_a_per_warp_loop_carries_controls_a_shuffle_inside_it():
    """Refused before (a block maximum compared the bits of a 16-bit float, where -0.5 is above -inf): their copies
    start from the trip before's value too, the slots of the maximum starting at 0 in their storage."""
    half, flag = np.zeros(64, np.float32), np.zeros(64, np.int64)
    carried_half_bound_in_a_per_warp_loop(half)
    carried_flag_in_a_per_warp_loop(flag)
    want_half, want_flag = np.zeros(64, np.float32), np.zeros(64, np.int64)
    for warp in range(2):
        lanes = slice(warp * 32, warp * 32 + 32)
        x, c = np.arange(64, dtype=np.float32)[lanes], np.float16(-1.5)
        y, on = np.arange(64)[lanes], False
        for i in range(warp + 2):
            c, on = np.float16(c + np.float16(1)), not on
            for j in range(int(c) + 2):
                x = x[np.arange(32) ^ 1] + j
            if on:
                y = y[np.arange(32) ^ 1] + i
        want_half[lanes], want_flag[lanes] = x + np.float32(c), y * 2 + on
    np.testing.assert_array_equal(half, want_half)
    np.testing.assert_array_equal(flag, want_flag)
