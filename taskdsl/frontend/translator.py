"""Python AST -> typed tensor IR.

Names bound to Python values (ints, tuples, task mappings, functions) are compile-time
constants: expressions over them are evaluated while translating, so `if` on them picks a
branch and `for` over a tuple unrolls. Names assigned more than once (or augmented, or
annotated) are runtime variables; a runtime variable takes the widest type it is assigned
(`acc = 0` then `acc += x` with `x: f32` makes `acc` an f32: translation restarts when a
later assignment widens a variable).
"""
from __future__ import annotations

import ast
import builtins
import dataclasses
import difflib
import functools
import operator

import numpy as np

from .. import ir
from ..errors import DSLError, SourceLoc
from ..ir import types as T
from ..lang import intrinsics as L
from ..mapping import MappingLoop, TaskMapping
from .global_reads import GlobalReads
from .intrinsic_calls import IntrinsicCalls
from .source import ParsedSource, closure_values
from .values import describe, is_number, is_runtime

_BINOPS = {ast.Add: "+", ast.Sub: "-", ast.Mult: "*", ast.Div: "/", ast.FloorDiv: "//", ast.Mod: "%",
           ast.BitAnd: "&", ast.BitOr: "|", ast.BitXor: "^", ast.LShift: "<<", ast.RShift: ">>", ast.Pow: "**"}
_PY_BINOPS = {"+": operator.add, "-": operator.sub, "*": operator.mul, "/": operator.truediv,
              "//": operator.floordiv, "%": operator.mod, "&": operator.and_, "|": operator.or_,
              "^": operator.xor, "<<": operator.lshift, ">>": operator.rshift, "**": operator.pow}
# expressions kernels do not have, in words, with what to write instead
_LOOP_INSTEAD = "Write a for loop (over range() or a compile-time tuple), or a tuple of the expressions."
_UNSUPPORTED = {ast.ListComp: ("list comprehensions", _LOOP_INSTEAD),
                ast.GeneratorExp: ("generator expressions", _LOOP_INSTEAD),
                ast.SetComp: ("set comprehensions", _LOOP_INSTEAD), ast.DictComp: ("dict comprehensions", None),
                ast.Dict: ("dicts", None), ast.Set: ("sets", None), ast.Lambda: ("lambdas", "Use a @td.func."),
                ast.NamedExpr: ("assignment expressions (:=)", "Assign in a statement of its own first."),
                ast.JoinedStr: ("f-strings", "Kernels have no strings."),
                ast.Starred: ("starred expressions (*x)", None), ast.Await: ("'await' expressions", None),
                ast.Yield: ("'yield' expressions", None), ast.YieldFrom: ("'yield from' expressions", None),
                ast.Slice: ("slices (a:b)", "Index one element at a time, in a loop.")}
_CMPOPS = {ast.Lt: "<", ast.LtE: "<=", ast.Gt: ">", ast.GtE: ">=", ast.Eq: "==", ast.NotEq: "!=",
           ast.Is: "is", ast.IsNot: "is not", ast.In: "in", ast.NotIn: "not in"}
_PY_CMPOPS = {"<": operator.lt, "<=": operator.le, ">": operator.gt, ">=": operator.ge, "==": operator.eq,
              "!=": operator.ne, "is": operator.is_, "is not": operator.is_not,
              "in": lambda a, b: a in b, "not in": lambda a, b: a not in b}
_ALLOWED_BUILTINS = {"range", "len", "min", "max", "abs", "int", "float", "bool", "tuple", "list", "zip",
                     "enumerate", "reversed", "print", "isinstance", "sum", "True", "False", "None"}
_PY_TYPE_DTYPES = {int: T.i32, float: T.f32, bool: T.boolean}


class _Restart(Exception):
    """A runtime variable was widened; translate again with the wider type."""


RETURNED = "<returned>"      # in `definite` once every path so far has returned a @td.func's value


def _shuffles(value) -> bool:
    """Whether `value` (a runtime expression or a number) holds a warp shuffle."""
    return is_runtime(value) and any(c.func in L.WARP_OPS for c in ir.collect(value, ir.Call))


def _literal_like(partner):
    """The type a Python number next to `partner` takes: see `ir.literal_type` (None: no runtime partner)."""
    return ir.literal_type(partner.dtype) if is_runtime(partner) else None


def _target_names(target: ast.expr):
    """The names an assignment target binds (not those in a subscript's indices)."""
    if isinstance(target, ast.Name):
        yield target.id
    elif isinstance(target, (ast.Tuple, ast.List)):
        for t in target.elts:
            yield from _target_names(t)


def _runtime_names(tree: ast.FunctionDef) -> set:
    """Names assigned more than once, augmented or annotated: runtime variables."""
    counts: dict = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.Assign):
            for t in node.targets:
                for n in _target_names(t):
                    counts[n] = counts.get(n, 0) + 1
        elif isinstance(node, (ast.AugAssign, ast.AnnAssign)) and isinstance(node.target, ast.Name):
            counts[node.target.id] = counts.get(node.target.id, 0) + 2
    return {n for n, c in counts.items() if c > 1}


@functools.lru_cache(maxsize=4096)
def _is_float_operation(a, b) -> bool:
    """Whether compile-time numbers `a` and `b` make a float operation (one of them a float)."""
    return is_number(a) and is_number(b) and any(isinstance(v, (float, np.floating)) for v in (a, b))


def _is_mapping_call(func, rank: int) -> bool:
    """Whether `func` is a task mapping of `rank`-d tasks, or its `on` method."""
    mapping = func.__self__ if getattr(func, "__func__", None) is TaskMapping.on else func
    return isinstance(mapping, TaskMapping) and len(mapping.task_shape) == rank


def _contains(node: ast.AST, kinds: tuple) -> bool:
    """Whether `node` or a node inside it is of one of the classes `kinds`: remembered per node, as an unrolled
    loop or an inlined `@td.func` translates the same statements again (~5% of building a tensor-core kernel)."""
    return any(isinstance(n, kinds) for n in ast.walk(node))


def _may_return(node: ast.stmt) -> bool:
    """Whether a `return` can happen inside `node`."""
    return _contains(node, (ast.Return,))


def _always_returns(stmts: list, exits: tuple = (ast.Return,)) -> bool:
    """Whether every path through `stmts` ends in `return` (or another of the statement classes `exits`)."""
    if not stmts:
        return False
    last = stmts[-1]
    if isinstance(last, exits):
        return True
    if isinstance(last, ast.If):
        return _always_returns(last.body, exits) and _always_returns(last.orelse, exits)
    return False


JUMPS = (ast.Return, ast.Break, ast.Continue)


def _assigned_names(tree: ast.FunctionDef, declarations: bool = True) -> set:
    """Names the body binds (assignments and loop targets, and with `declarations` annotations without a value):
    a read of one must follow a binding on every path."""
    names = set()
    for node in ast.walk(tree):
        targets = node.targets if isinstance(node, ast.Assign) else \
            [node.target] if isinstance(node, (ast.AugAssign, ast.For)) or isinstance(node, ast.AnnAssign) and \
            (declarations or node.value is not None) else []
        for target in targets:
            names.update(_target_names(target))
    return names


@functools.lru_cache(maxsize=1024)
def _body_names(tree: ast.FunctionDef) -> tuple:
    """(`_runtime_names`, `_assigned_names`, whether a `return` gives a value) of a parsed function: found once,
    as every inlined call of a `@td.func` translates its body again (and a kernel's restarts its own)."""
    returns_value = any(isinstance(n, ast.Return) and n.value is not None for n in ast.walk(tree))
    return frozenset(_runtime_names(tree)), frozenset(_assigned_names(tree)), returns_value


def _shape(buffer: ir.Buffer) -> tuple:
    """A tensor's `.shape` in a kernel: ints where the size is fixed, size symbols where it is not."""
    return tuple(d.value if isinstance(d, ir.Const) else d for d in buffer.shape)


