"""Small models built with onnx.helper, imported with from_onnx and run on the cpu target, against onnxruntime."""
import numpy as np
import pytest
from onnx import TensorProto, helper

import taskdsl.graph as tg
from taskdsl.graph import passes

from . import assert_close, make_model, rand, run_onnxruntime

pytest.importorskip("onnxruntime")


def small_cnn(opset: int = 17):
    """Conv-BN-Relu-MaxPool, Conv(stride 2)-Relu, GlobalAveragePool, Flatten, Gemm (transB): a tiny classifier."""
    w = {"w1": rand((8, 3, 3, 3), 1, low=-0.5, high=0.5), "b1": rand((8,), 2),
         "scale": rand((8,), 3, low=0.5, high=1.5), "bias": rand((8,), 4), "mean": rand((8,), 5),
         "var": rand((8,), 6, low=0.5, high=2.0),
         "w2": rand((8, 8, 3, 3), 7, low=-0.3, high=0.3), "b2": rand((8,), 8),
         "fc_w": rand((10, 8), 9), "fc_b": rand((10,), 10)}
    nodes = [
        helper.make_node("Conv", ["x", "w1", "b1"], ["c1"], pads=[1, 1, 1, 1], kernel_shape=[3, 3]),
        helper.make_node("BatchNormalization", ["c1", "scale", "bias", "mean", "var"], ["bn"], epsilon=1e-5),
        helper.make_node("Relu", ["bn"], ["r1"]),
        helper.make_node("MaxPool", ["r1"], ["p1"], kernel_shape=[2, 2], strides=[2, 2]),
        helper.make_node("Conv", ["p1", "w2", "b2"], ["c2"], pads=[1, 1, 1, 1], strides=[2, 2]),
        helper.make_node("Relu", ["c2"], ["r2"]),
        helper.make_node("GlobalAveragePool", ["r2"], ["gap"]),
        helper.make_node("Flatten", ["gap"], ["flat"]),
        helper.make_node("Gemm", ["flat", "fc_w", "fc_b"], ["y"], transB=1),
    ]
    return make_model(nodes, [("x", [2, 3, 16, 16])], [("y", [2, 10])], w, opset=opset, name="cnn")


