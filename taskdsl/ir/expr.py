"""Expressions of the tensor IR: small immutable nodes, each with its result type.

Nodes compare by identity (`==` is not overloaded to build IR); arithmetic and ordering
operators are overloaded so that Python code such as task-mapping functions and `td.cdiv`
can be evaluated on IR values as well as on ints.
"""
from __future__ import annotations

import contextlib
import dataclasses
import functools
import itertools
import math
import threading
from dataclasses import dataclass, field

import numpy as np

from .types import DataType, as_dtype, boolean, f32, i32, i64, promote, u64

_ids = itertools.count()


class _Depth(threading.local):
    depth = 0


_elementwise_equality = _Depth()


@contextlib.contextmanager
def elementwise_equality():
    """Within it, `==` and `!=` of an expression and an expression or a number build comparisons, as `<` does
    everywhere (a compute definition's function runs so: `lambda i: X[i] % 3 == 0`). Elsewhere they keep Python's
    identity, which IR code relies on."""
    _elementwise_equality.depth += 1
    try:
        yield
    finally:
        _elementwise_equality.depth -= 1


def _comparable(o) -> bool:
    return isinstance(o, (Expr, bool, int, float, np.number))


class Expr:
    """Base class of expressions; subclasses are frozen dataclasses with a `dtype`."""

    dtype: DataType

    def __add__(self, o): return binary("+", self, o)
    def __radd__(self, o): return binary("+", o, self)
    def __sub__(self, o): return binary("-", self, o)
    def __rsub__(self, o): return binary("-", o, self)
    def __mul__(self, o): return binary("*", self, o)
    def __rmul__(self, o): return binary("*", o, self)
    def __truediv__(self, o): return binary("/", self, o)
    def __rtruediv__(self, o): return binary("/", o, self)
    def __floordiv__(self, o): return binary("//", self, o)
    def __rfloordiv__(self, o): return binary("//", o, self)
    def __mod__(self, o): return binary("%", self, o)
    def __rmod__(self, o): return binary("%", o, self)
    def __neg__(self):     # bools and narrow ints in i32, as C and kernels promote them; floats as they are
        e = self if self.dtype.is_float or self.dtype.bits >= 32 else Cast(self, i32)
        return Unary("-", e, e.dtype)
    def __abs__(self): return math_expr("abs", [self])
    # numpy's meanings, as a compute definition's body has them: on bools logical, on integers bitwise
    def __and__(self, o): return _bitwise("&", self, o)
    def __rand__(self, o): return _bitwise("&", o, self)
    def __or__(self, o): return _bitwise("|", self, o)
    def __ror__(self, o): return _bitwise("|", o, self)
    def __xor__(self, o): return _bitwise("^", self, o)
    def __rxor__(self, o): return _bitwise("^", o, self)
    def __lshift__(self, o): return _bitwise("<<", self, o)
    def __rlshift__(self, o): return _bitwise("<<", o, self)
    def __rshift__(self, o): return _bitwise(">>", self, o)
    def __rrshift__(self, o): return _bitwise(">>", o, self)
    def __pow__(self, o): return math_expr("pow", [self, o])      # as `**` is td.pow in a kernel's body
    def __rpow__(self, o): return math_expr("pow", [o, self])

    def __array_ufunc__(self, ufunc, method, *inputs, **kwargs): return numpy_ufunc(ufunc, method, inputs, kwargs)

    def __float__(self): raise _no_python_value("float", "td.cast(x, td.f32)")
    def __int__(self): raise _no_python_value("int", "td.cast(x, td.i32)")
    def __round__(self, ndigits=None): raise _no_python_value("rounded", "td.floor(x + 0.5)")

    def __invert__(self):
        if self.dtype.is_bool:
            return Unary("not", self, boolean)
        if not self.dtype.is_integer:
            raise TypeError(f"'~' needs an integer or bool operand, got {self.dtype.name}")
        e = self if self.dtype.bits >= 32 else Cast(self, i32)
        return Unary("~", e, e.dtype)
    def __lt__(self, o): return binary("<", self, o)
    def __le__(self, o): return binary("<=", self, o)
    def __gt__(self, o): return binary(">", self, o)
    def __ge__(self, o): return binary(">=", self, o)

    def __eq__(self, o):
        return binary("==", self, o) if _elementwise_equality.depth and _comparable(o) else NotImplemented

    def __ne__(self, o):
        return binary("!=", self, o) if _elementwise_equality.depth and _comparable(o) else NotImplemented

    __hash__ = object.__hash__

    def __bool__(self):
        raise TruthValueError("an IR expression has no Python truth value (it is only known when the kernel runs); "
                              "in a compute definition write `x if c else y` as taskdsl.ir.Select(c, x, y, dtype), "
                              "max/min as td.max/td.min, and `and`/`or`/`not` as & | ~ (comparisons in parentheses)")


