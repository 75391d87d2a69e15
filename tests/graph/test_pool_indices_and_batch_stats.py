"""Max pooling with indices (ONNX MaxPool's Indices output, both storage orders) and training-mode batch norm
(ONNX BatchNormalization with training_mode=1), on the cpu target against numpy loops."""
import itertools

import numpy as np
import onnx
import pytest
from hypothesis import assume, example, given, settings
from hypothesis import strategies as st
from onnx import TensorProto, helper

import taskdsl.graph as tg
from taskdsl.graph import ops


def numpy_max_pool_indices(x, kernel, stride, pads, column_major, dilation=1):
    """(max over each window, flat index in x of its first maximum) by loops over windows; padding never wins, and
    a window wholly in the padding gives -inf and index -1 (onnxruntime's index; its value is -FLT_MAX)."""
    n, c, *spatial = x.shape
    rank = len(spatial)
    out = [(spatial[i] + pads[i] + pads[rank + i] - dilation * (kernel[i] - 1) - 1) // stride[i] + 1
           for i in range(rank)]
    values, indices = np.empty((n, c, *out), x.dtype), np.empty((n, c, *out), np.int64)
    for b, ch, *o in itertools.product(range(n), range(c), *map(range, out)):
        best, where = None, None
        for k in itertools.product(*map(range, kernel)):
            pos = [o[i] * stride[i] - pads[i] + k[i] * dilation for i in range(rank)]
            if all(0 <= p < s for p, s in zip(pos, spatial)) and (best is None or x[(b, ch, *pos)] > best):
                best, where = x[(b, ch, *pos)], pos
        flat = b * c + ch
        for i in (reversed(range(rank)) if column_major else range(rank)):
            flat = flat * spatial[i] + where[i] if where else -1
        values[(b, ch, *o)], indices[(b, ch, *o)] = -np.inf if best is None else best, flat
    return values, indices


@settings(max_examples=10, deadline=None)
@given(spatial=st.lists(st.sampled_from([1, 3, 5, 8]), min_size=1, max_size=2), n=st.sampled_from([1, 2]),
       c=st.sampled_from([1, 3]), k=st.sampled_from([1, 2, 3]), stride=st.sampled_from([1, 2]),
       pad=st.integers(0, 1), dilation=st.sampled_from([1, 2, 4]), column_major=st.booleans(),
       seed=st.integers(0, 1000))
