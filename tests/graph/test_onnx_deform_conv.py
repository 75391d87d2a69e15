"""ONNX DeformConv against onnxruntime and onnx's reference evaluator (which takes no axis of size 1): hypothesis-drawn images (sizes 1 to primes),
kernels, strides, pads, dilations, groups and offset groups, with and without a bias and a mask, offsets that move
taps past the image (they read zeros) and onto whole pixels; f16 against the f32 result; the refusals. Every kernel
the tests launch is also compiled for CUDA by NVRTC (tests/conftest.py)."""
import numpy as np
import pytest
from hypothesis import given, note, settings
from hypothesis import strategies as st
from onnx import TensorProto, helper
from onnx.reference import ReferenceEvaluator

import taskdsl.graph as tg
from taskdsl.graph.onnx_import import OnnxImportError, UnsupportedOnnxError

from . import assert_close, make_model, rand, run_onnxruntime

pytest.importorskip("onnxruntime")


def deform_conv_model(x: list, w: list, out: list, extras: tuple = (), elem=TensorProto.FLOAT, **attrs):
    """A DeformConv model (opset 22) of inputs X, W, offset and `extras` (B, mask: name, shape pairs)."""
    groups = attrs.get("offset_group", 1)
    taps = w[2] * w[3]
    inputs = [("X", x, elem), ("W", w, elem), ("offset", [x[0], groups * 2 * taps] + out, elem)]
    inputs += [(name, shape, elem) for name, shape in extras]
    names = ["X", "W", "offset"] + (["B" if extras[0][0] == "B" else ""] if extras else [])
    names += ["mask"] * any(name == "mask" for name, _ in extras)
    node = helper.make_node("DeformConv", names, ["Y"], **attrs)
    return make_model([node], inputs, [("Y", [x[0], w[0]] + out, elem)], opset=22)


@settings(max_examples=8, deadline=None)
@given(data=st.data(), batch=st.sampled_from([1, 2]), image=st.lists(st.sampled_from([1, 3, 5, 7]), min_size=2,
       max_size=2), group=st.sampled_from([1, 2]), offset_group=st.sampled_from([1, 2]), bias=st.booleans(),
       mask=st.booleans(), whole=st.booleans(), seed=st.integers(0, 99))
