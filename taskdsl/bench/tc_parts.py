"""`python -m taskdsl.bench tc-parts`: where the tensor-core matmul's k loop spends its time (cuda, f16).

At N^3 (`--sizes`, default 4096), for the larger tiles of the template's space, four forms of the kernel
(`stdlib_ops.matmul_tc.tc_matmul_kernel(parts=...)`), each timed as CUDA-graph replays:

- all: the kernel itself, checked against numpy;
- copies: its cp.async copies, waits and barriers alone: the path from L2 to shared memory. The bytes
  they read over their time is the L2 bandwidth the tile draws (every block reads (BM + BN) x K x 2);
- math: its ldmatrix and mma alone, on whatever shared memory holds: tensor cores, shared-memory reads
  and issue slots;
- mma: its mma alone, on fragments loaded once: the most mma.sync does on the device at this tile.

A kernel about as slow as one of its parts is bound by that part; one slower than all of them overlaps
them poorly (latency, the barriers). Then cuBLAS (torch.matmul, where torch sees the GPU) at the same size,
beside the fastest math and the fastest mma alone: whether issue 5's target, 0.6x cuBLAS, is within reach. No
kernel of a tile runs faster than its math, so the fastest math is the template's ceiling at these tiles.
"""
from __future__ import annotations

import numpy as np

from .accuracy import rel_err, shown

# the points timed: the large default, the 256-wide tiles of one block an SM (which read 25% less from L2), the
# 128x64 default, and where a block may have 192 KiB of shared memory (sm_90) the 256x128 tile with a fourth stage
POINTS = (
    dict(warps=(2, 2), warp_tiles=(4, 8), bk=64, stages=3),
    dict(warps=(4, 2), warp_tiles=(4, 8), bk=64, stages=3),
    dict(warps=(2, 4), warp_tiles=(4, 8), bk=64, stages=3),
    dict(warps=(2, 2), warp_tiles=(4, 4), bk=32, stages=3),
    dict(warps=(4, 2), warp_tiles=(4, 8), bk=64, stages=4),
)


def rows(n: int) -> list:
    """A row a point of POINTS this device can run: its tile, the times in seconds of its forms (`tc.PARTS`), L2
    bytes read, max relative error."""
    import taskdsl as td
    from stdlib_ops import gemm
    from stdlib_ops import matmul_simt as simt
    from stdlib_ops import matmul_tc as tc
    from .cuda_timing import time_cuda_replayed
    rng = np.random.default_rng(0)
    a, b = (rng.standard_normal((1, n, n)).astype(np.float16) for _ in range(2))
    want = a[0].astype(np.float32) @ b[0].astype(np.float32)
    a_, b_, index = td.to_device(a), td.to_device(b), td.to_device(simt.batch_index((), (), ()))
    out = []
    space = gemm.TENSOR_CORE.space("cuda", 2)       # the space the tuner searches on this device
    for values in POINTS:
        try:
            p = space.point(**values)
        except ValueError:      # more shared memory than a block of this device may have
            continue
        bm, bn, _ = tc.tile_shape(p)
        c = td.to_device(np.zeros((1, n, n), np.float16))
        times = {}
        for parts in tc.PARTS:
            kernel = tc.tc_matmul_kernel(p, td.f16, td.f16, 8, parts)
            times[parts] = time_cuda_replayed(lambda: kernel(a_, b_, c, index, 1))
            if parts == "all":
                got = c.numpy()[0].astype(np.float32)
                err = rel_err(got, want)
        l2_bytes = td.cdiv(n, bm) * td.cdiv(n, bn) * (bm + bn) * n * 2
        out.append(dict(point=p, tile=f"{bm}x{bn}x{p.bk} s{p.stages}", l2_bytes=l2_bytes, err=err, **times))
    return out


TIMED_PARTS = ("copies", "math", "mma")
TARGET = 0.6        # issue 5: f16 tensor-core matmul at 4096^3 >= 0.6x cuBLAS on an H100