def transformer_block(opset: int = 20, heads: int = 2, seq: int = 8, dim: int = 16):
    """Pre-LN attention + MLP block: LayerNorm, MatMul/Add projections, Reshape/Transpose into heads,
    Softmax attention, Gelu MLP, residual Adds. The head reshape's target comes from Shape arithmetic."""
    dh = dim // heads
    w = {"ln1_w": rand((dim,), 1, low=0.5, high=1.5), "ln1_b": rand((dim,), 2, low=-0.1, high=0.1),
         "wq": rand((dim, dim), 3, low=-0.3, high=0.3), "bq": rand((dim,), 4, low=-0.1, high=0.1),
         "wk": rand((dim, dim), 5, low=-0.3, high=0.3), "bk": rand((dim,), 6, low=-0.1, high=0.1),
         "wv": rand((dim, dim), 7, low=-0.3, high=0.3), "bv": rand((dim,), 8, low=-0.1, high=0.1),
         "wo": rand((dim, dim), 9, low=-0.3, high=0.3), "bo": rand((dim,), 10, low=-0.1, high=0.1),
         "ln2_w": rand((dim,), 11, low=0.5, high=1.5), "ln2_b": rand((dim,), 12, low=-0.1, high=0.1),
         "w1": rand((dim, 4 * dim), 13, low=-0.3, high=0.3), "b1": rand((4 * dim,), 14, low=-0.1, high=0.1),
         "w2": rand((4 * dim, dim), 15, low=-0.3, high=0.3), "b2": rand((dim,), 16, low=-0.1, high=0.1),
         "scale": np.array(1.0 / np.sqrt(dh), np.float32), "heads_tail": np.array([heads, dh], np.int64),
         "zero": np.array([0], np.int64), "one": np.array([1], np.int64), "merged": np.array([0, 0, dim], np.int64)}
    n = helper.make_node
    nodes = [n("LayerNormalization", ["x", "ln1_w", "ln1_b"], ["h"], axis=-1, epsilon=1e-5),
             # (B, S) from Shape, then (B, S, heads, dh): folded into a constant target shape
             n("Shape", ["x"], ["x_shape"]), n("Gather", ["x_shape", "zero"], ["b_dim"]),
             n("Gather", ["x_shape", "one"], ["s_dim"]),
             n("Concat", ["b_dim", "s_dim", "heads_tail"], ["split_shape"], axis=0)]
    for p in "qkv":
        nodes += [n("MatMul", ["h", f"w{p}"], [f"{p}_mm"]), n("Add", [f"{p}_mm", f"b{p}"], [f"{p}_lin"]),
                  n("Reshape", [f"{p}_lin", "split_shape"], [f"{p}_4d"]),
                  n("Transpose", [f"{p}_4d"], [f"{p}_heads"], perm=[0, 2, 1, 3])]
    nodes += [n("Transpose", ["k_heads"], ["k_t"], perm=[0, 1, 3, 2]),
              n("MatMul", ["q_heads", "k_t"], ["scores"]), n("Mul", ["scores", "scale"], ["scaled"]),
              n("Softmax", ["scaled"], ["probs"], axis=-1), n("MatMul", ["probs", "v_heads"], ["ctx"]),
              n("Transpose", ["ctx"], ["ctx_t"], perm=[0, 2, 1, 3]), n("Reshape", ["ctx_t", "merged"], ["ctx_2d"]),
              n("MatMul", ["ctx_2d", "wo"], ["o_mm"]), n("Add", ["o_mm", "bo"], ["attn"]),
              n("Add", ["x", "attn"], ["res1"]),
              n("LayerNormalization", ["res1", "ln2_w", "ln2_b"], ["h2"], axis=-1, epsilon=1e-5),
              n("MatMul", ["h2", "w1"], ["f1_mm"]), n("Add", ["f1_mm", "b1"], ["f1"])]
    if opset >= 20:
        nodes.append(n("Gelu", ["f1"], ["act"]))
    else:   # the exporters' erf pattern: x * 0.5 * (1 + erf(x / sqrt(2)))
        w.update({"sqrt2": np.array(np.sqrt(2.0), np.float32), "half": np.array(0.5, np.float32),
                  "one_f": np.array(1.0, np.float32)})
        nodes += [n("Div", ["f1", "sqrt2"], ["g_div"]), n("Erf", ["g_div"], ["g_erf"]),
                  n("Add", ["g_erf", "one_f"], ["g_add"]), n("Mul", ["f1", "g_add"], ["g_mul"]),
                  n("Mul", ["g_mul", "half"], ["act"])]
    nodes += [n("MatMul", ["act", "w2"], ["f2_mm"]), n("Add", ["f2_mm", "b2"], ["mlp"]),
              n("Add", ["res1", "mlp"], ["y"])]
    return make_model(nodes, [("x", [2, seq, dim])], [("y", [2, seq, dim])], w, opset=opset, name="block")


def test_small_cnn_matches_onnxruntime():
    model = small_cnn()
    x = rand((2, 3, 16, 16), 42)
    g = tg.from_onnx(model)
    got, = g(x)                                   # compiled on first call
    want, = run_onnxruntime(model, {"x": x})
    assert_close(got, want, rtol=1e-4)
    assert_close(g.reference(x)[0], want, rtol=1e-4)   # the graph's numpy reference agrees too


@pytest.mark.parametrize("opset", [17, 20])
def test_transformer_block_matches_onnxruntime(opset):
    model = transformer_block(opset)
    x = rand((2, 8, 16), 7)
    g = tg.from_onnx(model)
    cg = g.compile()
    got, = cg({"x": x})
    want, = run_onnxruntime(model, {"x": x})
    assert_close(got, want, rtol=1e-4)
    kinds = [op.kind for op in g.nodes]
    assert "layer_norm" in kinds and "softmax" in kinds and kinds.count("matmul") == 8
    # Shape -> Gather -> Concat is folded: the head reshapes have constant targets and nothing else remains of it
    folded = passes.fold_constants(g)
    assert all(op.kind not in ("gather", "concat") for op in folded.nodes)


