"""unroll_loops: constant loops become copies of their body, within bounds on the code it may produce."""
from hypothesis import given, settings, strategies as st

from taskdsl import ir
from taskdsl.ir import types as T
from taskdsl.passes import unroll_loops
from taskdsl.passes.unroll import MAX_BRANCHES, MAX_COPIES, MAX_NODES

from .ir_eval import run


def _loop(trips: int, body_of) -> ir.Function:
    """A kernel storing body_of(i) to out[i] for i in range(trips)."""
    out = ir.Buffer("out", T.i32, (ir.const(max(trips, 1)),))
    i = ir.Var("i", T.i32, kind="loop")
    body = body_of(i, out)
    return ir.Function("k", (out,), (), ir.For(i, ir.const(0), ir.const(trips), ir.const(1), body), (1, 1, 1))


def _chain(i, terms: int) -> ir.Expr:
    """i * 1 + i * 2 + ... : an expression of about 4 * terms nodes."""
    e = i * 1
    for t in range(2, terms + 1):
        e = e + i * t
    return e


def _stores(fn: ir.Function) -> list:
    trace: list = []
    run(fn.body, {}, (0, 0, 0), trace)
    return trace


@settings(max_examples=40, deadline=None)
@given(trips=st.integers(0, 12), terms=st.integers(1, 6))
def test_small_loops_unroll_into_the_same_stores(trips, terms):
    fn = _loop(trips, lambda i, out: ir.Store(out, (i,), _chain(i, terms)))
    unrolled = unroll_loops(fn)
    assert not ir.collect(unrolled.body, ir.For)
    assert _stores(unrolled) == _stores(fn) == [("out", (t,), sum(t * k for k in range(1, terms + 1)))
                                               for t in range(trips)]


def test_too_many_statements_stay_a_loop():
    fn = _loop(MAX_COPIES + 1, lambda i, out: ir.Store(out, (i,), i))
    assert isinstance(unroll_loops(fn).body, ir.For)


def test_too_many_branches_stay_a_loop():
    fn = _loop(MAX_BRANCHES + 1, lambda i, out: ir.If(ir.binary("<", i, ir.const(3)), ir.Store(out, (i,), i)))
    assert isinstance(unroll_loops(fn).body, ir.For)


def test_big_expressions_stay_a_loop():
    """Few statements, but each a large expression: copies of it would make numba's compile slow."""
    trips = 8
    terms = MAX_NODES // trips // 4 + 8
    fn = _loop(trips, lambda i, out: ir.Store(out, (i,), _chain(i, terms)))
    assert trips * len(ir.collect(fn.body.body, ir.Expr)) > MAX_NODES
    unrolled = unroll_loops(fn)
    assert isinstance(unrolled.body, ir.For)
    assert _stores(unrolled) == _stores(fn)
