"""The cpu target's float32 tanh and erf are rational approximations (vectorizable, unlike libm's
calls): checked against float64 numpy / math over their whole range, and at the special values."""
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
