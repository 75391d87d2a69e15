"""`python -m taskdsl.bench matmul`: the matmul templates against the best local peer, in one run.

cpu target: stdlib_ops.matmul (the register-tile cpu template at its default schedule, or tuned with --tune)
against numpy's BLAS, f32; and, as the graph layer runs constant weights, with B packed once outside the
timing (`plan.pack_b`); E4M3 operands into f32 against numpy on their f32 values (ml_dtypes' conversion); s8
by u8 into i32 against numpy's f64 product of their values (exact); u8 by s8 (a dynamically quantized model's
activations by its weights) against onnxruntime's MatMulInteger, B an initializer (its 8-bit kernels, AVX-512
VNNI where the host has it; without VNNI they saturate, and a note says by how much), where onnxruntime is
installed, both checked against the exact product; then batched products of small matrices
(`stdlib_ops.matmul_small`), the same call against numpy's. cuda target: the tuned plan, called as
stdlib_ops.matmul calls it (padded copies of unaligned operands and split-k sums included), against
torch.matmul (cuBLAS, TF32 off), f32 and f16; E4M3 into f32 against torch._scaled_mm (cuBLASLt's 8-bit
product, scales 1; where it refuses a size, f16 cuBLAS, named in the row); int8 into int32 against
torch._int_mm (likewise); and DESIGN.md's kernel (f32): each side's kernels captured into a CUDA graph and
timed as its replays with CUDA events (GPU time only; 'call ms' is a taskdsl call's time with its host
launch cost and output allocation, td.DeviceArray operands).
"""
from __future__ import annotations

import time

import numpy as np

from .accuracy import rel_err, shown
from .onnx_peer import session_of
from .timing import RATIO_LEGEND, time_cpu


def _cpu_rows(sizes, tune: bool) -> list:
    import ml_dtypes

    import stdlib_ops as ops
    import taskdsl as td
    from stdlib_ops import gemm
    rng = np.random.default_rng(0)
    rows = []
    for n in sizes:
        a = rng.standard_normal((n, n), dtype=np.float32)
        b = rng.standard_normal((n, n), dtype=np.float32)
        c = ops.matmul(a, b, tune=tune)           # compiles (and tunes) outside the timing
        t_td = time_cpu(lambda: ops.matmul(a, b, tune=tune), repeat=3)
        panels = gemm.plan(a.shape, b.shape, td.f32, "cpu", tune).pack_b(b)
        t_packed = time_cpu(lambda: ops.matmul(a, b, tune=tune, packed=panels), repeat=3)
        t_np = time_cpu(lambda: a @ b, repeat=5)
        err = max(rel_err(c, a @ b), rel_err(ops.matmul(a, b, tune=tune, packed=panels), a @ b))
        rows.append(dict(size=n, dtype="f32", taskdsl=t_td, packed=t_packed, peer=t_np, err=err))
    e4m3 = lambda n: tuple(rng.standard_normal((n, n), dtype=np.float32).astype(ml_dtypes.float8_e4m3fn)
                           for _ in range(2))
    s8_u8 = lambda n: (rng.integers(-128, 128, (n, n)).astype(np.int8), rng.integers(0, 256, (n, n)).astype(np.uint8))
    # (row, operands of size n, the type numpy multiplies them in, the oracle's): E4M3 into f32 against numpy on
    # ml_dtypes' f32 values; s8 by u8 into exact i32 against numpy's f64 BLAS on their values (exact, its fastest)
    for label, operands, peer_type, exact_type in (("f8e4m3", e4m3, np.float32, np.float64),
                                                   ("s8 x u8", s8_u8, np.float64, np.int64)):
        for n in sizes:
            a, b = operands(n)
            c = ops.matmul(a, b, tune=tune)
            t_td = time_cpu(lambda: ops.matmul(a, b, tune=tune), repeat=3)
            t_np = time_cpu(lambda: a.astype(peer_type) @ b.astype(peer_type), repeat=5)
            err = rel_err(c, a.astype(exact_type) @ b.astype(exact_type))
            rows.append(dict(size=n, dtype=label, taskdsl=t_td, peer=t_np, err=err))
    return rows + _integer_rows(sizes, tune, rng)


