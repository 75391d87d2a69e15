"""Kernels on a real GPU (target 'cuda'), checked against numpy and the cpu target.

Every test here is marked `gpu`: tests/conftest.py skips them where no GPU is usable, and
this module calls no CUDA API at import time, so it collects anywhere.
"""
import threading

import numpy as np
import pytest

import taskdsl as td
from taskdsl import bf16, blockIdx, f16, f32, f64, i32, i64, threadIdx
from .kernels import histogram, tree_sum, warp_sums

pytestmark = pytest.mark.gpu


@pytest.fixture(autouse=True)
def cuda_target():
    td.set_target("cuda")
    yield
    td.set_target("cpu")


def on_cpu(kernel, *args):
    """Run `kernel` on the cpu target (the reference), then go back to cuda."""
    td.set_target("cpu")
    try:
        kernel(*args)
    finally:
        td.set_target("cuda")


def rand_f32(rng, *shape):
    return rng.uniform(-2.0, 2.0, size=shape).astype(np.float32)


# --------------------------------------------------------------------------- kernels
@td.kernel(grid=lambda M, N: (td.cdiv(N, 16), M), block=16)
def add_rows(A: f32["M", "N"], B: f32["M", "N"], C: f32["M", "N"]):
    j = blockIdx.x * 16 + threadIdx.x
    if j < N:
        C[blockIdx.y, j] = A[blockIdx.y, j] + B[blockIdx.y, j]


@td.kernel(grid=lambda N: td.cdiv(N, 64), block=64)
def tickets(Counter: i32[1], Ticket: i32["N"]):
    i = blockIdx.x * 64 + threadIdx.x
    if i < N:
        Ticket[i] = td.atomic_add(Counter[0], 1)


@td.kernel(grid=lambda N: td.cdiv(N, 128), block=128)
def half_mix(X: f16["N"], W: bf16["N"], Y: f16["N"], Z: f32["N"]):
    i = blockIdx.x * 128 + threadIdx.x
    if i < N:
        Y[i] = X[i] * 1.5 - (-X[i])
        Z[i] = td.exp(X[i]) + W[i]


@td.kernel(grid=lambda N: td.cdiv(N, 64), block=64)
def scalars(X: f32["N"], Y: f64["N"], alpha: f32, shift: i32, big: i64, beta: f64):
    i = blockIdx.x * 64 + threadIdx.x
    if i < N:
        Y[i] = beta + big + (X[i] * alpha + shift)     # f64 + i64 first: exact in f64


@td.kernel(grid=lambda N: (1, N), block=32)
def tall_grid(X: f32["N"]):
    if threadIdx.x == 0:
        X[blockIdx.y] = 1.0


@td.kernel(grid=1, block=256)
def big_tile(X: f32[256], Y: f32[256]):
    tile = td.shared(f32, (128, 128))          # 64 KiB: dynamic shared memory, opted in at launch
    if threadIdx.x < 128:
        for r in range(128):
            tile[r, threadIdx.x] = X[threadIdx.x] + r
    td.syncthreads()
    c = threadIdx.x % 128
    Y[threadIdx.x] = tile[c, c]


# --------------------------------------------------------------------------- numpy arguments
@pytest.mark.parametrize("m, n, k", [(257, 131, 67), (64, 64, 8), (1, 1, 1)])
def test_design_matmul_matches_numpy_and_cpu(m, n, k):
    from stdlib_ops.design_matmul import matmul_kernel
    rng = np.random.default_rng(m + n + k)
    a, b = rand_f32(rng, m, k), rand_f32(rng, k, n)
    c = np.full((m, n), np.nan, np.float32)
    matmul_kernel(a, b, c)
    np.testing.assert_allclose(c, a.astype(np.float64) @ b, rtol=1e-4, atol=1e-4)
    c_cpu = np.full((m, n), np.nan, np.float32)
    on_cpu(matmul_kernel, a, b, c_cpu)
    np.testing.assert_allclose(c, c_cpu, rtol=1e-5, atol=1e-5)


