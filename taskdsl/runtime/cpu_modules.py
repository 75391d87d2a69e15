"""Generated cpu modules by kernel IR: a kernel generated before skips lowering and code generation.

`lower_for_cpu` and `emit_python` take ~0.15 s for a fused convolution (its register tile unrolled),
and a graph has dozens of them: 9 s of each ResNet-50 start with numba's machine code all cached.
An index entry maps the kernel's frontend IR, spelled out by `ir.structural_text` (or, where a custom
task mapping cannot be spelled, its IR after `passes.lower`), with everything else the generated text
depends on (debug and fast-compile modes, early async copies, the compiler's fingerprint, taskdsl's own code) to the
module's cache key and the few facts the runtime needs besides its text:

    cpu/<ir key>.json      {"module": <module key>, "entry": ..., "parallel": ..., "flat": ..., "opt_level": ...,
                            "outlined": [[<module key>, <entry>, <opt_level>], ...]}
    cpu/k_<module key>.py  the generated module (`cache.cpu_module`), and one per outlined function

An outlined function (`passes.outline`) is a module of its own, shared by every kernel that calls it: compiled once
(`outlined_addresses`), its address goes to the kernels in their `launch_ints`.

Identical kernels built twice in one process (a model's repeated layers) share one generation too.
An index entry that does not parse, whose module is gone, or whose module's text does not hash to its
name (damaged), is regenerated. Debug-mode sources are
not indexed: their error sites point into the user's source file.
"""
from __future__ import annotations

import json
from pathlib import Path

from .. import ir
from . import cache
from .config import cache_dir

_generated: dict = {}       # (cache directory, ir key) -> (CpuSource, module path), this process's
GENERATED_KEPT = 256        # entries of `_generated` (forgotten all at once past this: the disk index remains)


def cpu_module(fn: ir.Function, lowered, debug: bool, fast: bool, early_copies: bool = False):
    """(the CpuSource, the path of its module file) of the kernel whose frontend IR is `fn`; `lowered()` gives
    its IR as `passes.lower` leaves it, for a kernel the index does not know; `early_copies`: cp_async copies
    land at issue (`td.cp_async_early`)."""
    from ..backend.cpu.codegen import emit_python
    from ..backend.cpu.compile import compiler_fingerprint
    from ..passes import lower_for_cpu
    key = None if debug else _ir_key(fn, lowered, fast, early_copies)
    if key is not None:
        found = _generated.get((cache_dir(), key)) or _load(key)
        if found is not None:
            _keep(key, found)
            return found
    src = emit_python(lower_for_cpu(lowered(), debug, unroll=not fast, early_copies=early_copies), debug, fast)
    path = _written(src)
    for o in src.outlined:
        _written(o)
    if key is not None:
        record = {"module": _module_key(src), "entry": src.entry, "parallel": src.parallel, "flat": src.flat,
                  "opt_level": src.opt_level, "outlined": [[_module_key(o), o.entry, o.opt_level]
                                                           for o in src.outlined]}
        cache.store(_index_path(key), json.dumps(record).encode())
        _keep(key, (src, path))
    return src, path


def _module_key(src) -> str:
    from ..backend.cpu.compile import compiler_fingerprint
    return cache.cache_key(src.text, compiler_fingerprint())


def _written(src) -> Path:
    """The module file of `src` (written, or found, in the cache)."""
    return cache.cpu_module(_module_key(src), src.text)


def outlined_jobs(src) -> list:
    """The `precompile.Job` of each of `src`'s outlined functions: its `SIGNATURE`, and the one-block launch's
    `launch_ints` and block range."""
    import numpy as np
    from numba import from_dtype, types

    from ..backend.cpu.compile import load_module_function
    from ..backend.cpu.precompile import Job
    jobs = []
    for o in src.outlined:
        _, path = entry_function(o, _written(o))     # (written again where evicted since)
        params = tuple(types.Array(from_dtype(np.dtype(n[:-2])), 1, "C") if n.endswith("[]")
                       else from_dtype(np.dtype(n)) for n in load_module_function(path, "SIGNATURE"))
        jobs.append(Job(str(path), o.entry, (*params, types.Array(types.int64, 1, "C"), types.int64, types.int64),
                        o.opt_level))
    return jobs


