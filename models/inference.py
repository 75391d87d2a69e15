"""One inference run end to end: sample inputs, a reference, compile, warm-up, timed iterations, the error.

    result = infer(graph, onnx_model, target="cpu", iters=10)
    print(result.median_ms, result.max_error, result.reference)

The reference is onnxruntime on the ONNX model when onnxruntime is installed (and runs the
model), else the graph's numpy reference evaluator.
"""
from __future__ import annotations

import math
import time
from dataclasses import dataclass

import numpy as np
import onnx

from taskdsl.bench.timing import settle
from taskdsl.graph import CompiledGraph, Graph
from taskdsl.graph.ops import IntegerConv, IntegerMatMul
from taskdsl.graph.passes.plan_memory import plan_memory
from taskdsl.graph.printer import format_bytes

# relative error allowed by dtype; 1e-3 otherwise. bf16 keeps 8 bits of mantissa, f16 11: BERT-base in bf16, the graph's
# own numpy reference (each operator rounding to bf16) is 4.6e-2 from the model in f32, taskdsl 5.2e-2 (seed 0;
# GPT-2 1.3e-2 both; BERT-base in f16 5.4e-3), past the 5e-2 this was
TOLERANCE = {"float16": 2e-2, "bfloat16": 1e-1}
# ...and by a graph that rounds its activations to 8 bits at run time (a quantized model), where a float one
# rounding apart from the reference's (a layer norm's, a softmax's, a sum's in another order) gives another integer,
# and the step propagates: on dynamically quantized BERT-base (onnxruntime.quantization's quantize_dynamic), three
# seeds of `sample_inputs`, onnxruntime's outputs differ from onnx's reference evaluator by 6.4-7.3%, taskdsl's by
# 6.8-9.9%, taskdsl's from onnxruntime's by 7.3-7.7%; on a statically quantized MobileNet-V2 (quantize_static, QDQ
# format), taskdsl's differ from onnxruntime's by 2.3%, and from onnxruntime's run of the model as written (no graph
# optimizations: its QuantizeLinear and DequantizeLinear around f32 convolutions, as taskdsl runs it) by 1.5%
QUANTIZED_TOLERANCE = 0.2


