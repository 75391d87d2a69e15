"""Host twins (TASKDSL_HOST_TWIN=1): every kernel a cpu test launches also runs its CUDA C++ on the host.

With the variable set, `tests/conftest.py` hands each cpu kernel call to `HostTwins.call`: the arguments are
copied before the cpu kernel runs, the kernel's CUDA source runs on the copies through `cuda_on_host.py`, and
every array must then hold what the cpu kernel left in it (integers and booleans exactly; floats within RTOL,
or SCALE of the array's largest magnitude; 16- and 8-bit floats within two ulps; NaN where NaN). The whole suite
becomes a search for CUDA code-generator bugs that NVRTC (which only compiles) and the simulated GPU (which
runs the cpu's kernels) cannot see, without a GPU.

It is off by default: it takes the suite 1.6x its time (196 s against 121 s on two cores with warm kernel caches,
session 49). Calls the shim cannot run faithfully, or whose results may depend on the threads' order, are passed
over and counted (atomics, inline PTX other than mma.sync, ldmatrix and cp.async, launches of more than MAX_THREADS
threads or more dynamic shared memory than the shim holds, arrays that overlap in part, a graph's compile run on
zeros, an integer division by zero, which x86 traps and a GPU leaves unspecified): the counts print at the end of
the session. Tests marked `undefined_behavior` are not twinned. One difference is by design: i32 arithmetic that
overflows wraps in CUDA and not on the cpu, which computes it in 64 bits (docs/dsl-reference.md). The random float
programs draw such expressions (`a - t` and `a * 2` of i32 values in session 48's seeds 102 and 110, `a * -7` in
session 50's seed 321) and their oracle knows where: under `unspecified(index, mask)` a twin leaves those elements
uncompared.
"""
from __future__ import annotations

import os
import re
from collections import Counter
from contextlib import contextmanager

import numpy as np

import taskdsl as td
from taskdsl.backend.cpu import precompile
from taskdsl.backend.cuda.codegen import dynamic_shared_bytes

from taskdsl.ir.types import FLOAT8_VALUES

from .cuda_on_host import (HOST_DYNAMIC_SMEM_BYTES, DivisionByZeroOnHost, entry_params, host_compiler, run_source,
                           unsupported)

ENABLED = os.environ.get("TASKDSL_HOST_TWIN") == "1"
MAX_THREADS = 1 << 20      # grid x block: a host run starts a fiber per CUDA thread (about a microsecond each)
# The host runs atomics, in its threads' order: an exchange's last value or a ticket can differ from the cpu's
# order, as between two GPU runs, so twins (which compare exactly) pass atomic kernels over.
_ATOMICS = re.compile(r"\batomic[A-Z]\w*\s*\(|\btd_atomic_rmw\b")
# The cpu's f32 math (vectorizable exp, erf, tanh) is not the host libm's, and LLVM contracts a * b + c into an fma
# where the host's -O0 code rounds twice: a sum that cancels (a matmul's output near 0) differs by more than RTOL
# of itself, so the absolute tolerance is SCALE of the array's largest magnitude. A wrong index is off by far more.
RTOL, ATOL, SCALE = 1e-4, 1e-6, 1e-5
# the 16- and 8-bit floats: two ulps (one rounding of an f32 result)
RTOL_NARROW = {"f16": 2 * 2.0 ** -10, "bf16": 2 * 2.0 ** -7, "f8e4m3": 2 * 2.0 ** -3, "f8e5m2": 2 * 2.0 ** -2}


_UNSPECIFIED: dict = {}     # argument index -> mask of its elements the calls under `unspecified` leave open


@contextmanager
def unspecified(index: int, mask: np.ndarray):
    """Twins of the kernel calls inside do not compare argument `index` where `mask` is true: elements C leaves
    unspecified (an i32 product that overflows: CUDA wraps it, the cpu computes it in 64 bits)."""
    _UNSPECIFIED[index] = mask
    try:
        yield
    finally:
        del _UNSPECIFIED[index]


