"""The traced op set: each op's graph output (kernels on the cpu target) against an independent numpy formula
and against the graph's numpy reference (the operators' compute definitions)."""
import math

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import taskdsl as td
import taskdsl.graph as tg
from taskdsl.graph import ops, passes

from . import assert_close, rand

FEW = settings(max_examples=4, deadline=None, suppress_health_check=[HealthCheck.too_slow])
_erf = np.vectorize(math.erf, otypes=[np.float64])


def run(fn, *arrays, rtol=1e-5, atol=1e-6):
    """fn traced on graph inputs shaped like `arrays`, run; checked against the graph reference; outputs returned."""
    inputs = [tg.input(f"x{k}", a.shape, a.dtype) for k, a in enumerate(arrays)]
    g = tg.trace(fn, *inputs)
    got = g(*arrays)
    for out, ref in zip(got, g.reference(*arrays)):
        assert_close(out, ref, rtol=rtol, atol=atol)
    return got


small_shapes = st.lists(st.sampled_from([1, 2, 3, 5]), min_size=1, max_size=3).map(tuple)


@st.composite
def broadcast_pair(draw):
    full = draw(small_shapes)
    ones = draw(st.lists(st.booleans(), min_size=len(full), max_size=len(full)))
    drop = draw(st.integers(0, len(full)))
    other = tuple(1 if o else n for o, n in zip(ones, full))[drop:]
    return (full, other) if draw(st.booleans()) else (other, full)


BINARY = {"add": np.add, "sub": np.subtract, "mul": np.multiply, "div": np.divide, "maximum": np.maximum,
          "minimum": np.minimum, "pow": np.power}


@pytest.mark.parametrize("name", list(BINARY))
@FEW
@given(shapes=broadcast_pair(), seed=st.integers(0, 1000))
def test_binary_broadcast(name, shapes, seed):
    a, b = rand(shapes[0], seed), rand(shapes[1], seed + 1)
    if name == "pow":
        a = np.abs(a) + 0.5
    if name == "div":
        b = np.where(np.abs(b) < 0.2, 0.7, b).astype(np.float32)
    got, = run(getattr(ops, name), a, b)
    assert_close(got, BINARY[name](a.astype(np.float64), b.astype(np.float64)).astype(np.float32), rtol=1e-5)


def test_integer_division_truncates_and_keeps_dtype():
    a = np.array([-7, 7, -7, 7, 0], np.int32)
    b = np.array([2, -2, -2, 2, 3], np.int32)
    got, = run(ops.div, a, b)
    np.testing.assert_array_equal(got, np.trunc(a / b).astype(np.int32))
    got, = run(lambda x: ops.relu(x - 3), np.arange(6, dtype=np.int8))   # scalars adopt the tensor's dtype
    assert got.dtype == np.int8
    np.testing.assert_array_equal(got, np.maximum(np.arange(6) - 3, 0))


@pytest.mark.parametrize("dtype", [np.int8, np.int16, np.int32, np.int64])
def test_integer_division_of_the_most_negative_value_by_minus_one_and_by_zero(dtype):
    """The cases ONNX leaves undefined, as graph.md gives them: 8- and 16-bit ones wrap (computed in i32, as
    numpy's), 32- and 64-bit ones are 0 (the DSL's rule), a division by zero is 0."""
    low = np.iinfo(dtype).min
    a, b = np.array([low, low, 5], dtype), np.array([-1, 1, 0], dtype)
    got, = run(ops.div, a, b)
    assert got.tolist() == [low if np.iinfo(dtype).bits <= 16 else 0, low, 0]


UNARY = {"relu": lambda x: np.maximum(x, 0), "sigmoid": lambda x: 1 / (1 + np.exp(-x)), "tanh": np.tanh,
         "exp": np.exp, "erf": _erf, "gelu": lambda x: 0.5 * x * (1 + _erf(x / np.sqrt(2))),
         "silu": lambda x: x / (1 + np.exp(-x)), "neg": np.negative, "log": np.log, "sqrt": np.sqrt}


@pytest.mark.parametrize("name", list(UNARY))
def test_unary(name):
    x = rand((3, 7), 5)
    x = np.abs(x) + np.float32(0.1) if name in ("log", "sqrt") else x
    got, = run(getattr(ops, name), x)
    assert_close(got, UNARY[name](x.astype(np.float64)).astype(np.float32), rtol=1e-5, atol=1e-6)


def test_gelu_tanh_where_clip_cast():
    x, y = rand((4, 5), 1), rand((4, 5), 2)
    got = run(lambda a, b: [ops.gelu(a, "tanh"), ops.where(ops.greater(a, b), a, b), ops.clip(a, -0.5, 0.5),
                            ops.cast(a * 10.0, "int32"), ops.cast(ops.less(a, 0.0), "float32")], x, y)
    x64 = x.astype(np.float64)
    gelu_tanh = 0.5 * x64 * (1 + np.tanh(np.sqrt(2 / np.pi) * (x64 + 0.044715 * x64 ** 3)))
    assert_close(got[0], gelu_tanh.astype(np.float32))
    assert_close(got[1], np.maximum(x, y))
    assert_close(got[2], np.clip(x, -0.5, 0.5))
    np.testing.assert_array_equal(got[3], np.trunc(x * np.float32(10.0)).astype(np.int32))
    np.testing.assert_array_equal(got[4], (x < 0).astype(np.float32))


@pytest.mark.parametrize("name", ["sum", "mean", "max", "min", "prod"])
@FEW
@given(shape=st.lists(st.sampled_from([1, 2, 3, 4]), min_size=1, max_size=4).map(tuple), data=st.data())
def test_reductions(name, shape, data):
    axes = data.draw(st.lists(st.integers(0, len(shape) - 1), unique=True, max_size=len(shape)))
    keepdims = data.draw(st.booleans())
    x = rand(shape, 3, low=0.5, high=1.5)
    axis = tuple(axes) if axes else None
    got, = run(lambda t: getattr(ops, name)(t, axis, keepdims), x)
    assert_close(got, getattr(np, name)(x.astype(np.float64), axis=axis, keepdims=keepdims).astype(np.float32))


