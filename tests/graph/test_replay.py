"""cpu launch replay (graph/replay.py): a call issues the recorded launches again; it gives what an
operator-by-operator run gives, refuses graphs whose runs the host computes part of, and keeps value checks."""
import gc
import weakref

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import taskdsl as td
import taskdsl.graph as tg
from taskdsl.graph import ops, runners
from taskdsl.graph.ops import Reduce

from . import rand


def chain(n: int, m: int):
    """relu(x @ w + b), its row sums and x itself: a matmul with a fused epilogue, a reduction, an input output."""
    x = tg.input("x", (n, m))
    w = tg.constant(rand((m, 5), 3), name="w")
    b = tg.constant(rand((5,), 4), name="b")
    y = ops.relu(ops.add(ops.matmul(x, w), b))
    return tg.Graph([x], [y, ops.sum(y, 1), x, y], name="chain")


@settings(max_examples=6, deadline=None)
@given(n=st.sampled_from([1, 2, 7, 13]), m=st.sampled_from([1, 3, 8, 17]), seed=st.integers(0, 10))
def test_replay_gives_what_a_run_gives(n, m, seed):
    """Each call of a replayed graph matches the operator-by-operator run and numpy, with fresh outputs."""
    g = chain(n, m)
    cg, run = g.compile("cpu"), g.compile("cpu", replay=False)
    assert cg.replay.startswith("on (") and run.replay == "off (replay=False)"
    w, b = (t.value for t in g.constants if t.ndim == 2), (t.value for t in g.constants if t.ndim == 1)
    w, b = next(w), next(b)
    first = None
    for k in range(3):
        x = rand((n, m), seed + k)
        got, want = cg(x), run(x)
        for a, e in zip(got, want):
            np.testing.assert_array_equal(a, e)
        np.testing.assert_allclose(got[0], np.maximum(x @ w + b, 0), rtol=1e-5, atol=1e-5)
        assert got[2] is not x and not np.shares_memory(got[0], got[3])
        if first is None:
            first = [a.copy() for a in got], got
    kept, returned = first
    for a, e in zip(returned, kept):       # a later call did not write into an earlier call's results
        np.testing.assert_array_equal(a, e)


def test_host_work_turns_replay_off_with_the_reason():
    """Weights given as a graph input are laid out on the host at every call: no replay, and it says why."""
    x, w = tg.input("x", (1, 3, 8, 8)), tg.input("w", (4, 3, 3, 3))
    g = tg.Graph([x, w], [ops.conv2d(x, w, padding=1)])
    cg = g.compile("cpu")
    assert cg.replay.startswith("off (the host computed part of a run") and "weights" in cg.replay
    assert "replay: off" in cg.summary()
    xs, ws = rand((1, 3, 8, 8), 1), rand((4, 3, 3, 3), 2)
    want = g.compile("cpu", replay=False)(xs, ws)[0]
    np.testing.assert_array_equal(cg(xs, ws)[0], want)


def test_host_work_nobody_noted_is_caught_by_the_probe(monkeypatch):
    """A runner that sums on the host without saying so: the replay of the probe disagrees with a run, so
    replay stays off and calls stay right."""
    def numpy_sum(op, arrays):
        return [arrays[0].sum(axis=op.attrs["axes"], keepdims=op.attrs["keepdims"])], []
    monkeypatch.setitem(runners.RUNNERS, Reduce, numpy_sum)
    x = tg.input("x", (4, 6))
    g = tg.Graph([x], [ops.exp(ops.sum(ops.relu(x), 1))])
    cg = g.compile("cpu")
    assert cg.replay.startswith("off (a replay on probe inputs gave another output 0 than a run")
    xs = rand((4, 6), 5)
    np.testing.assert_allclose(cg(xs)[0], np.exp(np.maximum(xs, 0).sum(1)), rtol=1e-5)


def test_replay_keeps_the_value_checks():
    """gather's index check runs at every replayed call: an index out of range is an IndexError, not a clamp."""
    table = tg.constant(rand((10, 4), 1), name="table")
    ids = tg.input("ids", (3,), "i64")
    g = tg.Graph([ids], [ops.exp(ops.gather(table, ids))])
    cg = g.compile("cpu")
    assert cg.replay.startswith("on (")
    good = np.array([0, 9, -10], np.int64)
    np.testing.assert_allclose(cg(good)[0], np.exp(table.value[good]), rtol=1e-6)
    with pytest.raises(IndexError, match="out of range"):
        cg(np.array([0, 10, 1], np.int64))


