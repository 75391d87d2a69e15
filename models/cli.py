"""`python -m models`: list the zoo, run one model (or any ONNX file) end to end, or benchmark the zoo.

    python -m models list
    python -m models run resnet50 [--batch B] [--dtype f32|f16|bf16] [--target cpu|cuda] [--iters N] [--small]
    python -m models run bert --seq 64
    python -m models run --onnx model.onnx [--batch B] [--seq S] [--constant NAME=V,V,... ...] [--shape NAME=D,D,...]
    python -m models bench [NAME ...] [--small]

Bad input (an unknown model, a bad flag, an unreadable ONNX file) prints one line on stderr (a flag
argparse refuses, the usage line too) and exits with status 2; a run whose outputs do not match the
reference exits with 1.
"""
from __future__ import annotations

import argparse
import os
import re
import sys

import taskdsl as td

from . import MODELS, get

DTYPES = {"f32": "float32", "f16": "float16", "bf16": "bfloat16"}
TOP_OPERATORS = 5


class UsageError(Exception):
    """Input the command line cannot run: reported as one line on stderr, exit status 2."""


def parser() -> argparse.ArgumentParser:
    """The argument parser of `python -m models`."""
    p = argparse.ArgumentParser(prog="python -m models", description="The taskdsl model zoo: list, run, bench.")
    sub = p.add_subparsers(dest="command", required=True)
    sub.add_parser("list", help="the models of the zoo")
    run = sub.add_parser("run", help="build, time and check one model (or any ONNX file with --onnx)")
    run.add_argument("name", nargs="?", help=f"one of: {', '.join(MODELS)}")
    run.add_argument("--onnx", metavar="PATH", help="run this ONNX model instead of a zoo model")
    run.add_argument("--constant", action="append", default=[], metavar="NAME=V,V,...",
                     help="with --onnx: fix a model input's value (e.g. a shape input); repeatable")
    run.add_argument("--shape", action="append", default=[], metavar="NAME=D,D,...",
                     help="with --onnx: an input's shape (one without a shape in the model, or sized otherwise than "
                          "--batch/--seq do); repeatable")
    run.add_argument("--iters", type=int, default=10, help="timed iterations after the warm-up (default 10)")
    add_shape_flags(run, onnx=True)
    bench = sub.add_parser("bench", help="per model: taskdsl latency vs onnxruntime (and PyTorch on a GPU)")
    bench.add_argument("names", nargs="*", help="models to run (default: all)")
    bench.add_argument("--iters", type=int, default=5, help="timed iterations per runtime (default 5)")
    add_shape_flags(bench, onnx=False)
    return p


def add_shape_flags(p: argparse.ArgumentParser, onnx: bool) -> None:
    """The flags `run` and `bench` share: batch, sequence length, dtype, target, small, layout, tuning (`onnx`:
    the command also takes --onnx, whose symbolic axes --batch and --seq size)."""
    p.add_argument("--batch", type=int, default=1, help="batch size (default 1" + (
        "; for an ONNX model, the size of its inputs' symbolic axis 0)" if onnx else ")"))
    p.add_argument("--seq", type=int, help="sequence length of text models (default: 128, 16 with --small)" + (
        ", or the size of an ONNX model's symbolic dims past axis 0" if onnx else "; with every model, of the text "
        "models only"))
    p.add_argument("--dtype", choices=sorted(DTYPES), default="f32", help="weights and activations (default f32)")
    p.add_argument("--target", choices=list(td.runtime.config.TARGETS),
                   help="where kernels run (default: $TASKDSL_TARGET, else cuda with a usable GPU, else cpu)")
    p.add_argument("--small", action="store_true", help="the reduced model (fewer layers and channels)")
    p.add_argument("--channels-last", action=argparse.BooleanOptionalAction, default=None,
                   help="run 2-D convolutions in NHWC (the graph's channels_last layout pass; default: on; "
                   "--no-channels-last keeps the model's NCHW)")
    p.add_argument("--no-tune", action="store_true",
                   help="use the templates' default schedules instead of tuning each new shape (TASKDSL_TUNE=0)")


