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
            calls, caller = [], self.loc.caller
            while caller is not None:       # the calls of the @td.funcs it is inlined from, innermost first
                calls.append(caller)
                caller = caller.caller
            k = 0
            while k < len(calls):           # a recursion: its calls once and how often they repeat, not 32 frames
                period, repeats = _repeated_calls(calls, k)
                for call in calls[k:k + period]:
                    text += f"\n  in the @td.func called at {call}" + _shown(call)
                if repeats:
                    what = "called there" if period == 1 else f"the {period} calls above repeat"
                    text += f"\n  ... {what} {repeats} more time{'s' * (repeats > 1)}"
                k += period * (repeats + 1)
        if self.hint:
            text += f"\n{self.hint}"
        return text


def _repeated_calls(calls: list, start: int) -> tuple:
    """(period, repeats): the shortest run of calls from `start` that follows itself at once (a recursion through
    `period` functions), and how many more times it does; (1, 0) where none does."""
    places = [(c.file, c.line, c.col) for c in calls]
    for period in range(1, (len(calls) - start) // 2 + 1):
        run, repeats = places[start:start + period], 0
        while places[start + period * (repeats + 1):start + period * (repeats + 2)] == run:
            repeats += 1
        if repeats:
            return period, repeats
    return 1, 0


def _shown(loc: SourceLoc) -> str:
    """The line of `loc` with a caret under its column, indented ('' when the file is unreadable)."""
    line = loc.source_line()
    return f"\n    {line}\n    {' ' * loc.col}^" if line else ""
