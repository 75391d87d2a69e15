"""The converter of If: shapes are static, so its condition must be known at import time, and the branch it
chooses is imported in its place.

Exporters emit If where the model's Python code branched on a shape (`if x.dim() == 3:`); with the shapes fixed,
that condition folds to a constant. A condition that depends on a graph input's values raises the
ConstantRequiredError that names the inputs to fix with `from_onnx(constants=...)`. The chosen branch's nodes are
converted in a scope of their own, which sees the enclosing graph's tensors (ONNX's outer-scope references) and
the branch's initializers; its outputs are the If's outputs, in order.
"""
from __future__ import annotations

import numpy as np
import onnx

from ..tensor import constant
from .errors import OnnxImportError
from .node import Node, converts, to_array


@converts("If", attrs=("then_branch", "else_branch"))
def if_node(node: Node) -> list:
    """If with a condition computable at import: the outputs of the branch it chooses."""
    condition = np.asarray(node.const(0))
    if condition.size != 1:
        raise node.error(f"the condition must hold one element, got shape {condition.shape}", OnnxImportError)
    branch = _graph_attribute(node, "then_branch" if condition.reshape(-1)[0] else "else_branch")
    if len(branch.output) != len(node.proto.output):
        raise node.error(f"the branch {branch.name!r} has {len(branch.output)} outputs, the node "
                         f"{len(node.proto.output)}", OnnxImportError)
    scope = dict(node.env)      # the enclosing graph's tensors; what the branch defines stays in it
    scope.update({init.name: constant(to_array(init, f"initializer {init.name!r} of branch {branch.name!r}"),
                                      name=init.name) for init in branch.initializer})
    from .model import convert_node     # (model imports this module to register its converter)
    for proto in branch.node:
        convert_node(proto, scope, node.opset)
    missing = [vi.name for vi in branch.output if vi.name not in scope]
    if missing:
        raise node.error(f"the branch {branch.name!r} does not produce its outputs {missing}", OnnxImportError)
    return [scope[vi.name] for vi in branch.output]


def _graph_attribute(node: Node, name: str) -> onnx.GraphProto:
    for a in node.proto.attribute:
        if a.name == name and a.type == onnx.AttributeProto.GRAPH:
            return a.g
    raise node.error(f"the graph attribute {name!r} is missing", OnnxImportError)
