"""Building blocks the convolutional models share: conv + batch norm + activation, and the classifier head."""
from __future__ import annotations

from taskdsl.graph import ops

from .weights import Weights


def _pair(v) -> tuple:
    return (v, v) if isinstance(v, int) else tuple(v)


def activate(x, activation: str | None):
    """x through 'relu', 'relu6' (clip to [0, 6]) or None (identity)."""
    if activation == "relu":
        return ops.relu(x)
    if activation == "relu6":
        return ops.clip(x, 0.0, 6.0)
    assert activation is None, f"unknown activation {activation!r}"
    return x


def conv_bn(x, w: Weights, out_channels: int, kernel, stride=1, padding=0, groups: int = 1,
            activation: str | None = "relu", eps: float = 1e-5, gamma: float = 1.0):
    """conv2d (no bias) -> inference batch norm -> activation, as in torchvision's CNNs."""
    kernel = _pair(kernel)
    weight = w.conv(out_channels, x.shape[1] // groups, kernel)
    y = ops.conv2d(x, weight, stride=stride, padding=padding, groups=groups)
    bn = w.batch_norm(out_channels, gamma)
    y = ops.batch_norm(y, bn["mean"], bn["var"], bn["weight"], bn["bias"], eps=eps)
    return activate(y, activation)


def classifier(x, w: Weights, num_classes: int):
    """Global average pool -> flatten -> linear: (N, C, H, W) features to (N, classes) logits."""
    x = ops.flatten(ops.global_avg_pool(x))
    weight, bias = w.linear(x.shape[1], num_classes)
    return ops.matmul(x, weight) + bias
