"""A simulated GPU for machines without one: "device memory" is host memory, and cuda launches run their CUDA C++
on the host (tests/cuda_on_host.py) or the cpu backend's kernels (`cuda_source_on_host` says which).

It stands in below everything taskdsl builds on the driver: `td.DeviceArray`s (allocation, copies,
reshapes), the operator library's placement of results, the graph executor's device-resident
runs and its CUDA-graph recording and replay. The driver calls themselves (cuda.core launches,
graph capture) are what it replaces; tests/test_gpu.py and the @gpu tests cover those on a GPU.

    def test_x(simulated_gpu):           # the fixture (tests/conftest.py) makes "cuda" usable
        y = td.to_device(x) ...
        simulated_gpu.launches           # (kernel, arguments) of every cuda launch, in order
"""
from __future__ import annotations

import ctypes
import os
from dataclasses import dataclass, field

import numpy as np

import taskdsl
from taskdsl.backend.cuda import graphs, launch
from taskdsl.backend.cuda.codegen import emit_cuda
from taskdsl.ir.types import ML_DTYPES_NAMES, DataType, numpy_dtype
from taskdsl.runtime import config, device_array
from taskdsl.runtime.device_array import DeviceArray
from taskdsl.runtime.kernel import Kernel

from .cuda_on_host import DivisionByZeroOnHost, host_compiler, run_source, unsupported

REAL_LAUNCH_PATH = {"_run_cuda": Kernel._run_cuda, "_prepare_cuda": Kernel._prepare_cuda}   # what install replaces


def host_view(array: DeviceArray) -> np.ndarray:
    """The numpy array over a simulated DeviceArray's memory (no copy)."""
    raw = (ctypes.c_uint8 * max(array.nbytes, 1)).from_address(array.ptr)
    return np.frombuffer(raw, np.uint8, count=array.nbytes).view(array.dtype).reshape(array.shape)


class _Buffer:
    def __init__(self, nbytes: int):
        self.memory = np.empty(nbytes + 64, np.uint8)
        self.handle = self.memory.ctypes.data + (-self.memory.ctypes.data % 64)   # 64-byte aligned, like cudaMalloc's 256


@dataclass
class _Properties:
    multiprocessor_count: int = 4
    memory_clock_rate: int = 2_619_000      # kHz (an H100 SXM's HBM3)
    global_memory_bus_width: int = 5120     # bits


class _Device:
    device_id = 0
    properties = _Properties()

    def allocate(self, nbytes: int, stream=None) -> _Buffer:
        return _Buffer(nbytes)


class _Stream:
    handle = 0

    def sync(self) -> None:
        pass


@dataclass
class SimulatedGPU:
    """What the simulated device saw: every launch, as (kernel, its arguments as the kernel received them)."""

    launches: list = field(default_factory=list)
    replays: int = 0
    limits: launch.LaunchLimits = field(default_factory=launch.LaunchLimits)     # a GPU's (a test may lower them)
    cuda_source: bool = False       # launches run their CUDA C++ on the host, in place (else the cpu kernel)
    sources: dict = field(default_factory=dict)     # (id of a kernel's IR, sizes) -> (IR, CUDA source)

    def run(self, kernel: Kernel, binding) -> None:
        """Run a launch, refusing grids and blocks a GPU's launch would (grid.z 65535 and the like: limits the
        cpu has not)."""
        launch.check_launch_dims(binding.grid, binding.block, self.limits, kernel.name)
        values = binding.values
        arguments = [host_view(v) if isinstance(v, DeviceArray) else v for v in values]
        self.launches.append((kernel, values))
        self.execute(kernel, arguments)
        record = launch.recording_active()
        if record is not None:
            record.launches.append(launch.LaunchRecord(kernel, None, arguments, list(values), False))

    def execute(self, kernel: Kernel, arguments: list) -> None:
        """Run `kernel` on `arguments` (numpy arrays over device memory, and scalars): its cpu kernel, or its CUDA
        source on the host where the host can run it (an integer division by zero, which x86 traps and a GPU
        leaves unspecified, as a graph's compile run on zeros divides, runs again on the cpu)."""
        arguments = _held_values(kernel, arguments)
        if self.cuda_source:
            binding = kernel.bind(tuple(arguments), "cuda")
            if 0 in binding.grid:
                return
            # by the kernel's IR for the launch's block (built again after a global it read was rebound), which the
            # entry keeps alive so that its id is not reused, and the sizes, as Kernel keys its cubins
            built = kernel._frontend_ir(binding.block)
            key = (id(built), tuple(sorted(binding.sizes.items())))
            if key not in self.sources:      # a replayed graph launches each kernel again: lower it once
                self.sources[key] = (built, emit_cuda(kernel._cuda_function(binding)))
            source = self.sources[key][1]
            if unsupported(source) is None:
                try:
                    run_source(source, binding.grid, binding.block, binding.values, kernel.name, in_place=True)
                    return
                except DivisionByZeroOnHost:
                    pass
        kernel._call_cpu(tuple(arguments))


