"""CompiledGraph: calling conventions, input checks, kernels, summary, output ownership, progress bar."""
import numpy as np
import pytest

import taskdsl.graph as tg
from taskdsl.graph import ops

from . import UNFUSED, rand


def two_input_graph():
    x, b = tg.input("x", (3, 4)), tg.input("b", (4,))
    return tg.Graph([x, b], [ops.relu(ops.add(x, b)), ops.sum(x, 0)], name="g")


def test_positional_and_dict_calls():
    cg = two_input_graph().compile(target="cpu")
    x, b = rand((3, 4), 1), rand((4,), 2)
    y, s = cg(x, b)
    np.testing.assert_allclose(y, np.maximum(x + b, 0), rtol=1e-6)
    np.testing.assert_allclose(s, x.sum(0), rtol=1e-5)
    y2, _ = cg({"b": b, "x": x})
    np.testing.assert_array_equal(y, y2)
    assert cg.target == "cpu"


def test_input_errors():
    cg = two_input_graph().compile()
    x, b = rand((3, 4), 1), rand((4,), 2)
    with pytest.raises(TypeError, match=r"takes 2 input arrays \(x, b\), got 1"):
        cg(x)
    one = tg.input("x", (3, 4))
    with pytest.raises(TypeError, match=r"takes 1 input array \(x\), got 2"):
        tg.Graph([one], [ops.relu(one)], name="one")(x, x)
    with pytest.raises(ValueError, match=r"input 'b' must have shape \(4,\), got \(5,\)"):
        cg(x, rand((5,), 1))
    with pytest.raises(TypeError, match=r"dtype float32, got float64; convert it with \.astype\(np\.float32\)"):
        cg(x, b.astype(np.float64))
    with pytest.raises(TypeError, match=r"got int64; convert it with np\.asarray\(x, np\.float32\)"):   # a list
        cg(x, [1, 2, 3, 4])
    with pytest.raises(ValueError, match="missing"):
        cg({"x": x})
    with pytest.raises(ValueError, match="unknown"):
        cg({"x": x, "b": b, "c": b})
    with pytest.raises(ValueError, match=r"missing \['b'\], unknown \['bb'\]"):      # a misspelled name: both
        cg({"x": x, "bb": b})
    with pytest.raises(TypeError, match=r"input 'x' must be an array of shape \(3, 4\)"):
        cg(None, b)
    with pytest.raises(TypeError, match=r"input 'x' must be an array .* got list"):       # numpy's ValueError
        cg([[1.0, 2.0, 3.0, 4.0], [1.0]], b)
    with pytest.raises(TypeError, match="not mixed"):
        cg(x, b=b)


def test_keyword_calls_and_big_endian_inputs():
    """`cg(x=..., b=...)` was Python's "unexpected keyword argument"; a big-endian float32 array was refused as
    of another dtype, though it is converted on the way in."""
    cg = two_input_graph().compile(target="cpu")
    x, b = rand((3, 4), 1), rand((4,), 2)
    want = cg(x, b)
    for got in (cg(x=x, b=b), cg(x.astype(">f4"), b), cg.source.reference(x=x, b=b)):
        np.testing.assert_allclose(got[0], want[0], rtol=1e-6)
        np.testing.assert_allclose(got[1], want[1], rtol=1e-5)


def test_read_only_inputs_are_copied_once_bound():
    """numba compiled every kernel again for a read-only array (np.frombuffer, an image's pixels)."""
    from taskdsl.graph.graph import bind_inputs
    g = two_input_graph()
    x = rand((3, 4), 1)
    x.setflags(write=False)
    bound = bind_inputs(g, (x, rand((4,), 2)))[0]
    assert bound.flags.writeable and not np.shares_memory(bound, x)
    np.testing.assert_array_equal(bound, x)


