"""cp_async on the cpu target (`passes/emulate_async_copies.py`): a copy lands at the wait that covers its group.

PTX lets a copy complete at any moment before that wait; the cpu target takes the last moment, so a kernel that
reads too early reads the old contents here too. These tests read shared memory at points where PTX does not
promise the data yet: on a GPU such a read may see either value, so they run on the cpu target only.
"""
import re

import numpy as np
import pytest

import taskdsl as td
from taskdsl import f32, threadIdx
from taskdsl.passes.emulate_async_copies import QUEUE

OLD = -1.0      # what shared memory holds before the copies


@td.kernel(grid=1, block=32)
def read_before_and_after_the_wait(X: f32[32, 4], Before: f32[32, 4], After: f32[32, 4]):
    s = td.shared(f32, (32, 4))
    t = threadIdx.x
    for e in range(4):
        s[t, e] = OLD
    td.cp_async(s[t, 0], X[t, 0], 4)
    td.cp_async_commit()
    for e in range(4):
        Before[t, e] = s[t, e]
    td.cp_async_wait(0)
    for e in range(4):
        After[t, e] = s[t, e]


@pytest.mark.parametrize("debug", [False, True])
def test_a_read_before_the_wait_sees_the_old_contents(debug):
    td.debug(debug)
    try:
        x = np.arange(128, dtype=np.float32).reshape(32, 4)
        before, after = np.zeros_like(x), np.zeros_like(x)
        read_before_and_after_the_wait(x, before, after)
    finally:
        td.debug(False)
    np.testing.assert_array_equal(before, np.full_like(x, OLD))
    np.testing.assert_array_equal(after, x)


@td.kernel(grid=1, block=32)
def three_copies(X: f32[32, 12], FirstWait: f32[32, 12], SecondWait: f32[32, 12]):
    """Three copies of a row's thirds: the first two in groups of their own, the third never committed."""
    s = td.shared(f32, (32, 12))
    t = threadIdx.x
    for e in range(12):
        s[t, e] = OLD
    td.cp_async(s[t, 0], X[t, 0], 4)
    td.cp_async_commit()
    td.cp_async(s[t, 4], X[t, 4], 4)
    td.cp_async_commit()
    td.cp_async(s[t, 8], X[t, 8], 4)
    td.cp_async_wait(1)             # the newest committed group may still be in flight
    for e in range(12):
        FirstWait[t, e] = s[t, e]
    td.cp_async_wait(0)             # every committed group: not the copy issued since the last commit
    for e in range(12):
        SecondWait[t, e] = s[t, e]


@pytest.mark.parametrize("debug", [False, True])
def test_a_wait_covers_the_groups_committed_before_its_newest_n(debug):
    x = np.arange(32 * 12, dtype=np.float32).reshape(32, 12)
    first, second = np.zeros_like(x), np.zeros_like(x)
    td.debug(debug)
    try:
        three_copies(x, first, second)
    finally:
        td.debug(False)
    old = np.full((32, 4), OLD, np.float32)
    np.testing.assert_array_equal(first, np.hstack([x[:, :4], old, old]))
    np.testing.assert_array_equal(second, np.hstack([x[:, :8], old]))


COPIES = QUEUE + 3


@td.kernel(grid=1, block=1)
def more_copies_than_the_queue(X: f32[COPIES], Before: f32[COPIES], After: f32[COPIES]):
    s = td.shared(f32, (COPIES,))
    for i in range(COPIES):
        s[i] = OLD
    for i in range(COPIES):
        td.cp_async(s[i], X[i], 1)
    td.cp_async_commit()
    for i in range(COPIES):
        Before[i] = s[i]
    td.cp_async_wait(0)
    for i in range(COPIES):
        After[i] = s[i]


@pytest.mark.undefined_behavior      # reads copies' destinations before their wait: PTX leaves them unspecified
def test_a_full_queue_lands_its_oldest_copies_early():
    """A thread holds QUEUE pending copies; each copy past them lands the oldest one (early, which PTX allows)."""
    x = np.arange(COPIES, dtype=np.float32) + 1
    before, after = np.zeros_like(x), np.zeros_like(x)
    more_copies_than_the_queue(x, before, after)
    np.testing.assert_array_equal(before, np.concatenate([x[:3], np.full(QUEUE, OLD, np.float32)]))
    np.testing.assert_array_equal(after, x)


