"""Block-parallel cpu launches: the launching thread and the pool's helpers claim chunks of the blocks."""
import threading

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st
from numba import njit, typeof, types

import taskdsl as td
from taskdsl import blockIdx, f32, i32, threadIdx
from taskdsl.backend.cpu import threads

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
    """add_shifted's result, its f32 additions in its order (summed first, the scalars differed from it by an ulp
    of their sum: 1.2e-6 at 0.136)."""
    shifted = x
    for s in scalars[1:]:
        shifted = shifted + np.float32(s)
    return y + shifted


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
    from taskdsl.backend.cpu.parallel import launch
    monkeypatch.setenv("TASKDSL_NUM_THREADS", "2")
    td.set_target("cpu")
    td.fast_compile(fast)
    x = np.arange(4099, dtype=np.float32)
    y = np.ones_like(x)
    add_shifted(x, y, 1, 1, 2, 3, 4)             # 129 blocks on 2 threads: through a launcher
    np.testing.assert_array_equal(y, 1 + x + 10)
    launchers = set(launch.signatures)
    sub_shifted(x, y, 1, 1, 2, 3, 4)
    np.testing.assert_array_equal(y, np.ones_like(x))
    assert set(launch.signatures) == launchers     # no new launcher compiled for the second kernel
    assert len(add_shifted.source(x, y, 1, 0, 0, 0, 0, target="cpu").split("@njit")) == 2   # one function a module


def _doubling(dtype):
    """Y = X + X, on elements of `dtype`."""
    @td.kernel(grid=lambda N: td.cdiv(N, 32), block=32, name=f"doubling_{dtype}")
    def doubling(X: dtype["N"], Y: dtype["N"]):
        i = blockIdx.x * 32 + threadIdx.x
        if i < N:
            Y[i] = X[i] + X[i]

    return doubling


DOUBLINGS = {np.dtype(n): _doubling(t) for n, t in
             [("float32", td.f32), ("float64", td.f64), ("int16", td.i16), ("uint8", td.u8), ("float16", td.f16)]}


@pytest.mark.parametrize("fast", [False, True])
def test_kernels_on_other_element_types_share_one_launcher(fast):
    """The launcher takes flat arrays as views of their bytes: one launcher serves every element type."""
    from taskdsl.backend.cpu.parallel import launch
    td.set_target("cpu")
    td.fast_compile(fast)
    launchers = None
    for dtype, kernel in DOUBLINGS.items():
        x = (np.arange(37) % 100).astype(dtype)
        y = np.zeros_like(x)
        kernel(x, y)
        np.testing.assert_array_equal(y, x + x)
        launchers = set(launch.signatures) if launchers is None else launchers
        assert set(launch.signatures) == launchers, f"a new launcher for {dtype}"


@td.kernel(grid=lambda R: R, block=lambda C: C)
def _doubled_rows(X: f32["R", "C"], Y: f32["R", "C"]):
    Y[blockIdx.x, threadIdx.x] = X[blockIdx.x, threadIdx.x] * 2.0


def test_kernels_of_other_numbers_of_sizes_share_one_launcher():
    """A kernel's sizes and grid travel as one int64 array (`launch.launch_ints`): a kernel of two size symbols
    runs through the launcher of a kernel of one. (Once a process: launchers are the process's.)"""
    from taskdsl.backend.cpu.parallel import launch
    td.set_target("cpu")
    x = np.arange(37, dtype=np.float32)
    y = np.zeros_like(x)
    DOUBLINGS[np.dtype(np.float32)](x, y)
    np.testing.assert_array_equal(y, x + x)
    launchers = set(launch.signatures)
    rows = np.arange(15, dtype=np.float32).reshape(3, 5)
    doubled = np.zeros_like(rows)
    _doubled_rows(rows, doubled)
    np.testing.assert_array_equal(doubled, rows * 2)
    assert set(launch.signatures) == launchers, "a new launcher for a kernel of two sizes"


# tests of the helper-thread pool itself, which exists on Linux (x86-64, aarch64) only
pooled = pytest.mark.skipif(threads._syscall_numbers() is None, reason="no helper-thread pool off Linux")


