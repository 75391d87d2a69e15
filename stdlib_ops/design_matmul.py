"""The SIMT matmul of DESIGN.md section 3: 64x64 block tiles, 4x4 per thread, predicated loads."""
from __future__ import annotations

import taskdsl as td
from taskdsl import blockIdx, f32, repeat, spatial, threadIdx

BM, BN, BK = 64, 64, 8


@td.kernel(grid=lambda M, N: (td.cdiv(N, BN), td.cdiv(M, BM)), block=256)
def matmul_kernel(A: f32["M", "K"], B: f32["K", "N"], C: f32["M", "N"]):
    """C = A @ B: the DESIGN.md section 3 kernel."""
    sa = td.shared(f32, (BM, BK))
    sb = td.shared(f32, (BK, BN))
    acc = td.registers(f32, (4, 4))
    c_map = spatial(16, 16) * repeat(4, 4)          # 64x64 outputs on 256 threads
    for i, j in c_map(threadIdx.x):
        acc[i % 4, j % 4] = 0.0
    for k0 in range(0, K, BK):
        for i, k in (repeat(2, 1) * spatial(32, 8))(threadIdx.x):   # 64x8 tile, 2 loads each
            gi, gk = blockIdx.y * BM + i, k0 + k
            sa[i, k] = A[gi, gk] if gi < M and gk < K else 0.0      # predicated load
        for k, j in (repeat(2, 1) * spatial(4, 64))(threadIdx.x):
            gk, gj = k0 + k, blockIdx.x * BN + j
            sb[k, j] = B[gk, gj] if gk < K and gj < N else 0.0
        td.syncthreads()
        for i, j in c_map(threadIdx.x):
            for k in range(BK):
                acc[i % 4, j % 4] += sa[i, k] * sb[k, j]
        td.syncthreads()
    for i, j in c_map(threadIdx.x):
        gi, gj = blockIdx.y * BM + i, blockIdx.x * BN + j
        if gi < M and gj < N:
            C[gi, gj] = acc[i % 4, j % 4]

