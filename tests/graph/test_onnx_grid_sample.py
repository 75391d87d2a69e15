"""ONNX GridSample and AffineGrid against onnxruntime: hypothesis-drawn shapes (size-1 and prime axes), every mode,
padding mode and align_corners, grids reaching past the borders with exact halves (nearest's ties); against onnx's
reference implementation where onnxruntime has no kernel (1-D and 3-D cubic sampling, integer inputs); f64 and
f16; more points than the cpu kernel's block samples; the operator's definitions on a simulated GPU; a spatial
transformer (AffineGrid into GridSample); refusals. Every kernel the tests launch is also compiled for CUDA by
NVRTC (tests/conftest.py).

A grid that is an initializer makes the coordinate arithmetic a constant (folded at compile time): the tests of
other types and ranks take one, so that only the sampling itself compiles anew."""
import numpy as np
import pytest
from hypothesis import given, note, settings
from hypothesis import strategies as st
from onnx import TensorProto, helper
from onnx.reference import ReferenceEvaluator

import taskdsl.graph as tg
from taskdsl.graph import ops
from taskdsl.graph.onnx_import import OnnxImportError, UnsupportedOnnxError

from . import assert_close, make_model, run_onnxruntime

pytest.importorskip("onnxruntime")

SIZES = st.sampled_from([1, 2, 3, 4, 7])
MODES = {16: ("bilinear", "nearest", "bicubic"), 20: ("linear", "nearest", "cubic")}
PADDINGS = st.sampled_from(["zeros", "border", "reflection"])
ELEM = {np.float32: TensorProto.FLOAT, np.float64: TensorProto.DOUBLE, np.float16: TensorProto.FLOAT16,
        np.int32: TensorProto.INT32}


def grid_sample_model(x_shape, grid, dtype=np.float32, opset: int = 20, constant_grid: bool = False, **attrs):
    """A GridSample model of an X input and a grid (an input of the grid's shape, or an initializer)."""
    node = helper.make_node("GridSample", ["x", "grid"], ["y"], **attrs)
    inputs = [("x", x_shape, ELEM[dtype])] + ([] if constant_grid else [("grid", grid.shape, ELEM[grid.dtype.type])])
    return make_model([node], inputs, [("y", [None] * len(x_shape), ELEM[dtype])],
                      {"grid": grid} if constant_grid else None, opset=opset)


def grid_values(shape, seed: int) -> np.ndarray:
    """Normalized coordinates from -1.6 to 1.6 (past the borders), half of them multiples of 1/8: whole pixels
    and exact halves (nearest's ties) on axes of 2 and 4 pixels."""
    rng = np.random.default_rng(seed)
    values = np.where(rng.random(shape) < 0.5, rng.uniform(-1.6, 1.6, shape), rng.integers(-13, 14, shape) / 8)
    return values.astype(np.float32)


def sample_shapes(draw, rank: int) -> tuple:
    """(X's shape, the grid's shape) of a GridSample with `rank` spatial axes."""
    n, c = draw(st.sampled_from([1, 2]), label="N"), draw(st.sampled_from([1, 3]), label="C")
    spatial = draw(st.lists(SIZES, min_size=rank, max_size=rank), label="spatial")
    out = draw(st.lists(SIZES, min_size=rank, max_size=rank), label="output spatial")
    return (n, c, *spatial), (n, *out, rank)


