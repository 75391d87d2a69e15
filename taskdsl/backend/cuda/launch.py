"""Running compiled kernels on a GPU through cuda.core.

One `DeviceState` per device holds the launch limits, the exact arch (`sm_XY`), the loaded
kernels and the stream every taskdsl launch and copy goes on: a *blocking* stream
(`StreamOptions(nonblocking=False)`), so it is ordered with work on the legacy default
stream, where torch and cupy run by default.

Arguments, in the kernel's parameter order:

- numpy arrays are copied to the device, and the ones the kernel may write (pointer
  parameters not declared `const` in the generated CUDA) are copied back in place; all
  copies and the launch go on one stream, with a single sync at the end;
- `td.DeviceArray`s are passed as they are;
- other CUDA arrays (torch, cupy, anything with DLPack or `__cuda_array_interface__`) are
  passed without copies through a `StridedMemoryView` taken on the launch stream, which
  orders the launch after the producer's pending work;
- scalars are passed as numpy scalars of the parameter's dtype;
- an array parameter the generated code never names gets a null pointer.

A launch whose arguments are all `td.DeviceArray`s and scalars is prepared once per argument
signature (`prepare_cuda` -> `PreparedCudaLaunch`: checks, module load and launch
configuration done once). `recording()` collects the launches of a block of code as
`LaunchRecord`s, which `graphs.CudaGraph` captures into one CUDA graph.

A launch without numpy arguments is asynchronous, like a torch or cupy kernel: results
are read by `DeviceArray.numpy()` (which syncs), by torch/cupy on their default stream
(ordered by the blocking stream), or after `synchronize()`.
"""
from __future__ import annotations

import re
import threading
from contextlib import contextmanager
from dataclasses import dataclass, field

import numpy as np

from ...ir.types import ML_DTYPES_NAMES
from ...runtime.config import gpu_status
from ..cpu.launch import view_key, written_pairs

# DLPack device types a kernel can read (CUDA, pinned host, managed).
DL_CPU, DL_CUDA, DL_CUDA_HOST, DL_CUDA_MANAGED = 1, 2, 3, 13
_STATIC_SHARED_LIMIT = 48 * 1024   # dynamic shared memory above this needs the function attribute


@dataclass(frozen=True)
class LaunchLimits:
    """A device's launch limits (the defaults hold for every GPU since sm_30)."""

    max_threads: int = 1024
    block: tuple = (1024, 1024, 64)
    grid: tuple = (2**31 - 1, 65535, 65535)
    max_shared: int | None = None       # opt-in shared memory per block, bytes (None: not checked)


def check_launch_dims(grid: tuple, block: tuple, limits: LaunchLimits = LaunchLimits(), kernel: str = "kernel",
                      shared_bytes: int = 0) -> None:
    """ValueError naming the offending dimension if `grid`/`block` (3-tuples) exceed `limits`."""
    threads = block[0] * block[1] * block[2]
    if threads > limits.max_threads:
        raise ValueError(f"kernel '{kernel}': a block of {block} has {threads} threads, but at most "
                         f"{limits.max_threads} threads per block can run (the device's limit, or lower for a "
                         "kernel that needs many registers)")
    for axis, n, limit in zip("xyz", block, limits.block):
        if n > limit:
            raise ValueError(f"kernel '{kernel}': block.{axis} is {n}, but block dims are at most {limits.block}")
    for axis, n, limit in zip("xyz", grid, limits.grid):
        if n > limit:
            raise ValueError(f"kernel '{kernel}': grid.{axis} is {n} blocks, but grid dims are at most {limits.grid}; "
                             "use larger blocks, more work per block or another grid axis")
    if limits.max_shared is not None and shared_bytes > limits.max_shared:
        raise ValueError(f"kernel '{kernel}': a block needs {shared_bytes} bytes of shared memory, but this GPU "
                         f"allows at most {limits.max_shared}")


@dataclass(frozen=True)
class ParamInfo:
    """One parameter of a generated `__global__` function."""

    pointer: bool
    writable: bool


def kernel_params(source: str, symbol: str) -> list | None:
    """The parameters of `symbol` in generated CUDA source (None if its signature is not found).

    A pointer the generated code never stores to is declared `const`, so only non-const
    pointers need copying back to the host.
    """
    match = re.search(r'extern "C" __global__ void (?:__launch_bounds__\(\d+\) )?' + re.escape(symbol) +
                      r'\(([^)]*)\)', source)
    if match is None:
        return None
    params = []
    for text in filter(None, (p.strip() for p in match.group(1).split(","))):
        pointer = "*" in text
        params.append(ParamInfo(pointer, pointer and not text.startswith("const ")))
    return params


