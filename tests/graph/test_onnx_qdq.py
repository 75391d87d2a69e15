"""QDQ products (Conv, MatMul and Gemm of DequantizeLinear outputs, as onnxruntime's static quantization writes
them) imported as exact integer products scaled once, against onnxruntime running the model as written
(its optimizations off):
hypothesis-drawn shapes (size 1, odd and prime sizes), groups, strides, pads, dilations, int8 and uint8 operands,
zero points or none, scales per tensor and per output channel / column, activation by activation products, Gemm's
transposes; the products that must stay float (another axis's scales, a sum past int32) stay float; Gather of a
dequantized table dequantizes the gathered rows only; on a simulated GPU the products run the 8-bit tensor cores.
Every kernel the tests launch is also compiled for CUDA by NVRTC (tests/conftest.py)."""
import numpy as np
import pytest
from hypothesis import given, note, settings
from hypothesis import strategies as st
from onnx import TensorProto, helper

import taskdsl.graph as tg
from taskdsl.graph.ops import Conv, IntegerConv, IntegerMatMul, MatMul

from . import assert_close, make_model
from .test_onnx_qlinear import ELEMS, conv_case, conv_output, full_range

pytest.importorskip("onnxruntime")


def dequantized(name: str, q: np.ndarray, axis: int | None, zero: bool, rng, inits: dict, as_input: bool = False):
    """A DequantizeLinear node of 8-bit `q` (an initializer, or a graph input with `as_input`), its scale per tensor
    (axis None) or along `axis`, with a random zero point or none; its parameters (and q) go into `inits`."""
    n = 1 if axis is None else q.shape[axis]
    shape = () if axis is None else (n,)
    inits[f"{name}_s"] = rng.uniform(0.002, 0.05, shape).astype(np.float32)
    if zero:
        inits[f"{name}_z"] = full_range(shape, q.dtype, rng)
    if not as_input:
        inits[name] = q
    inputs = [name, f"{name}_s"] + ([f"{name}_z"] if zero else [])
    return helper.make_node("DequantizeLinear", inputs, [f"{name}_d"], **({} if axis is None else {"axis": axis}))


def run_as_written(model, feeds: dict) -> np.ndarray:
    """onnxruntime's output with its graph optimizations off: the float product of the dequantized operands (its
    own QDQ fusion refuses some valid models, a per-column zero point of b among them)."""
    import onnxruntime as ort
    options = ort.SessionOptions()
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    session = ort.InferenceSession(model.SerializeToString(), options, providers=["CPUExecutionProvider"])
    return session.run(None, feeds)[0]


def products(model) -> dict:
    """How many float and integer products the imported graph holds."""
    graph = tg.from_onnx(model)
    kinds = {"float": (Conv, MatMul), "integer": (IntegerConv, IntegerMatMul)}
    return {kind: sum(type(op) in types for op in graph.nodes) for kind, types in kinds.items()}


def check(model, feeds: dict, integer: bool) -> None:
    """taskdsl's output within f32 rounding of onnxruntime's, from an integer product (`integer`; a float
    convolution of ones may sum x's windows for w's zero point) or a float one."""
    counts = products(model)
    assert counts["integer"] == 1 if integer else counts == {"float": 1, "integer": 0}
    got, want = tg.from_onnx(model).compile()(feeds)[0], run_as_written(model, feeds)
    assert_close(got, want, rtol=1e-5, atol=1e-5)


@settings(max_examples=8, deadline=None)
@given(case=conv_case(), x_type=st.sampled_from(sorted(ELEMS, key=str)), w_type=st.sampled_from(sorted(ELEMS, key=str)),
       zeros=st.tuples(st.booleans(), st.booleans()), per_channel=st.booleans(), bias=st.booleans(),
       dilated=st.booleans(), seed=st.integers(0, 99))