def test_reduce_bool_and_int():
    b = np.array([[True, False, False], [False, False, False]])
    got = run(lambda t: [ops.max(t, 1), ops.min(t, 1)], b)
    np.testing.assert_array_equal(got[0], b.any(1))
    np.testing.assert_array_equal(got[1], b.all(1))
    i = np.arange(12, dtype=np.int64).reshape(3, 4) - 5
    got = run(lambda t: [ops.sum(t, 0), ops.max(t, 1, keepdims=True)], i)
    np.testing.assert_array_equal(got[0], i.sum(0))
    np.testing.assert_array_equal(got[1], i.max(1, keepdims=True))


def test_a_sum_in_a_given_dtype_is_one_reduction_of_the_narrow_elements():
    """`ops.sum(x, dtype=...)` as numpy's: bytes summed in int32 past where uint8 would wrap, by one operator (no
    cast of x first); over no axes, the elements converted; a dtype for anything but a sum is refused."""
    x = np.random.default_rng(7).integers(0, 256, (3, 70, 5)).astype(np.uint8)
    got = run(lambda t: [ops.sum(t, 1, dtype="int32"), ops.sum(t, (0, 2), True, dtype=np.int64),
                         ops.sum(t, (), dtype="int32")], x)
    for g, want in zip(got, [x.sum(1, dtype=np.int32), x.sum((0, 2), keepdims=True, dtype=np.int64),
                             x.astype(np.int32)]):
        assert g.dtype == want.dtype
        np.testing.assert_array_equal(g, want)
    graph = tg.trace(lambda t: ops.sum(t, 1, dtype="int32"), tg.input("x", x.shape, x.dtype))
    assert [op.kind for op in graph.nodes] == ["reduce_sum"]
    with pytest.raises(TypeError, match="sums only"):
        ops.Reduce([tg.input("x", (3,), "uint8")], {"op": "max", "axes": 0, "keepdims": False, "dtype": "int32"})


@pytest.mark.parametrize("axis", [0, 1, -1])
def test_softmax_family(axis):
    x = rand((3, 4, 5), axis + 10, low=-5, high=5)
    got = run(lambda t: [ops.softmax(t, axis), ops.log_softmax(t, axis)], x)
    x64 = x.astype(np.float64)
    e = np.exp(x64 - x64.max(axis, keepdims=True))
    assert_close(got[0], (e / e.sum(axis, keepdims=True)).astype(np.float32))
    assert_close(got[1], np.log(e / e.sum(axis, keepdims=True)).astype(np.float32), atol=1e-5)


def test_norms():
    x, w, b = rand((2, 3, 8), 1), rand((8,), 2), rand((8,), 3)
    got = run(lambda t, wt, bt: [ops.layer_norm(t, wt, bt, eps=1e-5), ops.rms_norm(t, wt, eps=1e-6),
                                 ops.layer_norm(t, eps=1e-5, axis=1)], x, w, b)
    x64 = x.astype(np.float64)
    mu, var = x64.mean(-1, keepdims=True), x64.var(-1, keepdims=True)
    assert_close(got[0], ((x64 - mu) / np.sqrt(var + 1e-5) * w + b).astype(np.float32), atol=1e-5)
    assert_close(got[1], (x64 / np.sqrt((x64 ** 2).mean(-1, keepdims=True) + 1e-6) * w).astype(np.float32), atol=1e-5)
    mu, var = x64.mean((1, 2), keepdims=True), x64.var((1, 2), keepdims=True)
    assert_close(got[2], ((x64 - mu) / np.sqrt(var + 1e-5)).astype(np.float32), atol=1e-5)


@pytest.mark.parametrize("shape", [(2, 3, 5, 7), (1, 4, 9), (3, 1, 1, 2, 3)])
def test_instance_norm_scales_per_channel_in_its_own_kernel(shape):
    """An instance norm is one LayerNorm from axis 2 whose per-channel weight and bias its last definition applies
    (no elementwise operator after it: a pass over the tensor fewer, InstanceNormalization of (1, 64, 256, 256)
    2.0 -> 1.3-1.5 ms on the cpu); numpy's per-channel statistics are the oracle, and shapes that do not fit are
    refused."""
    c = shape[1]
    x, w, b = rand(shape, 1), rand((c,), 2), rand((c,), 3)
    t, wt, bt = tg.input("x", shape), tg.input("w", (c,)), tg.input("b", (c,))
    g = tg.Graph([t, wt, bt], [ops.instance_norm(t, wt, bt, eps=1e-5)])
    assert [op.kind for op in g.nodes if op.kind != "reshape"] == ["layer_norm"]
    x64, axes = x.astype(np.float64), tuple(range(2, len(shape)))
    mu, var = x64.mean(axes, keepdims=True), x64.var(axes, keepdims=True)
    per_channel = (c,) + (1,) * (len(shape) - 2)
    want = (x64 - mu) / np.sqrt(var + 1e-5) * w.reshape(per_channel) + b.reshape(per_channel)
    assert_close(g(x, w, b)[0], want.astype(np.float32), atol=1e-5)
    with pytest.raises(ValueError, match=r"a weight and bias of shape \(C,\), one per channel; got x \(2, 3, 5, 7\), "
                                         r"weight \(4,\)"):
        ops.instance_norm(tg.input("x", (2, 3, 5, 7)), rand((4,), 0), rand((4,), 1))
    with pytest.raises(ValueError, match=r"per-channel weight and bias must have shape \(3, 1, 1\)"):
        tg.ops.LayerNorm([tg.input("x", (2, 3, 5, 7)), tg.constant(rand((3, 5, 1), 0))],
                         {"axis": 2, "eps": 1e-5, "has_weight": True, "per_channel": True})


def test_batch_norm_and_lrn():
    x = rand((2, 6, 3, 3), 4)
    mean, var, w, b = rand((6,), 5), rand((6,), 6, low=0.5, high=2), rand((6,), 7), rand((6,), 8)
    got = run(lambda t: [ops.batch_norm(t, mean, var, w, b, eps=1e-3), ops.lrn(t, 3, 1e-2, 0.75, 1.0)], x)
    c = (slice(None), None, None)
    want = (x - mean[c]) / np.sqrt(var[c] + 1e-3) * w[c] + b[c]
    assert_close(got[0], want.astype(np.float32), atol=1e-5)
    sq = np.pad(x.astype(np.float64) ** 2, ((0, 0), (1, 1), (0, 0), (0, 0)))
    window = sum(sq[:, k:k + 6] for k in range(3))
    assert_close(got[1], (x / (1.0 + 1e-2 / 3 * window) ** 0.75).astype(np.float32), atol=1e-6)


