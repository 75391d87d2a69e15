"""Symbolic tensors of the graph layer: a static shape, a dtype, and either a constant value or a producer.

    x = graph.input("x", (1, 3, 32, 32), "float32")     # a graph input
    w = graph.constant(np.ones((8, 3, 3, 3), np.float32))  # a constant (a weight)
    y = ops.conv2d(x, w)                                 # produced by an Operator

Python operators on tensors (`+ - * / ** @`, unary `-`, `.reshape`, `.T`) trace ops.
"""
from __future__ import annotations

import math

import numpy as np

from ..compute import numpy_dtype
from ..ir.types import as_dtype
from ..runtime.arrays import contiguous

def as_shape(shape, what: str = "shape") -> tuple:
    """A shape as a tuple of non-negative Python ints (ValueError otherwise)."""
    if isinstance(shape, (int, np.integer)):
        shape = (shape,)
    dims = None if isinstance(shape, str) or not hasattr(shape, "__iter__") else tuple(shape)   # ("2,3": no dims)
    if dims is None or any(isinstance(d, bool) or not isinstance(d, (int, np.integer)) or d < 0 for d in dims):
        raise ValueError(f"{what} must be a tuple of non-negative ints, got {shape!r}")
    return tuple(int(d) for d in dims)


class Tensor:
    """A graph value: shape and dtype are static; `value` is set for constants, `producer` for op outputs."""

    def __init__(self, shape, dtype, *, name: str | None = None, value: np.ndarray | None = None,
                 producer=None, index: int = 0):
        self.shape = as_shape(shape)
        self.dtype = as_dtype(dtype)
        self.name = name
        self.value = value
        self.producer = producer      # the Operator that computes this tensor (None for inputs and constants)
        self.index = index            # which output of the producer it is

    @property
    def ndim(self) -> int:
        """The number of dimensions."""
        return len(self.shape)

    @property
    def size(self) -> int:
        """The number of elements."""
        return math.prod(self.shape)

    @property
    def nbytes(self) -> int:
        """The size of the tensor's data in bytes."""
        return self.size * self.numpy_dtype.itemsize

    @property
    def numpy_dtype(self) -> np.dtype:
        """The numpy dtype of the tensor's arrays."""
        return np.dtype(numpy_dtype(self.dtype))

    @property
    def is_constant(self) -> bool:
        """Whether the tensor holds a constant value."""
        return self.value is not None

    @property
    def is_input(self) -> bool:
        """Whether this is a graph input: neither a constant nor computed by an operator."""
        return self.value is None and self.producer is None

    def type_str(self) -> str:
        """`f32[1, 3, 32, 32]`."""
        return f"{self.dtype.name}[{', '.join(str(d) for d in self.shape)}]"

    def __repr__(self) -> str:
        kind = "constant" if self.is_constant else "input" if self.is_input else self.producer.name
        return f"<Tensor {self.name or '?'}: {self.type_str()} ({kind})>"

    # ------------------------------------------------------------------ tracing sugar
    # numpy's operators on an array and a Tensor give way to the Tensor's (else `array + x` is an object array of
    # one traced add per element)
    __array_ufunc__ = None

    def __add__(self, o): return _ops().add(self, o)
    def __radd__(self, o): return _ops().add(o, self)
    def __sub__(self, o): return _ops().sub(self, o)
    def __rsub__(self, o): return _ops().sub(o, self)
    def __mul__(self, o): return _ops().mul(self, o)
    def __rmul__(self, o): return _ops().mul(o, self)
    def __truediv__(self, o): return _ops().div(self, o)
    def __rtruediv__(self, o): return _ops().div(o, self)
    def __pow__(self, o): return _ops().pow(self, o)
    def __rpow__(self, o): return _ops().pow(o, self)
    def __matmul__(self, o): return _ops().matmul(self, o)
    def __rmatmul__(self, o): return _ops().matmul(o, self)
    def __neg__(self): return _ops().neg(self)
    __hash__ = object.__hash__

    def reshape(self, *shape):
        """ops.reshape(self, shape); one dim may be -1."""
        return _ops().reshape(self, shape[0] if len(shape) == 1 and np.ndim(shape[0]) == 1 else shape)

    def transpose(self, *perm):
        """ops.transpose(self, perm) (no perm: reverse the axes)."""
        return _ops().transpose(self, perm[0] if len(perm) == 1 and np.ndim(perm[0]) == 1 else perm or None)

    @property
    def T(self):  # noqa: N802 - numpy's name
        """ops.transpose(self): the axes reversed."""
        return _ops().transpose(self)


