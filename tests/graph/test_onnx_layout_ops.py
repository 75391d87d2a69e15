"""Tile, DepthToSpace, SpaceToDepth, GatherElements, CumSum, CumProd and InstanceNormalization imported from one-node
ONNX models and checked against onnxruntime (onnx's reference evaluator where onnxruntime has no kernel for the type;
numpy for CumProd),
with hypothesis drawing shapes (odd, prime, 1 and 0 sizes) and attributes; then a small model in which they feed
elementwise operators, compiled with the default passes (fusion on). Every kernel is also compiled by NVRTC
(tests/conftest.py), and each test has a @gpu twin on the cuda target (a GPU, or the simulated one with
TASKDSL_SIMULATED_GPU=1)."""
import numpy as np
import onnx
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from onnx import TensorProto, helper

import taskdsl.graph as tg
from taskdsl.graph import OnnxImportError
from taskdsl.graph.fusion import FusedAnchor
from taskdsl.graph.onnx_import import ConstantRequiredError

from . import assert_close, make_model, rand, run_onnxruntime

pytest.importorskip("onnxruntime")

GPU_TWINS = True
n = helper.make_node
F32, F16, I32, I64 = TensorProto.FLOAT, TensorProto.FLOAT16, TensorProto.INT32, TensorProto.INT64
NUMPY = {F32: np.float32, F16: np.float16, I32: np.int32, I64: np.int64}
SIZES = st.sampled_from([1, 2, 3, 5, 7])
SIZES_OR_0 = st.sampled_from([0, 1, 2, 3, 5, 7])
# f16 values and sums round; onnxruntime's and taskdsl's (summed in f32, rounded once) may differ by a few ulps
TOLERANCE = {F32: {"rtol": 1e-4, "atol": 1e-5}, F16: {"rtol": 1e-2, "atol": 1e-2}, I32: {}, I64: {}}
# (the twins' target fixture is function-scoped: the same target for every example)
EXAMPLES = settings(max_examples=20, deadline=None,
                    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])


def values(shape, dtype: int, seed: int) -> np.ndarray:
    """Random inputs of an ONNX element type; int64 ones up to 9 * 10**15 in magnitude, past 2**53 (where a float64
    round trip or accumulator would round them)."""
    if dtype == I64:
        return np.asarray(rand(shape, seed, np.int64, -9, 9) * np.int64(10**15) + 1)
    return np.asarray(rand(shape, seed, NUMPY[dtype], -9 if dtype == I32 else -2, 9 if dtype == I32 else 2))


def oracle(model: onnx.ModelProto, feeds: dict, reference: bool = False) -> list:
    """onnxruntime's outputs, or (`reference`) those of onnx's reference evaluator."""
    if reference:
        from onnx.reference import ReferenceEvaluator
        return ReferenceEvaluator(model).run(None, feeds)
    return run_onnxruntime(model, feeds)


def check_node(node: onnx.NodeProto, x: np.ndarray, dtype: int, inits: dict | None = None, opset: int = 17,
               reference: bool = False) -> None:
    """The one-node model `node` of input x (element type `dtype`) and output y: taskdsl's y equals the oracle's."""
    model = make_model([node], [("x", list(x.shape), dtype)], [("y", [None] * x.ndim, dtype)], inits, opset=opset)
    got = tg.from_onnx(model)(x)
    want = oracle(model, {"x": x}, reference)
    assert_close(got[0], want[0], **TOLERANCE[dtype])


def refused(model: onnx.ModelProto, feeds: dict, match: str, error=OnnxImportError) -> None:
    """onnxruntime fails on `model`, and from_onnx raises `error` matching `match`."""
    with pytest.raises(Exception):
        run_onnxruntime(model, feeds)
    with pytest.raises(error, match=match):
        tg.from_onnx(model)


