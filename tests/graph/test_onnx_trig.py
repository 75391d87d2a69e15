"""ONNX's inverse trigonometric and hyperbolic operators (Asin, Acos, Atan, Sinh, Cosh, Asinh, Acosh, Atanh),
imported from one-node models and checked against onnxruntime in f32 and f16 (onnx's reference evaluator in f64 and
bf16, which onnxruntime has no kernel for), with hypothesis drawing shapes (odd, prime, 1 and 0 sizes), opsets, and
values inside each function's domain, at its ends and past them (NaN there, as the oracle gives), and the special
ones. The 16-bit types are also run over every one of their values: computed in f32 and rounded once, each result is
within one unit in the last place of the exactly rounded one. The kernel language's td.asin ... td.atanh are checked
in a kernel on the cpu target against numpy, on Python numbers, and as numpy's ufuncs in a compute definition.
Every kernel is also compiled by NVRTC (tests/conftest.py), and each test has a @gpu twin on the cuda target."""
from __future__ import annotations

from dataclasses import dataclass

import ml_dtypes
import numpy as np
import onnx
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from hypothesis.extra.numpy import arrays
from onnx import TensorProto, helper

import taskdsl as td
import taskdsl.graph as tg
from taskdsl import blockIdx, f32, threadIdx
from taskdsl.compute import evaluate

from . import assert_close, make_model, rand, run_onnxruntime

pytest.importorskip("onnxruntime")

GPU_TWINS = True
F16, F32, F64, BF16 = TensorProto.FLOAT16, TensorProto.FLOAT, TensorProto.DOUBLE, TensorProto.BFLOAT16
ORT_TYPES = (F32, F16)      # onnxruntime's cpu kernels of these operators (1.32): no double, no bfloat16
SHAPES = st.lists(st.sampled_from([0, 1, 2, 3, 5, 7, 13]), max_size=3)
SPECIAL = (np.nan, np.inf, -np.inf, 0.0, -0.0)
# both sides compute in f32 (16-bit: rounded once) by different libms: a few ulps apart. No absolute tolerance:
# these functions are accurate relative to their values, down to 0 (asin(x) ~ x, acos(1) = 0, acosh(1) = 0).
RTOL = {F32: 1e-5, F16: 2e-3, BF16: 1.6e-2, F64: 1e-12}
# (the twins' target fixture is function-scoped: the same target for every example)
EXAMPLES = settings(max_examples=5, deadline=None,
                    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])


@dataclass(frozen=True)
class Trig:
    """An operator under test: taskdsl's function, numpy's, the first opset that has it, where drawn values lie
    (its domain, or a stretch where the result is finite), and values at and past the domain's ends."""

    fn: str
    ufunc: np.ufunc
    since: int
    domain: tuple
    edges: tuple


TRIG = {
    "Asin": Trig("asin", np.arcsin, 7, (-1.0, 1.0), (1.0, -1.0, 1.5, -1.5, 2.0)),
    "Acos": Trig("acos", np.arccos, 7, (-1.0, 1.0), (1.0, -1.0, 1.5, -1.5, -3.0)),
    "Atan": Trig("atan", np.arctan, 7, (-50.0, 50.0), (1.0, -1.0, 1e4, -3e4)),
    # past 89.4 (f32), 11.8 (f16) and 710.5 (f64) sinh and cosh overflow to +-inf
    "Sinh": Trig("sinh", np.sinh, 9, (-10.0, 10.0), (20.0, -20.0, 100.0, -100.0, 1000.0, -1000.0)),
    "Cosh": Trig("cosh", np.cosh, 9, (-10.0, 10.0), (20.0, -20.0, 100.0, -100.0, 1000.0, -1000.0)),
    "Asinh": Trig("asinh", np.arcsinh, 9, (-50.0, 50.0), (1e4, -3e4, 1e-3)),
    "Acosh": Trig("acosh", np.arccosh, 9, (1.0, 50.0), (1.0, 0.5, -1.0, 1e4)),
    "Atanh": Trig("atanh", np.arctanh, 9, (-1.0, 1.0), (1.0, -1.0, 1.5, -1.5)),
}


def numpy_type(elem_type: int) -> np.dtype:
    """The numpy dtype of an ONNX element type."""
    return np.dtype(helper.tensor_dtype_to_np_dtype(elem_type))


