"""The cpu's 8-bit integer matmul on byte dot products: u8 or s8 A by u8 or s8 B into exact i32, four k at a time.

`td.dot4(acc[x, y], a[i, k], b[q, 4 * y], L)` adds to L i32 accumulators the dot products of four bytes of A's
row with four bytes of each of L columns of B: x86's vpdpbusd, 64 multiply-adds an AVX-512 instruction where the
f32 register-tile template (`matmul_cpu`, which runs 8-bit integers exactly as f32) does 16 a fused multiply-add.
The micro-kernel's step is MR broadcasts of four bytes of A, NR / L vector loads of B and MR * NR / L dot4s:

    repeat(BM // MR, BN // NR)  *  repeat(MR, NR // L)  *  L lanes
    micro-tiles, one at a time     the register tile       a vector of accumulators

B comes packed as each block's panel wants it (`pack_b`): per column block, its rows are groups of four k, each
holding the block's BN columns as four consecutive bytes (k, k + 1, k + 2, k + 3): one 64-byte load gives 16
columns' four bytes. Constant weights are packed once; the kernel without `packed_b` packs its own panels. A's
block is copied per k block into a strip whose rows run past K to a multiple of 4 in zeros (and whose rows past M
are zeros), so a step never reads past A. The sums are exact in i32 (they wrap as i32 do past 2^31, at K of
65793 or more): no k blocks of bounded length as the f32 template needs (`gemm.exact_k`).

The instruction takes u8 by s8. The other pairs run offset into them: A' = A + alpha (alpha = 128 for s8 A, else
0) when A's block is copied, B' = B - beta (beta = 128 for u8 B) when B is packed, and since
sum (A + alpha)(B - beta) = AB - beta sum A + alpha sum B - alpha beta K,

    AB = A'B' + beta * rowsum(A') - alpha * colsum(B') - alpha * beta * K

in i32 (wrapping alike on both sides, so exact wherever AB fits). rowsum(A') adds up as A's block is copied;
colsum(B') is one more dot4 per panel step, of four ones by the panel row (1 / BM of the products).

A k block's column sums and micro-tiles are an outlined function (`sweep`, `@td.func(outline=True)`, as the
register-tile template's): the unrolled tile is nearly all of a kernel's numba time, and outlined it is compiled once
for every kernel of a point and operand form, whatever its fused epilogue or shapes. Built cold, QDQ BERT-base's 19
fused products took 88 s, 29 s with it; QDQ ResNet-50 54 -> 15 s, MobileNet-V2 45 -> 17 s (docs/benchmarks.md).

It runs where the host computes dot4 by an instruction (`vectors.dot4_lanes`: AVX-512 VNNI); elsewhere the
register-tile template multiplies 8-bit integers (`gemm.template_for`). The kernel itself runs on any cpu (dot4's
plain arithmetic, slowly) and on a GPU, which has tensor cores for 8-bit products.
"""

import functools

import numpy as np

import taskdsl as td
from taskdsl import blockIdx
from taskdsl.backend.cpu import vectors
from taskdsl.runtime.host import CACHE_LINE, empty_aligned
from taskdsl.schedule.space import Space

PANEL_BYTES = 512 * 1024       # a block's A strip, B panel and i32 sums, kept in L2


def lanes() -> int:
    """The accumulators one dot4 computes: the host's widest dot4 instruction's (16 where it has none: the
    kernels then run dot4 as plain arithmetic)."""
    return max(vectors.dot4_lanes(), default=16)


def available() -> bool:
    """Whether the host computes dot4 of 8 or 16 lanes by an instruction, which this template needs to be worth
    running (a 128-bit one would leave it no micro-tile within 16 registers)."""
    return bool({8, 16} & vectors.dot4_lanes())


def tile_shape(p) -> tuple:
    """(BM, BN, threads) of a schedule point."""
    return p.block[0], p.block[1], 1


def check(p, width: int | None = None, registers: int | None = None):
    """Why point `p` cannot run well with dot4s of `width` lanes and `registers` vector registers (default: the
    host's), or None."""
    (mr, nr), (bm, bn) = p.micro, p.block
    width, registers = width or lanes(), registers or vectors.host().registers
    if nr % width:
        return f"micro-tile columns not a multiple of the {width} lanes of a dot4"
    if bm % mr or bn % nr:
        return "block tile not a multiple of the micro-tile"
    row = nr // width
    if mr * row + row + 1 > registers:      # accumulators + B's vectors + A's broadcast
        return f"micro-tile needs more than {registers} vector registers"
    if bm * p.bk + p.bk * bn + 4 * bm * bn > PANEL_BYTES:
        return f"panels above {PANEL_BYTES // 1024} KiB"
    return None


