"""ResNet-50 (He et al. 2016; torchvision's v1.5: the stride is on the bottleneck's 3x3 conv)."""
from __future__ import annotations

from dataclasses import dataclass

import taskdsl.graph as tg
from taskdsl.graph import ops

from .cnn import classifier, conv_bn
from .weights import Weights


@dataclass(frozen=True)
class ResNetConfig:
    """Bottleneck blocks per stage, the first stage's width, the input resolution and the number of classes."""

    layers: tuple = (3, 4, 6, 3)
    width: int = 64
    image_size: int = 224
    num_classes: int = 1000


FULL = ResNetConfig()
# two stages (the second strided, with a projected shortcut): every operator of the full model, few conv shapes
SMALL = ResNetConfig(layers=(1, 1), width=4, image_size=32, num_classes=10)
EXPANSION = 4


def bottleneck(x, w: Weights, width: int, stride: int):
    """1x1 reduce -> 3x3 (strided) -> 1x1 expand, plus the (projected) shortcut, then relu."""
    out_channels = width * EXPANSION
    y = conv_bn(x, w, width, 1)
    y = conv_bn(y, w, width, 3, stride, 1)
    y = conv_bn(y, w, out_channels, 1, activation=None, gamma=0.2)     # small residual branch: stable depth
    shortcut = x
    if stride != 1 or x.shape[1] != out_channels:
        shortcut = conv_bn(x, w, out_channels, 1, stride, activation=None)
    return ops.relu(y + shortcut)


def build(config: ResNetConfig, batch: int = 1, dtype="float32", seed: int = 0) -> tg.Graph:
    """The traced ResNet graph: input `image` (batch, 3, size, size) -> `logits` (batch, classes)."""
    w = Weights(seed, dtype)
    image = tg.input("image", (batch, 3, config.image_size, config.image_size), dtype)
    x = conv_bn(image, w, config.width, 7, 2, 3)
    x = ops.max_pool2d(x, 3, 2, 1)
    for stage, blocks in enumerate(config.layers):
        for block in range(blocks):
            x = bottleneck(x, w, config.width * 2 ** stage, 2 if stage > 0 and block == 0 else 1)
    logits = classifier(x, w, config.num_classes)
    logits.name = "logits"
    return tg.Graph([image], [logits], name="resnet50")
