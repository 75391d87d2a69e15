"""simplify: constant folding and the identities index arithmetic needs."""
from hypothesis import given, settings, strategies as st

from taskdsl import ir, threadIdx
from taskdsl.ir import types as T
from taskdsl.passes import simplify

from .ir_eval import evaluate


def _simplified(e, block=(256, 1, 1)):
    x = ir.Buffer("x", T.f32, (ir.const(1),))
    fn = ir.Function("k", (x,), (), ir.Store(x, (ir.const(0),), ir.Cast(e, T.f32)), block)
    return simplify(fn).body.value.value if isinstance(simplify(fn).body.value, ir.Cast) else simplify(fn).body.value


def test_folds_constants_with_python_floor_semantics():
    e = ir.binary("//", ir.const(-7), ir.const(2))
    assert _simplified(e).value == -4
    assert _simplified(ir.binary("%", ir.const(-7), ir.const(2))).value == 1


def test_range_based_removal_of_mod_and_div():
    tid = threadIdx.x
    assert _simplified(tid % 256) is tid
    assert _simplified(tid // 256).value == 0
    assert _simplified(tid % 128) is not tid


def test_unary_minus_is_kept():
    v = ir.Var("v", T.f32)
    e = _simplified(ir.Unary("-", v, T.f32))
    assert isinstance(e, ir.Unary) and e.a is v


@settings(max_examples=200, deadline=None)
@given(q=st.integers(-50, 50), r=st.integers(-50, 50), c=st.integers(1, 9), k=st.integers(1, 4),
       op=st.sampled_from(["%", "//"]))
def test_multiple_splitting_matches_python(q, r, c, k, op):
    qv, rv = ir.Var("q", T.i32), ir.Var("r", T.i32)
    e = ir.binary(op, qv * (c * k) + rv, ir.const(c))
    env = {qv.uid: q, rv.uid: r}
    expected = (q * c * k + r) // c if op == "//" else (q * c * k + r) % c
    assert evaluate(_simplified(e), env, (0, 0, 0)) == expected


@settings(max_examples=200, deadline=None)
@given(q=st.integers(-50, 50), r=st.integers(-50, 50), s=st.integers(-50, 50), c=st.sampled_from([2, 4, 8]),
       y=st.sampled_from([1, 2, 4]), op=st.sampled_from(["%", "//"]))
def test_multiples_inside_a_scaled_sum_split_too(q, r, s, c, y, op):
    """((q * c/y + r) * y + s) % c and // c: a task mapping's nested index, (q*c + r*y + s) underneath."""
    qv, rv, sv = ir.Var("q", T.i32), ir.Var("r", T.i32), ir.Var("s", T.i32)
    e = ir.binary(op, (qv * (c // y) + rv) * y + sv, ir.const(c))
    value = (q * (c // y) + r) * y + s
    assert evaluate(_simplified(e), {qv.uid: q, rv.uid: r, sv.uid: s}, (0, 0, 0)) == \
        (value // c if op == "//" else value % c)


def test_a_register_fragment_index_folds_to_its_repeat_index():
    """The SIMT matmul's fragment index i // 16 % 2 of i = ((t // 128 * 2 + r) * 4 + t % 32 // 8) * 4 + u,
    with r < 2 and u < 4 (unrolled loop variables), is r: a constant index once the loops are unrolled."""
    t, r, u = threadIdx.x, ir.Var("r", T.i32), ir.Var("u", T.i32)
    i = ((t // 128 * 2 + r) * 4 + t % 32 // 8) * 4 + u
    x = ir.Buffer("x", T.f32, (ir.const(1),))
    body = ir.For(r, ir.const(0), ir.const(2), ir.const(1), ir.For(u, ir.const(0), ir.const(4), ir.const(1),
                  ir.Store(x, (ir.const(0),), ir.Cast(i // 16 % 2, T.f32))))
    folded = simplify(ir.Function("k", (x,), (), body, (256, 1, 1))).body.body.body.value.value
    assert folded is r


@settings(max_examples=200, deadline=None)
@given(u=st.integers(-50, 50), x=st.integers(-500, 500), c=st.integers(1, 9), swap=st.booleans())
def test_row_major_index_of_a_split_dimension_joins_back(u, x, c, swap):
    """(u + x // c) * c + x % c == u * c + x with floor semantics, for negative x too: no division left."""
    uv, xv = ir.Var("u", T.i32), ir.Var("x", T.i32)
    inner = xv // c + uv if swap else uv + xv // c
    e = _simplified(inner * c + xv % c)
    assert not ir.collect(e, ir.Binary) or all(b.op not in ("//", "%") for b in ir.collect(e, ir.Binary))
    assert evaluate(e, {uv.uid: u, xv.uid: x}, (0, 0, 0)) == (u + x // c) * c + x % c
    assert _simplified((xv // c) * c + xv % c) is xv


@settings(max_examples=200, deadline=None)
@given(y=st.integers(-2000, 2000), b=st.integers(1, 12), c=st.integers(1, 12), sizes=st.booleans())
def test_an_index_split_in_three_joins_back(y, b, c, sizes):
    """((y // (b*c)) * c + (y // b) % c) * b + y % b, a batch's (image, row, column) of flat pixel y flattened
    again, is y: for constants b and c, and for size symbols with b * c their product (as `generalize` lifts
    them), negative y too (floor semantics)."""
    yv = ir.Var("y", T.i32)
    bv, cv = (ir.Var("b", T.i32, kind="size"), ir.Var("c", T.i32, kind="size")) if sizes else (ir.const(b),
                                                                                                ir.const(c))
    whole = bv * cv if sizes else ir.const(b * c)
    e = _simplified(((yv // whole) * cv + (yv // bv) % cv) * bv + yv % bv)
    assert e is yv
    assert ((y // (b * c)) * c + (y // b) % c) * b + y % b == y       # the identity itself, in Python


def test_an_index_split_by_values_of_any_sign_keeps_its_divisions():
    """Floor division composes for positive divisors only ((5 // -2) // -3 == 1, 5 // 6 == 0): b and c that are
    not sizes (loop variables, which may be negative) leave the index as it is; so do constants whose product
    is not the outer divisor."""
    yv, bv, cv = ir.Var("y", T.i32), ir.Var("b", T.i32), ir.Var("c", T.i32)
    e = _simplified(((yv // (bv * cv)) * cv + (yv // bv) % cv) * bv + yv % bv)
    assert e is not yv and [x for x in ir.collect(e, ir.Binary) if x.op == "//"]
    e = _simplified(((yv // 35) * 5 + (yv // 6) % 5) * 6 + yv % 6)
    assert e is not yv
    env = {yv.uid: 1234}
    assert evaluate(e, env, (0, 0, 0)) == ((1234 // 35) * 5 + (1234 // 6) % 5) * 6 + 1234 % 6


@settings(max_examples=200, deadline=None)
@given(a=st.integers(-20, 20), b=st.integers(-20, 20), func=st.sampled_from(["min", "max"]), t=st.integers(0, 255))
def test_integer_min_and_max_fold_when_ranges_decide_them(a, b, func, t):
    """min/max of constants fold; of threadIdx.x (0..255) and a constant, they fold when the range decides."""
    expected = {"min": min, "max": max}[func]
    assert _simplified(ir.Call(func, (ir.const(a), ir.const(b)), T.i32)).value == expected(a, b)
    e = _simplified(ir.Call(func, (threadIdx.x, ir.const(a * 20)), T.i32))
    assert evaluate(e, {}, (t, 0, 0)) == expected(t, a * 20)
    decided = a * 20 <= 0 or a * 20 >= 255
    assert isinstance(e, ir.Call) != decided


def test_unsigned_multiples_are_not_split_because_they_wrap():
    # (x * (2**63 - 1)) % 7 is not 0 for a u64 x: the product is taken modulo 2**64, no multiple of 7
    x = ir.Var("x", T.u64)
    e = ir.binary("%", ir.binary("*", x, ir.const(2**63 - 1, T.u64)), ir.const(7, T.u64))
    simplified = _simplified(e)
    assert isinstance(simplified, ir.Binary) and simplified.op == "%" and _is_product(simplified.a)
    signed = ir.Var("y", T.i64)      # signed arithmetic may not overflow, so there the split stands
    assert isinstance(_simplified(ir.binary("%", signed * (2**63 - 1), ir.const(7, T.i64))), ir.Const)


@settings(max_examples=200, deadline=None)
@given(c=st.integers(0, 300), k=st.integers(0, 300), func=st.sampled_from(["min", "max"]),
       dtype=st.sampled_from([T.u32, T.u64]), t=st.integers(0, 255))
def test_unsigned_min_and_max_see_the_wrap(c, k, func, dtype, t):
    """min(u32(t) - c, k): when t < c the difference wraps to a huge value, so the range decides nothing."""
    difference = ir.binary("-", ir.Cast(threadIdx.x, dtype), ir.const(c, dtype))
    e = _simplified(ir.Call(func, (difference, ir.const(k, dtype)), dtype))
    expected = {"min": min, "max": max}[func](dtype.wrap(t - c), dtype.wrap(k))
    assert evaluate(e, {}, (t, 0, 0)) == expected


def test_casts_keep_the_range_that_fits_the_new_type():
    tid = threadIdx.x
    kept = _simplified(ir.binary("%", ir.Cast(tid, T.u32), ir.const(256, T.u32)))
    assert isinstance(kept, ir.Cast) and kept.value is tid
    assert isinstance(_simplified(ir.binary("%", ir.Cast(tid, T.u8), ir.const(128, T.u8))), ir.Binary)
    shifted = ir.Cast(ir.binary("-", tid, ir.const(1)), T.u32)      # -1 becomes 4294967295
    assert isinstance(_simplified(ir.binary("//", shifted, ir.const(256, T.u32))), ir.Binary)


def _is_product(e) -> bool:
    return isinstance(e, ir.Binary) and e.op == "*"