class TruthValueError(TypeError):
    """A runtime value tested as a Python bool (`if`, `and`, `min` of Python on an IR expression)."""


@dataclass(frozen=True, eq=False)
class Const(Expr):
    """A literal of a given type."""

    value: object
    dtype: DataType


@dataclass(frozen=True, eq=False)
class Var(Expr):
    """A named scalar: a local, a loop variable, a scalar parameter or a size symbol ('size')."""

    name: str
    dtype: DataType
    kind: str = "local"
    uid: int = field(default_factory=lambda: next(_ids))


@dataclass(frozen=True, eq=False)
class SpecialReg(Expr):
    """A CUDA built-in index register: threadIdx / blockIdx / blockDim / gridDim, axis x|y|z."""

    name: str
    axis: str
    dtype: DataType = i32


@dataclass(frozen=True, eq=False)
class Binary(Expr):
    """`a op b` for arithmetic, comparison, logical and bitwise operators."""

    op: str
    a: Expr
    b: Expr
    dtype: DataType

    @property
    def divides_integers(self) -> bool:
        """Whether this is an integer division or remainder: an operation not to make where the program would not
        (x86 traps on INT_MIN // -1)."""
        return self.op in ("/", "%", "//") and not self.dtype.is_float


@dataclass(frozen=True, eq=False)
class Unary(Expr):
    """`op a` for '-', 'not' and '~'."""

    op: str
    a: Expr
    dtype: DataType


@dataclass(frozen=True, eq=False)
class Select(Expr):
    """`a if cond else b` (only the chosen branch is evaluated).

    `eager`: a library's promise that both operands are safe to evaluate whatever `cond` is (loads at
    clamped indices, say), so a backend may evaluate both and pick one, with no branch: on a GPU a thread's
    loads under such selects then overlap their latencies instead of each waiting behind its branch.
    """

    cond: Expr
    a: Expr
    b: Expr
    dtype: DataType
    eager: bool = False

    def __post_init__(self):
        """Python numbers become constants (a compute definition's `Select(c, x, 0, td.i32)`), and operands of
        another type are converted to `dtype` as `td.cast` converts them (float to int saturates): the backends
        and the reference evaluator would each convert them their own way. The dtype may be named as for
        placeholders ('float32', np.float32)."""
        if not isinstance(self.dtype, DataType):
            object.__setattr__(self, "dtype", as_dtype(self.dtype, "Select's dtype"))
        if not isinstance(self.cond, Expr):
            object.__setattr__(self, "cond", as_expr(self.cond))
        for name in ("a", "b"):
            value = getattr(self, name)
            object.__setattr__(self, name, convert(as_expr(value, self.dtype), self.dtype))


@dataclass(frozen=True, eq=False)
class Cast(Expr):
    """Conversion of `value` to `dtype`."""

    value: Expr
    dtype: DataType


@dataclass(frozen=True, eq=False)
class Call(Expr):
    """A math or warp intrinsic by name (see `taskdsl.lang.intrinsics`)."""

    func: str
    args: tuple
    dtype: DataType


@dataclass(frozen=True, eq=False)
class Buffer:
    """A tensor in a memory scope: 'global' (a kernel parameter), 'shared' or 'register'."""

    name: str
    dtype: DataType
    shape: tuple
    scope: str = "global"
    uid: int = field(default_factory=lambda: next(_ids))

    def __post_init__(self):
        assert self.scope in ("global", "shared", "register"), self.scope