def check_onnxruntime(x_shape, grid, opset: int = 20, seed: int = 0, **attrs) -> None:
    """taskdsl's GridSample of a random X at `grid` (an input) equals onnxruntime's, to f32 rounding."""
    x = np.random.default_rng(seed).standard_normal(x_shape).astype(np.float32)
    model = grid_sample_model(x_shape, grid, opset=opset, **attrs)
    feeds = {"x": x, "grid": grid}
    assert_close(tg.from_onnx(model).compile()(feeds)[0], run_onnxruntime(model, feeds)[0], rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("align_corners", [0, 1])
@pytest.mark.parametrize("padding", ["zeros", "border", "reflection"])
@pytest.mark.parametrize("mode", MODES[20])
def test_grid_sample_modes_match_onnxruntime(mode, padding, align_corners):
    """Every mode, padding mode and align_corners, on a batch of 2 images of 3 channels."""
    check_onnxruntime((2, 3, 4, 5), grid_values((2, 3, 7, 2), 0), mode=mode, padding_mode=padding,
                      align_corners=align_corners)


@settings(max_examples=8, deadline=None)
@given(data=st.data(), rank=st.sampled_from([2, 3]), opset=st.sampled_from([16, 20, 22]), mode=st.integers(0, 2),
       padding=PADDINGS, align_corners=st.integers(0, 1), seed=st.integers(0, 99))
def test_grid_sample_matches_onnxruntime(data, rank, opset, mode, padding, align_corners, seed):
    """Drawn shapes, 2-D and 3-D (onnxruntime samples 3-D cubically nowhere: linear there), and the opset's mode
    names; opset 16 defines 2-D only, which onnxruntime extends to 3-D as taskdsl does."""
    x_shape, grid_shape = sample_shapes(data.draw, rank)
    grid = grid_values(grid_shape, seed)
    note(f"grid = {grid!r}")
    mode = MODES[16 if opset < 20 else 20][0 if rank == 3 and mode == 2 else mode]
    check_onnxruntime(x_shape, grid, opset, seed, mode=mode, padding_mode=padding, align_corners=align_corners)


@pytest.mark.parametrize("align_corners", [0, 1])
@pytest.mark.parametrize("mode", MODES[20])
def test_more_points_than_a_block_samples(mode, align_corners):
    """143 points per image, past two of the cpu kernel's chunks (stdlib_ops.grid_sample.CHUNK, 64), the last one
    partial, at every padding mode."""
    for padding in ("zeros", "border", "reflection"):
        check_onnxruntime((2, 5, 11, 13), grid_values((2, 13, 11, 2), 1), seed=1, mode=mode, padding_mode=padding,
                          align_corners=align_corners)


@settings(max_examples=8, deadline=None)
@given(data=st.data(), rank=st.sampled_from([1, 2, 3]), mode=st.sampled_from(["nearest", "linear", "cubic"]),
       padding=PADDINGS, align_corners=st.booleans(), dtype=st.sampled_from([np.float32, np.float16, np.int8]),
       seed=st.integers(0, 99))
def test_the_cpu_kernel_samples_as_the_definitions(data, rank, mode, padding, align_corners, dtype, seed):
    """ops.grid_sample at pixel coordinates (a NaN among them) by the cpu's kernel (stdlib_ops/grid_sample.py)
    against the numpy evaluation of the operator's definitions."""
    if dtype == np.int8:
        mode = "nearest"
    x_shape, grid_shape = sample_shapes(data.draw, rank)
    points = int(np.prod(grid_shape[1:-1])) * data.draw(st.sampled_from([1, 13]), label="repeats")
    rng = np.random.default_rng(seed)
    x = (rng.standard_normal(x_shape) * 5).astype(dtype)
    coordinates = rng.uniform(-3, 10, (x_shape[0], points, rank)).astype(np.float32)
    coordinates[0, -1, 0] = np.nan
    inputs = tg.input("x", x.shape, x.dtype), tg.input("coordinates", coordinates.shape)
    graph = tg.Graph(list(inputs), [ops.grid_sample(*inputs, mode, padding, align_corners)])
    got = graph.compile()(x, coordinates)[0]
    assert graph.compile().kernels[-1].name.startswith(mode)
    assert_close(got, graph.reference(x, coordinates)[0], rtol=1e-6, atol=1e-6)


def test_grid_sample_on_a_simulated_gpu(simulated_gpu):
    """On the cuda target GridSample runs its operator's definitions (graph/ops/sample.py), their CUDA C++ run on the
    host: the three modes, each with another padding mode."""
    nodes = [helper.make_node("GridSample", ["x", "grid"], [f"y{k}"], mode=mode, padding_mode=padding,
                              align_corners=align_corners)
             for k, (mode, padding, align_corners) in enumerate([("nearest", "zeros", 0), ("linear", "reflection", 1),
                                                                 ("cubic", "border", 0)])]
    x = np.random.default_rng(2).standard_normal((2, 3, 5, 7)).astype(np.float32)
    grid = grid_values((2, 4, 6, 2), 2)
    model = make_model(nodes, [("x", x.shape), ("grid", grid.shape)], [(f"y{k}", [None] * 4) for k in range(3)],
                       opset=20)
    feeds = {"x": x, "grid": grid}
    compiled = tg.from_onnx(model).compile(target="cuda")
    assert not any(k.name.startswith(("nearest", "linear", "cubic")) for k in compiled.kernels)    # not the cpu's
    for got, want in zip(compiled(feeds), run_onnxruntime(model, feeds)):
        assert_close(np.asarray(got), want, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("dtype, mode, padding", [(np.float64, "linear", "reflection"), (np.float64, "cubic", "zeros"),
                                                   (np.float64, "nearest", "border"), (np.float16, "cubic", "zeros")])
def test_grid_sample_float_types(dtype, mode, padding):
    """f64 as onnxruntime computes it (on the cpu by the operator's definitions, where f32 takes a kernel of its
    own); f16 (no onnxruntime kernel) computed in f32 and rounded once: onnxruntime's f32 result rounded to f16."""
    x_shape, wide = (2, 3, 4, 5), np.float64 if dtype == np.float64 else np.float32
    x, grid = np.random.default_rng(0).standard_normal(x_shape), grid_values((2, 3, 7, 2), 0).astype(dtype)
    model = grid_sample_model(x_shape, grid, dtype, constant_grid=True, mode=mode, padding_mode=padding)
    got = tg.from_onnx(model).compile()({"x": x.astype(dtype)})[0]
    model = grid_sample_model(x_shape, grid.astype(wide), wide, constant_grid=True, mode=mode, padding_mode=padding)
    want = run_onnxruntime(model, {"x": x.astype(dtype).astype(wide)})[0].astype(dtype)
    assert_close(got, want, rtol=1e-3 if dtype == np.float16 else 1e-12, atol=1e-3 if dtype == np.float16 else 1e-14)


@settings(max_examples=5, deadline=None)
@given(data=st.data(), case=st.sampled_from([(1, "linear", np.float32), (1, "cubic", np.float32),
                                             (3, "cubic", np.float32), (2, "nearest", np.int32)]),
       padding=st.sampled_from(["zeros", "reflection"]), align_corners=st.integers(0, 1), seed=st.integers(0, 99))
def test_grid_sample_matches_the_reference(data, case, padding, align_corners, seed):
    """Where onnxruntime has no kernel, onnx's reference implementation: 1-D, 3-D cubic, integer inputs (nearest).
    (Its padding clamps a cubic sample's coordinate before its taps with border padding: not compared; and it
    divides by zero reflecting about an axis of one pixel with align_corners: no such axis here.)"""
    rank, mode, dtype = case
    x_shape, grid_shape = sample_shapes(data.draw, rank)
    if align_corners and padding == "reflection":
        x_shape = x_shape[:2] + tuple(max(n, 2) for n in x_shape[2:])
    x = (np.random.default_rng(seed).standard_normal(x_shape) * 5).astype(dtype)
    model = grid_sample_model(x_shape, grid_values(grid_shape, seed), dtype, constant_grid=True, mode=mode,
                              padding_mode=padding, align_corners=align_corners)
    assert_close(tg.from_onnx(model).compile()({"x": x})[0], ReferenceEvaluator(model).run(None, {"x": x})[0],
                 rtol=1e-5, atol=1e-6)


@settings(max_examples=6, deadline=None)
@given(rank=st.sampled_from([2, 3]), n=st.sampled_from([1, 2]), sizes=st.lists(SIZES, min_size=3, max_size=3),
       align_corners=st.integers(0, 1), dtype=st.sampled_from([np.float32, np.float64]), seed=st.integers(0, 99))
def test_affine_grid_matches_onnxruntime(rank, n, sizes, align_corners, dtype, seed):
    """2-D and 3-D grids of theta, with and without align_corners (no axis of size 1 with it: see the refusals)."""
    spatial = [max(s, 2) if align_corners else s for s in sizes[:rank]]
    theta = np.random.default_rng(seed).uniform(-2, 2, (n, rank, rank + 1)).astype(dtype)
    node = helper.make_node("AffineGrid", ["theta", "size"], ["grid"], align_corners=align_corners)
    model = make_model([node], [("theta", theta.shape, ELEM[dtype])], [("grid", [None] * (rank + 2), ELEM[dtype])],
                       {"size": np.array([n, 3, *spatial], np.int64)}, opset=20)
    assert_close(tg.from_onnx(model).compile()({"theta": theta})[0], run_onnxruntime(model, {"theta": theta})[0],
                 rtol=1e-5, atol=1e-6)


def test_spatial_transformer():
    """AffineGrid's grid sampled by GridSample, one graph: an image rotated and shifted."""
    nodes = [helper.make_node("AffineGrid", ["theta", "size"], ["grid"]),
             helper.make_node("GridSample", ["x", "grid"], ["y"], padding_mode="border")]
    angle = 0.3
    theta = np.array([[[np.cos(angle), -np.sin(angle), 0.1], [np.sin(angle), np.cos(angle), -0.2]]], np.float32)
    model = make_model(nodes, [("x", [1, 2, 5, 7]), ("theta", [1, 2, 3])], [("y", [None] * 4)],
                       {"size": np.array([1, 2, 4, 6], np.int64)}, opset=20)
    feeds = {"x": np.random.default_rng(0).standard_normal((1, 2, 5, 7)).astype(np.float32), "theta": theta}
    assert_close(tg.from_onnx(model).compile()(feeds)[0], run_onnxruntime(model, feeds)[0], rtol=1e-5, atol=1e-6)


def test_refusals():
    """Shapes that do not match, another opset's mode names, unknown padding modes, linear sampling of integers,
    AffineGrid's undefined align_corners position on an axis of size 1, and a theta that does not fit size."""
    def sampling(x_shape, grid_shape, dtype=np.float32, **attrs):
        return grid_sample_model(x_shape, np.zeros(grid_shape, np.float32), dtype, **attrs)

    def affine(theta_shape, size, **attrs):
        node = helper.make_node("AffineGrid", ["theta", "size"], ["grid"], **attrs)
        return make_model([node], [("theta", theta_shape)], [("grid", [None] * (len(size) - 1))],
                          {"size": np.array(size, np.int64)}, opset=20)

    cases = [
        (sampling([1, 1, 4, 4], [1, 3, 3, 3]), OnnxImportError, r"X \(1, 1, 4, 4\) and grid .* do not match"),
        (sampling([2, 1, 4, 4], [1, 3, 3, 2]), OnnxImportError, "do not match"),
        (sampling([1, 1, 4, 4], [1, 3, 3, 2], mode="bilinear"), OnnxImportError,
         "mode='bilinear' is not one of opset 20's modes linear, nearest, cubic"),
        (sampling([1, 1, 4, 4], [1, 3, 3, 2], opset=16, mode="linear"), OnnxImportError,
         "not one of opset 16's modes bilinear"),
        (sampling([1, 1, 4, 4], [1, 3, 3, 2], padding_mode="wrap"), OnnxImportError,
         "padding_mode='wrap' is not one of zeros, border, reflection"),
        (sampling([1, 1, 4, 4], [1, 3, 3, 2], np.int32), UnsupportedOnnxError,
         "mode 'linear' on int32 inputs is not supported"),
        (affine([1, 2, 3], [1, 1, 1, 3], align_corners=1), UnsupportedOnnxError,
         "align_corners=1 with a spatial size of 1"),
        (affine([1, 2, 3], [2, 1, 3, 3]), OnnxImportError, r"theta must have shape \(2, 2, 3\)"),
        (affine([1, 2, 3], [1, 1, 1, 3, 3]), OnnxImportError, r"theta must have shape \(1, 3, 4\)"),
    ]
    for model, error, match in cases:
        with pytest.raises(error, match=match):
            tg.from_onnx(model)
