"""The on-disk compile cache: hits across processes, damaged entries, LRU eviction, the CLI."""
import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import taskdsl as td
from taskdsl.runtime import cache, config

_COMPILE_IN_A_NEW_PROCESS = """
import hashlib, numpy as np
from taskdsl.backend.cuda import nvrtc
from stdlib_ops.design_matmul import matmul_kernel
calls = []
compile_cubin = nvrtc.compile_cubin
nvrtc.compile_cubin = lambda *args, **kwargs: calls.append(1) or compile_cubin(*args, **kwargs)
a = np.ones((96, 96), np.float32)
binary = matmul_kernel.compile(a, a, a, target="cuda", arch="sm_90").binary
print(len(calls), hashlib.sha256(binary).hexdigest())
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


def test_a_new_process_loads_the_binary_an_earlier_one_compiled(tmp_path):
    """A cache hit in a new process runs no NVRTC compile and loads the same cubin (its speed is `bench`'s and
    docs/benchmarks.md's concern: this test timed it once, and failed on a busy machine)."""
    def run() -> tuple:
        env = dict(os.environ, TASKDSL_CACHE_DIR=str(tmp_path))
        out = subprocess.run([sys.executable, "-c", _COMPILE_IN_A_NEW_PROCESS], env=env, capture_output=True,
                             text=True, check=True)
        calls, digest = out.stdout.split()[-2:]
        return int(calls), digest

    cold, warm = run(), run()
    assert len(list((tmp_path / "cuda").glob("*.cubin"))) == 1
    assert cold[0] == 1 and warm == (0, cold[1])


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


def test_cubins_are_keyed_by_taskdsl_code_not_its_version_number(tmp_path, monkeypatch):
    """The key held taskdsl's version number, which stays 0.1.0 while the code (NVRTC's options, say) changes:
    a changed taskdsl loaded cubins the old one built."""
    from taskdsl.backend.cuda import nvrtc
    monkeypatch.setenv("TASKDSL_CACHE_DIR", str(tmp_path))
    calls = []
    original = nvrtc.compile_cubin
    monkeypatch.setattr(nvrtc, "compile_cubin", lambda *a: calls.append(a) or original(*a))
    kernel = _kernel(5.0)
    _compile(kernel), _compile(kernel)
    assert len(calls) == 1
    monkeypatch.setattr(cache, "code_fingerprint", lambda: "another taskdsl")
    _compile(kernel)
    assert len(calls) == 2


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


def test_stores_rescan_the_cache_only_near_its_cap_or_after_a_while(tmp_path, monkeypatch):
    """Every store scanned the whole cache (0.2 s with 8000 files); a process now keeps a running total."""
    monkeypatch.setenv("TASKDSL_CACHE_DIR", str(tmp_path))
    monkeypatch.setattr(cache, "_estimates", {})
    scans = []
    original = cache._scan
    monkeypatch.setattr(cache, "_scan", lambda: scans.append(1) or original())
    text = "x = 1\n" * 100
    modules = lambda: len(list((tmp_path / "cpu").glob("k_*.py")))
    for i in range(3):
        cache.cpu_module(f"{i:040x}", text)
    assert len(scans) == 1 and modules() == 3           # one scan, at the first store
    monkeypatch.setenv("TASKDSL_CACHE_MAX_MB", str(3.5 * len(text) / 2**20))
    cache.cpu_module(f"{3:040x}", text)                               # a fourth would pass the cap: scan, evict
    assert len(scans) == 2 and modules() == 3
    monkeypatch.delenv("TASKDSL_CACHE_MAX_MB")
    folder = cache.cache_dir()
    total, scanned = cache._estimates[folder]
    cache._estimates[folder] = total, scanned - cache.RESCAN_SECONDS  # another process may have stored since
    cache.cpu_module(f"{4:040x}", text)
    assert len(scans) == 3


def test_temporary_files_a_killed_writer_left_are_removed(tmp_path, monkeypatch):
    monkeypatch.setenv("TASKDSL_CACHE_DIR", str(tmp_path))
    (tmp_path / "cpu" / "__pycache__").mkdir(parents=True)
    old, fresh = tmp_path / "cpu" / "tmpab12.tmp", tmp_path / "cpu" / "__pycache__" / "k_x.nbi.tmp.1f2e"
    for path in (old, fresh):
        path.write_bytes(b"partial")
    os.utime(old, (1, 1))
    cache.evict(2**30)
    assert not old.exists() and fresh.exists()        # a fresh one may still be being written


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


_CPU_RUN = """
import numpy as np, taskdsl as td
@td.kernel(grid=1, block=32)
def affine(X: td.f32[32], Y: td.f32[32]):
    Y[td.threadIdx.x] = X[td.threadIdx.x] * 3.0 + 1.0
x = np.arange(32, dtype=np.float32); y = np.zeros(32, np.float32)
affine(x, y)
print("ok" if np.array_equal(y, x * 3 + 1) else "WRONG")
"""


def _cpu_run(folder, **env) -> str:
    root = str(Path(__file__).resolve().parents[1])         # this taskdsl, from a script outside the tree too
    env = dict(os.environ, TASKDSL_CACHE_DIR=str(folder), PYTHONPATH=os.pathsep.join(
        p for p in (root, os.environ.get("PYTHONPATH")) if p), **env)
    script = folder.with_name(folder.name + "_run.py")      # kernels are defined in files (their source is read)
    script.write_text(_CPU_RUN)
    done = subprocess.run([sys.executable, str(script)], env=env, capture_output=True, text=True)
    return (done.stdout.strip() or done.stderr.strip()).splitlines()[-1]


def test_damaged_cpu_modules_and_numba_files_are_rebuilt(tmp_path):
    """A generated module whose text changed (one index, g_3 for g_2 say) imported as it was and computed something
    else; a truncated numba index raised at every call. Both are rebuilt now (a fresh process each time)."""
    assert _cpu_run(tmp_path) == "ok"
    module, = (tmp_path / "cpu").glob("k_*.py")
    text = module.read_text()
    module.write_text(text.replace("3.0", "4.0") if "3.0" in text else text[: len(text) // 2])
    assert _cpu_run(tmp_path) == "ok"
    assert module.read_text() == text
    index, = (tmp_path / "cpu" / "__pycache__").glob("*.nbi")
    index.write_bytes(index.read_bytes()[:40])
    assert _cpu_run(tmp_path) == "ok" and _cpu_run(tmp_path) == "ok"


def test_a_folder_in_place_of_a_cpu_module_is_replaced(tmp_path):
    """A folder where a generated module belongs made every run warn and compile into a scratch folder."""
    assert _cpu_run(tmp_path) == "ok"
    module, = (tmp_path / "cpu").glob("k_*.py")
    module.unlink()
    (module / "stray").mkdir(parents=True)
    assert _cpu_run(tmp_path, PYTHONWARNINGS="error") == "ok"
    assert module.is_file()


def test_the_cap_is_checked_and_never_evicts_what_was_just_stored(tmp_path, monkeypatch):
    assert _cpu_run(tmp_path, TASKDSL_CACHE_MAX_MB="0") == "ok"      # the module just written stays
    # a bad cap is an error with a warm cache too, where nothing is stored (it was read only when storing)
    assert _cpu_run(tmp_path, TASKDSL_CACHE_MAX_MB="-5").startswith("taskdsl.errors.ConfigError: "
                                                                    "TASKDSL_CACHE_MAX_MB='-5'")
    monkeypatch.setenv("TASKDSL_CACHE_DIR", str(tmp_path))
    for junk in ("abc", "-1", "nan", "inf"):
        monkeypatch.setenv("TASKDSL_CACHE_MAX_MB", junk)
        with pytest.raises(ValueError, match="TASKDSL_CACHE_MAX_MB"):
            config.cache_max_bytes()
    monkeypatch.setenv("TASKDSL_CACHE_MAX_MB", "")
    assert config.cache_max_bytes() == 2048 * 2**20


def test_an_entry_under_another_key_is_not_served(tmp_path, monkeypatch):
    """A cubin and record copied over another key (an sm_80 build served for sm_90) are refused by the record's
    key, and rebuilt."""
    monkeypatch.setenv("TASKDSL_CACHE_DIR", str(tmp_path))
    first, second = _kernel(5.0), _kernel(6.0)
    want = _compile(second)
    _compile(first)
    cubins = sorted((tmp_path / "cuda").glob("*.cubin"), key=os.path.getmtime)
    for suffix in (".cubin", ".json"):
        cubins[1].with_suffix(suffix).write_bytes(cubins[0].with_suffix(suffix).read_bytes())
    assert _compile(second) == want


def test_an_unwritable_cache_costs_the_reuse_not_the_compile(tmp_path, monkeypatch):
    monkeypatch.setenv("TASKDSL_CACHE_DIR", str(tmp_path))

    def refuse(path, data):
        raise PermissionError(13, "Permission denied", str(path))

    monkeypatch.setattr(cache, "atomic_write", refuse)
    monkeypatch.setattr(cache, "_warned", set())
    with pytest.warns(UserWarning, match="cannot write the compile cache"):
        assert _compile(_kernel(7.0))
    monkeypatch.setattr(cache, "atomic_write", lambda path, data: (path.parent.mkdir(parents=True, exist_ok=True),
                                                                   path.write_bytes(data)))
    (tmp_path / "blocked").write_text("a file where a folder should be")
    monkeypatch.setenv("TASKDSL_CACHE_DIR", str(tmp_path / "blocked"))
    with pytest.raises(ValueError, match="set TASKDSL_CACHE_DIR"):
        cache.info()


def test_clear_removes_entries_and_tuning_records_only(tmp_path):
    env = dict(os.environ, TASKDSL_CACHE_DIR=str(tmp_path))
    cli = lambda action: subprocess.run([sys.executable, "-m", "taskdsl", "cache", action], env=env,
                                        capture_output=True, text=True, check=True).stdout
    assert _cpu_run(tmp_path) == "ok"
    (tmp_path / "tune").mkdir()
    (tmp_path / "tune" / f"{'cd' * 20}.json").write_text('{"point": {}}')
    (tmp_path / "cpu" / "notes.txt").write_text("mine")
    listed = cli("info")
    assert "cpu: 1 entries" in listed and "tune: 1 entries" in listed      # the module (its index goes with it)
    assert "numba: 1 entries" in listed          # the launcher for the kernel's argument types
    assert "removed 3 entries" in cli("clear") and "empty" in cli("info")
    assert (tmp_path / "cpu" / "notes.txt").read_text() == "mine"


def test_damaged_or_stray_tuning_winners_are_retuned(tmp_path, monkeypatch):
    from taskdsl.schedule import tuner
    from taskdsl.schedule.space import Space
    monkeypatch.setenv("TASKDSL_CACHE_DIR", str(tmp_path))
    space = Space("widths", {"per_thread": [1, 2, 4]})
    path = tuner._record_path("op", ((8,),), ("f32",), "cpu")
    path.parent.mkdir(parents=True)
    for point in ([], "x", {"per_thread": 3}, {"per_thread": "4"}, {"per_thread": 4}):
        path.write_text(json.dumps({"point": point, "timed_with": tuner._timed_with(space)}))
        found = tuner.cached_winner(space, "op", ((8,),), ("f32",), "cpu")
        assert found == (space.point(per_thread=4) if point == {"per_thread": 4} else None), point


def test_damaged_tuning_records_report_nothing(tmp_path, monkeypatch):
    """`tuner.report` (bench matmul and conv print it) on a damaged record: no lines, as for a missing one."""
    from taskdsl.schedule import tuner
    monkeypatch.setenv("TASKDSL_CACHE_DIR", str(tmp_path))
    path = tuner._record_path("op", ((8,),), ("f32",), "cpu")
    path.parent.mkdir(parents=True)
    timing = [{"per_thread": 2}, 1e-3, True]
    whole = {"timings": [timing], "candidates": 3, "failed": 0}
    for record in ([], None, "x", {"timings": []}, {"timings": None, "candidates": 3, "failed": 0},
                   dict(whole, timings=[[1]]), dict(whole, timings=[[timing[0], "fast", True]]),
                   dict(whole, candidates="3")):
        path.write_text(json.dumps(record))
        assert tuner.report("op", ((8,),), ("f32",), "cpu") == [], record
    path.write_text(json.dumps(whole))
    assert tuner.report("op", ((8,),), ("f32",), "cpu") == ["op ((8,),): 1 timed of 3 (0 failed)",
                                                            "  #1        1.000 ms  {'per_thread': 2}"]


def test_the_package_launchers_numba_code_is_in_the_cache_folder(tmp_path, monkeypatch):
    """numba kept the launchers' code (one per tuple of argument types) beside the package's source: 76 MB after a
    few model runs, uncounted, uncapped and left by `cache clear`. It is in the cache folder's numba/ now."""
    assert _cpu_run(tmp_path) == "ok"
    launchers = list((tmp_path / "numba").rglob("parallel.launch-*.nbc"))
    assert launchers, sorted(p.name for p in tmp_path.rglob("*"))
    monkeypatch.setenv("TASKDSL_CACHE_DIR", str(tmp_path))
    assert cache.info()["kinds"]["numba"]["entries"] >= len(launchers)
    cache.clear()
    assert not list((tmp_path / "numba").rglob("*.nb[ci]"))
    assert _cpu_run(tmp_path) == "ok"       # and compiled again


def test_winners_of_another_space_or_code_are_retuned_and_hits_are_kept_fresh(tmp_path, monkeypatch):
    """The record was keyed by (op, shapes, dtypes, device, version) only: a space given more points, or a changed
    template, kept serving the old winner, its new points never timed. A hit now also refreshes the record's time
    (the least-recently-used eviction took the most used records first)."""
    from taskdsl.schedule import tuner
    from taskdsl.schedule.space import Space
    monkeypatch.setenv("TASKDSL_CACHE_DIR", str(tmp_path))
    small, large = Space("widths", {"per_thread": [1, 4]}), Space("widths", {"per_thread": [1, 4, 8]})
    path = tuner._record_path("op", ((8,),), ("f32",), "cpu")
    path.parent.mkdir(parents=True)
    path.write_text(json.dumps({"point": {"per_thread": 4}, "timed_with": tuner._timed_with(small)}))
    os.utime(path, (1, 1))
    assert tuner.cached_winner(small, "op", ((8,),), ("f32",), "cpu") == small.point(per_thread=4)
    assert path.stat().st_mtime > 1
    assert tuner.cached_winner(large, "op", ((8,),), ("f32",), "cpu") is None
    monkeypatch.setattr(tuner, "code_fingerprint", lambda package="taskdsl": f"another {package}")
    assert tuner.cached_winner(small, "op", ((8,),), ("f32",), "cpu") is None


def test_a_module_removed_between_its_lookup_and_its_import_is_written_again(tmp_path, monkeypatch):
    """Another process's eviction or `cache clear` between the two made the kernel call a FileNotFoundError."""
    from taskdsl.runtime import cpu_modules
    monkeypatch.setenv("TASKDSL_CACHE_DIR", str(tmp_path))
    found = cpu_modules.cpu_module

    def removed_meanwhile(*args, **kwargs):
        src, path = found(*args, **kwargs)
        path.unlink()
        return src, path
    monkeypatch.setattr(cpu_modules, "cpu_module", removed_meanwhile)
    x = np.arange(8, dtype=np.float32)
    y = np.zeros(8, np.float32)
    _module_kernel(3.5)(x, y)
    np.testing.assert_array_equal(y, x + 3.5)


def _module_kernel(c: float):
    @td.kernel(block=8)
    def add_constant(x: td.f32[8], y: td.f32[8]):
        y[td.threadIdx.x] = x[td.threadIdx.x] + c
    return add_constant


def test_a_kernel_hit_refreshes_its_index_record(tmp_path, monkeypatch):
    """Only the module's time was refreshed: its index record (an entry of its own) went first when the cache was
    over its cap, and the kernel was lowered and generated again."""
    from taskdsl.runtime import cpu_modules
    monkeypatch.setenv("TASKDSL_CACHE_DIR", str(tmp_path))
    _module_kernel(1.25)(np.zeros(8, np.float32), np.zeros(8, np.float32))
    index, = [p for p in (tmp_path / "cpu").glob("*.json")]
    os.utime(index, (1, 1))
    assert cpu_modules._load(index.stem) is not None
    assert index.stat().st_mtime > 1


def test_numba_cache_dir_does_not_take_the_kernels_machine_code(tmp_path):
    """With $NUMBA_CACHE_DIR set, numba wrote the generated modules' machine code there: outside the cap, left by
    `cache clear`, orphaned once the modules were evicted."""
    elsewhere = tmp_path / "numba_elsewhere"
    assert _cpu_run(tmp_path / "cache", NUMBA_CACHE_DIR=str(elsewhere)) == "ok"
    assert list((tmp_path / "cache" / "cpu" / "__pycache__").glob("k_*.nbc"))
    assert not list(elsewhere.rglob("k_*.nb[ci]"))


_DISTINCT_KERNELS = '''
import numpy as np
import taskdsl as td
from taskdsl import f32, threadIdx


def make(c):
    @td.kernel(block=8)
    def add(x: f32[8], y: f32[8]):
        y[threadIdx.x] = x[threadIdx.x] + c
    return add


x, y = np.zeros(8, np.float32), np.zeros(8, np.float32)
for c in range(12):
    make(float(c))(x, y)
    assert (y == c).all()
'''


def test_the_cap_counts_what_numba_writes_for_a_module(tmp_path):
    """The running estimate counted a module's text only: numba's files for it are ~30 times bigger, so a 0.3 MiB cap
    held 1 MiB after 40 kernels. Now the cache stays within the cap plus about one module's files."""
    root = str(Path(__file__).resolve().parents[1])
    script = tmp_path / "distinct_kernels.py"
    script.write_text(_DISTINCT_KERNELS)
    folder, cap = tmp_path / "cache", 0.1
    env = dict(os.environ, TASKDSL_CACHE_DIR=str(folder), TASKDSL_CACHE_MAX_MB=str(cap), TASKDSL_COMPILE_WORKERS="1",
               PYTHONPATH=os.pathsep.join(p for p in (root, os.environ.get("PYTHONPATH")) if p))
    subprocess.run([sys.executable, str(script)], env=env, check=True)
    size = sum(p.stat().st_size for p in folder.rglob("*")
               if p.is_file() and "numba" not in p.relative_to(folder).parts)
    assert size <= cap * 2**20 + 64 * 1024, size


def test_cli_info_shows_a_small_cap_and_help_names_the_settings(tmp_path):
    env = dict(os.environ, TASKDSL_CACHE_DIR=str(tmp_path), TASKDSL_CACHE_MAX_MB="0.3")
    run = lambda *args: subprocess.run([sys.executable, "-m", "taskdsl", "cache", *args], env=env,
                                       capture_output=True, text=True).stdout
    assert "(cap 0.30 MiB, $TASKDSL_CACHE_MAX_MB)" in run("info")          # it said "cap 0 MiB"
    assert "$TASKDSL_CACHE_MAX_MB" in run("--help") and "$TASKDSL_CACHE_DIR" in run("--help")
