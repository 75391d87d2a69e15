"""One ONNX node as converters see it: typed attributes, input tensors, constant inputs, and errors."""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import onnx
from onnx import helper

from ..graph import topological_nodes
from ..passes.fold_constants import constant_value
from ...runtime.arrays import contiguous
from ..tensor import Tensor, constant
from .errors import ConstantRequiredError, OnnxImportError, UnsupportedOnnxError


@dataclass(frozen=True)
class Converter:
    """How one ONNX operator becomes graph ops: `fn(node)` returns one Tensor (or None) per node output."""

    fn: Callable
    attrs: frozenset


CONVERTERS: dict = {}           # the default ONNX domain's, by operator
DOMAIN_CONVERTERS: dict = {}    # other domains' (onnxruntime's com.microsoft): domain -> operator -> Converter


@dataclass(frozen=True)
class TensorSequence:
    """An ONNX sequence, known at import: its tensors in order (graph Tensors) and their element type (a numpy
    dtype name, which an empty sequence keeps)."""

    items: tuple
    dtype: str


@dataclass(frozen=True)
class NoElement:
    """An ONNX optional without a value (`Optional` of no input)."""


@dataclass(frozen=True)
class FourBitTensor:
    """A constant of ONNX's 4-bit integer types (INT4, UINT4: quantized weights), its values held in an 8-bit
    `tensor`. Only DequantizeLinear reads it: elsewhere 4-bit values would wrap and saturate as 8-bit ones do."""

    tensor: Tensor


def kind_of(value) -> str:
    """What an imported value is, for errors: a tensor, a sequence, an empty optional or a 4-bit tensor."""
    kinds = {TensorSequence: "sequence", NoElement: "empty optional", FourBitTensor: "4-bit integer tensor"}
    return kinds.get(type(value), "tensor")


def converts(*op_types: str, attrs: tuple = (), domain: str = "") -> Callable:
    """Register the decorated function as the converter of `op_types` (of `domain`; default: ONNX's), accepting
    attributes `attrs`."""
    table = CONVERTERS if domain == "" else DOMAIN_CONVERTERS.setdefault(domain, {})

    def register(fn):
        for op_type in op_types:
            table[op_type] = Converter(fn, frozenset(attrs))
        return fn
    return register


class Node:
    """An ONNX node being converted: `env` maps tensor names to graph Tensors."""

    def __init__(self, proto: onnx.NodeProto, env: dict, opset: int):
        self.proto, self.env, self.opset = proto, env, opset
        self.op_type = proto.op_type
        self.name = proto.name or (proto.output[0] if proto.output else "?")

    def error(self, message: str, cls=UnsupportedOnnxError) -> OnnxImportError:
        """An import error naming this node and its operator."""
        return cls(f"node {self.name!r} ({self.op_type}): {message}")

    # ------------------------------------------------------------------ attributes
    def attr(self, name: str, default=None):
        """The attribute's Python value (ints, floats, strings, lists, numpy arrays for tensors), or `default`."""
        for a in self.proto.attribute:
            if a.name == name:
                if a.type == onnx.AttributeProto.TENSOR:
                    return to_array(a.t, f"attribute {name!r} of node {self.name!r}")
                value = helper.get_attribute_value(a)
                if a.type == onnx.AttributeProto.STRING:
                    return value.decode()
                if a.type == onnx.AttributeProto.STRINGS:
                    return [v.decode() for v in value]
                if a.type in (onnx.AttributeProto.INTS, onnx.AttributeProto.FLOATS):
                    return list(value)
                if a.type in (onnx.AttributeProto.INT, onnx.AttributeProto.FLOAT):
                    return value
                raise self.error(f"attribute {name!r} has type {onnx.AttributeProto.AttributeType.Name(a.type)}, "
                                 "which is not supported")
        return default

    def flag(self, name: str, default: int = 0) -> bool:
        """A 0/1 attribute (keepdims, transA, ...) as a bool; any other value is an OnnxImportError."""
        value = self.attr(name, default)
        if value not in (0, 1):
            raise self.error(f"attribute {name!r} must be 0 or 1, got {value!r}", OnnxImportError)
        return bool(value)

    def has_attr(self, name: str) -> bool:
        return any(a.name == name for a in self.proto.attribute)

    # ------------------------------------------------------------------ inputs and outputs
    @property
    def num_inputs(self) -> int:
        return len(self.proto.input)

    def value(self, k: int, required: bool = True):
        """Input k as imported: a graph Tensor, a TensorSequence, a NoElement or a FourBitTensor (None if it is
        absent and not required)."""
        name = self.proto.input[k] if k < len(self.proto.input) else ""
        if not name:
            if required:
                raise self.error(f"input {k} is required but missing", OnnxImportError)
            return None
        if name not in self.env:
            raise self.error(f"input {name!r} is not produced by any earlier node, initializer or graph input",
                             OnnxImportError)
        return self.env[name]

    def input(self, k: int, required: bool = True) -> Tensor | None:
        """Input k as a graph Tensor (None if it is absent and not required)."""
        return self._of_kind(k, required, "tensor")

    def sequence(self, k: int, required: bool = True) -> TensorSequence | None:
        """Input k as a TensorSequence (None if it is absent and not required)."""
        return self._of_kind(k, required, "sequence")

    def _of_kind(self, k: int, required: bool, kind: str):
        value = self.value(k, required)
        if value is not None and kind_of(value) != kind:
            raise self.error(f"input {k} ({self.proto.input[k]!r}) is a{'n' * (kind_of(value)[0] == 'e')} "
                             f"{kind_of(value)}, where the operator takes a {kind}", OnnxImportError)
        return value

    def inputs(self) -> list:
        """Every present input, in order."""
        return [self.input(k) for k in range(len(self.proto.input)) if self.proto.input[k]]

    def const(self, k: int, required: bool = True) -> np.ndarray | None:
        """The value of input k, which must be computable at import time (it fixes a shape or a parameter)."""
        t = self.input(k, required)
        return None if t is None else self.value_of(t, f"input {self.proto.input[k]!r}")

    def const_int(self, k: int, what: str, required: bool = False) -> int | None:
        """Input k, one constant integer (`what` names it in the error; None where it is absent and may be)."""
        value = self.const(k, required)
        if value is None:
            return None
        value = np.asarray(value)
        if value.size != 1 or value.dtype.kind not in "iu":
            raise self.error(f"{what} must be one integer, got {value.dtype}{list(value.shape)}", OnnxImportError)
        return int(value.reshape(-1)[0])

    def value_of(self, t: Tensor, what: str) -> np.ndarray:
        """The value of `t` (`what` names it in the error), which must be computable at import time."""
        value = constant_value(t)
        if value is None:
            sources = _graph_inputs_of(t)
            raise ConstantRequiredError(
                f"node {self.name!r} ({self.op_type}): {what} must be a constant (it fixes a shape or a parameter) "
                f"but depends on graph input(s) {', '.join(sources)}; fix their values with "
                f"from_onnx(model, constants={{{sources[0]!r}: value}}) or make them initializers", sources)
        return value

    def wanted(self, k: int) -> bool:
        """Whether output k is present (optional outputs may be left out with an empty name)."""
        return k < len(self.proto.output) and bool(self.proto.output[k])


