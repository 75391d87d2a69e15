"""Random float programs: hypothesis writes kernels, numpy evaluating the same trees by the DSL's rules is the oracle.

Each example is one kernel, shaped like the integer one (test_random_programs.py): in each of three
iterations of a loop over `i`, every thread computes a random expression, publishes it in a shared
array (f32, f64, f16, bf16, f8e4m3 or f8e5m2) and after a barrier reads a neighbour's value `w`; then it stores
several random expressions. The expressions mix f32, f64, f16, bf16, f8e4m3 and f8e5m2 values (`x`, `y`, `p`, `q`,
`e`, `m`) with i32 and
i64 ones (`t`, `i`, `a`, `d`), typed constants and plain literals, with `+ - * / // %`, unary minus,
`abs`, `min`, `max`, `floor`, `ceil`, `sqrt`, `fma`, casts, comparisons and conditional
expressions. Inputs include NaN, infinities, signed zeros, subnormals and values near each type's
limits.

The oracle applies the typing rules the DSL reference states (C promotion, weak literals, 16- and 8-bit
floats computed in f32, the 8-bit ones saturating, int/float comparisons in the float type) with numpy's IEEE
arithmetic per element (ml_dtypes' conversions). Results must be equal bit for bit (NaN matches NaN; the sign of
a zero is not compared, since max/min of -0.0 and 0.0 may give either, and an element computed from such a zero is
not checked). An element is not checked where C leaves its value open: signed integer overflow, and a product that
rounds (both targets may fuse `a * b + c` into one rounding). A float converted to an integer it does not fit is
checked: taskdsl saturates it (NaN gives 0), where C leaves it undefined.
"""
from __future__ import annotations

import functools
import operator
from fractions import Fraction

import ml_dtypes
import numpy as np
from hypothesis import Phase, assume, given, settings
from hypothesis import strategies as st

import taskdsl as td

from .host_twin import unspecified
from .program_files import exchange_kernel, expression_source

GPU_TWINS = True   # every example also runs as a @gpu twin on the cuda target (conftest.py)

THREADS, LOOP, EXPRESSIONS = 32, 3, 6
NUMPY = {"f16": np.dtype(np.float16), "bf16": np.dtype(ml_dtypes.bfloat16), "f8e4m3": np.dtype(ml_dtypes.float8_e4m3fn),
         "f8e5m2": np.dtype(ml_dtypes.float8_e5m2), "f32": np.dtype(np.float32), "f64": np.dtype(np.float64),
         "i32": np.dtype(np.int32), "i64": np.dtype(np.int64)}
BITS = {"f16": 16, "bf16": 16, "f8e4m3": 8, "f8e5m2": 8, "f32": 32, "f64": 64, "i32": 32, "i64": 64}
VARIABLES = {"x": "f32", "y": "f64", "p": "f16", "q": "bf16", "e": "f8e4m3", "m": "f8e5m2", "w": "f32", "t": "i32",
             "i": "i32", "a": "i32", "d": "i64"}
LITERALS = [0.0, -0.0, 0.5, -1.5, 3.0, 0.1, 1e30, 1e-30, 65504.0, 3.4e38, 0, 1, -7, 2, 3]


# ------------------------------------------------------------------ trees
def expressions(names: list):
    """Random expression trees over the variables `names`, typed constants and plain literals."""
    constants = st.tuples(st.just("const"), st.sampled_from(LITERALS), st.sampled_from([None, None, *NUMPY]))
    leaves = st.sampled_from(names).map(lambda name: ("var", name)) | constants
    return st.recursive(leaves, _extend, max_leaves=7)


def _extend(children):
    compare = st.tuples(st.just("compare"), st.sampled_from(["<", "<=", ">", ">=", "==", "!="]), children, children)
    return st.one_of(
        st.tuples(st.just("bin"), st.sampled_from(["+", "-", "*", "/", "//", "%"]), children, children),
        st.tuples(st.just("unary"), st.sampled_from(["-", "abs"]), children),
        st.tuples(st.just("call"), st.sampled_from(["floor", "ceil", "rint", "sqrt"]), children),
        st.tuples(st.just("call"), st.sampled_from(["min", "max"]), children, children),
        st.tuples(st.just("call"), st.just("fma"), children, children, children),
        st.tuples(st.just("cast"), st.sampled_from(list(NUMPY)), children),
        st.tuples(st.just("select"), compare | st.tuples(st.just("not"), compare), children, children))