@pytest.mark.parametrize("sa, sb", [((3, 4), (4, 5)), ((2, 3, 4), (4, 5)), ((2, 1, 3, 4), (3, 4, 2)), ((4,), (4, 3)),
                                    ((2, 3, 4), (4,)), ((4,), (4,))])
def test_matmul_numpy_semantics(sa, sb):
    a, b = rand(sa, 1), rand(sb, 2)
    got, = run(ops.matmul, a, b)
    assert_close(got, np.matmul(a.astype(np.float64), b.astype(np.float64)).astype(np.float32), rtol=1e-5)


def test_linear():
    x, w, b = rand((3, 6), 1), rand((4, 6), 2), rand((4,), 3)
    got, = run(lambda t: ops.linear(t, w, b), x)
    assert_close(got, (x @ w.T + b).astype(np.float32), rtol=1e-5)


def conv_reference(x, w, stride, pads, dilation, groups):
    """Direct convolution in float64 (pads: (top, left, bottom, right); stride and dilation an int or one per
    axis)."""
    x = np.pad(x.astype(np.float64), ((0, 0), (0, 0), (pads[0], pads[2]), (pads[1], pads[3])))
    n, _, h, wd = x.shape
    o, cg, kh, kw = w.shape
    (sh, sw), (dh, dw) = np.broadcast_to(stride, 2), np.broadcast_to(dilation, 2)
    oh = (h - dh * (kh - 1) - 1) // sh + 1
    ow = (wd - dw * (kw - 1) - 1) // sw + 1
    out = np.zeros((n, o, oh, ow))
    for g in range(groups):
        xs = x[:, g * cg:(g + 1) * cg]
        ws = w[g * (o // groups):(g + 1) * (o // groups)].astype(np.float64)
        for i in range(kh):
            for j in range(kw):
                rows = slice(i * dh, i * dh + sh * oh, sh)
                patch = xs[:, :, rows, j * dw:j * dw + sw * ow:sw]
                out[:, g * (o // groups):(g + 1) * (o // groups)] += np.einsum("nchw,oc->nohw", patch, ws[:, :, i, j])
    return out


@pytest.mark.parametrize("stride, pads, dilation, groups", [(1, (1, 1, 1, 1), 1, 1), (2, (0, 1, 1, 0), 1, 2),
                                                            (1, (2, 2, 2, 2), 2, 1), (3, (1, 1, 1, 1), 1, 4)])
def test_conv2d(stride, pads, dilation, groups):
    x, w, b = rand((2, 4, 9, 7), 1), rand((8, 4 // groups, 3, 3), 2), rand((8,), 3)
    got, = run(lambda t: ops.conv2d(t, w, b, stride=stride, padding=pads, dilation=dilation, groups=groups), x)
    want = conv_reference(x, w, stride, pads, dilation, groups) + b[None, :, None, None]
    assert_close(got, want.astype(np.float32), rtol=1e-5, atol=1e-5)


def conv_operand(shape, integer: bool, seed: int, weights: bool = False) -> np.ndarray:
    """A convolution's operand: f32 (`rand`), or for an integer convolution uint8 inputs and int8 weights over their
    whole ranges."""
    if not integer:
        return rand(shape, seed)
    low, high, dtype = (-128, 128, np.int8) if weights else (0, 256, np.uint8)
    return np.random.default_rng(seed).integers(low, high, shape).astype(dtype)


def assert_convolution(got, want, integer: bool) -> None:
    """`got` equals the f64 reference `want`: exactly for an integer convolution, else to f32's rounding."""
    if integer:
        np.testing.assert_array_equal(got, want.astype(np.int64))
    else:
        assert_close(got, want.astype(np.float32), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("integer", [False, True])
@pytest.mark.parametrize("channels_last", [False, True])
@pytest.mark.parametrize("stride, pads, dilation, groups", [(1, (1, 1), 1, 1), (2, (0, 2), 2, 2), (1, (2, 2), 1, 6)])
def test_1d_convolutions_run_as_2d_ones_of_one_row(integer, channels_last, stride, pads, dilation, groups):
    """A 1-D convolution (float or 8-bit integer, either layout, grouped and depthwise) runs on stdlib_ops.conv as a
    2-D one over an image of one row, not by its definitions (a reduce: 761 ms for 256 -> 256 channels over 1000
    positions, 2.7 ms so)."""
    x, w = conv_operand((2, 6, 23), integer, 1), conv_operand((6, 6 // groups, 3), integer, 2, weights=True)
    conv = ops.integer_conv if integer else ops.conv
    t = tg.input("x", (2, 23, 6) if channels_last else x.shape, x.dtype)
    g = tg.trace(lambda t: conv(t, w, stride=stride, padding=pads, dilation=dilation, groups=groups,
                                channels_last=channels_last), t)
    got, = g(x.transpose(0, 2, 1).copy() if channels_last else x)
    want = conv_reference(x[:, :, None], w[:, :, None], stride, (0, pads[0], 0, pads[1]), dilation, groups)[:, :, 0]
    assert_convolution(got.transpose(0, 2, 1) if channels_last else got, want, integer)
    names = [k.name for k in g.compile().kernels]
    assert names and not any(name.startswith("conv_reduce") for name in names), names     # not the definitions


def conv3d_reference(x, w, stride, pads, dilation, groups):
    """A 3-D convolution in float64 as sums over the kernel's depth of `conv_reference`'s 2-D ones (stride, pads
    (d, h, w begins, then ends) and dilation per axis)."""
    xd = np.pad(x.astype(np.float64), ((0, 0), (0, 0), (pads[0], pads[3]), (0, 0), (0, 0)))
    kd = w.shape[2]
    od = (xd.shape[2] - dilation[0] * (kd - 1) - 1) // stride[0] + 1
    depths = []
    for o in range(od):
        planes = [conv_reference(xd[:, :, o * stride[0] + k * dilation[0]], w[:, :, k], stride[1:],
                                 (pads[1], pads[2], pads[4], pads[5]), dilation[1:], groups) for k in range(kd)]
        depths.append(np.sum(planes, axis=0))
    return np.stack(depths, axis=2)


@pytest.mark.parametrize("integer", [False, True])
@pytest.mark.parametrize("channels_last", [False, True])
@pytest.mark.parametrize("stride, pads, dilation, groups", [((1, 1, 1), (1, 1, 1, 1, 1, 1), (1, 1, 1), 1),
                                                            ((2, 1, 2), (0, 1, 0, 2, 0, 1), (2, 1, 1), 2)])
def test_3d_convolutions_run_as_2d_ones_of_the_depth_stacked_input(integer, channels_last, stride, pads, dilation,
                                                                    groups):
    """A 3-D convolution (float or 8-bit integer, either layout, grouped, strided, dilated and padded in depth)
    runs on stdlib_ops.conv as the 2-D one of its depth-stacked input, not by its definitions (13.8 s for 64 -> 64
    channels 3x3x3 over 8x28x28, 12.4 ms so)."""
    w = conv_operand((6, 4 // groups, 3, 2, 3), integer, 10, weights=True)
    conv = ops.integer_conv if integer else ops.conv
    shape = (2, 7, 6, 5, 4) if channels_last else (2, 4, 7, 6, 5)
    x_input = tg.input("x", shape, np.uint8 if integer else w.dtype)
    g = tg.trace(lambda t: conv(t, w, stride=stride, padding=pads, dilation=dilation, groups=groups,
                                channels_last=channels_last), x_input)
    compiled = g.compile()
    for seed in range(3):      # new inputs at each run: the compiled graph's replay too
        x = conv_operand((2, 4, 7, 6, 5), integer, seed)
        got = compiled(x.transpose(0, 2, 3, 4, 1).copy() if channels_last else x)[0]
        want = conv3d_reference(x, w, stride, pads, dilation, groups)
        assert_convolution(got.transpose(0, 4, 1, 2, 3) if channels_last else got, want, integer)
    names = [k.name for k in compiled.kernels]
    assert names[0].startswith("stacked") and not any(name.startswith("conv_reduce") for name in names), names


@pytest.mark.parametrize("rank", [1, 3])
@pytest.mark.parametrize("integer", [False, True])
def test_1d_and_3d_convolutions_on_a_gpu(simulated_gpu, integer, rank):
    """On a (simulated) GPU a 1-D or 3-D convolution is the template's GEMM with the implicit im2col of a one-row
    image or of the depth-stacked input (f32: SIMT; 8-bit: the 8-bit tensor cores), equal to the reference."""
    x_shape, w_shape = ((2, 16, 19), (8, 16, 3)) if rank == 1 else ((1, 8, 5, 6, 7), (8, 8, 3, 3, 3))
    x, w = conv_operand(x_shape, integer, 3), conv_operand(w_shape, integer, 4, weights=True)
    t = tg.input("x", x.shape, x.dtype)
    padding = (1, 2) if rank == 1 else (1, 0, 1, 1, 2, 0)
    g = tg.Graph([t], [(ops.integer_conv if integer else ops.conv)(t, tg.constant(w), stride=2, padding=padding)])
    compiled = g.compile("cuda")
    if rank == 1:
        want = conv_reference(x[:, :, None], w[:, :, None], 2, (0, 1, 0, 2), 1, 1)[:, :, 0]
    else:
        want = conv3d_reference(x, w, (2, 2, 2), padding, (1, 1, 1), 1)
    for _ in range(2):
        assert_convolution(compiled(x)[0], want, integer)
    names = [kernel.name for kernel, _ in simulated_gpu.launches]
    assert any(name.startswith("tc_matmul_" if integer else "simt_matmul") for name in names), names


@pytest.mark.parametrize("channels_last", [False, True])
@pytest.mark.parametrize("stride, pads, dilation, groups", [(1, (1, 1, 1, 1), 1, 1), (2, (0, 1, 1, 0), 2, 2)])
def test_integer_conv_is_exact(channels_last, stride, pads, dilation, groups):
    """integer_conv of u8 by s8 over their whole ranges: exact int32, either layout; float operands are refused."""
    x, w = conv_operand((2, 4, 9, 7), True, groups), conv_operand((6, 4 // groups, 3, 3), True, groups, weights=True)
    xin = x.transpose(0, 2, 3, 1).copy() if channels_last else x
    got, = run(lambda t: ops.integer_conv(t, w, stride, pads, dilation, groups, channels_last), xin)
    want = conv_reference(x, w, stride, pads, dilation, groups).astype(np.int64)
    assert got.dtype == np.int32
    np.testing.assert_array_equal(got.transpose(0, 3, 1, 2) if channels_last else got, want)
    with pytest.raises(TypeError, match="integer_conv needs int8 or uint8 tensors, got f32 and i8"):
        tg.trace(lambda t: ops.integer_conv(t, w), tg.input("x", x.shape, np.float32))


@pytest.mark.parametrize("rank, groups", [(2, 1), (2, 4), (1, 2), (3, 1)])
def test_bf16_convolutions_run_on_the_templates(rank, groups):
    """A bf16 convolution runs on the templates (or depthwise the direct kernel) in bf16, its products summed in f32
    and rounded to bf16 once, as its definitions sum: equal to their evaluation but for a last-bit rounding of a
    differently ordered sum; new inputs at each run (the replay); no f32 copies of the input or the output."""
    import ml_dtypes
    bf16 = ml_dtypes.bfloat16
    spatial = {1: (23,), 2: (9, 7), 3: (5, 6, 7)}[rank]
    w = rand((8, 8 // groups) + (3,) * rank, 2).astype(bf16)
    t = tg.input("x", (2, 8) + spatial, bf16)
    g = tg.trace(lambda t: ops.conv(t, w, padding=1, groups=groups), t)
    compiled = g.compile()
    for seed in range(3):
        x = rand((2, 8) + spatial, seed).astype(bf16)
        got, = compiled(x)
        want, = g.reference(x)
        assert got.dtype == bf16
        np.testing.assert_allclose(got.astype(np.float32), want.astype(np.float32), rtol=2**-7, atol=2**-7)
    names = [k.name for k in compiled.kernels]
    assert not any(name.startswith(("cast", "conv_reduce")) for name in names), names


@pytest.mark.parametrize("target", ["cpu", "cuda"])
def test_bf16_matmuls_run_on_the_templates(simulated_gpu, target):
    """A bf16 matmul (constant B, batched A) runs on the matmul templates (the cpu's register tile or small kernel,
    a GPU's tensor cores), not by its definitions, its prologue and epilogue fused in (four kernels before); equal
    to their evaluation but for bf16 roundings of differently ordered sums."""
    import ml_dtypes
    b, bias = rand((48, 40), 2).astype(ml_dtypes.bfloat16), rand((40,), 3).astype(ml_dtypes.bfloat16)
    t = tg.input("a", (3, 37, 48), ml_dtypes.bfloat16)
    g = tg.Graph([t], [ops.relu(ops.matmul(ops.elementwise("abs", t), tg.constant(b)) + tg.constant(bias))])
    compiled = g.compile(target)
    for seed in range(3):
        a = rand((3, 37, 48), seed).astype(ml_dtypes.bfloat16)
        got, want = compiled(a)[0], g.reference(a)[0]
        assert got.dtype == ml_dtypes.bfloat16
        np.testing.assert_allclose(got.astype(np.float32), want.astype(np.float32), rtol=2**-7, atol=2**-6)
    names = [k.name for k in compiled.kernels]
    assert len(names) == 1 and "matmul" in names[0] and names[0].endswith("fused"), names


def test_bf16_convolutions_on_a_gpu_run_on_tensor_cores(simulated_gpu):
    """On a (simulated) GPU a bf16 convolution is the tensor-core template's implicit-im2col GEMM (mma.sync of bf16
    into f32), its bias and ReLU fused into the stores, run after run."""
    import ml_dtypes
    bf16 = ml_dtypes.bfloat16
    w, b = rand((16, 8, 3, 3), 2).astype(bf16), rand((16,), 3).astype(bf16)
    t = tg.input("x", (1, 8, 9, 7), bf16)
    g = tg.trace(lambda t: ops.relu(ops.conv2d(t, w, b, padding=1)), t)
    compiled = g.compile("cuda")
    for seed in range(3):
        x = rand((1, 8, 9, 7), seed).astype(bf16)
        got = compiled(x)[0]
        assert got.dtype == bf16
        np.testing.assert_allclose(got.astype(np.float32), g.reference(x)[0].astype(np.float32),
                                   rtol=2**-7, atol=2**-7)
    assert [kernel.name for kernel in compiled.kernels] == [compiled.kernels[0].name]     # one kernel
    assert all(kernel.name.startswith("tc_matmul") for kernel, _ in simulated_gpu.launches)


def test_grouped_conv2d_with_a_prologue_and_an_epilogue():
    """A grouped convolution of 36 terms a group (on the cpu: explicit columns, the GEMM batched over images and
    groups) with a relu fused into its columns and a residual add into its stores."""
    x, w = rand((2, 12, 6, 5), 4), rand((6, 4, 3, 3), 5)
    shortcut = rand((2, 6, 6, 5), 6)
    got, = run(lambda t: ops.conv2d(ops.relu(t), w, padding=1, groups=3) + shortcut, x)
    want = conv_reference(np.maximum(x, 0), w, 1, (1, 1, 1, 1), 1, 3) + shortcut
    assert_close(got, want.astype(np.float32), rtol=1e-5, atol=1e-5)


def test_window_arguments_take_numpy_ints():
    x, w = rand((1, 4, 7, 6), 1), rand((6, 2, 3, 3), 2)
    i = np.int64
    got, = run(lambda t: ops.conv2d(t, w, stride=i(2), padding=(i(1), 0), dilation=[i(1), 1], groups=i(2)), x)
    assert_close(got, conv_reference(x, w, 2, (1, 0, 1, 0), 1, 2).astype(np.float32), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("arguments, error, message", [
    ({"groups": 2.5}, TypeError, "groups must be an int, got 2.5"),
    ({"groups": True}, TypeError, "groups must be an int"),
    ({"stride": 1.5}, TypeError, "stride must be integers, got 1.5"),
    ({"padding": "same"}, TypeError, "padding must be integers, got 'same'"),
    ({"padding": (1, 1.0)}, TypeError, r"padding must be integers, got \(1, 1.0\)"),
    ({"padding": (1, 1, 1)}, ValueError, r"padding must be an integer, 2 of them .* or 4"),
    ({"dilation": (1, 1, 1)}, ValueError, "dilation must be an integer or 2 of them"),
])
def test_window_arguments_are_checked(arguments, error, message):
    x = tg.input("x", (1, 4, 6, 6))
    with pytest.raises(error, match=message):
        ops.conv2d(x, rand((6, 2, 3, 3), 0), **{"groups": 2, **arguments})
    if "groups" not in arguments:
        with pytest.raises(error, match=message):
            ops.max_pool2d(x, 2, **arguments)
    with pytest.raises(TypeError, match="kernel_size must be integers, got 2.5"):
        ops.max_pool2d(x, 2.5)


def test_linear_errors_name_the_given_shapes():
    x = tg.input("x", (3, 6))
    with pytest.raises(ValueError, match=r"weight must be \(out_features, in_features\).*x \(3, 6\) and weight "
                                         r"\(6, 4\)"):
        ops.linear(x, rand((6, 4), 0))
    with pytest.raises(ValueError, match=r"one value per output feature, shape \(4,\), got \(3, 4\)"):
        ops.linear(x, rand((4, 6), 0), rand((3, 4), 1))


def window_taps(size, k, s, pad_begin, pad_end, dilation, ceil_mode) -> list:
    """Per output position along one axis of `size`, the input positions its window's k taps read (padding's
    outside [0, size))."""
    span = size + pad_begin + pad_end - (dilation * (k - 1) + 1)
    o = -(-span // s) + 1 if ceil_mode else span // s + 1
    if ceil_mode and (o - 1) * s >= size + pad_begin:
        o -= 1
    return [[i * s - pad_begin + t * dilation for t in range(k)] for i in range(o)]


def pool_reference(x, mode, k, s, pads, dilation, ceil_mode, include_pad):
    """Pooling by explicit windows over a padded array (pads: (top, left, bottom, right))."""
    n, c, h, w = x.shape
    taps_h, taps_w = (window_taps(size, k, s, pads[a], pads[a + 2], dilation, ceil_mode)
                      for a, size in enumerate((h, w)))
    out = np.zeros((n, c, len(taps_h), len(taps_w)))
    for i, rows in enumerate(taps_h):
        for j, cols in enumerate(taps_w):
            vals, count = [], 0
            for r in rows:
                for q in cols:
                    if 0 <= r < h and 0 <= q < w:
                        vals.append(x[:, :, r, q])
                    if include_pad and -pads[0] <= r < h + pads[2] and -pads[1] <= q < w + pads[3]:
                        count += 1
            if mode == "max":
                out[:, :, i, j] = np.max(vals, axis=0)
            else:
                out[:, :, i, j] = np.sum(vals, axis=0) / (count if include_pad else len(vals))
    return out


@pytest.mark.parametrize("mode", ["max", "avg"])
@pytest.mark.parametrize("k, s, pads, dilation, ceil_mode, include_pad", [
    (2, 2, (0, 0, 0, 0), 1, False, True), (3, 2, (1, 1, 1, 1), 1, True, False), (3, 1, (1, 0, 0, 1), 2, False, True),
    (2, 3, (1, 1, 1, 1), 1, True, True)])
def test_pool2d(mode, k, s, pads, dilation, ceil_mode, include_pad):
    x = rand((2, 3, 7, 8), 9)
    got, = run(lambda t: ops.pool(t, mode, k, s, pads, dilation, ceil_mode, include_pad), x)
    assert_close(got, pool_reference(x, mode, k, s, pads, dilation, ceil_mode, include_pad).astype(np.float32))


@pytest.mark.parametrize("mode, k, s, pads, dilation, ceil_mode, include_pad, params", [
    ("max", 3, 2, (1, 1, 1, 1), 1, True, False, ["X", "Y"]),
    ("max", 2, 1, (0, 1, 1, 0), 2, True, False, ["X", "Y"]),
    ("avg", 3, 1, (1, 0, 0, 1), 2, False, False, ["X", "Y"])])
def test_pool2d_specialized_outside_fast_compile(mode, k, s, pads, dilation, ceil_mode, include_pad, params):
    """Without td.fast_compile a pooling layer gets a kernel of its own shapes (no size parameters: the
    window is unrolled and its arithmetic folds; a cpu max or average pool is stdlib_ops.pool's row kernel with
    the window built in); the values are those of the generic kernel's reference."""
    td.fast_compile(False)          # the conftest fixture sets it again for the next test
    x = tg.input("x", (2, 3, 7, 8))
    pooling_kept = [p for p in passes.PIPELINE if p is not passes.avg_pool_as_conv]     # (it rewrites avg pools)
    cg = tg.Graph([x], [ops.pool(x, mode, k, s, pads, dilation, ceil_mode, include_pad)]).compile("cpu", pooling_kept)
    xa = rand((2, 3, 7, 8), 9)
    got, = cg(xa)
    kernel, = cg.kernels
    assert [name for name, _ in kernel.params] == params
    assert_close(got, pool_reference(xa, mode, k, s, pads, dilation, ceil_mode, include_pad).astype(np.float32))


@settings(max_examples=40, deadline=None)
@given(mode=st.sampled_from(["max", "avg"]), width=st.sampled_from([1, 6, 9, 10, 11, 18, 19, 20, 34, 35, 36, 75]),
       k=st.integers(1, 4), s=st.integers(1, 3), pads=st.tuples(*[st.integers(0, 3)] * 4),
       dilation=st.integers(1, 2), ceil_mode=st.booleans(), include_pad=st.booleans(), seed=st.integers(0, 2**16))
def test_pool2d_rows_of_every_chunk_width(mode, width, k, s, pads, dilation, ceil_mode, include_pad, seed):
    """The cpu's row kernel takes each output row's interior in whole chunks of 32, 16 or 8 columns, the last one
    overlapping the one before, and the edges' columns (and a shorter interior) one at a time: widths around each
    chunk's, any window, asymmetric pads, dilation and ceil mode, against explicit windows in numpy (the generic
    kernel: one compile; a layer's own, the same code with its window folded, above)."""
    span = dilation * (k - 1) + 1
    pads = tuple(min(p, span - 1) for p in pads)
    x = tg.input("x", (1, 2, 5, width))
    if any(n + pads[i] + pads[i + 2] < span for i, n in enumerate((5, width))):
        return                                          # the window does not fit
    if any(all(not 0 <= t < n for t in taps) for i, n in enumerate((5, width))
           for taps in window_taps(n, k, s, pads[i], pads[i + 2], dilation, ceil_mode)):
        return                  # a window of padding alone (its dilated taps step over the input): no defined result
    xa = rand((1, 2, 5, width), seed)
    got, = tg.Graph([x], [ops.pool(x, mode, k, s, pads, dilation, ceil_mode, include_pad)]).compile("cpu")(xa)
    assert_close(got, pool_reference(xa, mode, k, s, pads, dilation, ceil_mode, include_pad).astype(np.float32))


def test_global_pools_and_1d_3d_pools():
    x1, x3 = rand((2, 3, 9), 1), rand((1, 2, 5, 4, 6), 2)
    got = run(lambda a, b: [ops.global_avg_pool(a), ops.pool(a, "max", 3, 2), ops.pool(b, "avg", (2, 2, 3), 1)], x1, x3)
    assert_close(got[0], x1.mean(2, keepdims=True))
    assert_close(got[1], np.stack([x1[:, :, i:i + 3].max(2) for i in range(0, 7, 2)], 2))
    win = np.lib.stride_tricks.sliding_window_view(x3.astype(np.float64), (2, 2, 3), axis=(2, 3, 4))
    assert_close(got[2], win.mean((-3, -2, -1)).astype(np.float32))


def test_large_slices_get_their_own_kernel_and_match_numpy():
    """Slices of SPECIALIZED_SLICE outputs or more run the definitions with starts and steps built in
    (a specialized copy), smaller ones the generic kernel; both against numpy's slicing."""
    from taskdsl.graph import runners
    x = rand((2, 64, 384), 3)
    cases = [([128], [256], [1], [2], x[:, :, 128:256]),                 # 16384 elements: specialized
             ([1, 383], [64, 0], [1, -2], [1, 2], x[:, 1:64, 383:0:-2]),   # reversed, strided: specialized
             ([1, 300], [64, 2], [2, -3], [1, 2], x[:, 1:64:2, 300:2:-3]),   # 6400 elements: generic
             ([5], [9], [1], [1], x[:, 5:9])]                             # small: the generic kernel
    for starts, stops, steps, axes, want in cases:
        inp = tg.input("x", x.shape)
        g = tg.Graph([inp], [ops.slice(inp, starts, stops, axes=axes, steps=steps)])
        cg = g.compile("cpu")
        got, = cg(x)
        np.testing.assert_array_equal(got, want)
        kernel, = cg.kernels
        generic = "start_step" in [name for name, _ in kernel.params]       # starts and steps as an argument
        assert generic == (want.size < runners.SPECIALIZED_SLICE)


def test_transforms():
    x = rand((2, 3, 4), 1)
    idx = np.array([[2, -1], [0, 1]], np.int64)
    got = run(lambda t: [
        ops.reshape(t, (4, -1)), ops.flatten(t, 2), ops.unsqueeze(ops.squeeze(ops.reshape(t, (2, 1, 12))), (0, 3)),
        ops.transpose(t, (2, 0, 1)), ops.concat([t, t * 2.0], axis=1), ops.split(t, [1, 3], axis=2)[1],
        ops.slice(t, [3, 0], [-5, 3], axes=[2, 1], steps=[-2, 2]), ops.gather(t, idx, axis=1),
        ops.expand(ops.slice(t, [0], [1], [1]), (3, 2, 2, 4)), ops.pad(t, ((0, 1), (2, 0), (1, 1)), 7.0)], x)
    want = [x.reshape(4, -1), x.reshape(6, 4), x.reshape(1, 2, 12, 1), x.transpose(2, 0, 1),
            np.concatenate([x, x * 2], axis=1), x[:, :, 1:], x[:, 0:3:2, 3::-2], np.take(x, idx, axis=1),
            np.broadcast_to(x[:, :1], (3, 2, 2, 4)), np.pad(x, ((0, 1), (2, 0), (1, 1)), constant_values=7.0)]
    for g, w in zip(got, want):
        assert_close(g, np.ascontiguousarray(w).astype(np.float32))


@settings(max_examples=8, deadline=None)
@given(shape=st.lists(st.sampled_from([1, 1, 2, 3]), min_size=2, max_size=4).map(tuple), data=st.data())
def test_a_transpose_that_moves_only_axes_of_length_1_is_a_view(shape, data):
    """Where the axes longer than 1 keep their order, a transpose is a reshape: no Transpose operator, no kernel."""
    perm = tuple(data.draw(st.permutations(range(len(shape)))))
    x = tg.input("x", shape)
    y = ops.transpose(x, perm)
    longer = [a for a in perm if shape[a] != 1]
    assert (y.producer is None or y.producer.kind != "transpose") == (longer == sorted(longer))
    got, = run(lambda t: [ops.transpose(t, perm)], rand(shape, 2))
    assert_close(got, rand(shape, 2).transpose(perm))


def resampled(x, indices, weights, axis):
    """numpy's resample: output slice o is the sum over t of weights[o, t] * x's slice indices[o, t], in f64."""
    taken = np.take(x.astype(np.float64), indices, axis=axis)      # axis replaced by (outputs, taps)
    w = weights.astype(np.float64).reshape((1,) * axis + weights.shape + (1,) * (x.ndim - axis - 1))
    return (taken * w).sum(axis=axis + 1)


@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(shape=st.lists(st.sampled_from([1, 2, 3, 7]), min_size=1, max_size=3).map(tuple), data=st.data(),
       taps=st.sampled_from([0, 1, 2, 4, 16, 17, 41]), outputs=st.sampled_from([0, 1, 5]))
def test_resample_of_any_number_of_taps_matches_numpy(shape, data, taps, outputs):
    """Taps written out (up to Resample.UNROLLED_TAPS) or reduced over; negative indices count from the end; no
    taps sum to 0."""
    axis = data.draw(st.integers(0, len(shape) - 1))
    n = shape[axis]
    rng = np.random.default_rng(taps * 7 + outputs)
    indices = rng.integers(-n, n, (outputs, taps)).astype(np.int64)
    weights = rng.uniform(-1, 1, (outputs, taps)).astype(np.float32)
    x = rand(shape, taps)
    got, = run(lambda t, i, w: ops.resample(t, i, w, axis), x, indices, weights)
    assert_close(got, resampled(x, indices, weights, axis).astype(np.float32), rtol=1e-5)


def test_resamples_of_many_taps_share_one_kernel():
    """Past Resample.UNROLLED_TAPS the taps are a reduction: one kernel for any number of them."""
    x = rand((3, 50), 1)
    kernels = []
    for taps in (17, 40):
        indices = np.arange(2 * taps).reshape(2, taps) % 50
        weights = rand((2, taps), taps)
        g = tg.trace(lambda t: [ops.resample(t, indices, weights, 1)], tg.input("x", x.shape))
        cg = g.compile()
        assert_close(cg(x)[0], resampled(x, indices, weights, 1).astype(np.float32))
        kernels += cg.kernels
    assert len(kernels) == 2 and kernels[0] is kernels[1]


def test_resample_refuses_taps_of_other_shapes_and_types():
    x = tg.input("x", (4, 5))
    with pytest.raises(ValueError, match="one shape"):
        ops.resample(x, np.zeros((2, 3), np.int64), np.zeros((2, 2), np.float32), 1)
    with pytest.raises(ValueError, match="2-d"):
        ops.resample(x, np.zeros(2, np.int64), np.zeros(2, np.float32), 1)
    with pytest.raises(TypeError, match="integer indices"):
        ops.resample(x, np.zeros((2, 3), np.float32), np.zeros((2, 3), np.float32), 1)
    with pytest.raises(IndexError):
        ops.resample(x, np.full((2, 3), 5, np.int64), np.zeros((2, 3), np.float32), 1)


@pytest.mark.parametrize("axis", [0, 1, 2])
def test_concat_of_many_tensors_some_empty(axis):
    """Each element's source is found by a balanced tree of tests over the non-empty parts (stdlib_ops'
    `part_at`, shared with stdlib_ops.concat)."""
    widths = (2, 0, 1, 3, 0, 5, 1)
    parts = [rand(tuple(w if a == axis else 3 for a in range(3)), k) for k, w in enumerate(widths)]
    got, = run(lambda *ts: [ops.concat(list(ts), axis=axis)], *parts)
    assert_close(got, np.concatenate(parts, axis=axis))


@FEW
@given(shape=small_shapes, mode=st.sampled_from(["constant", "edge", "reflect", "wrap"]), data=st.data())
def test_pad_modes_match_numpy(shape, mode, data):
    widest = (lambda d: d - 1) if mode == "reflect" else (lambda d: 4)      # wrap may go around more than once
    widths = tuple((data.draw(st.integers(0, widest(d))), data.draw(st.integers(0, widest(d)))) for d in shape)
    x = rand(shape, 3)
    got, = run(lambda t: ops.pad(t, widths, 0.5, mode=mode), x)
    want = np.pad(x, widths, mode=mode, **({"constant_values": 0.5} if mode == "constant" else {}))
    assert_close(got, want.astype(np.float32))


PARTLY_PADDED = [((0, 0), (0, 0), (3, 3), (3, 3)), ((0, 0), (2, 0), (0, 8), (36, 0)), ((1, 1), (0, 0), (0, 0), (0, 4))]


@pytest.mark.parametrize("mode", ["edge", "reflect", "wrap"])
@pytest.mark.parametrize("widths", PARTLY_PADDED)
def test_pad_modes_of_some_axes_of_long_rows_match_numpy(mode, widths):
    """Each mode reads an axis's three parts (before, inside, after) through selects that the cpu's row loops split
    at: rows of 37 padded on both sides, one side (as wide as a reflection may go), or not at all, and axes left
    unpadded, which read their own index."""
    x = rand((2, 3, 9, 37), 5)
    got, = run(lambda t: ops.pad(t, widths, mode=mode), x)
    np.testing.assert_array_equal(got, np.pad(x, widths, mode=mode))


@pytest.mark.parametrize("shape", [(1,), (5,), (3, 4)])
def test_wrap_pads_as_wide_as_the_axis_and_wider_match_numpy(shape):
    """Wrap padding at most an axis wide finds its source by a select (`Pad`'s wraps_once), wider by a modulo: both
    at the boundary, each side, against numpy.pad."""
    x = rand(shape, 4)
    for around in ((lambda d: (d, d)), (lambda d: (d + 1, 0)), (lambda d: (0, 2 * d + 1))):
        widths = tuple(around(d) for d in shape)
        got, = run(lambda t: ops.pad(t, widths, mode="wrap"), x)
        np.testing.assert_array_equal(got, np.pad(x, widths, mode="wrap"))


def test_pad_refuses_reflections_wider_than_the_axis_empty_axes_and_unknown_modes():
    x = tg.input("x", (3, 0))
    with pytest.raises(ValueError, match="at most 2"):
        ops.pad(tg.input("y", (3,)), ((3, 0),), mode="reflect")
    with pytest.raises(ValueError, match="empty"):
        ops.pad(x, ((0, 0), (1, 0)), mode="edge")
    with pytest.raises(ValueError, match="not one of"):
        ops.pad(x, ((1, 0), (0, 0)), mode="symmetric")


def test_tensor_operators_trace_ops():
    x, w = rand((3, 4), 1), rand((4, 2), 2)
    got = run(lambda t, u: [(-(t * 2.0 + 1.0) / 4.0 - t ** 2.0) @ u, t.T.reshape(2, 6)], x, w)
    x64 = x.astype(np.float64)
    assert_close(got[0], ((-(x64 * 2 + 1) / 4 - x64 ** 2) @ w).astype(np.float32), rtol=1e-5)
    assert_close(got[1], np.ascontiguousarray(x.T).reshape(2, 6))


def test_gelu_and_silu_at_infinities_take_their_limits():
    """The graph's gelu and silu use stdlib's formulas: 0 at -inf (their textbook forms give -inf * 0, NaN)."""
    x = tg.input("x", (4,), "float32")
    got = tg.Graph([x], [ops.gelu(x), ops.gelu(x, approximate="tanh"), ops.silu(x)]).compile()(
        np.array([-np.inf, np.inf, np.nan, -1.5], np.float32))
    phi = 0.5 * (1 + math.erf(-1.5 / math.sqrt(2)))
    tanh_phi = 0.5 * (1 + math.tanh(math.sqrt(2 / math.pi) * (-1.5 + 0.044715 * -1.5 ** 3)))
    for y, cdf in zip(got, (phi, tanh_phi, 1 / (1 + math.exp(1.5)))):
        np.testing.assert_array_equal(y[:3], np.array([0.0, np.inf, np.nan], np.float32))
        np.testing.assert_allclose(y[3], -1.5 * cdf, rtol=1e-5)


@pytest.mark.parametrize("dtype", ["float32", "float16"])
def test_neg_of_zero_is_negative_zero(dtype):
    """Neg was 0 - x: Neg(+0.0) gave +0.0, so 1 / Neg(0) was +inf where numpy and onnxruntime give -inf."""
    x = tg.input("x", (3,), dtype)
    got, = tg.Graph([x], [ops.neg(x)]).compile("cpu")(np.array([0.0, -0.0, 2.5], dtype))
    np.testing.assert_array_equal(np.signbit(got), [True, False, True])
    np.testing.assert_array_equal(got, [0.0, 0.0, -2.5])


def test_cubes_are_products_within_an_ulp_of_numpys_power():
    """x ** 3 (the tanh-GELU of GPT-2's exports) called libm's pow per element, 10x slower than x * x * x."""
    special = np.array([0.0, -0.0, 1.0, -1.0, np.inf, -np.inf, np.nan, 3e12, -3e12, 1e-13, 7.5], np.float32)
    x = np.concatenate([special, np.random.default_rng(3).standard_normal(997).astype(np.float32) * 40])
    got, = run(lambda t: t ** 3.0, x)
    want = np.power(x, np.float32(3))
    np.testing.assert_array_max_ulp(got, want, maxulp=2)
    assert np.signbit(got[1]) and np.isnan(got[6])
