"""The reference evaluator's contractions: a float sum or mean of a product (a matmul, a convolution under its
padding guard) over a grid of more than BIG_GRID elements is summed by numpy's einsum instead of over the whole
materialised domain. Each case is checked against numpy formulas and against the evaluator's general path,
which `+ 0.0` on the body selects."""
import importlib
import tracemalloc
import warnings

import numpy as np
import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

import taskdsl as td
import taskdsl.graph as tg
from taskdsl import ir
from taskdsl.compute import evaluate, size_var
from taskdsl.graph import ops

FEW = settings(max_examples=10, deadline=None)


@pytest.fixture(autouse=True)
def contract_every_grid(monkeypatch):
    """Grids of any size take the frugal path here (by default only those above BIG_GRID elements do)."""
    monkeypatch.setattr(importlib.import_module("taskdsl.compute"), "BIG_GRID", 0)
DIM = st.sampled_from([1, 2, 3, 5, 7, 13])

A = td.placeholder("A", td.f32, ("B", "M", "K"))
W = td.placeholder("W", td.f32, ("K", "N"))
S = td.placeholder("S", td.f32, ("N",))
X, Wk = td.placeholder("X", td.f32, ("M",)), td.placeholder("Wk", td.f32, ("Kw",))


def both_paths(name, shape, reduce_shape, body, op="sum", dtype=None):
    """The definition `body` as given (a product: the contraction) and as `body + 0.0` (the general path)."""
    return (td.reduce(name, shape, reduce_shape, body, op=op, dtype=dtype),
            td.reduce(name + "_general", shape, reduce_shape, lambda *ix: body(*ix) + 0.0, op=op, dtype=dtype))


@FEW
@given(b=DIM, m=DIM, k=DIM, n=DIM, seed=st.integers(0, 2**16))
@example(b=1, m=1, k=1, n=1, seed=0)
def test_a_batched_scaled_matmul_is_numpys(b, m, k, n, seed):
    rng = np.random.default_rng(seed)
    a, w, s = (rng.standard_normal(shape).astype(np.float32) for shape in ((b, m, k), (k, n), (n,)))
    fast, general = both_paths("Y", ("B", "M", "N"), ("K",), lambda i, r, c, j: A[i, r, j] * W[j, c] * S[c])
    got, want = evaluate([A, W, S], [fast, general], [a, w, s])
    np.testing.assert_allclose(got, (a.astype(np.float64) @ w) * s, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)


def guarded_window(i, j):
    """X[i + j] * Wk[j] where i + j is inside X, else 0."""
    return ir.Select(i + j < size_var("M"), X[i + j] * Wk[j], ir.const(0.0, td.f32), td.f32)


@FEW
@given(m=DIM, k=DIM, seed=st.integers(0, 2**16))
def test_a_guarded_product_sums_only_where_the_guard_holds(m, k, seed):
    """A shifted window read past the end, guarded as a convolution's padding is."""
    rng = np.random.default_rng(seed)
    x = rng.standard_normal(m).astype(np.float32)
    w = rng.standard_normal(k).astype(np.float32)
    fast, general = both_paths("Y", ("M",), ("Kw",), guarded_window)
    got, want = evaluate([X, Wk], [fast, general], [x, w])
    padded = np.concatenate([x, np.zeros(k, np.float32)]).astype(np.float64)
    np.testing.assert_allclose(got, [padded[i:i + k] @ w for i in range(m)], rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)


def test_an_infinity_outside_the_guard_does_not_make_nan():
    """0 * inf is NaN, but the guarded sum leaves the term out: the general path is taken."""
    fast, general = both_paths("Y", ("M",), ("Kw",), guarded_window)
    x = np.array([1.0, 2.0, 3.0], np.float32)
    w = np.array([1.0, np.inf], np.float32)
    got, want = evaluate([X, Wk], [fast, general], [x, w])
    np.testing.assert_array_equal(got, [np.inf, np.inf, 3.0])
    np.testing.assert_array_equal(got, want)


def test_a_reduction_axis_no_factor_reads_multiplies_the_sum():
    fast, general = both_paths("Y", ("N",), ("K", 4), lambda c, j, unused: W[j, c] * S[c])
    w, s = np.arange(6, dtype=np.float32).reshape(3, 2), np.array([1.0, -2.0], np.float32)
    got, want = evaluate([W, S], [fast, general], [w, s])
    np.testing.assert_array_equal(got, 4 * w.sum(axis=0) * s)
    np.testing.assert_array_equal(got, want)


def test_a_mean_of_squares_is_numpys():
    x = np.random.default_rng(1).standard_normal((3, 5, 7)).astype(np.float32)
    fast, general = both_paths("Y", ("B", "M"), ("K",), lambda i, r, j: A[i, r, j] * A[i, r, j], op="mean")
    got, want = evaluate([A], [fast, general], [x])
    assert got.dtype == np.float32
    np.testing.assert_allclose(got, (x.astype(np.float64) ** 2).mean(axis=2), rtol=1e-6)
    np.testing.assert_allclose(got, want, rtol=1e-6)


