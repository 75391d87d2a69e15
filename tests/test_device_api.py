"""The GPU-facing API without a GPU: imports, clear errors, launch-limit checks, device-array binding.

Everything here is pure Python or NVRTC (no CUDA driver call), so it runs on any machine;
tests/test_gpu.py runs the same paths on a real GPU.
"""
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import taskdsl as td
from taskdsl import blockIdx, f32, i32, threadIdx
from taskdsl.backend.cuda.codegen import kernel_symbol
from taskdsl.backend.cuda.launch import (LaunchLimits, check_launch_dims, dtype_matches, is_c_contiguous,
                                         kernel_params)
from taskdsl.runtime.device_array import ArrayInfo, array_info, view_dtype


class FakeCudaArray:
    """A pure-Python stand-in for a GPU array: only a `__cuda_array_interface__` dict (never dereferenced)."""

    def __init__(self, shape, typestr="<f4", strides=None, **extra):
        self.__cuda_array_interface__ = {"version": 3, "shape": tuple(shape), "typestr": typestr,
                                         "data": (0xDEAD0000, False), "strides": strides, "stream": None, **extra}


class HostDLPack:
    """A host array that speaks DLPack only (like a torch tensor in CPU memory); `device`: another DLPack device."""

    def __init__(self, array, device=None):
        self._array, self._device = array, device

    def __dlpack__(self, **kwargs):
        return self._array.__dlpack__(**kwargs)

    def __dlpack_device__(self):
        return self._device or self._array.__dlpack_device__()


@td.kernel(grid=lambda M, N: (td.cdiv(N, 16), M), block=16)
def scale_rows(A: f32["M", "N"], C: f32["M", "N"], k: f32):
    j = blockIdx.x * 16 + threadIdx.x
    if j < N:
        C[blockIdx.y, j] = A[blockIdx.y, j] * k


def no_gpu():
    usable, _ = td.gpu_status()
    if usable:
        pytest.skip("a GPU is present: tests/test_gpu.py covers this")


def test_import_exports_device_api():
    assert td.DeviceArray.__name__ == "DeviceArray" and callable(td.to_device)
    import taskdsl.bench.cuda_timing as timing   # importing needs no GPU either
    assert callable(timing.time_cuda)


def test_synchronize_waits_on_the_stream_of_the_launches(simulated_gpu, monkeypatch):
    """td.synchronize() waits for this thread's stream (the simulated device's: its `sync` is counted)."""
    from taskdsl.backend.cuda import launch
    waits = []
    monkeypatch.setattr(launch.device_state().stream, "sync", lambda: waits.append(1), raising=False)
    x = td.to_device(np.ones((2, 16), np.float32))
    scale_rows(x, x, 2.0)
    td.synchronize()
    assert waits == [1]
    np.testing.assert_array_equal(x.numpy(), 2.0)


def test_synchronize_without_a_gpu_has_nothing_to_wait_for():
    no_gpu()
    assert td.synchronize() is None


def test_to_device_without_gpu_names_the_reason():
    no_gpu()
    reason = td.gpu_status()[1]
    with pytest.raises(RuntimeError) as info:
        td.to_device(np.ones(4, np.float32))
    assert "td.to_device needs a usable CUDA GPU" in str(info.value)
    assert reason in str(info.value) and "set_target('cpu')" in str(info.value)


def test_without_a_driver_the_first_cpu_call_does_not_import_cuda_core():
    """Choosing the target without a GPU skips cuda.core (and the ml_dtypes it imports: 0.8 s of a small kernel's
    first call) where the driver library does not load; the reason says so."""
    from taskdsl.runtime import config
    if not config._driver_missing():
        pytest.skip("the CUDA driver library loads here")
    code = ("import sys, numpy as np, taskdsl as td; from tests.test_device_api import scale_rows; "
            "a = np.ones((2, 3), np.float32); c = np.empty_like(a); scale_rows(a, c, 2.0); "
            "print(c.sum(), 'cuda.core' in sys.modules, td.gpu_status())")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                         cwd=Path(__file__).parent.parent).stdout
    assert out.startswith("12.0 False (False, 'no NVIDIA driver: "), out


def test_timing_and_device_state_without_gpu_raise():
    no_gpu()
    from taskdsl.backend.cuda.launch import device_state
    from taskdsl.bench.cuda_timing import time_cuda
    with pytest.raises(RuntimeError, match="time_cuda needs a usable CUDA GPU"):
        time_cuda(lambda: None)
    with pytest.raises(RuntimeError, match="usable CUDA GPU"):
        device_state()


