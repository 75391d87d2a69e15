"""Tiled matrix multiplication, the kernel of DESIGN.md section 3.

What it shows:

* tensor parameters with size symbols (``f32["M", "K"]``) and a ``grid`` callable
  that reads them;
* task mappings scheduling the work of 256 threads: ``spatial(16, 16) * repeat(4, 4)``
  gives each thread a 4x4 tile of the 64x64 block tile, and
  ``repeat(2, 1) * spatial(32, 8)`` loads a 64x8 tile with two loads per thread;
* shared memory, per-thread registers, ``td.syncthreads()`` inside a runtime loop;
* predicated loads and stores, so any M, N, K work (here 300 x 200 @ 200 x 250,
  none a multiple of the 64x64x8 tile);
* the CUDA C++ of the same specialization (compiled with NVRTC, no GPU needed).

Run it with ``python examples/matmul.py``.
"""
import numpy as np

import taskdsl as td
from taskdsl import f32, spatial, repeat, threadIdx, blockIdx

BM, BN, BK = 64, 64, 8


@td.kernel(grid=lambda M, N: (td.cdiv(N, BN), td.cdiv(M, BM)), block=256)
def matmul(A: f32["M", "K"], B: f32["K", "N"], C: f32["M", "N"]):
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


def main():
    td.set_target("cpu")   # runs anywhere (launching on a GPU is not implemented yet)
    rng = np.random.default_rng(0)
    M, K, N = 300, 200, 250
    A = rng.standard_normal((M, K)).astype(np.float32)
    B = rng.standard_normal((K, N)).astype(np.float32)
    C = np.zeros((M, N), np.float32)

    matmul(A, B, C)                                  # numpy arrays in, C written in place

    expected = A.astype(np.float64) @ B.astype(np.float64)
    np.testing.assert_allclose(C, expected, rtol=1e-4, atol=1e-4)
    print(f"matmul {M}x{K} @ {K}x{N}: max abs error {np.abs(C - expected).max():.2e}")

    cuda = matmul.source(A, B, C, target="cuda")     # the CUDA C++ of this specialization
    print("first lines of the generated CUDA C++:")
    print("\n".join(cuda.splitlines()[:12]))

    cubin = matmul.compile(A, B, C, target="cuda", arch="sm_90")   # NVRTC; no GPU needed
    print(f"NVRTC compiled it to a {len(cubin.binary)}-byte cubin for {cubin.arch}")


if __name__ == "__main__":
    main()
