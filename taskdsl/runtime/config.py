"""Process-wide settings: target, debug mode, fast compilation, when the cpu lands async copies, cache directory."""
from __future__ import annotations

import atexit
import ctypes
import functools
import math
import os
import shutil
import sys
import tempfile
import warnings
from pathlib import Path

import numpy as np

from ..errors import ConfigError

TARGETS = ("cpu", "cuda")
_state = {"target": None, "debug": None, "fast_compile": None, "cp_async_early": None}


def cache_dir() -> Path:
    """Where compiled artifacts live: $TASKDSL_CACHE_DIR, else ~/.cache/taskdsl, else (a home that cannot hold it)
    a temporary folder of this process. A TASKDSL_CACHE_DIR that cannot be created is a ConfigError."""
    setting = os.environ.get("TASKDSL_CACHE_DIR")
    try:
        # expanduser: a quoted "~/cache" (a unit file, a Dockerfile ENV) reaches us unexpanded
        path = Path(setting).expanduser() if setting else Path.home() / ".cache" / "taskdsl"
        path.mkdir(parents=True, exist_ok=True)
    except (OSError, RuntimeError) as e:        # RuntimeError: no home directory to expand
        reason = getattr(e, "strerror", None) or str(e)
        if not setting:
            return _scratch_cache_dir(reason)
        raise ConfigError(f"the compile cache folder {setting} cannot be used ({reason}): set TASKDSL_CACHE_DIR to "
                          "a folder taskdsl may create or write") from None
    cache_max_bytes()       # the cache's other setting: a bad one is an error at the first use, a hit too
    return path


def cache_max_bytes() -> int:
    """The size cap of the cache directory in bytes ($TASKDSL_CACHE_MAX_MB, megabytes)."""
    text = os.environ.get("TASKDSL_CACHE_MAX_MB") or "2048"
    try:
        megabytes = float(text)
    except ValueError:
        megabytes = math.nan
    if not 0 <= megabytes < math.inf:
        raise ConfigError(f"TASKDSL_CACHE_MAX_MB={text!r}: give the cache's size cap as a number of megabytes >= 0")
    return int(megabytes * 2**20)


_scratch_cache: list = []


def process_folder(prefix: str) -> Path:
    """A new temporary folder for this process only, removed at exit."""
    folder = Path(tempfile.mkdtemp(prefix=prefix))
    atexit.register(shutil.rmtree, folder, ignore_errors=True)
    return folder


def _scratch_cache_dir(reason: str) -> Path:
    """A cache folder for this process only (removed at exit), where the default one cannot be created (a read-only
    or missing home, as in some containers): kernels still compile, and a warning says so once."""
    if not _scratch_cache:
        folder = process_folder("taskdsl-cache-")
        _scratch_cache.append(folder)
        warnings.warn(f"taskdsl: cannot create the compile cache ~/.cache/taskdsl ({reason}); compiling into {folder} "
                      "for this process only. Set TASKDSL_CACHE_DIR to a writable folder to keep compiled kernels.",
                      stacklevel=3)
    return _scratch_cache[0]


@functools.cache
def gpu_status() -> tuple[bool, str]:
    """(usable, reason): whether a CUDA device can be used, and why not when it cannot."""
    driver = _driver_missing()
    if driver:      # no GPU: cuda.core's import (0.8 s, most of a small kernel's first call) is not needed to say so
        return False, driver
    try:
        from cuda.core import Device
        device = Device(0)
        device.set_current()
        return True, f"{device.name} (sm_{device.compute_capability.major}{device.compute_capability.minor})"
    except Exception as exc:  # noqa: BLE001 - any failure means no usable GPU; keep the reason
        return False, f"{type(exc).__name__}: {exc}".strip()


def _driver_missing() -> str:
    """Why the CUDA driver library cannot be loaded (as cuda.core would load it, by the system's search), or ''."""
    name = "nvcuda.dll" if sys.platform == "win32" else "libcuda.so.1"
    try:
        ctypes.CDLL(name)
    except OSError as exc:
        return f"no NVIDIA driver: {name} cannot be loaded ({exc})"
    return ""


