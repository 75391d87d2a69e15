"""Sum of a vector: warp shuffles, then a cross-warp step in shared memory.

What it shows:

* a block of 256 threads = 8 warps; each thread first sums ``ITEMS`` elements picked
  by the task mapping ``repeat(ITEMS) * spatial(256)`` (consecutive threads read
  consecutive elements, which coalesces on a GPU);
* a butterfly reduction inside each warp with ``td.shfl_xor`` over a compile-time tuple
  of offsets (the loop is unrolled while translating);
* lane 0 of each warp writes its warp's sum to shared memory, ``td.syncthreads()``,
  then warp 0 alone reduces the 8 warp sums with ``td.shfl_down`` under ``if warp == 0:``.
  ``warp = threadIdx.x // 32`` is warp-uniform, so shuffles may sit under that ``if``
  (a barrier could not: it is not uniform across the block);
* two ways to finish: a second pass of the same kernel over the per-block partial sums,
  and a variant that adds each block's sum into the result with ``td.atomic_add``.

Run it with ``python examples/reduction.py``.
"""
import numpy as np

import taskdsl as td
from taskdsl import f32, repeat, spatial, threadIdx, blockIdx

THREADS = 256
WARPS = THREADS // 32
ITEMS = 4                    # elements each thread sums before the shuffles
TILE = THREADS * ITEMS       # elements per block


@td.func
def block_sum(s: f32) -> f32:
    """The sum of `s` over the block, valid in thread 0 (every thread must call it)."""
    warp_sums = td.shared(f32, (WARPS,))
    lane = threadIdx.x % 32
    warp = threadIdx.x // 32
    for offset in (16, 8, 4, 2, 1):                 # unrolled: a compile-time tuple
        s += td.shfl_xor(s, offset)                 # every lane ends with the warp's sum
    if lane == 0:
        warp_sums[warp] = s
    td.syncthreads()
    if warp == 0:                                   # warp-uniform: shuffles are allowed here
        v = warp_sums[lane] if lane < WARPS else 0.0
        for offset in (4, 2, 1):
            v += td.shfl_down(v, offset)            # lane 0 ends with the block's sum
        s = v
    return s


@td.func
def tile_sum(X, N) -> f32:
    """The sum of this block's tile of TILE elements of X, on every thread of the block."""
    s = 0.0
    for i in (repeat(ITEMS) * spatial(THREADS))(threadIdx.x):
        idx = blockIdx.x * TILE + i
        if idx < N:
            s += X[idx]
    return block_sum(s)


@td.kernel(grid=lambda N: td.cdiv(N, TILE), block=THREADS)
def sum_pass(X: f32["N"], partial: f32["P"]):
    """partial[b] = sum of the b-th tile of TILE elements of X."""
    total = tile_sum(X, N)
    if threadIdx.x == 0:
        partial[blockIdx.x] = total


@td.kernel(grid=lambda N: td.cdiv(N, TILE), block=THREADS)
def sum_atomic(X: f32["N"], out: f32[1]):
    """out[0] += sum of each tile (out must start at 0)."""
    total = tile_sum(X, N)
    if threadIdx.x == 0:
        td.atomic_add(out[0], total)


def two_pass_sum(x: np.ndarray) -> np.float32:
    """Reduce with sum_pass until one value is left (two passes up to TILE**2 elements)."""
    while x.size > 1:
        partial = np.zeros(-(-x.size // TILE), np.float32)
        sum_pass(x, partial)
        x = partial
    return x[0]


def main():
    td.set_target("cpu")
    rng = np.random.default_rng(0)
    x = rng.standard_normal(300_001).astype(np.float32)     # not a multiple of TILE
    expected = x.astype(np.float64).sum()

    total = two_pass_sum(x)
    np.testing.assert_allclose(total, expected, rtol=1e-4, atol=1e-3)
    print(f"two passes : {total:.4f} (numpy {expected:.4f}, error {abs(total - expected):.2e})")

    out = np.zeros(1, np.float32)
    sum_atomic(x, out)
    np.testing.assert_allclose(out[0], expected, rtol=1e-4, atol=1e-3)
    print(f"atomic_add : {out[0]:.4f} (numpy {expected:.4f}, error {abs(out[0] - expected):.2e})")


if __name__ == "__main__":
    main()
