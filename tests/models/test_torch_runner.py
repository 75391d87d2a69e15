"""The PyTorch baseline of `python -m models bench` (models/torch_runner.py: a graph's operators replayed as
torch functions) computes what the graph's numpy reference computes, for every zoo model at small size.

Run on torch's CPU device, so a GPU session's bench does not meet a broken replay first. Skipped where torch is
not installed (an optional dependency: the GPU machine's image has it; CI does not).
"""
import argparse

import numpy as np
import pytest

import models
from models.cli import zoo_model
from models.inference import relative_error, sample_inputs

torch = pytest.importorskip("torch")
from models.torch_runner import torch_function  # noqa: E402 - imports torch


@pytest.mark.parametrize("dtype, tolerance", [("f32", 1e-5), ("f16", 3e-3), ("bf16", 3e-2)])
@pytest.mark.parametrize("name", sorted(models.MODELS))
def test_torch_replay_matches_the_reference(name, dtype, tolerance):
    _, graph, vocab = zoo_model(argparse.Namespace(name=name, small=True, seq=None, batch=1, dtype=dtype))
    feeds = sample_inputs(graph, vocab)
    fn, inputs = torch_function(graph, feeds, "cpu")
    with torch.inference_mode():
        got = [out.float().numpy() for out in fn(*inputs)]
    want = [np.asarray(out, np.float32) for out in graph.reference(feeds)]
    assert [g.shape for g in got] == [w.shape for w in want]
    assert relative_error(got, want) <= tolerance
