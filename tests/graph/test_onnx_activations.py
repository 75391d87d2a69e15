"""Activation functions and elementwise math (onnx_import/activations.py) imported from one-node ONNX models and
checked against onnxruntime (onnx's reference evaluator where onnxruntime has no kernel for the type; Swish against
f64 numpy, where onnxruntime's sigmoid is too coarse), with hypothesis drawing shapes (odd, prime, 1 and 0 sizes),
attributes (or their defaults), and values among which the special ones (NaN, +-inf, -0.0) and those at and beside
the operator's thresholds. Each model runs compiled with the default passes (an operator's graph ops fused into one
kernel) and through the graph's numpy reference (what constant folding computes). Every kernel is also compiled by
NVRTC (tests/conftest.py), and each test has a @gpu twin on the cuda target (a GPU, or the simulated one with
TASKDSL_SIMULATED_GPU=1)."""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np
import onnx
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from hypothesis.extra.numpy import arrays
from onnx import TensorProto, helper

import taskdsl.graph as tg
from taskdsl.graph import OnnxImportError, UnsupportedOnnxError

from . import make_model, run_onnxruntime

pytest.importorskip("onnxruntime")

GPU_TWINS = True
n = helper.make_node
F16, F32, F64, BOOL = TensorProto.FLOAT16, TensorProto.FLOAT, TensorProto.DOUBLE, TensorProto.BOOL
INTEGERS = [TensorProto.INT8, TensorProto.INT16, TensorProto.INT32, TensorProto.INT64, TensorProto.UINT8,
            TensorProto.UINT16, TensorProto.UINT32, TensorProto.UINT64]
SIZES_OR_0 = st.sampled_from([0, 1, 2, 3, 5, 7, 13])
SHAPES = st.lists(SIZES_OR_0, max_size=3)
SPECIAL = (np.nan, np.inf, -np.inf, -0.0, 0.0)
# both compute in f32 (16-bit: rounded once), by other exp / tanh / log implementations: a few ulps apart, and an
# absolute error where a difference cancels (e^x - 1 near 0)
TOLERANCE = {F16: {"rtol": 2e-3, "atol": 1e-4}, F32: {"rtol": 1e-5, "atol": 1e-6}, F64: {"rtol": 1e-12, "atol": 1e-14}}
# (the twins' target fixture is function-scoped: the same target for every example)
EXAMPLES = settings(max_examples=8, deadline=None,
                    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])


def numpy_type(elem_type: int) -> np.dtype:
    """The numpy dtype of an ONNX element type."""
    return np.dtype(helper.tensor_dtype_to_np_dtype(elem_type))


def oracle(model: onnx.ModelProto, feeds: dict, reference: bool = False) -> list:
    """onnxruntime's outputs, or (`reference`) those of onnx's reference evaluator."""
    if reference:
        from onnx.reference import ReferenceEvaluator
        return ReferenceEvaluator(model).run(None, feeds)
    return run_onnxruntime(model, feeds)


def assert_matches(got: np.ndarray, want: np.ndarray, exact: bool = False) -> None:
    """Same dtype and shape; equal integers and bools; floats within TOLERANCE (equal if `exact`), NaN and infinities
    where the oracle has them."""
    assert got.dtype == want.dtype and got.shape == want.shape, (got.dtype, got.shape, want.dtype, want.shape)
    if want.dtype.kind in "biu" or exact:
        np.testing.assert_array_equal(got, want)
    else:
        tolerance = TOLERANCE[helper.np_dtype_to_tensor_dtype(want.dtype)]
        np.testing.assert_allclose(got.astype(np.float64), want.astype(np.float64), **tolerance)


def one_node(node: onnx.NodeProto, feeds: dict, out_type: int, opset: int) -> onnx.ModelProto:
    """The model of `node`, its inputs those of `feeds` (arrays by name), its output y of their broadcast shape."""
    shape = np.broadcast_shapes(*(x.shape for x in feeds.values()))
    inputs = [(name, list(x.shape), helper.np_dtype_to_tensor_dtype(x.dtype)) for name, x in feeds.items()]
    return make_model([node], inputs, [("y", list(shape), out_type)], opset=opset)


