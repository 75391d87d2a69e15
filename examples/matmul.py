"""Tiled matrix multiplication, the kernel of the project's design document (DESIGN.md section 3, kept with
the project's shared files, not in this repository).

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

The kernel lives in ``stdlib_ops/design_matmul.py`` (the operator library uses it too); this
script prints it, runs it and shows its CUDA. Run it with ``python examples/matmul.py``.
"""
import inspect

import numpy as np

import taskdsl as td
from stdlib_ops.design_matmul import matmul_kernel as matmul   # the design document's kernel, verbatim


def main():
    td.set_target("cpu")   # runs anywhere; "cuda" launches it on a GPU
    print(inspect.getsource(matmul.fn))
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
