"""The tuner's keys, failures and stored records: what an audit of schedule spaces and tuning found."""
import json

import numpy as np
import pytest

import taskdsl as td
from taskdsl.backend.cpu import vectors
from taskdsl.runtime import config
from taskdsl.schedule import tuner
from taskdsl.schedule.space import Space


class Fake:
    """A "kernel" whose time is its point's `t` (the timer below reads it), recording every run."""

    runs: list = []

    def __init__(self, p):
        self.p = p

    def compile(self, *args, target):
        pass

    def __call__(self, *args):
        Fake.runs.append(self.p)


@pytest.fixture
def timed(tmp_path, monkeypatch):
    """A fresh cache, tuning on, and a timer that reads each candidate's time off its point."""
    monkeypatch.setenv("TASKDSL_CACHE_DIR", str(tmp_path))
    monkeypatch.setenv("TASKDSL_TUNE", "1")
    Fake.runs = []
    timer = lambda fn: (fn(), float(Fake.runs[-1]["t"]))[1]
    monkeypatch.setattr(tuner, "_timer", lambda target: (timer, timer))
    return tmp_path


def tune_toy(space, build=Fake, target="cpu", op="toy", **options):
    return tuner.tune(space, build, (), op=op, shapes=((8, 8),), dtypes=("f32",), default=space.points()[-1],
                      target=target, show=False, **options)


def test_cpu_winners_are_keyed_by_the_threads_and_cpu_they_ran_on(timed, monkeypatch):
    """A cpu winner ranks kernels on one CPU model, vector width and thread count (which also decides split-k):
    the key had only the machine type and core count ('cpu x86_64 x2'), so a winner tuned with
    TASKDSL_NUM_THREADS=1, TASKDSL_CPU_VECTOR_BITS=128 or on another x86_64 part of as many cores was reused."""
    space = Space("toy", {"t": (3, 1, 2)})
    monkeypatch.setenv("TASKDSL_NUM_THREADS", "1")
    assert tune_toy(space).t == 1
    Fake.runs.clear()
    assert tune_toy(space).t == 1 and not Fake.runs          # the same settings: the stored winner
    for setting in ("threads", "vectors", "cpu"):
        if setting == "threads":
            monkeypatch.setenv("TASKDSL_NUM_THREADS", "2")
        elif setting == "vectors":
            other = vectors.AVX2 if vectors.host().bits == 128 else vectors.SSE   # a width this host does not have
            monkeypatch.setattr(vectors, "host", lambda: other)
        else:
            from numba.core import config as numba_config
            monkeypatch.setattr(numba_config, "CPU_NAME", "some-other-cpu")
        tune_toy(space)
        assert {p.t for p in Fake.runs} == {1, 2, 3}, setting     # tuned anew
        Fake.runs.clear()
        tune_toy(space)
        assert not Fake.runs, setting                                  # ...and stored apart


def test_debug_mode_winners_are_kept_apart(timed, monkeypatch):
    """On the cpu, debug mode checks every access: a winner ranked on that code is not one for normal runs."""
    space = Space("toy", {"t": (3, 1, 2)})
    monkeypatch.setitem(config._state, "debug", True)
    tune_toy(space)
    monkeypatch.setitem(config._state, "debug", False)
    Fake.runs.clear()
    tune_toy(space)
    assert {p.t for p in Fake.runs} == {1, 2, 3}


def test_failing_candidates_are_reported_with_their_error(timed):
    """A candidate that fails is skipped, with a warning that says which and why (it was silent: with every
    candidate failing, the default came back as if tuned, and the next process timed them all again)."""
    space = Space("toy", {"t": (3, 1, 2)})

    def build(p):
        if p.t == 1:
            raise RuntimeError("no such intrinsic")
        return Fake(p)
    with pytest.warns(UserWarning, match=r"1 of 3 candidates failed.*t=1.*no such intrinsic"):
        assert tune_toy(space, build).t == 2
    broken = lambda p: (_ for _ in ()).throw(ValueError("bad template"))
    with pytest.warns(UserWarning, match=r"3 of 3 candidates failed.*default.*bad template"):
        assert tune_toy(space, broken, op="broken") == space.points()[-1]
    assert len(list(timed.glob("tune/*.json"))) == 1       # the first tuning's record: none without a winner


