"""The errors of ONNX import: what the user can hit, each with what to do about it."""
from __future__ import annotations


class OnnxImportError(ValueError):
    """The model cannot be imported: it is malformed, or uses something the importer does not support."""


class UnsupportedOnnxError(OnnxImportError):
    """The model is valid ONNX but uses an operator, attribute, data type or opset the importer does not support."""


class ConstantRequiredError(UnsupportedOnnxError):
    """A value that fixes a shape (Reshape's shape, Slice's starts, ...) depends on graph inputs.

    `inputs` names those graph inputs: `from_onnx(model, constants={name: value})` fixes them.
    """

    def __init__(self, message: str, inputs: list):
        super().__init__(message)
        self.inputs = list(inputs)