def check_node(node: onnx.NodeProto, feeds: dict, out_type: int, opset: int, reference: bool = False,
               exact: bool = False, numpy_oracle: Callable | None = None) -> None:
    """The one-node model of `node`: taskdsl's y, compiled and by the graph's numpy reference, matches the
    oracle's (`numpy_oracle(**feeds)` where given)."""
    model = one_node(node, feeds, out_type, opset)
    graph = tg.from_onnx(model)
    with np.errstate(all="ignore"):     # e^x overflows, inf * 0, ... (in the numpy oracles)
        want = numpy_oracle(**feeds) if numpy_oracle else oracle(model, feeds, reference)[0]
        assert_matches(graph(feeds)[0], want, exact)
        assert_matches(graph.reference(feeds)[0], want, exact)


def beside(value: float, dtype: np.dtype) -> list:
    """`value` in `dtype` (inf past its range) and its two neighbours there."""
    with np.errstate(over="ignore"):
        v = dtype.type(value)
    return [v, np.nextafter(v, dtype.type(-np.inf)), np.nextafter(v, dtype.type(np.inf))]


def float_arrays(dtype: np.dtype, shape, near=(), bound: float = 10.0, special: bool = True):
    """Arrays of `dtype`: values within +-`bound`, and unless not `special`, special values, values at and beside
    each of `near` and now and then up to the type's largest."""
    width = dtype.itemsize * 8
    elements = st.floats(-bound, bound, width=width)
    if special:
        marked = [dtype.type(v) for v in SPECIAL] + [v for t in near for v in beside(t, dtype)]
        elements = st.one_of(st.sampled_from(marked), elements,
                             st.floats(allow_nan=False, allow_infinity=False, width=width))
    return arrays(dtype, tuple(shape), elements=elements)


def integer_arrays(dtype: np.dtype, shape, low: int | None = None, high: int | None = None, nonzero: bool = False):
    """Arrays of an integer dtype, within [low, high] (default: the type's range), without 0 if `nonzero`."""
    info = np.iinfo(dtype)
    low = info.min if low is None else max(low, info.min)
    high = info.max if high is None else min(high, info.max)
    elements = st.integers(low, high)
    return arrays(dtype, tuple(shape), elements=elements.filter(bool) if nonzero else elements)


def partner_shape(data, shape: list) -> list:
    """A shape that broadcasts with `shape`: a suffix of it, some dims 1 (or, where it has 1, any size)."""
    drop = data.draw(st.integers(0, len(shape)))
    return [data.draw(SIZES_OR_0 if d == 1 else st.sampled_from([d, 1])) for d in shape[drop:]]


def attribute_values(op: str, drawn: dict) -> dict:
    """The drawn attributes, and the schema's defaults of those left out."""
    schema = onnx.defs.get_schema(op)
    return {name: drawn.get(name, helper.get_attribute_value(a.default_value)) for name, a in schema.attributes.items()}


# ---------------------------------------------------------------- unary operators of floats
REAL = st.floats(-3, 3, width=32)


@dataclass(frozen=True)
class Unary:
    """A unary operator of floats under test: its attributes' strategies, the values its results change at (from
    the attributes' values), the types onnxruntime runs it on (others against the reference evaluator)."""

    attrs: dict = field(default_factory=dict)
    thresholds: Callable = lambda a: (0.0,)
    ort_types: tuple = (F32, F16)
    out_type: int | None = None         # the output's element type, where it is not the input's
    exact: bool = False
    opset: int = 20
    in_f64: Callable | None = None      # the oracle (f64 numpy of x and the attributes) where onnxruntime's is coarse


def _swish_in_f64(x: np.ndarray, alpha: float = 1.0) -> np.ndarray:
    """x sigmoid(alpha x) in f64, rounded to x's type: onnxruntime's sigmoid is within about 2e-7 of the true one,
    so its Swish is off by 2e-7 |x|, most of the result once alpha x < -10."""
    x64 = x.astype(np.float64)
    return (x64 * (1 / (1 + np.exp(-np.float64(alpha) * x64)))).astype(x.dtype)


