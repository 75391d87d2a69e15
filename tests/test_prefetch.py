"""`td.prefetch`: a cache hint that changes no value, checked in debug mode, fused away with what it names.

Oracle: numpy on the same inputs; the hint itself is seen in the generated sources.
"""
import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

import taskdsl as td
from taskdsl import blockIdx, f32, threadIdx

from .markers import Markers

MARKS = Markers(__file__)


@td.kernel(grid=lambda N: td.cdiv(N, 32), block=32)
def scale_ahead(X: f32["N"], Y: f32["N"], ahead: td.i32):
    i = blockIdx.x * 32 + threadIdx.x
    if i < N:
        if i + ahead < N:
            td.prefetch(X[i + ahead])
        Y[i] = X[i] * 2.0


@settings(max_examples=10, deadline=None)
@given(n=st.sampled_from([1, 2, 17, 31, 32, 97, 1000]), ahead=st.integers(0, 64), seed=st.integers(0, 2**16))
def test_a_prefetch_changes_no_value(n, ahead, seed):
    x = np.random.default_rng(seed).standard_normal(n).astype(np.float32)
    y = np.full(n, np.nan, np.float32)
    scale_ahead(x, y, ahead)
    np.testing.assert_array_equal(y, x * np.float32(2))


def test_the_cpu_and_cuda_sources_prefetch():
    x, y = np.zeros(40, np.float32), np.zeros(40, np.float32)
    assert "rt.prefetch(X, " in scale_ahead.source(x, y, 8, target="cpu")
    assert 'prefetch.global.L2 [%0];" :: "l"(__cvta_generic_to_global(&X[' in scale_ahead.source(x, y, 8, target="cuda")


@td.kernel(grid=1, block=32)
def prefetch_past_end(X: f32["N"], Y: f32["N"]):
    i = threadIdx.x
    if i < N:
        td.prefetch(X[i + 1])  # P_PAST
        Y[i] = X[i]


def test_debug_mode_reports_a_prefetch_outside_the_tensor():
    """A GPU's prefetch must name a global address, so an index outside the tensor is an error on every target."""
    td.debug(True)
    x, y = np.arange(8, dtype=np.float32), np.zeros(8, np.float32)
    MARKS.expect_error(lambda: prefetch_past_end(x, y), "P_PAST",
                       r"^out-of-bounds prefetch of 'X': index 8 on axis 0 is outside \[0, 8\)")
    td.debug(False)
    prefetch_past_end(x, y)      # without debug mode a prefetch never faults
    np.testing.assert_array_equal(y, x)


def test_debug_mode_is_silent_for_prefetches_inside():
    td.debug(True)
    x, y = np.arange(50, dtype=np.float32), np.zeros(50, np.float32)
    scale_ahead(x, y, 3)
    np.testing.assert_array_equal(y, x * 2)


@td.kernel(grid=1, block=32)
def prefetch_shared(X: f32[32], Y: f32[32]):
    s = td.shared(f32, (32,))
    s[threadIdx.x] = X[threadIdx.x]
    td.prefetch(s[threadIdx.x])  # P_SHARED
    Y[threadIdx.x] = s[threadIdx.x]


@td.kernel(grid=1, block=32)
def prefetch_two(X: f32[32], Y: f32[32]):
    td.prefetch(X[0], X[1])  # P_ARGS
    Y[threadIdx.x] = X[threadIdx.x]


@td.kernel(grid=1, block=32)
def prefetch_tensor(X: f32[32], Y: f32[32]):
    td.prefetch(X)  # P_WHOLE
    Y[threadIdx.x] = X[threadIdx.x]


@pytest.mark.parametrize("kernel, tag, message", [
    (prefetch_shared, "P_SHARED", "the prefetched address must be in global memory; 's' is shared"),
    (prefetch_two, "P_ARGS", r"td.prefetch\(tensor\[i, j\]\) takes one element of a global tensor"),
    (prefetch_tensor, "P_WHOLE", r"the prefetched address must be one element, e.g. X\[i, j\]"),
])
def test_a_prefetch_names_one_element_of_a_global_tensor(kernel, tag, message):
    x, y = np.zeros(32, np.float32), np.zeros(32, np.float32)
    MARKS.expect_error(lambda: kernel(x, y), tag, message)


@td.kernel(grid=1, block=64)
def add_next(A: f32[64], out: f32[64]):
    i = threadIdx.x
    if i + 8 < 64:
        td.prefetch(A[i + 8])
    td.prefetch(out[i])
    out[i] = A[i] + 1.0


def test_fusion_drops_the_prefetches_of_a_prologue_or_epilogue():
    """A fused prologue's or epilogue's values are computed, not in memory: the prefetches of the tensors they
    replace go, and the kernel computes what the unfused pair did."""
    c = td.placeholder("C", f32, (64,))
    out = td.placeholder("out", f32, (64,))
    fused = td.fuse(add_next, np.zeros(64, np.float32), np.zeros(64, np.float32),
                    prologues={"A": td.compute("A", (64,), lambda i: c[i] * 3.0)},
                    epilogues={"out": td.compute("D", (64,), lambda i: out[i] - 2.0)})
    x = np.random.default_rng(5).standard_normal(64).astype(np.float32)
    d = np.zeros(64, np.float32)
    fused(x, d)
    np.testing.assert_allclose(d, x * 3 + 1 - 2, rtol=1e-6)
    assert "prefetch" not in fused.ir(x, d)


@td.kernel(grid=1, block=32)
def gather_ahead(X: f32[64], I: td.i32[32], Y: f32[32]):
    i = threadIdx.x
    td.prefetch(X[I[(i + 1) % 32]])
    Y[i] = X[I[i]]


def test_a_prologue_reaches_into_the_index_of_a_prefetch_it_keeps():
    """The prefetch of X stays when a prologue replaces the index tensor I, and its index reads the prologue's
    values (it named the removed parameter I: an audit's finding)."""
    j = td.placeholder("J", td.i32, (32,))
    fused = td.fuse(gather_ahead, np.zeros(64, np.float32), np.zeros(32, np.int32), np.zeros(32, np.float32),
                    prologues={"I": td.compute("I", (32,), lambda i: j[i] * 2)})
    x, jj, y = np.arange(64, dtype=np.float32), np.arange(32, dtype=np.int32), np.zeros(32, np.float32)
    fused(x, y, jj)
    np.testing.assert_array_equal(y, x[jj * 2])
    assert "prefetch(&X[J[(i + 1) % 32] * 2])" in fused.ir(x, y, jj)
    assert "I[" not in fused.source(x, y, jj, target="cuda")
