"""Unique, valid identifiers for IR variables and buffers in generated source."""
from __future__ import annotations

import keyword
import re

# names generated code may not use: Python's keywords and builtins it calls, C++'s keywords and types
_RESERVED = set(keyword.kwlist) | {
    "int", "float", "double", "char", "bool", "np", "math", "range", "prange", "max", "min", "abs",
    "auto", "case", "catch", "const", "default", "delete", "do", "enum", "extern", "friend", "goto", "inline",
    "long", "namespace", "new", "nullptr", "operator", "private", "protected", "public", "register", "short",
    "signed", "sizeof", "static", "struct", "switch", "template", "this", "throw", "true", "false", "try",
    "typedef", "typename", "union", "unsigned", "virtual", "void", "volatile"}


def identifier(name: str) -> str:
    """`name` with every character outside [A-Za-z0-9_] replaced by '_', and a leading digit prefixed (C++ and
    Python accept the result)."""
    text = re.sub(r"[^0-9A-Za-z_]", "_", name)
    return f"v{text}" if text[:1].isdigit() else text


class NameTable:
    """Maps IR objects (by uid) to distinct identifiers derived from their names."""

    def __init__(self, reserved=()):
        self.names: dict = {}
        self.used: set = set(reserved) | _RESERVED

    def __call__(self, obj) -> str:
        return self.derived(obj.uid, obj.name)

    def derived(self, key, name: str) -> str:
        """The identifier for `key` (an object's uid, or any hashable the generator makes up), from `name`.

        Names a generator derives (`x_t` for the thread array of `x`, say) come from here too, so
        they cannot collide with a user's variable of the same spelling.
        """
        if key not in self.names:
            base = identifier(name).lstrip("_") or "v"
            candidate, n = base, 0
            while candidate in self.used:
                n += 1
                candidate = f"{base}_{n}"
            self.used.add(candidate)
            self.names[key] = candidate
        return self.names[key]
