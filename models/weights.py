"""Seeded random weights for the model zoo (nothing can be downloaded), as graph constants.

Initializations keep activations in a sane range through deep networks (He-normal convs,
1/sqrt(fan_in) linears, batch-norm statistics near the identity), so that outputs are
well-conditioned numbers and relative errors against a reference mean something.
"""
from __future__ import annotations

import numpy as np

import taskdsl.graph as tg


class Weights:
    """A stream of seeded random weights (numpy default_rng), each a graph constant of one float dtype."""

    def __init__(self, seed: int = 0, dtype="float32"):
        self.rng = np.random.default_rng(seed)
        self.dtype = np.dtype(dtype)

    def constant(self, value: np.ndarray) -> tg.Tensor:
        """`value` as a graph constant of this stream's dtype."""
        return tg.constant(np.asarray(value, dtype=self.dtype))

    def normal(self, shape, std: float) -> tg.Tensor:
        """Normal(0, std) values."""
        return self.constant(self.rng.standard_normal(shape, dtype=np.float32) * np.float32(std))

    def uniform(self, shape, low: float, high: float) -> tg.Tensor:
        """Uniform(low, high) values."""
        return self.constant(self.rng.uniform(low, high, size=shape))

    def conv(self, out_channels: int, in_per_group: int, kernel: tuple) -> tg.Tensor:
        """A conv weight (out, in / groups, kh, kw), He-normal."""
        fan_in = in_per_group * int(np.prod(kernel))
        return self.normal((out_channels, in_per_group, *kernel), np.sqrt(2.0 / fan_in))

    def linear(self, in_features: int, out_features: int) -> tuple:
        """(weight (in, out), bias (out,)) of a linear layer, applied as x @ weight + bias."""
        return self.normal((in_features, out_features), 1.0 / np.sqrt(in_features)), \
            self.uniform((out_features,), -0.1, 0.1)

    def batch_norm(self, channels: int, gamma: float = 1.0) -> dict:
        """Inference batch-norm parameters near the identity; `gamma` scales the weight (small on residual branches)."""
        return {"mean": self.uniform((channels,), -0.1, 0.1), "var": self.uniform((channels,), 0.8, 1.2),
                "weight": self.uniform((channels,), 0.8 * gamma, 1.2 * gamma),
                "bias": self.uniform((channels,), -0.1, 0.1)}

    def layer_norm(self, features: int) -> tuple:
        """(weight, bias) of a layer norm, near the identity."""
        return self.uniform((features,), 0.8, 1.2), self.uniform((features,), -0.1, 0.1)
