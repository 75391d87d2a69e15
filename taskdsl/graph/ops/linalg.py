"""The anchors: matmul (numpy semantics: 1-d operands, broadcast batch axes) and N-d convolution.

Both are reductions; they are what fusion partitions are built around (`is_anchor`).
`linear` and `conv2d` with a bias are the anchor followed by an elementwise add. `integer_matmul` and
`integer_conv`, the product and convolution of 8-bit integers into exact int32 (ONNX's MatMulInteger and
ConvInteger), run on their own (on a GPU's 8-bit tensor cores).
"""
from __future__ import annotations

from ... import ir
from ...ir import types as T
from ...compute import reduce as reduction
from ..operator import Operator, dims
from ..tensor import Tensor, as_tensor
from .elementwise import add, broadcast_shape
from .transform import reshape, transpose
from stdlib_ops.elementwise import as_int, int_tuple

from .window import ChannelsLast, pads_of, window_input, window_positions


class MatMul(Operator):
    """a @ b as numpy.matmul: (..., M, K) @ (..., K, N) with broadcast batch axes; 1-d operands allowed."""

    kind = "matmul"
    is_anchor = True
    generic = True

    def check(self):
        a, b = self.inputs
        if a.dtype != b.dtype or a.dtype.is_bool:
            raise TypeError(f"matmul needs two numeric tensors of one dtype, got {a.dtype.name} and {b.dtype.name}")
        self.check_shapes()

    def check_shapes(self):
        """A ValueError unless the operands' shapes multiply (numpy's matmul rules)."""
        a, b = self.inputs
        if a.ndim == 0 or b.ndim == 0:
            raise ValueError("matmul needs tensors of at least 1 dimension; use mul for scalars")
        ka = a.shape[-1]
        kb = b.shape[-2] if b.ndim >= 2 else b.shape[0]
        if ka != kb:
            raise ValueError(f"matmul: shapes {a.shape} and {b.shape} do not match (K = {ka} vs {kb})")
        broadcast_shape([a.shape[:-2], b.shape[:-2]], "matmul batch axes")

    def define(self, a, b):
        return [self.product(a, b, lambda x, y: x * y, self.inputs[0].dtype)]

    def product(self, a, b, term, dtype) -> Tensor:
        """The reduction a @ b whose summed terms are term(a element, b element), of `dtype`."""
        ta, tb = self.inputs
        da, db = dims(a), dims(b)
        rank = max(ta.ndim, tb.ndim, 2) - 2
        batch_a, batch_b = (1,) * (rank - len(da[:-2])) + da[:-2], (1,) * (rank - len(db[:-2])) + db[:-2]
        batch = tuple(y if x == 1 else x for x, y in zip(batch_a, batch_b))     # 1s are static: structure
        m = da[-2:-1] if ta.ndim >= 2 else ()
        n = db[-1:] if tb.ndim >= 2 else ()

        def operand_batch(ix, t):
            lead = rank - max(t.ndim - 2, 0)
            return tuple(ir.const(0) if t.shape[k] == 1 else ix[lead + k] for k in range(max(t.ndim - 2, 0)))

        def fcompute(*ix):
            k = ix[-1]
            row = (ix[rank],) if m else ()
            col = (ix[rank + len(m)],) if n else ()
            return term(a[operand_batch(ix, ta) + row + (k,)], b[operand_batch(ix, tb) + (k,) + col])

        return reduction(self.kind, batch + m + n, (da[-1],), fcompute, op="sum", dtype=dtype)


class IntegerMatMul(MatMul):
    """a @ b of 8-bit integers (int8 or uint8 each) into exact int32, as numpy.matmul's shapes: ONNX's MatMulInteger
    without zero points. Not an anchor: it runs on its own, on a GPU by the 8-bit tensor-core template."""

    kind = "matmul_integer"
    is_anchor = False

    def check(self):
        a, b = self.inputs
        if a.dtype.name not in ("i8", "u8") or b.dtype.name not in ("i8", "u8"):
            raise TypeError(f"integer_matmul needs int8 or uint8 tensors, got {a.dtype.name} and {b.dtype.name}")
        self.check_shapes()

    def define(self, a, b):
        return [self.product(a, b, lambda x, y: ir.Cast(x, T.i32) * ir.Cast(y, T.i32), T.i32)]