def test_design_matmul_1024():
    from stdlib_ops.design_matmul import matmul_kernel
    rng = np.random.default_rng(0)
    a, b = rand_f32(rng, 1024, 1024), rand_f32(rng, 1024, 1024)
    c = np.empty((1024, 1024), np.float32)
    matmul_kernel(a, b, c)
    want = a.astype(np.float64) @ b
    assert np.abs(c - want).max() <= 1e-4 * np.abs(want).max()
    # the same on device arrays: no copies, result read back once
    da, db, dc = td.to_device(a), td.to_device(b), td.to_device(np.zeros_like(c))
    matmul_kernel(da, db, dc)
    np.testing.assert_array_equal(dc.numpy(), c)


@pytest.mark.parametrize("n", [1, 255, 256, 1000, 65536])
def test_reductions_with_barriers_and_shuffles(n):
    rng = np.random.default_rng(n)
    x = rand_f32(rng, n)
    blocks = -(-n // 256)
    out = np.zeros(blocks, np.float32)
    tree_sum(x, out)
    padded = np.zeros(blocks * 256, np.float64)
    padded[:n] = x
    np.testing.assert_allclose(out, padded.reshape(blocks, 256).sum(1), rtol=1e-5, atol=1e-4)
    w = -(-n // 64) * 2
    sums, sums_cpu = np.zeros(w, np.float32), np.zeros(w, np.float32)
    warp_sums(x, sums)
    on_cpu(warp_sums, x, sums_cpu)
    padded = np.zeros(w * 32, np.float64)
    padded[:n] = x
    np.testing.assert_allclose(sums, padded.reshape(w, 32).sum(1), rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(sums, sums_cpu, rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("n, bins", [(1, 1), (1000, 7), (200_000, 3)])
def test_atomics(n, bins):
    vals = np.random.default_rng(n).integers(0, bins, size=n).astype(np.int32)
    hist, total = np.zeros(bins, np.int32), np.zeros(1, np.float32)
    histogram(vals, hist, total)
    np.testing.assert_array_equal(hist, np.bincount(vals, minlength=bins))
    assert total[0] == n
    counter, ticket = np.array([5], np.int32), np.zeros(n, np.int32)
    tickets(counter, ticket)
    assert counter[0] == 5 + n
    np.testing.assert_array_equal(np.sort(ticket), np.arange(5, 5 + n))


@pytest.mark.parametrize("n", [1, 97, 1000])
def test_half_precision_matches_cpu_target(n):
    import ml_dtypes
    rng = np.random.default_rng(n)
    x = rng.standard_normal(n).astype(np.float16)
    w = rng.standard_normal(n).astype(ml_dtypes.bfloat16)
    y, z = np.zeros(n, np.float16), np.zeros(n, np.float32)
    half_mix(x, w, y, z)
    y_cpu, z_cpu = np.zeros(n, np.float16), np.zeros(n, np.float32)
    on_cpu(half_mix, x, w, y_cpu, z_cpu)
    np.testing.assert_array_equal(y, y_cpu)
    xf = x.astype(np.float32)
    np.testing.assert_array_equal(y, (xf * 1.5 + xf).astype(np.float16))
    np.testing.assert_allclose(z, z_cpu, rtol=1e-5, atol=1e-6)


def test_scalar_parameters_of_each_width():
    x = np.arange(100, dtype=np.float32)
    y = np.zeros(100, np.float64)
    scalars(x, y, 0.5, -3, 2**40, 0.25)
    want = 0.25 + 2**40 + (x.astype(np.float64) * 0.5 - 3)
    np.testing.assert_array_equal(y, want)
    y_cpu = np.zeros(100, np.float64)
    on_cpu(scalars, x, y_cpu, 0.5, -3, 2**40, 0.25)
    np.testing.assert_array_equal(y, y_cpu)


def test_numpy_arguments_are_written_in_place():
    a = np.arange(60, dtype=np.float32).reshape(6, 10)
    b = np.ones((10, 6), np.float32).T                  # Fortran order: copied in as C order
    base = np.zeros((10, 12), np.float32)
    out = base[:, ::2].T                                # a strided (6, 10) view of `base`
    add_rows(a, b, out)
    np.testing.assert_array_equal(out, a + 1)
    np.testing.assert_array_equal(base[:, 1::2], 0)     # only the view's elements were written
    c = np.zeros((6, 10), np.float32)
    a.setflags(write=False)                             # read-only inputs are fine
    add_rows(a, a, c)
    np.testing.assert_array_equal(c, 2 * a)
    with pytest.raises(ValueError, match="read-only"):
        add_rows(a, a, a)


@td.kernel(block=1)
def running_sum(x: f32["N"], y: f32["N"]):
    for i in range(1, N):
        y[i] = y[i - 1] + x[i - 1]


def test_one_numpy_view_passed_twice_is_one_device_array():
    """Each numpy argument is copied to the GPU, but one view passed for two parameters is copied once: the kernel
    reads its own writes, as on the cpu (two copies gave 2 for every element past the first)."""
    for x in (np.ones(6, np.float32), np.ones(12, np.float32)[::2]):
        running_sum(x, x)
        np.testing.assert_array_equal(x, 2.0 ** np.arange(6))
    a = np.ones(7, np.float32)
    with pytest.raises(ValueError, match="different views of the same memory"):
        running_sum(a[:6], a[1:])


def test_empty_grid_is_a_no_op():
    x = np.zeros((0, 5), np.float32)
    add_rows(x, x, x)


def test_launch_from_another_thread():
    x = np.arange(32, dtype=np.float32).reshape(2, 16)
    out = np.zeros_like(x)
    errors = []

    def work():
        try:
            add_rows(x, x, out)
        except Exception as exc:  # noqa: BLE001 - reported below
            errors.append(exc)

    thread = threading.Thread(target=work)
    thread.start()
    thread.join()
    assert not errors, errors
    np.testing.assert_array_equal(out, 2 * x)


# --------------------------------------------------------------------------- launch limits
def test_grid_limit_is_checked_before_launch():
    with pytest.raises(ValueError, match=r"grid\.y is 70000"):
        tall_grid(np.zeros(70000, np.float32))
    x = np.zeros(65535, np.float32)
    tall_grid(x)
    assert x.min() == 1.0


def test_shared_memory_past_48k():
    x = np.arange(256, dtype=np.float32)
    y = np.zeros(256, np.float32)
    assert big_tile.compile(x, y, target="cuda").dynamic_shared_bytes > 48 * 1024
    big_tile(x, y)
    c = np.arange(256) % 128
    np.testing.assert_array_equal(y, x[c] + c)


def test_cubin_for_another_arch_is_refused():
    from taskdsl.backend.cuda.launch import device_state, launch_cuda
    arch = device_state().arch
    other = "sm_75" if arch != "sm_75" else "sm_80"
    x = np.zeros((1, 16), np.float32)
    compiled = add_rows.compile(x, x, x, target="cuda", arch=other)
    with pytest.raises(ValueError, match=f"compiled for {other}"):
        launch_cuda(compiled, "add_rows", [x, x, x], (1, 1, 1), (16, 1, 1), [f32, f32, f32])


# --------------------------------------------------------------------------- td.DeviceArray
def test_device_array_round_trip():
    x = np.arange(24, dtype=np.float32).reshape(4, 6)
    d = td.to_device(x)
    assert isinstance(d, td.DeviceArray)
    assert d.shape == (4, 6) and d.dtype == np.float32 and d.nbytes == 96 and d.ndim == 2 and len(d) == 4
    assert "DeviceArray(shape=(4, 6), dtype=float32" in repr(d)
    np.testing.assert_array_equal(d.numpy(), x)
    cai = d.__cuda_array_interface__
    assert cai["version"] == 3 and cai["shape"] == (4, 6) and cai["typestr"] == "<f4"
    assert cai["data"] == (d.ptr, False) and cai["stream"] not in (None, 0)
    assert d.__dlpack_device__() == (2, d.device_id)
    np.testing.assert_array_equal(td.to_device(x.T).numpy(), x.T)    # non-contiguous input: copied to C order
    empty = td.to_device(np.zeros(0, np.float32))
    assert empty.shape == (0,) and empty.numpy().shape == (0,)


def test_kernels_on_device_arrays_and_numpy_mixed():
    from taskdsl.runtime.device_array import empty
    a = np.arange(60, dtype=np.float32).reshape(6, 10)
    da = td.to_device(a)
    dc = empty((6, 10), td.f32)
    add_rows(da, a, dc)                # a device array, a numpy array (copied in) and a device output
    np.testing.assert_array_equal(dc.numpy(), 2 * a)
    with pytest.raises(TypeError, match="dtype float32"):
        add_rows(td.to_device(a.astype(np.float64)), a, dc)


def test_device_array_views_copies_and_zero():
    x = np.arange(24, dtype=np.float32)
    d = td.to_device(x)
    v = d.reshape(4, -1)
    assert v.ptr == d.ptr and v.shape == (4, 6)
    np.testing.assert_array_equal(v.numpy(), x.reshape(4, 6))
    e = td.to_device(np.zeros(24, np.float32))
    e.copy_from(d)                     # device to device
    np.testing.assert_array_equal(e.numpy(), x)
    np.testing.assert_array_equal(e.zero().numpy(), np.zeros(24, np.float32))
    assert td.to_device(np.float32(3.0)).shape == ()


def test_recorded_launches_replay_as_a_cuda_graph():
    from taskdsl.backend.cuda.graphs import CudaGraph
    from taskdsl.backend.cuda.launch import recording
    from taskdsl.runtime.device_array import empty
    a = np.arange(60, dtype=np.float32).reshape(6, 10)
    da, db, dc = td.to_device(a), td.to_device(a), empty((6, 10), td.f32)
    with recording() as record:
        add_rows(da, db, dc)
        add_rows(dc, db, dc)
    assert len(record.launches) == 2 and not record.host_reads
    np.testing.assert_array_equal(dc.numpy(), 3 * a)
    graph = CudaGraph(record.launches)
    da.copy_from_host(a + 1)           # new inputs in the recorded buffers
    graph.replay()
    np.testing.assert_array_equal(dc.numpy(), (a + 1) + 2 * a)


def test_graph_executor_keeps_activations_on_the_gpu_and_replays():
    from .graph.test_executor_device import small_net
    g = small_net()
    x = np.random.default_rng(3).uniform(-2, 2, (2, 3, 9, 9)).astype(np.float32)
    want = g.reference(x)
    for replay in (False, True):
        cg = g.compile(target="cuda", cuda_graph=replay)
        assert cg.cuda_graph.startswith("on (" if replay else "off (")
        assert "of GPU memory" in cg.arena, cg.arena          # the activations in the planned arena
        for _ in range(2):
            for got, ref in zip(cg(x), want):
                np.testing.assert_allclose(got, ref, rtol=2e-4, atol=2e-4 * float(np.abs(ref).max()))
        outputs = cg.run_on_device(td.to_device(x))
        assert all(isinstance(a, td.DeviceArray) for a in outputs)
        np.testing.assert_allclose(outputs[1].numpy(), want[1], rtol=2e-4, atol=1e-4)


def test_carved_views_of_an_arena():
    from taskdsl.runtime.device_array import carve, empty
    arena = empty((4096,), np.uint8)
    a = np.arange(60, dtype=np.float32).reshape(6, 10)
    first, second = carve(arena, 0, (6, 10), np.float32), carve(arena, 256, (6, 10), np.float32)
    assert second.ptr == arena.ptr + 256
    first.copy_from_host(a)
    add_rows(first, first, second)
    np.testing.assert_array_equal(second.numpy(), 2 * a)
    np.testing.assert_array_equal(first.numpy(), a)             # the views do not overlap
    del arena                                                   # the views keep the arena alive
    np.testing.assert_array_equal(second.numpy(), 2 * a)
    torch = pytest.importorskip("torch")
    if torch.cuda.is_available():
        t = torch.from_dlpack(second)
        assert t.data_ptr() == second.ptr
        np.testing.assert_array_equal(t.cpu().numpy(), 2 * a)


# --------------------------------------------------------------------------- torch / cupy
def test_torch_tensors_are_used_in_place():
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available():
        pytest.skip("torch has no CUDA")
    from stdlib_ops.design_matmul import matmul_kernel
    a = torch.randn(257, 67, device="cuda")
    b = torch.randn(67, 131, device="cuda")
    c = torch.full((257, 131), float("nan"), device="cuda")
    pointers = (a.data_ptr(), b.data_ptr(), c.data_ptr())
    matmul_kernel(a, b, c)
    torch.cuda.synchronize()
    assert (a.data_ptr(), b.data_ptr(), c.data_ptr()) == pointers
    torch.testing.assert_close(c, a @ b, rtol=1e-4, atol=1e-4)
    # f16 / bf16 tensors (bf16 travels through DLPack)
    x = torch.randn(97, device="cuda").half()
    w = torch.randn(97, device="cuda").bfloat16()
    y, z = torch.zeros(97, device="cuda").half(), torch.zeros(97, device="cuda")
    half_mix(x, w, y, z)
    torch.testing.assert_close(y, (x.float() * 1.5 + x.float()).half(), rtol=0, atol=0)
    torch.testing.assert_close(z, torch.exp(x.float()) + w.float(), rtol=1e-5, atol=1e-5)


def test_torch_errors_say_what_to_do():
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available():
        pytest.skip("torch has no CUDA")
    a = torch.ones(6, 10, device="cuda")
    with pytest.raises(ValueError, match=r"not C-contiguous.*\.contiguous\(\)"):
        add_rows(a, a, torch.ones(10, 6, device="cuda").T)
    with pytest.raises(TypeError, match="dtype float32"):
        add_rows(a.double(), a, a)
    with pytest.raises(TypeError, match="host memory"):
        add_rows(torch.ones(6, 10), a, a)


def test_device_array_to_torch_without_copies():
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available():
        pytest.skip("torch has no CUDA")
    x = np.arange(12, dtype=np.float32).reshape(3, 4)
    d = td.to_device(x)
    via_dlpack = torch.from_dlpack(d)
    via_cai = torch.as_tensor(d, device="cuda")
    assert via_dlpack.data_ptr() == d.ptr == via_cai.data_ptr()
    np.testing.assert_array_equal(via_dlpack.cpu().numpy(), x)
    np.testing.assert_array_equal(via_cai.cpu().numpy(), x)


def test_cupy_arrays_are_used_in_place():
    cp = pytest.importorskip("cupy")
    a = cp.arange(60, dtype=cp.float32).reshape(6, 10)
    c = cp.zeros((6, 10), cp.float32)
    pointer = c.data.ptr
    add_rows(a, a, c)
    cp.cuda.Device().synchronize()
    assert c.data.ptr == pointer
    np.testing.assert_array_equal(cp.asnumpy(c), 2 * cp.asnumpy(a))
    with pytest.raises(ValueError, match="not C-contiguous"):
        add_rows(a, a, cp.zeros((10, 6), cp.float32).T)
    d = td.to_device(np.arange(5, dtype=np.float32))
    assert cp.asarray(d).data.ptr == d.ptr and cp.from_dlpack(d).data.ptr == d.ptr
    np.testing.assert_array_equal(cp.asnumpy(cp.asarray(d)), np.arange(5, dtype=np.float32))


# --------------------------------------------------------------------------- timing
def test_time_cuda_measures_kernels():
    from stdlib_ops.design_matmul import matmul_kernel
    from taskdsl.bench.cuda_timing import time_cuda
    rng = np.random.default_rng(0)
    a, b = td.to_device(rand_f32(rng, 512, 512)), td.to_device(rand_f32(rng, 512, 512))
    c = td.to_device(np.zeros((512, 512), np.float32))
    cold = time_cuda(lambda: matmul_kernel(a, b, c), warmup=2, repeat=5)
    warm = time_cuda(lambda: matmul_kernel(a, b, c), warmup=2, repeat=5, flush_l2=False)
    assert 0 < cold < 1 and 0 < warm < 1
