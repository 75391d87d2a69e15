"""Deep expressions (`passes/split_deep.py`): hundreds of folded terms compile on both targets and match numpy.

Before the pass, an expression nesting more than about 200 levels failed in the cpu target's generated module
("too many nested parentheses") and past about 330 in the IR's recursive walks (RecursionError).
"""
import dataclasses

import numpy as np
import pytest
from hypothesis import example, given, settings, strategies as st

import taskdsl as td
from taskdsl import ir
from taskdsl.backend.cuda.codegen import emit_cuda
from taskdsl.backend.cuda.nvrtc import compile_cubin
from taskdsl.passes.split_deep import MAX_DEPTH, depth, split_deep_expressions

ir.allow_deep_trees()   # as the first kernel or op would; here before hypothesis runs (it warns of a change mid-test)


def _fold(terms: int, ops: list):
    """(definition function, float64 oracle) of y[i] = x[i] folded with x[k] by ops[k % len(ops)], k < terms."""
    def term(acc, op, v):
        return {"+": lambda: acc + v, "-": lambda: acc - v, "*": lambda: acc * (1.0 + 0.01 * v)}[op]()

    def definition(x, i):
        acc = x[i]
        for k in range(terms):
            acc = term(acc, ops[k % len(ops)], x[k])
        return acc

    def oracle(a: np.ndarray) -> np.ndarray:
        acc = a.astype(np.float64)
        for k in range(terms):
            acc = term(acc, ops[k % len(ops)], float(a[k]))
        return acc
    return definition, oracle


@settings(max_examples=4, deadline=None)
@given(terms=st.sampled_from([1, 97, 211, 433]), ops=st.lists(st.sampled_from("+-*"), min_size=1, max_size=3),
       seed=st.integers(0, 2**16))
@example(terms=700, ops=["+"], seed=0)        # past the IR walks' old recursion limit too
def test_deep_folds_match_numpy_and_compile_for_cuda(terms, ops, seed):
    td.set_target("cpu")
    definition, oracle = _fold(terms, ops)
    n = max(terms, 3)
    x = td.placeholder("x", td.f32, (n,))
    y = td.compute("y", (n,), lambda i: definition(x, i))
    op = td.op([x], [y])
    a = np.random.default_rng(seed).uniform(-1, 1, n).astype(np.float32)
    np.testing.assert_allclose(op(a)[0], oracle(a), rtol=1e-4, atol=1e-4)
    source = op.source(a, target="cuda")
    assert compile_cubin(source, "sm_90", "deep", fast=True)


def test_a_deep_branch_stays_behind_its_guard():
    """y[i] = (x[i] + x[i + 1] + ... + x[i + 109]) if i + 109 < n else -1: the branch reads past the end for the
    last rows, so its terms move into an `if` on the guard, never before it (debug mode checks every read)."""
    width, n = 110, 113
    x = td.placeholder("x", td.f32, (n,))

    def window(i):
        acc = x[i]
        for k in range(1, width):
            acc = acc + x[i + k]
        return acc
    y = td.compute("y", (n,), lambda i: ir.Select(i + width - 1 < n, window(i), -1.0, td.f32))
    op = td.op([x], [y])
    a = np.random.default_rng(0).uniform(-1, 1, n).astype(np.float32)
    want = np.array([a[i:i + width].astype(np.float64).sum() if i + width <= n else -1.0 for i in range(n)])
    td.set_target("cpu")
    td.debug(True)
    try:
        np.testing.assert_allclose(op(a)[0], want, rtol=1e-4, atol=1e-4)
    finally:
        td.debug(False)


def _deep_sum(x: ir.Buffer, terms: int) -> ir.Expr:
    acc = ir.Load(x, (ir.const(0),))
    for k in range(1, terms):
        acc = acc + ir.Load(x, (ir.const(k),))
    return acc


def test_statements_come_out_shallow_and_while_conditions_untouched():
    x = ir.Buffer("x", td.f32, (ir.const(1000),), "global")
    y = ir.Buffer("y", td.f32, (ir.const(4),), "global")
    flag = ir.Var("flag", td.boolean)
    deep = _deep_sum(x, 500)
    looping = _deep_sum(x, 150) > 0.0
    body = ir.seq([
        ir.Store(y, (ir.const(0),), deep),
        ir.Store(y, (ir.const(1),), ir.Select(deep > 0.0, deep, _deep_sum(x, 300) * 2.0, td.f32)),
        ir.Assign(flag, ir.binary("and", deep > 0.0, _deep_sum(x, 200) < 1.0)),
        ir.While(looping, ir.Store(y, (ir.const(2),), ir.const(0.0))),
    ])
    fn = ir.Function("deep", (x, y), (), body, (1, 1, 1))
    out = split_deep_expressions(fn)
    statements = ir.collect(out.body, ir.Stmt)
    for s in statements:
        exprs = [v for v in (getattr(s, f, None) for f in ("value", "cond", "start", "stop")) if isinstance(v, ir.Expr)]
        if isinstance(s, ir.While):
            assert s.cond is looping            # evaluated at every iteration: left as it was
        else:
            assert all(depth(e) <= MAX_DEPTH for e in exprs), s
    assert split_deep_expressions(out) is out     # nothing left to split
    assert depth(deep) == 501 and depth(looping) > MAX_DEPTH


def test_an_eager_select_splits_as_one_expression_and_emits_no_branch():
    """Both operands of an eager select are evaluated (`ir.Select.eager`): their deep parts become temporaries
    before the statement, with no `if`, and the CUDA emitter passes them to td_select as a call's arguments."""
    x = ir.Buffer("x", td.f32, (ir.const(1000),), "global")
    y = ir.Buffer("y", td.f32, (ir.const(1),), "global")
    select = ir.Select(ir.Load(x, (ir.const(0),)) > 0.0, _deep_sum(x, 500), _deep_sum(x, 300) * 2.0, td.f32, eager=True)
    fn = ir.Function("eager", (x, y), (), ir.Store(y, (ir.const(0),), select), (1, 1, 1))
    out = split_deep_expressions(fn)
    assert not ir.collect(out.body, ir.If) and len(ir.collect(out.body, ir.Assign)) > 2
    assert [e.eager for e in ir.collect(out.body, ir.Select)] == [True]
    source = emit_cuda(out)
    assert "td_select<float>(" in source and " ? " not in source.split("td_select<float>(")[-1].split(";")[0]
    assert compile_cubin(source, "sm_90", "eager", fast=True)
    lazy = split_deep_expressions(ir.Function("lazy", (x, y), (), ir.Store(y, (ir.const(0),), dataclasses.replace(
        select, eager=False)), (1, 1, 1)))
    assert ir.collect(lazy.body, ir.If)     # the same select, lazy: its arms run under an `if`


@pytest.mark.gpu
def test_deep_folds_on_gpu():
    td.set_target("cuda")
    definition, oracle = _fold(433, ["+", "*"])
    x = td.placeholder("x", td.f32, (433,))
    y = td.compute("y", (433,), lambda i: definition(x, i))
    a = np.random.default_rng(1).uniform(-1, 1, 433).astype(np.float32)
    np.testing.assert_allclose(td.op([x], [y])(a)[0], oracle(a), rtol=1e-4, atol=1e-4)