@pytest.mark.parametrize("opset", [11, 13])
def test_older_opsets(opset):
    """Reduce axes as attributes (opset < 13 / < 18), Split's 'split' attribute, Softmax's 2-d coercion (< 13)."""
    n = helper.make_node
    split = {"split": [2, 4]} if opset < 13 else {}
    split_inputs = ["x"] if opset < 13 else ["x", "sizes"]
    nodes = [n("Split", split_inputs, ["a", "b"], axis=1, **split),
             n("ReduceMean", ["b"], ["m"], axes=[1], keepdims=1),
             n("Sub", ["b", "m"], ["c"]),
             n("Softmax", ["c"], ["s"], axis=1),
             n("Unsqueeze", ["s"] if opset < 13 else ["s", "ax"], ["u"], **({"axes": [0]} if opset < 13 else {})),
             n("Squeeze", ["u"] if opset < 13 else ["u", "ax"], ["y"], **({"axes": [0]} if opset < 13 else {}))]
    inits = {} if opset < 13 else {"sizes": np.array([2, 4], np.int64), "ax": np.array([0], np.int64)}
    model = make_model(nodes, [("x", [3, 6])], [("a", [3, 2]), ("y", [3, 4])], inits, opset=opset)
    x = rand((3, 6), opset)
    got = tg.from_onnx(model)(x)
    want = run_onnxruntime(model, {"x": x})
    for g_, w_ in zip(got, want):
        assert_close(g_, w_, rtol=1e-5)


def test_integer_and_bool_paths():
    """Where / Equal / Cast / integer Div (truncating) / Expand / ConstantOfShape / Range, against onnxruntime."""
    n = helper.make_node
    nodes = [n("Div", ["i", "d"], ["q"]),
             n("Equal", ["q", "zero"], ["is_zero"]),
             n("Cast", ["q"], ["qf"], to=TensorProto.FLOAT),
             n("Where", ["is_zero", "f", "qf"], ["w"]),
             n("Range", ["start", "limit", "delta"], ["r"]),
             n("Cast", ["r"], ["rf"], to=TensorProto.FLOAT),
             n("Add", ["w", "rf"], ["y"]),
             n("ConstantOfShape", ["shape"], ["ones"], value=helper.make_tensor("v", TensorProto.FLOAT, [1], [1.0])),
             n("Expand", ["y", "shape"], ["e"]),
             n("Mul", ["e", "ones"], ["z"])]
    inits = {"d": np.array([3, -2, 5, 7], np.int32), "zero": np.array(0, np.int32),
             "start": np.array(1, np.int64), "limit": np.array(9, np.int64), "delta": np.array(2, np.int64),
             "shape": np.array([2, 4], np.int64)}
    model = make_model(nodes, [("i", [4], TensorProto.INT32), ("f", [4])],
                       [("z", [2, 4]), ("q", [4], TensorProto.INT32)], inits)
    feeds = {"i": np.array([-7, 7, 3, -1], np.int32), "f": rand((4,), 3)}
    got = tg.from_onnx(model)(feeds)
    want = run_onnxruntime(model, feeds)
    for g_, w_ in zip(got, want):
        assert_close(g_, w_, rtol=1e-6)


@pytest.mark.parametrize("op_type", ["LayerNormalization", "RMSNormalization"])
@pytest.mark.parametrize("axis, scale_shape, bias_shape", [(-1, (3, 4, 5), (5,)), (2, (2, 1, 4, 5), None),
                                                           (-2, (4, 5), (3, 1, 1))])
def test_normalization_scale_over_more_axes(op_type, axis, scale_shape, bias_shape):
    """LayerNormalization's Scale and B (RMSNormalization's Scale: opset 23) broadcast with Y as the definition's
    Mul and Add do: they may span axes before `axis` (per-row parameters), as onnxruntime accepts."""
    x_shape, rms = (2, 3, 4, 5), op_type == "RMSNormalization"
    params = {"s": rand(scale_shape, 2)} | ({"b": rand(bias_shape, 3)} if bias_shape and not rms else {})
    node = helper.make_node(op_type, ["x", *params], ["y"], axis=axis)
    model = make_model([node], [("x", list(x_shape))], [("y", list(x_shape))], params, opset=23 if rms else 17)
    x = rand(x_shape, 1)
    assert_close(tg.from_onnx(model)(x)[0], run_onnxruntime(model, {"x": x})[0], rtol=1e-5, atol=1e-5)