@njit(nogil=True, no_cpython_wrapper=True, no_cfunc_wrapper=True)
def _doubling_entry(a, shift, block_begin, block_end):
    """A kernel entry as the cpu code generator makes them (no numba wrappers): block i doubles a[i] and adds
    `shift`; a negative element raises, as a debug check does."""
    for i in range(block_begin, block_end):
        if a[i] < 0:
            raise IndexError(7, "a negative element")
        a[i] = 2 * a[i] + shift


@njit(nogil=True, no_cpython_wrapper=True, no_cfunc_wrapper=True)
def _counting_entry(a, block_begin, block_end):
    """A kernel entry whose block i adds 1 to a[i]."""
    for i in range(block_begin, block_end):
        a[i] += 1


def _entry(fn, *arg_types) -> int:
    from taskdsl.backend.cpu.parallel import entry_address
    return entry_address(fn, (*arg_types, types.int64, types.int64))


def _idle_pool(helpers: int):
    """A pool whose state says `helpers` helpers take part, none of them running: as if the machine's other
    cores were busy and their threads never got a turn."""
    pool = threads.Pool()
    pool.state[threads.HELPERS] = helpers
    return pool.state_address


@pooled
@settings(max_examples=10, deadline=None)
@given(n=st.integers(1, 50), bounds=st.tuples(st.integers(0, 50), st.integers(0, 50)), chunks=st.integers(1, 9),
       idle=st.booleans())
def test_a_launch_runs_each_block_of_its_range_once_in_any_number_of_chunks(n, bounds, chunks, idle):
    """The pool's helpers and the launching thread claim the chunks; with helpers that never run (`idle`), the
    launching thread runs every chunk and returns: it never waits for a helper to wake."""
    from taskdsl.backend.cpu.parallel import launch
    begin, end = min(min(bounds), n), min(max(bounds), n)
    address = _entry(_doubling_entry, typeof(np.zeros(1)), types.int64)
    a = np.arange(n, dtype=np.float64)
    launch(_idle_pool(3) if idle else threads.pool().engage(1), address, begin, end, chunks, a, 3)
    want = np.arange(n, dtype=np.float64)
    want[begin:end] = 2 * want[begin:end] + 3
    np.testing.assert_array_equal(a, want)


@pooled
def test_launches_from_several_threads_at_once_run_every_block_once():
    """Threads launching at once, for a second and a half, on more helpers than cores: one holds the pool's helpers,
    the others run their chunks themselves; jobs of every size and count of chunks follow one another, and helpers
    fall asleep between some. (A run of this kind, 30 s long, found a helper reading a job's fields as the next
    job wrote them.)"""
    import time
    from taskdsl.backend.cpu.parallel import launch
    address = _entry(_counting_entry, typeof(np.zeros(1)))
    pool = threads.Pool()
    state, failures = pool.engage(3), []

    def launches(seed):
        rng, end = np.random.default_rng(seed), time.perf_counter() + 1.5
        while time.perf_counter() < end:
            a, repeats = np.zeros(int(rng.integers(1, 300))), int(rng.integers(1, 20))
            for _ in range(repeats):
                launch(state, address, 0, a.size, int(rng.integers(1, 70)), a)
            if not (a == repeats).all():
                failures.append((a.size, repeats))
            if rng.random() < 0.01:
                time.sleep(0.002)
    workers = [threading.Thread(target=launches, args=(seed,)) for seed in range(3)]
    for w in workers:
        w.start()
    for w in workers:
        w.join()
    pool.stop()
    assert not failures


@pooled
def test_a_forked_child_launches_on_helpers_of_its_own():
    """A child forked after the parent's helpers started has none of them: it starts its own."""
    import multiprocessing
    x = np.arange(4099, dtype=np.float32)
    y = np.zeros_like(x)
    add_shifted(x, y, 1, 0, 0, 0, 0)        # the parent's pool is running
    child = multiprocessing.get_context("fork").Pool(1)
    try:
        y = child.apply(_shifted_in_a_child, (x,))
    finally:
        child.terminate()
    np.testing.assert_array_equal(y, x)


def _shifted_in_a_child(x):
    y = np.zeros_like(x)
    add_shifted(x, y, 1, 0, 0, 0, 0)        # 129 blocks: a parallel launch
    assert len(threads.pool().threads) >= 1
    return y


