"""The Einsum converter: an equation becomes diagonals, sums, transposes and batched matmuls of graph ops."""
from __future__ import annotations

import math

import numpy as np

from .. import ops
from ..tensor import constant
from .errors import OnnxImportError
from .node import Node, converts

ELLIPSIS = "..."


@converts("Einsum", attrs=("equation",))
def einsum(node: Node) -> list:
    """Einsum: each operand's repeated labels become its diagonal, then the operands are contracted pairwise, left to
    right (a batched matmul each, summing the labels no later operand or the output needs), and the result is
    summed and transposed to the output's labels."""
    xs = node.inputs()
    terms, output = parse_equation(node, [x.ndim for x in xs])
    operands = [_diagonal(x, term) for x, term in zip(xs, terms)]
    x, labels = operands[0]
    for k, (y, y_labels) in enumerate(operands[1:], 1):
        needed = set(output).union(*(term for _, term in operands[k + 1:]))
        x, labels = _contract(node, (x, labels), (y, y_labels), needed)
    x, labels = _sum_labels(x, labels, set(output))
    return [ops.transpose(x, [labels.index(label) for label in output])]


def parse_equation(node: Node, ranks: list) -> tuple:
    """(the label list of each operand, the output's labels): an ellipsis becomes labels of its own, right-aligned
    across operands (numpy's broadcasting); without '->' the output is the ellipsis, then the labels used once,
    sorted (upper case first)."""
    equation = node.attr("equation")
    if equation is None:
        raise node.error("the 'equation' attribute is required", OnnxImportError)
    lhs, arrow, rhs = equation.replace(" ", "").partition("->")
    terms = lhs.split(",")
    if len(terms) != len(ranks):
        raise node.error(f"equation {equation!r} has {len(terms)} operand terms for {len(ranks)} inputs",
                         OnnxImportError)
    widths = [rank - len(term.replace(ELLIPSIS, "")) if ELLIPSIS in term else 0 for term, rank in zip(terms, ranks)]
    broadcast = [f"{ELLIPSIS}{k}" for k in range(max(widths, default=0))]
    parsed = [_labels(node, term, broadcast[len(broadcast) - width:], rank)
              for term, width, rank in zip(terms, widths, ranks)]
    if arrow:
        output = _labels(node, rhs, broadcast, None)
    else:
        letters = [label for term in parsed for label in term if not label.startswith(ELLIPSIS)]
        output = broadcast + sorted(label for label in set(letters) if letters.count(label) == 1)
    unknown = [label for label in output if not any(label in term for term in parsed)]
    if unknown or len(set(output)) != len(output):
        raise node.error(f"equation {equation!r}: the output's labels must be distinct labels of the operands",
                         OnnxImportError)
    return parsed, output


def _labels(node: Node, term: str, broadcast: list, rank: int | None) -> list:
    """The labels of one term, its ellipsis replaced by `broadcast`; checked against the operand's rank."""
    head, dots, tail = term.partition(ELLIPSIS)
    letters = head + tail
    if letters and not (letters.isascii() and letters.isalpha()):
        raise node.error(f"term {term!r}: labels are letters, with at most one '...'", OnnxImportError)
    labels = list(head) + (broadcast if dots else []) + list(tail)
    if rank is not None and len(labels) != rank:
        raise node.error(f"term {term!r} does not match its operand's rank {rank}", OnnxImportError)
    return labels


def _diagonal(x, labels: list) -> tuple:
    """(x, labels) with each repeated label reduced to its diagonal: the later axis is summed with every element
    off the diagonal replaced by 0 (an exact selection, which NaN or inf elsewhere do not reach)."""
    labels = list(labels)
    for b in range(len(labels) - 1, 0, -1):
        a = labels.index(labels[b])
        if a == b:
            continue
        eye = np.eye(x.shape[a], dtype=bool).reshape([x.shape[a] if k in (a, b) else 1 for k in range(x.ndim)])
        x = ops.sum(ops.where(constant(eye), x, constant(np.zeros((), x.numpy_dtype))), [b])
        del labels[b]
    return x, labels


def _sum_labels(x, labels: list, kept: set) -> tuple:
    """(x, labels) summed over the labels not in `kept`."""
    axes = [k for k, label in enumerate(labels) if label not in kept]
    if not axes:
        return x, labels
    return ops.sum(x, axes), [label for label in labels if label in kept]


def _contract(node: Node, left: tuple, right: tuple, needed: set) -> tuple:
    """Two (tensor, labels) operands as one whose labels are those of `needed` they hold: the labels only one holds
    and nothing needs are summed first, shared ones broadcast (size 1), then one batched matmul of (batch, free,
    summed) by (batch, summed, free)."""
    (a, la), (b, lb) = _sum_labels(*left, needed | set(right[1])), _sum_labels(*right, needed | set(left[1]))
    shared = [label for label in la if label in lb]
    a, b = (_broadcast(node, x, labels, other, other_labels, shared)
            for x, labels, other, other_labels in ((a, la, b, lb), (b, lb, a, la)))
    batch = [label for label in shared if label in needed]
    summed = [label for label in shared if label not in needed]
    a_free, b_free = [label for label in la if label not in lb], [label for label in lb if label not in la]
    size = dict(zip(la, a.shape)) | dict(zip(lb, b.shape))
    a = _as_matrices(a, la, batch, a_free, summed, size)
    b = _as_matrices(b, lb, batch, summed, b_free, size)
    labels = batch + a_free + b_free
    product = ops.matmul(a, b)
    shape = tuple(size[label] for label in labels)
    return (product if product.shape == shape else ops.reshape(product, shape)), labels


def _broadcast(node: Node, x, labels: list, other, other_labels: list, shared: list):
    """x expanded where a shared label has size 1 in x and another size in `other` (an ellipsis broadcasting)."""
    shape = list(x.shape)
    for label in shared:
        mine, theirs = x.shape[labels.index(label)], other.shape[other_labels.index(label)]
        if mine != theirs and mine != 1 and theirs != 1:
            raise node.error(f"label {label!r} has size {mine} in one operand and {theirs} in another",
                             OnnxImportError)
        shape[labels.index(label)] = max(mine, theirs) if min(mine, theirs) else 0
    return x if tuple(shape) == x.shape else ops.expand(x, shape)


def _as_matrices(x, labels: list, batch: list, rows: list, columns: list, size: dict):
    """x with its axes in the order of the batch, rows and columns labels, the rows and the columns each merged
    into one axis (matmul's operand, batch axes kept: a transpose of the last two axes matmul reads in place)."""
    order = [labels.index(label) for label in batch + rows + columns]
    if order != list(range(len(order))):
        x = ops.transpose(x, order)
    shape = tuple(size[label] for label in batch) + tuple(math.prod(size[label] for label in group)
                                                          for group in (rows, columns))
    return x if x.shape == shape else ops.reshape(x, shape)
