"""Random integer programs: hypothesis writes kernels, a Python interpreter of the same trees is the oracle.

Each example is one kernel. In each of three iterations of a loop over `i`, every thread
computes a random expression `v` of its thread index `t`, `i` and two input values `a`, `b`,
publishes it in shared memory, and after a barrier reads a neighbour's value `w` (through a
random permutation of the threads); then it adds several random expressions of
`t, i, a, b, w` to its outputs. Expressions use `+ - * // % & | ^ << >> ~`, unary minus,
`abs`, `min`, `max`, comparisons, `and`/`or`/`not` and conditional expressions.

The oracle evaluates the trees with Python's integers, whose semantics the DSL reference
promises (floor division, remainder with the divisor's sign); examples whose values leave
the i32 range, where the targets may differ by design, are discarded. This exercises the
simplifier's range-based rewrites, constant folding after unrolling, the cpu backend's
splitting of a block at barriers, and both code generators (the conftest also builds each
kernel's CUDA source with NVRTC).
"""
from __future__ import annotations

import importlib.util
import itertools
import tempfile
from pathlib import Path

import numpy as np
from hypothesis import assume, given, settings
from hypothesis import strategies as st

import taskdsl as td

GPU_TWINS = True   # every example also runs as a @gpu twin on the cuda target (conftest.py)

THREADS, LOOP, EXPRESSIONS = 64, 3, 6
I32 = 2**31 - 1
_counter = itertools.count()
_SCRATCH = tempfile.TemporaryDirectory(prefix="taskdsl_random_programs_")   # removed at exit

# ------------------------------------------------------------------ trees and their oracle
NONZERO = st.integers(-9, 9).filter(bool).map(lambda v: ("const", v))


def expressions(names: list):
    """Random expression trees over the variables `names` and small constants."""
    leaves = st.sampled_from(names).map(lambda name: ("var", name)) | st.integers(-9, 9).map(lambda v: ("const", v))
    return st.recursive(leaves, _extend, max_leaves=8)


def _extend(children):
    divisor = NONZERO | children.map(lambda e: ("bin", "+", ("bin", "%", e, ("const", 7)), ("const", 1)))
    return st.one_of(
        st.tuples(st.just("bin"), st.sampled_from(["+", "-", "*", "&", "|", "^"]), children, children),
        st.tuples(st.just("bin"), st.sampled_from(["//", "%"]), children, divisor),
        st.tuples(st.just("shift"), st.sampled_from(["<<", ">>"]), children, st.integers(0, 5)),
        st.tuples(st.just("unary"), st.sampled_from(["-", "~", "abs"]), children),
        st.tuples(st.just("call"), st.sampled_from(["min", "max"]), children, children),
        st.tuples(st.just("select"), _conditions(children), children, children))


def _conditions(children):
    compare = st.tuples(st.just("compare"), st.sampled_from(["<", "<=", ">", ">=", "==", "!="]), children, children)
    return compare | st.tuples(st.just("not"), compare) | \
        st.tuples(st.just("logic"), st.sampled_from(["and", "or"]), compare, compare | st.tuples(st.just("not"), compare))


def _floor_div(a, b):
    return a // b


OPS = {"+": int.__add__, "-": int.__sub__, "*": int.__mul__, "//": _floor_div, "%": int.__mod__,
       "&": int.__and__, "|": int.__or__, "^": int.__xor__, "<": int.__lt__, "<=": int.__le__,
       ">": int.__gt__, ">=": int.__ge__, "==": int.__eq__, "!=": int.__ne__}


def evaluate(tree, env: dict) -> int:
    """Python's value of `tree`; ValueError when a value leaves the i32 range."""
    kind = tree[0]
    if kind == "var":
        value = env[tree[1]]
    elif kind == "const":
        value = tree[1]
    elif kind == "bin":
        value = OPS[tree[1]](evaluate(tree[2], env), evaluate(tree[3], env))
    elif kind == "shift":
        left = evaluate(tree[2], env)
        value = (left & 1023) << tree[3] if tree[1] == "<<" else left >> tree[3]
    elif kind == "unary":
        operand = evaluate(tree[2], env)
        value = {"-": -operand, "~": ~operand, "abs": abs(operand)}[tree[1]]
    elif kind == "call":
        value = (min if tree[1] == "min" else max)(evaluate(tree[2], env), evaluate(tree[3], env))
    elif kind == "select":
        value = evaluate(tree[2], env) if truth(tree[1], env) else evaluate(tree[3], env)
    else:
        raise AssertionError(kind)
    if not -I32 - 1 <= value <= I32:
        raise ValueError("outside i32")
    return value


