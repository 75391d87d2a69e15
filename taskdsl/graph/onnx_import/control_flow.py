"""The converters of If, Loop and Scan: shapes are static, so what decides which nodes run must be known at
import time, and the nodes that run are imported in place of the control flow.

Exporters emit If where the model's Python code branched on a shape (`if x.dim() == 3:`), and Loop for a Python
loop over a range; with the shapes fixed, the condition and the trip count fold to constants. One that depends on a
graph input's values raises the ConstantRequiredError that names the inputs to fix with `from_onnx(constants=...)`.
If imports the branch it chooses; Loop and Scan are unrolled: the body is imported once per iteration, with that
iteration's values bound to its inputs (a Loop's iteration number, condition and loop-carried values; a Scan's
states and its scan inputs' slices), and the scan outputs stacked. Each import of a subgraph has a scope of its
own, which sees the enclosing graph's tensors (ONNX's outer-scope references) and the subgraph's initializers.
"""
from __future__ import annotations

import numpy as np
import onnx

from .. import ops
from ..ops.axes import normalize_axis
from ..tensor import Tensor, constant
from .errors import OnnxImportError
from .node import Node, converts, imported_constant, kind_of

MAX_UNROLLED_NODES = 20_000     # a Loop's body nodes times its iterations: past it, the loop is refused


@converts("If", attrs=("then_branch", "else_branch"))
def if_node(node: Node) -> list:
    """If with a condition computable at import: the outputs of the branch it chooses."""
    condition = _scalar(node, node.const(0), "the condition")
    branch = graph_attribute(node, "then_branch" if condition else "else_branch")
    if len(branch.output) != len(node.proto.output):
        raise node.error(f"the branch {branch.name!r} has {len(branch.output)} outputs, the node "
                         f"{len(node.proto.output)}", OnnxImportError)
    return import_subgraph(node, branch, [])


@converts("Loop", attrs=("body",))
def loop(node: Node) -> list:
    """Loop with a trip count and a condition computable at import (each iteration's too): the body unrolled, the
    final loop-carried values and the scan outputs (each iteration's value stacked along a new first axis)."""
    body = graph_attribute(node, "body")
    trips, given = node.const(0, required=False), node.const(1, required=False)     # None where absent
    carried = [node.value(k) for k in range(2, node.num_inputs)]      # (tensors, sequences or optionals)
    scanned = len(body.output) - 1 - len(carried)
    if len(body.input) != 2 + len(carried) or scanned < 0:
        raise node.error(f"the body takes {len(body.input)} inputs and gives {len(body.output)} outputs; with "
                         f"{len(carried)} loop-carried values it must take {2 + len(carried)} and give at least "
                         f"{1 + len(carried)}", OnnxImportError)
    if trips is None and given is None:
        raise node.error("a loop with neither a trip count nor a condition never ends", OnnxImportError)
    trips = None if trips is None else int(_scalar(node, trips, "the trip count M"))
    condition = True if given is None else bool(_scalar(node, given, "the condition"))
    scans: list = [[] for _ in range(scanned)]
    iteration = 0
    while condition and (trips is None or iteration < trips):
        # a for-loop's length is known before it is unrolled
        runs = trips if given is None else iteration + 1
        if runs * len(body.node) > MAX_UNROLLED_NODES:
            raise node.error(f"the loop's {runs if given is None else f'more than {iteration}'} iterations of its "
                             f"{len(body.node)} body nodes are more than the {MAX_UNROLLED_NODES} nodes it may unroll "
                             "into")
        bound = [constant(np.array(iteration, np.int64)), constant(np.array(condition)), *carried]
        outputs = import_subgraph(node, body, bound)
        carried = outputs[1:1 + len(carried)]
        for k, (values, value) in enumerate(zip(scans, outputs[1 + len(carried):])):
            if not isinstance(value, Tensor):
                raise node.error(f"scan output {k} is a {kind_of(value)}; scan outputs must be tensors",
                                 OnnxImportError)
            values.append(ops.unsqueeze(value, 0))
        if given is not None:      # without a condition input, the body's condition output is ignored (the spec)
            condition = bool(_scalar(node, node.value_of(outputs[0], f"the condition of iteration {iteration}"),
                                     f"the condition of iteration {iteration}"))
        iteration += 1
    if scans and not iteration:
        raise node.error("a loop that runs no iteration has scan outputs of no known shape; it is not supported")
    return carried + [ops.concat(values, 0) for values in scans]


