"""Replace mma and ldmatrix by plain IR: their meaning on the cpu target.

Both warp-wide instructions are an exchange through a per-block scratch buffer: every lane
stores its operands into its row, the warp synchronizes (a syncwarp, which the cpu backend
turns into a region boundary), and each lane then reads the rows of the lanes it needs.
`mma`: lanes publish their a and b fragments (as f32, or i32 for integer operands) and each computes its
four c elements from the lanes that the PTX fragment layouts give each A and B element to.
`ldmatrix`: lanes publish their row addresses (the indices of each row's first element)
and each loads its elements from the rows the layout gives it (`cp_async` is
`emulate_async_copies`'s). Runs after `emulate_async_copies`: on n-d IR in debug mode, on flattened IR
otherwise (an ldmatrix row address is then one linear index).
"""
from __future__ import annotations

import dataclasses

from .. import ir
from ..ir import types as T
from .emulate_async_copies import linear_thread_index

def emulate_tensor_cores(fn: ir.Function, flat: bool = False) -> ir.Function:
    """`fn` with every mma and ldmatrix replaced by loads, stores and syncwarps; `flat`: `fn` was flattened."""
    emulator = _Emulator(fn, flat)
    body = emulator.visit(fn.body)
    allocations = [ir.Allocate(b, scratch=True) for b in emulator.scratch.values()]
    return dataclasses.replace(fn, body=ir.seq(allocations + [body]) if allocations else body)


class _Emulator(ir.Rewriter):
    statements_only = True

    def __init__(self, fn: ir.Function, flat: bool):
        self.flat = flat
        self.tid = linear_thread_index(fn)
        self.lane = self.tid % 32
        self.warp = self.tid // 32 * 32   # the first thread of this thread's warp
        self.num_threads = fn.num_threads
        self.scratch: dict = {}

    def exchange(self, name: str, dtype: T.DataType, values: list, loc) -> tuple:
        """(scratch buffer `name`, the statements by which every lane publishes `values` in its row of it).

        The stores sit between two syncwarps: the first lets the readers of the previous exchange
        through the buffer finish, the second makes the new rows visible to the whole warp.
        """
        if name not in self.scratch:
            self.scratch[name] = ir.Buffer(name, dtype, (ir.const(self.num_threads * len(values)),), "shared")
        buf = self.scratch[name]
        stores = [ir.Store(buf, (self.tid * len(values) + r,), ir.Cast(v, dtype) if v.dtype != dtype else v, loc)
                  for r, v in enumerate(values)]
        return buf, [ir.SyncWarp(loc, emulated=True), *stores, ir.SyncWarp(loc, emulated=True)]

    def visit_Mma(self, s: ir.Mma) -> ir.Stmt:
        per = 32 // s.a.dtype.bits          # operand elements in a 32-bit register: 2 (k 16) or 4 (k 32)
        half = s.k // 2
        fragments = [ir.Load(s.a.buffer, s.a.element(r, self.flat)) for r in range(4 * per)]
        fragments += [ir.Load(s.b.buffer, s.b.element(r, self.flat)) for r in range(2 * per)]
        cols = len(fragments)                # a lane's scratch row: its a fragment, then its b fragment
        scratch, out = self.exchange(f"mma{s.k}_scratch{s.c.dtype.name}", s.c.dtype, fragments, s.loc)
        group, tig = self.lane // 4, self.lane % 4   # groupID, threadID_in_group
        # A[row, k] is a_{k%per + per*(row//8) + 2*per*(k//half)} of lane 4*(row%8) + (k%half)//per;
        # B[k, col] is b_{k%per + per*(k//half)} of lane 4*col + (k%half)//per.
        a_row = ir.Var("mma_a", T.i32)
        b_rows = [ir.Var("mma_b", T.i32) for _ in range(2)]
        out.append(ir.Assign(a_row, (self.warp + group * 4) * cols, s.loc))
        out += [ir.Assign(b_rows[lo], (self.warp + (tig * 2 + lo) * 4) * cols, s.loc) for lo in range(2)]
        # the products of each c element in a loop, not unrolled: numba's time grows with the code it types
        # (64 unrolled products an mma made a tensor-core kernel several times slower to compile)
        k, acc = ir.Var("mma_k", T.i32), ir.Var("mma_acc", s.c.dtype)
        lane_offset = (k % half) // per * cols + k % per
        for i in range(4):   # c_i is D[groupID + 8 * (i // 2), 2 * threadID_in_group + i % 2]
            a = ir.Load(scratch, (a_row + (lane_offset + per * (i // 2) + 2 * per * (k // half)),))
            b = ir.Load(scratch, (b_rows[i % 2] + (lane_offset + 4 * per + per * (k // half)),))
            out += [ir.Assign(acc, ir.Load(s.c.buffer, s.c.element(i, self.flat)), s.loc),
                    ir.For(k, ir.const(0), ir.const(s.k), ir.const(1), ir.Assign(acc, acc + a * b, s.loc), loc=s.loc),
                    ir.Store(s.c.buffer, s.c.element(i, self.flat), acc, s.loc)]
        return ir.seq(out)

    def visit_LdMatrix(self, s: ir.LdMatrix) -> ir.Stmt:
        src, lane, rank = s.src.buffer, self.lane, len(s.src.indices)
        rows, out = self.exchange(f"ldmatrix_rows{rank}", T.i32, list(s.src.indices), s.loc)
        per = 32 // src.dtype.bits          # elements of a 32-bit register: 2 of 16 bits, 4 of 8 bits
        for j in range(s.num):
            for h in range(per):
                # lane l gets elements per*j + h from row l//4, columns per*(l%4) + h of matrix j (its 4 bytes
                # of the row); with .trans (16-bit) from rows 2*(l%4) + h, column l//4. Lane 8j + r gave row r's
                # address.
                row, column = (lane % 4 * 2 + h, lane // 4) if s.trans else (lane // 4, lane % 4 * per + h)
                start = ir.Ref(src, tuple(ir.Load(rows, ((self.warp + 8 * j + row) * rank + d,)) for d in range(rank)))
                value = ir.Load(src, start.element(column, self.flat))
                out.append(ir.Store(s.frag.buffer, s.frag.element(per * j + h, self.flat), value, s.loc))
        return ir.seq(out)
