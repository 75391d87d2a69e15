"""A kernel's module-level names are read as Python reads a function's globals: at each call. Rebinding one (a
notebook cell run again, a REPL assignment) builds the kernel again with the new value; the oracle is the
arithmetic the kernel body states, with the values bound at the call."""
from __future__ import annotations

import functools

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import taskdsl as td

from .program_files import load_program

PROGRAM = """
import taskdsl as td
from taskdsl import blockIdx, f32, threadIdx

SCALE = 2.0
TERMS = 1
BLOCKS = 1
OFFSET = 1.0


@td.func
def helper(x: f32) -> f32:
    return x + OFFSET                           # a global of the helper's body: noted too


@td.kernel(grid=1, block=8)
def scaled(X: f32[8], Y: f32[8]):
    acc = 0.0
    for _ in range(TERMS):                      # a compile-time trip count: TERMS shapes the IR
        acc += helper(X[threadIdx.x]) * SCALE
    Y[threadIdx.x] = acc


@td.kernel(grid=lambda N: BLOCKS, block=1)     # the grid reads a global the body does not
def mark(Y: f32["N"]):
    Y[blockIdx.x] = 1.0
"""


@pytest.fixture
def program():
    """A fresh module holding the kernels (its globals are the test's to rebind)."""
    return load_program(PROGRAM, "global_reads")


@functools.cache
def _shared_program():
    return load_program(PROGRAM, "global_reads_shared")


def _scaled(program, x) -> np.ndarray:
    y = np.zeros(8, np.float32)
    program.scaled(x, y)
    return y


X = np.arange(8, dtype=np.float32)


def test_rebinding_a_constant_or_a_helper_changes_the_next_call(program):
    np.testing.assert_array_equal(_scaled(program, X), (X + 1) * 2)
    program.SCALE = 3.0
    np.testing.assert_array_equal(_scaled(program, X), (X + 1) * 3)
    program.TERMS = 2
    np.testing.assert_array_equal(_scaled(program, X), (X + 1) * 3 * 2)

    @td.func
    def helper(x: td.f32) -> td.f32:
        return x - 1.0

    program.helper = helper         # what running a notebook cell that redefines `helper` does
    np.testing.assert_array_equal(_scaled(program, X), (X - 1) * 3 * 2)


def test_a_global_read_by_the_helper(program):
    program.OFFSET = -4.0
    np.testing.assert_array_equal(_scaled(program, X), (X - 4) * 2)


def test_what_is_noted_and_what_is_kept(program):
    """The body's own globals are noted, not modules or the DSL's names (td, threadIdx, f32); a call with them
    unchanged keeps the prepared launch, and so does rebinding a name to the object it had."""
    _scaled(program, X)
    noted = sorted(name for _, name, _ in program.scaled._global_reads.noted.values())
    assert noted == ["OFFSET", "SCALE", "TERMS", "helper"]
    launch = next(iter(program.scaled._launches.values()))
    program.SCALE = program.SCALE
    _scaled(program, X)
    assert next(iter(program.scaled._launches.values())) is launch


def test_a_global_only_the_grid_reads(program):
    for blocks in (2, 5, 3):
        program.BLOCKS = blocks
        y = np.zeros(6, np.float32)
        program.mark(y)
        np.testing.assert_array_equal(y, np.arange(6) < blocks)


def test_a_deleted_global_is_a_dsl_error_at_the_next_call(program):
    _scaled(program, X)
    del program.SCALE
    with pytest.raises(td.DSLError, match="name 'SCALE' is not defined"):
        _scaled(program, X)


def test_device_arrays_and_their_prepared_launches(simulated_gpu, program):
    """On cuda a call of device arrays reuses a prepared launch: rebinding still builds again."""
    x, y = td.to_device(X), td.to_device(np.zeros(8, np.float32))
    program.scaled(x, y)
    np.testing.assert_array_equal(y.numpy(), (X + 1) * 2)
    program.SCALE = -1.5
    program.scaled(x, y)
    np.testing.assert_array_equal(y.numpy(), (X + 1) * -1.5)


@settings(max_examples=8, deadline=None)
@given(values=st.lists(st.sampled_from([0.5, -2.0, 3.0]), min_size=1, max_size=4))
def test_any_sequence_of_rebinds(values):
    """Each call computes with the value bound when it is made (one module for every example, so three builds,
    then loads from the disk cache)."""
    program = _shared_program()
    for value in values:
        program.SCALE = value
        np.testing.assert_array_equal(_scaled(program, X), (X + 1) * np.float32(value))
