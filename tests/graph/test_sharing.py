"""A cpu graph's fused kernels that differ only in their shapes' constants run one generated module
(`runtime.sharing`). Oracle: the graph's numpy reference (its operators' compute definitions)."""
import re

import numpy as np
from hypothesis import given, settings, strategies as st

import taskdsl as td
import taskdsl.graph as tg
from taskdsl.graph import ops

RNG = np.random.default_rng(0)


def _pointwise_convs(shape: tuple, widths: tuple) -> tg.Graph:
    """1x1 convolutions with a bias and a ReLU, one per width, one after the other."""
    x = tg.input("x", shape)
    y, channels = x, shape[1]
    for width in widths:
        weight = tg.constant((RNG.standard_normal((width, channels, 1, 1)) / channels ** 0.5).astype(np.float32))
        bias = tg.constant(RNG.standard_normal(width).astype(np.float32))
        y, channels = ops.relu(ops.conv2d(y, weight, bias)), width
    return tg.Graph([x], [y], name="pointwise")


def _check(graph: tg.Graph):
    td.set_target("cpu")
    cg = graph.compile()
    data = RNG.standard_normal(graph.inputs[0].shape).astype(np.float32)
    np.testing.assert_allclose(cg(data)[0], graph.reference(data)[0], rtol=1e-4, atol=1e-4)
    return cg


def _modules(kernels: list) -> set:
    """The generated modules `kernels` ran from."""
    return {path for kernel in kernels for _, _, path in kernel._cpu.values()}


def test_convolutions_of_other_shapes_share_one_module():
    """1x1 convolutions over 32x32 pixels, 8 -> 64 -> 128 -> 192 -> 64 channels. The inner two fuse into tile
    matmuls that differ only in K and N (the first reads the NCHW input, the last writes it): one module runs
    both, and each computes its own shape."""
    cg = _check(_pointwise_convs((1, 8, 32, 32), (64, 128, 192, 64)))
    inner = [k for k in cg.kernels if k.name.startswith("tile_matmul")][1:3]
    assert inner[0] is not inner[1] and inner[0].name == inner[1].name
    assert cg.shared_kernels == 2 and len(_modules(inner)) == 1
    outlined = {o.text for k in cg.kernels for _, src, _ in k._cpu.values() for o in src.outlined}
    assert outlined and cg.cpu_modules == len({id(k) for k in cg.kernels}) - 1 + len(outlined)


def test_share_code_0_compiles_each_convolution_apart(monkeypatch):
    from taskdsl.runtime import config
    monkeypatch.setenv("TASKDSL_SHARE_CODE", "0")
    config.environment.cache_clear()
    try:
        cg = _check(_pointwise_convs((1, 8, 32, 32), (64, 128, 192, 64)))
    finally:
        monkeypatch.undo()
        config.environment.cache_clear()
    inner = [k for k in cg.kernels if k.name.startswith("tile_matmul")][1:3]
    assert cg.shared_kernels == 0 and len(_modules(inner)) == 2


@settings(max_examples=6, deadline=None)
@given(st.integers(1, 47), st.integers(1, 23), st.lists(st.sampled_from([64, 128, 192]), min_size=3, max_size=4))
def test_shared_convolutions_compute_their_own_shapes(height, width, widths):
    """Odd, prime and one-pixel sizes, three or four widths: the shared kernels agree with the reference."""
    _check(_pointwise_convs((1, 5, height, width), tuple(widths)))


def test_a_batchs_shared_convolutions_store_by_their_flat_pixel_index():
    """Two images at each of two sizes, 1x1 convolutions 8 -> 64 -> 128 -> 16 on each: each layer's convolutions
    share one module over the sizes. The second reads the first's NHWC output in place, as a (2*H*W) x 64 matrix,
    and stores its own NHWC output at pixel p's flat index, not through (p // (H*W), p // W % H, p % W), which a
    symbol of its own for H*W kept as three divisions an element (MobileNet-V2 at batch 8 took 3.7x as long).
    (The first reads the NCHW input an image at a time; the last, transposed to the NCHW output, needs them.)"""
    inputs = [tg.input(f"x{k}", (2, 8, side, side)) for k, side in enumerate((12, 20))]
    outputs = []
    for x in inputs:
        y, channels = x, 8
        for width in (64, 128, 16):
            weight = tg.constant((RNG.standard_normal((width, channels, 1, 1)) / channels ** 0.5).astype(np.float32))
            y, channels = ops.relu(ops.conv2d(y, weight)), width
        outputs.append(y)
    graph = tg.Graph(inputs, outputs, name="two_sizes")
    td.set_target("cpu")
    cg = graph.compile()
    data = [RNG.standard_normal(x.shape).astype(np.float32) for x in inputs]
    for got, want in zip(cg(*data), graph.reference(*data)):
        np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)
    second = [k for k in cg.kernels if k.name.startswith("tile_matmul") and "indirect" not in k.name
              and k.params[-1][0] == "relu_out"]
    assert len(second) == 2 and all(k._fixed_sizes for k in second) and len(_modules(second)) == 1
    source = open(next(iter(_modules(second)))).read()
    assert "relu_out[" in source and not re.findall(r"(//|%) \(?lifted_", source)     # no division by a size
