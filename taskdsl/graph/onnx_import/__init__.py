"""ONNX import: `from_onnx(model_or_path)` builds a Graph from an ONNX model (opsets 11-28)."""
from .errors import ConstantRequiredError, OnnxImportError, UnsupportedOnnxError
from .functions import EXPANDED_OPERATORS
from .model import CONVERTED_OPERATORS, MAX_OPSET, MIN_OPSET, from_onnx
from .node import CONVERTERS

# what a model may hold: operators with a converter, those imported as their ONNX function bodies, and those of
# opsets before 11 that onnx's version converter replaces
SUPPORTED_OPERATORS = tuple(sorted({*CONVERTERS, *EXPANDED_OPERATORS, *CONVERTED_OPERATORS}))

__all__ = ["from_onnx", "OnnxImportError", "UnsupportedOnnxError", "ConstantRequiredError", "SUPPORTED_OPERATORS",
           "EXPANDED_OPERATORS", "CONVERTED_OPERATORS", "MIN_OPSET", "MAX_OPSET"]
