"""Built CUDA kernels by kernel IR: a kernel built before skips lowering and code generation.

A cubin cache hit used to redo everything but NVRTC before it could name its cubin: lowering, code
generation and hashing the source were 16 ms of a `design_matmul` hit (in a warm process); found by
its IR it takes 6.6 ms, the frontend and the key. An index entry maps the kernel's frontend IR,
spelled out by `ir.structural_text` with its source locations (they become the source's `#line`
directives), its sizes and everything else the cubin depends on (arch, fast-compile mode, NVRTC's
version, taskdsl's own code) to the cubin's key and what a launch needs besides the cubin:

    cuda/index/<ir key>.json   {"cubin": <cubin key>, "source": ..., "symbol": ..., "dynamic_shared_bytes": ...,
                                "unused_params": [...]}
    cuda/<cubin key>.cubin     the cubin (`cache.load_cubin`), keyed by its source as before

An index entry that does not parse, whose source does not hash to its cubin's key (damaged), or whose
cubin is gone, is rebuilt. A kernel whose IR cannot be spelled (a custom task mapping) is not indexed.
"""
from __future__ import annotations

import json
from pathlib import Path

from .. import ir
from . import cache
from .config import cache_dir


def compiled_cuda(fn: ir.Function, sizes: dict, arch: str, fast: bool, build, name: str):
    """The CompiledKernel of frontend IR `fn` at `sizes` for `arch`; `build()` gives its CUDA function (IR) when
    the index does not know it (`name`, the kernel's, is for NVRTC's messages)."""
    from ..backend.cuda.codegen import dynamic_shared_bytes, emit_cuda, kernel_symbol
    from .kernel import CompiledKernel
    key = _ir_key(fn, sizes, arch, fast)
    found = _load(key, arch, fast) if key is not None else None
    if found is not None:
        return found
    function = build()
    source = emit_cuda(function)
    named = ir.referenced_buffers(function.body)
    unused = frozenset(k for k, p in enumerate(function.params) if isinstance(p, ir.Buffer) and p.uid not in named)
    cubin_key = _cubin_key(source, arch, fast)
    compiled = CompiledKernel("cuda", source, _cubin(cubin_key, source, arch, name, fast), arch,
                              dynamic_shared_bytes(function), unused, kernel_symbol(function))
    if key is not None:
        record = {"cubin": cubin_key, "source": source, "symbol": compiled.symbol,
                  "dynamic_shared_bytes": compiled.dynamic_shared_bytes, "unused_params": sorted(unused)}
        cache.store(_index_path(key), json.dumps(record).encode())
    return compiled


def _cubin_key(source: str, arch: str, fast: bool) -> str:
    from ..backend.cuda.nvrtc import nvrtc_version
    # the code's fingerprint, not its version number: NVRTC's options may change while the source does not
    return cache.cache_key(source, arch, nvrtc_version(), cache.code_fingerprint(), *(("fast",) if fast else ()))


def _cubin(key: str, source: str, arch: str, name: str, fast: bool) -> bytes:
    """The cubin of `source` for `arch`, from the disk cache or freshly compiled by NVRTC (`fast`: at NVRTC's
    least optimization, under `td.fast_compile`)."""
    from .. import __version__
    from ..backend.cuda.nvrtc import compile_cubin, nvrtc_version
    binary = cache.load_cubin(key)
    if binary is None:
        binary = compile_cubin(source, arch, name, fast)
        cache.store_cubin(key, binary, arch=arch, nvrtc=nvrtc_version(), taskdsl=__version__, kernel=name,
                          fast_compile=fast)
    return binary


def _ir_key(fn: ir.Function, sizes: dict, arch: str, fast: bool) -> str | None:
    from ..backend.cuda.nvrtc import nvrtc_version
    try:
        text = ir.structural_text(fn, locations=True)
    except (ir.Unspellable, RecursionError):
        return None
    return cache.cache_key(text, repr(sorted(sizes.items())), arch, f"fast={fast}", nvrtc_version(),
                           cache.code_fingerprint())


def _index_path(key: str) -> Path:
    return cache_dir() / "cuda" / "index" / f"{key}.json"


_RECORD_TYPES = {"cubin": str, "source": str, "symbol": str, "dynamic_shared_bytes": int, "unused_params": list}


def _load(key: str, arch: str, fast: bool):
    """The indexed CompiledKernel of `key`, or None when absent or unusable (then removed). A record whose source
    does not hash to its cubin's key is damaged: its cubin would be loaded for another source."""
    from .kernel import CompiledKernel
    index = _index_path(key)
    try:
        record = json.loads(index.read_text())
        if not isinstance(record, dict) or any(type(record.get(k)) is not t for k, t in _RECORD_TYPES.items()) \
                or not all(type(k) is int for k in record["unused_params"]):
            raise ValueError("a malformed index record")
    except FileNotFoundError:
        return None
    except (OSError, ValueError):
        cache.remove(index)
        return None
    if _cubin_key(record["source"], arch, fast) != record["cubin"]:
        cache.remove(index)
        return None
    binary = cache.load_cubin(record["cubin"])
    if binary is None:
        return None     # evicted or damaged: the build that follows compiles it again and rewrites this record
    cache.touch(index)
    return CompiledKernel("cuda", record["source"], binary, arch, record["dynamic_shared_bytes"],
                          frozenset(record["unused_params"]), record["symbol"])
