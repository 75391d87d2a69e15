"""Kernels that differ only in constants run one generated module (`runtime/sharing.py`): launched on their own,
a kernel joins the ones of its form launched before it. Oracles: numpy (the kernels' stores written out, a
convolution by sums of shifted products)."""
import numpy as np
import pytest

import stdlib_ops as ops
import taskdsl as td
from taskdsl import ir
from taskdsl.ir import types as T
from taskdsl.runtime import config


def _scaled(n: int, m: int) -> td.Kernel:
    """out[i] = i * m + 3 for i < n (A, of n elements, unread), built from IR as fusion builds its kernels."""
    a, out = ir.Buffer("A", T.i32, (ir.const(n),)), ir.Buffer("out", T.i32, (ir.const(n),))
    i = ir.Var("i", T.i32, kind="loop")
    body = ir.For(i, ir.const(0), ir.const(n), ir.const(1), ir.Store(out, (i,), i * ir.const(m) + ir.const(3)))
    kernel = td.Kernel.from_ir(ir.Function("scaled", (a, out), (), body, (1, 1, 1)), (1, 1, 1))
    kernel.shareable = True
    return kernel


def _modules(kernels) -> set:
    return {path for k in kernels for _, _, path in k._cpu.values()}


def test_a_kernel_launched_alone_shares_the_module_of_its_form():
    """The first kernel of a form runs its own code; the second and later ones their group's, one module; each
    computes its own constants."""
    td.set_target("cpu")
    kernels = [_scaled(n, m) for n, m in ((5, 2), (7, 2), (3, 4), (5, 2))]
    for kernel, (n, m) in zip(kernels, ((5, 2), (7, 2), (3, 4), (5, 2))):
        out = np.zeros(n, np.int32)
        kernel(np.zeros(n, np.int32), out)
        np.testing.assert_array_equal(out, np.arange(n) * m + 3)
        assert kernel.share_checked
    first, *later = kernels
    assert not first._fixed_sizes and all(k._fixed_sizes for k in later)
    assert len(_modules(later[1:])) == 1 and _modules([first]).isdisjoint(_modules(later))
    scaled = _scaled(9, 2)
    scaled.shareable = False        # (td.fuse with constants=): its own code
    scaled(np.zeros(9, np.int32), np.zeros(9, np.int32))
    assert not scaled._fixed_sizes and _modules([scaled]).isdisjoint(_modules(kernels))


@pytest.fixture
def sharing_off(monkeypatch):
    """TASKDSL_SHARE_CODE=0 for the test (the variable is read once per process: read again before and after)."""
    monkeypatch.setenv("TASKDSL_SHARE_CODE", "0")
    config.environment.cache_clear()
    yield
    monkeypatch.undo()
    config.environment.cache_clear()


def test_share_code_0_gives_each_kernel_its_own_code(sharing_off):
    td.set_target("cpu")
    kernels = [_scaled(n, 5) for n in (4, 6, 8)]
    for kernel, n in zip(kernels, (4, 6, 8)):
        out = np.zeros(n, np.int32)
        kernel(np.zeros(n, np.int32), out)
        np.testing.assert_array_equal(out, np.arange(n) * 5 + 3)
    assert all(k.share_checked and not k._fixed_sizes for k in kernels) and len(_modules(kernels)) == 3


def _conv_bias_relu(x, w, b):
    """3x3 convolution with padding 1, bias and ReLU, in f64."""
    h, width = x.shape[2:]
    padded = np.pad(x.astype(np.float64), ((0, 0), (0, 0), (1, 1), (1, 1)))
    out = sum(np.einsum("nchw,oc->nohw", padded[:, :, kh:kh + h, kw:kw + width], w[:, :, kh, kw])
              for kh in range(3) for kw in range(3))
    return np.maximum(out + b[None, :, None, None], 0)


def test_eager_convolutions_at_new_sizes_reuse_one_module():
    """A notebook's convolution at four image sizes of one form: the second size compiles the shared kernel, the
    others run it; every size computes its own convolution."""
    td.set_target("cpu")
    rng = np.random.default_rng(0)
    w, b = rng.standard_normal((64, 16, 3, 3)).astype(np.float32), rng.standard_normal(64).astype(np.float32)
    tiles = []
    for size in (34, 39, 44, 51):
        x = rng.standard_normal((1, 16, size, size)).astype(np.float32)
        np.testing.assert_allclose(ops.conv2d(x, w, b, padding=1, activation="relu"), _conv_bias_relu(x, w, b),
                                   rtol=1e-4, atol=1e-3)
        g = ops.conv_geometry.geometry(x.shape, w.shape, 1, 1, 1, 1, "NCHW")
        tiles += [k for k in ops.conv.plan(g, td.f32, "cpu", True, "relu").kernels if k.name.startswith("tile")]
    assert len(tiles) == 4 and len(_modules(tiles[1:])) == 1
