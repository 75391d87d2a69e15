"""The channels-last layout: graph convolutions in NHWC, and the pass that propagates that layout
through elementwise operators (oracle: the original graph's numpy reference, and numpy itself)."""
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import taskdsl.graph as tg
from taskdsl.graph import ops, passes

from . import assert_close, rand


LAYOUT_PASSES = [passes.infer_shapes, passes.fold_constants, passes.channels_last, passes.eliminate_dead_code]


def _kinds(g) -> list:
    return [op.kind for op in g.nodes]


def _numpy_conv(x, w, pad):
    """NCHW x (one group, stride 1) convolved with OIHW w, by numpy."""
    n, c, h, wd = x.shape
    o, _, kh, kw = w.shape
    xp = np.pad(x.astype(np.float64), ((0, 0), (0, 0), (pad, pad), (pad, pad)))
    oh, ow = h + 2 * pad - kh + 1, wd + 2 * pad - kw + 1
    out = np.zeros((n, o, oh, ow))
    for i in range(kh):
        for j in range(kw):
            out += np.einsum("nchw,oc->nohw", xp[:, :, i:i + oh, j:j + ow], w[:, :, i, j])
    return out


def test_channels_last_conv_matches_numpy_and_prints_its_layout():
    x = tg.input("x", (2, 7, 5, 3))                  # N, H, W, C
    w, b = rand((4, 3, 3, 3), 1), rand((4,), 2)
    y = ops.relu(ops.conv2d(x, tg.constant(w), tg.constant(b), padding=1, channels_last=True))
    g = tg.Graph([x], [y])
    assert y.shape == (2, 7, 5, 4) and "channels_last=True" in str(g)
    xa = rand((2, 7, 5, 3), 3)
    want = np.maximum(_numpy_conv(xa.transpose(0, 3, 1, 2), w, 1) + b.reshape(4, 1, 1), 0).transpose(0, 2, 3, 1)
    assert_close(g.reference(xa)[0], want.astype(np.float32))
    assert_close(g(xa)[0], want.astype(np.float32))
    z = tg.input("z", (1, 3, 5, 5))
    assert "channels_last" not in str(tg.Graph([z], [ops.conv2d(z, tg.constant(w))]))


def _block(x, seed: int):
    """conv -> add bias -> relu -> conv, plus a residual from a 1x1 conv: a ResNet-like block."""
    c = x.shape[1]
    a = ops.relu(ops.conv2d(x, tg.constant(rand((6, c, 3, 3), seed)), tg.constant(rand((6,), seed + 1)), padding=1))
    b = ops.conv2d(a, tg.constant(rand((5, 6, 3, 3), seed + 2)), padding=1)
    return ops.relu(ops.add(b, ops.conv2d(x, tg.constant(rand((5, c, 1, 1), seed + 3)))))


def test_the_pass_leaves_one_transpose_at_each_end_of_a_conv_stack():
    x = tg.input("x", (1, 4, 9, 8))
    g = tg.Graph([x], [ops.max_pool2d(_block(_block(x, 0), 10), 2)])
    last = passes.optimize(g, LAYOUT_PASSES)
    kinds = _kinds(last)
    assert kinds.count("transpose") == 2 and kinds[0] == "transpose" and kinds[-2:] == ["max_pool", "transpose"]
    assert all(op.attrs["channels_last"] for op in last.nodes if op.kind in ("conv2d", "max_pool"))
    xa = rand((1, 4, 9, 8), 4)
    assert_close(last.reference(xa)[0], g.reference(xa)[0])
    cg = g.compile(channels_last=True)          # x's transpose is read by two convs: no prologue of either
    assert sorted(set(_kinds(cg.graph))) == ["conv2d", "fused", "max_pool", "transpose"]
    assert _kinds(cg.graph).count("transpose") == 2
    assert_close(cg(xa)[0], g.reference(xa)[0])