@pytest.mark.parametrize("dtype", [np.float16, np.float64])
def test_other_float_types(dtype):
    tdtype = td.f16 if dtype == np.float16 else td.f64
    P, Q = td.placeholder("P", tdtype, ("M", "K")), td.placeholder("Q", tdtype, ("K",))
    fast, general = both_paths("Y", ("M",), ("K",), lambda i, j: P[i, j] * Q[j])
    rng = np.random.default_rng(2)
    p, q = rng.standard_normal((5, 11)).astype(dtype), rng.standard_normal(11).astype(dtype)
    got, want = evaluate([P, Q], [fast, general], [p, q])
    assert got.dtype == want.dtype
    np.testing.assert_allclose(got.astype(np.float64), p.astype(np.float64) @ q, rtol=2e-3, atol=2e-3)
    np.testing.assert_allclose(got.astype(np.float64), want.astype(np.float64), rtol=2e-3, atol=2e-3)


def test_an_empty_reduction_sums_to_zero():
    fast, _ = both_paths("Y", ("B", "M", "N"), ("K",), lambda i, r, c, j: A[i, r, j] * W[j, c])
    got, = evaluate([A, W], [fast], [np.zeros((2, 3, 0), np.float32), np.zeros((0, 4), np.float32)])
    np.testing.assert_array_equal(got, np.zeros((2, 3, 4), np.float32))


def peak_bytes(fn) -> int:
    """The most memory numpy and Python held at once while `fn()` ran."""
    tracemalloc.start()
    try:
        fn()
        return tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()


def test_a_matmul_reference_does_not_hold_its_whole_domain():
    """512^3 materialised is 512 MiB of f32; the operands and the result are 3 MiB."""
    a, b = (np.random.default_rng(3).standard_normal((512, 512)).astype(np.float32) for _ in range(2))
    x, y = tg.input("x", a.shape, a.dtype), tg.input("y", b.shape, b.dtype)
    graph = tg.trace(ops.matmul, x, y)
    out = []
    assert peak_bytes(lambda: out.append(graph.reference(a, b)[0])) < 48 * 2**20
    np.testing.assert_allclose(out[0], a.astype(np.float64) @ b, rtol=1e-4, atol=1e-3)


def test_a_convolution_reference_holds_one_window_per_output():
    """A ResNet 3x3 layer: (O, H, W) x (C, 3, 3) materialised is 440 MiB; its windows over the input are 7 MiB
    (with one group, the input channel read does not depend on the output channel)."""
    rng = np.random.default_rng(4)
    x = rng.standard_normal((1, 64, 56, 56)).astype(np.float32)
    w = rng.standard_normal((64, 64, 3, 3)).astype(np.float32)
    graph = tg.trace(lambda t: ops.conv2d(t, w, padding=1), tg.input("x", x.shape, x.dtype))
    out = []
    assert peak_bytes(lambda: out.append(graph.reference(x)[0])) < 64 * 2**20
    got = out[0]
    want = sum(np.einsum("chw,oc->ohw", np.pad(x[0], ((0, 0), (1, 1), (1, 1)))[:, i:i + 56, j:j + 56],
                         w[:, :, i, j].astype(np.float64)) for i in range(3) for j in range(3))
    np.testing.assert_allclose(got[0], want, rtol=1e-4, atol=1e-3)


def test_an_integer_product_under_a_float_select_wraps_as_kernels_do():
    """The select is f32 but its product is i32, which wraps (100000^2 mod 2^32): the general path multiplies."""
    Ints = td.placeholder("Ints", td.i32, ("M",))
    fast, general = both_paths("Y", (), ("M",), lambda k: ir.Select(
        k >= 0, Ints[k] * Ints[k], ir.const(0.0, td.f32), td.f32))
    got, want = evaluate([Ints], [fast, general], [np.array([100000, 3], np.int32)])
    np.testing.assert_array_equal(got, np.float32(100000 * 100000 % 2**32 + 9))   # (below 2**31: positive)
    np.testing.assert_array_equal(got, want)


def test_a_scale_applied_after_the_sum_does_not_overflow():
    """A[i, k]^2 * C[i] with A = 1e19, C = 1e-19: each term is finite in f32, a sum of the squares is not."""
    C = td.placeholder("C", td.f32, ("B",))
    Rows = td.placeholder("Rows", td.f32, ("B", "K"))
    fast, general = both_paths("Y", ("B",), ("K",), lambda i, k: Rows[i, k] * Rows[i, k] * C[i])
    got, want = evaluate([Rows, C], [fast, general], [np.full((2, 4), 1e19, np.float32), np.full(2, 1e-19, np.float32)])
    np.testing.assert_allclose(got, 4e19, rtol=1e-6)
    np.testing.assert_allclose(got, want, rtol=1e-6)


def test_infinities_give_what_the_general_path_gives_without_a_warning():
    fast, general = both_paths("Y", ("N", "N"), ("K",), lambda i, j, k: W[k, i] * W[k, j])
    w = np.array([[1.0, 2.0], [np.inf, -np.inf]], np.float32)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        got, want = evaluate([W], [fast, general], [w])
    np.testing.assert_array_equal(got, want)
    np.testing.assert_array_equal(got, [[np.inf, -np.inf], [-np.inf, np.inf]])