def _integer_rows(sizes, tune: bool, rng) -> list:
    """u8 by s8 into i32, as called and with B packed once, against onnxruntime's MatMulInteger ([] without it)."""
    try:
        import onnxruntime  # noqa: F401 (the peer: `session_of`)
    except ImportError:
        return []
    import onnx
    from onnx import TensorProto, helper

    import stdlib_ops as ops
    import taskdsl as td
    from stdlib_ops import gemm
    rows = []
    for n in sizes:
        a, b = rng.integers(0, 256, (n, n)).astype(np.uint8), rng.integers(-128, 128, (n, n)).astype(np.int8)
        graph = helper.make_graph([helper.make_node("MatMulInteger", ["a", "b"], ["y"])], "mm",
                                  [helper.make_tensor_value_info("a", TensorProto.UINT8, a.shape)],
                                  [helper.make_tensor_value_info("y", TensorProto.INT32, None)],
                                  [onnx.numpy_helper.from_array(b, "b")])
        session = session_of(graph)
        panels = gemm.plan(a.shape, b.shape, td.u8, "cpu", tune, b_dtype=td.i8).pack_b(b)
        c, c_packed = ops.matmul(a, b, tune=tune), ops.matmul(a, b, tune=tune, packed=panels)
        t_td = time_cpu(lambda: ops.matmul(a, b, tune=tune), repeat=3)
        t_packed = time_cpu(lambda: ops.matmul(a, b, tune=tune, packed=panels), repeat=3)
        t_ort = time_cpu(lambda: session.run(None, {"a": a}), repeat=5)
        exact = a.astype(np.int64) @ b.astype(np.int64)
        err = max(rel_err(c, exact), rel_err(c_packed, exact))
        rows.append(dict(size=n, dtype="u8 x s8 vs onnxruntime", taskdsl=t_td, packed=t_packed, peer=t_ort, err=err,
                         peer_err=rel_err(session.run(None, {"a": a})[0], exact)))
    return rows


# (batch, M, K, N) of the cpu's batched small products: tiny matrices, then up to 64 x 64 (`matmul_small`)
SMALL_BATCHES = ((4096, 4, 4, 4), (1024, 8, 8, 8), (512, 16, 16, 16), (64, 64, 64, 64))


def small_products(shapes=SMALL_BATCHES) -> list:
    """Print and return the times of stdlib_ops.batch_matmul and numpy's matmul for batched products of small
    matrices (cpu, f32)."""
    import stdlib_ops as ops
    rng = np.random.default_rng(0)
    rows = []
    print(f"batched small products on cpu: taskdsl vs numpy; {RATIO_LEGEND}")
    print(f"{'batch x (M x K @ K x N)':>24} {'taskdsl ms':>11} {'numpy ms':>9} {'ratio':>7} {'max rel err':>12}")
    for batch, m, k, n in shapes:
        a = rng.standard_normal((batch, m, k), dtype=np.float32)
        b = rng.standard_normal((batch, k, n), dtype=np.float32)
        err = rel_err(ops.batch_matmul(a, b), a @ b)      # compiles outside the timing
        t_td = time_cpu(lambda: ops.batch_matmul(a, b), warmup=3, repeat=15)
        t_np = time_cpu(lambda: a @ b, warmup=3, repeat=15)
        rows.append(dict(shape=(batch, m, k, n), taskdsl=t_td, peer=t_np, err=err))
        what = f"{batch} x ({m}x{k} @ {k}x{n})"
        print(f"{what:>24} {t_td * 1e3:>11.3f} {t_np * 1e3:>9.3f} {t_np / t_td:>7.3f} "
              f"{shown(err, 'f32', 'batched matmul ' + what)}")
    return rows