def bound(r: dict) -> str:
    """What bounds a row's kernel: its slowest part within 15% of it ("copies", "math" or "mma"), else "overlap"."""
    part = max(TIMED_PARTS, key=lambda name: r[name])
    return part if r["all"] < 1.15 * r[part] else "overlap"


def verdict(math_ratio: float, mma_ratio: float) -> str:
    """What the fastest math alone at `math_ratio` x cuBLAS and the fastest mma alone at `mma_ratio` x say of the
    TARGET."""
    if math_ratio >= TARGET:
        return f"{TARGET}x is within the math's reach: the rows above say what the whole kernel loses to its copies"
    if mma_ratio >= TARGET:
        return (f"the math alone is below {TARGET}x at every tile, the mma alone is not: fragment loads (ldmatrix) "
                "stand between them")
    return f"below {TARGET}x even with no copies or fragment loads: this template cannot reach it (wgmma can)"


def cublas_time(n: int):
    """torch.matmul's time for f16 N x N operands (cuBLAS), or None without torch or a GPU torch sees."""
    try:
        import torch
    except ImportError:
        return None
    if not torch.cuda.is_available():
        return None
    from .cuda_timing import time_torch_replayed
    a, b = (torch.randn(n, n, device="cuda", dtype=torch.float16) for _ in range(2))
    return time_torch_replayed(lambda: torch.matmul(a, b))


def run(sizes=None) -> list:
    """Print and return the rows of each size (cuda target only)."""
    results = []
    for n in sizes or (4096,):
        tflops = lambda t: 2.0 * n ** 3 / t / 1e12
        print(f"tensor-core matmul {n}^3 f16 in parts: ms (TFLOP/s of the whole product; copies: L2 TB/s)")
        print(f"{'tile':>16} {'all':>15} {'copies':>15} {'math':>15} {'mma':>15} {'bound by':>9} {'max rel err':>12}")
        size_rows = rows(n)
        if not size_rows:
            print("no point of the table fits this device's shared memory")
            continue
        for r in size_rows:
            r.update(size=n, bound=bound(r))
            print(f"{r['tile']:>16} {r['all'] * 1e3:>7.3f} ({tflops(r['all']):>5.0f}) "
                  f"{r['copies'] * 1e3:>7.3f} ({r['l2_bytes'] / r['copies'] / 1e12:>5.2f}) "
                  f"{r['math'] * 1e3:>7.3f} ({tflops(r['math']):>5.0f}) "
                  f"{r['mma'] * 1e3:>7.3f} ({tflops(r['mma']):>5.0f}) {r['bound']:>9} "
                  f"{shown(r['err'], 'f16', r['tile'])}", flush=True)
            results.append(r)
        fastest_math = min(size_rows, key=lambda r: r["math"])
        fastest_mma = min(size_rows, key=lambda r: r["mma"])
        t_peer = cublas_time(n)
        if t_peer is None:
            print("cuBLAS: not timed (torch with a GPU is not installed)")
        else:
            math_ratio, mma_ratio = t_peer / fastest_math["math"], t_peer / fastest_mma["mma"]
            print(f"cuBLAS (torch.matmul) {t_peer * 1e3:.3f} ms ({tflops(t_peer):.0f} TFLOP/s); {TARGET}x of it: "
                  f"{TARGET * tflops(t_peer):.0f} TFLOP/s; the fastest math alone: {tflops(fastest_math['math']):.0f} "
                  f"TFLOP/s ({math_ratio:.2f}x cuBLAS, {fastest_math['tile']}); the fastest mma alone: "
                  f"{tflops(fastest_mma['mma']):.0f} ({mma_ratio:.2f}x, {fastest_mma['tile']}): "
                  f"{verdict(math_ratio, mma_ratio)}")
        for r in size_rows:
            r.update(cublas=t_peer)
    return results