def set_target(name: str) -> None:
    """Run kernels on 'cpu' or 'cuda' from now on (RuntimeError if 'cuda' has no usable GPU)."""
    if name not in TARGETS:
        raise ValueError(f"unknown target {name!r}; choose one of {', '.join(TARGETS)}")
    if name == "cuda":
        usable, reason = gpu_status()
        if not usable:
            raise RuntimeError(f"the cuda target needs a usable GPU, but none was found ({reason}). "
                               "Use td.set_target('cpu') to run kernels on the CPU.")
    _state["target"] = name


def get_target() -> str:
    """The current target: set_target's, else $TASKDSL_TARGET, else 'cuda' with a usable GPU, else 'cpu'."""
    if _state["target"] is not None:
        return _state["target"]
    env = environment("TASKDSL_TARGET")
    if env:
        name = env.strip().lower()
        if name not in TARGETS:
            raise ConfigError(f"TASKDSL_TARGET={env!r} is no target: set it to one of {', '.join(TARGETS)}, or unset it")
        if name == "cuda" and not gpu_status()[0]:
            raise ConfigError(f"TASKDSL_TARGET=cuda, but there is no usable GPU ({gpu_status()[1]}): set it to cpu, "
                              "or unset it")
        set_target(name)
        return _state["target"]
    return "cuda" if gpu_status()[0] else "cpu"


class target_scope:
    """Run the body with `name` as the target, then restore the previous setting (an unset one stays unset, so
    TASKDSL_TARGET is never read for it). A class, not a generator: a compiled graph's call enters one, and a
    @contextmanager took 1 us of a small graph's 11."""

    __slots__ = ("name", "previous")

    def __init__(self, name: str):
        self.name = name

    def __enter__(self) -> None:
        self.previous = _state["target"]
        set_target(self.name)

    def __exit__(self, *exc) -> None:
        _state["target"] = self.previous


def _switch(value, what: str) -> bool:
    """`value` as an on/off switch: True, False, 1 or 0 (a string such as "no" would be truthy)."""
    if isinstance(value, (bool, np.bool_)) or (isinstance(value, (int, np.integer)) and value in (0, 1)):
        return bool(value)
    raise TypeError(f"{what} takes True or False, got {value!r}")


def debug(enabled: bool = True) -> None:
    """Turn the cpu target's debug mode on or off: bounds checks and shared-memory race reports."""
    _state["debug"] = _switch(enabled, "td.debug")


@functools.cache
def environment(name: str) -> str | None:
    """The environment variable `name`, read once per process (a read costs ~1 us, and launches ask often)."""
    return os.environ.get(name)


_SWITCH = {"1": True, "true": True, "yes": True, "on": True, "0": False, "false": False, "no": False, "off": False,
           "": False}     # set but empty: off


def env_switch(name: str, default: bool, meaning: str = "on", off: str = "off", read_once: bool = False) -> bool:
    """The on/off environment variable `name`: 1 / true / yes / on or 0 / false / no / off, in any case (set but
    empty: off), `default` when unset; any other value is a ValueError saying what 1 (`meaning`) and 0 (`off`)
    do. `read_once`: read through `environment` (once per process). The one reader of TASKDSL_DEBUG,
    TASKDSL_FAST_COMPILE, TASKDSL_CP_ASYNC_EARLY, TASKDSL_FULL_TRACEBACKS, TASKDSL_PROGRESS, TASKDSL_SHARE_CODE and
    TASKDSL_TUNE."""
    text = environment(name) if read_once else os.environ.get(name)
    if text is None:
        return default
    value = _SWITCH.get(text.strip().lower())
    if value is None:
        raise ConfigError(f"{name}={text!r}: use 1 ({meaning}) or 0 ({off})")
    return value


