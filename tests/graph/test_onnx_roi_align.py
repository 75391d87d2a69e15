"""ONNX RoiAlign against onnxruntime: hypothesis-drawn images (sizes 1 to primes), regions (inside, partly and wholly
outside the image, empty and reversed ones), batch indices, output sizes, sampling ratios (0, adaptive, with the
regions constant), modes avg and max, both coordinate transformations and spatial scales; the refusals. Every
kernel the tests launch is also compiled for CUDA by NVRTC (tests/conftest.py)."""
import numpy as np
import pytest
from hypothesis import given, note, settings
from hypothesis import strategies as st
from onnx import TensorProto, helper

import taskdsl.graph as tg
from taskdsl.graph.onnx_import import ConstantRequiredError, OnnxImportError, UnsupportedOnnxError

from . import assert_close, make_model, rand, run_onnxruntime

pytest.importorskip("onnxruntime")


def roi_align_model(x: list, regions: int, bins: tuple, inits: dict | None = None, **attrs):
    """A RoiAlign model (opset 16) of X, rois and batch_indices (graph inputs unless `inits` holds them)."""
    inputs = [("X", x), ("rois", [regions, 4]), ("batch_indices", [regions], TensorProto.INT64)]
    node = helper.make_node("RoiAlign", ["X", "rois", "batch_indices"], ["Y"], output_height=bins[0],
                            output_width=bins[1], **attrs)
    return make_model([node], [i for i in inputs if i[0] not in (inits or {})], [("Y", [regions, x[1], *bins])],
                      inits, opset=16)


@settings(max_examples=8, deadline=None)
@given(batch=st.sampled_from([1, 2]), channels=st.sampled_from([1, 3]), image=st.lists(st.sampled_from([1, 3, 7, 10]),
       min_size=2, max_size=2), regions=st.sampled_from([1, 2, 5]), bins=st.tuples(st.integers(1, 4), st.integers(1, 3)),
       ratio=st.sampled_from([0, 1, 2]), mode=st.sampled_from(["avg", "max"]),
       transform=st.sampled_from(["half_pixel", "output_half_pixel"]), scale=st.sampled_from([1.0, 0.5]),
       seed=st.integers(0, 99))
def test_roi_align_matches_onnxruntime(batch, channels, image, regions, bins, ratio, mode, transform, scale, seed):
    """Regions anywhere, some past the image's edges or empty; sampling_ratio 0 takes the regions as constants (in
    order, each bin at most 2 x 2 samples: onnxruntime overflows on a reversed one, and each number of samples a
    bin is a kernel of its own, its taps compiled in one expression)."""
    rng = np.random.default_rng(seed)
    h, w = image
    corners = rng.uniform(-3, max(h, w) / scale + 3, (regions, 2, 2))       # (x, y) pairs
    if ratio:
        corners[::2] = np.sort(corners[::2], axis=1)                          # some in order, others reversed
    else:
        corners[:, 1] = corners[:, 0] + rng.uniform(0, 2, (regions, 2)) * np.array(bins[::-1]) / scale
    rois = corners.reshape(regions, 4).astype(np.float32)
    feeds = {"X": rand([batch, channels, h, w], seed), "rois": rois,
             "batch_indices": rng.integers(0, batch, regions).astype(np.int64)}
    note(f"rois = {rois!r}, batch_indices = {feeds['batch_indices']!r}")
    attrs = dict(sampling_ratio=ratio, mode=mode, coordinate_transformation_mode=transform, spatial_scale=scale)
    model = roi_align_model([batch, channels, h, w], regions, bins, **attrs)
    graph = tg.from_onnx(model, constants={"rois": rois} if ratio == 0 else None)
    got = graph.compile()({t.name: feeds[t.name] for t in graph.inputs})[0]
    assert_close(got, run_onnxruntime(model, feeds)[0], rtol=1e-5, atol=1e-5)


def test_regions_of_a_replayed_graph_match_onnxruntime():
    """The batch indices may not be negative, so the replay's first probe (signed integers in {-1, 0}) is an
    IndexError: the second, its integers at 0, turns replay on (it was off, and the graph's call 6x onnxruntime's
    time); replayed calls on new regions and batch indices still match onnxruntime, and a negative index is still
    an IndexError."""
    model = roi_align_model([2, 3, 9, 8], 4, (2, 3), sampling_ratio=2)
    compiled = tg.from_onnx(model).compile("cpu")
    assert compiled.replay.startswith("on ("), compiled.replay
    rng = np.random.default_rng(5)
    for seed in (1, 2):
        feeds = {"X": rand([2, 3, 9, 8], seed), "rois": rng.uniform(-2, 10, (4, 4)).astype(np.float32),
                 "batch_indices": np.array([1, 0, 1, 1], np.int64) if seed == 1 else np.zeros(4, np.int64)}
        assert_close(compiled(feeds)[0], run_onnxruntime(model, feeds)[0], rtol=1e-5, atol=1e-5)
    with pytest.raises(IndexError, match="out of range"):
        compiled(dict(feeds, batch_indices=np.array([0, -1, 0, 0], np.int64)))


def test_roi_align_refusals():
    """Adaptive sampling of regions known only at run time, too many samples a bin, and shapes that do not fit,
    are clear errors; a negative batch index is an IndexError at run time."""
    model = roi_align_model([1, 2, 8, 8], 3, (2, 2))
    with pytest.raises(ConstantRequiredError, match="rois"):
        tg.from_onnx(model)
    big = np.array([[0, 0, 80, 80]], np.float32)
    with pytest.raises(UnsupportedOnnxError, match="a bin takes 40 x 40 samples, more than the 64 supported"):
        tg.from_onnx(roi_align_model([1, 2, 8, 8], 1, (2, 2), {"rois": big}))
    node = helper.make_node("RoiAlign", ["X", "rois", "b"], ["Y"], sampling_ratio=2)
    bad = make_model([node], [("X", [1, 2, 8, 8]), ("rois", [3, 5]), ("b", [3], TensorProto.INT64)],
                     [("Y", [3, 2, 1, 1])], opset=16)
    with pytest.raises(OnnxImportError, match=r"rois \(3, 5\) and batch_indices \(3,\) do not match"):
        tg.from_onnx(bad)
    compiled = tg.from_onnx(roi_align_model([1, 2, 8, 8], 1, (2, 2), sampling_ratio=2)).compile()
    with pytest.raises(IndexError):
        compiled({"X": rand([1, 2, 8, 8], 1), "rois": np.array([[0, 0, 4, 4]], np.float32),
                  "batch_indices": np.array([-1], np.int64)})
