"""Errors a user can hit, located at the user's source line."""
from __future__ import annotations

import linecache
from dataclasses import dataclass


@dataclass(frozen=True)
class SourceLoc:
    """A position in the user's Python file (1-based line, 0-based column)."""

    file: str
    line: int
    col: int = 0

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
            text = f"{self.loc}: {self.message}"
            line = self.loc.source_line()
            if line:
                text += f"\n    {line}\n    {' ' * self.loc.col}^"
        if self.hint:
            text += f"\n{self.hint}"
        return text