# --------------------------------------------------------------------------- launch limits
def test_launch_limits_accept_the_largest_legal_launch():
    check_launch_dims((2**31 - 1, 65535, 65535), (1024, 1, 1))
    check_launch_dims((1, 1, 1), (16, 16, 4))
    check_launch_dims((1, 1, 1), (1, 1, 64))


@pytest.mark.parametrize("grid, block, pattern", [
    ((1, 65536, 1), (32, 1, 1), r"grid\.y is 65536"),
    ((1, 1, 70000), (32, 1, 1), r"grid\.z is 70000"),
    ((2**31, 1, 1), (32, 1, 1), r"grid\.x is 2147483648"),
    ((1, 1, 1), (1025, 1, 1), r"1025 threads.*at most 1024"),
    ((1, 1, 1), (32, 32, 2), r"2048 threads"),
    ((1, 1, 1), (1, 1, 65), r"block\.z is 65"),
])
def test_launch_limits_reject_with_the_offending_dim(grid, block, pattern):
    with pytest.raises(ValueError, match=pattern) as info:
        check_launch_dims(grid, block, kernel="k")
    assert "kernel 'k'" in str(info.value)


def test_launch_limits_of_a_device_and_kernel():
    limits = LaunchLimits(max_threads=256, max_shared=100 * 1024)
    with pytest.raises(ValueError, match="at most 256"):
        check_launch_dims((1, 1, 1), (512, 1, 1), limits)
    with pytest.raises(ValueError, match="shared memory"):
        check_launch_dims((1, 1, 1), (32, 1, 1), limits, shared_bytes=128 * 1024)
    check_launch_dims((1, 1, 1), (256, 1, 1), limits, shared_bytes=64 * 1024)


# --------------------------------------------------------------------------- generated signature
def test_kernel_params_tell_which_arrays_are_written():
    a = np.ones((3, 20), np.float32)
    compiled = scale_rows.compile(a, a, 2.0, target="cuda")
    symbol = kernel_symbol(scale_rows._lowered_ir(scale_rows.bind((a, a, 2.0)).block))
    params = kernel_params(compiled.source, symbol)
    assert [(p.pointer, p.writable) for p in params] == [(True, False), (True, True), (False, False)]
    assert kernel_params(compiled.source, "not_there") is None


def test_kernel_params_of_the_design_matmul():
    from stdlib_ops.design_matmul import matmul_kernel
    a = np.ones((5, 3), np.float32)
    b = np.ones((3, 7), np.float32)
    c = np.ones((5, 7), np.float32)
    compiled = matmul_kernel.compile(a, b, c, target="cuda")
    params = kernel_params(compiled.source, "matmul_kernel")
    assert [p.writable for p in params] == [False, False, True]


def test_c_contiguity():
    assert is_c_contiguous((3, 4), None, 4)
    assert is_c_contiguous((3, 4), (16, 4), 4)
    assert not is_c_contiguous((3, 4), (4, 12), 4)          # Fortran order
    assert not is_c_contiguous((3, 4), (32, 8), 4)          # every other element
    assert is_c_contiguous((3, 1), (4, 999), 4)             # strides of length-1 axes do not matter
    assert is_c_contiguous((0, 4), (7, 3), 4)               # nothing to lay out
    assert is_c_contiguous((2, 3), (3, 1), 1)               # strides in elements


def test_bf16_passes_as_its_bits():
    import ml_dtypes
    assert dtype_matches(np.dtype(ml_dtypes.bfloat16), np.dtype(np.uint16))
    assert dtype_matches(np.dtype(np.uint16), np.dtype(np.uint16))
    assert not dtype_matches(np.dtype(np.float16), np.dtype(np.uint16))


# --------------------------------------------------------------------------- device-array binding
def test_dlpack_bfloat16_views_read_as_bfloat16():
    """cuda.core gives DLPack's bfloat16 (a torch bf16 tensor's) as 2-byte void; other dtypes stay as they are."""
    import ml_dtypes

    class View:
        def __init__(self, dtype):
            self.dtype = np.dtype(dtype)
    assert view_dtype(View("V2")) == np.dtype(ml_dtypes.bfloat16)
    assert dtype_matches(view_dtype(View("V2")), np.dtype(np.uint16))
    assert view_dtype(View(np.float16)) == np.float16 and view_dtype(View("V4")) == np.dtype("V4")
    # torch's __cuda_array_interface__ of a bf16 tensor says '<V2' too
    cai = {"version": 3, "shape": (4,), "typestr": "<V2", "data": (0, False), "strides": None}
    assert array_info(type("TorchLike", (), {"__cuda_array_interface__": cai})()).dtype == np.dtype(ml_dtypes.bfloat16)


