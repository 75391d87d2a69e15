"""Rule-based schedules (taskdsl/schedule/rules.py) and the td.op runtime, run on the cpu target
against the numpy reference (`op(*arrays)` vs `op.reference(*arrays)`).

Sizes are symbolic, so one generated kernel serves every shape: the ops below are built once
at module level and reused across hypothesis examples (each new kernel costs a numba compile).
"""
import contextlib
import functools
import importlib
import inspect
import math
import os
from unittest import mock

import numpy as np
import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

import taskdsl as td
from taskdsl import ir
from taskdsl.compute import evaluate, size_var
from taskdsl.schedule.rules import (SPAN, choose_strategy, injective_strategy, schedule_injective, schedule_reduce,
                                    split_chunks, split_stages)

FEW = settings(max_examples=6, deadline=None)
OPS = ["sum", "max", "min", "prod", "mean"]
STRATEGIES = ["thread", "warp", "block", "split"]

# Shapes (rows, reduced) that make choose_strategy pick each strategy for a row reduction:
# odd, prime, size 1, a large last axis, many rows with tiny rows.
SHAPES = {
    "thread": st.tuples(st.sampled_from([1, 2, 3, 97, 1031, 4099]), st.sampled_from([1, 2, 3, 5, 7, 13, 16])),
    "warp": st.tuples(st.sampled_from([1, 2, 3, 7, 64, 131]), st.sampled_from([17, 31, 32, 33, 127, 509, 512])),
    "block": st.tuples(st.sampled_from([1, 3, 64, 67]), st.sampled_from([513, 1021, 3001, 4099])) |
    st.just((64, 32771)),
    "split": st.tuples(st.sampled_from([1, 2, 3, 5, 63]), st.sampled_from([32768, 32771, 40009])) |
    st.just((1, 65537)),
}
SUFFIXES = {"thread": ["_reduce_thread"], "warp": ["_reduce_warp"], "block": ["_reduce_block"],
            "split": ["_partials_reduce_block"]}    # then the partials' reduction: see assert_strategy


# ---------------------------------------------------------------- helpers
def make_data(op: str, shape, rng, dtype=np.float32) -> np.ndarray:
    """Inputs whose reductions are well conditioned (products of +-1 and a few exact powers of two: about 32 of them
    at most, so no partial product leaves f32's range, whatever the order; at 0.5% each, a row of 2^20 took its
    running exponent to 155, and the reference's product overflowed where the kernel's did not)."""
    if op == "prod":
        values = [-1, 1, 2, 0.5] if np.dtype(dtype).kind == "f" else [-1, 1, 2, -1]
        rare = min(0.005, 16 / max(int(np.prod(shape)), 1))
        p = [0.5 - rare, 0.5 - rare, rare, rare]
        return rng.choice(np.array(values), size=shape, p=p).astype(dtype)
    if np.dtype(dtype).kind == "f":
        return rng.uniform(-1, 1, shape).astype(dtype)
    return rng.integers(-50, 51, shape).astype(dtype)


def assert_same(got: np.ndarray, ref: np.ndarray, reduced: int = 1):
    assert got.shape == ref.shape, (got.shape, ref.shape)
    assert got.dtype == ref.dtype, (got.dtype, ref.dtype)
    if got.dtype.kind in "iub":
        np.testing.assert_array_equal(got, ref)
    else:
        np.testing.assert_allclose(got, ref, rtol=2e-5, atol=2e-5 * math.sqrt(max(reduced, 1)))


def check(op: td.Op, *arrays, reduced: int = 1) -> list:
    """Run `op`, compare every output with the reference; the names of the kernels that ran."""
    got = op(*arrays)
    ref = op.reference(*arrays)
    assert len(got) == len(ref) == len(op.outputs)
    for g, r in zip(got, ref):
        assert_same(g, r, reduced)
    return [k.name for k in op.kernels]


def is_injective_kernel(name: str, tensor: str) -> bool:
    """An injective ('flat' / 'rows' / ...) kernel writing `tensor`."""
    return name.startswith(tensor + "_") and "_reduce_" not in name and "partials" not in name


def assert_strategy(names: list, strategy: str, prefix: str, outputs: int = 1, reduced: int = 0):
    """The kernels of a reduction of `reduced` elements into each of `outputs` (the counts matter to a split,
    whose partials, split_chunks(...) per output, are reduced by the strategy their count calls for)."""
    suffixes = SUFFIXES[strategy]
    if strategy == "split":
        final = choose_strategy(RED["sum"], outputs, split_chunks(outputs, reduced), may_split=False)
        suffixes = suffixes + [f"_reduce_{final}"]
    assert len(names) == len(suffixes), names
    for name, suffix in zip(names, suffixes):
        assert name.endswith(suffix) and name.startswith(prefix), names


# ---------------------------------------------------------------- row reductions: each strategy, each op
X = td.placeholder("X", td.f32, ("M", "K"))
XI = td.placeholder("XI", td.i32, ("M", "K"))
RED = {op: td.reduce(f"R{op}", ("M",), ("K",), lambda i, k: X[i, k], op=op) for op in OPS}
RED_I = {op: td.reduce(f"RI{op}", ("M",), ("K",), lambda i, k: XI[i, k], op=op) for op in OPS}
ROW_OPS = {op: td.op([X], [RED[op]]) for op in OPS}
ROW_OPS_I = {op: td.op([XI], [RED_I[op]]) for op in OPS}


@contextlib.contextmanager
def gpu_plan():
    """Ops plan their kernels as for a GPU (choose_strategy's GPU rules) while the kernels still
    run on the cpu target: every GPU strategy runs through the td.op runtime."""
    op_module = importlib.import_module("taskdsl.schedule.op")   # (the package's `op` is the function)
    with mock.patch.object(op_module, "get_target", lambda: "cuda"):
        yield