@pytest.mark.parametrize("debug", [False, True])
def test_a_queued_copy_keeps_one_linear_index_outside_debug_mode(debug):
    """The emulation runs on flattened IR (numba compiles about half the code a tensor-core kernel's n-d queue
    entries and ldmatrix rows made), and on n-d IR in debug mode, whose accesses are checked per axis."""
    x = np.zeros((32, 12), np.float32)
    td.debug(debug)
    try:
        source = three_copies.source(x, x, x, target="cpu")
    finally:
        td.debug(False)
    indices_per_entry = 2 if debug else 1      # s is (32, 12)
    count = 32 * QUEUE * indices_per_entry       # on the stack outside debug mode (`codegen.STACK_BYTES`)
    assert re.search(rf"cpq_indices_s = (np\.empty\(\({count}, \)|rt\.stack_array\({count}), np\.int32\)", source)


@td.kernel(grid=1, block=32)
def refill_before_the_barrier(X: f32[2, 32], Y: f32[32]):
    """A slot refilled too soon: thread t reads its neighbour's element of tile 0, but every thread issues its copy
    of tile 1 into the slot before the barrier that ends those reads (the barrier must come first)."""
    s = td.shared(f32, (32,))
    t = threadIdx.x
    td.cp_async(s[t], X[0, t], 1)
    td.cp_async_commit()
    td.cp_async_wait(0)
    td.syncthreads()
    td.cp_async(s[t], X[1, t], 1)
    td.cp_async_commit()
    Y[t] = s[(t + 31) % 32]
    td.syncthreads()
    td.cp_async_wait(0)


@pytest.mark.undefined_behavior      # a race: the kernel reads a slot while a copy into it is in flight
def test_early_copies_show_a_slot_refilled_before_the_barrier():
    """PTX lets a copy land anywhere between its issue and its wait. Landing at the wait, the cpu hides a copy that
    overwrites what another thread still reads; `td.cp_async_early` lands it at issue, and the thread that runs after
    the copying one reads the new tile (thread 0 reads thread 31's element before thread 31 runs)."""
    x = np.arange(64, dtype=np.float32).reshape(2, 32)
    neighbours = (np.arange(32) + 31) % 32
    y = np.zeros(32, np.float32)
    refill_before_the_barrier(x, y)
    np.testing.assert_array_equal(y, x[0, neighbours])        # late: the race does not show
    td.cp_async_early(True)
    try:
        refill_before_the_barrier(x, y)
    finally:
        td.cp_async_early(False)
    np.testing.assert_array_equal(y, np.where(np.arange(32) == 0, x[0, 31], x[1, neighbours]))


def test_early_copies_in_debug_mode_report_the_race():
    """In debug mode an early copy is a write of the issuing thread, so the race detector names the read."""
    x, y = np.zeros((2, 32), np.float32), np.zeros(32, np.float32)
    td.debug(True)
    try:
        refill_before_the_barrier(x, y)         # late: the copy's store is after the barrier
        td.cp_async_early(True)
        with pytest.raises(td.DSLError, match=r"shared-memory race on 's'(.|\n)*Y\[t\] = s\["):
            refill_before_the_barrier(x, y)
    finally:
        td.debug(False)
        td.cp_async_early(False)


def test_early_copies_are_a_switch():
    with pytest.raises(TypeError, match="td.cp_async_early takes True or False"):
        td.cp_async_early("yes")


@td.kernel(grid=1, block=32)
def a_copy_past_its_row(A: f32[32, 8], B: f32[32, 8]):
    s = td.shared(f32, (32, 8))
    td.cp_async(s[threadIdx.x, 0], A[threadIdx.x, 0], 4)
    td.cp_async(s[threadIdx.x, 6], A[threadIdx.x, 4], 4)      # s[t, 6..9]: past the row
    td.cp_async_commit()
    td.cp_async_wait(0)
    td.syncthreads()
    for j in range(8):
        B[threadIdx.x, j] = s[threadIdx.x, j]


@pytest.mark.parametrize("early", [False, True])
def test_debug_mode_reports_a_destination_past_its_buffer_at_the_copy(early):
    """It was reported at the wait that lands the copy: with several copies in flight, which one was wrong?"""
    import inspect
    lines, first = inspect.getsourcelines(a_copy_past_its_row.fn)
    bad = first + next(k for k, line in enumerate(lines) if "past the row" in line)
    td.debug(True)
    td.cp_async_early(early)
    try:
        with pytest.raises(td.DSLError, match=r"of .s.: index [89] on axis 1 is outside \[0, 8\)") as info:
            a_copy_past_its_row(np.ones((32, 8), np.float32), np.zeros((32, 8), np.float32))
    finally:
        td.debug(False)
        td.cp_async_early(False)
    assert info.value.loc.line == bad
