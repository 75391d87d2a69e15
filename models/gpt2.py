"""GPT-2 small (Radford et al. 2019, 124M): pre-LN decoder layers with causal attention, tanh GELU and a
language-model head tied to the token embedding."""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

import taskdsl.graph as tg
from taskdsl.graph import ops

from .transformer import MASKED, attention, dense, embed, layer_norm, positions
from .weights import Weights

EPS = 1e-5


@dataclass(frozen=True)
class GPT2Config:
    """Decoder sizes (GPT-2 small by default)."""

    layers: int = 12
    hidden: int = 768
    heads: int = 12
    vocab_size: int = 50257
    max_positions: int = 1024
    seq: int = 128              # the input sequence length


FULL = GPT2Config()
SMALL = GPT2Config(layers=2, hidden=32, heads=2, vocab_size=100, max_positions=64, seq=16)


def decoder_layer(x, w: Weights, config: GPT2Config, mask):
    """x + attention(ln(x)) with one fused q/k/v projection, then x + mlp(ln(x))."""
    q, k, v = ops.split(dense(layer_norm(x, w, EPS), w, 3 * config.hidden), 3, axis=-1)
    x = x + dense(attention(q, k, v, config.heads, mask), w, config.hidden)
    h = ops.gelu(dense(layer_norm(x, w, EPS), w, 4 * config.hidden), approximate="tanh")
    return x + dense(h, w, config.hidden)


def causal_mask(seq: int, w: Weights):
    """(1, 1, seq, seq): 0 where a token may attend (itself and earlier ones), MASKED above the diagonal."""
    return w.constant(np.triu(np.full((seq, seq), MASKED, np.float32), k=1)[None, None])


def build(config: GPT2Config, batch: int = 1, dtype="float32", seed: int = 0) -> tg.Graph:
    """The traced GPT-2 graph: `input_ids` (batch, seq) int64 -> `logits` (batch, seq, vocab)."""
    seq = config.seq
    w = Weights(seed, dtype)
    ids = tg.input("input_ids", (batch, seq), "int64")
    tokens = w.normal((config.vocab_size, config.hidden), 0.02)
    x = embed(ids, tokens) + positions(w.normal((config.max_positions, config.hidden), 0.02), seq)
    mask = causal_mask(seq, w)
    for _ in range(config.layers):
        x = decoder_layer(x, w, config, mask)
    # the tied head reads the embedding transposed: a constant of its own (folding a 38M-element transpose
    # at every compile would be slower than storing it twice)
    head = w.constant(np.ascontiguousarray(tokens.value.T))
    logits = ops.matmul(layer_norm(x, w, EPS), head)
    logits.name = "logits"
    return tg.Graph([ids], [logits], name="gpt2")