def marked_values(trig: Trig, dtype: np.dtype) -> list:
    """The special values, and each edge in `dtype` with its two neighbours there (1 + ulp is past asin's end)."""
    values = [dtype.type(v) for v in SPECIAL]
    for edge in trig.edges:
        v = dtype.type(edge)
        values += [v, np.nextafter(v, dtype.type(-np.inf)), np.nextafter(v, dtype.type(np.inf))]
    return values


def trig_arrays(trig: Trig, dtype: np.dtype, shape) -> st.SearchStrategy:
    """Arrays of `dtype`: mostly values within the function's domain, some of the marked values."""
    low, high = (float(dtype.type(b)) for b in trig.domain)
    inside = st.floats(low, high, width=32 if dtype.itemsize <= 4 else 64).map(dtype.type)
    return arrays(dtype, tuple(shape), elements=st.one_of(inside, st.sampled_from(marked_values(trig, dtype))))


def oracle(model: onnx.ModelProto, feeds: dict, elem_type: int) -> list:
    """onnxruntime's outputs, or for the types it has no kernel for, those of onnx's reference evaluator."""
    if elem_type in ORT_TYPES:
        return run_onnxruntime(model, feeds)
    from onnx.reference import ReferenceEvaluator
    return ReferenceEvaluator(model).run(None, feeds)


@EXAMPLES
@pytest.mark.filterwarnings("ignore:from_onnx. the model's opset")    # opsets 7 and 9, converted to 13
@pytest.mark.parametrize("elem_type", [F32, F16, F64, BF16], ids=["f32", "f16", "f64", "bf16"])
@pytest.mark.parametrize("op", sorted(TRIG))
@given(shape=SHAPES, data=st.data())
def test_trig_operator(op, elem_type, shape, data):
    """One node of `op`, at an opset drawn from those that have it (bfloat16: 22, which added it); the compiled
    graph and its numpy reference (what constant folding computes) match the oracle, NaN and inf where it has them."""
    trig = TRIG[op]
    opsets = [22] if elem_type == BF16 else sorted({trig.since, 11, 13, 17, 22})
    opset = data.draw(st.sampled_from(opsets), label="opset")
    x = data.draw(trig_arrays(trig, numpy_type(elem_type), shape), label="x")
    model = make_model([helper.make_node(op, ["x"], ["y"])], [("x", shape, elem_type)], [("y", shape, elem_type)],
                       opset=opset)
    graph = tg.from_onnx(model)
    with np.errstate(all="ignore"):     # the numpy oracles' NaN out of the domain, sinh's overflow
        want = oracle(model, {"x": x}, elem_type)[0]
        assert_close(graph({"x": x})[0], want, rtol=RTOL[elem_type], atol=0.0)
        assert_close(graph.reference({"x": x})[0], want, rtol=RTOL[elem_type], atol=0.0)


@pytest.mark.parametrize("dtype", [np.dtype(np.float16), np.dtype(ml_dtypes.bfloat16)], ids=["f16", "bf16"])
def test_every_16_bit_value(dtype):
    """Each operator of every f16 (bf16) value, from one model: computed in f32 and rounded once to the 16-bit type,
    as sin and cos are, so each result is within one ulp of the exactly rounded value (one rounding of a result a
    few f32 ulps off), and is it at all but the few that lie next to a half-way point between 16-bit values."""
    x = np.arange(1 << 16, dtype=np.uint16).view(dtype)
    elem_type = helper.np_dtype_to_tensor_dtype(dtype)
    names = sorted(TRIG)
    nodes = [helper.make_node(op, ["x"], [op.lower()]) for op in names]
    model = make_model(nodes, [("x", [x.size], elem_type)], [(op.lower(), [x.size], elem_type) for op in names],
                       opset=22)
    graph = tg.from_onnx(model)
    with np.errstate(all="ignore"):
        outputs = graph({"x": x})
        references = graph.reference({"x": x})
        exact = [TRIG[op].ufunc(x.astype(np.float64)).astype(dtype) for op in names]
    for op, got, reference, want in zip(names, outputs, references, exact):
        for result in (got, reference):
            assert result.dtype == dtype, (op, result.dtype)
            wide, want_wide = result.astype(np.float64), want.astype(np.float64)
            np.testing.assert_array_equal(np.isnan(wide), np.isnan(want_wide), err_msg=op)
            infinite = np.isinf(want_wide)
            np.testing.assert_array_equal(wide[infinite], want_wide[infinite], err_msg=op)
            finite = np.isfinite(want_wide)
            ulp = np.spacing(np.abs(want[finite])).astype(np.float64)
            off = np.abs(wide[finite] - want_wide[finite])
            assert np.all(off <= ulp), (op, x[finite][off > ulp], result[finite][off > ulp], want[finite][off > ulp])
            # (the cpu's libm is within an ulp of f32, CUDA's within two to four: a few hundredths of a percent)
            assert np.count_nonzero(off) <= x.size // 500, (op, np.count_nonzero(off))


