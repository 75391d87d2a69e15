"""stdlib_ops.transform: transpose/permute, reshape, slice, concat, pad, gather, expand."""
import numpy as np
import pytest
from hypothesis import example, given
from hypothesis import strategies as st

from stdlib_ops import transform as X

from . import FEW, FEWER, SEEDS, check, rand, shapes

GPU_TWINS = True     # each test also runs on cuda (as a @gpu test) where a GPU is usable

SMALL = st.sampled_from([1, 2, 3, 5, 7])


@FEW
@given(shape=shapes(1, 4, max_size=20_000), data=st.data(), seed=SEEDS)
@example(shape=(3, 1, 4, 5), data=None, seed=0)
def test_transpose(shape, data, seed):
    perm = (tuple(reversed(range(len(shape)))) if data is None else
            tuple(data.draw(st.permutations(range(len(shape))), label="perm")))
    x = rand(shape, seed)
    check(X.transpose(x, perm), X.op_for("transpose", x, perm), np.transpose(x, perm))
    check(X.permute(x, perm), X.op_for("permute", x, perm), np.transpose(x, perm))


def test_transpose_defaults_and_ints():
    x = rand((2, 3, 5), 0, np.int32, -9, 9)
    check(X.transpose(x), X.op_for("transpose", x), x.T)
    # neighbours that stay neighbours are merged: (0, 2, 3, 1) on 4-d is a 3-d transpose
    plan = X.op_for("transpose", rand((2, 3, 4, 5), 1), (0, 2, 3, 1))
    assert [a.shape for a in plan.arrays] == [(2, 3, 20)]


SWAPS = [((1024, 8), (1, 0)), ((8, 129), (1, 0)), ((3, 67, 131), (0, 2, 1)), ((2, 64, 9, 15), (0, 2, 3, 1)),
         ((2, 9, 15, 64), (0, 3, 1, 2)), ((1, 7, 300), (0, 2, 1)), ((5, 4, 130), (2, 1, 0))]


@pytest.mark.parametrize("shape, perm", SWAPS)
def test_transposes_that_swap_two_axes_run_in_tiles_on_the_cpu(shape, perm):
    """A canonical transpose that swaps its last two axes, each a tile (8) long or more, runs `transpose_tiles` on
    the cpu (8 x 8 tiles in squares of 64: full and edge tiles, several matrices, NCHW <-> NHWC), in every element
    type; a swap with an axis shorter than a tile, or another canonical permutation, runs the definitions."""
    from stdlib_ops import transpose_tiles
    from taskdsl.runtime.config import get_target
    canon_shape, canon_perm = X.transpose_canon(shape, perm)
    tiled = transpose_tiles.applies(canon_shape, canon_perm)
    assert tiled == (min(canon_shape[-2:]) >= 8 and canon_perm in ((1, 0), (0, 2, 1)))
    for dtype in (np.float32, np.float16, np.int8, np.bool_, np.int64):
        x = (rand(shape, 6) * 10).astype(dtype)
        assert X.transposes_by_kernel(x, perm) == (tiled and get_target() == "cpu")
        np.testing.assert_array_equal(X.transpose(x, perm), np.transpose(x, perm))


# (shape, perm, whether it interleaves): (B, S1, S2, H, W) -> (B, H, S1, W, S2) as a ConvTranspose's phases
# (`_by_phases`: (N, G, S1, S2, C, Q1, Q2)), DepthToSpace (CRD), with B = 1 dropped, size-1 and merged axes around
# them; then S2 past MAX_S2 and another permutation, which run the definitions
INTERLEAVES = [((1, 1, 2, 2, 64, 28, 28), (0, 1, 4, 5, 2, 6, 3), True),
               ((2, 3, 2, 2, 5, 7), (0, 1, 4, 2, 5, 3), True), ((3, 2, 3, 5, 7), (0, 3, 1, 4, 2), True),
               ((2, 3, 5, 7), (2, 0, 3, 1), True),
               ((2, 3, 2, 2, 1, 5, 1, 3), (0, 1, 4, 5, 2, 6, 7, 3), True), ((2, 9, 5, 3), (2, 0, 3, 1), False),
               ((2, 3, 2, 4, 5), (0, 3, 2, 4, 1), False)]


