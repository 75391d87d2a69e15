"""stdlib_ops.reduce: sum / mean / max / min over any axes, argmax / argmin."""
import ml_dtypes
import numpy as np
import pytest
from hypothesis import example, given
from hypothesis import strategies as st

import taskdsl as td
from stdlib_ops import reduce as R
from taskdsl.ir.types import is_float_dtype
from taskdsl.schedule.rules import UNROLL_REDUCED

from . import FEW, SEEDS, TWO, check, rand, shapes

GPU_TWINS = True     # each test also runs on cuda (as a @gpu test) where a GPU is usable


@st.composite
def shape_and_axis(draw, max_ndim: int = 4):
    shape = draw(shapes(1, max_ndim))
    kind = draw(st.sampled_from(["none", "int", "tuple"]))
    if kind == "none":
        return shape, None
    if kind == "int":
        return shape, draw(st.integers(-len(shape), len(shape) - 1))
    axes = draw(st.lists(st.integers(0, len(shape) - 1), min_size=1, max_size=len(shape), unique=True))
    return shape, tuple(axes)


NUMPY = {"sum": np.sum, "mean": np.mean, "max": np.max, "min": np.min}


@pytest.mark.parametrize("name", list(NUMPY))
@FEW
@given(case=shape_and_axis(), keepdims=st.booleans(), seed=SEEDS)
@example(case=((7, 1031), -1), keepdims=False, seed=0)        # a large contiguous reduction
@example(case=((1031, 13), 0), keepdims=True, seed=1)         # a strided one
@example(case=((2, 13, 1031), None), keepdims=False, seed=75)  # a sum of 26806 terms that cancels to -6.96
def test_reduce(name, case, keepdims, seed):
    shape, axis = case
    x = rand(shape, seed, low=-1, high=1)
    got = getattr(R, name)(x, axis=axis, keepdims=keepdims)
    expected = NUMPY[name](x.astype(np.float64), axis=axis, keepdims=keepdims)
    # a float32 sum that cancels to a small value is only as exact as its terms' magnitude allows
    magnitude = NUMPY[name](np.abs(x.astype(np.float64)), axis=axis).max(initial=0.0)
    atol = 2e-5 + 1e-7 * magnitude if name in ("sum", "mean") else 2e-5
    check(got, R.op_for(name, x, axis, keepdims), expected, rtol=1e-5, atol=atol, dtype=np.float32)


def test_reduce_whole_array_and_size_one_axes():
    x = rand((1, 5, 1, 7), 3)
    for name, fn in NUMPY.items():
        for axis in (None, 0, 2, (0, 2), (1, 2)):
            got = getattr(R, name)(x, axis=axis)
            expected = fn(x.astype(np.float64), axis=axis)
            check(got, R.op_for(name, x, axis), expected, rtol=1e-5, atol=1e-6, dtype=np.float32)
    assert R.sum(x).shape == ()
    assert R.max(x, axis=(0, 1, 2, 3), keepdims=True).shape == (1, 1, 1, 1)
    # axes of size 1 only: one element an output, a constant (as a size: a reduction loop an output, 15x numpy)
    reduction = R.op_for("sum", x, (0, 2)).op.outputs[0]
    assert [d.value for d in reduction.reduce_shape] == [1]


def test_few_reduced_elements_are_built_into_the_kernel():
    """Outside td.fast_compile a reduction of at most UNROLL_REDUCED elements an output has that count built in, so
    its loop unrolls (a sum of (524288, 4) over the last axis: 1.62 -> 0.46 ms); more elements, or the tests' fast
    compiles, keep a size symbol (one kernel for every size)."""
    def reduced(name, x, axis):     # the reduced extents built in (None: a size symbol)
        return [d.value if isinstance(d, td.ir.Const) else None
                for d in R.op_for(name, x, axis).op.outputs[0].reduce_shape]
    td.fast_compile(False)
    for name, shape, axis in (("sum", (37, 3), -1), ("max", (5, 16), -1), ("sum", (3, 5, 11), 1)):
        x = rand(shape, 4, low=-1, high=1)
        assert reduced(name, x, axis) == [shape[axis]]
        check(getattr(R, name)(x, axis=axis), R.op_for(name, x, axis), NUMPY[name](x.astype(np.float64), axis=axis),
              rtol=1e-5, atol=1e-6, dtype=np.float32)
    long = rand((3, UNROLL_REDUCED + 1), 5)
    assert reduced("sum", long, -1)[0] is None
    td.fast_compile(True)
    assert reduced("sum", rand((37, 3), 4), -1)[0] is None


