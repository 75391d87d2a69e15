"""Replace `for i, j in m(w)` loops by plain loops and index arithmetic.

For a composition of atoms a_1 * ... * a_k (outermost first), atom a_t sees worker
w_t = (w // n_{t+1..k}) % n_t; spatial(d) gives the task unravel(w_t, d), repeat(d) a
loop nest over d (unrolled), a custom mapping the tasks its function returns on the
symbolic w_t. Coordinates combine as in the paper's f1 * f2: t = t_outer * d_inner + t_inner.
The loop variables are replaced by their coordinate expressions, which lets simplify turn
`i % 4` of `i = (w // 16) * 4 + r` into `r`. A worker index that may exceed the mapping's workers is guarded by `if w < n`.
A worker that reads memory, calls, or reads a variable the body assigns is first stored in a variable of its
own: `m(w)` is evaluated once, before the loop, as in Python.
"""
from __future__ import annotations

import dataclasses
import math

from .. import ir
from ..errors import DSLError
from ..ir import types as T
from ..mapping import RepeatMapping, SpatialMapping, unravel
from .bounds import int_range


def expand_mappings(fn: ir.Function) -> ir.Function:
    """`fn` with every ForMapping lowered to For loops and Assigns of the task coordinates."""
    return dataclasses.replace(fn, body=_Expander(fn.block).visit(fn.body))


class _Expander(ir.Rewriter):
    statements_only = True

    def __init__(self, block: tuple):
        self.block = block

    def visit_ForMapping(self, s: ir.ForMapping) -> ir.Stmt:
        body = self.visit(s.body)
        bound = int_range(s.worker, self.block, {})
        given = s.worker
        held = None if _stable(given, body) else ir.Var("worker", given.dtype)
        if held is not None:
            s = dataclasses.replace(s, worker=held)
        atoms = s.mapping.atoms()
        for atom in atoms:
            if not isinstance(atom, (SpatialMapping, RepeatMapping)):
                _check_custom(atom, s.loc)
        workers_after = [math.prod(a.num_workers for a in atoms[t + 1:]) for t in range(len(atoms))]
        expanded = self._emit(s, atoms, workers_after, 0, None, body)
        if bound is not None and bound[1] < s.mapping.num_workers - 1:
            raise DSLError(f"the mapping has {s.mapping.num_workers} workers, but its worker index reaches "
                           f"{bound[1]} at most (block {tuple(self.block)}): the tasks of workers {bound[1] + 1} to "
                           f"{s.mapping.num_workers - 1} would never run", s.loc,
                           "Match the mapping to the threads: fewer workers (a repeat() for the rest), or a larger "
                           "block.")
        tests = [] if bound is not None and bound[0] >= 0 else [ir.binary(">=", s.worker, 0)]    # others' tasks
        if bound is None or bound[1] >= s.mapping.num_workers:
            tests.append(ir.binary("<", s.worker, s.mapping.num_workers))
        if tests:
            expanded = ir.If(tests[0] if len(tests) == 1 else ir.binary("and", *tests), expanded, None, s.loc)
        return expanded if held is None else ir.seq([ir.Assign(held, given, s.loc), expanded])

    def _emit(self, s: ir.ForMapping, atoms, workers_after, t, coords, body) -> ir.Stmt:
        if t == len(atoms):  # the loop variables are read-only, so their uses take the coordinates
            return ir.substitute(body, {v.uid: ir.as_expr(c, T.i32) for v, c in zip(s.vars, coords)})
        atom = atoms[t]
        worker = s.worker if workers_after[t] == 1 else s.worker // workers_after[t]
        if atom.num_workers == 1:       # (the only worker: a custom function may use it)
            worker = 0
        elif t > 0:
            worker = worker % atom.num_workers

        def combine(task):
            if coords is None:
                return tuple(task)
            return tuple(c * d + x for c, d, x in zip(coords, atom.task_shape, task))

        if isinstance(atom, SpatialMapping):
            return self._emit(s, atoms, workers_after, t + 1, combine(unravel(worker, atom.dims, atom.ranks)), body)
        if isinstance(atom, RepeatMapping):
            loop_vars = [ir.Var(f"{s.vars[d].name}_r{t}", T.i32, kind="loop") if n > 1 else 0
                         for d, n in enumerate(atom.dims)]
            inner = self._emit(s, atoms, workers_after, t + 1, combine(loop_vars), body)
            for d in sorted(range(len(atom.dims)), key=lambda i: atom.ranks[i], reverse=True):
                if atom.dims[d] > 1:  # the rank-0 dimension ends up outermost
                    inner = ir.For(loop_vars[d], ir.const(0), ir.const(atom.dims[d]), ir.const(1), inner, True, s.loc)
            return inner
        try:
            with ir.elementwise_equality():
                tasks = atom.worker_to_tasks(worker)
        except Exception as exc:  # noqa: BLE001 - the user's mapping function, run on the worker's IR
            raise DSLError(f"the custom task mapping {atom!r} failed on the worker index: {type(exc).__name__}: "
                           f"{exc}", s.loc, "A custom mapping run in a kernel may only do arithmetic (+ - * // %) "
                           "on the worker, no comparisons in 'if' or min/max.") from None
        return ir.seq([self._emit(s, atoms, workers_after, t + 1, combine(tuple(task)), body) for task in tasks])


def _stable(worker: ir.Expr, body: ir.Stmt) -> bool:
    """Whether `worker` has one value wherever `body` uses the coordinates made of it: it reads no memory, calls
    nothing (an atomic would run at each use) and reads no variable that `body` assigns."""
    if ir.collect(worker, (ir.Load, ir.Call, ir.Atomic)):
        return False
    assigned = {a.var.uid for a in ir.collect(body, ir.Assign, expressions=False)}
    return not any(v.uid in assigned for v in ir.collect(worker, ir.Var))


def _check_custom(atom, loc) -> None:
    """Run custom mapping `atom` on each of its workers in Python: its tasks must be what `atom(w)` accepts
    (tuples of its rank, inside its task shape), which the symbolic run in the kernel cannot check."""
    for w in range(atom.num_workers):
        try:
            atom(w)
        except Exception as exc:  # noqa: BLE001 - the user's mapping function
            raise DSLError(f"the custom task mapping {atom!r} is not valid: {type(exc).__name__}: {exc}", loc,
                           "Return a list of int tuples of the task shape's rank, each inside the task shape, "
                           "for every worker.") from None
