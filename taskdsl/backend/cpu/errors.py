"""Turn the cpu debug checks' raw exceptions into DSLErrors at the kernel's source line."""
from __future__ import annotations

from ...errors import DSLError
from .codegen import DebugSite

_RACES = {0: "reads an element that {other} wrote",
          1: "writes an element that {other} wrote",
          2: "writes an element that {other} read",
          3: "updates an element atomically that {other} wrote",
          4: "updates an element atomically that {other} read",
          5: "reads an element that {other} updated atomically",
          6: "writes an element that {other} updated atomically"}


def debug_error(site: DebugSite, exc: Exception) -> DSLError:
    """The DSLError for a failed bounds check (IndexError) or a detected race (RuntimeError)."""
    if isinstance(exc, IndexError):
        _, dim, index, extent = exc.args
        return DSLError(f"out-of-bounds {site.access} of '{site.buffer}': index {index} on axis "
                        f"{dim - site.hidden_axes} is outside "
                        f"[0, {extent})", site.loc, "Guard the access with an 'if' or a conditional expression.")
    _, kind, element, tid, other = exc.args
    who = "several threads" if other == -1 else f"thread {other}"
    doer = "the block (a value its threads read at once, such as a loop bound)" if tid == -1 else f"thread {tid}"
    message = f"shared-memory race on '{site.buffer}' (element {element}): {doer} " + \
        _RACES[kind].format(other=who) + " with no syncthreads() in between"
    return DSLError(message, site.loc, "Add td.syncthreads() between the write and the other thread's access.")
