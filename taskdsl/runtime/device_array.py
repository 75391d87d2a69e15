"""`td.DeviceArray`: a C-contiguous array in GPU memory, and reading other libraries' device arrays.

A DeviceArray is a cuda.core `Buffer` with a shape and a numpy dtype. Kernels take it
without copies; it exports `__cuda_array_interface__` (v3) and DLPack, so torch, cupy and
numba can use it without copies too. Its copies and the kernels that use it run on
taskdsl's stream (see `taskdsl.backend.cuda.launch`).

`array_info` reads the shape, dtype and strides of any device array (`__cuda_array_interface__`
or DLPack) for argument binding; for a `__cuda_array_interface__` object it is pure Python.
"""
from __future__ import annotations

import math
import operator
from dataclasses import dataclass

import numpy as np

from ..backend.cuda.launch import (DL_CPU, DL_CUDA, DL_CUDA_HOST, DL_CUDA_MANAGED, copy_on_device, copy_to_device,
                                   copy_to_host, device_state, fill_zero, is_c_contiguous, recording_active)
from ..ir.types import DataType, is_number_dtype, numpy_dtype
from . import config

ACCEPTED = ("host arrays, numpy's or with DLPack (copied to the GPU and back), or arrays in GPU memory: td.DeviceArray "
            "(td.to_device), torch / cupy CUDA tensors, any DLPack or __cuda_array_interface__ CUDA array")


