"""ONNX's 8-bit floats FLOAT8E4M3FN and FLOAT8E5M2 (taskdsl's f8e4m3, f8e5m2): Cast and CastLike to them
(saturating or not) from f32 and f16 and back, QuantizeLinear to them and DequantizeLinear from them, on
hypothesis-drawn values (NaNs, infinities, ties, magnitudes past the range); refusals.

The oracle is onnx's reference evaluator (ml_dtypes' conversions, clipped where saturating), and onnxruntime where
the conversion saturates: without saturation onnxruntime 1.32 gives E4M3's 448 for 480 (NaN for 470 and for 500)
and E5M2's NaN for 61440 (the operator's table: inf). onnxruntime returns no E5M2 array, so its E5M2 results are
compared after the cast back.
Every kernel the tests launch is also compiled for CUDA by NVRTC (tests/conftest.py), and runs on a GPU in the @gpu
twins."""
import ml_dtypes
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from onnx import TensorProto, helper
from onnx.reference import ReferenceEvaluator

import taskdsl.graph as tg
from taskdsl.graph.onnx_import import OnnxImportError, UnsupportedOnnxError
from taskdsl.ir.types import FLOAT8_VALUES

from . import make_model, run_onnxruntime

pytest.importorskip("onnxruntime")

GPU_TWINS = True   # each test also runs as a @gpu twin on the cuda target (conftest.py)
FORMATS = {TensorProto.FLOAT8E4M3FN: "f8e4m3", TensorProto.FLOAT8E5M2: "f8e5m2"}
SOURCES = {TensorProto.FLOAT: np.float32, TensorProto.FLOAT16: np.float16}
# the formats' values, their midpoints (ties), the largest's neighbourhood, and far past it
SPECIAL = [0.0, -0.0, np.nan, np.inf, -np.inf, 448.0, 460.0, 464.0, 465.0, 480.0, 57344.0, 61440.0, 61441.0, 1e9,
           -1e9, 2.0 ** -9, 2.0 ** -10, 2.0 ** -16, 2.0 ** -17, 1.0625, 1.1875, -3.0]
VALUES = st.lists(st.one_of(st.sampled_from(SPECIAL), st.floats(-1e5, 1e5), st.floats(-1.0, 1.0)), min_size=1,
                  max_size=40)


def _check(model, feeds: dict, saturate: bool) -> None:
    """taskdsl's outputs are the reference evaluator's (8-bit floats as bit patterns, NaNs of either sign alike), and
    where the conversions saturate, onnxruntime's floats of 16 bits or more."""
    ours = tg.from_onnx(model).compile()(feeds)
    for got, want in zip(ours, ReferenceEvaluator(model).run(None, feeds)):
        assert got.dtype == want.dtype, (got.dtype, want.dtype)
        if want.dtype.itemsize == 1:
            _same_8_bit_floats(got, want.view(np.uint8), "f8e4m3" if want.dtype == ml_dtypes.float8_e4m3fn else
                               "f8e5m2")
        else:
            np.testing.assert_array_equal(got, want)
    if saturate:
        wide = [i for i, o in enumerate(model.graph.output) if o.type.tensor_type.elem_type not in FORMATS]
        session_model = _with_outputs(model, wide)
        for i, want in zip(wide, run_onnxruntime(session_model, feeds)):
            np.testing.assert_array_equal(ours[i], want)


def _same_8_bit_floats(got: np.ndarray, want_bits: np.ndarray, name: str) -> None:
    """An 8-bit float array holds the expected bit patterns, NaNs of either sign alike."""
    got_bits = got.view(np.uint8)
    nan = np.isnan(FLOAT8_VALUES[name][want_bits])
    np.testing.assert_array_equal(np.isnan(FLOAT8_VALUES[name][got_bits]), nan)
    np.testing.assert_array_equal(got_bits[~nan], want_bits[~nan])


def _with_outputs(model, keep: list):
    """A copy of `model` whose outputs are those at the positions `keep`."""
    copy = type(model)()
    copy.CopyFrom(model)
    outputs = [copy.graph.output[i] for i in keep]
    del copy.graph.output[:]
    copy.graph.output.extend(outputs)
    return copy


@settings(max_examples=20, deadline=None)
@given(values=VALUES, to=st.sampled_from(sorted(FORMATS)), source=st.sampled_from(sorted(SOURCES)),
       saturate=st.booleans(), like=st.booleans())
def test_cast_to_an_8_bit_float_and_back(values, to, source, saturate, like):
    """Cast (or CastLike, its target an initializer) to the format, and the result cast back to the source type."""
    with np.errstate(over="ignore"):
        x = np.array(values, SOURCES[source])
    n = x.size
    if like:
        nodes = [helper.make_node("CastLike", ["x", "like"], ["y"], saturate=int(saturate))]
        initializers = {"like": np.zeros(1, ml_dtypes.float8_e4m3fn if FORMATS[to] == "f8e4m3" else
                                         ml_dtypes.float8_e5m2)}
    else:
        nodes, initializers = [helper.make_node("Cast", ["x"], ["y"], to=to, saturate=int(saturate))], {}
    nodes.append(helper.make_node("Cast", ["y"], ["back"], to=source))
    model = make_model(nodes, [("x", [n], source)], [("y", [n], to), ("back", [n], source)], initializers, opset=21)
    _check(model, {"x": x}, saturate)


