"""taskdsl: an embedded Python DSL for tensor programs in the task-mapping paradigm (Hidet).

Write kernels with `@td.kernel`, schedule their work with `spatial(...)` / `repeat(...)`
task mappings, and run them on the cpu target (numba) or compile them to CUDA (NVRTC).
"""
from .backend.cpu import numba_settings  # noqa: F401 - first of all: settings numba reads at its import
from .backend.cpu import numba_cache  # noqa: F401 - then: numba's cache folder for the package's functions
from .compute import Tensor, compute, in_place, placeholder, reduce, size_var
from .errors import ConfigError, DSLError, SourceLoc
from .frontend.decorators import func, kernel
from .ir.types import bf16, boolean, f8e4m3, f8e5m2, f16, f32, f64, i8, i16, i32, i64, u8, u16, u32, u64
from .lang import *  # noqa: F401,F403 - the kernel language: threadIdx, shared, syncthreads, exp, ...
from .lang import cdiv, warp_size
from .mapping import TaskMapping, repeat, spatial
from .runtime.config import cp_async_early, debug, fast_compile, get_target, gpu_status, set_target
from .runtime.device_array import DeviceArray, synchronize, to_device
from .runtime.kernel import CompiledKernel, Kernel
from .schedule import FusionError, Op, fuse, op

__version__ = "0.1.0"
