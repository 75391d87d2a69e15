"""Attention (opsets 23-25) and RotaryEmbedding (opset 23) imported from one-node ONNX models and checked against
onnxruntime, with hypothesis drawing shapes (odd and prime sequence lengths, one head, one query, grouped-query head
ratios) and attributes (is_causal, scale, softcap, bool and float masks, past key / value, windows,
nonpad_kv_seqlen, 3-D and 4-D inputs; interleaved and partial rotations, position_ids), in f32 and f16; then
projections -> Attention -> projection compiled with the default passes (fusion on). Every kernel is also compiled
by NVRTC (tests/conftest.py)."""
import numpy as np
import onnx
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from onnx import TensorProto, helper

import taskdsl.graph as tg
from taskdsl.graph import OnnxImportError
from taskdsl.graph.fusion import FusedAnchor
from taskdsl.graph.onnx_import import ConstantRequiredError, UnsupportedOnnxError

from . import assert_close, make_model, rand, run_onnxruntime

pytest.importorskip("onnxruntime")

n = helper.make_node
F32, F16, BOOL, I32, I64 = (TensorProto.FLOAT, TensorProto.FLOAT16, TensorProto.BOOL, TensorProto.INT32,
                            TensorProto.INT64)
NUMPY = {F32: np.float32, F16: np.float16, I32: np.int32}
# f16 results are rounded once from f32 here; onnxruntime's may differ from them by an ulp
TOLERANCE = {F32: {"rtol": 1e-4, "atol": 1e-5}, F16: {"rtol": 1e-2, "atol": 1e-2}}
EXAMPLES = settings(max_examples=5, deadline=None, suppress_health_check=[HealthCheck.too_slow])
SEQUENCES = st.sampled_from([1, 2, 3, 5, 7])
HEAD_SIZES = st.sampled_from([1, 2, 4, 5, 8])
OUTPUTS = ["Y", "present_key", "present_value", "qk_matmul_output"]


def run_taskdsl(model: onnx.ModelProto, feeds: dict, constants: dict | None = None) -> list:
    """The outputs of `model` imported (`constants` fixing inputs at import) and run on `feeds`."""
    graph = tg.from_onnx(model, constants=constants or {})
    got = graph(*(feeds[t.name] for t in graph.inputs))
    return list(got) if isinstance(got, (list, tuple)) else [got]


def check(model: onnx.ModelProto, feeds: dict, dtype: int, constants: dict | None = None) -> None:
    """Every output of `model` computed by taskdsl equals onnxruntime's (whose masked scores in qk_matmul_output,
    -inf by the definition, are the lowest finite float)."""
    want = run_onnxruntime(model, feeds)
    for got, expected in zip(run_taskdsl(model, feeds, constants), want, strict=True):
        masked = np.finfo(expected.dtype).min
        assert_close(got, np.where(expected == masked, -np.inf, expected).astype(expected.dtype), **TOLERANCE[dtype])


def attention_model(inputs: dict, dtype: int, outputs: int = 1, opset: int = 23, **attrs) -> onnx.ModelProto:
    """A one-node Attention model: `inputs` maps the node's input names (Q, K, V, attn_mask, past_key, past_value,
    nonpad_kv_seqlen; absent ones left out) to their (shape, element type); its first `outputs` outputs."""
    names = ["Q", "K", "V", "attn_mask", "past_key", "past_value", "nonpad_kv_seqlen"]
    used = [name if name in inputs else "" for name in names]
    while not used[-1]:
        used.pop()
    wanted = OUTPUTS[:outputs]
    node = n("Attention", used, wanted, **attrs)
    return make_model([node], [(name, list(shape), t) for name, (shape, t) in inputs.items()],
                      [(name, [None] * (4 if name != "Y" else len(inputs["Q"][0])), dtype) for name in wanted],
                      opset=opset)


