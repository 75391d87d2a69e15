"""Arguments of the graph ops as users give them: numpy ints work like ints; floats, bools, strings and None where
an int or a number belongs are errors naming the argument (they were truncated, read digit by digit, wrapped
around or crashed inside); numbers combined with a tensor must be of its dtype and fit it."""
import numpy as np
import pytest

import taskdsl.graph as tg
from taskdsl.graph import ops

from . import rand

X = tg.input("x", (2, 3, 4))
I8 = tg.input("i8", (2,), "int8")
I32 = tg.input("i32", (4,), "int32")


def run(build, *arrays):
    """build(*inputs) compiled and run on `arrays`: its first output."""
    inputs = [tg.input(f"a{k}", a.shape, a.dtype) for k, a in enumerate(arrays)]
    return tg.Graph(inputs, [build(*inputs)]).compile()(*arrays)[0]


@pytest.mark.parametrize("build, error, message", [
    # numbers combined with a tensor (were truncated / wrapped into the tensor's dtype)
    (lambda: ops.add(I32, np.float32(2.5)), TypeError, "cannot combine the number np.float32"),
    (lambda: ops.mul(I32, np.float16(0.5)), TypeError, "cast the tensor first"),
    (lambda: ops.where(ops.greater(I32, 0), I32, np.float32(0.5)), TypeError, "cannot combine"),
    (lambda: ops.add(I8, np.int64(1000)), ValueError, r"1000\) does not fit the i8 tensor .*\(-128..127\)"),
    (lambda: ops.add(I8, 1000), ValueError, "does not fit the i8 tensor"),
    (lambda: ops.clip(I8, -1000), ValueError, "does not fit the i8 tensor"),
    (lambda: ops.add(tg.input("u", (2,), "uint8"), np.int64(-1)), ValueError, "does not fit the u8 tensor"),
    (lambda: ops.add(X, np.complex64(1 + 1j)), TypeError, "must be a real number"),
    (lambda: ops.add(tg.input("h", (2,), "float16"), 1e6), ValueError,    # (was inf, with numpy's warning)
     r"1000000.0 does not fit the f16 tensor it is combined with \(it would round to inf\)"),
    (lambda: tg.constant(-1, "uint8"), ValueError, "the constant -1 does not fit u8"),
    (lambda: tg.constant(np.ones(2, np.complex64)), TypeError, "complex constants are not supported"),
    # pad (1.5 was truncated, None padded NaN, a third column was dropped, all-zero pads skipped every check)
    (lambda: ops.pad(X, (1, 0, 0, 0, 0, 0), value=None), TypeError, "pad: value must be a real number, got None"),
    (lambda: ops.pad(I32, (1, 0), value=2.5), TypeError, "cannot combine pad: value 2.5 with a i32 tensor"),
    (lambda: ops.pad(I8, (1, 0), value=1000), ValueError, "pad: value 1000 does not fit"),
    (lambda: ops.pad(X, (1.5, 0, 0, 0, 0, 0)), TypeError, "pad: pads must be integers"),
    (lambda: ops.pad(X, (True, 0, 0, 0, 0, 0)), TypeError, "pad: pads must be integers"),
    (lambda: ops.pad(X, ((1, 1, 9), (1, 1, 9), (0, 0, 0))), ValueError, r"\(before, after\) must be an integer or 2"),
    (lambda: ops.pad(X, (0, 0)), ValueError, "pad: pads must be 6 non-negative ints"),
    (lambda: ops.pad(X, (0,) * 6, mode="mirror"), ValueError, "mode 'mirror' is not one of"),
    # sizes, bounds and axes (were truncated by int(), parsed from strings, or crashed inside)
    (lambda: ops.lrn(tg.input("img", (1, 4, 2, 2)), 2.5), TypeError, "lrn: size must be an int, got 2.5"),
    (lambda: ops.lrn(tg.input("img", (1, 4, 2, 2)), 3, alpha="1e-4"), TypeError, "lrn: alpha must be a number"),
    (lambda: ops.slice(X, [1.5], [3.9], [0]), TypeError, r"slice: starts must be integers, got \[1.5\]"),
    (lambda: ops.slice(X, [0], [2], [0], [0.5]), TypeError, "slice: steps must be integers"),
    (lambda: ops.slice(X, [None], [2]), TypeError, "slice: starts must be integers"),
    (lambda: ops.split(X, [1.5, 0.5], axis=0), TypeError, r"split: sizes must be integers, got \[1.5, 0.5\]"),
    (lambda: ops.split(X, True), TypeError, "split: sizes must be an int, got True"),
    (lambda: ops.reshape(X, (6, 4.5)), TypeError, r"reshape: the shape must be integers, got \(6, 4.5\)"),
    (lambda: ops.reshape(tg.input("e", (8,)), "24"), TypeError, "reshape: the shape must be integers, got '24'"),
    (lambda: ops.flatten(X, 1.5), TypeError, "flatten: axis must be an int, got 1.5"),
    (lambda: ops.sum(X, 1.0), TypeError, "reduce_sum: an axis must be an int, got 1.0"),
    (lambda: ops.unsqueeze(X, None), TypeError, "unsqueeze: axis must be an int or a sequence of ints"),
    (lambda: ops.transpose(X, 1), TypeError, "transpose: perm must be a sequence of axes"),
    (lambda: ops.concat(X, 0), TypeError, "concat takes a list of tensors"),
    (lambda: ops.sum(X, 1, keepdims="no"), TypeError, "sum: keepdims must be True or False"),
    (lambda: ops.argmax(X, 0, select_last_index="no"), TypeError, "argmax: select_last_index must be True or"),
    (lambda: ops.layer_norm(X, eps="1e-5"), TypeError, "layer_norm: eps must be a number"),
    (lambda: ops.batch_norm(tg.input("img", (1, 4, 2, 2)), None, rand((4,))), TypeError, "running mean and var"),
    # elementwise parameters (were ignored or unchecked) and dtypes (None was float64)
    (lambda: ops.elementwise("gelu", X, approximate="bad"), ValueError, "gelu: approximate must be one of"),
    (lambda: ops.elementwise("relu", X, foo=1), TypeError, "relu takes no parameter 'foo'"),
    (lambda: ops.elementwise("leaky_relu", X, alpha=True), TypeError, "leaky_relu: alpha must be a number"),
    (lambda: ops.elementwise("cast", X), TypeError, "cast: to: no type given"),
    (lambda: ops.cast(X, None), TypeError, "no type given"),
    (lambda: tg.input("q", (2,), None), TypeError, "no type given"),
    # grid_sample
    (lambda: ops.grid_sample(tg.input("img", (1, 2, 4, 4)), tg.input("c", (1, 5, 3))), ValueError,
     r"x \(1, 2, 4, 4\) and coordinates \(1, 5, 3\) do not match"),
    (lambda: ops.grid_sample(tg.input("img", (1, 2, 4, 4)), tg.input("c", (1, 5, 2)), "bilinear"), ValueError,
     "mode must be one of linear, nearest, cubic and padding one of zeros, border, reflection, got 'bilinear'"),
    (lambda: ops.grid_sample(tg.input("img", (1, 2, 4, 4), "int32"), tg.input("c", (1, 5, 2))), TypeError,
     "for mode 'linear', a float x; got f32 and i32"),
    (lambda: ops.grid_sample(tg.input("img", (1, 2, 0, 4)), tg.input("c", (1, 5, 2))), ValueError,
     "has an empty spatial axis"),
    (lambda: ops.grid_sample(tg.input("img", (1, 2, 4)), tg.input("c", (1, 5, 1)), align_corners="yes"), TypeError,
     "grid_sample: align_corners must be True or False"),
    # an array where the op takes a graph tensor (was an AttributeError from the message itself)
    (lambda: ops.softmax(rand((2, 3))), TypeError, "Softmax: inputs must be graph Tensors"),
    (lambda: ops.sum(rand((2, 3))), TypeError, "Reduce: inputs must be graph Tensors"),
])
def test_bad_arguments_are_errors_naming_them(build, error, message):
    with pytest.raises(error, match=message):
        build()