@dataclass(frozen=True, eq=False)
class Load(Expr):
    """`buffer[indices]`; after flattening, `indices` is a single linear index."""

    buffer: Buffer
    indices: tuple

    @property
    def dtype(self) -> DataType:
        return self.buffer.dtype

    @property
    def at_constant_element(self) -> bool:
        """Whether the load reads constant indices inside its buffer's constant shape (after flattening, one index
        inside its size): an element any point of the kernel may read, such as a size-1 operand's."""
        shape, indices = self.buffer.shape, self.indices
        if not all(isinstance(x, Const) for x in (*shape, *indices)):
            return False
        if len(indices) == 1 and len(shape) != 1:
            return 0 <= indices[0].value < math.prod(d.value for d in shape)
        return len(indices) == len(shape) and all(0 <= i.value < d.value for i, d in zip(indices, shape))


@dataclass(frozen=True, eq=False)
class Ref(Expr):
    """`buffer[indices]` as the operand of a memory instruction (mma, ldmatrix, cp_async), not a value.

    With fewer indices than axes it names the row-major sub-tensor of the remaining axes (a
    fragment of a register array); after flattening, `indices` is its first element's linear index.
    """

    buffer: Buffer
    indices: tuple

    @property
    def dtype(self) -> DataType:
        return self.buffer.dtype

    def element(self, k, flat: bool = False) -> tuple:
        """Indices of the `k`-th element of the sub-tensor (row-major; `k` an int), or, from an element, of the
        `k`-th element along the last axis (CUDA reads flat memory, so a run may go on into the next row; after
        flattening the cpu target does too, and debug mode reports such a run as an index out of its axis).
        `flat`: the Ref was flattened (its one index is linear), so the element is `k` past it."""
        idx = self.indices
        if not flat and len(idx) < len(self.buffer.shape):
            rest = []
            for d in reversed(self.buffer.shape[len(idx):]):
                k, r = divmod(k, d.value)
                rest.append(const(r))
            return idx + tuple(reversed(rest))
        return idx if isinstance(k, int) and k == 0 else idx[:-1] + (idx[-1] + k,)


@dataclass(frozen=True, eq=False)
class Atomic(Expr):
    """`buffer[indices] op= value` done atomically; its value is the old element."""

    op: str
    buffer: Buffer
    indices: tuple
    value: Expr

    @property
    def dtype(self) -> DataType:
        return self.buffer.dtype


ARITH_OPS = ("+", "-", "*", "/", "//", "%")
COMPARE_OPS = ("<", "<=", ">", ">=", "==", "!=")
LOGIC_OPS = ("and", "or")


class ConstantError(ValueError):
    """A Python number that has no value in the IR's types (an int beyond 64 bits, inf as an integer)."""


def const(value, dtype: DataType | None = None) -> Const:
    """A literal; Python bool -> bool, int -> i32 (i64, u64 when it needs them), float -> f32 unless
    `dtype` says otherwise. An integer is converted to an integer `dtype` as C converts it (wrapping), a finite
    float as a runtime conversion does (saturating: `DataType.saturate`), a number to a float `dtype` is rounded
    to that type (so folding `f32(f16(0.1))` gives f16's 0.1)."""
    if dtype is None:
        dtype = boolean if isinstance(value, bool) else _int_literal_type(value) if isinstance(value, int) else f32
    if dtype.is_float:
        value = dtype.round(value)
    elif dtype.is_bool:
        value = bool(value)
    elif isinstance(value, (float, np.floating)):
        if not math.isfinite(value):
            raise ConstantError(f"{value} has no {dtype.name} value (only finite floats convert to integers)")
        value = dtype.saturate(float(value))
    else:
        value = dtype.wrap(int(value))
    return Const(value, dtype)


def _int_literal_type(value: int) -> DataType:
    for dtype in (i32, i64, u64):
        if dtype.holds(value):
            return dtype
    raise ConstantError(f"the integer literal {value} does not fit in 64 bits")


