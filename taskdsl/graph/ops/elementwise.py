"""Elementwise operators with numpy broadcasting: arithmetic, comparisons, logic, activations, where, cast, clip.

Each function of the table `FUNCTIONS` is a body over the operands' loaded values (IR
expressions) plus a dtype rule. Semantics follow ONNX: operands of arithmetic share one
dtype (use `cast` to convert), the result keeps it (integer `div` truncates toward zero,
`pow` keeps the base's dtype), comparisons give bool. 16-bit floats are computed in f32.
"""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from stdlib_ops.elementwise import flag, gelu_formula, real, silu_formula

from ... import ir
from ...compute import compute
from ...ir import types as T
from ...lang import math_expr
from ..operator import Operator
from ..tensor import Tensor, as_dtype, as_tensor


def broadcast_shape(shapes: list, what: str) -> tuple:
    """numpy's broadcast of `shapes` (ValueError naming `what` when they do not broadcast)."""
    try:
        return tuple(int(n) for n in np.broadcast_shapes(*shapes))
    except ValueError:
        raise ValueError(f"{what}: shapes {', '.join(str(tuple(s)) for s in shapes)} do not broadcast") from None


def broadcast_index(axes: tuple, shape: tuple) -> tuple:
    """The index into an operand of `shape` for output axes `axes` (right-aligned; size-1 dims read 0)."""
    lead = len(axes) - len(shape)
    return tuple(ir.const(0) if n == 1 else axes[lead + k] for k, n in enumerate(shape))


def promote_f32(e: ir.Expr) -> T.DataType:
    """The dtype arithmetic on `e` is computed in (16-bit floats in f32)."""
    return T.f32 if e.dtype.computes_in_f32 else e.dtype


def _f32(e: ir.Expr) -> ir.Expr:
    """16-bit floats widened to f32 for arithmetic that does not widen by itself (negation, selects)."""
    return ir.Cast(e, T.f32) if promote_f32(e) != e.dtype else e


def _fold(fn: Callable) -> Callable:
    """A variadic body: fn applied left to right over the operands (Sum, Max, Min)."""
    def body(*xs, **_):
        out = xs[0]
        for x in xs[1:]:
            out = fn(out, x)
        return out if len(xs) > 1 else _f32(out)
    return body


def _truncdiv(a, b, **_):
    if not (a.dtype.is_integer or a.dtype.is_bool):
        return a / b
    q = ir.binary("//", a, b)
    if a.dtype.kind == "uint":
        return q
    inexact = ir.binary("!=", ir.binary("%", a, b), 0)
    signs_differ = ir.binary("!=", ir.binary("<", a, 0), ir.binary("<", b, 0))
    return ir.Select(ir.binary("and", inexact, signs_differ), q + 1, q, q.dtype)   # C's division


def _pow(a, b, **_):
    wide = T.f64 if T.f64 in (a.dtype, b.dtype) or not a.dtype.is_float or not b.dtype.is_float else T.f32
    return math_expr("pow", [ir.Cast(a, wide), ir.Cast(b, wide)])


def _where(c, a, b, **_):
    test = c if c.dtype.is_bool else ir.binary("!=", c, 0)
    return ir.Select(test, a, b, a.dtype)


def _clip(x, *bounds, has_min=False, has_max=False, **_):
    bounds = list(bounds)
    x = _f32(x)
    if has_min:
        x = math_expr("max", [x, bounds.pop(0)])
    if has_max:
        x = math_expr("min", [x, bounds.pop(0)])
    return x


def _math(name: str) -> Callable:
    return lambda x, **_: math_expr(name, [x])


def _bit_shift(x, count, direction="left", **_):
    """x shifted left, or right (arithmetic for a signed x), by `count` bits: ONNX's BitShift. A count outside
    0..bits-1, where C's shift is undefined, shifts every bit out: 0, or -1 right of a negative x."""
    in_range = count < x.dtype.bits
    if count.dtype.kind == "int":
        in_range = ir.binary("and", count >= 0, in_range)
    count = ir.Select(in_range, count, ir.const(0, count.dtype), count.dtype)
    fill = ir.const(0, x.dtype)
    if direction == "left":     # in the unsigned type: C's left shift of a negative value is undefined
        shifted = ir.binary("<<", ir.convert(x, as_dtype(f"u{x.dtype.bits}")), count)
    else:
        shifted = ir.binary(">>", x, count)
        if x.dtype.kind == "int":
            fill = ir.Select(x < 0, ir.const(-1, x.dtype), fill, x.dtype)
    return ir.Select(in_range, ir.convert(shifted, x.dtype), fill, x.dtype)