# ---------------------------------------------------------------- Tile
@EXAMPLES
@given(shape=st.lists(SIZES_OR_0, max_size=3), data=st.data(), dtype=st.sampled_from([F32, I64, F16]))
def test_tile(shape, data, dtype):
    repeats = data.draw(st.lists(st.sampled_from([0, 1, 2, 3, 5]), min_size=len(shape), max_size=len(shape)))
    x = values(shape, dtype, 1)
    check_node(n("Tile", ["x", "r"], ["y"]), x, dtype, {"r": np.array(repeats, np.int64)})


# ---------------------------------------------------------------- DepthToSpace, SpaceToDepth
@EXAMPLES
@given(batch=st.sampled_from([0, 1, 2]), depth=st.sampled_from([1, 2, 3]), height=SIZES, width=SIZES,
       blocksize=st.sampled_from([1, 2, 3]), mode=st.sampled_from(["DCR", "CRD"]),
       dtype=st.sampled_from([F32, I64, F16]))
def test_depth_to_space(batch, depth, height, width, blocksize, mode, dtype):
    """onnxruntime has no integer DepthToSpace: int64 is checked against onnx's reference evaluator."""
    x = values((batch, depth * blocksize**2, height, width), dtype, 2)
    check_node(n("DepthToSpace", ["x"], ["y"], blocksize=blocksize, mode=mode), x, dtype, reference=dtype == I64)


@EXAMPLES
@given(batch=st.sampled_from([0, 1, 2]), channels=st.sampled_from([1, 2, 3]), height=SIZES_OR_0, width=SIZES,
       blocksize=st.sampled_from([1, 2, 3]), mode=st.sampled_from([None, "DCR", "CRD"]),
       dtype=st.sampled_from([F32, I64, F16]))
def test_space_to_depth(batch, channels, height, width, blocksize, mode, dtype):
    """`mode` is an attribute from opset 28 (ONNX's default before it, DCR, when absent)."""
    x = values((batch, channels, height * blocksize, width * blocksize), dtype, 3)
    attrs = {} if mode is None else {"mode": mode}
    opset = 17 if mode is None else 28
    check_node(n("SpaceToDepth", ["x"], ["y"], blocksize=blocksize, **attrs), x, dtype, opset=opset,
               reference=dtype == I64)


# ---------------------------------------------------------------- GatherElements
@EXAMPLES
@given(shape=st.lists(SIZES, min_size=1, max_size=3), data=st.data(), dtype=st.sampled_from([F32, I64, F16]),
       index_dtype=st.sampled_from([np.int64, np.int32]))
def test_gather_elements(shape, data, dtype, index_dtype):
    """Indices as long as they like along the axis, no longer than x on the others (0 included); negative ones
    count from the end."""
    axis = data.draw(st.integers(-len(shape), len(shape) - 1))
    index_shape = [data.draw(st.sampled_from([0, 1, 2, 5, 7]) if a == axis % len(shape)
                             else st.integers(0, d)) for a, d in enumerate(shape)]
    size = shape[axis]
    indices = np.random.default_rng(4).integers(-size, size, index_shape).astype(index_dtype)
    check_node(n("GatherElements", ["x", "i"], ["y"], axis=axis), values(shape, dtype, 5), dtype, {"i": indices})


def test_gather_elements_indices_of_a_graph_input_are_checked_at_each_call(twin_target):
    if twin_target == "cuda":
        pytest.skip("indices in GPU memory are not read back to be checked (docs/graph.md)")
    model = make_model([n("GatherElements", ["x", "i"], ["y"], axis=1)], [("x", [2, 3]), ("i", [2, 2], I64)],
                       [("y", [2, 2])])
    graph, x = tg.from_onnx(model), rand((2, 3))
    indices = np.array([[0, -3], [2, 1]], np.int64)
    assert_close(graph(x, indices)[0], run_onnxruntime(model, {"x": x, "i": indices})[0])
    with pytest.raises(IndexError, match="gather_elements: index 3 is out of range for axis 1 of size 3"):
        graph(x, np.array([[0, 3], [2, 1]], np.int64))


