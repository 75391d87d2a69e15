"""The operators session 70 added, used as a model uses them: multi-node models built with onnx.helper (random
weights as initializers), imported with from_onnx and compiled with the default passes (fusion and the layout
pass on), against onnxruntime. A UNet-style decoder (ConvTranspose, Concat, linear Resize, InstanceNormalization,
LeakyRelu) and upsamplers (nearest Resize by sizes, DepthToSpace); a MobileNetV3 block (HardSwish, depthwise
conv, squeeze-excite with HardSigmoid), f32 and f16; a LLaMA-style decoder layer (RMSNormalization,
RotaryEmbedding, grouped-query Attention with and without a key/value cache, a gated Swish MLP), f32 and f16;
a post-processing graph (Einsum, Softmax, CumSum, ArgMax, Tile, Mod, GatherElements, Where, Cast); and the same
models through `python -m models run --onnx`."""
import warnings

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from onnx import TensorProto, helper

import taskdsl.graph as tg

from . import assert_close, make_model, rand, run_onnxruntime

pytest.importorskip("onnxruntime")

F32, F16, I64, I32 = TensorProto.FLOAT, TensorProto.FLOAT16, TensorProto.INT64, TensorProto.INT32
node = helper.make_node
TOLERANCE = {F32: dict(rtol=1e-4, atol=1e-5), F16: dict(rtol=1e-2, atol=1e-2)}


def _np(elem):
    return np.float16 if elem == F16 else np.float32


def _weights(arrays: dict, elem, keep=()) -> dict:
    """The float weights in the model's type (those named in `keep` stay as they are: scales, shapes)."""
    return {k: v.astype(_np(elem)) if v.dtype == np.float32 and k not in keep else v for k, v in arrays.items()}


def _check(model, feeds: dict, elem=F32) -> list:
    """Every output of the default compile against onnxruntime's; returns ours."""
    got = tg.from_onnx(model)(feeds)
    want = run_onnxruntime(model, feeds)
    assert len(got) == len(want)
    for g, w in zip(got, want):
        if w.dtype.kind == "f" and w.dtype.itemsize == 2:
            assert g.dtype == w.dtype
            g, w = g.astype(np.float32), w.astype(np.float32)
        assert_close(g, w, **TOLERANCE[elem])
    return got


# ---------------------------------------------------------------- UNet-style decoder and upsamplers
def unet_decoder(batch, channels, h, w, skip_channels, elem=F32):
    """Conv -> Relu -> ConvTranspose (stride 2, output_padding) -> Concat with the skip -> Resize (linear, x2,
    half_pixel) -> Conv -> InstanceNormalization -> LeakyRelu."""
    weights = _weights({
        "w1": rand((8, channels, 3, 3), 1, low=-.4, high=.4), "b1": rand((8,), 2, low=-.2, high=.2),
        "wt": rand((8, 6, 3, 3), 3, low=-.4, high=.4), "bt": rand((6,), 4, low=-.2, high=.2),
        "roi": np.zeros((0,), np.float32), "scales": np.array([1, 1, 2, 2], np.float32),
        "w2": rand((5, 6 + skip_channels, 3, 3), 5, low=-.3, high=.3), "b2": rand((5,), 6),
        "in_s": rand((5,), 7, low=.5, high=1.5), "in_b": rand((5,), 8, low=-.5, high=.5)}, elem, ("roi", "scales"))
    nodes = [node("Conv", ["x", "w1", "b1"], ["c1"], pads=[1, 1, 1, 1]),
             node("Relu", ["c1"], ["r1"]),
             node("ConvTranspose", ["r1", "wt", "bt"], ["up"], strides=[2, 2], pads=[1, 1, 1, 1],
                  output_padding=[1, 1]),
             node("Concat", ["up", "skip"], ["cat"], axis=1),
             node("Resize", ["cat", "roi", "scales"], ["rs"], mode="linear",
                  coordinate_transformation_mode="half_pixel"),
             node("Conv", ["rs", "w2", "b2"], ["c2"], pads=[1, 1, 1, 1]),
             node("InstanceNormalization", ["c2", "in_s", "in_b"], ["inn"], epsilon=1e-5),
             node("LeakyRelu", ["inn"], ["y"], alpha=0.1)]
    inputs = [("x", [batch, channels, h, w], elem), ("skip", [batch, skip_channels, 2 * h, 2 * w], elem)]
    return make_model(nodes, inputs,
                      [("y", [batch, 5, 4 * h, 4 * w], elem)], weights, opset=17, name="unet_decoder")