def test_rms_normalization_of_f16_keeps_f32_statistics():
    """RMSNormalization of f16 with stash_type 1 squares and averages in f32: rows of 300 would overflow f16's
    x * x; the result is f16, as onnxruntime's."""
    x = (rand((3, 64), 1) * 300).astype(np.float16)
    scale = rand((64,), 2).astype(np.float16)
    node = helper.make_node("RMSNormalization", ["x", "s"], ["y"], epsilon=1e-3)
    model = make_model([node], [("x", [3, 64], TensorProto.FLOAT16)], [("y", [3, 64], TensorProto.FLOAT16)],
                       {"s": scale}, opset=23)
    got, want = tg.from_onnx(model)(x)[0], run_onnxruntime(model, {"x": x})[0]
    assert got.dtype == np.float16 and np.isfinite(got).all()
    assert_close(got.astype(np.float32), want.astype(np.float32), rtol=2e-3, atol=2e-3)


@pytest.mark.parametrize("mode", ["constant", "edge", "reflect", "wrap"])
def test_pad_with_negative_pads_crops_first(mode):
    """Negative pads crop; the positive ones then pad what is left (so `wrap` wraps the cropped axis)."""
    pads = np.array([-1, 2, 0, 2, -2, -1], np.int64)            # begins (axes 0, 1, 2), then ends
    node = helper.make_node("Pad", ["x", "pads"], ["y"], mode=mode)
    model = make_model([node], [("x", [4, 5, 6])], [("y", [4 - 1 + 2, 5 + 2 - 2, 6 - 1])], {"pads": pads},
                       opset=19)
    x = rand((4, 5, 6), 1)
    assert_close(tg.from_onnx(model)(x)[0], run_onnxruntime(model, {"x": x})[0], rtol=0, atol=0)


@pytest.mark.parametrize("elem", [TensorProto.FLOAT, TensorProto.INT32])
def test_pad_by_a_value_computed_at_run_time(elem):
    """Pad's constant_value from the graph (the input's max), with negative pads cropping too."""
    reduce = helper.make_node("ReduceMax", ["x"], ["m"], keepdims=0)
    node = helper.make_node("Pad", ["x", "pads", "m"], ["y"], mode="constant")
    pads = np.array([0, 1, -2, 1, 0, 3], np.int64)
    model = make_model([reduce, node], [("x", [2, 3, 5], elem)], [("y", [3, 4, 6], elem)], {"pads": pads},
                       opset=18)
    x = rand((2, 3, 5), 3, np.int32 if elem == TensorProto.INT32 else np.float32, low=-9, high=9)
    assert_close(tg.from_onnx(model)(x)[0], run_onnxruntime(model, {"x": x})[0], rtol=0, atol=0)


@pytest.mark.parametrize("upper", [0, 1])
@pytest.mark.parametrize("k, shape, elem", [(None, (5, 5), TensorProto.FLOAT), (2, (2, 3, 7), TensorProto.FLOAT),
                                            (-1, (1, 6, 4), TensorProto.INT32), (-9, (3, 4), TensorProto.FLOAT)])
def test_trilu(upper, k, shape, elem):
    """Trilu (torch.tril / triu exports it): the triangle of the last two axes above or below diagonal k, at
    rectangular, batched and integer shapes; a k past every diagonal keeps all (lower) or nothing (upper)."""
    inputs = ["x"] if k is None else ["x", "k"]
    node = helper.make_node("Trilu", inputs, ["y"], upper=upper)
    inits = {} if k is None else {"k": np.array(k, np.int64)}
    model = make_model([node], [("x", list(shape), elem)], [("y", list(shape), elem)], inits, opset=14)
    x = rand(shape, 1, np.int32 if elem == TensorProto.INT32 else np.float32, low=-9, high=9)
    assert_close(tg.from_onnx(model)(x)[0], run_onnxruntime(model, {"x": x})[0], rtol=0, atol=0)


def test_log_sum_exp_of_infinite_rows():
    """A row holding +inf gives inf, a row of -inf (a fully masked one) -inf, as onnxruntime: not NaN."""
    node = helper.make_node("ReduceLogSumExp", ["x"], ["y"], axes=[1], keepdims=0)
    model = make_model([node], [("x", [4, 3])], [("y", [4])], opset=13)
    x = np.array([[np.inf, 1, 2], [-np.inf] * 3, [1, -np.inf, 3], [80, 90, 100]], np.float32)
    got, want = tg.from_onnx(model)(x)[0], run_onnxruntime(model, {"x": x})[0]
    assert_close(got, want, rtol=1e-6)
    assert got[0] == np.inf and got[1] == -np.inf


