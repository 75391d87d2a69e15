"""Products with few rows on the cpu target (matrix-vector, vector-matrix, dot), as reductions.

The register-tile template computes whole micro-tiles of 6 rows and packs panels of B per block:
for one row that is six times the multiply-adds of a product whose cost is reading B once
(`(1, 768) @ (768, 3072)` took 1.9 ms, 16x numpy's time). As rule-based reductions, a product
with B as (K, N) runs as 'columns' (each of B's rows added, times a's element, into a row of
accumulators) and one with B given as (N, K) rows (linear's weight, or a column B as one row)
as a dot product per output, both reading B once, contiguously: 1.0 ms and 0.26 ms for that
product (one thread); the template wins from about 4 rows on. With B packed once (a model's
constant weights), the template's plans of at most MAX_ROWS rows run `packed_rows_kernel`.
"""
import functools

import numpy as np

import taskdsl as td
from taskdsl import blockIdx, f32

from .elementwise import cached_op

MAX_ROWS = 3        # rows (M) at most of a product computed as a reduction (with packed B: `packed_rows_kernel`)
# `packed_rows_kernel` launched on fewer bytes (packed B, mostly) runs on one thread: the hand-off to a second costs
# more than it saves. A chain of 16 products (1, K) @ (K, K), each with its own weights, K = 128 / 192 / 256 (64 / 144
# / 256 KiB of B), per product: 2.3 / 3.4 / 4.7 us on one thread, 2.6 / 3.8 / 4.4 on two; an LSTM of hidden 128 (R:
# 256 KiB), its steps' small kernels between the products: 0.201-0.205 ms on one, 0.208-0.339 on two (by process)
ROWS_SERIAL_BYTES = 320 * 1024


def applies(m: int, n: int, batched: bool) -> bool:
    """Whether the cpu target computes a product of `m` rows and `n` columns (not batched) as a reduction."""
    return td.get_target() == "cpu" and not batched and (m <= MAX_ROWS or n == 1)


def _op(dtype: td.ir.types.DataType, rows_b: bool) -> td.Op:
    """C (M, N) = A (M, K) @ B, B as (K, N) or (`rows_b`) as (N, K); the products in f32 at least."""
    a = td.placeholder("a", dtype, ("M", "K"))
    b = td.placeholder("b", dtype, ("N", "K") if rows_b else ("K", "N"))
    wide = td.f64 if dtype == td.f64 else td.f32

    def term(m, n, k):
        return td.cast(a[m, k], wide) * td.cast(b[n, k] if rows_b else b[k, n], wide)

    c = td.reduce("rows_product", ("M", "N"), ("K",), term, op="sum", dtype=dtype)
    return td.op([a, b], [c], name="rows_product")


def product(a2: np.ndarray, b: np.ndarray, dtype, rows_b: bool = False) -> np.ndarray:
    """A (M, K) @ B for B (K, N), or (`rows_b`) B (N, K) @ ... as `a2 @ b.T` (contiguous arrays of `dtype`)."""
    if not rows_b and b.shape[1] == 1:
        b, rows_b = b.reshape(1, -1), True        # a column: the same elements as one row
    op = cached_op(("rows_product", dtype, rows_b), lambda: _op(dtype, rows_b))
    return op(a2, b)[0]