def as_expr(value, like: DataType | None = None) -> Expr:
    """An Expr for `value`; a Python number takes the type of `like` when it fits there (weak literals)."""
    if isinstance(value, Expr):
        return value
    if isinstance(value, (bool, int, float)) and like is not None and not isinstance(value, bool):
        if like.is_float or (like.is_integer and isinstance(value, int) and like.holds(value)):
            return const(value, like)
    if isinstance(value, (bool, int, float)):
        return const(value)
    if hasattr(value, "item") and hasattr(value, "dtype"):  # numpy scalar
        return as_expr(value.item(), like)
    raise TypeError(f"cannot use {type(value).__name__} value {value!r} in a kernel expression")


def literal_type(partner: DataType) -> DataType:
    """The type a Python number takes next to a `partner` operand in arithmetic or a comparison:
    the partner's, except f32 next to a 16-bit float (whose arithmetic is done in f32, so a
    literal is not rounded to 16 bits first)."""
    return f32 if partner.computes_in_f32 else partner


def convert(e: Expr, dtype: DataType) -> Expr:
    """`e` as a `dtype` value: a constant is converted now, anything else gets a Cast."""
    if e.dtype == dtype:
        return e
    return const(e.value, dtype) if isinstance(e, Const) else Cast(e, dtype)


def binary(op: str, a, b) -> Expr:
    """Build `a op b` with C-like type promotion; Python numbers adopt the other operand's type."""
    a = as_expr(a, literal_type(b.dtype) if isinstance(b, Expr) else None)
    b = as_expr(b, literal_type(a.dtype))
    if op in COMPARE_OPS:
        return _compare(op, a, b)
    if op in LOGIC_OPS:
        return Binary(op, a, b, boolean)
    # a shift has its left operand's (promoted) type, as in C: `-2 >> 1u` is -1, not a logical shift in u32
    dtype = promote(a.dtype, a.dtype) if op in ("<<", ">>") else promote(a.dtype, b.dtype)
    if (op == "/" and not dtype.is_float) or (dtype.computes_in_f32):
        dtype = f32  # 16-bit floats are a storage format: arithmetic on them is done in f32
    return Binary(op, convert(a, dtype), convert(b, dtype), dtype)


def _no_python_value(kind: str, instead: str) -> TypeError:
    """What converting an IR expression to a Python number raises (math.exp(x) does, float(x), ...)."""
    return TypeError(f"an IR expression has no {kind} Python value (it is only known when the kernel runs): write "
                     f"{instead} for a conversion, and td.exp, td.sqrt, ... (or numpy's, not math's) for math")


# numpy's ufuncs that have an IR meaning: operators (np.float32(2) * x calls np.multiply) and math functions
_UFUNC_OPERATORS = {np.add: "+", np.subtract: "-", np.multiply: "*", np.true_divide: "/", np.floor_divide: "//",
                    np.remainder: "%", np.less: "<", np.less_equal: "<=", np.greater: ">", np.greater_equal: ">=",
                    np.equal: "==", np.not_equal: "!="}
_UFUNC_BITWISE = {np.bitwise_and: "&", np.bitwise_or: "|", np.bitwise_xor: "^", np.left_shift: "<<",
                  np.right_shift: ">>"}
_UFUNC_MATH = {np.exp: "exp", np.exp2: "exp2", np.log: "log", np.log2: "log2", np.sqrt: "sqrt", np.sin: "sin",
               np.cos: "cos", np.tanh: "tanh", np.arcsin: "asin", np.arccos: "acos", np.arctan: "atan",
               np.sinh: "sinh", np.cosh: "cosh", np.arcsinh: "asinh", np.arccosh: "acosh", np.arctanh: "atanh",
               np.floor: "floor", np.ceil: "ceil", np.rint: "rint", np.absolute: "abs", np.fabs: "abs",
               np.maximum: "max", np.minimum: "min", np.power: "pow"}