@pytest.mark.parametrize("keepdims", [True, False])
def test_a_global_pool_of_a_channels_last_tensor_reduces_its_channels_last_form(keepdims):
    """A reduction over the spatial axes (2, 3) of a tensor computed channels-last reduces axes (1, 2) of that form:
    with keepdims its (N, 1, 1, C) result is the channels-last form, back to (N, C, 1, 1) by a reshape (the axes
    longer than 1 keep their order: no data moves), without it (N, C) is the same in both layouts. A reduction over
    the channels keeps the channels-first layout."""
    x = tg.input("x", (2, 4, 9, 8))
    y = _block(_block(x, 0), 10)
    pooled = ops.mean(y, (2, 3), keepdims) if keepdims else ops.max(y, (-1, -2))
    g = tg.Graph([x], [ops.flatten(pooled), ops.sum(y, 1)])
    last = passes.optimize(g, LAYOUT_PASSES)
    spatial = [op for op in last.nodes if op.kind.startswith("reduce") and op.inputs[0].shape == (2, 9, 8, 5)]
    assert [op.attrs["axes"] for op in spatial] == [(1, 2)]
    channels = [op for op in last.nodes if op.kind == "reduce_sum"]
    assert [(op.attrs["axes"], op.inputs[0].shape) for op in channels] == [((1,), (2, 5, 9, 8))]
    assert _kinds(last).count("transpose") == 2
    xa = rand((2, 4, 9, 8), 6)
    for got, want in zip(last.reference(xa), g.reference(xa)):
        assert_close(got, want)
    for got, want in zip(g.compile(channels_last=True)(xa), g.reference(xa)):
        assert_close(got, want)


@pytest.mark.parametrize("shape", [(1, 2, 1, 2), (1, 2, 2, 2), (1, 3, 1, 3)])
def test_a_stack_whose_channels_and_width_are_alike_transposes_back(shape):
    """Two axes longer than 1 of one length that change places (C and W of (1, 2, 1, 2)) are a transpose, not a
    reshape: comparing the lengths alone took them for axes that keep their order (a hypothesis example of a
    ConvInteger found it)."""
    c = shape[1]
    x = tg.input("x", (1, 1) + shape[2:])
    y = ops.conv2d(ops.relu(ops.conv2d(x, tg.constant(rand((c, 1, 1, 1), 1)))), tg.constant(rand((c, c, 1, 1), 2)))
    g = tg.Graph([x], [y])
    assert y.shape == shape
    last = passes.optimize(g, LAYOUT_PASSES)
    assert [op.attrs.get("channels_last") for op in last.nodes if op.kind == "conv2d"] == [True, True]
    assert _kinds(last)[-1] == "transpose"
    xa = rand((1, 1) + shape[2:], 2)
    for got, want in zip(g.compile(channels_last=True)(xa), g.reference(xa)):
        assert_close(got, want)


def test_the_pass_changes_nothing_without_convolutions():
    x = tg.input("x", (2, 3, 4, 4))
    g = tg.Graph([x], [ops.relu(x)])
    assert passes.channels_last(g) is g
    for flag in (True, False):      # False was accepted, and the passes ran the layout pass anyway
        with pytest.raises(ValueError, match="either passes or channels_last"):
            g.compile(passes=passes.pipeline(True), channels_last=flag)


@pytest.mark.parametrize("second_reader", ["add", "max_pool"])
@pytest.mark.parametrize("conv_input", ["computed", "graph input"])
def test_a_channels_first_tensor_a_conv_reads_keeps_its_other_readers_channels_first(second_reader, conv_input):
    """Its transposed copy for the conv made its other readers follow channels-last, each then transposed back
    (3 transposes where 2 do: only what a converted operator computes channels-last is followed)."""
    x = tg.input("x", (1, 3, 6, 6))
    r = ops.relu(x) if conv_input == "computed" else x
    other = ops.add(r, 1.0) if second_reader == "add" else ops.max_pool2d(r, 2)
    y = ops.conv2d(ops.conv2d(r, tg.constant(rand((4, 3, 3, 3), 5)), padding=1), tg.constant(rand((2, 4, 1, 1), 7)))
    g = tg.Graph([x], [y, other])
    last = passes.optimize(g, LAYOUT_PASSES)
    assert _kinds(last).count("transpose") == 2, _kinds(last)
    assert not any(op.attrs.get("channels_last") for op in last.nodes if op.kind != "conv2d")
    xa = rand((1, 3, 6, 6), 6)
    for got, want in zip(last.reference(xa), g.reference(xa)):
        assert_close(got, want)