def test_numpy_ints_and_zero_d_arrays_work_as_ints():
    x = rand((2, 3, 4), 1)
    np.testing.assert_allclose(run(lambda t: ops.sum(t, np.int64(1)), x), x.sum(axis=1), rtol=1e-5)
    np.testing.assert_allclose(run(lambda t: ops.mean(t, np.array(2)), x), x.mean(axis=2), rtol=1e-5)
    np.testing.assert_array_equal(run(lambda t: t.transpose(np.int64(0)), x[0, 0]), x[0, 0])
    np.testing.assert_array_equal(run(lambda t: ops.slice(t, [np.int32(1)], [np.int64(3)], [np.int8(2)]), x),
                                  x[:, :, 1:3])


def test_numbers_that_fit_are_taken_exactly():
    a = np.array([-7, -1, 0, 5], np.int32)
    np.testing.assert_array_equal(run(lambda t: ops.add(t, np.int64(3)), a), a + 3)
    np.testing.assert_array_equal(run(lambda t: ops.mul(t, True), a), a)
    b = rand((3,), 2)
    np.testing.assert_allclose(run(lambda t: ops.add(t, np.float64(0.25)), b), b + np.float32(0.25), rtol=1e-6)


def test_python_ints_beyond_int32_make_int64_constants():
    """They wrapped into an int32 constant (2**40 became 0)."""
    for value in (2 ** 40, [3_000_000_000], -2 ** 31 - 1):
        c = tg.constant(value)
        assert c.dtype.name == "i64"
        np.testing.assert_array_equal(c.value, np.asarray(value, np.int64))
    assert tg.constant(5).dtype.name == "i32" and tg.constant([]).dtype.name == "f32"


def test_pad_takes_numpy_pads_and_pads_bools_with_false():
    x = rand((2, 3), 3)
    np.testing.assert_allclose(run(lambda t: ops.pad(t, ((1, 0), (np.int64(0), 2)), value=np.float32(1.5)), x),
                               np.pad(x, ((1, 0), (0, 2)), constant_values=1.5))
    flags = np.array([True, False])
    np.testing.assert_array_equal(run(lambda t: ops.pad(t, (1, 1)), flags), np.pad(flags, 1))


