"""Import a generated cpu module from a file, so numba's `cache=True` keeps its machine code."""
from __future__ import annotations

import functools
import hashlib
import importlib.util
import sys
import types
from pathlib import Path


@functools.cache
def compiler_fingerprint() -> str:
    """What besides a module's text decides its machine code: numba, the support helpers (with the rounding they
    inline from `ir.types`: an edit of it ran kernels cached with the old one), the vector width and the dot4
    instructions (`vectors.dot4_lanes`)."""
    import inspect

    import numba

    from ...ir.types import narrow_float_bits
    from . import support, support_calls, vectors
    text = Path(support.__file__).read_text() + Path(support_calls.__file__).read_text() + \
        inspect.getsource(narrow_float_bits)
    host = f"vectors={vectors.host().bits} dot4={sorted(vectors.dot4_lanes())}"
    return hashlib.sha256(f"{text}\nnumba={numba.__version__}\n{host}".encode()).hexdigest()


def load_module_function(path: Path, name: str):
    """The function `name` of the Python module file `path` (imported once per process)."""
    module_name = f"taskdsl_cpu_{path.stem}"
    module = sys.modules.get(module_name)
    if module is None:
        spec = importlib.util.spec_from_file_location(module_name, path)
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        sys.modules[module_name] = module
    return getattr(module, name)      # (compiled through `parallel.compiled`: its cache is best effort there)


APART = "_apart"      # the suffix of an apart twin's name


def apart_twin(dispatcher):
    """`dispatcher`'s kernel for calls whose written arrays overlap no other argument: the same function under
    its own name (so numba caches it apart), compiled by `support.ApartKernelCompiler` (made once per kernel)."""
    twin = getattr(dispatcher, "_taskdsl_apart", None)
    if twin is None:
        from numba import njit
        from .support import ApartKernelCompiler
        fn = dispatcher.py_func
        name = fn.__name__ + APART
        code = fn.__code__.replace(co_name=name, co_qualname=name)
        copy = types.FunctionType(code, fn.__globals__, name, fn.__defaults__, fn.__closure__)
        copy.__qualname__, copy.__module__ = name, fn.__module__
        options = {k: v for k, v in dispatcher.targetoptions.items() if k != "nopython"}    # (njit's own)
        twin = njit(cache=True, pipeline_class=ApartKernelCompiler, **options)(copy)
        dispatcher._taskdsl_apart = twin
    return twin
