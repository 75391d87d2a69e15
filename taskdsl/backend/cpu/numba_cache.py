"""Where numba keeps the machine code of taskdsl's own numba functions (the launchers of `parallel.py`, one per
tuple of argument types; the helpers of `support.py`): in taskdsl's cache folder, under `numba/`, where `python -m
taskdsl cache` counts, caps and clears it, not beside the package's source (an installed package's folder, which
held 76 MB of launchers after a few model runs). Registered when this module is imported, before the functions
are decorated: numba picks a function's cache folder when its dispatcher is made. The generated modules' machine
code stays beside them (`cpu/__pycache__`), where numba would put it, also when $NUMBA_CACHE_DIR points elsewhere:
there the cap would not count it, nor `clear` remove it."""
from __future__ import annotations

import functools
import os

from numba.core import caching

from ...errors import ConfigError
from ...runtime.config import cache_dir

PACKAGE = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))     # .../taskdsl
# package files whose functions numba-compiled helpers of other files inline (support.py's f16/bf16 conversions,
# ir/types.py's rounding): numba checks a function's own file only, and kept helpers cached with an old rounding
INLINED_FROM = ("ir/types.py",)


class TaskdslCacheLocator(caching.UserProvidedCacheLocator):
    """numba's locator for a function of the taskdsl package, `cache_dir()/numba/<its folder in the package>`, and
    for one of a generated module, `cache_dir()/cpu/__pycache__`."""

    def __init__(self, py_func, py_file):
        self._py_file = py_file
        self._lineno = py_func.__code__.co_firstlineno
        folder = os.path.dirname(os.path.abspath(py_file))
        self._generated = _generated(py_file)
        if self._generated:
            self._cache_path = os.path.join(folder, "__pycache__")
        else:
            self._cache_path = os.path.join(str(cache_dir()), "numba",
                                            os.path.relpath(folder, PACKAGE).replace(os.sep, "."))

    def get_source_stamp(self):
        """The stamp of the function's file, and for the package's, of the files it may inline from (`INLINED_FROM`;
        a generated module's name hashes the helpers it calls, with what they inline)."""
        stamp = super().get_source_stamp()
        return stamp if self._generated else (stamp, _inlined_stamps())

    @classmethod
    def from_function(cls, py_func, py_file):
        try:
            if not (os.path.abspath(py_file).startswith(PACKAGE + os.sep) or _generated(py_file)):
                return None         # the user's numba functions
            return super(caching.UserProvidedCacheLocator, cls).from_function(py_func, py_file)
        except ConfigError:         # TASKDSL_CACHE_DIR unusable: numba's own place; the first cache use says why
            return None


def _generated(py_file: str) -> bool:
    """Whether `py_file` is a generated module in the cache's `cpu/` folder."""
    return os.path.dirname(os.path.abspath(py_file)) == os.path.abspath(cache_dir() / "cpu")


@functools.cache
def _inlined_stamps() -> tuple:
    """(modification time, size) of each `INLINED_FROM` file, read once per process."""
    stamps = []
    for name in INLINED_FROM:
        st = os.stat(os.path.join(PACKAGE, name))
        stamps.append((st.st_mtime, st.st_size))
    return tuple(stamps)


if TaskdslCacheLocator not in caching.CacheImpl._locator_classes:
    caching.CacheImpl._locator_classes.insert(0, TaskdslCacheLocator)
