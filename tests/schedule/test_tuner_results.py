"""The tuner checks a would-be winner's results against the default schedule's before it may win."""
import json
import math
import warnings

import ml_dtypes
import numpy as np
import pytest

import taskdsl as td
from taskdsl.runtime import config
from taskdsl.schedule import results, tuner
from taskdsl.schedule.space import Space

from ..simulated_gpu import host_view

SPACE = Space("toy", {"t": (3, 1, 2)})     # each point's `t` is its time; the last (t=2) is the default


@pytest.fixture
def timed(tmp_path, monkeypatch):
    """A fresh cache, tuning on, and a timer that reads each candidate's time off its point."""
    monkeypatch.setenv("TASKDSL_CACHE_DIR", str(tmp_path))
    monkeypatch.setenv("TASKDSL_TUNE", "1")
    runs = []
    timer = lambda fn: (fn(), float(runs[-1]))[1]
    monkeypatch.setattr(tuner, "_timer", lambda target: (timer, timer))
    return runs


class Doubler:
    """A "kernel" writing Y = 2 X (`dtype` values; numpy arrays, or device arrays on the simulated GPU), recording
    its point's time in `runs` at each run; `spoil` (Y -> None) spoils its output after it is written; with
    `accumulate`, Y += 2 X."""

    def __init__(self, p, runs: list, dtype, spoil=None, accumulate=False):
        self.p, self.runs, self.values, self.spoil = p, runs, td.ir.types.numpy_dtype(dtype), spoil
        self.accumulate = accumulate

    def compile(self, *args, target):
        pass

    def __call__(self, x, y):
        x, y = (a if isinstance(a, np.ndarray) else host_view(a) for a in (x, y))
        y.view(self.values)[...] = 2 * x.view(self.values) + (y.view(self.values) if self.accumulate else 0)
        if self.spoil:
            self.spoil(y)
        self.runs.append(self.p.t)


def doubler(runs: list, wrong: dict, dtype=td.f32, accumulate=False):
    """build(point): a Doubler, spoilt by `wrong[t]` at point t."""
    return lambda p: Doubler(p, runs, dtype, wrong.get(p.t), accumulate)


def tune_doubler(runs: list, wrong: dict, dtype=td.f32, space=SPACE, target="cpu", accumulate=False, **options):
    x = np.linspace(-3, 5, 37).astype(td.ir.types.numpy_dtype(dtype)).view(dtype.numpy)
    y = np.zeros_like(x)
    return tuner.tune(space, doubler(runs, wrong, dtype, accumulate), (x, y), op="toy", shapes=((37,),), dtypes=(dtype.name,),
                      default=space.points()[-1], target=target, show=False, outputs={1: dtype}, **options)


@pytest.mark.parametrize("target", ["cpu", "cuda"])
def test_a_fast_wrong_candidate_does_not_win(target, request, tmp_path):
    """The fastest point (t=1) spoils one element: it is skipped as failed, with a warning naming it and the
    difference, and the next fastest right one is stored. On cuda (a simulated GPU) the outputs are device
    arrays, poisoned and read back through the driver's copies."""
    if target == "cuda":
        request.getfixturevalue("simulated_gpu")    # first: it turns tuning off, `timed` on again
    timed = request.getfixturevalue("timed")

    def spoil(y):
        y[5] += 0.25
    with pytest.warns(UserWarning, match=r"1 of 3 candidates failed.*t=1.*WrongResult: output 1 disagrees.*"
                                         r"max difference 0\.025"):
        assert tune_doubler(timed, {1: spoil}, target=target).t == 2
    record = json.loads(next((tmp_path / "tune").glob("*.json")).read_text())
    assert record["point"] == {"t": 2} and record["failed"] == 1
    assert [t[0] for t in record["timings"]] == [{"t": 2}, {"t": 3}]


def test_an_element_left_unwritten_is_caught(timed):
    """A candidate that leaves an element alone would pass on the values an earlier run left there: outputs are
    filled with NaN before the checking run."""
    def skip_last(y):
        y[-1] = math.nan           # as unwritten: what the poisoned output held
    with pytest.warns(UserWarning, match=r"t=1.*WrongResult"):
        assert tune_doubler(timed, {1: skip_last}).t == 2


def test_only_candidates_that_would_win_are_run_again(timed):
    """The check costs a run of each candidate faster than the best so far: t=1 (timed first, the best then);
    t=3 and t=2 are slower, not checked, and t=3's wrong result cannot win."""
    def spoil(y):
        y[:] = 0
    assert tune_doubler(timed, {3: spoil}, space=Space("toy", {"t": (1, 3, 2)})).t == 1
    # the default's reference run; t=1 probed, timed in full and checked; t=3 probed only (past SLOW_CUT); t=2
    assert timed == [2, 1, 1, 1, 3, 2, 2]


