"""Kernels several test files share."""
import taskdsl as td
from taskdsl import blockIdx, f32, threadIdx


@td.kernel(grid=lambda N: td.cdiv(N, 256), block=256)
def tree_sum(X: f32["N"], Out: f32["G"]):
    sm = td.shared(f32, (256,))
    t = threadIdx.x
    g = blockIdx.x * 256 + t
    sm[t] = X[g] if g < N else 0.0
    td.syncthreads()
    s = 128
    while s > 0:                     # uniform: s is the same in every thread
        if t < s:
            sm[t] += sm[t + s]
        td.syncthreads()
        s //= 2
    if t == 0:
        Out[blockIdx.x] = sm[0]
