"""The on-disk compile cache: hits across processes, damaged entries, LRU eviction, the CLI."""
import json
import os
import subprocess
import sys

import numpy as np

import taskdsl as td
from taskdsl.runtime import cache

_COMPILE_TIME = """
import time, numpy as np
from stdlib_ops.design_matmul import matmul_kernel
a = np.ones((96, 96), np.float32)
matmul_kernel.source(a, a, a, target="cuda")      # imports and code paths warmed, as in a real program
matmul_kernel._frontend.clear(); matmul_kernel._lowered.clear()
start = time.perf_counter()
matmul_kernel.compile(a, a, a, target="cuda", arch="sm_90")
print(time.perf_counter() - start)
"""


def _kernel(scale: float):
    @td.kernel(grid=1, block=32)
    def scaled(X: td.f32[32]):
        X[td.threadIdx.x] = X[td.threadIdx.x] * scale

    return scaled


def _compile(kernel):
    x = np.ones(32, np.float32)
    kernel._cuda.clear()                                  # forget the in-memory copy: go to disk
    return kernel.compile(x, target="cuda", arch="sm_90").binary


def test_hit_in_a_new_process_is_10x_faster_than_a_cold_compile(tmp_path):
    def run(cache) -> float:
        env = dict(os.environ, TASKDSL_CACHE_DIR=str(cache))
        out = subprocess.run([sys.executable, "-c", _COMPILE_TIME], env=env, capture_output=True, text=True,
                             check=True)
        return float(out.stdout.strip().splitlines()[-1])

    # best of several runs on each side, so that a busy machine does not decide the ratio
    cold = min(run(tmp_path / f"cold{k}") for k in range(2))
    warm = min(run(tmp_path / "cold0") for _ in range(3))
    assert len(list((tmp_path / "cold0" / "cuda").glob("*.cubin"))) == 1
    print(f"cold compile {cold * 1e3:.0f} ms, cache hit in a new process {warm * 1e3:.1f} ms")
    assert cold >= 10 * warm, (cold, warm)


def test_damaged_entries_are_rebuilt(tmp_path, monkeypatch):
    monkeypatch.setenv("TASKDSL_CACHE_DIR", str(tmp_path))
    kernel = _kernel(2.0)
    original = _compile(kernel)
    cubin, = (tmp_path / "cuda").glob("*.cubin")
    record = json.loads(cubin.with_suffix(".json").read_text())
    assert record["size"] == len(original) and record["arch"] == "sm_90"

    cubin.write_bytes(original[: len(original) // 2])      # truncated
    assert _compile(kernel) == original
    assert cubin.read_bytes() == original

    cubin.write_bytes(b"\0" * len(original))               # same size, wrong bytes
    assert _compile(kernel) == original
    cubin.with_suffix(".json").write_text("{not json")     # damaged record
    assert _compile(kernel) == original
    assert json.loads(cubin.with_suffix(".json").read_text())["sha256"] == record["sha256"]


def test_fast_compile_builds_cubins_at_nvrtcs_least_optimization_and_caches_them_apart(tmp_path, monkeypatch):
    """Under td.fast_compile NVRTC runs with -Ofast-compile=max; the optimized and the fast cubin are two
    cache entries, and each mode loads its own."""
    from taskdsl.backend.cuda import nvrtc
    monkeypatch.setenv("TASKDSL_CACHE_DIR", str(tmp_path))
    calls = []
    original = nvrtc.compile_cubin
    monkeypatch.setattr(nvrtc, "compile_cubin", lambda *a: calls.append(a[3]) or original(*a))
    kernel = _kernel(3.0)
    cubins = {}
    for fast in (True, False, True, False):
        td.fast_compile(fast)
        cubins.setdefault(fast, _compile(kernel))
        assert _compile(kernel) == cubins[fast]
    assert calls == [True, False] and cubins[True] != cubins[False]
    assert len(list((tmp_path / "cuda").glob("*.cubin"))) == 2
    records = [json.loads(p.read_text()) for p in (tmp_path / "cuda").glob("*.json")]
    assert sorted(r["fast_compile"] for r in records) == [False, True]


def test_least_recently_used_entries_are_evicted(tmp_path, monkeypatch):
    monkeypatch.setenv("TASKDSL_CACHE_DIR", str(tmp_path))
    first, second, third = _kernel(1.0), _kernel(2.0), _kernel(3.0)
    size_of_one = len(_compile(first)) + 400          # the cubin and its JSON record
    monkeypatch.setenv("TASKDSL_CACHE_MAX_MB", str(2.5 * size_of_one / 2**20))
    _compile(second)
    os.utime(next(iter(sorted((tmp_path / "cuda").glob("*.cubin"), key=os.path.getmtime))), (1, 1))
    _compile(first)                                   # a hit refreshes the first entry ...
    _compile(third)                                   # ... so the second one is the oldest and goes
    kinds = cache.info()["kinds"]
    assert kinds["cuda"]["entries"] == 2
    assert cache.evict(0) == 2 and cache.info()["kinds"] == {}


def test_cli_info_and_clear(tmp_path):
    env = dict(os.environ, TASKDSL_CACHE_DIR=str(tmp_path))
    cli = lambda action: subprocess.run([sys.executable, "-m", "taskdsl", "cache", action], env=env,
                                        capture_output=True, text=True, check=True).stdout
    assert "empty" in cli("info")
    os.environ_backup = None
    (tmp_path / "cuda").mkdir()
    cache_key = "ab" * 20
    (tmp_path / "cuda" / f"{cache_key}.cubin").write_bytes(b"x" * 10)
    (tmp_path / "cuda" / f"{cache_key}.json").write_text("{}")
    assert "cuda: 1 entries" in cli("info")
    assert "removed 1 entries" in cli("clear")
    assert "empty" in cli("info")