def check_flags(args) -> str:
    """The target to run on, after checking the flags argparse cannot (UsageError)."""
    if args.batch < 1 or (args.seq is not None and args.seq < 1) or args.iters < 1:
        raise UsageError("--batch, --seq and --iters must be positive integers")
    if args.no_tune:
        os.environ["TASKDSL_TUNE"] = "0"
    td.runtime.config.check_environment()       # a bad TASKDSL_* setting: exit 2 now, not minutes into the build
    target = args.target or td.get_target()
    if target == "cuda":
        usable, reason = td.gpu_status()
        if not usable:
            raise UsageError(f"--target cuda needs a usable GPU, but there is none ({reason}); use --target cpu")
    return target


def command_list() -> int:
    """Print the zoo, one model a line."""
    width = max(len(n) for n in MODELS)
    for name, spec in MODELS.items():
        print(f"{name.ljust(width)}  {spec.summary}")
    return 0


def top_operators(summary: str, n: int = TOP_OPERATORS) -> list:
    """The header and the `n` slowest rows of a CompiledGraph.summary(timing=True) table (its last column is ms)."""
    lines = summary.splitlines()
    header = next(k for k, line in enumerate(lines) if line.split()[:1] == ["#"])
    rows = [line for line in lines[header + 1:] if line.split()[:1] and line.split()[0].isdigit()]
    return [lines[header]] + sorted(rows, key=lambda line: -float(line.split()[-1]))[:n]


def print_result(title: str, result) -> None:
    """The run's report: build time, latency, activation memory, error, kernels, and where the time goes."""
    from .inference import QUANTIZED_TOLERANCE
    cg = result.compiled
    kernels = cg.kernels
    print(title)
    print(f"  built in {result.build_seconds:.1f} s: {len(cg.graph.nodes)} operators, {len(kernels)} kernel launches "
          f"({len({id(k) for k in kernels})} distinct kernels"
          f"{f', {cg.cpu_modules} modules' if cg.target == 'cpu' else ''}), target {cg.target}"
          f"{', convolutions NHWC' if cg.channels_last else ''}")
    print(f"  latency: median {result.median_ms:.3f} ms, p90 {result.p90_ms:.3f} ms "
          f"over {len(result.latencies)} iterations")
    print(f"  {cg.memory.summary()}; arena {cg.arena}; replay {cg.replay}")
    quantized = result.tolerance == QUANTIZED_TOLERANCE       # (a quantized graph's tolerance is loose: say so)
    verdict = "ok" if result.ok else "MISMATCH"
    if not result.ok or quantized:
        verdict += f" (tolerance {result.tolerance:.0e}{', activations rounded to 8 bits' if quantized else ''})"
    print(f"  max error vs {result.reference}: {result.max_error:.2e} relative, {verdict}")
    summary = cg.summary(timing=True)
    how = summary.splitlines()[-1].partition("(")[2]       # its total line: "total 1.234 ms (how they were timed)"
    print(f"  top operators by time ({how}:")
    for line in top_operators(summary):
        print("  " + line)


def zoo_model(args) -> tuple:
    """(title, graph, vocabulary size) of the zoo model the flags name (UsageError for bad names and sizes,
    MemoryError for sizes beyond the machine's memory)."""
    from .inference import check_memory
    try:
        spec = get(args.name)
        config = spec.config(args.small, args.seq)
        graph = spec.build(config, batch=args.batch, dtype=DTYPES[args.dtype])
    except KeyError as e:
        raise UsageError(e.args[0]) from None
    except ValueError as e:
        raise UsageError(f"{args.name}: {e}") from None
    seq = f", sequence {config.seq}" if spec.takes_seq else ""
    title = f"{spec.name}{' (small)' if args.small else ''}: batch {args.batch}{seq}, {args.dtype}"
    check_memory(graph)
    return title, graph, getattr(config, "vocab_size", 2)


