"""Debug mode (`td.debug(True)`) on the cpu target: bounds checks and shared-memory race reports,
each a DSLError at the kernel line that made the bad access; correct kernels stay silent."""

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

import taskdsl as td
from stdlib_ops.design_matmul import matmul_kernel
from taskdsl import blockIdx, f16, f32, i32, threadIdx

from .kernels import tree_sum

from .markers import Markers

MARKS = Markers(__file__)
LINES = MARKS.lines
line_of = MARKS.line_of


def debug_error(call, tags, pattern: str) -> td.DSLError:
    """Run `call` in debug mode; expect a DSLError matching `pattern` at one of the marked lines."""
    td.debug(True)
    return MARKS.expect_error(call, tags, pattern)


# --------------------------------------------------------------------------- bounds
@td.kernel(grid=lambda N: td.cdiv(N, 32), block=32)
def read_past_end(X: f32["N"], Y: f32["N"]):
    i = blockIdx.x * 32 + threadIdx.x
    if i < N:
        Y[i] = X[i + 1]  # D_READ


def test_out_of_bounds_read():
    x, y = np.arange(32, dtype=np.float32), np.zeros(32, np.float32)
    err = debug_error(lambda: read_past_end(x, y), "D_READ",
                      r"^out-of-bounds read of 'X': index 32 on axis 0 is outside \[0, 32\)")
    assert err.loc.col == LINES[err.loc.line - 1].index("Y[i]")


@settings(max_examples=4, deadline=None)
@given(n=st.integers(1, 200))
def test_out_of_bounds_read_reports_the_size(n):
    x, y = np.arange(n, dtype=np.float32), np.zeros(n, np.float32)
    debug_error(lambda: read_past_end(x, y), "D_READ",
                rf"^out-of-bounds read of 'X': index {n} on axis 0 is outside \[0, {n}\)")


@td.kernel(grid=lambda N: td.cdiv(N, 32), block=32)
def write_before_start(X: f32["N"], Y: f32["N"]):
    i = blockIdx.x * 32 + threadIdx.x
    if i < N:
        v = X[i]
        Y[i - 1] = v  # D_WRITE


def test_out_of_bounds_write_with_a_negative_index():
    x, y = np.arange(40, dtype=np.float32), np.zeros(40, np.float32)
    debug_error(lambda: write_before_start(x, y), "D_WRITE",
                r"^out-of-bounds write of 'Y': index -1 on axis 0 is outside \[0, 40\)")


@td.kernel(grid=1, block=(8, 4))
def read_2d(X: f32[4, 8], Y: f32[4, 8]):
    r, c = threadIdx.y, threadIdx.x
    Y[r, c] = X[r, c + 1] if c < 8 else 0.0  # D_READ2D


def test_out_of_bounds_on_the_second_axis():
    x, y = np.zeros((4, 8), np.float32), np.zeros((4, 8), np.float32)
    debug_error(lambda: read_2d(x, y), "D_READ2D",
                r"^out-of-bounds read of 'X': index 8 on axis 1 is outside \[0, 8\)")


@td.kernel(grid=1, block=32)
def shared_overflow(X: f32[32]):
    s = td.shared(f32, (32,))
    s[threadIdx.x + 1] = X[threadIdx.x]  # D_SHARED
    td.syncthreads()
    X[threadIdx.x] = s[threadIdx.x]


def test_out_of_bounds_shared_memory_write():
    x = np.zeros(32, np.float32)
    debug_error(lambda: shared_overflow(x), "D_SHARED",
                r"^out-of-bounds write of 's': index 32 on axis 0 is outside \[0, 32\)")


@td.kernel(grid=1, block=4)
def registers_overflow(X: f32[4], k: i32):
    regs = td.registers(f32, (4,))
    for j in range(k):
        regs[j] = X[threadIdx.x]  # D_REGS
    X[threadIdx.x] = regs[0]


def test_out_of_bounds_register_write():
    x = np.zeros(4, np.float32)
    registers_overflow(x, 4)             # in bounds: no error, also in debug mode
    td.debug(True)
    registers_overflow(x, 4)
    debug_error(lambda: registers_overflow(x, 5), "D_REGS",
                r"^out-of-bounds write of 'regs': index 4 on axis 0 is outside \[0, 4\)")