def test_the_compiled_graph_says_whether_a_convolution_runs_channels_last():
    """A graph whose convolutions the pass leaves alone (1-d here) reported 'layout pass on (2-D convolutions
    NHWC)' and channels_last=True."""
    x = tg.input("x", (1, 3, 9))
    g = tg.Graph([x], [ops.conv(x, tg.constant(rand((2, 3, 3), 7)))])
    cg = g.compile("cpu", channels_last=True)
    assert not cg.channels_last and "layout pass on (no 2-D convolution to convert" in cg.summary()
    assert "layout pass off" in g.compile("cpu", channels_last=False).summary()


def test_a_tensor_read_in_both_layouts_is_transposed_once():
    """A conv output read by another conv and by a softmax (no channels-last form): one transpose back."""
    x = tg.input("x", (1, 3, 6, 6))
    y = ops.conv2d(x, tg.constant(rand((4, 3, 1, 1), 1)))
    outs = [ops.softmax(y, axis=1), ops.conv2d(y, tg.constant(rand((2, 4, 3, 3), 2))), y]
    g = tg.Graph([x], outs)
    last = passes.channels_last(g)
    assert _kinds(last).count("transpose") == 3       # x in; y back (once, for softmax and output); 2nd conv out
    xa = rand((1, 3, 6, 6), 3)
    for got, want in zip(last.reference(xa), g.reference(xa)):
        assert_close(got, want)