def is_c_contiguous(shape: tuple, strides: tuple | None, itemsize: int) -> bool:
    """Whether `strides` (in the unit of `itemsize`; None means C order) lay `shape` out in C order."""
    if strides is None or 0 in shape:
        return True
    expected = itemsize
    for n, stride in zip(reversed(shape), reversed(strides)):
        if n != 1 and stride != expected:
            return False
        expected *= n
    return True


def dtype_matches(actual: np.dtype, expected: np.dtype) -> bool:
    """Whether an array of `actual` dtype can be passed for `expected` (bf16 and the 8-bit floats travel as their
    bits: ml_dtypes' types pass for the unsigned integers of their width)."""
    if actual == expected:
        return True
    bits = np.dtype(f"uint{8 * actual.itemsize}") if getattr(actual, "name", "") in ML_DTYPES_NAMES.values() else None
    return expected == bits


def _np_dtype(dtype) -> np.dtype:
    """The numpy dtype of a taskdsl DataType (its `.numpy`) or of anything np.dtype accepts."""
    return dtype.numpy if hasattr(dtype, "numpy") and not isinstance(dtype, np.dtype) else np.dtype(dtype)


def check(result) -> tuple:
    """Raise RuntimeError for a failed cuda.bindings call; return the rest of its result tuple."""
    from cuda.bindings import driver
    result = result if isinstance(result, tuple) else (result,)
    err = result[0]
    if err != driver.CUresult.CUDA_SUCCESS:
        _, name = driver.cuGetErrorName(err)
        name = name.decode() if isinstance(name, bytes) else str(name)
        raise RuntimeError(f"CUDA driver call failed: {name} ({int(err)})")
    return result[1:]


def copy_to_device(ptr: int, host: np.ndarray, stream) -> None:
    """Queue a copy of C-contiguous `host` to device address `ptr` on `stream` (the host data is staged
    before this returns: pageable memory)."""
    if host.nbytes:
        from cuda.bindings import driver
        check(driver.cuMemcpyHtoDAsync(ptr, host.ctypes.data, host.nbytes, stream.handle))


def copy_to_host(host: np.ndarray, ptr: int, stream) -> None:
    """Queue a copy from device address `ptr` into C-contiguous `host` on `stream` (sync before reading)."""
    if host.nbytes:
        from cuda.bindings import driver
        check(driver.cuMemcpyDtoHAsync(host.ctypes.data, ptr, host.nbytes, stream.handle))


def copy_on_device(dst: int, src: int, nbytes: int, stream) -> None:
    """Queue a copy of `nbytes` bytes between device addresses on `stream`."""
    if nbytes:
        from cuda.bindings import driver
        check(driver.cuMemcpyDtoDAsync(dst, src, nbytes, stream.handle))


def fill_zero(ptr: int, nbytes: int, stream) -> None:
    """Queue zeroing `nbytes` bytes at device address `ptr` on `stream`."""
    if nbytes:
        from cuda.bindings import driver
        check(driver.cuMemsetD8Async(ptr, 0, nbytes, stream.handle))


# ---------------------------------------------------------------------------------------- device state
@dataclass
class _Loaded:
    code: object            # the cuda.core ObjectCode (keeps the module loaded)
    kernel: object          # the cuda.core Kernel
    params: list | None
    max_threads: int
    static_shared: int
    dynamic_shared: int = _STATIC_SHARED_LIMIT   # the kernel's current dynamic shared memory cap


@dataclass
class DeviceState:
    """Per-device launch state: limits, arch, loaded kernels, the stream, the L2-flush buffer."""

    device: object
    device_id: int
    arch: str
    limits: LaunchLimits
    l2_bytes: int
    stream: object
    kernels: dict = field(default_factory=dict)
    flush_buffer: object = None

    @property
    def stream_handle(self) -> int:
        return int(self.stream.handle)


_states: dict = {}
_lock = threading.Lock()
_local = threading.local()


