"""Kernels that tests write as text: each is saved to a file and imported (a kernel needs its source).

The random-program tests draw expressions as tuple trees and print them with `expression_source`:
("var", name), ("const", value, dtype or None for a plain literal), ("cast", dtype, e), ("bin", op, a, b),
("unary", "-" | "~" | "abs", e), ("call", math function, args...), ("select", condition, a, b); a
condition is ("compare", op, a, b), ("not", condition) or ("logic", "and" | "or", c1, c2).
"""
from __future__ import annotations

import importlib.util
import itertools
import tempfile
from pathlib import Path

_counter = itertools.count()
_SCRATCH = tempfile.TemporaryDirectory(prefix="taskdsl_test_programs_")   # removed at exit


def load_program(text: str, stem: str):
    """The module whose source is `text`, from a fresh file named after `stem`."""
    path = Path(_SCRATCH.name) / f"{stem}_{next(_counter)}.py"
    path.write_text(text)
    spec = importlib.util.spec_from_file_location(path.stem, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def exchange_kernel(stem: str, imports: str, params: str, loads: str, shared_type: str, shared, stores: str,
                    step: int, shift: int, threads: int, loop: int):
    """(kernel, source) of the random-program tests' kernel: one block of `threads`; `loads` reads each
    thread's inputs, then `loop` times every thread publishes tree `shared` in a shared `shared_type` array,
    reads lane (t * step + i + shift) % threads's value as `w`, and runs `stores` (lines of the loop body)."""
    text = (f"import taskdsl as td\nfrom taskdsl import {imports}, threadIdx\n\n\n"
            f"@td.kernel(grid=1, block={threads})\n"
            f"def random_program({params}):\n"
            f"    s = td.shared({shared_type}, ({threads},))\n"
            f"    t = threadIdx.x\n    {loads}\n"
            f"    for i in range({loop}):\n"
            f"        s[t] = {expression_source(shared)}\n"
            f"        td.syncthreads()\n"
            f"        w = s[(t * {step} + i + {shift}) % {threads}]\n"
            f"        td.syncthreads()\n{stores}\n")
    return load_program(text, stem).random_program, text


def expression_source(tree) -> str:
    """An expression tree (see the module docstring) as a fully parenthesized DSL expression."""
    kind = tree[0]
    if kind == "var":
        return tree[1]
    if kind == "const":
        return f"({tree[1]!r})" if tree[2] is None else f"{tree[2]}({tree[1]!r})"
    if kind == "cast":
        return f"{tree[1]}({expression_source(tree[2])})"
    if kind == "bin":
        return f"({expression_source(tree[2])} {tree[1]} {expression_source(tree[3])})"
    if kind == "unary":
        operand = expression_source(tree[2])
        return f"abs({operand})" if tree[1] == "abs" else f"({tree[1]}{operand})"
    if kind == "call":
        return f"td.{tree[1]}({', '.join(expression_source(a) for a in tree[2:])})"
    if kind == "select":
        return f"({expression_source(tree[2])} if {condition_source(tree[1])} else {expression_source(tree[3])})"
    raise AssertionError(kind)


def condition_source(cond) -> str:
    """A condition tree as DSL source."""
    if cond[0] == "compare":
        return f"({expression_source(cond[2])} {cond[1]} {expression_source(cond[3])})"
    if cond[0] == "not":
        return f"(not {condition_source(cond[1])})"
    return f"({condition_source(cond[2])} {cond[1]} {condition_source(cond[3])})"
