"""The cpu's interleaving transposes (`applies`): x (B, S1, S2, H, W) into y (B, H, S1, W, S2), S2 small.

Each row of y, (b, h, s1), interleaves S2 rows of x, x[b, s1, :, h, :]: its element (w, s2) is x[b, s1, s2, h, w].
A block writes one row, reading its S2 source rows along w, with the loop over s2 of constant length, which LLVM
unrolls into one pass over the S2 rows at once. DepthToSpace's transpose is one (in both modes, once its neighbour
axes merge), and so is the interleave of a ConvTranspose's phases (`graph/onnx_import/resize.py`, `_by_phases`):
(1, 2, 2, 1792, 28), a 2x2 ConvTranspose of stride 2 with 64 channels at 28x28, took 0.245 ms as the definitions'
transpose (each output row gathered element by element from strided reads) and 0.052 ms here; (1, 2, 2, 3584, 56)
0.889 and 0.077 ms (docs/benchmarks.md, session 114).
"""
# ruff: noqa: F821 - the kernel's body uses its size symbols SB, SS, SH, SW as names
# No `from __future__ import annotations`: the kernel's annotations use closure dtypes and sizes.
import functools

import numpy as np

import taskdsl as td
from taskdsl import blockIdx

from .elementwise import tdtype

MAX_S2 = 8      # the longest interleave a kernel unrolls (a kernel per length)
PERMS = ((0, 3, 1, 4, 2), (2, 0, 3, 1))     # the canonical permutations: B > 1, B = 1


@functools.cache
def interleave_kernel(dtype, s2: int) -> td.Kernel:
    """y (B, H, S1, W, s2) = x (B, S1, s2, H, W) transposed: a block per row of y."""
    @td.kernel(grid=lambda SB, SS, SH, SW: SB * SS * SH, block=1, name=f"interleave_{s2}")
    def interleave(X: dtype["SB", "SS", s2, "SH", "SW"], Y: dtype["SB", "SH", "SS", "SW", s2]):
        b = blockIdx.x // (SS * SH)
        s1 = blockIdx.x // SH % SS
        h = blockIdx.x % SH
        for w in range(SW):
            for t in range(s2):
                Y[b, h, s1, w, t] = X[b, s1, t, h, w]

    return interleave


def applies(canon_shape: tuple, canon_perm: tuple) -> bool:
    """Whether a canonical transpose (`stdlib_ops.transform.transpose_canon`) interleaves rows: (B, S1, S2, H, W)
    into (B, H, S1, W, S2), B dropped where it is 1, with S2 at most MAX_S2."""
    return canon_perm in PERMS and canon_shape[-3] <= MAX_S2


def transpose(x: np.ndarray, canon_shape: tuple, y: np.ndarray) -> td.Kernel:
    """Write x, a contiguous cpu array whose canonical transpose `applies` (its shape `canon_shape`), transposed
    into y; returns the kernel launched."""
    b, s1, s2, h, w = (1,) * (5 - len(canon_shape)) + tuple(canon_shape)
    kernel = interleave_kernel(tdtype(x.dtype), s2)
    kernel(x.reshape(b, s1, s2, h, w), y.reshape(b, h, s1, w, s2))
    return kernel