def onnx_shapes(model, batch: int, seq: int | None, given: dict | None = None, fixed=()) -> dict:
    """Static shapes for the model inputs with symbolic dims, or none: `given` (--shape) as it says, else each
    symbolic dim by its name, in every input that names it: the size a given shape has there, else --seq where
    it names an axis past 0 of some input, else --batch (an unnamed one by its place: axis 0 --batch, others
    --seq). The inputs named in `fixed` (--constant: their values give their shapes) are left out."""
    given = given or {}
    initializers = {init.name for init in model.graph.initializer}
    inputs = [vi for vi in model.graph.input if vi.name not in initializers and vi.name not in fixed]
    unshaped = [vi.name for vi in inputs if vi.name not in given and not vi.type.tensor_type.HasField("shape")]
    if unshaped:
        raise UsageError(f"input {unshaped[0]!r} has no shape in the model; give it with --shape "
                         f"{unshaped[0]}=D,D,...")
    symbolic = [vi for vi in inputs if vi.name not in given
                and not all(d.HasField("dim_value") for d in vi.type.tensor_type.shape.dim)]
    if not symbolic and (batch != 1 or seq is not None):
        raise UsageError("--batch and --seq size the symbolic dims of an ONNX model's inputs; this model's inputs "
                         "have static shapes" + (" (or sizes --shape gives)" if given else ""))
    past_axis_0 = {d.dim_param for vi in symbolic for axis, d in enumerate(vi.type.tensor_type.shape.dim)
                   if axis > 0 and d.dim_param}
    named = {}      # a dim name -> the size a given shape has there (from_onnx reports given shapes that disagree)
    for vi in inputs:
        dims = vi.type.tensor_type.shape.dim
        if vi.name in given and len(dims) == len(given[vi.name]):
            named.update({d.dim_param: size for d, size in zip(dims, given[vi.name]) if d.dim_param})
    shapes, used = dict(given), set()
    for vi in symbolic:
        shape = []
        for axis, d in enumerate(vi.type.tensor_type.shape.dim):
            if d.HasField("dim_value"):
                shape.append(d.dim_value)
            elif d.dim_param in named:
                shape.append(named[d.dim_param])
            elif d.dim_param not in past_axis_0 and (d.dim_param or axis == 0):
                shape.append(batch)
                used.add("--batch")
            elif seq is not None:
                shape.append(seq)
                used.add("--seq")
            else:
                raise UsageError(f"input {vi.name!r} has a symbolic dim {d.dim_param or '?'!r} at axis {axis}; "
                                 "give its size with --seq (or the input's shape with --shape NAME=D,D,...)")
        shapes[vi.name] = shape
    flags = {flag for flag, value in (("--batch", batch != 1), ("--seq", seq is not None)) if value}
    if flags - used:        # a size no symbolic dim takes would be silently ignored
        flag = sorted(flags - used)[0]
        which = "axis 0" if flag == "--batch" else "an axis past 0"
        raise UsageError(f"{flag} sizes the symbolic dims at {which} of an ONNX model's inputs; this model's inputs "
                         f"have none there ({', '.join(f'{n}: {shapes[n]}' for n in shapes)})")
    return shapes


def onnx_given_shapes(model, specs: list) -> dict:
    """The input shapes `--shape NAME=D,D,...` give; UsageError for a spec that is malformed or names no input."""
    inputs = {vi.name for vi in model.graph.input} - {init.name for init in model.graph.initializer}
    shapes = {}
    for spec in specs:
        name, sep, text = spec.partition("=")
        if name not in inputs:
            raise UsageError(f"--shape {spec!r}: the model has no input {name!r} (inputs: {', '.join(inputs)})")
        if name in shapes:
            raise UsageError(f"--shape {spec!r}: {name!r} is given twice")
        try:
            shape = [int(d) for d in text.split(",")] if text else []
        except ValueError:
            shape = None
        if not sep or shape is None or any(d < 0 for d in shape):
            raise UsageError(f"--shape {spec!r}: give NAME=D,D,... of sizes >= 0 (NAME= for a 0-d input)")
        shapes[name] = shape
    return shapes


