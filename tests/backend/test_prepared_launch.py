"""Prepared cpu launches: a call with the shapes, dtypes and scalars of an earlier one skips the checks and
lookups, and must behave exactly like the first call (numpy is the oracle)."""
import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

import taskdsl as td
from taskdsl import blockIdx, f16, f32, i32, threadIdx
from taskdsl.runtime.kernel import _binding_key

from ..markers import Markers

MARKS = Markers(__file__)


@td.kernel(grid=lambda N: td.cdiv(N, 64), block=64)
def axpy(X: f32["N"], Y: f32["N"], alpha: f32, shift: i32):
    i = blockIdx.x * 64 + threadIdx.x
    if i < N:
        Y[i] = Y[i] + alpha * X[i] + shift


@td.kernel(grid=lambda N: td.cdiv(N, 64), block=64)
def half_double(X: f16["N"], Y: f16["N"]):
    i = blockIdx.x * 64 + threadIdx.x
    if i < N:
        Y[i] = X[i] * td.cast(2.0, f16)


@td.kernel(grid=lambda N: td.cdiv(N, 32), block=32)
def shifted_read(X: f32["N"], Y: f32["N"]):
    i = blockIdx.x * 32 + threadIdx.x
    if i < N:
        Y[i] = X[i + 1]  # P_READ


@settings(max_examples=10, deadline=None)
@given(n=st.sampled_from([1, 2, 63, 64, 65, 97, 1031]), alpha=st.sampled_from([0.5, -3.0]),
       shift=st.integers(-4, 4), calls=st.integers(2, 4), seed=st.integers(0, 2**16))
def test_repeated_calls_on_new_arrays_match_numpy(n, alpha, shift, calls, seed):
    td.set_target("cpu")
    rng = np.random.default_rng(seed)
    for _ in range(calls):     # the first call prepares the launch, the others reuse it on fresh arrays
        x, y = rng.standard_normal(n).astype(np.float32), rng.standard_normal(n).astype(np.float32)
        want = y + np.float32(alpha) * x + np.float32(shift)
        axpy(x, y, alpha, shift)
        np.testing.assert_allclose(y, want, rtol=1e-6, atol=1e-6)
    assert any(key[0][2:] == _binding_key((alpha, shift)) for key in axpy._launches)


def test_other_scalars_or_shapes_prepare_another_launch():
    td.set_target("cpu")
    x, y = np.ones(100, np.float32), np.zeros(100, np.float32)
    axpy._launches.clear()
    axpy(x, y, 1.0, 0)
    axpy(x, y, 1.0, 0)
    axpy(x, y, 2.0, 0)
    axpy(x[:50].copy(), y[:50].copy(), 2.0, 0)
    assert len(axpy._launches) == 3
    np.testing.assert_array_equal(y, np.full(100, 4.0, np.float32))


def test_a_prepared_launch_writes_non_contiguous_and_read_only_arrays_correctly():
    td.set_target("cpu")
    x = np.arange(200, dtype=np.float32)
    y = np.zeros(200, np.float32)
    axpy(x[:100].copy(), y[:100].copy(), 1.0, 1)            # prepares the launch for 100 elements
    strided = y[::2]                                        # same shape and dtype, not contiguous
    axpy(x[:100], strided, 1.0, 1)
    np.testing.assert_array_equal(y[::2], x[:100] + 1)
    np.testing.assert_array_equal(y[1::2], 0)
    frozen = x[:100].copy()
    frozen.flags.writeable = False                          # another numba signature: compiled on first use
    out = np.zeros(100, np.float32)
    axpy(frozen, out, 2.0, 0)
    np.testing.assert_array_equal(out, 2 * frozen)


def test_half_precision_through_a_prepared_launch():
    td.set_target("cpu")
    for scale in (1, 3):
        x = (np.arange(77) * scale / 7).astype(np.float16)
        y = np.zeros(77, np.float16)
        half_double(x, y)
        np.testing.assert_array_equal(y, x * np.float16(2))


def test_debug_errors_on_every_call_and_debug_mode_is_part_of_the_key():
    td.set_target("cpu")
    x, y = np.arange(32, dtype=np.float32), np.zeros(32, np.float32)
    td.debug(True)
    for _ in range(2):                                                # prepared in debug mode, then reused
        err = MARKS.expect_error(lambda: shifted_read(x, y), "P_READ", r"^out-of-bounds read of 'X'")
        assert err.loc.line == MARKS.line_of("P_READ")
    axpy._launches.clear()
    y = np.zeros(32, np.float32)
    axpy(x, y, 1.0, 0)
    td.debug(False)
    axpy(x, y, 1.0, 0)
    assert sorted(key[1] for key in axpy._launches) == [False, True]
    np.testing.assert_array_equal(y, 2 * x)


def test_empty_grids_run_nothing_and_compile_nothing():
    td.set_target("cpu")

    @td.kernel(grid=lambda N: N, block=1)
    def never(X: f32["N"]):
        X[blockIdx.x] = 1.0

    for _ in range(2):
        never(np.zeros(0, np.float32))
    assert never._cpu == {} and never._launches == {}


@pytest.fixture(autouse=True)
def _reset_debug():
    yield
    td.debug(False)


@td.kernel(grid=1, block=lambda N: N)
def shifted_sum(X: f32["N"], Z: f32["N"], Y: f32["N"]):
    """Y[i] = 2 X[i] + Z[i], one block whose threads run in order on the cpu."""
    Y[threadIdx.x] = X[threadIdx.x] * 2.0 + Z[threadIdx.x]


def _run_of(*args) -> str:
    from taskdsl.backend.cpu.launch import recording
    with recording() as r:
        shifted_sum(*args)
    return r.launches[-1].run.__name__


@given(n=st.integers(2, 40))
@settings(max_examples=5, deadline=None)
def test_calls_whose_written_array_overlaps_no_other_run_the_noalias_twin(n):
    """A call whose written arrays share no memory with another argument runs the kernel's `apart_twin` (numba marks
    its arrays `noalias`); one writing where it reads runs the plain kernel. Read-only arguments may share memory."""
    rng = np.random.default_rng(n)
    x, z = rng.standard_normal(n).astype(np.float32), rng.standard_normal(n).astype(np.float32)
    y = np.zeros(n, np.float32)
    assert _run_of(x, z, y).endswith("_apart")
    np.testing.assert_array_equal(y, x * np.float32(2) + z)
    assert _run_of(x, x, y).endswith("_apart")          # both read: they may alias
    np.testing.assert_array_equal(y, x * np.float32(3))
    buf = rng.standard_normal(n + 1).astype(np.float32)
    want = buf[1:] * np.float32(2) + z[:n]             # thread i reads buf[i + 1] before thread i + 1 writes it
    name = _run_of(buf[1:], z, buf[:-1])
    assert not name.endswith("_apart")
    np.testing.assert_array_equal(buf[:-1], want)
    inplace = x.copy()
    assert not _run_of(inplace, z, inplace).endswith("_apart")
    np.testing.assert_array_equal(inplace, x * np.float32(2) + z)
