"""The tensor-core matmul template: f16/bf16 operands with f32 accumulation (mma.sync m16n8k16), and 8-bit ones
(m16n8k32: E4M3/E5M2 into f32, s8/u8 into s32).

A block of wm x wn warps computes a BM x BN tile; each warp owns mi x ni mma tiles of
16 x 8 (a warp tile of 16*mi x 8*ni). The k loop is a `stages`-deep cp.async pipeline:
tiles of A (BM x BK) and B (BK x BN) are copied into a ring of shared buffers while the
warps multiply an older one, so global latency hides behind tensor-core work:

    prologue: issue the copies of tiles 0 .. stages-2, one commit group each; wait for tile 0;
              barrier; ldmatrix its first k16 step's fragments
    for kt:   for each k16 step: ldmatrix the next step's fragments into the other of two
              fragment sets (in the last step, after waiting for tile kt+1 and a barrier:
              tile kt+1's first step); mma the step's fragments into the accumulators; after
              the first step's mma issue the copies of A's part of tile kt+stages-1 (into the
              slot of tile kt-1, which every warp finished reading before the last barrier),
              after the second's B's, and commit

so the barrier and the fragment loads of each step hide behind the mma already issued, as in
CUTLASS's multistage mainloop.

Shared tiles are stored with an XOR swizzle of their 16-byte chunks (chunk ^ f(row)), so
the eight rows an `ldmatrix` phase reads fall in different banks; copies and ldmatrix use
the same `swizzle`, so it is invisible to correctness. Copies move 8 elements (16 bytes)
when the rows of A and B are multiples of 8 elements; otherwise (e.g. 2039) the tiles are filled
by element loads (unconditional, at clamped indices, zero-filled past K by a select) and the
pipeline is only a double-buffered schedule, unless the
caller first copies the operands into rows padded with zeros (`padded_copy_kernel`): B's rows
may be longer than C's (B (batch, K, NB), C (batch, M, N), NB >= N; the extra columns are
computed and never stored). Operands are 3-D with the SIMT template's `batch_index` table
(batch broadcasting) and the same calling convention.

8-bit operands take B k-major, as BT (batch, NB, K) (the instruction reads B's columns as rows, and ldmatrix
cannot transpose 8-bit elements), and their k tiles are twice as deep: a point's `bk` counts 16-bit columns, so a
point moves the same bytes and runs the same number of mma steps a k tile for either width.
"""

import functools

import taskdsl as td
from taskdsl import blockIdx, f32, threadIdx
from taskdsl.schedule.space import Space

from .matmul_simt import batch_block, batch_grid, batch_tile, load_mapping, split_k_tiles

# dynamic shared memory per block: sm_80 lets a block have 163 KiB (sm_90 227 KiB, sm_86 and sm_89 99 KiB). The
# space off a device stops at 160 KiB; on one, at the device's limit (`space(max_smem)`): a Hopper GPU adds the
# 256x128x64 and 128x256x64 tiles of 4 stages (192 KiB), an sm_86 or sm_89 one drops what it cannot launch. Up to
# 96 KiB two blocks share an SM, above it (CUTLASS's 128x256x64 and 256x128x64 tiles of 3 stages) one
MAX_SMEM = 160 * 1024
MAX_ACC = 128             # f32 accumulators per thread


def tile_shape(p) -> tuple:
    """(BM, BN, threads) of a point."""
    (wm, wn), (mi, ni) = p.warps, p.warp_tiles
    return wm * mi * 16, wn * ni * 8, 32 * wm * wn


def operand_tiles(p, bits: int = 16) -> tuple:
    """The (rows, columns), in elements, of a k tile of A and of B in shared memory, for operands of `bits` bits:
    B's is (BK, BN), or k-major (BN, BK) for 8-bit operands."""
    bm, bn, _ = tile_shape(p)
    bk = p.bk * 16 // bits
    return (bm, bk), ((bn, bk) if bits == 8 else (bk, bn))