# ------------------------------------------------------------------ the oracle
class Uncompilable(Exception):
    """Literal arithmetic that Python itself rejects while the kernel is translated (1.0 // 0)."""


class Value:
    """A tree's value: per-thread numpy array of `dtype` and where it is undefined, or a plain literal (dtype None);
    `const`: a typed constant, which the translator converts while translating."""

    def __init__(self, value, dtype: str | None, bad=False, const=False):
        self.value, self.dtype, self.bad, self.const = value, dtype, bad, const


def is_float(dtype: str) -> bool:
    return dtype[0] in "fb"


def narrow(dtype: str) -> bool:
    """A storage format computed in f32 (the 16- and 8-bit floats)."""
    return is_float(dtype) and BITS[dtype] < 32


def promote(a: str, b: str) -> str:
    """The DSL's arithmetic type of two typed operands (the reference's C rules)."""
    if is_float(a) or is_float(b):
        if is_float(a) and is_float(b) and a != b:
            return "f32" if narrow(a) and narrow(b) else max(a, b, key=BITS.get)
        return a if is_float(a) else b
    return max(a, b, key=BITS.get)


def literal_type(value, like: str | None) -> str:
    """The type a plain literal takes next to an operand of type `like` (weak literals)."""
    if like is not None and (is_float(like) or isinstance(value, int)):
        if not is_float(like) and not -2**(BITS[like] - 1) <= value < 2**(BITS[like] - 1):
            return "i32" if -2**31 <= value < 2**31 else "i64"
        return "f32" if narrow(like) else like
    if isinstance(value, float):
        return "f32"
    return "i32" if -2**31 <= value < 2**31 else "i64"


def convert(v: Value, dtype: str) -> Value:
    """`v` as a `dtype` value (a conversion, or a literal becoming a constant)."""
    if v.dtype == dtype:
        return v
    source = np.asarray(v.value, np.float64 if v.dtype is None and isinstance(v.value, float) else
                        np.int64 if v.dtype is None else NUMPY[v.dtype])
    if v.dtype in ("bf16", "f8e4m3", "f8e5m2"):
        source = source.astype(np.float32)      # exactly: numpy sees ml_dtypes' types as no float kind
    with np.errstate(all="ignore"):
        if dtype == "bf16":
            result = Value(to_bf16(source), dtype, v.bad | (np.abs(source) > 2**53 if source.dtype.kind == "i" else False))
        elif BITS[dtype] == 8:
            result = Value(to_float8(source, dtype), dtype, v.bad)
        elif is_float(dtype):
            result = Value(source.astype(NUMPY[dtype]), dtype, v.bad)
        elif source.dtype.kind == "f":
            if (v.dtype is None or v.const) and not np.isfinite(source).all():
                raise Uncompilable(f"{v.value} as {dtype}")       # the translator refuses i32(inf)
            # saturating, NaN giving 0 (the DSL reference; PTX's cvt.rzi), where C leaves it undefined
            lo, hi = -2.0**(BITS[dtype] - 1), 2.0**(BITS[dtype] - 1)
            low, high = np.iinfo(NUMPY[dtype]).min, np.iinfo(NUMPY[dtype]).max
            inside = np.where((source >= lo) & (source < hi), np.trunc(source), 0).astype(NUMPY[dtype])
            saturated = np.where(source < lo, low, np.where(source >= hi, high, inside))
            result = Value(saturated.astype(NUMPY[dtype]), dtype, v.bad)
        else:
            result = Value(source.astype(NUMPY[dtype]), dtype, v.bad)
    result.const = v.dtype is None or v.const
    return result


def to_bf16(source):
    """`source` rounded once to bf16. ml_dtypes rounds an f64 to f32 first (twice: 1 + 2**-8 + 2**-30 would
    give 1.0); rounding to f32 *to odd* first keeps the one rounding exact (f32 has 16 more bits)."""
    return rounded_to_odd_f32(source.astype(np.float64)).astype(ml_dtypes.bfloat16)