@pytest.mark.parametrize("shape, perm, interleaves", INTERLEAVES)
def test_transposes_that_interleave_rows_run_their_own_kernel_on_the_cpu(shape, perm, interleaves):
    """A canonical transpose of (B, S1, S2, H, W) into (B, H, S1, W, S2), S2 at most 8, runs `interleave` on the
    cpu: a ConvTranspose's phases, DepthToSpace's (CRD), several batches, odd sizes, in every element type; S2 past
    8, or another permutation, runs the definitions. Against numpy."""
    from stdlib_ops import interleave
    from taskdsl.runtime.config import get_target
    assert interleave.applies(*X.transpose_canon(shape, perm)) == interleaves
    for dtype in (np.float32, np.float16, np.int8, np.bool_, np.int64):
        x = (rand(shape, 7) * 10).astype(dtype)
        assert X.transposes_by_kernel(x, perm) == (interleaves and get_target() == "cpu")
        np.testing.assert_array_equal(X.transpose(x, perm), np.transpose(x, perm))


@FEWER
@given(shape=shapes(1, 4, max_size=20_000), seed=SEEDS)
def test_reshape(shape, seed):
    x = rand(shape, seed)
    new = (-1,) + shape[-1:] if len(shape) > 1 else (shape[0], 1)
    check(X.reshape(x, new), X.op_for("reshape", x, new), x.reshape(new))
    with pytest.raises(ValueError):
        X.reshape(x, (x.size + 1,))


@st.composite
def slicing(draw, ndim: int):
    starts, stops, steps = [], [], []
    for _ in range(ndim):
        starts.append(draw(st.one_of(st.none(), st.integers(-8, 8))))
        stops.append(draw(st.one_of(st.none(), st.integers(-8, 8))))
        steps.append(draw(st.sampled_from([None, 1, 2, 3, -1, -2])))
    return starts, stops, steps


@FEW
@given(shape=shapes(1, 4, max_size=20_000), data=st.data(), seed=SEEDS)
def test_slice(shape, data, seed):
    starts, stops, steps = data.draw(slicing(len(shape)), label="slicing")
    x = rand(shape, seed)
    key = tuple(slice(a, b, c) for a, b, c in zip(starts, stops, steps))
    check(X.slice(x, starts, stops, steps), X.op_for("slice", x, starts, stops, steps), x[key])


def test_slice_axes_and_ints():
    x = rand((4, 9, 6), 2, np.int32, -50, 50)
    check(X.slice(x, 1, -1, 2, axes=1), X.op_for("slice", x, 1, -1, 2, axes=1), x[:, 1:-1:2])
    check(X.slice(x, [5, 0], [None, 2], [-1, 1], axes=[2, 0]),
          X.op_for("slice", x, [5, 0], [None, 2], [-1, 1], axes=[2, 0]), x[0:2, :, 5::-1])
    assert X.slice(x, 3, 3, axes=0).shape == (0, 9, 6)
    with pytest.raises(ValueError):
        X.slice(x, 0, 2, 0)
    with pytest.raises(ValueError, match="a 0-d array has no axis to slice"):
        X.slice(np.float32(1.0), [0], [1])
    # bounds as numpy takes them: 0-d integer arrays, a step past the axis (it took an int32 overflow)
    check(X.slice(x, np.array(1), np.array(3)), X.op_for("slice", x, np.array(1), np.array(3)), x[1:3])
    check(X.slice(x, 0, None, 2**40), X.op_for("slice", x, 0, None, 2**40), x[0::2**40])
    with pytest.raises(TypeError, match="slice: starts must be integers"):
        X.slice(x, 1.0, 3)


def test_sizes_must_be_integers():
    """numpy refuses a float size; int() had truncated it silently (pad 1.5 -> 1)."""
    x = rand((3, 4), 0)
    for call, what in ((lambda: X.pad(x, 1.5), "pad widths"), (lambda: X.reshape(x, (2.5, -1)), "reshape"),
                       (lambda: X.expand(x, (2.5, 3, 4)), "expand")):
        with pytest.raises(TypeError, match=what):
            call()


@FEW
@given(shape=shapes(1, 4, max_size=10_000), data=st.data(), count=st.integers(1, 3), seed=SEEDS)
def test_concat(shape, data, count, seed):
    axis = data.draw(st.integers(-len(shape), len(shape) - 1), label="axis")
    arrays = []
    for k in range(count):
        s = list(shape)
        s[axis] = data.draw(st.sampled_from([0, 1, 2, 5, 13]), label=f"size{k}")
        arrays.append(rand(tuple(s), seed + k))
    check(X.concat(arrays, axis), X.op_for("concat", arrays, axis), np.concatenate(arrays, axis))


