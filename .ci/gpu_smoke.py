"""First look at a GPU machine: versions, then the cuda target's basic paths, each checked against numpy.

Run by `.ci/gpu-session smoke`. Every check prints OK or its traceback and the script goes on, so one
run shows every broken path; the exit code is the number of failed checks.
"""
import importlib
import os
import sys
import time
import traceback

import numpy as np


def versions() -> None:
    print("python", sys.version.split()[0])
    for name in ("numpy", "numba", "cuda.core", "cuda.bindings", "cuda.pathfinder", "torch", "cupy",
                 "onnxruntime", "onnx", "ml_dtypes"):
        try:
            module = importlib.import_module(name)
            print(f"{name:16} {getattr(module, '__version__', '?'):12} {getattr(module, '__file__', '')}")
        except Exception as error:       # noqa: BLE001 - a report, not a program
            print(f"{name:16} missing ({error})")
    try:
        from cuda.bindings import nvrtc
        print("nvrtc", nvrtc.nvrtcVersion())
    except Exception as error:           # noqa: BLE001
        print("nvrtc version unknown:", error)


FAILED: list = []


def check(name: str):
    """Decorator: run the check now, print OK (with its seconds) or the traceback."""
    def run(fn):
        start = time.perf_counter()
        try:
            fn()
            print(f"OK   {name} ({time.perf_counter() - start:.2f} s)", flush=True)
        except Exception:                # noqa: BLE001
            FAILED.append(name)
            print(f"FAIL {name}", flush=True)
            traceback.print_exc()
        return fn
    return run


def close(got, want, tol=1e-5) -> None:
    got, want = np.asarray(got, np.float64), np.asarray(want, np.float64)
    err = np.abs(got - want).max() / max(np.abs(want).max(), 1e-30) if want.size else 0.0
    assert err <= tol, f"relative error {err:.2e} > {tol}"


def main() -> int:
    versions()
    import taskdsl as td
    from taskdsl import blockIdx, f16, f32, threadIdx
    print("gpu_status", td.gpu_status(), flush=True)
    td.set_target(os.environ.get("SMOKE_TARGET", "cuda"))
    rng = np.random.default_rng(0)

    @td.kernel(grid=lambda N: td.cdiv(N, 128), block=128)
    def axpy(X: f32["N"], Y: f32["N"], Z: f32["N"]):  # noqa: F821
        i = blockIdx.x * 128 + threadIdx.x
        if i < N:  # noqa: F821
            Z[i] = 2.0 * X[i] + Y[i]

    x, y = rng.standard_normal(1001, dtype=np.float32), rng.standard_normal(1001, dtype=np.float32)

    @check("numpy arguments (copy in, launch, copy back)")
    def _():
        z = np.full_like(x, np.nan)
        axpy(x, y, z)
        close(z, 2 * x + y)

    @check("td.DeviceArray arguments")
    def _():
        dx, dy, dz = td.to_device(x), td.to_device(y), td.to_device(np.full_like(x, np.nan))
        axpy(dx, dy, dz)
        close(dz.numpy(), 2 * x + y)

    @check("torch CUDA tensors (no copy)")
    def _():
        import torch
        tx, ty = torch.from_numpy(x).cuda(), torch.from_numpy(y).cuda()
        tz = torch.full_like(tx, float("nan"))
        axpy(tx, ty, tz)
        close(tz.cpu().numpy(), 2 * x + y)

    @check("cupy arrays (no copy)")
    def _():
        import cupy
        cz = cupy.full(x.shape, np.nan, np.float32)
        axpy(cupy.asarray(x), cupy.asarray(y), cz)
        close(cupy.asnumpy(cz), 2 * x + y)

    @check("f16 kernel")
    def _():
        @td.kernel(grid=lambda N: td.cdiv(N, 64), block=64)
        def half_scale(X: f16["N"], Y: f16["N"]):  # noqa: F821
            i = blockIdx.x * 64 + threadIdx.x
            if i < N:  # noqa: F821
                Y[i] = X[i] * 3.0
        h = x.astype(np.float16)
        out = np.zeros_like(h)
        half_scale(h, out)
        close(out, h.astype(np.float32) * 3, 2e-3)

    import stdlib_ops as ops

    @check("stdlib matmul f32 (default schedule) vs numpy, 257x129x67")
    def _():
        a, b = rng.standard_normal((257, 67), dtype=np.float32), rng.standard_normal((67, 129), dtype=np.float32)
        close(ops.matmul(a, b), a.astype(np.float64) @ b, 1e-4)

    @check("stdlib matmul f16 (tensor cores) vs numpy, 256x136x72")
    def _():
        a = rng.standard_normal((256, 72)).astype(np.float16)
        b = rng.standard_normal((72, 136)).astype(np.float16)
        close(ops.matmul(a, b).astype(np.float32), a.astype(np.float64) @ b.astype(np.float64), 2e-2)

    @check("softmax, layer_norm, sum vs numpy")
    def _():
        v = rng.standard_normal((33, 1000), dtype=np.float32)
        e = np.exp(v - v.max(1, keepdims=True))
        close(ops.softmax(v, axis=1), e / e.sum(1, keepdims=True), 1e-5)
        close(ops.sum(v, axis=1), v.astype(np.float64).sum(1), 1e-5)

    @check("conv2d NCHW 3x3 vs a numpy im2col")
    def _():
        inp = rng.standard_normal((1, 8, 13, 11), dtype=np.float32)
        w = rng.standard_normal((16, 8, 3, 3), dtype=np.float32)
        got = ops.conv2d(inp, w, padding=1)
        padded = np.pad(inp, ((0, 0), (0, 0), (1, 1), (1, 1))).astype(np.float64)
        want = np.zeros((1, 16, 13, 11))
        for r in range(3):
            for s in range(3):
                want += np.einsum("oc,nchw->nohw", w[:, :, r, s], padded[:, :, r:r + 13, s:s + 11])
        close(got, want, 1e-4)

    return len(FAILED)


if __name__ == "__main__":
    failed = main()
    print(f"smoke: {failed} failed: {FAILED}")
    sys.exit(failed)
