"""CUDA C++ -> cubin with NVRTC (through cuda.core's Program); needs no GPU and no toolkit."""
from __future__ import annotations

import functools
import re
import threading

from ...errors import DSLError, SourceLoc

_ERROR_LINE = re.compile(r'^(?P<file>.+?)\((?P<line>\d+)\): (?:catastrophic )?error: (?P<msg>.*)$', re.M)


def normalize_arch(arch) -> str:
    """'sm_90' from 'sm_90', '90', 90 or (9, 0); ValueError for anything else."""
    if isinstance(arch, tuple) and len(arch) == 2:
        arch = f"{arch[0]}{arch[1]}"
    text = str(arch).lower().removeprefix("sm_").removeprefix("compute_")
    if not re.fullmatch(r"\d{2,3}[af]?", text):
        raise ValueError(f"unknown CUDA architecture {arch!r}; use a form like 'sm_90' or 'sm_80'")
    return f"sm_{text}"


@functools.cache
def supported_arch(arch) -> str:
    """`normalize_arch(arch)`, or a ValueError naming the architectures this NVRTC compiles for."""
    name = normalize_arch(arch)
    from cuda.bindings import nvrtc
    _, numbers = nvrtc.nvrtcGetSupportedArchs()
    if int(re.match(r"sm_(\d+)", name).group(1)) not in numbers:
        raise ValueError(f"this NVRTC ({nvrtc_version()}) cannot compile for {name}; it compiles for "
                         f"{', '.join(f'sm_{n}' for n in numbers)}")
    return name


@functools.cache
def nvrtc_version() -> str:
    """The NVRTC build, e.g. '13.5.37' (part of every compile-cache key).

    Read from the wheel's dist-info name (a cache hit must not pay for loading the NVRTC library,
    nor for importlib.metadata's scan of every installed package).
    """
    import importlib.util
    from pathlib import Path
    spec = importlib.util.find_spec("nvidia")
    for folder in (spec.submodule_search_locations or []) if spec else []:
        for info in sorted(Path(folder).parent.glob("nvidia_cuda_nvrtc-*.dist-info")):
            return info.name.removeprefix("nvidia_cuda_nvrtc-").removesuffix(".dist-info")
    from importlib import metadata
    try:
        return metadata.version("nvidia-cuda-nvrtc")
    except metadata.PackageNotFoundError:   # NVRTC from a CUDA toolkit instead of the wheel
        from cuda.bindings import nvrtc
        _, major, minor = nvrtc.nvrtcVersion()
        return f"{major}.{minor}"


@functools.cache
def _cuda_include_dir() -> str:
    """The CUDA runtime headers (cuda_fp16.h, ...) shipped by the nvidia-cuda-runtime wheel."""
    from cuda.pathfinder import find_nvidia_header_directory
    path = find_nvidia_header_directory("cudart")
    if path is None:
        raise RuntimeError("f16/bf16 kernels need the CUDA headers of the 'nvidia-cuda-runtime' package: "
                           "pip install 'nvidia-cuda-runtime==13.*'")
    return path


def _include_paths(source: str) -> list | None:
    """NVRTC's include paths for `source`: the CUDA headers' folder where it includes one of them, else none (the
    headers' lookup fails without the nvidia-cuda-runtime wheel, which f32 kernels do not need)."""
    return [_cuda_include_dir()] if "#include <cuda_" in source else None


_IMPORTING = threading.Lock()


def _program_api() -> tuple:
    """cuda.core's (Program, ProgramOptions), imported under a lock: two threads importing cuda.core for the first
    time at once (a tuner's compile pool, off a GPU) had one get "cannot import name 'Program'"."""
    with _IMPORTING:
        from cuda.core import Program, ProgramOptions
    return Program, ProgramOptions


def compile_cubin(source: str, arch: str = "sm_90", name: str = "kernel", fast: bool = False) -> bytes:
    """Compile a CUDA C++ translation unit to a cubin for `arch` (`fast`: least optimization, for checks).

    A compile error becomes a DSLError at the Python line named by the failing line's
    `#line` directive, with the whole NVRTC log attached.
    """
    Program, ProgramOptions = _program_api()
    options = ProgramOptions(arch=supported_arch(arch), std="c++17", lineinfo=True, name=f"{name}.cu",
                             include_path=_include_paths(source), ofast_compile="max" if fast else None)
    try:
        return bytes(Program(source, code_type="c++", options=options).compile("cubin").code)
    except Exception as exc:  # noqa: BLE001 - cuda.core raises its own NVRTCError type
        log = str(exc).replace("\x00", "")      # NVRTC's log ends in its C string's NUL
        if "NVRTC_ERROR_COMPILATION" not in log and "error" not in log:
            raise
        raise _compile_error(log) from None