def numpy_ufunc(ufunc, method: str, inputs: tuple, kwargs: dict) -> Expr:
    """A numpy ufunc called on IR values (`np.exp(x)`, `np.float32(2) * x`): the IR expression it means, as a
    compute definition's body has them, or a TypeError saying what to write."""
    if method != "__call__" or kwargs:
        raise TypeError(f"numpy's {ufunc.__name__}.{method}{' with ' + ', '.join(kwargs) if kwargs else ''} does "
                        f"not take IR values: write the expression for one element (td.exp(x), td.max(a, b), ...)")
    inputs = [x[()] if isinstance(x, np.ndarray) and x.ndim == 0 else x for x in inputs]   # a numpy scalar's binop
    arrays = [type(x).__name__ for x in inputs if not isinstance(x, (Expr, bool, int, float, np.generic))]
    if arrays:
        raise TypeError(f"numpy's {ufunc.__name__} of an IR value and a {arrays[0]}: an IR value is one element, "
                        "so it combines with numbers only (index an array's element instead)")
    if ufunc in (np.equal, np.not_equal) and not _elementwise_equality.depth:   # `==` is identity there (__eq__)
        raise TypeError(f"numpy's {ufunc.__name__} of IR values outside a compute definition: write `a == b` or "
                        "`a != b` in a kernel's body")
    if ufunc in _UFUNC_OPERATORS:
        return binary(_UFUNC_OPERATORS[ufunc], *inputs)
    if ufunc in _UFUNC_BITWISE:
        return _bitwise(_UFUNC_BITWISE[ufunc], *inputs)
    if ufunc is np.negative:
        return -inputs[0]
    if ufunc in _UFUNC_MATH:
        return math_expr(_UFUNC_MATH[ufunc], list(inputs))
    raise TypeError(f"numpy's {ufunc.__name__} does not take IR values: write taskdsl's math functions (td.exp, "
                    "td.sqrt, td.max, ...) or operators on them")


def _bitwise(op: str, a, b) -> Expr:
    """`a op b` for & | ^ << >>: & | ^ of two bools their logical and / or / inequality, else bitwise (integers)."""
    is_bool = [x.dtype.is_bool if isinstance(x, Expr) else isinstance(x, (bool, np.bool_)) for x in (a, b)]
    if all(is_bool) and op in ("&", "|", "^"):
        return binary({"&": "and", "|": "or", "^": "!="}[op], a, b)
    for x in (a, b):
        if isinstance(x, Expr) and x.dtype.is_float or isinstance(x, (float, np.floating)):
            raise TypeError(f"'{op}' needs integer or bool operands, got {x.dtype.name if isinstance(x, Expr) else x}")
    result = binary(op, a, b)
    count = b.value if isinstance(b, Const) else b
    if op in ("<<", ">>") and isinstance(count, (int, np.integer)) and not 0 <= count < result.dtype.bits:
        # undefined in C and CUDA (x86 masks the count, PTX clamps it), as a kernel's body refuses it
        raise ValueError(f"shift by {count}: the count must be in 0..{result.dtype.bits - 1} for {result.dtype.name}")
    return result


def _compare(op: str, a: Expr, b: Expr) -> Expr:
    """`a op b` with operands both targets compare alike.

    A float and an int compare in the float type (C's rule, made explicit: numba would compare in
    f64); 16-bit floats compare in f32. Integers of mixed signedness compare exactly, as in Python
    (C would convert the signed one, so that `-1 < 1u` is false): in a signed type wide enough for
    both, or, against a u64, by testing the sign first.
    """
    da, db = a.dtype, b.dtype
    if da.is_float or db.is_float:
        dtype = promote(da, db)
        dtype = f32 if dtype.computes_in_f32 else dtype
    elif da.is_integer and db.is_integer and (da.kind == "uint") != (db.kind == "uint"):
        if u64 in (da, db):
            return _compare_with_u64(op, a, b)
        dtype = i64 if max(da.bits, db.bits) >= 32 else i32
    else:
        return Binary(op, a, b, boolean)
    return Binary(op, convert(a, dtype), convert(b, dtype), boolean)


def _compare_with_u64(op: str, a: Expr, b: Expr) -> Expr:
    """`a op b` where one operand is u64 and the other signed: a negative one is below every u64."""
    negative_left = a.dtype.kind == "int"
    signed = a if negative_left else b
    # the value of `a op b` when the signed operand is negative (then it is the smaller one)
    if_negative = {"<": negative_left, "<=": negative_left, ">": not negative_left, ">=": not negative_left,
                   "==": False, "!=": True}[op]
    return Select(Binary("<", signed, const(0, signed.dtype), boolean), const(if_negative),
                  Binary(op, convert(a, u64), convert(b, u64), boolean), boolean)


