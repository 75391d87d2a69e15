"""Block-parallel cpu launches: numba's threads from the main thread, the thread pool from any other."""
import threading

import numpy as np
from hypothesis import given, settings, strategies as st

import taskdsl as td
from taskdsl import blockIdx, f32, i32, threadIdx

OPTIMIZED = True    # not td.fast_compile, which launches through the thread pool only


@td.kernel(grid=lambda N, chunk: td.cdiv(N, 32 * chunk), block=32)
def add_shifted(X: f32["N"], Y: f32["N"], chunk: i32, chunks: i32, blocks: i32, prange: i32, parallel_chunk: i32):
    """Y += X + the scalars, `chunk` elements per thread: parameter names the launch code also uses."""
    base = (blockIdx.x * 32 + threadIdx.x) * chunk
    for k in range(chunk):
        i = base + k
        if i < N:
            Y[i] = Y[i] + X[i] + chunks + blocks + prange + parallel_chunk


def _expected(x, y, scalars):
    return y + x + np.float32(sum(scalars[1:]))


@settings(max_examples=8, deadline=None)
@given(n=st.sampled_from([1, 31, 33, 97, 1000, 4099]), chunk=st.integers(1, 4),
       scalars=st.lists(st.integers(-9, 9), min_size=4, max_size=4), seed=st.integers(0, 2**16))
def test_every_block_runs_once_from_the_main_thread_and_from_others(n, chunk, scalars, seed):
    td.set_target("cpu")
    rng = np.random.default_rng(seed)
    x, y = rng.standard_normal(n).astype(np.float32), rng.standard_normal(n).astype(np.float32)
    want = _expected(x, y, [chunk] + scalars)
    main = y.copy()
    add_shifted(x, main, chunk, *scalars)
    np.testing.assert_allclose(main, want, rtol=1e-6, atol=1e-6)
    other = y.copy()
    worker = threading.Thread(target=add_shifted, args=(x, other, chunk, *scalars))
    worker.start()
    worker.join()
    np.testing.assert_array_equal(other, main)


def test_parallel_kernels_have_a_parallel_entry_unless_compiling_fast():
    td.set_target("cpu")
    x = np.zeros(64, np.float32)
    text = add_shifted.source(x, x.copy(), 1, 0, 0, 0, 0, target="cpu")
    assert "def parallel_kernel_add_shifted(" in text and "prange(parallel_chunks)" in text
    td.fast_compile(True)
    assert "def parallel_" not in add_shifted.source(x, x.copy(), 1, 0, 0, 0, 0, target="cpu")
    y = np.zeros(64, np.float32)
    add_shifted(x + 1, y, 1, 0, 0, 0, 0)            # through the thread pool
    np.testing.assert_array_equal(y, np.ones(64, np.float32))
