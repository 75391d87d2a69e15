"""Converters of the classification losses: NegativeLogLikelihoodLoss and SoftmaxCrossEntropyLoss.

Both pick, at every position of the target (N) or (N, d1..dk), the input's element along the class axis 1 that the
target names (gather_elements with the target as a size-1 class axis), negate it and scale it by the class's weight
(gather from the optional weight (C)); targets equal to ignore_index contribute 0 and weigh 0. Those may lie outside
[0, C): they gather class 0, which a `where` on the ignore mask then discards (any other target outside the classes
is the gathers' IndexError at run time). reduction 'mean' divides the sum by the summed weights (by the count of
targets when there are neither weights nor ignore_index). SoftmaxCrossEntropyLoss is that loss of
log_softmax(input) over axis 1, which is also its optional second output. The loss of 16-bit floats is computed in
f32 and rounded once.
"""
from __future__ import annotations

from .. import ops
from ..tensor import Tensor, constant
from .errors import OnnxImportError
from .node import Node, converts

REDUCTIONS = ("none", "sum", "mean")


@converts("NegativeLogLikelihoodLoss", attrs=("ignore_index", "reduction"))
def negative_log_likelihood_loss(node: Node) -> list:
    """NegativeLogLikelihoodLoss: -input[n, target[n, d...], d...] weighted by class, reduced by `reduction`."""
    x, target, weight = _operands(node)
    return [_nll(node, x, target, weight)]


@converts("SoftmaxCrossEntropyLoss", attrs=("ignore_index", "reduction"))
def softmax_cross_entropy_loss(node: Node) -> list:
    """SoftmaxCrossEntropyLoss: the NegativeLogLikelihoodLoss of log_softmax(scores) over the classes, with the
    log-probabilities as the optional second output."""
    x, target, weight = _operands(node)
    log_prob = ops.log_softmax(x, axis=1)
    return [_nll(node, log_prob, target, weight), log_prob if node.wanted(1) else None]


def _operands(node: Node) -> tuple:
    """(input, target, weight or None), their types and shapes checked."""
    x, target = node.input(0), node.input(1)
    weight = node.input(2, required=False) if node.num_inputs > 2 else None
    if not x.dtype.is_float:
        raise node.error(f"data type {x.dtype.name} is not supported for the input (floats)")
    if not target.dtype.is_integer:
        raise node.error(f"data type {target.dtype.name} is not supported for the target (integers)")
    if x.ndim < 2:
        raise node.error(f"the input must be (N, C) or (N, C, d1, ..., dk), got shape {list(x.shape)}",
                         OnnxImportError)
    if target.shape != x.shape[:1] + x.shape[2:]:
        raise node.error(f"the target's shape {list(target.shape)} must be the input's {list(x.shape)} without its "
                         "class axis 1", OnnxImportError)
    if weight is not None and (weight.shape != x.shape[1:2] or weight.dtype != x.dtype):
        raise node.error(f"the weight must be a {x.dtype.name} vector of the {x.shape[1]} classes, got "
                         f"{weight.dtype.name}{list(weight.shape)}", OnnxImportError)
    _reduction(node)
    return x, target, weight


def _reduction(node: Node) -> str:
    """The checked reduction attribute."""
    reduction = node.attr("reduction", "mean")
    if reduction not in REDUCTIONS:
        raise node.error(f"reduction={reduction!r} is not one of {', '.join(REDUCTIONS)}", OnnxImportError)
    return reduction


def _nll(node: Node, log_prob: Tensor, target: Tensor, weight: Tensor | None) -> Tensor:
    """The reduced negative log-likelihood of `target` under `log_prob` (N, C, d...), weighted by class; of 16-bit
    floats computed in f32 and rounded once, as onnxruntime's kernel (the weighting, the sums and their quotient
    would each round)."""
    dtype = log_prob.dtype
    if dtype.computes_in_f32:
        log_prob, weight = (None if t is None else ops.cast(t, "float32") for t in (log_prob, weight))
    target = ops.cast(target, "int64")     # the ignore_index attribute's type: an int32 target cannot hold them all
    ignored = None
    if node.has_attr("ignore_index"):
        ignored = ops.equal(target, int(node.attr("ignore_index")))
        target = ops.where(ignored, 0, target)      # an ignored target may lie outside the classes: class 0 instead
    loss = ops.neg(ops.squeeze(ops.gather_elements(log_prob, ops.unsqueeze(target, 1), axis=1), 1))
    if weight is not None:
        weight = ops.gather(weight, target)
        loss = ops.mul(loss, weight)
    if ignored is not None:
        # a select, not a product with a 0 weight: what was picked for an ignored target may be infinite
        loss = ops.where(ignored, 0.0, loss)
        weight = ops.where(ignored, 0.0, constant(1.0, log_prob.dtype) if weight is None else weight)
    reduction = _reduction(node)
    if reduction == "sum":
        loss = ops.sum(loss)
    elif reduction == "mean":
        loss = ops.mean(loss) if weight is None else ops.div(ops.sum(loss), ops.sum(weight))
    return ops.cast(loss, dtype)