def compile_ptx(source: str, arch: str = "sm_90", name: str = "kernel", fast: bool = False) -> str:
    """Compile a CUDA C++ translation unit to PTX for `arch`: NVRTC's front end and NVVM without ptxas, about a
    quarter of a cubin's time in fast mode; inline PTX is left unassembled. Errors as `compile_cubin`'s.

    Through cuda.bindings: cuda.core's Program asks the driver's version before it returns PTX, and there may be
    no driver.
    """
    from cuda.bindings import nvrtc
    virtual = "compute_" + supported_arch(arch).removeprefix("sm_")
    options = [f"-arch={virtual}", "--std=c++17", "--generate-line-info"] + (["--Ofast-compile=max"] if fast else [])
    options += [f"--include-path={path}" for path in _include_paths(source) or ()]
    _, program = nvrtc.nvrtcCreateProgram(source.encode(), f"{name}.cu".encode(), 0, [], [])
    try:
        status, = nvrtc.nvrtcCompileProgram(program, len(options), [o.encode() for o in options])
        if status != nvrtc.nvrtcResult.NVRTC_SUCCESS:
            _, size = nvrtc.nvrtcGetProgramLogSize(program)
            log = b" " * size
            nvrtc.nvrtcGetProgramLog(program, log)
            raise _compile_error(log.decode(errors="replace").replace("\x00", ""))
        _, size = nvrtc.nvrtcGetPTXSize(program)
        ptx = b" " * size
        nvrtc.nvrtcGetPTX(program, ptx)
        return ptx.decode().rstrip("\x00")
    finally:
        nvrtc.nvrtcDestroyProgram(program)


def _compile_error(log: str) -> DSLError:
    """A DSLError at the Python line named by the `#line` directive of NVRTC's first error, the log attached."""
    match = _ERROR_LINE.search(log)
    loc = SourceLoc(match["file"], int(match["line"])) if match else None
    message = f"CUDA compilation failed: {match['msg'].strip()}" if match else "CUDA compilation failed"
    return DSLError(message, loc, "NVRTC log:\n" + log.strip())


_RESOURCES = {"registers": r"Used (\d+) registers", "stack_bytes": r"(\d+) bytes stack frame",
              "spill_store_bytes": r"(\d+) bytes spill stores", "spill_load_bytes": r"(\d+) bytes spill loads",
              "shared_bytes": r"(\d+) bytes smem"}


def resource_usage(source: str, arch: str = "sm_90") -> dict:
    """ptxas's report on each kernel of `source`: {kernel name: {'registers': 128, 'stack_bytes': 0,
    'spill_store_bytes': 0, 'spill_load_bytes': 0, 'shared_bytes': 20736}} (a key is missing where ptxas
    omits it).

    A stack frame without spills is an array the code indexes at run time: in local memory, not registers.
    """
    import io

    Program, ProgramOptions = _program_api()
    options = ProgramOptions(arch=supported_arch(arch), std="c++17", include_path=_include_paths(source),
                             ptxas_options=["-v"])
    log = io.StringIO()
    Program(source, code_type="c++", options=options).compile("cubin", logs=log)
    reports = {}
    for part in re.split(r"Compiling entry function '", log.getvalue())[1:]:
        name = part.split("'", 1)[0]
        reports[name] = {key: int(m.group(1)) for key, pattern in _RESOURCES.items()
                         if (m := re.search(pattern, part))}
    return reports


def combine_sources(sources: list) -> str:
    """One translation unit holding several generated kernels (each in its own namespace).

    `#include`s are hoisted to the top; the `extern "C"` kernel names must differ. Compiling
    many kernels in one NVRTC call parses the headers once, which is what makes checking a
    whole schedule space (hundreds of kernels) cheap.
    """
    includes, bodies = [], []
    for k, source in enumerate(sources):
        lines = source.splitlines()
        includes += [line for line in lines if line.startswith("#include") and line not in includes]
        body = "\n".join(line for line in lines if not line.startswith("#include"))
        bodies.append(f"namespace td_unit_{k} {{\n{body}\n}}")
    return "\n".join(includes + bodies) + "\n"
