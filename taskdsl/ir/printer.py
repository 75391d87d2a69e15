"""A readable, Python-like text form of IR functions, statements and expressions."""
from __future__ import annotations

from . import expr as E
from . import stmt as S
from .function import Function

_PRECEDENCE = {"or": 1, "and": 2, "<": 4, "<=": 4, ">": 4, ">=": 4, "==": 4, "!=": 4, "|": 5, "^": 6,
               "&": 7, "<<": 8, ">>": 8, "+": 9, "-": 9, "*": 10, "/": 10, "//": 10, "%": 10}


def expr_str(e, parent: int = 0) -> str:
    """The text of an expression, with only the parentheses precedence needs."""
    if isinstance(e, E.Const):
        return e.dtype.float_text(e.value) if e.dtype.is_float else repr(e.value)
    if isinstance(e, E.Var):
        return e.name
    if isinstance(e, E.SpecialReg):
        return f"{e.name}.{e.axis}"
    if isinstance(e, E.Binary):
        p = _PRECEDENCE[e.op]
        text = f"{expr_str(e.a, p)} {e.op} {expr_str(e.b, p + 1)}"
        return f"({text})" if p < parent else text
    if isinstance(e, E.Unary):
        op = "not " if e.op == "not" else e.op
        return f"{op}{expr_str(e.a, 11)}"
    if isinstance(e, E.Select):
        text = f"{expr_str(e.a, 1)} if {expr_str(e.cond, 1)} else {expr_str(e.b, 1)}"
        return f"({text})" if parent > 0 else text
    if isinstance(e, E.Cast):
        return f"{e.dtype.name}({expr_str(e.value)})"
    if isinstance(e, E.Call):
        return f"{e.func}({', '.join(expr_str(a) for a in e.args)})"
    if isinstance(e, E.Load):
        return f"{e.buffer.name}[{', '.join(expr_str(i) for i in e.indices)}]"
    if isinstance(e, E.Ref):   # the address of an element, or of the first element of a fragment
        return f"&{e.buffer.name}" + (f"[{', '.join(expr_str(i) for i in e.indices)}]" if e.indices else "")
    if isinstance(e, E.Atomic):
        idx = ", ".join(expr_str(i) for i in e.indices)
        return f"atomic_{e.op}({e.buffer.name}[{idx}], {expr_str(e.value)})"
    raise AssertionError(f"printer: unknown expression {type(e).__name__}")


def _lines(s, depth: int, out: list) -> None:
    pad = "    " * depth
    if isinstance(s, S.Outlined):
        out.append(f"{pad}outlined {s.name}:")
        for x in s.stmts:
            _lines(x, depth + 1, out)
    elif isinstance(s, S.Seq):
        for x in s.stmts:
            _lines(x, depth, out)
    elif isinstance(s, S.Assign):
        out.append(f"{pad}{s.var.name}: {s.var.dtype.name} = {expr_str(s.value)}")
    elif isinstance(s, S.Store):
        out.append(f"{pad}{expr_str(E.Load(s.buffer, s.indices))} = {expr_str(s.value)}")
    elif isinstance(s, S.Allocate):
        b = s.buffer
        out.append(f"{pad}{b.name} = {b.scope}({b.dtype.name}, [{', '.join(expr_str(d) for d in b.shape)}])")
    elif isinstance(s, S.For):
        rng = f"{expr_str(s.start)}, {expr_str(s.stop)}, {expr_str(s.step)}"
        out.append(f"{pad}for {s.var.name} in {'unroll' if s.unroll else 'range'}({rng}):")
        _lines(s.body, depth + 1, out)
    elif isinstance(s, S.ForMapping):
        names = ", ".join(v.name for v in s.vars)
        out.append(f"{pad}for {names} in ({s.mapping!r})({expr_str(s.worker)}):")
        _lines(s.body, depth + 1, out)
    elif isinstance(s, S.If):
        out.append(f"{pad}if {expr_str(s.cond)}:")
        _lines(s.then, depth + 1, out)
        if s.orelse is not None:
            out.append(f"{pad}else:")
            _lines(s.orelse, depth + 1, out)
    elif isinstance(s, S.While):
        out.append(f"{pad}while {expr_str(s.cond)}:")
        _lines(s.body, depth + 1, out)
    elif isinstance(s, S.Break):
        out.append(f"{pad}break")
    elif isinstance(s, S.Continue):
        out.append(f"{pad}continue")
    elif isinstance(s, S.SyncThreads):
        out.append(f"{pad}syncthreads()")
    elif isinstance(s, S.SyncWarp):
        out.append(f"{pad}syncwarp()")
    elif isinstance(s, S.Mma):
        out.append(f"{pad}mma_m16n8k16({expr_str(s.a)}, {expr_str(s.b)}, {expr_str(s.c)})")
    elif isinstance(s, S.Dot4):
        out.append(f"{pad}dot4({expr_str(s.acc)}, {expr_str(s.a)}, {expr_str(s.b)}, lanes={s.lanes})")
    elif isinstance(s, S.LdMatrix):
        out.append(f"{pad}ldmatrix.x{s.num}{'.trans' if s.trans else ''}({expr_str(s.frag)}, {expr_str(s.src)})")
    elif isinstance(s, S.CpAsync):
        out.append(f"{pad}cp_async({expr_str(s.dst)}, {expr_str(s.src)}, {s.count}, pred={expr_str(s.pred)})")
    elif isinstance(s, S.CpAsyncCommit):
        out.append(f"{pad}cp_async_commit()")
    elif isinstance(s, S.CpAsyncWait):
        out.append(f"{pad}cp_async_wait({s.pending})")
    elif isinstance(s, S.Prefetch):
        out.append(f"{pad}prefetch({expr_str(s.src)})")
    elif isinstance(s, S.Evaluate):
        out.append(f"{pad}{expr_str(s.expr)}")
    elif isinstance(s, S.CallOutlined):
        args = ", ".join(a.name if isinstance(a, E.Buffer) else expr_str(a) for a in s.args)
        out.append(f"{pad}call outlined_{s.index}({args})")
    else:
        raise AssertionError(f"printer: unknown statement {type(s).__name__}")


def stmt_str(s, depth: int = 0) -> str:
    """The text of a statement tree, indented like Python."""
    out: list = []
    _lines(s, depth, out)
    return "\n".join(out)


def function_str(fn: Function) -> str:
    """The text of a kernel: signature, launch shape, sizes, body."""
    params = []
    for p in fn.params:
        if isinstance(p, E.Buffer):
            params.append(f"{p.name}: {p.dtype.name}[{', '.join(expr_str(d) for d in p.shape)}]")
        else:
            params.append(f"{p.name}: {p.dtype.name}")
    head = [f"kernel {fn.name}({', '.join(params)})", f"    # block={fn.block}"]
    if fn.sizes:
        head.append(f"    # sizes: {', '.join(v.name for v in fn.sizes)}")
    outlined = [f"# outlined_{i}:\n{function_str(f)}" for i, f in enumerate(fn.outlined)]
    return "\n\n".join(["\n".join(head + [stmt_str(fn.body, 1)]), *outlined])
