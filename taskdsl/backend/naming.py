"""Unique, valid identifiers for IR variables and buffers in generated source."""
from __future__ import annotations

import keyword
import re

# C++20's keywords and alternative tokens (`xor`, `compl`, ...), which NVRTC reads as C++: no variable, buffer or kernel
# of generated CUDA may take one as its name
CPP_KEYWORDS = frozenset("""
    alignas alignof and and_eq asm auto bitand bitor bool break case catch char char8_t char16_t char32_t class compl
    concept const consteval constexpr constinit const_cast continue co_await co_return co_yield decltype default delete
    do double dynamic_cast else enum explicit export extern false float for friend goto if inline int long mutable
    namespace new noexcept not not_eq nullptr operator or or_eq private protected public register reinterpret_cast
    requires return short signed sizeof static static_assert static_cast struct switch template this thread_local
    throw true try typedef typeid typename union unsigned using virtual void volatile wchar_t while xor xor_eq""".split())
# macros every NVRTC program has (a variable named NULL became `int 0 = ...`)
CPP_MACROS = frozenset({"NULL"})
# names generated code may not use: Python's keywords and builtins it calls, C++'s keywords and macros
_RESERVED = set(keyword.kwlist) | CPP_KEYWORDS | CPP_MACROS | {"np", "math", "range", "prange", "max", "min", "abs"}


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
