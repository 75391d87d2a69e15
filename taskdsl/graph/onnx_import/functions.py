"""Operators that ONNX defines as functions of other operators and that have no converter of their own.

A node without a converter of its own, whose schema has a function body for the model's opset, is imported as that
body's nodes, as onnxruntime runs an operator it has no kernel for. A context-dependent body (one built for the
node's input types) is built for the types and shapes the node's inputs have. onnx's inliner expands the body for
the node (its attributes substituted, its names made unique), and its nodes are then converted in a scope of their
own, at the opset the body is written for. EXPANDED_OPERATORS are those imported so (onnx's node cases check them);
the tests also take GroupNormalization's and MeanVarianceNormalization's converters away to check this path against
onnxruntime.
"""
from __future__ import annotations

import onnx
import onnx.inliner
from onnx import helper

from .errors import UnsupportedOnnxError
from .node import Node

_CALLS = "taskdsl.expanded"    # the domain the body is a local function of while the inliner expands it
# the operators without a converter whose bodies import (onnx's node cases of each pass); Bernoulli's body draws
# random numbers and SequenceMap's maps sequences, which the importer refuses
EXPANDED_OPERATORS = ("CausalConvWithState", "LinearAttention", "SwiGLU")


def _schema(node: Node) -> onnx.defs.OpSchema | None:
    try:
        return onnx.defs.get_schema(node.op_type, node.opset, "")
    except onnx.defs.SchemaError:
        return None


def function_body(node: Node) -> onnx.FunctionProto | None:
    """The function body the schema of `node`'s operator gives for its opset, or None."""
    schema = _schema(node)
    if schema is None:
        return None
    versions = [v for v in schema.function_opset_versions if v <= node.opset]
    if versions:
        body = schema.get_function_with_opset_version(max(versions))
    else:
        versions = [v for v in schema.context_dependent_function_opset_versions if v <= node.opset]
        if not versions:
            return None
        types = [_type_of(node, k).SerializeToString() for k in range(len(node.proto.input))]
        body = schema.get_context_dependent_function_with_opset_version(max(versions), node.proto.SerializeToString(),
                                                                         types)
    return onnx.FunctionProto.FromString(body) if isinstance(body, bytes) else body


def import_function(node: Node, body: onnx.FunctionProto) -> list:
    """The outputs of `node` computed by the nodes of its function `body`, converted in a scope of their own."""
    opset = next((o.version for o in body.opset_import if o.domain in ("", "ai.onnx")), node.opset)
    body = onnx.FunctionProto.FromString(body.SerializeToString())
    body.domain, body.name = _CALLS, node.op_type
    call = onnx.NodeProto.FromString(node.proto.SerializeToString())
    call.domain = _CALLS
    # the body reads the schema's defaults of the attributes the node leaves out (MeanVarianceNormalization's axes)
    given = {a.name for a in call.attribute}
    call.attribute.extend(a.default_value for name, a in _schema(node).attributes.items()
                          if name not in given and a.default_value.name)
    graph = helper.make_graph([call], "call", [], [])
    model = helper.make_model(graph, functions=[body], opset_imports=[helper.make_opsetid("", opset),
                                                                       helper.make_opsetid(_CALLS, 1)])
    scope = dict(node.env)
    from .model import convert_node     # (model imports this module to expand operators it has no converter for)
    try:
        for proto in onnx.inliner.inline_local_functions(model).graph.node:
            convert_node(proto, scope, opset)
    except UnsupportedOnnxError as e:
        raise node.error(f"operator {node.op_type} is not supported (it has no converter, and the nodes ONNX defines "
                         f"it as could not be imported: {e})") from e
    return [scope.get(name) if name else None for name in node.proto.output]


def _type_of(node: Node, k: int) -> onnx.TypeProto:
    """Input k's tensor type (element type and shape), an empty type where the input is absent."""
    t = node.input(k, required=False) if node.proto.input[k] else None
    if t is None:
        return onnx.TypeProto()
    return helper.make_tensor_type_proto(helper.np_dtype_to_tensor_dtype(t.numpy_dtype), list(t.shape))
