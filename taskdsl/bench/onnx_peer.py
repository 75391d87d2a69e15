"""onnxruntime as a benchmark's cpu peer: a session running one ONNX graph."""
from __future__ import annotations


def session_of(graph, opset: int = 17):
    """An onnxruntime CPU session of the ONNX `graph` (a GraphProto) at the default domain's `opset`."""
    import onnxruntime as ort
    from onnx import helper
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
    model.ir_version = 8    # what onnxruntime builds older than the onnx package still read
    return ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
