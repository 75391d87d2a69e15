"""passes.crop_padding_taps: a float convolution's edge taps that read only padding are cropped, the padding adjusted.
The oracle is the original graph's numpy reference (every tap summed); each test also asserts the cropped kernel's
shape (or that the convolution was left alone)."""
import numpy as np
from hypothesis import assume, given, settings
from hypothesis import strategies as st

import taskdsl.graph as tg
from taskdsl.graph import ops, passes

from . import assert_close, rand


def kernel_shapes(graph) -> list:
    """The weight shapes of the convolutions of `graph` after the pass."""
    return [op.inputs[1].shape for op in passes.crop_padding_taps(graph).nodes if op.kind.startswith("conv")]


def live_taps(n: int, k: int, stride: int, pad: int, dilation: int) -> np.ndarray:
    """Which taps of one axis read an input position for some output (numpy's count of the outputs)."""
    out = (n + 2 * pad - dilation * (k - 1) - 1) // stride + 1
    positions = np.arange(out)[:, None] * stride - pad + np.arange(k) * dilation
    return ((positions >= 0) & (positions < n)).any(axis=0)


def test_an_aspp_branch_becomes_a_1x1_convolution():
    """DeepLab's atrous branch of dilation 36 over a 33x33 map reads the input by its centre tap only: a 1x1
    convolution, unpadded, with the centre weights; the output equals the 3x3 one's."""
    x = tg.input("x", (1, 16, 33, 33))
    w = rand((8, 16, 3, 3), 1)
    g = tg.Graph([x], [ops.relu(ops.conv2d(x, tg.constant(w), np.ones(8, np.float32), padding=36, dilation=36))])
    cropped = passes.crop_padding_taps(g)
    conv = next(op for op in cropped.nodes if op.kind == "conv2d")
    assert conv.inputs[1].shape == (8, 16, 1, 1) and conv.attrs["pads"] == (0, 0, 0, 0)
    np.testing.assert_array_equal(conv.inputs[1].value, w[:, :, 1:2, 1:2])
    data = rand((1, 16, 33, 33), 2)
    for channels_last in (False, True):
        assert_close(g.compile(channels_last=channels_last)(data)[0], g.reference(data)[0])


@settings(max_examples=12, deadline=None)
@given(n=st.sampled_from([1, 2, 3, 5, 8]), k=st.sampled_from([1, 2, 3, 5]), stride=st.sampled_from([1, 2, 3]),
       pad=st.integers(0, 6), dilation=st.sampled_from([1, 2, 3, 7]), groups=st.sampled_from([1, 2]),
       depth=st.sampled_from([1, 2]), seed=st.integers(0, 99))
def test_cropped_convolutions_match_the_reference(n, k, stride, pad, dilation, groups, depth, seed):
    """Small maps with wide padding and dilation, 1-d and 2-d (the same geometry per axis), strides, groups: the
    kernel keeps the taps from the first live one to the last (of each axis) and the output is the original's."""
    assume(n + 2 * pad >= dilation * (k - 1) + 1)
    live = live_taps(n, k, stride, pad, dilation)
    assume(live.any())
    spatial = (n,) * depth
    x = tg.input("x", (2, 4) + spatial)
    w = rand((6, 4 // groups) + (k,) * depth, seed)
    g = tg.Graph([x], [ops.conv(x, tg.constant(w), stride=stride, padding=pad, dilation=dilation, groups=groups)])
    first, last = np.flatnonzero(live)[[0, -1]]
    kept = last - first + 1
    if kept < k and pad - first * dilation >= 0:
        assert kernel_shapes(g) in ([w.shape], [(6, 4 // groups) + (kept,) * depth])
    else:
        assert kernel_shapes(g) == [w.shape]
    data = rand((2, 4) + spatial, seed + 1)
    assert_close(g.compile()(data)[0], g.reference(data)[0])


def test_taps_with_infinite_weights_are_kept():
    """inf * 0 is NaN: a tap seeing only padding with an infinite weight stays, and the outputs keep the NaNs the
    kernels give uncropped (as onnxruntime's, whose im2col multiplies the padding's zeros too; the definitions'
    reference skips padding taps instead)."""
    x = tg.input("x", (1, 1, 2, 2))
    w = np.ones((1, 1, 3, 3), np.float32)
    w[0, 0, 0, 0] = np.inf      # at offset (-4, -4) for every output: padding only
    g = tg.Graph([x], [ops.conv2d(x, tg.constant(w), padding=4, dilation=4)])
    assert kernel_shapes(g) == [(1, 1, 3, 3)]
    data = rand((1, 1, 2, 2), 3)
    uncropped = g.compile(passes=[p for p in passes.PIPELINE if p is not passes.crop_padding_taps])(data)[0]
    assert np.isnan(uncropped).all()
    np.testing.assert_array_equal(g.compile()(data)[0], uncropped)


def test_weights_computed_at_run_time_are_left_alone():
    """A convolution by a graph input's weights is not cropped (its weights are unknown when the graph compiles)."""
    x, w = tg.input("x", (1, 2, 3, 3)), tg.input("w", (2, 2, 3, 3))
    assert kernel_shapes(tg.Graph([x, w], [ops.conv2d(x, w, padding=4, dilation=4)])) == [(2, 2, 3, 3)]
