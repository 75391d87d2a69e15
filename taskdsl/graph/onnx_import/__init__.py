"""ONNX import: `from_onnx(model_or_path)` builds a Graph from an ONNX model (opsets 11-28)."""
from .errors import ConstantRequiredError, OnnxImportError, UnsupportedOnnxError
from .model import MAX_OPSET, MIN_OPSET, from_onnx
from .node import CONVERTERS

SUPPORTED_OPERATORS = tuple(sorted(CONVERTERS))

__all__ = ["from_onnx", "OnnxImportError", "UnsupportedOnnxError", "ConstantRequiredError", "SUPPORTED_OPERATORS",
           "MIN_OPSET", "MAX_OPSET"]
