"""Hoisting invariant subexpressions out of elementwise kernels' loops (taskdsl/schedule/hoist.py).

Oracle: numpy formulas of the definitions; the kernels' IR shows where each value is computed.
"""
import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

import taskdsl as td
from taskdsl import ir
from taskdsl.compute import size_var
from taskdsl.schedule.rules import schedule_injective

from .test_rules import gpu_plan

X = td.placeholder("HX", td.f32, ("M", "N"))
S = td.placeholder("HS", td.f32, (1,))
SCALED = td.compute("Scaled", ("M", "N"), lambda i, j: X[i, j] / (S[0] * S[0] + 1.0) + size_var("N"))
SCALED_OP = td.op([X, S], [SCALED])

XI = td.placeholder("HXI", td.i32, ("N",))
A = td.placeholder("HA", td.i32, (1,))
B = td.placeholder("HB", td.i32, (1,))
V = td.placeholder("HV", td.f32, ("K",))
BRANCHES = td.compute("Branches", ("N",), lambda i: ir.Select(
    XI[i] > 0, ir.Cast(A[0] // B[0], td.f32) + S[0] * 2.0 + V[0], ir.Cast(XI[i], td.f32), td.f32))
BRANCHES_OP = td.op([XI, A, B, S, V], [BRANCHES])


def _loop_and_ahead(out, strategy: str) -> tuple[str, str]:
    """The IR text of `out`'s kernel by `strategy`: the statements ahead of its first loop, and the rest."""
    fn = schedule_injective(out, set(), strategy)._frontend_ir((1, 1, 1))
    text = ir.function_str(fn)
    body, cut = text[text.index("\n    ", text.index("# sizes")):], text.index("for ")
    return body[:body.index("for ")], text[cut:]


@pytest.mark.parametrize("strategy", ["spans", "row_spans", "flat", "rows"])
def test_scalar_arithmetic_is_computed_once_ahead_of_the_loops(strategy):
    ahead, loop = _loop_and_ahead(SCALED, strategy)
    assert "HS[0] * HS[0] + 1.0" in ahead and "HS" not in loop
    assert "HX[" in loop and "HX[" not in ahead


@settings(max_examples=12, deadline=None)
@given(st.sampled_from([0, 1, 2, 7, 31]), st.sampled_from([1, 3, 16, 257, 4099]), st.booleans(),
       st.floats(-3, 3, width=32))
def test_hoisted_kernels_match_numpy(m, n, gpu, s):
    """Every strategy's kernel (the GPU's planned and run on the cpu target), odd and empty shapes."""
    x = np.random.default_rng(m * n).standard_normal((m, n)).astype(np.float32)
    scale = np.array([s], np.float32)
    if gpu:
        with gpu_plan():
            got, = SCALED_OP(x, scale)
    else:
        got, = SCALED_OP(x, scale)
    np.testing.assert_allclose(got, x / (scale[0] * scale[0] + np.float32(1)) + np.float32(n), rtol=1e-6)


def test_a_branch_keeps_what_may_not_be_evaluated():
    """In a select's branch an integer division (INT_MIN // -1 traps on x86, where the branch is not taken) stays in
    the loop, and so does a load of a buffer that may be empty; a float product of a size-1 buffer moves ahead, and
    so do the division's operands."""
    ahead, loop = _loop_and_ahead(BRANCHES, "spans")
    assert "HS[0] * 2.0" in ahead and "HA[0]" in ahead and "HB[0]" in ahead
    assert "//" in loop and "HV[0]" in loop and "//" not in ahead and "HV" not in ahead


GATHERED = td.compute("Gathered", ("M", "N"), lambda i, j: X[i, j] + V[0] + V[A[0]] + X[0, 0])


@pytest.mark.parametrize("strategy", ["row_spans", "rows"])
def test_loads_move_only_where_they_stay_in_bounds(strategy):
    """Outside any branch too, only loads at constant indices inside constant shapes move: the assignments run where
    the loops run no element (an output of 0 rows still runs a block of row_spans' grid, a GPU block's threads past
    the end run too), so V[0] of a V that may be empty, V[A[0]] and X[0, 0] stay in the loop; A[0] moves."""
    ahead, loop = _loop_and_ahead(GATHERED, strategy)
    assert "HA[0]" in ahead and "HV" not in ahead and "HX" not in ahead
    assert "HV[0]" in loop and "HX[0, 0]" in loop


@pytest.mark.parametrize("taken", [False, True])
def test_branches_compute_what_they_take(taken):
    """Not taken: a divisor of 0 and an empty V are never read. Taken: the branch's value."""
    xi = np.array([3, -1, 0, 5, -7] if taken else [-1, 0, -4], np.int32)
    a, b = np.array([17], np.int32), np.array([5 if taken else 0], np.int32)
    s, v = np.array([0.25], np.float32), np.array([1.5] if taken else [], np.float32)
    got, = BRANCHES_OP(xi, a, b, s, v)
    want = np.where(xi > 0, np.float32(17 // 5 + 0.5 + 1.5) if taken else 0, xi).astype(np.float32)
    np.testing.assert_array_equal(got, want)