class Convolution(ChannelsLast, Operator):
    """What Conv and IntegerConv share: N-d convolution (1-3 spatial axes) of x (N, C, ...) with w (O, C / groups,
    ...), no bias, as one reduction of `term(x element, w element)` in `accumulator`.

    attrs: strides, pads ((begin..., end...) per spatial axis), dilations, groups, and
    channels_last: x is (N, ..., C) and the output (N, ..., O) (the weights stay (O, C / groups, ...)).
    """

    generic = True
    size_attrs = ("strides", "pads", "dilations", "groups", "out")    # one kernel for every convolution of a rank
    derived_attrs = ("out",)      # the output's spatial size: a plain size symbol in the generic definitions

    def check_types(self, x: Tensor, w: Tensor) -> None:
        """A TypeError unless the operands' types are the operator's."""
        raise NotImplementedError

    def term(self, x: ir.Expr, w: ir.Expr) -> ir.Expr:
        """One summed term of the convolution."""
        return x * w

    @property
    def accumulator(self) -> T.DataType:
        """The type of the sums (the output's)."""
        return self.inputs[0].dtype

    def check(self):
        self.set_layout()
        x, w = self.inputs
        a = self.attrs
        rank = x.ndim - 2
        self.check_types(x, w)
        if not 1 <= rank <= 3 or w.ndim != x.ndim:
            raise ValueError(f"conv needs x (N, C, spatial...) with 1-3 spatial axes and a weight of the same rank, "
                             f"got {x.shape} and {w.shape}")
        g, channels = a["groups"], self.channels(x.shape)
        if g < 1 or channels % g or w.shape[0] % g or w.shape[1] * g != channels:
            raise ValueError(f"conv: {channels} input channels, weight {w.shape} and groups={g} do not match "
                             "(the weight is (out_channels, in_channels / groups, kernel...))")
        for key, length, low in (("strides", rank, 1), ("dilations", rank, 1), ("pads", 2 * rank, 0)):
            if len(a[key]) != length or any(n < low for n in a[key]):
                raise ValueError(f"conv: {key} must be {length} ints >= {low}, got {a[key]!r}")
        self.attrs["out"] = self._spatial(self.spatial_dims(x.shape), w.shape)
        if any(n < 1 for n in self.attrs["out"]):
            raise ValueError(f"conv: the (dilated) kernel {w.shape[2:]} is larger than the padded input "
                             f"{self.spatial_dims(x.shape)}")

    def _spatial(self, spatial: tuple, w_shape: tuple) -> tuple:
        rank = len(spatial)
        strides, pads, dilations = (self.size(k) for k in ("strides", "pads", "dilations"))
        return tuple(window_positions(spatial[i], w_shape[2 + i], strides[i], pads[i], pads[rank + i],
                                      dilations[i]) for i in range(rank))

    def define(self, x, w):
        dx, dw = dims(x), dims(w)
        rank = len(dx) - 2
        strides, pads, dilations, groups = (self.size(k) for k in ("strides", "pads", "dilations", "groups"))

        def fcompute(*ix):
            n, o, spatial = self.split_index(ix[:rank + 2])
            (c, *k) = ix[rank + 2:]
            pos, ok = window_input(spatial, k, strides, pads, dilations, self.spatial_dims(dx))
            channel = (o // (dw[0] // groups)) * dw[1] + c         # the input channel of group o // (O / groups)
            v = self.term(x[self.join_index(n, channel, pos)], w[(o, c, *k)])
            return ir.Select(ok, v, ir.const(0, v.dtype), v.dtype)

        out_shape = self.join_index(dx[0], dw[0], self.size("out"))
        return [reduction("conv", out_shape, dw[1:], fcompute, op="sum", dtype=self.accumulator)]


class Conv(Convolution):
    """N-d convolution of float x by w of its type (`Convolution`): an anchor."""

    is_anchor = True

    @property
    def kind(self) -> str:
        return f"conv{len(self.inputs[0].shape) - 2}d"

    def check_types(self, x: Tensor, w: Tensor) -> None:
        if not x.dtype.is_float or w.dtype != x.dtype:
            raise TypeError(f"conv needs float input and weight of one dtype, got {x.dtype.name} and {w.dtype.name}")


class IntegerConv(Convolution):
    """N-d convolution of 8-bit integers (int8 or uint8 each) into exact int32 (`Convolution`): ONNX's ConvInteger
    without zero points. 1-D and 2-D ones run by stdlib_ops.conv (on a GPU the 8-bit tensor-core template); on the
    cpu a 2-D one is an anchor with an epilogue (graph/fusion.py), and runs channels-last in a stack
    (passes.channels_last)."""

    @property
    def kind(self) -> str:
        return f"conv{len(self.inputs[0].shape) - 2}d_integer"

    def check_types(self, x: Tensor, w: Tensor) -> None:
        if x.dtype.name not in ("i8", "u8") or w.dtype.name not in ("i8", "u8"):
            raise TypeError(f"integer_conv needs int8 or uint8 tensors, got {x.dtype.name} and {w.dtype.name}")

    def term(self, x: ir.Expr, w: ir.Expr) -> ir.Expr:
        return ir.Cast(x, T.i32) * ir.Cast(w, T.i32)

    @property
    def accumulator(self) -> T.DataType:
        return T.i32


def matmul(a, b):
    """numpy.matmul(a, b) on graph tensors."""
    return MatMul([as_tensor(a), as_tensor(b)]).outputs[0]


def integer_matmul(a, b):
    """numpy.matmul(a, b) of int8 / uint8 tensors into exact int32."""
    return IntegerMatMul([as_tensor(a), as_tensor(b)]).outputs[0]


def linear(x, weight, bias=None):
    """x @ weight.T + bias (PyTorch's nn.Linear: weight is (out_features, in_features))."""
    x, weight = as_tensor(x), as_tensor(weight)
    if weight.ndim != 2 or x.ndim == 0 or x.shape[-1] != weight.shape[1]:
        raise ValueError(f"linear: the weight must be (out_features, in_features) with in_features = x's last dim "
                         f"{x.shape[-1:]}, got x {x.shape} and weight {weight.shape}")
    y = matmul(x, transpose(weight))
    if bias is None:
        return y
    bias = as_tensor(bias, y)
    if bias.shape != weight.shape[:1]:
        raise ValueError(f"linear: the bias must have one value per output feature, shape ({weight.shape[0]},), "
                         f"got {bias.shape}")
    return add(y, bias)


def _window_attrs(rank: int, stride, padding, dilation, groups, channels_last: bool) -> dict:
    """A convolution's attrs (`Convolution`) from its arguments."""
    return {"strides": int_tuple(stride, "stride", rank), "pads": pads_of(padding, rank),
            "dilations": int_tuple(dilation, "dilation", rank), "groups": as_int(groups, "groups"),
            "channels_last": bool(channels_last)}


def conv(x, weight, bias=None, stride=1, padding=0, dilation=1, groups: int = 1,
         channels_last: bool = False) -> Tensor:
    """N-d convolution (1-3 spatial axes); padding is an int, one per axis, or (begin..., end...);
    x is (N, C, ...), or (N, ..., C) with channels_last."""
    weight = as_tensor(weight)
    y = Conv([x, weight], _window_attrs(x.ndim - 2, stride, padding, dilation, groups, channels_last)).outputs[0]
    if bias is None:
        return y
    bias = as_tensor(bias, y)
    if bias.shape != (weight.shape[0],):
        raise ValueError(f"conv: the bias must have one value per output channel, shape ({weight.shape[0]},), "
                         f"got {bias.shape}")
    return add(y, bias if channels_last else reshape(bias, (bias.size,) + (1,) * (x.ndim - 2)))


def integer_conv(x, weight, stride=1, padding=0, dilation=1, groups: int = 1, channels_last: bool = False) -> Tensor:
    """N-d convolution of int8 / uint8 tensors into exact int32 (`conv`'s arguments, no bias)."""
    x, weight = as_tensor(x), as_tensor(weight)
    return IntegerConv([x, weight], _window_attrs(x.ndim - 2, stride, padding, dilation, groups,
                                                  channels_last)).outputs[0]


def conv2d(x, weight, bias=None, stride=1, padding=0, dilation=1, groups: int = 1,
           channels_last: bool = False) -> Tensor:
    """2-d convolution of x (N, C, H, W), or (N, H, W, C) with channels_last, with weight (O, C / groups, KH, KW):
    PyTorch's conv2d semantics."""
    if x.ndim != 4:
        raise ValueError(f"conv2d needs a 4-D (N, C, H, W) or (N, H, W, C) tensor, got shape {x.shape}")
    return conv(x, weight, bias, stride, padding, dilation, groups, channels_last)
