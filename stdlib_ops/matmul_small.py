"""Products of small matrices on the cpu target: (..., M, K) @ (..., K, N), M <= 128 and N <= 64.

The register-tile template computes whole micro-tiles (6 x 32 with AVX-512) in blocks of 48 x 64 or more, with
their sums kept in memory between k blocks and B's panels packed per block: a 4 x 4 product fills a sixth of a
micro-tile's rows and an eighth of its columns (4096 products of 4 x 4 matrices: 0.48 ms, numpy 0.21). Here a
kernel per (M, N) keeps a product's M x N sums, a chunk of rows at a time, in registers over the whole k range,
reading A and B in place: a block per product, its sizes built in, so LLVM vectorizes each row of sums across the
N columns (0.09 ms); with one column, each row's dot product in interleaved sums over k. From 128 x 128 outputs
on, the two run about as fast (docs/templates.md), and each (M, N) here is a compile of its own, where the
template's one kernel serves every shape (under `td.fast_compile`, one kernel here serves them all too).
"""
import functools

import taskdsl as td
from taskdsl import blockIdx, f32
from taskdsl.backend.cpu.launch import num_threads
from taskdsl.passes.unroll import MAX_COPIES
from taskdsl.runtime.config import fast_compile_enabled

from . import gemv

MAX_M = 128         # rows (M) at most of a product this kernel computes
MAX_N = 64          # columns (N) at most
LANES = 16          # interleaved sums of a row's dot product, for one column
ONE_THREAD_MACS = 1 << 18   # multiply-adds at most of a batch with fewer products than threads (a block each)


def applies(batch: int, m: int, n: int, k: int) -> bool:
    """Whether the cpu computes `batch` products of (m x k) @ (k x n) with `small_matmul_kernel`: small matrices,
    enough of them for every thread, or too few multiply-adds for the threads to matter."""
    return 1 <= m <= MAX_M and 1 <= n <= MAX_N and (batch >= num_threads() or batch * m * n * k <= ONE_THREAD_MACS)


