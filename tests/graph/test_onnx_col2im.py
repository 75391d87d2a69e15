"""ONNX Col2Im against its definition summed block by block in numpy and against onnx's reference evaluator
(onnxruntime 1.32 is not an oracle here: with a dilation and padding, or 3 spatial axes and a dilation, its sums
differ from the definition, which onnx's reference follows): hypothesis-drawn images (1-3 spatial axes, sizes 1 to primes), blocks, strides, dilations and pads, blocks that
overlap, that leave pixels uncovered and that run into the padding; the refusals. Every kernel the tests launch is also compiled for CUDA by NVRTC (tests/conftest.py)."""
import itertools
import math

import numpy as np
import pytest
from hypothesis import given, note, settings
from hypothesis import strategies as st
from onnx import helper
from onnx.reference import ReferenceEvaluator

import taskdsl.graph as tg
from taskdsl.graph.onnx_import import OnnxImportError

from . import assert_close, make_model, rand


def col2im_model(shape: list, image: list, block: list, **attrs):
    """A Col2Im model (opset 18) of an input of `shape`, image_shape and block_shape initializers."""
    node = helper.make_node("Col2Im", ["x", "image", "block"], ["y"], **attrs)
    out = [shape[0], shape[1] // math.prod(block)] + list(image)
    return make_model([node], [("x", shape)], [("y", out)],
                      {"image": np.array(image, np.int64), "block": np.array(block, np.int64)}, opset=18)


def blocks_per_axis(image, block, strides, dilations, pads) -> list:
    rank = len(image)
    return [(n + b + e - d * (k - 1) - 1) // s + 1
            for n, k, s, d, b, e in zip(image, block, strides, dilations, pads[:rank], pads[rank:])]


def col2im_definition(x: np.ndarray, image, block, strides, dilations, pads) -> np.ndarray:
    """Each block's values added at its pixels (offset k of block l at l * stride - pad + k * dilation), one by
    one."""
    rank, size = len(image), math.prod(block)
    y = np.zeros((x.shape[0], x.shape[1] // size) + tuple(image), x.dtype)
    counts = blocks_per_axis(image, block, strides, dilations, pads)
    for k, offset in enumerate(itertools.product(*(range(b) for b in block))):
        for l, at in enumerate(itertools.product(*(range(c) for c in counts))):
            pixel = [a * s - p + o * d for a, s, p, o, d in zip(at, strides, pads, offset, dilations)]
            if all(0 <= q < n for q, n in zip(pixel, image)):
                y[(slice(None), slice(None)) + tuple(pixel)] += x[:, k::size, l]
    return y


@settings(max_examples=16, deadline=None)
@given(data=st.data(), rank=st.sampled_from([1, 2, 2, 3]), batch=st.sampled_from([1, 2]),
       channels=st.sampled_from([1, 3]), seed=st.integers(0, 99))
def test_col2im_matches_its_definition(data, rank, batch, channels, seed):
    """Overlapping blocks sum, pixels no block covers are 0, and the padding's share of a block is dropped."""
    image = data.draw(st.lists(st.sampled_from([1, 2, 5, 7]), min_size=rank, max_size=rank), label="image")
    block = [data.draw(st.integers(1, min(n, 3)), label="block") for n in image]
    strides = data.draw(st.lists(st.integers(1, 3), min_size=rank, max_size=rank), label="strides")
    dilations = data.draw(st.lists(st.integers(1, 2), min_size=rank, max_size=rank), label="dilations")
    pads = data.draw(st.lists(st.integers(0, 2), min_size=2 * rank, max_size=2 * rank), label="pads")
    counts = blocks_per_axis(image, block, strides, dilations, pads)
    if min(counts) < 1:         # the dilated block is longer than the padded image
        dilations = [1] * rank
        counts = blocks_per_axis(image, block, strides, dilations, pads)
    shape = [batch, channels * math.prod(block), math.prod(counts)]
    note(f"input {shape}")
    model = col2im_model(shape, image, block, strides=strides, dilations=dilations, pads=pads)
    feeds = {"x": rand(shape, seed)}
    got = tg.from_onnx(model).compile()(feeds)[0]
    assert_close(got, col2im_definition(feeds["x"], image, block, strides, dilations, pads), rtol=1e-5, atol=1e-6)
    assert_close(got, ReferenceEvaluator(model).run(None, feeds)[0], rtol=1e-5, atol=1e-6)


def test_col2im_refusals():
    """Blocks that do not fit the input's shape, and attributes of the wrong length or sign, are clear errors."""
    with pytest.raises(OnnxImportError, match=r"input \(1, 4, 5\) does not hold the blocks of image_shape \[3, 3\]: it "
                                              r"must be \(N, C \* 4, 4\)"):
        tg.from_onnx(col2im_model([1, 4, 5], [3, 3], [2, 2]))
    with pytest.raises(OnnxImportError, match=r"need one value per spatial axis"):
        tg.from_onnx(col2im_model([1, 4, 4], [3, 3], [2, 2], strides=[1]))
    with pytest.raises(OnnxImportError, match=r"pads \[0, 0, -1, 0\] non-negative"):
        tg.from_onnx(col2im_model([1, 4, 4], [3, 3], [2, 2], pads=[0, 0, -1, 0]))
