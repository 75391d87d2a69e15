"""The graph layer: build models from operators (by tracing Python code or importing ONNX), optimize
them with graph passes, and run them as kernels.

    import taskdsl.graph as tg
    from taskdsl.graph import ops
    x = tg.input("x", (1, 3, 32, 32))
    y = ops.relu(ops.conv2d(x, tg.constant(w), padding=1))
    g = tg.Graph([x], [y]); print(g)
    cg = g.compile(); out, = cg(x_array)
    g2 = tg.from_onnx("model.onnx"); out, = g2(x_array)
"""
from . import ops, passes
from .executor import CompiledGraph
from .graph import Graph, trace
from .onnx_import import OnnxImportError, UnsupportedOnnxError, from_onnx
from .operator import Operator
from .tensor import Tensor, as_dtype, constant, input

__all__ = ["Tensor", "Operator", "Graph", "CompiledGraph", "from_onnx", "ops", "passes", "trace", "input", "constant",
           "as_dtype", "OnnxImportError", "UnsupportedOnnxError"]
