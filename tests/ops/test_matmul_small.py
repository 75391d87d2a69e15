"""Batched products of small matrices on the cpu (`stdlib_ops.matmul_small`).

Oracle: numpy's matmul in float64. Which kernel runs is asserted too: these products took the register-tile
template (6 x 32 micro-tiles, a block per product: 4096 products of 4 x 4 matrices at 4x numpy's time).
"""
import contextlib
from unittest import mock

import ml_dtypes
import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

import taskdsl as td
import taskdsl.graph as tg
from stdlib_ops import gemm
from stdlib_ops import matmul_small as small

from . import FEW, SEEDS, rand

TOLERANCE = {np.float32: 1e-5, np.float16: 2e-3, ml_dtypes.bfloat16: 1e-2}
ROWS = (1, 2, 3, 5, 13, 17, 31, 97, 127)
COLUMNS = (1, 2, 3, 5, 13, 17, 31, 61)


def _close(got, a, b, dtype) -> None:
    expected = a.astype(np.float64) @ b.astype(np.float64)
    assert got.dtype == dtype and got.shape == expected.shape
    scale = np.sqrt(max(a.shape[-1], 1)) * 3        # terms of uniform(-1, 1) products, summed k at a time
    np.testing.assert_allclose(got.astype(np.float64), expected, rtol=TOLERANCE[dtype],
                               atol=TOLERANCE[dtype] * scale)


@contextlib.contextmanager
def _two_threads():
    """Plans made as on CI's 2 threads (a batch of 2 is enough products for the small kernel), whatever this
    machine has; plans are cached without the thread count, so none made here outlives the block."""
    gemm._plan.cache_clear()
    with mock.patch.object(small, "num_threads", lambda: 2):
        yield
    gemm._plan.cache_clear()


def _kernels_run(monkeypatch) -> list:
    """A list that records the name of each kernel a MatmulPlan call launches."""
    names = []
    kernel = gemm.MatmulPlan.kernel
    monkeypatch.setattr(gemm.MatmulPlan, "kernel", lambda self, *a, **kw: names.append(kernel(self, *a, **kw).name)
                        or kernel(self, *a, **kw))
    return names


BATCHES = [((2,), (2,)), ((3, 1), (5,)), ((1,), (4,)), ((2, 3), (2, 3)), ((6,), ())]     # (A's, B's): broadcast


@FEW
@given(m=st.sampled_from(ROWS), n=st.sampled_from(COLUMNS), k=st.sampled_from((1, 2, 7, 64, 129)),
       batches=st.sampled_from(BATCHES), dtype=st.sampled_from([np.float32, np.float16]), seed=SEEDS)
def test_batched_small_products_match_numpy(m, n, k, batches, dtype, seed):
    """Prime sizes, batch dims broadcast on either side, a 2-D B (`test_optimized_builds_have_a_kernel_per_size`
    checks the optimized kernels' chunks of rows)."""
    a, b = rand((*batches[0], m, k), seed, dtype, -1, 1), rand((*batches[1], k, n), seed + 1, dtype, -1, 1)
    with _two_threads():
        assert gemm.plan(a.shape, b.shape, td.ir.types.from_numpy(np.dtype(dtype)), "cpu").small
        _close(gemm.matmul(a, b), a, b, dtype)


@pytest.mark.parametrize("shape", [(4096, 4, 4, 4), (7, 128, 3, 64), (2, 1, 33, 1), (5, 100, 16, 16),
                                   (9, 37, 70, 1)])
