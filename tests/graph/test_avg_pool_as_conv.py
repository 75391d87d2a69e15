"""avg_pool_as_conv: 2-D average pooling rewritten as a depthwise convolution by ones times a constant
(oracle: the original pooling operator's numpy reference on random inputs)."""
from unittest import mock

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from stdlib_ops import pool as pool_lib
import taskdsl as td
import taskdsl.graph as tg
from taskdsl.graph import ops, passes

from . import assert_close, rand


def _rewrite(g, row_kernel: bool = False):
    """The pass, run as for a real model (it leaves graphs alone under td.fast_compile), on the cpu with its row
    kernel for f32 channels-first pools (`row_kernel`: it keeps them) or without, as for a GPU."""
    td.fast_compile(False)
    try:
        with mock.patch.object(pool_lib, "on_rows", pool_lib.on_rows if row_kernel else lambda dtype, target: False):
            return passes.optimize(g, [passes.infer_shapes, passes.avg_pool_as_conv])
    finally:
        td.fast_compile(True)


@settings(max_examples=40, deadline=None)
@given(hw=st.tuples(st.integers(1, 9), st.integers(1, 9)), k=st.tuples(st.integers(1, 3), st.integers(1, 3)),
       stride=st.integers(1, 3), pad=st.integers(0, 2), dilation=st.integers(1, 2), ceil_mode=st.booleans(),
       count_include_pad=st.booleans(), channels_last=st.booleans(), seed=st.integers(0, 2**16))
def test_rewrite_keeps_the_pooling_values(hw, k, stride, pad, dilation, ceil_mode, count_include_pad,
                                          channels_last, seed):
    pads = (min(pad, k[0] - 1), min(pad, k[1] - 1))
    spans = [dilation * (n - 1) + 1 for n in k]
    if any(n + 2 * p < s for n, p, s in zip(hw, pads, spans)):
        return                                       # the window does not fit
    shape = (2,) + hw + (3,) if channels_last else (2, 3) + hw
    x = tg.input("x", shape)
    y = ops.pool(x, "avg", k, stride, pads, dilation, ceil_mode, count_include_pad, channels_last=channels_last)
    g = tg.Graph([x], [y])
    rewritten = _rewrite(g)
    assert [op.kind for op in rewritten.nodes] in (["conv2d", "mul"], ["avg_pool"])   # avg_pool: an empty window
    conv = rewritten.nodes[0]
    if conv.kind == "conv2d":
        assert conv.attrs["groups"] == 3 and conv.attrs["channels_last"] == channels_last
    xa = rand(shape, seed)
    assert_close(rewritten.reference(xa)[0], g.reference(xa)[0], rtol=1e-5)


def test_an_inception_pool_branch_is_one_direct_kernel():
    """avg_pool(3, 1, 1) -> the depthwise conv by ones with `* ratio` fused into its stores (`plane_kernel`: the
    rewrite a GPU gets, run on the cpu)."""
    td.set_target("cpu")
    x = tg.input("x", (1, 5, 9, 8))
    g = tg.Graph([x], [ops.avg_pool2d(x, 3, 1, 1, count_include_pad=False)])
    cg = _rewrite(g).compile(passes=[passes.partition])
    assert [k.name for k in cg.kernels] == ["conv_direct_plane_f32_fused"]      # a stride-1 depthwise plane
    xa = rand((1, 5, 9, 8), 4)
    x64 = np.pad(xa.astype(np.float64), ((0, 0), (0, 0), (1, 1), (1, 1)))
    ones = np.pad(np.ones((9, 8)), 1)
    sums = sum(x64[:, :, i:i + 9, j:j + 8] for i in range(3) for j in range(3))
    counts = sum(ones[i:i + 9, j:j + 8] for i in range(3) for j in range(3))
    assert_close(cg(xa)[0], (sums / counts).astype(np.float32))


def test_fast_compile_leaves_pooling_alone():
    x = tg.input("x", (1, 2, 5, 5))
    g = tg.Graph([x], [ops.avg_pool2d(x, 2)])
    td.fast_compile(True)
    assert passes.avg_pool_as_conv(g) is g


@pytest.mark.parametrize("channels_last", [False, True])
def test_the_cpu_keeps_channels_first_pools_for_its_row_kernel(channels_last):
    """On the cpu an f32 channels-first average pool stays a pool (the row kernel runs it, in about half the
    convolution's time); a channels-last one is rewritten, as every one is for a GPU."""
    shape = (1, 5, 9, 3) if channels_last else (1, 3, 5, 9)
    x = tg.input("x", shape)
    g = tg.Graph([x], [ops.pool(x, "avg", 3, 2, (1, 1, 1, 1), count_include_pad=False, channels_last=channels_last)])
    kinds = [op.kind for op in _rewrite(g, row_kernel=True).nodes]
    assert kinds == (["conv2d", "mul"] if channels_last else ["avg_pool"])
    assert [op.kind for op in _rewrite(g).nodes] == ["conv2d", "mul"]