def env_count(name: str, default: int) -> int:
    """The positive whole number in the environment variable `name` (`default` when unset or empty); a ConfigError
    for anything else (0, -1, 'x' were read as 1 or raised deep inside). The one reader of TASKDSL_COMPILE_WORKERS
    and TASKDSL_NUM_THREADS."""
    text = os.environ.get(name, "").strip()
    if not text:
        return default
    if not (text.isascii() and text.isdigit()) or int(text) < 1:
        raise ConfigError(f"{name}={text!r}: set it to a positive whole number (1, 2, ...), or unset it for the "
                          "default (the CPU count)")
    return int(text)


COUNTS = ("TASKDSL_COMPILE_WORKERS", "TASKDSL_NUM_THREADS")


def check_environment() -> None:
    """Read every TASKDSL_* setting now (but TASKDSL_TARGET, which an explicit target overrides): a bad one is one
    ConfigError before any work, not a traceback minutes into a build or a value never read and silently
    ignored. For command lines."""
    # the readers live in the layers that use them: imported here, at call time, to avoid import cycles
    from ..backend.cpu import vectors
    from ..schedule import tuner
    from . import progress
    debug_enabled(), fast_compile_enabled(), cp_async_early_enabled(), progress.enabled(), tuner.tuning_enabled()
    full_tracebacks_enabled(), share_code_enabled()
    for name in COUNTS:
        env_count(name, 1)
    cache_dir(), vectors.host()


def _flag(name: str, env: str) -> bool:
    if _state[name] is not None:
        return _state[name]
    return env_switch(env, False, read_once=True)      # launches ask


def debug_enabled() -> bool:
    """Whether debug mode is on (`td.debug(True)` or TASKDSL_DEBUG=1)."""
    return _flag("debug", "TASKDSL_DEBUG")


def fast_compile(enabled: bool = True) -> None:
    """Trade kernel speed for compile speed (prototyping, tests). cpu: no loop unrolling, so numba
    compiles large kernels 3-5x faster, which then run slower (up to several times); cuda: NVRTC at its least
    optimization (-Ofast-compile=max), about 2x faster. Kernels compiled before the switch are kept."""
    _state["fast_compile"] = _switch(enabled, "td.fast_compile")


def fast_compile_enabled() -> bool:
    """Whether fast compilation is on (`td.fast_compile(True)` or TASKDSL_FAST_COMPILE=1)."""
    return _flag("fast_compile", "TASKDSL_FAST_COMPILE")


def cp_async_early(enabled: bool = True) -> None:
    """On the cpu target, land each `cp_async` copy when it is issued, the earliest moment PTX allows, instead of at
    the wait that covers it, the latest (the default). A kernel that overwrites, by a copy, shared memory another
    thread still reads (a ring slot refilled before the barrier that ends its reads) computes the right result
    with late copies and the wrong one with early copies: run a pipeline's tests both ways."""
    _state["cp_async_early"] = _switch(enabled, "td.cp_async_early")


def share_code_enabled() -> bool:
    """Whether cpu kernels that differ only in constants share one module (`runtime.sharing`); TASKDSL_SHARE_CODE=0
    gives each its own code (a compile per shape: for comparisons)."""
    return env_switch("TASKDSL_SHARE_CODE", True, "share", "each kernel its own code", read_once=True)


def full_tracebacks_enabled() -> bool:
    """Whether a DSLError keeps the compiler's frames in its traceback (TASKDSL_FULL_TRACEBACKS=1: for reports of
    compiler bugs); by default it is raised from the kernel call, whose message already names the kernel's line."""
    return env_switch("TASKDSL_FULL_TRACEBACKS", False, "keep the compiler's frames", "raise from the call",
                      read_once=True)


def cp_async_early_enabled() -> bool:
    """Whether the cpu target lands async copies at issue (`td.cp_async_early(True)` or TASKDSL_CP_ASYNC_EARLY=1)."""
    return _flag("cp_async_early", "TASKDSL_CP_ASYNC_EARLY")