def onnx_constants(model, specs: list, shapes: dict | None = None) -> dict:
    """The values `--constant NAME=V,V,...` fix, as arrays of the inputs' ONNX types, in the shape `--shape` gives
    the input (`shapes`), else the one it declares where its dims are all fixed (a one-value spec of a 0-d input
    is a scalar), else 1-d; UsageError for a spec that is malformed or names no input."""
    import math

    import numpy as np
    from onnx.helper import tensor_dtype_to_np_dtype
    from taskdsl.graph.onnx_import.model import input_constant
    inputs = {vi.name: vi for vi in model.graph.input}
    constants = {}
    for spec in specs:
        name, sep, text = spec.partition("=")
        if not sep or not text:
            raise UsageError(f"--constant {spec!r}: give NAME=V or NAME=V,V,... (e.g. shape=1,3,224,224)")
        if name not in inputs:
            raise UsageError(f"--constant {spec!r}: the model has no input {name!r} (inputs: {', '.join(inputs)})")
        if name in constants:
            raise UsageError(f"--constant {spec!r}: {name!r} is given twice")
        tensor = inputs[name].type.tensor_type
        try:
            dtype = np.dtype(tensor_dtype_to_np_dtype(tensor.elem_type))
        except KeyError:
            raise UsageError(f"--constant {spec!r}: input {name!r} has no type numbers can take") from None
        try:
            values = np.array([_truth(v) if dtype == np.bool_ else _number(v) for v in text.split(",")])
            if values.dtype == object:      # an integer beyond int64
                raise ValueError(text)
        except ValueError:
            what = "0 or 1 (false or true)" if dtype == np.bool_ else f"{dtype.name} numbers"
            raise UsageError(f"--constant {spec!r}: the values must be {what}, as input {name!r} takes") from None
        shape = (shapes or {}).get(name)
        if shape is not None and math.prod(shape) != values.size:
            raise UsageError(f"--constant {spec!r} gives {values.size} values, but --shape gives {name!r} the shape "
                             f"{tuple(shape)} ({math.prod(shape)} values)")
        if shape is None and tensor.HasField("shape") and all(d.HasField("dim_value") for d in tensor.shape.dim):
            shape = [d.dim_value for d in tensor.shape.dim]
        if shape is not None and math.prod(shape) == values.size:
            values = values.reshape(shape)
        try:        # checked as from_onnx checks constants, and cast to the input's type (onnxruntime's feeds)
            constants[name] = input_constant(inputs[name], values, f"--constant {spec!r}")
        except ValueError as e:
            raise UsageError(str(e)) from None
    return constants


def _truth(text: str) -> bool:
    """A bool input's value on the command line: 0 / 1 / false / true (ValueError otherwise)."""
    truth = {"0": False, "1": True, "false": False, "true": True}.get(text.strip().lower())
    if truth is None:
        raise ValueError(text)
    return truth


def _number(text: str):
    """`text` as an int, else as a float (ValueError if neither)."""
    try:
        return int(text)
    except ValueError:
        return float(text)


def onnx_file(args) -> tuple:
    """(title, graph, the input values --constant fixes) of the ONNX file --onnx names (UsageError
    when it cannot be read or imported, MemoryError when its sizes are beyond the machine's memory)."""
    from taskdsl.graph import from_onnx
    from .inference import check_memory
    from taskdsl.graph.onnx_import import ConstantRequiredError, UnsupportedOnnxError
    from taskdsl.graph.onnx_import.model import load_model
    if args.dtype != "f32" or args.small:
        raise UsageError("--dtype and --small apply to zoo models; an ONNX model runs with its own types and sizes")
    shapes, given = {}, {}
    try:
        model = load_model(args.onnx)
        given = onnx_given_shapes(model, args.shape)
        constants = onnx_constants(model, args.constant, given)
        shapes = {name: shape for name, shape in onnx_shapes(model, args.batch, args.seq, given, constants).items()
                  if name not in constants}
        graph = from_onnx(model, shapes=shapes, constants=constants)
    except ConstantRequiredError as e:
        raise UsageError(f"{args.onnx}: {e}; on the command line: --constant {e.inputs[0]}=V,V,...") from None
    except ValueError as e:       # OnnxImportError, and shapes or constants that contradict the model
        by_flags = {name: shape for name, shape in shapes.items() if name not in given}
        raise UsageError(f"{args.onnx}: {e}{_sizing_hint(e, args, by_flags)}") from None
    check_memory(graph)
    return f"{args.onnx}: {graph!r}", graph, constants