@pooled
@pytest.mark.parametrize("asleep", [False, True])
def test_a_stopped_pool_ends_its_helpers(asleep):
    """`Pool.stop` (run at exit, before the interpreter tears down the code helpers run) ends every helper, spinning
    right after a launch or asleep on the futex (woken: else each would hold the exit up for its join's timeout)."""
    import time
    from taskdsl.backend.cpu.parallel import launch
    pool = threads.Pool()
    a = np.zeros(50)
    launch(pool.engage(2), _entry(_counting_entry, typeof(a)), 0, 50, 9, a)
    np.testing.assert_array_equal(a, np.ones(50))
    assert all(t.is_alive() for t in pool.threads) and len(pool.threads) == 2
    deadline = time.perf_counter() + 10
    while asleep and pool.state[threads.SLEEPERS] < 2 and time.perf_counter() < deadline:
        time.sleep(0.01)
    assert not asleep or pool.state[threads.SLEEPERS] == 2
    started = time.perf_counter()
    pool.stop()
    assert not any(t.is_alive() for t in pool.threads) and time.perf_counter() - started < 0.9


def test_without_a_pool_a_launch_shares_its_blocks_through_python_threads(monkeypatch):
    """Where helpers cannot sleep on a futex (`threads.pool()` is None: not Linux), equal shares go to a thread
    pool, the calling thread running the first."""
    from taskdsl.backend.cpu import launch
    pools, thread_pool = [], launch._pool
    monkeypatch.setattr(threads, "pool", lambda: None)
    monkeypatch.setattr(launch, "_pool", lambda workers: pools.append(workers) or thread_pool(workers))
    monkeypatch.setenv("TASKDSL_NUM_THREADS", "3")
    td.set_target("cpu")
    x = np.arange(4099, dtype=np.float32)
    y = np.zeros_like(x)
    sub_shifted(x, y, 1, 0, 0, 0, 0)        # 129 blocks, in 2 or 3 shares (the count of its first launch)
    np.testing.assert_array_equal(y, -x)
    assert pools and pools[0] >= 1


@pooled
def test_an_exception_propagates_from_one_chunk_and_fails_a_parallel_launch():
    """One chunk: the kernel's own exception (a debug check's site number and message). Several: a chunk cannot
    carry it, so the launch raises a RuntimeError that says what likely happened."""
    from taskdsl.backend.cpu.parallel import launch
    address = _entry(_doubling_entry, typeof(np.zeros(1)), types.int64)
    a = np.array([1.0, -1.0, 2.0])
    with pytest.raises(IndexError) as raised:
        launch(0, address, 0, 3, 1, a, 0)
    assert raised.value.args == (7, "a negative element")
    with pytest.raises(RuntimeError, match="raised in a parallel launch"):
        launch(threads.pool().engage(1), address, 0, 3, 2, a, 0)


_CACHED = '''
from numba import njit


@njit(cache=True)
def twice(x):
    return x + x
'''


