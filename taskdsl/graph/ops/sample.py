"""Sampling at computed positions: grid_sample (ONNX GridSample's and DeformConv's sampling)."""
from __future__ import annotations

from stdlib_ops.elementwise import flag
from stdlib_ops.grid_sample import CUBIC_A, TAPS

from ... import ir
from ...compute import compute
from ...compute import reduce as reduction
from ...ir import types as T
from ...ir.expr import math_expr
from ..operator import Operator, dims
from ..tensor import Tensor

PADDINGS = ("zeros", "border", "reflection")


def _tap_weight(t: ir.Expr, offset: ir.Expr, mode: str) -> ir.Expr:
    """The weight of the tap `offset` from the base of a coordinate whose fraction is t: linear 1 - d, cubic Keys'
    kernel (onnxruntime's formulas), d = |t - offset|."""
    d = math_expr("abs", [t - ir.convert(offset, t.dtype)])
    if mode == "linear":
        return 1.0 - d
    a = CUBIC_A
    near = ((d * (a + 2) - (a + 3)) * d) * d + 1.0                 # d <= 1: the taps at offsets 0 and 1
    far = (((d * a - 5 * a) * d) + 8 * a) * d - 4 * a               # 1 < d <= 2
    return ir.Select(ir.binary("and", offset >= 0, offset <= 1), near, far, t.dtype)


def _padded(i: ir.Expr, n, padding: str, align_corners: bool) -> tuple:
    """(index, inside) of tap index i along an axis of n pixels: border clamps it; reflection folds it into the axis
    mirrored about its borders (the pixel centres 0 and n - 1 with align_corners, the edges -0.5 and n - 0.5
    without: onnxruntime's GsReflect on whole indices); zeros clamps it too, `inside` then saying whether it was
    inside (None: always)."""
    if padding == "reflection":     # (an axis of one pixel: period 1, every index 0)
        period = (max(2 * (n - 1), 1) if isinstance(n, int) else math_expr("max", [2 * (n - 1), 1])) if align_corners \
            else 2 * n
        m = ir.binary("%", i, period)
        return ir.Select(m < n, m, period - (0 if align_corners else 1) - m, i.dtype), None
    clamped = math_expr("min", [math_expr("max", [i, 0]), n - 1])
    return clamped, (ir.binary("and", i >= 0, i < n) if padding == "zeros" else None)


class GridSample(Operator):
    """x (N, C, D1, ..., Dr) sampled at `coordinates` (N, points, r), in pixels, each point's last spatial axis
    first (as GridSample's grid lists them): (N, C, points). Along each axis a coordinate's taps (`mode`: nearest,
    halves to even; linear, 2; cubic, 4, Keys' kernel) are indices made valid by `padding` (border: clamped;
    reflection: folded, about the pixel centres with `align_corners`, the edges without; zeros: a tap outside reads
    0); the output sums the corners (one tap per axis), each weighted by its taps' product. Coordinates should lie
    within +-2^22 (f32) or +-2^51 (f64), where their whole parts are exact; a NaN one samples index 0 with NaN
    weights. Computed in f32 for 16-bit x, else in x's dtype; nearest takes x of any type, the others floats."""

    kind = "grid_sample"
    generic = True

    def check(self):
        if len(self.inputs) != 2:
            raise ValueError(f"grid_sample: needs x and coordinates, got {len(self.inputs)} inputs")
        x, coordinates = self.inputs
        mode, padding = self.attrs.get("mode"), self.attrs.get("padding")
        self.attrs["align_corners"] = flag(self.attrs.get("align_corners", False), "grid_sample: align_corners")
        if mode not in TAPS or padding not in PADDINGS:
            raise ValueError(f"grid_sample: mode must be one of {', '.join(TAPS)} and padding one of "
                             f"{', '.join(PADDINGS)}, got {mode!r} and {padding!r}")
        rank = x.ndim - 2
        if rank < 1 or coordinates.ndim != 3 or coordinates.shape[::2] != (x.shape[0], rank):
            raise ValueError(f"grid_sample: x {x.shape} and coordinates {coordinates.shape} do not match: x is "
                             "(N, C, D1, ..., Dr) with r >= 1, coordinates (N, points, r)")
        if 0 in x.shape[2:]:
            raise ValueError(f"grid_sample: x {x.shape} has an empty spatial axis: there is no pixel to sample")
        if not coordinates.dtype.is_float or not (mode == "nearest" or x.dtype.is_float):
            raise TypeError(f"grid_sample: needs float coordinates and, for mode {mode!r}, a float x; got "
                            f"{coordinates.dtype.name} and {x.dtype.name}")

    def define(self, x, coordinates):
        mode, padding, align_corners = self.attrs["mode"], self.attrs["padding"], self.attrs["align_corners"]
        (batch, channels), spatial = dims(x)[:2], dims(x)[2:]
        rank, points, taps = len(spatial), dims(coordinates)[1], TAPS[mode]
        wide = T.f32 if x.dtype.computes_in_f32 else x.dtype

        def corner(n, c, p, digits: list):
            """(x's value at the corner whose tap along axis a is digits[a], 0 where zeros padding leaves it
            outside; the product of its taps' weights, None for nearest)."""
            index, inside, weight = [], None, None
            for a, digit in enumerate(digits):
                u = coordinates[n, p, a]
                base = math_expr("rint" if mode == "nearest" else "floor", [u])
                offset = ir.convert(ir.as_expr(digit), T.i64) + taps[0]
                k, ok = _padded(ir.convert(base, T.i64) + offset, spatial[rank - 1 - a], padding, align_corners)
                index.append(k)
                inside = ok if inside is None or ok is None else ir.binary("and", inside, ok)
                if mode != "nearest":
                    w = _tap_weight(u - base, offset, mode)
                    weight = w if weight is None else weight * w
            value = x[(n, c) + tuple(reversed(index))]
            if inside is not None:
                value = ir.Select(inside, value, ir.const(0, x.dtype), x.dtype)
            return value, weight

        shape = (batch, channels, points)
        if mode == "nearest":
            return [compute("grid_sample", shape, lambda n, c, p: corner(n, c, p, [0] * rank)[0])]

        def term(n, c, p, t):
            """Corner t of the K^r, its tap along axis a digit a of t in base K."""
            value, weight = corner(n, c, p, [t // len(taps) ** a % len(taps) for a in range(rank)])
            return ir.convert(weight, wide) * ir.convert(value, wide)

        return [reduction("grid_sample", shape, (len(taps) ** rank,), term, dtype=wide)]


def grid_sample(x, coordinates, mode: str = "linear", padding: str = "zeros", align_corners: bool = False) -> Tensor:
    """x (N, C, spatial...) sampled at pixel `coordinates` (N, points, r), the last spatial axis's first:
    (N, C, points) (`GridSample`)."""
    return GridSample([x, coordinates], {"mode": mode, "padding": padding, "align_corners": align_corners}).outputs[0]
