"""Barrier fission on the cpu target: kernels whose results depend on `syncthreads()`.

On the cpu target a block runs as a sequence of per-thread loops split at each barrier;
these kernels are only correct if every thread finishes the phase before a barrier before
any thread starts the phase after it, if values that live across a barrier are kept per
thread, and if uniform loops and ifs around barriers run once per block. The references
are numpy computations of what a GPU would produce.
"""
import numpy as np
from hypothesis import example, given, settings
from hypothesis import strategies as st

import taskdsl as td
from taskdsl import blockIdx, f32, i32, threadIdx

from .kernels import tree_sum

GPU_TWINS = True   # every test also runs as a @gpu twin on the cuda target (conftest.py)

FEW = settings(max_examples=6, deadline=None)
SIZES = st.integers(1, 700) | st.sampled_from([1, 2, 31, 255, 256, 257, 509, 512])


def per_block(x, block, fill=0.0):
    """`x` padded with `fill` to whole blocks, shape (blocks, block)."""
    blocks = max(1, -(-len(x) // block))
    padded = np.full(blocks * block, fill, dtype=x.dtype)
    padded[:len(x)] = x
    return padded.reshape(blocks, block)


# --------------------------------------------------------------------------- tree reduction in a while loop
@FEW
@given(n=SIZES, seed=st.integers(0, 2**16))
@example(n=1, seed=0)
@example(n=257, seed=1)
def test_tree_reduction_with_barrier_in_while(n, seed):
    x = np.random.default_rng(seed).uniform(-1, 1, n).astype(np.float32)
    out = np.full(-(-n // 256), np.nan, np.float32)
    tree_sum(x, out)
    np.testing.assert_allclose(out, per_block(x, 256).astype(np.float64).sum(1), rtol=1e-5, atol=1e-5)


# --------------------------------------------------------------------------- cross-thread reads
@td.kernel(grid=lambda N: td.cdiv(N, 96), block=96)
def rotate_and_reverse(X: f32["N"], Rot: f32["N"], Rev: f32["N"]):
    s = td.shared(f32, (96,))
    t = threadIdx.x
    g = blockIdx.x * 96 + t
    s[t] = X[g] if g < N else -1.0
    td.syncthreads()
    if g < N:
        Rot[g] = s[(t + 1) % 96]     # written by the next thread, in the previous phase
        Rev[g] = s[95 - t]


@FEW
@given(n=SIZES, seed=st.integers(0, 2**16))
@example(n=1, seed=0)
def test_thread_reads_what_another_thread_wrote(n, seed):
    x = np.random.default_rng(seed).uniform(-5, 5, n).astype(np.float32)
    rot, rev = np.zeros(n, np.float32), np.zeros(n, np.float32)
    rotate_and_reverse(x, rot, rev)
    blocks = per_block(x, 96, fill=-1.0)
    np.testing.assert_array_equal(rot, np.roll(blocks, -1, axis=1).reshape(-1)[:n])
    np.testing.assert_array_equal(rev, blocks[:, ::-1].reshape(-1)[:n])


@td.kernel(grid=lambda N: td.cdiv(N, 100), block=100)
def rotate_rounds(X: f32["N"], Y: f32["N"], rounds: i32):
    s = td.shared(f32, (100,))
    t = threadIdx.x
    g = blockIdx.x * 100 + t
    v = X[g] if g < N else 0.0       # a local that lives across every barrier below
    for r in range(rounds):          # uniform loop: bound is a scalar parameter
        s[t] = v
        td.syncthreads()
        v = s[(t + 1) % 100]
        td.syncthreads()             # without it, the next round's write races this read
    if g < N:
        Y[g] = v


@FEW
@given(n=SIZES, rounds=st.integers(0, 7), seed=st.integers(0, 2**16))
@example(n=100, rounds=0, seed=0)
def test_barriers_in_uniform_for_loop(n, rounds, seed):
    x = np.random.default_rng(seed).uniform(-5, 5, n).astype(np.float32)
    y = np.zeros(n, np.float32)
    rotate_rounds(x, y, rounds)
    np.testing.assert_array_equal(y, np.roll(per_block(x, 100), -rounds, axis=1).reshape(-1)[:n])


# --------------------------------------------------------------------------- uniform ifs around barriers
@td.kernel(grid=lambda N: td.cdiv(N, 64), block=64)
def conditional_reverse(X: f32["N"], Y: f32["N"], Flags: i32["G"], flip: i32):
    s = td.shared(f32, (64,))
    t = threadIdx.x
    g = blockIdx.x * 64 + t
    s[t] = X[g] if g < N else 0.0
    td.syncthreads()
    if flip > 0:                     # uniform: a scalar parameter
        v = s[63 - t]
        td.syncthreads()
        s[t] = v * 2.0
    if blockIdx.x % 2 == 1:          # uniform: blockIdx
        td.syncthreads()
        w = s[(t + 3) % 64]
        td.syncthreads()
        s[t] = w
    else:
        s[t] += 1000.0
    if Flags[blockIdx.x] != 0:       # uniform: a load at a block-uniform address
        td.syncthreads()
        u = s[(t + 1) % 64]
        td.syncthreads()
        s[t] = u + 0.5
    td.syncthreads()
    if g < N:
        Y[g] = s[t]


@FEW
@given(n=SIZES, flip=st.integers(0, 1), seed=st.integers(0, 2**16))
def test_barriers_in_uniform_ifs(n, flip, seed):
    rng = np.random.default_rng(seed)
    x = rng.uniform(-5, 5, n).astype(np.float32)
    blocks = per_block(x, 64)
    flags = rng.integers(0, 2, size=len(blocks)).astype(np.int32)
    y = np.zeros(n, np.float32)
    conditional_reverse(x, y, flags, flip)
    want = blocks.copy()
    if flip:
        want = want[:, ::-1] * np.float32(2)
    for b in range(len(blocks)):
        want[b] = np.roll(want[b], -3) if b % 2 == 1 else want[b] + np.float32(1000)
        if flags[b]:
            want[b] = np.roll(want[b], -1) + np.float32(0.5)
    np.testing.assert_array_equal(y, want.reshape(-1)[:n])


# --------------------------------------------------------------------------- values across barriers
@td.kernel(grid=lambda N: td.cdiv(N, 64), block=64)
def across_barriers(X: f32["N"], Y: f32["N"]):
    s = td.shared(f32, (64,))
    regs = td.registers(f32, (4,))
    t = threadIdx.x
    g = blockIdx.x * 64 + t
    x = X[g] if g < N else 0.0
    a = x * 2.0                      # a local, alive until the end
    for k in range(4):
        regs[k] = x + k              # registers, alive until the end
    if t % 3 == 0:                   # a divergent definition before a barrier
        c = 1.0
    else:
        c = -1.0
    s[t] = x
    td.syncthreads()
    b = s[(t + 3) % 64]
    td.syncthreads()
    s[t] = b + a
    td.syncthreads()
    if g < N:
        Y[g] = s[(t + 1) % 64] + regs[0] * regs[3] + a * c


@FEW
@given(n=SIZES, seed=st.integers(0, 2**16))
def test_locals_and_registers_live_across_barriers(n, seed):
    x = np.random.default_rng(seed).uniform(-3, 3, n).astype(np.float32)
    y = np.zeros(n, np.float32)
    across_barriers(x, y)
    xb = per_block(x, 64).astype(np.float64)
    a = 2 * xb
    s = np.roll(xb, -3, axis=1) + a
    c = np.where(np.arange(64) % 3 == 0, 1.0, -1.0)
    want = np.roll(s, -1, axis=1) + xb * (xb + 3) + a * c
    np.testing.assert_allclose(y, want.reshape(-1)[:n], rtol=1e-5, atol=1e-5)


@td.kernel(grid=lambda N: td.cdiv(N, 128), block=128)
def block_scan(X: f32["N"], Y: f32["N"]):
    s = td.shared(f32, (128,))
    t = threadIdx.x
    g = blockIdx.x * 128 + t
    s[t] = X[g] if g < N else 0.0
    td.syncthreads()
    d = 1                            # block-level loop-carried variable
    while d < 128:
        v = s[t - d] if t >= d else 0.0
        td.syncthreads()
        s[t] += v
        td.syncthreads()
        d *= 2
    if g < N:
        Y[g] = s[t]


@FEW
@given(n=SIZES, seed=st.integers(0, 2**16))
@example(n=1, seed=0)
def test_hillis_steele_scan(n, seed):
    x = np.random.default_rng(seed).integers(-8, 8, n).astype(np.float32)   # exact sums
    y = np.zeros(n, np.float32)
    block_scan(x, y)
    np.testing.assert_array_equal(y, np.cumsum(per_block(x, 128), axis=1).reshape(-1)[:n])


@td.kernel(grid=lambda N: td.cdiv(N, 32), block=32)
def carried(X: f32["N"], Y: f32["N"], Z: i32["N"], limit: i32):
    s = td.shared(f32, (32,))
    t = threadIdx.x
    g = blockIdx.x * 32 + t
    x = X[g] if g < N else 0.0
    acc = 0.0                        # per-thread value carried around a block-level loop
    steps = 0
    for r in range(6):
        if r == 2:
            continue                 # uniform continue of a loop holding barriers
        if r == limit:
            break                    # uniform break
        s[t] = x * (r + 1)
        td.syncthreads()
        acc += s[(t + r) % 32]
        steps += 1
        td.syncthreads()
    if g < N:
        Y[g] = acc
        Z[g] = steps


@FEW
@given(n=SIZES, limit=st.integers(0, 7), seed=st.integers(0, 2**16))
def test_loop_carried_values_with_uniform_break_and_continue(n, limit, seed):
    x = np.random.default_rng(seed).integers(-8, 8, n).astype(np.float32)
    y, z = np.zeros(n, np.float32), np.zeros(n, np.int32)
    carried(x, y, z, limit)
    xb = per_block(x, 32)
    acc = np.zeros_like(xb)
    steps = 0
    for r in range(6):
        if r == 2:
            continue
        if r == limit:
            break
        acc += np.roll(xb * (r + 1), -r, axis=1)
        steps += 1
    np.testing.assert_array_equal(y, acc.reshape(-1)[:n])
    np.testing.assert_array_equal(z, np.full(n, steps))


@td.kernel(grid=lambda N: N, block=64)
def countdown(Start: i32["N"], Out: i32["N", 64]):
    flag = td.shared(i32, (1,))
    t = threadIdx.x
    if t == 0:
        flag[0] = Start[blockIdx.x]
    td.syncthreads()
    count = 0
    while flag[0] > 0:               # uniform: every thread reads the same shared element
        td.syncthreads()             # ... before thread 0 changes it
        if t == 0:
            flag[0] -= 1
        count += 1
        td.syncthreads()
    Out[blockIdx.x, t] = count


@FEW
@given(starts=st.lists(st.integers(-2, 9), min_size=1, max_size=5))
def test_while_on_a_shared_memory_flag(starts):
    start = np.array(starts, np.int32)
    out = np.full((len(starts), 64), -1, np.int32)
    countdown(start, out)
    np.testing.assert_array_equal(out, np.repeat(np.maximum(start, 0)[:, None], 64, axis=1))


# --------------------------------------------------------------------------- warp shuffles + shared memory
@td.func
def warp_sum(v: f32) -> f32:
    for off in (16, 8, 4, 2, 1):
        v += td.shfl_xor(v, off)
    return v


@td.kernel(grid=lambda N: td.cdiv(N, 256), block=256)
def block_sum_warps(X: f32["N"], Out: f32["G"]):
    partial = td.shared(f32, (8,))
    t = threadIdx.x
    g = blockIdx.x * 256 + t
    lane = threadIdx.x % 32
    warp = threadIdx.x // 32
    v = warp_sum(X[g] if g < N else 0.0)
    if lane == 0:
        partial[warp] = v
    td.syncthreads()
    if warp == 0:                    # warp-uniform: shuffles are allowed inside
        w = partial[lane] if lane < 8 else 0.0
        for off in (16, 8, 4, 2, 1):
            w += td.shfl_down(w, off)
        if lane == 0:
            Out[blockIdx.x] = w


@FEW
@given(n=SIZES, seed=st.integers(0, 2**16))
@example(n=1, seed=0)
@example(n=512, seed=0)
def test_warp_shuffle_then_shared_memory_block_reduction(n, seed):
    x = np.random.default_rng(seed).uniform(-1, 1, n).astype(np.float32)
    out = np.full(-(-n // 256), np.nan, np.float32)
    block_sum_warps(x, out)
    np.testing.assert_allclose(out, per_block(x, 256).astype(np.float64).sum(1), rtol=1e-5, atol=1e-5)


@td.kernel(grid=lambda N: td.cdiv(N, 128), block=128)
def warp_max_broadcast(X: f32["N"], Y: f32["N"]):
    best = td.shared(f32, (4,))
    t = threadIdx.x
    g = blockIdx.x * 128 + t
    v = X[g] if g < N else -1e30
    for off in (1, 2, 4, 8, 16):
        v = td.max(v, td.shfl_xor(v, off))
    if t % 32 == 0:
        best[t // 32] = v
    td.syncthreads()
    m = td.max(td.max(best[0], best[1]), td.max(best[2], best[3]))
    if g < N:
        Y[g] = X[g] - m              # every thread uses the block maximum


@FEW
@given(n=SIZES, seed=st.integers(0, 2**16))
def test_block_max_broadcast(n, seed):
    x = np.random.default_rng(seed).uniform(-5, 5, n).astype(np.float32)
    y = np.zeros(n, np.float32)
    warp_max_broadcast(x, y)
    blocks = per_block(x, 128, fill=np.float32(-1e30))
    np.testing.assert_array_equal(y, (blocks - blocks.max(1, keepdims=True)).reshape(-1)[:n])


@td.kernel(grid=lambda N: td.cdiv(N, 64), block=64)
def warp_uniform_via_alias(X: f32["N"], Out: f32["G"]):
    partial = td.shared(f32, (2,))
    t = threadIdx.x                  # an alias of threadIdx.x ...
    warp = t // 32                   # ... so this is as warp-uniform as threadIdx.x // 32
    lane = t % 32
    g = blockIdx.x * 64 + t
    v = warp_sum(X[g] if g < N else 0.0)
    if lane == 0:
        partial[warp] = v
    td.syncthreads()
    if warp == 0:
        w = partial[lane % 2]
        w = w + td.shfl_xor(w, 1)
        if lane == 0:
            Out[blockIdx.x] = w


@FEW
@given(n=SIZES, seed=st.integers(0, 2**16))
def test_warp_uniform_condition_through_an_alias_of_threadidx(n, seed):
    x = np.random.default_rng(seed).uniform(-1, 1, n).astype(np.float32)
    out = np.full(-(-n // 64), np.nan, np.float32)
    warp_uniform_via_alias(x, out)
    np.testing.assert_allclose(out, per_block(x, 64).astype(np.float64).sum(1), rtol=1e-5, atol=1e-5)


@td.kernel(grid=lambda N: td.cdiv(N, 64), block=64)
def shuffle_while_in_warp_if(X: f32["N"], Out: f32["G"]):
    partial = td.shared(f32, (2,))
    g = blockIdx.x * 64 + threadIdx.x
    v = warp_sum(X[g] if g < N else 0.0)
    if threadIdx.x % 32 == 0:
        partial[threadIdx.x // 32] = v
    td.syncthreads()
    if threadIdx.x < 32:             # warp-uniform
        w = partial[threadIdx.x] if threadIdx.x < 2 else 0.0
        off = 16
        while off > 0:               # the same trip count in every lane
            w += td.shfl_down(w, off)
            off //= 2
        if threadIdx.x == 0:
            Out[blockIdx.x] = w


@FEW
@given(n=SIZES, seed=st.integers(0, 2**16))
def test_runtime_loop_around_a_shuffle_in_a_warp_uniform_if(n, seed):
    x = np.random.default_rng(seed).uniform(-1, 1, n).astype(np.float32)
    out = np.full(-(-n // 64), np.nan, np.float32)
    shuffle_while_in_warp_if(x, out)
    np.testing.assert_allclose(out, per_block(x, 64).astype(np.float64).sum(1), rtol=1e-5, atol=1e-5)


# --------------------------------------------------------------------------- barriers in functions and nests
@td.func
def block_reduce(sm, t: i32) -> f32:
    td.syncthreads()
    s = 64
    while True:                      # left by a uniform break
        if s == 0:
            break
        if t < s:
            sm[t] += sm[t + s]
        td.syncthreads()
        s //= 2
    total = sm[0]
    td.syncthreads()                 # everyone has read sm[0] before it is reused
    return total


@td.kernel(grid=lambda N: td.cdiv(N, 128), block=128)
def two_reductions(X: f32["N"], Out: f32["G", 2], live: i32):
    sm = td.shared(f32, (128,))
    if blockIdx.x >= live:
        return                       # uniform early return before the barriers
    t = threadIdx.x
    g = blockIdx.x * 128 + t
    x = X[g] if g < N else 0.0
    sm[t] = x
    total = block_reduce(sm, t)
    sm[t] = x * x
    squares = block_reduce(sm, t)
    if t == 0:
        Out[blockIdx.x, 0] = total
        Out[blockIdx.x, 1] = squares


@FEW
@given(n=SIZES, seed=st.integers(0, 2**16))
def test_barriers_inside_a_device_function_and_uniform_early_return(n, seed):
    x = np.random.default_rng(seed).integers(-5, 5, n).astype(np.float32)
    blocks = -(-n // 128)
    live = max(1, blocks - 1)        # the last block returns early when there is more than one
    out = np.full((blocks, 2), -7.0, np.float32)
    two_reductions(x, out, live)
    xb = per_block(x, 128).astype(np.float64)
    want = np.stack([xb.sum(1), (xb * xb).sum(1)], axis=1)
    want[live:] = -7.0
    np.testing.assert_array_equal(out, want)


@td.kernel(grid=1, block=64)
def shuffle_after_a_warp_uniform_return(X: i32[64], Y: i32[64], skip_warp: i32):
    t = threadIdx.x
    if t // 32 == skip_warp:
        Y[t] = -2
        if skip_warp >= 0:
            return                  # a whole warp returns: the other's lanes all reach the shuffle below
    v = X[t] + td.shfl_xor(X[t], 1)
    if v > 100:
        Y[t] = -3
        if t >= 0:
            return                  # lane-dependent (as the analysis sees it), but after the shuffle
    Y[t] = v


def test_a_shuffle_after_a_warp_uniform_return():
    """Refused until session 50 ("inside a branch ... that differs between the lanes"): the code after a return
    was as divergent as the function's most divergent return, there the lane-dependent one after the shuffle."""
    x = np.arange(64, dtype=np.int32) * 3
    for skip in (0, 1):
        y = np.full(64, -1, np.int32)
        shuffle_after_a_warp_uniform_return(x, y, skip)
        v = x + x[np.arange(64) ^ 1]
        want = np.where(np.arange(64) // 32 == skip, -2, np.where(v > 100, -3, v))
        np.testing.assert_array_equal(y, want)


@td.kernel(grid=lambda N: td.cdiv(N, 32), block=32)
def nested_block_loops(X: f32["N"], Y: f32["N"], inner: i32):
    s = td.shared(f32, (32,))
    acc = td.registers(f32, (2,))
    t = threadIdx.x
    g = blockIdx.x * 32 + t
    v = X[g] if g < N else 0.0
    acc[0] = 0.0
    acc[1] = 0.0
    for a in range(2):
        for b in range(inner):
            s[t] = v
            td.syncthreads()
            v = s[(t + 1) % 32] + 1.0
            acc[a] += v              # a register element carried across barriers and iterations
            td.syncthreads()
    if g < N:
        Y[g] = acc[0] * 1000.0 + acc[1]


@FEW
@given(n=SIZES, inner=st.integers(0, 4), seed=st.integers(0, 2**16))
def test_nested_block_level_loops_with_registers(n, inner, seed):
    x = np.random.default_rng(seed).integers(-5, 5, n).astype(np.float32)
    y = np.zeros(n, np.float32)
    nested_block_loops(x, y, inner)
    v = per_block(x, 32).astype(np.float64)
    acc = np.zeros((2,) + v.shape)
    for a in range(2):
        for _ in range(inner):
            v = np.roll(v, -1, axis=1) + 1.0
            acc[a] += v
    np.testing.assert_array_equal(y, (acc[0] * 1000 + acc[1]).reshape(-1)[:n])
