"""generalize: kernels that differ only in integer constants become one kernel over size symbols, and each
member's values give that member back exactly (oracle: the member's own IR, spelled out by structural_text, and
its stores evaluated)."""
from hypothesis import example, given, settings, strategies as st

from taskdsl import ir
from taskdsl.ir import types as T
from taskdsl.passes import bind_sizes, flatten_buffers, simplify
from taskdsl.passes.generalize import generalize

from .ir_eval import run


def _scaled(n: int, m: int, *, local: int = 4, trips: int = 2, offset: int = 3,
            wide: bool = False) -> ir.Function:
    """out[i] = i * m + offset for i < n (A, of n elements, unread), then `trips` unrolled stores to a register buffer of `local`
    elements; A of 2^31 elements where `wide`."""
    a = ir.Buffer("A", T.i32, (ir.const(2 ** 31 if wide else n),))
    out = ir.Buffer("out", T.i32, (ir.const(n),))
    regs = ir.Buffer("regs", T.i32, (ir.const(local),), "register")
    i, j = ir.Var("i", T.i32, kind="loop"), ir.Var("j", T.i32, kind="loop")
    scale = ir.For(i, ir.const(0), ir.const(n), ir.const(1),
                   ir.Store(out, (i,), i * ir.const(m) + ir.const(offset)))
    fill = ir.For(j, ir.const(0), ir.const(trips), ir.const(1), ir.Store(regs, (j,), j), unroll=True)
    return ir.Function("k", (a, out), (), ir.seq([ir.Allocate(regs), scale, fill]), (1, 1, 1))


def _stores(fn: ir.Function, sizes: dict) -> list:
    trace: list = []
    run(fn.body, {v.uid: sizes[v.name] for v in fn.sizes}, (0, 0, 0), trace)
    return trace


@settings(max_examples=40, deadline=None)
@given(st.lists(st.tuples(st.integers(1, 9), st.integers(0, 7)), min_size=1, max_size=5))
@example([(2, 4), (3, 0)]).via("m's column is n's squared")
@example([(1, 1), (4, 2)]).via("n's column is m's squared")
def test_members_share_one_function_that_gives_each_back(shapes):
    """One column of values may be the other's squared: then it is the other's symbol times itself, which folds
    back to its values."""
    functions = [_scaled(n, m) for n, m in shapes]
    forms = generalize(functions)
    for fn, (shared, sizes) in zip(functions, forms):
        assert ir.structural_text(simplify(bind_sizes(shared, sizes))) == ir.structural_text(simplify(fn))
        assert _stores(shared, sizes) == _stores(fn, {})
    ns, ms = (tuple(column) for column in zip(*shapes))
    differing = {column for column in (ns, ms) if len(set(column)) > 1}
    squared = len(differing) == 2 and (all(n * n == m for n, m in shapes) or all(m * m == n for n, m in shapes))
    symbols = len(differing) - squared      # n's and m's columns: one symbol where equal, or m's is n's squared
    assert len({id(shared) for shared, _ in forms}) == (1 if symbols else len(functions))
    assert all(len(shared.sizes) == symbols for shared, _ in forms)


def _split_in_three(h: int, w: int) -> ir.Function:
    """out[(p // (h*w), p // w % h, p % w)] = p for p < 2*h*w: a batch of images' pixels stored by (image, row,
    column) from their flat index, as a fused convolution's epilogue stores them."""
    out = ir.Buffer("out", T.i32, (ir.const(2), ir.const(h), ir.const(w)))
    p = ir.Var("p", T.i32, kind="loop")
    index = (p // ir.const(h * w), p // ir.const(w) % ir.const(h), p % ir.const(w))
    return ir.Function("k", (out,), (), ir.For(p, ir.const(0), ir.const(2 * h * w), ir.const(1),
                                               ir.Store(out, index, p)), (1, 1, 1))


def test_a_constant_that_is_the_product_of_two_others_stays_their_product():
    """h * w lifted as a symbol of its own would hide that it is h's times w's, and the flattened index of
    (p // (h*w), p // w % h, p % w) would keep its divisions (MobileNet-V2 at batch 8: 3.7x slower); as the
    product of their symbols, it joins back to p."""
    shapes = ((3, 5), (4, 4), (2, 7))
    forms = generalize([_split_in_three(h, w) for h, w in shapes])
    shared = forms[0][0]
    assert all(form is shared for form, _ in forms)
    for (h, w), (_, sizes) in zip(shapes, forms):     # h, w and the loop's 2*h*w (2 is no symbol); h*w is none
        assert sorted(sizes.values()) == sorted([h, w, 2 * h * w])
    flat = simplify(flatten_buffers(shared))
    assert not [b for b in ir.collect(flat.body, ir.Binary) if b.op in ("//", "%")]
    for (h, w), (_, sizes) in zip(shapes, forms):
        assert _stores(shared, sizes) == _stores(_split_in_three(h, w), {})


def test_a_constant_at_two_places_with_the_same_values_is_one_symbol():
    """n is out's size and the loop's bound: one symbol, so a pass may see the loop covers out."""
    (shared, sizes), _ = generalize([_scaled(5, 2), _scaled(7, 2)])
    loop = ir.collect(shared.body, ir.For, expressions=False)[0]
    assert sizes == {"lifted_0": 5} and loop.stop is shared.params[1].shape[0] is shared.sizes[0]


def test_constants_that_passes_and_code_generators_need_keep_kernels_apart():
    """A register buffer's size, an unrolled loop's bound, a negative constant, an i32-wide tensor's shape: the
    kernels come back as they are (and alike ones still share)."""
    for apart in ({"local": 8}, {"trips": 3}, {"offset": -3}, {"wide": True}):
        first, second = _scaled(5, 2, **({"offset": -1} if "offset" in apart else {})), _scaled(6, 2, **apart)
        assert generalize([first, second]) == [(first, {}), (second, {})]
    same = [_scaled(5, 2, local=8), _scaled(6, 2, local=8)]
    assert [sizes for _, sizes in generalize(same)] == [{"lifted_0": 5}, {"lifted_0": 6}]


def _strided(step: int) -> ir.Function:
    """out[i] = i for every `step`-th i < 12."""
    out = ir.Buffer("out", T.i32, (ir.const(12),))
    i = ir.Var("i", T.i32, kind="loop")
    return ir.Function("k", (out,), (), ir.For(i, ir.const(0), ir.const(12), ir.const(step), ir.Store(out, (i,), i)),
                       (1, 1, 1))


def test_loops_of_other_steps_keep_kernels_apart():
    """A loop's step stays a number: `simplify` reads it (the loop's direction, its trip count), and failed on a
    lifted one."""
    first, second = _strided(2), _strided(3)
    assert generalize([first, second]) == [(first, {}), (second, {})]


def test_equal_functions_and_unspellable_ones_come_back_as_they_are():
    functions = [_scaled(5, 2), _scaled(5, 2)]
    assert generalize(functions) == [(fn, {}) for fn in functions]
