"""The SIMT matmul template: C[z] = A[za] @ B[zb] on CUDA cores, f32 accumulation.

The output tile of a block is the task mapping of the Hidet paper,

    spatial(wm, wn) * repeat(rm, rn) * spatial(lm, ln) * repeat(tm, tn)
    warps per block   warp repeats     lanes per warp    thread tile

so a block computes BM x BN = (wm*rm*lm*tm) x (wn*rn*ln*tn) outputs on 32*wm*wn threads.
The k loop is software pipelined as in the paper's Fig. 5 (register double buffering):
while the block multiplies shared-memory tile k, each thread holds tile k+1's global
loads in registers and writes them to the other shared buffer afterwards, so one barrier
per k tile suffices. Loads are predicated (any M, N, K), blocks are swizzled in groups of
GROUP block rows for L2 reuse, and with split-k (the `split` argument > 1) each z-slice of the
grid reduces one chunk of K into its own f32 partial output (summed by the caller).

Operands are 3-D: A (BA, M, K), B (BB, K, N), C (BZ, M, N) with BZ = batch * split; the
`batch_index` table (BZ, 2) says which A and B matrices each z-slice multiplies (batch
broadcasting), so one compiled kernel serves every shape, batch pattern and split.
"""
from __future__ import annotations

import functools
import math

import numpy as np

import taskdsl as td
from taskdsl import blockIdx, f32, repeat, spatial, threadIdx
from taskdsl.schedule.space import Space

GROUP = 8                   # block rows per swizzle group
PAD_A = 4                   # shared A is stored k-major, (BK, BM + PAD_A): the lanes of a warp that read
                            # different rows hit different banks, and so do its stores along k
MAX_SMEM = 48 * 1024        # static shared memory per block
MAX_ACC = 64                # f32 accumulators per thread (registers)


