"""Barrier fission: how a block body is split, and which values become per-thread arrays."""
import numpy as np

import taskdsl as td
from taskdsl import f32, threadIdx
from taskdsl.backend.cpu import fission as F
from taskdsl.passes import lower


@td.kernel(grid=1, block=64)
def rotate(X: f32[64], Y: f32[64]):
    s = td.shared(f32, (64,))
    t = threadIdx.x
    v = X[t] * 2.0            # lives across the barrier
    s[t] = v
    td.syncthreads()
    w = s[(t + 1) % 64]       # only used in this region
    Y[t] = w + v


def _program(kernel, *args):
    binding = kernel.bind(args)
    return F.fission(lower(kernel._frontend_ir(binding.block)))


def test_split_at_barrier_and_cross_barrier_values():
    x = np.arange(64, dtype=np.float32)
    program = _program(rotate, x, x)
    kinds = [type(it).__name__ for it in program.items]
    assert kinds == ["Region", "Barrier", "Region"]
    names = {v.name for v in program.thread_arrays.values()}
    assert names == {"t", "v"}                  # w never crosses a region boundary
    y = np.empty_like(x)
    rotate(x, y)
    np.testing.assert_array_equal(y, 2 * np.roll(x, -1) + 2 * x)


@td.kernel(grid=1, block=64)
def loop_barrier(X: f32[64], n: td.i32):
    s = td.shared(f32, (64,))
    s[threadIdx.x] = X[threadIdx.x]
    step = 1
    for _ in range(n):        # uniform loop around a barrier: stays at block level
        td.syncthreads()
        v = s[(threadIdx.x + step) % 64]
        td.syncthreads()
        s[threadIdx.x] = v
        step *= 2
    td.syncthreads()
    X[threadIdx.x] = s[threadIdx.x]


def test_uniform_loop_with_barriers_stays_at_block_level():
    x = np.arange(64, dtype=np.float32)
    program = _program(loop_barrier, x, 3)
    loops = [it for it in program.items if isinstance(it, F.BlockFor)]
    assert len(loops) == 1
    assert [type(it).__name__ for it in loops[0].body] == ["Barrier", "Region", "Barrier", "Region"]
    # step is carried from one iteration of the block-level loop to the next, per thread
    assert "step" in {v.name for v in program.thread_arrays.values()}
    loop_barrier(x, 3)
    np.testing.assert_array_equal(x, np.roll(np.arange(64, dtype=np.float32), -(1 + 2 + 4)))


@td.kernel(grid=1, block=64)
def warp_guarded(X: f32[64], Y: f32[2]):
    v = X[threadIdx.x]
    if threadIdx.x // 32 == 1:          # warp-uniform: shuffles allowed
        for off in (16, 8, 4, 2, 1):
            v += td.shfl_down(v, off)
        if threadIdx.x % 32 == 0:
            Y[1] = v


def test_warp_uniform_branch_guards_each_region():
    x = np.arange(64, dtype=np.float32)
    program = _program(warp_guarded, x, np.zeros(2, np.float32))
    guarded = [it for it in program.items if isinstance(it, F.Region) and it.guards]
    assert len(guarded) == 6 and all(len(r.guards) == 1 for r in guarded)
    y = np.zeros(2, np.float32)
    warp_guarded(x, y)
    assert y[1] == x[32:].sum() and y[0] == 0