def feeds_for(inputs: dict, seed: int = 0) -> dict:
    """Random values for the float and int32 inputs, a random bool mask (of 2 axes or more: its first row all False,
    a fully-masked row)."""
    feeds = {}
    for k, (name, (shape, t)) in enumerate(inputs.items()):
        if t == BOOL:
            mask = rand(shape, seed + k, np.bool_)
            if len(shape) > 1:
                mask[..., 0, :] = False
            feeds[name] = mask
        elif t != I64:
            feeds[name] = rand(shape, seed + k, NUMPY[t])
    return feeds


# ---------------------------------------------------------------- Attention, 4-D
@EXAMPLES
@given(batch=st.sampled_from([1, 2]), kv_heads=st.sampled_from([1, 2, 3]), group=st.sampled_from([1, 2, 3]),
       queries=SEQUENCES, keys=SEQUENCES, head=HEAD_SIZES, v_head=HEAD_SIZES, past=st.sampled_from([0, 0, 1, 3]),
       causal=st.booleans(), mask=st.sampled_from([None, "bool", "float"]),
       mask_shape=st.sampled_from(["2d", "heads", "batch", "4d"]), scale=st.sampled_from([None, 0.3]),
       softcap=st.sampled_from([0.0, 1.5]), mode=st.sampled_from([None, 0, 1, 2, 3]), dtype=st.sampled_from([F32, F16]))
def test_attention_4d(batch, kv_heads, group, queries, keys, head, v_head, past, causal, mask, mask_shape, scale,
                      softcap, mode, dtype):
    # new keys as many as the queries, else onnxruntime departs (test_attention_causal_offset_is_the_past_length)
    keys = queries if past and causal else keys
    heads, total = kv_heads * group, past + keys
    inputs = {"Q": ((batch, heads, queries, head), dtype), "K": ((batch, kv_heads, keys, head), dtype),
              "V": ((batch, kv_heads, keys, v_head), dtype)}
    if mask is not None:
        shape = {"2d": (queries, total), "heads": (heads, queries, total), "batch": (batch, 1, queries, total),
                 "4d": (batch, heads, queries, total)}[mask_shape]
        inputs["attn_mask"] = (shape, BOOL if mask == "bool" else dtype)
    if past:
        inputs["past_key"] = ((batch, kv_heads, past, head), dtype)
        inputs["past_value"] = ((batch, kv_heads, past, v_head), dtype)
    attrs = {"is_causal": int(causal), "softcap": softcap, **({} if scale is None else {"scale": scale}),
             **({} if mode is None else {"qk_matmul_output_mode": mode})}
    model = attention_model(inputs, dtype, 4 if mode is not None else 3 if past else 1, **attrs)
    check(model, feeds_for(inputs), dtype)


# ---------------------------------------------------------------- Attention, 3-D
@EXAMPLES
@given(batch=st.sampled_from([1, 2]), kv_heads=st.sampled_from([1, 2]), group=st.sampled_from([1, 3]),
       queries=SEQUENCES, keys=SEQUENCES, head=HEAD_SIZES, v_head=HEAD_SIZES, past=st.sampled_from([0, 2]),
       causal=st.booleans(), float_mask=st.booleans(), dtype=st.sampled_from([F32, F16]))
def test_attention_3d(batch, kv_heads, group, queries, keys, head, v_head, past, causal, float_mask, dtype):
    """(batch, sequence, heads * head size) inputs split by q_num_heads / kv_num_heads (the past cache stays 4-D)."""
    # new keys as many as the queries, else onnxruntime departs (test_attention_causal_offset_is_the_past_length)
    keys = queries if past and causal else keys
    heads, total = kv_heads * group, past + keys
    inputs = {"Q": ((batch, queries, heads * head), dtype), "K": ((batch, keys, kv_heads * head), dtype),
              "V": ((batch, keys, kv_heads * v_head), dtype)}
    if float_mask:
        inputs["attn_mask"] = ((queries, total), dtype)
    if past:
        inputs["past_key"] = ((batch, kv_heads, past, head), dtype)
        inputs["past_value"] = ((batch, kv_heads, past, v_head), dtype)
    model = attention_model(inputs, dtype, 3 if past else 1, is_causal=int(causal), q_num_heads=heads,
                            kv_num_heads=kv_heads)
    check(model, feeds_for(inputs, 7), dtype)


