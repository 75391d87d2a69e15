"""Inception-V3 (Szegedy et al. 2016), as torchvision builds it: a conv stem, then Inception blocks
A (x3), B (grid reduction), C (x4, factorized 7x7), D (grid reduction), E (x2, expanded 3x3)."""
from __future__ import annotations

from dataclasses import dataclass

import taskdsl.graph as tg
from taskdsl.graph import ops

from .cnn import classifier, conv_bn
from .weights import Weights

EPS = 1e-3    # torchvision's BasicConv2d batch-norm epsilon


@dataclass(frozen=True)
class InceptionConfig:
    """How many A, C and E blocks; `width`: every conv's output channels (None: the real, per-branch widths);
    input resolution; classes."""

    blocks_a: int = 3
    blocks_c: int = 4
    blocks_e: int = 2
    width: int | None = None
    image_size: int = 299
    num_classes: int = 1000


FULL = InceptionConfig()
# one block of each kind; one width makes many branch convs the same shape (one compiled kernel); 107 is the
# smallest input at which no feature map shrinks to 1x1
SMALL = InceptionConfig(blocks_a=1, blocks_c=1, blocks_e=1, width=4, image_size=107, num_classes=10)


class _Block:
    """Basic conv (conv + BN(eps 1e-3) + relu) at the config's widths."""

    def __init__(self, w: Weights, width: int | None):
        self.w, self.width = w, width

    def __call__(self, x, channels: int, kernel, stride=1, padding=0):
        return conv_bn(x, self.w, self.width or channels, kernel, stride, padding, eps=EPS)


def _avg_pool_branch(conv: _Block, x, channels: int):
    return conv(ops.avg_pool2d(x, 3, 1, 1), channels, 1)


def block_a(conv: _Block, x, pool_features: int):
    """1x1 | 1x1 -> 5x5 | 1x1 -> 3x3 -> 3x3 | avg pool -> 1x1."""
    b5 = conv(conv(x, 48, 1), 64, 5, padding=2)
    b3 = conv(conv(conv(x, 64, 1), 96, 3, padding=1), 96, 3, padding=1)
    return ops.concat([conv(x, 64, 1), b5, b3, _avg_pool_branch(conv, x, pool_features)], axis=1)


def block_b(conv: _Block, x):
    """Grid reduction: 3x3/2 | 1x1 -> 3x3 -> 3x3/2 | max pool/2."""
    b3 = conv(conv(conv(x, 64, 1), 96, 3, padding=1), 96, 3, stride=2)
    return ops.concat([conv(x, 384, 3, stride=2), b3, ops.max_pool2d(x, 3, 2)], axis=1)


def block_c(conv: _Block, x, c7: int):
    """1x1 | 1x1 -> 1x7 -> 7x1 | 1x1 -> 7x1 -> 1x7 -> 7x1 -> 1x7 | avg pool -> 1x1."""
    b7 = conv(conv(conv(x, c7, 1), c7, (1, 7), padding=(0, 3)), 192, (7, 1), padding=(3, 0))
    d = conv(conv(x, c7, 1), c7, (7, 1), padding=(3, 0))
    d = conv(conv(d, c7, (1, 7), padding=(0, 3)), c7, (7, 1), padding=(3, 0))
    d = conv(d, 192, (1, 7), padding=(0, 3))
    return ops.concat([conv(x, 192, 1), b7, d, _avg_pool_branch(conv, x, 192)], axis=1)


def block_d(conv: _Block, x):
    """Grid reduction: 1x1 -> 3x3/2 | 1x1 -> 1x7 -> 7x1 -> 3x3/2 | max pool/2."""
    b3 = conv(conv(x, 192, 1), 320, 3, stride=2)
    b7 = conv(conv(conv(x, 192, 1), 192, (1, 7), padding=(0, 3)), 192, (7, 1), padding=(3, 0))
    return ops.concat([b3, conv(b7, 192, 3, stride=2), ops.max_pool2d(x, 3, 2)], axis=1)


def _expanded(conv: _Block, x):
    return ops.concat([conv(x, 384, (1, 3), padding=(0, 1)), conv(x, 384, (3, 1), padding=(1, 0))], axis=1)


def block_e(conv: _Block, x):
    """1x1 | 1x1 -> (1x3, 3x1) | 1x1 -> 3x3 -> (1x3, 3x1) | avg pool -> 1x1."""
    b3 = _expanded(conv, conv(x, 384, 1))
    d = _expanded(conv, conv(conv(x, 448, 1), 384, 3, padding=1))
    return ops.concat([conv(x, 320, 1), b3, d, _avg_pool_branch(conv, x, 192)], axis=1)


def build(config: InceptionConfig, batch: int = 1, dtype="float32", seed: int = 0) -> tg.Graph:
    """The traced Inception-V3 graph: input `image` (batch, 3, size, size) -> `logits` (batch, classes)."""
    w = Weights(seed, dtype)
    conv = _Block(w, config.width)
    image = tg.input("image", (batch, 3, config.image_size, config.image_size), dtype)
    x = conv(conv(conv(image, 32, 3, stride=2), 32, 3), 64, 3, padding=1)
    x = ops.max_pool2d(x, 3, 2)
    x = ops.max_pool2d(conv(conv(x, 80, 1), 192, 3), 3, 2)
    for k in range(config.blocks_a):
        x = block_a(conv, x, 32 if k == 0 else 64)
    x = block_b(conv, x)
    for k in range(config.blocks_c):
        x = block_c(conv, x, (128, 160, 160, 192)[min(k, 3)])
    x = block_d(conv, x)
    for _ in range(config.blocks_e):
        x = block_e(conv, x)
    logits = classifier(x, w, config.num_classes)     # dropout is the identity at inference
    logits.name = "logits"
    return tg.Graph([image], [logits], name="inception_v3")
