"""Random integer programs: hypothesis writes kernels, a Python interpreter of the same trees is the oracle.

Each example is one kernel. In each of three iterations of a loop over `i`, every thread
computes a random expression `v` of its thread index `t`, `i` and its inputs, publishes it
in shared memory, and after a barrier reads a neighbour's value `w` (through a random
permutation of the threads); then it adds several random expressions to its outputs.
Expressions mix i32, u32, i64 and u64 values (`a`, `b`: i32; `c`: u32; `d`: i64; `e`: u64)
and narrower ones (`f`: u8; `g`: i8; `h`: i16, which compute as i32), typed constants
(`u64(7)`, `u8(-9)`, `u16(-3)`) and plain literals, with `+ - * // % & | ^ << >> ~`, unary minus,
`abs`, `min`, `max`, casts, comparisons, `and`/`or`/`not` and conditional expressions.

The oracle is an interpreter of the typing rules the DSL reference states (C promotion,
unsigned wrapping, weak literals, exact comparisons, Python's floor division), on Python's
integers. An expression whose signed value leaves its type somewhere (undefined in C; the cpu
target does not wrap i32) is dropped from the example. This exercises the translator's typing,
the simplifier's range-based rewrites and its constant folding after unrolling, the cpu
backend's splitting of a block at barriers, and both code generators (the conftest also builds
each kernel's CUDA source with NVRTC).
"""
from __future__ import annotations

import numpy as np
from hypothesis import Phase, assume, given, settings
from hypothesis import strategies as st

import taskdsl as td

from .program_files import exchange_kernel, expression_source

GPU_TWINS = True   # every example also runs as a @gpu twin on the cuda target (conftest.py)

THREADS, LOOP, EXPRESSIONS = 64, 3, 6
TYPES = {"i8": (8, True), "u8": (8, False), "i16": (16, True), "u16": (16, False), "i32": (32, True), "u32": (32, False),
         "i64": (64, True), "u64": (64, False)}
VARIABLES = {"t": "i32", "i": "i32", "a": "i32", "b": "i32", "w": "i32", "c": "u32", "d": "i64", "e": "u64",
             "f": "u8", "g": "i8", "h": "i16"}


# ------------------------------------------------------------------ trees
def expressions(names: list):
    """Random expression trees over the variables `names`, typed constants and plain literals."""
    constants = st.tuples(st.just("const"), st.integers(-9, 9), st.sampled_from([None, None, *TYPES]))
    leaves = st.sampled_from(names).map(lambda name: ("var", name)) | constants
    return st.recursive(leaves, _extend, max_leaves=8)


def _extend(children):
    nonzero = st.tuples(st.just("const"), st.integers(-9, 9).filter(bool), st.sampled_from([None, *TYPES]))
    divisor = nonzero | children.map(lambda e: ("bin", "+", ("bin", "%", e, ("const", 7, None)), ("const", 1, None)))
    masked = children.map(lambda e: ("bin", "&", e, ("const", 1023, None)))    # no signed overflow
    shift = st.integers(0, 5).map(lambda n: ("const", n, None))
    return st.one_of(
        st.tuples(st.just("bin"), st.sampled_from(["+", "-", "*", "&", "|", "^"]), children, children),
        st.tuples(st.just("bin"), st.sampled_from(["//", "%"]), children, divisor),
        st.tuples(st.just("bin"), st.just("<<"), masked, shift),
        st.tuples(st.just("bin"), st.just(">>"), children, shift),
        st.tuples(st.just("unary"), st.sampled_from(["-", "~", "abs"]), children),
        st.tuples(st.just("cast"), st.sampled_from(list(TYPES)), children),
        st.tuples(st.just("call"), st.sampled_from(["min", "max"]), children, children),
        st.tuples(st.just("select"), _conditions(children), children, children))


def _conditions(children):
    compare = st.tuples(st.just("compare"), st.sampled_from(["<", "<=", ">", ">=", "==", "!="]), children, children)
    return compare | st.tuples(st.just("not"), compare) | \
        st.tuples(st.just("logic"), st.sampled_from(["and", "or"]), compare, compare | st.tuples(st.just("not"), compare))


# ------------------------------------------------------------------ the oracle: the typing rules on Python ints
class Outside(Exception):
    """A signed value left its type: C leaves that undefined, so the expression cannot be checked."""


