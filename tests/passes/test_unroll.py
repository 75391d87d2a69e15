"""unroll_loops: constant loops that index register tiles (or are written td.unroll) become copies of their
body, within bounds on the code it may produce."""
from hypothesis import given, settings, strategies as st

from taskdsl import ir
from taskdsl.ir import types as T
from taskdsl.passes import unroll_loops
from taskdsl.passes.unroll import MAX_BRANCHES, MAX_COPIES, MAX_NODES, MAX_TILE

from .ir_eval import run


def _loop(trips: int, body_of, scope: str = "register", size: int | None = None, unroll: bool = False):
    """A kernel storing body_of(i) to out[i] for i in range(trips); `out` a register buffer (of `size`
    elements, default `trips`) allocated by the kernel, or a parameter (scope 'global')."""
    out = ir.Buffer("out", T.i32, (ir.const(size or max(trips, 1)),), scope)
    i = ir.Var("i", T.i32, kind="loop")
    loop = ir.For(i, ir.const(0), ir.const(trips), ir.const(1), body_of(i, out), unroll=unroll)
    if scope == "global":
        return ir.Function("k", (out,), (), loop, (1, 1, 1))
    return ir.Function("k", (), (), ir.seq([ir.Allocate(out), loop]), (1, 1, 1))


def _loops(fn: ir.Function) -> list:
    return ir.collect(fn.body, ir.For, expressions=False)


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
    assert not _loops(unrolled)
    assert _stores(unrolled) == _stores(fn) == [("out", (t,), sum(t * k for k in range(1, terms + 1)))
                                               for t in range(trips)]


def test_only_loops_that_index_register_tiles_unroll():
    """A loop over global memory, or over a register buffer too big to be a tile, stays a loop (LLVM
    vectorizes it as one) unless written td.unroll; one whose variable reaches a tile's index through
    a variable the body assigns unrolls."""
    def store(i, out):
        return ir.Store(out, (i,), i * 2)

    assert _loops(unroll_loops(_loop(8, store, scope="global")))
    assert not _loops(unroll_loops(_loop(8, store, scope="global", unroll=True)))
    assert _loops(unroll_loops(_loop(8, store, size=MAX_TILE + 1)))
    assert not _loops(unroll_loops(_loop(8, store, size=MAX_TILE)))

    def through_a_variable(i, out):
        j = ir.Var("j", T.i32)
        return ir.seq([ir.Assign(j, i + 1), ir.Store(out, (j - 1,), j)])

    fn = _loop(8, through_a_variable)
    assert not _loops(unroll_loops(fn)) and _stores(unroll_loops(fn)) == _stores(fn)


def test_too_many_statements_stay_a_loop():
    fn = _loop(MAX_COPIES + 1, lambda i, out: ir.Store(out, (i,), i))
    assert _loops(unroll_loops(fn))


def test_too_many_branches_stay_a_loop():
    fn = _loop(MAX_BRANCHES + 1, lambda i, out: ir.If(ir.binary("<", i, ir.const(3)), ir.Store(out, (i,), i)))
    assert _loops(unroll_loops(fn))


def test_loops_of_async_copies_and_tensor_core_instructions_count_them_as_branches():
    """unroll_loops runs before the cpu target emulates cp_async, ldmatrix and mma, whose emulations are loops, an
    `if` and warp exchanges: each counts as a branch (a 16-step k loop of ldmatrix and mma, unrolled, took 64 s to
    compile instead of 5)."""
    src = ir.Buffer("src", T.f16, (ir.const(64),))
    smem = ir.Buffer("smem", T.f16, (ir.const(64),), "shared")
    frag = ir.Buffer("frag", T.f16, (ir.const(8),), "register")
    c = ir.Buffer("c", T.f32, (ir.const(4),), "register")
    instructions = {
        "cp_async": lambda i: ir.CpAsync(ir.Ref(smem, (i * 4,)), ir.Ref(src, (i * 4,)), 4, ir.const(True)),
        "ldmatrix": lambda i: ir.LdMatrix(ir.Ref(frag, ()), ir.Ref(smem, (i * 4,)), 1, False),
        "mma": lambda i: ir.Mma(ir.Ref(frag, ()), ir.Ref(frag, ()), ir.Ref(c, ())),
    }
    for name, instruction in instructions.items():
        def body(i, out, instruction=instruction):
            return ir.seq([ir.Store(out, (i,), i), instruction(i)])     # the store indexes a register tile

        assert not _loops(unroll_loops(_loop(MAX_BRANCHES, body))), name
        assert _loops(unroll_loops(_loop(MAX_BRANCHES + 1, body))), name


def test_big_expressions_stay_a_loop():
    """Few statements, but each a large expression: copies of it would make numba's compile slow."""
    trips = 8
    terms = MAX_NODES // trips // 4 + 8
    fn = _loop(trips, lambda i, out: ir.Store(out, (i,), _chain(i, terms)))
    assert trips * len(ir.collect(_loops(fn)[0].body, ir.Expr)) > MAX_NODES
    unrolled = unroll_loops(fn)
    assert _loops(unrolled)
    assert _stores(unrolled) == _stores(fn)


def test_cuda_marks_the_loops_that_index_register_tiles():
    """mark_tile_loops (CUDA): a constant loop reaching a register tile's index is marked `unroll`, within
    MAX_MARKED statements; a loop over a global buffer, or one that would grow too big, is not."""
    from taskdsl.passes.unroll import MAX_MARKED, mark_tile_loops
    store = lambda i, out: ir.Store(out, (i,), i)      # noqa: E731
    assert all(f.unroll for f in _loops(mark_tile_loops(_loop(8, store))))
    assert not any(f.unroll for f in _loops(mark_tile_loops(_loop(8, store, scope="global"))))
    assert not any(f.unroll for f in _loops(mark_tile_loops(_loop(MAX_MARKED + 1, store, size=8))))