# ---------------------------------------------------------------- opsets 24 and 25: nonpad_kv_seqlen, windows
@EXAMPLES
@given(queries=SEQUENCES, keys=SEQUENCES, left=st.sampled_from([-1, 0, 1, 3]), right=st.sampled_from([-1, 0, 2]),
       causal=st.booleans(), past=st.sampled_from([0, 2]), dtype=st.sampled_from([F32, F16]))
def test_attention_sliding_windows(queries, keys, left, right, causal, past, dtype):
    """Opset 25's left / right windows around each query's position (after the past keys), with is_causal."""
    # new keys as many as the queries, else onnxruntime departs (test_attention_causal_offset_is_the_past_length)
    keys = queries if past else keys
    inputs = {"Q": ((2, 2, queries, 4), dtype), "K": ((2, 1, keys, 4), dtype), "V": ((2, 1, keys, 3), dtype)}
    if past:
        inputs["past_key"], inputs["past_value"] = ((2, 1, past, 4), dtype), ((2, 1, past, 3), dtype)
    model = attention_model(inputs, dtype, 3 if past else 1, opset=25, is_causal=int(causal), left_window_size=left,
                            right_window_size=right)
    check(model, feeds_for(inputs, 3), dtype)


@EXAMPLES
@given(queries=SEQUENCES, keys=SEQUENCES, data=st.data(), causal=st.booleans(), bool_mask=st.booleans(),
       dtype=st.sampled_from([F32, F16]))
def test_attention_nonpad_kv_seqlen(queries, keys, data, causal, bool_mask, dtype):
    """Opset 24's count of valid keys per batch (an external cache), a constant: the keys past it are masked, and
    is_causal aligns each query with the end of its valid keys (the leading queries of a batch with fewer valid keys
    than queries attend none: zeros)."""
    counts = np.array(data.draw(st.lists(st.integers(0, keys), min_size=3, max_size=3)), np.int64)
    inputs = {"Q": ((3, 2, queries, 4), dtype), "K": ((3, 2, keys, 4), dtype), "V": ((3, 2, keys, 4), dtype),
              "attn_mask": ((1, queries, keys), BOOL if bool_mask else dtype), "nonpad_kv_seqlen": ((3,), I64)}
    model = attention_model(inputs, dtype, opset=24, is_causal=int(causal))
    feeds = {**feeds_for(inputs, 5), "nonpad_kv_seqlen": counts}
    check(model, feeds, dtype, constants={"nonpad_kv_seqlen": counts})


def test_attention_causal_offset_is_the_past_length():
    """With a past cache, query i attends keys j <= i + the cache's length, also where the new keys outnumber the
    queries: checked against onnx's reference (onnxruntime lets a single query attend every key then)."""
    from onnx.reference import ReferenceEvaluator
    inputs = {"Q": ((1, 2, 1, 4), F32), "K": ((1, 2, 3, 4), F32), "V": ((1, 2, 3, 4), F32),
              "past_key": ((1, 2, 2, 4), F32), "past_value": ((1, 2, 2, 4), F32)}
    model = attention_model(inputs, F32, 3, is_causal=1)
    feeds = feeds_for(inputs, 17)
    for got, want in zip(run_taskdsl(model, feeds), ReferenceEvaluator(model).run(None, feeds), strict=True):
        assert_close(got, want, **TOLERANCE[F32])