def _cuda_rows(sizes, tune: bool) -> list:
    import torch
    import taskdsl as td
    torch.backends.cuda.matmul.allow_tf32 = False
    rows = []
    for tdt, torch_type in ((td.f32, torch.float32), (td.f16, torch.float16), (td.f8e4m3, torch.float8_e4m3fn),
                            (td.i8, torch.int8)):
        for n in sizes:
            try:
                rows.append(_cuda_row(n, tdt, torch_type, tune))
            except Exception as exc:      # noqa: BLE001 - the 8-bit rows are new (session 87, not yet run on a GPU)
                if tdt.bits != 8:
                    raise
                print(f"  {n} {tdt.name}: failed, left out of the table: {exc!r}", flush=True)
    return rows + _design_rows(sizes)


def _cuda_row(n: int, tdt, torch_type, tune: bool) -> dict:
    """The row of an n^3 product of DSL type `tdt` (operands of `torch_type`) against its peer."""
    import torch
    import taskdsl as td
    from stdlib_ops import gemm
    from .cuda_timing import time_cuda, time_cuda_replayed, time_torch_replayed
    a = torch.randn(n, n, device="cuda").to(torch_type)
    b = torch.randn(n, n, device="cuda").to(torch_type)
    start = time.perf_counter()
    plan = gemm.plan((n, n), (n, n), tdt, "cuda", tune)     # tunes unless a winner is cached
    plan_seconds = time.perf_counter() - start
    a_, b_ = (td.to_device(_host(t)[None]) for t in (a, b))     # the prepared launch path
    run = lambda: plan(a_, b_)      # as stdlib_ops.matmul runs it: padded copies, split-k sums included
    t_td, t_call = time_cuda_replayed(run), time_cuda(run)
    peer, peer_name = _peer(a, b)
    t_peer = time_torch_replayed(peer)
    err = rel_err(run().numpy()[0].astype(np.float64), torch.matmul(a.double(), b.double()).cpu().numpy())
    peer_shown = peer_name or ("cuBLASLt" if tdt.bits == 8 else "cuBLAS")      # torch's 8-bit products: cuBLASLt
    print(f"  {n} {tdt.name}: {t_peer / t_td:.3f}x {peer_shown}, planned in {plan_seconds:.1f} s", flush=True)
    _print_tuning(n, tdt)
    return dict(size=n, dtype=tdt.name + (f" vs {peer_name}" if peer_name else ""), taskdsl=t_td, call=t_call,
                peer=t_peer, err=err, schedule=f"{plan.point} (planned in {plan_seconds:.1f} s)")


def _host(t) -> np.ndarray:
    """A torch tensor as a numpy array (8-bit floats as ml_dtypes', through their bits)."""
    import torch
    if t.dtype == torch.float8_e4m3fn:      # numpy has no 8-bit floats: ml_dtypes' view of the bits
        import ml_dtypes
        return t.view(torch.uint8).cpu().numpy().view(ml_dtypes.float8_e4m3fn)
    return t.cpu().numpy()


def _peer(a, b) -> tuple:
    """(the peer's product of torch tensors a and b, None) for f32 / f16: torch.matmul; for E4M3:
    torch._scaled_mm into f32 (B column-major, as it takes it); for int8: torch._int_mm into int32; where those
    refuse the size, or this torch has none, (f16 torch.matmul, its name for the row)."""
    import torch
    if a.dtype == torch.float8_e4m3fn:
        bt, one = b.t().contiguous().t(), torch.ones((), device="cuda")
        product, name = lambda: torch._scaled_mm(a, bt, scale_a=one, scale_b=one, out_dtype=torch.float32), "_scaled_mm"
    elif a.dtype == torch.int8:
        product, name = lambda: torch._int_mm(a, b), "_int_mm"
    else:
        return (lambda: torch.matmul(a, b)), None
    try:
        product()
        return product, None
    except (RuntimeError, TypeError, AttributeError) as exc:
        print(f"  torch.{name} refused {tuple(a.shape)} @ {tuple(b.shape)} ({str(exc).splitlines()[0][:80]}): "
              "the peer is f16 cuBLAS", flush=True)
        a16, b16 = a.half(), b.half()
        return (lambda: torch.matmul(a16, b16)), "f16 cuBLAS"


