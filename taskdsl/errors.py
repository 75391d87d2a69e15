"""Errors a user can hit, located at the user's source line."""
from __future__ import annotations

import linecache
from dataclasses import dataclass


@dataclass(frozen=True)
class SourceLoc:
    """A position in the user's Python file (1-based line, 0-based column); in an inlined `@td.func`, `caller` is
    where the call was."""

    file: str
    line: int
    col: int = 0
    caller: SourceLoc | None = None

    def __str__(self) -> str:
        return f"{self.file}:{self.line}:{self.col}"

    def source_line(self) -> str:
        """The text of the line, without its newline ('' when the file is unreadable)."""
        return linecache.getline(self.file, self.line).rstrip("\n")


class ConfigError(ValueError):
    """A setting taskdsl cannot work with: a TASKDSL_* environment variable or the cache folder. The message
    names the setting and what to change; command lines report it as a usage error."""


class DSLError(Exception):
    """Kernel code outside the language, reported at file:line:col with the line shown."""

    def __init__(self, message: str, loc: SourceLoc | None = None, hint: str | None = None):
        self.message, self.loc, self.hint = message, loc, hint
        super().__init__(self._format())

    def _format(self) -> str:
        if self.loc is None:
            text = self.message
        else:
            text = f"{self.loc}: {self.message}" + _shown(self.loc)
            caller = self.loc.caller
            while caller is not None:       # the calls of the @td.funcs it is inlined from, innermost first
                text += f"\n  in the @td.func called at {caller}" + _shown(caller)
                repeats, caller = _same_calls(caller)
                if repeats:                 # a recursion: one line for its repeated calls, not 32 frames
                    text += f"\n  ... called there {repeats} more time{'s' * (repeats > 1)}"
        if self.hint:
            text += f"\n{self.hint}"
        return text


def _same_calls(call: SourceLoc) -> tuple:
    """How many callers after `call` are at its very place, and the first caller that is not."""
    repeats, caller = 0, call.caller
    while caller is not None and (caller.file, caller.line, caller.col) == (call.file, call.line, call.col):
        repeats, caller = repeats + 1, caller.caller
    return repeats, caller


def _shown(loc: SourceLoc) -> str:
    """The line of `loc` with a caret under its column, indented ('' when the file is unreadable)."""
    line = loc.source_line()
    return f"\n    {line}\n    {' ' * loc.col}^" if line else ""