@td.kernel(grid=lambda N: td.cdiv(N, 32), block=32)
def bad_histogram(V: i32["N"], H: i32[8]):
    i = blockIdx.x * 32 + threadIdx.x
    if i < N:
        td.atomic_add(H[V[i]], 1)  # D_ATOMIC


def test_out_of_bounds_atomic():
    v, h = np.array([0, 3, 8, 1], np.int32), np.zeros(8, np.int32)
    debug_error(lambda: bad_histogram(v, h), "D_ATOMIC", r"'H': index 8 on axis 0 is outside \[0, 8\)")


# --------------------------------------------------------------------------- races
@td.kernel(grid=lambda N: td.cdiv(N, 64), block=64)
def rotate_racy(X: f32["N"], Y: f32["N"]):
    s = td.shared(f32, (64,))
    t = threadIdx.x
    g = blockIdx.x * 64 + t
    s[t] = X[g] if g < N else 0.0  # D_RACE_W
    v = s[(t + 1) % 64]  # D_RACE_R
    if g < N:
        Y[g] = v


@td.kernel(grid=lambda N: td.cdiv(N, 64), block=64)
def rotate_synced(X: f32["N"], Y: f32["N"]):
    s = td.shared(f32, (64,))
    t = threadIdx.x
    g = blockIdx.x * 64 + t
    s[t] = X[g] if g < N else 0.0
    td.syncthreads()
    v = s[(t + 1) % 64]
    if g < N:
        Y[g] = v


def test_shared_memory_race_without_barrier_is_reported():
    x, y = np.arange(100, dtype=np.float32), np.zeros(100, np.float32)
    debug_error(lambda: rotate_racy(x, y), ["D_RACE_W", "D_RACE_R"], r"^shared-memory race on 's'")


