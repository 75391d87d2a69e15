"""Benchmarks: `python -m taskdsl.bench NAME`. Each prints taskdsl against the best local peer.

The target is the process's (TASKDSL_TARGET=cpu|cuda; default: cuda with a usable GPU, else cpu)."""
from __future__ import annotations

import argparse
import sys

from ..runtime.pipes import exit_with

BENCHMARKS = {
    "cpu-matmul": ("the DESIGN matmul on the cpu target vs numpy (512^3, 1024^3) and compile times",
                   "taskdsl.bench.cpu_matmul"),
    "matmul": ("the matmul templates vs numpy (cpu, f32; --sizes N...) or cuBLAS (cuda, f32 and f16)",
               "taskdsl.bench.matmul"),
    "conv": ("ResNet-50 conv layers (--layers depthwise: MobileNet-V2's depthwise ones, cpu; --int8: u8 by s8 into "
             "int32; --bf16: bf16), batch 1, vs onnxruntime (cpu) or cuDNN (cuda); --sizes picks layers by index",
             "taskdsl.bench.conv"),
    "launch": ("an empty kernel with 3 tensor arguments: cold compile, cached load, us per launch (--sizes N "
               "launches)", "taskdsl.bench.launch"),
    "tc-parts": ("the tensor-core matmul's k loop whole, its copies alone, its math alone and its mma alone, f16, "
                 "beside cuBLAS (cuda; --sizes N: N^3, default 4096)", "taskdsl.bench.tc_parts"),
    "written-out": ("ONNX models with GELU, Swish, Softsign and layer norms written out in elementwise operators and "
                    "reductions (older exports), vs onnxruntime (cpu)", "taskdsl.bench.written_out"),
    "ops": ("softmax, layer norm and sums of an f32 array: cpu, (4096, 1024) vs numpy; cuda, (16384, 4096) "
            "vs peak and copy bandwidth and torch (--sizes ROWS COLS)", "taskdsl.bench.ops"),
}


MAX_LAUNCHES = 10 ** 8     # ~7 minutes of cpu launches


def _check_sizes(parser: argparse.ArgumentParser, args) -> None:
    """A usage error (exit 2) for --sizes the benchmark cannot take."""
    if args.name == "written-out":
        parser.error("written-out takes no --sizes: its models have BERT-base's and ResNet's sizes")
    if args.name == "conv":
        from .conv import LAYERS
        count = len(LAYERS[args.layers or "resnet50"])
        if not all(0 <= n < count for n in args.sizes):
            parser.error(f"conv: --sizes picks layers by index, 0 to {count - 1}")
    elif not all(n > 0 for n in args.sizes):
        parser.error(f"{args.name}: --sizes must be positive, got {' '.join(map(str, args.sizes))}")
    elif args.name == "ops" and len(args.sizes) != 2:
        parser.error("ops: --sizes takes ROWS COLS")
    elif args.name == "launch" and (len(args.sizes) != 1 or args.sizes[0] > MAX_LAUNCHES):
        parser.error(f"launch: --sizes takes one number, the launches to time (at most {MAX_LAUNCHES:,})")


def main(argv=None) -> int:
    """Run the benchmark named on the command line; return the exit code."""
    parser = argparse.ArgumentParser(prog="python -m taskdsl.bench", description=__doc__)
    parser.add_argument("name", choices=sorted(BENCHMARKS), help="; ".join(f"{k}: {v[0]}" for k, v in BENCHMARKS.items()))
    parser.add_argument("--sizes", type=int, nargs="+", help="problem sizes (default: the benchmark's own)")
    parser.add_argument("--layout", choices=["NCHW", "NHWC"], help="conv: the layout taskdsl's input and output have "
                        "(default NCHW; the peer runs its own)")
    parser.add_argument("--layers", choices=["resnet50", "depthwise"], help="conv: the layer set (default resnet50)")
    parser.add_argument("--int8", action="store_true", help="conv: uint8 inputs by int8 weights into exact int32 "
                        "(cpu: vs onnxruntime's ConvInteger; cuda: the 8-bit tensor-core template vs cuDNN f16)")
    parser.add_argument("--bf16", action="store_true", help="conv: bf16 inputs and weights (cpu: vs onnxruntime's "
                        "f32 Conv of the same values; cuda: the tensor-core template vs cuDNN bf16)")
    parser.add_argument("--tune", action="store_true", help="matmul: tune each size's schedule on the cpu too (on "
                        "cuda it always does)")
    args = parser.parse_args(argv)
    for flag, benchmark in (("layout", "conv"), ("layers", "conv"), ("int8", "conv"), ("bf16", "conv"),
                            ("tune", "matmul")):
        if getattr(args, flag) and args.name != benchmark:
            parser.error(f"--{flag} applies to the {benchmark} benchmark only")
    if args.sizes:
        _check_sizes(parser, args)
    import importlib

    import taskdsl as td
    try:
        td.runtime.config.check_environment()      # a bad TASKDSL_* setting: exit 2 before the benchmark starts
        if args.int8 and args.bf16:
            parser.error("conv: --int8 and --bf16 are two benchmarks: choose one")
        if args.layers == "depthwise" and (args.int8 or args.bf16):
            parser.error(f"conv --layers depthwise is f32 only: leave out --{'int8' if args.int8 else 'bf16'}")
        if args.layers == "depthwise" and td.get_target() == "cuda":
            parser.error("conv --layers depthwise runs on the cpu target only (TASKDSL_TARGET=cpu)")
        if args.name == "written-out" and td.get_target() != "cpu":
            parser.error("written-out compares with onnxruntime on the cpu: it needs the cpu target "
                         "(TASKDSL_TARGET=cpu)")
        if args.name == "tc-parts" and td.get_target() != "cuda":
            parser.error("tc-parts times tensor-core kernels on a GPU: it needs the cuda target")
        from . import accuracy
        accuracy.wrong.clear()
        module = importlib.import_module(BENCHMARKS[args.name][1])
        options = {"sizes": tuple(args.sizes) if args.sizes else None, "layout": args.layout, "layers": args.layers,
                   "tune": args.tune or None, "int8": args.int8 or None, "bf16": args.bf16 or None}
        module.run(**{k: v for k, v in options.items() if v is not None})
    except td.ConfigError as e:         # a TASKDSL_* setting (the target, the cache folder) taskdsl cannot use
        parser.exit(2, f"{parser.prog}: error: {e}\n")
    except MemoryError as e:
        parser.exit(2, f"{parser.prog}: error: not enough memory for these sizes ({e}); use smaller --sizes\n")
    except KeyboardInterrupt:
        parser.exit(130, f"{parser.prog}: interrupted\n")
    if accuracy.wrong:      # the figures are printed, but they are a wrong kernel's
        print(f"{parser.prog}: error: wrong results: {'; '.join(accuracy.wrong)}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    exit_with(main)