@converts("Scan", attrs=("body", "num_scan_inputs", "scan_input_axes", "scan_input_directions", "scan_output_axes",
                         "scan_output_directions"))
def scan(node: Node) -> list:
    """Scan (opsets 9 on), unrolled over the scan inputs' length: each iteration binds the state variables and
    the scan inputs' slices along their axes (from the end where their direction is 1); the final states, and each
    scan output's values stacked along its axis (in reverse where its direction is 1)."""
    body = graph_attribute(node, "body")
    present = node.inputs()
    m = node.attr("num_scan_inputs")
    if not 0 < m <= len(present) or len(body.input) != len(present) or len(body.output) < len(present) - m:
        raise node.error(f"num_scan_inputs={m} does not fit the node's {len(present)} inputs and the body's "
                         f"{len(body.input)} inputs and {len(body.output)} outputs", OnnxImportError)
    states, sequences = present[:len(present) - m], present[len(present) - m:]
    produced = len(body.output) - len(states)
    in_axes = [normalize_axis(a, t.ndim, f"node {node.name!r} (Scan): scan_input_axes")
               for a, t in zip(node.attr("scan_input_axes", [0] * m), sequences)]
    in_reversed, out_reversed = (node.attr(f"scan_{kind}_directions", [0] * n) for kind, n in
                                 (("input", m), ("output", produced)))
    lengths = {t.shape[a] for t, a in zip(sequences, in_axes)}
    if len(lengths) != 1:
        raise node.error(f"the scan inputs have lengths {sorted(lengths)} along their axes; they must agree",
                         OnnxImportError)
    length = lengths.pop()
    if length * len(body.node) > MAX_UNROLLED_NODES:
        raise node.error(f"the scan's {length} iterations of its {len(body.node)} body nodes are more than the "
                         f"{MAX_UNROLLED_NODES} nodes it may unroll into")
    if produced and not length:
        raise node.error("a scan of no iteration has scan outputs of no known shape; it is not supported")
    values: list = [[] for _ in range(produced)]
    for step in range(length):
        slices = [ops.squeeze(ops.slice(t, [k], [k + 1], [axis]), axis) for t, axis, k in
                  zip(sequences, in_axes, [length - 1 - step if backwards else step for backwards in in_reversed])]
        outputs = import_subgraph(node, body, states + slices)
        states = outputs[:len(states)]
        for stacked, value in zip(values, outputs[len(states):]):
            stacked.append(value)
    out_axes = node.attr("scan_output_axes", [0] * produced)
    results = []
    for stacked, axis, backwards in zip(values, out_axes, out_reversed):
        axis = normalize_axis(axis, stacked[0].ndim + 1, f"node {node.name!r} (Scan): scan_output_axes")
        results.append(ops.concat([ops.unsqueeze(v, axis) for v in (stacked[::-1] if backwards else stacked)], axis))
    return states + results


def _scalar(node: Node, value, what: str):
    """The one element of `value` (an OnnxImportError naming `what` if it has another number)."""
    value = np.asarray(value)
    if value.size != 1:
        raise node.error(f"{what} must hold one element, got shape {value.shape}", OnnxImportError)
    return value.reshape(-1)[0]


def import_subgraph(node: Node, graph: onnx.GraphProto, bound: list) -> list:
    """The outputs of subgraph `graph` of `node`, imported with its inputs bound to the tensors `bound`."""
    scope = dict(node.env)      # the enclosing graph's tensors; what the subgraph defines stays in its scope
    scope.update({init.name: imported_constant(init, f"initializer {init.name!r} of {graph.name!r}", init.name)
                  for init in graph.initializer})
    scope.update({vi.name: t for vi, t in zip(graph.input, bound)})
    from .model import convert_node     # (model imports this module to register its converters)
    for proto in graph.node:
        convert_node(proto, scope, node.opset)
    missing = [vi.name for vi in graph.output if vi.name not in scope]
    if missing:
        raise node.error(f"the subgraph {graph.name!r} does not produce its outputs {missing}", OnnxImportError)
    return [scope[vi.name] for vi in graph.output]


def graph_attribute(node: Node, name: str) -> onnx.GraphProto:
    """The subgraph in `node`'s graph attribute `name` (an OnnxImportError where it has none)."""
    for a in node.proto.attribute:
        if a.name == name and a.type == onnx.AttributeProto.GRAPH:
            return a.g
    raise node.error(f"the graph attribute {name!r} is missing", OnnxImportError)