def device_state(what: str = "the cuda target") -> DeviceState:
    """The launch state of this thread's device, made current (RuntimeError without a usable GPU)."""
    state = getattr(_local, "state", None)
    if state is not None:
        return state
    usable, reason = gpu_status()
    if not usable:
        raise RuntimeError(f"{what} needs a usable CUDA GPU, but none was found ({reason}). Without a GPU, pass "
                           "numpy arrays and run kernels on the cpu target: td.set_target('cpu').")
    from cuda.core import Device, StreamOptions
    device = Device()          # this thread's current device: device 0 unless the program chose another
    device.set_current()
    with _lock:
        state = _states.get(device.device_id)
        if state is None:
            props = device.properties
            cc = device.compute_capability
            limits = LaunchLimits(props.max_threads_per_block,
                                  (props.max_block_dim_x, props.max_block_dim_y, props.max_block_dim_z),
                                  (props.max_grid_dim_x, props.max_grid_dim_y, props.max_grid_dim_z),
                                  props.max_shared_memory_per_block_optin)
            stream = device.create_stream(options=StreamOptions(nonblocking=False))
            state = DeviceState(device, device.device_id, f"sm_{cc.major}{cc.minor}", limits,
                                props.l2_cache_size, stream)
            _states[device.device_id] = state
    _local.state = state
    return state


def current_stream():
    """The cuda.core Stream taskdsl launches and copies on (this thread's device)."""
    return device_state().stream


def synchronize() -> None:
    """Wait for every taskdsl launch and copy on this thread's device to finish."""
    device_state().stream.sync()


def _load(state: DeviceState, compiled, symbol: str) -> _Loaded:
    key = (compiled.binary, symbol)
    loaded = state.kernels.get(key)
    if loaded is None:
        from cuda.core import ObjectCode
        if compiled.binary is None:
            raise ValueError(f"kernel '{symbol}': no cubin to load (compiled for target {compiled.target!r})")
        if compiled.arch is not None and compiled.arch != state.arch:
            raise ValueError(f"kernel '{symbol}' was compiled for {compiled.arch}, but the GPU is {state.arch}; "
                             f"compile with arch='{state.arch}'")
        code = ObjectCode.from_cubin(compiled.binary, name=symbol)
        kernel = code.get_kernel(symbol)
        attrs = kernel.attributes
        loaded = _Loaded(code, kernel, kernel_params(compiled.source, symbol), attrs.max_threads_per_block,
                         attrs.shared_size_bytes)
        state.kernels[key] = loaded
    return loaded


def _allow_dynamic_shared(state: DeviceState, loaded: _Loaded, nbytes: int) -> None:
    """Raise the kernel's dynamic shared memory cap to `nbytes` (needed above 48 KB)."""
    if nbytes <= loaded.dynamic_shared:
        return
    from cuda.bindings import driver
    attr = driver.CUfunction_attribute.CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES
    handle = loaded.kernel.handle
    if isinstance(handle, driver.CUfunction):
        check(driver.cuFuncSetAttribute(handle, attr, nbytes))
    else:   # a CUkernel from the library API, which cuda.core uses
        check(driver.cuKernelSetAttribute(attr, nbytes, handle, state.device_id))
    loaded.dynamic_shared = nbytes


def _host_array_error(value, what: str) -> TypeError:
    return TypeError(f"{what} is a {type(value).__module__}.{type(value).__name__} in host memory; the cuda target "
                     "takes numpy arrays (copied to the GPU and back) or arrays in GPU memory (td.DeviceArray, "
                     "torch/cupy CUDA tensors, any DLPack or __cuda_array_interface__ CUDA array): pass "
                     "np.asarray(x) or move it to the GPU (x.cuda(), td.to_device(x))")


def _device_pointer(state: DeviceState, value, expected: np.dtype, writable: bool, what: str, keep: list) -> int:
    """The device pointer of a CUDA array argument, after checking device, dtype and layout."""
    from ...runtime.device_array import DeviceArray, view_dtype
    if isinstance(value, DeviceArray):
        if value.device_id != state.device_id:
            raise ValueError(f"{what} is on device {value.device_id}, but the launch is on device {state.device_id}")
        if not dtype_matches(value.dtype, expected):
            raise TypeError(f"{what} must have dtype {expected}, got {value.dtype}")
        return value.ptr
    from cuda.core.utils import StridedMemoryView
    view = StridedMemoryView.from_any_interface(value, stream_ptr=state.stream_handle)
    keep.append(view)
    if not view.is_device_accessible:
        raise _host_array_error(value, what)
    if view.device_id >= 0 and view.device_id != state.device_id:
        raise ValueError(f"{what} is on device {view.device_id}, but the launch is on device {state.device_id}")
    if not dtype_matches(view_dtype(view), expected):
        raise TypeError(f"{what} must have dtype {expected}, got {view.dtype}")
    if not is_c_contiguous(tuple(view.shape), None if view.strides is None else tuple(view.strides), 1):
        raise ValueError(f"{what} is not C-contiguous (shape {tuple(view.shape)}, strides {tuple(view.strides)} "
                         "elements); device arrays are passed without copies, so make it contiguous first: "
                         "x.contiguous() (torch), cupy.ascontiguousarray(x)")
    if writable and view.readonly:
        raise ValueError(f"{what} is read-only, but the kernel writes to it")
    return int(view.ptr)


