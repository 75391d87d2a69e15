"""Audit of the graph passes and the executor's outputs: each test failed before its fix.

Oracles: onnxruntime on the same ONNX model, or numpy.
"""
import numpy as np
import pytest
from onnx import TensorProto, helper

import taskdsl.graph as tg
from taskdsl.graph import ops, passes

from . import assert_close, make_model, rand, run_onnxruntime

n = helper.make_node
LAYOUT_PASSES = [passes.infer_shapes, passes.fold_constants, passes.channels_last, passes.eliminate_dead_code]


def _check_against_onnxruntime(model, feeds: dict, channels_last: bool, **tolerances) -> tg.Graph:
    """The model compiled with or without the layout pass gives onnxruntime's outputs (shapes, dtypes, values)."""
    cg = tg.from_onnx(model).compile(channels_last=channels_last)
    for got, want in zip(cg(*feeds.values()), run_onnxruntime(model, feeds)):
        assert_close(got, want, **tolerances)
    return cg


def test_channels_last_keeps_a_shared_constant_in_its_own_layout():
    """A constant broadcast into a channels-last add is padded to rank 4 and transposed for it; its other readers
    (an add of another rank, the graph's output) got that rank-4 form transposed back: (1, 4, 1, 1), not (4, 1, 1)."""
    model = make_model([n("Conv", ["x", "w"], ["c"]), n("Add", ["c", "k"], ["y"]), n("Add", ["v", "k"], ["z"]),
                        n("Identity", ["k"], ["k_out"])],
                       [("x", [1, 3, 4, 4]), ("v", [4, 1, 1])],
                       [("y", [1, 4, 2, 2]), ("z", [4, 1, 1]), ("k_out", [4, 1, 1])],
                       {"w": rand((4, 3, 3, 3), 1), "k": rand((4, 1, 1), 2)})
    _check_against_onnxruntime(model, {"x": rand((1, 3, 4, 4), 3), "v": rand((4, 1, 1), 4)}, channels_last=True)


def test_channels_last_with_a_scalar_input_read_in_both_layouts():
    """A 0-d graph input scaling a channels-last conv output and read by another operator: the pass transposed
    the 0-d tensor (ValueError: axis 0 out of range for a 0-d tensor)."""
    model = make_model([n("Conv", ["x", "w"], ["c"]), n("Mul", ["c", "s"], ["y"]), n("Neg", ["s"], ["z"])],
                       [("x", [1, 3, 4, 4]), ("s", [])], [("y", [1, 4, 2, 2]), ("z", [])], {"w": rand((4, 3, 3, 3), 1)})
    _check_against_onnxruntime(model, {"x": rand((1, 3, 4, 4), 3), "s": np.array(1.5, np.float32)},
                               channels_last=True)


def test_channels_last_computes_a_conv_feeding_a_scalar_once():
    """relu(conv(x)) summed to a scalar that scales the conv: the channels-last mul read the input graph's scalar,
    which pulled the whole channels-first chain into the new graph (the convolution ran twice)."""
    model = make_model([n("Conv", ["x", "w"], ["c"], pads=[1, 1, 1, 1]), n("Relu", ["c"], ["r"]),
                        n("ReduceSum", ["r"], ["s"], keepdims=0), n("Mul", ["c", "s"], ["y"])],
                       [("x", [1, 3, 5, 5])], [("y", [1, 4, 5, 5])], {"w": rand((4, 3, 3, 3), 1)})
    optimized = passes.optimize(tg.from_onnx(model), LAYOUT_PASSES)
    assert [op.kind for op in optimized.nodes].count("conv2d") == 1
    _check_against_onnxruntime(model, {"x": rand((1, 3, 5, 5), 3)}, channels_last=True, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("replay", [False, True])
def test_outputs_sharing_storage_are_arrays_of_their_own(replay):
    """Outputs a, reshape(a) (a view: a's storage) and a again: writing into one returned array changed another."""
    x = tg.input("x", (2, 3))
    a = ops.exp(x)
    cg = tg.Graph([x], [a, ops.reshape(a, (6,)), a]).compile(replay=replay)
    xa = rand((2, 3), 1)
    first, flat, again = cg(xa)
    first[...] = 100.0
    flat_want = np.exp(xa).reshape(6)
    assert_close(flat, flat_want, rtol=1e-6)
    flat[...] = -1.0
    assert_close(again, np.exp(xa), rtol=1e-6)


@pytest.mark.parametrize("channels_last", [False, True])
def test_f16_batch_norm_is_not_folded_where_the_scaled_conv_output_overflows(channels_last):
    """f16 depthwise conv (weights 1) -> BatchNorm with mean 6000, scale 10: folded, conv(x, W * 10) = 70000 is inf
    where the BatchNorm's (7000 - 6000) * 10 = 10000 is not, though the scaled weights and the shift (-60000)
    fit f16. The fold is kept where the shift is within rounding of f16's largest value."""
    f16 = np.float16
    c = 2
    model = make_model([n("Conv", ["x", "w"], ["c"], group=c),
                        n("BatchNormalization", ["c", "g", "b", "m", "v"], ["y"], epsilon=0.0)],
                       [("x", [1, c, 1, 3], TensorProto.FLOAT16)], [("y", [1, c, 1, 3], TensorProto.FLOAT16)],
                       {"w": np.ones((c, 1, 1, 1), f16), "g": np.ones(c, f16), "b": np.zeros(c, f16),
                        "m": np.full(c, 6000, f16), "v": np.full(c, 0.01, f16)})
    x = np.broadcast_to(np.array([7000, 5000, 6000], f16), (1, c, 1, 3)).copy()
    cg = _check_against_onnxruntime(model, {"x": x}, channels_last=channels_last, rtol=1e-3, atol=1e-3)
    assert np.array_equal(cg(x)[0][0, :, 0], np.array([[10000, -10000, 0]] * c, f16))
    small = make_model([n("Conv", ["x", "w"], ["c"], group=c),
                        n("BatchNormalization", ["c", "g", "b", "m", "v"], ["y"], epsilon=0.0)],
                       [("x", [1, c, 1, 3], TensorProto.FLOAT16)], [("y", [1, c, 1, 3], TensorProto.FLOAT16)],
                       {"w": np.ones((c, 1, 1, 1), f16), "g": np.ones(c, f16), "b": np.zeros(c, f16),
                        "m": np.full(c, 3, f16), "v": np.full(c, 0.25, f16)})
    folded = passes.optimize(tg.from_onnx(small), passes.PIPELINE[:4])
    assert [op.kind for op in folded.nodes] == ["conv2d", "add"]      # shift -6: still folded into the weights
    _check_against_onnxruntime(small, {"x": rand((1, c, 1, 3), 5).astype(f16)}, channels_last=channels_last,
                               rtol=1e-3, atol=1e-3)