def test_qdq_convolutions_are_integer_products(case, x_type, w_type, zeros, per_channel, bias, dilated, seed):
    """Conv(DQ(x), DQ(w) [, bias]): x's scale per tensor, w's per tensor or per output channel, any zero points."""
    x_shape, w_shape, attrs = case
    if dilated:
        attrs["dilations"] = [2] * (len(x_shape) - 2)
        x_shape = x_shape[:2] + [n + k for n, k in zip(x_shape[2:], w_shape[2:])]
    note(f"x {x_shape}, w {w_shape}, {attrs}")
    rng = np.random.default_rng(seed)
    inits = {}
    nodes = [dequantized("x", full_range(x_shape, x_type, rng), None, zeros[0], rng, inits, as_input=True),
             dequantized("w", full_range(w_shape, w_type, rng), 0 if per_channel else None, zeros[1], rng, inits)]
    if bias:
        inits["b"] = rng.uniform(-1, 1, w_shape[:1]).astype(np.float32)
    nodes.append(helper.make_node("Conv", ["x_d", "w_d"] + (["b"] if bias else []), ["y"], **attrs))
    model = make_model(nodes, [("x", x_shape, ELEMS[x_type])], [("y", conv_output(x_shape, w_shape, attrs))], inits,
                       opset=13)
    check(model, {"x": full_range(x_shape, x_type, rng)}, integer=True)


@settings(max_examples=8, deadline=None)
@given(shapes=st.sampled_from([([1, 1], [1, 1]), ([3, 7], [7, 5]), ([2, 5, 13], [13, 3]), ([2, 3, 7], [2, 7, 11]),
                               ([4, 17], [17]), ([17], [17, 2])]),
       types=st.tuples(st.sampled_from(sorted(ELEMS, key=str)), st.sampled_from(sorted(ELEMS, key=str))),
       zeros=st.tuples(st.booleans(), st.booleans()), per_column=st.booleans(), b_input=st.booleans(),
       seed=st.integers(0, 99))
def test_qdq_matmuls_are_integer_products(shapes, types, zeros, per_column, b_input, seed):
    """MatMul(DQ(a), DQ(b)) of any rank: a's scale per tensor, b's per tensor or per column; b a weight or an
    activation."""
    (a_shape, b_shape), rng = shapes, np.random.default_rng(seed)
    per_column = per_column and len(b_shape) > 1
    inits = {}
    a, b = full_range(a_shape, types[0], rng), full_range(b_shape, types[1], rng)
    nodes = [dequantized("a", a, None, zeros[0], rng, inits, as_input=True),
             dequantized("b", b, len(b_shape) - 1 if per_column else None, zeros[1], rng, inits, as_input=b_input),
             helper.make_node("MatMul", ["a_d", "b_d"], ["y"])]
    inputs = [("a", a_shape, ELEMS[types[0]])] + ([("b", b_shape, ELEMS[types[1]])] if b_input else [])
    model = make_model(nodes, inputs, [("y", list(np.matmul(a, b).shape))], inits, opset=13)
    check(model, {"a": a} | ({"b": b} if b_input else {}), integer=True)


def test_an_activation_product_with_zero_points_is_its_sums_and_one_fused_kernel():
    """MatMul(DQ(a), DQ(b)) of two activations with zero points: the sums of a's rows and of b's columns, then one
    kernel, the product with every zero-point share in its epilogue (their products with the zero points too)."""
    rng = np.random.default_rng(3)
    a, b = full_range([2, 5, 13], np.int8, rng), full_range([2, 13, 11], np.uint8, rng)
    inits = {}
    nodes = [dequantized("a", a, None, True, rng, inits, as_input=True),
             dequantized("b", b, None, True, rng, inits, as_input=True),
             helper.make_node("MatMul", ["a_d", "b_d"], ["y"])]
    model = make_model(nodes, [("a", [2, 5, 13], ELEMS[np.int8]), ("b", [2, 13, 11], ELEMS[np.uint8])],
                       [("y", [2, 5, 11])], inits, opset=13)
    cg = tg.from_onnx(model).compile()
    assert_close(cg({"a": a, "b": b})[0], run_as_written(model, {"a": a, "b": b}), rtol=1e-5, atol=1e-5)
    assert [op.kind for op in cg.graph.nodes] == ["reduce_sum", "reduce_sum", "fused"] and len(cg.kernels) == 3