@pytest.mark.parametrize("precision, oracle", [(TensorProto.DOUBLE, "onnxruntime"), (TensorProto.FLOAT16, "onnx")])
def test_attention_softmax_precision(precision, oracle):
    """softmax_precision casts the scores to its type for the softmax (and its mode-3 output back to T1);
    onnxruntime computes an f32 softmax whatever the precision: an f16 one is checked against onnx's reference
    (which rounds each step of its softmax to f16, where taskdsl rounds the probabilities once)."""
    inputs = {"Q": ((1, 2, 5, 4), F32), "K": ((1, 2, 7, 4), F32), "V": ((1, 2, 7, 4), F32),
              "attn_mask": ((5, 7), BOOL)}
    model = attention_model(inputs, F32, 4, opset=24, softmax_precision=precision, qk_matmul_output_mode=3)
    feeds = feeds_for(inputs, 9)
    if oracle == "onnxruntime":
        return check(model, feeds, F32)
    from onnx.reference import ReferenceEvaluator
    for g, w in zip(run_taskdsl(model, feeds), ReferenceEvaluator(model).run(None, feeds), strict=True):
        assert_close(g, w, rtol=2e-3, atol=2e-3)


@pytest.mark.parametrize("mask_shape, mask_type, opset, causal", [
    ((5, 7), I32, 23, 0), ((7,), BOOL, 23, 0), ((2, 1, 5, 4), F32, 24, 1), ((5, 3), BOOL, 24, 1)])
def test_attention_mask_forms(mask_shape, mask_type, opset, causal):
    """An integer mask (added, as a float one: onnxruntime agrees without is_causal, and with it gives values no
    reading of the mask explains), a mask of one axis, and from opset 24 a mask shorter than the keys (padded: the
    keys past it masked); onnxruntime refuses the last two, which are checked against onnx's reference."""
    inputs = {"Q": ((2, 2, 5, 4), F32), "K": ((2, 2, 7, 4), F32), "V": ((2, 2, 7, 4), F32),
              "attn_mask": (mask_shape, mask_type)}
    model = attention_model(inputs, F32, opset=opset, is_causal=causal)
    feeds = feeds_for(inputs, 13)
    if len(mask_shape) > 1 and mask_shape[-1] == 7:
        return check(model, feeds, F32)
    from onnx.reference import ReferenceEvaluator
    for got, want in zip(run_taskdsl(model, feeds), ReferenceEvaluator(model).run(None, feeds), strict=True):
        assert_close(got, want, **TOLERANCE[F32])


def test_attention_fully_masked_rows_are_zeros_not_nan():
    """A query row whose keys are all masked (an all-False bool row, an all -inf float row) gives zeros, in Y and
    the mode-3 probabilities, as the definition says and onnxruntime gives."""
    for t in (BOOL, F32):
        inputs = {"Q": ((1, 1, 3, 4), F32), "K": ((1, 1, 5, 4), F32), "V": ((1, 1, 5, 4), F32),
                  "attn_mask": ((3, 5), t)}
        model = attention_model(inputs, F32, 4, qk_matmul_output_mode=3)
        feeds = feeds_for(inputs, 11)
        feeds["attn_mask"] = np.array([[1, 1, 0, 0, 1], [0] * 5, [1] * 5], bool)
        if t == F32:
            feeds["attn_mask"] = np.where(feeds["attn_mask"], 0.0, -np.inf).astype(np.float32)
        y, _, _, probabilities = run_taskdsl(model, feeds)
        assert not np.isnan(y).any() and (y[0, 0, 1] == 0).all() and (probabilities[0, 0, 1] == 0).all()
        check(model, feeds, F32)


def test_bfloat16_attention_is_computed_in_f32_and_rounded_once():
    """bf16 Q, K, V (causal): within a bf16 unit of onnxruntime's f32 attention of the same values, rounded."""
    import ml_dtypes
    shape = (1, 2, 5, 8)
    feeds = {name: rand(shape, seed).astype(ml_dtypes.bfloat16) for seed, name in enumerate("QKV")}
    model = attention_model({name: (shape, TensorProto.BFLOAT16) for name in "QKV"}, TensorProto.BFLOAT16,
                            is_causal=1)
    wide = attention_model({name: (shape, F32) for name in "QKV"}, F32, is_causal=1)
    got = run_taskdsl(model, feeds)[0]
    want = run_onnxruntime(wide, {name: x.astype(np.float32) for name, x in feeds.items()})[0]
    assert got.dtype == ml_dtypes.bfloat16
    np.testing.assert_allclose(got.astype(np.float32), want.astype(ml_dtypes.bfloat16).astype(np.float32),
                               rtol=float(ml_dtypes.finfo(ml_dtypes.bfloat16).eps), atol=1e-6)