@pytest.mark.parametrize("target", ["cpu", "cuda"])
@pytest.mark.parametrize("dtype", [np.float32, np.uint8, np.int32])
def test_pad_by_a_value_computed_at_run_time(dtype, target, request):
    """A one-element tensor pads (a quantized input's zero point): its value when the graph runs, every run (on a
    simulated GPU too, its calls replayed)."""
    if target == "cuda":
        request.getfixturevalue("simulated_gpu")
    x = (rand((2, 5, 3), 7) * 20 + 30).astype(dtype)
    t = tg.input("x", x.shape, x.dtype)
    graph = tg.Graph([t], [ops.pad(t, (0, 1, 2, 1, 0, 3), ops.max(t))])
    compiled = graph.compile(target)
    for data in (x, x + 1):
        np.testing.assert_array_equal(compiled(data)[0], np.pad(data, ((0, 1), (1, 0), (2, 3)),
                                                                 constant_values=data.max()))
        np.testing.assert_array_equal(graph.reference(data)[0], compiled(data)[0])


@pytest.mark.parametrize("fill, mode", [(ops.cast(tg.input("v", ()), "int32"), "constant"),
                                        (tg.input("v", (2,)), "constant"), (tg.input("v", ()), "edge")])
def test_a_pad_value_tensor_must_be_one_element_of_x_dtype_in_constant_mode(fill, mode):
    with pytest.raises(ValueError, match="a tensor value must have one element of x's dtype"):
        ops.pad(tg.input("x", (3, 4)), (1, 1, 0, 0), fill, mode)


def test_gather_with_empty_index_list_and_layer_norm_with_an_array_weight():
    x = rand((5, 3), 4)
    assert run(lambda t: ops.gather(t, []), x).shape == (0, 3)
    w = rand((3, 4), 5) + 2
    y = run(lambda t: ops.layer_norm(t, w), rand((2, 3, 4), 6))       # normalized over the last w.ndim axes
    x = rand((2, 3, 4), 6).astype(np.float64)
    mean, var = x.mean(axis=(1, 2), keepdims=True), x.var(axis=(1, 2), keepdims=True)
    np.testing.assert_allclose(y, (x - mean) / np.sqrt(var + 1e-5) * w, rtol=1e-4, atol=1e-5)


def test_arrays_and_numbers_on_the_left_of_a_tensor_trace_ops():
    """`array + x` was numpy's object array of one traced add per element (numpy's operator ran first), and
    `2.0 ** x` a TypeError (no reflected power)."""
    b = np.arange(20, dtype=np.float32).reshape(4, 5)
    xv = rand((4, 5), 3) + np.float32(1.5)
    np.testing.assert_allclose(run(lambda t: b + t, xv), b + xv, rtol=1e-6)
    np.testing.assert_allclose(run(lambda t: b / t - b, xv), b / xv - b, rtol=1e-6)
    np.testing.assert_allclose(run(lambda t: b.T @ t, xv), b.T @ xv, rtol=1e-5)
    np.testing.assert_allclose(run(lambda t: np.float32(3) * t, xv), 3 * xv, rtol=1e-6)
    np.testing.assert_allclose(run(lambda t: 2.0 ** t, xv), 2.0 ** xv, rtol=1e-6)
    assert isinstance(b[:3, :4] * tg.input("y", (3, 4)), tg.Tensor)


def test_pooling_padding_as_wide_as_the_window_is_refused():
    """Kernel 2, padding 3 was accepted: whole windows lay in the padding (max pooling gave -inf rows, an average
    without the padding 0 / 0 -> 0); onnxruntime and PyTorch refuse it. One less than the window is fine."""
    x = tg.input("x", (1, 1, 4, 4))
    for mode, padding in (("max", 3), ("avg", 2), ("max", (0, 2, 0, 0))):
        with pytest.raises(ValueError, match=r"pooling: the padding .* must be smaller than the window's extent "
                                             r"\(2, 2\)"):
            ops.pool(x, mode, kernel=2, padding=padding)
    xa = np.arange(16, dtype=np.float32).reshape(1, 1, 4, 4)
    got = run(lambda t: ops.max_pool2d(t, 2, stride=2, padding=1), xa)
    np.testing.assert_array_equal(got[0, 0], [[0, 2, 3], [8, 10, 11], [12, 14, 15]])
    # a dilated window reaches further: padding 2 with kernel 2 at dilation 3 (extent 4) holds elements, as
    # auto_pad SAME gives it
    got = run(lambda t: ops.max_pool2d(t, 2, stride=1, padding=2, dilation=3), xa)
    padded = np.pad(xa[0, 0], 2, constant_values=-np.inf)
    want = np.array([[max(padded[i, j], padded[i, j + 3], padded[i + 3, j], padded[i + 3, j + 3]) for j in range(5)]
                     for i in range(5)])
    np.testing.assert_array_equal(got[0, 0], want)