def test_constants_are_snapshots():
    """A constant kept the caller's array: changing it afterwards reached the kernels that read it, not the
    packed matmul weights nor the folded values (one call gave 8, 9 and 2 where each should agree)."""
    w = np.full((2, 2), 1.0, np.float32)
    x = tg.input("x", (1, 2))
    c = tg.constant(w)
    g = tg.Graph([x], [ops.matmul(x, c), ops.add(ops.sum(c), x), c])
    w[:] = 2.0
    xa = np.full((1, 2), 4.0, np.float32)
    for got in (g.compile("cpu")(xa), g.compile("cpu", replay=False)(xa), g.reference(xa)):
        np.testing.assert_array_equal(got[0], [[8.0, 8.0]])
        np.testing.assert_array_equal(got[1], [[8.0, 8.0]])
        np.testing.assert_array_equal(got[2], np.ones((2, 2)))


def test_graph_and_compile_arguments_are_checked():
    x = tg.input("x", (2,))
    with pytest.raises(ValueError, match="at least one output"):
        tg.Graph([x], [])
    g = tg.Graph([x], [ops.relu(x)])
    for passes in ([1], "infer_shapes"):
        with pytest.raises(TypeError, match="passes must be a list of graph passes"):
            g.compile("cpu", passes=passes)


def test_timing_summary_after_a_failed_call_times_the_last_call_that_ran():
    """The failed call's inputs were kept, and summary(timing=True) raised its error again."""
    x = tg.input("x", (3,), "int64")
    cg = tg.Graph([x], [ops.gather(tg.constant(rand((10, 4), 3)), x)], name="gathers").compile("cpu")
    cg(np.array([1, 2, 3]))
    with pytest.raises(IndexError, match="out of range"):
        cg(np.array([1, 2, 30]))
    assert "total" in cg.summary(timing=True)


def test_kernels_and_summary():
    cg = two_input_graph().compile()
    cg(rand((3, 4), 1), rand((4,), 2))
    names = [k.name for k in cg.kernels]
    assert len(names) == 3 and any("add" in n for n in names) and any("reduce_sum" in n for n in names)
    text = cg.summary()
    assert "CompiledGraph g: 3 operators, 3 kernels, target cpu" in text
    assert "peak activation memory" in text and "reduce_sum" in text
    timed = cg.summary(timing=True)
    assert " ms" in timed.splitlines()[2] + timed and "total" in timed.splitlines()[-1]


def _gather_reshape_sum():
    """gather (whose index check is a replayed action), reshape (a view: no kernel), exp, sum."""
    idx = tg.input("idx", (6,), "int64")
    rows = ops.gather(tg.constant(rand((10, 4), 3)), idx)
    return tg.Graph([idx], [ops.sum(ops.exp(ops.reshape(rows, (4, 6))), 1)], name="timed")


def test_replayed_timing_gives_each_operator_the_launches_it_made():
    """On the cpu with replay on, summary(timing=True) times each operator's own actions inside replays: the
    replay's marks split its launches as the operators' kernels (recorded apart, by the executor) say, a view
    takes none and no time, and the table says how it timed."""
    g = _gather_reshape_sum()
    cg = g.compile("cpu", passes=UNFUSED)
    idx = np.array([1, 2, 3, 9, 0, 5])
    (out,) = cg(idx)
    np.testing.assert_allclose(out, np.exp(rand((10, 4), 3)[idx].reshape(4, 6)).sum(1), rtol=1e-5)
    assert cg.replay.startswith("on")
    replay, kinds = cg._replay, [op.kind for op in cg.graph.nodes]
    ends = [0] + list(replay.step_ends)
    launches = [sum(type(a).__name__ == "RecordedLaunch" for a in replay.actions[b:e]) for b, e in zip(ends, ends[1:])]
    assert ends[-1] == len(replay.actions) and launches == [len(kernels) for kernels, _ in cg._records]
    assert launches[kinds.index("reshape")] == 0 and launches[kinds.index("gather")] >= 1
    times, how = cg.operator_times(repeat=2)
    assert times.shape == (len(kinds),) and times[kinds.index("reshape")] == 0 and (times >= 0).all()
    assert "replays" in how and how in cg.summary(timing=True, repeat=2).splitlines()[-1]