@pytest.mark.parametrize("strategy", STRATEGIES)
@pytest.mark.parametrize("op", OPS)
@settings(max_examples=4, deadline=None)
@given(data=st.data())
def test_row_reduce_strategy(op, strategy, data):
    m, k = data.draw(SHAPES[strategy], label="shape")
    seed = data.draw(st.integers(0, 2**16), label="seed")
    x = make_data(op, (m, k), np.random.default_rng(seed))
    assert choose_strategy(RED[op], m, k) == strategy
    with gpu_plan():
        names = check(ROW_OPS[op], x, reduced=k)
        assert_strategy(names, strategy, f"R{op}", m, k)
        assert [k_.name for k_ in ROW_OPS[op].kernels_for(x)] == names


CPU_SHAPES = st.sampled_from([(1, 1), (4099, 7), (3, 3001), (5, 40009), (1, 2**20), (3, 349529), (17, 65537),
                               (25, 65537)])


@pytest.mark.parametrize("op", OPS)
@settings(max_examples=4, deadline=None)
@given(shape=CPU_SHAPES, seed=st.integers(0, 2**16))
@example(shape=(2, 524309), seed=0)
def test_row_reduce_cpu_plan(op, shape, seed):
    """On the cpu target: a thread per output, 8 outputs a block; split where the blocks are fewer than the CPU
    threads, and the reduction has 2^20 elements or more to share."""
    m, k = shape
    x = make_data(op, shape, np.random.default_rng(seed))
    with mock.patch.dict(os.environ, {"TASKDSL_NUM_THREADS": "4"}):
        names = check(ROW_OPS[op], x, reduced=k)
    if -(-m // 8) < 4 and m * k >= 2**20:
        assert len(names) == 2 and names[0].startswith(f"R{op}_partials_reduce_")
        assert names[1].startswith(f"R{op}_reduce_")
    else:
        assert names == [f"R{op}_reduce_thread"]


@pytest.mark.parametrize("m,k,expected", [
    (4099, 7, "thread"), (1, 16, "thread"), (1, 17, "warp"), (1000, 512, "warp"), (1, 513, "block"),
    (63, 32767, "block"), (64, 32768, "block"), (63, 32768, "split"), (1, 10**6, "split"), (0, 0, "thread")])
def test_choose_strategy_thresholds(m, k, expected):
    assert choose_strategy(RED["sum"], m, k) == expected
    assert choose_strategy(RED["sum"], m, k, "cuda", 16) == expected


@pytest.mark.parametrize("m,k,workers,expected", [
    (4099, 7, 2, "thread"), (1, 513, 2, "thread"), (64, 10**6, 2, "thread"), (1, 2**20 - 1, 2, "thread"),
    (1, 2**20, 2, "split"), (3, 10**6, 4, "split"), (4, 10**6, 4, "split"), (25, 10**6, 4, "thread"),
    (24, 10**6, 4, "split"), (1, 2**20, 1, "thread")])
def test_choose_strategy_cpu(m, k, workers, expected):
    assert choose_strategy(RED["sum"], m, k, "cpu", workers) == expected


def test_split_chunks_fill_a_gpu():
    """On a GPU a split makes ~2048 partials (at least 2 chunks, each of 4096 elements or more); on the cpu,
    32 chunks per output."""
    assert split_chunks(1, 16384 * 4096) == 2048
    assert split_chunks(63, 32768) == 8 and split_chunks(1, 8192) == 2 and split_chunks(1, 100) == 2
    assert split_chunks(32, 2**21) == 64 and split_chunks(1, 2**21, "cpu") == 32


def test_the_stages_of_a_split_are_not_split_again():
    """A sum of 2M elements: its partial stage (many outputs of many elements) would be a split again."""
    x = make_data("sum", (1, 2**21), np.random.default_rng(5))
    with gpu_plan():
        assert_strategy(check(ROW_OPS["sum"], x, reduced=2**21), "split", "Rsum", 1, 2**21)
    assert choose_strategy(RED["sum"], 32, 2**17) == "split"
    assert choose_strategy(RED["sum"], 32, 2**17, may_split=False) == "block"
    assert choose_strategy(RED["sum"], 1, 2**20, "cpu", 4, may_split=False) == "thread"


def test_choose_strategy_non_contiguous_is_thread():
    """Reducing a non-contiguous axis: a thread per output so that neighbouring threads read neighbours."""
    col = td.reduce("Col", ("K",), ("M",), lambda j, i: X[i, j])
    assert choose_strategy(col, 5, 10**6) == "thread"
    assert choose_strategy(col, 10**6, 10**6) == "thread"


# ---------------------------------------------------------------- each strategy forced through schedule_reduce
@functools.lru_cache(maxsize=None)
def forced_kernel(op: str, dtype: str, strategy: str):
    t = (RED if dtype == "f32" else RED_I)[op]
    return t, schedule_reduce(t, set(), strategy)


FORCED_SHAPES = st.tuples(st.sampled_from([1, 2, 3, 33, 257]),
                          st.sampled_from([1, 2, 7, 31, 32, 33, 256, 257, 511, 3001]))


@pytest.mark.parametrize("strategy", ["thread", "warp", "block"])
@pytest.mark.parametrize("dtype", ["f32", "i32"])
@pytest.mark.parametrize("op", OPS)
@settings(max_examples=4, deadline=None)
@given(shape=FORCED_SHAPES, seed=st.integers(0, 2**16))
@example(shape=(1, 1), seed=0)
@example(shape=(3, 3001), seed=1)
def test_forced_strategy(op, dtype, strategy, shape, seed):
    t, kernel = forced_kernel(op, dtype, strategy)
    placeholder = X if dtype == "f32" else XI
    assert kernel.name == f"{t.name}_reduce_{strategy}"
    params = [p for p in kernel._frontend_ir(kernel.block_spec).params if isinstance(p, ir.Buffer)]
    assert [p.name for p in params] == [placeholder.name, t.name]      # the placeholder's array, then the output
    x = make_data(op, shape, np.random.default_rng(seed), placeholder.dtype.numpy)
    out = np.full(shape[:1], 123, t.dtype.numpy)
    kernel(x, out)
    ref, = evaluate([placeholder], [t], [x])
    assert_same(out, ref, shape[1])


@pytest.mark.parametrize("dtype", ["f32", "i32"])
@pytest.mark.parametrize("op", OPS)
@settings(max_examples=4, deadline=None)
@given(shape=FORCED_SHAPES, seed=st.integers(0, 2**16))
@example(shape=(3, 3001), seed=1)
def test_compact_thread_reduction(op, dtype, shape, seed):
    """The 'thread' form for fast compilation (one accumulator, one loop) gives the reference's results."""
    t = (RED if dtype == "f32" else RED_I)[op]
    kernel = schedule_reduce(t, set(), "thread", compact=True)
    x = make_data(op, shape, np.random.default_rng(seed), (X if dtype == "f32" else XI).dtype.numpy)
    out = np.full(shape[:1], 123, t.dtype.numpy)
    kernel(x, out)
    assert_same(out, evaluate([X if dtype == "f32" else XI], [t], [x])[0], shape[1])


@pytest.mark.parametrize("window", [None, 9])      # a symbolic row, a constant 3x3 window
def test_ops_unroll_thread_reductions_only_outside_fast_compile(window):
    """An op's 'thread' reduction has interleaved lanes (or its constant window unrolled) unless
    `td.fast_compile` is on: then its body appears once, and numba compiles it several times faster."""
    x = td.placeholder("x", td.f32, ("M", window or "K"))
    red = td.reduce("s", ("M",), (window or "K",), lambda i, k: x[i, k] * 2.0, op="sum")
    op = td.op([x], [red])
    a = np.random.default_rng(0).uniform(-1, 1, (4099, window or 5)).astype(np.float32)
    for fast in (True, False):
        td.fast_compile(fast)
        check(op, a, reduced=a.shape[1])
        kernel, = op.kernels
        assert kernel.name.endswith("_reduce_thread")
        text = kernel.ir(a, np.empty(a.shape[0], np.float32))
        assert text.count("x[") == (1 if fast else 9)       # 8 lanes and the rest's loop, or 9 window elements
        assert ("lane1" in text) == (not fast and window is None)


def test_reference_of_int_reductions_matches_python():
    """The oracle itself, for int32 rows: exact integer results (mean as f32)."""
    x = np.array([[3, -7, 2], [50, 50, -1]], np.int32)
    got = ROW_OPS_I["sum"].reference(x)[0], ROW_OPS_I["prod"].reference(x)[0], ROW_OPS_I["mean"].reference(x)[0]
    np.testing.assert_array_equal(got[0], [-2, 99])
    np.testing.assert_array_equal(got[1], [-42, -2500])
    assert got[2].dtype == np.float32


@pytest.mark.parametrize("op", OPS)
@settings(max_examples=3, deadline=None)
@given(shape=st.sampled_from([(4099, 3), (5, 300), (3, 3001), (2, 40009)]), seed=st.integers(0, 2**16))
def test_int32_row_reduce_through_op(op, shape, seed):
    x = make_data(op, shape, np.random.default_rng(seed), np.int32)
    check(ROW_OPS_I[op], x, reduced=shape[1])


# ---------------------------------------------------------------- other reduce layouts
COL = td.reduce("ColSum", ("K",), ("M",), lambda j, i: X[i, j])
COL_OP = td.op([X], [COL])
X3 = td.placeholder("X3", td.f32, ("P", "Q", "R"))
OUTER = td.reduce("Outer", ("Q",), ("P", "R"), lambda q, p, r: X3[p, q, r], op="max")     # axes 0 and 2
OUTER_OP = td.op([X3], [OUTER])
KEEP = td.reduce("Keep", ("P", 1, 1), ("Q", "R"), lambda p, a, b, q, r: X3[p, q, r], op="mean")
KEEP_OP = td.op([X3], [KEEP])
ALL_KEEP = td.reduce("AllKeep", (1, 1), ("M", "K"), lambda a, b, m, k: X[m, k])
ALL_KEEP_OP = td.op([X], [ALL_KEEP])
ALL = td.reduce("All", (), ("M", "K"), lambda m, k: X[m, k])
ALL_OP = td.op([X], [ALL])


@FEW
@given(shape=st.sampled_from([(3001, 5), (1, 1), (7, 1), (513, 131), (40009, 2), (9, 15), (9, 16)]),
       seed=st.integers(0, 2**16))
def test_column_reduce_uses_thread_or_columns_strategy(shape, seed):
    """A thread per output; on the cpu, from 16 outputs on, a block per 1024 of them adding rows ('columns')."""
    x = make_data("sum", shape, np.random.default_rng(seed))
    rows = td.get_target() == "cpu" and shape[1] >= 16 and shape[0] > 1
    assert check(COL_OP, x, reduced=shape[0]) == ["ColSum_reduce_columns" if rows else "ColSum_reduce_thread"]


@pytest.mark.parametrize("op", OPS)
def test_a_column_reduce_of_too_few_blocks_is_split_into_rows_of_partials(monkeypatch, op):
    """On the cpu a 'columns' reduction with fewer blocks of columns than threads is split with its chunks as the
    partials' leading axis: both stages add rows (64 columns of 32771 rows ran on one of two cores)."""
    if td.get_target() != "cpu":
        pytest.skip("the 'columns' strategy is the cpu's")
    monkeypatch.setenv("TASKDSL_NUM_THREADS", "4")
    reduction = td.reduce(f"Col{op}", ("K",), ("M",), lambda j, i: X[i, j], op=op)
    fresh = td.op([X], [reduction])
    x = make_data(op, (32771, 67), np.random.default_rng(11))      # 2.2M elements: one block of 67 columns
    assert check(fresh, x, reduced=32771) == [f"Col{op}_partials_reduce_columns", f"Col{op}_reduce_columns"]
    assert choose_strategy(reduction, 67, 32771, "cpu", 4, last=67) == "split"
    assert choose_strategy(reduction, 67, 32771, "cpu", 1, last=67) == "columns"    # one thread: nothing to share
    assert choose_strategy(reduction, 67, 2**14, "cpu", 4, last=67) == "columns"    # (not worth a split)
    assert choose_strategy(reduction, 4096, 2**12, "cpu", 4, last=4096) == "columns"    # four blocks of columns


@FEW
@given(shape=st.sampled_from([(3, 2, 5), (1, 1, 1), (7, 3, 31), (2, 13, 1031), (1, 2, 3001)]),
       seed=st.integers(0, 2**16))
def test_reduce_over_first_and_last_axes(shape, seed):
    x = make_data("max", shape, np.random.default_rng(seed))
    names = check(OUTER_OP, x, reduced=shape[0] * shape[2])
    assert len(names) == 1 and names[0].startswith("Outer_reduce_")


@FEW
@given(shape=st.sampled_from([(2, 3, 5), (1, 1, 1), (5, 7, 11), (3, 2, 3001), (1, 3, 40009)]),
       seed=st.integers(0, 2**16))
def test_reduce_keepdims(shape, seed):
    x = make_data("mean", shape, np.random.default_rng(seed))
    out, = KEEP_OP(x)
    assert out.shape == (shape[0], 1, 1)
    check(KEEP_OP, x, reduced=shape[1] * shape[2])


@FEW
@given(shape=st.sampled_from([(1, 1), (3, 5), (7, 3001), (1, 40009), (4, 32768)]), seed=st.integers(0, 2**16))
def test_reduce_all_axes_keepdims(shape, seed):
    x = make_data("sum", shape, np.random.default_rng(seed))
    with gpu_plan():
        names = check(ALL_KEEP_OP, x, reduced=x.size)
    assert_strategy(names, choose_strategy(ALL_KEEP, 1, x.size), "AllKeep", 1, x.size)


@pytest.mark.parametrize("shape", [(3, 5), (7, 3001)])
def test_reduce_all_axes_to_a_scalar(shape):
    """A reduction over every axis has a 0-d output."""
    x = make_data("sum", shape, np.random.default_rng(0))
    s, = ALL_OP(x)
    assert s.shape == () and s.dtype == np.float32
    check(ALL_OP, x, reduced=x.size)


CHUNKS = 32


@pytest.mark.parametrize("op", OPS)
def test_split_stages_definitions(op):
    """'split' is two reduce definitions whose reference value is the original reduction's."""
    t = RED[op]
    partial, final = split_stages(t, CHUNKS)
    assert partial.kind == final.kind == "reduce"
    assert partial.name == f"R{op}_partials" and partial.ndim == 2
    assert isinstance(partial.shape[1], ir.Const) and partial.shape[1].value == CHUNKS
    assert final.buffer is t.buffer and final.dtype == t.dtype and final.shape == t.shape
    assert final.reduce_shape[0].value == CHUNKS
    assert final.inputs == [partial]
    for shape in [(2, 1), (3, 31), (2, 33), (1, 1000), (2, 40009)]:
        x = make_data(op, shape, np.random.default_rng(shape[1]))
        ref, = evaluate([X], [t], [x])
        got, = evaluate([X], [final], [x])
        assert_same(got, ref, shape[1])


# ---------------------------------------------------------------- injective chains and fusion
A = td.placeholder("A", td.f32, ("M", "K"))
B = td.placeholder("B", td.f32, ("K",))
Y = td.compute("Y", ("M", "K"), lambda i, j: td.exp(A[i, j] - B[j]))
S = td.reduce("S", ("M",), ("K",), lambda i, k: Y[i, k], op="sum")
CHAIN = td.op([A, B], [S])


@FEW
@given(shape=st.sampled_from([(1, 1), (97, 13), (5, 37), (3, 509), (2, 3001), (67, 1021)]),
       seed=st.integers(0, 2**16))
@example(shape=(4099, 7), seed=0)
def test_injective_producer_is_inlined_into_the_reduction(shape, seed):
    """Y = exp(A - B[j]) and S = sum(Y): one kernel, which computes exp as it sums."""
    rng = np.random.default_rng(seed)
    a, b = rng.uniform(-1, 1, shape).astype(np.float32), rng.uniform(-1, 1, shape[1:]).astype(np.float32)
    for plan in (contextlib.nullcontext, gpu_plan):
        with plan():
            names = check(CHAIN, a, b, reduced=shape[1] * 3)
            assert len(names) == 1 and names[0].startswith("S_reduce_")
            kernel = CHAIN.kernels[0]
            params = [p.name for p in kernel._frontend_ir(kernel.block_spec).params if isinstance(p, ir.Buffer)]
            assert params == ["A", "B", "S"]                                   # Y is never stored
            src = CHAIN.source(a, b)
            assert "expf" in src and "__global__" in src


@pytest.mark.parametrize("shape", [(1, 2**20 + 7), (3, 349529)])
def test_injective_producer_is_inlined_into_a_split_reduction(shape):
    """A 'split' reduction inlines the producer into its first stage: Y is never stored."""
    rng = np.random.default_rng(0)
    a, b = rng.uniform(-1, 1, shape).astype(np.float32), rng.uniform(-1, 1, shape[1:]).astype(np.float32)
    for plan in (contextlib.nullcontext, gpu_plan):
        with plan(), mock.patch.dict(os.environ, {"TASKDSL_NUM_THREADS": "4"}):
            names = check(CHAIN, a, b, reduced=shape[1] * 3)
            assert len(names) == 2 and names[0].startswith("S_partials_reduce_")
            for kernel in CHAIN.kernels:
                params = [p.name for p in kernel._frontend_ir(kernel.block_spec).params if isinstance(p, ir.Buffer)]
                assert "Y" not in params, (kernel.name, params)


XS = td.placeholder("XS", td.f32, ("M", "K"))
MX = td.reduce("Mx", ("M",), ("K",), lambda i, k: XS[i, k], op="max")
EXP = td.compute("Ex", ("M", "K"), lambda i, j: td.exp(XS[i, j] - MX[i]))
SOFTMAX_NUM = td.op([XS], [EXP])
SUM = td.reduce("Den", ("M",), ("K",), lambda i, k: EXP[i, k])
SOFTMAX = td.compute("Softmax", ("M", "K"), lambda i, j: EXP[i, j] / SUM[i])
SOFTMAX_OP = td.op([XS], [SOFTMAX])


@FEW
@given(shape=st.sampled_from([(1, 1), (7, 33), (3, 255), (131, 127)]), seed=st.integers(0, 2**16))
def test_reduce_then_elementwise(shape, seed):
    x = np.random.default_rng(seed).normal(0, 3, shape).astype(np.float32)
    with gpu_plan():
        names = check(SOFTMAX_NUM, x, reduced=1)
    assert names[0] == ("Mx_reduce_warp" if shape[1] > 16 else "Mx_reduce_thread")
    assert len(names) == 2 and is_injective_kernel(names[1], "Ex")


@FEW
@given(shape=st.sampled_from([(1, 1), (7, 33), (3, 255), (131, 127), (2, 3001)]), seed=st.integers(0, 2**16))
def test_softmax_three_kernels_exp_inlined_twice(shape, seed):
    x = np.random.default_rng(seed).normal(0, 3, shape).astype(np.float32)
    names = check(SOFTMAX_OP, x, reduced=1)
    assert len(names) == 3 and names[0].startswith("Mx_reduce_") and names[1].startswith("Den_reduce_")
    assert is_injective_kernel(names[2], "Softmax")
    out, = SOFTMAX_OP(x)
    np.testing.assert_allclose(out.sum(axis=1), 1.0, rtol=1e-4)
    e = np.exp(x.astype(np.float64) - x.max(axis=1, keepdims=True))
    np.testing.assert_allclose(out, e / e.sum(axis=1, keepdims=True), rtol=1e-4, atol=1e-7)


XO = td.placeholder("XO", td.f32, ("M", "K"))
YO = td.compute("Yo", ("M", "K"), lambda i, j: XO[i, j] * 2.0 + 1.0)
ZO = td.compute("Zo", ("M", "K"), lambda i, j: td.exp(YO[i, j]) - YO[i, j])
SO = td.reduce("So", ("M",), ("K",), lambda i, k: YO[i, k], op="min")
SHARED_OUT = td.op([XO], [YO, ZO, SO])
W = td.compute("W", ("M", "K"), lambda i, j: XO[i, j] * 3.0)
O1 = td.compute("O1", ("M", "K"), lambda i, j: W[i, j] + 1.0)
O2 = td.compute("O2", ("M", "K"), lambda i, j: W[i, j] * W[i, j])
SHARED_INLINED = td.op([XO], [O1, O2])


@FEW
@given(shape=st.sampled_from([(1, 1), (3, 7), (2, 3001), (1031, 3)]), seed=st.integers(0, 2**16))
def test_output_consumed_by_other_outputs_is_materialized_once(shape, seed):
    x = np.random.default_rng(seed).uniform(-1, 1, shape).astype(np.float32)
    names = check(SHARED_OUT, x, reduced=shape[1])
    assert len(names) == 3 and sum(n.startswith("Yo_") for n in names) == 1
    assert is_injective_kernel(names[0], "Yo") and is_injective_kernel(names[1], "Zo")
    assert names[2].startswith("So_reduce_")
    for kernel in SHARED_OUT.kernels[1:]:        # the consumers read the stored Yo, not XO
        params = [p.name for p in kernel._frontend_ir(kernel.block_spec).params if isinstance(p, ir.Buffer)]
        assert params[0] == "Yo" and "XO" not in params
    y, z, s = SHARED_OUT(x)
    np.testing.assert_allclose(z, np.exp(y) - y, rtol=1e-5, atol=1e-6)
    np.testing.assert_array_equal(s, y.min(axis=1))


@FEW
@given(shape=st.sampled_from([(1, 1), (3, 7), (2, 3001)]), seed=st.integers(0, 2**16))
def test_intermediate_read_by_two_outputs_is_inlined_into_both(shape, seed):
    x = np.random.default_rng(seed).uniform(-1, 1, shape).astype(np.float32)
    names = check(SHARED_INLINED, x)
    assert len(names) == 2 and is_injective_kernel(names[0], "O1") and is_injective_kernel(names[1], "O2")
    for kernel in SHARED_INLINED.kernels:
        params = [p.name for p in kernel._frontend_ir(kernel.block_spec).params if isinstance(p, ir.Buffer)]
        assert "W" not in params


# ---------------------------------------------------------------- injective kernels vs the reference
C = td.placeholder("C", td.f32, ("M", 1))
BCAST = td.compute("Bcast", ("M", "K"), lambda i, j: A[i, j] * B[j] + C[i, 0] + (i - 2 * j))
TRANS = td.compute("Trans", ("K", "M"), lambda j, i: A[i, j])
SHIFT = td.compute("Shift", ("M", "K"), lambda i, j: ir.Select(i > 0, A[i - 1, j], ir.const(0.0), td.f32))
SHIFT_UP = td.compute("ShiftUp", ("M", "K"),
                      lambda i, j: ir.Select(j < size_var("K") - 1, A[i, j + 1], B[j], td.f32))
INJECTIVE = td.op([A, B, C], [BCAST, TRANS, SHIFT, SHIFT_UP])
INJ_SHAPES = st.tuples(st.sampled_from([1, 2, 3, 7, 31, 97, 1031]), st.sampled_from([1, 2, 5, 13, 257, 3001]))


@FEW
@given(shape=INJ_SHAPES, seed=st.integers(0, 2**16))
@example(shape=(1, 1), seed=0)
@example(shape=(1, 3001), seed=0)
def test_elementwise_broadcast_transpose_shift(shape, seed):
    rng = np.random.default_rng(seed)
    m, k = shape
    a, b, c = (rng.uniform(-1, 1, s).astype(np.float32) for s in ((m, k), (k,), (m, 1)))
    names = check(INJECTIVE, a, b, c)
    assert len(names) == 4
    assert all(is_injective_kernel(n, t) for n, t in zip(names, ["Bcast", "Trans", "Shift", "ShiftUp"]))
    bcast, trans, shift, up = INJECTIVE(a, b, c)
    np.testing.assert_array_equal(trans, a.T)
    np.testing.assert_array_equal(shift[1:], a[:-1])
    np.testing.assert_array_equal(shift[:1], 0)
    np.testing.assert_array_equal(up[:, :-1], a[:, 1:])
    np.testing.assert_array_equal(up[:, -1], np.broadcast_to(b[-1], (m,)))


AI = td.placeholder("AI", td.i32, ("M", "K"))
ROWIDX = td.compute("RowIdx", ("M", "K"), lambda i, j: AI[i, j] + i * 1000 + j)
ROWIDX_OP = td.op([AI], [ROWIDX])


@pytest.mark.parametrize("shape", [(3, 255), (3, 256), (1, 3001), (1031, 7), (5, 15), (5, 16), (65537, 256), (0, 300),
                                   (300, 0)])
def test_elementwise_rows_and_flat(shape):
    """'rows' for a last axis of >= 256 (grid-striding past 65535 rows), else 'flat'; on the cpu their
    one-thread forms, a loop over a contiguous span per block ('row_spans' from rows of 16, 'spans')."""
    a = np.random.default_rng(0).integers(-5, 6, shape).astype(np.int32)
    names = check(ROWIDX_OP, a)
    rows = shape[1] >= 256
    assert names == ["RowIdx_row_spans" if shape[1] >= 16 else "RowIdx_spans"]
    sizes = {"M": shape[0], "K": shape[1]}
    assert injective_strategy(ROWIDX, sizes, "cuda") == ("rows" if rows else "flat")
    gpu_kernel = schedule_injective(ROWIDX, set(), injective_strategy(ROWIDX, sizes, "cuda"))
    assert gpu_kernel.name == ("RowIdx_rows" if rows else "RowIdx_flat") and gpu_kernel.block_spec == (256, 1, 1)
    out, = ROWIDX_OP(a)
    np.testing.assert_array_equal(out, a + np.arange(shape[0])[:, None] * 1000 + np.arange(shape[1]))


AI3 = td.placeholder("AI3", td.i32, ("A", "B", "C"))
COORDS3 = td.compute("Coords3", ("A", "B", "C"), lambda i, j, k: AI3[i, j, k] + i * 100000 + j * 10 + k)
COORDS3_OP = td.op([AI3], [COORDS3])


@pytest.mark.parametrize("shape", [(2, 3001, 3), (3, 5, 7), (4099, 1, 2), (1, 1, 1), (0, 4, 3)])
def test_cpu_spans_carry_coordinates(shape):
    """A cpu 'spans' kernel unravels its first element's coordinates once and carries them from element to
    element (spans of 4096 start mid-row and mid-plane here), with no division in its loop: a gather of 2M elements
    with a short last axis took 19.3 ms with three int64 divisions an element, numpy.take 1.8 ms."""
    a = np.random.default_rng(1).integers(-5, 6, shape).astype(np.int32)
    assert check(COORDS3_OP, a) == ["Coords3_spans"]
    i, j, k = np.indices(shape)
    np.testing.assert_array_equal(COORDS3_OP(a)[0], a + i * 100000 + j * 10 + k)
    fn = schedule_injective(COORDS3, set(), "spans")._frontend_ir((1, 1, 1))
    loop, = [f for f in ir.collect(fn.body, ir.For) if f.var.name == "j"]
    assert not [e for e in ir.collect(loop.body, ir.Binary) if e.op in ("//", "%")]


@pytest.mark.parametrize("shape", [(2, 7, 16), (3, 301, 64), (1, 2, 4096), (5, 3, 5000), (0, 2, 20)])
def test_cpu_row_spans_take_groups_of_rows_carrying_their_coordinates(shape):
    """A cpu 'row_spans' block takes as many rows as make SPAN elements (one row past SPAN), unravels the first
    one's coordinates once and carries them from row to row (rows of 64 took a block each, four divisions a row):
    groups that end mid-plane and a last, partial group."""
    a = np.random.default_rng(2).integers(-5, 6, shape).astype(np.int32)
    i, j, k = np.indices(shape)
    np.testing.assert_array_equal(COORDS3_OP(a)[0], a + i * 100000 + j * 10 + k)
    kernel = schedule_injective(COORDS3, set(), "row_spans")
    rows, width = shape[0] * shape[1], shape[2]
    groups = -(-rows // max(1, SPAN // width))
    sizes = dict(zip("ABC", shape))
    assert kernel.grid_spec(*[sizes[name] for name in inspect.signature(kernel.grid_spec).parameters])[1] \
        == max(1, groups)
    fn = kernel._frontend_ir((1, 1, 1))
    loop, = [f for f in ir.collect(fn.body, ir.For) if f.var.name == "row"]
    assert not [e for e in ir.collect(loop.body, ir.Binary) if e.op in ("//", "%")]


NI = td.placeholder("NI", td.i32, ("N",))
ND = td.placeholder("ND", td.i32, ("N",))
NF = td.placeholder("NF", td.f32, ("N",))
FLOORDIV = td.compute("FloorDiv", ("N",), lambda i: NI[i] // ND[i])
FLOORMOD = td.compute("FloorMod", ("N",), lambda i: NI[i] % ND[i] + NI[i] % -3 * 1000)
TRUNC = td.compute("Trunc", ("N",), lambda i: NF[i], dtype=td.i32)
GATHER = td.compute("Gather", ("N",), lambda i: NF[ir.Select(NI[i] < 0, NI[i] + size_var("N"), NI[i], td.i32)
                                                   % size_var("N")])
INT_OP = td.op([NI, ND, NF], [FLOORDIV, FLOORMOD, TRUNC, GATHER])


@FEW
@given(n=st.sampled_from([1, 2, 7, 31, 1031, 3001]), seed=st.integers(0, 2**16))
@example(n=9, seed=0)
def test_integer_division_casts_and_gather(n, seed):
    rng = np.random.default_rng(seed)
    i = rng.integers(-100, 101, n).astype(np.int32)
    d = rng.choice(np.array([-7, -3, -2, -1, 1, 2, 3, 7], np.int32), n)
    f = rng.uniform(-50, 50, n).astype(np.float32)
    if n == 9:
        i[:4], d[:4] = [-7, -7, 7, 7], [2, -2, 2, -2]
    names = check(INT_OP, i, d, f)
    assert all(is_injective_kernel(n, t) for n, t in zip(names, ["FloorDiv", "FloorMod", "Trunc", "Gather"]))
    div, mod, trunc, gather = INT_OP(i, d, f)
    ii, dd = i.tolist(), d.tolist()
    np.testing.assert_array_equal(div, [x // y for x, y in zip(ii, dd)])
    np.testing.assert_array_equal(mod, [x % y + (x % -3) * 1000 for x, y in zip(ii, dd)])
    np.testing.assert_array_equal(trunc, [int(v) for v in f.tolist()])
    np.testing.assert_array_equal(gather, f[i % n])


MF = td.placeholder("MF", td.f32, ("N",))
MG = td.placeholder("MG", td.f32, ("N",))
MATH_ALL = td.compute("MathAll", ("N",), lambda i: (
    td.exp(MF[i]) + td.exp2(MF[i]) + td.log(MG[i]) + td.log2(MG[i]) + td.sqrt(MG[i]) + td.rsqrt(MG[i])
    + td.sin(MF[i]) + td.cos(MF[i]) + td.tanh(MF[i]) + td.erf(MF[i]) + td.abs(MF[i]) + td.floor(MF[i])
    + td.ceil(MF[i]) + td.max(MF[i], MG[i]) + td.min(MF[i], MG[i]) + td.pow(MG[i], MF[i])
    + td.fma(MF[i], MG[i], 0.5) + td.sigmoid(MF[i])))
MATH_OP = td.op([MF, MG], [MATH_ALL])


@FEW
@given(n=st.sampled_from([1, 5, 257, 3001]), seed=st.integers(0, 2**16))
def test_every_math_function_in_a_kernel(n, seed):
    rng = np.random.default_rng(seed)
    f = rng.uniform(-3, 3, n).astype(np.float32)
    g = rng.uniform(0.1, 3, n).astype(np.float32)
    got, = MATH_OP(f, g)
    ref, = MATH_OP.reference(f, g)
    assert got.dtype == ref.dtype == np.float32
    np.testing.assert_allclose(got, ref, rtol=1e-5, atol=1e-4)
    src = MATH_OP.source(f, g)
    for fn in ("expf", "logf", "sqrtf", "sinf", "cosf", "tanhf", "erff", "floorf", "ceilf", "powf"):
        assert fn in src, fn


HF = td.placeholder("HF", td.f16, ("M", "K"))
H_SUM = td.reduce("HSum", ("M",), ("K",), lambda i, k: HF[i, k] * HF[i, k])
H_SCALE = td.compute("HScale", ("M", "K"), lambda i, j: HF[i, j] * 0.5, dtype=td.f16)
H_OP = td.op([HF], [H_SUM, H_SCALE])


@FEW
@given(shape=st.sampled_from([(3, 7), (2, 4096), (5, 300)]), seed=st.integers(0, 2**16))
def test_f16_inputs_compute_in_f32(shape, seed):
    h = np.random.default_rng(seed).uniform(-2, 2, shape).astype(np.float16)
    h[0, 0] = 200.0                                                          # 200 * 200 overflows f16
    s, scale = H_OP(h)
    s_ref, scale_ref = H_OP.reference(h)
    assert s.dtype == np.float32 and scale.dtype == np.float16
    assert np.isfinite(s).all()
    np.testing.assert_allclose(s, s_ref, rtol=1e-4)
    np.testing.assert_allclose(s, (h.astype(np.float64) ** 2).sum(axis=1), rtol=1e-4)
    np.testing.assert_array_equal(scale, scale_ref)


# ---------------------------------------------------------------- zero-size inputs
def test_zero_size_elementwise():
    a, b, c = np.zeros((0, 5), np.float32), np.zeros((5,), np.float32), np.zeros((0, 1), np.float32)
    outs = INJECTIVE(a, b, c)
    assert [o.shape for o in outs] == [(0, 5), (5, 0), (0, 5), (0, 5)]
    a, b, c = np.zeros((3, 0), np.float32), np.zeros((0,), np.float32), np.zeros((3, 1), np.float32)
    assert [o.shape for o in INJECTIVE(a, b, c)] == [(3, 0), (0, 3), (3, 0), (3, 0)]


@pytest.mark.parametrize("op", OPS)
def test_zero_rows(op):
    out, = ROW_OPS[op](np.zeros((0, 7), np.float32))
    assert out.shape == (0,) and out.dtype == np.float32


@pytest.mark.parametrize("op", ["sum", "max", "min", "prod"])
def test_empty_reduction_float(op):
    x = np.zeros((3, 0), np.float32)
    check(ROW_OPS[op], x)
    out, = ROW_OPS[op](x)
    expected = {"sum": 0.0, "max": -np.inf, "min": np.inf, "prod": 1.0}[op]
    np.testing.assert_array_equal(out, np.full(3, expected, np.float32))


def test_empty_reduction_mean_is_nan():
    out, = ROW_OPS["mean"](np.zeros((2, 0), np.float32))
    assert out.shape == (2,) and np.isnan(out).all()


@pytest.mark.parametrize("op", ["sum", "max", "min", "prod"])
def test_empty_reduction_int32_matches_reference(op):
    """Kernel and reference agree on an empty int reduction (the identity of the op)."""
    x = np.zeros((2, 0), np.int32)
    check(ROW_OPS_I[op], x)
    info = np.iinfo(np.int32)
    out, = ROW_OPS_I[op](x)
    np.testing.assert_array_equal(out, np.full(2, {"sum": 0, "prod": 1, "max": info.min, "min": info.max}[op]))


# ---------------------------------------------------------------- the td.op interface
def test_op_interface_errors():
    x = np.zeros((2, 3), np.float32)
    fresh = td.op([X], [RED["sum"]], name="fresh_sum")
    assert fresh.name == "fresh_sum" and ROW_OPS["sum"].name == "Rsum"
    with pytest.raises(RuntimeError, match="has not been called yet"):
        fresh.kernels
    assert [k.name for k in fresh.kernels_for(x)] == ["Rsum_reduce_thread"]
    with pytest.raises(TypeError, match=r"takes 1 arrays \(X\), got 2"):
        fresh(x, x)
    with pytest.raises(TypeError, match=r"input 'X' must have dtype float32 \(f32\), got float64"):
        fresh(x.astype(np.float64))
    with pytest.raises(ValueError, match=r"'X' must be 2-d"):
        fresh(np.zeros(3, np.float32))
    with pytest.raises(ValueError, match=r"size 'K'"):
        CHAIN(np.zeros((2, 3), np.float32), np.zeros(4, np.float32))
    with pytest.raises(ValueError, match=r"the outputs read B, which are not inputs"):
        td.op([A], [S])
    unbound = td.compute("U", ("Z",), lambda i: X[0, 0] + 1.0)
    with pytest.raises(ValueError, match=r"size 'Z' of 'U' is not determined by the shape of any input"):
        td.op([X], [unbound])
    with pytest.raises(TypeError, match="must be td.placeholder tensors"):
        td.op([Y], [S])
    with pytest.raises(TypeError, match="outputs must be tensors"):
        td.op([X], ["Rsum"])


def test_op_materializes_outputs_and_reductions_only():
    assert [t.name for t in SOFTMAX_OP.materialized] == ["Mx", "Den", "Softmax"]
    assert SOFTMAX_OP.inlined == {id(EXP)}
    assert [t.name for t in SHARED_OUT.materialized] == ["Yo", "Zo", "So"] and SHARED_OUT.inlined == set()
    assert [t.name for t in CHAIN.materialized] == ["S"] and CHAIN.inlined == {id(Y)}



# a max over the 3 rows around each row, outside X -inf: the test of the window position reads no column
PADDED = td.reduce("PaddedMax", ("M", "K"), (3,), lambda i, j, w: ir.Select(
    (i + w >= 1) & (i + w <= X.shape[0]), X[i + w - 1, j], ir.const(-np.inf, ir.types.f32), ir.types.f32), op="max")
PADDED_OP = td.op([X], [PADDED])


@pytest.mark.parametrize("shape", [(7, 40), (1, 33), (2, 1031)])
def test_a_columns_window_test_is_taken_out_of_the_row_loop(shape):
    """A 'columns' reduction tests a window position that reads no column once per row, not per element: `if`
    the loop over the row on the select's first operand, `else` on its second (a pooling's padding); the
    results are the compute definition's, padding rows included."""
    x = make_data("max", shape, np.random.default_rng(1))
    if td.get_target() != "cpu":
        pytest.skip("the 'columns' strategy is the cpu's")
    assert check(PADDED_OP, x) == ["PaddedMax_reduce_columns"]
    [kernel] = PADDED_OP.kernels
    fn = kernel._frontend_ir(kernel.bind(kernel.arguments((x, np.empty(shape, np.float32)), {})).block)
    [test] = [s for s in ir.collect(fn.body, ir.If, expressions=False) if isinstance(s.then, ir.For)]
    assert isinstance(test.orelse, ir.For) and not ir.collect(test.then, ir.Select)
    np.testing.assert_array_equal(PADDED_OP(x)[0], np.max(np.stack([np.pad(x, ((1, 1), (0, 0)),
                                  constant_values=-np.inf)[w:w + shape[0]] for w in range(3)]), axis=0))


@pytest.mark.parametrize("op", OPS)
def test_a_splits_chunks_reduce_their_elements_inside_untested(monkeypatch, op):
    """On the cpu the partial stage of a split reduces each chunk over its elements inside the reduced ones
    (`rules._inside_prefix`): its loops hold no select (tested element by element, the loop stayed scalar) and the
    last chunk stops short; the results are the compute definition's, for floats and integers."""
    if td.get_target() != "cpu":
        pytest.skip("the cpu's split reduces its chunks by the 'thread' strategy")
    monkeypatch.setenv("TASKDSL_NUM_THREADS", "4")     # one output: split wherever there are threads to share it
    rng = np.random.default_rng(3)
    for holder, reductions, dtype in ((X, RED, np.float32), (XI, RED_I, np.int32)):
        fresh = td.op([holder], [reductions[op]])
        data = make_data(op, (1, 2**20 + 9), rng, dtype)
        if op == "prod":        # (a million factors: a few 2s only, at both ends, or the product overflows)
            data = np.where(data < 0, -1, 1).astype(dtype)
            data[0, :3] = data[0, -3:] = 2
        check(fresh, data, reduced=2**20 + 9)
        if op == "mean" and dtype == np.int32:      # an integer mean divides once: it is not split
            continue
        [partial] = [k for k in fresh.kernels if k.name.endswith("_partials_reduce_thread")]
        loops = ir.collect(partial._frontend_ir(partial.block_spec).body, ir.For, expressions=False)
        assert loops and not any(ir.collect(loop.body, ir.Select) for loop in loops)
