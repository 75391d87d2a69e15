"""Converters of ONNX's sequence and optional operators: what they hold is known at import.

Exporters emit sequences where the model's Python code built a list of tensors (`torch.stack` or `torch.cat` of a
list, `tensor.split` or `unbind` iterated over, a list appended to in a loop). With static shapes, the list's length
and its positions fold to constants, so a sequence imports as the Python tuple of its tensors (`TensorSequence`):
SequenceAt is one of them, ConcatFromSequence one concat, SplitToSequence slices, SequenceMap its body imported once
per element. An optional imports as its value, or as a NoElement where it has none; OptionalHasElement is then a
constant. Positions must be constants (a ConstantRequiredError names the graph inputs to fix otherwise); graph
inputs and outputs stay tensors.
"""
from __future__ import annotations

import numpy as np

from .. import ops
from ..ops.axes import normalize_axis
from ..tensor import constant
from .control_flow import graph_attribute, import_subgraph
from .errors import OnnxImportError
from .node import NoElement, Node, TensorSequence, converts, dtype_of, kind_of


def _position(node: Node, k: int, length: int, default: int, past_end: bool = False) -> int:
    """Input k, a constant position in a sequence of `length` (negative ones count from the end; `past_end`: the
    length itself is one too), or `default` where the input is absent."""
    position = node.const_int(k, "the position")
    if position is None:
        return default
    last = length if past_end else length - 1
    if not -length <= position <= last:
        raise node.error(f"position {position} is outside the sequence of {length} tensors ([-{length}, {last}])",
                         OnnxImportError)
    return position + length if position < 0 else position


def _checked(node: Node, items: list, dtype: str) -> TensorSequence:
    """A sequence of `items`, each checked to be a tensor of `dtype`."""
    for t in items:
        if str(t.numpy_dtype) != dtype:
            raise node.error(f"a sequence of {dtype} cannot hold a tensor of {t.numpy_dtype}", OnnxImportError)
    return TensorSequence(tuple(items), dtype)


@converts("SequenceEmpty", attrs=("dtype",))
def sequence_empty(node: Node) -> list:
    """SequenceEmpty: a sequence of no tensor, of element type `dtype` (default float)."""
    return [TensorSequence((), dtype_of(node.attr("dtype", 1), f"node {node.name!r} (SequenceEmpty) 'dtype'"))]


@converts("SequenceConstruct")
def sequence_construct(node: Node) -> list:
    """SequenceConstruct: the sequence of the inputs, one element type."""
    items = node.inputs()
    return [_checked(node, items, str(items[0].numpy_dtype))]


@converts("SequenceAt")
def sequence_at(node: Node) -> list:
    """SequenceAt: the tensor at a constant position."""
    sequence = node.sequence(0)
    return [sequence.items[_position(node, 1, len(sequence.items), 0)]]


@converts("SequenceLength")
def sequence_length(node: Node) -> list:
    """SequenceLength: the number of tensors, an int64 scalar constant."""
    return [constant(np.array(len(node.sequence(0).items), np.int64))]


@converts("SequenceInsert")
def sequence_insert(node: Node) -> list:
    """SequenceInsert: the sequence with the tensor inserted at a constant position (default: at the end)."""
    sequence, items = node.sequence(0), list(node.sequence(0).items)
    items.insert(_position(node, 2, len(items), len(items), past_end=True), node.input(1))
    return [_checked(node, items, sequence.dtype)]


@converts("SequenceErase")
def sequence_erase(node: Node) -> list:
    """SequenceErase: the sequence without the tensor at a constant position (default: the last)."""
    sequence, items = node.sequence(0), list(node.sequence(0).items)
    if not items:
        raise node.error("cannot erase from an empty sequence", OnnxImportError)
    del items[_position(node, 1, len(items), len(items) - 1)]
    return [TensorSequence(tuple(items), sequence.dtype)]


@converts("ConcatFromSequence", attrs=("axis", "new_axis"))
def concat_from_sequence(node: Node) -> list:
    """ConcatFromSequence: the tensors concatenated along `axis`, or with new_axis=1 stacked along a new one."""
    items = node.sequence(0).items
    if not items:
        raise node.error("cannot concatenate an empty sequence: its result has no shape", OnnxImportError)
    stacked = node.flag("new_axis")
    axis = normalize_axis(node.attr("axis"), items[0].ndim + stacked, f"node {node.name!r} (ConcatFromSequence)")
    if stacked:
        items = [ops.unsqueeze(t, axis) for t in items]
    return [ops.concat(list(items), axis) if len(items) > 1 else items[0]]