def _held_values(kernel: Kernel, arguments: list) -> list:
    """Bound arguments with bf16 and 8-bit float scalars, which a binding turns into their bits, as the values the
    bits hold (ml_dtypes scalars): bound again as numbers, the bits would be rounded as the values they are not."""
    return [np.array(a).view(numpy_dtype(spec))[()] if isinstance(spec, DataType) and spec.name in ML_DTYPES_NAMES
            else a for (_, spec), a in zip(kernel.params, arguments)]


class _Graph:
    """CudaGraph's stand-in: replaying runs the recorded kernels again on the recorded arrays."""

    gpu: SimulatedGPU = None

    def __init__(self, launches: list):
        self.launches = launches

    def __len__(self) -> int:
        return len(self.launches)

    def replay(self) -> None:
        type(self).gpu.replays += 1
        for r in self.launches:
            type(self).gpu.execute(r.kernel, r.args)


def cuda_source_on_host() -> bool:
    """Whether the `simulated_gpu` fixture's launches run their CUDA C++ on the host: where a host C++ compiler
    exists, unless TASKDSL_SIMULATED_GPU=1 asks for the cpu kernels (cold, the fixture's tests take half the time
    on the host: g++ builds a kernel faster than numba)."""
    mode = os.environ.get("TASKDSL_SIMULATED_GPU")
    return mode == "host" or (mode != "1" and host_compiler() is not None)


def simulate_cuda_twin(monkeypatch, twin_target) -> None:
    """For a cuda twin (tests/conftest.py GPU_TWINS) on a machine without a GPU, with TASKDSL_SIMULATED_GPU=1 or
    host: install the simulated GPU (without that variable such twins are skipped)."""
    mode = os.environ.get("TASKDSL_SIMULATED_GPU")
    if twin_target == "cuda" and mode in ("1", "host") and not config.gpu_status()[0]:
        install(monkeypatch, cuda_source=mode == "host")


def install(monkeypatch, cuda_source: bool = False) -> SimulatedGPU:
    """Make the cuda target usable in this test, on the simulated device (`cuda_source`: launches run their CUDA
    C++ on the host)."""
    gpu = SimulatedGPU(cuda_source=cuda_source)
    state = launch.DeviceState(_Device(), 0, "sm_90", launch.LaunchLimits(), 50 * 2**20, _Stream())
    monkeypatch.setattr(launch._local, "state", state, raising=False)
    for module in (config, taskdsl):                # taskdsl re-exports it as td.gpu_status
        monkeypatch.setattr(module, "gpu_status", lambda: (True, "simulated GPU"))
    copies = {"copy_to_host": lambda host, ptr, stream: ctypes.memmove(host.ctypes.data, ptr, host.nbytes),
              "copy_to_device": lambda ptr, host, stream: ctypes.memmove(ptr, host.ctypes.data, host.nbytes),
              "copy_on_device": lambda dst, src, nbytes, stream: ctypes.memmove(dst, src, nbytes),
              "fill_zero": lambda ptr, nbytes, stream: ctypes.memset(ptr, 0, nbytes)}
    for module in (launch, device_array):          # device_array imported them by name
        for name, fn in copies.items():
            monkeypatch.setattr(module, name, fn)
    monkeypatch.setattr(Kernel, "_run_cuda", lambda kernel, binding: gpu.run(kernel, binding))
    monkeypatch.setattr(Kernel, "_prepare_cuda", lambda kernel, binding: None)   # every launch through _run_cuda
    monkeypatch.setattr(_Graph, "gpu", gpu)
    monkeypatch.setattr(graphs, "CudaGraph", _Graph)
    monkeypatch.setenv("TASKDSL_TUNE", "0")       # the default schedules: nothing to time on a simulation
    return gpu