class DeviceArray:
    """A C-contiguous array in GPU memory. Make one with `td.to_device(array)` or `empty(shape, dtype)`."""

    __slots__ = ("_buffer", "_shape", "_dtype", "_device_id", "_stream_handle", "_ptr", "launch_key", "__weakref__")

    def __init__(self, buffer, shape: tuple, dtype, device_id: int, stream_handle: int):
        self._buffer = buffer
        self._shape = tuple(int(n) for n in shape)
        self._dtype = np.dtype(dtype)
        self._device_id = int(device_id)
        self._stream_handle = int(stream_handle)
        self._ptr = int(buffer.handle)      # read at every launch: computed once
        # what a kernel launch's argument signature holds of this array (Kernel's prepared-launch lookup)
        self.launch_key = (DeviceArray, self._dtype, self._shape, self._device_id)

    # ------------------------------------------------------------------ metadata
    @property
    def shape(self) -> tuple:
        return self._shape

    @property
    def dtype(self) -> np.dtype:
        return self._dtype

    @property
    def ndim(self) -> int:
        return len(self._shape)

    @property
    def size(self) -> int:
        return math.prod(self._shape)

    @property
    def nbytes(self) -> int:
        return self.size * self._dtype.itemsize

    @property
    def ptr(self) -> int:
        """The device address of the first element."""
        return self._ptr

    @property
    def device_id(self) -> int:
        return self._device_id

    @property
    def buffer(self):
        """The cuda.core Buffer holding the data."""
        return self._buffer

    def __len__(self) -> int:
        if not self._shape:
            raise TypeError("len() of a 0-d DeviceArray")
        return self._shape[0]

    def __repr__(self) -> str:
        return f"DeviceArray(shape={self._shape}, dtype={self._dtype}, device={self._device_id})"

    def __bool__(self) -> bool:
        """The truth of a one-element array (copied to the host, as numpy and torch do); ValueError otherwise."""
        if self.size != 1:
            raise ValueError(f"the truth value of a DeviceArray of {self.size} elements is ambiguous")
        return bool(self.numpy().reshape(()))

    def copy(self) -> "DeviceArray":
        """A new DeviceArray with a copy of the contents (in stream order)."""
        out = empty(self._shape, self._dtype)
        out.copy_from(self)
        return out

    def __copy__(self) -> "DeviceArray":     # copy.copy / copy.deepcopy: new memory, as for numpy arrays
        return self.copy()

    def __deepcopy__(self, memo) -> "DeviceArray":
        return self.copy()

    def __reduce__(self):
        """Pickle the contents (copied to the host), unpickled into new GPU memory, as torch pickles CUDA tensors:
        the buffer's address would be meaningless in another process, and aliased in this one."""
        return to_device, (self.numpy(),)

    # ------------------------------------------------------------------ copies
    def numpy(self) -> np.ndarray:
        """A host copy (waits for the kernels and copies queued before it)."""
        record = recording_active()
        if record is not None:     # the host now depends on this run's values: a graph replay would not redo it
            record.host_reads += 1
        out = np.empty(self._shape, self._dtype)
        stream = device_state("DeviceArray.numpy()").stream
        copy_to_host(out, self.ptr, stream)
        stream.sync()
        return out

    def copy_from_host(self, array) -> None:
        """Overwrite the contents with a numpy array of the same shape and dtype (Python numbers and lists are
        converted to the dtype where numpy casts them safely: floats to any float, ints to any int)."""
        if isinstance(array, DeviceArray):
            self.copy_from(array)
            return
        host = _c_order(array)
        # numbers and lists have no dtype of their own (numpy makes Python floats float64): cast those
        if not hasattr(array, "dtype") and np.can_cast(host.dtype, self._dtype, "same_kind"):
            host = host.astype(self._dtype)
        if host.shape != self._shape or host.dtype != self._dtype:
            raise ValueError(f"copy_from_host needs shape {self._shape} and dtype {self._dtype}, "
                             f"got {host.shape} {host.dtype}")
        _count_memory_op()
        copy_to_device(self.ptr, host, device_state("DeviceArray.copy_from_host()").stream)

    def copy_from(self, array) -> None:
        """Overwrite the contents with a numpy array or a DeviceArray of the same shape and dtype."""
        if not isinstance(array, DeviceArray):
            self.copy_from_host(array)
            return
        if array.shape != self._shape or array.dtype != self._dtype:
            raise ValueError(f"copy_from needs shape {self._shape} and dtype {self._dtype}, "
                             f"got {array.shape} {array.dtype}")
        _count_memory_op()
        copy_on_device(self.ptr, array.ptr, self.nbytes, device_state("DeviceArray.copy_from()").stream)

    def zero(self) -> "DeviceArray":
        """Set every element to zero (in stream order); returns self."""
        _count_memory_op()
        fill_zero(self.ptr, self.nbytes, device_state("DeviceArray.zero()").stream)
        return self

    def reshape(self, *shape) -> "DeviceArray":
        """A view with another shape of the same elements (one dim may be -1), sharing the memory."""
        shape = shape[0] if len(shape) == 1 and isinstance(shape[0], (tuple, list)) else shape
        if not all(isinstance(n, (int, np.integer)) and not isinstance(n, bool) and n >= -1 for n in shape):
            raise ValueError(f"DeviceArray.reshape takes non-negative ints (and one -1), got {shape}")
        requested = tuple(int(n) for n in shape)
        known = math.prod(n for n in requested if n != -1)
        shape = requested
        if requested.count(-1) == 1 and known:
            shape = tuple(self.size // known if n == -1 else n for n in requested)
        if shape.count(-1) or math.prod(shape) != self.size:
            raise ValueError(f"cannot reshape a DeviceArray of shape {self._shape} ({self.size} elements) into "
                             f"{requested}")
        return DeviceArray(self._buffer, shape, self._dtype, self._device_id, self._stream_handle)

    def __array__(self, dtype=None, copy=None):
        raise TypeError("a DeviceArray lives in GPU memory: numpy cannot read it in place. Copy it to the host "
                        "with .numpy() (which waits for the GPU)")

    # ------------------------------------------------------------------ interop
    @property
    def __cuda_array_interface__(self) -> dict:
        # "stream": the producer stream; a consumer orders its own stream after it.
        return {"version": 3, "shape": self._shape, "typestr": self._dtype.str, "data": (self.ptr, False),
                "strides": None, "descr": [("", self._dtype.str)], "stream": self._stream_handle}

    def __dlpack_device__(self) -> tuple:
        return (DL_CUDA, self._device_id)

    def __dlpack__(self, *, stream=None, max_version=None, dl_device=None, copy=None):
        """A DLPack capsule (no copy); the consumer's `stream` is ordered after taskdsl's stream."""
        if dl_device is not None and tuple(dl_device) != self.__dlpack_device__():
            raise BufferError(f"a DeviceArray lives on CUDA device {self._device_id} and cannot be exported "
                              f"to DLPack device {tuple(dl_device)}")
        if copy:
            raise BufferError("DeviceArray.__dlpack__ exports without copying (copy=True is not supported)")
        self._order_before(stream)
        from cuda.core.utils import StridedMemoryView
        view = StridedMemoryView.from_buffer(self._buffer, self._shape, dtype=self._dtype)
        return view.__dlpack__(max_version=max_version)

    def _order_before(self, stream) -> None:
        """Make the DLPack consumer stream (None / 1: legacy default, 2: per-thread, -1: none) wait for ours."""
        if stream == -1 or stream == self._stream_handle:
            return
        from cuda.core import LEGACY_DEFAULT_STREAM, PER_THREAD_DEFAULT_STREAM, Stream
        ours = device_state("DeviceArray.__dlpack__").stream
        if stream is None or stream in (0, 1):
            consumer = LEGACY_DEFAULT_STREAM
        elif stream == 2:
            consumer = PER_THREAD_DEFAULT_STREAM
        else:
            consumer = Stream.from_handle(int(stream))
        consumer.wait(ours)


def _c_order(array) -> np.ndarray:
    """`array` as a C-contiguous numpy array of numbers in native byte order, 0-d staying 0-d
    (np.ascontiguousarray makes it 1-d); TypeError for anything else (objects, strings, None)."""
    host = np.asarray(array)
    if not is_number_dtype(host.dtype):
        raise TypeError(f"device arrays hold numbers (bool, int, float); got {type(array).__name__} of dtype "
                        f"{host.dtype}")
    if not host.dtype.isnative:
        host = host.astype(host.dtype.newbyteorder("="))
    return host if host.flags.c_contiguous else np.ascontiguousarray(host)


def empty(shape, dtype) -> DeviceArray:
    """An uninitialized DeviceArray (`dtype`: a numpy dtype or a taskdsl type such as td.f32)."""
    try:        # as numpy: 2.5 or "3" is no dim
        shape = tuple(operator.index(n) for n in ((shape,) if isinstance(shape, (int, np.integer)) else shape))
    except TypeError:
        raise TypeError(f"array dims must be ints, got {shape}") from None
    if any(n < 0 for n in shape):
        raise ValueError(f"array dims must be non-negative, got {shape}")
    dtype = numpy_dtype(dtype) if isinstance(dtype, DataType) else np.dtype(dtype)    # bf16 as bfloat16
    if not is_number_dtype(dtype):      # GPU memory holds no Python objects (numpy() would read pointers)
        raise TypeError(f"device arrays hold numbers (bool, int, float), not {dtype}")
    state = device_state("td.DeviceArray")
    nbytes = math.prod(shape) * dtype.itemsize
    buffer = state.device.allocate(max(nbytes, 1), stream=state.stream)
    return DeviceArray(buffer, shape, dtype, state.device_id, state.stream_handle)


def carve(arena: DeviceArray, offset: int, shape, dtype) -> DeviceArray:
    """A DeviceArray over part of `arena`'s memory, from byte `offset` (no allocation; it keeps `arena`
    alive): the graph executor's planned activations."""
    shape, dtype = tuple(int(n) for n in shape), np.dtype(dtype)
    nbytes = math.prod(shape) * dtype.itemsize
    if offset < 0 or offset + nbytes > arena.nbytes:
        raise ValueError(f"{nbytes} bytes at offset {offset} do not fit in an arena of {arena.nbytes} bytes")
    from cuda.core import Buffer
    buffer = Buffer.from_handle(arena.ptr + offset, max(nbytes, 1), owner=arena.buffer)
    return DeviceArray(buffer, shape, dtype, arena.device_id, arena._stream_handle)


def _count_memory_op() -> None:
    """Tell a launch recording, if one is on, that memory was filled or copied outside kernels: a CUDA graph of
    the recorded launches would not redo it."""
    record = recording_active()
    if record is not None:
        record.memory_ops += 1


def synchronize() -> None:
    """Wait until the kernels and copies taskdsl issued on this thread's GPU have finished. A cuda launch returns
    before its kernel ends, so time one as `k(x, y); td.synchronize()`. Nothing waits on a machine without a usable
    GPU (cpu launches end before they return)."""
    if config.gpu_status()[0]:
        device_state().stream.sync()


def to_device(array) -> DeviceArray:
    """A DeviceArray holding a copy of `array` (a numpy array, or anything np.asarray takes, of numbers); a
    DeviceArray is returned as it is (`.copy()` copies one)."""
    if isinstance(array, DeviceArray):
        return array
    if not isinstance(array, np.ndarray) and _in_gpu_memory(array):
        raise TypeError(f"td.to_device takes host arrays; this {type(array).__name__} is already in GPU memory, "
                        "and kernels take it as it is")
    device_state("td.to_device")     # RuntimeError naming the reason when there is no GPU
    host = _c_order(array)
    out = empty(host.shape, host.dtype)
    out.copy_from_host(host)     # pageable host memory: the data is staged before this returns
    return out


def _in_gpu_memory(obj) -> bool:
    """Whether `obj` is another library's array in GPU memory (`__cuda_array_interface__` or a DLPack device
    other than the host's)."""
    if _cuda_array_interface(obj) is not None:
        return True
    device = getattr(obj, "__dlpack_device__", None)
    return callable(device) and int(device()[0]) != DL_CPU


# ---------------------------------------------------------------------------------------- binding
@dataclass(frozen=True)
class ArrayInfo:
    """What argument binding needs from a device array: shape, dtype and byte strides (None: C order)."""

    shape: tuple
    dtype: np.dtype
    strides: tuple | None = None

    @property
    def c_contiguous(self) -> bool:
        return is_c_contiguous(self.shape, self.strides, self.dtype.itemsize)


def _from_cai(cai: dict, what: str) -> ArrayInfo:
    try:
        dtype = bfloat16_for_void(np.dtype(cai["typestr"]))
        shape = tuple(int(n) for n in cai["shape"])
    except (KeyError, TypeError, ValueError) as exc:
        raise TypeError(f"{what} has an invalid __cuda_array_interface__ ({exc})") from None
    if not dtype.isnative:
        raise TypeError(f"{what} has a non-native byte order ({cai['typestr']!r})")
    if cai.get("mask") is not None:
        raise ValueError(f"{what} is a masked array (__cuda_array_interface__ 'mask'), which kernels cannot take")
    strides = cai.get("strides")
    return ArrayInfo(shape, dtype, None if strides is None else tuple(int(s) for s in strides))


def _cuda_array_interface(obj) -> dict | None:
    try:
        cai = obj.__cuda_array_interface__
    except AttributeError:      # e.g. a torch tensor in host memory
        return None
    except Exception:  # noqa: BLE001 - e.g. torch bfloat16 has no typestr (KeyError): DLPack describes it
        if hasattr(obj, "__dlpack__") and hasattr(obj, "__dlpack_device__"):
            return None
        raise
    return cai if isinstance(cai, dict) else None


def view_dtype(view) -> np.dtype:
    """The numpy dtype of a cuda.core StridedMemoryView (a bfloat16 view's as ml_dtypes' bfloat16)."""
    return bfloat16_for_void(np.dtype(view.dtype))


def bfloat16_for_void(dtype: np.dtype) -> np.dtype:
    """`dtype`, except 2-byte void ('V2') as ml_dtypes' bfloat16: how bfloat16, which numpy lacks, comes
    through DLPack (cuda.core's views) and torch's __cuda_array_interface__."""
    if dtype.kind == "V" and dtype.itemsize == 2 and dtype.fields is None:
        import ml_dtypes
        return np.dtype(ml_dtypes.bfloat16)
    return dtype


def array_info(obj, what: str = "argument") -> ArrayInfo | None:
    """Shape, dtype and strides of a GPU array; None for another library's host array with DLPack (a torch CPU
    tensor: the caller binds it as numpy's, `arrays.host_view`); TypeError for anything else."""
    if isinstance(obj, DeviceArray):
        return ArrayInfo(obj.shape, obj.dtype)
    cai = _cuda_array_interface(obj)
    if cai is not None:
        return _from_cai(cai, what)
    if hasattr(obj, "__dlpack__") and hasattr(obj, "__dlpack_device__"):
        device_type = int(obj.__dlpack_device__()[0])
        if device_type == DL_CPU:
            return None
        if device_type not in (DL_CUDA, DL_CUDA_HOST, DL_CUDA_MANAGED):
            raise TypeError(f"{what} is on DLPack device type {device_type}, not a CUDA device; the cuda target "
                            f"takes {ACCEPTED}")
        from cuda.core.utils import StridedMemoryView
        view = StridedMemoryView.from_dlpack(obj, stream_ptr=-1)   # metadata only: no stream ordering here
        dtype = view_dtype(view)
        strides = None if view.strides is None else tuple(int(s) * dtype.itemsize for s in view.strides)
        return ArrayInfo(tuple(int(n) for n in view.shape), dtype, strides)
    raise TypeError(f"{what} must be an array, got {type(obj).__name__}; the cuda target takes {ACCEPTED}")


__all__ = ["DeviceArray", "empty", "carve", "to_device", "array_info", "view_dtype", "ArrayInfo", "ACCEPTED"]