def test_array_info_from_cuda_array_interface():
    info = array_info(FakeCudaArray((3, 5)))
    assert info == ArrayInfo((3, 5), np.dtype(np.float32), None) and info.c_contiguous
    assert array_info(FakeCudaArray((3, 5), strides=(20, 4))).c_contiguous
    assert not array_info(FakeCudaArray((5, 3), strides=(4, 20))).c_contiguous   # a transposed view
    with pytest.raises(ValueError, match="masked"):
        array_info(FakeCudaArray((3,), mask=object()))
    with pytest.raises(TypeError, match="byte order"):
        array_info(FakeCudaArray((3,), typestr=">f4"))


def test_bind_takes_shape_and_dtype_of_device_arrays():
    a, c = FakeCudaArray((3, 20)), FakeCudaArray((3, 20))
    binding = scale_rows.bind((a, c, 2.0), target="cuda")
    assert binding.sizes == {"M": 3, "N": 20} and binding.grid == (2, 3, 1)
    assert binding.values[0] is a and binding.values[1] is c       # passed on as they are: no copies
    mixed = scale_rows.bind((np.ones((3, 20), np.float32), c, 2.0), target="cuda")
    assert mixed.sizes == {"M": 3, "N": 20}


def test_device_arrays_compile_without_a_gpu():
    a, c = FakeCudaArray((3, 20)), FakeCudaArray((3, 20))
    compiled = scale_rows.compile(a, c, 2.0, target="cuda", arch="sm_80")
    assert compiled.binary[:4] == b"\x7fELF" and "(j < 20)" in compiled.source


def test_wrong_dtype_device_array_is_a_type_error():
    with pytest.raises(TypeError, match=r"'A' must have dtype float32 \(f32\), got float64.*torch"):
        scale_rows.bind((FakeCudaArray((3, 20), "<f8"), FakeCudaArray((3, 20)), 2.0), target="cuda")


def test_non_contiguous_device_array_is_a_value_error():
    transposed = FakeCudaArray((3, 20), strides=(4, 12))
    with pytest.raises(ValueError, match=r"'C' is not C-contiguous.*\.contiguous\(\)"):
        scale_rows.bind((FakeCudaArray((3, 20)), transposed, 2.0), target="cuda")


def test_device_array_shape_mismatch():
    with pytest.raises(ValueError, match="size 'N' is 20"):
        scale_rows.bind((FakeCudaArray((3, 20)), FakeCudaArray((3, 21)), 2.0), target="cuda")
    with pytest.raises(ValueError, match="must be 2-d"):
        scale_rows.bind((FakeCudaArray((60,)), FakeCudaArray((3, 20)), 2.0), target="cuda")


def test_host_arrays_with_dlpack_bind_as_numpy_views_on_cuda():
    """A host array that speaks DLPack (a torch CPU tensor) binds on the cuda target as numpy arrays do, a view of
    its memory that the launch copies in and back (it was refused, while stdlib_ops took it); a list is refused."""
    a = np.ones((3, 20), np.float32)
    binding = scale_rows.bind((HostDLPack(a), FakeCudaArray((3, 20)), 2.0), target="cuda")
    assert isinstance(binding.values[0], np.ndarray) and np.shares_memory(binding.values[0], a)
    with pytest.raises(TypeError, match="must be an array, got list.*host arrays, numpy's or with DLPack"):
        scale_rows.bind(([[1.0]], FakeCudaArray((3, 20)), 2.0), target="cuda")


def test_host_arrays_with_dlpack_run_on_the_cpu_as_their_memory():
    """On the cpu target too: a kernel writes into a DLPack host array's memory, on a first call and a repeated one
    (the prepared launch of its shapes), its source builds, and the operator library takes it; an array on another
    DLPack device is refused by name."""
    import stdlib_ops as ops
    a = HostDLPack(np.arange(60, dtype=np.float32).reshape(3, 20))
    for k in (2.0, 3.0):
        c = np.zeros((3, 20), np.float32)
        scale_rows(a, HostDLPack(c), k)
        np.testing.assert_array_equal(c, a._array * k)
    assert "kernel_scale_rows" in scale_rows.source(a, a, 1.0, target="cpu")
    w = np.linspace(-1, 1, 20 * 7, dtype=np.float32).reshape(20, 7)
    np.testing.assert_allclose(ops.matmul(a, HostDLPack(w)), a._array @ w, rtol=1e-5)
    with pytest.raises(TypeError, match=r"argument 'A' must be a numpy array \(or another host array with DLPack: "
                                        r"a torch CPU tensor\), got HostDLPack"):
        scale_rows(HostDLPack(a._array, device=(13, 0)), a, 1.0)