def _hard_sigmoid_corners(a: dict) -> tuple:
    """Where alpha x + beta is 0 and 1."""
    return (-a["beta"] / a["alpha"], (1 - a["beta"]) / a["alpha"]) if a["alpha"] else (0.0,)


UNARY = {
    "HardSigmoid": Unary({"alpha": REAL, "beta": REAL}, _hard_sigmoid_corners),
    "HardSwish": Unary(thresholds=lambda a: (-3.0, 3.0)),
    "Elu": Unary({"alpha": REAL}),
    "Selu": Unary({"alpha": st.floats(0.125, 3, width=32), "gamma": st.floats(0.125, 3, width=32)}),
    # onnxruntime's Celu is f32 only; alpha 0 is refused (test_refused_only_here)
    "Celu": Unary({"alpha": REAL.filter(bool)}, ort_types=(F32,)),
    "Softplus": Unary(thresholds=lambda a: (0.0, -88.7, 88.7, -104.0)),     # e^x's overflow and underflow in f32
    "Softsign": Unary(),
    "Mish": Unary(thresholds=lambda a: (0.0, -20.0, 20.0)),
    "ThresholdedRelu": Unary({"alpha": REAL}, lambda a: (a["alpha"],)),
    # (onnxruntime's double Shrink computes in float: the reference evaluator is its oracle)
    "Shrink": Unary({"lambd": REAL, "bias": REAL}, lambda a: (a["lambd"], -a["lambd"])),
    "Sign": Unary(ort_types=(F32, F16, F64), exact=True),
    "IsNaN": Unary(ort_types=(F32, F16, F64), out_type=BOOL),
    "IsInf": Unary({"detect_negative": st.sampled_from([0, 1]), "detect_positive": st.sampled_from([0, 1])},
                   ort_types=(F32, F16, F64), out_type=BOOL),
    "Round": Unary(thresholds=lambda a: (0.5, -0.5, 1.5, -2.5, 3.5, 2**22 + 0.5, 2**52 + 0.5),
                   ort_types=(F32, F16, F64), exact=True),
    "Tan": Unary(thresholds=lambda a: (np.pi / 2, -np.pi / 2, 3 * np.pi / 2, np.pi)),
    "Swish": Unary({"alpha": REAL}, opset=24, in_f64=_swish_in_f64),
}


@EXAMPLES
@pytest.mark.parametrize("op", sorted(UNARY))
@given(shape=SHAPES, data=st.data())
def test_unary_operator(op, shape, data):
    """Each type onnxruntime runs the operator on, and doubles; attributes drawn or left to their defaults."""
    case = UNARY[op]
    drawn = {name: data.draw(s, label=name) for name, s in case.attrs.items() if data.draw(st.booleans())}
    # the reference evaluator reads an attribute of 0 as its default (`alpha or self.alpha`)
    elem_type = data.draw(st.sampled_from(case.ort_types + ((F64,) if all(drawn.values()) else ())), label="type")
    dtype = numpy_type(elem_type)
    if op == "Softsign" and elem_type == F64:
        shape = shape or [1]    # the reference evaluator's Softsign fails on a 0-d x (np.divide's out= a scalar)
    x = data.draw(float_arrays(dtype, shape, case.thresholds(attribute_values(op, drawn))), label="x")
    if op == "Sign" and elem_type == F16:
        x[np.isnan(x)] = 0      # onnxruntime's f16 Sign gives 0 at NaN (its f32 and f64 give NaN, as taskdsl does)
    in_f64 = (lambda x: case.in_f64(x, **drawn)) if case.in_f64 else None
    check_node(n(op, ["x"], ["y"], **drawn), {"x": x}, case.out_type or elem_type, opset=case.opset,
               reference=elem_type not in case.ort_types, exact=case.exact, numpy_oracle=in_f64)