@dataclass
class LaunchRecord:
    """One launch as issued, to be issued again (into a CUDA graph): what `recording` collects."""

    kernel: object          # the cuda.core Kernel
    config: object          # its LaunchConfig
    args: list              # device pointers and scalars, as passed
    keep: list              # what must stay alive while the pointers are used: arrays, staging buffers
    host_writes: bool       # numpy outputs were copied back: replaying it would not update them


class _Recording:
    """The launches of a `recording()` block, and whether the host read GPU memory during it."""

    def __init__(self):
        self.launches: list = []
        self.host_reads = 0            # copies of device memory back to the host: a replay would not redo them
        self.memory_ops = 0            # fills and copies into device memory outside kernels: nor these


def recording_active() -> _Recording | None:
    """The recording of this thread, or None outside `recording()`."""
    return getattr(_local, "recording", None)


@contextmanager
def recording():
    """Collect every launch of this thread (`LaunchRecord`s, in order) while the block runs, besides running
    it: `with recording() as r: ...; r.launches`. The records keep their arrays alive."""
    previous, _local.recording = recording_active(), _Recording()
    try:
        yield _local.recording
    finally:
        _local.recording = previous


def _configure(compiled, symbol: str, values: list, grid: tuple, block: tuple, shmem_size: int | None) -> tuple:
    """(device state, loaded kernel, LaunchConfig) of a launch, after checking its dims and argument count."""
    from cuda.core import LaunchConfig

    if shmem_size is None:
        shmem_size = int(getattr(compiled, "dynamic_shared_bytes", 0) or 0)
    state = device_state()
    loaded = _load(state, compiled, symbol)
    limits = state.limits
    if loaded.max_threads < limits.max_threads:
        limits = LaunchLimits(loaded.max_threads, limits.block, limits.grid, limits.max_shared)
    check_launch_dims(grid, block, limits, symbol, loaded.static_shared + shmem_size)
    if loaded.params is not None and len(loaded.params) != len(values):
        raise RuntimeError(f"kernel '{symbol}' has {len(loaded.params)} parameters in its CUDA source, "
                           f"but {len(values)} arguments were bound")
    if shmem_size > _STATIC_SHARED_LIMIT:
        _allow_dynamic_shared(state, loaded, shmem_size)
    return state, loaded, LaunchConfig(grid=tuple(grid), block=tuple(block), shmem_size=shmem_size)


def _record(kernel, config, args: list, keep: list, host_writes: bool) -> None:
    record = recording_active()
    if record is not None:
        record.launches.append(LaunchRecord(kernel, config, args, keep, host_writes))


def launch_cuda(compiled, symbol: str, values: list, grid: tuple, block: tuple, dtypes: list, *,
                shmem_size: int | None = None) -> None:
    """Launch `symbol` of `compiled` (a cuda CompiledKernel) on `grid` x `block` with `values`.

    `values` are the bound arguments in parameter order (arrays and scalars), `dtypes` the
    parameters' element / scalar types (taskdsl DataTypes or numpy dtypes), `shmem_size`
    the dynamic shared memory per block in bytes (default: `compiled.dynamic_shared_bytes`,
    which the code generator sets when a kernel's shared buffers exceed 48 KiB). An array
    parameter the kernel never reads (`compiled.unused_params`, a shape carrier say) gets a
    null pointer, with no copy.
    """
    from cuda.core import launch

    state, loaded, config = _configure(compiled, symbol, values, grid, block, shmem_size)
    params = loaded.params
    unused = getattr(compiled, "unused_params", ())
    stream = state.stream
    args, keep, copy_back = [], [], []
    buffers = {}        # a numpy view -> its device buffer: one view passed twice is one array there too
    for index, (value, dtype) in enumerate(zip(values, dtypes)):
        expected = _np_dtype(dtype)
        writable = params[index].writable if params is not None else True
        what = f"kernel '{symbol}': argument {index}"
        if index in unused:
            args.append(0)
        elif isinstance(value, np.ndarray):
            if writable and not value.flags.writeable:
                raise ValueError(f"{what} is a read-only numpy array, but the kernel writes to it")
            key = view_key(value)
            if key not in buffers:
                host = value if value.flags.c_contiguous else np.ascontiguousarray(value)
                buffers[key] = host, state.device.allocate(max(host.nbytes, 1), stream=stream)
                copy_to_device(int(buffers[key][1].handle), host, stream)
                keep.append(buffers[key][1])
            host, buffer = buffers[key]
            if writable and all(b is not buffer for _, _, b in copy_back):
                copy_back.append((value, host, buffer))
            args.append(int(buffer.handle))
        elif isinstance(value, (np.generic, bool, int, float)):
            args.append(expected.type(value))
        else:
            args.append(_device_pointer(state, value, expected, writable, what, keep))
            keep.append(value)
    launch(stream, config, loaded.kernel, *args)
    _record(loaded.kernel, config, args, keep, bool(copy_back))
    if copy_back:
        for _, host, buffer in copy_back:
            copy_to_host(host, int(buffer.handle), stream)
        stream.sync()
        for value, host, _ in copy_back:
            if host is not value:
                np.copyto(value, host.reshape(value.shape))
    del keep    # device buffers are freed in stream order, after the kernel has used them


