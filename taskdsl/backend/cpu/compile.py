"""Load generated cpu modules from the cache directory, so numba caches their machine code."""
from __future__ import annotations

import functools
import hashlib
import importlib.util
import os
import sys
import tempfile
from pathlib import Path

from ...runtime.config import cache_dir
from .codegen import CpuSource


@functools.cache
def _support_fingerprint() -> str:
    """numba caches each module by its own text only, but generated code inlines the support helpers."""
    import numba
    from . import support
    text = Path(support.__file__).read_text()
    return hashlib.sha256(f"{text}\nnumba={numba.__version__}".encode()).hexdigest()


def load_cpu_kernel(src: CpuSource):
    """The numba dispatcher of a generated module (written once, atomically, keyed by its text)."""
    key = hashlib.sha256(f"{src.text}\n{_support_fingerprint()}".encode()).hexdigest()[:24]
    folder = cache_dir() / "cpu"
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"k_{key}.py"
    if not path.exists() or path.read_text() != src.text:
        fd, tmp = tempfile.mkstemp(dir=folder, suffix=".tmp")
        with os.fdopen(fd, "w") as f:
            f.write(src.text)
        os.replace(tmp, path)
    module_name = f"taskdsl_cpu_{key}"
    module = sys.modules.get(module_name)
    if module is None:
        spec = importlib.util.spec_from_file_location(module_name, path)
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        sys.modules[module_name] = module
    return getattr(module, src.entry)