def _softplus(a) -> ir.Expr:
    """log(1 + e^a) as max(a, 0) + log1p(e^-|a|), as onnxruntime computes it (e^a would overflow where the result
    is a, and 1 + e^a round to 1 where it is e^a); log1p(u) as Kahan's log(w) u / (w - 1), w = 1 + u, in which
    w - 1 is exact (and u itself where w rounds to 1)."""
    a = _f32(a)
    u = math_expr("exp", [-math_expr("abs", [a])])
    w = u + 1.0
    log1p = ir.Select(ir.binary("==", w, 1.0), u, math_expr("log", [w]) * (u / (w - 1.0)), a.dtype)
    return math_expr("max", [a, 0]) + log1p


def _elu(a, alpha=1.0, gamma=1.0, celu=False, **_) -> ir.Expr:
    """ONNX Elu: a, or alpha (e^a - 1) below 0 (NaN kept); Selu: that times gamma; Celu: e^(a / alpha) instead."""
    a = _f32(a)
    below = (math_expr("exp", [a / alpha if celu else a]) - 1.0) * alpha
    value = ir.Select(a < 0, below, a, a.dtype)
    return value if gamma == 1.0 else value * gamma


def _hard_swish(a, **_) -> ir.Expr:
    """x HardSigmoid(x) with alpha 1/6 and beta 1/2, the attributes of ONNX HardSwish's function body (float32
    values, for doubles too); NaN kept."""
    a = _f32(a)
    return a * math_expr("min", [math_expr("max", [a * float(np.float32(1 / 6)) + 0.5, 0]), 1])


# ---------------------------------------------------------------- dtype rules
def _same(dtypes: list, fn: str) -> T.DataType:
    if len(set(dtypes)) > 1:
        raise TypeError(f"{fn}: operands have different dtypes ({', '.join(d.name for d in dtypes)}); "
                        "convert them to one dtype with ops.cast")
    return dtypes[0]


def _numeric(dtypes, fn, **_):
    dtype = _same(dtypes, fn)
    if dtype.is_bool:
        raise TypeError(f"{fn} is not defined on bool tensors; cast them first")
    return dtype


def _floating(dtypes, fn, **_):
    dtype = _same(dtypes, fn)
    if not dtype.is_float:
        raise TypeError(f"{fn} needs float tensors, got {dtype.name}; cast the input first with ops.cast")
    return dtype


def _integer(dtypes, fn, **_):
    dtype = _same(dtypes, fn)
    if not dtype.is_integer:
        raise TypeError(f"{fn} needs integer tensors, got {dtype.name}")
    return dtype


def _compare(dtypes, fn, **_):
    _same(dtypes, fn)
    return T.boolean


def _logical(dtypes, fn, **_):
    if any(not d.is_bool for d in dtypes):
        raise TypeError(f"{fn} needs bool tensors, got {', '.join(d.name for d in dtypes)}")
    return T.boolean


def _base(dtypes, fn, **_):
    if any(d.is_bool for d in dtypes):
        raise TypeError(f"{fn} is not defined on bool tensors")
    return dtypes[0]


def _select(dtypes, fn, **_):
    return _same(dtypes[1:], fn)


def _clip_dtype(dtypes, fn, **_):
    return _numeric(dtypes, fn)


def _to(dtypes, fn, to=None, **_):
    return as_dtype(to, f"{fn}: to")


# ---------------------------------------------------------------- parameter checks: (value, what) -> value
def _one_of(*options) -> Callable:
    def check(value, what: str):
        if value not in options:
            raise ValueError(f"{what} must be one of {', '.join(map(repr, options))}, got {value!r}")
        return value
    return check


def _type_name(value, what: str) -> str:
    return as_dtype(value, what).name


@dataclass(frozen=True)
class Function:
    """An elementwise function: its body over loaded operands, its dtype rule, how many operands it takes, and
    its parameters' checks (name -> check(value, what), which returns the value to keep)."""

    body: Callable
    dtype: Callable
    arity: tuple = (1, 1)     # (min, max); max None = variadic
    params: tuple = ()        # (name, check) pairs


