"""The cpu's sampling of images at computed positions (`applies`): GridSample's and DeformConv's, 1-3 spatial axes.

The graph's GridSample operator is definitions (graph/ops/sample.py): each output element finds its point's corners
and their weights again, for every channel. Here a block takes a chunk of CHUNK points of one image: it finds their
taps along each axis (indices made valid by the padding, weights, and for zeros padding which taps are inside), and
from them each corner's offset in the flattened image, weight and (zeros padding) whether it is inside, once, in
registers; then it sweeps the channels, each a loop over the chunk with contiguous stores. The corners are weighted
and summed in the definitions' order. (1, 16, 64, 64) sampled bilinearly at 64x64 points took 0.16-0.23 ms by the
definitions (a graph of the sampling alone), 0.3-0.4 ms by the composition of gathers that came before them, and
0.09-0.16 ms here, against onnxruntime's 0.13-0.21; bicubically 2.4 ms by the definitions, 0.29-0.48 here
(docs/benchmarks.md, session 115).
"""
# ruff: noqa: F821 - the kernel's body uses its size symbols SN, SC, SX, SP as names
# No `from __future__ import annotations`: the kernel's annotations use closure dtypes.
import functools

import numpy as np

import taskdsl as td
from taskdsl import blockIdx

from .elementwise import tdtype

CHUNK = 64      # the points a block samples: their taps and weights stay in registers across the channels
# mode -> the offsets of its taps from the base index along an axis (the graph's GridSample operator's too)
TAPS = {"linear": (0, 1), "nearest": (0,), "cubic": (-1, 0, 1, 2)}
CUBIC_A = -0.75     # Keys' coefficient, as onnxruntime and PyTorch fix it