def test_cuda_compile_errors_are_reported(simulated_gpu, timed):      # simulated_gpu first: it turns tuning off
    """On cuda a candidate that NVRTC refuses was skipped as 'did not compile', its error dropped."""
    class Refused(Fake):
        def compile(self, *args, target):
            if self.p.t == 3:
                raise RuntimeError("NVRTC: too many resources")
    with pytest.warns(UserWarning, match=r"1 of 3 candidates failed.*t=3.*NVRTC: too many resources"):
        assert tune_toy(Space("toy", {"t": (3, 1, 2)}), Refused, target="cuda").t == 1


def test_a_candidate_that_loses_the_gpu_context_stops_tuning(simulated_gpu, timed):
    """An illegal address (a sticky CUDA error) leaves the context unusable: every later candidate would fail and
    the winner of those before would be stored. Tuning stops there, naming the point, and stores nothing."""
    class Crashes(Fake):
        def __call__(self, *args):
            if self.p.t == 1:
                raise RuntimeError("CUDA driver call failed: CUDA_ERROR_ILLEGAL_ADDRESS (700)")
            super().__call__(*args)
    crash = r"candidate Point\(t=1\) failed on the GPU .*ILLEGAL_ADDRESS.*nothing was stored"
    with pytest.raises(RuntimeError, match=crash):
        tune_toy(Space("toy", {"t": (3, 1, 2)}), Crashes, target="cuda")
    assert not list(timed.glob("tune/*"))


def test_numpy_valued_axes_store_their_winner(timed):
    """Axes built with numpy (`tuple(2 ** np.arange(3))`) hold numpy scalars, which JSON cannot write: tuning
    timed every candidate and then died storing the winner, the work lost."""
    space = Space("toy", {"t": tuple(np.arange(3, 0, -1)), "w": (np.float32(0.5),)})
    best = tune_toy(space)
    assert best.t == 1
    Fake.runs.clear()
    again = tune_toy(space)
    assert again == best and not Fake.runs                              # from the stored record
    assert all(isinstance(v, np.generic) for _, v in again.values)     # the space's own values, as tuned
    record = json.loads(next((timed / "tune").glob("*.json")).read_text())
    assert record["point"] == {"t": 1, "w": 0.5}


def test_axis_values_json_cannot_store_are_refused_before_timing(timed):
    """A value no record can hold (an object) is a TypeError before anything is timed, not after all of it."""
    space = Space("toy", {"t": (1, 2), "how": (object(),)})
    with pytest.raises(TypeError, match="toy.*how"):
        tune_toy(space)
    assert not Fake.runs


def test_a_point_off_the_axes_is_not_a_point_of_the_space():
    """`space.point` promises a ValueError for a point that is not valid; a value off an axis passed."""
    space = Space("widths", {"per_thread": (1, 2, 4)})
    assert space.point(per_thread=2) in space.points()
    with pytest.raises(ValueError, match="per_thread=3.*1, 2, 4"):
        space.point(per_thread=3)
    checked = Space("tiles", {"bm": (32, 64)}, lambda p: "too big" if p.bm > 32 else None)
    with pytest.raises(ValueError, match="too big"):
        checked.point(bm=64)
    with pytest.raises(ValueError, match="bm=128"):
        checked.point(bm=128)


def test_a_check_that_raises_leaves_no_half_enumerated_space(timed):
    """The points found before the check raised were kept: the next call listed only those, and the tuner timed
    and stored the best of them as the space's winner."""
    flaky = {"first": True}

    def check(p):
        if p.t == 5 and flaky.pop("first", False):
            raise RuntimeError("transient failure in check")
        return None

    space = Space("flaky", {"t": (20, 5, 1)}, check)
    with pytest.raises(RuntimeError, match="transient"):
        space.points()
    assert [p.t for p in space.points()] == [20, 5, 1]
    assert tune_toy(space).t == 1


