"""MobileNet-V2 (Sandler et al. 2018): inverted residual blocks with depthwise convolutions and relu6."""
from __future__ import annotations

from dataclasses import dataclass

import taskdsl.graph as tg

from .cnn import classifier, conv_bn
from .weights import Weights


@dataclass(frozen=True)
class MobileNetConfig:
    """Inverted residual settings (expansion t, channels c, repeats n, first stride s), stem and head widths."""

    settings: tuple = ((1, 16, 1, 1), (6, 24, 2, 2), (6, 32, 3, 2), (6, 64, 4, 2), (6, 96, 3, 1), (6, 160, 3, 2),
                       (6, 320, 1, 1))
    stem: int = 32
    head: int = 1280
    image_size: int = 224
    num_classes: int = 1000


FULL = MobileNetConfig()
# one strided block and one residual block: every operator of the full model, few conv shapes
SMALL = MobileNetConfig(settings=((6, 4, 2, 2),), stem=4, head=16, image_size=32, num_classes=10)


def inverted_residual(x, w: Weights, out_channels: int, stride: int, expansion: int):
    """1x1 expand (relu6) -> 3x3 depthwise (relu6) -> 1x1 linear projection, plus x when shapes allow."""
    hidden = x.shape[1] * expansion
    y = conv_bn(x, w, hidden, 1, activation="relu6") if expansion != 1 else x
    y = conv_bn(y, w, hidden, 3, stride, 1, groups=hidden, activation="relu6")
    y = conv_bn(y, w, out_channels, 1, activation=None, gamma=0.5 if stride == 1 and x.shape[1] == out_channels
                else 1.0)
    return y + x if stride == 1 and x.shape[1] == out_channels else y


def build(config: MobileNetConfig, batch: int = 1, dtype="float32", seed: int = 0) -> tg.Graph:
    """The traced MobileNet-V2 graph: input `image` (batch, 3, size, size) -> `logits` (batch, classes)."""
    w = Weights(seed, dtype)
    image = tg.input("image", (batch, 3, config.image_size, config.image_size), dtype)
    x = conv_bn(image, w, config.stem, 3, 2, 1, activation="relu6")
    for expansion, channels, repeats, stride in config.settings:
        for k in range(repeats):
            x = inverted_residual(x, w, channels, stride if k == 0 else 1, expansion)
    x = conv_bn(x, w, config.head, 1, activation="relu6")
    logits = classifier(x, w, config.num_classes)
    logits.name = "logits"
    return tg.Graph([image], [logits], name="mobilenet_v2")