@settings(max_examples=4, deadline=None)
@given(n=st.integers(1, 300))
def test_the_same_kernel_with_the_barrier_is_silent_and_correct(n):
    td.debug(True)
    x, y = np.random.default_rng(n).uniform(-1, 1, n).astype(np.float32), np.zeros(n, np.float32)
    rotate_synced(x, y)
    blocks = np.zeros(-(-n // 64) * 64, np.float32)
    blocks[:n] = x
    np.testing.assert_array_equal(y, np.roll(blocks.reshape(-1, 64), -1, axis=1).reshape(-1)[:n])


@td.kernel(grid=1, block=64)
def write_after_read(X: f32[64]):
    s = td.shared(f32, (64,))
    t = threadIdx.x
    s[t] = X[t]
    td.syncthreads()
    v = s[63 - t]  # D_WAR_R
    s[t] = v * 2.0  # D_WAR_W
    td.syncthreads()
    X[t] = s[t]


def test_write_after_read_race_is_reported():
    x = np.arange(64, dtype=np.float32)
    debug_error(lambda: write_after_read(x), ["D_WAR_R", "D_WAR_W"], r"^shared-memory race on 's'")


@td.kernel(grid=1, block=32)
def same_slot(X: f32[32]):
    s = td.shared(f32, (1,))
    s[0] = X[threadIdx.x]  # D_WAW
    td.syncthreads()
    X[threadIdx.x] = s[0]


def test_write_write_race_is_reported():
    x = np.arange(32, dtype=np.float32)
    debug_error(lambda: same_slot(x), "D_WAW", r"^shared-memory race on 's'")


def shared_atomics(synced: bool):
    """Thread 0 zeroes a shared sum that every thread then adds to atomically (`synced`: a barrier between)."""
    @td.kernel(grid=1, block=64)
    def sum_atomically(X: f32[64], Y: f32[1]):
        s = td.shared(f32, (1,))
        if threadIdx.x == 0:
            s[0] = 0.0
        if synced:
            td.syncthreads()
        td.atomic_add(s[0], X[threadIdx.x])  # D_ATOMIC_INIT
        td.syncthreads()
        if threadIdx.x == 0:
            Y[0] = s[0]
    return sum_atomically


@td.kernel(grid=1, block=64)
def read_among_atomics(X: f32[64], Y: f32[64]):
    s = td.shared(f32, (1,))
    if threadIdx.x == 0:
        s[0] = 0.0
    td.syncthreads()
    td.atomic_add(s[0], X[threadIdx.x])  # D_ATOMIC_READ_A
    Y[threadIdx.x] = s[0]  # D_ATOMIC_READ_B


def test_shared_atomics_racing_plain_accesses_are_reported():
    """A shared atomic was only bounds-checked: a plain write or read of its element by another thread with no
    barrier in between (a GPU may run warp 1's atomics before warp 0's store) went unreported."""
    x = np.arange(64, dtype=np.float32)
    debug_error(lambda: shared_atomics(False)(x, np.zeros(1, np.float32)), "D_ATOMIC_INIT",
                r"^shared-memory race on 's' \(element 0\): thread 1 updates an element atomically that thread 0 "
                "wrote")
    debug_error(lambda: read_among_atomics(x, np.zeros(64, np.float32)), ["D_ATOMIC_READ_A", "D_ATOMIC_READ_B"],
                r"^shared-memory race on 's'")
    y = np.zeros(1, np.float32)
    shared_atomics(True)(x, y)      # atomics of many threads between barriers do not race each other
    assert y[0] == x.sum()


@td.kernel(grid=1, block=64)
def race_across_an_mma(X: f32[64], A: f16[16, 16], B: f16[16, 8], C: f32[64, 4]):
    sm = td.shared(f32, (64,))
    a = td.registers(f16, (8,))
    b = td.registers(f16, (4,))
    c = td.registers(f32, (4,))
    t = threadIdx.x
    lane = t % 32
    sm[t] = X[t]
    for r in range(8):
        a[r] = A[lane // 4 + r // 2 % 2 * 8, lane % 4 * 2 + r % 2 + r // 4 * 8]
    for r in range(4):
        b[r] = B[lane % 4 * 2 + r % 2 + r // 2 * 8, lane // 4]
        c[r] = 0.0
    td.mma_m16n8k16(a, b, c)
    for r in range(4):
        C[t, r] = c[r] + sm[63 - t]  # D_MMA_RACE


def test_a_tensor_core_instruction_does_not_hide_a_race():
    """The cpu emulation's syncwarps around its exchange counted as barriers: a write and another warp's read
    with an mma between them, and no syncthreads(), went unreported."""
    debug_error(lambda: race_across_an_mma(np.ones(64, np.float32), np.ones((16, 16), np.float16),
                                           np.ones((16, 8), np.float16), np.zeros((64, 4), np.float32)),
                "D_MMA_RACE", r"^shared-memory race on 'sm' \(element 63\): thread 0 reads an element that thread "
                              "63 wrote")


@td.kernel(grid=1, block=64)
def loop_bound_then_write(X: f32[64], P: i32[1]):
    n = td.shared(i32, (1,))
    if threadIdx.x == 0:
        n[0] = 0
    td.syncthreads()
    for k in range(n[0]):      # every thread reads n[0] here, at once (a block-level loop: no barrier runs) ...
        td.syncthreads()
        X[threadIdx.x] += 1.0
    if threadIdx.x == P[0]:
        n[0] = 7  # D_BOUND_WRITE


@settings(max_examples=3, deadline=None)
@given(writer=st.integers(0, 63))
def test_a_block_level_read_counts_as_every_threads(writer):
    """A shared read made once for the block (a loop bound) was charged to the thread of the region before (63):
    its write racing the others' read went unreported, another thread's named 63 as the reader."""
    debug_error(lambda: loop_bound_then_write(np.zeros(64, np.float32), np.array([writer], np.int32)),
                "D_BOUND_WRITE", rf"^shared-memory race on 'n' \(element 0\): thread {writer} writes an element "
                                 "that several threads read")


# --------------------------------------------------------------------------- correct kernels stay silent
@settings(max_examples=4, deadline=None)
@given(n=st.integers(1, 400))
def test_reduction_is_silent_in_debug_mode(n):
    td.debug(True)
    x = np.random.default_rng(n).uniform(-1, 1, n).astype(np.float32)
    out = np.zeros(-(-n // 256), np.float32)
    tree_sum(x, out)
    padded = np.zeros(len(out) * 256)
    padded[:n] = x
    np.testing.assert_allclose(out, padded.reshape(-1, 256).sum(1), rtol=1e-5, atol=1e-5)


@settings(max_examples=4, deadline=None)
@given(m=st.integers(1, 40), n=st.integers(1, 40), k=st.integers(1, 20))
def test_tiled_matmul_is_silent_in_debug_mode(m, n, k):
    td.debug(True)
    rng = np.random.default_rng(m * 1000 + n * 10 + k)
    a, b = rng.uniform(-1, 1, (m, k)).astype(np.float32), rng.uniform(-1, 1, (k, n)).astype(np.float32)
    c = np.zeros((m, n), np.float32)
    matmul_kernel(a, b, c)
    np.testing.assert_allclose(c, a.astype(np.float64) @ b, rtol=1e-5, atol=1e-5)


@td.kernel(grid=1, block=64)
def warp_then_shared(X: f32[64], Out: f32[1]):
    part = td.shared(f32, (2,))
    v = X[threadIdx.x]
    for off in (16, 8, 4, 2, 1):
        v += td.shfl_xor(v, off)
    if threadIdx.x % 32 == 0:
        part[threadIdx.x // 32] = v
    td.syncthreads()
    if threadIdx.x == 0:
        Out[0] = part[0] + part[1]


def test_shuffles_and_shared_memory_are_silent_in_debug_mode():
    td.debug(True)
    x = np.arange(64, dtype=np.float32)
    out = np.zeros(1, np.float32)
    warp_then_shared(x, out)
    assert out[0] == x.sum()


def test_debug_mode_can_be_switched_off_again():
    x, y = np.arange(32, dtype=np.float32), np.zeros(32, np.float32)
    td.debug(True)
    rotate_synced(x, y)
    td.debug(False)
    y2 = np.zeros(32, np.float32)
    rotate_synced(x, y2)
    np.testing.assert_array_equal(y, y2)


@td.kernel(grid=1, block=32)
def many_sites(X: f32[32], Y: f32[32]):
    s = td.shared(f32, (32,))
    t = threadIdx.x
    s[t] = X[t] + X[31 - t] + X[t // 2] + X[t % 3]
    td.syncthreads()
    Y[t] = s[t] + s[31 - t] + s[t // 2] + s[t % 3]


def test_checking_helpers_compile_once_per_type_not_per_site():
    """Each access's site number went to numba as a literal: the checking helpers were compiled once per
    access (355 compiles, two minutes, for one mma kernel)."""
    from taskdsl.backend.cpu import support_calls as rt
    td.debug(True)
    before = {f: len(getattr(rt, f).signatures) for f in ("load_checked", "load_shared_checked", "check_index")}
    x, y = np.arange(32, dtype=np.float32), np.zeros(32, np.float32)
    many_sites(x, y)
    s = x + x[::-1] + x[np.arange(32) // 2] + x[np.arange(32) % 3]
    np.testing.assert_array_equal(y, s + s[::-1] + s[np.arange(32) // 2] + s[np.arange(32) % 3])
    grown = {f: len(getattr(rt, f).signatures) - n for f, n in before.items()}
    assert grown["load_checked"] <= 1 and grown["load_shared_checked"] <= 1 and grown["check_index"] <= 2, grown


def test_zero_dimensional_tensors_in_debug_mode():
    """Debug mode keeps tensors n-d for its per-axis checks; a 0-d one (a graph's scalar, a clip bound) has no
    index to check, and numba could not type the check on an empty index tuple: BERT and MobileNet-V2 failed to
    build under TASKDSL_DEBUG=1."""
    import taskdsl.graph as tg
    from taskdsl.graph import ops

    @td.kernel(block=4)
    def scaled(S: f32[()], O: f32[4], C: i32[()], T: f32[()]):
        O[threadIdx.x] = S[()] * 2.0 + threadIdx.x
        td.atomic_add(C[()], 1)
        if threadIdx.x == 0:
            T[()] = S[()] + 1.0

    w = np.random.default_rng(0).standard_normal((8, 8)).astype(np.float32)
    x_in = tg.input("x", (4, 8), "float32")
    graph = tg.trace(lambda x: ops.clip(x @ tg.constant(w), 0.0, 6.0), x_in)    # the scalar bounds: 0-d operands
    td.debug(True)
    try:
        s, o, c, t = np.array(1.5, np.float32), np.zeros(4, np.float32), np.array(0, np.int32), np.zeros((), np.float32)
        scaled(s, o, c, t)
        compiled = graph.compile()
    finally:
        td.debug(False)
    np.testing.assert_array_equal(o, [3, 4, 5, 6])
    assert c == 4 and t == 2.5
    x = np.random.default_rng(1).standard_normal((4, 8)).astype(np.float32)
    np.testing.assert_allclose(compiled(x)[0], np.clip(x @ w, 0, 6), rtol=1e-5, atol=1e-6)