@functools.cache
def sample_kernel(dtype, rank: int, mode: str, padding: str, align_corners: bool) -> td.Kernel:
    """The kernel sampling X (N, C, pixels) of `dtype`, images of `rank` spatial axes (width, height, depth: the
    sizes of the last, the one before, and the one before that, 1 where the image lacks it) flattened, at f32 pixel
    coordinates U (N, points, rank), the last axis's first, into Y (N, C, points): of f32, or of `dtype` for mode
    nearest."""
    f32, i64 = td.f32, td.i64
    taps = TAPS[mode]
    k = len(taps)
    corners = k ** rank
    place = tuple(k ** a for a in range(rank))      # axis a's digit of corner t is t // place[a] % k
    later_axes = tuple(range(1, rank))      # (a compile-time tuple: loops over it unroll)
    out_dtype = dtype if mode == "nearest" else f32

    @td.func
    def padded(i, n):
        """Tap index i along an axis of n pixels made valid by the padding (zeros: clamped, as border)."""
        if padding == "reflection":
            period = td.max(2 * (n - 1), 1) if align_corners else 2 * n
            m = i % period
            return m if m < n else period - (0 if align_corners else 1) - m
        return td.min(td.max(i, 0), n - 1)

    @td.func
    def weight(t, offset: int):
        """The weight of the tap `offset` from the base of a coordinate whose fraction is t (Keys' kernel for cubic,
        onnxruntime's formulas)."""
        d = td.abs(t - offset)
        if mode == "linear":
            return 1.0 - d
        if offset == 0 or offset == 1:
            return ((d * (CUBIC_A + 2) - (CUBIC_A + 3)) * d) * d + 1.0
        return (((d * CUBIC_A - 5 * CUBIC_A) * d) + 8 * CUBIC_A) * d - 4 * CUBIC_A

    @td.func
    def axis_taps(u, n, index, weights, inside, a: int, q):
        """Point q's taps along axis a (of n pixels) at coordinate u: their valid indices, weights and (zeros
        padding) whether they are inside."""
        base = td.rint(u) if mode == "nearest" else td.floor(u)
        first = td.cast(base, i64)          # NaN: 0 (its weights are NaN)
        for j, offset in enumerate(taps):
            index[a, j, q] = padded(first + offset, n)
            if mode != "nearest":
                weights[a, j, q] = weight(u - base, offset)
            if padding == "zeros":
                inside[a, j, q] = 0 <= first + offset < n

    @td.func
    def corner_offset(index, t, q, width, height):
        """Corner t's pixel in the flattened image (its tap along axis a: digit a of t in base k)."""
        offset = td.cast(index[0, t % k, q], i64)
        if rank > 1:
            offset += td.cast(index[1, t // place[1] % k, q], i64) * width
        if rank > 2:
            offset += td.cast(index[2, t // place[2] % k, q], i64) * width * height
        return offset

    @td.func
    def corner(X, n, c, offsets, inside, t, q):
        """The value at corner t of point q: 0 where zeros padding finds it outside."""
        value = X[n, c, offsets[t, q]]
        if padding == "zeros":
            return value if inside[t, q] else td.cast(0, dtype)
        return value

    name = f"{mode}_{rank}d_{padding}" + ("_align" if align_corners else "")

    @td.kernel(grid=lambda SN, SP: SN * td.cdiv(SP, CHUNK), block=1, name=name)
    def sample(X: dtype["SN", "SC", "SX"], U: f32["SN", "SP", rank], Y: out_dtype["SN", "SC", "SP"], width: i64,
               height: i64, depth: i64):
        chunks = td.cdiv(SP, CHUNK)
        n = blockIdx.x // chunks
        p0 = blockIdx.x % chunks * CHUNK
        count = td.min(CHUNK, SP - p0)
        index = td.registers(td.i32, (rank, k, CHUNK))
        weights = td.registers(f32, (rank, k, CHUNK))
        inside = td.registers(td.boolean, (rank, k, CHUNK))
        offsets = td.registers(i64, (corners, CHUNK))
        corner_weights = td.registers(f32, (corners, CHUNK))
        corner_inside = td.registers(td.boolean, (corners, CHUNK))
        for q in range(count):
            axis_taps(U[n, p0 + q, 0], width, index, weights, inside, 0, q)
            if rank > 1:
                axis_taps(U[n, p0 + q, 1], height, index, weights, inside, 1, q)
            if rank > 2:
                axis_taps(U[n, p0 + q, 2], depth, index, weights, inside, 2, q)
            for t in range(corners):
                offsets[t, q] = corner_offset(index, t, q, width, height)
                if mode != "nearest":       # the definitions' order: the weights' product from the last axis's
                    w = weights[0, t % k, q]
                    for a in later_axes:
                        w *= weights[a, t // place[a] % k, q]
                    corner_weights[t, q] = w
                if padding == "zeros":
                    ok = inside[0, t % k, q]
                    for a in later_axes:
                        ok = ok and inside[a, t // place[a] % k, q]
                    corner_inside[t, q] = ok
        for c in range(SC):
            for q in range(count):
                if mode == "nearest":
                    Y[n, c, p0 + q] = corner(X, n, c, offsets, corner_inside, 0, q)
                else:       # summed in the definitions' order
                    total = corner_weights[0, q] * td.cast(corner(X, n, c, offsets, corner_inside, 0, q), f32)
                    for t in range(1, corners):
                        total += corner_weights[t, q] * td.cast(corner(X, n, c, offsets, corner_inside, t, q), f32)
                    Y[n, c, p0 + q] = total

    return sample


def applies(x_dtype, rank: int, mode: str, coordinates_dtype) -> bool:
    """Whether the kernel samples so: 1 to 3 spatial axes, f32 coordinates, and for linear and cubic sampling a
    float x of 32 bits or fewer (nearest: any x)."""
    return (1 <= rank <= 3 and np.dtype(coordinates_dtype) == np.float32
            and (mode == "nearest" or tdtype(x_dtype) in (td.f32, td.f16, td.bf16)))


def sample(x: np.ndarray, coordinates: np.ndarray, y: np.ndarray, mode: str, padding: str,
           align_corners: bool) -> td.Kernel:
    """Write x (N, C, spatial...), contiguous, sampled at `coordinates` (N, points, rank) into y (N, C, points),
    where `applies`; returns the kernel launched."""
    rank = x.ndim - 2
    kernel = sample_kernel(tdtype(x.dtype), rank, mode, padding, align_corners and padding == "reflection")
    depth, height, width = (1,) * (3 - rank) + x.shape[2:]
    kernel(x.reshape(x.shape[:2] + (-1,)), coordinates, y, width, height, depth)
    return kernel