class FunctionTranslator(IntrinsicCalls):
    """Translates one Python function body (a kernel, or an inlined `@td.func`) into IR statements."""

    def __init__(self, source: ParsedSource, fn, env: dict, var_types: dict, return_var: ir.Var | None = None,
                 depth: int = 0, is_func: bool = False, reads: GlobalReads | None = None,
                 call_site: SourceLoc | None = None):
        self.src = source
        self.call_site = call_site      # of an inlined @td.func: where it was called, in each location it gives
        self.fn = fn
        self.env = dict(env)
        self.var_types = var_types
        self.return_var = return_var
        self.is_func = is_func
        self.depth = depth
        self.runtime_names, self.local_names, returns_value = _body_names(source.tree)
        self.definite = set(env)  # names bound on every path to the statement being translated
        self.loops: list = []     # the loops around the code, innermost last: 'runtime', 'mapping' or 'unrolled'
        self.shadowed: dict = {}  # name -> the loop that bound it over an earlier binding, until it is reassigned
        self.ended_loops: dict = {}   # name -> the loop that bound it with no binding before (none after it)
        self.pending: list = []   # statements an expression emits before its own (allocations, inlined calls)
        self.return_flags: list = []    # the `returned` flags of the statements around (`guarded`)
        self.returns_value = is_func and returns_value
        self.namespace = dict(fn.__globals__)
        closure = closure_values(fn)
        self.namespace.update(closure)
        self.closure_names = frozenset(closure)
        self.reads = reads      # the globals read, with their values (a call after one is rebound builds again)

    # ----------------------------------------------------------------- errors
    def error(self, node: ast.AST, message: str, hint: str | None = None) -> DSLError:
        return DSLError(message, self.loc(node), hint)

    def loc(self, node: ast.AST) -> SourceLoc:
        loc = self.src.loc(node)
        return loc if self.call_site is None else dataclasses.replace(loc, caller=self.call_site)

    # ----------------------------------------------------------------- statements
    def block(self, stmts: list) -> ir.Stmt:
        """Translate a statement list, lowering `return`s that are not the last statement.

        `if c: ... return` makes the rest of the list the other branch; after a statement with a return
        deeper inside, the rest of the list runs under `if not returned` (`guarded`).
        """
        out = []
        for i, node in enumerate(stmts):
            rest = stmts[i + 1:]
            if isinstance(node, ast.Return):
                out.append(self.stmt(node))
                break
            if isinstance(node, ast.If) and rest and (_always_returns(node.body) or _always_returns(node.orelse)):
                then_body, else_body = list(node.body), list(node.orelse)
                if _always_returns(node.body):
                    else_body += rest
                else:
                    then_body += rest
                out.append(self.stmt(node, lambda n: self.stmt_if(n, then_body, else_body)))
                break
            if rest and _may_return(node):
                out += self.guarded(lambda: self.stmt(node), lambda: self.block(rest), self.loc(rest[0]))
                break
            out.append(self.stmt(node))
        return ir.seq([s for s in out if s is not None]) if out else ir.Seq(())

    def guarded(self, first, rest, loc: SourceLoc) -> list:
        """`first()`, whose code may return, then `rest()` under `if not returned`. The flag is this statement's
        own, set by the returns inside it (and by those inside the statements around it, whose own flags are
        open too): one flag for the whole function would make the code after a warp-uniform return as
        divergent as the most divergent return anywhere, for the barrier and shuffle checks."""
        flag = ir.Var("returned", T.boolean)
        self.return_flags.append(flag)
        try:
            head = first()
        finally:
            self.return_flags.pop()
        return [ir.Assign(flag, ir.const(False), loc), head, ir.If(ir.Unary("not", flag, T.boolean), rest(), None, loc)]

    def function_body(self) -> ir.Stmt:
        """The whole body."""
        body = self.block(self.src.tree.body)
        if self.return_var is not None and RETURNED not in self.definite and not _always_returns(self.src.tree.body):
            # a thread that falls off the end would read the result uninitialized (another thread's, in practice)
            raise self.error(self.src.tree, f"@td.func '{self.fn.__name__}' returns a value on some paths but can "
                                            "reach its end without one", "End every path with a 'return value'.")
        return body

    def stmt(self, node: ast.stmt, translate=None) -> ir.Stmt | None:
        """Translate one statement, with the statements its expressions emit (allocations, inlined calls)."""
        method = translate or getattr(self, "stmt_" + type(node).__name__.lower(), None)
        if method is None:
            raise self.error(node, f"'{type(node).__name__}' statements are not supported in kernels",
                             "Kernels may use assignments, if/elif/else, for, while, break, continue and calls.")
        outer, self.pending = self.pending, []
        try:
            result = method(node)
            emitted = self.pending + ([result] if result is not None else [])
        except ir.ConstantError as exc:    # a number converted outside an expression (a store's index)
            raise self.error(node, str(exc)) from None
        finally:
            self.pending = outer
        return ir.seq(emitted) if emitted else None

    def stmt_pass(self, node):
        return None

    def stmt_expr(self, node: ast.Expr):
        if isinstance(node.value, ast.Constant) and isinstance(node.value.value, str):
            return None  # docstring
        if isinstance(node.value, tuple(_UNSUPPORTED)):
            self.expr(node.value)       # the unsupported construct's own message (a `yield` statement, say)
        if not isinstance(node.value, ast.Call):
            raise self.error(node, "this expression statement has no effect")
        result = self.expr(node.value, statement=True)
        if isinstance(result, ir.Stmt):
            return result
        if isinstance(result, ir.Atomic):
            return ir.Evaluate(result, self.loc(node))
        return None

    @property
    def in_runtime_loop(self) -> bool:
        """Whether the code being translated is inside a loop that runs at runtime (not only unrolled ones)."""
        return any(kind != "unrolled" for kind in self.loops)

    def stmt_return(self, node: ast.Return):
        if self.in_runtime_loop:
            raise self.error(node, "'return' inside a loop is not supported",
                             "Use a flag and 'break', or restructure with if/else.")
        flag = ir.seq([ir.Assign(f, ir.const(True), self.loc(node)) for f in self.return_flags])  # code after it skips
        if not self.is_func:
            if node.value is not None:
                raise self.error(node, "a kernel cannot return a value", "Write results into an output tensor.")
            return flag
        if node.value is None:
            if self.return_var is not None or self.returns_value:
                raise self.error(node, "this @td.func returns a value, so every 'return' needs one")
            return flag
        if isinstance(node.value, (ast.Tuple, ast.List)):
            raise self.error(node, "a @td.func returns one number, not a tuple",
                             "Write the other results into a tensor (or td.registers) the caller passes, or call one "
                             "@td.func per result.")
        if self.return_var is None:  # no return annotation: the first returned value fixes the type
            value = self.runtime_value(node.value)
            self.return_var = ir.Var(f"{self.fn.__name__}_ret", value.dtype)
        value = self.cast_to(self.runtime_value(node.value, self.return_var.dtype), self.return_var.dtype, node)
        self.definite.add(RETURNED)
        return ir.seq([ir.Assign(self.return_var, value, self.loc(node)), flag])

    def stmt_assign(self, node: ast.Assign):
        if len(node.targets) != 1:
            raise self.error(node, "chained assignment (a = b = ...) is not supported")
        target = node.targets[0]
        if not isinstance(target, (ast.Tuple, ast.List)):
            value = self.expr(node.value, name_hint=self._name_of(target))
            return self.assign_to(target, value, node)
        if isinstance(node.value, (ast.Tuple, ast.List)) and len(node.value.elts) == len(target.elts):
            value = tuple(self.in_order(node.value.elts, [self._name_of(t) for t in target.elts]))
        else:
            value = self.expr(node.value)
        pairs = self.unpack(target, value, node)
        # Python evaluates the whole right side first: `a, b = b, a` must read the old values, and so must
        # `X[0], X[1] = X[1], X[0]` (every store may change what a later value reads)
        targeted = {self.env[t.id].uid for t, _ in pairs
                    if isinstance(t, ast.Name) and isinstance(self.env.get(t.id), ir.Var)}
        stores = any(isinstance(t, ast.Subscript) for t, _ in pairs)
        snapshots = []
        for k, (t, v) in enumerate(pairs):
            if is_runtime(v) and (any(x.uid in targeted for x in ir.collect(v, ir.Var))
                                  or stores and ir.collect(v, (ir.Load, ir.Atomic))):
                tmp = ir.Var(f"{self._name_of(t) or 'tmp'}_new", v.dtype)
                snapshots.append(ir.Assign(tmp, v, self.loc(node)))
                pairs[k] = (t, tmp)
        assigns = [self.assign_to(t, v, node) for t, v in pairs]
        return ir.seq(snapshots + [s for s in assigns if s]) if pairs else None

    def unpack(self, target: ast.expr, value, node: ast.Assign) -> list:
        """(name or element target, value) pairs of `target = value`, tuples unpacked (nested ones too)."""
        if not isinstance(target, (ast.Tuple, ast.List)):
            return [(target, value)]
        if any(isinstance(t, ast.Starred) for t in target.elts):
            raise self.error(target, "starred assignment (a, *b = ...) is not supported",
                             "Unpack into one name per value, or index the compile-time tuple.")
        if not isinstance(value, (tuple, list)):
            raise self.error(node.value, "only a tuple known at compile time can be unpacked")
        if len(value) != len(target.elts):
            raise self.error(node, f"cannot unpack {len(value)} values into {len(target.elts)} names")
        return [pair for t, v in zip(target.elts, value) for pair in self.unpack(t, v, node)]

    def stmt_annassign(self, node: ast.AnnAssign):
        if not isinstance(node.target, ast.Name):
            raise self.error(node, "annotated assignment needs a plain name")
        dtype = self.dtype_of(node.annotation)
        name = node.target.id
        key = (id(self.fn), name)
        self.var_types[key] = (dtype, True)
        var = self.env.get(name)
        if not isinstance(var, ir.Var) or var.dtype != dtype:
            self.env[name] = ir.Var(name, dtype)
        if node.value is None:
            return None
        return self.assign_to(node.target, self.expr(node.value), node)

    def stmt_augassign(self, node: ast.AugAssign):
        op = _BINOPS.get(type(node.op))
        if op is None:      # '@', the one binary operator of Python that kernels do not have
            raise self.error(node, "'@=' is not supported")
        if isinstance(node.target, ast.Subscript):   # Python reads the element before evaluating the value
            buf, idx = self.subscript_target(node.target)
            [*idx, current], value = self.then([*idx, ir.Load(buf, idx)], node.value)
            return ir.Store(buf, tuple(idx), self.cast_to(self.binop(op, current, value, node), buf.dtype, node),
                            self.loc(node))
        if not isinstance(node.target, ast.Name):
            raise self.error(node, "augmented assignment needs a name or a tensor element")
        current = self.lookup(node.target.id, node.target)
        value = self.expr(node.value)
        return self.assign_to(node.target, self.binop(op, current, value, node), node)

    def assign_to(self, target: ast.expr, value, node: ast.stmt):
        """Bind or assign `value` to `target` (a name or a tensor element)."""
        if isinstance(target, ast.Subscript):   # Python evaluates the value before the element's indices
            [value], (buf, idx) = self.then([value], target, evaluate=lambda: self.subscript_target(target))
            return ir.Store(buf, idx, self.cast_to(value, buf.dtype, target), self.loc(node))
        if not isinstance(target, ast.Name):
            raise self.error(target, f"cannot assign to '{ast.unparse(target)}'",
                             "Kernels assign to names, to tensor elements (x[i]) and to tuples of them.")
        name = target.id
        self.shadowed.pop(name, None)
        self.definite.add(name)
        if isinstance(self.env.get(name), ir.Var) and self.env[name].kind == "loop":
            raise self.error(target, f"cannot assign to the loop variable '{name}'")
        bound = self.env.get(name)
        if (isinstance(bound, ir.Var) and bound.kind in ("size", "param")) or \
                (isinstance(bound, ir.Buffer) and bound.scope == "global"):
            raise self.error(target, f"cannot assign to the parameter '{name}'",
                             "Parameters and size symbols are read-only names; use a new variable.")
        if name not in self.runtime_names and not isinstance(self.env.get(name), ir.Var):
            if not is_runtime(value):
                self.env[name] = value  # a compile-time value (or a buffer)
                return None
            var = ir.Var(name, value.dtype)
            self.env[name] = var
            return ir.Assign(var, value, self.loc(node))
        if isinstance(value, ir.Buffer) or not (is_runtime(value) or is_number(value)):
            raise self.error(node, f"'{name}' is assigned more than once, so it is a runtime variable, and "
                                   f"a {type(value).__name__} cannot be stored in one",
                             "Give compile-time values (tensors, mappings, tuples) a name of their own.")
        return self.assign_var(name, value, node)

    def assign_var(self, name: str, value, node: ast.AST) -> ir.Assign:
        """Assign to the runtime variable `name`, widening its type (and restarting) when needed."""
        key = (id(self.fn), name)
        known, annotated = self.var_types.get(key, (None, False))
        value = ir.as_expr(value, known)      # a Python float for an f64 variable: not rounded to f32 first
        if known is None:
            known = value.dtype
            self.var_types[key] = (known, False)
        elif not annotated and known != value.dtype and _widens(known, value.dtype):
            self.var_types[key] = (T.promote(known, value.dtype), False)
            raise _Restart()
        var = self.env.get(name)
        if not isinstance(var, ir.Var) or var.dtype != known:
            var = ir.Var(name, known)
            self.env[name] = var
        return ir.Assign(var, self.cast_to(value, known, node), self.loc(node))

    def stmt_if(self, node: ast.If, body=None, orelse=None):
        body = node.body if body is None else body
        orelse = node.orelse if orelse is None else orelse
        cond = self.test(node.test)
        if not is_runtime(cond):
            return self.block(body if self.truth(cond, node.test) else orelse)
        cond = self.condition(cond, node.test)
        before = set(self.definite)
        then = self.block(body)
        after_then, self.definite = self.definite, set(before)
        other = self.block(orelse) if orelse else None
        # a branch that always returns, breaks or continues does not reach the code after the `if`
        reaching = [d for d, stmts in ((after_then, body), (self.definite, orelse))
                    if not _always_returns(stmts, JUMPS)]
        self.definite = set.intersection(*reaching) if reaching else before
        return ir.If(cond, then, other, self.loc(node))

    def stmt_while(self, node: ast.While):
        if node.orelse:
            raise self.error(node, "'while ... else' is not supported")
        test, emitted = self.expr_apart(node.test, evaluate=lambda: self.test(node.test))
        cond = self.condition(test, node.test)
        self.loops.append("runtime")
        before = set(self.definite)
        body = self.block(node.body)
        self.definite = before      # the body may not run
        self.loops.pop()
        if not emitted:
            return ir.While(cond, body, self.loc(node))
        # the condition takes statements (an inlined call): they must run again before every test
        stop = ir.If(ir.Unary("not", cond, T.boolean), ir.Break(self.loc(node)), None, self.loc(node))
        return ir.While(ir.const(True), ir.seq([*emitted, stop, body]), self.loc(node))

    def stmt_break(self, node):
        return self._loop_jump(node, ir.Break)

    def stmt_continue(self, node):
        return self._loop_jump(node, ir.Continue)

    def _loop_jump(self, node, cls):
        word = cls.__name__.lower()
        innermost = self.loops[-1] if self.loops else None
        if not self.in_runtime_loop or innermost == "unrolled":
            raise self.error(node, f"'{word}' outside a runtime loop" if not self.in_runtime_loop else
                             f"'{word}' in a loop over a compile-time tuple",
                             "Loops over compile-time tuples are unrolled and cannot be left early.")
        if innermost == "mapping":
            raise self.error(node, f"'{word}' in a task-mapping loop",
                             "A mapping loop becomes several loops, or none, per worker, so it cannot be left "
                             "early as one loop: keep a flag, or test a condition around the body.")
        return cls(self.loc(node))

    def stmt_for(self, node: ast.For):
        if node.orelse:
            raise self.error(node, "'for ... else' is not supported")
        it = node.iter
        if isinstance(it, ast.Call):
            func = self.expr(it.func)
            if func is builtins.range or func is L.unroll:
                return self.for_range(node, it, unroll=func is L.unroll)
            inner = it.args[0] if func is builtins.reversed and len(it.args) == 1 else None
            if isinstance(inner, ast.Call) and self.expr(inner.func) in (builtins.range, L.unroll):
                return self.for_range(node, inner, unroll=self.expr(inner.func) is L.unroll, reverse=True)
        source = self.expr(it)
        if isinstance(source, MappingLoop):
            return self.for_mapping(node, source)
        if isinstance(source, TaskMapping):
            raise self.error(it, "a task mapping must be called on a worker index to be iterated",
                             "Write 'for i, j in mapping(threadIdx.x):'.")
        if isinstance(source, (tuple, list, range)) or hasattr(source, "__iter__") and not is_runtime(source):
            values = list(source)
            if isinstance(it, ast.Call) and _is_mapping_call(func, rank=1) and isinstance(node.target, ast.Name):
                values = [task for task, in values]     # one name per dimension, as with a runtime worker
            return self.for_unrolled(node, values)
        raise self.error(it, f"cannot iterate over {type(source).__name__}",
                         "Loop over range(...), td.unroll(...), a task mapping call, or a compile-time tuple.")

    def reversed_range(self, start, stop, step: int, call: ast.Call) -> tuple:
        """(start, stop, step) of `reversed(range(start, stop, step))`: from the last value back past the first."""
        if not is_runtime(start) and not is_runtime(stop):
            backwards = range(start, stop, step)[::-1]
            return backwards.start, backwards.stop, backwards.step
        # in a signed type: an empty range's count is negative, and unsigned bounds wrapped (0 - 1 is 2**32 - 1)
        dtype = _loop_dtype(start, stop, -abs(step))
        start, stop = (self.cast_to(b, dtype, call) for b in (start, stop))
        sign = 1 if step > 0 else -1            # the last value: start + ((stop - start - sign) // step) * step
        steps = self.binop("//", self.binop("-", self.binop("-", stop, start, call), sign, call), step, call)
        last = self.binop("+", start, self.binop("*", steps, step, call), call)
        return last, self.binop("-", start, step, call), -step

    def for_range(self, node: ast.For, call: ast.Call, unroll: bool, reverse: bool = False):
        """A loop over `range(...)` or `td.unroll(...)` (`reverse`: over `reversed()` of it)."""
        if call.keywords or not 1 <= len(call.args) <= 3:
            raise self.error(call, "range() takes 1 to 3 positional arguments")
        args = [self.expr(a) for a in call.args]
        start, stop, step = (0, args[0], 1) if len(args) == 1 else (args[0], args[1], args[2] if len(args) == 3 else 1)
        if is_runtime(step) or not isinstance(step, int) or step == 0:
            raise self.error(call, "the step of range() must be a non-zero int known at compile time")
        if not isinstance(node.target, ast.Name):
            raise self.error(node.target, "range() loops take a single loop variable")
        for bound, arg in ((start, call.args[0]), (stop, call.args[-1] if len(args) > 1 else call.args[0])):
            if not (is_runtime(bound) and bound.dtype.is_integer) and not (isinstance(bound, int) and not isinstance(bound, bool)):
                raise self.error(arg, "range() bounds must be integers")
        if reverse:
            start, stop, step = self.reversed_range(start, stop, step, call)
        runs = not is_runtime(start) and not is_runtime(stop) and (stop - start) * step > 0 and \
            not _contains(node, (ast.Break, ast.Continue))
        dtype = _loop_dtype(start, stop, step)
        start, stop = (self.cast_to(b, dtype, call) for b in (start, stop))
        var = ir.Var(node.target.id, dtype, kind="loop")
        body = self.loop_body(node, {node.target.id: var}, runs)
        return ir.For(var, start, stop, ir.const(step, dtype), body, unroll,
                      self.loc(node))

    def for_mapping(self, node: ast.For, source: MappingLoop):
        rank = len(source.mapping.task_shape)
        targets = node.target.elts if isinstance(node.target, ast.Tuple) else [node.target]
        if len(targets) != rank or not all(isinstance(t, ast.Name) for t in targets):
            raise self.error(node.target, f"the mapping {source.mapping!r} has {rank}-d tasks, so the loop needs "
                                          f"{rank} variable name{'s' if rank > 1 else ''}, got {len(targets)}")
        try:
            worker = ir.as_expr(source.worker)
        except TypeError as exc:
            raise self.error(node.iter, f"a task mapping's worker index must be an integer value: {exc}",
                             "e.g. mapping(threadIdx.x), not mapping(threadIdx).") from None
        if not worker.dtype.is_integer:
            raise self.error(node.iter, "a task mapping's worker index must be an integer")
        loop_vars = tuple(ir.Var(t.id, T.i32, kind="loop") for t in targets)
        body = self.loop_body(node, {v.name: v for v in loop_vars}, scope="mapping")
        return ir.ForMapping(loop_vars, source.mapping, worker, body, self.loc(node))

    def for_unrolled(self, node: ast.For, values: list):
        self.loops.append("unrolled")
        try:
            return self.iterations(node, values)
        finally:
            self.loops.pop()

    def iterations(self, node: ast.For, values: list):
        """The unrolled iterations of loop `node` over `values`; after one that may return, the rest run
        `guarded` (Python's loop ends at the return)."""
        out = []
        for k, value in enumerate(values):
            self.bind_target(node.target, value)
            if k + 1 < len(values) and _may_return(node):
                out += self.guarded(lambda: self.block(node.body), lambda: self.iterations(node, values[k + 1:]),
                                    self.loc(node))
                break
            out.append(self.block(node.body))
        return ir.seq([s for s in out if s is not None]) if out else None

    def bind_target(self, target: ast.expr, value):
        if isinstance(target, ast.Name):
            self.env[target.id] = value
            self.definite.add(target.id)
        elif isinstance(target, (ast.Tuple, ast.List)) and isinstance(value, (tuple, list)) \
                and len(value) == len(target.elts):
            for t, v in zip(target.elts, value):
                self.bind_target(t, v)
        else:
            raise self.error(target, "cannot unpack this loop value into the loop variables")

    def loop_body(self, node: ast.For, bindings: dict, runs: bool = False, scope: str = "runtime") -> ir.Stmt:
        """The body of a runtime loop binding `bindings`; what it assigns counts as assigned after the loop
        only when it `runs` (a constant trip count of one or more, and no break or continue). `scope` says what
        a break or continue in it would leave ('mapping' loops refuse them)."""
        saved = {n: self.env.get(n) for n in bindings}
        before = set(self.definite)
        self.definite |= set(bindings)
        self.env.update(bindings)
        for n in bindings:      # the loop's own name (reads in the body are of it)
            self.shadowed.pop(n, None)
        self.loops.append(scope)
        body = self.block(node.body)
        self.loops.pop()
        self.definite = (self.definite - set(bindings)) | (before & set(bindings)) if runs else before
        for n, v in saved.items():
            if v is None:
                self.env.pop(n, None)
                self.ended_loops[n] = node
            else:
                self.env[n] = v
                self.shadowed[n] = node
        return body

    # ----------------------------------------------------------------- expressions
    def expr(self, node: ast.expr, name_hint: str | None = None, statement: bool = False):
        method = getattr(self, "expr_" + type(node).__name__.lower(), None)
        if method is None:
            what, hint = _UNSUPPORTED.get(type(node), (f"'{type(node).__name__}' expressions", None))
            raise self.error(node, f"{what} are not supported in kernels", hint)
        try:
            if isinstance(node, ast.Call):
                return method(node, name_hint=name_hint, statement=statement)
            return method(node)
        except ir.ConstantError as exc:    # a number with no IR value (2**70, i32(inf)), at its expression
            raise self.error(node, str(exc)) from None

    def runtime_value(self, node: ast.expr, dtype: T.DataType | None = None) -> ir.Expr:
        value = self.expr(node)
        if not (is_runtime(value) or is_number(value)):
            raise self.error(node, f"expected a number, got {describe(value)}")
        value = ir.as_expr(value, dtype)
        return self.cast_to(value, dtype, node) if dtype is not None else value

    def expr_constant(self, node: ast.Constant):
        return node.value

    def expr_name(self, node: ast.Name):
        return self.lookup(node.id, node)

    def lookup(self, name: str, node: ast.AST):
        if name in self.shadowed:
            raise self.error(node, f"'{name}' is read after a loop over '{name}', which had its own '{name}': here "
                                   "it is the value from before the loop, not the loop's last one as in Python",
                             "Give the loop variable another name, or assign the value you want after the loop.")
        if name in self.local_names and name not in self.env:
            if name in self.ended_loops:
                raise self.error(node, f"'{name}' is the variable of the loop at line "
                                       f"{self.src.loc(self.ended_loops[name]).line}, which has no value after its "
                                       "loop (Python's would be its last one)",
                                 f"Assign what you need to another variable in the loop (`last = {name}`).")
            if name in self.namespace or hasattr(builtins, name):
                raise self.error(node, f"'{name}' is assigned in this function, which makes it a local variable "
                                       "throughout (as in Python), and it has no value yet here: it is not the "
                                       f"global '{name}'", "Give the local another name than the global's.")
        if name in self.local_names and name not in self.definite:
            if name not in _assigned_names(self.src.tree, declarations=False):
                raise self.error(node, f"'{name}' is declared but never assigned a value",
                                 f"Assign '{name}' before reading it: `{name}: f32 = 0.0` declares and assigns.")
            raise self.error(node, f"'{name}' may be unassigned here: it is assigned only on some paths before this "
                                   "read (one branch of an `if`, or a loop that may run no iteration)",
                             f"Assign '{name}' before the `if` or loop. On a GPU a thread that skipped the "
                             "assignment would read an uninitialized register.")
        if name in self.env:
            return self.env[name]
        if name in self.namespace:
            value = self.namespace[name]
            if self.reads is not None and name not in self.closure_names:
                self.reads.note(self.fn.__globals__, name, value)
            return value
        if name in _ALLOWED_BUILTINS:
            return getattr(builtins, name)
        if hasattr(builtins, name):
            raise self.error(node, f"the Python builtin '{name}' cannot be used in kernels")
        raise self.error(node, f"name '{name}' is not defined")

    def expr_attribute(self, node: ast.Attribute):
        base = self.expr(node.value)
        if isinstance(base, ir.Buffer):
            if node.attr == "shape":
                return _shape(base)
            if node.attr == "dtype":
                return base.dtype
            raise self.error(node, f"tensors have no attribute '{node.attr}' in kernels (use .shape or .dtype)")
        if is_runtime(base):
            if node.attr == "dtype":
                return base.dtype
            hidden = isinstance(node.value, ast.Name) and node.value.id in self.namespace
            raise self.error(node, f"runtime values have no attribute '{node.attr}'", (
                f"'{node.value.id}' is a runtime {base.dtype.name} value here: a size symbol, parameter or variable of "
                f"that name hides the global '{node.value.id}'; rename it.") if hidden else None)
        if isinstance(base, tuple) and hasattr(list, node.attr) and not hasattr(tuple, node.attr):
            raise self.error(node, f"'{ast.unparse(node.value)}' is a compile-time tuple (a list in a kernel is "
                                   f"one, fixed when the kernel is built): it has no '{node.attr}'",
                             "Keep values that change in td.registers, indexed by a loop variable.")
        try:
            return getattr(base, node.attr)
        except AttributeError:
            close = difflib.get_close_matches(node.attr, [n for n in dir(base) if not n.startswith("_")], n=1)
            raise self.error(node, f"'{ast.unparse(node.value)}' has no attribute '{node.attr}'"
                             + (f"; did you mean '{close[0]}'?" if close else "")) from None

    def expr_tuple(self, node: ast.Tuple):
        return tuple(self.expr(e) for e in node.elts)

    expr_list = expr_tuple

    def expr_subscript(self, node: ast.Subscript):
        base = self.expr(node.value)
        if isinstance(base, ir.Buffer):
            buf, idx = self.buffer_indices(base, node)
            return ir.Load(buf, idx)
        if is_runtime(base):
            raise self.error(node, f"'{ast.unparse(node.value)}' is a number ({base.dtype.name}), not a tensor: it "
                                   "cannot be indexed")
        if isinstance(node.slice, ast.Slice):       # a compile-time tuple's slice is a compile-time tuple
            bounds = (node.slice.lower, node.slice.upper, node.slice.step)
            index = slice(*(None if b is None else self.expr(b) for b in bounds))
            runtime = any(is_runtime(b) for b in (index.start, index.stop, index.step))
        else:
            index = self.expr(node.slice)
            runtime = is_runtime(index)
        if runtime:
            raise self.error(node, "a compile-time tuple can only be indexed by a compile-time value")
        if isinstance(base, T.DataType):
            return base[index]
        try:
            return base[index]
        except Exception as exc:  # noqa: BLE001 - any Python indexing error is the user's
            raise self.error(node, f"indexing failed: {exc}") from None

    def subscript_target(self, node: ast.Subscript):
        base = self.expr(node.value)
        if not isinstance(base, ir.Buffer):
            raise self.error(node, f"only tensors can be assigned to by index, not {describe(base)}")
        return self.buffer_indices(base, node)

    def buffer_indices(self, buf: ir.Buffer, node: ast.Subscript, partial: bool = False):
        """(buf, typed indices) of `buf[...]`; `partial` allows fewer indices than axes (a sub-tensor)."""
        raw = node.slice
        parts = raw.elts if isinstance(raw, ast.Tuple) else [raw]
        if any(isinstance(p, ast.Slice) for p in parts):
            raise self.error(node, "slices of tensors are not supported in kernels; index one element")
        idx = []
        for v in self.in_order(parts):
            if isinstance(v, tuple):
                idx.extend(v)
            else:
                idx.append(v)
        if len(idx) != len(buf.shape) and not (partial and len(idx) < len(buf.shape)):
            raise self.error(node, f"'{buf.name}' has {len(buf.shape)} dimension{'s' if len(buf.shape) != 1 else ''}"
                                   f" but is indexed with {len(idx)} index{'es' if len(idx) != 1 else ''}")
        out = []
        for v, p in zip(idx, parts if len(parts) == len(idx) else [node] * len(idx)):
            e = ir.as_expr(v) if (is_runtime(v) or is_number(v)) else None
            if e is None or not (e.dtype.is_integer or e.dtype.is_bool):
                got = e.dtype.name if e is not None else describe(v)
                raise self.error(p, f"tensor indices must be integers, got {got}")
            self._check_constant_index(buf, len(out), e, p)
            out.append(e)
        return buf, tuple(out)

    def _check_constant_index(self, buf: ir.Buffer, axis: int, index: ir.Expr, node: ast.AST) -> None:
        """A DSLError for a constant index outside its axis: a negative one (kernels do not count from the end,
        as Python does), or one past a constant size."""
        if not isinstance(index, ir.Const) or isinstance(index.value, bool):
            return
        size = buf.shape[axis]
        if index.value < 0:
            raise self.error(node, f"index {index.value} of '{buf.name}' is negative",
                             "Kernel indices do not count from the end: write the size minus one (e.g. N - 1).")
        if isinstance(size, ir.Const) and index.value >= size.value:
            raise self.error(node, f"index {index.value} is past the end of axis {axis} of '{buf.name}' (size "
                                   f"{size.value})")

    def expr_binop(self, node: ast.BinOp):
        op = _BINOPS.get(type(node.op))
        if op is None:      # '@'
            raise self.error(node, "the operator '@' is not supported")
        [left], right = self.then([self.expr(node.left)], node.right)
        return self.binop(op, left, right, node)

    def binop(self, op: str, a, b, node: ast.AST):
        for v in (a, b):
            if isinstance(v, ir.Buffer):
                raise self.error(node, f"'{op}' cannot take {describe(v)}")
        if not is_runtime(a) and not is_runtime(b):
            try:
                value = _PY_BINOPS[op](a, b)
            except Exception as exc:  # noqa: BLE001 - a compile-time Python error in user code
                if isinstance(exc, ZeroDivisionError) and _is_float_operation(a, b):
                    return self.ieee_fold(op, a, b, node)      # a float's zero divisor: inf or nan
                raise self.error(node, f"compile-time '{op}' failed: {exc}") from None
            if isinstance(value, complex) and _is_float_operation(a, b):    # (-8.0) ** 0.5
                return self.ieee_fold(op, a, b, node)
            return value
        for v in (a, b):
            if not (is_runtime(v) or is_number(v)):
                raise self.error(node, f"unsupported operand {describe(v)} for '{op}'")
        if op == "**":
            return self.math_call("pow", [a, b], node)
        ea, eb = ir.as_expr(a, _literal_like(b)), ir.as_expr(b, _literal_like(a))
        if op in ("&", "|", "^", "<<", ">>") and (ea.dtype.is_float or eb.dtype.is_float):
            raise self.error(node, f"'{op}' needs integer operands, got {ea.dtype.name} and {eb.dtype.name}")
        result = ir.binary(op, ea, eb)
        if op in ("<<", ">>") and isinstance(eb, ir.Const) and not 0 <= eb.value < result.dtype.bits:
            # undefined in C and CUDA (x86 masks the count, PTX clamps it): the cpu and a GPU would differ
            raise self.error(node, f"shift by {eb.value}: the count must be in 0..{result.dtype.bits - 1} "
                                   f"for {result.dtype.name}")
        return result

    def ieee_fold(self, op: str, a, b, node: ast.AST) -> float:
        """Compile-time float `a op b` where Python raises or gives a complex number: the IEEE value the
        operation has at run time (`1.0 // 0.0` is inf, `(-8.0) ** 0.5` nan)."""
        if op == "**":
            return self.math_call("pow", [a, b], node)
        with np.errstate(all="ignore"):
            return float({"/": np.true_divide, "//": np.floor_divide, "%": np.remainder}[op](np.float64(a),
                                                                                          np.float64(b)))

    def expr_unaryop(self, node: ast.UnaryOp):
        v = self.test(node.operand) if isinstance(node.op, ast.Not) else self.expr(node.operand)
        if not is_runtime(v):
            if isinstance(node.op, ast.Not):
                return not self.truth(v, node)
            try:
                return {ast.USub: operator.neg, ast.UAdd: operator.pos, ast.Not: operator.not_,
                        ast.Invert: operator.invert}[type(node.op)](v)
            except Exception as exc:  # noqa: BLE001 - a compile-time Python error in user code: ~1.5
                raise self.error(node, f"compile-time '{type(node.op).__name__}' failed: {exc}") from None
        if isinstance(node.op, ast.UAdd):
            return v
        if isinstance(node.op, ast.Not):
            return ir.Unary("not", self.condition(v, node), T.boolean)
        if isinstance(node.op, ast.Invert) and not (v.dtype.is_integer or v.dtype.is_bool):
            raise self.error(node, "'~' needs an integer operand")
        if v.dtype.bits < 32:   # as in binary arithmetic: bools and narrow ints compute in i32, 16-bit floats in f32
            v = ir.Cast(v, T.f32 if v.dtype.is_float else T.i32)
        return ir.Unary("~" if isinstance(node.op, ast.Invert) else "-", v, v.dtype)

    def expr_compare(self, node: ast.Compare):
        left = self.expr(node.left)
        result = None
        for op_node, right_node in zip(node.ops, node.comparators):
            op = _CMPOPS[type(op_node)]
            right, emitted = self.expr_apart(right_node)
            if emitted:     # `left` was read before the call in `right` ran
                [left], kept = self.kept([left], right_node)
                emitted = kept + emitted
            for v in (left, right):
                if isinstance(v, ir.Buffer) and op not in ("is", "is not", "in", "not in"):
                    raise self.error(node, f"'{v.name}' is a whole tensor: compare its elements ({v.name}[i] {op} ...)")
            runtime_items = isinstance(right, (tuple, list)) and any(map(is_runtime, right))
            if op in ("in", "not in") and (is_runtime(left) or runtime_items):
                part = self.membership(op, left, right, right_node)
            elif op in ("is", "is not") and (is_runtime(left) or is_runtime(right)):
                raise self.error(node, f"'{op}' compares values known at compile time (such as None), not runtime "
                                       "values", "Compare numbers with == or !=.")
            elif not is_runtime(left) and not is_runtime(right):
                try:
                    part = _PY_CMPOPS[op](left, right)
                except Exception as exc:  # noqa: BLE001 - a compile-time Python error in user code
                    raise self.error(node, f"compile-time '{op}' failed: {exc}") from None
            else:
                part = self.binop(op, left, right, node) if op not in ("==", "!=") else self._equality(op, left, right, node)
            if result is None:
                self.pending += emitted
                result = part
            else:   # `a < b < f(c)` calls f only when a < b
                result = self.logical("and", result, part, node, emitted)
            left = right
        return result

    def membership(self, op: str, value, items, node) -> ir.Expr:
        """`value in items` with a runtime value: `value == item` for any item of a compile-time tuple or list."""
        if not isinstance(items, (tuple, list)):
            raise self.error(node, f"'{op}' with a runtime value needs a tuple or list known at compile time, "
                                   f"got {describe(items)}")
        found = ir.const(False)
        for item in items:
            found = ir.Binary("or", found, self._equality("==", value, item, node), T.boolean)
        return ir.Unary("not", found, T.boolean) if op == "not in" else found

    def _equality(self, op, a, b, node):
        for v in (a, b):
            if not (is_runtime(v) or is_number(v)):
                raise self.error(node, f"cannot compare a runtime value with {describe(v)}")
        ea = ir.as_expr(a, _literal_like(b))
        return ir.binary(op, ea, ir.as_expr(b, ir.literal_type(ea.dtype)))

    def expr_boolop(self, node: ast.BoolOp, truth_only: bool = False):
        op = "and" if isinstance(node.op, ast.And) else "or"
        evaluate = self.test if truth_only else self.expr
        result = evaluate(node.values[0])
        for v in node.values[1:]:
            if not is_runtime(result):  # Python short-circuit at compile time
                if (op == "and") != self.truth(result, node):
                    return result
                result = evaluate(v)
                continue
            value, emitted = self.expr_apart(v, evaluate=lambda v=v: evaluate(v))
            result = self.logical(op, result, value, node, emitted, truth_only)
        return result

    def test(self, node: ast.expr):
        """The value of a condition (of `if`, `while`, `not`, a conditional expression): an `and`/`or` there is
        only tested, so it stays a bool expression whatever its operands are."""
        if isinstance(node, ast.BoolOp):
            return self.expr_boolop(node, truth_only=True)
        return self.expr(node)

    def logical(self, op: str, a, b, node, emitted: list = (), truth_only: bool = True):
        """Python's `a and b` / `a or b`: the value of the operand that decides, `b` computed only when `a` does
        not (`emitted` are the statements computing `b`). A bool expression when both are bools or only the
        truth matters (`truth_only`); otherwise the chosen number, in the operands' common type."""
        decisive = op == "or"           # the truth value that decides `a op b` on its own
        if not is_runtime(a):
            if self.truth(a, node) == decisive:
                return a                # decided while translating: `b` is never computed
            self.pending += emitted
            return b
        bools = a.dtype.is_bool and (isinstance(b, bool) or is_runtime(b) and b.dtype.is_bool)
        if not (truth_only or bools):
            return self.chosen_operand(op, a, b, node, emitted)
        if emitted or _shuffles(b):     # `b` under an `if`, as in `expr_ifexp`
            # the test's variable is assigned once: as uniform as `a` (the result is as uniform as `b` too)
            flag = ir.Var("decided" if op == "or" else "holds", T.boolean)
            result = ir.Var("both" if op == "and" else "either", T.boolean)
            undecided = flag if op == "and" else ir.Unary("not", flag, T.boolean)
            self.pending += [ir.Assign(flag, self.condition(a, node), self.loc(node)),
                             ir.Assign(result, flag, self.loc(node)),
                             ir.If(undecided, ir.seq([*emitted, ir.Assign(result, self.condition(b, node),
                                                                         self.loc(node))]), None, self.loc(node))]
            return result
        if not is_runtime(b):
            return decisive if self.truth(b, node) == decisive else self.condition(a, node)
        return ir.Binary(op, self.condition(a, node), self.condition(b, node), T.boolean)

    def chosen_operand(self, op: str, a: ir.Expr, b, node, emitted: list) -> ir.Expr:
        """The value of `a or b` (`a and b`) of numbers: `a` if it is true (false), else `b`, as Python gives."""
        if not (is_runtime(b) or is_number(b)):
            raise self.error(node, f"'{op}' of a runtime value needs numbers, got {describe(b)}")
        if not isinstance(a, (ir.Var, ir.Const)):   # `a` is both tested and chosen: compute it once
            tested = ir.Var("tested", a.dtype)
            self.pending.append(ir.Assign(tested, a, self.loc(node)))
            a = tested
        dtype, first, other = self.common_type(a, b, node)
        cond = self.condition(a, node)
        if not (emitted or _shuffles(other)):
            return ir.Select(cond, first, other, dtype) if op == "or" else ir.Select(cond, other, first, dtype)
        chosen = ir.Var("chosen", dtype)
        undecided = cond if op == "and" else ir.Unary("not", cond, T.boolean)
        self.pending += [ir.Assign(chosen, first, self.loc(node)),
                         ir.If(undecided, ir.seq([*emitted, ir.Assign(chosen, other, self.loc(node))]), None,
                               self.loc(node))]
        return chosen

    def common_type(self, a, b, node) -> tuple:
        """(dtype, a, b): two numbers converted to their common type, a Python number taking the other's."""
        ea = ir.as_expr(a, _literal_like(b))
        eb = ir.as_expr(b, ir.literal_type(ea.dtype))
        dtype = T.promote(ea.dtype, eb.dtype) if ea.dtype != eb.dtype else ea.dtype
        return dtype, self.cast_to(ea, dtype, node), self.cast_to(eb, dtype, node)

    def expr_apart(self, node: ast.expr, name_hint: str | None = None, evaluate=None) -> tuple:
        """The value of `node` (or of `evaluate()`), and the statements translating it emitted (inlined calls)
        kept apart."""
        outer, self.pending = self.pending, []
        try:
            return (evaluate() if evaluate else self.expr(node, name_hint=name_hint)), self.pending
        finally:
            self.pending = outer

    def then(self, earlier: list, node: ast.expr, name_hint: str | None = None, evaluate=None) -> tuple:
        """(`earlier`, value of `node`): `node` evaluated after the values `earlier`, in Python's left-to-right
        order. When `node` emits statements (an inlined call, which may store to a tensor), each earlier value
        that reads memory is first kept in a variable, so the call cannot change what was already read."""
        value, emitted = self.expr_apart(node, name_hint, evaluate)
        if emitted:
            earlier, kept = self.kept(earlier, node)
            self.pending += kept + emitted
        return earlier, value

    def in_order(self, nodes: list, name_hints: list | None = None) -> list:
        """The values of `nodes`, evaluated left to right as Python does (see `then`)."""
        values: list = []
        for k, node in enumerate(nodes):
            values, value = self.then(values, node, name_hints[k] if name_hints else None)
            values.append(value)
        return values

    def kept(self, values: list, node: ast.AST) -> tuple:
        """(`values` with each one that reads memory kept in a new variable, the assignments that keep them)."""
        out, assigns = [], []
        for v in values:
            if is_runtime(v) and ir.collect(v, (ir.Load, ir.Atomic)):
                var = ir.Var("kept", v.dtype)
                assigns.append(ir.Assign(var, v, self.loc(node)))
                v = var
            out.append(v)
        return out, assigns

    def truth(self, value, node) -> bool:
        """The truth of a value known while translating (Python's); a whole tensor has none a kernel could use."""
        if isinstance(value, ir.Buffer):
            raise self.error(node, f"'{value.name}' is a whole tensor, not a condition: test its elements "
                                   f"({value.name}[i] > 0, say) or its size ({value.name}.shape[0])")
        return bool(value)

    def condition(self, value, node) -> ir.Expr:
        """`value` as a bool expression (numbers compare with zero, as in Python)."""
        if not is_runtime(value):
            return ir.const(self.truth(value, node))
        if value.dtype.is_bool:
            return value
        return ir.binary("!=", value, ir.as_expr(0, value.dtype))

    def expr_ifexp(self, node: ast.IfExp):
        cond = self.test(node.test)
        if not is_runtime(cond):
            return self.expr(node.body if self.truth(cond, node.test) else node.orelse)
        (a, emitted_a), (b, emitted_b) = self.expr_apart(node.body), self.expr_apart(node.orelse)
        for v, n in ((a, node.body), (b, node.orelse)):
            if not (is_runtime(v) or is_number(v)):
                raise self.error(n, f"a runtime conditional expression needs numbers, got {describe(v)}")
        dtype, ea, eb = self.common_type(a, b, node)
        cond = self.condition(cond, node.test)
        if not (emitted_a or emitted_b or _shuffles(ea) or _shuffles(eb)):
            return ir.Select(cond, ea, eb, dtype)
        # an operand takes statements (an inlined call) or shuffles: only the chosen one's run, under an `if` (where a
        # per-thread condition is a shuffle some lanes do not reach: the barrier checks reject it)
        chosen = ir.Var("chosen", dtype)
        self.pending.append(ir.If(cond, ir.seq([*emitted_a, ir.Assign(chosen, ea, self.loc(node))]),
                                  ir.seq([*emitted_b, ir.Assign(chosen, eb, self.loc(node))]), self.loc(node)))
        return chosen

    # ----------------------------------------------------------------- calls
    def expr_call(self, node: ast.Call, name_hint: str | None = None, statement: bool = False):
        func = self.expr(node.func)
        if isinstance(func, L.Intrinsic):
            result = self.intrinsic_call(func, node, name_hint)
            if isinstance(result, ir.Stmt) and not statement:
                raise self.error(node, f"td.{func.name}() is a statement and has no value")
            return result
        from .decorators import DeviceFunction, is_kernel  # the decorator module imports this one
        if isinstance(func, DeviceFunction):
            result = self.inline_call(func, node)
            if result is None and not statement:
                raise self.error(node, f"@td.func '{func.name}' returns no value",
                                 "Give it a 'return value', or call it as a statement of its own.")
            return result
        if is_kernel(func):
            raise self.error(node, f"a kernel cannot call the kernel '{func.name}'",
                             "Put the shared code in a @td.func and call it from both.")
        if func is builtins.range or func is L.unroll:
            raise self.error(node, f"{'range' if func is builtins.range else 'td.unroll'}() can only be a for-loop source")
        values = self.in_order(list(node.args) + [k.value for k in node.keywords])
        args, kwargs = values[:len(node.args)], {k.arg: v for k, v in zip(node.keywords, values[len(node.args):])}
        if any(k.arg is None for k in node.keywords) or any(isinstance(a, ast.Starred) for a in node.args):
            raise self.error(node, "*args and **kwargs are not supported in kernel calls")
        if func is builtins.len and len(args) == 1 and isinstance(args[0], ir.Buffer):
            if not args[0].shape:
                raise self.error(node, f"len() of the 0-d tensor '{args[0].name}'")
            return _shape(args[0])[0]           # numpy's len: the first axis
        runtime_args = any(is_runtime(v) for v in list(args) + list(kwargs.values()))
        runtime_items = len(args) == 1 and isinstance(args[0], (tuple, list)) and any(map(is_runtime, args[0]))
        if func in (builtins.min, builtins.max) and (runtime_args or runtime_items):
            return self.extremum(func.__name__, args, kwargs, node)
        if runtime_args and func is builtins.abs:
            return self.math_call("abs", args, node)
        if runtime_args and func in _PY_TYPE_DTYPES:
            return self.cast_to(ir.as_expr(args[0]), _PY_TYPE_DTYPES[func], node)
        if isinstance(func, T.DataType):
            if len(args) != 1 or not (runtime_args or is_number(args[0])):
                raise self.error(node, f"{func.name}(x) takes one number")
            return self.cast_to(args[0], func, node)
        if func is builtins.print:  # runs while translating: a runtime value prints as the expression it is
            args = [ir.expr_str(a) if is_runtime(a) else a for a in args]
        if is_runtime(func):        # e.g. a size symbol named `len`, which hides the builtin in the kernel
            raise self.error(node, f"'{ast.unparse(node.func)}' is a runtime {func.dtype.name} value here, not a "
                                   "function", "A size symbol, parameter or variable hides a function of the same "
                                   "name: rename it.")
        try:
            if not runtime_args:
                return func(*args, **kwargs)
            with ir.elementwise_equality():     # `v == 0` on a runtime value builds a comparison, as `<` does
                return func(*args, **kwargs)
        except DSLError:
            raise
        except Exception as exc:  # noqa: BLE001 - user code raised at compile time
            if isinstance(func, (ir.Buffer, ir.Expr)):
                raise self.error(node, f"{describe(func)} cannot be called") from None
            name = getattr(func, "__name__", repr(func))
            own = (getattr(func, "__module__", None) or "").startswith("taskdsl")    # its message says what to do
            hint = ("Functions called with runtime values must only use arithmetic on them; "
                    "decorate device functions with @td.func.") if runtime_args and not own else None
            if runtime_args and name in L.MATH:
                hint = f"Kernels compute math with taskdsl's own functions: td.{name}(...)."
            why = f"{type(exc).__name__}: {exc}"
            if isinstance(exc, ir.TruthValueError):     # its own text is about compute definitions
                why = ("it tests a value known only when the kernel runs as a Python bool (an `if`, `while`, "
                       "`and`/`or`/`not`, or Python's min/max on it)")
                hint = ("Decorate it with @td.func: a device function may branch on runtime values "
                        "(td.max / td.min for min / max).")
            numpy_function = isinstance(func, np.ufunc) or (getattr(func, "__module__", None) or "").startswith("numpy")
            if (runtime_args or runtime_items) and numpy_function and name not in L.MATH:   # no @td.func wraps it
                hint = ("numpy's functions run at compile time, on compile-time values. On runtime values write "
                        "taskdsl's: `a if c else b` for np.where, td.max(lo, td.min(x, hi)) for np.clip, td.rint for "
                        "np.round, td.max / td.min, and arithmetic for a mean.")
            raise self.error(node, f"calling '{name}' at compile time failed: {why}", hint) from None

    def extremum(self, name: str, args: list, kwargs: dict, node: ast.Call):
        """Python's `min` / `max` of runtime values, of several arguments or of one tuple: td.min / td.max folded
        from the left (a NaN wins, and -0.0 is below 0.0, where Python's gives the first of equal values)."""
        if kwargs:
            raise self.error(node, f"{name}() of runtime values takes no keyword arguments")
        items = args[0] if len(args) == 1 and isinstance(args[0], (tuple, list)) else args
        if not items or len(args) == 1 and items is args:     # min(x) of one number: Python has no such call
            raise self.error(node, f"{name}() needs two or more values, or a non-empty tuple of them")
        return functools.reduce(lambda a, b: self.math_call(name, [a, b], node), items)

    def inline_call(self, dfn, node: ast.Call) -> ir.Expr | None:
        """Inline a `@td.func`: arguments bind its parameters (by value; tensors by reference)."""
        if node.keywords:
            raise self.error(node, "keyword arguments are not supported in @td.func calls")
        if self.depth > 32:
            raise self.error(node, f"@td.func '{dfn.name}' nests too deeply (recursion is not supported)")
        if len(node.args) != len(dfn.params):
            raise self.error(node, f"'{dfn.name}' takes {len(dfn.params)} argument(s), got {len(node.args)}")
        src = dfn.source()
        reassigned = _body_names(src.tree)[1]
        callee_env = {}
        for (pname, pdtype), arg_node in zip(dfn.params, node.args):
            value = self.expr(arg_node)
            # a number for a parameter the callee assigns is a runtime variable, as a local assigned twice is (bound
            # as a constant, an assignment under a runtime `if` took effect while translating, in every thread)
            # an outlined function's numbers are runtime values too: it is compiled once for all of them
            if isinstance(value, ir.Buffer) or not is_runtime(value) and not ((pname in reassigned or dfn.outline)
                                                                              and is_number(value)):
                callee_env[pname] = value
                continue
            dtype = pdtype or ir.as_expr(value).dtype
            if isinstance(value, (ir.Var, ir.SpecialReg)) and value.dtype == dtype and pname not in reassigned and \
                    not (dfn.outline and isinstance(value, ir.Var) and value.kind == "size"):  # (a graph binds sizes)
                # the callee only reads it, and cannot assign the caller's variables: no copy (a copy is one
                # more variable for every later stage, and on the cpu one more per-thread array across barriers)
                callee_env[pname] = value
                continue
            var = ir.Var(pname, dtype)
            # bound now, before the next argument's inlined calls run (Python's order)
            self.pending.append(ir.Assign(var, self.cast_to(value, dtype, arg_node), self.loc(arg_node)))
            callee_env[pname] = var
        ret = ir.Var(f"{dfn.name}_ret", dfn.return_dtype) if dfn.return_dtype is not None else None
        callee = FunctionTranslator(src, dfn.fn, callee_env, self.var_types, ret, self.depth + 1, is_func=True,
                                    reads=self.reads, call_site=self.loc(node))
        body = callee.function_body()
        if dfn.outline and ret is None:
            body = ir.Outlined(body.stmts if type(body) is ir.Seq else (body,), self.loc(node), dfn.name)
        self.pending.append(body)
        return callee.return_var

    # ----------------------------------------------------------------- types
    def dtype_of(self, node: ast.expr) -> T.DataType:
        value = self.expr(node)
        if isinstance(value, T.DataType):
            return value
        if value in _PY_TYPE_DTYPES:
            return _PY_TYPE_DTYPES[value]
        shown = describe(value) if isinstance(value, (ir.Expr, ir.Buffer)) else repr(value)
        raise self.error(node, f"expected a dtype such as td.f32, got {shown}")

    def cast_to(self, value, dtype: T.DataType, node: ast.AST) -> ir.Expr:
        if not (is_runtime(value) or is_number(value)):
            raise self.error(node, f"expected a number, got {describe(value)}")
        if is_number(value):        # converted once, from the Python number (0.1 as an f64: not f32's 0.1)
            number = value.item() if hasattr(value, "item") else value
            if isinstance(number, int) and dtype.is_integer:
                ir.const(number)    # an error past 64 bits (wrapped into `dtype`, 2**70 would store 0 silently)
            return ir.const(number, dtype)
        return ir.convert(value, dtype)

    @staticmethod
    def _name_of(target: ast.expr) -> str | None:
        return target.id if isinstance(target, ast.Name) else None