def _sizing_hint(error: ValueError, args, by_flags: dict) -> str:
    """The sizes --batch / --seq gave the inputs, for an error about shapes (a default --batch 1 the user never
    wrote may be its cause); "" for other errors."""
    from taskdsl.graph.onnx_import import UnsupportedOnnxError
    if not by_flags or isinstance(error, UnsupportedOnnxError) or not re.search(r"shape|dim|size|broadcast|fit",
                                                                               str(error)):
        return ""
    seq = "" if args.seq is None else f" and --seq {args.seq}"
    sized = ", ".join(f"{name} {tuple(shape)}" for name, shape in by_flags.items())
    return f" (the inputs' symbolic dims were sized by --batch {args.batch}{seq}: {sized})"


def command_run(args) -> int:
    """Build, time and check one model; print the report. Exit status 1 if the outputs do not match."""
    from .inference import infer, sample_inputs
    if (args.name is None) == (args.onnx is None):
        raise UsageError("run takes a model name or --onnx PATH (one of the two); see `python -m models list`")
    if args.onnx is not None and not args.onnx:
        raise UsageError("--onnx needs a path to an ONNX file")
    target = check_flags(args)
    fixed, weights = {}, {}
    if args.onnx:
        title, graph, fixed = onnx_file(args)
        model = args.onnx       # onnxruntime reads the file itself (serialized again, the model took seconds)
        feeds = sample_inputs(graph)
    elif args.constant or args.shape:
        raise UsageError(f"{'--constant' if args.constant else '--shape'} applies to --onnx models")
    else:
        title, graph, vocab = zoo_model(args)
        feeds = sample_inputs(graph, vocab)
        model, weights = checkable_export(args, graph)
    print(f"{title}: building for {target}...", flush=True)     # the first build compiles for a minute or more
    result = infer(graph, model, feeds, target, args.iters, args.channels_last, fixed, weights)
    print_result(title, result)
    return 0 if result.ok else 1


def checkable_export(args, graph) -> tuple:
    """`export_if_checkable` of the zoo model the flags name (`graph`), or with --dtype bf16 of the model in f32 (the
    same weights, not rounded to bf16): onnxruntime's CPU kernels take next to no bf16 (`declared_feeds`)."""
    if args.dtype == "bf16":
        spec = get(args.name)
        graph = spec.build(spec.config(args.small, args.seq), batch=args.batch, dtype="float32")
    return export_if_checkable(graph)


def export_if_checkable(graph) -> tuple:
    """(the graph as ONNX, its weights left out as arrays: `export_onnx`) when onnxruntime is there to run it (the
    reference), else (None, {})."""
    try:
        import onnxruntime  # noqa: F401
    except ImportError:
        return None, {}
    from .onnx_export import export_onnx
    weights: dict = {}
    return export_onnx(graph, weights=weights), weights


def main(argv=None) -> int:
    """Run the command line; return the exit status (2 for bad input)."""
    args = parser().parse_args(argv)       # exits with 2 on a bad flag
    saved_tune = os.environ.get("TASKDSL_TUNE")   # --no-tune sets it for this command only (tests call main)
    try:
        if args.command == "list":
            return command_list()
        if args.command == "run":
            return command_run(args)
        from .bench import command_bench
        return command_bench(args, check_flags(args))
    except (UsageError, td.ConfigError) as e:
        print(f"python -m models: error: {e}", file=sys.stderr)
        return 2
    except MemoryError as e:
        print(f"python -m models: error: not enough memory for this run: {e}; use a smaller --batch or --seq",
              file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("python -m models: interrupted", file=sys.stderr)
        return 130
    finally:
        if saved_tune is None:
            os.environ.pop("TASKDSL_TUNE", None)
        else:
            os.environ["TASKDSL_TUNE"] = saved_tune