def _graph_inputs_of(t: Tensor) -> list:
    """Names of the graph inputs a tensor's value depends on."""
    if t.is_input:
        return [t.name]
    names = []
    for op in topological_nodes([t]):
        names += [x.name for x in op.inputs if x.is_input and x.name not in names]
    return names


ONNX_DTYPES = {onnx.TensorProto.FLOAT: "float32", onnx.TensorProto.DOUBLE: "float64",
               onnx.TensorProto.FLOAT16: "float16", onnx.TensorProto.INT8: "int8", onnx.TensorProto.INT16: "int16",
               onnx.TensorProto.INT32: "int32", onnx.TensorProto.INT64: "int64", onnx.TensorProto.UINT8: "uint8",
               onnx.TensorProto.UINT16: "uint16", onnx.TensorProto.UINT32: "uint32", onnx.TensorProto.UINT64: "uint64",
               onnx.TensorProto.BOOL: "bool", onnx.TensorProto.BFLOAT16: "bfloat16",
               onnx.TensorProto.FLOAT8E4M3FN: "float8_e4m3fn", onnx.TensorProto.FLOAT8E5M2: "float8_e5m2"}


def dtype_of(elem_type: int, what: str) -> str:
    """The dtype name of an ONNX element type (UnsupportedOnnxError for types the DSL has no type for)."""
    if elem_type not in ONNX_DTYPES:
        name = onnx.TensorProto.DataType.Name(elem_type) if elem_type in onnx.TensorProto.DataType.values() \
            else str(elem_type)
        supported = ", ".join(onnx.TensorProto.DataType.Name(t) for t in ONNX_DTYPES)
        raise UnsupportedOnnxError(f"{what}: data type {name} is not supported; supported: {supported}")
    return ONNX_DTYPES[elem_type]


FOUR_BIT_TYPES = {onnx.TensorProto.INT4: np.int8, onnx.TensorProto.UINT4: np.uint8}


def imported_constant(proto: onnx.TensorProto, what: str, name: str | None = None):
    """A TensorProto (an initializer, a Constant's value) as a constant Tensor, or for the 4-bit integer types as
    a FourBitTensor of its values."""
    if proto.data_type in FOUR_BIT_TYPES:
        values = onnx.numpy_helper.to_array(proto).astype(FOUR_BIT_TYPES[proto.data_type])
        return FourBitTensor(constant(values, name=name))
    return constant(to_array(proto, what), name=name)


def to_array(proto: onnx.TensorProto, what: str) -> np.ndarray:
    """A TensorProto's value as a contiguous numpy array of a supported dtype."""
    dtype = dtype_of(proto.data_type, what)
    try:
        value = onnx.numpy_helper.to_array(proto)
    except Exception as e:   # truncated raw data, missing external data, ...
        raise OnnxImportError(f"{what}: cannot read the tensor data ({e})") from e
    return contiguous(value, dtype)