def sample_inputs(graph: Graph, vocab_size: int = 2, seed: int = 0) -> dict:
    """Seeded inputs for `graph`: standard normal floats; integer ids in [0, vocab_size), and below the size of
    every table they index (a RoBERTa's one-row token-type table); masks of ones (integer inputs named *mask*)
    with the last quarter of the last row masked out."""
    rng = np.random.default_rng(seed)
    feeds = {}
    users = graph.users()
    for t in graph.inputs:
        if t.dtype.is_float:
            feeds[t.name] = rng.standard_normal(t.shape, dtype=np.float32).astype(t.numpy_dtype)
        elif "mask" in t.name and t.ndim >= 1 and t.size:
            mask = np.ones(t.shape, t.numpy_dtype)
            mask.reshape(-1, t.shape[-1])[-1, t.shape[-1] - t.shape[-1] // 4:] = 0
            feeds[t.name] = mask
        elif t.dtype.is_bool:
            feeds[t.name] = rng.random(t.shape) < 0.5
        else:
            feeds[t.name] = rng.integers(0, min(vocab_size, _table_rows(t, users)), t.shape).astype(t.numpy_dtype)
    # a 0-d input's sample is a numpy scalar (rng.random(()) < 0.5 is a numpy.bool_), which onnxruntime refuses
    return {name: np.asarray(value) for name, value in feeds.items()}


def _table_rows(ids, users: dict) -> int:
    """The least size of the axes that `ids` (an integer tensor) indexes through gathers, directly or after casts
    and reshapes (at least 1); a large number where it indexes none."""
    rows, reached = 2**31, [ids]
    while reached:
        t = reached.pop()
        for op in users.get(id(t), []):
            if op.kind == "gather" and op.inputs[1] is t:
                rows = min(rows, max(op.inputs[0].shape[op.attrs["axis"]], 1))
            elif op.kind == "cast" or op.is_view:
                reached += op.outputs
    return rows


def available_memory() -> int | None:
    """Bytes of host memory the kernel says a process can still take without swapping (Linux's MemAvailable);
    None where it does not say."""
    try:
        with open("/proc/meminfo") as f:
            kilobytes = next(int(line.split()[1]) for line in f if line.startswith("MemAvailable:"))
    except (OSError, StopIteration, ValueError, IndexError):
        return None
    return kilobytes * 1024


def check_memory(graph: Graph, available: int | None = None) -> None:
    """MemoryError, before anything is allocated, when one run of `graph` needs more host memory than is
    available: its inputs, and its peak activations twice (taskdsl's arena and the reference's). Without the
    check a run far too large is killed by the system, with no message."""
    available = available_memory() if available is None else available
    inputs, activations = sum(t.nbytes for t in graph.inputs), plan_memory(graph).peak_bytes
    needed = inputs + 2 * activations
    if available is not None and needed > available:
        raise MemoryError(f"it needs about {format_bytes(needed)} (inputs {format_bytes(inputs)}, activations "
                          f"{format_bytes(activations)} for taskdsl and as much for the reference), and "
                          f"{format_bytes(available)} are available")


def onnxruntime_session(model: onnx.ModelProto | str, weights: dict | None = None):
    """An onnxruntime CPU session of `model` (or of the ONNX file at that path, which onnxruntime reads itself),
    given the arrays of the constants its export left out (`weights`: `export_onnx(graph, weights=...)`) as
    external initializers (ImportError without onnxruntime)."""
    import onnxruntime as ort
    options = ort.SessionOptions()
    if weights:
        options.add_external_initializers(list(weights), [ort.OrtValue.ortvalue_from_numpy(np.ascontiguousarray(a))
                                                          for a in weights.values()])
    source = model if isinstance(model, str) else model.SerializeToString()    # (2 s for BERT-base's 440 MB)
    return ort.InferenceSession(source, options, providers=["CPUExecutionProvider"])


def declared_feeds(session, feeds: dict) -> dict:
    """`feeds` for onnxruntime `session`, a bf16 array of an f32 input converted: a bf16 zoo model is checked against,
    and timed beside, its model in f32 (`cli.checkable_export`), onnxruntime's CPU kernels taking next to no bf16."""
    wants_f32 = {i.name for i in session.get_inputs() if i.type == "tensor(float)"}
    return {name: a.astype(np.float32) if name in wants_f32 and a.dtype.name == "bfloat16" else a
            for name, a in feeds.items()}


def onnxruntime_outputs(model: onnx.ModelProto | str, feeds: dict, failure: list | None = None,
                        weights: dict | None = None) -> list | None:
    """The model's outputs by onnxruntime on the CPU (`weights`: as `onnxruntime_session` takes them); None when
    onnxruntime is not installed or cannot run it (then why it could not, in one line, is appended to `failure`)."""
    try:
        import onnxruntime  # noqa: F401
    except ImportError:
        return None
    try:
        session = onnxruntime_session(model, weights)
        return session.run(None, declared_feeds(session, feeds))
    except Exception as e:  # noqa: BLE001 - e.g. an operator onnxruntime lacks for this dtype: use the numpy reference
        if failure is not None:
            first_line = (str(e).strip().splitlines() or [""])[0]
            failure.append(f"{type(e).__name__}: {first_line[:120]}")
        return None


def reference_outputs(graph: Graph, model: onnx.ModelProto | str | None, feeds: dict, fixed: dict | None = None,
                      weights: dict | None = None) -> tuple:
    """(outputs, name of the reference): onnxruntime on `model` (and the `weights` its export left out) when it
    can (fed also the values of the model inputs that `fixed` fixed at import), else the graph's numpy evaluator
    (named with onnxruntime's failure)."""
    failure: list = []
    outputs = None if model is None else onnxruntime_outputs(model, {**feeds, **(fixed or {})}, failure, weights)
    if outputs is not None:
        widened = any(t.numpy_dtype.name == "bfloat16" and np.asarray(o).dtype == np.float32
                      for o, t in zip(outputs, graph.outputs))     # a bf16 graph's model in f32 (`declared_feeds`)
        return outputs, "onnxruntime" + (" (the model in f32)" if widened else "")
    return graph.reference(feeds), "numpy reference" + "".join(f" (onnxruntime failed: {why})" for why in failure)


def relative_error(got: list, want: list) -> float:
    """The largest |got - want| over every output, relative to the largest finite |want| of that output; inf
    where a NaN or an infinity of one side is not the other's (NaN where NaN, the same infinity, are equal), and
    where the outputs differ in number or shape (zip and broadcasting would compare a part, or the wrong pairs)."""
    if len(got) != len(want):
        return math.inf
    worst = 0.0
    for a, b in zip(got, want):
        a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
        if a.shape != b.shape:
            return math.inf
        same = (a == b) | (np.isnan(a) & np.isnan(b))
        if same.all():
            continue
        differences = np.abs(a[~same] - b[~same])      # not inf - inf where both agree: no RuntimeWarning
        if not np.isfinite(differences).all():
            return math.inf
        finite = np.abs(b[np.isfinite(b)])
        worst = max(worst, float(differences.max() / max(finite.max() if finite.size else 0.0, 1e-30)))
    return worst


def rounds_to_8_bits(graph: Graph) -> bool:
    """Whether `graph` rounds float values to 8-bit ones as it runs (a quantized model's QuantizeLinear or
    DynamicQuantizeLinear), or multiplies 8-bit integers (ConvInteger, MatMulInteger)."""
    return any(isinstance(op, (IntegerMatMul, IntegerConv)) or
               (op.kind == "cast" and op.inputs[0].dtype.is_float and op.outputs[0].dtype.bits == 8)
               for op in graph.nodes)


def tolerance(graph: Graph) -> float:
    """The relative error a correct run stays within, by the graph's least precise float tensor (an f16 model
    with f32 inputs and outputs, as onnxconverter's keep_io_types makes, is an f16 one), or QUANTIZED_TOLERANCE
    for a graph that rounds its activations to 8 bits (`rounds_to_8_bits`)."""
    if rounds_to_8_bits(graph):
        return QUANTIZED_TOLERANCE
    tensors = [*graph.inputs, *graph.outputs, *(t for op in graph.nodes for t in op.outputs)]
    dtypes = {t.numpy_dtype.name for t in tensors}
    return max([TOLERANCE.get(d, 1e-3) for d in dtypes])


@dataclass
class Result:
    """What one `infer` measured."""

    compiled: CompiledGraph
    build_seconds: float
    latencies: np.ndarray       # seconds, one per timed iteration
    max_error: float            # relative, see relative_error
    reference: str              # what the outputs were checked against
    tolerance: float

    @property
    def median_ms(self) -> float:
        return float(np.median(self.latencies) * 1e3)

    @property
    def p90_ms(self) -> float:
        return float(np.percentile(self.latencies, 90) * 1e3)

    @property
    def ok(self) -> bool:
        """Whether the outputs match the reference within the tolerance."""
        return self.max_error <= self.tolerance


def time_on_device(compiled: CompiledGraph, feeds: dict, iters: int) -> np.ndarray:
    """Seconds per call of a cuda graph on inputs already on the GPU, outputs left there (as PyTorch is timed):
    each call waits for the GPU to finish."""
    import taskdsl as td
    on_gpu = {name: td.to_device(a) for name, a in feeds.items()}

    def call(f):
        compiled.run_on_device(f)
        td.synchronize()
    call(on_gpu)
    return time_calls(call, on_gpu, iters)


def time_calls(fn, feeds: dict, iters: int) -> np.ndarray:
    """Seconds per call of fn(feeds), `iters` times (after the caller's warm-up and `settle()`)."""
    settle()
    times = []
    for _ in range(max(iters, 1)):
        start = time.perf_counter()
        fn(feeds)
        times.append(time.perf_counter() - start)
    return np.array(times)


def infer(graph: Graph, model: onnx.ModelProto | str | None, feeds: dict, target: str | None = None,
          iters: int = 10, channels_last: bool | None = None, fixed: dict | None = None,
          weights: dict | None = None) -> Result:
    """Compile `graph` for `target` (convolutions NHWC with `channels_last`; None: the target's choice), warm up,
    time `iters` calls and check the outputs against the reference (`fixed`: the model inputs' values fixed at
    import; `weights`: the constants `model`'s export left out)."""
    want, reference = reference_outputs(graph, model, feeds, fixed, weights)
    start = time.perf_counter()
    compiled = graph.compile(target, channels_last=channels_last)
    build_seconds = time.perf_counter() - start
    got = compiled(feeds)                               # warm-up on the real inputs
    timer = time_calls if compiled.target == "cpu" else time_on_device
    latencies = timer(compiled, feeds, iters)
    return Result(compiled, build_seconds, latencies, relative_error(got, want), reference, tolerance(graph))
