"""`python -m models bench`: per model, taskdsl latency against onnxruntime on the CPU, and against PyTorch
eager and torch.compile (default mode, and with CUDA graphs) where a GPU and torch are present (each peer
skipped when it is not installed).

Every runtime runs the same graph: onnxruntime the exported ONNX model, PyTorch the graph's
operators replayed as torch functions (models.torch_runner).
"""
from __future__ import annotations

import argparse

import numpy as np

from .inference import declared_feeds, infer, onnxruntime_session, sample_inputs, time_calls


def onnxruntime_latency(model, feeds: dict, iters: int, weights: dict | None = None) -> float | None:
    """Median seconds of onnxruntime (all CPU cores) on `model` (and the `weights` its export left out), after a
    warm-up; None without onnxruntime."""
    try:
        session = onnxruntime_session(model, weights)
    except ImportError:
        return None
    feeds = declared_feeds(session, feeds)

    def run(f):
        return session.run(None, f)
    run(feeds)
    return float(np.median(time_calls(run, feeds, iters)))


TORCH_PEERS = (   # label, torch.compile mode (None: eager); CUDA graphs replay launches as taskdsl does
    ("torch eager", None), ("torch.compile", "default"), ("torch.compile CUDA graphs", "reduce-overhead"))


def torch_latencies(graph, feeds: dict, iters: int) -> dict:
    """{label: median seconds} of each of TORCH_PEERS on the GPU; empty without torch or a GPU."""
    try:
        import torch
    except ImportError:
        return {}
    if not torch.cuda.is_available():
        return {}
    from .torch_runner import torch_function
    fn, inputs = torch_function(graph, feeds, "cuda")
    out = {}
    for label, mode in TORCH_PEERS:
        f = fn if mode is None else torch.compile(fn, mode=mode)
        def call(_, f=f):
            with torch.inference_mode():
                f(*inputs)
            torch.cuda.synchronize()
        for _ in range(3):      # warm-up: a CUDA-graph mode records its graph on a later call than the first
            call(None)
        out[label] = float(np.median(time_calls(call, None, iters)))
    return out


def command_bench(args: argparse.Namespace, target: str) -> int:
    """Print one row per model: taskdsl latency, each peer's, and taskdsl / peer ratios."""
    from . import MODELS, get
    from .cli import UsageError, checkable_export, zoo_model
    names = args.names or list(MODELS)
    # --seq with every model: the text models' length (named models: each must take it)
    seq = {name: args.seq if args.names or get(name).takes_seq else None for name in names if name in MODELS}
    for name in names:  # every name and size before any model runs: a long bench should not end on a typo
        try:
            get(name).config(args.small, seq.get(name))
        except KeyError as e:
            raise UsageError(e.args[0]) from None
        except ValueError as e:         # --seq for an image model, or out of a text model's range
            raise UsageError(f"{name}: {e}") from None
    rows = []
    for name in names:
        one = argparse.Namespace(**{**vars(args), "name": name, "seq": seq[name]})
        title, graph, vocab = zoo_model(one)
        feeds = sample_inputs(graph, vocab)
        model, weights = checkable_export(one, graph)
        result = infer(graph, model, feeds, target, args.iters, args.channels_last, weights=weights)
        peers = {}
        if model is not None:
            peers["onnxruntime cpu" + (" (f32)" if args.dtype == "bf16" else "")] = onnxruntime_latency(
                model, feeds, args.iters, weights)
        if target == "cuda":
            peers.update(torch_latencies(graph, feeds, args.iters))
        rows.append((title, result, peers))
        print(format_row(title, result, peers), flush=True)
    return 0 if all(r.ok for _, r, _ in rows) else 1


def format_row(title: str, result, peers: dict) -> str:
    """`title: taskdsl 12.3 ms (error 1e-6) | onnxruntime cpu 4.1 ms (taskdsl takes 3.00x) | ...`."""
    mismatch = "" if result.ok else " MISMATCH"
    cells = [f"{title}: taskdsl {result.compiled.target} {result.median_ms:.2f} ms "
             f"(error {result.max_error:.1e}{mismatch})"]
    for label, seconds in peers.items():
        if seconds is not None:
            cells.append(f"{label} {seconds * 1e3:.2f} ms (taskdsl takes {result.median_ms / (seconds * 1e3):.2f}x)")
    return " | ".join(cells)
