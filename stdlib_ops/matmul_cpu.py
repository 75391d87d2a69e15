"""The cpu matmul template: one thread per block and a register micro-tile, as a BLAS micro-kernel.

On the cpu target the threads of a block run one after another, so the SIMT template's staging
through shared memory and its barriers buy nothing there: every barrier ends a region, and the
accumulators go back to memory at each one. This template gives a block one thread and maps its
output tile as

    repeat(BM // MR, BN // NR)  *  repeat(MR, NR)
    micro-tiles, one at a time     the register tile: MR x NR accumulators

The micro-kernel's step is MR loads of A (broadcast), NR consecutive loads of B and MR * NR
multiply-adds; unrolled, LLVM's SLP vectorizer turns it into NR / L vector loads and
MR * NR / L vector FMAs, L floats a vector. The default tile fills about as many registers with
accumulators as the host has (`taskdsl.backend.cpu.vectors`): 4 x 16 fills 8 of AVX2's 16 ymm
registers (L = 8; 6 x 16 left no room for its six broadcasts of A: `SIXTEEN_REGISTERS`), 4 x 64 fills 16 of
AVX-512's 32 zmm registers (L = 16): a step's 8 loads feed 16 FMAs,
where 6 x 32's 8 fed 12 (ResNet-50 at batch 8 ran 5-8% faster; 6 x 64's 24 ran no faster than 4 x 64). The
register tile's loops are `td.unroll` loops, not the compile-time tasks of `repeat(MR, NR)(0)`:
the cpu target's unroll pass (and the CUDA compiler) unroll them all the same, and under
`td.fast_compile` they stay loops, which takes a third off numba's time for the kernel (LLVM
unrolls them itself and keeps the tile, on the stack, in registers: `codegen.STACK_BYTES`). There,
a tile row of one vector (AVX-512's 6x16) has its multiply-adds loop over the columns outside the
rows: LLVM unrolls an inner loop that short first and vectorizes the loop around it, which for
rows outside went across the rows, by gathers, 40x slower (`columns_outside`). k is
blocked by KC. For each k block, the block first packs B's (KC x BN) panel into a contiguous
buffer, as a BLAS does: read in place, the panel's rows are N floats apart, and for N a
multiple of 1024 (BERT's 3072) they all map to the same few L1 sets (128 x 768 x 3072 ran at
73 GFLOP/s unpacked, 120 packed). Its micro-tiles then sweep the panel; between k blocks the
partial sums wait in a per-block buffer (the first k block starts from zero registers). After the
last k block's sweep, the block goes from the buffer to C (and a fused epilogue), row by row, or
column by column where C is stored so (a transposed A's).

The sweep is an outlined function (`@td.func(outline=True)`): its unrolled tile is nearly all of a
kernel's numba time, and outlined it is compiled once for every kernel of the same micro-tile and
operand forms, whatever their fused epilogues, blocks and shapes (ResNet-50's cold build: 12.1 -> 8.9 s,
MobileNet-V2's 19.9 -> 12.1 s; the block's width comes in as a number, so Inception-V3's four became
two). A call costs 20-30 ns, once per block, panel and k block: a call per row of micro-tiles cost 1-11%
of a product's time (K = 768 down to 16).

Edges: rows past M are clamped (they read row M - 1 and are never stored); the packed
panel's columns past N are zeros (computed, never stored), so there is one micro-kernel
for full and edge tiles. Operands, `batch_index` and split-k are those of the SIMT template.
"""

import functools
from dataclasses import dataclass

import numpy as np

import taskdsl as td
from taskdsl import blockIdx, f32
from taskdsl.backend.cpu import vectors
from taskdsl.passes.unroll import MAX_COPIES
from taskdsl.runtime.host import CACHE_LINE, empty_aligned
from taskdsl.schedule.space import Space

PANEL_BYTES = 512 * 1024       # a block's A and B panels and its partial sums, kept in L2


def tile_shape(p) -> tuple:
    """(BM, BN, threads) of a schedule point."""
    return p.block[0], p.block[1], 1