def test_deform_conv_matches_onnxruntime(data, batch, image, group, offset_group, bias, mask, whole, seed):
    """Taps moved by fractional offsets (or whole ones: no interpolation), some past the image's edges."""
    kernel = [data.draw(st.integers(1, 3), label="kernel") for _ in range(2)]
    strides = data.draw(st.lists(st.integers(1, 2), min_size=2, max_size=2), label="strides")
    dilations = data.draw(st.lists(st.integers(1, 2), min_size=2, max_size=2), label="dilations")
    pads = data.draw(st.lists(st.integers(0, 1), min_size=4, max_size=4), label="pads")
    out = [(n + b + e - d * (k - 1) - 1) // s + 1
           for n, k, s, d, b, e in zip(image, kernel, strides, dilations, pads[:2], pads[2:])]
    if min(out) < 1:
        dilations = pads = None
        out = [(n - k) // s + 1 for n, k, s in zip(image, kernel, strides)]
        if min(out) < 1:
            kernel = [1, 1]
            out = [(n - 1) // s + 1 for n, s in zip(image, strides)]
    channels = 2 * group * offset_group
    x, w = [batch, channels] + image, [2 * group, channels // group] + kernel
    taps = kernel[0] * kernel[1]
    extras = (("B", [w[0]]),) * bias + (("mask", [batch, offset_group * taps] + out),) * mask
    attrs = dict(kernel_shape=kernel, strides=strides, group=group, offset_group=offset_group)
    attrs.update({k: v for k, v in (("dilations", dilations), ("pads", pads)) if v is not None})
    note(f"X {x}, W {w}, out {out}, {attrs}")
    model = deform_conv_model(x, w, out, extras, **attrs)
    feeds = {"X": rand(x, seed), "W": rand(w, seed + 1), "offset": rand([batch, offset_group * 2 * taps] + out,
                                                                          seed + 2, low=-2.5, high=2.5)}
    if whole:
        feeds["offset"] = np.round(feeds["offset"])
    feeds.update({name: rand(shape, seed + 3 + k) for k, (name, shape) in enumerate(extras)})
    got = tg.from_onnx(model).compile()(feeds)[0]
    assert_close(got, run_onnxruntime(model, feeds)[0], rtol=1e-4, atol=1e-5)
    if min(image) > 1:      # (the reference normalizes coordinates by size - 1 for GridSample)
        assert_close(got, ReferenceEvaluator(model).run(None, feeds)[0], rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("image, out_channels", [([6, 5], 4), ([3, 2], 8)])
def test_both_forms_of_the_product_match_onnxruntime(image, out_channels):
    """A wide image for its channels (the weights by the samples: deform_conv.WIDE_IMAGE) and a narrow one (the
    samples transposed by the weights), with two groups, two offset groups, a bias and a mask."""
    x, w, out, taps = [2, 4] + image, [out_channels, 2, 3, 3], image, 9
    extras = (("B", [out_channels]), ("mask", [2, 2 * taps] + out))
    model = deform_conv_model(x, w, out, extras, kernel_shape=[3, 3], pads=[1, 1, 1, 1], group=2, offset_group=2)
    feeds = {"X": rand(x, 1), "W": rand(w, 2), "offset": rand([2, 4 * taps] + out, 3, low=-2.5, high=2.5),
             "B": rand([out_channels], 4), "mask": rand([2, 2 * taps] + out, 5)}
    assert_close(tg.from_onnx(model).compile()(feeds)[0], run_onnxruntime(model, feeds)[0], rtol=1e-4, atol=1e-5)


def test_16_bit_deform_conv_is_computed_in_f32():
    """f16 inputs give the f32 result of the same values, rounded once."""
    x, w, out = [1, 2, 5, 4], [3, 2, 2, 2], [4, 3]
    feeds = {"X": rand(x, 1), "W": rand(w, 2), "offset": rand([1, 8] + out, 3)}
    wide = tg.from_onnx(deform_conv_model(x, w, out)).compile()(feeds)[0]
    narrow = {k: v.astype(np.float16) for k, v in feeds.items()}
    got = tg.from_onnx(deform_conv_model(x, w, out, elem=TensorProto.FLOAT16)).compile()(narrow)[0]
    want = tg.from_onnx(deform_conv_model(x, w, out)).compile()({k: v.astype(np.float32)
                                                                  for k, v in narrow.items()})[0]
    assert got.dtype == np.float16
    np.testing.assert_array_equal(got, want.astype(np.float16))
    assert_close(got.astype(np.float32), wide, rtol=2e-2, atol=2e-2)


def test_deform_conv_refusals():
    """Shapes that do not fit, and inputs other than 2-D images of floats, are clear errors."""
    with pytest.raises(OnnxImportError, match=r"offset must have shape \(1, 8, 4, 3\), got \(1, 8, 3, 3\)"):
        tg.from_onnx(deform_conv_model([1, 2, 5, 4], [3, 2, 2, 2], [3, 3]))
    with pytest.raises(OnnxImportError, match=r"do not match \(W is \(M, C / group, kH, kW\)"):
        tg.from_onnx(deform_conv_model([1, 2, 5, 4], [3, 2, 2, 2], [4, 3], group=2))
    node = helper.make_node("DeformConv", ["X", "W", "offset"], ["Y"])
    model = make_model([node], [("X", [1, 2, 5]), ("W", [3, 2, 2]), ("offset", [1, 4, 4])], [("Y", [1, 3, 4])],
                       opset=22)
    with pytest.raises(UnsupportedOnnxError, match=r"2 spatial axes \(N, C, H, W\)"):
        tg.from_onnx(model)
