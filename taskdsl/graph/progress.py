"""A one-line progress bar on stderr for compiling big graphs, drawn only when stderr is a terminal."""
from __future__ import annotations

import sys
import time

MIN_STEPS = 20       # smaller graphs compile quickly: no bar


class Progress:
    """`bar = Progress(total, "compiling"); bar.step(note); bar.close()`; silent unless stderr is a tty."""

    WIDTH = 30

    def __init__(self, total: int, label: str):
        self.total, self.label, self.done = total, label, 0
        self.show = total >= MIN_STEPS and sys.stderr.isatty()
        self.start = time.perf_counter()

    def step(self, note: str = "") -> None:
        """One more item done; `note` says which."""
        self.done += 1
        if self.show:
            filled = self.WIDTH * self.done // max(self.total, 1)
            elapsed = time.perf_counter() - self.start
            eta = elapsed / self.done * (self.total - self.done)
            sys.stderr.write(f"\r{self.label} [{'#' * filled}{'.' * (self.WIDTH - filled)}] "
                             f"{self.done}/{self.total} ETA {eta:.0f}s {note}"[:110].ljust(110))
            sys.stderr.flush()

    def close(self) -> None:
        """End the bar's line (with the total time)."""
        if self.show:
            sys.stderr.write(f"\r{self.label}: {self.total} operators in {time.perf_counter() - self.start:.1f}s"
                             .ljust(110) + "\n")
            sys.stderr.flush()
