"""ONNX import: `from_onnx(model_or_path)` builds a Graph from an ONNX model (opsets 11-28)."""
from .errors import ConstantRequiredError, OnnxImportError, UnsupportedOnnxError
from .model import MAX_OPSET, MIN_OPSET, from_onnx
from .functions import FUNCTION_OPERATORS
from .node import CONVERTERS

# the operators with a converter, and those imported as the nodes of their ONNX function bodies
SUPPORTED_OPERATORS = tuple(sorted(set(CONVERTERS) | set(FUNCTION_OPERATORS)))

__all__ = ["from_onnx", "OnnxImportError", "UnsupportedOnnxError", "ConstantRequiredError", "SUPPORTED_OPERATORS",
           "MIN_OPSET", "MAX_OPSET"]