@pytest.mark.parametrize("elem", [F32, F16])
def test_unet_decoder(elem):
    model = unet_decoder(1, 4, 5, 7, 3, elem)
    feeds = {"x": rand((1, 4, 5, 7), 11).astype(_np(elem)), "skip": rand((1, 3, 10, 14), 12).astype(_np(elem))}
    _check(model, feeds, elem)


@settings(max_examples=2, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(batch=st.integers(1, 2), channels=st.sampled_from([1, 3]), h=st.sampled_from([1, 2, 5]),
       w=st.sampled_from([1, 3, 7]), skip=st.integers(1, 2))
def test_unet_decoder_shapes(batch, channels, h, w, skip):
    model = unet_decoder(batch, channels, h, w, skip)
    _check(model, {"x": rand((batch, channels, h, w), 11), "skip": rand((batch, skip, 2 * h, 2 * w), 12)})


def upsamplers(batch, channels, h, w, elem=F32):
    """Conv -> Relu -> a nearest Resize by sizes (2h + 1, 3w); and a 1x1 Conv -> DepthToSpace (pixel shuffle, CRD)
    -> Sigmoid."""
    weights = _weights({"w1": rand((channels, channels, 3, 3), 1, low=-.3, high=.3), "roi": np.zeros((0,), np.float32),
                        "no_scales": np.zeros((0,), np.float32),
                        "sizes": np.array([batch, channels, 2 * h + 1, 3 * w], np.int64),
                        "w2": rand((12, channels, 1, 1), 2, low=-.3, high=.3)}, elem, ("roi", "no_scales"))
    nodes = [node("Conv", ["x", "w1"], ["c1"], pads=[1, 1, 1, 1]), node("Relu", ["c1"], ["r1"]),
             node("Resize", ["r1", "roi", "no_scales", "sizes"], ["nearest"], mode="nearest"),
             node("Conv", ["x", "w2"], ["c2"]), node("DepthToSpace", ["c2"], ["shuffled"], blocksize=2, mode="CRD"),
             node("Sigmoid", ["shuffled"], ["y"])]
    return make_model(nodes, [("x", [batch, channels, h, w], elem)],
                      [("nearest", [batch, channels, 2 * h + 1, 3 * w], elem), ("y", [batch, 3, 2 * h, 2 * w], elem)],
                      weights, opset=17, name="upsamplers")


@pytest.mark.parametrize("shape, elem", [((1, 8, 5, 7), F32), ((2, 3, 1, 3), F32), ((1, 8, 5, 7), F16)])
def test_upsamplers(shape, elem):
    _check(upsamplers(*shape, elem), {"x": rand(shape, 13).astype(_np(elem))}, elem)


def test_pixel_shuffle_and_focus_between_convolutions():
    """SpaceToDepth (a YOLO 'focus' stem) -> Conv -> HardSwish -> Conv -> DepthToSpace (DCR) -> Conv: the layout
    pass sees convolutions on both sides of each rearrangement."""
    weights = {"w1": rand((8, 12, 1, 1), 1, low=-.5, high=.5), "w2": rand((12, 8, 3, 3), 2, low=-.3, high=.3),
               "w3": rand((4, 3, 3, 3), 3, low=-.3, high=.3)}
    nodes = [node("SpaceToDepth", ["x"], ["s"], blocksize=2), node("Conv", ["s", "w1"], ["c1"]),
             node("HardSwish", ["c1"], ["h"]), node("Conv", ["h", "w2"], ["c2"], pads=[1, 1, 1, 1]),
             node("DepthToSpace", ["c2"], ["d"], blocksize=2, mode="DCR"),
             node("Conv", ["d", "w3"], ["y"], pads=[1, 1, 1, 1])]
    model = make_model(nodes, [("x", [2, 3, 10, 6])], [("y", [2, 4, 10, 6])], weights, opset=14)
    _check(model, {"x": rand((2, 3, 10, 6), 4)})


# ---------------------------------------------------------------- MobileNetV3 block
def mobilenet_v3_block(batch, channels, h, w, expanded, squeezed, out_channels, stride, elem=F32):
    """1x1 Conv -> BatchNormalization -> HardSwish -> depthwise 3x3 Conv -> HardSwish -> squeeze-excite
    (GlobalAveragePool -> Conv -> Relu -> Conv -> HardSigmoid -> Mul) -> 1x1 Conv (+ the input where shapes allow)."""
    weights = _weights({
        "we": rand((expanded, channels, 1, 1), 1, low=-.5, high=.5), "bn_s": rand((expanded,), 2, low=.5, high=1.5),
        "bn_b": rand((expanded,), 3, low=-.5, high=.5), "bn_m": rand((expanded,), 4, low=-.5, high=.5),
        "bn_v": rand((expanded,), 5, low=.5, high=2), "wd": rand((expanded, 1, 3, 3), 6, low=-.5, high=.5),
        "bd": rand((expanded,), 7, low=-.2, high=.2), "ws1": rand((squeezed, expanded, 1, 1), 8, low=-.5, high=.5),
        "bs1": rand((squeezed,), 9, low=-.2, high=.2), "ws2": rand((expanded, squeezed, 1, 1), 10, low=-.5, high=.5),
        "bs2": rand((expanded,), 11, low=-.2, high=.2),
        "wp": rand((out_channels, expanded, 1, 1), 12, low=-.5, high=.5),
        "bp": rand((out_channels,), 13, low=-.2, high=.2)}, elem)
    ho, wo = (h - 1) // stride + 1, (w - 1) // stride + 1
    nodes = [node("Conv", ["x", "we"], ["c1"]),
             node("BatchNormalization", ["c1", "bn_s", "bn_b", "bn_m", "bn_v"], ["bn"], epsilon=1e-3),
             node("HardSwish", ["bn"], ["hs"]),
             node("Conv", ["hs", "wd", "bd"], ["dw"], group=expanded, pads=[1, 1, 1, 1], strides=[stride, stride]),
             node("HardSwish", ["dw"], ["hs2"]),
             node("GlobalAveragePool", ["hs2"], ["gap"]),
             node("Conv", ["gap", "ws1", "bs1"], ["s1"]), node("Relu", ["s1"], ["sr"]),
             node("Conv", ["sr", "ws2", "bs2"], ["s2"]), node("HardSigmoid", ["s2"], ["gate"], alpha=1 / 6, beta=0.5),
             node("Mul", ["hs2", "gate"], ["excited"]),
             node("Conv", ["excited", "wp", "bp"], ["proj"])]
    residual = stride == 1 and out_channels == channels
    nodes.append(node("Add", ["proj", "x"], ["y"]) if residual else node("Identity", ["proj"], ["y"]))
    return make_model(nodes, [("x", [batch, channels, h, w], elem)], [("y", [batch, out_channels, ho, wo], elem)],
                      weights, opset=17, name="mobilenet_v3_block")


@pytest.mark.parametrize("elem", [F32, F16])
@pytest.mark.parametrize("shape", [
    dict(batch=1, channels=8, h=9, w=9, expanded=16, squeezed=4, out_channels=8, stride=1),     # residual
    dict(batch=2, channels=3, h=7, w=5, expanded=12, squeezed=3, out_channels=5, stride=2),
    dict(batch=1, channels=8, h=1, w=1, expanded=16, squeezed=4, out_channels=8, stride=1)])
def test_mobilenet_v3_block(shape, elem):
    x = rand((shape["batch"], shape["channels"], shape["h"], shape["w"]), 21).astype(_np(elem))
    _check(mobilenet_v3_block(**shape, elem=elem), {"x": x}, elem)


# ---------------------------------------------------------------- LLaMA-style decoder layer
DIM, Q_HEADS, KV_HEADS, HIDDEN, MAX_POSITIONS = 32, 4, 2, 48, 64
HEAD = DIM // Q_HEADS


def llama_layer(batch, seq, past=0, elem=F32, opset=23, swish=False, rope_3d=False, mask=False):
    """RMSNormalization -> q, k, v MatMuls -> (Reshape, Transpose) -> RotaryEmbedding (4-D, or 3-D with num_heads)
    -> Attention (grouped-query, is_causal, optionally a past cache and a bool mask) -> MatMul -> residual Add ->
    RMSNormalization -> gated MLP (Swish at opset 24, else Sigmoid * x) -> residual Add."""
    inv = 1.0 / 10000 ** (np.arange(0, HEAD, 2) / HEAD)
    angles = np.arange(MAX_POSITIONS)[:, None] * inv[None]
    weights = _weights({
        "g1": rand((DIM,), 1, low=.5, high=1.5), "wq": rand((DIM, DIM), 2, low=-.3, high=.3),
        "wk": rand((DIM, KV_HEADS * HEAD), 3, low=-.3, high=.3),
        "wv": rand((DIM, KV_HEADS * HEAD), 4, low=-.3, high=.3),
        "wo": rand((DIM, DIM), 5, low=-.3, high=.3), "g2": rand((DIM,), 6, low=.5, high=1.5),
        "wg": rand((DIM, HIDDEN), 7, low=-.3, high=.3), "wu": rand((DIM, HIDDEN), 8, low=-.3, high=.3),
        "wd": rand((HIDDEN, DIM), 9, low=-.3, high=.3),
        "cos": np.cos(angles).astype(np.float32), "sin": np.sin(angles).astype(np.float32)}, elem)
    weights |= {"pos": np.broadcast_to(np.arange(past, past + seq, dtype=np.int64), (batch, seq)).copy(),
                "q_shape": np.array([batch, seq, Q_HEADS, HEAD], np.int64),
                "kv_shape": np.array([batch, seq, KV_HEADS, HEAD], np.int64),
                "merged": np.array([batch, seq, DIM], np.int64)}
    nodes = [node("RMSNormalization", ["x", "g1"], ["h"], axis=-1, epsilon=1e-6),
             node("MatMul", ["h", "wq"], ["q"]), node("MatMul", ["h", "wk"], ["k"]), node("MatMul", ["h", "wv"], ["v"])]
    if rope_3d:     # rotated as (B, S, heads * head size), then split into heads
        nodes += [node("RotaryEmbedding", ["q", "cos", "sin", "pos"], ["q_rot"], num_heads=Q_HEADS),
                  node("RotaryEmbedding", ["k", "cos", "sin", "pos"], ["k_rot"], num_heads=KV_HEADS),
                  node("Reshape", ["q_rot", "q_shape"], ["q4"]), node("Transpose", ["q4"], ["qa"], perm=[0, 2, 1, 3]),
                  node("Reshape", ["k_rot", "kv_shape"], ["k4"]), node("Transpose", ["k4"], ["ka"], perm=[0, 2, 1, 3])]
    else:
        nodes += [node("Reshape", ["q", "q_shape"], ["q4"]), node("Transpose", ["q4"], ["qt"], perm=[0, 2, 1, 3]),
                  node("Reshape", ["k", "kv_shape"], ["k4"]), node("Transpose", ["k4"], ["kt"], perm=[0, 2, 1, 3]),
                  node("RotaryEmbedding", ["qt", "cos", "sin", "pos"], ["qa"]),
                  node("RotaryEmbedding", ["kt", "cos", "sin", "pos"], ["ka"])]
    nodes += [node("Reshape", ["v", "kv_shape"], ["v4"]), node("Transpose", ["v4"], ["va"], perm=[0, 2, 1, 3])]
    inputs, outputs = [("x", [batch, seq, DIM], elem)], [("out", [batch, seq, DIM], elem)]
    attention_in, attention_out = ["qa", "ka", "va", "mask" if mask else ""], ["y"]
    if past:
        attention_in += ["past_k", "past_v"]
        attention_out += ["present_k", "present_v"]
        inputs += [("past_k", [batch, KV_HEADS, past, HEAD], elem), ("past_v", [batch, KV_HEADS, past, HEAD], elem)]
        outputs += [("present_k", [batch, KV_HEADS, past + seq, HEAD], elem),
                    ("present_v", [batch, KV_HEADS, past + seq, HEAD], elem)]
    if mask:
        inputs.append(("mask", [batch, 1, seq, past + seq], TensorProto.BOOL))
    nodes += [node("Attention", attention_in, attention_out, is_causal=1),
              node("Transpose", ["y"], ["yt"], perm=[0, 2, 1, 3]), node("Reshape", ["yt", "merged"], ["ym"]),
              node("MatMul", ["ym", "wo"], ["o"]), node("Add", ["x", "o"], ["r1"]),
              node("RMSNormalization", ["r1", "g2"], ["h2"], axis=-1, epsilon=1e-6),
              node("MatMul", ["h2", "wg"], ["gate"]), node("MatMul", ["h2", "wu"], ["up"])]
    if swish:
        nodes.append(node("Swish", ["gate"], ["act"]))
    else:
        nodes += [node("Sigmoid", ["gate"], ["sg"]), node("Mul", ["gate", "sg"], ["act"])]
    nodes += [node("Mul", ["act", "up"], ["gated"]), node("MatMul", ["gated", "wd"], ["mlp"]),
              node("Add", ["r1", "mlp"], ["out"])]
    return make_model(nodes, inputs, outputs, weights, opset=opset, name="llama_layer")


def llama_feeds(batch, seq, past=0, elem=F32, mask=False, seed=0) -> dict:
    feeds = {"x": rand((batch, seq, DIM), 100 + seed).astype(_np(elem))}
    if past:
        feeds["past_k"] = rand((batch, KV_HEADS, past, HEAD), 101 + seed).astype(_np(elem))
        feeds["past_v"] = rand((batch, KV_HEADS, past, HEAD), 102 + seed).astype(_np(elem))
    if mask:
        allowed = rand((batch, 1, seq, past + seq), 103 + seed, np.bool_)
        allowed[..., 0] = True          # no fully masked row (onnxruntime gives NaN there, taskdsl zeros)
        feeds["mask"] = allowed
    return feeds


@pytest.mark.parametrize("elem", [F32, F16])
@pytest.mark.parametrize("batch, seq, past, opset, swish", [
    (1, 7, 0, 23, False),       # prefill
    (2, 13, 5, 24, True),       # prefill after a cache, Swish (opset 24)
    (2, 1, 6, 23, False),       # one decode step
])
def test_llama_layer(batch, seq, past, opset, swish, elem):
    model = llama_layer(batch, seq, past, elem, opset, swish)
    got = _check(model, llama_feeds(batch, seq, past, elem), elem)
    if past:    # the present cache is the past one with the new keys and values after it
        feeds = llama_feeds(batch, seq, past, elem)
        np.testing.assert_array_equal(got[1][:, :, :past], feeds["past_k"])
        np.testing.assert_array_equal(got[2][:, :, :past], feeds["past_v"])


@pytest.mark.parametrize("elem", [F32, F16])
def test_llama_layer_3d_rotary_and_mask(elem):
    """RotaryEmbedding on the 3-D projections (num_heads), and a bool attn_mask with the cache (opset 24)."""
    model = llama_layer(2, 5, 3, elem, opset=24, rope_3d=True, mask=True)
    _check(model, llama_feeds(2, 5, 3, elem, mask=True), elem)


@settings(max_examples=2, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(batch=st.integers(1, 2), seq=st.sampled_from([1, 2, 7, 11]), past=st.sampled_from([0, 1, 3]))
def test_llama_layer_shapes(batch, seq, past):
    _check(llama_layer(batch, seq, past), llama_feeds(batch, seq, past))


# ---------------------------------------------------------------- post-processing graph
def post_processing(batch, queries, keys, channels, top, reverse=0, exclusive=0):
    """Einsum scores (bqc,bkc->bqk) -> Softmax -> CumSum along the keys; the best key (ArgMax) Tiled and offset,
    Mod the key count -> GatherElements of the running sums -> Greater / Where -> times the index Cast to float;
    the indices Cast to int32; the probabilities Tiled, fmod'ed (Mod fmod=1) and summed by Einsum."""
    weights = {"axis": np.array(-1, np.int64), "reps": np.array([1, 1, top], np.int64),
               "offsets": np.arange(top, dtype=np.int64), "n_keys": np.array(keys, np.int64),
               "threshold": np.array(0.5 * top / keys, np.float32), "zero": np.array(0, np.float32),
               "reps2": np.array([1, 2, 1], np.int64), "period": np.array(0.75, np.float32),
               "temperature": np.array(0.5, np.float32)}
    nodes = [node("Einsum", ["q", "k"], ["s"], equation="bqc,bkc->bqk"),
             node("Mul", ["s", "temperature"], ["st"]),
             node("Softmax", ["st"], ["p"], axis=-1),
             node("CumSum", ["p", "axis"], ["cs"], reverse=reverse, exclusive=exclusive),
             node("ArgMax", ["p"], ["best"], axis=-1, keepdims=1),
             node("Tile", ["best", "reps"], ["tiled"]),
             node("Add", ["tiled", "offsets"], ["shifted"]),
             node("Mod", ["shifted", "n_keys"], ["idx"]),
             node("GatherElements", ["cs", "idx"], ["g"], axis=2),
             node("Greater", ["g", "threshold"], ["keep"]),
             node("Where", ["keep", "g", "zero"], ["kept"]),
             node("Cast", ["idx"], ["idx_f"], to=F32),
             node("Mul", ["kept", "idx_f"], ["score"]),
             node("Cast", ["idx"], ["idx32"], to=I32),
             node("Tile", ["p", "reps2"], ["p2"]),
             node("Mod", ["p2", "period"], ["pm"], fmod=1),
             node("Einsum", ["pm"], ["total"], equation="bqk->bq")]
    return make_model(nodes, [("q", [batch, queries, channels]), ("k", [batch, keys, channels])],
                      [("score", [batch, queries, top]), ("idx32", [batch, queries, top], I32),
                       ("total", [batch, 2 * queries])], weights, opset=17, name="post_processing")


@settings(max_examples=3, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(batch=st.integers(1, 3), queries=st.sampled_from([1, 5, 13]), keys=st.sampled_from([1, 2, 7, 11, 37]),
       channels=st.sampled_from([1, 6]), top=st.integers(1, 4), reverse=st.integers(0, 1), exclusive=st.integers(0, 1))
def test_post_processing(batch, queries, keys, channels, top, reverse, exclusive):
    model = post_processing(batch, queries, keys, channels, top, reverse, exclusive)
    _check(model, {"q": rand((batch, queries, channels), 1), "k": rand((batch, keys, channels), 2)})


def test_post_processing_keeps_the_arena():
    """CumSum between other operators: the arena stays on (the graph's activations share one block). Its scan's
    stages of the output's shape and dtype took the output's arena slot, which turned the arena off."""
    cg = tg.from_onnx(post_processing(2, 5, 7, 6, 3)).compile()
    assert cg.arena.startswith("on"), cg.arena


# ---------------------------------------------------------------- Upsample (opsets 7-9) inside a model
def test_upsample_opset_9_followed_by_an_operator():
    """An Upsample another node reads keeps its asymmetric coordinates (onnx's converter renamed its output, and
    the Resize it became was not found by that name: half_pixel, a max error of 1.19)."""
    weights = {"scales": np.array([1, 1, 2, 3], np.float32)}
    nodes = [node("Upsample", ["x", "scales"], ["u"], mode="linear"), node("Relu", ["u"], ["y"])]
    model = make_model(nodes, [("x", [1, 1, 2, 2])], [("y", [1, 1, 4, 6])], weights, opset=9)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)    # the opset-9 model is converted (with a warning)
        _check(model, {"x": rand((1, 1, 2, 2), 4)})


# ---------------------------------------------------------------- the command line
@pytest.mark.parametrize("build", [
    lambda: unet_decoder(1, 4, 5, 7, 3),
    lambda: mobilenet_v3_block(1, 8, 9, 9, 16, 4, 8, 1, elem=F16),
    lambda: llama_layer(2, 7, 3, F16, opset=24, swish=True),
    lambda: post_processing(2, 5, 7, 6, 3),
], ids=["unet", "mobilenet_v3_f16", "llama_f16_past", "post_processing"])
def test_command_line_runs_the_models(build, tmp_path, capsys):
    """`python -m models run --onnx FILE`: built, timed and compared with onnxruntime by the command itself."""
    import onnx

    from models.cli import main
    path = tmp_path / "model.onnx"
    onnx.save(build(), str(path))
    assert main(["run", "--onnx", str(path), "--iters", "2", "--no-tune", "--target", "cpu"]) == 0
    out = capsys.readouterr().out
    assert "max error vs onnxruntime" in out and ", ok" in out and "MISMATCH" not in out
