"""What calls of the kernel language's intrinsics (`td.exp`, `td.shared`, `td.atomic_add`, `td.shfl_xor`,
`td.mma_m16n8k16`, `td.dot4`, `td.cp_async`, ...) become in the IR, with their arguments checked at the user's line.

`IntrinsicCalls` is a part of `translator.FunctionTranslator`: its methods translate the arguments with the
translator's own (`expr`, `runtime_value`, `cast_to`, ...) and report errors with its `error`.
"""
from __future__ import annotations

import ast
import math

from .. import ir
from ..ir import types as T
from ..lang import intrinsics as L
from .values import describe, is_number, is_runtime


class IntrinsicCalls:
    """The translation of `td.*` intrinsic calls, by kind: math, memory, barriers, casts, atomics, warp shuffles,
    tensor cores, dot4, async copies and prefetches."""

    def intrinsic_call(self, fn: L.Intrinsic, node: ast.Call, name_hint: str | None):
        """The IR of a call of intrinsic `fn` (an expression, a statement or an allocated buffer), by its kind."""
        kwargs = {k.arg: k.value for k in node.keywords}
        if fn.kind == "math":
            if kwargs:
                raise self.error(node, f"td.{fn.name}() takes no keyword arguments")
            return self.math_call(fn.name, self.in_order(node.args), node)
        if fn.kind == "memory":
            return self.alloc_call(fn, node, name_hint)
        if fn.kind == "barrier":
            if node.args or kwargs:
                raise self.error(node, f"td.{fn.name}() takes no arguments")
            return (ir.SyncThreads if fn.name == "syncthreads" else ir.SyncWarp)(self.loc(node))
        if fn.kind == "cast":
            if len(node.args) != 2 or kwargs:
                raise self.error(node, "td.cast(value, dtype) takes two arguments")
            dtype = self.dtype_of(node.args[1])
            return self.cast_to(self.expr(node.args[0]), dtype, node)
        if fn.kind == "atomic":
            return self.atomic_call(fn, node)
        if fn.kind == "warp":
            return self.warp_call(fn, node, kwargs)
        if fn.kind in ("tensor", "hint"):
            return getattr(self, fn.name + "_call")(node, kwargs)
        raise self.error(node, f"td.{fn.name}() can only be used as a for-loop source")

    def math_call(self, name: str, args: list, node: ast.AST):
        """td.<name>(args): folded in Python where every argument is a compile-time number, else an IR math call."""
        arity = ir.expr.MATH_ARITY.get(name, 1)
        if len(args) != arity:
            raise self.error(node, f"{name}() takes {arity} argument{'s' if arity > 1 else ''}, got {len(args)}")
        for a in args:
            if not (is_runtime(a) or is_number(a)):
                raise self.error(node, f"{name}() needs numbers, got {describe(a)}")
        if not any(is_runtime(a) for a in args):
            return L.MATH[name].host(*args)
        return L.math_expr(name, args)

    def alloc_call(self, fn: L.Intrinsic, node: ast.Call, name_hint: str | None):
        """td.shared / td.registers(dtype, shape): a buffer of compile-time shape, allocated where the call is."""
        if len(node.args) != 2 or node.keywords:
            raise self.error(node, f"td.{fn.name}(dtype, shape) takes two arguments")
        dtype = self.dtype_of(node.args[0])
        shape = self.expr(node.args[1])
        shape = shape if isinstance(shape, tuple) else (shape,)
        if not shape or not all(isinstance(d, int) and not isinstance(d, bool) and d > 0 for d in shape):
            shown = ", ".join(ir.expr_str(d) if is_runtime(d) else repr(d) for d in shape)
            raise self.error(node.args[1], f"the shape of td.{fn.name}() must be positive ints known at compile time, "
                                           f"got ({shown}{',' if len(shape) == 1 else ''})")
        scope = "shared" if fn.name == "shared" else "register"
        buf = ir.Buffer(name_hint or scope, dtype, tuple(ir.const(d) for d in shape), scope)
        self.pending.append(ir.Allocate(buf, self.loc(node)))
        return buf

    def atomic_call(self, fn: L.Intrinsic, node: ast.Call):
        """td.atomic_<op>(tensor[index], value) on a global or shared tensor of 32- or 64-bit elements."""
        if len(node.args) != 2 or node.keywords or not isinstance(node.args[0], ast.Subscript):
            raise self.error(node, f"td.{fn.name}(tensor[index], value) takes a tensor element and a value")
        buf, idx = self.subscript_target(node.args[0])
        if buf.scope == "register":
            raise self.error(node, "atomics work on global or shared tensors, not registers")
        if buf.dtype.bits < 32 or buf.dtype.is_bool:
            raise self.error(node, f"atomics need 32- or 64-bit elements; '{buf.name}' holds {buf.dtype.name}")
        idx, value = self.then(list(idx), node.args[1], evaluate=lambda: self.runtime_value(node.args[1], buf.dtype))
        value = self.cast_to(value, buf.dtype, node)
        return ir.Atomic(fn.name.removeprefix("atomic_"), buf, tuple(idx), value)

    def warp_call(self, fn: L.Intrinsic, node: ast.Call, kwargs: dict):
        """A warp shuffle, td.shfl_*(value, lane, width=32) (bools moved as i32)."""
        if len(node.args) != 2 or set(kwargs) - {"width"}:
            raise self.error(node, f"td.{fn.name}(value, lane, width=32) takes a value and a lane argument")
        width = self.expr(kwargs["width"]) if "width" in kwargs else 32
        if not isinstance(width, int) or width not in (1, 2, 4, 8, 16, 32):
            raise self.error(node, "the width of a warp shuffle must be a power of two <= 32 known at compile time")
        value = self.runtime_value(node.args[0])
        lane = self.cast_to(self.runtime_value(node.args[1], T.i32), T.i32, node.args[1])
        if value.dtype.is_bool:     # no bool shuffle in CUDA: move it as an i32
            return ir.binary("!=", ir.Call(fn.name, (ir.Cast(value, T.i32), lane, ir.const(width)), T.i32), 0)
        return ir.Call(fn.name, (value, lane, ir.const(width)), value.dtype)

    # ----------------------------------------------------------------- tensor cores, dot4, async copies
    def buffer_ref(self, node: ast.expr, what: str, scope: str | None, fragment: bool = False) -> ir.Ref:
        """`T[i, j]` (an element) or, for a `fragment`, `T` / `T[i]` (the sub-tensor of the remaining axes), of a
        tensor in `scope` (None: any)."""
        base = self.expr(node.value if isinstance(node, ast.Subscript) else node)
        if not isinstance(base, ir.Buffer):
            got = "a runtime value" if is_runtime(base) else repr(base)
            raise self.error(node, f"{what} must be a {'register array' if fragment else 'tensor element'}, got {got}")
        if scope is not None and base.scope != scope:
            raise self.error(node, f"{what} must be in {scope} memory; '{base.name}' is {base.scope}")
        if isinstance(node, ast.Subscript):
            return ir.Ref(*self.buffer_indices(base, node, partial=fragment))
        if not fragment:
            raise self.error(node, f"{what} must be one element, e.g. {base.name}[i, j]")
        return ir.Ref(base, ())

    def fragment(self, node: ast.expr, what: str, sizes: tuple, dtypes: tuple) -> tuple:
        """(Ref, element count) of a register fragment of one of `sizes` elements of one of `dtypes`."""
        ref = self.buffer_ref(node, what, "register", fragment=True)
        size = math.prod(d.value for d in ref.buffer.shape[len(ref.indices):])
        if size not in sizes:
            raise self.error(node, f"{what} must be a fragment of {' or '.join(map(str, sizes))} elements, got {size}",
                             "Index the leading axes of a register array and leave the fragment's axes free, "
                             "e.g. acc[mi, ni] of td.registers(f32, (MI, NI, 4)).")
        if ref.dtype not in dtypes:
            raise self.error(node, f"{what} must hold {' or '.join(t.name for t in dtypes)} elements; "
                                   f"'{ref.buffer.name}' holds {ref.dtype.name}")
        return ref, size

    def compile_time_count(self, node: ast.expr, what: str) -> int:
        """The value of `node`, which must be a non-negative int known at compile time."""
        value = self.expr(node)
        if isinstance(value, bool) or not isinstance(value, int) or value < 0:
            shown = ir.expr_str(value) if is_runtime(value) else repr(value)
            raise self.error(node, f"{what} must be a non-negative int known at compile time, got {shown}")
        return value

    def mma_m16n8k16_call(self, node: ast.Call, kwargs: dict) -> ir.Mma:
        """td.mma_m16n8k16(a, b, c): f16 or bf16 fragments into f32."""
        return self.mma_call(node, kwargs, 16, ((T.f16,), (T.bf16,)))

    def mma_m16n8k32_call(self, node: ast.Call, kwargs: dict) -> ir.Mma:
        """td.mma_m16n8k32(a, b, c): 8-bit integer fragments into i32, or 8-bit float ones into f32."""
        # PTX pairs either 8-bit integer type with either, and either 8-bit float with either
        return self.mma_call(node, kwargs, 32, ((T.i8, T.u8), (T.f8e4m3, T.f8e5m2)))

    def mma_call(self, node: ast.Call, kwargs: dict, k: int, kinds: tuple) -> ir.Mma:
        """td.mma_m16n8k{k}(a, b, c): a and b of one of `kinds` (tuples of types that mix), c f32 (i32 for
        integer operands)."""
        if len(node.args) != 3 or kwargs:
            raise self.error(node, f"td.mma_m16n8k{k}(a, b, c) takes three register fragments")
        per_register = k // 8            # operand elements in a 32-bit register
        a, _ = self.fragment(node.args[0], "the a fragment", (4 * per_register,), sum(kinds, ()))
        kind = next(kind for kind in kinds if a.dtype in kind)
        b, _ = self.fragment(node.args[1], "the b fragment", (2 * per_register,), kind)
        c, _ = self.fragment(node.args[2], "the c fragment", (4,), (T.f32 if a.dtype.is_float else T.i32,))
        return ir.Mma(a, b, c, self.loc(node))

    DOT4_LANES = (4, 8, 16)     # x86's vpdpbusd on 128-, 256- and 512-bit vectors

    def dot4_call(self, node: ast.Call, kwargs: dict) -> ir.Dot4:
        """td.dot4(acc[...], a[...], b[...], lanes): acc's `lanes` i32 elements from the one named += the dot products
        of the four u8 from a's element on with each four i8 of b's 4 * lanes from its element on."""
        if len(node.args) != 4 or kwargs:
            raise self.error(node, "td.dot4(acc[i, j], a[r, k], b[q, 4 * j], lanes) takes an i32 register element, "
                                   "a u8 element, an i8 element and the lane count (4, 8 or 16)")
        lanes = self.compile_time_count(node.args[3], "the lane count of dot4")
        if lanes not in self.DOT4_LANES:
            raise self.error(node.args[3], f"dot4 computes 4, 8 or 16 lanes (a 128-, 256- or 512-bit vector), got "
                                           f"{lanes}")
        acc = self.buffer_ref(node.args[0], "the dot4 accumulator", "register")
        refs = [acc, self.buffer_ref(node.args[1], "the dot4 a operand", None),
                self.buffer_ref(node.args[2], "the dot4 b operand", None)]
        whats = ("accumulator", "a operand", "b operand")
        for ref, arg, dtype, what in zip(refs, node.args, (T.i32, T.u8, T.i8), whats):
            if ref.dtype != dtype:
                raise self.error(arg, f"the dot4 {what} must hold {dtype.name} elements; '{ref.buffer.name}' holds "
                                      f"{ref.dtype.name}", "dot4 multiplies u8 a by i8 b into i32 (x86's vpdpbusd); "
                                                           "offset other operands into those types first")
        return ir.Dot4(*refs, lanes, self.loc(node))

    def ldmatrix_call(self, node: ast.Call, kwargs: dict) -> ir.LdMatrix:
        """td.ldmatrix(frag, smem[row, col], trans=False): one, two or four 8x8 matrices from shared memory."""
        if len(node.args) != 2 or set(kwargs) - {"trans"}:
            raise self.error(node, "td.ldmatrix(frag, smem[row, col], trans=False) takes a register fragment and "
                                   "a shared-memory element")
        src = self.buffer_ref(node.args[1], "the ldmatrix source", "shared")
        if src.dtype.bits not in (8, 16):
            raise self.error(node.args[1], f"ldmatrix loads 16-bit or 8-bit elements; '{src.buffer.name}' holds "
                                           f"{src.dtype.name}")
        per_register = 32 // src.dtype.bits
        frag, size = self.fragment(node.args[0], "the ldmatrix fragment", tuple(n * per_register for n in (1, 2, 4)),
                                   (src.dtype,))
        trans = self.expr(kwargs["trans"]) if "trans" in kwargs else False
        if not isinstance(trans, bool):
            raise self.error(kwargs["trans"], "trans= must be True or False, known at compile time")
        if trans and src.dtype.bits == 8:
            raise self.error(node, "ldmatrix's trans= transposes 16-bit elements, not 8-bit ones",
                             "Store the 8-bit tile transposed in shared memory instead (an mma_m16n8k32 takes B "
                             "k-major: its rows are B's columns).")
        return ir.LdMatrix(frag, src, size // per_register, trans, self.loc(node))

    def cp_async_call(self, node: ast.Call, kwargs: dict) -> ir.CpAsync:
        """td.cp_async(smem[i, j], tensor[gi, gj], n, pred=True): 4, 8 or 16 bytes copied without registers."""
        if len(node.args) != 3 or set(kwargs) - {"pred"}:
            raise self.error(node, "td.cp_async(smem[i, j], tensor[gi, gj], n, pred=True) takes a shared element, "
                                   "a global element and an element count")
        dst = self.buffer_ref(node.args[0], "the cp_async destination", "shared")
        src = self.buffer_ref(node.args[1], "the cp_async source", "global")
        if src.dtype != dst.dtype:
            raise self.error(node, f"cp_async copies between tensors of one dtype, got {src.dtype.name} to "
                                   f"{dst.dtype.name}")
        count = self.compile_time_count(node.args[2], "the element count of cp_async")
        if count * dst.dtype.bits not in (32, 64, 128):
            raise self.error(node.args[2], f"cp_async copies 4, 8 or 16 bytes; {count} {dst.dtype.name} elements "
                                           f"are {count * dst.dtype.bits / 8:g} bytes")
        pred = self.condition(self.runtime_value(kwargs["pred"]), kwargs["pred"]) if "pred" in kwargs else \
            ir.const(True)
        return ir.CpAsync(dst, src, count, pred, self.loc(node))

    def prefetch_call(self, node: ast.Call, kwargs: dict) -> ir.Prefetch:
        """td.prefetch(tensor[i, j]): a cache hint for one element of a global tensor."""
        if len(node.args) != 1 or kwargs:
            raise self.error(node, "td.prefetch(tensor[i, j]) takes one element of a global tensor")
        return ir.Prefetch(self.buffer_ref(node.args[0], "the prefetched address", "global"), self.loc(node))

    def cp_async_commit_call(self, node: ast.Call, kwargs: dict) -> ir.CpAsyncCommit:
        """td.cp_async_commit(): the async copies issued so far become a group."""
        if node.args or kwargs:
            raise self.error(node, "td.cp_async_commit() takes no arguments")
        return ir.CpAsyncCommit(self.loc(node))

    def cp_async_wait_call(self, node: ast.Call, kwargs: dict) -> ir.CpAsyncWait:
        """td.cp_async_wait(n=0): wait until at most n groups of async copies are in flight."""
        given = list(node.args) + ([kwargs["n"]] if "n" in kwargs else [])
        if len(given) > 1 or set(kwargs) - {"n"}:
            raise self.error(node, "td.cp_async_wait(n=0) takes the number of groups that may stay in flight")
        pending = self.compile_time_count(given[0], "the group count of cp_async_wait") if given else 0
        return ir.CpAsyncWait(pending, self.loc(node))