def wrap(value: int, dtype: str) -> int:
    """`value` converted to `dtype` as C converts it."""
    bits, signed = TYPES[dtype]
    value &= (1 << bits) - 1
    return value - (1 << bits) if signed and value >> (bits - 1) else value


def literal_type(value: int) -> str:
    for dtype in ("i32", "i64", "u64"):
        if wrap(value, dtype) == value:
            return dtype
    raise Outside(value)


def widen(dtype: str) -> str:
    """C's integer promotion: types narrower than 32 bits compute as i32."""
    return "i32" if TYPES[dtype][0] < 32 else dtype


def promote(x: str, y: str) -> str:
    return max(widen(x), widen(y), key=lambda d: (TYPES[d][0], not TYPES[d][1]))


def common(x: tuple, y: tuple) -> str:
    """The type two operands are computed in; a plain literal takes the other's type when it fits there."""
    types = [t for _, t in (x, y) if t is not None]
    for value, t in (x, y):
        if t is None and not (types and wrap(value, types[0]) == value):
            types.append(literal_type(value))
    return widen(types[0]) if len(types) == 1 else promote(*types)


def result(value: int, dtype: str) -> tuple:
    if TYPES[dtype][1] and wrap(value, dtype) != value:
        raise Outside(value)
    return wrap(value, dtype), dtype


ARITHMETIC = {"+": int.__add__, "-": int.__sub__, "*": int.__mul__, "//": int.__floordiv__, "%": int.__mod__,
              "&": int.__and__, "|": int.__or__, "^": int.__xor__, "<<": int.__lshift__, ">>": int.__rshift__}
COMPARE = {"<": int.__lt__, "<=": int.__le__, ">": int.__gt__, ">=": int.__ge__, "==": int.__eq__, "!=": int.__ne__}


def evaluate(tree, env: dict) -> tuple:
    """(value, type) of `tree`; the type of a plain literal, or of arithmetic on literals only, is None."""
    kind = tree[0]
    if kind == "var":
        return env[tree[1]], VARIABLES[tree[1]]
    if kind == "const":
        return (tree[1], None) if tree[2] is None else (wrap(tree[1], tree[2]), tree[2])
    if kind == "cast":
        return wrap(evaluate(tree[2], env)[0], tree[1]), tree[1]
    if kind == "unary":
        value, dtype = evaluate(tree[2], env)
        value = {"-": -value, "~": ~value, "abs": abs(value)}[tree[1]]
        return (value, None) if dtype is None else result(value, widen(dtype))
    if kind == "select":
        chosen, static = truth(tree[1], env)
        x, y = evaluate(tree[2], env), evaluate(tree[3], env)
        if static:
            return x if chosen else y
        dtype = common(x, y)
        return wrap((x if chosen else y)[0], dtype), dtype
    x, y = evaluate(tree[2], env), evaluate(tree[3], env)
    if kind == "call":
        pick = min if tree[1] == "min" else max
        if x[1] is None and y[1] is None:
            return pick(x[0], y[0]), None
        dtype = common(x, y)
        return pick(wrap(x[0], dtype), wrap(y[0], dtype)), dtype
    assert kind == "bin", kind
    if x[1] is None and y[1] is None:     # Python folds literal arithmetic while translating
        return ARITHMETIC[tree[1]](x[0], y[0]), None
    dtype = common(x, y)
    return result(ARITHMETIC[tree[1]](wrap(x[0], dtype), wrap(y[0], dtype)), dtype)


def truth(cond, env: dict) -> tuple:
    """(truth, decided while translating) of a condition tree; comparisons are exact."""
    if cond[0] == "compare":
        (x, tx), (y, ty) = evaluate(cond[2], env), evaluate(cond[3], env)
        return COMPARE[cond[1]](x, y), tx is None and ty is None
    if cond[0] == "not":
        value, static = truth(cond[1], env)
        return not value, static
    (first, first_static), (second, second_static) = truth(cond[2], env), truth(cond[3], env)
    decided = first if cond[1] == "or" else not first    # the first operand alone gives the answer
    if first_static and decided:
        return first, True
    return (first or second) if cond[1] == "or" else (first and second), first_static and second_static


