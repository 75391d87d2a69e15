"""What a host run of generated CUDA costs (tests/cuda_on_host.py): barrier-heavy kernels, median of three runs.

    PYTHONPATH=. python tests/bench_host_runner.py                    # this tree's runner
    git show b659438:tests/cuda_on_host.py > /tmp/old_runner.py       # session 48's (a std::thread per thread)
    PYTHONPATH=. python tests/bench_host_runner.py /tmp/old_runner.py
    PYTHONPATH=. python tests/bench_host_runner.py --space            # every point of the space against numpy
    PYTHONPATH=. python tests/bench_host_runner.py --space8           # ... of the 8-bit space

`tree_sum` sums 2^16 f32 in 256 blocks of 256 threads (eight __syncthreads each); the tensor-core template
(this tree's runner only: older ones refuse inline PTX) runs the 28 points that cover every pair of its axis
values, one block each, K through the ring of stages; with --space, every point of the space (sm_90's: 153), its result checked
against numpy (the tests run the covering points).
"""
from __future__ import annotations

import importlib.util
import sys
import time

import numpy as np

import taskdsl as td
from stdlib_ops import matmul_simt as simt
from stdlib_ops import matmul_tc as tc
from tests.kernels import tree_sum
from tests.ops.test_matmul_tc import HOPPER_SMEM, _covering, one_block_shape


def _runner(path: str | None):
    if path is None:
        from tests import cuda_on_host
        return cuda_on_host
    spec = importlib.util.spec_from_file_location("old_runner", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _median_seconds(run) -> float:
    run()       # builds and loads the libraries
    times = []
    for _ in range(3):
        start = time.perf_counter()
        run()
        times.append(time.perf_counter() - start)
    return sorted(times)[1]


def _launch(runner, kernel, *args):
    args = kernel.arguments(args, {})
    binding = kernel.bind(args, "cuda")
    source = kernel.source(*args, target="cuda")
    return lambda: runner.run_source(source, binding.grid, binding.block, binding.values, kernel.name)


def every_point() -> None:
    """Run every point of the tensor-core space (a Hopper GPU's, the largest) on the host against numpy; print the
    time and the largest error."""
    from tests.cuda_on_host import run_on_host
    start, worst = time.perf_counter(), 0.0
    points = tc.space(HOPPER_SMEM).points()
    for i, point in enumerate(points):
        m, n, k = one_block_shape(point)
        rng = np.random.default_rng(i)
        a = rng.standard_normal((1, m, k)).astype(np.float16)
        b = rng.standard_normal((1, k, n)).astype(np.float16)
        c = np.full((1, m, n), np.nan, np.float32)
        run_on_host(tc.tc_matmul_kernel(point, td.f16, td.f32, 8), a, b, c, simt.batch_index((), (), ()), 1)
        error = float(np.abs(c[0] - a[0].astype(np.float64) @ b[0].astype(np.float64)).max())
        assert error < 1e-3, f"{point}: off by {error}"
        worst = max(worst, error)
    print(f"every point of the tensor-core space ({len(points)}) on the host: {time.perf_counter() - start:.1f} s, "
          f"largest error {worst:.1e}")


def every_8_bit_point() -> None:
    """Run every point of the 8-bit space (a Hopper GPU's) on the host against numpy, u8 x s8 and E4M3 x E5M2 taking
    turns: a partial tile in M and N, K around the ring of stages (session 87: 153 points, 47.7 s)."""
    from tests.cuda_on_host import run_on_host
    from tests.ops import test_matmul_tc_8bit as t8
    start = time.perf_counter()
    points = tc.space(HOPPER_SMEM, 8).points()
    rng = np.random.default_rng(0)
    for i, point in enumerate(points):
        a_type, b_type = [(td.u8, td.i8), (td.f8e4m3, td.f8e5m2)][i % 2]
        bm, bn, _ = tc.tile_shape(point)
        m, n, k = bm + 3, bn + 5, 2 * point.bk * (point.stages + 1) + 32
        a, bt = t8.operand(rng, a_type, (1, m, k)), t8.operand(rng, b_type, (1, n, k))
        out = t8.accumulator(a_type)
        c = np.zeros((1, m, n), out.numpy)
        run_on_host(tc.tc_matmul_kernel(point, a_type, out, 16, b_dtype=b_type), a, bt, c,
                    simt.batch_index((1,), (1,), (1,)), 1)
        t8.check(c.astype(np.float64 if out.is_float else np.int64), a, bt, k)
    print(f"every point of the 8-bit tensor-core space ({len(points)}) on the host: "
          f"{time.perf_counter() - start:.1f} s")


def main() -> None:
    """Print the medians (or, with --space / --space8, check every point)."""
    td.set_target("cpu")
    if sys.argv[1:] in (["--space"], ["--space8"]):
        (every_point if sys.argv[1] == "--space" else every_8_bit_point)()
        return
    runner = _runner(sys.argv[1] if len(sys.argv) > 1 else None)
    x = np.random.default_rng(0).standard_normal(1 << 16).astype(np.float32)
    seconds = _median_seconds(_launch(runner, tree_sum, x, np.zeros(256, np.float32)))
    print(f"tree_sum, 256 blocks x 256 threads: {seconds * 1e3:.0f} ms")
    if runner.unsupported('asm volatile("cp.async.commit_group;" ::: "memory");') is not None:
        return
    points = _covering()
    launches = []
    for point in points:
        m, n, k = one_block_shape(point)
        a, b = np.ones((1, m, k), np.float16), np.ones((1, k, n), np.float16)
        launches.append(_launch(runner, tc.tc_matmul_kernel(point, td.f16, td.f32, 8), a, b,
                                np.zeros((1, m, n), np.float32), simt.batch_index((), (), ()), 1))
    seconds = _median_seconds(lambda: [run() for run in launches])
    print(f"the tensor-core template at its {len(points)} covering points, one block each: {seconds:.2f} s")


if __name__ == "__main__":
    main()
