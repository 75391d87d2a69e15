"""conv2d: the matmul templates (implicit im2col fused into the loads, or on the cpu weights @ explicit
columns) and the direct schedule.

Oracle: a float64 numpy convolution written as a sum over kernel taps of strided slices.
"""
import dataclasses

import ml_dtypes
import numpy as np
import pytest
from hypothesis import assume, example, given, settings, strategies as st

import taskdsl as td
import stdlib_ops as ops
from stdlib_ops import conv, conv_direct, gemm
from stdlib_ops import matmul_cpu as cpu_tile
from stdlib_ops.conv_geometry import geometry
from taskdsl.schedule import tuner
from taskdsl.schedule.space import Space
import taskdsl.graph as tg


def reference(x, w, bias, stride, padding, dilation, groups):
    """NCHW convolution in float64, independent of the library."""
    n, c, h, wd = x.shape
    oc, cg, kh, kw = w.shape
    (sh, sw), (dh, dw) = stride, dilation
    pt, pl, pb, pr = padding
    xp = np.pad(x.astype(np.float64), ((0, 0), (0, 0), (pt, pb), (pl, pr)))
    oh = (h + pt + pb - dh * (kh - 1) - 1) // sh + 1
    ow = (wd + pl + pr - dw * (kw - 1) - 1) // sw + 1
    out = np.zeros((n, oc, oh, ow))
    ocg = oc // groups
    for o in range(oc):
        g = o // ocg
        for i in range(kh):
            for j in range(kw):
                patch = xp[:, g * cg:(g + 1) * cg, i * dh:i * dh + sh * oh:sh, j * dw:j * dw + sw * ow:sw]
                out[:, o] += np.einsum("nchw,c->nhw", patch, w[o, :, i, j].astype(np.float64))
    return out + (bias[None, :, None, None] if bias is not None else 0)


CASES = [   # n, c, h, w, oc, (kh, kw), stride, padding (t, l, b, r), dilation, groups
    (2, 8, 9, 7, 12, (3, 3), (1, 1), (1, 1, 1, 1), (1, 1), 1),
    (1, 6, 11, 13, 4, (3, 2), (2, 1), (0, 1, 2, 0), (2, 1), 2),
    (1, 3, 7, 7, 5, (1, 1), (1, 1), (0, 0, 0, 0), (1, 1), 1),
    (1, 4, 8, 8, 4, (3, 3), (1, 1), (1, 1, 1, 1), (1, 1), 4),       # depthwise: the direct schedule
    (1, 2, 5, 6, 4, (1, 1), (1, 1), (0, 0, 0, 0), (1, 1), 2),       # grouped 1x1, a reduction of 1: direct
    (1, 8, 32, 32, 80, (3, 3), (1, 1), (1, 1, 1, 1), (1, 1), 1),    # the cpu tile's scratch past a GPU's 227 KiB
]