def load_mapping(rows: int, cols: int, threads: int):
    """A mapping of `threads` over a (rows, cols) tile, consecutive threads along cols (coalesced).

    Returns (mapping, spatial_shape), or None when the tile does not split evenly; a thread's
    task (i, j) is its register (i // spatial_shape[0], j // spatial_shape[1]).
    """
    if threads <= cols:
        if cols % threads:
            return None
        return repeat(rows, cols // threads) * spatial(1, threads), (1, threads)
    if threads % cols or rows % (threads // cols):
        return None
    s = threads // cols
    return repeat(rows // s, 1) * spatial(s, cols), (s, cols)


def tile_shape(p) -> tuple:
    """(BM, BN, threads) of a schedule point."""
    (wm, wn), (rm, rn), (lm, ln), (tm, tn) = p.warps, p.repeat, p.lanes, p.tile
    return wm * rm * lm * tm, wn * rn * ln * tn, 32 * wm * wn


def check(p, itemsize: int = 4, min_tile: int = 64 * 64):
    """Why point `p` cannot run (a resource or mapping limit), or None."""
    bm, bn, threads = tile_shape(p)
    rm, rn = p.repeat
    tm, tn = p.tile
    if rm * rn * tm * tn > MAX_ACC:
        return f"more than {MAX_ACC} accumulators per thread"
    if bm > 256 or bn > 256:
        return "block tile above 256"
    if bm * bn < min_tile:
        return f"block tile below {min_tile} outputs (too little reuse per load)"
    if 2 * (bm + PAD_A + bn) * p.bk * itemsize > MAX_SMEM:
        return "shared memory above 48 KiB"
    if load_mapping(bm, p.bk, threads) is None or load_mapping(p.bk, bn, threads) is None:
        return "a tile the threads cannot load evenly"
    return None


def gpu_space(itemsize: int = 4) -> Space:
    """The hardware-centric space of SIMT schedules for a GPU."""
    return Space("simt_matmul", {
        "warps": ((1, 2), (2, 1), (2, 2), (2, 4), (4, 2)),
        "repeat": ((1, 1), (2, 1), (1, 2), (2, 2)),
        "lanes": ((4, 8), (8, 4)),
        "tile": ((4, 4), (8, 4), (4, 8), (8, 8)),
        "bk": (8, 16),
        "prefetch": (True,),
    }, lambda p: check(p, itemsize))


def space_for(target: str, itemsize: int = 4) -> Space:
    """The schedule space on `target` (the cpu space is small: its blocks run threads in turn)."""
    if target == "cuda":
        return gpu_space(itemsize)
    return Space("simt_matmul_cpu", {
        "warps": ((1, 1), (1, 2), (2, 2)),
        "repeat": ((1, 1),),
        "lanes": ((4, 8), (8, 4)),
        "tile": ((4, 4), (8, 4), (4, 8), (8, 8)),
        "bk": (8, 16),
        "prefetch": (False,),
    }, lambda p: check(p, itemsize, min_tile=16 * 16))


DEFAULTS = {   # measured defaults (docs/benchmarks.md): used when tuning is off or skipped
    "cuda": dict(warps=(2, 4), repeat=(2, 2), lanes=(4, 8), tile=(4, 4), bk=8, prefetch=True),
    "cpu": dict(warps=(1, 2), repeat=(1, 1), lanes=(8, 4), tile=(8, 8), bk=8, prefetch=False),
}


def default_point(target: str, itemsize: int = 4):
    """The default schedule on `target`."""
    return space_for(target, itemsize).point(**DEFAULTS[target])


@functools.lru_cache(maxsize=256)
def batch_index(out_batch: tuple, a_batch: tuple, b_batch: tuple, split: int = 1) -> np.ndarray:
    """For each z-slice of the grid (output batch index x split chunk), the A and B matrices it reads.

    Batch dims broadcast as in numpy: a dim of size 1 is repeated. Made once per shape (a small product's call
    spent a fifth of its time here): callers read it, never write to it.
    """
    def flat(shape):
        shape = (1,) * (len(out_batch) - len(shape)) + tuple(shape)
        index = np.arange(math.prod(shape), dtype=np.int32).reshape(shape)
        return np.broadcast_to(index, out_batch).reshape(-1)
    pairs = np.stack([flat(a_batch), flat(b_batch)], axis=1)
    return np.ascontiguousarray(np.repeat(pairs, split, axis=0), np.int32)


def swizzled_tile(block, M, N, BM, BN) -> tuple:
    """(first row, first column) of the output tile of block `block` (called in a kernel, on runtime values):
    consecutive blocks walk GROUP block rows before the next column, so the blocks running together share
    their B tiles (and GROUP rows of A tiles) in L2."""
    grid_m, grid_n = td.cdiv(M, BM), td.cdiv(N, BN)
    first = block // (GROUP * grid_n) * GROUP
    rows = td.min(grid_m - first, GROUP)
    in_group = block % (GROUP * grid_n)
    return (first + in_group % rows) * BM, in_group // rows * BN


def batch_grid(blocks, BZ) -> tuple:
    """The grid of `blocks` blocks for each of BZ z-slices (products of a batch, times split-k), all along x:
    grid.z holds 65535 blocks, fewer than a batch of small products may need; x holds 2^31 - 1."""
    return (blocks * BZ, 1, 1)


def batch_block(block, blocks) -> tuple:
    """(z-slice, block within it) of block `block` of a `batch_grid` of `blocks` blocks a z-slice (called in a
    kernel)."""
    return block // blocks, block % blocks


def batch_tile(block, M, N, BM, BN) -> tuple:
    """(z-slice, first row, first column) of block `block` of a `batch_grid` of BM x BN output tiles (called in
    a kernel): the z-slices follow one another along x, so blocks still run a product's tiles together."""
    zs, tile = batch_block(block, td.cdiv(M, BM) * td.cdiv(N, BN))
    row0, col0 = swizzled_tile(tile, M, N, BM, BN)
    return zs, row0, col0


def split_k_tiles(K, BK, split, z) -> tuple:
    """(first, end) of the k tiles z-slice `z` of a split-k launch reduces (called in a kernel)."""
    k_tiles = td.cdiv(K, BK)
    chunk = td.cdiv(k_tiles, split)
    kt0 = z % split * chunk
    return kt0, td.min(k_tiles, kt0 + chunk)


@functools.cache
def simt_matmul_kernel(p, dtype, out_dtype):
    """The SIMT matmul kernel for schedule point `p` and element types (one compile serves every shape)."""
    (wm, wn), (rm, rn), (lm, ln), (tm, tn) = p.warps, p.repeat, p.lanes, p.tile
    BM, BN, T = tile_shape(p)
    BK = p.bk
    c_map = spatial(wm, wn) * repeat(rm, rn) * spatial(lm, ln) * repeat(tm, tn)
    a_frag_map = spatial(wm, wn) * repeat(rm, 1) * spatial(lm, ln) * repeat(tm, 1)    # rows of c_map's tasks
    b_frag_map = spatial(wm, wn) * repeat(1, rn) * spatial(lm, ln) * repeat(1, tn)    # its columns
    PREFETCH = p.prefetch
    a_map, (a_s0, a_s1) = load_mapping(BM, BK, T)
    b_map, (b_s0, b_s1) = load_mapping(BK, BN, T)

    @td.func
    def load_tiles(A, B, ra, rb, za, zb, row0, col0, k0):
        """Thread's share of the A (BM x BK) and B (BK x BN) tiles at k0, into registers."""
        M, K, N = A.shape[1], A.shape[2], B.shape[2]
        for i, k in a_map(threadIdx.x):
            gi, gk = row0 + i, k0 + k
            ra[i // a_s0, k // a_s1] = A[za, gi, gk] if gi < M and gk < K else 0.0
        for k, j in b_map(threadIdx.x):
            gk, gj = k0 + k, col0 + j
            rb[k // b_s0, j // b_s1] = B[zb, gk, gj] if gk < K and gj < N else 0.0

    @td.func
    def store_tiles(sa, sb, ra, rb, buf):
        """Registers -> shared buffer `buf`."""
        for i, k in a_map(threadIdx.x):
            sa[buf, k, i] = ra[i // a_s0, k // a_s1]
        for k, j in b_map(threadIdx.x):
            sb[buf, k, j] = rb[k // b_s0, j // b_s1]

    name = (f"simt_matmul_{BM}x{BN}x{BK}_w{wm}x{wn}_r{rm}x{rn}_l{lm}x{ln}_t{tm}x{tn}"
            + ("_prefetch" if PREFETCH else ""))

    @td.kernel(grid=lambda M, N, BZ: batch_grid(td.cdiv(M, BM) * td.cdiv(N, BN), BZ), block=T, name=name)
    def matmul(A: dtype["BA", "M", "K"], B: dtype["BB", "K", "N"], C: out_dtype["BZ", "M", "N"],
               batch_index: td.i32["BZ", 2], split: td.i32):
        sa = td.shared(dtype, (2, BK, BM + PAD_A))
        sb = td.shared(dtype, (2, BK, BN))
        ra = td.registers(dtype, (BM // a_s0, BK // a_s1))
        rb = td.registers(dtype, (BK // b_s0, BN // b_s1))
        acc = td.registers(f32, (rm * tm, rn * tn))
        fa = td.registers(f32, (rm * tm,))
        fb = td.registers(f32, (rn * tn,))
        zs, row0, col0 = batch_tile(blockIdx.x, M, N, BM, BN)
        # batch broadcasting (which A and B matrices this z-slice multiplies) and its split-k chunk
        za, zb = batch_index[zs, 0], batch_index[zs, 1]
        kt0, kt1 = split_k_tiles(K, BK, split, zs)
        for x in range(rm * tm):
            for y in range(rn * tn):
                acc[x, y] = 0.0
        if kt0 < kt1:
            load_tiles(A, B, ra, rb, za, zb, row0, col0, kt0 * BK)
            store_tiles(sa, sb, ra, rb, 0)
            td.syncthreads()
            for kt in range(kt0, kt1):
                buf = (kt - kt0) % 2
                if PREFETCH and kt + 1 < kt1:
                    load_tiles(A, B, ra, rb, za, zb, row0, col0, (kt + 1) * BK)
                for k in td.unroll(BK):   # outer product of the thread's A column and B row fragments; unrolled:
                                          # constant shared offsets, and the next k step's loads overlap this one's FMAs
                    for i, _ in a_frag_map(threadIdx.x):
                        fa[i // (lm * tm) % rm * tm + i % tm] = td.cast(sa[buf, k, i], f32)
                    for _, j in b_frag_map(threadIdx.x):
                        fb[j // (ln * tn) % rn * tn + j % tn] = td.cast(sb[buf, k, j], f32)
                    for x in range(rm * tm):
                        for y in range(rn * tn):
                            acc[x, y] += fa[x] * fb[y]
                if kt + 1 < kt1:
                    if not PREFETCH:
                        td.syncthreads()
                        load_tiles(A, B, ra, rb, za, zb, row0, col0, (kt + 1) * BK)
                    store_tiles(sa, sb, ra, rb, 1 - buf)
                td.syncthreads()
        for i, j in c_map(threadIdx.x):
            gi, gj = row0 + i, col0 + j
            if gi < M and gj < N:
                C[zs, gi, gj] = td.cast(acc[i // (lm * tm) % rm * tm + i % tm,
                                            j // (ln * tn) % rn * tn + j % tn], out_dtype)

    return matmul