@TWO
@given(case=shape_and_axis(3), seed=SEEDS)
def test_integer_reductions(case, seed):
    shape, axis = case
    x = rand(shape, seed, np.int32, -100, 100)
    for name in ("sum", "max"):
        expected = NUMPY[name](x, axis=axis, dtype=np.int32) if name == "sum" else NUMPY[name](x, axis=axis)
        check(getattr(R, name)(x, axis=axis), R.op_for(name, x, axis), expected, dtype=np.int32)
    check(R.mean(x, axis=axis), R.op_for("mean", x, axis), np.mean(x, axis=axis), rtol=1e-5, atol=1e-5,
          dtype=np.float32)


def test_float16_sum_and_max():
    x = rand((6, 257), 4, low=-1, high=1).astype(np.float16)
    x64 = x.astype(np.float64)
    check(R.sum(x, axis=1), R.op_for("sum", x, 1), x64.sum(1), rtol=2e-3, atol=2e-2, dtype=np.float16)
    check(R.max(x, axis=0), R.op_for("max", x, 0), x.max(0), dtype=np.float16)


def test_long_float_sums_keep_their_precision():
    """(2, 2_000_003) f32 elements of 0.1: the cpu's eight running f32 sums per row drifted 0.1% from the exact sum
    (0.35% at 4M), its one fast-compile sum 1.5%; by blocks of SUM_CHAIN terms an accumulator, added to an f64
    total, they stay within 2e-6."""
    x = np.full((2, 2_000_003), 0.1, np.float32)
    exact = x.astype(np.float64).sum(axis=1)
    np.testing.assert_allclose(R.sum(x, axis=1), exact, rtol=2e-6)
    np.testing.assert_allclose(R.mean(x, axis=1), exact / x.shape[1], rtol=2e-6)


def test_reduction_errors():
    x = rand((3, 4), 0)
    with pytest.raises(ValueError):
        R.sum(x, axis=(0, 0))
    with pytest.raises(np.exceptions.AxisError):
        R.sum(x, axis=2)
    with pytest.raises(ValueError):
        R.max(np.zeros((3, 0), np.float32), axis=1)


@pytest.mark.parametrize("name", ["max", "min"])
@FEW
@given(case=shape_and_axis(), seed=SEEDS)
@example(case=((3, 1031), -1), seed=0)        # rows long enough for the cpu's vectorized running maximum
def test_max_and_min_keep_nans_and_order_zeros(name, case, seed):
    """A float max / min is IEEE 754's maximum / minimum whatever the schedule's order (lanes, splits, columns): a
    NaN wins, and a zero result is +0.0 for max where any +0.0 is among the elements (-0.0 for min where any -0.0
    is). numpy's max / min are the oracle for the values, the elements' signs for the zeros."""
    shape, axis = case
    x = rand(shape, seed, np.int32, -2, 2).astype(np.float32)      # many zeros, ties and extremes
    special = rand(shape, seed + 1, np.int32, 0, 40)
    x = np.where(special == 0, np.nan, np.where(special == 1, -np.inf, np.where(special < 12, -0.0, x)))
    got = np.asarray(getattr(R, name)(x, axis=axis))
    expected = np.asarray(NUMPY[name](x, axis=axis))
    np.testing.assert_array_equal(got, expected)
    signed = (x == 0) & (np.signbit(x) if name == "min" else ~np.signbit(x))
    want_sign = np.asarray(signed.any(axis=axis)) if name == "min" else ~np.asarray(signed.any(axis=axis))
    zeros = expected == 0
    np.testing.assert_array_equal(np.signbit(got)[zeros], want_sign[zeros])


@pytest.mark.parametrize("which", ["argmax", "argmin"])
@FEW
@given(shape=shapes(1, 4, max_size=20_000), data=st.data(), keepdims=st.booleans(), seed=SEEDS)
def test_argmax_argmin(which, shape, data, keepdims, seed):
    axis = data.draw(st.one_of(st.none(), st.integers(-len(shape), len(shape) - 1)), label="axis")
    # few distinct values, so ties are common: the first index must win, as in numpy; so must the first NaN
    x = rand(shape, seed, np.int32, -3, 3).astype(np.float32)
    special = rand(shape, seed + 1, np.int32, 0, 30)
    x = np.where(special == 0, np.nan, np.where(special == 1, np.inf, np.where(special == 2, -np.inf, x)))
    got = getattr(R, which)(x, axis=axis, keepdims=keepdims)
    expected = getattr(np, which)(x, axis=axis, keepdims=keepdims)
    assert got.dtype == np.int64 and got.shape == expected.shape
    np.testing.assert_array_equal(got, expected)