@pytest.mark.parametrize("case", CASES, ids=lambda c: "x".join(map(str, c[:5])) + f"_g{c[-1]}")
@pytest.mark.parametrize("layout", ["NCHW", "NHWC"])
def test_conv2d_matches_reference(case, layout):
    td.set_target("cpu")
    n, c, h, w, oc, ks, stride, padding, dilation, groups = case
    rng = np.random.default_rng(sum(case[:5]))
    x = rng.standard_normal((n, c, h, w)).astype(np.float32)
    wt = rng.standard_normal((oc, c // groups) + ks).astype(np.float32)
    bias = rng.standard_normal(oc).astype(np.float32)
    expected = np.maximum(reference(x, wt, bias, stride, padding, dilation, groups), 0)
    xin = x if layout == "NCHW" else x.transpose(0, 2, 3, 1).copy()
    y = ops.conv2d(xin, wt, bias, stride=stride, padding=padding, dilation=dilation, groups=groups, layout=layout,
                   activation="relu")
    got = y if layout == "NCHW" else y.transpose(0, 3, 1, 2)
    np.testing.assert_allclose(got, expected, rtol=1e-4, atol=1e-4)


def test_empty_batch_and_a_bias_of_the_wrong_length():
    w = np.ones((4, 3, 3, 3), np.float32)
    for layout, shape, out in [("NCHW", (0, 3, 8, 8), (0, 4, 6, 6)), ("NHWC", (0, 8, 8, 3), (0, 6, 6, 4))]:
        y = ops.conv2d(np.zeros(shape, np.float32), w, np.zeros(4, np.float32), layout=layout, activation="relu")
        assert y.shape == out and y.dtype == np.float32
    with pytest.raises(ValueError, match=r"bias must have shape \(4,\) \(one per output channel\), got \(2,\)"):
        ops.conv2d(np.zeros((1, 3, 8, 8), np.float32), w, np.zeros(2, np.float32))


@settings(max_examples=8, deadline=None)
@given(n=st.sampled_from([1, 2]), c=st.sampled_from([1, 3, 5]), oc=st.sampled_from([4, 33]),
       hw=st.tuples(st.integers(24, 36), st.integers(32, 41)), k=st.sampled_from([(3, 3), (5, 3), (1, 1)]),
       stride=st.sampled_from([1, 2]), pad=st.integers(0, 2), dilation=st.sampled_from([1, 2]),
       fused=st.booleans(), seed=st.integers(0, 2**16))
def test_cpu_window_kernels_im2col_in_their_copy(n, c, oc, hw, k, stride, pad, dilation, fused, seed):
    """NCHW convolutions of 512+ pixels with rows of WINDOW_ROW or more: one GEMM kernel whose blocks copy the
    im2col of the input itself (`conv.window_kernel`), no columns kernel; prime and odd sizes, strides,
    dilations, padding, and a preceding ReLU fused into its loads with bias and ReLU6 in its stores."""
    td.set_target("cpu")
    (h, w), (kh, kw) = hw, k
    g = geometry((n, c, h, w), (oc, c, kh, kw), stride, pad, dilation)
    assume(g.ow >= conv.WINDOW_ROW and g.oh * g.ow >= 512 and (kh, kw, stride, pad) != (1, 1, 1, 0))
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((n, c, h, w)).astype(np.float32)
    wt = rng.standard_normal((oc, c, kh, kw)).astype(np.float32)
    b = rng.standard_normal(oc).astype(np.float32)
    low = conv.plan(g, td.f32, "cpu", True, "relu6").lowered
    assert low.window and low.columns is None and len(low.kernels) == 1
    want = np.clip(reference(x, wt, b, (stride,) * 2, (pad,) * 4, (dilation,) * 2, 1), 0, 6)
    np.testing.assert_allclose(ops.conv2d(x, wt, b, stride, pad, dilation, activation="relu6"), want,
                               rtol=1e-4, atol=1e-4)
    if fused:       # relu -> conv -> relu6 in a graph: the relu in the window kernel's loads
        t = tg.input("x", x.shape)
        y = tg.ops.clip(tg.ops.conv2d(tg.ops.relu(t), tg.constant(wt), tg.constant(b), stride, pad, dilation), 0.0, 6.0)
        cg = tg.Graph([t], [y]).compile("cpu", channels_last=False)
        assert [k.name for k in cg.kernels] == [low.kernel.name]
        want = np.clip(reference(np.maximum(x, 0), wt, b, (stride,) * 2, (pad,) * 4, (dilation,) * 2, 1), 0, 6)
        np.testing.assert_allclose(cg(x)[0], want, rtol=1e-4, atol=1e-4)


def test_gpu_convolutions_fold_im2col_into_the_gemm_loads(simulated_gpu):
    """On GPUs the GEMM's loads of A are the implicit im2col: one kernel, no A and no C buffer."""
    g = geometry((2, 9, 7, 8), (12, 4, 3, 3), padding=1, groups=2, layout="NHWC")
    low = conv.plan(g, td.f32, "cuda", True, "relu").lowered
    assert not low.transposed_a and not low.on_columns and low.kernels == [low.kernel]
    assert [name for name, _ in low.kernel.params] == ["B", "batch_index", "split", "X", "bias", "Z"]
    x, w = np.zeros((2, 9, 7, 8), np.float32), np.zeros((2, 36, 6), np.float32)
    text = low.kernel.ir(w, np.zeros((2, 2), np.int32), 1, x, np.zeros(12, np.float32),
                         np.zeros((2, 9, 7, 2, 6), np.float32))
    assert "X[" in text and "A[" not in text
    depthwise = geometry((1, 8, 8, 4), (4, 1, 3, 3), padding=1, groups=4, layout="NHWC")
    assert conv.plan(depthwise, td.f32, "cuda", False, None).direct        # a reduce (cpu: direct rows)
    tiny = conv.plan(geometry((1, 3, 7, 7), (5, 3, 1, 1)), td.f32, "cpu", False, None)   # reduction of 3,
    assert tiny.direct is None and tiny.lowered is not None                                # but ungrouped: a GEMM


@pytest.mark.parametrize("layout,groups,split", [("NCHW", 1, 4), ("NHWC", 2, 2)])   # 18 / 9 k tiles, >= 4 per chunk
def test_gpu_convolutions_with_few_tiles_split_k(simulated_gpu, layout, groups, split):
    """On a GPU a convolution whose output has too few tiles splits K: the implicit-im2col GEMM writes f32
    partials, a second kernel sums them with the bias and activation fused in (simulated GPU of 4 SMs)."""
    rng = np.random.default_rng(groups)
    x = rng.standard_normal((1, 16, 6, 6)).astype(np.float32)
    w = rng.standard_normal((8, 16 // groups, 3, 3)).astype(np.float32)
    bias = rng.standard_normal(8).astype(np.float32)
    xin = x if layout == "NCHW" else x.transpose(0, 2, 3, 1).copy()
    g = geometry(xin.shape, w.shape, padding=1, groups=groups, layout=layout)
    low = conv.plan(g, td.f32, "cuda", True, "relu").lowered
    assert low.matmul.split == split and low.kernels == [low.kernel, low.finish]
    assert [name for name, _ in low.finish.params][:2] == ["P", "split"] and "bias" in dict(low.finish.params)
    y = ops.conv2d(td.to_device(xin), w, bias, padding=1, groups=groups, layout=layout, activation="relu").numpy()
    got = y if layout == "NCHW" else y.transpose(0, 3, 1, 2)
    want = np.maximum(reference(x, w, bias, (1, 1), (1, 1, 1, 1), (1, 1), groups), 0)
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)
    assert [k.name for k, _ in simulated_gpu.launches][-2:] == [low.kernel.name, low.finish.name]


@pytest.mark.parametrize("channels,pixels,split", [(64, 7, 2), (8, 13, 1)])    # 8 k tiles of 8: two chunks; one
def test_gpu_pointwise_nhwc_convolutions_read_the_input_as_the_gemm_operand(simulated_gpu, channels, pixels, split):
    """On a GPU a 1x1 stride-1 NHWC convolution of an input tensor is a plain GEMM of the input (N*H*W x C) by the
    weights: no im2col in its loads; the bias and activation still fuse into its stores (or into the split-k sum)."""
    rng = np.random.default_rng(channels)
    x = rng.standard_normal((1, pixels, pixels, channels)).astype(np.float32)
    w = rng.standard_normal((8, channels, 1, 1)).astype(np.float32)
    bias = rng.standard_normal(8).astype(np.float32)
    g = geometry(x.shape, w.shape, layout="NHWC")
    low = conv.plan(g, td.f32, "cuda", True, "relu").lowered
    assert low.on_columns and low.columns is None and low.matmul.split == split
    assert "A" in dict(low.kernel.params) and "X" not in dict(low.kernel.params)
    assert low.kernels == [low.kernel] + ([low.finish] if split > 1 else [])
    assert "bias" in dict((low.finish or low.kernel).params)
    y = ops.conv2d(td.to_device(x), w, bias, layout="NHWC", activation="relu").numpy()
    want = np.maximum(reference(x.transpose(0, 3, 1, 2), w, bias, (1, 1), (0, 0, 0, 0), (1, 1), 1), 0)
    np.testing.assert_allclose(y.transpose(0, 3, 1, 2), want, rtol=1e-4, atol=1e-4)
    assert [k.name for k, _ in simulated_gpu.launches][-len(low.kernels):] == [k.name for k in low.kernels]


def test_gpu_convolutions_are_tuned_on_their_own_kernels(simulated_gpu, monkeypatch):
    """On a GPU the tuner ranks a convolution's schedules by timing the convolution itself at each point (its
    implicit im2col, and a split point's sum), keyed by its geometry; the plan runs the winner."""
    seen = {}
    space = gemm.template_for(td.f32, "cuda").space("cuda", 4)
    winner = next(p for p in space.points() if gemm.choose_split(p, 1, 36, 8, 144, "cuda") == 1)

    def record(space, build, args, **options):
        seen.update(build=build, args=args, **options)
        return winner
    monkeypatch.setattr(conv, "tune", record)
    monkeypatch.setenv("TASKDSL_TUNE", "1")
    conv._plan.cache_clear()
    rng = np.random.default_rng(5)
    x = rng.standard_normal((1, 16, 6, 6)).astype(np.float32)
    w = rng.standard_normal((8, 16, 3, 3)).astype(np.float32)
    g = geometry(x.shape, w.shape, padding=1)
    low = conv.plan(g, td.f32, "cuda", True, "relu").lowered
    assert low.matmul.point == winner and seen["op"] == "conv_simt_matmul" and seen["shapes"] == (g,)
    assert seen["outputs"] == {2: td.f32}       # a would-be winner's output is checked against the default's
    x_example, weight, out = seen["args"]
    assert x_example.shape == x.shape and out.shape == g.out_shape
    want = reference(x_example, w, None, (1, 1), (1, 1, 1, 1), (1, 1), 1)
    split_point = next(p for p in space.points() if gemm.choose_split(p, 1, 36, 8, 144, "cuda") > 1)
    for point in (seen["default"], split_point):
        candidate = seen["build"](point)
        assert candidate.lowered.matmul.point == point
        assert (candidate.lowered.finish is not None) == (candidate.lowered.matmul.split > 1)
        packed = td.to_device(candidate.lowered.weight_operand(w))
        x_dev, y_dev = td.to_device(x_example), td.to_device(np.full(g.out_shape, np.nan, np.float32))
        candidate.compile(x_dev, packed, y_dev, target="cuda")      # every kernel, as the tuner compiles one
        simulated_gpu.launches.clear()
        candidate(x_dev, packed, y_dev)
        assert [k.name for k, _ in simulated_gpu.launches] == [k.name for k in candidate.lowered.kernels]
        np.testing.assert_allclose(y_dev.numpy(), want, rtol=1e-4, atol=1e-4)


class SerialPool:
    """ThreadPoolExecutor's `map` in the calling thread."""

    def __init__(self, workers=None):
        pass

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False

    def map(self, fn, items):
        return map(fn, items)


def tune_over_a_pair(monkeypatch, tmp_path, dtype, g) -> tuple:
    """Tuning on, into `tmp_path`, over two points of `dtype`'s GPU space for convolution `g`: one that splits K
    and one that does not (on this GPU's SM count). Returns them (unsplit, split)."""
    monkeypatch.setenv("TASKDSL_CACHE_DIR", str(tmp_path))
    monkeypatch.setenv("TASKDSL_TUNE", "1")
    template = gemm.template_for(dtype, "cuda")
    full = template.space("cuda", dtype.bits // 8)
    groups, m, k, n = g.gemm
    splits = lambda p: gemm.choose_split(p, groups, m, n, k, "cuda", template) > 1
    unsplit, split = (next(p for p in full.points() if splits(p) == want) for want in (False, True))
    pair = Space(full.name, full.axes, lambda q: None if q in (unsplit, split) else "off the pair")
    monkeypatch.setattr(gemm, "template_for", lambda dtype, target, *_: dataclasses.replace(
        template, space=lambda target, itemsize: pair))
    conv._plan.cache_clear()
    return unsplit, split


@pytest.mark.parametrize("dtype, channels, hw", [(td.f32, 16, 6), (td.bf16, 64, 7)], ids=["f32", "bf16"])
def test_gpu_convolution_tuning_end_to_end(simulated_gpu, tmp_path, monkeypatch, dtype, channels, hw):
    """A convolution tuned on the (simulated) GPU over a two-point space, with a timer that prefers the split
    point: the winner is stored per geometry, reported, and the plan runs it correctly; f32 on the SIMT template,
    bf16 on the tensor-core one (its tuning operands bf16 values, its winner checked as values)."""
    rng = np.random.default_rng(8)
    host_type = td.ir.types.numpy_dtype(dtype)
    x = rng.standard_normal((1, channels, hw, hw)).astype(host_type)
    w = (rng.standard_normal((8, channels, 3, 3)) / np.sqrt(channels)).astype(host_type)
    g = geometry(x.shape, w.shape, padding=1)
    template = gemm.template_for(dtype, "cuda").name
    _, split_point = tune_over_a_pair(monkeypatch, tmp_path, dtype, g)
    timed = []

    def timer(target):
        def time_it(fn):        # the split point (its sum kernel among the launches) is the faster
            simulated_gpu.launches.clear()
            fn()
            timed.append([k.name for k, _ in simulated_gpu.launches])
            return 1.0 if any(name.startswith("split_k_sum") for name in timed[-1]) else 2.0
        return time_it, time_it
    monkeypatch.setattr(tuner, "_timer", timer)
    monkeypatch.setattr(tuner, "ThreadPoolExecutor", SerialPool)    # the simulated GPU is this thread's
    low = conv.plan(g, dtype, "cuda", False, None).lowered
    assert low.matmul.point == split_point and low.finish is not None
    assert sorted(map(len, timed)) == [1, 1, 2, 2]       # each point once as a probe, once in full
    lines = conv.tuning_report(g, dtype)
    assert lines[0].startswith(f"conv_{template}") and "2 timed of 2" in lines[0] and len(lines) == 3
    assert "#1" in lines[1] and f"'warps': {list(split_point.warps)}" in lines[1] and "#2" in lines[2]
    y = ops.conv2d(td.to_device(x), w, padding=1).numpy()
    assert y.dtype == host_type
    want = reference(x, w, None, (1, 1), (1, 1, 1, 1), (1, 1), 1)
    np.testing.assert_allclose(y.astype(np.float64), want, rtol=1e-4 if dtype == td.f32 else 2**-7,
                               atol=1e-4 if dtype == td.f32 else 2**-7)
    conv._plan.cache_clear()


@pytest.mark.gpu
def test_f16_convolution_tuning_on_a_gpu(tmp_path, monkeypatch):
    """On a GPU, a tensor-core convolution tuned for real over two points, one splitting K (timed as CUDA-graph
    replays of its two kernels): both are timed, and the winner runs correctly."""
    td.set_target("cuda")
    rng = np.random.default_rng(9)
    x = rng.standard_normal((1, 14, 14, 32)).astype(np.float16)
    w = (rng.standard_normal((64, 32, 3, 3)) / 17).astype(np.float16)
    g = geometry(x.shape, w.shape, padding=1, layout="NHWC")
    pair = tune_over_a_pair(monkeypatch, tmp_path, td.f16, g)
    low = conv.plan(g, td.f16, "cuda", False, None).lowered
    assert low.matmul.point in pair
    assert "2 timed of 2 (0 failed)" in conv.tuning_report(g, td.f16)[0]
    y = ops.conv2d(td.to_device(x), w, padding=1, layout="NHWC").numpy()
    want = reference(x.transpose(0, 3, 1, 2), w, None, (1, 1), (1,) * 4, (1, 1), 1)
    np.testing.assert_allclose(y.transpose(0, 3, 1, 2).astype(np.float64), want, rtol=2e-2, atol=2e-2)
    conv._plan.cache_clear()


@settings(max_examples=12, deadline=None)
@given(hw=st.tuples(st.integers(1, 6), st.sampled_from([1, 15, 16, 17, 31, 33, 40])), k=st.sampled_from([1, 3]),
       stride=st.sampled_from([1, 2, 3]), pad=st.integers(0, 2), dilation=st.sampled_from([1, 2]),
       seed=st.integers(0, 2**16))
def test_cpu_columns_kernel_is_numpys_im2col(hw, k, stride, pad, dilation, seed):
    """`columns_kernel` copies each output row's pixels inside the input in whole runs of COPY_RUN, the last one
    overlapping the one before, a shorter row one by one, and zeros the padding: rows around a run's width, any
    stride, padding and dilation, against numpy's im2col of the zero-padded input."""
    (h, w), span = hw, dilation * (k - 1) + 1
    assume(h + 2 * pad >= span and w + 2 * pad >= span)
    g = geometry((2, 3, h, w), (4, 3, k, k), stride, pad, dilation)
    x = np.random.default_rng(seed).standard_normal((2, 3, h, w)).astype(np.float32)
    cols = np.full(conv._columns_shape(g), np.nan, np.float32)
    conv.columns_kernel(td.f32)(x, cols, *conv._columns_scalars(g).values())
    padded = np.pad(x, ((0, 0), (0, 0), (pad, pad), (pad, pad)))
    taps = [padded[:, :, i * dilation:i * dilation + stride * (g.oh - 1) + 1:stride,
                   j * dilation:j * dilation + stride * (g.ow - 1) + 1:stride] for i in range(k) for j in range(k)]
    want = np.stack(taps, axis=2).reshape(2, 3 * k * k, g.oh * g.ow)       # rows (c, kh, kw)
    np.testing.assert_array_equal(cols, want)


def test_cpu_nchw_convolutions_multiply_explicit_columns_by_the_packed_weights():
    """On the cpu, NCHW: an im2col kernel (generic over geometries, K x OH*OW per image), then columns^T @
    weights (the template's transposed A and packed B) with the epilogue fused, storing C transposed; a 1x1
    stride-1 convolution reads its input as the columns, the B of weights @ input: one kernel."""
    td.set_target("cpu")
    rng = np.random.default_rng(7)
    g = geometry((2, 40, 9, 7), (12, 40, 3, 3), padding=1)
    low = conv.plan(g, td.f32, "cpu", True, "relu").lowered
    assert low.transposed_a and low.columns is conv.columns_kernel(td.f32)
    assert [k.name for k in low.kernels] == ["im2col_f32", low.matmul.kernel(packed_b=True).name + "_at_fused"]
    assert low.matmul.operand_shapes(transposed_a=True)[0] == (2, 40 * 9, 9 * 7)
    assert low.matmul.kernel(packed_b=True).name.startswith("tile_matmul_")
    assert [name for name, _ in low.kernel.params] == ["A", "B", "batch_index", "split", "bias", "Z"]
    pointwise = conv.plan(geometry((2, 40, 9, 7), (12, 40, 1, 1)), td.f32, "cpu", False, None).lowered
    assert pointwise.columns is None and len(pointwise.kernels) == 1
    x = rng.standard_normal((2, 40, 9, 7)).astype(np.float32)
    for ks, pad in (((3, 3), 1), ((1, 1), 0)):
        w = rng.standard_normal((12, 40) + ks).astype(np.float32)
        b = rng.standard_normal(12).astype(np.float32)
        want = np.maximum(reference(x, w, b, (1, 1), (pad,) * 4, (1, 1), 1), 0)
        np.testing.assert_allclose(ops.conv2d(x, w, b, padding=pad, activation="relu"), want, rtol=1e-4, atol=1e-4)


@settings(max_examples=8, deadline=None)
@given(n=st.sampled_from([1, 2, 3]), c=st.sampled_from([1, 3, 16, 37]), oc=st.sampled_from([1, 5, 64, 97]),
       hw=st.tuples(st.integers(1, 41), st.sampled_from([1, 7, 31, 64, 97])), dtype=st.sampled_from([td.f32, td.f16,
       td.bf16]), activation=st.sampled_from([None, "relu6"]), seed=st.integers(0, 2**16))
@example(n=2, c=3, oc=5, hw=(13, 97), dtype=td.f32, activation="relu6", seed=1)      # weights @ input
@example(n=1, c=37, oc=64, hw=(1, 1), dtype=td.f32, activation=None, seed=2)        # columns^T @ weights
def test_cpu_pointwise_nchw_convolutions_multiply_the_weights_by_the_input(n, c, oc, hw, dtype, activation, seed):
    """On the cpu a 1x1 stride-1 NCHW convolution of WEIGHTS_FIRST_PIXELS or more is weights (OC x C) @ input
    (C x H*W) per image: the weights are A, read as they are and shared by the images, the input B, and C the output
    itself (no transposed store), the bias and activation fused into its stores; fewer pixels keep columns^T @
    weights. Prime and odd sizes, one channel, one pixel, 16-bit floats."""
    td.set_target("cpu")
    g = geometry((n, c) + hw, (oc, c, 1, 1))
    low = conv.plan(g, dtype, "cpu", True, activation).lowered
    pixels = hw[0] * hw[1]
    assert low.weights_first == (pixels >= conv.WEIGHTS_FIRST_PIXELS) != low.transposed_a
    assert low.kernels == [low.kernel] and ("_at" in low.kernel.name) == low.transposed_a
    if low.weights_first:
        assert low.matmul.operand_shapes() == ((1, oc, c), (n, c, pixels), (n, oc, pixels))
    rng = np.random.default_rng(seed)
    values = ml_dtypes.bfloat16 if dtype == td.bf16 else dtype.numpy
    x = rng.standard_normal((n, c) + hw).astype(values)
    w = (rng.standard_normal((oc, c, 1, 1)) / np.sqrt(c)).astype(values)
    b = rng.standard_normal(oc).astype(values)
    want = reference(x.astype(np.float32), w.astype(np.float32), b.astype(np.float32), (1, 1), (0,) * 4, (1, 1), 1)
    want = np.clip(want, 0, 6) if activation else want
    got = ops.conv2d(x, w, b, activation=activation)
    assert got.dtype == x.dtype and got.shape == want.shape
    tolerance = {td.f32: 1e-4, td.f16: 4e-3, td.bf16: 3e-2}[dtype]
    np.testing.assert_allclose(got.astype(np.float64), want, rtol=tolerance, atol=tolerance)


@settings(max_examples=6, deadline=None)
@given(n=st.sampled_from([1, 2]), c=st.sampled_from([1, 3, 5]), oc=st.sampled_from([63, 64, 96, 97]),
       size=st.sampled_from([(32, 32), (37, 41), (17, 61), (20, 20)]), kernel=st.sampled_from([(3, 3), (1, 5), (2, 1)]),
       stride=st.sampled_from([(1, 1), (1, 2)]), padding=st.sampled_from([(0, 0, 0, 0), (1, 2, 2, 0)]),
       dilation=st.sampled_from([(1, 1), (2, 1)]), dtype=st.sampled_from([td.f32, td.f16, td.bf16]),
       seed=st.integers(0, 2**16))
@example(n=2, c=3, oc=64, size=(37, 41), kernel=(3, 3), stride=(1, 1), padding=(1, 1, 1, 1), dilation=(1, 1),
         dtype=td.f32, seed=1)      # weights @ the input's window
@example(n=1, c=3, oc=97, size=(37, 41), kernel=(3, 3), stride=(1, 1), padding=(1, 1, 1, 1), dilation=(1, 1),
         dtype=td.f32, seed=2)      # columns^T @ weights: a second row block would copy the window again
@example(n=1, c=1, oc=96, size=(32, 32), kernel=(1, 5), stride=(1, 1), padding=(0, 2, 0, 2), dilation=(1, 1),
         dtype=td.bf16, seed=3)     # bf16 through the window's copy, exactly 1024 pixels
def test_cpu_nchw_convolutions_of_64_to_96_channels_multiply_the_weights_by_the_inputs_window(
        n, c, oc, size, kernel, stride, padding, dilation, dtype, seed):
    """On the cpu an NCHW convolution with a window, WINDOW_B_CHANNELS output channels and WEIGHTS_FIRST_PIXELS
    output pixels or more is weights (OC x C*KH*KW) @ im2col per image, each block copying its panels of the im2col
    from the input (`window_b`; zeros in the padding): C is the output itself. Other convolutions keep columns^T @
    weights. Strides, dilations, uneven padding, odd and prime sizes, 16-bit floats."""
    td.set_target("cpu")
    g = geometry((n, c) + size, (oc, c) + kernel, stride, padding, dilation)
    low = conv.plan(g, dtype, "cpu", True, "relu").lowered
    expected = g.oh * g.ow >= conv.WEIGHTS_FIRST_PIXELS and oc in conv.WINDOW_B_CHANNELS
    assert low.weights_first == expected and ("_bwindow" in low.kernel.name) == expected
    if expected:
        assert low.kernels == [low.kernel] and low.matmul.operand_shapes()[0] == (1, oc, c * kernel[0] * kernel[1])
    rng = np.random.default_rng(seed)
    values = ml_dtypes.bfloat16 if dtype == td.bf16 else dtype.numpy
    x = rng.standard_normal((n, c) + size).astype(values)
    w = (rng.standard_normal((oc, c) + kernel) / np.sqrt(c * kernel[0] * kernel[1])).astype(values)
    b = rng.standard_normal(oc).astype(values)
    want = np.maximum(reference(x.astype(np.float32), w.astype(np.float32), b.astype(np.float32), stride, padding,
                                dilation, 1), 0)
    got = ops.conv2d(x, w, b, stride=stride, padding=padding, dilation=dilation, activation="relu")
    assert got.dtype == x.dtype and got.shape == want.shape
    tolerance = {td.f32: 1e-4, td.f16: 4e-3, td.bf16: 3e-2}[dtype]
    np.testing.assert_allclose(got.astype(np.float64), want, rtol=tolerance, atol=tolerance)


def test_a_residual_add_fuses_into_the_stores_of_weights_at_input():
    """A graph's pointwise NCHW convolution (weights @ input) with a residual add of another input and a ReLU: one
    kernel, its C rows the output's, the add reading the other input at the same elements."""
    rng = np.random.default_rng(3)
    x = rng.standard_normal((2, 16, 40, 41)).astype(np.float32)
    y = rng.standard_normal((2, 24, 40, 41)).astype(np.float32)
    w, b = rng.standard_normal((24, 16, 1, 1)).astype(np.float32), rng.standard_normal(24).astype(np.float32)
    tx, ty = tg.input("x", x.shape), tg.input("y", y.shape)
    out = tg.ops.relu(tg.ops.add(tg.ops.conv2d(tx, tg.constant(w), tg.constant(b)), ty))
    cg = tg.Graph([tx, ty], [out]).compile("cpu", channels_last=False)
    (kernel,) = cg.kernels
    assert kernel.name.startswith("tile_matmul_") and kernel.name.endswith("_fused") and "_at" not in kernel.name
    want = np.maximum(reference(x, w, b, (1, 1), (0,) * 4, (1, 1), 1) + y, 0)
    np.testing.assert_allclose(cg(x, y)[0], want, rtol=1e-4, atol=1e-4)


def test_cpu_nhwc_convolutions_read_their_im2col_in_place_from_the_padded_input():
    """On the cpu, NHWC of one group: the input copied into its zero border, then the `indirect` GEMM, reading
    element (pixel, (kh, kw, c)) of the im2col at the pixel's offset plus the tap's; C comes out NHWC. Without
    padding the input itself is read (one kernel), and a 1x1 stride-1 convolution's input is the columns."""
    td.set_target("cpu")
    g = geometry((2, 9, 7, 40), (12, 40, 3, 3), padding=(1, 2, 0, 1), layout="NHWC")
    low = conv.plan(g, td.f32, "cpu", True, "relu").lowered
    assert low.on_columns and low.indirect and low.columns is conv.pad_kernel(td.f32)
    assert [k.name for k in low.kernels] == ["pad_nhwc_f32", low.matmul.kernel(packed_b=True).name + "_indirect_fused"]
    table = low.batch_index[0, 2:]           # the offsets of pixel (1, 3, 4) and of tap (2, 1, 5), by hand
    hp, wp, oh, ow = 9 + 1, 7 + 3, 8, 8
    assert table[(1 * oh + 3) * ow + 4] == ((1 * hp + 3) * wp + 4) * 40
    assert table[2 * oh * ow + (2 * 3 + 1) * 40 + 5] == (2 * wp + 1) * 40 + 5
    w = np.random.default_rng(5).standard_normal((12, 40, 3, 3)).astype(np.float32)   # as the template's B panels
    np.testing.assert_array_equal(low.weight_operand(w), cpu_tile.pack_b(low.matmul.point, conv.pack_weight(g, w)))
    x = np.random.default_rng(6).standard_normal((2, 9, 7, 40)).astype(np.float32)
    want = reference(x.transpose(0, 3, 1, 2), w, None, (1, 1), g.padding, (1, 1), 1).transpose(0, 2, 3, 1)
    np.testing.assert_allclose(ops.conv2d(x, w, padding=(1, 2, 0, 1), layout="NHWC"), want, rtol=1e-4, atol=1e-4)
    unpadded = conv.plan(geometry((2, 9, 7, 40), (12, 40, 3, 3), stride=2, layout="NHWC"), td.f32, "cpu",
                         False, None)
    assert unpadded.lowered.indirect and unpadded.lowered.columns is None and len(unpadded.kernels) == 1
    pointwise = conv.plan(geometry((2, 9, 7, 40), (12, 40, 1, 1), layout="NHWC"), td.f32, "cpu", False, None)
    assert not pointwise.lowered.indirect and pointwise.lowered.columns is None and len(pointwise.kernels) == 1


@pytest.mark.parametrize("dtype", [td.f16, td.bf16], ids=["f16", "bf16"])
@pytest.mark.parametrize("padding", [(1, 2, 0, 1), (0, 0, 0, 0)], ids=["padded", "unpadded"])
def test_cpu_nhwc_convolutions_of_16_bit_floats_widen_their_input_to_f32(dtype, padding):
    """A 16-bit input is copied into its zero border as f32 (without a border too: a copy), and the indirect GEMM
    reads f32, which its micro-kernel broadcasts from memory (it converted each element at each load, a scalar at
    a time: 1.6-1.7x f32's time). Oracle: the f32 reference of the 16-bit values, rounded to the type."""
    td.set_target("cpu")
    g = geometry((2, 9, 7, 40), (12, 40, 3, 3), padding=padding, layout="NHWC")
    low = conv.plan(g, dtype, "cpu", False, None).lowered
    assert low.indirect and low.columns is conv.pad_kernel(dtype, td.f32)
    assert [k.name for k in low.kernels][0] == f"pad_nhwc_{dtype.name}_to_f32"
    assert dict(low.kernel.params)["A"].dtype == td.f32
    rng, values = np.random.default_rng(7), ml_dtypes.bfloat16 if dtype == td.bf16 else np.float16
    x = rng.standard_normal((2, 9, 7, 40)).astype(values)
    w = (rng.standard_normal((12, 40, 3, 3)) / 19).astype(values)
    got = ops.conv2d(x, w, padding=padding, layout="NHWC")
    want = reference(x.astype(np.float32).transpose(0, 3, 1, 2), w.astype(np.float32), None, (1, 1), padding,
                     (1, 1), 1).transpose(0, 2, 3, 1)
    assert got.dtype == values
    np.testing.assert_allclose(got.astype(np.float32), want.astype(values).astype(np.float32),
                               rtol=2e-2 if dtype == td.bf16 else 2e-3, atol=1e-2 if dtype == td.bf16 else 1e-3)


def test_cpu_nhwc_convolutions_past_i32_offsets_take_the_implicit_im2col(monkeypatch):
    """An input whose padded elements pass i32 cannot be the indirect GEMM's table: the implicit im2col runs
    (a geometry that small, told it is that large)."""
    td.set_target("cpu")
    monkeypatch.setattr(conv, "_indexable", lambda g: False)
    x = np.random.default_rng(8).standard_normal((1, 6, 5, 7)).astype(np.float32)
    w = np.random.default_rng(9).standard_normal((4, 7, 3, 3)).astype(np.float32)
    g = geometry(x.shape, w.shape, stride=(2, 1), padding=(1, 0, 2, 1), layout="NHWC")
    low = conv.lower(g, td.f32, "cpu", conv._x_placeholder(g, td.f32), conv.no_epilogue)
    assert not low.on_columns and low.kernels == [low.kernel]
    out = np.empty(g.out_shape, np.float32)
    low.run({"X": x}, low.weight_operand(w), out)
    want = reference(x.transpose(0, 3, 1, 2), w, None, (2, 1), (1, 0, 2, 1), (1, 1), 1).transpose(0, 2, 3, 1)
    np.testing.assert_allclose(out, want, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("kernel", [(1, 1), (3, 2)])
def test_cpu_grouped_nhwc_convolutions_read_each_groups_im2col_in_place(kernel):
    """Grouped NHWC on the cpu: the indirect GEMM batched over (image, group), each z-slice's A at its image's and
    group's first channel in the padded input, with its group's weights (the implicit im2col took 4x the
    time), a 1x1 convolution too (its input is no group's columns matrix); depthwise ones run direct."""
    td.set_target("cpu")
    rng = np.random.default_rng(6)
    x = rng.standard_normal((2, 5, 6, 120)).astype(np.float32)          # 3 groups of 40 channels
    w = rng.standard_normal((9, 40, *kernel)).astype(np.float32)
    padding = (kernel[0] // 2, 0)
    g = geometry(x.shape, w.shape, padding=padding, groups=3, layout="NHWC")
    low = conv.plan(g, td.f32, "cpu", False, None).lowered
    assert low.indirect and low.matmul.operand_shapes()[2] == (2 * 3, g.oh * g.ow, 3)
    image = (5 + 2 * padding[0]) * 6 * 120
    assert low.batch_index[:, 0].tolist() == [0, 40, 80, image, image + 40, image + 80]
    got = ops.conv2d(x, w, padding=padding, groups=3, layout="NHWC")
    want = reference(x.transpose(0, 3, 1, 2), w, None, (1, 1), g.padding, (1, 1), 3).transpose(0, 2, 3, 1)
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)
    depthwise = geometry((1, 9, 9, 8), (8, 1, 7, 7), padding=3, groups=8, layout="NHWC")    # 49 terms
    assert isinstance(conv.plan(depthwise, td.f32, "cpu", False, None).lowered, conv_direct.DirectRows)


@settings(max_examples=8, deadline=None)
@given(n=st.sampled_from([1, 2]), c=st.sampled_from([5, 11, 37]), hw=st.tuples(st.integers(1, 12), st.integers(1, 12)),
       oc=st.sampled_from([1, 7, 50]), k=st.sampled_from([(1, 1), (3, 3), (2, 5)]), stride=st.sampled_from([1, 2]),
       pad=st.tuples(*[st.integers(0, 2)] * 4), dilation=st.sampled_from([1, 2]),
       layout=st.sampled_from(["NCHW", "NHWC"]), seed=st.integers(0, 2**16))
def test_cpu_columns_lowering_matches_reference(n, c, hw, oc, k, stride, pad, dilation, layout, seed):
    """The cpu's GEMM routes (NCHW columns or window, NHWC indirect or pointwise) against float64 numpy, with
    padding (top, left, bottom, right) of its own on each side."""
    td.set_target("cpu")
    kh, kw = k
    h, w = hw
    assume(h + pad[0] + pad[2] >= dilation * (kh - 1) + 1 and w + pad[1] + pad[3] >= dilation * (kw - 1) + 1)
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((n, c, h, w)).astype(np.float32)
    wt = rng.standard_normal((oc, c, kh, kw)).astype(np.float32)
    want = reference(x, wt, None, (stride,) * 2, pad, (dilation,) * 2, 1)
    if layout == "NHWC":
        got = ops.conv2d(x.transpose(0, 2, 3, 1), wt, stride=stride, padding=pad, dilation=dilation, layout=layout)
        got = got.transpose(0, 3, 1, 2)
    else:
        got = ops.conv2d(x, wt, stride=stride, padding=pad, dilation=dilation)
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)


@settings(max_examples=6, deadline=None)
@given(data=st.data(), batch=st.sampled_from([1, 2]), groups=st.sampled_from([2, 3]),
       per_group=st.sampled_from([2, 5]), outputs=st.sampled_from([1, 3, 6]), kernel=st.sampled_from([(3, 3), (1, 1),
       (2, 3)]), stride=st.sampled_from([(1, 1), (2, 1), (2, 2)]), dilation=st.sampled_from([(1, 1), (2, 1)]),
       activation=st.sampled_from([None, "relu6"]), seed=st.integers(0, 99))
def test_grouped_plane_convolutions_match_numpy(data, batch, groups, per_group, outputs, kernel, stride, dilation,
                                                activation, seed):
    """`grouped_plane_kernel` on drawn geometries: several channels a group, output channels a group not a multiple
    of its GROUP_OUTPUTS (one, three, six: chunks partial), strides, dilations, asymmetric padding, odd and prime
    sizes, a bias and an activation fused into its stores; an inf weight, whose products with the padding's zeros
    are NaN as im2col's are."""
    h, w = data.draw(st.sampled_from([5, 7, 11]), label="h"), data.draw(st.sampled_from([1, 6, 13]), label="w")
    padding = tuple(data.draw(st.lists(st.integers(0, 2), min_size=4, max_size=4), label="padding"))
    assume(all(n + before + after > d * (k - 1) for n, before, after, d, k in
               zip((h, w), padding[:2], padding[2:], dilation, kernel)))
    g = geometry((batch, groups * per_group, h, w), (groups * outputs, per_group) + kernel, stride, padding, dilation,
                 groups)
    assert conv_direct.uses_grouped_planes(g)
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((batch, groups * per_group, h, w)).astype(np.float32)
    wt = rng.standard_normal((groups * outputs, per_group) + kernel).astype(np.float32)
    bias = rng.standard_normal(groups * outputs).astype(np.float32)
    if data.draw(st.booleans(), label="an inf weight"):
        wt[-1, 0, 0, 0] = np.inf
    want = reference(x, wt, bias, stride, padding, dilation, groups)
    want = np.clip(want, 0, 6) if activation else want
    plan = conv.plan(g, td.f32, "cpu", True, activation)
    assert plan.kernels[0].name.startswith("conv_grouped_plane_f32")
    got = ops.conv2d(x, wt, bias, stride, padding, dilation, groups, activation=activation)
    np.testing.assert_allclose(got, want.astype(np.float32), rtol=1e-4, atol=1e-4)


def test_cpu_direct_convolutions_run_rows_with_the_epilogue_in_the_stores():
    """A grouped NCHW conv with a tiny reduction runs `direct_kernel` on the cpu (`plane_kernel` for a
    depthwise conv whose padded input, or its phases when strided, fits its buffer; `grouped_plane_kernel` for one
    of more channels a group whose planes fit its): one generic kernel, or one kernel with bias and activation
    fused and the window geometry built in; on GPUs the rule-scheduled reduce stays."""
    g = geometry((1, 8, 9, 9), (16, 1, 3, 3), padding=1, groups=8)
    strided = geometry((1, 8, 9, 9), (16, 1, 3, 3), stride=2, padding=1, groups=8)
    for plane in (g, strided):
        assert (conv_direct.on_rows(plane, "cpu") and not conv_direct.on_rows(plane, "cuda")
                and conv_direct.uses_plane(plane))
        assert conv.plan(plane, td.f32, "cpu", False, None).kernels == [conv_direct.plane_kernel(td.f32)]
    wide = geometry((1, 8, 130, 130), (8, 1, 3, 3), padding=1, groups=8)  # a padded plane over PLANE
    big = geometry((1, 8, 100, 100), (8, 1, 3, 3), stride=2, padding=1, groups=8)    # phases over PLANE
    two = geometry((1, 8, 130, 130), (8, 2, 3, 3), padding=1, groups=4)  # 2 channels a group, a span past GROUP_SPAN
    for rows in (wide, big, two):
        assert not conv_direct.uses_plane(rows) and not conv_direct.uses_grouped_planes(rows)
        assert conv.plan(rows, td.f32, "cpu", False, None).kernels == [conv_direct.direct_kernel(td.f32)]
    two = geometry((1, 8, 9, 9), (8, 2, 3, 3), padding=1, groups=4)          # two input channels a group
    assert conv.plan(two, td.f32, "cpu", False, None).kernels == [conv_direct.grouped_plane_kernel(td.f32)]
    nhwc = geometry((1, 9, 9, 8), (16, 1, 3, 3), padding=1, groups=8, layout="NHWC")
    assert conv.plan(nhwc, td.f32, "cpu", False, None).kernels == [conv_direct.direct_nhwc_kernel(td.f32)]
    fused = conv.plan(wide, td.f32, "cpu", True, "relu6").lowered
    assert [k.name for k in fused.kernels] == ["conv_direct_rows_f32_fused"]
    assert [name for name, _ in fused.kernel.params] == ["X", "Wt", "bias", "Z"]     # no geometry scalars left
    fused = conv.plan(g, td.f32, "cpu", True, "relu6").lowered
    assert [k.name for k in fused.kernels] == ["conv_direct_plane_f32_fused"]
    assert [name for name, _ in fused.kernel.params] == ["X", "Wt", "conv_span", "conv_plane", "conv_out", "conv_taps",
                                                         "bias", "Z"]
    rng = np.random.default_rng(3)
    for hw in (9, 61):     # a plane of one sweep of sums, and one of many (61 x 61 rows of 63: 3904 sums)
        x, w, b = (rng.standard_normal(s).astype(np.float32) for s in ((1, 8, hw, hw), (16, 1, 3, 3), (16,)))
        assert conv_direct.uses_plane(geometry(x.shape, w.shape, padding=1, groups=8))
        want = np.clip(reference(x, w, b, (1, 1), (1,) * 4, (1, 1), 8), 0, 6)
        got = ops.conv2d(x, w, b, padding=1, groups=8, activation="relu6")
        np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)


def test_cpu_direct_convolutions_without_an_epilogue_are_built_for_their_geometry_when_optimized():
    """Under td.fast_compile one generic direct kernel serves every geometry; an optimized build specializes it to
    its geometry with nothing to fuse too (a 3x3 depthwise convolution without a bias ran 3-5x slower generic than
    with a zero bias fused). Both match the reference."""
    rng = np.random.default_rng(4)
    x, w = rng.standard_normal((1, 8, 11, 11)).astype(np.float32), rng.standard_normal((8, 1, 3, 3)).astype(np.float32)
    want = reference(x, w, None, (2, 2), (1,) * 4, (1, 1), 8)
    g = geometry(x.shape, w.shape, stride=2, padding=1, groups=8)
    for fast in (True, False):
        td.fast_compile(fast)
        kernel = conv.plan(g, td.f32, "cpu", False, None).lowered.kernel
        scalars = {"conv_sh", "conv_sw", "conv_pt", "conv_pl"} & {name for name, _ in kernel.params}
        assert (kernel is conv_direct.plane_kernel(td.f32)) == fast and bool(scalars) == fast
        np.testing.assert_allclose(ops.conv2d(x, w, stride=2, padding=1, groups=8), want, rtol=1e-4, atol=1e-4)


@settings(max_examples=16, deadline=None)
@given(n=st.sampled_from([1, 2]), groups=st.sampled_from([1, 3, 5, 67]), cg=st.sampled_from([1, 2]),
       mult=st.sampled_from([1, 2]), hw=st.tuples(st.integers(1, 9), st.sampled_from([1, 7, 64, 67, 131])),
       k=st.sampled_from([(1, 1), (3, 3), (5, 3)]), stride=st.sampled_from([1, 2]), pad=st.integers(0, 2),
       dilation=st.sampled_from([1, 2]), layout=st.sampled_from(["NCHW", "NHWC"]), seed=st.integers(0, 2**16))
def test_cpu_direct_rows_match_reference(n, groups, cg, mult, hw, k, stride, pad, dilation, layout, seed):
    """Rows wider than a register chunk (64), prime widths, strides, dilations and padding on every side
    (the generic kernel: one compile for every example)."""
    td.set_target("cpu")
    (h, w), (kh, kw) = hw, k
    assume(h + 2 * pad >= dilation * (kh - 1) + 1 and w + 2 * pad >= dilation * (kw - 1) + 1)
    assume(groups > 1)
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((n, groups * cg, h, w)).astype(np.float32)
    wt = rng.standard_normal((groups * mult, cg, kh, kw)).astype(np.float32)
    assert conv_direct.on_rows(geometry(x.shape, wt.shape, stride, pad, dilation, groups), "cpu")
    want = reference(x, wt, None, (stride,) * 2, (pad,) * 4, (dilation,) * 2, groups)
    if layout == "NHWC":
        got = ops.conv2d(x.transpose(0, 2, 3, 1), wt, stride=stride, padding=pad, dilation=dilation, groups=groups,
                         layout=layout).transpose(0, 3, 1, 2)
    else:
        got = ops.conv2d(x, wt, stride=stride, padding=pad, dilation=dilation, groups=groups)
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("channels,width,window,stride,dilation,whole,fast", [
    (5, 13, (3, 3), (1, 1), 2, True, True),     # the whole window unrolled; 13 pixels: the last group repeats one
    (5, 13, (3, 3), (1, 1), 2, True, False),
    (37, 37, (3, 3), (2, 1), 1, True, True),
    # two pieces of channels
    (conv_direct.ROW_BUFFER // conv_direct.DEPTHWISE_PIXELS + 5, 6, (3, 3), (1, 2), 1, True, True),
    (conv_direct.ROW_BUFFER // conv_direct.DEPTHWISE_PIXELS + 5, 6, (3, 3), (1, 2), 1, True, False),
    (24, 29, (5, 3), (1, 1), 1, False, True),   # a window row at a time
    (16, 11, (7, 7), (2, 1), 1, False, True)])
def test_nhwc_depthwise_kernel_sums_groups_of_pixels(channels, width, window, stride, dilation, whole, fast):
    """`depthwise_nhwc_kernel`: DEPTHWISE_PIXELS output pixels at a time, each channel's taps in registers (the
    whole window, or of a window row over the sums of the rows before), the bias and activation fused in its
    stores; strides, dilation and padding on every side, against float64 numpy. Under `td.fast_compile` (`fast`)
    the inner pixels sum a tap at a time over their channels (`compact`); optimized, the window unrolled."""
    td.set_target("cpu")
    td.fast_compile(fast)
    rng = np.random.default_rng(channels)
    x = rng.standard_normal((2, 9, width, channels)).astype(np.float32)
    w = rng.standard_normal((channels, 1) + window).astype(np.float32)
    b = rng.standard_normal(channels).astype(np.float32)
    padding = (1, 4, 0, 3)
    g = geometry(x.shape, w.shape, stride, padding, dilation, channels, layout="NHWC")
    assert conv_direct.whole_window(g) == whole
    assert [k.name for k in conv.plan(g, td.f32, "cpu", True, "relu").kernels] == ["conv_depthwise_nhwc_f32_fused"]
    got = ops.conv2d(x, w, b, stride, padding, dilation, channels, layout="NHWC", activation="relu")
    want = reference(x.transpose(0, 3, 1, 2), w, b, stride, padding, (dilation,) * 2, channels)
    np.testing.assert_allclose(got, np.maximum(want, 0).transpose(0, 2, 3, 1), rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("window", [(3, 3), (1, 7)])
def test_nhwc_depthwise_kernel_multiplies_the_padding_by_infinite_weights(window):
    """A tap in the padding adds w * 0, as the zero padding does in numpy (and in onnxruntime): NaN for an inf or
    NaN weight, in the outputs whose window reaches the padding there (inf or finite elsewhere)."""
    td.set_target("cpu")
    rng = np.random.default_rng(7)
    x = rng.standard_normal((1, 6, 7, 16)).astype(np.float32)
    w = rng.standard_normal((16, 1) + window).astype(np.float32)
    w[3, 0, 0, 0] = np.inf
    w[5, 0, -1, -1] = np.nan
    want = reference(x.transpose(0, 3, 1, 2), w, None, (1, 1), (1, 3, 1, 3), (1, 1), 16).transpose(0, 2, 3, 1)
    assert np.isnan(want[..., 3]).any() and not np.isnan(want[..., 3]).all()
    got = ops.conv2d(x, w, padding=(1, 3, 1, 3), groups=16, layout="NHWC")
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)      # NaN where want is NaN, inf where inf


@settings(max_examples=24, deadline=None)
@given(channels=st.sampled_from([3, 16, 17, 40]), hw=st.tuples(st.integers(1, 11), st.integers(1, 23)),
       k=st.sampled_from([(1, 3), (2, 3), (3, 3), (3, 5)]), stride=st.tuples(st.integers(1, 2), st.integers(1, 3)),
       pads=st.tuples(*[st.integers(0, 2)] * 4), dilation=st.sampled_from([1, 2]), infinite=st.booleans(),
       seed=st.integers(0, 2**16))
def test_nhwc_depthwise_kernel_matches_reference_inside_and_at_the_borders(channels, hw, k, stride, pads, dilation,
                                                                           infinite, seed):
    """`depthwise_nhwc_kernel` on any geometry: groups of pixels whose windows lie inside the input (the unrolled
    window, for 3x3 and smaller) and groups at the borders (window rows, clamped reads), with a bias and ReLU
    fused; an inf weight gives NaN only where its tap meets the padding. Against float64 numpy."""
    td.set_target("cpu")
    (h, w), (kh, kw) = hw, k
    assume(h + pads[0] + pads[2] >= dilation * (kh - 1) + 1 and w + pads[1] + pads[3] >= dilation * (kw - 1) + 1)
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((1, h, w, channels)).astype(np.float32)
    wt = rng.standard_normal((channels, 1, kh, kw)).astype(np.float32)
    b = rng.standard_normal(channels).astype(np.float32)
    if infinite:
        wt[channels // 2, 0, 0, kw - 1] = np.inf
    g = geometry(x.shape, wt.shape, stride, pads, dilation, channels, layout="NHWC")
    assert [kern.name for kern in conv.plan(g, td.f32, "cpu", True, "relu").kernels] == \
        ["conv_depthwise_nhwc_f32_fused"]
    got = ops.conv2d(x, wt, b, stride, pads, dilation, channels, layout="NHWC", activation="relu")
    with np.errstate(invalid="ignore"):
        want = reference(x.transpose(0, 3, 1, 2), wt, b, stride, pads, (dilation,) * 2, channels)
    np.testing.assert_allclose(got, np.maximum(want, 0).transpose(0, 2, 3, 1), rtol=1e-4, atol=1e-4)


@settings(max_examples=16, deadline=None)
@given(n=st.sampled_from([1, 2]), channels=st.sampled_from([2, 3, 7]), mult=st.sampled_from([1, 2]),
       hw=st.tuples(st.integers(1, 13), st.integers(1, 29)), k=st.sampled_from([(1, 1), (3, 3), (5, 3)]),
       stride=st.tuples(st.integers(1, 3), st.integers(1, 3)), pads=st.tuples(*[st.integers(0, 2)] * 4),
       dilation=st.sampled_from([1, 2]), fused=st.booleans(), seed=st.integers(0, 2**16))
def test_cpu_depthwise_planes_match_reference(n, channels, mult, hw, k, stride, pads, dilation, fused, seed):
    """Depthwise convs of small inputs (`plane_kernel`, its stride_h x stride_w phase planes): strides,
    asymmetric padding, dilation, channel multipliers; generic, and fused with bias and ReLU6 (geometry
    built into the kernel)."""
    td.set_target("cpu")
    (h, w), (kh, kw) = hw, k
    assume(h + pads[0] + pads[2] >= dilation * (kh - 1) + 1 and w + pads[1] + pads[3] >= dilation * (kw - 1) + 1)
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((n, channels, h, w)).astype(np.float32)
    wt = rng.standard_normal((channels * mult, 1, kh, kw)).astype(np.float32)
    b = rng.standard_normal(channels * mult).astype(np.float32) if fused else None
    g = geometry(x.shape, wt.shape, stride, pads, dilation, channels)
    assert conv_direct.on_rows(g, "cpu") and conv_direct.uses_plane(g)
    want = reference(x, wt, b, stride, pads, (dilation,) * 2, channels)
    got = ops.conv2d(x, wt, b, stride=stride, padding=pads, dilation=dilation, groups=channels,
                     activation="relu6" if fused else None)
    np.testing.assert_allclose(got, np.clip(want, 0, 6) if fused else want, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("groups", [1, 4])
def test_f16_convolutions_with_bias_and_activation_keep_f16(groups):
    x = np.linspace(-1, 1, 4 * 6 * 5).reshape(1, 4, 6, 5).astype(np.float16)
    wt = np.linspace(-1, 1, 4 * 4 // groups * 9).reshape(4, 4 // groups, 3, 3).astype(np.float16)
    b = np.array([0.5, -0.25, 0.125, 0.0], np.float16)
    got = ops.conv2d(x, wt, b, padding=1, groups=groups, activation="relu")
    assert got.dtype == np.float16
    want = np.maximum(reference(x, wt, b, (1, 1), (1,) * 4, (1, 1), groups), 0)
    np.testing.assert_allclose(got.astype(np.float64), want, rtol=2e-2, atol=2e-2)


@pytest.mark.gpu
@pytest.mark.parametrize("layout", ["NCHW", "NHWC"])
def test_f16_tensor_core_convolutions_split_k_on_a_gpu(layout):
    """A 7x7 layer on tensor cores: one 128x64 tile, so split-k (the bias and ReLU fused into the sum of the
    partials); NHWC copies its im2col runs of 64 channels with cp.async (`gather_runs`)."""
    td.set_target("cuda")
    rng = np.random.default_rng(7)
    x = rng.standard_normal((1, 64, 7, 7)).astype(np.float16)
    w = (rng.standard_normal((64, 64, 3, 3)) / 24).astype(np.float16)
    b = rng.standard_normal(64).astype(np.float16)
    xin = x if layout == "NCHW" else x.transpose(0, 2, 3, 1).copy()
    g = geometry(xin.shape, w.shape, padding=1, layout=layout)
    low = conv.plan(g, td.f16, "cuda", True, "relu").lowered
    assert low.matmul.split > 1 and low.finish is not None
    y = ops.conv2d(td.to_device(xin), w, b, padding=1, layout=layout, activation="relu").numpy()
    got = y if layout == "NCHW" else y.transpose(0, 3, 1, 2)
    want = np.maximum(reference(x, w, b, (1, 1), (1,) * 4, (1, 1), 1), 0)
    np.testing.assert_allclose(got.astype(np.float64), want, rtol=2e-2, atol=2e-2)


@pytest.mark.parametrize("layout", ["NCHW", "NHWC"])
def test_bf16_tensor_core_convolutions_split_k(simulated_gpu, layout):
    """bf16 on the (simulated) GPU's tensor cores, mma.sync of bf16 into f32: a layer of two tiles splits K, the f32
    partials summed with the bias and ReLU fused in and rounded to bf16 once (a last bit from the float64 sum's)."""
    rng = np.random.default_rng(3)
    x = rng.standard_normal((1, 64, 5, 5)).astype(ml_dtypes.bfloat16)
    w = (rng.standard_normal((16, 64, 3, 3)) / 24).astype(ml_dtypes.bfloat16)
    b = rng.standard_normal(16).astype(ml_dtypes.bfloat16)
    xin = x if layout == "NCHW" else x.transpose(0, 2, 3, 1).copy()
    low = conv.plan(geometry(xin.shape, w.shape, padding=1, layout=layout), td.bf16, "cuda", True, "relu").lowered
    assert low.kernel.name.startswith("tc_matmul") and low.matmul.split > 1 and low.finish is not None
    y = ops.conv2d(td.to_device(xin), w, b, padding=1, layout=layout, activation="relu").numpy()
    assert y.dtype == ml_dtypes.bfloat16
    got = y if layout == "NCHW" else y.transpose(0, 3, 1, 2)
    want = np.maximum(reference(x, w, b, (1, 1), (1,) * 4, (1, 1), 1), 0).astype(ml_dtypes.bfloat16)
    np.testing.assert_allclose(got.astype(np.float64), want.astype(np.float64), rtol=2**-7, atol=2**-7)
    assert [k.name for k, _ in simulated_gpu.launches][-2:] == [low.kernel.name, low.finish.name]


def test_conv2d_errors_are_clear():
    x = np.zeros((1, 4, 5, 5), np.float32)
    with pytest.raises(ValueError, match="weight of shape"):
        ops.conv2d(x, np.zeros((8, 3, 3, 3), np.float32))
    with pytest.raises(ValueError, match="larger than the padded input"):
        ops.conv2d(x, np.zeros((8, 4, 7, 7), np.float32))
    with pytest.raises(ValueError, match="layout"):
        ops.conv2d(x, np.zeros((8, 4, 3, 3), np.float32), layout="CHWN")
    with pytest.raises(ValueError, match="activation"):
        ops.conv2d(x, np.zeros((8, 4, 3, 3), np.float32), activation="swish")
    with pytest.raises(ValueError, match="padding"):
        ops.conv2d(x, np.zeros((8, 4, 3, 3), np.float32), padding=-1)
    for name, value in (("stride", 1.0), ("padding", 1.0), ("dilation", None), ("groups", 2.0)):   # raw TypeErrors
        with pytest.raises(TypeError, match=f"conv2d: {name} must be integers"):
            ops.conv2d(x, np.zeros((8, 4, 3, 3), np.float32), **{name: value})
    with pytest.raises(TypeError, match="conv2d supports float32, float16, .* and uint8 operands, got int32"):
        ops.conv2d(x.astype(np.int32), np.zeros((8, 4, 3, 3), np.float32))
