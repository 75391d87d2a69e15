"""Products of few rows (matrix-vector, vector-matrix, dot) and linear on the cpu target, as reductions.

Oracle: numpy's matmul in float64. Which kernels run is asserted too: these shapes took the register-tile
template (6-row micro-tiles, B's panels packed per call: 6-60x numpy's time) and linear a transposed copy
of its weight per call (59-135x for one row).
"""
import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

import taskdsl as td
from stdlib_ops import gemm, gemv

from . import FEW, SEEDS, rand

SIZES = st.sampled_from([1, 2, 3, 17, 31, 32, 33, 1031])
TOLERANCE = {np.float32: 1e-5, np.float16: 2e-3}


def _expected(a, b) -> np.ndarray:
    return a.astype(np.float64) @ b.astype(np.float64)


def _close(got, expected, dtype, k: int) -> None:
    assert got.dtype == dtype and got.shape == expected.shape
    scale = np.sqrt(max(k, 1)) * 3          # the terms' magnitude: uniform(-1, 1) products summed k at a time
    np.testing.assert_allclose(got.astype(np.float64), expected, rtol=TOLERANCE[dtype],
                               atol=TOLERANCE[dtype] * scale)


def _ran_rows_product(monkeypatch) -> list:
    """A list that records each `gemv.product` call (the cpu's reduction path)."""
    calls = []
    real = gemv.product
    monkeypatch.setattr(gemv, "product", lambda *args, **kw: calls.append(args) or real(*args, **kw))
    return calls


@FEW
@given(m=st.integers(1, 3), k=SIZES, n=SIZES, dtype=st.sampled_from([np.float32, np.float16]), seed=SEEDS)
def test_few_rows_match_numpy(m, k, n, dtype, seed):
    a, b = rand((m, k), seed, dtype, -1, 1), rand((k, n), seed + 1, dtype, -1, 1)
    _close(gemm.matmul(a, b), _expected(a, b), dtype, k)
    w = rand((n, k), seed + 2, dtype, -1, 1)        # linear's weight: (out_features, in_features)
    _close(gemm.linear(a, w), _expected(a, w.T), dtype, k)


@pytest.mark.parametrize("a_shape, b_shape", [((1031,), (1031,)), ((5, 33), (33,)), ((33,), (33, 40)),
                                              ((2, 7), (7, 1)), ((4, 1031), (1031, 1)), ((1, 1), (1, 1))])
def test_vectors_and_columns(a_shape, b_shape, monkeypatch):
    """1-D operands (numpy's promotion and dropped axes), a column B of any number of rows (as one row)."""
    calls = _ran_rows_product(monkeypatch)
    a, b = rand(a_shape, 1, low=-1, high=1), rand(b_shape, 2, low=-1, high=1)
    got = gemm.matmul(a, b)
    _close(got, _expected(a, b), np.float32, a_shape[-1])
    assert len(calls) == (1 if td.get_target() == "cpu" else 0)


def test_which_products_are_reductions(monkeypatch):
    """Three rows or fewer, or one column, unbatched and untuned: reductions; the rest: the template."""
    calls = _ran_rows_product(monkeypatch)
    a3, a4, b = rand((3, 40), 3), rand((4, 40), 4), rand((40, 50), 5)
    gemm.matmul(a3, b)
    gemm.matmul(a4, b)
    gemm.matmul(a3[None], b[None])
    gemm.matmul(a3, b, tune=False)
    assert len(calls) == (2 if td.get_target() == "cpu" else 0)


@pytest.mark.parametrize("x_shape", [(1, 96), (2, 3, 96), (96,), (7, 96), (130, 96)])
def test_linear_without_a_transposed_weight(x_shape, monkeypatch):
    """Linear reads its (N, K) weight as it is: a dot per output for few rows, the template's panels packed from
    the weight's rows for more (no transpose kernel); batch axes of x flatten into rows."""
    import stdlib_ops.transform as transform
    monkeypatch.setattr(transform, "transpose", lambda *_: pytest.fail("the weight was transposed"))
    x, w, bias = rand(x_shape, 6, low=-1, high=1), rand((37, 96), 7, low=-1, high=1), rand((37,), 8)
    if td.get_target() != "cpu":
        monkeypatch.undo()
    got = gemm.linear(x, w, bias)
    _close(got, _expected(x, w.T) + bias, np.float32, 96)


def test_linear_and_matmul_of_empty_operands():
    x, w = np.zeros((0, 5), np.float32), np.zeros((4, 5), np.float32)
    assert gemm.linear(x, w).shape == (0, 4)
    np.testing.assert_array_equal(gemm.matmul(np.ones((2, 0), np.float32), np.ones((0, 3), np.float32)), 0)
