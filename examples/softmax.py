"""Row softmax, one block per row, numerically stable.

What it shows:

* ``grid=lambda R: R``: one block of 128 threads per row, each thread striding over the
  row with ``range(threadIdx.x, C, THREADS)``;
* the stable formulation: ``m = max(x)``, ``s = sum(exp(x - m))``, ``y = exp(x - m) / s``;
* block reductions as a tree in shared memory: ``stride`` halves in a ``while`` loop with
  ``td.syncthreads()`` in its body. The loop condition depends only on ``stride``, which is
  the same in every thread (uniform), so the barrier is legal; the thread-dependent
  ``if threadIdx.x < stride`` sits inside the loop, not around the barrier;
* a ``@td.func`` that takes a shared tensor (by reference) and an operator chosen at compile
  time (``is_max``), inlined twice with different arguments.

Run it with ``python examples/softmax.py``.
"""
import numpy as np

import taskdsl as td
from taskdsl import f32, threadIdx, blockIdx

THREADS = 128                # a power of two, for the tree


@td.func
def block_reduce(buf, value: f32, is_max) -> f32:
    """max (is_max=True) or sum of `value` over the block; every thread gets the result."""
    buf[threadIdx.x] = value
    td.syncthreads()
    stride = THREADS // 2
    while stride > 0:
        if threadIdx.x < stride:
            a, b = buf[threadIdx.x], buf[threadIdx.x + stride]
            buf[threadIdx.x] = td.max(a, b) if is_max else a + b
        td.syncthreads()
        stride //= 2
    result = buf[0]
    td.syncthreads()         # everyone has read buf[0] before buf is reused
    return result


@td.kernel(grid=lambda R: R, block=THREADS)
def softmax(X: f32["R", "C"], Y: f32["R", "C"]):
    buf = td.shared(f32, (THREADS,))
    row = blockIdx.x
    m = -float("inf")
    for j in range(threadIdx.x, C, THREADS):
        m = td.max(m, X[row, j])
    m = block_reduce(buf, m, True)
    s = 0.0
    for j in range(threadIdx.x, C, THREADS):
        s += td.exp(X[row, j] - m)
    s = block_reduce(buf, s, False)
    inv = 1.0 / s
    for j in range(threadIdx.x, C, THREADS):
        Y[row, j] = td.exp(X[row, j] - m) * inv


def main():
    td.set_target("cpu")
    rng = np.random.default_rng(0)
    x = (rng.standard_normal((37, 1000)) * 10).astype(np.float32)   # large values: needs the max
    y = np.zeros_like(x)

    softmax(x, y)

    e = np.exp(x.astype(np.float64) - x.max(axis=1, keepdims=True))
    expected = e / e.sum(axis=1, keepdims=True)
    np.testing.assert_allclose(y, expected, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(y.sum(axis=1), 1.0, rtol=1e-5)
    print(f"softmax {x.shape}: max abs error {np.abs(y - expected).max():.2e}, row sums within "
          f"{np.abs(y.sum(axis=1) - 1).max():.1e} of 1")


if __name__ == "__main__":
    main()