def test_space_and_point_misuse_is_named():
    """Axes named like a Point's own attributes could not be read; a typo in `replace` was dropped; a check's
    reason that is no string failed in a Counter; an axis of one value or of repeated values, or a tuning space
    with no valid point, gave no word."""
    with pytest.raises(ValueError, match="axis name 'values' must be an identifier other than a Point's own"):
        Space("clash", {"block": (64,), "values": (1, 2)})
    with pytest.raises(TypeError, match="axis 'a' needs a tuple of choices, got 5"):
        Space("scalar", {"a": 5})
    with pytest.raises(ValueError, match=r"axis 'a' repeats a choice: \(1, 1, 2\)"):
        Space("repeats", {"a": (1, 1, 2)})
    with pytest.raises(TypeError, match="its check must return a reason string or None, got \\['no'\\]"):
        Space("listed", {"a": (1,)}, lambda p: ["no"]).points()
    space = Space("tile", {"block": (64, 128), "flag": (True, False)})
    point = space.point(block=64.0, flag=1)
    assert point == space.point(block=64, flag=True) and point["block"] == 64 and point.flag is True
    with pytest.raises(ValueError, match="has no axis blok"):
        point.replace(blok=128)
    with pytest.raises(KeyError):
        point["blok"]


def test_tuning_a_space_with_no_valid_point_says_so(timed):
    space = Space("empty", {"t": (1, 2)}, lambda p: "never fits")
    with pytest.warns(UserWarning, match=r"the space has no valid point \(its checks pruned all 2: "
                                         r"\{'never fits': 2\}\)"):
        chosen = tuner.tune(space, Fake, (), op="empty", shapes=((8,),), dtypes=("f32",),
                            default=Space("any", {"t": (1,)}).point(t=1), target="cpu", show=False)
    assert chosen.t == 1 and Fake.runs == []


def test_keyboard_interrupt_while_timing_stores_nothing(timed):
    """Ctrl-C in the middle of tuning leaves no record, partial or stale: the next tuning times every point."""
    space = Space("toy", {"t": (3, 1, 2)})

    def build(p):
        if p.t == 2:
            raise KeyboardInterrupt
        return Fake(p)
    with pytest.raises(KeyboardInterrupt):
        tune_toy(space, build)
    assert not list(timed.glob("tune/*"))
    Fake.runs.clear()
    assert tune_toy(space).t == 1 and {p.t for p in Fake.runs} == {1, 2, 3}


def cpu_cut(tmp_path, monkeypatch) -> Space:
    """Tuning on, into `tmp_path`, in fast-compile mode, over a two-point cut of the cpu register-tile space
    (returned), neither point the default of a 20x30 @ 30x17 product (bk 256); no plan kept from another test."""
    import dataclasses
    from stdlib_ops import gemm, matmul_cpu as cpu
    monkeypatch.setenv("TASKDSL_CACHE_DIR", str(tmp_path))
    monkeypatch.setenv("TASKDSL_TUNE", "1")
    monkeypatch.setitem(config._state, "fast_compile", True)
    cut = Space("tile_matmul_cpu", {"micro": ((2, 8), (4, 8)), "block": ((16, 64),), "bk": (128,)},
                cpu.space(4).check)
    monkeypatch.setattr(gemm, "CPU_TILE", dataclasses.replace(gemm.CPU_TILE, space=lambda target, itemsize: cut))
    monkeypatch.setattr(gemm, "_plan", gemm._plan.__wrapped__)
    td.set_target("cpu")
    return cut


def tuned_product(tmp_path) -> dict:
    """A 20x30 @ 30x17 product tuned through `stdlib_ops.matmul` (numpy's, checked) and its stored record."""
    import stdlib_ops as ops
    rng = np.random.default_rng(3)
    a, b = rng.standard_normal((20, 30)).astype(np.float32), rng.standard_normal((30, 17)).astype(np.float32)
    np.testing.assert_allclose(ops.matmul(a, b, tune=True), a.astype(np.float64) @ b, rtol=1e-4, atol=1e-4)
    return json.loads(next((tmp_path / "tune").glob("*.json")).read_text())