# ------------------------------------------------------------------ trees as kernel source
def build_kernel(shared: tuple, trees: list, step: int, shift: int):
    """The kernel of the module docstring, written to a file (kernels need their source)."""
    n = THREADS
    params = (f"A: i32[{n}], B: i32[{n}], C: u32[{n}], D: i64[{n}], E: u64[{n}], "
              f"F: u8[{n}], G: i8[{n}], H: i16[{n}], OUT: u64[{len(trees)}, {n}]")
    stores = "\n".join(f"        OUT[{k}, t] += {expression_source(tree)}" for k, tree in enumerate(trees))
    return exchange_kernel("random_program", "i8, i16, i32, i64, u8, u16, u32, u64", params,
                           "a, b, c, d, e, f, g, h = A[t], B[t], C[t], D[t], E[t], F[t], G[t], H[t]", "i32",
                           shared, stores, step, shift, n, LOOP)


def expected(shared: tuple, trees: list, step: int, shift: int, inputs: dict) -> tuple[list, np.ndarray]:
    """The trees whose values stay defined, and what the kernel adds up for them (u64 outputs wrap)."""
    envs = [[{"t": t, "i": i, **{name: int(x[t]) for name, x in inputs.items()}} for t in range(THREADS)]
            for i in range(LOOP)]
    for i, threads in enumerate(envs):
        published = [wrap(evaluate(shared, env)[0], "i32") for env in threads]   # s is an i32 array
        for t, env in enumerate(threads):
            env["w"] = published[(t * step + i + shift) % THREADS]
    kept, sums = [], []
    for tree in trees:
        try:
            sums.append([wrap(sum(evaluate(tree, envs[i][t])[0] for i in range(LOOP)), "u64") for t in range(THREADS)])
            kept.append(tree)
        except Outside:
            continue
    return kept, np.array(sums, np.uint64).reshape(len(kept), THREADS)


def _inputs(rng) -> dict:
    edges = {"c": [0, 1, 2**32 - 1, 2**31], "d": [0, -1, 2**40, -2**40], "e": [0, 1, 2**64 - 1, 2**63],
             "f": [0, 255, 128], "g": [-128, 127, -1], "h": [-32768, 32767, -1]}
    inputs = {"a": rng.integers(-60, 61, THREADS), "b": rng.integers(-60, 61, THREADS),
              "c": rng.integers(0, 2**32, THREADS), "d": rng.integers(-2**20, 2**20, THREADS),
              "e": rng.integers(0, 2**63, THREADS, dtype=np.uint64) * np.uint64(2) + np.uint64(1),
              "f": rng.integers(0, 256, THREADS), "g": rng.integers(-128, 128, THREADS),
              "h": rng.integers(-32768, 32768, THREADS)}
    for name, values in edges.items():
        inputs[name][:len(values)] = values
    dtypes = {"a": np.int32, "b": np.int32, "c": np.uint32, "d": np.int64, "e": np.uint64, "f": np.uint8,
              "g": np.int8, "h": np.int16}
    return {name: x.astype(dtypes[name]) for name, x in inputs.items()}


# No shrinking: a failure already names the wrong expression and prints its kernel, and shrinking a
# case means compiling a kernel per attempt (minutes of CI).
@settings(max_examples=12, deadline=None, phases=[Phase.explicit, Phase.reuse, Phase.generate])
@given(shared=expressions(["t", "i", "a", "b", "c", "d", "e", "f", "g", "h"]),
       trees=st.lists(expressions(list(VARIABLES)), min_size=EXPRESSIONS, max_size=EXPRESSIONS),
       step=st.sampled_from([1, 3, 5, 63]), shift=st.integers(0, THREADS - 1), seed=st.integers(0, 2**16),
       fast=st.booleans())
def test_random_integer_programs_match_python(shared, trees, step, shift, seed, fast):
    td.fast_compile(fast)   # the optimized path unrolls the loop over `i`, so the simplifier folds more
    inputs = _inputs(np.random.default_rng(seed))
    try:
        trees, reference = expected(shared, trees, step, shift, inputs)
    except Outside:
        assume(False)
    assume(trees)
    kernel, text = build_kernel(shared, trees, step, shift)
    out = np.zeros((len(trees), THREADS), np.uint64)
    kernel(*inputs.values(), out)
    for k in range(len(trees)):
        wrong = np.flatnonzero(out[k] != reference[k])
        assert not wrong.size, (f"expression {k}: {expression_source(trees[k])}\nthread {wrong[0]} "
                                f"({', '.join(f'{n}={x[wrong[0]]}' for n, x in inputs.items())}): "
                                f"got {out[k, wrong[0]]}, expected {reference[k, wrong[0]]}\n{text}")