@converts("SplitToSequence", attrs=("axis", "keepdims"))
def split_to_sequence(node: Node) -> list:
    """SplitToSequence: the input split along `axis` into a sequence: into parts of the sizes a constant `split`
    lists, or of the size it gives (the last part shorter), or without it into single elements (the axis kept,
    or with keepdims=0 removed)."""
    x = node.input(0)
    axis = normalize_axis(node.attr("axis", 0), x.ndim, f"node {node.name!r} (SplitToSequence)")
    n = x.shape[axis]
    split = node.const(1, required=False)
    if split is None:
        parts = [ops.slice(x, [i], [i + 1], [axis]) for i in range(n)]
        squeeze = not node.flag("keepdims", True)
        return [TensorSequence(tuple(ops.squeeze(p, axis) if squeeze else p for p in parts), str(x.numpy_dtype))]
    split = np.asarray(split)
    if split.dtype.kind not in "iu" or split.ndim > 1 or (split < 0).any() or (split.ndim == 0 and split == 0):
        raise node.error(f"split must be a positive integer or a list of non-negative ones, got {split.tolist()}",
                         OnnxImportError)
    sizes = [int(split)] * (n // int(split)) + [n % int(split)] * bool(n % int(split)) if split.ndim == 0 \
        else split.tolist()
    if sum(sizes) != n:
        raise node.error(f"split {split.tolist()} does not add up to the axis's size {n}", OnnxImportError)
    starts = np.cumsum([0] + sizes).tolist()
    parts = tuple(ops.slice(x, [b], [e], [axis]) for b, e in zip(starts, starts[1:]))
    return [TensorSequence(parts, str(x.numpy_dtype))]


@converts("SequenceMap", attrs=("body",))
def sequence_map(node: Node) -> list:
    """SequenceMap: the body imported once per position of the sequence inputs, bound to their tensors there
    (and to the tensor inputs each time); each body output gathered into a sequence."""
    body = graph_attribute(node, "body")
    values = [node.value(k) for k in range(node.num_inputs)]
    lengths = {len(v.items) for v in values if isinstance(v, TensorSequence)}
    if not isinstance(values[0], TensorSequence) or len(lengths) != 1 or len(body.input) != len(values):
        raise node.error(f"the sequence inputs ({', '.join(kind_of(v) for v in values)}) must be sequences of one "
                         f"length, the first among them, one per input of the body ({len(body.input)})",
                         OnnxImportError)
    steps = [import_subgraph(node, body, [v.items[i] if isinstance(v, TensorSequence) else v for v in values])
             for i in range(lengths.pop())]
    return [_checked(node, [outputs[k] for outputs in steps], _element_type(node, vi, steps, k))
            for k, vi in enumerate(body.output)]


def _element_type(node: Node, vi, steps: list, k: int) -> str:
    """The element type of SequenceMap's output k: its first tensor's, or for none the body's declared one."""
    if steps:
        return str(steps[0][k].numpy_dtype)
    if vi.type.HasField("tensor_type") and vi.type.tensor_type.elem_type:
        return dtype_of(vi.type.tensor_type.elem_type, f"output {vi.name!r} of the body")
    raise node.error(f"the body's output {vi.name!r} declares no element type for the empty sequence it makes",
                     OnnxImportError)


@converts("Optional", attrs=("type",))
def optional(node: Node) -> list:
    """Optional: its input (a tensor or a sequence) as an optional holding it, or without one an empty optional."""
    value = node.value(0, required=False)
    return [NoElement() if value is None else value]


@converts("OptionalHasElement")
def optional_has_element(node: Node) -> list:
    """OptionalHasElement: a bool scalar constant, whether the optional (or an absent input) holds a value."""
    value = node.value(0, required=False)
    return [constant(np.array(value is not None and not isinstance(value, NoElement)))]


@converts("OptionalGetElement")
def optional_get_element(node: Node) -> list:
    """OptionalGetElement: the value the optional holds (a tensor is its own value)."""
    value = node.value(0)
    if isinstance(value, NoElement):
        raise node.error("the optional holds no value", OnnxImportError)
    return [value]

