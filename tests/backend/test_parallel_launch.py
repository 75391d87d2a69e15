"""Block-parallel cpu launches: numba's threads from the main thread, the thread pool from any other."""
import threading

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

import taskdsl as td
from taskdsl import blockIdx, f32, i32, threadIdx

OPTIMIZED = True    # unrolled, as models compile


def _shifted(sign: float, name: str):
    """Y += sign * (X + the scalars), `chunk` elements per thread. The scalars are named like things the cpu
    code generator and launcher use or used (`prange`, the per-kernel launchers' `parallel_chunk`, ...)."""
    @td.kernel(grid=lambda N, chunk: td.cdiv(N, 32 * chunk), block=32, name=name)
    def shifted(X: f32["N"], Y: f32["N"], chunk: i32, chunks: i32, blocks: i32, prange: i32, parallel_chunk: i32):
        base = (blockIdx.x * 32 + threadIdx.x) * chunk
        for k in range(chunk):
            i = base + k
            if i < N:
                Y[i] = Y[i] + sign * (X[i] + chunks + blocks + prange + parallel_chunk)

    return shifted


add_shifted = _shifted(1.0, "add_shifted")
sub_shifted = _shifted(-1.0, "sub_shifted")     # another kernel with add_shifted's argument types


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


@pytest.mark.parametrize("fast", [False, True])
def test_kernels_with_the_same_argument_types_share_one_launcher(fast, monkeypatch):
    from taskdsl.backend.cpu.parallel import run_parallel
    monkeypatch.setenv("TASKDSL_NUM_THREADS", "2")
    td.set_target("cpu")
    td.fast_compile(fast)
    x = np.arange(4099, dtype=np.float32)
    y = np.ones_like(x)
    add_shifted(x, y, 1, 1, 2, 3, 4)             # 129 blocks on 2 threads: through a launcher
    np.testing.assert_array_equal(y, 1 + x + 10)
    launchers = set(run_parallel.signatures)
    sub_shifted(x, y, 1, 1, 2, 3, 4)
    np.testing.assert_array_equal(y, np.ones_like(x))
    assert set(run_parallel.signatures) == launchers     # no new launcher compiled for the second kernel
    assert len(add_shifted.source(x, y, 1, 0, 0, 0, 0, target="cpu").split("@njit")) == 2   # one function a module