def test_rounding_differences_pass(timed):
    """Another summation order or rounding of a 16-bit output is no error: a difference of an ulp of an f16 or
    bf16 output, or 1e-4 of an f32 one's largest magnitude, passes."""
    for dtype, nudge in ((td.f16, lambda y: y.__setitem__(0, np.nextafter(y[0], np.float16(0)))),
                         (td.bf16, lambda y: y.__setitem__(0, y[0] - 1)),      # bf16 bits: one ulp toward zero
                         (td.f32, lambda y: y.__setitem__(0, y[0] * (1 + 1e-4)))):
        timed.clear()
        assert tune_doubler(timed, {1: nudge}, dtype, force=True).t == 1, dtype


def test_bf16_outputs_are_compared_as_values_not_bits(timed):
    """bf16 arrays hold the bits (uint16): a sign flip is 32768 bits away and a wrong value; it must be seen as
    a value."""
    def negate(y):
        y[3] ^= 0x8000
    with pytest.warns(UserWarning, match="WrongResult"):
        assert tune_doubler(timed, {1: negate}, td.bf16).t == 2


def test_without_a_usable_default_the_results_go_unchecked_with_a_warning(timed):
    """A default that fails gives nothing to check against: tuning goes on unchecked, and says so."""
    def broken(p):
        if p.t == 2:
            raise RuntimeError("no such intrinsic")
        return doubler(timed, {})(p)
    x, y = np.ones(4, np.float32), np.zeros(4, np.float32)
    with pytest.warns(UserWarning) as caught:
        tuner.tune(SPACE, broken, (x, y), op="toy", shapes=((4,),), dtypes=("f32",), default=SPACE.points()[-1],
                   target="cpu", show=False, outputs={1: td.f32})
    assert [str(w.message).split(": ", 1)[1] for w in caught] == [
        "1 of 3 candidates failed and were skipped (first: Point(t=2): RuntimeError: no such intrinsic)",
        "the candidates' results were not checked: the default failed: RuntimeError: no such intrinsic"]


def test_a_kernel_that_reads_its_output_is_checked_from_the_given_values(timed):
    """Y += 2 X reads the NaN the check fills Y with: every candidate's check was NaN, so tuning went unchecked
    ("the default left elements unwritten"). The checks start from Y's given values now, and still catch a
    wrong candidate, one that skips an element included."""
    with pytest.warns(UserWarning, match=r"1 of 3 candidates failed.*t=1.*WrongResult"):
        assert tune_doubler(timed, {1: lambda y: y.__setitem__(5, 0)}, accumulate=True).t == 2
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert tune_doubler(timed, {}, accumulate=True, force=True).t == 1


def test_a_default_whose_output_holds_nan_is_still_the_reference(timed):
    """A NaN the default computes (from the outputs' given values too) is part of its result: a candidate
    without it disagrees."""
    with pytest.warns(UserWarning, match=r"2 of 3 candidates failed.*WrongResult"):
        assert tune_doubler(timed, {2: lambda y: y.__setitem__(0, math.nan)}).t == 2


def test_the_disagreement_measure():
    """max |got - want| over want's largest magnitude (over 1 for all zeros); a NaN or infinity where the other
    has a number is infinitely wrong, a matching one is not; integers must be equal."""
    want = np.array([1.0, -4.0, 2.0])
    assert results.disagreement(want + [0, 0.5, 0], want) == pytest.approx(0.125)
    assert results.disagreement(np.array([0.0, 0.25]), np.zeros(2)) == 0.25
    assert results.disagreement(np.array([1.0, math.nan]), np.array([1.0, 2.0])) == math.inf
    assert results.disagreement(np.array([1.0, math.inf]), np.array([1.0, -math.inf])) == math.inf
    assert results.disagreement(np.array([1.0, math.nan]), np.array([1.0, math.nan])) == 0.0
    assert results.disagreement(np.empty(0), np.empty(0)) == 0.0
    assert results.tolerance(td.i32) == 0.0 and results.tolerance(td.f32) == results.FLOOR
    assert results.tolerance(td.bf16) == results.ULPS * float(ml_dtypes.finfo(ml_dtypes.bfloat16).eps)


def test_poison_fills_each_kind_of_output():
    """NaN for floats (bf16's bits too), the largest value for integers, True for bools."""
    args = (np.zeros(3, np.float16), np.zeros(3, np.uint16), np.zeros(3, np.int8), np.zeros(3, bool))
    results.poison(args, {0: td.f16, 1: td.bf16, 2: td.i8, 3: td.boolean})
    assert np.isnan(args[0]).all() and np.isnan(args[1].view(ml_dtypes.bfloat16).astype(np.float32)).all()
    assert (args[2] == 127).all() and args[3].all()


def test_bf16_tuning_operands_are_normal_values():
    """The operands candidates are timed (and checked) on: for bf16, the bits of normal values. They were
    normal values cast to uint16 (small integers, and NaN's bits for values under -1), so bf16 outputs held NaN."""
    from stdlib_ops import gemm
    values = gemm.random_operand((2000,), td.bf16).view(ml_dtypes.bfloat16).astype(np.float64)
    want = gemm.random_operand((2000,), td.f32).astype(np.float64)
    np.testing.assert_allclose(values, want, rtol=2 ** -8)