def _ops():
    from . import ops  # ops builds on tensors: imported when first traced
    return ops


def input(name: str, shape, dtype="float32") -> Tensor:
    """A graph input called `name` with a static shape and dtype."""
    if not isinstance(name, str) or not name:
        raise ValueError(f"a graph input needs a non-empty name, got {name!r}")
    return Tensor(as_shape(shape, f"shape of input {name!r}"), dtype, name=name)


def constant(value, dtype=None, name: str | None = None) -> Tensor:
    """A constant tensor holding a copy of `value` (an array or a number), converted to `dtype` if given."""
    if dtype is None:
        array = np.asarray(value)
        if not isinstance(value, (np.ndarray, np.generic)):
            array = array.astype(_python_default(array))
    else:
        try:
            array = np.asarray(value, dtype=numpy_dtype(as_dtype(dtype)))
        except OverflowError:
            raise ValueError(f"the constant {value!r} does not fit {as_dtype(dtype).name}") from None
    if array.dtype.kind == "c":
        raise TypeError(f"complex constants are not supported, got {value!r}")
    array = contiguous(array)
    if not array.flags.writeable or (isinstance(value, np.ndarray) and np.may_share_memory(array, value)):
        # a snapshot: kernels, packed weights and folded values all see the value as it was given (a later
        # change of the caller's array reached some and not others); and numba types read-only arrays apart,
        # so a read-only weight (an ONNX initializer is one) would compile each kernel once more for that type
        array = array.copy()
    return Tensor(array.shape, as_dtype(array.dtype), name=name, value=array)


def _python_default(array: np.ndarray) -> np.dtype:
    """The dtype of a constant given as Python numbers (or lists of them): f32 and i32, as in the DSL; i64 for
    ints i32 cannot hold (numpy's choice); numpy's for the rest."""
    if array.dtype == np.float64:
        return np.dtype(np.float32)
    if array.dtype == np.int64 and (array.size == 0 or np.iinfo(np.int32).min <= array.min() <= array.max()
                                    <= np.iinfo(np.int32).max):
        return np.dtype(np.int32)
    return array.dtype


def as_tensor(value, like: Tensor | None = None) -> Tensor:
    """`value` as a Tensor: tensors as they are, numbers adopt `like`'s dtype, arrays become constants."""
    if isinstance(value, Tensor):
        return value
    if isinstance(value, (bool, int, float, np.number, np.bool_)) and like is not None:
        return constant(number_for(value, like), like.dtype)
    if isinstance(value, (bool, int, float, np.number, np.bool_, np.ndarray, list, tuple)):
        return constant(value)
    raise TypeError(f"expected a graph Tensor, a number or an array, got {type(value).__name__}")


def number_for(value, like: Tensor, what: str = "the number"):
    """`value`, a number combined with the tensor `like`, checked to be one of its dtype (ops.cast says what to do
    otherwise): a float tensor takes any real, an integer one integers in its range, a bool one bools."""
    if isinstance(value, (complex, np.complexfloating)) or \
            not isinstance(value, (bool, int, float, np.number, np.bool_)):
        raise TypeError(f"{what} must be a real number, got {value!r}")
    boolean = isinstance(value, (bool, np.bool_))
    integer = boolean or isinstance(value, (int, np.integer))
    fits = like.dtype.is_float or (like.dtype.is_integer and integer) or (like.dtype.is_bool and boolean)
    if not fits:
        raise TypeError(f"cannot combine {what} {value!r} with a {like.dtype.name} tensor; "
                        "cast the tensor first with ops.cast")
    if like.dtype.is_float and not integer and like.dtype.overflows(float(value)):
        raise ValueError(f"{what} {value!r} does not fit the {like.dtype.name} tensor it is combined with (it would "
                         "round to inf); cast the tensor first with ops.cast")
    if like.dtype.is_integer:
        info = np.iinfo(numpy_dtype(like.dtype))
        if not info.min <= int(value) <= info.max:
            raise ValueError(f"{what} {value!r} does not fit the {like.dtype.name} tensor it is combined with "
                             f"({info.min}..{info.max}); cast the tensor first with ops.cast")
    return value