def test_debug_calls_run_operator_by_operator(monkeypatch):
    """In debug mode a call takes the operator-by-operator path (with debug kernels), not the replay."""
    g = chain(3, 4)
    cg = g.compile("cpu")
    monkeypatch.setattr(cg._replay, "run", lambda arrays: pytest.fail("replayed in debug mode"))
    td.debug(True)
    try:
        x = rand((3, 4), 2)
        np.testing.assert_array_equal(cg(x)[0], g.compile("cpu", replay=False)(x)[0])
    finally:
        td.debug(False)


@pytest.mark.parametrize("options", [dict(arena=False), dict(passes=[]), dict(channels_last=True)])
def test_replay_under_other_build_options(options):
    """Without the arena (every activation its own array), without any pass (views of constants, unfused
    operators) and with the NHWC layout pass, replayed calls still match numpy on new inputs."""
    x = tg.input("x", (1, 3, 6, 6))
    w = tg.constant(rand((4, 3, 3, 3), 7), name="w")
    y = ops.relu(ops.conv2d(x, w, padding=1))
    g = tg.Graph([x], [ops.reshape(y, (4, 36)), ops.sum(y, (2, 3)), ops.reshape(w, (4, 27))], name="conv")
    cg = g.compile("cpu", **options)
    assert cg.replay.startswith("on (")
    for seed in (1, 2):
        xs = rand((1, 3, 6, 6), seed)
        for got, want in zip(cg(xs), g.reference(xs)):
            np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)


class _UncallableDispatcher:
    """A numba dispatcher whose calls fail: its compiles and compiled overloads are the real one's."""

    def __init__(self, dispatcher):
        self._dispatcher = dispatcher

    def __getattr__(self, name):
        return getattr(self._dispatcher, name)

    def __call__(self, *args):
        raise AssertionError("the launcher's dispatcher was called")


def test_launches_call_the_launchers_compiled_entry(monkeypatch):
    """Prepared launches and replays call `parallel.launch` through its compiled entry (`launch._compile`'s),
    not its dispatcher, which types every argument at each call (about a microsecond a launch): with the dispatcher's
    calls made to fail, a compiled graph runs, records and replays, on writable and read-only inputs alike (a
    replay binds the caller's array, whose byte view differs from the recorded one's type in that flag only)."""
    from taskdsl.backend.cpu import launch
    x = tg.input("x", (7, 8))
    w, b = rand((8, 5), 3), rand((5,), 4)
    g = tg.Graph([x], [ops.relu(ops.add(ops.matmul(x, tg.constant(w)), tg.constant(b)))], name="bound")
    cg, run = g.compile("cpu"), g.compile("cpu", replay=False)
    for compiled in (cg, run):
        compiled(rand((7, 8), 0))
    monkeypatch.setattr(launch, "launch", _UncallableDispatcher(launch.launch))
    for seed in range(4):
        xs = rand((7, 8), seed)
        xs.flags.writeable = seed % 2 == 0
        for compiled in (cg, run):
            np.testing.assert_allclose(compiled(xs)[0], np.maximum(xs @ w + b, 0), rtol=1e-5, atol=1e-5)
    assert cg.replay.startswith("on (") and [type(p).__name__ for p in cg._replay._inputs] == ["_Bound"]


def test_replay_reads_the_callers_inputs_without_copying_them():
    """A replay binds each input array a kernel reads (whole, or a contiguous slice of it at an offset) in place of
    the recorded buffer, and copies in an input an output shares memory with; results match numpy on every call,
    inputs are left as they were, and no output shares memory with an input."""
    x, z = tg.input("x", (16, 16)), tg.input("z", (3, 5))
    rows = ops.slice(x, [4], [12])                  # a view at 256 bytes into x
    g = tg.Graph([x, z], [ops.relu(rows), ops.mul(x, 2.0), ops.reshape(z, (15,)), ops.neg(z)], name="bound")
    cg = g.compile("cpu")
    assert cg.replay.startswith("on (")
    assert [type(p).__name__ for p in cg._replay._inputs] == ["_Bound", "_CopiedIn"]
    for seed in range(3):
        xs, zs = rand((16, 16), seed), rand((3, 5), seed + 10)
        kept = xs.copy(), zs.copy()
        relu_rows, doubled, flat, negated = cg(xs, zs)
        np.testing.assert_array_equal(relu_rows, np.maximum(xs[4:12], 0))
        np.testing.assert_array_equal(doubled, xs * 2)
        np.testing.assert_array_equal(flat, zs.reshape(15))
        np.testing.assert_array_equal(negated, -zs)
        np.testing.assert_array_equal(xs, kept[0])
        np.testing.assert_array_equal(zs, kept[1])
        assert not any(np.shares_memory(o, a) for o in (relu_rows, doubled, flat, negated) for a in (xs, zs))


