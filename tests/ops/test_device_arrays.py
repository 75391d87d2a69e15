"""The operator library on td.DeviceArrays (cuda target, simulated GPU: tests/simulated_gpu.py): DeviceArrays in,
DeviceArrays out, the same values as numpy. On a GPU, the cuda twins of the op tests run the kernels for real."""
import numpy as np

import stdlib_ops as ops
import taskdsl as td

from . import rand


def _check(got, want, rtol=2e-4):
    assert isinstance(got, td.DeviceArray), type(got)
    np.testing.assert_allclose(got.numpy(), want, rtol=rtol, atol=rtol * max(1.0, float(np.abs(want).max())))


def test_elementwise_reductions_and_rows(simulated_gpu):
    x, b = rand((5, 37), 1), rand((37,), 2)
    dx, db = td.to_device(x), td.to_device(b)
    _check(ops.gelu(ops.add(dx, db)), ops.gelu(ops.add(x, b)))
    _check(ops.sum(dx, axis=-1), x.sum(-1))
    _check(ops.softmax(dx), ops.softmax(x))
    _check(ops.layer_norm(dx, db, db), ops.layer_norm(x, b, b))
    _check(ops.transpose(dx), x.T)
    _check(ops.concat([dx, dx], axis=0), np.concatenate([x, x]))
    assert ops.argmax(dx, axis=1).numpy().tolist() == x.argmax(1).tolist()


def test_matmul_linear_conv_and_pooling(simulated_gpu):
    a, b, w = rand((3, 17, 9), 1), rand((9, 13), 2), rand((13, 9), 3)
    _check(ops.matmul(td.to_device(a), td.to_device(b)), a @ b)
    _check(ops.matmul(td.to_device(a[0, 0]), td.to_device(b)), a[0, 0] @ b)     # a 1-d operand
    _check(ops.linear(td.to_device(a), td.to_device(w), td.to_device(b[0])), a @ w.T + b[0])
    x, k = rand((1, 3, 11, 11), 4), rand((4, 3, 3, 3), 5)
    _check(ops.conv2d(td.to_device(x), td.to_device(k), padding=1, activation="relu"),
           ops.conv2d(x, k, padding=1, activation="relu"))
    _check(ops.max_pool2d(td.to_device(x), 3, 2), ops.max_pool2d(x, 3, 2))
    _check(ops.global_avg_pool2d(td.to_device(x)), x.mean((2, 3), keepdims=True))


def test_an_integer_product_takes_a_bias_in_gpu_memory(simulated_gpu):
    """The check that an integer bias fits the result's type read a DeviceArray's min() (an AttributeError)."""
    x, w, bias = np.arange(52, dtype=np.int8).reshape(4, 13), np.ones((6, 13), np.int8), np.arange(6, dtype=np.int32)
    got = ops.linear(td.to_device(x), td.to_device(w), td.to_device(bias))
    assert isinstance(got, td.DeviceArray)
    np.testing.assert_array_equal(got.numpy(), x.astype(np.int32) @ w.T.astype(np.int32) + bias)


def test_empty_inner_dimension_gives_zeros(simulated_gpu):
    got = ops.matmul(td.to_device(np.zeros((3, 0), np.float32)), td.to_device(np.zeros((0, 4), np.float32)))
    _check(got, np.zeros((3, 4), np.float32))


def test_mixing_computes_in_the_wider_type(simulated_gpu):
    """An f16 DeviceArray times an f32 one computes in f32, as numpy arrays do (it was a TypeError asking for a
    cast; tests/ops/test_matmul_audit.py checks the values)."""
    y = ops.matmul(td.to_device(rand((2, 3), 1).astype(np.float16)), td.to_device(rand((3, 2), 2)))
    assert isinstance(y, td.DeviceArray) and y.dtype == np.float32


def test_gather_clamps_indices_in_gpu_memory(simulated_gpu):
    """Indices on the GPU are not checked on the host: one out of range reads the nearest end of the axis,
    never memory outside the tensor (numpy indices out of range raise, tests/ops/test_transform.py)."""
    x = rand((4, 7), 1)
    indices = np.array([-1, 0, 9, -12, 6, 2], np.int64)
    clamped = np.clip(np.where(indices < 0, indices + 7, indices), 0, 6)
    _check(ops.gather(td.to_device(x), td.to_device(indices), axis=1), np.take(x, clamped, axis=1))


def test_bool_device_arrays_with_numbers_and_mixed_placement(simulated_gpu):
    """A bool DeviceArray with an int promotes like numpy's (in the kernel); a conv whose weight or bias is on the
    GPU puts its result there, as every other op does."""
    b = np.array([[True, False, True], [False, True, True]])
    db = td.to_device(b)
    _check(ops.add(db, 2), b + 2)
    _check(ops.where(db, db, 5), np.where(b, b, 5))
    x, w, bias = rand((1, 3, 6, 6), 1), rand((4, 3, 3, 3), 2), rand((4,), 3)
    want = ops.conv2d(x, w, bias, padding=1)
    _check(ops.conv2d(x, td.to_device(w), bias, padding=1), want)
    _check(ops.conv2d(x, w, td.to_device(bias), padding=1), want)