def space(width: int | None = None, registers: int | None = None) -> Space:
    """The schedule space: micro-tile, block tile and k block (the micro-tiles that fit the host's vectors)."""
    return Space("dot4_matmul", {
        # (24 accumulators, 12x32 and 6x64, ran at 40-50% of 6x32's rate: left out)
        "micro": ((6, 32), (8, 32), (4, 64), (4, 32), (6, 16), (8, 16), (12, 16), (4, 16)),
        "block": ((48, 64), (96, 64), (48, 128), (96, 128), (24, 128), (64, 64), (64, 128), (96, 32)),
        "bk": (256, 512, 1024),
    }, lambda p: check(p, width, registers))


DEFAULT = dict(micro=(6, 32), block=(48, 128), bk=1024)     # measured: docs/benchmarks.md
# Packed B (constant weights) comes from memory once a run of a model, where the hardware prefetcher alone kept it
# late (as the register-tile template's, `matmul_cpu.PREFETCH_GAP`): each micro-tile of a k block prefetches its
# share of the rows after the block's, a line every PREFETCH_GAP steps of four k
PREFETCH_GAP = 2


def default_point(m: int | None = None, n: int | None = None):
    """The default schedule (AVX-512's; 256-bit dot4s take half its columns), in 64- or 32-column blocks where N
    (where known) leaves fewer columns of the last block unused so (N = 64: 128-column blocks compute twice the
    columns; ResNet-50's 64-channel layers ran 1.4x faster quantized); and with AVX-512 VNNI (whose 32 registers
    hold the tile), in 64-row blocks of 8x32 micro-tiles where M (where known) fills them but not 48-row ones, whose
    last block streams B's panels for a few rows (M x 768 @ 768 x 768, medians: M = 128 204-229 us against 214-251,
    M = 256 381-398 against 399-422; M = 192 and M = 100, which 64-row blocks do not fill, ran 2-3% slower on them;
    M = 3136 and 12544 alike both ways)."""
    chosen = DEFAULT if lanes() == 16 else dict(DEFAULT, micro=(6, 16))
    if n is not None:
        unused = lambda bn: -(-n // bn) * bn - n     # noqa: E731
        width = min((128, 64, 32), key=lambda bn: (unused(bn), -bn))
        if width < 128:
            chosen = dict(chosen, block=(48, 64) if width == 64 else (96, 32))
    if m is not None and m % 64 == 0 and m % 48 and 16 in vectors.dot4_lanes() and chosen["block"][0] == 48:
        chosen = dict(chosen, micro=(8, 32), block=(64, chosen["block"][1]))
    return space().point(**chosen)


def pack_b(p, b3):
    """B (BB, K, N) s8 or u8 as the `packed_b` kernel of point `p` reads it: (BB * cdiv(N, BN) * cdiv(K, 4), 4 * BN)
    s8, panel (z, j) holding B[z, :, j*BN : (j+1)*BN] (less 128, u8: B') as rows of four k, each column's four
    bytes together, zeros past K and N (constant weights: pack once)."""
    bb, k, n = b3.shape
    bn = p.block[1]
    blocks, groups = -(-n // bn), -(-k // 4)
    padded = np.zeros((bb, 4 * groups, blocks * bn), np.int8)
    padded[:, :k, :n] = b3 if b3.dtype == np.int8 else (b3.astype(np.int16) - 128).astype(np.int8)
    out = empty_aligned(packed_b_shape(p, b3.shape), np.int8)     # aligned: the kernel's vector loads
    out.reshape(bb, blocks, groups, bn, 4)[...] = padded.reshape(bb, groups, 4, blocks, bn).transpose(0, 3, 1, 4, 2)
    return out


def packed_b_shape(p, b_shape: tuple) -> tuple:
    """The shape `pack_b` gives a (BB, K, N) operand."""
    bb, k, n = b_shape
    bn = p.block[1]
    return (bb * -(-n // bn) * -(-k // 4), 4 * bn)


@functools.cache
def dot4_matmul_kernel(p, out_dtype, packed_b: bool = False, a_dtype=td.u8, b_dtype=td.i8, indirect: bool = False,
                       columns_outer: bool = False):
    """The kernel for schedule point `p` (one compile serves every shape): C (BZ, M, N) of `out_dtype` = A (BA, M,
    K) @ B (BB, K, N) of 8-bit integers (`a_dtype`, `b_dtype`) in exact i32, the z-slices' A and B from
    `batch_index`; with `packed_b`, B as `pack_b`'s panels. The `split` argument (the other templates' split-k)
    must be 1. With `indirect` (and `packed_b`), A is an NHWC input read in place as its im2col, as the register-tile
    template's `indirect` kernel reads it (`matmul_cpu.tile_matmul_kernel`, `matmul_cpu.indirect_index`): element
    (i, k) of z-slice z's A at A[0, za + rows[i] + taps[k]], za = batch_index[z, 0]. With `columns_outer`, a block
    stores its outputs a column at a time: for an epilogue that lays C's columns far apart and its rows together
    (a projection stored transposed, attention's K^T: 335 -> 250 us at 128x768x768), where a row at a time stored
    bytes 128 apart."""
    if indirect and not packed_b:
        raise ValueError("dot4_matmul_kernel: an indirect A goes with packed B (a convolution's constant weights)")
    (MR, NR), (BM, BN), KC = p.micro, p.block, p.bk
    L = lanes()
    alpha, beta = (128 if a_dtype == td.i8 else 0), (128 if b_dtype == td.u8 else 0)    # A' = A + alpha, B' = B - beta
    pair = "" if (alpha, beta) == (0, 0) else f"_{a_dtype.name}{b_dtype.name}"
    name = (f"dot4_matmul_{BM}x{BN}x{KC}_m{MR}x{NR}" + ("_packed" if packed_b else "")
            + ("_indirect" if indirect else "") + ("_columns" if columns_outer else "") + pair)
    a_spec = a_dtype["BA", "XL"] if indirect else a_dtype["BA", "M", "K"]
    b_spec = td.i8["RB", 4 * BN] if packed_b else b_dtype["BB", "K", "N"]
    index_spec = td.i32["BZ", "BW"] if indirect else td.i32["BZ", 2]

    @td.func(outline=True)
    def sweep(strip, panel, partial, colsums, c, ones, rows, cols, steps, row, first, ends):
        """One k block of a block's products (`steps` groups of four k, the panel's from row `row`): with alpha,
        the panel's column sums first (four ones dotted with each panel row, in c's first row); then each
        micro-tile's sums from `partial` (zeros in the `first` k block), its dot4s, and back. With `packed_b`, each
        micro-tile prefetches its share of packed B's next `steps` rows (the next k block's or panel's; `ends`: its
        rows), a line every PREFETCH_GAP steps. Outlined: one compile of the unrolled tile serves every kernel of
        this point and operand form, whatever its epilogue or shapes (QDQ BERT-base's 19 fused products, built
        cold: about 8 s of numba each when each had its own)."""
        for q in td.unroll(4):
            ones[q] = 1
        if alpha:
            for nj in range(td.cdiv(cols, NR)):
                j0 = nj * NR
                for y in td.unroll(NR):
                    c[0, y] = 0 if first else colsums[j0 + y]
                for s in range(steps):
                    for v in td.unroll(NR // L):
                        td.dot4(c[0, v * L], ones[0], panel[row + s, 4 * (j0 + v * L)], L)
                for y in td.unroll(NR):
                    colsums[j0 + y] = c[0, y]
        for mi in range(td.cdiv(rows, MR)):
            for nj in range(td.cdiv(cols, NR)):
                i0, j0 = mi * MR, nj * NR
                for x in td.unroll(MR):
                    for y in td.unroll(NR):
                        c[x, y] = 0 if first else partial[i0 + x, j0 + y]
                line = -1       # the flat byte of packed B this micro-tile prefetches next (none: -1)
                if packed_b:
                    share = (mi * td.cdiv(cols, NR) + nj) * td.cdiv(steps, PREFETCH_GAP) * CACHE_LINE
                    if share < steps * 4 * BN:
                        line = (row + steps) * 4 * BN + share
                    line = line if line < ends * 4 * BN else -1
                for s in range(steps):
                    if packed_b and line >= 0 and s % PREFETCH_GAP == 0:
                        td.prefetch(panel[line // (4 * BN), line % (4 * BN)])
                        line = line + CACHE_LINE if line + CACHE_LINE < ends * 4 * BN else -1
                    for x in td.unroll(MR):
                        for v in td.unroll(NR // L):
                            td.dot4(c[x, v * L], strip[i0 + x, 4 * s], panel[row + s, 4 * (j0 + v * L)], L)
                for x in td.unroll(MR):
                    for y in td.unroll(NR):
                        partial[i0 + x, j0 + y] = c[x, y]

    @td.func
    def b_prime(v):
        """An element of B as the panel holds it: B' = B - beta."""
        return td.cast(td.cast(v, td.i32) - beta, td.i8) if beta else v

    @td.kernel(grid=lambda M, N, BZ: (td.cdiv(M, BM) * td.cdiv(N, BN), 1, BZ), block=1, name=name)
    def matmul(A: a_spec, B: b_spec, C: out_dtype["BZ", "M", "N"], batch_index: index_spec, split: td.i32):
        partial = td.shared(td.i32, (BM, BN))        # the block's sums between k blocks
        strip = td.shared(td.u8, (BM, KC))           # the block of A' for one k block, zeros past K and M
        panel = B if packed_b else td.shared(td.i8, (KC // 4, 4 * BN))
        rowsums = td.shared(td.i32, (BM,))           # beta: each row's sum of A'
        colsums = td.shared(td.i32, (BN,))           # alpha: each column's sum of B'
        runs = td.shared(td.i32, (KC + 1,))          # where the k block's runs of contiguous A start (indirect)
        c = td.registers(td.i32, (MR, NR))
        ones = td.registers(td.u8, (4,))
        grid_m = td.cdiv(M, BM)
        row0, col0 = blockIdx.x % grid_m * BM, blockIdx.x // grid_m * BN      # consecutive blocks share a panel
        za, zb = batch_index[blockIdx.z, 0], batch_index[blockIdx.z, 1]
        rows, cols = td.min(BM, M - row0), td.min(BN, N - col0)
        kdim = BW - 2 - M if indirect else K        # (indirect: the table's taps after its rows)
        for k0 in range(0, td.max(kdim, 1), KC):     # K = 0: one empty k block, the sums zeros
            k1 = td.min(kdim, k0 + KC)
            steps = td.cdiv(k1 - k0, 4)
            count = 1       # runs of the k block whose taps are consecutive offsets, from runs[r] to runs[r + 1]
            runs[0] = 0
            if indirect:    # (the same for every row: an NHWC window's taps run a pixel's channels, or more)
                count = 0
                k = 0
                while k < k1 - k0:
                    runs[count] = k
                    first = batch_index[0, 2 + M + k0 + k]
                    k += 1
                    while k < k1 - k0 and batch_index[0, 2 + M + k0 + k] == first + k - runs[count]:
                        k += 1
                    count += 1
            runs[count] = k1 - k0
            for i in range(rows):
                total = 0
                for r in range(count):      # one run: a contiguous copy, which LLVM vectorizes
                    start = runs[r]
                    at = za + batch_index[0, 2 + row0 + i] + batch_index[0, 2 + M + k0 + start] if indirect else 0
                    for k in range(start, runs[r + 1]):
                        value = A[0, at + k - start] if indirect else A[za, row0 + i, k0 + k]
                        if alpha:
                            strip[i, k] = td.cast(td.cast(value, td.i32) + alpha, td.u8)
                        else:
                            strip[i, k] = value
                        if beta:
                            total += td.cast(strip[i, k], td.i32)
                if beta:
                    rowsums[i] = total if k0 == 0 else rowsums[i] + total
                for k in range(k1 - k0, 4 * steps):
                    strip[i, k] = 0
            for i in range(rows, td.cdiv(rows, MR) * MR):
                for k in range(4 * steps):
                    strip[i, k] = 0
            row = 0     # the panel's first row of this k block
            if packed_b:
                row = (zb * td.cdiv(N, BN) + col0 // BN) * td.cdiv(kdim, 4) + k0 // 4
            else:
                for s in range(steps):      # B's rows k0 + 4s .. k0 + 4s + 3, interleaved into the panel's row s
                    k = k0 + 4 * s
                    if k + 4 <= k1:         # (a column's four bytes stored together: LLVM vectorizes the pass)
                        for j in range(cols):
                            for q in td.unroll(4):
                                panel[s, 4 * j + q] = b_prime(B[zb, k + q, col0 + j])
                    else:                   # the last group, past K in zeros
                        for q in range(4):
                            for j in range(cols if k + q < k1 else 0):
                                panel[s, 4 * j + q] = b_prime(B[zb, k + q, col0 + j])
                            for j in range(cols if k + q < k1 else 0, cols):
                                panel[s, 4 * j + q] = 0
                    for j in range(4 * cols, 4 * BN):
                        panel[s, j] = 0
            sweep(strip, panel, partial, colsums, c, ones, rows, cols, steps, row, k0 == 0, panel.shape[0])
        for u in range(cols if columns_outer else rows):
            for v in range(rows if columns_outer else cols):
                i = v if columns_outer else u
                j = u if columns_outer else v
                total = partial[i, j]
                if beta:
                    total += beta * rowsums[i]
                if alpha:
                    total -= alpha * colsums[j] + alpha * beta * kdim
                C[blockIdx.z, row0 + i, col0 + j] = td.cast(total, out_dtype)

    return matmul