class HostTwins:
    """Runs each cpu kernel call's CUDA source on the host and compares; counts what it ran and passed over."""

    def __init__(self):
        self.counts: Counter = Counter()

    def call(self, kernel, run_cpu, args: tuple) -> None:
        """Run the cpu kernel (`run_cpu()`) and, where the shim can, the host twin from the same inputs."""
        if precompile.is_recording():     # the launch is noted for an ahead compile, not run
            run_cpu()
            return
        launch = self._launch(kernel, args)
        run_cpu()
        if launch is None:
            return
        source, grid, block, copies, values = launch
        try:
            run_source(source, grid, block, values, kernel.name, in_place=True)
        except DivisionByZeroOnHost:
            self.counts["passed over: an integer division by zero (unspecified on a GPU)"] += 1
            return
        self.counts["ran"] += 1
        for k, ((_, spec), after, twin) in enumerate(zip(kernel.params, args, copies)):
            if isinstance(after, np.ndarray):
                if k in _UNSPECIFIED:   # zeros on both sides: nor do they scale the tolerance of the rest
                    after, twin = after.copy(), twin.copy()
                    after[_UNSPECIFIED[k]] = twin[_UNSPECIFIED[k]] = 0
                dtype = getattr(spec, "dtype", spec).name
                _assert_same(f"kernel '{kernel.name}', argument {k}", dtype, after, twin)

    def _launch(self, kernel, args: tuple) -> tuple | None:
        """(CUDA source, grid, block, copies of the arguments, their launch values) for the host run, or None
        (counted) where it cannot run. The source and binding are the call's, computed once."""
        if any(isinstance(a, td.DeviceArray) for a in args):
            return self._skip("device arrays")
        arrays = [a for a in args if isinstance(a, np.ndarray)]
        if any(np.shares_memory(a, b) and _view(a) != _view(b) for i, a in enumerate(arrays) for b in arrays[i + 1:]):
            return self._skip("arrays that overlap in part")
        try:
            binding = kernel.bind(args, "cuda")
            source = kernel.source(*args, target="cuda")
        except (TypeError, ValueError) as exc:
            return self._skip(f"not a cuda call ({type(exc).__name__})")
        read_only = [a for a, p in zip(args, entry_params(source)) if p.pointer and not p.writable]
        if read_only and not any(np.ascontiguousarray(a).view(np.uint8).any() for a in read_only if a.size):
            # a graph's compile run on zeros: it tests little, and host runs are slow
            return self._skip("every input zero")
        why = unsupported(source)
        if why is not None:
            return self._skip(why)
        if _ATOMICS.search(source):
            return self._skip("atomics (what they leave may depend on the threads' order)")
        if int(np.prod(binding.grid)) * int(np.prod(binding.block)) > MAX_THREADS:
            return self._skip(f"over {MAX_THREADS} threads")
        if dynamic_shared_bytes(kernel._cuda_function(binding)) > HOST_DYNAMIC_SMEM_BYTES:
            # (the cpu template's copy-A kernels, up to 384 KiB: they run on no GPU; they wrote past the buffer)
            return self._skip(f"over {HOST_DYNAMIC_SMEM_BYTES // 1024} KiB of dynamic shared memory")
        copied: dict = {}      # an array passed twice gets one copy: the host run writes the copies in place
        copies = [copied.setdefault(_view(a), a.copy()) if isinstance(a, np.ndarray) else a for a in args]
        return source, binding.grid, binding.block, copies, kernel.bind(copies, "cuda").values

    def _skip(self, why: str) -> None:
        self.counts["passed over: " + why] += 1
        return None

    def summary(self) -> list[str]:
        """Lines for the end of the session."""
        return [f"host twins: {n} {what}" for what, n in sorted(self.counts.items())]


def available() -> bool:
    """Whether host twins are on and a host compiler exists."""
    return ENABLED and host_compiler() is not None


def _view(array: np.ndarray) -> tuple:
    """What identifies the elements an array sees: its first byte, shape, strides and type."""
    return array.__array_interface__["data"][0], array.shape, array.strides, array.dtype.str


def _values(array: np.ndarray, dtype: str) -> np.ndarray:
    """The values a 16- or 8-bit float array holds, as f32 (bf16 and the 8-bit floats may come as their bits)."""
    if dtype == "bf16":
        return (np.ascontiguousarray(array).view(np.uint16).astype(np.uint32) << 16).view(np.float32)
    if dtype in FLOAT8_VALUES:
        return FLOAT8_VALUES[dtype][np.ascontiguousarray(array).view(np.uint8)]
    return array.astype(np.float32)


def _assert_same(what: str, dtype: str, cpu: np.ndarray, host: np.ndarray) -> None:
    """The host run's array `host` holds what the cpu kernel left in `cpu` (`dtype`: the parameter's type)."""
    message = f"{what}: the CUDA source on the host differs from the cpu kernel"
    cpu, host = np.asarray(cpu), np.asarray(host)       # masked arrays and other subclasses by their memory
    if dtype in RTOL_NARROW or cpu.dtype.kind == "f":
        host, cpu = (_values(host, dtype), _values(cpu, dtype)) if dtype in RTOL_NARROW else (host, cpu)
        finite = np.abs(cpu[np.isfinite(cpu)])
        atol = ATOL + SCALE * float(finite.max(initial=0.0))
        np.testing.assert_allclose(host, cpu, rtol=RTOL_NARROW.get(dtype, RTOL), atol=atol, equal_nan=True,
                                   err_msg=message)
    else:
        np.testing.assert_array_equal(host, cpu, err_msg=message)
