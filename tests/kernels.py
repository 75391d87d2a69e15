"""Kernels several test files share."""
import taskdsl as td
from taskdsl import blockIdx, f32, i32, threadIdx


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


@td.kernel(grid=lambda N: td.cdiv(N, 64), block=64)
def warp_sums(X: f32["N"], Out: f32["W"]):
    g = blockIdx.x * 64 + threadIdx.x
    v = X[g] if g < N else 0.0
    for off in (16, 8, 4, 2, 1):
        v += td.shfl_down(v, off)
    if threadIdx.x % 32 == 0:
        Out[g // 32] = v


@td.kernel(grid=lambda N: td.cdiv(N, 64), block=64)
def histogram(Vals: i32["N"], Hist: i32["B"], Total: f32[1]):
    i = blockIdx.x * 64 + threadIdx.x
    if i < N:
        td.atomic_add(Hist[Vals[i]], 1)
        td.atomic_add(Total[0], 1.0)
