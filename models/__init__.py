"""The model zoo: ResNet-50, Inception-V3, MobileNet-V2, BERT-base and GPT-2 on the graph layer, with seeded
random weights, plus `python -m models` (list / run / bench).

    import models
    spec = models.get("resnet50")
    g = spec.build(spec.small, batch=1)        # a traced taskdsl.graph.Graph; spec.full is the real size
    proto = models.export_onnx(g)              # the same graph as an ONNX model
"""
from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass

from . import bert, gpt2, inception, mobilenet, resnet
from .onnx_export import OnnxExportError, export_onnx
from .transformer import check_positions


@dataclass(frozen=True)
class ModelSpec:
    """A model of the zoo: how to build its graph, at full size or at a reduced size with the same op mix."""

    name: str
    summary: str
    build: Callable          # build(config, batch=1, dtype="float32", seed=0) -> Graph
    full: object             # the config of the real model
    small: object            # a reduced config: fewer layers and channels, the same operators

    @property
    def takes_seq(self) -> bool:
        """Whether the input is a token sequence (its length is the config's `seq`)."""
        return hasattr(self.full, "seq")

    def config(self, small: bool = False, seq: int | None = None):
        """The full or small config, with sequence length `seq` if given (text models only)."""
        config = self.small if small else self.full
        if seq is None:
            return config
        if not self.takes_seq:
            raise ValueError("a sequence length applies to the text models "
                             f"({', '.join(n for n, s in MODELS.items() if s.takes_seq)}), not to images")
        check_positions(seq, config.max_positions)     # before any model is built (bench builds several)
        return dataclasses.replace(config, seq=seq)


MODELS = {spec.name: spec for spec in [
    ModelSpec("resnet50", "ResNet-50 v1.5, 224x224 images, 1000 classes", resnet.build, resnet.FULL, resnet.SMALL),
    ModelSpec("inception_v3", "Inception-V3, 299x299 images, 1000 classes", inception.build, inception.FULL,
              inception.SMALL),
    ModelSpec("mobilenet_v2", "MobileNet-V2, 224x224 images, 1000 classes", mobilenet.build, mobilenet.FULL,
              mobilenet.SMALL),
    ModelSpec("bert", "BERT-base encoder (12 layers, 768 wide), sequence 128", bert.build, bert.FULL, bert.SMALL),
    ModelSpec("gpt2", "GPT-2 small (124M) with its LM head, sequence 128", gpt2.build, gpt2.FULL, gpt2.SMALL),
]}


def get(name: str) -> ModelSpec:
    """The model called `name` (KeyError listing the known names otherwise)."""
    if name not in MODELS:
        raise KeyError(f"unknown model {name!r}; known models: {', '.join(MODELS)}")
    return MODELS[name]


__all__ = ["MODELS", "ModelSpec", "OnnxExportError", "export_onnx", "get"]