def structurally_equal(a, b) -> bool:
    """Whether two expressions compute the same thing (same structure, same variables and buffers)."""
    if a is b:
        return True
    if type(a) is not type(b):
        return False
    if isinstance(a, Const):
        return a.value == b.value and a.dtype == b.dtype
    if isinstance(a, (Var, Buffer, Atomic)):
        return False   # distinct objects: identity was checked above (two atomics are two updates, however alike)
    if isinstance(a, SpecialReg):
        return a.name == b.name and a.axis == b.axis
    if isinstance(a, tuple):
        return len(a) == len(b) and all(structurally_equal(x, y) for x, y in zip(a, b))
    if isinstance(a, Expr):
        return all(structurally_equal(getattr(a, f.name), getattr(b, f.name)) for f in dataclasses.fields(a))
    return a == b


def nan_to_zero_operand(e: Select) -> Expr | None:
    """x where `e` is `x + 0 if x == x else 0`, x and e of f32 or f64 alike (a NaN made 0, -0.0 made 0.0: the graph's
    `nan_to_zero`), else None. The code generators write it as one call, x once: nested, the select's form writes x
    3^depth times (a QDQ epilogue's quantize-dequantize pairs: 27 copies of the first at three levels, 2 s of a 10 s
    compile)."""
    cond, kept, zero = e.cond, e.a, e.b

    def plus_zero(c) -> bool:       # (a -0.0 would keep a -0.0 x, or give -0.0 for a NaN)
        return isinstance(c, Const) and c.value == 0 and math.copysign(1.0, c.value) > 0

    if not (e.dtype.name in ("f32", "f64") and isinstance(cond, Binary) and cond.op == "==" and isinstance(kept, Binary)
            and kept.op == "+" and plus_zero(kept.b) and plus_zero(zero)):
        return None
    x = cond.a
    return x if x.dtype == e.dtype and structurally_equal(x, cond.b) and structurally_equal(x, kept.a) else None


def evaluate_int(e: Expr, sizes: dict) -> int:
    """The value of an integer expression over size symbols (`sizes`: name -> int)."""
    if isinstance(e, Const):
        return int(e.value)
    if isinstance(e, Var) and e.kind == "size":
        return int(sizes[e.name])
    if isinstance(e, Binary) and e.op in ("+", "-", "*", "//", "%"):
        a, b = evaluate_int(e.a, sizes), evaluate_int(e.b, sizes)
        return {"+": a + b, "-": a - b, "*": a * b, "//": a // b if b else 0, "%": a % b if b else 0}[e.op]
    raise TypeError(f"cannot evaluate {type(e).__name__} from sizes")


MATH_ARITY = {"max": 2, "min": 2, "pow": 2, "fma": 3}


def math_expr(name: str, args: list) -> Expr:
    """The typed IR call of math function `name` on `args` (IR values and Python numbers).

    Types promote as in arithmetic; transcendental functions of integers, and all math on
    16-bit floats, are computed in f32; max/min/abs keep integer types.
    """
    arity = MATH_ARITY.get(name, 1)
    if len(args) != arity:
        raise TypeError(f"td.{name}() takes {arity} argument{'s' if arity > 1 else ''}, got {len(args)}")
    dtype = functools.reduce(promote, [a.dtype for a in args if isinstance(a, Expr)])
    for a in args:   # an int literal the typed arguments cannot hold takes part with its own type, as in arithmetic
        if type(a) is int and dtype.is_integer and not dtype.holds(a):
            dtype = promote(dtype, const(a).dtype)
    if any(isinstance(a, float) for a in args) and not dtype.is_float:
        dtype = f32   # a Python float with an integer value: as in arithmetic, the float wins
    if (name not in ("max", "min", "abs") and not dtype.is_float) or (dtype.computes_in_f32):
        dtype = f32
    if dtype.is_bool or (dtype.is_integer and dtype.bits < 32):
        dtype = i32       # C's integer promotion, as in arithmetic (abs(i8(-128)) is 128)
    exprs = [convert(as_expr(a, dtype), dtype) for a in args]
    if name == "abs" and dtype.kind == "uint":
        return exprs[0]     # C++ has no abs of unsigned types (an ambiguous overload)
    return Call(name, tuple(exprs), dtype)
