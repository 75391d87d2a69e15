"""The cpu target's float32 tanh, erf, exp, log, sin and cos are approximations (vectorizable, unlike libm's calls):
checked against float64 numpy / math over their whole range, and at the special values."""
import math

import numpy as np
import pytest

import taskdsl as td
from taskdsl import blockIdx, f32, threadIdx


def _elementwise(fn):
    @td.kernel(grid=lambda N: td.cdiv(N, 128), block=128)
    def apply(X: f32["N"], Y: f32["N"]):
        i = blockIdx.x * 128 + threadIdx.x
        if i < N:
            Y[i] = fn(X[i])

    return apply


TANH, ERF = _elementwise(td.tanh), _elementwise(td.erf)
CASES = {"tanh": (TANH, np.tanh), "erf": (ERF, np.vectorize(math.erf))}


@pytest.mark.parametrize("name", sorted(CASES))
def test_float32_approximation_is_within_a_few_ulp_everywhere(name):
    td.set_target("cpu")
    kernel, oracle = CASES[name]
    tiny = np.geomspace(1e-30, 1e-2, 2001)
    x = np.concatenate([np.linspace(-20, 20, 400001), tiny, -tiny, [0.0, -0.0]]).astype(np.float32)
    y = np.empty_like(x)
    kernel(x, y)
    want = oracle(x.astype(np.float64))
    np.testing.assert_allclose(y, want, rtol=5e-7, atol=1e-37)
    assert np.all(np.abs(y) <= 1.0)
    assert np.array_equal(np.signbit(y[x != 0]), np.signbit(x[x != 0]))


@pytest.mark.parametrize("name", sorted(CASES))
def test_special_values(name):
    td.set_target("cpu")
    kernel, _ = CASES[name]
    x = np.array([np.inf, -np.inf, np.nan, 3e38, -3e38], np.float32)
    y = np.empty_like(x)
    kernel(x, y)
    np.testing.assert_array_equal(y[[0, 1, 3, 4]], [1.0, -1.0, 1.0, -1.0])
    assert np.isnan(y[2]), "NaN must propagate (a NaN activation is a bug to find, not to hide)"


EXP = _elementwise(td.exp)


def test_float32_exp_is_within_an_ulp_and_reaches_inf_and_subnormals():
    td.set_target("cpu")
    x = np.concatenate([np.linspace(-110, 95, 400001), [0.0, -0.0, 1.0, 88.72283, 88.7229, -87.33655, -103.97,
                                                       -104.5, 3e38, -3e38, np.inf, -np.inf, np.nan]])
    x = x.astype(np.float32)
    y = np.empty_like(x)
    assert "rt.exp_f32(" in EXP.source(x, y, target="cpu")
    EXP(x, y)
    with np.errstate(over="ignore"):
        want = np.exp(x.astype(np.float64))
    normal = (want > np.finfo(np.float32).tiny) & (want < np.finfo(np.float32).max)
    np.testing.assert_allclose(y[normal], want[normal], rtol=1.2e-7)       # 1 ulp is 6e-8 to 1.2e-7 relative
    subnormal = (want > 0) & (want <= np.finfo(np.float32).tiny)
    np.testing.assert_allclose(y[subnormal], want[subnormal], rtol=0, atol=3e-45)  # 2 of float32's smallest steps
    assert np.all(np.isinf(y[want >= 3.4028236e38])) and np.all(y[want < 1e-46] == 0)
    assert y[x == 1.0][0] == np.float32(np.e) and np.all(y[x == 0] == 1.0)
    assert np.isnan(y[-1])


SIGMOID = _elementwise(td.sigmoid)


def test_float32_sigmoid_goes_through_the_exp_approximation_within_a_few_ulp():
    td.set_target("cpu")
    x = np.concatenate([np.linspace(-110, 110, 200001), [0.0, -0.0, 3e38, -3e38, np.inf, -np.inf, np.nan]])
    x = x.astype(np.float32)
    y = np.empty_like(x)
    assert "rt.sigmoid_f32(" in SIGMOID.source(x, y, target="cpu")
    SIGMOID(x, y)
    with np.errstate(over="ignore"):
        want = 1.0 / (1.0 + np.exp(-x.astype(np.float64)))
    normal = want > np.finfo(np.float32).tiny
    np.testing.assert_allclose(y[normal], want[normal], rtol=2.5e-7)       # a few ulp: exp's, the add's, the divide's
    assert np.all(y[want <= np.finfo(np.float32).tiny] < 2e-38)              # the far negative tail underflows to ~0
    assert list(y[-7:-1]) == [0.5, 0.5, 1.0, 0.0, 1.0, 0.0] and np.isnan(y[-1])