def truth(cond, env: dict) -> bool:
    """Python's truth of a condition tree (short-circuit, as in the kernel)."""
    if cond[0] == "compare":
        return OPS[cond[1]](evaluate(cond[2], env), evaluate(cond[3], env))
    if cond[0] == "not":
        return not truth(cond[1], env)
    if cond[1] == "and":
        return truth(cond[2], env) and truth(cond[3], env)
    return truth(cond[2], env) or truth(cond[3], env)


# ------------------------------------------------------------------ trees as kernel source
def source(tree) -> str:
    """The tree as a fully parenthesized DSL expression."""
    kind = tree[0]
    if kind == "var":
        return tree[1]
    if kind == "const":
        return f"({tree[1]})"
    if kind == "bin":
        return f"({source(tree[2])} {tree[1]} {source(tree[3])})"
    if kind == "shift":
        left = f"({source(tree[2])} & 1023)" if tree[1] == "<<" else source(tree[2])
        return f"({left} {tree[1]} {tree[3]})"
    if kind == "unary":
        return f"abs({source(tree[2])})" if tree[1] == "abs" else f"({tree[1]}{source(tree[2])})"
    if kind == "call":
        return f"{tree[1]}({source(tree[2])}, {source(tree[3])})"
    if kind == "select":
        return f"({source(tree[2])} if {condition_source(tree[1])} else {source(tree[3])})"
    raise AssertionError(kind)


def condition_source(cond) -> str:
    if cond[0] == "compare":
        return f"({source(cond[2])} {cond[1]} {source(cond[3])})"
    if cond[0] == "not":
        return f"(not {condition_source(cond[1])})"
    return f"({condition_source(cond[2])} {cond[1]} {condition_source(cond[3])})"


def build_kernel(shared: tuple, trees: list, step: int, shift: int):
    """The kernel of the module docstring, written to a file (kernels need their source)."""
    body = "\n".join(f"        OUT[{k}, t] += {source(tree)}" for k, tree in enumerate(trees))
    text = (f"import taskdsl as td\nfrom taskdsl import i32, threadIdx\n\n\n"
            f"@td.kernel(grid=1, block={THREADS})\n"
            f"def random_program(A: i32[{THREADS}], B: i32[{THREADS}], OUT: i32[{len(trees)}, {THREADS}]):\n"
            f"    s = td.shared(i32, ({THREADS},))\n"
            f"    t = threadIdx.x\n    a = A[t]\n    b = B[t]\n"
            f"    for i in range({LOOP}):\n"
            f"        s[t] = {source(shared)}\n"
            f"        td.syncthreads()\n"
            f"        w = s[(t * {step} + i + {shift}) % {THREADS}]\n"
            f"        td.syncthreads()\n{body}\n")
    path = Path(_SCRATCH.name) / f"random_program_{next(_counter)}.py"
    path.write_text(text)
    spec = importlib.util.spec_from_file_location(path.stem, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.random_program, text


def expected(shared: tuple, trees: list, step: int, shift: int, a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """What the kernel must compute, by `evaluate` (raises ValueError outside the i32 range)."""
    out = np.zeros((len(trees), THREADS), np.int64)
    for i in range(LOOP):
        envs = [{"t": t, "i": i, "a": int(a[t]), "b": int(b[t])} for t in range(THREADS)]
        published = [evaluate(shared, env) for env in envs]
        for t, env in enumerate(envs):
            env["w"] = published[(t * step + i + shift) % THREADS]
            for k, tree in enumerate(trees):
                out[k, t] += evaluate(tree, env)
    return out


@settings(max_examples=16, deadline=None)
@given(shared=expressions(["t", "i", "a", "b"]),
       trees=st.lists(expressions(["t", "i", "a", "b", "w"]), min_size=EXPRESSIONS, max_size=EXPRESSIONS),
       step=st.sampled_from([1, 3, 5, 63]), shift=st.integers(0, THREADS - 1), seed=st.integers(0, 2**16),
       fast=st.booleans())
def test_random_integer_programs_match_python(shared, trees, step, shift, seed, fast):
    td.fast_compile(fast)   # the optimized path unrolls the loop over `i`, so the simplifier folds more
    rng = np.random.default_rng(seed)
    a = rng.integers(-60, 61, THREADS).astype(np.int32)
    b = rng.integers(-60, 61, THREADS).astype(np.int32)
    try:
        reference = expected(shared, trees, step, shift, a, b)
    except ValueError:
        assume(False)
    assume(np.abs(reference).max() <= I32)
    kernel, text = build_kernel(shared, trees, step, shift)
    out = np.zeros((len(trees), THREADS), np.int32)
    kernel(a, b, out)
    for k in range(len(trees)):
        wrong = np.flatnonzero(out[k] != reference[k])
        assert not wrong.size, (f"expression {k}: {source(trees[k])}\nthread {wrong[0]} (a={a[wrong[0]]}, "
                                f"b={b[wrong[0]]}): got {out[k, wrong[0]]}, expected {reference[k, wrong[0]]}\n{text}")