FUNCTIONS = {
    "add": Function(_fold(lambda a, b: a + b), _numeric, (1, None)),
    "sub": Function(lambda a, b, **_: a - b, _numeric, (2, 2)),
    "mul": Function(_fold(lambda a, b: a * b), _numeric, (1, None)),
    "div": Function(_truncdiv, _numeric, (2, 2)),
    # the floored remainder, with b's sign, as Python's and numpy's % (of floats: exact, through fmod)
    "mod": Function(lambda a, b, **_: ir.binary("%", a, b), _numeric, (2, 2)),
    "pow": Function(_pow, _base, (2, 2)),
    "maximum": Function(_fold(lambda a, b: math_expr("max", [a, b])), _numeric, (1, None)),
    "minimum": Function(_fold(lambda a, b: math_expr("min", [a, b])), _numeric, (1, None)),
    "equal": Function(lambda a, b, **_: ir.binary("==", a, b), _compare, (2, 2)),
    "less": Function(lambda a, b, **_: ir.binary("<", a, b), _compare, (2, 2)),
    "less_equal": Function(lambda a, b, **_: ir.binary("<=", a, b), _compare, (2, 2)),
    "greater": Function(lambda a, b, **_: ir.binary(">", a, b), _compare, (2, 2)),
    "greater_equal": Function(lambda a, b, **_: ir.binary(">=", a, b), _compare, (2, 2)),
    "logical_and": Function(lambda a, b, **_: ir.binary("and", a, b), _logical, (2, 2)),
    "logical_or": Function(lambda a, b, **_: ir.binary("or", a, b), _logical, (2, 2)),
    "logical_xor": Function(lambda a, b, **_: ir.binary("!=", a, b), _logical, (2, 2)),
    "logical_not": Function(lambda a, **_: ir.Unary("not", a, T.boolean), _logical),
    # -x, not 0 - x, for floats: -(+0.0) is -0.0 (1 / Neg(0) is -inf, as numpy and onnxruntime give)
    "neg": Function(lambda a, **_: -_f32(a) if a.dtype.is_float else ir.binary("-", 0, a), _numeric),
    "abs": Function(_math("abs"), _numeric),
    "relu": Function(lambda a, **_: math_expr("max", [a, 0]), _numeric),
    "leaky_relu": Function(lambda a, alpha=0.01, **_: ir.Select(a < 0, a * alpha, _f32(a), promote_f32(a)),
                           _floating, params=(("alpha", real),)),
    "sigmoid": Function(_math("sigmoid"), _floating),
    "tanh": Function(_math("tanh"), _floating),
    "exp": Function(_math("exp"), _floating),
    "log": Function(_math("log"), _floating),
    "sqrt": Function(_math("sqrt"), _floating),
    "rsqrt": Function(_math("rsqrt"), _floating),
    "erf": Function(_math("erf"), _floating),
    "sin": Function(_math("sin"), _floating),
    "cos": Function(_math("cos"), _floating),
    "asin": Function(_math("asin"), _floating),
    "acos": Function(_math("acos"), _floating),
    "atan": Function(_math("atan"), _floating),
    "sinh": Function(_math("sinh"), _floating),
    "cosh": Function(_math("cosh"), _floating),
    "asinh": Function(_math("asinh"), _floating),
    "acosh": Function(_math("acosh"), _floating),
    "atanh": Function(_math("atanh"), _floating),
    "floor": Function(_math("floor"), _floating),
    "ceil": Function(_math("ceil"), _floating),
    "rint": Function(_math("rint"), _floating),      # to the nearest integer, halves to even (ONNX's Round)
    "reciprocal": Function(lambda a, **_: 1.0 / a, _floating),
    "gelu": Function(lambda a, approximate="none", **_: gelu_formula(a, approximate), _floating,
                     params=(("approximate", _one_of("none", "tanh")),)),
    "silu": Function(lambda a, **_: silu_formula(a), _floating),
    # activations of one operand read more than once, as one operator (an epilogue fuses a chain of operators
    # each read once): ONNX Swish x sigmoid(alpha x) (NaN at -inf, where silu gives -0), HardSwish, Softplus, Mish,
    # Elu / Selu / Celu, PRelu (x, or slope x below 0)
    "swish": Function(lambda a, alpha=1.0, **_: _f32(a) * math_expr("sigmoid", [a * alpha]), _floating,
                      params=(("alpha", real),)),
    "hard_swish": Function(_hard_swish, _floating),
    "elu": Function(_elu, _floating, params=(("alpha", real), ("gamma", real), ("celu", flag))),
    "prelu": Function(lambda a, b, **_: ir.Select(a < 0, a * b, _f32(a), promote_f32(a)), _numeric, (2, 2)),
    "softplus": Function(lambda a, **_: _softplus(a), _floating),
    # a NaN to 0 and -0.0 to 0.0, else the value: what an integral float in an integer type's range becomes cast
    # there and back (`passes.drop_exact_round_trips`); the code generators write this select as one call
    # (`ir.nan_to_zero_operand`)
    "nan_to_zero": Function(lambda a, **_: ir.Select(ir.binary("==", a, a), a + 0.0, 0.0, a.dtype), _floating),
    "mish": Function(lambda a, **_: _f32(a) * math_expr("tanh", [_softplus(a)]), _floating),
    "where": Function(_where, _select, (3, 3)),
    "clip": Function(_clip, _clip_dtype, (1, 3), params=(("has_min", flag), ("has_max", flag))),
    "cast": Function(lambda a, **_: a, _to, params=(("to", _type_name),)),
    "bit_shift": Function(_bit_shift, _integer, (2, 2), params=(("direction", _one_of("left", "right")),)),
    "bitwise_and": Function(lambda a, b, **_: ir.binary("&", a, b), _integer, (2, 2)),
    "bitwise_or": Function(lambda a, b, **_: ir.binary("|", a, b), _integer, (2, 2)),
    "bitwise_xor": Function(lambda a, b, **_: ir.binary("^", a, b), _integer, (2, 2)),
    "bitwise_not": Function(lambda a, **_: ir.binary("^", a, ir.const(-1 if a.dtype.kind == "int" else
                                                                       a.dtype.limits[1], a.dtype)), _integer),
}


