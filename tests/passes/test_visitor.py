"""Walkers of statements only (`statements_only = True`): they meet every statement a full walk meets, in the
same order, rewrite them to the same tree, and refuse at class creation a handler of expressions, which they
would never call."""
import pytest
from hypothesis import given, settings, strategies as st

from taskdsl import ir
from taskdsl.ir import types as T
from taskdsl.ir.structure import structural_text

X = ir.Var("x", T.i32)
OUT = ir.Buffer("out", T.i32, (ir.const(64),), "global")


def _expressions():
    leaves = st.sampled_from([X, ir.const(1), ir.const(3), ir.Load(OUT, (ir.const(2),))])
    return st.recursive(leaves, lambda e: st.builds(lambda op, a, b: ir.binary(op, a, b),
                                                    st.sampled_from("+-*"), e, e), max_leaves=6)


def _statements():
    e = _expressions()
    leaves = st.one_of(st.builds(lambda v: ir.Assign(X, v), e),
                       st.builds(lambda i, v: ir.Store(OUT, (i,), v), e, e),
                       st.just(ir.SyncThreads()))

    def extend(s):
        loop_var = ir.Var("i", T.i32, kind="loop")
        return st.one_of(st.lists(s, max_size=3).map(lambda xs: ir.Seq(tuple(xs))),
                         st.builds(lambda c, t, f: ir.If(ir.binary("<", c, ir.const(5)), t, f), e, s,
                                   st.none() | s),
                         st.builds(lambda n, b: ir.For(loop_var, ir.const(0), n, ir.const(1), b), e, s))
    return st.recursive(leaves, extend, max_leaves=12)


class _Seen(ir.Visitor):
    def __init__(self):
        self.seen = []
        self.expressions = 0      # expression nodes visited

    def visit(self, node):
        self.expressions += isinstance(node, ir.Expr)
        return super().visit(node)

    def visit_Assign(self, s):
        self.seen.append(s)
        self.generic_visit(s)

    def visit_Store(self, s):
        self.seen.append(s)
        self.generic_visit(s)

    def visit_SyncThreads(self, s):
        self.seen.append(s)
        self.generic_visit(s)


class _SeenStatementsOnly(_Seen):
    statements_only = True


class _Barriers(ir.Rewriter):
    """Each barrier becomes two; each loop runs its body twice in a row."""

    def visit_SyncThreads(self, s):
        return ir.Seq((s, ir.SyncThreads()))

    def visit_For(self, s):
        body = self.visit(s.body)
        return ir.For(s.var, s.start, s.stop, s.step, ir.Seq((body, body)))


class _BarriersStatementsOnly(_Barriers):
    statements_only = True


@settings(max_examples=60, deadline=None)
@given(_statements())
def test_a_walk_of_statements_only_meets_the_statements_a_full_walk_meets(tree):
    full, short = _Seen(), _SeenStatementsOnly()
    full.visit(tree)
    short.visit(tree)
    assert [id(s) for s in short.seen] == [id(s) for s in full.seen]
    assert short.expressions == 0 and full.expressions == len(ir.collect(tree, ir.Expr))
    assert len(short.seen) == len([s for s in ir.collect(tree, ir.Stmt, expressions=False)
                                   if isinstance(s, (ir.Assign, ir.Store, ir.SyncThreads))])


@settings(max_examples=60, deadline=None)
@given(_statements())
def test_a_rewrite_of_statements_only_builds_the_tree_a_full_rewrite_builds(tree):
    assert structural_text(_BarriersStatementsOnly().visit(tree)) == structural_text(_Barriers().visit(tree))


def test_a_walker_of_statements_only_refuses_handlers_of_expressions():
    with pytest.raises(TypeError, match="visit_Load would never be called"):
        class _Loads(ir.Visitor):
            statements_only = True

            def visit_Load(self, e):
                pass
    with pytest.raises(TypeError, match="visit_Var"):
        class _Vars(_Barriers):
            statements_only = True

            def visit_Var(self, v):
                return v
