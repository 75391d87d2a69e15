"""Graph-layer tests: shared helpers to make random inputs, build ONNX models and compare outputs."""
import functools

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from taskdsl.graph import passes

# the default passes but elementwise fusion: for tests that need a chain of elementwise operators to stay one
# operator (one kernel, one activation) each
UNFUSED = [p for p in passes.PIPELINE if p is not passes.fuse_elementwise]


def rand(shape, seed: int = 0, dtype=np.float32, low: float = -2.0, high: float = 2.0) -> np.ndarray:
    """Uniform random values (integers for integer dtypes), an array even of shape () (onnxruntime takes no numpy
    scalar)."""
    rng = np.random.default_rng(seed)
    if np.dtype(dtype).kind in "iu":
        values = rng.integers(int(low), int(high) + 1, size=shape)
    elif np.dtype(dtype).kind == "b":
        values = rng.random(shape) < 0.5
    else:
        values = rng.uniform(low, high, size=shape)
    return np.asarray(values, dtype)


def assert_close(got, want, rtol: float = 1e-4, atol: float = 1e-6) -> None:
    """Same shape and dtype, values within rtol (plus atol scaled by the largest finite expected magnitude;
    infinities and NaNs must match exactly)."""
    got, want = np.asarray(got), np.asarray(want)
    assert got.shape == want.shape, (got.shape, want.shape)
    assert got.dtype == want.dtype, (got.dtype, want.dtype)
    if want.dtype.kind in "biu":
        np.testing.assert_array_equal(got, want)
        return
    finite = np.abs(want[np.isfinite(want)])
    scale = float(np.max(finite)) if finite.size else 1.0     # an inf would make atol inf: nothing checked
    np.testing.assert_allclose(got.astype(np.float64), want.astype(np.float64), rtol=rtol, atol=atol * max(scale, 1.0))


def tensor_info(name: str, shape, dtype=TensorProto.FLOAT) -> onnx.ValueInfoProto:
    return helper.make_tensor_value_info(name, dtype, shape)


def make_model(nodes: list, inputs: list, outputs: list, initializers: dict | None = None,
               opset: int = 17, name: str = "test") -> onnx.ModelProto:
    """A checked ONNX model: inputs/outputs are (name, shape[, elem type]) tuples, initializers name -> array."""
    inits = [numpy_helper.from_array(np.asarray(v), name=k) for k, v in (initializers or {}).items()]
    graph = helper.make_graph(nodes, name, [tensor_info(*i) for i in inputs], [tensor_info(*o) for o in outputs],
                              initializer=inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
    model.ir_version = 8
    onnx.checker.check_model(model)
    return model


def run_onnxruntime(model: onnx.ModelProto, feeds: dict) -> list:
    """The model's outputs computed by onnxruntime on the CPU."""
    import onnxruntime as ort
    try:
        session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    except ort.capi.onnxruntime_pybind11_state.Fail as error:
        # an onnxruntime older than the test extra's (a GPU machine's image) refuses opsets it does not know yet
        if "is under development" not in str(error):
            raise
        opset = max(o.version for o in model.opset_import)
        pytest.skip(f"onnxruntime {ort.__version__} reads no opset {opset} (the test extra asks for onnxruntime>=1.32)")
    return session.run(None, feeds)


@functools.cache
def onnxruntime_saturates() -> bool:
    """Whether onnxruntime's 8-bit products sum pairs of products in saturating 16-bit lanes on this host (its u8 x s8
    kernels on x86 without VNNI: 255 * 127 + 255 * 127 comes out 32767), which makes it no oracle of full-range
    8-bit products here (numpy's exact product, or onnx's reference implementation, is)."""
    a, b = np.full((1, 2), 255, np.uint8), np.full((2, 1), 127, np.int8)
    node = helper.make_node("MatMulInteger", ["a", "b"], ["y"])
    model = make_model([node], [("a", [1, 2], TensorProto.UINT8)], [("y", [1, 1], TensorProto.INT32)], {"b": b},
                       opset=13)
    return int(run_onnxruntime(model, {"a": a})[0][0, 0]) != 2 * 255 * 127