# ---------------------------------------------------------------- CumSum and CumProd
@EXAMPLES
@given(shape=st.lists(SIZES_OR_0, min_size=1, max_size=3), data=st.data(), exclusive=st.sampled_from([0, 1]),
       reverse=st.sampled_from([0, 1]), dtype=st.sampled_from([F32, I64, I32, F16]),
       axis_dtype=st.sampled_from([np.int64, np.int32]))
def test_cumsum(shape, data, exclusive, reverse, dtype, axis_dtype):
    """int64 sums past 2**53 must be exact (no float accumulator)."""
    axis = np.array(data.draw(st.integers(-len(shape), len(shape) - 1)), axis_dtype)
    node = n("CumSum", ["x", "a"], ["y"], exclusive=exclusive, reverse=reverse)
    check_node(node, values(shape, dtype, 6), dtype, {"a": axis})


@pytest.mark.parametrize("length", [31, 32, 33, 97, 1025, 2111])
@pytest.mark.parametrize("exclusive, reverse", [(0, 0), (1, 0), (0, 1), (1, 1)])
@pytest.mark.parametrize("dtype", [F32, I64])
def test_cumsum_over_several_blocks(length, exclusive, reverse, dtype):
    """Axes longer than a scan block (32: ops.transform.SCAN_BLOCK) and a super-block (32 blocks), with a partial
    last one, scanned either way along the inner and the outer axis."""
    for axis, shape in ((1, (3, length)), (0, (length, 2))):
        node = n("CumSum", ["x", "a"], ["y"], exclusive=exclusive, reverse=reverse)
        check_node(node, values(shape, dtype, length), dtype, {"a": np.array(axis, np.int64)})


@settings(EXAMPLES, max_examples=10)
@given(shape=st.lists(SIZES_OR_0, min_size=1, max_size=3), data=st.data(), exclusive=st.sampled_from([0, 1]),
       reverse=st.sampled_from([0, 1]), dtype=st.sampled_from([F32, I64, I32]), seed=st.integers(0, 99))
def test_cumprod(shape, data, exclusive, reverse, dtype, seed):
    """CumProd (opset 26) against numpy's cumprod, shifted for `exclusive` and flipped for `reverse`; axes longer
    than a scan block too (the block products multiply in another order: f32 within rounding)."""
    axis = data.draw(st.integers(-len(shape), len(shape) - 1))
    if shape[axis] and data.draw(st.booleans()):
        shape[axis] = 37
    rng = np.random.default_rng(seed)
    x = (rng.choice([-1, 1], shape) * rng.uniform(0.9, 1.1, shape) if dtype == F32 else
         rng.choice([-1, 1, 1, 1, 2], shape)).astype(NUMPY[dtype])
    node = n("CumProd", ["x", "a"], ["y"], exclusive=exclusive, reverse=reverse)
    model = make_model([node], [("x", shape, dtype)], [("y", [None] * len(shape), dtype)],
                       {"a": np.array(axis, np.int64)}, opset=26)
    flipped = np.flip(x, axis) if reverse else x
    want = np.cumprod(flipped, axis=axis, dtype=x.dtype)
    if exclusive and want.shape[axis]:     # (an empty axis stays empty)
        ones = np.ones_like(np.take(want, [0], axis=axis))
        want = np.concatenate([ones, np.take(want, range(want.shape[axis] - 1), axis=axis)], axis=axis)
    want = np.flip(want, axis) if reverse else want
    got = tg.from_onnx(model)(x)[0]
    assert got.dtype == want.dtype
    assert_close(got, want, **TOLERANCE[dtype])


def test_cumsum_of_large_int64_values_is_exact():
    """2**60 + 1 + 1 is exact in int64 (a float64 accumulator rounds it to 2**60)."""
    x = np.array([2**60, 1, 1, -(2**61)], np.int64)
    check_node(n("CumSum", ["x", "a"], ["y"]), x, I64, {"a": np.array(0, np.int64)})


