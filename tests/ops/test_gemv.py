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
import taskdsl.graph as tg
from stdlib_ops import gemm, gemv
from stdlib_ops import matmul_cpu as cpu
from stdlib_ops import matmul_simt as simt
from taskdsl.backend.cpu import vectors

from . import FEW, SEEDS, examples, rand

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


# panels of 64 (the AVX-512 default), 64 with k blocks of 128, 16 and 128 columns: AVX-512's points, whatever the
# host's vectors (a kernel compiled for too few registers spills, and computes the same)
AVX512_SPACE = cpu.space(unit=vectors.AVX512)
ROWS_POINTS = [cpu.default_point(unit=vectors.AVX512), AVX512_SPACE.point(micro=(4, 8), block=(24, 64), bk=128),
               AVX512_SPACE.point(micro=(6, 16), block=(96, 16), bk=256),
               AVX512_SPACE.point(micro=(4, 64), block=(48, 128), bk=512)]


@examples(12)
@given(rows=st.integers(1, gemv.MAX_ROWS), k=st.sampled_from([0, 1, 5, 17, 131, 300, 1031]), n=SIZES,
       split=st.sampled_from([1, 1, 3]), point=st.sampled_from(ROWS_POINTS), staged_a=st.booleans(), seed=SEEDS)
def test_packed_rows_kernel_matches_numpy(rows, k, n, split, point, staged_a, seed):
    """`packed_rows_kernel`: each block one panel of packed B over its z-slice's k range (split-k partials summed,
    K = 0 and slices past K zeros); every element of C is written. With `staged_a`, A's rows copied a k block at
    a time first (K past the k block included)."""
    td.set_target("cpu")
    a, b = rand((rows, k), seed, low=-1, high=1), rand((k, n), seed + 1, low=-1, high=1)
    c = np.full((split, rows, n), np.nan, np.float32)
    kernel = gemv.packed_rows_kernel(point, td.f32, td.f32, rows, staged_a)
    assert kernel.name.endswith("_staged") == staged_a
    kernel(a[None], cpu.pack_b(point, b[None]), c, simt.batch_index((), (), (), split), split)
    _close(c.sum(axis=0), _expected(a, b), np.float32, k)


def test_the_packed_rows_kernel_refuses_more_rows_than_it_sums():
    """A kernel built for `rows` rows of A refuses more at launch (they were left unwritten: an audit's finding)."""
    td.set_target("cpu")
    point = ROWS_POINTS[0]
    a, b = rand((1, 3, 20), 1), rand((1, 20, 70), 2)
    c = np.full((1, 3, 70), np.nan, np.float32)
    kernel = gemv.packed_rows_kernel(point, td.f32, td.f32, 2)
    with pytest.raises(ValueError, match="at most 2 rows of A, got M = 3"):
        kernel(a, cpu.pack_b(point, b), c, simt.batch_index((), (), (), 1), 1)
    kernel(a[:, :2], cpu.pack_b(point, b), c[:, :2], simt.batch_index((), (), (), 1), 1)
    _close(c[0, :2], _expected(a[0, :2], b[0]), np.float32, 20)


def test_plans_of_few_rows_stream_packed_weights_with_batches_and_f16():
    """A cpu plan of at most MAX_ROWS rows takes packed B through `packed_rows_kernel` (batch dims broadcast,
    f16 operands summed in f32); from MAX_ROWS + 1 rows on, the register-tile kernel."""
    td.set_target("cpu")
    a, w = rand((2, 3, 1, 131), 1, low=-1, high=1), rand((3, 131, 67), 2, low=-1, high=1)   # batch 1 -> 2
    p = gemm.plan(a.shape, w.shape, td.f32, "cpu")
    assert p.kernel(packed_b=True).name == f"rows_matmul_1x{p.point.block[1]}_packed"
    _close(gemm.matmul(a, w, packed=p.pack_b(w)), _expected(a, w), np.float32, 131)
    a16, w16 = rand((3, 200), 3, np.float16, -1, 1), rand((200, 45), 4, np.float16, -1, 1)
    p16 = gemm.plan(a16.shape, w16.shape, td.f16, "cpu")
    assert p16.kernel(packed_b=True).name.startswith("rows_matmul_3x")
    _close(gemm.matmul(a16, w16, packed=p16.pack_b(w16)), _expected(a16, w16), np.float16, 200)
    a4 = rand((gemv.MAX_ROWS + 1, 131), 5)
    assert gemm.plan(a4.shape, w[0].shape, td.f32, "cpu").kernel(packed_b=True).name.startswith("tile_matmul")