def _loop_dtype(start, stop, step: int) -> T.DataType:
    """The type of a range() loop's variable: its bounds' promoted type, a Python int taking the other bound's type
    where it fits; i64 where an unsigned type meets a negative number (a bound, or the step, which an unsigned
    variable cannot count down past 0 with, nor compare exactly with a signed bound)."""
    runtime = [b.dtype for b in (start, stop) if is_runtime(b)]
    numbers = [b for b in (start, stop) if not is_runtime(b)]
    if len(runtime) == 1 and runtime[0].holds(numbers[0]):
        dtype = runtime[0]
    else:
        dtype = T.promote(ir.as_expr(start).dtype, ir.as_expr(stop).dtype)
    signed = any(t.kind == "int" for t in runtime) or any(n < 0 for n in numbers) or step < 0
    return T.i64 if dtype.kind == "uint" and signed else dtype


def _widens(old: T.DataType, new: T.DataType) -> bool:
    """Whether assigning a `new` value to an `old` variable should widen the variable (int -> float)."""
    return (new.is_float and not old.is_float) or (new.is_float and old.is_float and new.bits > old.bits)


def translate_body(source: ParsedSource, fn, env: dict, reads: GlobalReads | None = None) -> ir.Stmt:
    """Translate a kernel body to IR, restarting when a runtime variable's type widens; the globals it reads are
    noted in `reads`."""
    var_types: dict = {}
    for _ in range(16):
        try:
            return FunctionTranslator(source, fn, env, var_types, reads=reads).function_body()
        except _Restart:
            continue
    raise DSLError("variable types did not settle during translation", source.loc(source.tree))
