"""Memoized call typing while kernels compile (`backend/cpu/call_types.py`)."""
import operator

import numpy as np
import pytest
from numba import njit, types
from numba.core.errors import TypingError
from numba.core.registry import cpu_target
from numba.core.types import functions
from numba.extending import overload

from taskdsl.backend.cpu import call_types


def _typings(monkeypatch) -> list:
    """The argument types of each resolution numba makes (numba's method wrapped before any block starts)."""
    seen = []

    def counted(self, context, args, kws):
        seen.append(tuple(args))
        return original(self, context, args, kws)
    original = functions.BaseFunction.get_call_type
    monkeypatch.setattr(functions.BaseFunction, "get_call_type", counted)
    return seen


def test_a_call_is_typed_once_inside_the_block_and_numba_is_restored_after(monkeypatch):
    monkeypatch.setattr(call_types, "_memo", {})    # without what the process's earlier compiles remembered
    seen = _typings(monkeypatch)
    numbas = functions.BaseFunction.get_call_type
    context = cpu_target.typing_context
    context.refresh()       # numba loads its typing registries lazily
    add = context.resolve_value_type(operator.add)
    f32 = (types.float32, types.float32)
    with call_types.memoized():
        with call_types.memoized():         # nested blocks share the memo
            first = add.get_call_type(context, f32, {})
        assert add.get_call_type(context, f32, {}) is first
        assert add.get_call_type(context, (types.int64, types.int64), {}).return_type == types.int64
    assert seen == [f32, (types.int64, types.int64)]
    assert functions.BaseFunction.get_call_type is numbas
    add.get_call_type(context, f32, {})        # outside a block: numba's own method
    assert seen[2:] == [f32]
    with call_types.memoized():                # a later block recalls the earlier ones
        assert add.get_call_type(context, f32, {}) is first
    assert seen[3:] == []


def test_an_overload_registered_after_a_block_types_the_calls_of_later_blocks():
    """A new template makes a new function type: no resolution remembered for the old one answers for it."""
    def halved(x):
        return x

    @overload(halved)
    def _integers(x):
        if isinstance(x, types.Integer):
            return lambda x: x // 2
    use = njit(lambda v: halved(v))
    with call_types.memoized():
        assert use(7) == 3
        with pytest.raises(TypingError):
            use(7.0)

    @overload(halved)
    def _floats(x):
        if isinstance(x, types.Float):
            return lambda x: x * 0.5
    with call_types.memoized():
        assert njit(lambda v: halved(v))(7.0) == 3.5 and njit(lambda v: halved(v) + 1)(7) == 4


def test_functions_compiled_inside_compute_what_they_compute_outside():
    def body(x, y):
        out = np.empty_like(x)
        for i in range(x.size):
            out[i] = x[i] * y[i] + np.float32(i) - abs(x[i])
        return out
    x = np.linspace(-2, 2, 37, dtype=np.float32)
    y = np.arange(37, dtype=np.float32)
    with call_types.memoized():
        inside = njit(body)(x, y)
    np.testing.assert_array_equal(inside, njit(body)(x, y))
    np.testing.assert_array_equal(inside, body(x, y))