def to_float8(source, dtype: str):
    """`source` rounded once to an 8-bit float, saturated to its largest finite value (infinities too; NaN stays)."""
    largest = float(ml_dtypes.finfo(NUMPY[dtype]).max)
    return rounded_to_odd_f32(np.clip(source.astype(np.float64), -largest, largest)).astype(NUMPY[dtype])


def rounded_to_odd_f32(wide):
    """f64 values as f32 rounded to odd: rounding those to a float of 16 or fewer bits rounds as from `wide`."""
    nearest = wide.astype(np.float32)
    toward_zero = np.where(np.abs(nearest.astype(np.float64)) > np.abs(wide), np.nextafter(nearest, np.float32(0)), nearest)
    inexact = (toward_zero.astype(np.float64) != wide) & np.isfinite(wide)
    return (toward_zero.view(np.uint32) | inexact.astype(np.uint32)).view(np.float32)


def typed_pair(x: Value, y: Value) -> tuple[Value, Value]:
    """Both operands typed: a literal takes its partner's type (f32 next to a 16-bit float)."""
    if x.dtype is None:
        x = convert(x, literal_type(x.value, y.dtype))
    if y.dtype is None:
        y = convert(y, literal_type(y.value, x.dtype))
    return x, y


def literal_op(op: str, a, b):
    """Python's arithmetic on two plain literals, done while the kernel is translated."""
    try:
        return {"+": a + b, "-": a - b, "*": a * b} [op] if op in "+-*" else \
            {"/": lambda: a / b, "//": lambda: a // b, "%": lambda: a % b}[op]()
    except (ZeroDivisionError, OverflowError) as error:
        raise Uncompilable(str(error)) from None


def arithmetic(op: str, x: Value, y: Value) -> Value:
    if x.dtype is None and y.dtype is None:
        return Value(literal_op(op, x.value, y.value), None)
    x, y = typed_pair(x, y)
    dtype = promote(x.dtype, y.dtype)
    if (op == "/" and not is_float(dtype)) or narrow(dtype):
        dtype = "f32"
    x, y = convert(x, dtype), convert(y, dtype)
    a, b, bad = x.value, y.value, x.bad | y.bad
    if not is_float(dtype):
        exact = {"+": a.astype(object) + b, "-": a.astype(object) - b, "*": a.astype(object) * b,
                 "//": np.floor_divide(a.astype(object), np.where(b == 0, 1, b).astype(object)),
                 "%": np.mod(a.astype(object), np.where(b == 0, 1, b).astype(object))}[op]
        exact = np.asarray(exact, dtype=object)     # 0-d operands give a Python int: np.where would overflow int64
        lo, hi = -2**(BITS[dtype] - 1), 2**(BITS[dtype] - 1)
        bad = bad | (exact < lo) | (exact >= hi) | ((b == 0) if op in ("//", "%") else False)
        return Value(np.where(bad, 0, exact).astype(NUMPY[dtype]), dtype, bad)
    function = {"+": np.add, "-": np.subtract, "*": np.multiply, "/": np.true_divide, "//": np.floor_divide,
                "%": np.mod}[op]
    with np.errstate(all="ignore"):
        result = function(a, b)
    if op == "*":
        bad = bad | rounded_products(a, b, result)
    return Value(result, dtype, bad)


def rounded_products(a, b, product):
    """Where `a * b` was rounded (or overflowed): a fused multiply-add would give another value."""
    a, b, product = np.broadcast_arrays(a, b, product)
    out = np.zeros(product.shape, bool)
    for k in np.ndindex(out.shape):
        p, u, v = float(product[k]), float(a[k]), float(b[k])
        if all(np.isfinite([p, u, v])):
            out[k] = Fraction(u) * Fraction(v) != Fraction(p)
        else:
            out[k] = np.isfinite(u) and np.isfinite(v)    # overflow
    return out


def compare(cond, env) -> Value:
    """A condition tree's truth per thread (a plain bool when decided while translating)."""
    if cond[0] == "not":
        inner = compare(cond[1], env)
        return Value(not inner.value if inner.dtype is None else ~inner.value, inner.dtype, inner.bad)
    x, y = evaluate(cond[2], env), evaluate(cond[3], env)
    function = {"<": operator.lt, "<=": operator.le, ">": operator.gt, ">=": operator.ge, "==": operator.eq,
                "!=": operator.ne}[cond[1]]
    if x.dtype is None and y.dtype is None:      # Python compares while translating (exactly, int with float)
        return Value(function(x.value, y.value), None)
    x, y = typed_pair(x, y)
    if is_float(x.dtype) or is_float(y.dtype):
        dtype = promote(x.dtype, y.dtype)
        dtype = "f32" if narrow(dtype) else dtype
        x, y = convert(x, dtype), convert(y, dtype)
    return Value(function(x.value, y.value), "bool", x.bad | y.bad)


def math_call(name: str, args: list) -> Value:
    if all(a.dtype is None for a in args):      # compile-time arguments: evaluated in f64 while translating
        return Value(host_math(name, [a.value for a in args]), None)
    typed = [a.dtype for a in args if a.dtype is not None]
    dtype = typed[0]
    for t in typed[1:]:
        dtype = promote(dtype, t)
    for a in args:
        if a.dtype is None and isinstance(a.value, int) and not is_float(dtype) and literal_type(a.value, dtype) != dtype:
            dtype = promote(dtype, literal_type(a.value, None))
    if any(a.dtype is None and isinstance(a.value, float) for a in args) and not is_float(dtype):
        dtype = "f32"
    if (name not in ("max", "min") and not is_float(dtype)) or narrow(dtype):
        dtype = "f32"
    args = [convert(a if a.dtype is not None else convert(a, literal_type(a.value, dtype)), dtype) for a in args]
    values, bad = [a.value for a in args], functools.reduce(operator.or_, [a.bad for a in args])
    with np.errstate(all="ignore"):
        if name == "fma":
            product = np.multiply(values[0], values[1])
            return Value(product + values[2], dtype, bad | rounded_products(values[0], values[1], product))
        function = {"floor": np.floor, "ceil": np.ceil, "rint": np.rint, "sqrt": np.sqrt, "max": np.maximum,
                    "min": np.minimum}[name]
        result = function(*values)
        if name in ("max", "min") and is_float(dtype):     # IEEE's: -0.0 below 0.0 (numpy's gives the second zero)
            a, b = values
            zeros = (a + b if name == "max" else -(-a - b))   # of two zeros: 0.0 unless both are -0.0, for max
            result = np.where((a == 0) & (b == 0), zeros, result).astype(result.dtype)
        return Value(result, dtype, bad)


def host_math(name: str, args: list):
    """A math function of plain numbers, as the DSL evaluates it while translating: IEEE f64 results;
    max/min return one operand (a NaN if either is one, -0.0 below 0.0)."""
    if name in ("max", "min"):
        nan = [a for a in args if a != a]
        a, b = args
        if not nan and a == 0 and b == 0:
            return (a + b) if name == "max" else -(-a - b)
        return nan[0] if nan else (max if name == "max" else min)(*args)
    x = [np.float64(a) for a in args]
    with np.errstate(all="ignore"):
        return float({"floor": np.floor, "ceil": np.ceil, "rint": np.rint, "sqrt": np.sqrt}[name](*x) if name != "fma"
                     else x[0] * x[1] + x[2])


def evaluate(tree, env: dict) -> Value:
    kind = tree[0]
    if kind == "var":
        name = tree[1]
        return Value(env[name], env.get("type " + name, VARIABLES[name]), env.get("bad " + name, False))
    if kind == "const":
        literal = Value(tree[1], None)
        return literal if tree[2] is None else convert(literal, tree[2])
    if kind == "cast":
        return convert(evaluate(tree[2], env), tree[1])
    if kind == "unary":
        v = evaluate(tree[2], env)
        if v.dtype is None:
            return Value(-v.value if tree[1] == "-" else abs(v.value), None)
        return negate_or_abs(tree[1], v)
    if kind == "select":
        cond = compare(tree[1], env)
        x, y = evaluate(tree[2], env), evaluate(tree[3], env)
        if cond.dtype is None:
            return x if cond.value else y
        if x.dtype is None and y.dtype is None:
            x = convert(x, literal_type(x.value, None))
        x, y = typed_pair(x, y)
        dtype = promote(x.dtype, y.dtype) if x.dtype != y.dtype else x.dtype
        x, y = convert(x, dtype), convert(y, dtype)
        return Value(np.where(cond.value, x.value, y.value), dtype,
                     cond.bad | np.where(cond.value, x.bad, y.bad))
    if kind == "call":
        return math_call(tree[1], [evaluate(a, env) for a in tree[2:]])
    return arithmetic(tree[1], evaluate(tree[2], env), evaluate(tree[3], env))


def negate_or_abs(op: str, v: Value) -> Value:
    """-v or abs(v) of a typed value: 16- and 8-bit floats in f32; an integer's minimum overflows."""
    v = convert(v, "f32") if narrow(v.dtype) else v
    overflow = v.value == np.iinfo(v.value.dtype).min if not is_float(v.dtype) else False
    return Value(np.negative(v.value) if op == "-" else np.abs(v.value), v.dtype, v.bad | overflow)


# ------------------------------------------------------------------ trees as kernel source
def build_kernel(shared: tuple, trees: list, step: int, shift: int, shared_type: str):
    """The kernel of the module docstring, written to a file (kernels need their source)."""
    n = THREADS
    params = (f"X: f32[{n}], Y: f64[{n}], P: f16[{n}], Q: bf16[{n}], E: f8e4m3[{n}], M: f8e5m2[{n}], A: i32[{n}], "
              f"D: i64[{n}], OUT: f64[{LOOP}, {len(trees)}, {n}]")
    stores = "\n".join(f"        OUT[i, {k}, t] = {expression_source(tree)}" for k, tree in enumerate(trees))
    return exchange_kernel("random_float_program", "bf16, f8e4m3, f8e5m2, f16, f32, f64, i32, i64", params,
                           "x, y, p, q, e, m, a, d = X[t], Y[t], P[t], Q[t], E[t], M[t], A[t], D[t]", shared_type,
                           shared, stores, step, shift, n, LOOP)


def expected(shared: tuple, trees: list, step: int, shift: int, shared_type: str,
             inputs: dict) -> tuple[list, np.ndarray, np.ndarray]:
    """The trees that compile, what the kernel stores for them and where that is undefined."""
    threads = np.arange(THREADS, dtype=np.int32)
    values, bad = [], []
    kept = []
    envs = []
    for i in range(LOOP):
        env = {"t": threads, "i": np.full(THREADS, i, np.int32), **inputs}
        published = convert(evaluate(shared, env), shared_type)
        source_lane = (threads * step + i + shift) % THREADS
        env["w"] = np.broadcast_to(published.value, (THREADS,))[source_lane]
        env["bad w"] = np.broadcast_to(published.bad, (THREADS,))[source_lane]
        env["type w"] = shared_type
        envs.append(env)
    for tree in trees:
        try:
            results = [convert(evaluate(tree, env), "f64") for env in envs]
        except Uncompilable:
            continue
        kept.append(tree)
        values.append([np.broadcast_to(r.value, (THREADS,)) for r in results])
        bad.append([np.broadcast_to(r.bad, (THREADS,)) for r in results])
    shape = (len(kept), LOOP, THREADS)
    return kept, np.array(values, np.float64).reshape(shape).swapaxes(0, 1), np.array(bad, bool).reshape(shape).swapaxes(0, 1)


def _inputs(rng) -> dict:
    special = [np.nan, np.inf, -np.inf, -0.0, 0.0, 1e-40, 3.4e38, -1e30, 0.1, 2.5, -2.5, 16777217.0]
    x = np.concatenate([special, rng.standard_normal(10) * 10, rng.integers(-8, 9, THREADS) / 2])[:THREADS]
    # 1 + 2**-11 + 2**-40 and 1 + 2**-8 + 2**-30 round up to f16 and bf16, but to ties (then down) through f32
    y = np.concatenate([[1e300, -np.inf, np.nan, 2.0**53 + 1, 5e-324, -0.0, 0.1, 1 + 2**-11 + 2**-40,
                         -(1 + 2**-8 + 2**-30)],
                        rng.standard_normal(THREADS) * 100])[:THREADS]
    p = np.concatenate([[65504.0, -0.0, np.inf, 6e-8, np.nan, 0.1], rng.standard_normal(THREADS) * 4])[:THREADS]
    q = np.concatenate([[3e38, -0.0, -np.inf, 1e-39, np.nan, 0.1], rng.standard_normal(THREADS) * 4])[:THREADS]
    e = np.concatenate([[448.0, -0.0, np.nan, 2.0 ** -9, -240.0, 0.1], rng.standard_normal(THREADS) * 8])[:THREADS]
    m = np.concatenate([[57344.0, -0.0, np.inf, 2.0 ** -16, np.nan, -0.1], rng.standard_normal(THREADS) * 8])[:THREADS]
    a = np.concatenate([[0, -1, 2**31 - 1, -2**31, 16777217, 2**24 + 2**16 + 1], rng.integers(-1000, 1000, THREADS)])[:THREADS]
    d = np.concatenate([[0, -1, 2**53 + 1, -2**62, 2**40], rng.integers(-2**20, 2**20, THREADS)])[:THREADS]
    with np.errstate(all="ignore"):
        return {"x": x.astype(np.float32), "y": y.astype(np.float64), "p": p.astype(np.float16),
                "q": q.astype(ml_dtypes.bfloat16), "e": e.astype(ml_dtypes.float8_e4m3fn),
                "m": m.astype(ml_dtypes.float8_e5m2), "a": a.astype(np.int32), "d": d.astype(np.int64)}


def same(got, want):
    """Equal values, NaN matching NaN (the sign of a zero is not compared)."""
    return (got == want) | (np.isnan(got) & np.isnan(want))


# No shrinking: a failure already names the wrong expression and prints its kernel.
@settings(max_examples=10, deadline=None, phases=[Phase.explicit, Phase.reuse, Phase.generate])
@given(shared=expressions(["t", "i", "x", "y", "p", "q", "e", "m", "a", "d"]),
       trees=st.lists(expressions(list(VARIABLES)), min_size=EXPRESSIONS, max_size=EXPRESSIONS),
       step=st.sampled_from([1, 3, 5, 31]), shift=st.integers(0, THREADS - 1), seed=st.integers(0, 2**16),
       shared_type=st.sampled_from(["f32", "f32", "f64", "f16", "bf16", "f8e4m3", "f8e5m2"]), fast=st.booleans())
def test_random_float_programs_match_numpy(shared, trees, step, shift, seed, shared_type, fast):
    td.fast_compile(fast)   # the optimized path unrolls the loop over `i`, so the simplifier folds more
    inputs = _inputs(np.random.default_rng(seed))
    try:
        trees, reference, undefined = expected(shared, trees, step, shift, shared_type, inputs)
    except Uncompilable:
        assume(False)
    assume(trees)
    kernel, text = build_kernel(shared, trees, step, shift, shared_type)
    out = np.full((LOOP, len(trees), THREADS), 12345.0)
    with unspecified(8, undefined):     # where C leaves a value open, the CUDA source's host twin may differ
        kernel(*(inputs[name] for name in "xypqemad"), out)
    wrong = np.argwhere(~same(out, reference) & ~undefined)
    if wrong.size:
        i, k, t = wrong[0]
        values = ", ".join(f"{n}={v[t]!r}" for n, v in inputs.items())
        raise AssertionError(f"expression {k}: {expression_source(trees[k])}\niteration {i}, thread {t} ({values}): "
                             f"got {out[i, k, t]!r}, expected {reference[i, k, t]!r}\n{text}")


def test_the_oracle_marks_an_overflowing_product_of_two_constants_undefined():
    """Two typed constants are 0-d values, whose exact product is a Python int: one past i64's range is undefined
    (0 in the array), not an OverflowError in the oracle (seed 3405 of the host twins)."""
    big = Value(np.array(2**62, np.int64), "i64", const=True)
    product = arithmetic("*", big, big)
    assert product.bad and product.value == 0 and product.value.dtype == np.int64