def test_timing_without_replay_runs_operator_by_operator():
    cg = _gather_reshape_sum().compile("cpu", passes=UNFUSED, replay=False)
    cg(np.array([0, 1, 2, 3, 4, 5]))
    times, how = cg.operator_times(repeat=1)
    assert len(times) == len(cg.graph.nodes) and "operator by operator" in how


def test_outputs_never_alias_inputs():
    x = tg.input("x", (2, 3))
    g = tg.Graph([x], [x, ops.reshape(x, (6,)), ops.exp(x)])
    xa = rand((2, 3), 1)
    same, flat, _ = g(xa)
    same[0, 0] = 100.0
    flat[0] = 100.0
    assert xa[0, 0] != 100.0


@pytest.mark.parametrize("replay", [True, False])
def test_an_output_viewing_a_constant_is_a_copy(replay):
    """Run operator by operator, a reshaped constant (one fold_constants leaves, here no pass folds it) was handed
    out as a view of the constant: writing into it changed what later calls computed."""
    w = np.arange(12, dtype=np.float32).reshape(3, 4)
    x = tg.input("x", (4,))
    flat = ops.reshape(tg.constant(w), (-1,))
    cg = tg.Graph([x], [flat, ops.add(ops.sum(flat), ops.sum(x))]).compile(passes=[], replay=replay)
    out, total = cg(np.zeros(4, np.float32))
    out[:] = 0
    np.testing.assert_array_equal(cg(np.zeros(4, np.float32))[0], w.ravel())
    assert cg(np.ones(4, np.float32))[1] == w.sum() + 4 == total + 4


def test_onnx_graph_is_directly_callable():
    from onnx import helper

    from . import make_model
    model = make_model([helper.make_node("Sigmoid", ["x"], ["y"])], [("x", [5])], [("y", [5])])
    g = tg.from_onnx(model)
    x = rand((5,), 3)
    np.testing.assert_allclose(g(x)[0], 1 / (1 + np.exp(-x)), rtol=1e-6)


def test_progress_bar_for_big_graphs(monkeypatch, capsys):
    monkeypatch.setenv("TASKDSL_PROGRESS", "1")
    x = tg.input("x", (4,))
    t = x
    for _ in range(24):
        t = ops.relu(t)
    tg.Graph([x], [t], name="deep").compile(passes=UNFUSED)      # 24 operators, not one fused one
    err = capsys.readouterr().err
    assert "compiling deep" in err and "24/24" in err
    tg.Graph([x], [ops.relu(x)], name="tiny").compile()
    assert "compiling tiny" not in capsys.readouterr().err


@pytest.mark.parametrize("columns", [40, 100, 200])
def test_the_progress_bar_fits_the_terminal(columns, monkeypatch, capsys):
    """Each redraw was padded to 100 characters: on an 80-column terminal the line wrapped, and each redraw
    scrolled instead of drawing over the last."""
    from taskdsl.runtime.progress import Progress
    monkeypatch.setenv("COLUMNS", str(columns))
    with Progress(12, "compiling a graph with a long name", show=True) as bar:
        for k in range(12):
            bar.step(note=f"best {k * 1.5:.3f} ms, and a long note after it" if k % 2 else None)
    lines = capsys.readouterr().err.replace("\n", "\r").split("\r")
    assert all(len(line) <= columns - 1 for line in lines) and any("12/12" in line for line in lines)


def test_cpu_kernels_compile_ahead_in_parallel(tmp_path, monkeypatch):
    # A fresh cache and two compile processes: the warm-up's launches are recorded, compiled by the
    # workers, then run; the results are those of the numpy reference.
    monkeypatch.setenv("TASKDSL_CACHE_DIR", str(tmp_path))
    monkeypatch.setenv("TASKDSL_COMPILE_WORKERS", "2")
    x = tg.input("x", (5, 7))
    g = tg.Graph([x], [ops.softmax(ops.mul(ops.sigmoid(x), ops.tanh(x)), -1)], name="ahead")
    cg = g.compile(target="cpu")
    feed = rand((5, 7), 3)
    np.testing.assert_allclose(cg(feed)[0], g.reference({"x": feed})[0], rtol=1e-5, atol=1e-6)
    assert len({id(k) for k in cg.kernels}) >= 2