@pytest.mark.parametrize("shape, axis", [((3, 301), 1), ((2, 37, 131), 1), ((129, 67), 0), ((5, 2, 64), 2)])
@pytest.mark.parametrize("exclusive, reverse", [(0, 0), (1, 1)])
def test_cumsum_on_the_cpu_adds_in_numpys_order(shape, axis, exclusive, reverse, twin_target):
    """The cpu walks the axis once (stdlib_ops.scan; inner sizes past a chunk of 64 columns, with a partial last
    chunk): f32 sums equal numpy.cumsum's bit for bit, and f16 ones are summed in f32 and rounded once at each
    store (numpy's f32 sums, rounded)."""
    if twin_target == "cuda":
        pytest.skip("the cuda target runs the definitions, which add in blocks")
    for dtype in (F32, F16):
        x = values(shape, dtype, 11)
        node = n("CumSum", ["x", "a"], ["y"], exclusive=exclusive, reverse=reverse)
        model = make_model([node], [("x", list(shape), dtype)], [("y", [None] * len(shape), dtype)],
                           {"a": np.array(axis, np.int64)})
        flipped = np.flip(x, axis) if reverse else x
        sums = np.cumsum(flipped.astype(np.float32), axis=axis)
        if exclusive:
            sums = np.concatenate([np.zeros_like(np.take(sums, [0], axis=axis)),
                                   np.take(sums, range(shape[axis] - 1), axis=axis)], axis=axis)
        want = (np.flip(sums, axis) if reverse else sums).astype(x.dtype)
        np.testing.assert_array_equal(tg.from_onnx(model)(x)[0], want)


def test_cumsum_axis_must_be_constant():
    model = make_model([n("CumSum", ["x", "a"], ["y"])], [("x", [3]), ("a", [], I64)], [("y", [3])])
    with pytest.raises(ConstantRequiredError, match="input 'a' must be a constant"):
        tg.from_onnx(model)
    graph = tg.from_onnx(model, constants={"a": np.array(-1, np.int64)})
    assert_close(graph(np.array([1, 2, 3], np.float32))[0], np.array([1, 3, 6], np.float32))


# ---------------------------------------------------------------- InstanceNormalization
@EXAMPLES
@given(batch=st.sampled_from([0, 1, 2]), channels=st.sampled_from([1, 2, 3, 5]),
       spatial=st.lists(SIZES, min_size=1, max_size=2), epsilon=st.sampled_from([1e-5, 1e-3, 0.5]),
       dtype=st.sampled_from([F32, F16]))
def test_instance_norm(batch, channels, spatial, epsilon, dtype):
    x = values((batch, channels, *spatial), dtype, 7)
    inits = {"s": values((channels,), dtype, 8), "b": values((channels,), dtype, 9)}
    check_node(n("InstanceNormalization", ["x", "s", "b"], ["y"], epsilon=epsilon), x, dtype, inits)


def test_instance_norm_of_f16_near_its_largest_values():
    """Statistics in f32: in f16, x - mean (-60000 - 10000) would overflow."""
    x = np.array([[[60000.0, -60000.0, 30000.0]], [[1.0, 2.0, 4.0]]], np.float16)
    inits = {"s": np.array([0.5], np.float16), "b": np.array([1.0], np.float16)}
    check_node(n("InstanceNormalization", ["x", "s", "b"], ["y"]), x, F16, inits)


# ---------------------------------------------------------------- refused nodes
def _model(node: onnx.NodeProto, shape: list, inits: dict | None = None) -> onnx.ModelProto:
    return make_model([node], [("x", shape)], [("y", [None] * len(shape))], inits)


