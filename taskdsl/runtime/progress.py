"""A small progress bar with an ETA for long work (tuning, compiling a model), on stderr.

Drawn only when stderr is a terminal (or TASKDSL_PROGRESS=1); elsewhere it stays silent so
logs and test output are not flooded. No dependency: tqdm is not needed for one line.
"""
from __future__ import annotations

import shutil
import sys
import time

from .config import env_switch


def enabled() -> bool:
    """Whether bars are drawn: $TASKDSL_PROGRESS if set, else whether stderr is a terminal."""
    return env_switch("TASKDSL_PROGRESS", sys.stderr.isatty(), "always draw them", "never")


class Progress:
    """`with Progress(total, "tuning matmul") as bar: ... bar.step(note="best 1.2 ms")`."""

    WIDTH = 24

    def __init__(self, total: int, label: str, show: bool | None = None):
        self.total, self.label = max(total, 0), label
        self.show = enabled() if show is None else show
        self.done, self.note = 0, ""
        self.start = time.perf_counter()

    def step(self, n: int = 1, note: str | None = None) -> None:
        """Mark `n` more items done, with an optional note shown after the bar."""
        self.done += n
        if note is not None:
            self.note = note
        self._draw()

    def eta(self) -> float | None:
        """Seconds left, estimated from the average time per item so far."""
        if not self.done:
            return None
        return (time.perf_counter() - self.start) / self.done * (self.total - self.done)

    def _draw(self, final: bool = False) -> None:
        if not self.show:
            return
        eta = self.eta()
        tail = f"{time.perf_counter() - self.start:.1f}s" if final else (f"ETA {eta:.0f}s" if eta is not None else "")
        # one line no wider than the terminal, padded over a longer line drawn before: a line that wrapped would
        # scroll at each redraw instead of drawing over itself
        columns = shutil.get_terminal_size((100, 24)).columns - 1
        sys.stderr.write("\r" + self._line(f"{self.done}/{self.total} {tail}", columns).ljust(columns))
        sys.stderr.write("\n" if final else "")
        sys.stderr.flush()

    def _line(self, count: str, columns: int) -> str:
        """The bar's text in `columns` characters: the note goes first, then the bar narrows, then the label."""
        label, width = self.label, self.WIDTH
        for note in (f" {self.note}" if self.note else "", ""):
            rest = f" {count}{note}"
            width = min(self.WIDTH, max(8, columns - len(label) - 3 - len(rest)))
            if len(label) + 3 + width + len(rest) <= columns:
                break
        label = label[:max(columns - 3 - width - len(rest), 0)]
        filled = width * self.done // self.total if self.total else width
        return f"{label} [{'#' * filled}{'.' * (width - filled)}]{rest}"[:columns]

    def __enter__(self) -> "Progress":
        self._draw()
        return self

    def __exit__(self, *exc) -> None:
        self._draw(final=True)