def test_torch_cpu_tensors_bf16_too_and_a_clear_error_for_ones_that_require_grad():
    """torch's bf16 tensors (np.asarray refuses them) through their bits; one that requires grad (DLPack refuses
    it) is a TypeError that says what to pass."""
    torch = pytest.importorskip("torch")
    import stdlib_ops as ops
    a, b = torch.randn(5, 7).bfloat16(), torch.randn(7, 3).bfloat16()
    got = ops.matmul(a, b)
    want = (a.float() @ b.float()).bfloat16().float().numpy()
    assert got.dtype.name == "bfloat16"
    np.testing.assert_allclose(got.astype(np.float32), want, rtol=2**-7, atol=2**-7)
    with pytest.raises(TypeError, match=r"through DLPack .*require.* gradient.*x\.detach\(\)\.numpy\(\)"):
        ops.softmax(torch.ones(4, requires_grad=True))


def test_cpu_target_refuses_gpu_arrays():
    with pytest.raises(TypeError, match=r"must be a numpy array \(or another host array .*\), got FakeCudaArray"):
        scale_rows.bind((FakeCudaArray((3, 20)), FakeCudaArray((3, 20)), 2.0), target="cpu")
    a = np.arange(60, dtype=np.float32).reshape(3, 20)
    c = np.zeros_like(a)
    scale_rows(a, c, 3.0)                        # the cpu target (set by conftest) runs it as before
    np.testing.assert_array_equal(c, a * 3)


@td.kernel(grid=1, block=32)
def copy_ignoring(A: f32[32], Unused: f32[32], C: f32[32]):
    C[threadIdx.x] = A[threadIdx.x]


def test_parameters_the_kernel_never_names_are_marked_unused():
    """The cuda launch passes a null pointer (no copy) for them: a shape carrier, an ignored operand."""
    a = np.zeros(32, np.float32)
    compiled = copy_ignoring.compile(a, a, a.copy(), target="cuda", arch="sm_90")
    assert compiled.unused_params == {1}


@pytest.fixture
def stubbed_driver(simulated_gpu, monkeypatch):
    """The simulated device with taskdsl's real launch path down to cuda.core's launch call, which records
    (config, args) instead of launching; the module load is stubbed too (there is no device to load on)."""
    import cuda.core

    from taskdsl.backend.cuda import launch
    from taskdsl.runtime.kernel import Kernel

    from .simulated_gpu import REAL_LAUNCH_PATH
    issued = []
    monkeypatch.setattr(cuda.core, "launch", lambda stream, config, kernel, *args: issued.append((config, list(args))))
    monkeypatch.setattr(launch, "_load", lambda state, compiled, symbol: launch._Loaded(
        None, "kernel", kernel_params(compiled.source, symbol), 1024, 0))
    for name, fn in REAL_LAUNCH_PATH.items():
        monkeypatch.setattr(Kernel, name, fn)
    return issued


def test_launch_arguments_and_recording(stubbed_driver):
    """launch_cuda's argument packing below the kernel (cuda.core's launch and the module load stubbed out, memory
    simulated): device pointers as they are, numpy arrays staged (and written back when written),
    a null pointer for a parameter the code never names, and the launch recorded with what it must keep alive."""
    from taskdsl.backend.cuda import launch
    from taskdsl.runtime.device_array import DeviceArray
    issued = stubbed_driver
    a = np.arange(32, dtype=np.float32)
    compiled = copy_ignoring.compile(a, a, a.copy(), target="cuda", arch="sm_90")
    symbol = kernel_symbol(copy_ignoring._lowered_ir((32, 1, 1)))
    device_a = td.to_device(a)
    unused, out = np.ones(32, np.float32), np.full(32, 7.0, np.float32)
    with launch.recording() as record:
        launch.launch_cuda(compiled, symbol, [device_a, unused, out], (1, 1, 1), (32, 1, 1), [td.f32] * 3)
    (config, args), = issued
    assert config.grid == (1, 1, 1) and config.block == (32, 1, 1) and config.shmem_size == 0
    assert args[0] == device_a.ptr and args[1] == 0 and args[2] not in (0, device_a.ptr)
    np.testing.assert_array_equal(out, np.full(32, 7.0, np.float32))   # staged, and copied back unchanged
    r, = record.launches
    assert r.args == args and r.host_writes                       # a numpy output: not replayable
    assert any(isinstance(k, DeviceArray) for k in r.keep) and len(r.keep) == 2   # the device array + staging
    with pytest.raises(RuntimeError, match="has 3 parameters in its CUDA source, but 2 arguments"):
        launch.launch_cuda(compiled, symbol, [device_a, out], (1, 1, 1), (32, 1, 1), [td.f32] * 2)


