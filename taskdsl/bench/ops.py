"""`python -m taskdsl.bench ops`: softmax, layer norm and sums of an f32 array through the operator library
(stdlib_ops), on the current target; on the cpu also its sum over axis 0, its first row times its
transpose (`linear`: a matrix-vector product), its rows' argmax and maximum, the array padded by 1, two
copies of it concatenated along the rows, and its conversion to and from the 8-bit float f8e4m3 (the peer: ml_dtypes,
clipped to the format's range, as taskdsl's conversion saturates).

cpu: a (4096, 1024) array, against numpy in the same run. cuda: a (16384, 4096) array (256 MiB) in
GPU memory, results left there, timed with CUDA events from a cold L2; the achieved bandwidth
(bytes read once plus bytes written once, over the time) as a fraction of the device's
datasheet peak (memory clock x bus width) and of a device-to-device copy measured in the
same run, and torch's time for the same op when torch is installed.
"""
import ml_dtypes
import numpy as np

from .accuracy import rel_err, shown
from .timing import RATIO_LEGEND, time_cpu

CUDA_SIZES = (16384, 4096)


def _numpy_softmax(x):
    e = np.exp(x - x.max(axis=-1, keepdims=True))
    return e / e.sum(axis=-1, keepdims=True)


def _numpy_layer_norm(x, w, b, eps=1e-5):
    mean = x.mean(axis=-1, keepdims=True)
    return (x - mean) / np.sqrt(x.var(axis=-1, keepdims=True) + eps) * w + b


def run(sizes=None) -> list:
    """Rows of (name, taskdsl ms, peer ms, GB/s, ratio, max error) on the current target."""
    import taskdsl as td
    if td.get_target() == "cuda":
        return _cuda_rows(*(sizes or CUDA_SIZES))
    return _cpu_rows(*(sizes or (4096, 1024)))


def _cpu_rows(rows: int, cols: int) -> list:
    import stdlib_ops as ops
    import taskdsl as td

    rng = np.random.default_rng(0)
    x = rng.standard_normal((rows, cols), dtype=np.float32)
    w = rng.standard_normal(cols, dtype=np.float32)
    b = rng.standard_normal(cols, dtype=np.float32)
    nbytes = x.nbytes
    x8 = np.clip(x * 50, -448, 448).astype(ml_dtypes.float8_e4m3fn)
    cases = [
        ("softmax", lambda: ops.softmax(x), lambda: _numpy_softmax(x), 2 * nbytes),
        ("layer_norm", lambda: ops.layer_norm(x, w, b), lambda: _numpy_layer_norm(x, w, b), 2 * nbytes),
        ("sum(axis=-1)", lambda: ops.sum(x, axis=-1), lambda: x.sum(axis=-1), nbytes),
        ("sum(all)", lambda: np.asarray(ops.sum(x)), lambda: np.asarray(x.sum()), nbytes),
        ("sum(axis=0)", lambda: ops.sum(x, axis=0), lambda: x.sum(axis=0), nbytes),
        ("x[:1] @ x.T", lambda: ops.linear(x[:1], x), lambda: x[:1] @ x.T, nbytes),   # a product of one row
        ("argmax(axis=-1)", lambda: ops.argmax(x, axis=-1), lambda: x.argmax(axis=-1), nbytes),   # indices: exact
        ("max(axis=-1)", lambda: ops.max(x, axis=-1), lambda: x.max(axis=-1), nbytes),
        ("pad by 1", lambda: ops.pad(x, 1), lambda: np.pad(x, 1), 2 * nbytes),
        ("concat(x, x)", lambda: ops.concat([x, x], axis=-1), lambda: np.concatenate([x, x], axis=-1), 4 * nbytes),
        ("to f8e4m3", lambda: ops.cast(x, ml_dtypes.float8_e4m3fn),
         lambda: np.clip(x, -448, 448).astype(ml_dtypes.float8_e4m3fn), nbytes + x8.nbytes),
        ("from f8e4m3", lambda: ops.cast(x8, np.float32), lambda: x8.astype(np.float32), nbytes + x8.nbytes),
    ]
    print(f"target: {td.get_target()}, input ({rows}, {cols}) f32; {RATIO_LEGEND}")
    print(f"{'op':>15} {'taskdsl ms':>11} {'numpy ms':>9} {'taskdsl GB/s':>13} {'ratio':>6} {'max rel err':>12}")
    results = []
    for name, ours, theirs, moved in cases:
        got, want = ours(), theirs()
        err = rel_err(got, want)
        t_ours, t_np = time_cpu(ours, repeat=10), time_cpu(theirs, repeat=10)
        row = (name, t_ours * 1e3, t_np * 1e3, moved / t_ours / 1e9, t_np / t_ours, err)
        results.append(row)
        print(f"{name:>15} {row[1]:>11.3f} {row[2]:>9.3f} {row[3]:>13.2f} {row[4]:>6.2f} {shown(err, 'f32', name)}")
    return results