def test_a_classifier_at_batch_one_is_one_fused_rows_kernel():
    """A model's classifier at batch 1 (x @ W + b, ReLU; W a constant): one kernel, streaming W's packed panels,
    the bias and ReLU fused into its stores."""
    td.set_target("cpu")
    rng = np.random.default_rng(9)
    w, bias = (rng.standard_normal(s).astype(np.float32) for s in ((300, 1001), (1001,)))
    x = tg.input("x", (1, 300))
    g = tg.Graph([x], [tg.ops.relu(tg.ops.add(tg.ops.matmul(x, tg.constant(w)), tg.constant(bias)))])
    cg = g.compile()
    data = rng.standard_normal((1, 300)).astype(np.float32)
    got, = cg(data)
    np.testing.assert_allclose(got, np.maximum(data.astype(np.float64) @ w + bias, 0), rtol=1e-4, atol=1e-4)
    assert [k.name for k in cg.kernels] == [f"rows_matmul_1x{cpu.default_point().block[1]}_packed_fused"]


@pytest.mark.parametrize("k, n, workers", [(128, 128, 1), (300, 1001, 2)])
def test_a_fused_rows_kernel_on_little_packed_weight_runs_on_one_thread(k, n, workers, monkeypatch):
    """Below `gemv.ROWS_SERIAL_BYTES` of arrays (a GRU's recurrent weights, hidden 128: 64 and 128 KiB) the fused rows
    kernel runs on one thread, the hand-off to a second costing more than it saves; a larger weight shares its
    panels out."""
    monkeypatch.setenv("TASKDSL_NUM_THREADS", "2")
    td.set_target("cpu")
    rng = np.random.default_rng(k)
    w = rng.standard_normal((k, n)).astype(np.float32)
    x = tg.input("x", (1, k))
    cg = tg.Graph([x], [tg.ops.tanh(tg.ops.matmul(x, tg.constant(w)))]).compile()
    data = rng.standard_normal((1, k)).astype(np.float32)
    np.testing.assert_allclose(cg(data)[0], np.tanh(data.astype(np.float64) @ w), rtol=1e-4, atol=1e-5)
    kernel, = cg.kernels
    assert kernel.name.endswith("_packed_fused") and kernel.serial_below == gemv.ROWS_SERIAL_BYTES
    launch = list(kernel._launches.values())[-1]
    assert launch.blocks > 1 and launch.workers == workers


@pytest.mark.parametrize("hidden, costly, product, kernels", [(128, True, "_staged_fused", 1), (256, True, "_fused", 2),
                                                              (256, False, "_fused", 1)])
def test_a_transcendental_prologue_joins_a_rows_kernel_that_stages_it(hidden, costly, product, kernels,
                                                                      elementwise_fusion):
    """A GRU step's sigmoid(x + y) * h, A of its candidate's product at batch 1: computed by the product's rows
    kernel into its copy of A's rows (`staged_a`) where that is at most `fusion.STAGED_RECOMPUTES` elements over
    the column blocks (hidden 128: 2 x 128), else by a kernel of its own (hidden 256: 4 x 256). A cheap prologue,
    (x + y) * h, joins any rows kernel, unstaged. All match numpy."""
    td.set_target("cpu")
    rng = np.random.default_rng(hidden)
    w = rng.standard_normal((hidden, hidden)).astype(np.float32) / 8
    x, y, h = (tg.input(name, (1, hidden)) for name in "xyh")
    a = tg.ops.mul(tg.ops.sigmoid(tg.ops.add(x, y)) if costly else tg.ops.add(x, y), h)
    cg = tg.Graph([x, y, h], [tg.ops.tanh(tg.ops.matmul(a, tg.constant(w)))]).compile()
    xv, yv, hv = (rng.standard_normal((1, hidden)) for _ in range(3))
    want = np.tanh((hv * (1 / (1 + np.exp(-(xv + yv))) if costly else xv + yv)) @ w)
    np.testing.assert_allclose(cg(*(v.astype(np.float32) for v in (xv, yv, hv)))[0], want, rtol=1e-4, atol=1e-5)
    assert len(cg.kernels) == kernels
    assert cg.kernels[-1].name == f"rows_matmul_1x{cpu.default_point().block[1]}_packed{product}"