@pytest.mark.parametrize("op_type", ["ReduceL2", "ReduceLogSum", "ReduceLogSumExp"])
@pytest.mark.parametrize("elem, dtype", [(TensorProto.INT32, np.int32), (TensorProto.INT64, np.int64)])
def test_floating_reductions_of_integers(op_type, elem, dtype):
    """The schema allows integer inputs: computed in floats and truncated back to the input type."""
    node = helper.make_node(op_type, ["x"], ["y"], axes=[1], keepdims=1)
    model = make_model([node], [("x", [3, 4], elem)], [("y", [3, 1], elem)], opset=13)
    x = np.array([[3, 4, 0, 1], [1, 1, 1, 1], [2, 7, 5, 9]], dtype)
    assert_close(tg.from_onnx(model)(x)[0], run_onnxruntime(model, {"x": x})[0])


def test_slice_with_a_negative_step_from_before_the_axis():
    """ONNX clamps a negative step's start to [0, n - 1]: start -100, step -1 takes x[0] (Python's slicing, and
    taskdsl before, took nothing)."""
    inits = {"s": np.array([-100], np.int64), "e": np.array([np.iinfo(np.int64).min], np.int64),
             "a": np.array([0], np.int64), "st": np.array([-1], np.int64)}
    node = helper.make_node("Slice", ["x", "s", "e", "a", "st"], ["y"])
    model = make_model([node], [("x", [5, 6])], [("y", [1, 6])], inits, opset=13)
    x = rand((5, 6), 1)
    assert_close(tg.from_onnx(model)(x)[0], run_onnxruntime(model, {"x": x})[0], rtol=0, atol=0)


@pytest.mark.parametrize("op_type", ["ReduceL1", "ReduceL2", "ReduceSumSquare", "ReduceLogSum", "ReduceMean"])
def test_reductions_over_no_axis_still_map_each_element(op_type):
    """noop_with_empty_axes=1 without axes reduces nothing, but |x|, x^2 and log x still apply (x was returned)."""
    node = helper.make_node(op_type, ["x"], ["y"], noop_with_empty_axes=1)
    model = make_model([node], [("x", [2, 3])], [("y", [2, 3])], opset=18)
    x = rand((2, 3), 2, low=0.25, high=3.0) * np.array([1, -1, 1], np.float32)
    if op_type == "ReduceLogSum":
        x = np.abs(x)
    assert_close(tg.from_onnx(model)(x)[0], run_onnxruntime(model, {"x": x})[0], rtol=1e-6)


@pytest.mark.parametrize("elem, dtype, base", [(TensorProto.INT32, np.int32, 2**29),
                                               (TensorProto.INT64, np.int64, 2**40),
                                               (TensorProto.INT64, np.int64, 2**62)])
def test_integer_means_are_exact(elem, dtype, base):
    """An integer mean was accumulated in f32 (2**29 + 2.33 came out 2**29): now summed in i64, divided once.
    64-bit ones sum in f64, as onnxruntime's: exact to 2**53, and sums past 2**63 (2**62 + 2**62) do not wrap."""
    node = helper.make_node("ReduceMean", ["x"], ["y"], axes=[1])
    model = make_model([node], [("x", [2, 3], elem)], [("y", [2, 1], elem)], opset=13)
    x = np.array([[base + 1, base + 2, base + 4], [-base - 1, -base - 2, -base - 4]], dtype)
    assert_close(tg.from_onnx(model)(x)[0], run_onnxruntime(model, {"x": x})[0], rtol=0, atol=0)


@pytest.mark.parametrize("bounds", [[], ["lo"], ["", "hi"]])
def test_clip_bounds_left_out_are_the_largest_finite_values(bounds):
    """Clip's missing min / max default to the type's lowest / highest finite value: +-inf become +-FLT_MAX."""
    node = helper.make_node("Clip", ["x"] + bounds, ["y"])
    inits = {"lo": np.array(-2, np.float32), "hi": np.array(2, np.float32)}
    model = make_model([node], [("x", [5])], [("y", [5])], {k: v for k, v in inits.items() if k in bounds}, opset=13)
    x = np.array([-np.inf, -1.0, 0.5, 3.0, np.inf], np.float32)
    assert_close(tg.from_onnx(model)(x)[0], run_onnxruntime(model, {"x": x})[0], rtol=0, atol=0)