@settings(max_examples=15, deadline=None)
@given(values=VALUES, to=st.sampled_from(sorted(FORMATS)), saturate=st.booleans(), scale=st.sampled_from([0.5, 3.0]))
def test_quantize_to_and_dequantize_from_an_8_bit_float(values, to, saturate, scale):
    x = np.array(values, np.float32)
    n = x.size
    zero = np.zeros((), ml_dtypes.float8_e4m3fn if FORMATS[to] == "f8e4m3" else ml_dtypes.float8_e5m2)
    nodes = [helper.make_node("QuantizeLinear", ["x", "scale", "zero"], ["q"], saturate=int(saturate)),
             helper.make_node("DequantizeLinear", ["q", "scale", "zero"], ["y"])]
    model = make_model(nodes, [("x", [n])], [("q", [n], to), ("y", [n])],
                       {"scale": np.array(scale, np.float32), "zero": zero}, opset=21)
    _check(model, {"x": x}, saturate)


def test_a_nonzero_8_bit_float_zero_point_is_refused():
    """QuantizeLinear's definition adds no 8-bit float zero point: one that is not 0 would be ignored."""
    nodes = [helper.make_node("QuantizeLinear", ["x", "scale", "zero"], ["q"])]
    model = make_model(nodes, [("x", [3])], [("q", [3], TensorProto.FLOAT8E4M3FN)],
                       {"scale": np.array(1.0, np.float32), "zero": np.ones((), ml_dtypes.float8_e4m3fn)}, opset=21)
    with pytest.raises(OnnxImportError, match="zero point must be 0"):
        tg.from_onnx(model)


def test_the_fnuz_formats_are_refused_by_name():
    """AMD's FNUZ variants (no negative zero, one NaN) are not taskdsl types: a clear refusal, not a wrong value."""
    nodes = [helper.make_node("Cast", ["x"], ["y"], to=TensorProto.FLOAT8E4M3FNUZ)]
    model = make_model(nodes, [("x", [3])], [("y", [3], TensorProto.FLOAT8E4M3FNUZ)], opset=21)
    with pytest.raises(UnsupportedOnnxError, match="FLOAT8E4M3FNUZ is not supported; supported: .*FLOAT8E5M2"):
        tg.from_onnx(model)


def test_the_graph_api_moves_and_converts_8_bit_floats():
    """Data movement keeps the bit patterns (NaNs too); arithmetic is done in f32 and rounded once when cast."""
    rng = np.random.default_rng(7)
    xs = (rng.standard_normal((5, 7)) * 300).astype(ml_dtypes.float8_e4m3fn)
    xs[0, 0] = np.nan
    x = tg.input("x", xs.shape, "float8_e4m3fn")
    moved = tg.ops.concat([tg.ops.transpose(x, (1, 0)), tg.ops.transpose(x, (1, 0))], 0)
    summed = tg.ops.cast(tg.ops.add(tg.ops.cast(x, "float32"), 1000.0), "float8_e5m2")
    moved_out, summed_out = tg.Graph([x], [moved, summed]).compile()({"x": xs})
    assert moved_out.dtype == xs.dtype and summed_out.dtype == np.dtype(ml_dtypes.float8_e5m2)
    np.testing.assert_array_equal(moved_out.view(np.uint8), np.concatenate([xs.T, xs.T]).view(np.uint8))
    with np.errstate(invalid="ignore"):
        want = np.clip(xs.astype(np.float32) + np.float32(1000), -57344, 57344).astype(ml_dtypes.float8_e5m2)
    _same_8_bit_floats(summed_out, want.view(np.uint8), "f8e5m2")      # NaN + 1000: a NaN


def test_8_bit_float_weights_dequantized_into_a_matmul_match_onnxruntime():
    """FP8-quantized weights as a model stores them: an E4M3 initializer, dequantized by a scale into a MatMul, and
    moved (Reshape, Transpose) before a Cast; constants, so folded when the graph compiles."""
    rng = np.random.default_rng(0)
    w = (rng.standard_normal((64, 48)) * 20).astype(ml_dtypes.float8_e4m3fn)
    nodes = [helper.make_node("DequantizeLinear", ["w", "scale"], ["wf"]),
             helper.make_node("MatMul", ["x", "wf"], ["y"]),
             helper.make_node("Reshape", ["w", "shape"], ["w2"]),
             helper.make_node("Transpose", ["w2"], ["wt"], perm=[1, 0]),
             helper.make_node("Cast", ["wt"], ["wtf"], to=TensorProto.FLOAT)]
    model = make_model(nodes, [("x", [5, 64])], [("y", [5, 48]), ("wtf", [48, 64])],
                       {"w": w, "scale": np.array(0.05, np.float32), "shape": np.array([64, 48], np.int64)}, opset=21)
    x = rng.standard_normal((5, 64)).astype(np.float32)
    y, wt = tg.from_onnx(model).compile()({"x": x})
    want_y, want_wt = run_onnxruntime(model, {"x": x})
    np.testing.assert_allclose(y, want_y, rtol=1e-5, atol=1e-5)
    np.testing.assert_array_equal(wt, want_wt)