_addresses: dict = {}       # Job -> the outlined function's machine code, in this process


def outlined_addresses(src) -> tuple:
    """The addresses of `src`'s outlined functions' machine code, compiled (or loaded from numba's cache) once per
    process."""
    from ..backend.cpu.launch import compiler_settings
    from ..backend.cpu.parallel import entry_address
    found = []
    for job in outlined_jobs(src):
        address = _addresses.get(job)
        if address is None:
            with compiler_settings(job.opt_level):
                address = _addresses[job] = entry_address(job.function(), job.signature)
        found.append(address)
    return tuple(found)


def entry_function(src, path: Path):
    """(the kernel's entry function, the module path it came from): a module another process evicted or cleared
    between its lookup and this import is written again, in this process's own folder, which nothing else clears."""
    from ..backend.cpu.compile import load_module_function
    try:
        return load_module_function(path, src.entry), path
    except FileNotFoundError:
        path = cache.scratch_module(path.stem.removeprefix("k_"), src.text)
        return load_module_function(path, src.entry), path


def _keep(key: str, found: tuple) -> None:
    """Remember `found` for this process (a program building thousands of kernels keeps a bounded number)."""
    if len(_generated) >= GENERATED_KEPT:
        _generated.clear()
    _generated[cache_dir(), key] = found


def _ir_key(fn: ir.Function, lowered, fast: bool, early_copies: bool) -> str | None:
    from ..backend.cpu.compile import compiler_fingerprint
    try:
        text = "frontend:" + ir.structural_text(fn)
    except (ir.Unspellable, RecursionError):
        try:
            text = "lowered:" + ir.structural_text(lowered())
        except (ir.Unspellable, RecursionError):
            return None
    settings = f"fast={fast}" + (" early_copies" if early_copies else "")    # unchanged keys for the default
    return cache.cache_key(text, settings, compiler_fingerprint(), cache.code_fingerprint())


def _index_path(key: str) -> Path:
    return cache_dir() / "cpu" / f"{key}.json"


_RECORD_TYPES = {"module": str, "entry": str, "parallel": bool, "flat": bool, "opt_level": int, "outlined": list}


def _load(key: str):
    """The indexed (CpuSource, module path) of `key`, or None when absent or unusable (then removed). A module
    whose text does not hash to its name (damaged) is removed too: it would import, and compute something else."""
    from ..backend.cpu.codegen import CpuSource
    from ..backend.cpu.compile import compiler_fingerprint
    index = _index_path(key)
    try:
        record = json.loads(index.read_text())
        if not isinstance(record, dict) or any(type(record.get(k)) is not t for k, t in _RECORD_TYPES.items()):
            raise ValueError("a malformed index record")
        modules = [(record["module"], record["entry"], record["opt_level"]), *map(tuple, record["outlined"])]
        paths = [cache_dir() / "cpu" / f"k_{module}.py" for module, _, _ in modules]
        texts = [p.read_text() for p in paths]
    except FileNotFoundError:
        return None
    except (OSError, ValueError, TypeError):
        cache.remove(index)
        return None
    for (module, _, _), path, text in zip(modules, paths, texts):
        if cache.cache_key(text, compiler_fingerprint()) != module:
            cache.remove(index, path)
            return None
    for path in paths:
        cache.touch(path)
    cache.touch(index)      # its own entry: the eviction would take it first, and the kernel be generated again
    outlined = tuple(CpuSource(text, entry, [], False, True, opt_level)
                     for (_, entry, opt_level), text in zip(modules[1:], texts[1:]))
    return CpuSource(texts[0], record["entry"], [], record["parallel"], record["flat"], record["opt_level"],
                     outlined), paths[0]
