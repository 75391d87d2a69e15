"""BERT-base (Devlin et al. 2019): post-LN encoder layers with exact (erf) GELU, and the tanh pooler."""
from __future__ import annotations

from dataclasses import dataclass

import taskdsl.graph as tg
from taskdsl.graph import ops

from .transformer import MASKED, attention, dense, embed, layer_norm, positions
from .weights import Weights

EPS = 1e-12


@dataclass(frozen=True)
class BertConfig:
    """Encoder sizes (BERT-base by default)."""

    layers: int = 12
    hidden: int = 768
    heads: int = 12
    intermediate: int = 3072
    vocab_size: int = 30522
    max_positions: int = 512
    seq: int = 128              # the input sequence length


FULL = BertConfig()
SMALL = BertConfig(layers=2, hidden=32, heads=2, intermediate=64, vocab_size=100, max_positions=64, seq=16)


def encoder_layer(x, w: Weights, config: BertConfig, mask):
    """Self-attention and the GELU feed-forward block, each followed by residual add and layer norm."""
    q, k, v = (dense(x, w, config.hidden) for _ in range(3))
    x = layer_norm(x + dense(attention(q, k, v, config.heads, mask), w, config.hidden), w, EPS)
    h = dense(ops.gelu(dense(x, w, config.intermediate)), w, config.hidden)
    return layer_norm(x + h, w, EPS)


def build(config: BertConfig, batch: int = 1, dtype="float32", seed: int = 0) -> tg.Graph:
    """The traced BERT graph: `input_ids`, `attention_mask` (batch, seq) int64 -> `last_hidden_state`,
    `pooler_output`."""
    seq = config.seq
    w = Weights(seed, dtype)
    ids = tg.input("input_ids", (batch, seq), "int64")
    mask_in = tg.input("attention_mask", (batch, seq), "int64")
    words = w.normal((config.vocab_size, config.hidden), 0.02)
    pos = w.normal((config.max_positions, config.hidden), 0.02)
    token_type = w.normal((2, config.hidden), 0.02)
    x = embed(ids, words) + positions(pos, seq) + positions(token_type, 1)      # every token is of type 0
    x = layer_norm(x, w, EPS)
    mask = ops.reshape((1.0 - ops.cast(mask_in, dtype)) * MASKED, (batch, 1, 1, seq))
    for _ in range(config.layers):
        x = encoder_layer(x, w, config, mask)
    first = ops.reshape(ops.slice(x, [0], [1], [1]), (batch, config.hidden))
    pooled = ops.tanh(dense(first, w, config.hidden))
    x.name, pooled.name = "last_hidden_state", "pooler_output"
    return tg.Graph([ids, mask_in], [x, pooled], name="bert_base")
