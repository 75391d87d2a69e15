"""Regression tests of the graph passes around fusion: small ONNX models whose passes once gave wrong numbers.

Oracle: onnxruntime on the same model, or numpy in f32 where onnxruntime makes the same fold itself.
"""
import numpy as np
import pytest
from onnx import TensorProto, helper

import taskdsl as td
import taskdsl.graph as tg

from . import assert_close, make_model, rand, run_onnxruntime

pytest.importorskip("onnxruntime")

F16 = TensorProto.FLOAT16


def _compiled(model):
    """The model compiled as for a real run (td.fast_compile off: avg_pool_as_conv leaves graphs alone under it)."""
    td.fast_compile(False)
    try:
        return tg.from_onnx(model).compile(target="cpu")
    finally:
        td.fast_compile(True)


def _check(model, feeds: dict, rtol: float = 1e-4, atol: float = 1e-5):
    """The compiled model's outputs against onnxruntime's; the compiled graph."""
    compiled = _compiled(model)
    for got, want in zip(compiled(feeds), run_onnxruntime(model, feeds)):
        assert_close(got, want, rtol=rtol, atol=atol)
    return compiled


def test_f16_average_pool_sums_in_f32_and_does_not_overflow():
    """A 7x7 f16 average of values near 2000 is near 2000: the pool sums in f32. As a depthwise f16 convolution by
    ones (avg_pool_as_conv) the window's sum, 98000, overflowed f16 to inf before the division."""
    model = make_model([helper.make_node("AveragePool", ["x"], ["y"], kernel_shape=[7, 7])],
                       [("x", (1, 3, 9, 9), F16)], [("y", (1, 3, 3, 3), F16)])
    x = rand((1, 3, 9, 9), low=1500, high=2500).astype(np.float16)
    compiled = _check(model, {"x": x}, rtol=2e-3, atol=1e-3)
    assert [op.kind for op in compiled.graph.nodes] == ["avg_pool"]


def test_f16_batch_norm_is_not_folded_where_f16_overflows():
    """(x - mean) * scale of an f16 BatchNorm is computed in f32. Folded into x * scale + shift, channel 0 (mean
    1000, scale ~30000) had an infinite shift and gave NaN where the BatchNorm gives 0, and channel 1 (mean 2000,
    scale 30, x 2200) an infinite x * scale where it gives 6000."""
    f16 = np.float16
    model = make_model([helper.make_node("Relu", ["x"], ["r"]),
                        helper.make_node("BatchNormalization", ["r", "g", "b", "mean", "var"], ["y"], epsilon=1e-9)],
                       [("x", (1, 4, 3, 5), F16)], [("y", (1, 4, 3, 5), F16)],
                       {"g": np.ones(4, f16), "b": np.zeros(4, f16), "mean": np.array([1000, 2000, 0, 0], f16),
                        "var": np.array([1e-7, 1 / 900, 1, 1], f16)})
    x = rand((1, 4, 3, 5)).astype(f16)
    x[:, 0], x[:, 1] = 1000, 2200
    compiled = _check(model, {"x": x}, rtol=5e-3, atol=1e-3)
    assert "batch_norm" in [op.kind for op in compiled.graph.nodes]


def test_f16_batch_norm_is_not_folded_into_conv_weights_that_overflow():
    """Conv weights of 20 times a BatchNorm scale of 4000 (a variance of 6e-8) overflow f16: the BatchNorm stays
    in the conv's epilogue and scales its small outputs. Oracle: numpy in f32 (onnxruntime folds into inf
    weights itself)."""
    f16 = np.float16
    w, var = np.full((2, 3, 3, 3), 20, f16), np.full(2, 6e-8, f16)
    model = make_model([helper.make_node("Conv", ["x", "w"], ["c"]),
                        helper.make_node("BatchNormalization", ["c", "g", "b", "mean", "var"], ["y"], epsilon=0.0)],
                       [("x", (1, 3, 5, 5), F16)], [("y", (1, 2, 3, 3), F16)],
                       {"w": w, "g": np.ones(2, f16), "b": np.zeros(2, f16), "mean": np.zeros(2, f16), "var": var})
    x = (rand((1, 3, 5, 5)) * 1e-4).astype(f16)
    compiled = _compiled(model)
    windows = np.lib.stride_tricks.sliding_window_view(x.astype(np.float32), (3, 3), axis=(2, 3))
    conv = np.einsum("nchwij,ocij->nohw", windows, w.astype(np.float32)).astype(f16).astype(np.float32)
    want = (conv / np.sqrt(var.astype(np.float32))[:, None, None]).astype(f16)
    assert_close(compiled({"x": x})[0], want, rtol=5e-3, atol=1e-3)
    fused, = compiled.graph.nodes
    assert "batch_norm" in [m.kind for m in fused.epilogue]


@pytest.mark.parametrize("channels_last", [False, True])
@pytest.mark.parametrize("after", ["Cast", "Greater"])
def test_a_conv_whose_epilogue_changes_the_type(after, channels_last):
    """A Cast (or a comparison) fused after a convolution: the im2col columns were allocated in the output's type
    (f16, bool), which the columns kernel refuses."""
    node = helper.make_node("Cast", ["c"], ["y"], to=F16) if after == "Cast" else \
        helper.make_node("Greater", ["c", "zero"], ["y"])
    conv, weight = helper.make_node("Conv", ["x", "w"], ["c"], pads=[1, 1, 1, 1]), rand((5, 4, 3, 3), 1)
    model = make_model([conv, node], [("x", (2, 4, 6, 7))],
                       [("y", (2, 5, 6, 7), F16 if after == "Cast" else TensorProto.BOOL)],
                       {"w": weight, "zero": np.zeros(1, np.float32)})
    x = rand((2, 4, 6, 7), 2)
    td.fast_compile(False)
    try:
        compiled = tg.from_onnx(model).compile(target="cpu", channels_last=channels_last)
    finally:
        td.fast_compile(True)
    got, = compiled(x)
    want, = run_onnxruntime(model, {"x": x})
    assert got.dtype == want.dtype
    if after == "Cast":
        assert_close(got, want, rtol=2e-3, atol=1e-3)
    else:       # a comparison: exact but for values within rounding of zero
        conv_alone = make_model([conv], [("x", (2, 4, 6, 7))], [("c", (2, 5, 6, 7))], {"w": weight})
        close = np.abs(run_onnxruntime(conv_alone, {"x": x})[0]) < 1e-5
        assert (got == want)[~close].all()


def test_an_epilogue_fusion_cannot_invert_runs_unfused():
    """Conv (1, 3, 4, 4) -> Reshape (8, 6) -> Transpose: the reshape's rows straddle the convolution's, and the
    composed map is no digit permutation, which fusion can invert: compile raised a FusionError. The group now
    runs as its operators, on repeated calls too (replayed)."""
    model = make_model([helper.make_node("Conv", ["x", "w"], ["c"], pads=[1, 1, 1, 1]),
                        helper.make_node("Reshape", ["c", "s"], ["r"]),
                        helper.make_node("Transpose", ["r"], ["y"], perm=[1, 0])],
                       [("x", (1, 2, 4, 4))], [("y", (6, 8))],
                       {"w": rand((3, 2, 3, 3), 1), "s": np.array([8, 6], np.int64)})
    compiled = _compiled(model)
    for seed in (2, 3, 4):
        x = rand((1, 2, 4, 4), seed)
        got, = compiled(x)
        assert_close(got, run_onnxruntime(model, {"x": x})[0], rtol=1e-4, atol=1e-5)