def test_matmul_tuning_skips_a_wrong_point(tmp_path, monkeypatch):
    """`stdlib_ops.matmul(..., tune=True)` on the cpu, timed for real over two points, the first point's kernel
    spoiling C after it runs: the tuner, checking C against the default schedule's
    (`tests/schedule/test_tuner_results.py`), skips it and stores the other; the product is numpy's."""
    from stdlib_ops import gemm
    candidate, spoilt = gemm._candidate, cpu_cut(tmp_path, monkeypatch).points()[0]

    def spoiled(plan, *form):
        kernel = candidate(plan, *form)
        if plan.point != spoilt:
            return kernel

        def run(a, b, c, *rest):
            kernel(a, b, c, *rest)
            c[0, -1, -1] *= 1.5
        return run
    monkeypatch.setattr(gemm, "_candidate", spoiled)
    with pytest.warns(UserWarning, match=r"1 of 2 candidates failed.*micro=\(2, 8\).*WrongResult"):
        record = tuned_product(tmp_path)
    assert record["point"]["micro"] == [4, 8] and record["failed"] == 1 and record["checked"] is True


def test_where_calls_pack_b_the_tuner_times_the_kernel_for_packed_b(tmp_path, monkeypatch):
    """A large product packs B before its kernel (`packs_per_call`), but the tuner timed the kernel for B as
    given: a winner ranked on code the call never runs. Every kernel tuning and the call launch is the one for
    B's panels (the threshold lowered to this product). The product is numpy's, the winner one of the two."""
    from stdlib_ops import gemm
    cut_points = [json.loads(json.dumps(tuner._point_json(p))) for p in cpu_cut(tmp_path, monkeypatch).points()]
    monkeypatch.setattr(gemm, "PACK_PER_CALL_MACS", 20 * 30 * 17)
    launched, call = [], td.Kernel.__call__
    monkeypatch.setattr(td.Kernel, "__call__", lambda self, *args: (launched.append(self.name), call(self, *args)))
    record = tuned_product(tmp_path)
    assert record["candidates"] == 2 and record["failed"] == 0 and record["point"] in cut_points
    assert len(launched) > 6 and all(name.endswith("_packed") for name in launched), launched


def test_numpy_integer_shapes_key_their_tuning_as_python_ints(monkeypatch):
    """Records are keyed by the shapes' `repr`, and numpy's ints print as `np.int64(20)`: a product planned from
    numpy-int sizes was tuned again beside the same product from Python ints. A float size is refused."""
    from stdlib_ops import gemm
    from stdlib_ops.conv_geometry import geometry
    seen = []
    monkeypatch.setattr(gemm, "tune", lambda space, build, args, *, shapes, default, **options: (
        seen.append(repr(shapes)), default)[1])
    monkeypatch.setattr(gemm, "_plan", gemm._plan.__wrapped__)
    monkeypatch.setenv("TASKDSL_TUNE", "1")
    gemm.plan(np.array([20, 30]), (np.int32(30), 17), td.f32, "cpu", do_tune=True)
    assert seen == ["((20, 30), (30, 17))"]
    with pytest.raises(TypeError, match="matmul: shapes must be integers"):
        gemm.plan((20.0, 30), (30, 17), td.f32, "cpu")
    assert repr(geometry(np.array([1, 3, 8, 8]), (np.int64(4), 3, 3, 3))) == \
        repr(geometry((1, 3, 8, 8), (4, 3, 3, 3)))


def test_a_plan_made_with_tuning_off_is_not_kept_once_it_is_on(tmp_path, monkeypatch):
    """TASKDSL_TUNE is read at each call, but `gemm.plan` cached its plans by shape: one made under TASKDSL_TUNE=0
    stayed untuned after tuning was turned back on in the same process (a notebook's os.environ)."""
    from stdlib_ops import gemm
    monkeypatch.setenv("TASKDSL_CACHE_DIR", str(tmp_path))
    tuned = []
    def tune(space, *args, default, **options):      # records the tunings that would time (the tuner's own test)
        if tuner.tuning_enabled():
            tuned.append(space)
        return default
    monkeypatch.setattr(gemm, "tune", tune)
    gemm._plan.cache_clear()
    shapes = ((20, 30), (30, 17), td.f32, "cpu")
    monkeypatch.setenv("TASKDSL_TUNE", "0")
    untuned = gemm.plan(*shapes, do_tune=True)
    monkeypatch.setenv("TASKDSL_TUNE", "1")
    gemm.plan(*shapes, do_tune=True)
    assert len(tuned) == 1 and gemm.plan(*shapes, do_tune=True).point == untuned.point
    gemm._plan.cache_clear()