def test_a_replay_keeps_no_results_alive():
    """After a replayed call its launches hold neither its outputs nor its inputs: dropping the outputs frees them
    (a replay held a call's results until the next call; the last inputs are the compiled graph's, for
    `summary(timing=True)`); the next call's results are still right."""
    x = tg.input("x", (6, 8))
    y = ops.relu(ops.matmul(x, tg.constant(rand((8, 5), 3))))
    cg = tg.Graph([x], [y, ops.sum(y, 1)]).compile("cpu")
    assert cg.replay.startswith("on (")
    x = rand((6, 8), 1)
    outputs = cg(x)
    assert type(cg._replay._inputs[0]).__name__ == "_Bound"
    refs = [weakref.ref(a) for a in outputs]
    del outputs
    gc.collect()
    assert [r() is None for r in refs] == [True, True]
    assert all(slot.action.args[slot.index] is None for slot in cg._replay._inputs[0].slots)
    x = rand((6, 8), 2)
    y, sums = cg(x)
    np.testing.assert_allclose(y, np.maximum(x @ rand((8, 5), 3), 0), rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(sums, y.sum(1), rtol=1e-5, atol=1e-6)


def test_a_replay_writing_into_its_inputs_is_refused(monkeypatch):
    """The probe check refuses a replay that changes its input arrays (a kernel may only read a graph's inputs)."""
    from taskdsl.graph import replay as replay_module
    real_run = replay_module.CpuReplay.run

    def scribbling_run(self, arrays):
        outputs = real_run(self, arrays)
        arrays[0][...] = 0
        return outputs

    monkeypatch.setattr(replay_module.CpuReplay, "run", scribbling_run)
    x = tg.input("x", (4, 4))
    cg = tg.Graph([x], [ops.relu(x)]).compile("cpu")
    assert cg.replay == "off (a replay on probe inputs wrote into them)"


def test_a_replay_issues_its_launches_in_one_native_loop(monkeypatch):
    """Each run of launches between value checks is one `NativeReplay` (`threads.replay`): no launch goes through
    its launcher's Python entry, the ones a call binds to its arrays are packed again, and a launch shared out to
    the helper threads runs there too. Calls on other inputs match the operator-by-operator run."""
    from taskdsl.backend.cpu import launch
    monkeypatch.setenv("TASKDSL_NUM_THREADS", "2")
    x, h = tg.input("x", (1, 16)), tg.input("h", (512, 1024))
    w = tg.constant(rand((16, 16), 3) / 4)
    state = x
    for _ in range(6):              # a recurrence's small launches, and one of 2 MiB
        state = ops.tanh(ops.matmul(state, w))
    g = tg.Graph([x, h], [state, ops.mul(ops.sigmoid(h), 2.0)], name="recurrent")
    cg, run = g.compile("cpu"), g.compile("cpu", replay=False)
    natives = [issue for issue in cg._replay._issues if isinstance(issue, launch.NativeReplay)]
    assert cg.replay.startswith("on (") and len(natives) == 1 == len(cg._replay._issues)
    assert max(row.workers for row in natives[0].launches) == 2 and natives[0].rebound
    monkeypatch.setattr(launch.RecordedLaunch, "__call__", lambda self: pytest.fail("a launch's Python entry ran"))
    for seed in range(3):
        feeds = rand((1, 16), seed), rand((512, 1024), seed + 5)
        got, want = cg(*feeds), run(*feeds)
        for a, b in zip(got, want):
            np.testing.assert_array_equal(a, b)


def test_a_native_replay_that_fails_raises(monkeypatch):
    """A launch the native loop reports failed is issued again through its launcher, whose call raises the kernel's
    own exception; one that then succeeds is a RuntimeError naming the likely cause."""
    from taskdsl.backend.cpu import launch
    x = tg.input("x", (4, 8))
    cg = tg.Graph([x], [ops.tanh(ops.matmul(x, tg.constant(rand((8, 8), 2))))]).compile("cpu")
    assert cg.replay.startswith("on (")
    monkeypatch.setattr(launch.threads, "replay", lambda state, table: 0)
    with pytest.raises(RuntimeError, match="scratch allocation failed"):
        cg(rand((4, 8), 1))
