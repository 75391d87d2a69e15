"""ONNX DFT, STFT, HannWindow, HammingWindow, BlackmanWindow and MelWeightMatrix against onnxruntime:
hypothesis-drawn shapes (size-1 and prime axes), axes (an attribute in opset 17, an input in 20), real and complex
signals, onesided, inverse, dft_length padding and cropping, frame steps and windows, mel filter banks; refusals of
invalid models."""
import numpy as np
import pytest
from hypothesis import given, note, settings
from hypothesis import strategies as st
from onnx import TensorProto, helper

import taskdsl.graph as tg
from taskdsl.graph.onnx_import import OnnxImportError, UnsupportedOnnxError

from . import assert_close, make_model, rand, run_onnxruntime

pytest.importorskip("onnxruntime")

SIZES = st.sampled_from([1, 2, 3, 5, 7])


def check(model, feeds: dict) -> None:
    """taskdsl's output is onnxruntime's within the rounding of differently ordered sums."""
    got = tg.from_onnx(model).compile()(feeds)[0]
    want = run_onnxruntime(model, feeds)[0]
    assert got.dtype == want.dtype
    assert_close(got, want, rtol=1e-4, atol=1e-5)


@settings(max_examples=8, deadline=None)
@given(data=st.data(), shape=st.lists(SIZES, min_size=1, max_size=3), parts=st.sampled_from([1, 2]),
       opset=st.sampled_from([17, 20]), seed=st.integers(0, 99))
def test_dft_matches_onnxruntime(data, shape, parts, opset, seed):
    """Forward (onesided for real signals: onnxruntime takes no complex onesided one) and inverse complex DFTs
    along any signal axis, with dft_length absent, shorter or longer than the axis."""
    rank = len(shape) + 1
    axis = data.draw(st.sampled_from(list(range(-rank, -1)) + list(range(rank - 1))), label="axis")
    inverse = parts == 2 and data.draw(st.booleans(), label="inverse")
    onesided = parts == 1 and data.draw(st.booleans(), label="onesided")
    length = data.draw(st.sampled_from([None, 1, 4, 9]), label="dft_length")
    x = rand(shape + [parts], seed)
    note(f"x = {x!r}")
    inits, names = {}, ["x", ""]
    if length is not None:
        inits["dft_length"], names[1] = np.array(length, np.int64), "dft_length"
    attrs = {"inverse": int(inverse), "onesided": int(onesided)}
    if opset >= 20:
        inits["axis"] = np.array(axis, np.int64)
        names.append("axis")
    else:
        attrs["axis"] = axis
    node = helper.make_node("DFT", names, ["y"], **attrs)
    model = make_model([node], [("x", x.shape)], [("y", [None] * rank)], inits, opset=opset)
    check(model, {"x": x})


def test_inverse_onesided_dft_is_irfft():
    """An inverse onesided DFT is numpy's irfft (onnxruntime has none), for even and odd lengths."""
    x = rand((2, 4, 2), 3)
    for length in (6, 7, 3):
        node = helper.make_node("DFT", ["x", "n"], ["y"], inverse=1, onesided=1, axis=1)
        model = make_model([node], [("x", x.shape)], [("y", [None] * 3)], {"n": np.array(length, np.int64)})
        got = tg.from_onnx(model).compile()({"x": x})[0]
        want = np.fft.irfft(x[..., 0] + 1j * x[..., 1], n=length, axis=1)[..., None]
        assert_close(got, want.astype(np.float32), rtol=1e-4, atol=1e-5)


@settings(max_examples=5, deadline=None)
@given(batch=st.sampled_from([1, 2]), length=st.sampled_from([5, 8, 13]), parts=st.sampled_from([1, 2]),
       step=st.sampled_from([1, 2, 3]), frame=st.sampled_from([1, 4, 5]), windowed=st.booleans(),
       seed=st.integers(0, 99))
def test_stft_matches_onnxruntime(batch, length, parts, step, frame, windowed, seed):
    """Frames of a real (onesided) or complex (two-sided) signal, with a Hann window or none (frame_length)."""
    x = rand((batch, length, parts), seed)
    note(f"x = {x!r}")
    inits = {"step": np.array(step, np.int64)}
    names = ["x", "step", "", "frame"]
    if windowed:
        inits["window"], names[2] = np.hanning(frame + 2)[1:-1].astype(np.float32), "window"
    inits["frame"] = np.array(frame, np.int64)
    node = helper.make_node("STFT", names, ["y"], onesided=int(parts == 1))
    model = make_model([node], [("x", x.shape)], [("y", [None] * 4)], inits)
    check(model, {"x": x})