def rows_at_once(m: int, n: int) -> int:
    """The rows of sums a kernel for m x n outputs keeps in registers at once: at most MAX_COPIES sums (the
    multiply-adds the cpu target unrolls for one k)."""
    return max(1, min(m, MAX_COPIES // n))


def small_matmul_kernel(dtype, out_dtype, m: int, n: int, b_dtype=None) -> td.Kernel:
    """C[z] = A[za] @ B[zb] for each z-slice z of `batch_index`, with the register-tile template's parameters
    and meaning (batch dims broadcast by the table; z-slice z sums chunk z % split of k), C's sizes built in
    (m x n), K any; the sums in f32 (8-bit integers' exact where the plan splits k into z-slices of at most
    `gemm.exact_k` products). The rows go in chunks of `rows_at_once`, the last one of the rest: each
    chunk's size is a constant, so its multiply-adds unroll with their sums in registers. The sums reach C
    through a buffer and a loop left to LLVM: unrolled, a fused epilogue would be in the source once a store.
    Under `td.fast_compile`, where nothing unrolls, one kernel of any sizes serves every (m, n)
    (`any_small_matmul_kernel`)."""
    if fast_compile_enabled():
        return any_small_matmul_kernel(dtype, out_dtype, b_dtype)
    return _small_matmul_kernel(dtype, out_dtype, m, n, b_dtype)


@functools.cache
def any_small_matmul_kernel(dtype, out_dtype, b_dtype=None) -> td.Kernel:
    """`small_matmul_kernel` with C's sizes read from its shape (M <= MAX_M rows, N <= MAX_N columns): a row's N
    sums at a time, in loops over them. The kernel of `td.fast_compile`: the sized kernels' loops stay loops
    there too, and each (m, n) was a numba compile of its own (a model's attention and projections at a few
    sequence lengths: a dozen)."""
    @td.func
    def product(A, B, C, z, za, zb, k_begin, k_end):
        """C[z] = A[za, :, k_begin:k_end] @ B[zb, k_begin:k_end], a row at a time."""
        sums = td.registers(f32, (MAX_N,))
        for i in range(C.shape[1]):
            for y in range(C.shape[2]):
                sums[y] = 0.0
            for k in range(k_begin, k_end):
                a = td.cast(A[za, i, k], f32)
                for y in range(C.shape[2]):
                    sums[y] += a * td.cast(B[zb, k, y], f32)
            for y in range(C.shape[2]):
                C[z, i, y] = td.cast(sums[y], out_dtype)
    return _batched(dtype, out_dtype, "M", "N", "small_matmul", product, b_dtype)


def _batched(dtype, out_dtype, m, n, name: str, product, b_dtype=None) -> td.Kernel:
    """The kernel both builds share: block z computes C[z] = A[za] @ B[zb] over its chunk of k (z-slice z of
    `batch_index`, chunk z % split) by `product`, a `td.func` of (A, B, C, z, za, zb, k_begin, k_end); m and n
    are C's sizes, numbers or size symbols; B is of `b_dtype` where it is not A's type."""
    @td.kernel(grid=lambda BZ: BZ, block=1, name=name)
    def small_matmul(A: dtype["BA", m, "K"], B: (b_dtype or dtype)["BB", "K", n], C: out_dtype["BZ", m, n],
                     batch_index: td.i32["BZ", 2], split: td.i32):
        z = blockIdx.x
        chunk = td.cdiv(K, split)
        k_begin = z % split * chunk
        product(A, B, C, z, batch_index[z, 0], batch_index[z, 1], k_begin, td.min(K, k_begin + chunk))
    return small_matmul


@functools.cache
def _small_matmul_kernel(dtype, out_dtype, m: int, n: int, b_dtype=None) -> td.Kernel:
    """`small_matmul_kernel` (optimized builds)."""
    rows = rows_at_once(m, n)
    whole, rest = m // rows * rows, m % rows

    def chunk(size: int):
        @td.func
        def product_rows(A, B, C, c, fa, fb, sums, z, za, zb, i0, k_begin, k_end):
            """C[z, i0 : i0 + size] = A[za, i0 : i0 + size, k_begin:k_end] @ B[zb, k_begin:k_end]."""
            for x in td.unroll(size):
                for y in td.unroll(n):
                    c[x, y] = 0.0
            for k in range(k_begin, k_end):
                for x in range(size):
                    fa[x] = td.cast(A[za, i0 + x, k], f32)
                for y in range(n):
                    fb[y] = td.cast(B[zb, k, y], f32)
                for x in td.unroll(size):
                    for y in td.unroll(n):
                        c[x, y] += fa[x] * fb[y]
            for x in td.unroll(size):
                for y in td.unroll(n):
                    sums[x, y] = c[x, y]
            for x in range(size):
                for y in range(n):
                    C[z, i0 + x, y] = td.cast(sums[x, y], out_dtype)
        return product_rows

    @td.func
    def column(A, B, C, lanes, z, za, zb, k_begin, k_end):
        """C[z, :, 0] = A[za, :, k_begin:k_end] @ B[zb, k_begin:k_end, 0], each row's dot product in LANES
        interleaved sums (B's one column is contiguous: a vector of multiply-adds a step, where the chunks of rows
        would multiply one element at a time, reading A's rows K apart)."""
        body = k_end - (k_end - k_begin) % LANES
        for i in range(m):
            for x in td.unroll(LANES):
                lanes[x, 0] = 0.0
            for k in range(k_begin, body, LANES):
                for x in td.unroll(LANES):
                    lanes[x, 0] += td.cast(A[za, i, k + x], f32) * td.cast(B[zb, k + x, 0], f32)
            for half in (8, 4, 2, 1):
                for x in td.unroll(half):
                    lanes[x, 0] += lanes[x + half, 0]
            for k in range(body, k_end):
                lanes[0, 0] += td.cast(A[za, i, k], f32) * td.cast(B[zb, k, 0], f32)
            C[z, i, 0] = td.cast(lanes[0, 0], out_dtype)

    whole_rows, rest_rows = chunk(rows), chunk(max(rest, 1))

    @td.func
    def product(A, B, C, z, za, zb, k_begin, k_end):
        """C[z] = A[za, :, k_begin:k_end] @ B[zb, k_begin:k_end]: one column's dot products, or chunks of rows."""
        if n == 1:
            lanes = td.registers(f32, (LANES, 1))
            column(A, B, C, lanes, z, za, zb, k_begin, k_end)
        else:
            c = td.registers(f32, (rows, n))
            fa = td.registers(f32, (rows,))
            fb = td.registers(f32, (n,))
            sums = td.shared(f32, (rows, n))
            for i0 in range(0, whole, rows):
                whole_rows(A, B, C, c, fa, fb, sums, z, za, zb, i0, k_begin, k_end)
            if rest:
                rest_rows(A, B, C, c, fa, fb, sums, z, za, zb, whole, k_begin, k_end)
    kernel = _batched(dtype, out_dtype, m, n, f"small_matmul_{m}x{n}", product, b_dtype)
    # on one thread below `gemv.ROWS_SERIAL_BYTES` per row of A (each of B's elements is used once a row, so that many
    # multiply-adds as the rows kernel's): an LSTM step's (1, 64) @ (4 gates, 64, 64) took 3.8-4.4 us a launch
    # shared out, 1.9 on one thread
    kernel.serial_below = gemv.ROWS_SERIAL_BYTES // m
    return kernel