def _peak_bandwidth() -> float:
    """The device's datasheet memory bandwidth in bytes/s: double data rate x memory clock x bus width."""
    from ..backend.cuda.launch import device_state
    props = device_state().device.properties
    return 2.0 * props.memory_clock_rate * 1e3 * props.global_memory_bus_width / 8


def _copy_bandwidth(nbytes: int) -> float:
    """Bytes/s of a device-to-device copy of `nbytes` (read plus written), timed like the ops."""
    from ..runtime.device_array import empty
    from .cuda_timing import time_cuda
    src, dst = empty(nbytes, np.uint8), empty(nbytes, np.uint8)
    return 2 * nbytes / time_cuda(lambda: dst.copy_from(src))


def _torch_ops(x):
    """The same ops in torch on the GPU (None without torch, or with a torch that sees no GPU)."""
    try:
        import torch
    except ImportError:
        return None
    if not torch.cuda.is_available():
        return None
    t = torch.from_dlpack(x)
    w, b = torch.ones(t.shape[-1], device=t.device), torch.zeros(t.shape[-1], device=t.device)
    return {"softmax": lambda: torch.softmax(t, -1),
            "layer_norm": lambda: torch.nn.functional.layer_norm(t, t.shape[-1:], w, b),
            "sum(axis=-1)": lambda: t.sum(-1), "sum(all)": lambda: t.sum()}


def _cuda_rows(rows: int, cols: int) -> list:
    import stdlib_ops as ops
    import taskdsl as td

    from .cuda_timing import time_cuda_replayed, time_torch_replayed

    rng = np.random.default_rng(0)
    host = rng.standard_normal((rows, cols), dtype=np.float32)
    w, b = (rng.standard_normal(cols, dtype=np.float32) for _ in range(2))
    x, dw, db = td.to_device(host), td.to_device(w), td.to_device(b)
    nbytes = host.nbytes
    cases = [
        ("softmax", lambda: ops.softmax(x), lambda: _numpy_softmax(host), 2 * nbytes),
        ("layer_norm", lambda: ops.layer_norm(x, dw, db), lambda: _numpy_layer_norm(host, w, b), 2 * nbytes),
        ("sum(axis=-1)", lambda: ops.sum(x, axis=-1), lambda: host.sum(axis=-1, dtype=np.float64), nbytes),
        ("sum(all)", lambda: ops.sum(x), lambda: host.sum(dtype=np.float64), nbytes),
    ]
    peak, copy = _peak_bandwidth(), _copy_bandwidth(nbytes)
    peers = _torch_ops(x) or {}
    print(f"target: cuda, input ({rows}, {cols}) f32 on the GPU; datasheet peak {peak / 1e9:.0f} GB/s, "
          f"device-to-device copy {copy / 1e9:.0f} GB/s; {RATIO_LEGEND}")
    print(f"{'op':>15} {'taskdsl ms':>11} {'GB/s':>7} {'of peak':>8} {'of copy':>8} {'torch ms':>9} {'ratio':>6} "
          f"{'max rel err':>12}")
    results = []
    for name, ours, oracle, moved in cases:
        err = rel_err(ours().numpy(), oracle())
        t_ours = time_cuda_replayed(ours)       # GPU time, as the peer's: both replayed as CUDA graphs
        t_peer = time_torch_replayed(peers[name]) if name in peers else float("nan")
        rate = moved / t_ours
        row = (name, t_ours * 1e3, t_peer * 1e3, rate / 1e9, t_peer / t_ours, err)
        results.append(row)
        print(f"{name:>15} {row[1]:>11.3f} {row[3]:>7.0f} {rate / peak:>8.2f} {rate / copy:>8.2f} {row[2]:>9.3f} "
              f"{row[4]:>6.2f} {shown(err, 'f32', name)}")
    return results