def test_sum_of_bools_counts_them():
    """numpy counts (int64); keeping the bool type would have made the sum an `or`."""
    x = rand((3, 700), 4) > 0.5
    for axis in (None, 0, 1):
        got, expected = R.sum(x, axis=axis), np.sum(x, axis=axis)
        assert np.asarray(got).dtype == np.int64
        np.testing.assert_array_equal(got, expected)
    np.testing.assert_allclose(R.mean(x, axis=1), np.mean(x, axis=1), rtol=1e-6)


@TWO
@given(case=shape_and_axis(3), keepdims=st.booleans(), seed=SEEDS,
       types=st.sampled_from([(np.uint8, np.int32), (np.int8, np.int32), (np.int16, np.int64), (np.uint8, np.float32)]))
def test_a_sum_in_a_given_dtype_converts_each_element(case, keepdims, seed, types):
    """`sum(x, dtype=...)`, as numpy's: 8-bit integers summed in int32 (where their own type would wrap), each
    element converted, with no widened copy of x."""
    (shape, axis), (source, target) = case, types
    info = np.iinfo(source)
    x = np.random.default_rng(seed).integers(info.min, info.max, shape, endpoint=True).astype(source)
    expected = np.sum(x, axis=axis, keepdims=keepdims, dtype=target)
    got = R.sum(x, axis=axis, keepdims=keepdims, dtype=target)
    check(got, R.op_for("sum", x, axis, keepdims, target), expected, dtype=target)


def test_only_sums_take_a_dtype():
    with pytest.raises(TypeError, match="sums only"):
        R.op_for("max", np.zeros(3, np.uint8), 0, dtype=np.int32)


def test_argmax_integers_and_large_axis():
    x = rand((5, 1031), 7, np.int32, -1000, 1000)
    np.testing.assert_array_equal(R.argmax(x, axis=1), np.argmax(x, axis=1))
    np.testing.assert_array_equal(R.argmin(x, axis=0), np.argmin(x, axis=0))
    assert R.argmax(x) == np.argmax(x)
    with pytest.raises(ValueError):
        R.argmax(np.zeros((2, 0), np.float32), axis=1)


@pytest.mark.parametrize("which", ["argmax", "argmin"])
@pytest.mark.parametrize("dtype", [np.float32, np.float16, ml_dtypes.bfloat16, np.float64, np.int32, np.uint8])
def test_arg_rows_longer_than_a_chunk_take_the_first_chunk_holding_the_extreme(which, dtype):
    """The cpu searches a row of more than ARG_CHUNK elements chunk by chunk (`arg_rows_kernel`): the first chunk
    holding the extreme wins, with ties in later chunks, and a NaN anywhere beats every number."""
    chunk = R.ARG_CHUNK
    x = rand((4, 2 * chunk + 37), 5, np.int32, 1, 50).astype(dtype)
    extreme = 60 if which == "argmax" else 0
    x[0, [chunk + 3, 5, 2 * chunk + 1]] = extreme       # ties in three chunks: the first chunk's wins
    x[1, [2 * chunk + 30, chunk + 17, chunk + 18]] = extreme      # the middle chunk's first, past a lane step
    x[2, -1] = extreme                                   # the last element, in the last step's tail
    if is_float_dtype(np.dtype(dtype)):
        x[3, [chunk + 7, 2 * chunk]] = np.nan           # the first NaN, though the extreme comes before it
        x[3, 1] = extreme
    got = getattr(R, which)(x, axis=1)
    np.testing.assert_array_equal(got, getattr(np, which)(x, axis=1))
    np.testing.assert_array_equal(getattr(R, which)(x[:, :chunk - 5], axis=1), getattr(np, which)(x[:, :chunk - 5], axis=1))


def test_zero_dim_reduction_in_taskdsl():
    """A reduction to shape () (0-d tensors crashed index flattening before taskdsl d6de583)."""
    import taskdsl as td
    a = td.placeholder("a", td.f32, ("ZD_K",))
    total = td.reduce("total", (), ("ZD_K",), lambda k: a[k], op="sum")
    op = td.op([a], [total])
    x = np.arange(5, dtype=np.float32)
    assert op.reference(x)[0] == 10
    assert op(x)[0].shape == () and op(x)[0] == 10


COLUMN_SHAPES = [((5, 32), 0), ((3, 1031), 0), ((7, 13, 33), 1), ((2, 3, 2053), (0, 1)), ((1031, 40), 0),
                 ((4, 1, 3, 1024), (0, 2)), ((13, 2, 1025), 0)]