@functools.cache
def packed_rows_kernel(p, dtype, out_dtype, rows: int, staged_a: bool = False) -> td.Kernel:
    """The cpu template's kernel for packed B (`matmul_cpu.pack_b` at point `p`) and A of `rows` rows (at most
    MAX_ROWS; a model's classifier at batch 1): one block per column panel of B, its `rows` x BN sums in registers
    over the whole k range, streaming the panel once, row after row, and stored through the fused epilogue. The
    register-tile kernel computes whole micro-tiles of 6 rows (and two micro-kernel calls for a k block of a
    64-column panel). ResNet-50's classifier, (1, 2048) @ (2048, 1000) with its bias, two threads, both kernels
    built in one process: 0.115 ms there and 0.048 here, warm; in the model's run, its weights coming from DRAM,
    0.40 and 0.28 ms. Its parameters, the split of k over z-slices and the packed layout are the template's.
    With `staged_a` (float A: for a prologue fused into it), A's rows are copied to f32 a k block at a time first
    (`staged_rows_times_panel`); without a prologue the copy only costs (its buffer's allocation, each launch)."""
    BN, KC = p.block[1], p.bk
    assert 1 <= rows <= MAX_ROWS
    # 8-bit integers: a k block's sums at a time in f32 (exact: `gemm.exact_k`), added up in i32
    integer = not dtype.is_float
    sums_type = td.i32 if integer else f32

    staged_a = staged_a and not integer
    name = f"rows_matmul_{rows}x{BN}_packed" + ("_staged" if staged_a else "")

    def grid(M, N, BZ):
        if M > rows:        # its sums hold `rows` rows: past them, rows of C would be left unwritten
            raise ValueError(f"kernel '{name}' computes at most {rows} rows of A, got M = {M} (a plan of M rows "
                             f"builds its kernel: gemm.plan(a.shape, b.shape, ...).kernel(packed_b=True))")
        return td.cdiv(N, BN), 1, BZ

    @td.func
    def rows_times_panel(A, B, c, za, first, k0, k1, M):
        """c += A[za, :rows, k0:k1] @ the panel's rows k0..k1 (packed B's, from row `first`)."""
        for k in range(k0, k1):
            for x in td.unroll(rows):
                a = td.cast(A[za, td.min(x, M - 1), k], f32)
                for y in td.unroll(BN):
                    c[x, y] += a * B[first + k, y]

    @td.func
    def staged_rows_times_panel(A, B, c, staging, za, first, k0, k1, M):
        """`rows_times_panel`, A's rows copied to `staging` (1, rows, KC) in f32 first: a prologue fused into A's
        loads (a GRU's sigmoid(...) * h) is computed there once a block, in a loop of its own that vectorizes, not
        once per k step beside the multiply-adds."""
        for x in td.unroll(rows):
            for k in range(k1 - k0):
                staging[0, x, k] = td.cast(A[za, td.min(x, M - 1), k0 + k], f32)
        rows_times_panel(staging, B, c, 0, first + k0, 0, k1 - k0, rows)

    @td.kernel(grid=grid, block=1, name=name)
    def rows_matmul(A: dtype["BA", "M", "K"], B: f32["RB", BN], C: out_dtype["BZ", "M", "N"],
                    batch_index: td.i32["BZ", 2], split: td.i32):
        c = td.registers(f32, (rows, BN))       # indexed by constants only: LLVM keeps them in vector registers
        sums = td.shared(sums_type, (rows, BN))     # ...and the stores read them from here
        za, zb = batch_index[blockIdx.z, 0], batch_index[blockIdx.z, 1]
        chunk = td.cdiv(td.cdiv(K, KC), split) * KC      # split-k: this z-slice's range of k, as the template's
        k_begin = blockIdx.z % split * chunk
        k_end = td.min(K, k_begin + chunk)
        col0 = blockIdx.x * BN
        first = (zb * td.cdiv(N, BN) + blockIdx.x) * K    # the panel's first row in packed B
        for x in td.unroll(rows):
            for y in td.unroll(BN):
                c[x, y] = 0.0
        if integer:
            for x in td.unroll(rows):
                for y in td.unroll(BN):
                    sums[x, y] = 0
            for k0 in range(k_begin, k_end, KC):
                rows_times_panel(A, B, c, za, first, k0, td.min(k_end, k0 + KC), M)
                for x in td.unroll(rows):
                    for y in td.unroll(BN):
                        sums[x, y] += td.cast(c[x, y], td.i32)
                        c[x, y] = 0.0
        else:
            if staged_a:
                staging = td.shared(f32, (1, rows, KC))
                for k0 in range(k_begin, k_end, KC):
                    staged_rows_times_panel(A, B, c, staging, za, first, k0, td.min(k_end, k0 + KC), M)
            else:
                rows_times_panel(A, B, c, za, first, k_begin, k_end, M)
            for x in td.unroll(rows):
                for y in td.unroll(BN):
                    sums[x, y] = c[x, y]
        for x in range(td.min(rows, M)):
            for y in range(td.min(BN, N - col0)):
                C[blockIdx.z, x, col0 + y] = td.cast(sums[x, y], out_dtype)

    rows_matmul.serial_below = ROWS_SERIAL_BYTES
    return rows_matmul