def check(p, max_smem: int = MAX_SMEM, bits: int = 16):
    """Why point `p` cannot run in a block of `max_smem` bytes of shared memory (operands of `bits` bits), or None."""
    bm, bn, threads = tile_shape(p)
    mi, ni = p.warp_tiles
    if ni % 2:
        return "an odd number of 8-column mma tiles (B fragments load in pairs)"
    if p.bk % 32:
        return "a k tile of an odd number of 16-deep steps (a tile's steps alternate two fragment sets)"
    if mi * ni * 4 > MAX_ACC:
        return f"more than {MAX_ACC} accumulators per thread"
    if p.stages * (bm + bn) * p.bk * 2 > max_smem:
        return f"shared memory above {max_smem // 1024} KiB"
    if bm > 256 or bn > 256:
        return "block tile above 256"
    for vec in (128 // bits, 1):      # 16-byte copies, and element loads for unaligned sizes
        if any(load_mapping(rows, cols // vec, threads) is None for rows, cols in operand_tiles(p, bits)):
            return "a tile the threads cannot load evenly"
    return None


@functools.cache
def space(max_smem: int = MAX_SMEM, bits: int = 16) -> Space:
    """The hardware-centric space of tensor-core schedules for blocks of up to `max_smem` bytes of shared memory,
    for operands of `bits` bits (16, or 8)."""
    return Space("tc_matmul" if bits == 16 else f"tc_matmul_{bits}bit", {
        "warps": ((2, 2), (2, 4), (4, 2), (1, 4)),
        # (1, 2) and (2, 2): block tiles down to 16x64 and 32x32 for outputs of a few 128x64 tiles (ResNet-50's
        # 1x1 convolutions at 14x14 and 7x7), which otherwise fill the SMs only through split-k and its second kernel
        "warp_tiles": ((1, 2), (2, 2), (2, 4), (4, 4), (2, 8), (4, 2), (4, 8)),
        "bk": (32, 64),
        "stages": (2, 3, 4),
    }, functools.partial(check, max_smem=max_smem, bits=bits))


DEFAULT = dict(warps=(2, 2), warp_tiles=(4, 4), bk=32, stages=3)          # 128x64 tiles, 128 threads
# From 2^22 output elements (256 tiles of 128x128, two a SM on 132 SMs) the larger tiles of LARGE. Every block
# streams its A and B tiles from L2: a 128x64 tile does 43 flops per byte it loads, a 128x128 one 64. Its 64x64
# warp tiles also halve the ldmatrix traffic per mma of the 64x32 ones. 4 warps, 224 registers and 96 KiB of
# shared memory (ptxas): two blocks per SM. Tuned on an H200 at 4096^3 (session 30), it was the fastest of the
# 100 points (0.418 ms, 0.44x cuBLAS); session 26's 256x128 tiles of 8 warps, one block a SM, ranked 25th (0.460).
LARGE = dict(warps=(2, 2), warp_tiles=(4, 8), bk=64, stages=3)            # 128x128 tiles, 128 threads
LARGE_FROM = 1 << 22
# Below 2^20 output elements (under 128 tiles of 128x64: fewer blocks than an H100 has SMs) the 16x64 tiles of
# SMALL, one 16x16 mma column per warp: many more blocks, each with a short k loop of deep stages. Tuned on an
# H100 over the 136 points (session 32), ResNet-50's 13 conv layers, batch 1 (M*N from 25,088 to 802,816): it
# ranked in the top 3 in 11 of them, within a microsecond of the best, where the 128x64 default ranked 45th to
# 103rd (0.949x cuDNN on average at that default, 1.276x tuned).
SMALL = dict(warps=(1, 4), warp_tiles=(1, 2), bk=64, stages=4)            # 16x64 tiles, 128 threads
SMALL_BELOW = 1 << 20


def default_point(m: int = 0, n: int = 0):
    """The default tensor-core schedule for an M x N output (128x64 tiles without sizes)."""
    size = m * n
    return space().point(**(LARGE if size >= LARGE_FROM else SMALL if 0 < size < SMALL_BELOW else DEFAULT))


PARTS = ("all", "copies", "math", "mma")


@functools.cache
def tc_matmul_kernel(p, dtype, out_dtype, vec: int = 8, parts: str = "all", b_dtype=None):
    """The tensor-core kernel for point `p`, A of `dtype` and B of `b_dtype` (default `dtype`; 8-bit types may
    mix within their kind); `vec` the elements a copy moves: 16 bytes' worth (8 of 16 bits, 16 of 8 bits:
    cp.async, K and N multiples of it) or 1 (loads).

    `parts` other than "all" keeps part of the k loop, to time where its time goes (`bench tc-parts`):
    "copies" the copies, waits and barriers alone (C is zeros), "math" the ldmatrix and mma alone, on
    whatever shared memory holds (C is garbage), "mma" the mma alone, on fragments loaded once before the
    loop, with no wait or barrier in it: the most this point's mma.sync can do on the device (C is garbage).
    """
    if parts not in PARTS:
        raise ValueError(f"parts must be one of {', '.join(PARTS)}, got {parts!r}")
    b_dtype = b_dtype or dtype
    if {dtype.bits, b_dtype.bits} not in ({16}, {8}):
        raise TypeError(f"the tensor-core template takes 16-bit or 8-bit operands of one width, got {dtype.name} and "
                        f"{b_dtype.name}")
    bits = dtype.bits
    chunk = 128 // bits            # elements of a 16-byte copy
    if vec not in (chunk, 1):
        raise ValueError(f"vec must be {chunk} (16-byte copies of {dtype.name}) or 1, got {vec}")
    copies, math = parts in ("all", "copies"), parts != "copies"
    streamed = parts != "mma"       # the k loop waits for the copies, and (with math) ldmatrix their tiles
    (wm, wn), (mi, ni) = p.warps, p.warp_tiles
    BM, BN, T = tile_shape(p)
    (_, BK), b_tile = operand_tiles(p, bits)
    STAGES = p.stages
    k_major_b = bits == 8         # B's shared tile (BN, BK), read by ldmatrix without .trans
    B_DIMS = ("BB", "NB", "K") if k_major_b else ("BB", "K", "NB")
    STEP = 256 // bits            # the depth of one mma: 16, or 32 for 8-bit operands
    KS = BK // STEP               # k steps a tile: even (the check), so tile kt + 1 starts on fragment set 0
    B_STEP = min(1, KS - 2)       # the step that copies B's part of the tile ahead
    per = 32 // bits              # operand elements in a 32-bit register
    acc_dtype = f32 if dtype.is_float else td.i32
    mma = td.mma_m16n8k16 if bits == 16 else td.mma_m16n8k32
    a_map, (a_s0, a_s1) = load_mapping(BM, BK // vec, T)      # over 'vec'-element chunks of the tiles
    b_map, (b_s0, b_s1) = load_mapping(b_tile[0], b_tile[1] // vec, T)
    name = (f"tc_matmul_{BM}x{BN}x{BK}_w{wm}x{wn}_m{mi}x{ni}_s{STAGES}" + ("" if vec > 1 else "_v1")
            + ("" if parts == "all" else "_" + parts))

    @td.func
    def swz(row, col, width):
        """Physical column of (row, col) in a shared row of `width` elements: its 16-byte chunk ^ f(row).

        f(row) cycles over the chunks of a 128-byte line of banks, for the rows sharing one line.
        """
        chunks = width // chunk
        return ((col // chunk) ^ (row // max(1, 8 // chunks) % min(8, chunks))) * chunk + col % chunk

    @td.func
    def issue_a(A, sa, za, row0, kt, slot):
        """Copy (or load) A's part of k tile `kt` into ring slot `slot`.

        Rows past the last are clamped to it rather than checked (their products are never stored), so only
        the k edge zero-fills; and K a multiple of BK needs no check: the kernel is specialized to its sizes,
        so the check folds away."""
        M, K = A.shape[1], A.shape[2]
        if not copies:
            return
        for i, c in a_map(threadIdx.x):
            gi, gk = td.min(row0 + i, M - 1), kt * BK + c * vec
            ok = K % BK == 0 or gk < K
            if vec > 1:
                td.cp_async(sa[slot, i, swz(i, c * vec, BK)], A[za, gi, gk], vec, pred=ok)
            else:       # the load unconditional (its index clamped), so a thread's loads overlap their latencies
                value = A[za, gi, td.min(gk, K - 1)]
                sa[slot, i, swz(i, c, BK)] = value if ok else td.cast(0, dtype)

    @td.func
    def issue_b(B, sb, zb, col0, kt, slot):
        """Copy (or load) B's part of k tile `kt` into ring slot `slot` (as `issue_a`); B (batch, K, NB), or
        k-major BT (batch, NB, K) for 8-bit operands."""
        K = B.shape[2] if k_major_b else B.shape[1]
        NB = B.shape[1] if k_major_b else B.shape[2]
        if not copies:
            return
        for r, c in b_map(threadIdx.x):
            if k_major_b:       # row r of the tile is column col0 + r of B; c counts chunks along k
                gk, gj = kt * BK + c * vec, td.min(col0 + r, NB - 1)
                ok = K % BK == 0 or gk < K
                if vec > 1:
                    td.cp_async(sb[slot, r, swz(r, c * vec, BK)], B[zb, gj, gk], vec, pred=ok)
                else:
                    value = B[zb, gj, td.min(gk, K - 1)]
                    sb[slot, r, swz(r, c, BK)] = value if ok else td.cast(0, b_dtype)
            else:
                gk, gj = kt * BK + r, td.min(col0 + c * vec, NB - vec)     # clamped columns: never stored either
                ok = K % BK == 0 or gk < K
                if vec > 1:
                    td.cp_async(sb[slot, r, swz(r, c * vec, BN)], B[zb, gk, gj], vec, pred=ok)
                else:
                    value = B[zb, td.min(gk, K - 1), gj]
                    sb[slot, r, swz(r, c, BN)] = value if ok else td.cast(0, b_dtype)

    @td.func
    def load_fragments(sa, sb, fa, fb, slot, kk, fragment_set, lane, warp_m0, warp_n0):
        """ldmatrix k step `kk` of ring slot `slot` into fragment set `fragment_set` (0 or 1) of `fa` and `fb`."""
        if not math:
            return
        for a in range(mi):     # x4: lanes 0-15 address rows 0-15 at the step's first half, lanes 16-31 its second
            r = warp_m0 + a * 16 + lane % 16
            td.ldmatrix(fa[fragment_set, a], sa[slot, r, swz(r, kk * STEP + lane // 16 * chunk, BK)])
        for b in range(ni // 2):      # x4: two 8-column mma tiles' B fragments, lanes 16-31 the second's
            if k_major_b:     # lanes 8j..8j+7: the tile's 8 rows (B's columns) at the step's half j % 2
                r = warp_n0 + (2 * b + lane // 16) * 8 + lane % 8
                td.ldmatrix(fb[fragment_set, b], sb[slot, r, swz(r, kk * STEP + lane // 8 % 2 * chunk, BK)])
            else:
                r = kk * STEP + lane % 16
                td.ldmatrix(fb[fragment_set, b], sb[slot, r, swz(r, warp_n0 + (2 * b + lane // 16) * 8, BN)],
                            trans=True)

    @td.kernel(grid=lambda M, N, BZ: batch_grid(td.cdiv(M, BM) * td.cdiv(N, BN), BZ), block=T, name=name)
    def matmul(A: dtype["BA", "M", "K"], B: b_dtype[B_DIMS], C: out_dtype["BZ", "M", "N"],
               batch_index: td.i32["BZ", 2], split: td.i32):
        sa = td.shared(dtype, (STAGES, BM, BK))
        sb = td.shared(b_dtype, (STAGES, b_tile[0], b_tile[1]))
        fa = td.registers(dtype, (2, mi, 4 * per))          # two fragment sets: k step kk uses set kk % 2
        fb = td.registers(b_dtype, (2, ni // 2, 2, 2 * per))  # B fragments in pairs: one ldmatrix.x4 loads two
        acc = td.registers(acc_dtype, (mi, ni, 4))
        zs, row0, col0 = batch_tile(blockIdx.x, M, N, BM, BN)
        za, zb = batch_index[zs, 0], batch_index[zs, 1]
        kt0, kt1 = split_k_tiles(K, BK, split, zs)
        lane = threadIdx.x % 32
        warp_m0 = threadIdx.x // 32 // wn * (mi * 16)
        warp_n0 = threadIdx.x // 32 % wn * (ni * 8)
        for a in range(mi):
            for b in range(ni):
                for r in range(4):
                    acc[a, b, r] = 0
        for s in range(STAGES - 1):
            if kt0 + s < kt1:
                issue_a(A, sa, za, row0, kt0 + s, (kt0 + s) % STAGES)
                issue_b(B, sb, zb, col0, kt0 + s, (kt0 + s) % STAGES)
            td.cp_async_commit()        # one group per tile, empty past the last: the waits count groups
        td.cp_async_wait(STAGES - 2)
        td.syncthreads()
        slot = kt0 % STAGES             # the ring slot of tile kt
        if kt0 < kt1:
            load_fragments(sa, sb, fa, fb, slot, 0, 0, lane, warp_m0, warp_n0)
            if not streamed:        # "mma": both fragment sets, once
                load_fragments(sa, sb, fa, fb, slot, 1, 1, lane, warp_m0, warp_n0)
        for kt in range(kt0, kt1):
            ahead = kt + STAGES - 1     # the tile to copy, into the slot of tile kt - 1, which every warp
            ahead_slot = slot - 1 if slot > 0 else STAGES - 1      # finished reading before the last barrier
            next_slot = slot + 1 if slot < STAGES - 1 else 0
            for kk in td.unroll(KS):
                # step kk's fragments were loaded during step kk - 1; load the next step's during this one's mma.
                # The last step's next is tile kt + 1's first: it first waits for that tile and a barrier (every
                # warp is then done with tile kt's slot too, which the next iteration's copies overwrite), so the
                # barrier and the loads hide behind the tensor cores' work on the steps already issued
                if kk == KS - 1 and streamed:
                    td.cp_async_wait(STAGES - 2)
                    td.syncthreads()
                if streamed and (kk < KS - 1 or kt + 1 < kt1):
                    load_fragments(sa, sb, fa, fb, slot if kk < KS - 1 else next_slot, (kk + 1) % KS, (kk + 1) % 2,
                                   lane, warp_m0, warp_n0)
                if math:
                    for a in range(mi):
                        for b in range(ni):
                            mma(fa[kk % 2, a], fb[kk % 2, b // 2, b % 2], acc[a, b])
                # the copies of tile `ahead` are issued after the step's mma (the tensor cores busy meanwhile), A's
                # in the first step and B's in the second (the first, of two), committed before the last step's
                # wait. ptxas predicates the branch around them (no select of each copy's address, as `pred=` has)
                if kk == 0 and ahead < kt1:
                    issue_a(A, sa, za, row0, ahead, ahead_slot)
                if kk == B_STEP:
                    if ahead < kt1:
                        issue_b(B, sb, zb, col0, ahead, ahead_slot)
                    td.cp_async_commit()
            slot = next_slot
        td.cp_async_wait(0)
        for a in range(mi):
            for b in range(ni):
                for r in range(4):
                    gi = row0 + warp_m0 + a * 16 + lane // 4 + r // 2 * 8
                    gj = col0 + warp_n0 + b * 8 + lane % 4 * 2 + r % 2
                    if gi < M and gj < N:
                        C[zs, gi, gj] = td.cast(acc[a, b, r], out_dtype)

    return matmul


PAD_BLOCK = 256


@functools.cache
def padded_copy_kernel(dtype):
    """Y (batch, RP, CP) = X (batch, R, C) in its top-left corner, zeros elsewhere (RP >= R, CP >= C): operands
    with rows of a multiple of 8 elements, which the 16-byte copies of `tc_matmul_kernel(vec=8)` need. (Not
    `stdlib_ops.pad`: its widths and fill value are host arrays copied to the GPU at every call; this kernel
    takes device arrays only, so a matmul's launches stay prepared and replayable.)"""
    @td.kernel(grid=lambda RP, CP, BZ: batch_grid(td.cdiv(RP * CP, PAD_BLOCK), BZ), block=PAD_BLOCK,
               name=f"padded_copy_{dtype.name}")
    def padded_copy(X: dtype["BZ", "R", "C"], Y: dtype["BZ", "RP", "CP"]):
        zs, block = batch_block(blockIdx.x, td.cdiv(RP * CP, PAD_BLOCK))
        i = block * PAD_BLOCK + threadIdx.x
        r, c = i // CP, i % CP
        if r < RP:
            Y[zs, r, c] = X[zs, r, c] if r < R and c < C else td.cast(0.0, dtype)

    return padded_copy


__all__ = ["space", "default_point", "tc_matmul_kernel", "PARTS", "padded_copy_kernel", "tile_shape", "check"]