@example(spatial=[3], n=1, c=1, k=2, stride=1, pad=1, dilation=4, column_major=False, seed=0)
@example(spatial=[3, 5], n=1, c=2, k=2, stride=1, pad=1, dilation=4, column_major=True, seed=0)
def test_max_pool_indices_match_numpy(spatial, n, c, k, stride, pad, dilation, column_major, seed):
    """Dilation 4 over 3 positions padded by 1 (the examples): a window lies wholly in the padding, whose index
    was int64's max (the reduction's start) and is -1."""
    rank = len(spatial)
    kernel = tuple(max(1, min(k, (s + 2 * pad - 1) // dilation + 1)) for s in spatial)     # the window fits
    assume(all(pad < (w - 1) * dilation + 1 for w in kernel))      # padding past the window is refused
    x = np.random.default_rng(seed).integers(0, 4, (n, c, *spatial)).astype(np.float32)    # ties: the first wins
    t = tg.input("x", x.shape)
    y, i = ops.max_pool_with_indices(t, kernel, stride, pad, dilation=dilation, column_major=column_major)
    got_y, got_i = tg.Graph([t], [y, i]).compile("cpu")(x)
    want_y, want_i = numpy_max_pool_indices(x, kernel, (stride,) * rank, (pad,) * 2 * rank, column_major, dilation)
    np.testing.assert_array_equal(got_y, want_y)
    assert got_i.dtype == np.int64
    np.testing.assert_array_equal(got_i, want_i)


@pytest.mark.parametrize("count_include_pad", [False, True])
def test_average_of_a_window_wholly_in_the_padding_is_zero(count_include_pad):
    """Windows at 0 and 4 of [1, 2, 3] padded by one each side (kernel 2, dilation 4): the first reads -1 and 3,
    no input (0/0 gave NaN without the padding counted; onnxruntime gives 0); the others average what they read."""
    x = np.array([[[1.0, 2.0, 3.0]]], np.float32)
    t = tg.input("x", x.shape)
    y = ops.pool(t, "avg", (2,), 1, (1, 1), dilation=(4,), count_include_pad=count_include_pad)
    (got,) = tg.Graph([t], [y]).compile("cpu")(x)
    np.testing.assert_array_equal(got, [[[0.0]]])


def test_indices_are_refused_for_average_and_channels_last_pools():
    x = tg.input("x", (1, 2, 4, 4))
    with pytest.raises(ValueError, match="indices"):
        ops.Pool([x], {"mode": "avg", "kernel": (2, 2), "strides": (2, 2), "pads": (0,) * 4, "dilations": (1, 1),
                       "ceil_mode": False, "count_include_pad": True, "indices": 1})
    with pytest.raises(ValueError, match="channels-first"):
        ops.Pool([x], {"mode": "max", "kernel": (2, 2), "strides": (2, 2), "pads": (0,) * 4, "dilations": (1, 1),
                       "ceil_mode": False, "count_include_pad": True, "indices": 1, "channels_last": True})


def _batch_norm_model(shape, epsilon, momentum) -> onnx.ModelProto:
    c = shape[1]
    node = helper.make_node("BatchNormalization", ["x", "s", "b", "mean", "var"], ["y", "running_mean", "running_var"],
                            epsilon=epsilon, momentum=momentum, training_mode=1)
    inputs = [helper.make_tensor_value_info("x", TensorProto.FLOAT, shape)] + [
        helper.make_tensor_value_info(name, TensorProto.FLOAT, [c]) for name in ("s", "b", "mean", "var")]
    outputs = [helper.make_tensor_value_info("y", TensorProto.FLOAT, shape)] + [
        helper.make_tensor_value_info(name, TensorProto.FLOAT, [c]) for name in ("running_mean", "running_var")]
    graph = helper.make_graph([node], "bn_training", inputs, outputs)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 15)])


@settings(max_examples=8, deadline=None)
@given(shape=st.lists(st.sampled_from([1, 2, 3, 5]), min_size=2, max_size=4), epsilon=st.sampled_from([1e-5, 1e-2]),
       momentum=st.sampled_from([0.9, 0.5]), seed=st.integers(0, 1000))
def test_training_mode_batch_norm_matches_numpy(shape, epsilon, momentum, seed):
    """Normalized by the batch's mean and (population) variance over every axis but 1; running statistics
    updated as old * momentum + batch * (1 - momentum)."""
    rng = np.random.default_rng(seed)
    c = shape[1]
    x = rng.standard_normal(shape).astype(np.float32)
    s, b, mean = (rng.standard_normal(c).astype(np.float32) for _ in range(3))
    var = rng.random(c).astype(np.float32) + 0.5
    g = tg.from_onnx(_batch_norm_model(shape, epsilon, momentum))
    got = g.compile("cpu")({"x": x, "s": s, "b": b, "mean": mean, "var": var})
    axes = tuple(a for a in range(len(shape)) if a != 1)
    batch_mean, batch_var = x.mean(axes), x.var(axes)
    at_channels = (1, c) + (1,) * (len(shape) - 2)
    y = ((x - batch_mean.reshape(at_channels)) / np.sqrt(batch_var.reshape(at_channels) + epsilon)
         * s.reshape(at_channels) + b.reshape(at_channels))
    want = [y, mean * momentum + batch_mean * (1 - momentum), var * momentum + batch_var * (1 - momentum)]
    for g_out, w_out in zip(got, want):
        np.testing.assert_allclose(g_out, w_out, rtol=1e-4, atol=1e-5)
