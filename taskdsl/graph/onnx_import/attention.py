"""Converters of attention blocks: Attention (opsets 23-25) and RotaryEmbedding (opset 23).

Both are compositions of graph ops: Attention is a matmul of the queries with the transposed keys, scaled (and
soft-capped), plus the mask's bias, a softmax along the keys, and a matmul with the values; fusion folds the
elementwise steps into the matmuls. Shapes are static, so the keys `is_causal`, the windows and `nonpad_kv_seqlen`
mask are known at import: their bias is a constant. 16-bit inputs are computed in f32 and rounded once.
"""
from __future__ import annotations

import numpy as np
from onnx import TensorProto

from .. import ops
from ..passes.fold_constants import constant_value
from ..tensor import constant
from .elementwise import in_f32
from .errors import OnnxImportError
from .node import Node, converts, dtype_of

SOFTMAX_PRECISIONS = (TensorProto.FLOAT, TensorProto.FLOAT16, TensorProto.DOUBLE, TensorProto.BFLOAT16)
QK_OUTPUT_MODES = {0: "the scaled Q K^T", 1: "after softcap", 2: "plus the mask's bias", 3: "after softmax"}
PAST_KEY, PAST_VALUE, NONPAD_KV_SEQLEN = 4, 5, 6
SHORT_MASK_SINCE = 24       # an attn_mask shorter than the keys is padded (before, it broadcasts)


# ---------------------------------------------------------------- Attention
@converts("Attention", attrs=("is_causal", "kv_num_heads", "q_num_heads", "qk_matmul_output_mode", "scale",
                              "softcap", "softmax_precision", "left_window_size", "right_window_size"))
def attention(node: Node) -> list:
    """Attention (opsets 23-25): multi-head, grouped-query and multi-query attention of 3-D or 4-D Q, K, V with a
    bool or additive mask, is_causal, sliding windows, softcap, a past key / value cache and nonpad_kv_seqlen (a
    constant); outputs Y, present_key, present_value and qk_matmul_output (modes 0-3)."""
    q, k, v = (node.input(i) for i in range(3))
    if not q.dtype.is_float or k.dtype != q.dtype or v.dtype != q.dtype:
        raise node.error(f"Q, K and V must be float tensors of one type, got {q.dtype.name}, {k.dtype.name} and "
                         f"{v.dtype.name}")
    if not q.ndim == k.ndim == v.ndim or q.ndim not in (3, 4):
        raise node.error(f"Q, K and V must all be 3-D or all 4-D, got shapes {q.shape}, {k.shape} and {v.shape}",
                         OnnxImportError)
    mode = node.attr("qk_matmul_output_mode", 0)
    if mode not in QK_OUTPUT_MODES:
        raise node.error(f"qk_matmul_output_mode={mode} is not supported; supported: "
                         + ", ".join(f"{m} ({what})" for m, what in QK_OUTPUT_MODES.items()))
    three_d = q.ndim == 3
    q, k, v = _heads_of(node, q, k, v)
    past_key, past_value = _past(node)
    k, v = _with_past(node, k, past_key), _with_past(node, v, past_value)    # present_key, present_value
    work = "float64" if q.dtype.bits == 64 else "float32"      # 16-bit inputs computed in f32, rounded once
    bias = _bias(node, q.shape, k.shape[2], work)
    stages = _attention(node, *(ops.cast(x, work) for x in (q, k, v)), bias)
    y = ops.cast(stages["y"], q.dtype)
    qk = ops.cast(stages[mode], q.dtype) if node.wanted(3) else None
    return [_merged_heads(y) if three_d else y, k, v, qk]


def _heads_of(node: Node, q, k, v) -> tuple:
    """Q (B, Hq, S, D), K (B, Hkv, T, D) and V (B, Hkv, T, Dv): 3-D inputs (B, S, heads * size) split into heads by
    q_num_heads / kv_num_heads; shapes checked."""
    q_heads, kv_heads = node.attr("q_num_heads"), node.attr("kv_num_heads")
    if q.ndim == 3:
        if q_heads is None or kv_heads is None:
            raise node.error("3-D Q, K and V need the q_num_heads and kv_num_heads attributes", OnnxImportError)
        q, k, v = _split_heads(node, q, q_heads, "Q"), _split_heads(node, k, kv_heads, "K"), \
            _split_heads(node, v, kv_heads, "V")
    for name, given, heads in (("q_num_heads", q_heads, q.shape[1]), ("kv_num_heads", kv_heads, k.shape[1])):
        if given is not None and given != heads:
            raise node.error(f"{name}={given} but the 4-D input has {heads} heads", OnnxImportError)
    b, hq, _, d = q.shape
    if k.shape[0] != b or v.shape[0] != b or k.shape[3] != d or v.shape[1:3] != k.shape[1:3] or hq % k.shape[1]:
        raise node.error(f"Q {q.shape}, K {k.shape} and V {v.shape} (batch, heads, sequence, head size) do not "
                         "match: one batch, K's head size that of Q, V's heads and sequence those of K, and Q's "
                         "heads a multiple of K's", OnnxImportError)
    return q, k, v