# ---------------------------------------------------------------- Attention: what is refused
def _simple(dtype: int = F32, **attrs) -> onnx.ModelProto:
    inputs = {"Q": ((1, 2, 3, 4), dtype), "K": ((1, 2, 3, 4), dtype), "V": ((1, 2, 3, 4), dtype)}
    return attention_model(inputs, dtype, **attrs)


@pytest.mark.parametrize("model, match, error", [
    (_simple(qk_matmul_output_mode=4), r"qk_matmul_output_mode=4 is not supported", UnsupportedOnnxError),
    (_simple(softmax_precision=TensorProto.INT32), r"softmax_precision=6 is not one of", OnnxImportError),
    (_simple(q_num_heads=3, kv_num_heads=2), r"q_num_heads=3 but the 4-D input has 2 heads", OnnxImportError),
    (attention_model({"Q": ((1, 1, 3, 4), F32), "K": ((1, 1, 3, 4), F32), "V": ((1, 1, 3, 4), F32),
                      "attn_mask": ((2, 3, 3), F32)}, F32),
     r"attn_mask of shape \(2, 3, 3\) does not broadcast to the scores' .* \(1, 1, 3, 3\)", OnnxImportError),
    (_simple(opset=25, left_window_size=-2), r"left_window_size=-2 .* must be -1", OnnxImportError),
    (attention_model({"Q": ((1, 3, 8), F32), "K": ((1, 3, 8), F32), "V": ((1, 3, 8), F32)}, F32),
     r"3-D Q, K and V need the q_num_heads and kv_num_heads", OnnxImportError),
    (attention_model({"Q": ((1, 3, 3, 4), F32), "K": ((1, 2, 3, 4), F32), "V": ((1, 2, 3, 4), F32)}, F32),
     r"Q's heads a multiple of K's", OnnxImportError),
    (attention_model({"Q": ((1, 2, 3, 4), F32), "K": ((1, 2, 3, 4), F32), "V": ((1, 2, 3, 4), F32),
                      "past_key": ((1, 2, 2, 4), F32)}, F32),
     r"past_key and past_value must be given together", OnnxImportError),
])
def test_attention_refuses(model, match, error):
    with pytest.raises(error, match=match):
        tg.from_onnx(model)


def test_attention_nonpad_kv_seqlen_must_be_a_constant():
    inputs = {"Q": ((2, 1, 3, 4), F32), "K": ((2, 1, 3, 4), F32), "V": ((2, 1, 3, 4), F32),
              "nonpad_kv_seqlen": ((2,), I64)}
    with pytest.raises(ConstantRequiredError, match=r"'nonpad_kv_seqlen' must be a constant"):
        tg.from_onnx(attention_model(inputs, F32, opset=24))
    with pytest.raises(OnnxImportError, match=r"nonpad_kv_seqlen \[1, 4\] must give one count in 0..3"):
        tg.from_onnx(attention_model(inputs, F32, opset=24), constants={"nonpad_kv_seqlen": np.array([1, 4])})


# ---------------------------------------------------------------- RotaryEmbedding
@EXAMPLES
@given(batch=st.sampled_from([1, 2]), heads=st.sampled_from([1, 3]), seq=SEQUENCES,
       half_head=st.sampled_from([1, 2, 3, 4]), data=st.data(), interleaved=st.booleans(),
       three_d=st.booleans(), position_ids=st.booleans(), dtype=st.sampled_from([F32, F16]))