def test_which_products_run_small_and_their_results(shape, monkeypatch):
    """The kernel is the small one: many 4 x 4 products, the largest matrices it takes, 1 x 1 outputs, and one
    column. (Under td.fast_compile, as here, one kernel of any sizes: `any_small_matmul_kernel`.)"""
    names = _kernels_run(monkeypatch)
    batch, m, k, n = shape
    a, b = rand((batch, m, k), 1, low=-1, high=1), rand((batch, k, n), 2, low=-1, high=1)
    with _two_threads():
        _close(gemm.batch_matmul(a, b), a, b, np.float32)
    assert names == ["small_matmul"]
    assert small.rows_at_once(m, n) == min(m, 256 // n)


@pytest.mark.parametrize("shape", [(3, 5, 20, 64), (2, 9, 70, 1)])
def test_optimized_builds_have_a_kernel_per_size(shape, monkeypatch):
    """Optimized, each (m, n) is a kernel of its own, its sizes in its name: 5 rows of 64 go in a chunk of 4
    rows (256 sums in registers) and a last one of 1; one column's dot products go in 16-element steps and a
    tail of 6."""
    td.fast_compile(False)
    names = _kernels_run(monkeypatch)
    batch, m, k, n = shape
    a, b = rand((batch, m, k), 3, low=-1, high=1), rand((batch, k, n), 4, low=-1, high=1)
    with _two_threads():
        _close(gemm.batch_matmul(a, b), a, b, np.float32)
    assert names == [f"small_matmul_{m}x{n}"]


@pytest.mark.parametrize("a_shape, b_shape", [((2, 129, 8), (2, 8, 4)), ((1, 64, 4096), (1, 4096, 64)),
                                              ((3, 4, 5), (3, 5, 65))])
def test_larger_or_too_few_products_keep_the_template(a_shape, b_shape, monkeypatch):
    """Past 128 rows or 64 columns, or one product of more multiply-adds than a thread's worth with fewer products
    than threads (`small.applies`), the register-tile template runs."""
    names = _kernels_run(monkeypatch)
    a, b = rand(a_shape, 3, low=-1, high=1), rand(b_shape, 4, low=-1, high=1)
    with _two_threads():
        _close(gemm.matmul(a, b), a, b, np.float32)
        assert small.applies(2, 128, 64, 10**6) and not small.applies(1, 64, 64, 4096)
    assert len(names) == 1 and names[0].startswith("tile_matmul")


def test_bf16_and_mixed_operands():
    """bf16 sums in f32 and rounds once; bf16 with f32 computes in f32."""
    bf16 = ml_dtypes.bfloat16
    a, b = rand((6, 9, 40), 5, bf16, -1, 1), rand((6, 40, 7), 6, bf16, -1, 1)
    _close(gemm.matmul(a, b), a, b, bf16)
    _close(gemm.matmul(a, b.astype(np.float32)), a.astype(np.float32), b.astype(np.float32), np.float32)


@pytest.mark.parametrize("split, n", [(1, 5), (2, 5), (3, 5), (3, 1)])
def test_split_sums_chunks_of_k_as_the_template_does(split, n):
    """The kernel takes the template's parameters: z-slice z of the batch index sums chunk z % split of k (the
    plans never split it, but a caller of the template's kernels may); one column's dot products too."""
    batch, m, k = 3, 13, 50
    a, b = rand((batch, m, k), 7, low=-1, high=1), rand((1, k, n), 8, low=-1, high=1)
    index = np.repeat(np.stack([np.arange(batch), np.zeros(batch)], 1).astype(np.int32), split, axis=0)
    partials = np.full((batch * split, m, n), np.nan, np.float32)
    small.small_matmul_kernel(td.f32, td.f32, m, n)(a, b, partials, index, split)
    np.testing.assert_allclose(partials.reshape(batch, split, m, n).sum(1), a.astype(np.float64) @ b[0],
                               rtol=1e-5, atol=1e-5)
    if split == 3:      # k's chunks are 17, 17 and 16 long: each partial is its chunk's product alone
        np.testing.assert_allclose(partials[2], a[0, :, 34:] @ b[0, 34:], rtol=1e-5, atol=1e-5)


def test_a_graph_matmul_with_its_epilogue_runs_small():
    """An attention-like batched product with a scale and a transpose after it: one fused kernel on the small
    kernel, against the graph's numpy reference."""
    x, y = tg.input("x", (4, 24, 16)), tg.input("y", (4, 16, 24))
    out = tg.ops.transpose(tg.ops.mul(tg.ops.matmul(x, y), tg.constant(np.float32(0.25))), (0, 2, 1))
    graph = tg.Graph([x, y], [out])
    compiled = graph.compile("cpu")
    xs, ys = rand((4, 24, 16), 9, low=-1, high=1), rand((4, 16, 24), 10, low=-1, high=1)
    got, = compiled(x=xs, y=ys)
    np.testing.assert_allclose(got, (xs.astype(np.float64) @ ys).transpose(0, 2, 1) * 0.25, rtol=1e-5, atol=1e-5)
    assert [k.name for k in compiled.kernels] == ["small_matmul_fused"]


def test_a_graph_matmul_by_constant_weights_reads_them_unpacked():
    """Constant weights of a small product are not packed into the template's panels: the small kernel reads B
    as it is, with the bias fused."""
    weight, bias = rand((16, 12), 11, low=-1, high=1), rand((12,), 12, low=-1, high=1)
    x = tg.input("x", (6, 10, 16))
    graph = tg.Graph([x], [tg.ops.add(tg.ops.matmul(x, tg.constant(weight)), tg.constant(bias))])
    compiled = graph.compile("cpu")
    xs = rand((6, 10, 16), 13, low=-1, high=1)
    got, = compiled(x=xs)
    np.testing.assert_allclose(got, xs.astype(np.float64) @ weight + bias, rtol=1e-5, atol=1e-5)
    assert [k.name for k in compiled.kernels] == ["small_matmul_fused"]


def test_a_small_linear_reads_its_weight_transposed_by_the_small_kernel(monkeypatch):
    """`linear` of a few columns copies its (out, in) weight transposed and runs the small kernel (it packed the
    template's panels from the weight's rows on every call), with batch dims in x and a bias."""
    names = _kernels_run(monkeypatch)
    x, weight, bias = rand((2, 5, 3, 40), 14, low=-1, high=1), rand((24, 40), 15, low=-1, high=1), rand((24,), 16)
    with _two_threads():
        got = gemm.linear(x, weight, bias)
    np.testing.assert_allclose(got, x.astype(np.float64) @ weight.T + bias, rtol=1e-5, atol=1e-5)
    assert names == ["small_matmul"]


@pytest.mark.parametrize("batch, m, workers", [(4, 1, 1), (512, 16, 2)])
def test_a_small_product_of_little_work_runs_on_one_thread(batch, m, workers, monkeypatch):
    """Optimized, a small product's launch runs on one thread below `gemv.ROWS_SERIAL_BYTES` of arrays per row of A
    (an LSTM step's (1, 64) @ (4 gates, 64, 64): 1.9 us there, 3.8-4.4 shared out); many products share out."""
    from stdlib_ops import gemv
    monkeypatch.setenv("TASKDSL_NUM_THREADS", "2")
    td.fast_compile(False)
    a, b = rand((batch, m, 64), 5, low=-1, high=1), rand((batch, 64, 16), 6, low=-1, high=1)
    _close(gemm.batch_matmul(a, b), a, b, np.float32)
    kernel = small.small_matmul_kernel(td.f32, td.f32, m, 16)
    assert kernel.serial_below == gemv.ROWS_SERIAL_BYTES // m
    launch = list(kernel._launches.values())[-1]
    assert launch.blocks == batch and launch.workers == workers