@pytest.mark.parametrize("shape, axis", COLUMN_SHAPES)
def test_reductions_over_leading_axes_read_rows(shape, axis):
    """Reductions whose kept last axis is the contiguous one run as 'columns' on the cpu: a block per 1024
    neighbouring outputs adds each reduced row to as many accumulators (a thread per output walked a column,
    a cache line and a page per element: 45-70x numpy's time for a sum over axis 0 of (4096, 1024)); widths
    of one chunk, several, a short last chunk, middle axes and size-1 axes between them."""
    import taskdsl as td
    x = rand(shape, 5, low=-1, high=1)
    ints = rand(shape, 6, np.int32, -100, 100)
    for name, fn in NUMPY.items():
        plan = R.op_for(name, x, axis)
        if td.get_target() == "cpu":
            assert [k.name for k in plan.op.kernels_for(*plan.arrays)] == [f"reduce_{name}_reduce_columns"]
        check(getattr(R, name)(x, axis=axis), plan, fn(x.astype(np.float64), axis=axis), rtol=1e-5, atol=2e-5,
              dtype=np.float32)
        expected = fn(ints, axis=axis, dtype=np.int32) if name == "sum" else fn(ints, axis=axis)
        check(getattr(R, name)(ints, axis=axis), R.op_for(name, ints, axis), expected,
              rtol=1e-5, atol=1e-5, dtype=np.float32 if name == "mean" else np.int32)
    halves = x.astype(np.float16)
    check(R.sum(halves, axis=axis), R.op_for("sum", halves, axis), halves.astype(np.float64).sum(axis=axis),
          rtol=2e-3, atol=2e-2, dtype=np.float16)


SEPARATE_AXES = [((64, 13, 81), (0, 2), 2), ((13, 67, 5, 71), (0, 2), 2), ((3, 7, 5, 17), (1, 3), 1),
                 ((2, 3, 4, 5, 6), (0, 2, 4), 1), ((11, 3, 8, 5, 61), (0, 2, 4), 3), ((5, 1, 3, 1, 7), (0, 4), 1),
                 ((1, 37, 2, 1031), (1, 3), 2), ((8193, 5, 2), (0, 2), 2), ((97, 3, 41, 5, 3), (0, 2, 4), 3),
                 ((3, 30011, 3), (0, 2), 1)]


@pytest.mark.parametrize("shape, axis, stages", SEPARATE_AXES)
def test_reductions_over_separate_axes_run_in_stages(shape, axis, stages):
    """On the cpu the reduced axes that are not neighbours are reduced one group after the other, the innermost
    first (one reduction read a strided gather an element: a sum of (64, 256, 64) over (0, 2) took 20x
    onnxruntime's time), from reduce.STAGED_MIN elements and STAGED_REDUCED an output (fewer: one launch), the
    outermost first where the innermost is short; partial sums of 16-bit floats stay f32, integer sums wrap in their
    type as numpy's do."""
    x = rand(shape, 7, low=-1, high=1)
    ints = rand(shape, 8, np.int32, -2**30, 2**30)      # sums wrap around
    for name, fn in NUMPY.items():
        plan = R.op_for(name, x, axis)
        if td.get_target() == "cpu":
            assert len(plan.op.kernels_for(*plan.arrays)) == stages
        check(getattr(R, name)(x, axis=axis), plan, fn(x.astype(np.float64), axis=axis), rtol=1e-5, atol=2e-5,
              dtype=np.float32)
        if name != "mean":
            expected = fn(ints, axis=axis, dtype=np.int32) if name == "sum" else fn(ints, axis=axis)
            check(getattr(R, name)(ints, axis=axis), R.op_for(name, ints, axis), expected, dtype=np.int32)
    for dtype, mantissa in ((np.float16, 10), (ml_dtypes.bfloat16, 7)):
        low = x.astype(dtype)
        for name in ("sum", "mean"):
            # rounded once, at the end (16-bit partials would round at each stage): within half an ulp of the exact
            # value, give or take the f32 partials' own rounding
            exact = NUMPY[name](low.astype(np.float64), axis=axis)
            magnitude = NUMPY[name](np.abs(low.astype(np.float64)), axis=axis)
            error = np.abs(getattr(R, name)(low, axis=axis).astype(np.float64) - exact)
            assert np.all(error <= np.abs(exact) * 2.0 ** -(mantissa + 1) * 1.001 + 1e-6 * magnitude + 1e-7)
        check(R.max(low, axis=axis), R.op_for("max", low, axis), low.max(axis=axis), dtype=dtype)


def test_long_column_sums_keep_their_precision():
    """A sum over axis 0 of 300_007 rows of 0.1: the 'columns' accumulators are f64, as exact as the rows'."""
    x = np.full((300_007, 33), 0.1, np.float32)
    exact = x.astype(np.float64).sum(axis=0)
    np.testing.assert_allclose(R.sum(x, axis=0), exact, rtol=2e-6)
    np.testing.assert_allclose(R.mean(x, axis=0), exact / x.shape[0], rtol=2e-6)