def test_device_array_launches_are_prepared_once(stubbed_driver):
    """Calls on td.DeviceArrays and scalars of one signature reuse a prepared launch: new pointers, typed scalars,
    no checks; a numpy argument takes the full path (staged copies) and prepares nothing."""
    from taskdsl.backend.cuda.launch import recording
    a = np.arange(12, dtype=np.float32).reshape(3, 4)
    x, y, z = (td.to_device(a) for _ in range(3))
    scale_rows(x, y, 2.0)
    scale_rows(z, x, 3)
    assert len(scale_rows._cuda_launches) == 2          # the scalar's type and value are part of the signature
    with recording() as record:
        scale_rows(y, z, 2.0)
    (c1, a1), (_, a2), (_, a3) = stubbed_driver
    assert c1.grid == (1, 3, 1) and c1.block == (16, 1, 1)
    assert a1[:2] == [x.ptr, y.ptr] and a2[:2] == [z.ptr, x.ptr] and a3[:2] == [y.ptr, z.ptr]
    assert type(a1[2]) is np.float32 and a1[2] == 2.0 and type(a2[2]) is np.float32 and a2[2] == 3.0
    assert record.launches[0].args == a3 and y in record.launches[0].keep
    scale_rows(a, z, 2.0)                               # numpy input: staged at every call, never prepared
    assert len(scale_rows._cuda_launches) == 2 and stubbed_driver[-1][1][0] not in (x.ptr, y.ptr, z.ptr)


def test_device_array_copies_conversions_and_reshapes(simulated_gpu):
    """copy.copy / deepcopy / .copy() own new memory; to_device takes numbers only (native byte order on the
    device); reshape takes non-negative ints; bool() of one element reads it back, as numpy's does."""
    import copy
    host = np.arange(6, dtype=np.float32)
    d = td.to_device(host)
    for duplicate in (copy.copy(d), copy.deepcopy(d), d.copy()):
        assert duplicate.ptr != d.ptr
        duplicate.copy_from_host(np.full(6, 7, np.float32))
        np.testing.assert_array_equal(d.numpy(), host)
    assert td.to_device(d) is d
    for bad in (np.array([object(), 1], dtype=object), np.array(["a", "b"]), None):
        with pytest.raises(TypeError, match="device arrays hold numbers"):
            td.to_device(bad)
    big = td.to_device(host.astype(">f4"))
    assert big.dtype == np.float32 and big.dtype.isnative
    np.testing.assert_array_equal(big.numpy(), host)
    assert d.reshape(2, -1).shape == (2, 3)
    for shape in ((-2, -3), (-1, -3), (2.5, 6)):
        with pytest.raises(ValueError, match="reshape takes non-negative ints"):
            d.reshape(*shape)
    assert bool(td.to_device(np.array([3]))) and not bool(td.to_device(np.float32(0)))
    with pytest.raises(ValueError, match="truth value of a DeviceArray of 6 elements is ambiguous"):
        bool(d)


def test_a_device_array_on_the_cpu_target_is_refused_after_a_cuda_call(simulated_gpu):
    """Checked bindings are per target: a signature that passed on cuda is checked again on the cpu."""
    a = np.arange(60, dtype=np.float32).reshape(3, 20)
    da, dc = td.to_device(a), td.to_device(np.zeros_like(a))
    scale_rows(da, dc, 2.0)
    np.testing.assert_array_equal(dc.numpy(), 2 * a)
    td.set_target("cpu")
    with pytest.raises(TypeError, match="argument 'A' is a td.DeviceArray \\(GPU memory\\), but the target is cpu"):
        scale_rows(da, dc, 2.0)
