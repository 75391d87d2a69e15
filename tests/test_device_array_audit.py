"""td.DeviceArray as a user meets it (cuda target on the simulated GPU, tests/simulated_gpu.py): round trips of
every dtype and layout, pickling, copies from Python values, constructors and the errors of misuse, checked
against numpy."""
import gc
import pickle
import weakref

import ml_dtypes
import numpy as np
import pytest

import taskdsl as td
from taskdsl import blockIdx, threadIdx
from taskdsl.runtime.device_array import empty

_BASE = np.arange(24).reshape(4, 6) % 5 - 2


@pytest.mark.parametrize("dtype", [np.float16, ml_dtypes.bfloat16, np.float32, np.float64, np.int32, np.int64,
                                   np.bool_, ">f4"])
@pytest.mark.parametrize("layout", ["c", "fortran", "transposed", "strided", "reversed", "zero-size", "0-d"])
def test_round_trips_every_dtype_and_layout(simulated_gpu, dtype, layout):
    x = _BASE.astype(dtype)
    host = {"c": x, "fortran": np.asfortranarray(x), "transposed": x.T, "strided": x[:, ::2],
            "reversed": x[::-1, ::-2], "zero-size": x[:0], "0-d": x[1, 2]}[layout]
    d = td.to_device(host)
    got = d.numpy()
    assert d.shape == np.shape(host) and got.dtype == np.dtype(dtype).newbyteorder("=") and got.dtype.isnative
    np.testing.assert_array_equal(got, host)


def test_pickle_copies_the_contents_into_new_memory(simulated_gpu):
    """A pickled DeviceArray kept its buffer's address: the unpickled one aliased the original's memory."""
    host = np.arange(6, dtype=np.float32).reshape(2, 3)
    d = td.to_device(host)
    restored = pickle.loads(pickle.dumps(d))
    assert isinstance(restored, td.DeviceArray) and restored.ptr != d.ptr
    restored.zero()
    np.testing.assert_array_equal(d.numpy(), host)
    np.testing.assert_array_equal(restored.numpy(), np.zeros_like(host))


def test_copy_from_host_casts_python_values_safely(simulated_gpu):
    """Python floats are float64 to numpy: copying a list into a float32 array was refused."""
    d = td.to_device(np.zeros(3, np.float32))
    d.copy_from_host([1.5, 2.5, -3.0])
    np.testing.assert_array_equal(d.numpy(), np.array([1.5, 2.5, -3.0], np.float32))
    i = td.to_device(np.zeros((), np.int32))
    i.copy_from_host(7)
    np.testing.assert_array_equal(i.numpy(), np.int32(7))
    with pytest.raises(ValueError, match="dtype int32, got .* float64"):      # would truncate
        i.copy_from_host(7.5)
    with pytest.raises(ValueError, match="dtype float32, got .* float64"):    # an array's own dtype is kept
        d.copy_from_host(np.ones(3))


def test_copy_from_host_of_a_device_array_copies_on_the_device(simulated_gpu):
    """It raised numpy's TypeError (\"numpy cannot read it in place\"), telling the user to round-trip the host."""
    src = td.to_device(np.arange(4, dtype=np.float32))
    dst = td.to_device(np.zeros(4, np.float32))
    dst.copy_from_host(src)
    np.testing.assert_array_equal(dst.numpy(), np.arange(4, dtype=np.float32))


def test_empty_takes_numbers_and_integer_dims_only(simulated_gpu):
    """An object DeviceArray held garbage pointers (numpy() would hand them to Python); 2.5 was truncated to 2;
    td.bf16 gave uint16 (its bits' type) instead of bfloat16."""
    with pytest.raises(TypeError, match="hold numbers.*not object"):
        empty(3, object)
    with pytest.raises(TypeError, match="dims must be ints"):
        empty((2.5, 3), np.float32)
    with pytest.raises(ValueError, match="non-negative"):
        empty((2, -1), np.float32)
    assert empty(3, td.bf16).dtype == np.dtype(ml_dtypes.bfloat16)
    assert empty(np.int64(3), td.f16).dtype == np.float16 and empty((np.int32(2), 0), np.int64).shape == (2, 0)


def test_reshape_errors_name_the_requested_shape(simulated_gpu):
    """reshape(5, -1) of 24 elements reported 'into (5, 4)', a shape nobody asked for."""
    d = td.to_device(np.zeros((4, 6), np.float32))
    with pytest.raises(ValueError, match=r"\(4, 6\) \(24 elements\) into \(5, -1\)"):
        d.reshape(5, -1)
    with pytest.raises(ValueError, match="non-negative ints"):      # numpy refuses a bool dim too
        d.reshape(True, 24)
    assert d.reshape(3, -1).shape == np.zeros((4, 6)).reshape(3, -1).shape


class _DLPackOnGPU:
    """Another library's GPU array that speaks DLPack only (no __cuda_array_interface__)."""

    def __dlpack__(self, **kwargs):
        raise AssertionError("to_device must not read it")

    def __dlpack_device__(self):
        return (2, 0)


def test_to_device_refuses_arrays_already_on_the_gpu(simulated_gpu):
    """A DLPack-only GPU array became a 0-d object array: 'got ndarray of dtype object'."""
    with pytest.raises(TypeError, match="_DLPackOnGPU is already in GPU memory"):
        td.to_device(_DLPackOnGPU())
    with pytest.raises(TypeError, match="got list of dtype <U1"):        # the type the user passed
        td.to_device(["a", "b"])


@td.kernel(grid=1, block=4)
def copy_bf16(A: td.bf16[4], C: td.bf16[4]):
    C[threadIdx.x] = A[threadIdx.x]


def test_bf16_parameter_errors_ask_for_bfloat16(simulated_gpu):
    """They asked for 'dtype uint16', the type of bf16's bits, not what to pass."""
    out = td.to_device(np.zeros(4, ml_dtypes.bfloat16))
    with pytest.raises(TypeError, match=r"'A' must have dtype bfloat16 \(bf16\), got float16"):
        copy_bf16(td.to_device(np.zeros(4, np.float16)), out)
    a = np.array([1.5, -2.0, 3.25, 0.0], ml_dtypes.bfloat16)
    copy_bf16(td.to_device(a), out)
    np.testing.assert_array_equal(out.numpy(), a)


@td.kernel(grid=lambda N: td.cdiv(N, 32), block=32)
def scale(A: td.f32["N"], C: td.f32["N"], k: td.f32):
    i = blockIdx.x * 32 + threadIdx.x
    if i < N:
        C[i] = A[i] * k


def test_cpu_launch_cache_keeps_no_arrays_alive():
    """The cpu launch prepared at a signature's first call kept that call's arrays alive with the kernel."""
    a = np.arange(40, dtype=np.float32)
    c = np.zeros_like(a)
    scale(a, c, 2.0)
    np.testing.assert_array_equal(c, a * 2)
    alive = weakref.ref(a)
    del a, c
    gc.collect()
    assert alive() is None
    b, out = np.ones(40, np.float32), np.zeros(40, np.float32)
    scale(b, out, 2.0)            # the prepared launch, reused with new arrays
    np.testing.assert_array_equal(out, np.full(40, 2.0, np.float32))