LOG = _elementwise(td.log)


def test_float32_log_is_within_an_ulp_over_every_positive_float_and_its_special_values():
    """Random bit patterns of every positive float (subnormals too), a sweep over [0.5, 2] where the mantissa's
    reduction turns, and the special values: against float64 numpy, within one ulp of the exact logarithm."""
    td.set_target("cpu")
    patterns = np.random.default_rng(7).integers(1, 0x7f800000, 400001, dtype=np.int64).astype(np.uint32)
    specials = [0.0, -0.0, -1.0, -np.inf, np.inf, np.nan, 1.0, np.finfo(np.float32).tiny, 1e-45,
                np.finfo(np.float32).max]
    x = np.concatenate([patterns.view(np.float32), np.linspace(0.5, 2.0, 200001, dtype=np.float32),
                        np.array(specials, np.float32)])
    y = np.empty_like(x)
    assert "rt.log_f32(" in LOG.source(x, y, target="cpu")
    LOG(x, y)
    with np.errstate(divide="ignore", invalid="ignore"):
        want = np.log(x.astype(np.float64))
    finite = np.isfinite(want)
    ulp = np.spacing(np.abs(want[finite]).astype(np.float32)).astype(np.float64)
    assert np.all(np.abs(y[finite] - want[finite]) <= ulp)
    np.testing.assert_array_equal(y[-10:-3], [-np.inf, -np.inf, np.nan, np.nan, np.inf, np.nan, 0.0])


SIN, COS = _elementwise(td.sin), _elementwise(td.cos)


@pytest.mark.parametrize("name", ["sin", "cos"])
def test_float32_sin_and_cos_round_correctly_but_for_a_hair_over_every_float(name):
    """Random bit patterns of every float (both signs, subnormals and the largest, where the reduction takes 2/pi's
    bits from the table), the floats nearest multiples of pi/2 (where the reduced argument cancels), the edge of the
    float64 reduction (2^18) and the special values: within 0.51 ulp of float64 numpy's (an exhaustive check of
    every positive float gave 0.502 at most, the polynomials' truncation)."""
    td.set_target("cpu")
    kernel, oracle = (SIN, np.sin) if name == "sin" else (COS, np.cos)
    patterns = np.random.default_rng(8).integers(0, 0xff800000, 400001, dtype=np.int64).astype(np.uint32)
    turns = np.concatenate([np.arange(1, 100001), np.random.default_rng(9).integers(1, 2 ** 60, 20001)])
    edge = np.float32(2.0 ** 18)
    specials = [0.0, -0.0, 1e-45, -1e-45, np.finfo(np.float32).max, -np.finfo(np.float32).max, np.inf, -np.inf,
                np.nan]
    x = np.concatenate([patterns.view(np.float32), (turns * (np.pi / 2)).astype(np.float32),
                        [np.nextafter(edge, np.float32(0)), edge, np.nextafter(edge, np.float32(np.inf))],
                        np.array(specials, np.float32)])
    y = np.empty_like(x)
    assert f"rt.{name}_f32(" in kernel.source(x, y, target="cpu")
    kernel(x, y)
    finite = np.isfinite(x)
    want = oracle(x[finite].astype(np.float64))
    ulp = np.maximum(np.spacing(np.abs(want).astype(np.float32)).astype(np.float64), 2.0 ** -149)
    assert np.all(np.abs(y[finite] - want) <= 0.51 * ulp)
    assert np.all(np.isnan(y[~finite]))
    zeros = y[-9:-7]
    assert list(zeros) == ([0.0, 0.0] if name == "sin" else [1.0, 1.0])
    if name == "sin":
        assert list(np.signbit(zeros)) == [False, True]