@pytest.mark.parametrize("dot4_products", [True], indirect=True)
@pytest.mark.parametrize("perm, columns", [((0, 2, 3, 1), True), ((0, 2, 1, 3), False), ((0, 1, 2, 3), False)])
def test_a_projection_stored_transposed_stores_its_blocks_a_column_at_a_time(perm, columns, dot4_products):
    """A QDQ projection whose epilogue splits heads and transposes them as attention's K^T (C's rows land next to
    each other in the output, its columns apart) runs the dot4 kernel that stores a column of a block at a time;
    as Q or untransposed, the one that stores rows."""
    rng = np.random.default_rng(4)
    s, e, heads = 7, 12, 3
    a, w = full_range([1, s, e], np.int8, rng), full_range([e, e], np.int8, rng)
    inits = {"shape": np.array([1, s, heads, e // heads], np.int64)}
    nodes = [dequantized("a", a, None, True, rng, inits, as_input=True), dequantized("w", w, None, False, rng, inits),
             helper.make_node("MatMul", ["a_d", "w_d"], ["m"]), helper.make_node("Reshape", ["m", "shape"], ["r"]),
             helper.make_node("Transpose", ["r"], ["y"], perm=list(perm))]
    out_shape = list(np.empty((1, s, heads, e // heads)).transpose(perm).shape)
    model = make_model(nodes, [("a", [1, s, e], ELEMS[np.int8])], [("y", out_shape)], inits, opset=13)
    cg = tg.from_onnx(model).compile()
    assert_close(cg({"a": a})[0], run_as_written(model, {"a": a}), rtol=1e-5, atol=1e-5)
    kernel, = cg.kernels
    assert kernel.name.startswith("dot4_matmul") and ("_columns" in kernel.name) == columns, kernel.name


@pytest.mark.parametrize("trans_a, trans_b, alpha, beta", [(0, 0, 1.0, 1.0), (1, 1, 0.5, 2.0), (0, 1, 1.0, 0.0)])
def test_qdq_gemms_are_integer_products(trans_a, trans_b, alpha, beta):
    """Gemm(DQ(A), DQ(B), C) with transposes: B's scale per output column (axis 0 of a transposed B)."""
    rng = np.random.default_rng(trans_a + 2 * trans_b)
    m, k, n = 5, 19, 7
    inits = {"c": rng.uniform(-1, 1, (n,)).astype(np.float32)}
    a = full_range([k, m] if trans_a else [m, k], np.uint8, rng)
    nodes = [dequantized("a", a, None, True, rng, inits, as_input=True),
             dequantized("b", full_range([n, k] if trans_b else [k, n], np.int8, rng), 0 if trans_b else 1, False, rng,
                         inits),
             helper.make_node("Gemm", ["a_d", "b_d", "c"], ["y"], transA=trans_a, transB=trans_b, alpha=alpha,
                              beta=beta)]
    model = make_model(nodes, [("a", list(a.shape), TensorProto.UINT8)], [("y", [m, n])], inits, opset=13)
    check(model, {"a": a}, integer=True)


def test_products_that_do_not_factor_stay_float():
    """An activation scaled per channel, a weight scaled along its input channels, b scaled per row and a sum that
    could pass int32's range (33027 terms of 255 x 255) keep the float product, and its result."""
    rng = np.random.default_rng(0)
    x, w = full_range([1, 3, 5, 5], np.uint8, rng), full_range([4, 3, 3, 3], np.int8, rng)
    for x_axis, w_axis in [(1, 0), (None, 1)]:
        inits = {}
        nodes = [dequantized("x", x, x_axis, True, rng, inits, as_input=True),
                 dequantized("w", w, w_axis, False, rng, inits), helper.make_node("Conv", ["x_d", "w_d"], ["y"])]
        model = make_model(nodes, [("x", [1, 3, 5, 5], TensorProto.UINT8)], [("y", [1, 4, 3, 3])], inits, opset=13)
        check(model, {"x": x}, integer=False)
    for k, b_axis in [(6, 0), (33027, None)]:
        inits = {}
        a, b = full_range([2, k], np.uint8, rng), full_range([k, 3], np.uint8, rng)
        nodes = [dequantized("a", a, None, True, rng, inits, as_input=True),
                 dequantized("b", b, b_axis, True, rng, inits), helper.make_node("MatMul", ["a_d", "b_d"], ["y"])]
        model = make_model(nodes, [("a", [2, k], TensorProto.UINT8)], [("y", [2, 3])], inits, opset=13)
        check(model, {"a": a}, integer=False)


@pytest.mark.parametrize("axis, zero", [(0, True), (1, False)])
def test_gathers_of_dequantized_tables_dequantize_the_rows_only(axis, zero):
    """Gather(DQ(table), ids): the 8-bit rows gathered, then dequantized (no float table in the graph), equal to
    onnxruntime's; a table scaled per row keeps the float gather."""
    rng = np.random.default_rng(axis)
    table = full_range([11, 6], np.int8, rng)
    for per_row in (False, True):
        inits = {}
        nodes = [dequantized("t", table, 0 if per_row else None, zero, rng, inits),
                 helper.make_node("Gather", ["t_d", "ids"], ["y"], axis=axis)]
        ids = np.array([[3, 0, 5], [5, 1, 2]], np.int64)
        model = make_model(nodes, [("ids", [2, 3], TensorProto.INT64)], [("y", list(np.take(table, ids, axis).shape))],
                           inits, opset=13)
        graph = tg.from_onnx(model)
        floats = [op for op in graph.nodes if op.kind == "gather" and op.outputs[0].dtype.name == "f32"]
        assert len(floats) == per_row
        got, want = graph.compile()({"ids": ids})[0], run_as_written(model, {"ids": ids})
        np.testing.assert_array_equal(got, want)


@pytest.mark.parametrize("layout, same", [("Reshape", True), ("Transpose", True), ("Transpose", False)])
def test_requantizing_with_the_same_parameters_gives_the_integers_back(layout, same):
    """Q(layout(DQ(q))) by DQ's own scale and zero point (QDQ models requantize every reshape and transpose) is
    layout(q), with no quantizing step in the graph, equal to onnxruntime's over all 256 values; other parameters
    quantize."""
    q = np.arange(256, dtype=np.uint8).reshape(4, 64)
    inits = {"s": np.float32(0.0371), "z": np.uint8(131), "s2": np.float32(0.0371 if same else 0.05),
             "shape": np.array([8, 32])}
    extra = ["shape"] if layout == "Reshape" else []
    nodes = [helper.make_node("DequantizeLinear", ["q", "s", "z"], ["d"]),
             helper.make_node(layout, ["d"] + extra, ["l"]),
             helper.make_node("QuantizeLinear", ["l", "s2", "z"], ["y"])]
    shape = [8, 32] if layout == "Reshape" else [64, 4]
    model = make_model(nodes, [("q", [4, 64], TensorProto.UINT8)], [("y", shape, TensorProto.UINT8)], inits, opset=13)
    graph = tg.from_onnx(model)
    assert any(op.attrs.get("fn") == "rint" for op in graph.nodes) is not same
    got, want = graph.compile()({"q": q})[0], run_as_written(model, {"q": q})
    np.testing.assert_array_equal(got, want)


def test_qdq_products_run_8_bit_tensor_cores_on_a_gpu(simulated_gpu):
    """On the cuda target a QDQ convolution into a QDQ matmul runs the 8-bit tensor-core kernels (their CUDA C++
    run on the host), within f32 rounding of onnxruntime's float products, run after run."""
    rng = np.random.default_rng(5)
    inits = {"shape": np.array([1, 6 * 7 * 4])}
    x = full_range([1, 8, 7, 6], np.uint8, rng)
    nodes = [dequantized("x", x, None, True, rng, inits, as_input=True),
             dequantized("w", full_range([6, 8, 3, 3], np.int8, rng), 0, False, rng, inits),
             helper.make_node("Conv", ["x_d", "w_d"], ["c"], pads=[1, 0, 1, 0], strides=[1, 1]),
             helper.make_node("Reshape", ["c", "shape"], ["r"]),
             helper.make_node("QuantizeLinear", ["r", "x_s", "x_z"], ["rq"]),
             dequantized("rq", np.zeros([1, 168], np.uint8), None, True, rng, {}, as_input=True),
             dequantized("v", full_range([168, 9], np.int8, rng), 1, False, rng, inits),
             helper.make_node("MatMul", ["rq_d", "v_d"], ["y"])]
    nodes[5].input[1:] = ["x_s", "x_z"]       # (rq dequantized by the scale and zero point it was quantized by)
    model = make_model(nodes, [("x", [1, 8, 7, 6], TensorProto.UINT8)], [("y", [1, 9])], inits, opset=13)
    compiled, want = tg.from_onnx(model).compile(), run_as_written(model, {"x": x})
    launched = [kernel.name for kernel, _ in simulated_gpu.launches]
    assert sum(name.startswith("tc_matmul_") for name in launched) >= 2, launched
    for _ in range(2):
        assert_close(compiled({"x": x})[0], want, rtol=1e-5, atol=1e-5)