@pytest.mark.parametrize("op", ["HannWindow", "HammingWindow", "BlackmanWindow"])
@pytest.mark.parametrize("periodic", [0, 1])
@pytest.mark.parametrize("dtype", [TensorProto.FLOAT, TensorProto.DOUBLE])
def test_windows_match_onnxruntime(op, periodic, dtype):
    """Windows of even and odd sizes and size 1 (NaN when symmetric), periodic and symmetric, float and double."""
    for size in (1, 2, 7, 10):
        node = helper.make_node(op, ["size"], ["y"], periodic=periodic, output_datatype=dtype)
        model = make_model([node], [], [("y", [None], dtype)], {"size": np.array(size, np.int64)})
        got = tg.from_onnx(model).compile()({})[0]
        want = run_onnxruntime(model, {})[0]
        assert got.dtype == want.dtype
        assert_close(got, want, rtol=1e-5, atol=1e-6)


def test_window_feeds_stft():
    """A HannWindow node's output is a constant that STFT takes as its window."""
    x = rand((1, 12, 1), 5)
    nodes = [helper.make_node("HannWindow", ["size"], ["w"]), helper.make_node("STFT", ["x", "step", "w"], ["y"])]
    inits = {"size": np.array(6, np.int64), "step": np.array(3, np.int64)}
    check(make_model(nodes, [("x", x.shape)], [("y", [None] * 4)], inits), {"x": x})


@pytest.mark.parametrize("mels, length, rate, low, high", [(8, 16, 8192, 0.0, 4096.0), (3, 9, 100, 5.0, 40.0),
                                                           (10, 64, 16000, 20.0, 8000.0), (20, 32, 1000, 0.0, 500.0),
                                                           (1, 7, 11, 1.0, 3.0)])
@pytest.mark.parametrize("dtype", [TensorProto.FLOAT, TensorProto.DOUBLE])
def test_mel_weight_matrix_matches_onnxruntime(mels, length, rate, low, high, dtype):
    """Mel filter banks with empty rising slopes (more mel bins than spectrogram bins) and without."""
    node = helper.make_node("MelWeightMatrix", ["m", "n", "r", "lo", "hi"], ["y"], output_datatype=dtype)
    inits = {"m": np.array(mels, np.int64), "n": np.array(length, np.int64), "r": np.array(rate, np.int64),
             "lo": np.array(low, np.float32), "hi": np.array(high, np.float32)}
    model = make_model([node], [], [("y", [None, None], dtype)], inits)
    got = tg.from_onnx(model).compile()({})[0]
    want = run_onnxruntime(model, {})[0]
    assert got.dtype == want.dtype
    np.testing.assert_array_equal(got, want)


def test_mel_weight_matrix_refuses_filters_past_the_bins():
    """An upper edge above the Nyquist frequency puts filters past the last bin: an invalid model."""
    node = helper.make_node("MelWeightMatrix", ["m", "n", "r", "lo", "hi"], ["y"])
    inits = {"m": np.array(4, np.int64), "n": np.array(8, np.int64), "r": np.array(100, np.int64),
             "lo": np.array(0, np.float32), "hi": np.array(200, np.float32)}
    model = make_model([node], [], [("y", [None, None])], inits)
    with pytest.raises(OnnxImportError, match="outside the 5 bins"):
        tg.from_onnx(model)


@pytest.mark.parametrize("case, error, message", [
    ({"shape": [3, 2], "axis": -1}, OnnxImportError, "not the last"),
    ({"shape": [3, 4], "axis": 0}, OnnxImportError, "1 (real) or 2 (complex) parts"),
    ({"shape": [3, 2], "axis": 0, "elem": TensorProto.INT32}, UnsupportedOnnxError, "i32 is not supported"),
    ({"shape": [3, 2], "axis": 0, "length": 0}, OnnxImportError, "dft_length must be at least 1"),
])
def test_dft_refusals(case, error, message):
    """An axis that is the parts axis, a last axis of other than 1 or 2, integers and an empty length are refused."""
    elem = case.get("elem", TensorProto.FLOAT)
    inits = {} if "length" not in case else {"n": np.array(case["length"], np.int64)}
    node = helper.make_node("DFT", ["x", "n" if inits else ""], ["y"], axis=case["axis"])
    model = make_model([node], [("x", case["shape"], elem)], [("y", [None] * len(case["shape"]), elem)], inits)
    with pytest.raises(error, match=message.replace("(", r"\(").replace(")", r"\)")):
        tg.from_onnx(model)


def test_window_refuses_size_0():
    """A window needs at least one sample."""
    node = helper.make_node("HannWindow", ["size"], ["y"])
    model = make_model([node], [], [("y", [None])], {"size": np.array(0, np.int64)})
    with pytest.raises(OnnxImportError, match="size must be at least 1"):
        tg.from_onnx(model)


def test_stft_refuses_a_frame_longer_than_the_signal():
    """A frame longer than the signal leaves no frame: an invalid model."""
    node = helper.make_node("STFT", ["x", "step", "", "frame"], ["y"])
    inits = {"step": np.array(1, np.int64), "frame": np.array(9, np.int64)}
    model = make_model([node], [("x", [1, 4, 1])], [("y", [None] * 4)], inits)
    with pytest.raises(OnnxImportError, match="exceeds the signal's length"):
        tg.from_onnx(model)