def test_concat_of_channels_last_tensors_joins_on_the_moved_axis():
    """Inception's branches: convs concatenated along the channels, then pooled; no transpose in between."""
    x = tg.input("x", (1, 3, 7, 6))
    branches = [ops.relu(ops.conv2d(x, tg.constant(rand((4, 3, k, k), k)), padding=k // 2)) for k in (1, 3)]
    for axis in (1, 2):      # the channels; or the rows (channels-last too: the transposes stay at the ends)
        g = tg.Graph([x], [ops.max_pool2d(ops.concat(branches, axis=axis), 2)])
        last = passes.optimize(g, LAYOUT_PASSES)
        assert _kinds(last).count("transpose") == 2       # x in, the pooled result out
        concat, = (op for op in last.nodes if op.kind == "concat")
        assert concat.attrs["axis"] == (3 if axis == 1 else 1)
        xa = rand((1, 3, 7, 6), 9)
        assert_close(last.reference(xa)[0], g.reference(xa)[0])


BROADCASTS = [(), (1,), (6,), (1, 1, 6), (5, 1, 1), (1, 5, 1, 1), (2, 5, 4, 6)]


@settings(max_examples=20, deadline=None)
@given(operand=st.sampled_from(BROADCASTS), is_constant=st.booleans(), fn=st.sampled_from(["add", "mul", "maximum"]),
       pad=st.integers(0, 1), seed=st.integers(0, 2**16))
def test_layout_propagates_through_broadcast_operands(operand, is_constant, fn, pad, seed):
    """conv -> fn(., operand) -> relu -> conv: any operand shape that broadcasts, constant or a graph input, gives
    the original graph's values; the elementwise operators run channels-last."""
    x = tg.input("x", (2, 3, 4 + 2 - 2 * pad, 6 + 2 - 2 * pad))
    other = tg.constant(rand(operand, seed + 1)) if is_constant else tg.input("other", operand)
    y = ops.conv2d(x, tg.constant(rand((5, 3, 3, 3), seed)), padding=pad)
    z = ops.conv2d(ops.relu(getattr(ops, fn)(y, other)), tg.constant(rand((2, 5, 1, 1), seed + 4)))
    g = tg.Graph([x] + ([] if is_constant else [other]), [z])
    last = passes.optimize(g, LAYOUT_PASSES)
    assert _kinds(last)[-2:] == ["conv2d", "transpose"]       # fn and relu channels-last, one transpose back
    assert all(op.attrs.get("channels_last", True) for op in last.nodes if op.kind != "transpose")
    args = [rand(x.shape, seed + 2)] + ([] if is_constant else [rand(operand, seed + 3)])
    assert_close(last.reference(*args)[0], g.reference(*args)[0])


def test_batch_norm_after_a_channels_last_conv_is_not_folded_into_its_weights():
    """BatchNorm normalizes axis 1: after an NHWC conv that is H, not the conv's output channels."""
    x = tg.input("x", (1, 4, 4, 2))
    y = ops.conv2d(x, tg.constant(rand((3, 2, 1, 1), 1)), channels_last=True)
    stats = [tg.constant(rand((4,), k, low=0.5, high=2.0)) for k in range(4)]
    g = tg.Graph([x], [ops.batch_norm(y, *stats)])
    folded = passes.optimize(g, passes.PIPELINE[:4])
    assert "conv2d" in _kinds(folded) and _kinds(folded)[-1] == "add"
    xa = rand((1, 4, 4, 2), 5)
    assert_close(folded.reference(xa)[0], g.reference(xa)[0])


def _convs_layouts(cg) -> set:
    """Whether each fused convolution of a compiled graph runs channels-last."""
    def convs(op):
        inner = getattr(op, "anchor", None)
        return [op] if op.kind == "conv2d" else convs(inner) if inner is not None else []
    return {c.attrs["channels_last"] for op in cg.graph.nodes for c in convs(op)}


def test_convolutions_run_channels_last_unless_told_otherwise(simulated_gpu):
    """Both targets run convolutions NHWC by default (cuda's tensor-core im2col copies runs of channels, the cpu's
    GEMM stores output rows); `channels_last=` overrides either, and explicit passes decide alone. Each result
    matches the reference."""
    x = tg.input("x", (1, 3, 5, 4))
    y = ops.relu(ops.conv2d(x, tg.constant(rand((4, 3, 3, 3), 20)), padding=1))
    g = tg.Graph([x], [ops.conv2d(y, tg.constant(rand((2, 4, 1, 1), 22)))])
    xa = rand((1, 3, 5, 4), 21)
    want = g.reference(xa)[0]
    for target, flag, nhwc in (("cuda", None, True), ("cuda", False, False), ("cpu", None, True),
                               ("cpu", False, False)):
        cg = g.compile(target, channels_last=flag)
        assert cg.channels_last is nhwc and _convs_layouts(cg) == {nhwc}, (target, flag)
        assert f"layout pass {'on' if nhwc else 'off'}" in cg.summary()
        assert_close(np.asarray(cg(xa)[0]), want)
    assert not g.compile("cuda", passes=passes.PIPELINE).channels_last


@pytest.mark.parametrize("target", ["cpu", "cuda"])
def test_a_lone_convolution_keeps_its_layout(simulated_gpu, target):
    """A convolution with no other in reach (through pooling, elementwise and concat operators) stays NCHW, even
    when asked for channels-last: its two transposes would cost more than the layout saves (1.5-3.5x on the cpu);
    two convolutions side by side, reading one input, are a region."""
    x = tg.input("x", (1, 3, 6, 6))
    lone = ops.max_pool2d(ops.relu(ops.conv2d(x, tg.constant(rand((4, 3, 3, 3), 30)), padding=1)), 2)
    g = tg.Graph([x], [ops.softmax(ops.flatten(lone), axis=-1)])
    assert passes.channels_last(g) is g
    for flag in (None, True):
        cg = g.compile(target, channels_last=flag)
        assert not cg.channels_last and "transpose" not in _kinds(cg.graph)
    side_by_side = ops.conv2d(x, tg.constant(rand((4, 3, 1, 1), 31))) + \
        ops.conv2d(x, tg.constant(rand((4, 3, 3, 3), 32)), padding=1)
    pair = tg.Graph([x], [side_by_side])
    assert _convs_layouts(pair.compile(target)) == {True}
    y = x      # ConvNeXt-like: each conv's output meets a layer norm (no channels-last form), its input a residual add
    for k in range(2):
        t = ops.layer_norm(ops.conv2d(y, tg.constant(rand((3, 1, 3, 3), 34 + k)), padding=1, groups=3))
        y = y + t
    assert passes.channels_last(tg.Graph([x], [y])).nodes == tg.Graph([x], [y]).nodes
    xa = rand((1, 3, 6, 6), 33)
    assert_close(np.asarray(g.compile(target)(xa)[0]), g.reference(xa)[0])


@pytest.mark.parametrize("channels, window, groups, nhwc", [
    (32, 3, 1, True), (48, 5, 1, True), (31, 3, 1, False), (32, 1, 1, False), (32, 3, 2, False)])
def test_a_lone_convolution_of_many_channels_runs_channels_last_on_the_cpu(channels, window, groups, nhwc,
                                                                            simulated_gpu):
    """On the cpu a lone float convolution of one group, reading LONE_MIN_CHANNELS or more channels through a window
    wider than a pixel, runs NHWC with its two transposes fused into it (its im2col copies runs of channels: a 3x3
    64 -> 64 at 56 x 56 1.47 -> 1.18 ms); a 1x1 one (NCHW is its columns), a grouped one and one of fewer channels
    keep NCHW, as every lone one does on a GPU; the values are numpy's."""
    x = tg.input("x", (1, channels, 9, 7))
    w = rand((8, channels // groups, window, window), 40)
    g = tg.Graph([x], [ops.relu(ops.conv2d(x, tg.constant(w), padding=window // 2, groups=groups))])
    cg = g.compile("cpu")
    assert _convs_layouts(cg) == {nhwc} and cg.channels_last == nhwc
    assert [k.name.startswith("pad_nhwc") for k in cg.kernels[:1]] == [nhwc]       # the input's transpose fused in
    assert _convs_layouts(g.compile("cuda")) == {False}
    xa = rand((1, channels, 9, 7), 41)
    cg_in, cg_out = channels // groups, 8 // groups
    want = np.concatenate([_numpy_conv(xa[:, k * cg_in:(k + 1) * cg_in], w[k * cg_out:(k + 1) * cg_out], window // 2)
                           for k in range(groups)], 1)
    assert_close(cg(xa)[0], np.maximum(want, 0).astype(np.float32), rtol=1e-4, atol=1e-5)


def _dynamic_quantized_conv(x, w: np.ndarray, pad: int):
    """ONNX's dynamically quantized convolution as the importer writes it: DynamicQuantizeLinear's max and min
    over the whole tensor, x quantized, padded with its zero point (a tensor computed at run time), an integer
    convolution, the zero point's share subtracted (a per-channel (O, 1, 1) tensor computed at run time too)."""
    high, low = ops.maximum(ops.max(x), 0.0), ops.minimum(ops.min(x), 0.0)
    scale = ops.div(ops.sub(high, low), 255.0)
    zero = ops.cast(ops.clip(ops.elementwise("rint", ops.neg(ops.div(low, scale))), 0.0, 255.0), "uint8")
    q = ops.cast(ops.clip(ops.add(ops.elementwise("rint", ops.div(x, scale)), ops.cast(zero, "float32")), 0.0, 255.0),
                 "uint8")
    padded = ops.pad(q, (0, 0, pad, pad, 0, 0, pad, pad), zero)
    share = ops.mul(ops.cast(zero, "int32"), tg.constant(w.sum((1, 2, 3), dtype=np.int32).reshape(-1, 1, 1)))
    y = ops.sub(ops.integer_conv(padded, tg.constant(w)), share)
    return ops.relu(ops.mul(ops.cast(y, "float32"), scale))


@pytest.mark.parametrize("target", ["cpu", "cuda"])
def test_a_quantized_stack_runs_channels_last(target, request):
    """Integer convolutions stack like float ones: the pads with a run-time zero point pad the spatial axes of the
    channels-last form, the max and min over everything read it as it is, and the zero point's per-channel share
    is reshaped, not transposed: the stack has a transpose at each end only. On a (simulated) GPU the NHWC integer
    convolutions run the 8-bit tensor-core template."""
    if target == "cuda":
        request.getfixturevalue("simulated_gpu")
    x = tg.input("x", (1, 3, 9, 7))
    w1 = np.random.default_rng(1).integers(-100, 100, (6, 3, 3, 3)).astype(np.int8)
    w2 = np.random.default_rng(2).integers(-100, 100, (4, 6, 1, 1)).astype(np.int8)
    g = tg.Graph([x], [_dynamic_quantized_conv(_dynamic_quantized_conv(x, w1, 1), w2, 0)])
    last = passes.optimize(g, LAYOUT_PASSES)
    assert all(op.attrs["channels_last"] for op in last.nodes if op.kind == "conv2d_integer")
    assert [op.attrs["pads"] for op in last.nodes if op.kind == "pad"] == [(0, 0, 1, 1, 0, 0, 1, 1)]
    assert _kinds(last).count("transpose") == 2 and _kinds(last).count("pad") == 1
    assert [op.inputs[0].shape for op in last.nodes if op.kind == "reduce_max"] == [(1, 3, 9, 7), (1, 9, 7, 6)]
    xa = rand((1, 3, 9, 7), 8)
    want = g.reference(xa)[0]
    assert_close(last.reference(xa)[0], want)
    compiled = g.compile(target, channels_last=True)
    assert compiled.channels_last
    assert_close(compiled(xa)[0], want)
