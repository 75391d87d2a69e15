"""Unique, valid identifiers for IR variables and buffers in generated source."""
from __future__ import annotations

import re

_RESERVED = {"int", "float", "double", "char", "bool", "np", "math", "range", "prange", "max", "min", "abs",
             "and", "or", "not", "if", "else", "for", "while", "in", "is", "def", "return", "lambda", "None",
             "True", "False", "pass", "break", "continue", "class", "import", "from", "global", "with"}


class NameTable:
    """Maps IR objects (by uid) to distinct identifiers derived from their names."""

    def __init__(self, reserved=()):
        self.names: dict = {}
        self.used: set = set(reserved) | _RESERVED

    def __call__(self, obj) -> str:
        if obj.uid not in self.names:
            base = re.sub(r"\W", "_", obj.name).lstrip("_") or "v"
            candidate, n = base, 0
            while candidate in self.used:
                n += 1
                candidate = f"{base}_{n}"
            self.used.add(candidate)
            self.names[obj.uid] = candidate
        return self.names[obj.uid]
