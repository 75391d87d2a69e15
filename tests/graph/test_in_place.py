"""Outputs computed in place: a fused residual sum's output planned over its shortcut (`plan_memory(in_place=True)`,
the cpu arena's), its kernel reading the shortcut from the output's own memory (`td.in_place`).

The oracle is the graph's numpy reference evaluator: a kernel that stored an element before reading the shortcut
there, or read another element than its own, changes the outputs.
"""
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import taskdsl.graph as tg
from taskdsl.graph import ops
from taskdsl.graph.fusion import FusedAnchor
from taskdsl.graph.passes import plan_memory

from . import assert_close, rand


def _in_place_builds(cg) -> list:
    """The fused operators of the last run whose kernel was built to overwrite an input: (operator, input index)."""
    return [(op, k) for op in cg.graph.nodes if isinstance(op, FusedAnchor)
            for target, k in op.__dict__.get("_builds", {}) if k is not None]


def residual_convs(n: int, c: int, hw: tuple, kernel: int, stride: int, dilation: int, groups: int, relu: bool,
                   shortcut_first: bool) -> tg.Graph:
    """h = relu(conv(x, stride)); u = relu(conv(x)); y = [relu](conv(u, stride) + h), h last read there;
    out = conv(y) (a graph output of its own: y is an activation)."""
    x = tg.input("x", (n, c, *hw))
    shapes = [(c, c, 1, 1), (c, c, 1, 1), (c, c // groups, kernel, kernel), (c, c, 1, 1)]
    w = [tg.constant(rand(s, 10 + k, low=-0.5, high=0.5)) for k, s in enumerate(shapes)]
    h = ops.relu(ops.conv2d(x, w[0], stride=stride))
    u = ops.relu(ops.conv2d(x, w[1]))
    z = ops.conv2d(u, w[2], stride=stride, padding=dilation * (kernel // 2), dilation=dilation, groups=groups)
    y = ops.add(h, z) if shortcut_first else ops.add(z, h)
    return tg.Graph([x], [ops.conv2d(ops.relu(y) if relu else y, w[3])], name="residual")


@settings(max_examples=6, deadline=None)
@given(n=st.sampled_from([1, 2]), c=st.sampled_from([1, 3, 8, 17, 40]), hw=st.sampled_from([(1, 1), (5, 7), (9, 4)]),
       kernel=st.sampled_from([1, 3]), stride=st.sampled_from([1, 2]), dilation=st.sampled_from([1, 2]),
       groups=st.sampled_from(["one", "two", "depthwise"]), relu=st.booleans(), shortcut_first=st.booleans(),
       channels_last=st.booleans())
def test_residual_convolutions_compute_their_sum_over_the_shortcut(n, c, hw, kernel, stride, dilation, groups, relu,
                                                                     shortcut_first, channels_last):
    groups = {"one": 1, "two": 2 if c % 2 == 0 else 1, "depthwise": c}[groups]
    check_residual_convs(residual_convs(n, c, hw, kernel, stride, dilation, groups, relu, shortcut_first),
                         channels_last)


def check_residual_convs(g: tg.Graph, channels_last: bool) -> None:
    """`g` (`residual_convs`) against its reference, twice (the arena reused), its sum built in place over h."""
    cg = g.compile(target="cpu", channels_last=channels_last)
    shape = tuple(g.inputs[0].shape)
    x = rand(shape, 1)
    assert_close(cg(x)[0], g.reference(x)[0], rtol=1e-4, atol=1e-5)
    (fused, k), = _in_place_builds(cg)
    assert fused.anchor.kind == "conv2d" and id(fused.outputs[0]) in cg.memory.in_place
    assert cg.memory.storage[id(fused.outputs[0])] is cg.memory.storage[id(fused.inputs[k])]
    x = rand(shape, 2)
    assert_close(cg(x)[0], g.reference(x)[0], rtol=1e-4, atol=1e-5)


@settings(max_examples=6, deadline=None)
@given(batch=st.sampled_from([(), (2,)]), m=st.sampled_from([1, 2, 7, 33]), k=st.sampled_from([1, 5, 16]),
       n=st.sampled_from([1, 8, 19, 64]))
def test_residual_products_compute_their_sum_over_the_shortcut(batch, m, k, n):
    """A transformer's `x + dense(...)`: h = relu(x W0 + b); y = (h W1) W2 + h; out = y W3 (the gemv kernel at one
    row, the small-matmul kernel and the template)."""
    x = tg.input("x", (*batch, m, k))
    w = [tg.constant(rand(s, 20 + j, low=-0.5, high=0.5)) for j, s in enumerate([(k, n), (n, n), (n, n), (n, 3)])]
    h = ops.relu(ops.add(ops.matmul(x, w[0]), tg.constant(rand((n,), 30))))
    y = ops.add(ops.matmul(ops.matmul(h, w[1]), w[2]), h)
    g = tg.Graph([x], [ops.matmul(y, w[3])])
    cg = g.compile(target="cpu")
    xs = rand((*batch, m, k), 3)
    assert_close(cg(xs)[0], g.reference(xs)[0], rtol=1e-4, atol=1e-5)
    assert len(_in_place_builds(cg)) == 1


def _block(read_later: bool, output: bool) -> tg.Graph:
    x = tg.input("x", (1, 4, 5, 5))
    w = [tg.constant(rand((4, 4, 1, 1), 40 + k)) for k in range(4)]
    h = ops.relu(ops.conv2d(x, w[0]))
    y = ops.relu(ops.add(ops.conv2d(ops.conv2d(h, w[1]), w[2]), h))
    outputs = [y] if output else [ops.conv2d(y, w[3])]
    return tg.Graph([x], outputs + ([ops.neg(h)] if read_later else []))


@pytest.mark.parametrize("read_later, output", [(False, False), (True, False), (False, True)])
def test_the_plan_overwrites_a_shortcut_only_where_nothing_reads_it_later_and_the_sum_is_no_graph_output(
        read_later, output):
    g = _block(read_later, output)
    cg = g.compile(target="cpu")
    expected = not read_later and not output
    assert bool(cg.memory.in_place) == expected and bool(_in_place_builds(cg)) == expected
    assert not plan_memory(cg.graph).in_place       # (off by default: the GPU arena's plan)
    x = rand((1, 4, 5, 5), 5)
    for got, want in zip(cg(x), g.reference(x)):
        assert_close(got, want)


def test_a_shortcut_that_is_a_graph_input_is_read_not_overwritten():
    x = tg.input("x", (1, 4, 5, 5))
    y = ops.relu(ops.add(ops.conv2d(x, tg.constant(rand((4, 4, 1, 1), 6))), x))
    g = tg.Graph([x], [ops.conv2d(y, tg.constant(rand((4, 4, 1, 1), 7)))])
    cg = g.compile(target="cpu")
    xs = rand((1, 4, 5, 5), 8)
    kept = xs.copy()
    assert_close(cg(xs)[0], g.reference(kept)[0])
    np.testing.assert_array_equal(xs, kept)
    assert not cg.memory.in_place and not _in_place_builds(cg)


def test_in_place_outputs_shrink_the_arena_and_count_in_the_memory_without_reuse():
    """A bottleneck block (16 -> 4 -> 4 -> 16 channels, plus the shortcut): its sum's output over the shortcut, the
    block's peak is one wide activation and a narrow one, not two wide ones."""
    x = tg.input("x", (1, 16, 6, 6))
    w = [tg.constant(rand(s, 50 + k)) for k, s in enumerate([(16, 16, 1, 1), (4, 16, 1, 1), (4, 4, 3, 3),
                                                                (16, 4, 1, 1), (16, 16, 1, 1)])]
    h = ops.relu(ops.conv2d(x, w[0]))
    b = ops.relu(ops.conv2d(ops.relu(ops.conv2d(h, w[1])), w[2], padding=1))
    y = ops.relu(ops.add(ops.conv2d(b, w[3]), h))
    g = tg.Graph([x], [ops.conv2d(y, w[4])])
    cg = g.compile(target="cpu")
    apart = plan_memory(cg.graph, place_outputs=False)
    together = plan_memory(cg.graph, place_outputs=False, in_place=True)
    assert together.peak_bytes < apart.peak_bytes and cg._arena.nbytes == together.peak_bytes
    assert together.unshared_bytes == apart.unshared_bytes
    xs = rand((1, 16, 6, 6), 9)
    assert_close(cg(xs)[0], g.reference(xs)[0])