# ---------------------------------------------------------------- integers: Sign and Shrink
@EXAMPLES
@given(shape=SHAPES, elem_type=st.sampled_from(INTEGERS), data=st.data())
def test_sign_of_integers(shape, elem_type, data):
    """Every integer type, over its whole range."""
    x = data.draw(integer_arrays(numpy_type(elem_type), shape), label="x")
    check_node(n("Sign", ["x"], ["y"]), {"x": x}, elem_type, opset=20)


@EXAMPLES
@given(shape=SHAPES, elem_type=st.sampled_from(INTEGERS), lambd=st.floats(-2, 3, width=32), data=st.data())
def test_shrink_of_integers(shape, elem_type, lambd, data):
    """Values within +-100 and biases of eighths, so that x -+ bias is within the type (a value outside is undefined
    in onnxruntime's conversion back, saturated in taskdsl's) and exact in f32, where onnxruntime computes it
    (taskdsl in f64: 1 - 1e-13 truncates to 0, not 1)."""
    dtype = numpy_type(elem_type)
    if dtype.kind == "u":       # x - bias >= 0 where x > lambd (and x < -lambd never holds for lambd >= 0)
        lambd = abs(lambd)
    eighths = st.integers(-24, int(8 * lambd) if dtype.kind == "u" else 24)
    bias = data.draw(eighths, label="bias") / 8
    x = data.draw(integer_arrays(dtype, shape, -100, 100), label="x")
    check_node(n("Shrink", ["x"], ["y"], lambd=lambd, bias=bias), {"x": x}, elem_type, opset=20)


# ---------------------------------------------------------------- binary operators: PRelu, Mod, BitShift
@EXAMPLES
@given(shape=SHAPES, data=st.data(),
       elem_type=st.sampled_from([F32, F16, F64, TensorProto.INT32, TensorProto.INT64, TensorProto.UINT32]))
def test_prelu(shape, data, elem_type):
    """The slope broadcasts to x's shape. onnxruntime has f32 and f16 kernels only; the reference evaluator, the
    others' oracle, computes x * slope at x = -0.0 too (NaN for a NaN slope, where the operator gives x)."""
    dtype = numpy_type(elem_type)
    reference = elem_type not in (F32, F16)
    slope_shape = [data.draw(st.sampled_from([d, 1])) for d in shape[data.draw(st.integers(0, len(shape))):]]
    if dtype.kind == "f":
        x = data.draw(float_arrays(dtype, shape))
        slope = data.draw(float_arrays(dtype, slope_shape, bound=3, special=not reference))
    else:
        x = data.draw(integer_arrays(dtype, shape, -1000, 1000))
        slope = data.draw(integer_arrays(dtype, slope_shape, -1000, 1000))
    check_node(n("PRelu", ["x", "slope"], ["y"]), {"x": x, "slope": slope}, elem_type, opset=16, reference=reference)


@EXAMPLES
@given(shape=SHAPES, data=st.data(), fmod=st.sampled_from([0, 1]), elem_type=st.sampled_from(INTEGERS + [F32, F16]))
def test_mod(shape, data, fmod, elem_type):
    """Floored (fmod=0, floats from opset 28) and truncated (fmod=1) remainders. Integer divisors are nonzero and
    dividends above the type's minimum (onnxruntime's x % 0 and INT_MIN % -1 are undefined); 64-bit ones within
    2**50 (onnxruntime's truncated one goes through a double)."""
    dtype = numpy_type(elem_type)
    shapes = [shape, partner_shape(data, shape)]
    if data.draw(st.booleans()):
        shapes.reverse()
    if dtype.kind == "f":
        a = data.draw(float_arrays(dtype, shapes[0], bound=1e4), label="a")
        b = data.draw(float_arrays(dtype, shapes[1], near=(1.0, -1.0)), label="b")
    else:
        info = np.iinfo(dtype)
        high = min(info.max, 2**50)
        low = max(info.min + 1, -high)
        a = data.draw(integer_arrays(dtype, shapes[0], low, high), label="a")
        b = data.draw(integer_arrays(dtype, shapes[1], low, high, nonzero=True), label="b")
    check_node(n("Mod", ["a", "b"], ["y"], fmod=fmod), {"a": a, "b": b}, elem_type,
               opset=28 if dtype.kind == "f" and fmod == 0 else 19, exact=True)