def test_an_unchecked_winner_is_not_served_to_a_checked_call_and_keys_and_targets_are_one(timed):
    """A winner chosen with no results check (no `outputs`, or a default that failed) was served to a later call that
    asks for the check, however wrong its results; `shapes` as lists or numpy ints keyed records of their own; a
    misspelled target ('gpu', 'CPU') ran as the cpu."""
    space = Space("toy", {"t": (3, 1, 2)})
    assert tune_toy(space).t == 1
    record = json.loads(next((timed / "tune").iterdir()).read_text())
    assert record["checked"] is False
    found = lambda checked: tuner.cached_winner(space, "toy", ((8, 8),), ("f32",), "cpu", checked=checked)
    assert found(False).t == 1 and found(True) is None
    Fake.runs.clear()
    for shapes in ([[8, 8]], ((np.int64(8), np.int32(8)),)):
        assert tuner.tune(space, Fake, (), op="toy", shapes=shapes, dtypes=("f32",), default=space.points()[-1],
                          target="cpu", show=False).t == 1
    assert not Fake.runs and len(list((timed / "tune").iterdir())) == 1       # the stored winner, one record
    for target in ("gpu", "CPU"):
        with pytest.raises(ValueError, match=f"tuning toy: target must be 'cpu' or 'cuda', got '{target}'"):
            tune_toy(space, target=target)


def test_arguments_tune_cannot_honour_are_errors(timed):
    """A wrong `outputs` index or type, or a default that is no point of the space, was taken for the default's
    failure (tuning went on unchecked and stored its winner); an empty axis, or a list as an axis value (every
    candidate failed in the tuner's own dict), was accepted."""
    space = Space("toy", {"t": (3, 1, 2)})
    with pytest.raises(ValueError, match=r"tuning toy: outputs names argument 5, but the call has 0 arguments"):
        tune_toy(space, outputs={5: td.f32})
    with pytest.raises(TypeError, match=r"outputs' types are taskdsl types such as td.f32, got <class 'numpy"):
        tuner.tune(space, Fake, (np.zeros(2, np.float32),), op="toy", shapes=((8, 8),), dtypes=("f32",),
                   default=space.points()[-1], target="cpu", show=False, outputs={0: np.float32})
    with pytest.raises(TypeError, match=r"default must be a Point of the toy space"):
        tuner.tune(space, Fake, (), op="toy", shapes=((8, 8),), dtypes=("f32",), default={"t": 1}, show=False)
    assert not (timed / "tune").exists()
    with pytest.raises(ValueError, match="space 'empty': axis 't' has no choices"):
        Space("empty", {"t": ()})
    with pytest.raises(TypeError, match=r"space 'lists': axis 'v' has the unhashable value \[1, 2\]"):
        Space("lists", {"v": ([1, 2], [3, 4])})
    with pytest.raises(ValueError, match=r"axis 'v' has the value \(1, nan\), which is not equal to itself"):
        Space("nan", {"v": (0.5, (1, float("nan")))})


def test_the_progress_bar_counts_the_failures_to_its_last_line(timed, capsys):
    """A failing candidate stepped the bar with no note: failures at the end of the space never showed."""
    def build(p):
        if p.t != 3:
            raise RuntimeError("no kernel")
        return Fake(p)

    space = Space("toy", {"t": (3, 1, 2)})
    with pytest.warns(UserWarning, match="2 of 3 candidates failed"):
        assert tuner.tune(space, build, (), op="toy", shapes=((8, 8),), dtypes=("f32",), default=space.points()[0],
                          target="cpu", show=True).t == 3
    assert capsys.readouterr().err.rstrip().splitlines()[-1].endswith("best 3000.000 ms, 2 failed")
