"""Arguments users get wrong in the stdlib operators are refused with a message naming them (a helper's audit
found each accepted, or failing inside taskdsl); the calls next to them, with good arguments, match numpy."""
import numpy as np
import pytest

import stdlib_ops as ops

X = np.arange(24, dtype=np.float32).reshape(2, 3, 4) - 10


@pytest.mark.parametrize("call, error, message", [
    # a start for an axis the array lacks raised IndexError: tuple index out of range
    (lambda: ops.slice(X[0], [0, 0, 0], [1, 1, 1]), ValueError, r"slice: 3 starts/stops for a 2-d array"),
    # a nested start kept its first item: (1, 2) sliced from 1
    (lambda: ops.slice(X, [(1, 2)], [3]), TypeError, r"slice: starts must be integers \(one per sliced axis\)"),
    (lambda: ops.slice(X, [0], [[3, 99]]), TypeError, r"slice: stops must be integers"),
    # truthy strings were read as True
    (lambda: ops.sum(X, axis=0, keepdims="False"), TypeError, r"sum: keepdims must be True or False, got 'False'"),
    (lambda: ops.argmax(X, axis=0, keepdims="no"), TypeError, r"argmax: keepdims must be True or False"),
    (lambda: ops.avg_pool2d(X[None], 2, count_include_pad="False"), TypeError,
     r"avg_pool2d: count_include_pad must be True or False"),
    # float("0.1") took a string; ndim=1.5 gave slicing's message, True was 1
    (lambda: ops.layer_norm(X, eps="0.1"), TypeError, r"layer_norm: eps must be a number, got '0.1'"),
    (lambda: ops.layer_norm(X, np.ones(4, np.float32), np.zeros(4, np.float32), eps="0.1"), TypeError,
     r"layer_norm: eps must be a number"),
    (lambda: ops.rms_norm(X, eps=None), TypeError, r"rms_norm: eps must be a number, got None"),
    (lambda: ops.layer_norm(X, ndim=1.5), TypeError, r"layer_norm: ndim must be integers, got 1.5"),
    (lambda: ops.layer_norm(X, ndim=True), TypeError, r"layer_norm: ndim must be integers, got True"),
    # a list value was "input 'value' must be 1-d, got shape (1, 1)"
    (lambda: ops.pad(X, 1, value=[3.0]), TypeError, r"pad: value must be one number"),
    # integers were averaged into float32, where the other pools refuse them
    (lambda: ops.global_avg_pool2d(np.ones((1, 2, 3, 3), np.int32)), TypeError,
     r"global_avg_pool2d needs a float array, got int32"),
    (lambda: ops.max_pool2d(np.ones((1, 2, 3, 3), np.int32), 2), TypeError, r"max_pool2d needs a float array"),
    (lambda: ops.avg_pool2d(np.ones((2, 3, 3), np.float32), 2), ValueError, r"avg_pool2d needs an NCHW array \(4-d\)"),
    # the message did not say which index
    (lambda: ops.gather(X, np.array([0, 3, -1]), axis=1), IndexError, r"gather: index 3 is out of range for axis 1"),
])
def test_bad_arguments_are_named(call, error, message):
    with pytest.raises(error, match=message):
        call()


def test_the_same_calls_with_good_arguments_match_numpy():
    np.testing.assert_array_equal(ops.slice(X[0], [0, 1], [2, 3]), X[0, 0:2, 1:3])
    np.testing.assert_array_equal(ops.sum(X, axis=0, keepdims=np.True_), X.sum(0, keepdims=True))
    np.testing.assert_array_equal(ops.argmax(X, axis=2, keepdims=1), X.argmax(2, keepdims=True))
    np.testing.assert_allclose(ops.avg_pool2d(X[None], 2, padding=1, count_include_pad=False),
                               _average_pool_without_padding(X[None], 2, 1), rtol=1e-6)
    x64 = X.astype(np.float64)
    want = (x64 - x64.mean(-1, keepdims=True)) / np.sqrt(x64.var(-1, keepdims=True) + 0.25)
    np.testing.assert_allclose(ops.layer_norm(X, eps=np.float32(0.25)), want, rtol=1e-5, atol=1e-6)
    np.testing.assert_array_equal(ops.pad(X, 1, value=np.float32(3)), np.pad(X, 1, constant_values=3))
    np.testing.assert_array_equal(ops.pad(X, 1, value=np.array([2.5], X.dtype)), np.pad(X, 1, constant_values=2.5))
    np.testing.assert_array_equal(ops.gather(X, np.array([0, 3, -1]), axis=2), np.take(X, [0, 3, -1], axis=2))


def _average_pool_without_padding(x, k, pad):
    """Each k x k window's mean over the positions inside x (stride k, `pad` zeros each side)."""
    n, c, h, w = x.shape
    oh, ow = (h + 2 * pad - k) // k + 1, (w + 2 * pad - k) // k + 1
    out = np.empty((n, c, oh, ow), np.float64)
    for i in range(oh):
        for j in range(ow):
            rows = slice(max(i * k - pad, 0), min(i * k - pad + k, h))
            cols = slice(max(j * k - pad, 0), min(j * k - pad + k, w))
            out[:, :, i, j] = x[:, :, rows, cols].mean(axis=(2, 3))
    return out
