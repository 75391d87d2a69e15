"""export_onnx on operators the zoo does not use, checked by onnxruntime against the graph's numpy reference
(nothing is compiled: these tests are fast)."""
import numpy as np
import pytest

import taskdsl.graph as tg
from models import OnnxExportError, export_onnx
from models.inference import onnxruntime_outputs, relative_error
from taskdsl.graph import ops

pytest.importorskip("onnxruntime")
rng = np.random.default_rng(0)


def const(*shape, low=-1.0, high=1.0):
    return tg.constant(rng.uniform(low, high, shape).astype(np.float32))


def check(graph: tg.Graph, feeds: dict, rtol: float = 1e-5) -> None:
    """onnxruntime on the exported graph, and the graph read back with from_onnx, agree with the reference."""
    proto = export_onnx(graph)
    want = graph.reference(feeds)
    got = onnxruntime_outputs(proto, feeds)
    assert got is not None, "onnxruntime could not run the exported model"
    assert [g.dtype for g in got] == [w.dtype for w in want]
    assert relative_error(got, want) < rtol
    assert relative_error(tg.from_onnx(proto).reference(feeds), want) < rtol


def test_elementwise_functions():
    x, y = tg.input("x", (3, 4)), tg.input("y", (4,))
    outs = [ops.elementwise("rsqrt", ops.elementwise("abs", x) + 0.5), ops.silu(x), ops.gelu(x, "tanh"),
            ops.elementwise("leaky_relu", x, alpha=0.2), ops.sub(x, y), ops.div(x, y + 2.0),
            ops.pow(ops.elementwise("abs", x), y), ops.maximum(x, y, 0.25), ops.minimum(x, y), ops.elementwise("mul", x, y, x),
            ops.elementwise("add", x, y, x), ops.clip(x, hi=0.5), ops.clip(x, -0.5, None), ops.sigmoid(x),
            ops.where(ops.greater(x, y), x, y), ops.cast(ops.less(x, 0.0), "float32"), ops.exp(x), ops.neg(x),
            ops.cast(ops.cast(x * 10.0, "int32"), "float32")]
    check(tg.Graph([x, y], outs), {"x": rng.uniform(-2, 2, (3, 4)).astype(np.float32),
                                   "y": rng.uniform(-1, 1, (4,)).astype(np.float32)})


def test_windows_and_normalizations():
    x = tg.input("x", (1, 4, 9, 9))
    outs = [ops.conv(x, const(6, 2, 3, 3), const(6), stride=2, padding=(1, 0, 2, 1), dilation=(1, 2), groups=2),
            ops.pool(x, "avg", 3, 2, 1, count_include_pad=False), ops.max_pool2d(x, 2, 2, ceil_mode=True),
            ops.batch_norm(x, const(4), const(4, low=0.5, high=1.5)),
            ops.layer_norm(x, eps=1e-3, axis=-2), ops.log_softmax(x, axis=1),
            ops.sum(x, (1, 3), keepdims=True), ops.max(x, 2), ops.global_avg_pool(x)]
    check(tg.Graph([x], outs), {"x": rng.standard_normal((1, 4, 9, 9)).astype(np.float32)})


def test_channels_last_windows_indices_lrn_and_arg_reductions():
    """Channels-last convolutions and pools go out as ONNX's channels-first ones between transposes; column-major
    max-pool indices as storage_order 1; LRN and ArgMax / ArgMin as themselves."""
    x, nhwc = tg.input("x", (1, 4, 7, 6)), tg.input("nhwc", (1, 7, 6, 4))
    values, indices = ops.max_pool_with_indices(x, 3, 2, 1, column_major=True)
    outs = [ops.conv(nhwc, const(6, 2, 3, 3), const(6), stride=2, padding=1, groups=2, channels_last=True),
            ops.pool(nhwc, "max", 2, 2, channels_last=True), ops.pool(nhwc, "avg", 3, 1, 1, channels_last=True),
            values, indices, ops.lrn(x, 3, 1e-2, 0.6, 1.5), ops.argmax(x, 2, keepdims=False),
            ops.argmin(x, -1, select_last_index=True)]
    check(tg.Graph([x, nhwc], outs), {"x": rng.standard_normal((1, 4, 7, 6)).astype(np.float32),
                                      "nhwc": rng.standard_normal((1, 7, 6, 4)).astype(np.float32)})


def test_data_movement():
    x = tg.input("x", (2, 3, 4))
    ids = tg.constant(np.array([[2, -1], [0, 1]], np.int64))
    outs = [ops.pad(x, [(0, 0), (1, 2), (0, 1)], value=1.5), ops.pad(x, [(1, 0), (0, 2), (1, 1)], mode="reflect"),
            ops.pad(x, [(0, 1), (2, 2), (0, 0)], mode="edge"), ops.pad(x, [(2, 1), (0, 0), (3, 1)], mode="wrap"),
            ops.expand(ops.slice(x, [0], [1]), (3, 2, 3, 4)),
            ops.slice(x, [3, 2], [-5, 0], [2, 1], [-2, -1]), ops.concat(ops.split(x, [1, 3], axis=2)[::-1], axis=2),
            ops.gather(x, ids, axis=2), ops.transpose(x, (2, 0, 1)), ops.flatten(x), ops.unsqueeze(x, 1)]
    check(tg.Graph([x], outs), {"x": rng.standard_normal((2, 3, 4)).astype(np.float32)})


def test_outputs_that_are_inputs_or_repeated():
    x = tg.input("x", (2, 2))
    y = ops.relu(x)
    check(tg.Graph([x], [y, x, y]), {"x": rng.standard_normal((2, 2)).astype(np.float32)})


def test_no_onnx_equivalent_is_a_clear_error():
    x = tg.input("x", (2, 8))
    with pytest.raises(OnnxExportError, match="rms_norm has no ONNX operator"):
        export_onnx(tg.Graph([x], [ops.rms_norm(x)]))