def check_host_arrays_apart(values: list, written: dict, kernel: str, names) -> None:
    """A ValueError where a numpy array the kernel writes and another numpy argument are different views of shared
    memory (`written`: index -> name; `names`: the parameters'): `launch_cuda` copies each view to the GPU on its
    own, so the kernel would see two arrays where the caller has one, and one copy coming back would undo the
    other's writes. One view passed twice is copied once, as one array."""
    for w, k in written_pairs(values, written):
        a, b = values[w], values[k]
        if view_key(a) != view_key(b) and np.shares_memory(a, b):
            raise ValueError(f"kernel '{kernel}': arguments '{names[w]}' (written) and '{names[k]}' are different "
                             "views of the same memory; the cuda target copies each numpy array to the GPU on its "
                             "own, so the kernel would see two arrays where there is one: pass arrays that do not "
                             "overlap, the same view for both, or td.to_device arrays")


_POINTER = "pointer"


@dataclass(frozen=True)
class PreparedCudaLaunch:
    """A launch decided once per argument signature (td.DeviceArrays and scalars only): a call reads the
    arrays' pointers, types the scalars, and launches; the checks, the kernel load and the launch
    configuration were done when it was prepared. It keeps a launch's Python cost to a few microseconds."""

    kernel: object
    config: object
    stream: object
    kinds: tuple        # per argument: _POINTER (a DeviceArray), a numpy scalar type, or None (unused: null)
    launch: object      # cuda.core.launch

    def arguments(self, values) -> list:
        """What cuda.core's launch gets for `values`: device pointers, typed scalars, nulls for unused arrays."""
        return [v.ptr if kind is _POINTER else 0 if kind is None else kind(v) for kind, v in zip(self.kinds, values)]

    def __call__(self, values) -> None:
        args = self.arguments(values)
        self.launch(self.stream, self.config, self.kernel, *args)
        if getattr(_local, "recording", None) is not None:
            _record(self.kernel, self.config, args, list(values), False)


def prepare_cuda(compiled, symbol: str, values: list, grid: tuple, block: tuple, dtypes: list) -> PreparedCudaLaunch | None:
    """The launch of `launch_cuda` for arguments of this signature, decided once; None when an argument needs
    work at every call (a numpy array to copy in, another library's array to view on the stream)."""
    from cuda.core import launch

    from ...runtime.device_array import DeviceArray

    unused = getattr(compiled, "unused_params", ())
    if not all(k in unused or isinstance(v, (DeviceArray, np.generic, bool, int, float)) for k, v in enumerate(values)):
        return None
    state, loaded, config = _configure(compiled, symbol, values, grid, block, None)
    kinds = []
    for index, (value, dtype) in enumerate(zip(values, dtypes)):
        expected = _np_dtype(dtype)
        if index in unused:
            kinds.append(None)
        elif isinstance(value, DeviceArray):
            writable = loaded.params[index].writable if loaded.params is not None else True
            _device_pointer(state, value, expected, writable, f"kernel '{symbol}': argument {index}", [])
            kinds.append(_POINTER)
        else:
            kinds.append(expected.type)
    return PreparedCudaLaunch(loaded.kernel, config, state.stream, tuple(kinds), launch)


__all__ = ["launch_cuda", "prepare_cuda", "PreparedCudaLaunch", "recording", "recording_active", "LaunchRecord",
           "check_launch_dims", "LaunchLimits", "kernel_params", "is_c_contiguous", "device_state", "current_stream",
           "synchronize", "DeviceState"]
