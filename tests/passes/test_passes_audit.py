"""Audit of the IR passes: each test failed before its fix, and checks against an oracle of its own
(plain Python over the threads, or numpy)."""
import numpy as np
import pytest
from hypothesis import assume, given, settings, strategies as st

import taskdsl as td
from taskdsl import DSLError, f32, i32, ir, threadIdx
from taskdsl.ir import types as T
from taskdsl.passes import simplify
from taskdsl.passes.uniformity import WARP, Uniformity

OPTIMIZED = True    # the cpu target's optimized path: unroll_loops makes the constants simplify folds

_PY_COMPARE = {"<": int.__lt__, "<=": int.__le__, ">": int.__gt__, ">=": int.__ge__, "//": int.__floordiv__,
               ">>": int.__rshift__}


# ------------------------------------------------------------------ uniformity: warp-uniform patterns
@settings(max_examples=150, deadline=None)
@given(op=st.sampled_from(list(_PY_COMPARE)), c=st.integers(-70, 100), tid_left=st.booleans())
def test_warp_uniform_patterns_are_the_same_in_every_lane_of_a_warp(op, c, tid_left):
    """Whatever the analysis calls warp-uniform (threadIdx.x compared with, divided or shifted by a constant) has
    one value per warp: `t <= 32`, `t // -32` and `t >> 4` do not (lane 0 of a warp differs from lane 1)."""
    assume(op != "//" or (tid_left and c != 0))
    assume(op != ">>" or (tid_left and 0 <= c < 32))
    block = (128, 1, 1)
    t, k = threadIdx.x, ir.const(c)
    e = ir.binary(op, t, k) if tid_left else ir.binary(op, k, t)
    x = ir.Buffer("x", T.f32, (ir.const(1),))
    fn = ir.Function("k", (x,), (), ir.Store(x, (ir.const(0),), ir.Cast(e, T.f32)), block)
    if Uniformity(fn).level(e) != WARP:
        return
    values = [_PY_COMPARE[op](tid, c) if tid_left else _PY_COMPARE[op](c, tid) for tid in range(block[0])]
    for warp in range(block[0] // 32):
        assert len(set(values[warp * 32:(warp + 1) * 32])) == 1, (op, c, tid_left, warp)


@td.kernel(grid=1, block=64)
def shuffle_under_le_32(X: f32[64], Out: f32[64]):
    v = X[threadIdx.x]
    if threadIdx.x <= 32:            # lane 0 of warp 1 is in, its lanes 1..31 are not
        v = td.shfl_xor(v, 1)
    Out[threadIdx.x] = v


@td.kernel(grid=1, block=64)
def shuffle_under_le_31(X: f32[64], Out: f32[64]):
    v = X[threadIdx.x]
    if threadIdx.x <= 31:            # warp 0 exactly
        v = td.shfl_xor(v, 1)
    Out[threadIdx.x] = v


def test_shuffle_under_a_comparison_that_splits_a_warp_is_rejected():
    x, out = np.arange(64, dtype=np.float32), np.zeros(64, np.float32)
    with pytest.raises(DSLError, match="'shfl_xor\\(\\)' inside a branch or loop that differs between the lanes"):
        shuffle_under_le_32.source(x, out, target="cuda")
    shuffle_under_le_31(x, out)
    expected = x.copy()
    expected[:32] = x[np.arange(32) ^ 1]
    np.testing.assert_array_equal(out, expected)


@td.kernel(grid=1, block=96)
def shuffle_in_warp_1_by_shift(X: f32[96], Out: f32[96]):
    v = X[threadIdx.x]
    if threadIdx.x >> 5 == 1:        # CUDA's warp index idiom
        v = td.shfl_xor(v, 1)
    Out[threadIdx.x] = v


def test_a_warp_index_by_shift_is_warp_uniform():
    """`threadIdx.x >> 5` was per-thread to the analysis: a shuffle under it was rejected."""
    x, out = np.arange(96, dtype=np.float32), np.zeros(96, np.float32)
    shuffle_in_warp_1_by_shift(x, out)
    lanes = np.arange(96)
    np.testing.assert_array_equal(out, np.where(lanes // 32 == 1, x[lanes ^ 1], x))


# ------------------------------------------------------------------ check_barriers: shuffles in a head
@td.kernel(grid=1, block=32)
def shuffle_in_a_divergent_if_condition(X: f32[32], Out: f32[32]):
    v = X[threadIdx.x]
    if threadIdx.x % 2 == 0:
        if td.shfl_xor(v, 1) > 0.0:  # only the even lanes run this shuffle
            v = 100.0
    Out[threadIdx.x] = v


@td.kernel(grid=1, block=32)
def shuffle_in_a_while_condition(X: i32[32], Out: i32[32]):
    v = X[threadIdx.x]
    n = 0
    while td.shfl_xor(v, 1) > n:     # lanes leave after different numbers of shuffles
        n += 1
    Out[threadIdx.x] = n


@td.kernel(grid=1, block=32)
def shuffle_in_a_uniform_if_condition(X: f32[32], Out: f32[32]):
    v = X[threadIdx.x]
    if td.shfl_xor(v, 1) > v:        # every lane runs it
        v = -v
    Out[threadIdx.x] = v


def test_shuffles_in_branch_and_loop_conditions_are_checked_on_every_target():
    """The conditions of ifs and whiles were not checked: CUDA code shuffled in half a warp."""
    x, out = np.arange(32, dtype=np.float32), np.zeros(32, np.float32)
    with pytest.raises(DSLError, match="'shfl_xor\\(\\)' inside a branch or loop that differs between the lanes"):
        shuffle_in_a_divergent_if_condition.source(x, out, target="cuda")
    xi, outi = np.arange(32, dtype=np.int32), np.zeros(32, np.int32)
    with pytest.raises(DSLError, match="a warp shuffle in a while condition is not supported"):
        shuffle_in_a_while_condition.source(xi, outi, target="cuda")
    shuffle_in_a_uniform_if_condition(x, out)
    np.testing.assert_array_equal(out, np.where(x[np.arange(32) ^ 1] > x, -x, x))


# ------------------------------------------------------------------ check_barriers: shuffles in chosen operands
@td.kernel(grid=1, block=32)
def shuffle_in_a_divergent_conditional_expression(X: f32[32], Out: f32[32]):
    Out[threadIdx.x] = td.shfl_xor(X[threadIdx.x], 1) if threadIdx.x < 3 else -1.0


@td.kernel(grid=1, block=32)
def shuffle_after_a_divergent_and(X: f32[32], Out: f32[32]):
    Out[threadIdx.x] = threadIdx.x < 3 and td.shfl_down(X[threadIdx.x], 1) > 0.5


@td.kernel(grid=1, block=32)
def shuffle_after_a_divergent_or_of_numbers(X: f32[32], Out: f32[32]):
    Out[threadIdx.x] = X[threadIdx.x] or td.shfl_xor(X[threadIdx.x], 1)


@td.kernel(grid=1, block=64)
def shuffles_chosen_by_warp(X: f32[64], Out: f32[64]):
    v = X[threadIdx.x]
    Out[threadIdx.x] = td.shfl_xor(v, 1) if threadIdx.x // 32 == 0 else td.shfl_xor(v, 2)
    Out[threadIdx.x] += threadIdx.x >= 32 and td.shfl_down(v, 1) > v


def test_shuffles_in_the_operand_a_condition_chooses_are_checked():
    """A shuffle in `a if c else b`, or in `b` of `c and b` / `c or b`, runs in the lanes `c` chooses: under a
    per-thread `c` it is rejected as under an `if` (it compiled to `c ? __shfl_xor_sync(...) : -1.0f`, and the cpu
    read lanes the GPU would not shuffle); under a warp-uniform one, each warp's choice runs."""
    x, out = np.arange(32, dtype=np.float32), np.zeros(32, np.float32)
    for kernel in (shuffle_in_a_divergent_conditional_expression, shuffle_after_a_divergent_and,
                   shuffle_after_a_divergent_or_of_numbers):
        with pytest.raises(DSLError, match="inside a branch or loop that differs between the lanes"):
            kernel.source(x, out, target="cuda")
        with pytest.raises(DSLError, match="inside a branch or loop that differs between the lanes"):
            kernel(x, out)
    x = np.random.default_rng(0).permutation(64).astype(np.float32)
    out = np.zeros(64, np.float32)
    shuffles_chosen_by_warp(x, out)
    lanes = np.arange(64)
    down = x[np.where(lanes % 32 < 31, lanes + 1, lanes)]     # shfl_down: the last lane keeps its own value
    expected = np.where(lanes < 32, x[lanes ^ 1], x[lanes ^ 2]) + ((lanes >= 32) & (down > x))
    np.testing.assert_array_equal(out, expected)


# ------------------------------------------------------------------ simplify: atomics are not dropped
@td.kernel(grid=1, block=4)
def atomic_times_zero(C: i32[1], Out: i32[4]):
    Out[threadIdx.x] = td.atomic_add(C[0], 1) * 0 + threadIdx.x


@td.kernel(grid=1, block=4)
def atomic_mod_one(C: i32[1], Out: i32[4]):
    Out[threadIdx.x] = td.atomic_add(C[0], 1) % 1


@td.kernel(grid=1, block=4)
def atomic_multiple_mod(C: i32[1], Out: i32[4]):
    Out[threadIdx.x] = (td.atomic_add(C[0], 1) * 4 + threadIdx.x) % 4


@td.kernel(grid=1, block=4)
def two_atomics_joined(C: i32[1], Out: i32[4]):
    Out[threadIdx.x] = (td.atomic_add(C[0], 1) // 3) * 3 + td.atomic_add(C[0], 1) % 3


@pytest.mark.parametrize("kernel, atomics, value", [
    (atomic_times_zero, 1, lambda olds, t: olds[0] * 0 + t),
    (atomic_mod_one, 1, lambda olds, t: olds[0] % 1),
    (atomic_multiple_mod, 1, lambda olds, t: (olds[0] * 4 + t) % 4),
    (two_atomics_joined, 2, lambda olds, t: (olds[0] // 3) * 3 + olds[1] % 3),
])
def test_identities_keep_the_atomics_they_would_drop(kernel, atomics, value):
    """x * 0, x % 1, (q*c + r) % c and (x // c) * c + x % c dropped or merged an atomic in x or q. Oracle:
    the cpu target runs a block's threads in tid order, each reading its operands left to right."""
    counter, out = np.zeros(1, np.int32), np.zeros(4, np.int32)
    kernel(counter, out)
    expected, count = [], 0
    for t in range(4):
        olds = list(range(count, count + atomics))
        count += atomics
        expected.append(value(olds, t))
    assert counter[0] == count
    np.testing.assert_array_equal(out, expected)


# ------------------------------------------------------------------ simplify: shifts out of range
def _folded(e: ir.Expr) -> ir.Expr:
    out = ir.Buffer("out", e.dtype, (ir.const(1),))
    return simplify(ir.Function("k", (out,), (), ir.Store(out, (ir.const(0),), e), (1, 1, 1))).body.value


@pytest.mark.parametrize("op", ["<<", ">>"])
@pytest.mark.parametrize("count", [-1, -40, 32, 33, 2**31 - 1])
def test_shift_by_a_count_out_of_range_is_kept(op, count):
    """`1 << -1` raised Python's ValueError in the compiler (and `1 << (2**31 - 1)` built a huge integer):
    a shift count outside 0..31 is undefined at run time, so the shift stays for the kernel to do (or skip)."""
    e = _folded(ir.binary(op, ir.const(1), ir.const(count)))
    assert isinstance(e, ir.Binary) and e.op == op


@pytest.mark.parametrize("op, value, count", [("<<", 1, 31), ("<<", 3, 4), (">>", -64, 3), (">>", 7, 0)])
def test_shift_by_a_count_in_range_still_folds(op, value, count):
    e = _folded(ir.binary(op, ir.const(value), ir.const(count)))
    expected = np.left_shift(np.int32(value), np.int32(count)) if op == "<<" else \
        np.right_shift(np.int32(value), np.int32(count))
    assert isinstance(e, ir.Const) and e.value == int(expected)


@td.kernel(grid=1, block=1)
def shift_in_an_unrolled_loop(X: i32[1], Out: i32[4]):
    r = td.registers(i32, (4,))
    for i in td.unroll(4):
        r[i] = (1 << (i - 1)) if X[0] > 100 else 7     # the shift by -1 is never evaluated
    for i in range(4):
        Out[i] = r[i]


@pytest.mark.parametrize("x", [0, pytest.param(200, marks=pytest.mark.undefined_behavior)])
def test_an_unrolled_shift_by_a_negative_count_that_never_runs_compiles(x):
    out = np.zeros(4, np.int32)
    shift_in_an_unrolled_loop(np.array([x], np.int32), out)
    expected = [7] * 4 if x <= 100 else None
    if expected is not None:
        np.testing.assert_array_equal(out, expected)
    else:           # i == 0 shifts by -1, undefined: only the defined lanes are checked
        np.testing.assert_array_equal(out[1:], [1, 2, 4])