# ---------------------------------------------------------------- the kernel language
@td.kernel(grid=lambda N: td.cdiv(N, 64), block=64)
def trig_all(X: f32["N"], Out: f32[8, "N"]):
    i = blockIdx.x * 64 + threadIdx.x
    if i < N:
        x = X[i]
        Out[0, i] = td.asin(x)
        Out[1, i] = td.acos(x)
        Out[2, i] = td.atan(x)
        Out[3, i] = td.sinh(x)
        Out[4, i] = td.cosh(x)
        Out[5, i] = td.asinh(x)
        Out[6, i] = td.acosh(x)
        Out[7, i] = td.atanh(x)


KERNEL_ORDER = ["Asin", "Acos", "Atan", "Sinh", "Cosh", "Asinh", "Acosh", "Atanh"]


@EXAMPLES
@given(n=st.sampled_from([1, 7, 64, 65, 257]), seed=st.integers(0, 2**16))
def test_kernel_intrinsics(n, seed):
    """td.asin ... td.atanh of f32 in a kernel: numpy's results in f64, rounded, within a few f32 ulps; NaN out of
    the domain (asin(1.5), acosh(0.5)), atanh(+-1) = +-inf, sinh(100) = inf."""
    x = np.concatenate([rand((n,), seed, low=-3.0, high=3.0),
                        np.array([1.5, -1.5, 1.0, -1.0, 0.5, 100.0, -100.0, 0.0, np.nan, np.inf, -np.inf], np.float32)])
    out = np.zeros((8, x.size), np.float32)
    trig_all(x, out)
    with np.errstate(all="ignore"):
        for row, op in enumerate(KERNEL_ORDER):
            want = TRIG[op].ufunc(x.astype(np.float64)).astype(np.float32)
            assert_close(out[row], want, rtol=2e-6, atol=0.0)


def test_intrinsics_on_numbers():
    """Outside a kernel the intrinsics compute on Python numbers in f64, IEEE's NaN and inf where math would raise."""
    assert td.asin(0.5) == float(np.arcsin(0.5)) and td.acos(-1.0) == float(np.pi)
    assert td.atan(1.0) == float(np.arctan(1.0)) and td.sinh(1.0) == float(np.sinh(1.0))
    assert td.cosh(0.0) == 1.0 and td.asinh(-2.0) == float(np.arcsinh(-2.0)) and td.acosh(1.0) == 0.0
    assert np.isnan(td.asin(1.5)) and np.isnan(td.acosh(0.5)) and np.isnan(td.atanh(2.0))
    assert td.atanh(1.0) == np.inf and td.atanh(-1.0) == -np.inf and td.sinh(1000.0) == np.inf


def test_numpy_ufuncs_in_compute_definitions():
    """np.arcsin ... np.arctanh of IR values build td.asin ... td.atanh; the reference evaluator computes them."""
    ufuncs = [np.arcsin, np.arccos, np.arctan, np.sinh, np.cosh, np.arcsinh, np.arccosh, np.arctanh]
    X = td.placeholder("X", td.f32, ("N",))
    outs = [td.compute(f"U_{u.__name__}", ("N",), lambda i, u=u: u(X[i])) for u in ufuncs]
    x = np.array([-0.5, 0.0, 0.25, 1.0, 1.5, 3.0], np.float32)
    with np.errstate(all="ignore"):
        got = evaluate([X], outs, [x])
        for u, result in zip(ufuncs, got):
            assert_close(result, u(x.astype(np.float64)).astype(np.float32), rtol=2e-6, atol=0.0)
