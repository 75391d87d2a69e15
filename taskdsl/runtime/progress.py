"""A small progress bar with an ETA for long work (tuning, compiling a model), on stderr.

Drawn only when stderr is a terminal (or TASKDSL_PROGRESS=1); elsewhere it stays silent so
logs and test output are not flooded. No dependency: tqdm is not needed for one line.
"""
from __future__ import annotations

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
        filled = self.WIDTH * self.done // self.total if self.total else self.WIDTH
        eta = self.eta()
        tail = f"{time.perf_counter() - self.start:.1f}s" if final else (f"ETA {eta:.0f}s" if eta is not None else "")
        sys.stderr.write(f"\r{self.label} [{'#' * filled}{'.' * (self.WIDTH - filled)}] {self.done}/{self.total} "
                         f"{tail} {self.note}".ljust(100)[:120])
        sys.stderr.write("\n" if final else "")
        sys.stderr.flush()

    def __enter__(self) -> "Progress":
        self._draw()
        return self

    def __exit__(self, *exc) -> None:
        self._draw(final=True)