class Elementwise(Operator):
    """`FUNCTIONS[fn]` applied elementwise to broadcast operands; attrs: fn and the function's parameters."""

    kind_attr = "fn"

    @property
    def kind(self) -> str:
        return self.attrs["fn"]

    @property
    def params(self) -> dict:
        """The function's parameters (every attribute but `fn`)."""
        return {k: v for k, v in self.attrs.items() if k != "fn"}

    def check(self):
        fn = self.attrs.get("fn")
        if fn not in FUNCTIONS:
            raise ValueError(f"unknown elementwise function {fn!r}; known: {', '.join(sorted(FUNCTIONS))}")
        low, high = FUNCTIONS[fn].arity
        n = len(self.inputs)
        if n < low or (high is not None and n > high):
            raise TypeError(f"{fn} takes {low}{'' if high == low else '+' if high is None else f'-{high}'} "
                            f"operands, got {n}")
        checks = dict(FUNCTIONS[fn].params)
        for name, value in self.params.items():
            if name not in checks:
                raise TypeError(f"{fn} takes no parameter {name!r}" +
                                (f"; its parameters: {', '.join(checks)}" if checks else ""))
            self.attrs[name] = checks[name](value, f"{fn}: {name}")
        self.out_dtype = FUNCTIONS[fn].dtype([t.dtype for t in self.inputs], fn, **self.params)
        self.out_shape = broadcast_shape([t.shape for t in self.inputs], fn)

    def body(self, *loads: ir.Expr) -> ir.Expr:
        """The output element from the operands' elements (the same expression the kernels compute)."""
        return FUNCTIONS[self.attrs["fn"]].body(*loads, **self.params)

    def define(self, *xs):
        def fcompute(*axes):
            return self.body(*(x[broadcast_index(axes, x_t.shape)] for x, x_t in zip(xs, self.inputs)))
        return [compute(f"{self.kind}_out", self.out_shape, fcompute, dtype=self.out_dtype)]


class FusedElementwise(Elementwise):
    """Elementwise operators computed as one: attrs["steps"] holds each member as (fn, its parameters as sorted
    (name, value) pairs, its operands), an operand k < len(inputs) being input k, and len(inputs) + j step j's
    value; the last step is the output. Each step's value is converted to its own dtype (a 16-bit intermediate
    rounded, an i32 one wrapped, as its tensor would be), so the result is the members' run one after another,
    but for a multiply and an add of f32 / f64 contracted into one FMA (an ulp; docs/dsl-reference.md).
    Built by the graph pass `fuse_elementwise`."""

    kind = "fused_elementwise"
    kind_attr = None

    @property
    def params(self) -> dict:
        return {"steps": self.attrs["steps"]}

    @property
    def kinds(self) -> tuple:
        return tuple(fn for fn, _, _ in self.attrs["steps"])

    def check(self):
        values = [(t.dtype, t.shape) for t in self.inputs]
        for fn, params, refs in self.attrs["steps"]:
            dtypes, shapes = [values[r][0] for r in refs], [values[r][1] for r in refs]
            values.append((FUNCTIONS[fn].dtype(dtypes, fn, **dict(params)), broadcast_shape(shapes, fn)))
        self.step_dtypes = [dtype for dtype, _ in values[len(self.inputs):]]
        self.out_dtype, self.out_shape = values[-1]

    def body(self, *loads: ir.Expr) -> ir.Expr:
        values = list(loads)
        for (fn, params, refs), dtype in zip(self.attrs["steps"], self.step_dtypes):
            value = ir.convert(ir.as_expr(FUNCTIONS[fn].body(*(values[r] for r in refs), **dict(params))), dtype)
            if dtype == T.i32:      # the cpu computes i32 + - * in 64 bits: wrap as the stored tensor would
                value = ir.Cast(ir.Cast(value, T.u32), T.i32)
            values.append(value)
        return values[-1]

    def expression(self) -> str:
        """The steps as one nested call, e.g. `mul(in0, sigmoid(in0))`."""
        text = [f"in{k}" for k in range(len(self.inputs))]
        for fn, params, refs in self.attrs["steps"]:
            args = [text[r] for r in refs] + [f"{k}={v!r}" for k, v in params]
            text.append(f"{fn}({', '.join(args)})")
        return text[-1]

    def shown_attrs(self) -> dict:
        return {"computes": self.expression()}


