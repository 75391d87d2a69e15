"""Outlining (the cpu target): the body of a `@td.func(outline=True)` call becomes a function of its own.

numba compiles each kernel module on its own, and everything a kernel inlines is typed, lowered and optimized
again in every kernel that inlines it (a large unrolled body shared by kernels that differ in their fused epilogues
costs each of them its compile). Outlined, the body is compiled once, in a module of its own, and each kernel calls
it through its address (`backend.cpu.codegen`, as the launcher calls kernels): worth it where a call's work is
microseconds (a call passes about sixty words).

A body is outlined where it is a function of its arguments alone:

- it assigns no variable the rest of the kernel reads or assigns (its results go to memory);
- its register buffers are its own: each becomes the function's (allocated in its frame, on the stack);
- the kernel's block has one thread (the threads of a block run as a loop on the cpu, their variables in
  per-thread arrays the function could not see).

Everything else it reads comes in as a parameter: the buffers (the kernel's tensors, shared buffers) as arrays,
the variables and index registers as scalars, and the extents of the buffers as scalars too, so that kernels of
other shapes (and of other shared buffer sizes: the cpu matmul's block width) share the function (the frontend
passes an outlined call's number arguments as runtime values for the same reason). Anywhere the rules do not
hold, the body is inlined, as it is on CUDA and in debug mode (`inline_outlined`).
"""
from __future__ import annotations

import dataclasses

from .. import ir
from ..ir.visitor import field_names
from .uniformity import BLOCK_MAX, WARP_FUNCS


def inline_outlined(fn: ir.Function) -> ir.Function:
    """`fn` with every outlined body a plain part of the kernel."""
    body = _Replace({}).visit(fn.body)
    return fn if body is fn.body else dataclasses.replace(fn, body=body)


def outline(fn: ir.Function) -> ir.Function:
    """`fn` (a kernel lowered for the cpu target, before its buffers are flattened) with each outlinable body
    replaced by an `ir.CallOutlined` of one of its `outlined` functions, and the others inlined."""
    regions = _regions(fn.body)
    if fn.num_threads != 1 or not regions:
        return inline_outlined(fn)
    functions, calls, owned = [], {}, set()
    for region in regions:
        found = _outlined(fn, region, len(functions))
        if found is not None:
            function, call, own = found
            functions.append(function)
            calls[id(region)] = call
            owned |= own
    body = _DropAllocations(owned).visit(_Replace(calls).visit(fn.body))
    return dataclasses.replace(fn, body=body, outlined=tuple(functions))


def _regions(node) -> list:
    """The outlined bodies in `node`, outermost only (one nested in another goes with it)."""
    if isinstance(node, ir.Outlined):
        return [node]
    found = []
    for name in field_names(type(node)):
        value = getattr(node, name)
        for x in (value if type(value) is tuple else (value,)):
            if isinstance(x, ir.Stmt):
                found += _regions(x)
    return found


# block-level and warp-level statements: their meaning is the block's threads together (and an async copy's
# completion is waited for elsewhere), so a body holding one stays in the kernel
_BLOCK_LEVEL = (ir.SyncThreads, ir.SyncWarp, ir.CpAsync, ir.CpAsyncCommit, ir.CpAsyncWait, ir.Mma, ir.LdMatrix)


def _outlined(fn: ir.Function, region: ir.Outlined, index: int):
    """(the function, the call replacing `region`, the register buffers it takes from the kernel) where `region`
    can be outlined, else None."""
    inner = _Replace({}).visit(ir.Seq(region.stmts, region.loc))
    if ir.collect(inner, _BLOCK_LEVEL, expressions=False) or \
            any(c.func in WARP_FUNCS or c.func == BLOCK_MAX for c in ir.collect(inner, ir.Call)):
        return None
    assigned = {s.var.uid for s in ir.collect(inner, (ir.Assign, ir.For), expressions=False)}
    outside = _Replace({id(region): ir.Seq(())}).visit(fn.body)
    seen_outside = {v.uid for v in ir.collect(outside, ir.Var)} | \
        {s.var.uid for s in ir.collect(outside, (ir.Assign, ir.For), expressions=False)}
    if assigned & seen_outside:
        return None
    allocations = {a.buffer.uid: a for a in ir.collect(fn.body, ir.Allocate, expressions=False)}
    used = ir.named_buffers(inner)
    own = {uid for uid in used if uid in allocations and allocations[uid].buffer.scope == "register"}
    if own & ir.referenced_buffers(_DropAllocations(own).visit(outside)):
        return None
    buffers = {uid: b for uid, b in used.items() if uid not in own}
    free = {}
    for x in ir.collect(inner, (ir.Var, ir.SpecialReg)):
        key = x.uid if isinstance(x, ir.Var) else (x.name, x.axis)
        if (not isinstance(x, ir.Var) or x.uid not in assigned) and key not in free:
            free[key] = x
    # a buffer's extents come in as numbers too: one function serves every shape (the graph fixes a fused kernel's
    # shapes in its IR, a template its shared buffers', and the body's indexing would otherwise spell them out)
    params, args, dims = {}, [], []
    for uid, b in buffers.items():      # (global and shared: the register buffers it uses are its own)
        extents = [ir.Var(f"{b.name}_d{axis}", ir.as_expr(d).dtype, "param") for axis, d in enumerate(b.shape)]
        params[uid] = dataclasses.replace(b, scope="global", shape=tuple(extents))
        args.append(b)
        dims += zip(extents, b.shape)
    scalars = {key: ir.Var(_param_name(x), x.dtype, "param") for key, x in free.items()}
    body = _Parameters(params, scalars).visit(inner)
    body = ir.seq([*(allocations[uid] for uid in sorted(own)), body])
    function = ir.Function(region.name, (*params.values(), *scalars.values(), *(v for v, _ in dims)), (), body,
                           (1, 1, 1), fn.source_file)
    call = ir.CallOutlined(index, (*args, *free.values(), *(ir.as_expr(d) for _, d in dims)), region.loc)
    return function, call, own


def _param_name(x) -> str:
    return x.name if isinstance(x, ir.Var) else f"{x.name}_{x.axis}"


class _DropAllocations(ir.Rewriter):
    statements_only = True

    def __init__(self, uids: set):
        self.uids = uids

    def visit_Allocate(self, s: ir.Allocate):
        return ir.Seq(()) if s.buffer.uid in self.uids else s


class _Replace(ir.Rewriter):
    """Replaces the outlined bodies whose id is a key of `calls` by the value, and inlines the others."""

    statements_only = True

    def __init__(self, calls: dict):
        self.calls = calls

    def visit_Outlined(self, s: ir.Outlined):
        found = self.calls.get(id(s))
        return found if found is not None else ir.Seq(tuple(self.visit(x) for x in s.stmts), s.loc)


class _Parameters(ir.Rewriter):
    """The outlined body reading its parameters: buffers by uid, variables by uid and index registers by name."""

    def __init__(self, buffers: dict, scalars: dict):
        self.buffers, self.scalars = buffers, scalars

    def visit_buffer(self, b: ir.Buffer) -> ir.Buffer:
        return self.buffers.get(b.uid, b)

    def visit_Var(self, v: ir.Var):
        return self.scalars.get(v.uid, v)

    def visit_SpecialReg(self, r: ir.SpecialReg):
        return self.scalars.get((r.name, r.axis), r)