@pytest.mark.parametrize("model, match", [
    (_model(n("Tile", ["x", "r"], ["y"]), [2, 3], {"r": np.array([2, -1], np.int64)}),
     r"\(Tile\): repeats \[2, -1\] need one non-negative count per axis"),
    (_model(n("DepthToSpace", ["x"], ["y"], blocksize=2), [1, 6, 2, 2]),
     r"\(DepthToSpace\): the channels of shape \(1, 6, 2, 2\) are not a multiple of blocksize\^2 = 4"),
    (_model(n("SpaceToDepth", ["x"], ["y"], blocksize=2), [1, 2, 3, 4]),
     r"\(SpaceToDepth\): the height and width of shape \(1, 2, 3, 4\) are not multiples of blocksize 2"),
    (_model(n("GatherElements", ["x", "i"], ["y"], axis=1), [2, 3], {"i": np.zeros((3, 1), np.int64)}),
     r"\(GatherElements\): gather_elements: indices of shape \(3, 1\) are longer than x's shape \(2, 3\)"),
    (_model(n("GatherElements", ["x", "i"], ["y"]), [2, 3], {"i": np.full((1, 3), -3, np.int64)}),
     r"\(GatherElements\): gather_elements: index -3 is out of range for axis 0 of size 2"),
    (_model(n("InstanceNormalization", ["x", "s", "b"], ["y"]), [2, 3],
            {"s": np.ones(3, np.float32), "b": np.zeros(3, np.float32)}),
     r"\(InstanceNormalization\): needs an \(N, C, D1, ...\) input, got shape \(2, 3\)"),
], ids=["tile-negative", "depth-to-space-channels", "space-to-depth-height", "gather-elements-shape",
        "gather-elements-index", "instance-norm-rank"])
def test_refused_by_both(model, match):
    refused(model, {"x": rand([d.dim_value for d in model.graph.input[0].type.tensor_type.shape.dim])}, match)


def test_cumsum_of_a_scalar_is_refused():
    model = make_model([n("CumSum", ["x", "a"], ["y"])], [("x", [])], [("y", [])], {"a": np.array(0, np.int64)})
    refused(model, {"x": np.array(1.0, np.float32)}, r"\(CumSum\): cumsum needs a tensor with at least one axis")


# ---------------------------------------------------------------- in a model, fused
def test_layout_ops_feeding_elementwise_ops_in_a_fused_model():
    """Conv -> DepthToSpace -> Relu -> Tile's first view fuse into one kernel (DepthToSpace's reshapes and transpose
    in its epilogue); Tile's expand, CumSum, GatherElements and InstanceNormalization feed elementwise operators
    after it."""
    rng = np.random.default_rng(10)
    inits = {"w": rand((12, 4, 3, 3), 11, low=-0.3, high=0.3), "r": np.array([1, 1, 1, 2], np.int64),
             "a": np.array(-1, np.int64), "i": rng.integers(-10, 10, (1, 3, 10, 28)).astype(np.int64),
             "s": rand((3,), 12), "b": rand((3,), 13)}
    nodes = [n("Conv", ["x", "w"], ["conv"], pads=[1, 1, 1, 1]),
             n("DepthToSpace", ["conv"], ["d2s"], blocksize=2, mode="CRD"),
             n("Relu", ["d2s"], ["relu"]),
             n("Tile", ["relu", "r"], ["tiled"]),
             n("CumSum", ["tiled", "a"], ["sums"], exclusive=1),
             n("GatherElements", ["sums", "i"], ["picked"], axis=2),
             n("Sub", ["picked", "tiled"], ["diff"]),
             n("InstanceNormalization", ["diff", "s", "b"], ["norm"]),
             n("Sigmoid", ["norm"], ["y"])]
    model = make_model(nodes, [("x", [1, 4, 5, 7])], [("y", [1, 3, 10, 28])], inits)
    x = rand((1, 4, 5, 7), 14)
    compiled = tg.from_onnx(model).compile()
    fused = [op for op in compiled.graph.nodes if isinstance(op, FusedAnchor)]
    assert len(fused) == 1 and [m.kind for m in fused[0].epilogue] == ["reshape", "transpose", "reshape", "relu",
                                                                             "reshape"]
    assert_close(compiled(x)[0], run_onnxruntime(model, {"x": x})[0], rtol=1e-4, atol=1e-5)
