"""The cpu's transposes that swap the last two axes (`transpose`), in 8 x 8 tiles.

A transpose as an injective definition writes each output row from a column of the input: a strided read per
element, which LLVM leaves scalar (a (1024, 1024) transpose took 2.3 ms, 3.8x onnxruntime's time; NCHW to NHWC of
(1, 64, 112, 112) 2.5x). Here a block takes a square of SQUARE x SQUARE elements of one matrix of x (B, R, C) and
copies it an 8 x 8 tile at a time, both loops of a tile of constant length, which LLVM unrolls and turns into
register shuffles; the square's 64 rows stay in the L1 cache while its columns are written. Tiles at the
matrices' edges are copied element by element. Canonical transposes (stdlib_ops.transform.transpose_canon) of
this form are most of them: NCHW to NHWC is (N, C, HW) to (N, HW, C), a matrix's transpose (1, R, C).
"""
# ruff: noqa: F821 - the kernel's body uses its size symbols SB, SR, SC as names
# No `from __future__ import annotations`: the kernel's annotations use closure dtypes.
import functools

import numpy as np

import taskdsl as td
from taskdsl import blockIdx

from .elementwise import tdtype

TILE = 8        # a tile's rows and columns: the constant loops LLVM turns into shuffles
SQUARE = 64     # a block's square: 64 rows and 64 columns of a matrix, 8 x 8 tiles


@functools.cache
def swap_kernel(dtype) -> td.Kernel:
    """y (B, C, R) = x (B, R, C) with its last two axes swapped: a block per square of one matrix."""
    @td.kernel(grid=lambda SB, SR, SC: SB * td.cdiv(SR, SQUARE) * td.cdiv(SC, SQUARE), block=1,
               name="swap_last_axes")
    def swap(X: dtype["SB", "SR", "SC"], Y: dtype["SB", "SC", "SR"]):
        across = td.cdiv(SC, SQUARE)
        squares = td.cdiv(SR, SQUARE) * across
        b = blockIdx.x // squares
        r_lo = blockIdx.x % squares // across * SQUARE
        c_lo = blockIdx.x % across * SQUARE
        for r0 in range(r_lo, min(r_lo + SQUARE, SR), TILE):
            for c0 in range(c_lo, min(c_lo + SQUARE, SC), TILE):
                if r0 + TILE <= SR and c0 + TILE <= SC:
                    for j in range(TILE):
                        for i in range(TILE):
                            Y[b, c0 + j, r0 + i] = X[b, r0 + i, c0 + j]
                else:
                    for j in range(c0, min(c0 + TILE, SC)):
                        for i in range(r0, min(r0 + TILE, SR)):
                            Y[b, j, i] = X[b, i, j]

    return swap


def applies(canon_shape: tuple, canon_perm: tuple) -> bool:
    """Whether a canonical transpose swaps its last two axes, each at least a tile long (shorter, every tile would
    be an edge tile: the definitions' kernels do as well)."""
    return (canon_perm in ((1, 0), (0, 2, 1)) and canon_shape[-1] >= TILE and canon_shape[-2] >= TILE)


def transpose(x: np.ndarray, canon_shape: tuple, y: np.ndarray) -> td.Kernel:
    """Write x, a contiguous cpu array whose canonical transpose `applies` (its shape `canon_shape`: (R, C) or
    (B, R, C)), with those last two axes swapped into y; returns the kernel launched."""
    rows, columns = canon_shape[-2:]
    matrices = canon_shape[0] if len(canon_shape) == 3 else 1
    kernel = swap_kernel(tdtype(x.dtype))
    kernel(x.reshape(matrices, rows, columns), y.reshape(matrices, columns, rows))
    return kernel