@EXAMPLES
@given(shape=SHAPES, data=st.data(), elem_type=st.sampled_from(INTEGERS), direction=st.sampled_from(["LEFT", "RIGHT"]))
def test_bit_shift(shape, data, elem_type, direction):
    """Counts past the type's bits (and negative ones, of signed types: opset 28) shift every bit out."""
    dtype = numpy_type(elem_type)
    bits = dtype.itemsize * 8
    shapes = [shape, partner_shape(data, shape)]
    if data.draw(st.booleans()):
        shapes.reverse()
    x = data.draw(integer_arrays(dtype, shapes[0]), label="x")
    count = data.draw(integer_arrays(dtype, shapes[1], -3, bits + 3), label="count")
    check_node(n("BitShift", ["x", "count"], ["y"], direction=direction), {"x": x, "count": count}, elem_type,
               opset=28 if dtype.kind == "i" else 19)


# ---------------------------------------------------------------- refused models
def refused(model: onnx.ModelProto, feeds: dict, match: str) -> None:
    """onnxruntime fails on `model`, and from_onnx raises an OnnxImportError matching `match`."""
    with pytest.raises(Exception):
        run_onnxruntime(model, feeds)
    with pytest.raises(OnnxImportError, match=match):
        tg.from_onnx(model)


X_F32 = {"x": np.array([-1.5, 0.0, 2.0], np.float32)}
X_I32 = {"x": np.array([-1, 0, 2], np.int32)}
SHIFTS = {"x": np.array([1, 2], np.uint8), "s": np.array([1, 1], np.uint8)}


@pytest.mark.parametrize("node, feeds, out_type, opset, match", [
    (n("Mod", ["x", "x"], ["y"]), X_F32, F32, 19, r"\(Mod\): fmod must be 1 for float inputs before opset 28"),
    (n("BitShift", ["x", "x"], ["y"], direction="LEFT"), X_I32, TensorProto.INT32, 19,
     r"\(BitShift\): signed integers are shifted from opset 28, got i32"),
    (n("BitShift", ["x", "s"], ["y"], direction="UP"), SHIFTS, TensorProto.UINT8, 19,
     r"\(BitShift\): direction must be 'LEFT' or 'RIGHT', got 'UP'"),
    (n("HardSwish", ["x"], ["y"]), X_I32, TensorProto.INT32, 20, r"\(HardSwish\): needs a float tensor, got i32"),
    (n("Sign", ["x"], ["y"]), {"x": np.array([True, False])}, BOOL, 20, r"\(Sign\): needs a numeric tensor, got bool"),
], ids=["mod-fmod0-of-floats", "signed-bitshift-before-28", "bitshift-direction", "hardswish-of-ints",
        "sign-of-bools"])
def test_refused_by_both(node, feeds, out_type, opset, match):
    """Invalid models: an attribute value or input type the operator's schema does not allow."""
    refused(one_node(node, feeds, out_type, opset), feeds, match)


def test_refused_only_here():
    """Models onnxruntime runs: Celu with alpha 0 (its x / alpha gives NaNs), and a PRelu slope larger than X
    (onnxruntime broadcasts X to it; the slope must broadcast to X's shape)."""
    with pytest.raises(UnsupportedOnnxError, match=r"\(Celu\): alpha 0 is not supported"):
        tg.from_onnx(one_node(n("Celu", ["x"], ["y"], alpha=0.0), X_F32, F32, 20))
    feeds = {"x": X_F32["x"], "slope": np.ones((2, 3), np.float32)}
    with pytest.raises(OnnxImportError, match=r"\(PRelu\): the slope of shape \(2, 3\) does not broadcast to X's "
                                              r"shape \(3,\)"):
        tg.from_onnx(one_node(n("PRelu", ["x", "slope"], ["y"]), feeds, F32, 16))