def check(p, itemsize: int = 4, unit: vectors.VectorUnit | None = None, k_block_at_most: int | None = None):
    """Why point `p` cannot run well on `unit` (default: the host's vectors) for registers, unrolling, cache
    or a block the micro-tiles do not divide, or (integer operands) sums more than `k_block_at_most` products in a
    k block; or None."""
    (mr, nr), (bm, bn) = p.micro, p.block
    unit = unit or vectors.host()
    if bm % mr or bn % nr:
        return "block tile not a multiple of the micro-tile"
    row = -(-nr // unit.floats)     # vectors in a row of the tile
    # accumulators + B's row + A's broadcasts, all of which LLVM loads ahead of the multiply-adds: AVX2's 6x16
    # (20 of 16 registers) kept three accumulators on the stack (`SIXTEEN_REGISTERS`)
    if mr * row + row + mr > unit.registers:
        return f"micro-tile needs more than {unit.registers} vector registers"
    if mr * nr > MAX_COPIES:
        return f"micro-tile above the {MAX_COPIES} multiply-adds the cpu target unrolls"
    if bn < LINE_FLOATS:
        return f"block narrower than a cache line ({LINE_FLOATS} floats: the micro-kernel prefetches a line a step)"
    if k_block_at_most is not None and p.bk > k_block_at_most:
        return f"k block above the {k_block_at_most} products whose f32 sum is exact (integer operands: gemm.exact_k)"
    a_bytes = bm * p.bk * (itemsize + 4 if itemsize < 4 else itemsize)     # narrow A: and its f32 copy (stages_a)
    if a_bytes + (bn * p.bk + bm * bn) * 4 > PANEL_BYTES:     # B's panel is packed as f32
        return f"panels above {PANEL_BYTES // 1024} KiB"
    return None


def space(itemsize: int = 4, unit: vectors.VectorUnit | None = None, k_block_at_most: int | None = None) -> Space:
    """The cpu schedule space: micro-tile, block tile and k block (the micro-tiles that fit `unit`; for integer
    operands, the k blocks of at most `k_block_at_most`)."""
    return Space("tile_matmul_cpu", {
        "micro": ((4, 64), (6, 32), (8, 32), (6, 16), (4, 16), (8, 8), (4, 8), (2, 8)),
        "block": ((48, 64), (96, 64), (48, 128), (24, 64), (64, 64), (16, 64), (96, 32), (96, 16)),
        "bk": (128, 256, 512),
    }, lambda p: check(p, itemsize, unit, k_block_at_most))


# the default tile per vector width, measured: docs/benchmarks.md
DEFAULT = {512: dict(micro=(4, 64), block=(48, 64), bk=256), 256: dict(micro=(6, 16), block=(48, 64), bk=256),
           128: dict(micro=(4, 8), block=(48, 64), bk=256)}
# ... and on a host of 256-bit vectors with 16 registers (AVX2 without AVX-512; `DEFAULT`'s 256 is AVX-512's 32
# registers capped to 256 bits): LLVM loads a 6x16 tile's six broadcasts of A ahead of its multiply-adds, which with
# B's two vectors and the twelve accumulators wants 20 registers, so three accumulators went to the stack and back
# at every k step. 4x16 needs 14 (session 117, Zen 3, B packed: 1024^3 73 -> 145 GFLOP/s, ResNet-50's and BERT's
# GEMMs 1.3-2.0x faster)
SIXTEEN_REGISTERS = {256: dict(micro=(4, 16), block=(64, 64), bk=256)}


def default_point(itemsize: int = 4, unit: vectors.VectorUnit | None = None, m: int | None = None,
                  n: int | None = None):
    """The default cpu schedule for `unit` (the host's vectors), fitted to an M x N product where its
    shape is known (`fitted`); under `td.fast_compile` too: left in loops, on the stack (`codegen.STACK_BYTES`),
    it compiles about as fast as the 2x8 tile fast compiles took before (MobileNet-V2 built in 13.6 s, not 13.9,
    and ran in 12.7 ms, not 19.8)."""
    unit = unit or vectors.host()
    chosen = SIXTEEN_REGISTERS.get(unit.bits) if unit.registers <= 16 else None
    return space(itemsize, unit).point(**fitted(chosen or DEFAULT[unit.bits], m, n))


def fitted(chosen: dict, m: int | None, n: int | None) -> dict:
    """`chosen` fitted to an M x N product (None: not known): a 96-row block where M fits one, but `chosen`'s
    rows leave a second row block at most half used; and 32-column blocks (16, with a 6x16 micro-tile, for
    N <= 16) where N leaves the last column block of `chosen` at most half used and that shortfall is over an
    eighth of N (rows then 96 a block, keeping its area: 96x32 beat 48x32 by 5% on MobileNet-V2).

    The threads take contiguous ranges of blocks, which run column block by column block, so a short last
    column block leaves one thread with less to do: N = 96 in 64-column blocks gives one thread the first 64
    columns and the other 32 (MobileNet-V2's 16 -> 96 1x1 convolution at 112x112, 2 threads: 0.62 -> 0.40 ms
    with 96x32 blocks; 0.79 -> 0.73 ms on one). A micro-tile wider than N computes columns it drops, hence
    6x16 for N <= 16 (0.30 -> 0.22 ms on one thread for 32 -> 16). A second row block holding a row or two
    (ResNet-50's 7x7 layers, M = 49) reads all of B's panels again for them: 9.2 -> 8.3 ms over those nine
    layers with one 96-row block (docs/benchmarks.md). Where 64-row blocks compute at least 8% fewer rows than
    48-row ones (M = 100, 128, 256: BERT's and GPT-2's 128 tokens), AVX-512's blocks take 64 rows (with 8x32
    micro-tiles, against 6x32 in 48-row blocks: BERT-base 95.0 -> 90.9 ms, GPT-2 132.8 -> 130.2 ms; 4x64 ones
    ran BERT-base as fast as 8x32).
    """
    (bm, bn), micro = chosen["block"], chosen["micro"]
    if m is not None and bm < m <= 96 and 2 * (m - bm) <= bm:     # a second row block at most half used
        bm = 96
    rest = n % bn if n else 0
    if rest and rest <= bn // 2 and 8 * (bn - rest) > n:
        bm, bn = 96, 16 if n <= 16 else 32
        if micro[1] > bn:
            micro = (6, bn)
    if m is not None and (bm, micro) == (48, (4, 64)) and 100 * _rows(m, 64) <= 92 * _rows(m, 48):
        bm = 64
    return dict(chosen, micro=micro, block=(bm, bn))


def _rows(m: int, bm: int) -> int:
    """The rows that blocks of `bm` rows compute for M = m."""
    return -(-m // bm) * bm


def pack_b(p, b3):
    """B (BB, K, N) as the panels the `packed_b` kernel of point `p` reads: (BB * cdiv(N, BN) * K, BN) f32, panel
    (z, j) holding B[z, :, j*BN : (j+1)*BN] row after row, zeros past column N (constant weights: pack once)."""
    bb, k, n = b3.shape
    bn = p.block[1]
    out = empty_aligned(packed_b_shape(p, b3.shape), np.float32)      # aligned: the kernel's vector loads
    panels = out.reshape(bb, -(-n // bn), k, bn)
    for j in range(panels.shape[1]):
        cols = min(bn, n - j * bn)
        panels[:, j, :, :cols] = b3[:, :, j * bn:j * bn + cols]
        panels[:, j, :, cols:] = 0.0
    return out


def packed_b_shape(p, b_shape: tuple) -> tuple:
    """The shape `pack_b` gives a (BB, K, N) operand."""
    bb, k, n = b_shape
    bn = p.block[1]
    return (bb * -(-n // bn) * k, bn)


# Packed B (constant weights) streams from memory once per run of a model, and the hardware prefetcher alone kept
# it late: ResNet-50's 7x7 layers ran 30-40% slower in sequence than alone, their weights (4-9 MB) coming from
# DRAM. So each micro-tile call of a k block prefetches its share of the rows after the block's (the next k
# block's, or the next panel's first), a line every PREFETCH_GAP k steps: 8 calls cover a 256 x 64 panel.
# ResNet-50 4%, BERT 5%, GPT-2 6% faster; every 4 steps and 1 (covering the panel in 16 and 4 calls) gained less.
PREFETCH_GAP = 2
LINE_FLOATS = CACHE_LINE // 4        # f32 in a cache line

COPY_A_ROWS = 512     # a transposed A with at least this many rows (M) is copied block by block: `copies_a`
WIDE_N = 512          # columns (N) at most that a block copying A computes, every column panel of them
COPY_RUN = 16         # input pixels an im2col copies at once, in a loop of constant length that LLVM vectorizes whole
                      # (a shorter run: one by one). Session 109, alternating with the loops of a run-time length:
                      # a depthwise plane's copy 0.24-0.32 -> 0.16-0.17 ms, NCHW 7x7 stem 2.37-2.46 -> 2.00-2.21 ms,
                      # a 3x3 (1, 64, 56, 56) no change


# `rows_first` where A has at least this many elements (past a core's L2 in f32, with C streaming beside it) and B
# at most this many: read in column-panel order, A is read from memory once per panel
ROWS_FIRST_A = 1 << 20
ROWS_FIRST_B = 1 << 14


def rows_first(p, m: int | None, k: int | None, n: int | None) -> bool:
    """Whether the kernel for an M x K @ K x N product at point `p` runs a row block's column panels one after the
    other (its rows of A then stay in cache for every panel), not a panel's row blocks: where A is large, B small
    and there is more than one panel. ResNet-50 at batch 8, its 1x1 convolutions 64 -> 256 at 56x56 (A 6.4 MB, four
    panels): see docs/benchmarks.md, session 101."""
    return (None not in (m, k, n) and m * k >= ROWS_FIRST_A and k * n <= ROWS_FIRST_B and n > p.block[1])


def copies_a(transposed_a: bool, m: int | None, n: int | None) -> bool:
    """Whether the kernel for a transposed A of M rows and N columns copies each block's A for a k block before its
    micro-tiles run (and then computes every column panel from the copy: N at most WIDE_N). Read in place, a k step
    of a micro-kernel is M floats past the last: from M = 512 on (2 KiB), a k block of 256 spans more 4 KiB pages
    than the L1 TLB holds. ResNet-50's 3x3 convolutions, copied against in place (`/tmp` timing, median of 40):
    M = 784 1.30 -> 1.11 ms, M = 3136 1.23 -> 1.12-1.15 ms, the 7x7 stem (M = 12544) 1.56 -> 1.49 ms; M = 196
    1.15 / 1.18 ms and M = 49 1.16 / 1.35 ms lose."""
    return transposed_a and m is not None and m >= COPY_A_ROWS and n is not None and n <= WIDE_N


def columns_outside(nr: int) -> bool:
    """Whether the micro-kernel's multiply-adds loop over a tile's `nr` columns outside its rows: where a tile row
    is one of the host's vectors or less. Left in loops (`td.fast_compile`), LLVM unrolls the inner loop first
    when it is that short and vectorizes the one around it: for rows outside, across the rows, by gathers
    (AVX-512's 6x16 tile, 12544 x 32 @ 32 x 16: 6.66 ms, 0.130 with columns outside). A row of two vectors or
    more is vectorized along itself with rows outside, and runs slower with columns outside (AVX2's 6x16: 0.136
    ms against 0.262). Unrolled in the IR (optimized kernels), the order makes no difference."""
    return nr <= vectors.host().floats


@dataclass(frozen=True)
class Window:
    """An NCHW convolution's window, for a kernel that reads the input itself as the transposed A (its
    im2col columns (C*KH*KW x OH*OW), never materialized): sizes, strides, top/left padding, dilations and
    the output width."""

    kh: int
    kw: int
    sh: int
    sw: int
    pt: int
    pl: int
    dh: int
    dw: int
    ow: int


@functools.cache
def tile_matmul_kernel(p, dtype, out_dtype, packed_b: bool = False, transposed_a: bool = False,
                       copy_a: bool = False, window: Window | None = None, indirect: bool = False, b_dtype=None,
                       rows_first: bool = False, window_b: Window | None = None):
    """The cpu matmul kernel for schedule point `p` and element types (one compile serves every shape; B of
    `b_dtype` where it is not A's type: 8-bit integers of two kinds).

    With `packed_b`, B comes as `pack_b`'s panels and the blocks read them in place instead of packing
    their own. With `transposed_a`, A comes as (batch, K, M), so a micro-kernel step reads MR consecutive
    elements of it, and C's tiles are stored column by column: the form of a convolution's NCHW output
    computed as (columns (K x pixels))^T @ weights, C (pixels x channels) being the output transposed.
    With `copy_a` too, each block copies its K x BM part of A for a k block first (`copies_a` says when) and
    computes every column panel (N <= WIDE_N) from the copy: the grid has no column blocks then. With a
    `window` (and copy_a), A is an NCHW input and the copy is its im2col, `window_strip`.
    With `indirect` (and neither), A is an NHWC input read in place as its im2col: flat (1, elements), with
    element (i, k) of z-slice z's A at A[0, za + rows[i] + taps[k]] for the tables `indirect_index` appends to
    batch_index's first row, where za = batch_index[z, 0] is an offset (an image's, a group's first channel),
    not a matrix index (the kernel's M comes from C, its K from the table's width).
    With a `window_b` (and neither packed_b nor a `window`), B is an NCHW input and each block's panel of B is its
    im2col (`window_strip`): a convolution computed as weights @ columns, C the NCHW output itself.
    With `rows_first` (and not copy_a), consecutive blocks are a row block's column panels, not a column panel's row
    blocks (`rows_first`, the function, says when).
    """
    (MR, NR), (BM, BN), KC = p.micro, p.block, p.bk
    COLUMNS_OUTSIDE = columns_outside(NR)
    copy_a = copy_a and transposed_a
    rows_first = rows_first and not copy_a
    window = window if copy_a else None
    indirect = indirect and not transposed_a
    window_b = None if packed_b or window else window_b
    # A is copied to f32 a k block at a time: for all column panels (copy_a), or, 16-bit, for the block's one
    # (`stages_a`), which converts each element once, vectorized, where the micro-kernel converted it once a
    # micro-tile column, a scalar at a time (BERT's 128 x 3072 @ 3072 x 768 in f16 took 1.8x f32's time)
    staged = copy_a or (stages_a(dtype) and not indirect)
    # 8-bit integers: each k block's sums (at most `gemm.exact_k` products: exact in f32) from zero, then added to
    # the block's sums in i32, which f32 would round past 2^24
    integer = not dtype.is_float
    sums_type = td.i32 if integer else f32
    name = (f"tile_matmul_{BM}x{BN}x{KC}_m{MR}x{NR}" + ("_packed" if packed_b else "") + ("_at" if transposed_a else "")
            + ("_copied" if copy_a else "") + ("_window" if window else "") + ("_indirect" if indirect else "")
            + ("_rows" if rows_first else "") + ("_bwindow" if window_b else ""))
    a_spec = (dtype["BA", "CI", "H", "W"] if window else dtype["BA", "K", "M"] if transposed_a
              else dtype["BA", "XL"] if indirect else dtype["BA", "M", "K"])
    index_spec = td.i32["BZ", "BW"] if indirect else td.i32["BZ", 2]
    fill_strip = window_strip(window, MR) if window else None
    fill_panel = window_strip(window_b, BN) if window_b else None
    b_spec = (f32["RB", BN] if packed_b else dtype["BB", "CI", "H", "W"] if window_b
              else (b_dtype or dtype)["BB", "K", "N"])

    @td.func
    def micro_kernel(A, strip, panel, c, fa, fb, za, i0, j, k0, k1, row, M, index, at, ahead, width):
        """c += A[i0:i0+MR, k0:k1] @ panel[row : row+k1-k0, j:j+NR] (rows past M clamped); with `copy_a`, A is
        read from the block's copy `strip`, where i0 counts from the block's first row; with `indirect`, at
        `at` (the rows' offsets) plus the k's offset in `index`. With `packed_b` and `ahead` >= 0, every
        PREFETCH_GAP k steps it prefetches the next line of packed B (rows `width` wide) from its flat element
        `ahead` on."""
        if indirect:
            for x in range(MR):
                at[x] = index[0, 2 + td.min(i0 + x, M - 1)]
        if packed_b:
            line_row, line_col = ahead // width, ahead % width      # the next line to prefetch
        for k in range(k0, k1):
            if packed_b and ahead >= 0 and (k - k0) % PREFETCH_GAP == 0:
                td.prefetch(panel[line_row, line_col])
                line_col += LINE_FLOATS      # (a block is at least a line wide: `check`)
                wraps = line_col >= width
                line_row += 1 if wraps else 0
                line_col -= width if wraps else 0
            for x in range(MR):
                if staged:
                    fa[x] = strip[k - k0, i0 + x] if transposed_a else strip[i0 + x, k - k0]
                elif indirect:
                    fa[x] = td.cast(A[0, za + at[x] + index[0, 2 + M + k]], f32)
                else:
                    i = td.min(i0 + x, M - 1)
                    fa[x] = td.cast(A[za, k, i] if transposed_a else A[za, i, k], f32)
            for y in range(NR):
                fb[y] = panel[row + k - k0, j + y]
            if COLUMNS_OUTSIDE:
                for y in td.unroll(NR):
                    for x in td.unroll(MR):
                        c[x, y] += fa[x] * fb[y]
            else:
                for x in td.unroll(MR):
                    for y in td.unroll(NR):
                        c[x, y] += fa[x] * fb[y]

    @td.func(outline=True)
    def sweep(A, strip, panel, ends, width, partial, c, fa, fb, at, za, i_first, tiles, pbase, cols, k0, k1, first, row,
              M, index):
        """A block's micro-tiles for one column panel and k block k0..k1, `tiles` rows of them: each tile's sums
        from `partial`'s rows `pbase`.. (zeros in the `first` k block), through the micro-kernel and back (integers:
        from zeros, then added to `partial` in i32, or stored there in the `first` k block). Outlined:
        one compile of the unrolled tile serves every kernel of this micro-tile and operand form, whatever its
        epilogue, block or shapes (`panel`'s rows, `width` wide, end at flat element `ends`)."""
        for mi in range(tiles):
            i0, prow = i_first + mi * MR, pbase + mi * MR
            for nj in range(td.cdiv(cols, NR)):
                j = nj * NR
                if first or integer:
                    for x in td.unroll(MR):
                        for y in td.unroll(NR):
                            c[x, y] = 0.0
                else:
                    for x in td.unroll(MR):
                        for y in td.unroll(NR):
                            c[x, y] = partial[prow + x, j + y]
                ahead = -1
                if packed_b:    # this call's share of the rows after the k block's: the next one's
                    span = KC // PREFETCH_GAP * LINE_FLOATS      # the floats a call prefetches
                    share = (mi * (width // NR) + nj) * span
                    ahead = (row + k1 - k0) * width + share
                    ahead = ahead if share < KC * width and ahead + span <= ends else -1
                micro_kernel(A, strip, panel, c, fa, fb, za, i0, j, k0, k1, row, M, index, at, ahead, width)
                if integer and not first:
                    for x in td.unroll(MR):
                        for y in td.unroll(NR):
                            partial[prow + x, j + y] += td.cast(c[x, y], td.i32)
                else:
                    for x in td.unroll(MR):
                        for y in td.unroll(NR):
                            partial[prow + x, j + y] = td.cast(c[x, y], sums_type)

    def grid(M, N, BZ):
        if copy_a and N > WIDE_N:       # the block's sums hold WIDE_N columns: past them, writes out of bounds
            raise ValueError(f"kernel '{name}' copies A and computes every column panel of a block from the copy: "
                             f"at most {WIDE_N} columns, got N = {N} (`matmul_cpu.copies_a` says when to copy A)")
        return td.cdiv(M, BM) * (1 if copy_a else td.cdiv(N, BN)), 1, BZ

    @td.kernel(grid=grid, block=1, name=name)
    def matmul(A: a_spec, B: b_spec, C: out_dtype["BZ", "M", "N"], batch_index: index_spec, split: td.i32):
        # the sums, panel after panel (copy_a: every panel's; each BN wide, as a panel's micro-tiles and stores read)
        partial = td.shared(sums_type, (BM * (WIDE_N // BN if copy_a else 1), BN))
        # the block's A for one k block, in f32 (staged): as A's transpose (k, i) or as A (i, k)
        strip = td.shared(f32, ((KC, BM) if transposed_a else (BM, KC)) if staged else (1, 1))
        c = td.registers(f32, (MR, NR))
        fa = td.registers(f32, (MR,))
        fb = td.registers(f32, (NR,))
        at = td.registers(td.i32, (MR,))     # indirect: the micro-tile's rows' offsets in A
        if rows_first:      # consecutive blocks share a block of A's rows: its column panels in turn
            grid_n = td.cdiv(N, BN)
            row0, first_panel = blockIdx.x // grid_n * BM, blockIdx.x % grid_n
        else:               # consecutive blocks share a B panel
            grid_m = td.cdiv(M, BM)
            row0, first_panel = blockIdx.x % grid_m * BM, 0 if copy_a else blockIdx.x // grid_m
        za, zb = batch_index[blockIdx.z, 0], batch_index[blockIdx.z, 1]
        kdim = CI * window.kh * window.kw if window else BW - 2 - M if indirect else K
        chunk = td.cdiv(td.cdiv(kdim, KC), split) * KC      # split-k: this z-slice's range of k
        k_begin = blockIdx.z % split * chunk
        k_end = td.min(kdim, k_begin + chunk)
        panels = td.cdiv(N, BN) if copy_a else 1          # the column panels this block computes
        panel = B if packed_b else td.shared(f32, (KC, BN))
        rows = td.min(BM, M - row0)
        for k0 in range(k_begin, td.max(k_end, k_begin + 1), KC):   # a slice with no k (K = 0, split past K): one
            k1 = td.min(k_end, k0 + KC)                                # empty k block, its sums zeros
            if window:
                fill_strip(A, strip, za, k0, k1, rows, row0, H, W)
            elif staged and transposed_a:
                for k in range(k1 - k0):
                    for i in range(rows):       # a loop of unknown length: LLVM vectorizes the copy
                        strip[k, i] = td.cast(A[za, k0 + k, row0 + i], f32)
                    for i in range(rows, td.cdiv(rows, MR) * MR):    # the last micro-tile's rows past M
                        strip[k, i] = 0.0
            elif staged:
                for i in range(rows):
                    for k in range(k1 - k0):
                        strip[i, k] = td.cast(A[za, row0 + i, k0 + k], f32)
                for i in range(rows, td.cdiv(rows, MR) * MR):
                    for k in range(k1 - k0):
                        strip[i, k] = 0.0
            for pj in range(panels):
                col0 = (first_panel + pj) * BN
                cols = td.min(BN, N - col0)
                if packed_b:        # the row of this panel's k block in packed B
                    row = ((zb * td.cdiv(N, BN) + first_panel + pj) * kdim + k0)
                elif window_b:      # the panel is the im2col of the input's pixels col0.. (zeros past N)
                    row = 0
                    fill_panel(B, panel, zb, k0, k1, cols, col0, H, W)
                else:
                    row = 0
                    for k in range(k1 - k0):         # B's panel, packed: its rows are N apart in B
                        for j in range(cols):
                            panel[k, j] = td.cast(B[zb, k0 + k, col0 + j], f32)
                        for j in range(cols, BN):    # past column N: zeros, computed but never stored
                            panel[k, j] = 0.0
                sweep(A, strip, panel, panel.shape[0] * BN, BN, partial, c, fa, fb, at, za, 0 if staged else row0,
                      td.cdiv(rows, MR), pj * BM, cols, k0, k1, k0 == k_begin, row, M, batch_index)
                if not transposed_a and k1 == k_end:    # the block's rows are done: to C, through the epilogue
                    for i in range(rows):
                        for jc in range(cols):
                            C[blockIdx.z, row0 + i, col0 + jc] = td.cast(partial[pj * BM + i, jc], out_dtype)
        if transposed_a:    # C's columns are the output's rows: a whole block's stored at once, column by column
            for pj in range(panels):
                col0 = (first_panel + pj) * BN
                for j in range(td.min(BN, N - col0)):
                    for i in range(rows):
                        C[blockIdx.z, row0 + i, col0 + j] = td.cast(partial[pj * BM + i, j], out_dtype)
    return matmul


def stages_a(dtype) -> bool:
    """Whether the kernels copy A of element type `dtype` to f32 a block and k block at a time (16- and 8-bit)."""
    return dtype.bits < 32


def indirect_index(batch_index: np.ndarray, rows: np.ndarray, taps: np.ndarray) -> np.ndarray:
    """The `indirect` kernel's table: `batch_index` with each row of the GEMM's A's offset in the input, then
    each k's, appended to its first row."""
    table = np.zeros((len(batch_index), 2 + len(rows) + len(taps)), np.int32)
    table[:, :2] = batch_index
    table[0, 2:] = np.concatenate([rows, taps])
    return table


def window_strip(w: Window, MR: int):
    """A `td.func` filling a block's copy of A, or its panel of B (`window_b`: then MR is the panel's width), (k rows
    k0..k1, pixels row0..row0+in_m) with the im2col of the NCHW input X (H x W planes) at window `w`: each k row
    (c, kh, kw) walks the block's pixels output row by output row, the columns whose input pixel is inside found
    first, so the copy in between has no bounds checks, and zeros the padding and the last micro-tile's rows past
    the pixels."""
    @td.func
    def fill(X, strip, z, k0, k1, in_m, row0, H, W):
        for k in range(k1 - k0):
            c, kh, kw = (k0 + k) // (w.kh * w.kw), (k0 + k) // w.kw % w.kh, (k0 + k) % w.kw
            offset = kw * w.dw - w.pl                            # iw = ow * stride + offset
            first = td.max(0, -(offset // w.sw))                # the first ow with iw >= 0
            end = td.min(w.ow, td.max(first, -((offset - W) // w.sw)))     # past the last with iw < W
            i = 0
            while i < in_m:                                     # one output row's part of the block at a time
                oh = (row0 + i) // w.ow
                ow0 = row0 + i - oh * w.ow
                ow1 = td.min(w.ow, ow0 + in_m - i)
                ih = oh * w.sh - w.pt + kh * w.dh
                inside = ih >= 0 and ih < H
                lo = td.min(ow1, td.max(ow0, first)) if inside else ow1
                hi = td.max(lo, td.min(ow1, end)) if inside else ow1
                base = i - ow0                                  # column ow is the block's pixel base + ow
                for ow in range(ow0, lo):
                    strip[k, base + ow] = 0.0
                if hi - lo >= COPY_RUN:     # whole runs (a constant trip count: vectorized), the last overlapping
                    for step in range(lo, hi, COPY_RUN):
                        ow_run = min(step, hi - COPY_RUN)
                        for r in range(COPY_RUN):
                            strip[k, base + ow_run + r] = td.cast(X[z, c, ih, (ow_run + r) * w.sw + offset], f32)
                else:
                    for ow in range(lo, hi):
                        strip[k, base + ow] = td.cast(X[z, c, ih, ow * w.sw + offset], f32)
                for ow in range(hi, ow1):
                    strip[k, base + ow] = 0.0
                i += ow1 - ow0
            for j in range(in_m, td.cdiv(in_m, MR) * MR):        # the last micro-tile's rows past the pixels
                strip[k, j] = 0.0

    return fill
