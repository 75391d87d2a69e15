"""The module-level names a kernel was built with, so that a call after one is rebound builds it again.

A kernel body's globals are compile-time values (a helper `@td.func`, a tile size), but Python reads a
function's globals at each call: in a notebook, running a cell again that redefines a helper or changes a
constant must change what the next call computes, as it would for a Python function. The translator notes
each global it reads with its value; a call checks them by identity (a few hundred nanoseconds for a dozen
names) and, where one was rebound or deleted, forgets what was built from them.

Not noted, as never rebound in practice: modules, and the DSL's own names (`threadIdx`, `f32`, `spatial`,
...) bound to taskdsl's objects. Not seen: a value changed in place (an element of a global list, an
attribute of a global object): rebind the name instead.
"""
from __future__ import annotations

import operator
import types

_MISSING = object()


def _is_fixed(name: str, value) -> bool:
    """Whether a global is one no program rebinds: a module, or one of taskdsl's own names."""
    import taskdsl
    return isinstance(value, types.ModuleType) or getattr(taskdsl, name, _MISSING) is value


class GlobalReads:
    """(namespace, name) -> the value a build read; `rebound()` says whether any differs now."""

    def __init__(self):
        self.noted: dict = {}           # (id(namespace), name) -> (namespace, name, value)
        self._checks: list | None = []  # per namespace: (namespace, a getter of the names' values, the values)

    def note(self, namespace: dict, name: str, value) -> None:
        """Remember that a build read global `name` of `namespace` as `value`."""
        key = (id(namespace), name)
        known = self.noted.get(key)
        if (known is None or known[2] is not value) and not _is_fixed(name, value):
            self.noted[key] = (namespace, name, value)
            self._checks = None

    def note_code(self, fn) -> None:
        """Remember the globals Python function `fn` (a grid or block callable) may read, with their values now."""
        namespace = getattr(fn, "__globals__", None)
        for name in getattr(getattr(fn, "__code__", None), "co_names", ()):
            if namespace is not None and name in namespace:
                self.note(namespace, name, namespace[name])

    def rebound(self) -> bool:
        """Whether a noted name is bound to another object now, or was deleted."""
        if self._checks is None:
            groups: dict = {}
            for namespace, name, value in self.noted.values():
                names, values = groups.setdefault(id(namespace), (namespace, [], []))[1:]
                names.append(name)
                values.append(value)
            self._checks = [(namespace, operator.itemgetter(*names, names[0]), tuple(values) + (values[0],))
                            for namespace, names, values in groups.values()]   # twice the first: always a tuple
        for namespace, get, values in self._checks:
            try:
                if not all(map(operator.is_, get(namespace), values)):
                    return True
            except KeyError:
                return True
        return False

    def clear(self) -> None:
        """Forget every noted name (what was built from them is forgotten too)."""
        self.noted.clear()
        self._checks = []