def _fresh_dispatcher(folder, name: str):
    """`twice` of the module file in `folder`, imported as a new module: a new dispatcher over the same numba
    disk cache, as in another process."""
    import importlib.util
    spec = importlib.util.spec_from_file_location(name, folder / "cached_twice.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.twice


def test_a_numba_cache_entry_naming_another_signatures_code_is_compiled_again(tmp_path):
    """Two processes saving to one numba cache at once (pytest's workers) can leave an index entry that names
    the data file of another signature's code: `launch` then ran code compiled for other argument types (a
    TypeError converting an array to a scalar, or worse). `parallel.compiled` takes a lock on the cache for its
    updates, and compiles again where an entry's code is for another signature."""
    from taskdsl.backend.cpu.parallel import compiled
    (tmp_path / "cached_twice.py").write_text(_CACHED)
    first = _fresh_dispatcher(tmp_path, "cached_twice_a")
    ints, floats = (types.int64,), (types.float64,)
    assert compiled(first, ints).entry_point(3) == 6 and compiled(first, floats).entry_point(1.5) == 3.0
    index_file = first._cache._cache_file
    index = index_file._load_index()
    key_of = {k[0]: k for k in index}
    index[key_of[floats]] = index[key_of[ints]]         # what the race leaves: floats -> the ints' code
    index_file._save_index(index)
    second = _fresh_dispatcher(tmp_path, "cached_twice_b")
    result = compiled(second, floats)
    assert tuple(result.signature.args) == floats and result.entry_point(1.25) == 2.5
    assert list((tmp_path / "__pycache__").glob("*.lock"))      # the lock file beside the index


def test_a_helper_numba_compiles_for_a_caller_takes_the_lock_and_the_repair(tmp_path):
    """The helpers `td.fast_compile` kernels call (`support_calls`) are compiled by numba when it types the kernel,
    not through `compiled`: `lock_compiles` routes those compiles through the lock and the repair too."""
    from taskdsl.backend.cpu.parallel import lock_compiles
    (tmp_path / "cached_twice.py").write_text(_CACHED)
    first = _fresh_dispatcher(tmp_path, "cached_twice_c")
    lock_compiles(first)
    assert first(3) == 6 and first(1.5) == 3.0
    index_file = first._cache._cache_file
    index = index_file._load_index()
    key_of = {k[0]: k for k in index}
    index[key_of[(types.float64,)]] = index[key_of[(types.int64,)]]
    index_file._save_index(index)
    second = _fresh_dispatcher(tmp_path, "cached_twice_d")
    lock_compiles(second)
    assert njit(lambda x: second(x))(1.25) == 2.5            # numba compiles `second` as it types the caller
    assert list((tmp_path / "__pycache__").glob("*.lock"))


def test_a_damaged_or_unwritable_numba_cache_of_the_package_is_best_effort(tmp_path, monkeypatch):
    """A truncated cache file of the package's own launchers and helpers raised at every call in every later
    process (only generated kernels' files were tolerated); a full disk raised from numba's save."""
    import errno

    from numba.core import caching

    from taskdsl.backend.cpu.parallel import compiled
    (tmp_path / "cached_twice.py").write_text(_CACHED)
    first = _fresh_dispatcher(tmp_path, "cached_twice_e")
    assert compiled(first, (types.int64,)).entry_point(4) == 8
    for data in (tmp_path / "__pycache__").glob("*.nbc"):
        data.write_bytes(data.read_bytes()[:100])
    second = _fresh_dispatcher(tmp_path, "cached_twice_f")
    assert compiled(second, (types.int64,)).entry_point(5) == 10

    def full(*args):
        raise OSError(errno.ENOSPC, "No space left on device")
    monkeypatch.setattr(caching.IndexDataCacheFile, "save", full)
    third = _fresh_dispatcher(tmp_path, "cached_twice_g")
    assert compiled(third, (types.float64,)).entry_point(1.5) == 3.0


def test_little_data_of_a_rule_based_kernel_runs_on_one_thread(monkeypatch):
    """A rule-based operator's kernel (its work its arrays' bytes) launched on less than SERIAL_BYTES runs on one
    thread: with the cores busy, handing a sum of (64, 64) to two threads took up to 8 ms. More data, and any
    kernel written in the DSL, whatever its data, share their blocks among the threads."""
    import stdlib_ops
    from stdlib_ops import elementwise
    from taskdsl.backend.cpu.launch import SERIAL_BYTES
    monkeypatch.setenv("TASKDSL_NUM_THREADS", "2")
    td.set_target("cpu")
    for size, workers in ((6000, 1), (65536, 2)):       # spans of 4096 elements: 2 and 16 blocks
        x = np.linspace(-1, 1, size, dtype=np.float32)
        np.testing.assert_array_equal(stdlib_ops.relu(x), np.maximum(x, 0))
        [kernel] = elementwise._unary_plan("relu", x).op.kernels
        launch = list(kernel._launches.values())[-1]        # this call's (the latest signature)
        assert kernel.serial_below == SERIAL_BYTES and (2 * x.nbytes < SERIAL_BYTES) == (workers == 1)
        assert launch.blocks > 1 and launch.workers == workers
    x, y = np.arange(64, dtype=np.float32), np.zeros(64, np.float32)
    add_shifted(x, y, 1, 0, 0, 0, 0)        # a DSL kernel of 512 bytes: its 2 blocks on 2 threads
    np.testing.assert_array_equal(y, x)
    assert add_shifted.serial_below == 0 and list(add_shifted._launches.values())[-1].workers == 2