def elementwise(fn: str, *operands, **params) -> Tensor:
    """`fn` (a name in FUNCTIONS) applied to operands (tensors; numbers adopt the first tensor's dtype)."""
    like = next((x for x in operands if isinstance(x, Tensor)), None)
    if like is None:
        raise TypeError(f"{fn}: at least one operand must be a graph Tensor")
    tensors = [as_tensor(x, like) for x in operands]
    return Elementwise(tensors, {"fn": fn, **params}).outputs[0]


def add(a, b):
    """a + b with broadcasting."""
    return elementwise("add", a, b)


def sub(a, b):
    """a - b with broadcasting."""
    return elementwise("sub", a, b)


def mul(a, b):
    """a * b with broadcasting."""
    return elementwise("mul", a, b)


def div(a, b):
    """a / b with broadcasting (integers: truncated toward zero)."""
    return elementwise("div", a, b)


def pow(a, b):
    """a ** b with broadcasting (the result has a's dtype)."""
    return elementwise("pow", a, b)


def maximum(*xs):
    """The elementwise maximum of the operands (broadcast)."""
    return elementwise("maximum", *xs)


def minimum(*xs):
    """The elementwise minimum of the operands (broadcast)."""
    return elementwise("minimum", *xs)


def equal(a, b):
    """a == b (bool)."""
    return elementwise("equal", a, b)


def less(a, b):
    """a < b (bool)."""
    return elementwise("less", a, b)


def greater(a, b):
    """a > b (bool)."""
    return elementwise("greater", a, b)


def neg(x):
    """-x."""
    return elementwise("neg", x)


def relu(x):
    """max(x, 0)."""
    return elementwise("relu", x)


def gelu(x, approximate: str = "none"):
    """GELU, exact (erf) or with approximate='tanh'."""
    return elementwise("gelu", x, approximate=approximate)


def silu(x):
    """x * sigmoid(x)."""
    return elementwise("silu", x)


def sigmoid(x):
    """1 / (1 + exp(-x))."""
    return elementwise("sigmoid", x)


def tanh(x):
    """Hyperbolic tangent."""
    return elementwise("tanh", x)


def erf(x):
    """The error function."""
    return elementwise("erf", x)


def exp(x):
    """e ** x."""
    return elementwise("exp", x)


def log(x):
    """Natural logarithm."""
    return elementwise("log", x)


def sqrt(x):
    """Square root."""
    return elementwise("sqrt", x)


def rsqrt(x):
    """1 / sqrt(x)."""
    return elementwise("rsqrt", x)


def where(cond, a, b):
    """a where cond (bool, or nonzero) else b, all three broadcast."""
    like = a if isinstance(a, Tensor) else b if isinstance(b, Tensor) else None
    if like is None:
        raise TypeError("where: a or b must be a graph Tensor")
    return elementwise("where", as_tensor(cond), as_tensor(a, like), as_tensor(b, like))


def cast(x, dtype):
    """x converted to `dtype` (float to int truncates toward zero); x itself where it has that dtype (an operator
    would copy it)."""
    x = as_tensor(x)
    return x if x.dtype == as_dtype(dtype) else elementwise("cast", x, to=as_dtype(dtype).name)


def clip(x, lo=None, hi=None):
    """x clamped to [lo, hi] (either may be None; numbers or tensors of x's dtype)."""
    x = as_tensor(x)
    if lo is None and hi is None:
        return x
    bounds = [as_tensor(v, x) for v in (lo, hi) if v is not None]
    return Elementwise([x, *bounds], {"fn": "clip", "has_min": lo is not None, "has_max": hi is not None}).outputs[0]
