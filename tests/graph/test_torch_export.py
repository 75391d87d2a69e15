"""Small PyTorch blocks (a CNN block, a BERT encoder layer, a GPT-2 causal block) exported by PyTorch's own ONNX
exporters, imported with from_onnx and run on the cpu target: outputs match onnxruntime within 1e-4 relative.

Skipped where torch is not installed (it is an optional dependency). Both exporters are tried: the
TorchScript-based one (dynamo=False) and, where this torch has it with its onnxscript dependency, the dynamo one.
"""
import io
import os
import traceback

import numpy as np
import pytest

import taskdsl.graph as tg

torch = pytest.importorskip("torch")
ort = pytest.importorskip("onnxruntime")
nn = torch.nn


class CnnBlock(nn.Module):
    """conv-bn-relu, a residual 3x3 conv-bn, max-pool, global average pool and a linear head."""

    def __init__(self):
        super().__init__()
        self.stem = nn.Sequential(nn.Conv2d(3, 8, 3, padding=1), nn.BatchNorm2d(8), nn.ReLU())
        self.body = nn.Sequential(nn.Conv2d(8, 8, 3, padding=1, bias=False), nn.BatchNorm2d(8))
        self.pool = nn.MaxPool2d(2)
        self.head = nn.Linear(8, 5)

    def forward(self, x):
        y = self.stem(x)
        y = torch.relu(y + self.body(y))
        return self.head(self.pool(y).mean(dim=(2, 3)))


def self_attention(x, qkv, heads: int, causal: bool):
    """Multi-head self-attention of x (b, s, d) by the fused projection `qkv` (its output projection left out)."""
    b, s, d = x.shape
    q, k, v = qkv(x).split(d, dim=-1)
    q, k, v = (t.reshape(b, s, heads, d // heads).transpose(1, 2) for t in (q, k, v))
    scores = q @ k.transpose(-1, -2) / (d // heads) ** 0.5
    if causal:
        scores = scores.masked_fill(~torch.tril(torch.ones(s, s, dtype=torch.bool)), float("-inf"))
    return (scores.softmax(-1) @ v).transpose(1, 2).reshape(b, s, d)


class GptBlock(nn.Module):
    """Pre-norm causal self-attention and a GELU MLP, as in GPT-2."""

    def __init__(self, dim=16, heads=2):
        super().__init__()
        self.heads = heads
        self.ln1, self.ln2 = nn.LayerNorm(dim), nn.LayerNorm(dim)
        self.qkv, self.proj = nn.Linear(dim, 3 * dim), nn.Linear(dim, dim)
        self.mlp = nn.Sequential(nn.Linear(dim, 4 * dim), nn.GELU(approximate="tanh"), nn.Linear(4 * dim, dim))

    def forward(self, x):
        x = x + self.proj(self_attention(self.ln1(x), self.qkv, self.heads, causal=True))
        return x + self.mlp(self.ln2(x))


class BertBlock(nn.Module):
    """Post-norm self-attention and an erf-GELU MLP, as in BERT (nn.TransformerEncoderLayer's own export fails in
    torch 2.14's TorchScript exporter: its SDPA gets `is_causal` as a tensor)."""

    def __init__(self, dim=16, heads=2):
        super().__init__()
        self.heads = heads
        self.ln1, self.ln2 = nn.LayerNorm(dim), nn.LayerNorm(dim)
        self.qkv, self.proj = nn.Linear(dim, 3 * dim), nn.Linear(dim, dim)
        self.mlp = nn.Sequential(nn.Linear(dim, 2 * dim), nn.GELU(), nn.Linear(2 * dim, dim))

    def forward(self, x):
        x = self.ln1(x + self.proj(self_attention(x, self.qkv, self.heads, causal=False)))
        return self.ln2(x + self.mlp(x))


BLOCKS = {"cnn": (CnnBlock, (1, 3, 12, 12)), "bert": (BertBlock, (2, 6, 16)), "gpt2": (GptBlock, (1, 7, 16))}


def _raised_in_torch(e: Exception) -> bool:
    """Whether `e` is torch's own: its type torch's, or raised in torch's code (torch 2.14's TorchScript exporter
    raised a builtin TypeError tracing nn.TransformerEncoderLayer, which then failed this test instead of skipping)."""
    frames = traceback.extract_tb(e.__traceback__)
    return "torch" in type(e).__module__ or bool(frames) and f"{os.sep}torch{os.sep}" in frames[-1].filename


def export(module, example, dynamo: bool) -> bytes:
    buffer = io.BytesIO()
    try:
        try:
            torch.onnx.export(module, (example,), buffer, input_names=["x"], output_names=["y"], dynamo=dynamo)
        except TypeError as e:      # a torch without the `dynamo` argument: only the TorchScript exporter
            if "dynamo" not in str(e):
                raise
            if dynamo:
                pytest.skip("this torch has no dynamo ONNX exporter")
            torch.onnx.export(module, (example,), buffer, input_names=["x"], output_names=["y"])
    except ImportError as e:     # the dynamo exporter needs onnxscript
        pytest.skip(f"the dynamo ONNX exporter is not usable here: {e}")
    except Exception as e:       # the exporter's own failure: nothing of taskdsl's to test
        if not _raised_in_torch(e):
            raise
        pytest.skip(f"torch's {'dynamo' if dynamo else 'TorchScript'} ONNX exporter fails on this block: "
                    f"{type(e).__name__}: {str(e)[:120]}")
    return buffer.getvalue()


@pytest.mark.parametrize("dynamo", [False, True], ids=["torchscript", "dynamo"])
@pytest.mark.parametrize("name", list(BLOCKS))
def test_torch_exported_block_matches_onnxruntime(name, dynamo):
    torch.manual_seed(0)
    build, shape = BLOCKS[name]
    module = build().eval()
    example = torch.randn(*shape)
    with torch.no_grad():
        proto = export(module, example, dynamo)
    x = example.numpy()
    want = ort.InferenceSession(proto, providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]
    got = tg.from_onnx(proto).compile("cpu")(x)[0]
    assert got.shape == want.shape
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4 * np.abs(want).max())
