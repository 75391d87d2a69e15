"""`python -m taskdsl.bench ops`: softmax, layer norm and sums of a (4096, 1024) f32 array vs numpy,
through the operator library (stdlib_ops), on the current target."""
import numpy as np

from .timing import time_cpu


def _numpy_softmax(x):
    e = np.exp(x - x.max(axis=-1, keepdims=True))
    return e / e.sum(axis=-1, keepdims=True)


def _numpy_layer_norm(x, w, b, eps=1e-5):
    mean = x.mean(axis=-1, keepdims=True)
    return (x - mean) / np.sqrt(x.var(axis=-1, keepdims=True) + eps) * w + b


def run(sizes=(4096, 1024)) -> list:
    """Rows of (name, taskdsl ms, numpy ms, GB/s, ratio, max error) on the current target."""
    import stdlib_ops as ops
    import taskdsl as td

    rows, cols = sizes
    rng = np.random.default_rng(0)
    x = rng.standard_normal((rows, cols), dtype=np.float32)
    w = rng.standard_normal(cols, dtype=np.float32)
    b = rng.standard_normal(cols, dtype=np.float32)
    nbytes = x.nbytes
    cases = [
        ("softmax", lambda: ops.softmax(x), lambda: _numpy_softmax(x), 2 * nbytes),
        ("layer_norm", lambda: ops.layer_norm(x, w, b), lambda: _numpy_layer_norm(x, w, b), 2 * nbytes),
        ("sum(axis=-1)", lambda: ops.sum(x, axis=-1), lambda: x.sum(axis=-1), nbytes),
        ("sum(all)", lambda: np.asarray(ops.sum(x)), lambda: np.asarray(x.sum()), nbytes),
    ]
    print(f"target: {td.get_target()}, input ({rows}, {cols}) f32")
    print(f"{'op':>13} {'taskdsl ms':>11} {'numpy ms':>9} {'taskdsl GB/s':>13} {'ratio':>6} {'max rel err':>12}")
    results = []
    for name, ours, theirs, moved in cases:
        got, want = ours(), theirs()
        err = float(np.abs(got.astype(np.float64) - want).max() / max(np.abs(want).max(), 1e-30))
        t_ours, t_np = time_cpu(ours, repeat=10), time_cpu(theirs, repeat=10)
        row = (name, t_ours * 1e3, t_np * 1e3, moved / t_ours / 1e9, t_np / t_ours, err)
        results.append(row)
        print(f"{name:>13} {row[1]:>11.2f} {row[2]:>9.2f} {row[3]:>13.2f} {row[4]:>6.2f} {err:>12.1e}")
    return results