@pytest.mark.parametrize("count", [2, 5, 9])
@pytest.mark.parametrize("inner", [(), (3,)])
def test_concat_of_many_arrays_picks_each_element_from_its_own(count, inner):
    """The element's source is chosen by a balanced tree of tests (a chain tested up to every array: 67x numpy's
    time for 64 arrays); a concatenation along the last axis is of 2-D rows. Widths 0 and 1 among others."""
    widths = [(0, 1, 7, 2, 33, 1, 0, 4, 40)[k] for k in range(count)]
    arrays = [rand((4,) + (w,) + inner, k) for k, w in enumerate(widths)]
    check(X.concat(arrays, 1), X.op_for("concat", arrays, 1), np.concatenate(arrays, 1))


def test_concat_mixed_dtypes():
    a, b = rand((3, 4), 0).astype(np.float16), rand((3, 2), 1)
    check(X.concat([a, b], 1), X.op_for("concat", [a, b], 1), np.concatenate([a.astype(np.float32), b], 1))
    i, j = rand((2, 3), 0, np.int32, -5, 5), rand((1, 3), 1, np.int32, -5, 5)
    check(X.concat([i, j]), X.op_for("concat", [i, j]), np.concatenate([i, j]))
    with pytest.raises(ValueError):
        X.concat([a, rand((2, 2), 2)], 1)


@FEW
@given(shape=shapes(1, 3, max_size=10_000), data=st.data(), seed=SEEDS)
def test_pad(shape, data, seed):
    widths = [tuple(data.draw(st.tuples(st.integers(0, 3), st.integers(0, 3)), label=f"pad{k}"))
              for k in range(len(shape))]
    value = data.draw(st.sampled_from([0.0, -1.5, 7.0]), label="value")
    x = rand(shape, seed)
    check(X.pad(x, widths, value), X.op_for("pad", x, widths, value), np.pad(x, widths, constant_values=value))


@FEW
@given(shape=shapes(2, 4, max_size=10_000), padded=st.lists(st.booleans(), min_size=4, max_size=4), data=st.data(),
       seed=SEEDS)
@example(shape=(1, 9, 7, 64), padded=[False, True, True, False], data=None, seed=0)
def test_pad_of_some_axes(shape, padded, data, seed):
    """An axis not padded is merged into the one before it (widths times its size): an NHWC image padded along H
    and W runs as rows of W * C; any pattern of padded and unpadded axes, empty ones included, is numpy's pad."""
    widths = [(1, 1) if data is None and p else
              tuple(data.draw(st.tuples(st.integers(0, 3), st.integers(1, 3)), label=f"pad{k}")) if p else (0, 0)
              for k, p in enumerate(padded[:len(shape)])]
    x = rand(shape, seed)
    plan = X.op_for("pad", x, widths, 3.0)
    check(X.pad(x, widths, 3.0), plan, np.pad(x, widths, constant_values=3.0))
    if data is None:
        assert plan.arrays[0].shape == (1, 9, 7 * 64)
    empty = np.zeros(shape[:-1] + (0,), np.float32)
    check(X.pad(empty, widths, 3.0), X.op_for("pad", empty, widths, 3.0), np.pad(empty, widths, constant_values=3.0))


@FEWER
@given(rows=st.sampled_from([1, 2, 5]), cols=st.sampled_from([1, 7, 4093, 4096, 4099, 9001]),
       before=st.sampled_from([0, 1, 3, 4095, 4097]), after=st.sampled_from([0, 2, 4096, 5003]),
       above=st.sampled_from([0, 1, 2]), seed=SEEDS)
def test_pad_rows_past_a_span(rows, cols, before, after, above, seed):
    """The cpu splits each row's span (4096 elements a block) into the ranges its pad fills and its copy: widths and
    rows that end before, at and past span boundaries, rows of padding only above."""
    x = rand((rows, cols), seed)
    widths = ((above, 1), (before, after))
    check(X.pad(x, widths, -2.0), X.op_for("pad", x, widths, -2.0), np.pad(x, widths, constant_values=-2.0))


def test_pad_and_concat_rows_test_no_element():
    """A pad's or a last-axis concatenation's row loops on the cpu copy and fill: no select is left in them (tested
    per element, a pad of (4096, 1024) ran 1.6-2.5x numpy's time), for short rows and 1-d arrays too."""
    from taskdsl import get_target, ir
    if get_target() != "cpu":
        pytest.skip("the row loops are the cpu's ('row_spans')")
    x, short = rand((3, 50), 0), rand((9, 5), 1)     # (rows of 5: split too, where plain ones run as flat spans)
    for plan in (X.op_for("pad", x, ((1, 2), (3, 4)), 0.0), X.op_for("concat", [x, x[:, :7], x], 1),
                 X.op_for("pad", short, 1, 0.0), X.op_for("pad", x[0], (2, 3), 0.0)):
        plan.run()
        [kernel] = plan.op.kernels
        loops = ir.collect(kernel._frontend_ir(kernel.block_spec).body, ir.For, expressions=False)
        innermost = [loop for loop in loops if not ir.collect(loop.body, ir.For, expressions=False)]
        assert len(innermost) >= 3 and not any(ir.collect(loop.body, ir.Select) for loop in innermost)