def _split_heads(node: Node, x, heads: int, what: str):
    """(B, S, heads * size) -> (B, heads, S, size)."""
    b, s, hidden = x.shape
    if heads < 1 or hidden % heads:
        raise node.error(f"{what}'s hidden size {hidden} is not a multiple of its {heads} heads", OnnxImportError)
    return ops.transpose(ops.reshape(x, (b, s, heads, hidden // heads)), (0, 2, 1, 3))


def _merged_heads(x):
    """(B, heads, S, size) -> (B, S, heads * size)."""
    b, h, s, size = x.shape
    return ops.reshape(ops.transpose(x, (0, 2, 1, 3)), (b, s, h * size))


def _past(node: Node) -> tuple:
    """(past_key, past_value), or (None, None) without a cache."""
    past = tuple(node.input(i, required=False) if node.num_inputs > i else None for i in (PAST_KEY, PAST_VALUE))
    if (past[0] is None) != (past[1] is None):
        raise node.error("past_key and past_value must be given together", OnnxImportError)
    return past


def _with_past(node: Node, x, past):
    """K or V (B, Hkv, T, size) after the past cache (B, Hkv, P, size): present_key or present_value."""
    if past is None:
        return x
    if past.dtype != x.dtype or past.ndim != 4 or past.shape[:2] != x.shape[:2] or past.shape[3] != x.shape[3]:
        raise node.error(f"the past cache {past.dtype.name}{list(past.shape)} does not match the new entries "
                         f"{x.dtype.name}{list(x.shape)} (batch, heads, past sequence, head size)", OnnxImportError)
    return ops.concat([past, x], axis=2)


def _nonpad_kv_seqlen(node: Node, batch: int, total: int) -> np.ndarray | None:
    """nonpad_kv_seqlen (opset 24), the count of valid keys of each batch (a constant: it fixes the mask)."""
    if node.num_inputs <= NONPAD_KV_SEQLEN or not node.proto.input[NONPAD_KV_SEQLEN]:
        return None
    if _past(node)[0] is not None:
        raise node.error("nonpad_kv_seqlen cannot be used with past_key and past_value", OnnxImportError)
    counts = np.asarray(node.const(NONPAD_KV_SEQLEN)).astype(np.int64).reshape(-1)
    if counts.size != batch or np.any(counts < 0) or np.any(counts > total):
        raise node.error(f"nonpad_kv_seqlen {counts.tolist()} must give one count in 0..{total} per batch "
                         f"({batch})", OnnxImportError)
    return counts


def _softmax_dtype(node: Node) -> str | None:
    """The dtype softmax_precision asks the softmax to be computed in (None: the scores' own)."""
    precision = node.attr("softmax_precision")
    if precision is None:
        return None
    if precision not in SOFTMAX_PRECISIONS:
        raise node.error(f"softmax_precision={precision} is not one of FLOAT (1), FLOAT16 (10), DOUBLE (11), "
                         "BFLOAT16 (16)", OnnxImportError)
    return dtype_of(precision, f"node {node.name!r} softmax_precision")


# ---------------------------------------------------------------- the mask
def _bias(node: Node, q_shape: tuple, total: int, dtype: str):
    """The bias added to the scores (B, Hq, S, T), of `dtype`, or None: the mask's (bool: -inf where False;
    numbers: added), and -inf where is_causal, the windows or nonpad_kv_seqlen disallow a key."""
    allowed = _allowed_keys(node, q_shape[0], q_shape[2], total)
    allowed_bias = None if allowed is None else constant(_additive(allowed), dtype)
    mask = node.input(3, required=False) if node.num_inputs > 3 else None
    if mask is None:
        return allowed_bias
    mask = _padded_mask(node, mask, total)
    scores = q_shape[:3] + (total,)
    if any(m not in (1, n) for m, n in zip(mask.shape[::-1], scores[::-1])):
        raise node.error(f"attn_mask of shape {mask.shape} does not broadcast to the scores' (batch, heads, "
                         f"queries, keys) {scores}", OnnxImportError)
    if mask.dtype.is_bool:      # a select, not a product: -inf * 0 would be NaN
        kept = constant(np.zeros((), dtype)) if allowed_bias is None else allowed_bias
        return ops.where(mask, kept, constant(np.array(-np.inf, dtype)))
    mask = ops.cast(mask, dtype)       # an integer mask is added too, as onnxruntime and the reference do
    return mask if allowed_bias is None else ops.add(mask, allowed_bias)


def _additive(allowed: np.ndarray) -> np.ndarray:
    """0 where a key is allowed, -inf where not."""
    return np.where(allowed, 0.0, -np.inf)


def _padded_mask(node: Node, mask, total: int):
    """attn_mask with its keys axis padded to `total` from opset 24 (a shorter mask disallows the keys past it;
    before, it must broadcast)."""
    if mask.ndim == 0 or mask.ndim > 4 or mask.shape[-1] > total:
        raise node.error(f"attn_mask of shape {mask.shape} needs 1-4 axes, the last at most the {total} keys",
                         OnnxImportError)
    short = total - mask.shape[-1]
    if not short or node.opset < SHORT_MASK_SINCE:
        return mask
    return ops.pad(mask, (0,) * (2 * mask.ndim - 1) + (short,), False if mask.dtype.is_bool else -np.inf)


def _allowed_keys(node: Node, batch: int, queries: int, total: int) -> np.ndarray | None:
    """Which keys j each query i may attend, (B or 1, 1, queries, total), by is_causal (j <= p), the windows
    (p - left <= j <= p + right) and nonpad_kv_seqlen (j < count), where p = offset + i is the query's position
    after the offset keys before it (the past cache, or the keys nonpad_kv_seqlen counts beyond the queries);
    None when every key is allowed."""
    left, right = node.attr("left_window_size", -1), node.attr("right_window_size", -1)
    if left < -1 or right < -1:
        raise node.error(f"left_window_size={left} and right_window_size={right} must be -1 (unbounded) or >= 0",
                         OnnxImportError)
    nonpad, (past_key, _) = _nonpad_kv_seqlen(node, batch, total), _past(node)
    offset = np.array(0 if past_key is None else past_key.shape[2]) if nonpad is None else nonpad - queries
    position = np.arange(queries).reshape(-1, 1) + offset.reshape(-1, 1, 1, 1)
    keys = np.arange(total)
    allowed = np.ones(position.shape[:-1] + (total,), bool)
    if node.flag("is_causal"):
        allowed &= keys <= position
    if left >= 0:
        allowed &= keys >= position - left
    if right >= 0:
        allowed &= keys <= position + right
    if nonpad is not None:
        allowed &= keys < nonpad.reshape(-1, 1, 1, 1)
    return None if allowed.all() else allowed


# ---------------------------------------------------------------- scores, softmax, values
def _attention(node: Node, q, k, v, bias) -> dict:
    """The stages of attention: the scaled scores (0), after softcap (1), plus the bias (2), the probabilities
    (3), and the output "y" (B, Hq, S, Dv)."""
    scale = node.attr("scale")
    scale = 1.0 / np.sqrt(q.shape[3]) if scale is None else scale
    # the scale multiplies the product (one epilogue), not Q and K by its root: in f32 the product does not overflow
    stages = {0: ops.mul(_grouped_matmul(q, ops.transpose(k, (0, 1, 3, 2))), float(scale))}
    softcap = node.attr("softcap", 0.0)
    stages[1] = stages[0] if softcap <= 0 else ops.mul(ops.tanh(ops.div(stages[0], softcap)), softcap)
    stages[2] = stages[1] if bias is None else ops.add(stages[1], bias)
    stages[3] = _probabilities(stages[2], bias, _softmax_dtype(node))
    stages["y"] = _grouped_matmul(stages[3], v)
    return stages


def _grouped_matmul(a, b):
    """a (B, Hq, S, X) @ b (B, Hkv, X, Y) -> (B, Hq, S, Y), query head h taking b's head h // (Hq / Hkv): the group
    of queries sharing a key head is folded into the rows (a view), so grouped-query attention repeats no keys."""
    batch, heads, rows, _ = a.shape
    groups = heads // b.shape[1]
    product = ops.matmul(ops.reshape(a, (batch, b.shape[1], groups * rows, a.shape[3])), b)
    return ops.reshape(product, (batch, heads, rows, b.shape[3]))


def _probabilities(scores, bias, softmax_dtype):
    """softmax(scores) along the keys (in `softmax_dtype` if given), a row whose keys the bias all masks zeros
    (its softmax is NaN: -inf - -inf)."""
    p = ops.softmax(ops.cast(scores, softmax_dtype or scores.dtype), axis=-1)
    if bias is not None:
        masked_rows = ops.equal(ops.max(bias, -1, keepdims=True), -np.inf)
        known = constant_value(masked_rows)     # without attn_mask, the bias is a constant
        if known is None or known.any():
            p = ops.where(masked_rows if known is None else constant(known), constant(np.zeros((), p.numpy_dtype)), p)
    return ops.cast(p, scores.dtype)


# ---------------------------------------------------------------- RotaryEmbedding
@converts("RotaryEmbedding", attrs=("interleaved", "num_heads", "rotary_embedding_dim"))
def rotary_embedding(node: Node) -> list:
    """RotaryEmbedding (opset 23) of X (B, H, S, D) or (B, S, H * D): the first rotary_embedding_dim (default D)
    features of each head rotated, as halves or (interleaved) as even / odd pairs, by the cos / sin caches
    (B, S, dim / 2), or their rows at position_ids (B, S)."""
    x, cos, sin = (node.input(i) for i in range(3))
    position_ids = node.input(3, required=False) if node.num_inputs > 3 else None
    if not x.dtype.is_float or cos.dtype != x.dtype or sin.dtype != x.dtype:
        raise node.error(f"X, cos_cache and sin_cache must be float tensors of one type, got {x.dtype.name}, "
                         f"{cos.dtype.name} and {sin.dtype.name}")
    heads = _rotary_heads(node, x)
    dim = node.attr("rotary_embedding_dim", 0) or heads.shape[3]
    if dim % 2 or not 0 < dim <= heads.shape[3]:
        raise node.error(f"rotary_embedding_dim={dim} must be even and at most the head size {heads.shape[3]}",
                         OnnxImportError)
    if position_ids is not None:
        cos, sin = ops.gather(cos, position_ids, axis=0), ops.gather(sin, position_ids, axis=0)
    batch, seq = (heads.shape[0], heads.shape[2]) if x.ndim == 4 else x.shape[:2]
    if cos.shape != (batch, seq, dim // 2) or sin.shape != cos.shape:
        raise node.error(f"the cos and sin caches (at position_ids) must be (batch, sequence, rotary_embedding_dim "
                         f"/ 2) = {(batch, seq, dim // 2)}, got {cos.shape} and {sin.shape}", OnnxImportError)
    # the caches broadcast over the heads: axis 1 of (B, H, S, D), axis 2 of the 3-D input's (B, S, H, D)
    angles = (batch, 1, seq, dim // 2) if x.ndim == 4 else (batch, seq, 1, dim // 2)
    cos, sin = ops.reshape(cos, angles), ops.reshape(sin, angles)
    rotated = in_f32(lambda h, c, s: _rotated(h, c, s, dim, node.flag("interleaved")), heads, cos, sin)
    return [ops.reshape(rotated, x.shape)]


def _rotary_heads(node: Node, x):
    """X as (B, H, S, D), or a 3-D X (B, S, H * D) as (B, S, H, D) (views: no data moves)."""
    if x.ndim == 4:
        return x
    heads = node.attr("num_heads")
    if x.ndim != 3 or heads is None or heads < 1 or x.shape[2] % heads:
        raise node.error(f"X must be 4-D, or 3-D with its hidden size a multiple of num_heads; got shape {x.shape} "
                         f"and num_heads={heads}", OnnxImportError)
    return ops.reshape(x, x.shape[:2] + (heads, x.shape[2] // heads))


def _rotated(x, cos, sin, dim: int, interleaved: bool):
    """x with the pairs (x1, x2) of its first `dim` features rotated: (x1 cos - x2 sin, x1 sin + x2 cos)."""
    head = x.shape[-1]
    rotary = ops.slice(x, [0], [dim], [-1])
    if interleaved:
        x1, x2 = ops.slice(rotary, [0], [dim], [-1], [2]), ops.slice(rotary, [1], [dim], [-1], [2])
    else:
        x1, x2 = ops.split(rotary, 2, axis=-1)
    real = ops.sub(ops.mul(x1, cos), ops.mul(x2, sin))
    imag = ops.add(ops.mul(x1, sin), ops.mul(x2, cos))
    if interleaved:     # (real, imag) pairs back in place: stacked on a new last axis, flattened
        pairs = ops.concat([ops.unsqueeze(real, -1), ops.unsqueeze(imag, -1)], axis=-1)
        rotary = ops.reshape(pairs, rotary.shape)
    else:
        rotary = ops.concat([real, imag], axis=-1)
    return rotary if dim == head else ops.concat([rotary, ops.slice(x, [dim], [head], [-1])], axis=-1)
