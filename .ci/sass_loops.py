"""SASS of the GPU matmul and conv kernels' k loops, read with no GPU: what a change did to the instructions.

    pip install nvidia-cuda-cuobjdump nvidia-cuda-nvdisasm     # the disassembler (not project dependencies)
    python .ci/sass_loops.py                 # tensor-core default points at three sizes, ResNet-50's conv layers

For each kernel: NVRTC compiles its CUDA for sm_90, cuobjdump disassembles the cubin, and the k loop (the
smallest loop holding the most HMMA) is counted: all instructions, HMMA, LDSM, LDGSTS (16-byte async copies)
and LDG (element loads). Convolutions use the cuda target's default schedules (TASKDSL_TUNE=0) on a
simulated GPU of 132 SMs (tests/simulated_gpu.py), NHWC, f16, batch 1, as `bench conv --layout NHWC` runs them.
"""
import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np

os.environ["TASKDSL_TUNE"] = "0"
ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def disassembler_env() -> dict:
    """The environment to run cuobjdump in: PATH led by the bin folder of NVIDIA's pip wheels (cuobjdump runs
    nvdisasm from PATH), where they are installed."""
    env = dict(os.environ)
    try:
        import nvidia.cu13
        env["PATH"] = os.pathsep.join([str(Path(list(nvidia.cu13.__path__)[0], "bin")), env.get("PATH", "")])
    except ImportError:
        pass
    return env


def k_loop(source: str) -> dict:
    """Instruction counts of the k loop of the (single-kernel) CUDA `source`, compiled for sm_90."""
    from taskdsl.backend.cuda.nvrtc import compile_cubin
    with tempfile.TemporaryDirectory() as folder:
        cubin = Path(folder, "k.cubin")
        cubin.write_bytes(compile_cubin(source, "sm_90", "k"))
        sass = subprocess.run(["cuobjdump", "-sass", str(cubin)], capture_output=True, text=True, check=True,
                              env=disassembler_env()).stdout
    lines = [line for line in sass.splitlines() if re.match(r"\s+/\*[0-9a-f]{4}\*/", line)]
    address = [int(re.match(r"\s+/\*([0-9a-f]+)\*/", line).group(1), 16) for line in lines]
    loops = []      # (start, end) of each backward branch's span: the k loop is the one with the most HMMA
    for end, line in enumerate(lines):
        jump = re.search(r"BRA 0x([0-9a-f]+)", line)
        target = int(jump.group(1), 16) if jump else None
        if target is not None and target < address[end] and target in address:
            loops.append((address.index(target), end))
    start, end = max(loops, key=lambda span: (sum("HMMA" in x for x in lines[span[0]:span[1] + 1]),
                                              -(span[1] - span[0])))
    body = lines[start:end + 1]
    count = lambda op: sum(1 for line in body if re.search(rf"\b{op}\b", line))
    return dict(instructions=len(body), HMMA=count("HMMA"), LDSM=count("LDSM"), LDGSTS=count("LDGSTS"),
                LDG=count("LDG"))


def matmuls() -> None:
    import taskdsl as td
    from stdlib_ops import matmul_tc as tc
    for name, values in (("16x64 (small)", tc.SMALL), ("128x64 (default)", tc.DEFAULT), ("128x128 (large)", tc.LARGE)):
        kernel = tc.tc_matmul_kernel(tc.space().point(**values), td.f16, td.f16)
        for m, k in ((4096, 4096), (2040, 2040), (3136, 64)):
            a, b, c = np.empty((1, m, k), np.float16), np.empty((1, k, m), np.float16), np.empty((1, m, m), np.float16)
            print(f"tc matmul {name:17} {m}x{m}x{k}: {k_loop(kernel.source(a, b, c, np.zeros((1, 2), np.int32), 1, target='cuda'))}",
                  flush=True)


def convolutions() -> None:
    import pytest
    sys.path.insert(0, str(ROOT / "tests"))
    import simulated_gpu
    simulated_gpu.install(pytest.MonkeyPatch())
    simulated_gpu._Device.properties.multiprocessor_count = 132
    import taskdsl as td
    from stdlib_ops import conv
    from stdlib_ops.conv_geometry import geometry
    from taskdsl.bench.conv import RESNET50
    from taskdsl.runtime.kernel import Kernel
    launched = []
    Kernel.__call__ = lambda self, *args, **kwargs: launched.append((self, args))    # record, never run
    for c, hw, oc, k, s, p in RESNET50:
        g = geometry((1, hw, hw, c), (oc, c, k, k), s, p, layout="NHWC")
        plan = conv.plan(g, td.f16, "cuda", False, None)
        launched.clear()
        plan.run(np.zeros((1, hw, hw, c), np.float16), None, packed=np.zeros((1, c * k * k, oc), np.float16))
        kernel, args = launched[0]
        print(f"conv {c},{hw},{oc},{k},{s} split {plan.lowered.matmul.split}: "
              f"{k_loop(kernel.source(*args, target='cuda'))}", flush=True)


if __name__ == "__main__":
    matmuls()
    convolutions()
