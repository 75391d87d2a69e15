"""Building blocks the transformer models share: dense layers, multi-head attention, token embeddings."""
from __future__ import annotations

import numpy as np

from taskdsl.graph import ops

from .weights import Weights

MASKED = -10000.0     # the additive attention mask of BERT and GPT-2 (finite, so f16 holds it)


def dense(x, w: Weights, out_features: int):
    """x @ weight + bias with fresh weights (in, out), as PyTorch exports nn.Linear / GPT-2's Conv1D."""
    weight, bias = w.linear(x.shape[-1], out_features)
    return ops.matmul(x, weight) + bias


def layer_norm(x, w: Weights, eps: float):
    """Layer norm over the last axis with fresh weight and bias."""
    weight, bias = w.layer_norm(x.shape[-1])
    return ops.layer_norm(x, weight, bias, eps=eps)


def split_heads(x, heads: int, transpose_last: bool = False):
    """(B, S, D) -> (B, heads, S, D / heads), or (B, heads, D / heads, S) with `transpose_last` (for keys)."""
    b, s, d = x.shape
    x = ops.reshape(x, (b, s, heads, d // heads))
    return ops.transpose(x, (0, 2, 3, 1) if transpose_last else (0, 2, 1, 3))


def merge_heads(x):
    """(B, heads, S, Dh) -> (B, S, heads * Dh)."""
    b, h, s, dh = x.shape
    return ops.reshape(ops.transpose(x, (0, 2, 1, 3)), (b, s, h * dh))


def attention(q, k, v, heads: int, mask=None):
    """softmax(q k^T / sqrt(Dh) + mask) v over `heads` heads; q, k, v and the result are (B, S, D)."""
    q, k, v = split_heads(q, heads), split_heads(k, heads, transpose_last=True), split_heads(v, heads)
    scores = ops.matmul(q, k) * float(1.0 / np.sqrt(q.shape[-1]))
    if mask is not None:
        scores = scores + mask
    return merge_heads(ops.matmul(ops.softmax(scores, axis=-1), v))


def check_positions(seq: int, count: int) -> None:
    """A ValueError unless a model of `count` positions takes sequences of length `seq`."""
    if not 1 <= seq <= count:
        raise ValueError(f"sequence length {seq} is outside 1..{count}, the positions the model has")


def positions(table, seq: int):
    """The first `seq` rows of a position-embedding table (ValueError if it has fewer)."""
    check_positions(seq, table.shape[0])
    return ops.slice(table, [0], [seq], [0])


def embed(ids, table):
    """Rows of `table` (vocab, D) at integer `ids` (B, S): (B, S, D)."""
    return ops.gather(table, ids, axis=0)