def _print_tuning(n: int, tdt) -> None:
    """The stored tuning of an n^3 matmul: its fastest candidates, the default's rank, the slowest."""
    from stdlib_ops import gemm
    from taskdsl.schedule import tuner
    template = gemm.template_for(tdt, "cuda")
    default = template.default("cuda", tdt.bits // 8, n, n)
    for line in tuner.report(template.name, ((n, n), (n, n)), (tdt.name,), "cuda", default=default):
        print("   ", line, flush=True)


def _design_rows(sizes) -> list:
    """DESIGN.md's matmul kernel (64x64 tiles, no tuning) on the GPU, f32, against cuBLAS (TF32 off)."""
    import torch

    import stdlib_ops
    import taskdsl as td
    from .cuda_timing import time_cuda, time_cuda_replayed, time_torch_replayed
    rows = []
    for n in sizes:
        a, b = torch.randn(n, n, device="cuda"), torch.randn(n, n, device="cuda")
        c = torch.empty(n, n, device="cuda")
        a_, b_, c_ = (td.to_device(t.cpu().numpy()) for t in (a, b, c))     # the prepared launch path
        run = lambda: stdlib_ops.matmul_kernel(a_, b_, c_)
        t_td, t_call = time_cuda_replayed(run), time_cuda(run)
        t_peer = time_torch_replayed(lambda: torch.matmul(a, b))
        err = rel_err(c_.numpy(), torch.matmul(a.double(), b.double()).cpu().numpy())
        rows.append(dict(size=n, dtype="f32 DESIGN", taskdsl=t_td, call=t_call, peer=t_peer, err=err))
    return rows


def run(sizes=None, tune: bool = False) -> list:
    """Print and return GFLOP/s of taskdsl and the peer (numpy on cpu, cuBLAS on cuda) per size; on the cpu
    without `sizes`, print `small_products` after them."""
    import taskdsl as td
    target = td.get_target()
    if target == "cuda":
        rows, peer = _cuda_rows(sizes or (1024, 2039, 4096), tune=True), "cuBLAS (torch.matmul, TF32 off)"
    else:
        rows, peer = _cpu_rows(sizes or (512, 1024), tune), "numpy"
    packed = target != "cuda"
    print(f"matmul on {target}: taskdsl vs {peer}; {RATIO_LEGEND}")
    width = max([10, *(len(r["dtype"]) for r in rows)])       # "u8 x s8 vs onnxruntime" is wider than "dtype"
    print(f"{'size':>6} {'dtype':>{width}} {'taskdsl GFLOP/s':>16} {'peer GFLOP/s':>13} {'ratio':>7} "
          + (f"{'B packed GFLOP/s':>17} {'ratio':>7} " if packed else f"{'call ms':>8} ") + f"{'max rel err':>12}")
    for r in rows:
        flops = 2.0 * r["size"] ** 3
        r.update(taskdsl_gflops=flops / r["taskdsl"] / 1e9, peer_gflops=flops / r["peer"] / 1e9,
                 ratio=r["peer"] / r["taskdsl"])
        extra = f"{r['call'] * 1e3:>8.3f} " if "call" in r else ""
        if packed and "packed" in r:
            r.update(packed_gflops=flops / r["packed"] / 1e9, packed_ratio=r["peer"] / r["packed"])
            extra = f"{r['packed_gflops']:>17.1f} {r['packed_ratio']:>7.3f} "
        elif packed:
            extra = f"{'-':>17} {'-':>7} "
        print(f"{r['size']:>6} {r['dtype']:>{width}} {r['taskdsl_gflops']:>16.1f} {r['peer_gflops']:>13.1f} "
              f"{r['ratio']:>7.3f} {extra}"
              f"{shown(r['err'], r['dtype'].split()[0], 'matmul %d %s' % (r['size'], r['dtype']))}"
              + (f"  {r['schedule']}" if "schedule" in r else ""))
    for r in rows:
        if r.get("peer_err"):
            print(f"note: the peer's {r['size']} {r['dtype']} is off the exact product by {r['peer_err']:.1e} (max "
                  "rel err): onnxruntime's u8 x s8 kernel sums pairs of products in saturating 16-bit lanes on x86 "
                  "without VNNI; taskdsl's error is against the exact product")
    if target == "cpu" and sizes is None:
        print()
        small_products()
    return rows