@FEWER
@given(widths=st.lists(st.sampled_from([0, 1, 5, 4095, 4096, 4097]), min_size=1, max_size=5), seed=SEEDS)
def test_concat_of_rows_past_a_span(widths, seed):
    """A concatenation along the last axis, its parts ending before, at and past the cpu's span boundaries."""
    arrays = [rand((2, w), seed + k) for k, w in enumerate(widths)]
    check(X.concat(arrays, 1), X.op_for("concat", arrays, 1), np.concatenate(arrays, 1))


def test_pad_forms_and_ints():
    x = rand((3, 4), 0, np.int32, -5, 5)
    check(X.pad(x, 2), X.op_for("pad", x, 2), np.pad(x, 2))
    check(X.pad(x, (1, 0), value=9), X.op_for("pad", x, (1, 0), value=9), np.pad(x, (1, 0), constant_values=9))
    with pytest.raises(ValueError):
        X.pad(x, ((1, 2),) * 3)
    scalar = np.array(2.5, np.float32)         # nothing to pad: numpy.pad returns it
    check(X.pad(scalar, 1), X.op_for("pad", scalar, 1), np.pad(scalar, 1))


@FEW
@given(shape=shapes(1, 3, max_size=10_000), data=st.data(), seed=SEEDS)
def test_gather(shape, data, seed):
    axis = data.draw(st.integers(-len(shape), len(shape) - 1), label="axis")
    n = shape[axis]
    ishape = data.draw(st.sampled_from([(), (1,), (4,), (2, 3)]), label="index shape")
    idtype = data.draw(st.sampled_from([np.int32, np.int64]), label="index dtype")
    indices = np.random.default_rng(seed).integers(-n, n, size=ishape).astype(idtype)   # negatives wrap
    x = rand(shape, seed)
    check(X.gather(x, indices, axis), X.op_for("gather", x, indices, axis), np.take(x, indices, axis=axis))


def test_gather_narrow_negative_indices_on_a_long_axis():
    """An int8 / int16 index plus the axis length wrapped in the index's type (-1 + 200 as int8 is -57, which read
    element 0): the index is widened first."""
    x = rand((200, 3), 1)
    check(X.gather(x, np.array([-1, -100, 5], np.int8)), X.op_for("gather", x, np.array([-1, -100, 5], np.int8)),
          np.take(x, np.array([-1, -100, 5]), axis=0))
    y = rand((40000,), 2)
    idx = np.array([-1, -30000], np.int16)
    check(X.gather(y, idx), X.op_for("gather", y, idx), np.take(y, idx))


def test_gather_errors():
    x = rand((3, 4), 0)
    with pytest.raises(IndexError):
        X.gather(x, np.array([4]), axis=1)
    with pytest.raises(TypeError):
        X.gather(x, np.array([0.5]), axis=1)


@FEW
@given(shape=shapes(1, 3, max_size=2_000), data=st.data(), seed=SEEDS)
def test_expand(shape, data, seed):
    ones = data.draw(st.lists(st.booleans(), min_size=len(shape), max_size=len(shape)), label="ones")
    lead = tuple(data.draw(st.lists(SMALL, max_size=2), label="lead"))
    src = tuple(1 if one else n for one, n in zip(ones, shape))
    x = rand(src, seed)
    target = lead + shape
    check(X.expand(x, target), X.op_for("expand", x, target), np.broadcast_to(x, target))
    with pytest.raises(ValueError):
        X.expand(rand((2, 3), 0), (4, 3))


def test_output_dim_expression():
    import taskdsl as td
    from taskdsl import ir
    from taskdsl.compute import size_var
    a = td.placeholder("a", td.f32, ("XB_A",))
    b = td.placeholder("b", td.f32, ("XB_B",))
    n = size_var("XB_A")
    joined = td.compute("joined", (n + size_var("XB_B"),), lambda i: ir.Select(i < n, a[i], b[i - n], td.f32))
    op = td.op([a, b], [joined])
    x, y = np.arange(3, dtype=np.float32), np.arange(4, dtype=np.float32)
    np.testing.assert_array_equal(op.reference(x, y)[0], np.concatenate([x, y]))
    np.testing.assert_array_equal(op(x, y)[0], np.concatenate([x, y]))