def test_rotary_embedding(batch, heads, seq, half_head, data, interleaved, three_d, position_ids, dtype):
    head = 2 * half_head + data.draw(st.sampled_from([0, 0, 1]))     # an odd head size with a partial rotation
    dim = 2 * data.draw(st.integers(1, half_head))
    partial = dim < head or data.draw(st.booleans())
    shape = (batch, seq, heads * head) if three_d else (batch, heads, seq, head)
    cache = (11, dim // 2) if position_ids else (batch, seq, dim // 2)
    inputs = [("x", list(shape), dtype), ("cos", list(cache), dtype), ("sin", list(cache), dtype)]
    rng = np.random.default_rng(seq)
    angles = rng.uniform(0, 2 * np.pi, cache)
    feeds = {"x": rand(shape, 1, NUMPY[dtype]), "cos": np.cos(angles).astype(NUMPY[dtype]),
             "sin": np.sin(angles).astype(NUMPY[dtype])}
    if position_ids:
        inputs.append(("pos", [batch, seq], I64))
        feeds["pos"] = rng.integers(0, 11, (batch, seq)).astype(np.int64)
    attrs = {"interleaved": int(interleaved), **({"num_heads": heads} if three_d else {}),
             **({"rotary_embedding_dim": dim} if partial else {})}
    node = n("RotaryEmbedding", [name for name, *_ in inputs], ["y"], **attrs)
    model = make_model([node], inputs, [("y", list(shape), dtype)], opset=23)
    check(model, feeds, dtype)


@pytest.mark.parametrize("attrs, cache, match", [
    ({"rotary_embedding_dim": 3}, (2, 3, 1), r"rotary_embedding_dim=3 must be even"),
    ({}, (2, 3, 3), r"must be \(batch, sequence, rotary_embedding_dim / 2\) = \(2, 3, 2\), got \(2, 3, 3\)"),
])
def test_rotary_embedding_refuses(attrs, cache, match):
    inputs = [("x", [2, 1, 3, 4]), ("cos", list(cache)), ("sin", list(cache))]
    model = make_model([n("RotaryEmbedding", ["x", "cos", "sin"], ["y"], **attrs)], inputs, [("y", [2, 1, 3, 4])],
                       opset=23)
    with pytest.raises(OnnxImportError, match=match):
        tg.from_onnx(model)


# ---------------------------------------------------------------- in a model, fused
def test_projections_attention_projection_fused():
    """x -> Q, K, V projections (MatMul) -> rotary embedding of Q and K -> causal grouped-query Attention (3-D) ->
    output projection, compiled with the default passes: the scale and the causal bias fuse into the scores'
    matmul."""
    batch, seq, width, heads, kv_heads = 2, 5, 16, 4, 2
    head = width // heads
    angles = rand((seq, head // 2), 20, low=0.0, high=6.0)
    inits = {"wq": rand((width, width), 21, low=-0.5, high=0.5),
             "wk": rand((width, kv_heads * head), 22, low=-0.5, high=0.5),
             "wv": rand((width, kv_heads * head), 23, low=-0.5, high=0.5),
             "wo": rand((width, width), 24, low=-0.5, high=0.5),
             "cos": np.cos(angles), "sin": np.sin(angles), "pos": np.tile(np.arange(seq), (batch, 1))}
    nodes = [n("MatMul", ["x", "wq"], ["q"]), n("MatMul", ["x", "wk"], ["k"]), n("MatMul", ["x", "wv"], ["v"]),
             n("RotaryEmbedding", ["q", "cos", "sin", "pos"], ["q_rot"], num_heads=heads),
             n("RotaryEmbedding", ["k", "cos", "sin", "pos"], ["k_rot"], num_heads=kv_heads),
             n("Attention", ["q_rot", "k_rot", "v"], ["attended"], is_causal=1, q_num_heads=heads,
               kv_num_heads=kv_heads),
             n("MatMul", ["attended", "wo"], ["y"])]
    model = make_model(nodes, [("x", [batch, seq, width])], [("y", [batch, seq, width])], inits, opset=23)
    x = rand((batch, seq, width), 25)
    compiled = tg.from_onnx(model).compile()
    epilogues = [op.attrs["epilogue"] for op in compiled.graph.nodes if isinstance(op, FusedAnchor)]
    assert ("reshape", "mul", "add") in epilogues      # the scores' matmul: its head groups, the scale, the bias
    assert_close(compiled(x)[0], run_onnxruntime(model, {"x": x})[0], rtol=1e-4, atol=1e-5)
