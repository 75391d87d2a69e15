"""Contiguous slices as views: a slice that is one aligned run of its input's memory (part of the leading axis,
a part of a (1, N) row) runs without a kernel, as a view sharing its input's storage in the memory plan.

Oracles: numpy's slicing for `Slice.view_offset`, the graph's reference evaluator for compiled graphs.
"""
import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

import taskdsl.graph as tg
from taskdsl.graph import ops
from taskdsl.graph.ops.transform import VIEW_ALIGNMENT

from . import UNFUSED, assert_close, rand


@st.composite
def slices(draw):
    """A shape (size-1 and odd sizes) and a numpy slice of it: whole axes, parts, single elements, steps."""
    shape = tuple(draw(st.lists(st.sampled_from([1, 2, 3, 4, 5, 16, 17]), min_size=1, max_size=4)))
    index = []
    for n in shape:
        start = draw(st.integers(0, n - 1))
        stop = draw(st.integers(start + 1, n))
        index.append(draw(st.sampled_from([slice(None), slice(start, stop), slice(start, start + 1),
                                           slice(start, stop, 2), slice(stop - 1, None, -1)])))
    return shape, tuple(index)


def slice_op(x, index: tuple):
    """The graph Slice operator of x[index] (slices with positive or negative steps)."""
    starts, ends, steps = [], [], []
    for n, s in zip(x.shape, index):
        start, stop, step = s.indices(n)
        starts.append(start)
        ends.append(stop if stop >= 0 else -n - 1)      # a negative step down to the first element
        steps.append(step)
    y = ops.slice(x, starts, ends, axes=list(range(x.ndim)), steps=steps)
    return y.producer if y is not x else None         # (a slice of every element is x itself)


@settings(max_examples=60, deadline=None)
@given(slices(), st.sampled_from([np.float32, np.float64, np.int8]))
def test_view_offset_is_where_numpy_finds_the_slice(case, dtype):
    """Where `view_offset` calls a slice a view, the output's elements are the run of x's memory it names, and
    that run starts aligned; a slice whose elements are not one run of memory is never a view."""
    shape, index = case
    x = np.arange(int(np.prod(shape))).astype(dtype).reshape(shape)
    want = x[index]
    op = slice_op(tg.input("x", shape, str(np.dtype(dtype))), index)
    if op is None:
        assert want.shape == shape and np.array_equal(want, x)
        return
    assert op.outputs[0].shape == want.shape
    offset = op.view_offset
    contiguous_run = want.size > 0 and want.flags.c_contiguous and np.shares_memory(x, want)
    if offset is None:
        start = (want.__array_interface__["data"][0] - x.__array_interface__["data"][0]) // x.itemsize
        assert not contiguous_run or start * x.itemsize % VIEW_ALIGNMENT
    else:
        assert contiguous_run and offset * x.itemsize % VIEW_ALIGNMENT == 0
        np.testing.assert_array_equal(x.reshape(-1)[offset:offset + want.size].reshape(want.shape), want)


def test_leading_rows_and_row_parts_are_views():
    x = tg.input("x", (8, 32))
    assert slice_op(x, (slice(2, 6), slice(None))).view_offset == 64
    row = tg.input("row", (1, 1024))
    assert slice_op(row, (slice(None), slice(256, 512))).view_offset == 256
    assert slice_op(x, (slice(None), slice(0, 16))).view_offset is None          # rows of a part: strided
    assert slice_op(tg.input("z", (8, 8)), (slice(1, 3), slice(None))).view_offset is None     # 32 bytes in
    assert slice_op(tg.input("y", (8, 3)), (slice(1, 3), slice(None))).view_offset is None     # 12 bytes in


def split_graph() -> tg.Graph:
    """x (8, 32) split into four pairs of rows: views, one tanh-ed, one a graph output as it is, two added; and
    a view of an intermediate that is also read elsewhere."""
    x = tg.input("x", (8, 32))
    a, b, c, d = ops.split(x, 4, axis=0)
    e = ops.exp(ops.mul(x, 0.5))
    tail = ops.slice(e, [4], [8], axes=[0])
    return tg.Graph([x], [ops.tanh(a), b, ops.add(c, d), tail, ops.sum(e, 1)], name="views")


def check_calls(cg, g, shape) -> None:
    """Calls on new inputs match the reference, and outputs neither alias the caller's input nor each other."""
    for seed in (3, 4, 5):
        x = rand(shape, seed, low=-1, high=1)
        kept = x.copy()
        got = cg(x)
        want = g.reference(kept)
        x[:] = 7.0                              # an output aliasing the input would change with it
        for out, ref in zip(got, want):
            assert_close(out, ref)
        assert not any(np.shares_memory(p, q) for k, p in enumerate(got) for q in got[k + 1:])


def test_split_runs_without_slice_kernels():
    g = split_graph()
    for passes in (None, UNFUSED):
        cg = g.compile(target="cpu", passes=passes)
        check_calls(cg, g, (8, 32))
        assert not any("slice" in k.name for k in cg.kernels), [k.name for k in cg.kernels]
        assert cg.arena.startswith("on (") and cg.replay.startswith("on"), (cg.arena, cg.replay)


def test_strided_and_unaligned_slices_still_copy():
    x = tg.input("x", (8, 3))
    g = tg.Graph([x], [ops.tanh(ops.slice(x, [1], [3], axes=[0])), ops.slice(x, [0], [2], axes=[1])])
    cg = g.compile(target="cpu")
    check_calls(cg, g, (8, 3))
    assert sum("slice" in k.name for k in cg.kernels) == 2


def test_views_on_a_simulated_gpu(simulated_gpu):
    """On the cuda target a view is a DeviceArray over its input's memory (the arena's, or an input's)."""
    g = split_graph()
    cg = g.compile(target="cuda")
    assert not any("slice" in k.name for k in cg.kernels)
    for seed in (7, 8):
        x = rand((8, 32), seed, low=-1, high=1)
        for out, ref in zip(cg(x), g.reference(x)):
            assert_close(np.asarray(out), ref)
