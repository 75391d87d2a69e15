"""The tuner: time every point of a schedule space, keep the fastest, remember it on disk.

    point = tune(space, build, args, op="matmul", shapes=..., default=p0)

`build(point)` returns a Kernel (or anything with a Kernel's `compile(*args, target=)` and call,
say two kernels a call runs in turn) and `args` are the arguments to time it with. The space is
enumerated exhaustively (it is small by design); on cuda every candidate is compiled first,
in parallel threads (NVRTC runs outside the GIL), then timed with CUDA events on arguments copied
to the GPU once; on the cpu
numba compiles one at a time. Winners are stored as JSON under
`cache_dir()/tune/<key>.json`, keyed by (op, shapes, dtypes, device, taskdsl version); a record
also names the space and the code it was timed with (`_timed_with`): a winner from another space, or
from before taskdsl or its templates changed, is re-tuned. TASKDSL_TUNE=0 turns tuning off (the
default point is used). A candidate that fails to
compile or run is skipped with a warning, never fatal; a damaged record is ignored and re-tuned.
With `outputs`, a candidate that would become the best must first agree with the default's
results (`results.check`): one that does not is skipped as failed.
"""
from __future__ import annotations

import json
import platform
import warnings
from concurrent.futures import ThreadPoolExecutor

import numpy as np

from ..runtime.cache import cache_key, code_fingerprint, store, touch
from ..runtime import config
from ..runtime.config import cache_dir, get_target
from ..runtime.progress import Progress
from . import results
from ..ir.types import DataType
from .space import Point, Space


def tuning_enabled() -> bool:
    """False when TASKDSL_TUNE=0 (or false / no / off / empty: use default schedules); any other value but 1 / true /
    yes / on is an error."""
    return config.env_switch("TASKDSL_TUNE", True, "tune each new shape", "the templates' default schedules")


def device_name(target: str) -> str:
    """What a tuning result is specific to: the GPU's name and arch, or the cpu numba compiles for, its vector
    width and the threads kernels run on."""
    if target == "cuda":
        return config.gpu_status()[1]
    # the model, not only x86_64 (a cache shared by other machines); the vector width and threads the kernels
    # get ($TASKDSL_CPU_VECTOR_BITS, $TASKDSL_NUM_THREADS), which decide their code, their ranking and split-k
    from ..backend.cpu import vectors
    from ..backend.cpu.launch import num_threads
    return f"cpu {platform.machine()} {_cpu_name()} {vectors.host().bits}-bit x{num_threads()}"


def _cpu_name() -> str:
    """The CPU numba compiles for, as LLVM names it ('znver3', 'skylake-avx512'): $NUMBA_CPU_NAME, else the host."""
    from numba.core import config as numba_config
    if numba_config.CPU_NAME:
        return numba_config.CPU_NAME
    import llvmlite.binding as llvm
    return llvm.get_host_cpu_name()


def _record_path(op: str, shapes, dtypes, target: str):
    from .. import __version__
    fast = f"fast={config.fast_compile_enabled()}"      # a fast-compile build ranks other code
    debug = ("debug",) if target == "cpu" and config.debug_enabled() else ()     # so does a checked cpu build
    early = ("cp_async_early",) if config.cp_async_early_enabled() else ()        # and copies landing at issue
    key = cache_key(op, repr(_plain(shapes)), repr(dtypes), device_name(target), __version__, fast, *debug, *early)
    return cache_dir() / "tune" / f"{key}.json"


def _plain(value):
    """Shapes as one key whatever their form: numpy ints as ints, lists as tuples (`[[4099]]`, `((np.int64(4099),),)`
    and `((4099,),)` keyed three records of one problem)."""
    if isinstance(value, np.generic):
        return value.item()
    return tuple(map(_plain, value)) if isinstance(value, (tuple, list)) else value


def _to_json(value):
    if isinstance(value, np.generic):      # numpy scalars (axes built with np.arange): JSON's numbers and bools
        return value.item()
    return list(map(_to_json, value)) if isinstance(value, tuple) else value


def _from_json(value):
    return tuple(map(_from_json, value)) if isinstance(value, list) else value


def _point_json(p: Point) -> dict:
    return {k: _to_json(v) for k, v in p.values}


def report(op: str, shapes, dtypes, target: str, top: int = 5, default: Point | None = None) -> list:
    """Lines describing the stored tuning of this problem: its `top` fastest candidates, `default`'s rank and the
    slowest, each with its time (one cut after a run, SLOW_CUT, is marked '1 run'); [] when none is stored."""
    record = _stored_timings(op, shapes, dtypes, target)
    if record is None:
        return []
    timings = record["timings"]
    ranks = list(range(min(top, len(timings))))
    if default is not None:
        ranks += [k for k, t in enumerate(timings) if t[0] == _point_json(default) and k >= top]
    ranks += [len(timings) - 1] if len(timings) > max(ranks, default=-1) + 1 else []
    lines = [f"{op} {shapes}: {len(timings)} timed of {record['candidates']} ({record['failed']} failed)"]
    for k in ranks:
        point, seconds, full = timings[k]
        tag = " (default)" if default is not None and point == _point_json(default) else ""
        lines.append(f"  #{k + 1:<4} {seconds * 1e3:9.3f} ms{'' if full else ' (1 run)'}{tag}  {point}")
    return lines


# What reading a damaged record raises (JSON nested past the parser's depth: RecursionError)
DAMAGED_RECORD = (OSError, ValueError, KeyError, TypeError, AttributeError, ArithmeticError, RecursionError)


def _stored_timings(op: str, shapes, dtypes, target: str) -> dict | None:
    """The stored record of this problem with its timings, or None (absent, or damaged: each timing must be
    [point, seconds, timed in full], the counts whole numbers)."""
    try:
        record = json.loads(_record_path(op, shapes, dtypes, target).read_bytes())
        timings = record["timings"]
        well_formed = (isinstance(timings, list) and all(isinstance(record[k], int) for k in ("candidates", "failed"))
                       and all(isinstance(t, list) and len(t) == 3 and isinstance(t[0], dict)
                               and isinstance(t[1], (int, float)) for t in timings))
    except DAMAGED_RECORD:
        return None
    return record if well_formed else None


def cached_winner(space: Space, op: str, shapes, dtypes, target: str, checked: bool = False) -> Point | None:
    """The stored winner for this problem, or None (absent, damaged, or no longer in the space; with `checked`, one
    whose results were not checked against the default's when it was chosen)."""
    path = _record_path(op, shapes, dtypes, target)
    try:
        record = json.loads(path.read_text())
        if record.get("timed_with") != _timed_with(space) or (checked and record.get("checked") is not True):
            return None
        point = space.point(**{k: _from_json(v) for k, v in record["point"].items()})
    except DAMAGED_RECORD:
        return None
    touch(path)
    # the space's own point (its values' types: numpy scalars come back from JSON as Python numbers)
    return next((p for p in space.points() if p == point), None)


def _timed_with(space: Space) -> str:
    """What a winner was chosen among and timed as: the space's name and valid points, taskdsl's code and the
    templates' (`stdlib_ops`): a record of another space or code was the best of other candidates."""
    return cache_key(space.name, repr(space.points()), code_fingerprint(), code_fingerprint("stdlib_ops"))


# CUDA errors after which a context runs nothing more: every later candidate would fail too, and a winner of the
# candidates timed before would be stored as the space's
STICKY_ERRORS = ("ILLEGAL_ADDRESS", "LAUNCH_FAILED", "MISALIGNED_ADDRESS", "INVALID_ADDRESS_SPACE", "INVALID_PC",
                 "ILLEGAL_INSTRUCTION", "HARDWARE_STACK_ERROR", "CUDA_ERROR_ASSERT")


def _breaks_the_context(error: Exception) -> bool:
    """Whether `error` is one of CUDA's sticky errors (the context is lost)."""
    return any(name in str(error) for name in STICKY_ERRORS)


def _check_storable(space: Space) -> None:
    """A TypeError, before any timing, for an axis value no JSON record of a winner can hold (found only when the
    winner was stored, it lost all the timing with it)."""
    for name, choices in space.axes.items():
        for value in choices:
            try:
                json.dumps(_to_json(value))
            except (TypeError, ValueError):
                raise TypeError(f"the {space.name} space cannot be tuned: its axis {name} has the value {value!r}, "
                                "which no JSON record of the winner can hold; make its values numbers, strings, "
                                "bools or tuples of them (say, a name to look the object up by)") from None


def _check_arguments(space: Space, args: tuple, op: str, default, target: str, outputs) -> None:
    """A ValueError / TypeError for a call `tune` cannot honour (they were taken for candidates' or the default's
    failures, and tuning went on unchecked)."""
    if target not in ("cpu", "cuda"):
        raise ValueError(f"tuning {op}: target must be 'cpu' or 'cuda', got {target!r}")
    if not isinstance(default, Point) or {k for k, _ in default.values} != set(space.axes):
        raise TypeError(f"tuning {op}: default must be a Point of the {space.name} space (space.point(...)), got "
                        f"{default!r}")
    for index, dtype in (outputs or {}).items():
        if not (isinstance(index, int) and 0 <= index < len(args)):
            raise ValueError(f"tuning {op}: outputs names argument {index!r}, but the call has {len(args)} arguments")
        if not isinstance(dtype, DataType):
            raise TypeError(f"tuning {op}: outputs' types are taskdsl types such as td.f32, got {dtype!r}")


SLOW_CUT = 2.0   # a candidate whose first timed run takes this many times the best median so far is not timed on


def _timer(target: str):
    """(probe, full): one timed run after a warm-up, and the median of several (`fn` already warmed up)."""
    if target == "cuda":    # as CUDA-graph replays, as compiled graphs run: the host's launch gaps between the kernels
        from ..bench.cuda_timing import captured, time_cuda      # of a call (split-k's sum) would rank them otherwise
        last: dict = {}

        def replay(fn):     # the probe and the full timing of a candidate replay one capture of it
            if last.get("fn") is not fn:
                last.clear()            # the previous candidate's graph (and the buffers it holds) goes
                last.update(fn=fn, replay=captured(fn))
            return last["replay"]
        return (lambda fn: time_cuda(replay(fn), warmup=1, repeat=1),
                lambda fn: time_cuda(replay(fn), warmup=1, repeat=10))
    from ..bench.timing import time_cpu
    return lambda fn: time_cpu(fn, warmup=1, repeat=1), lambda fn: time_cpu(fn, warmup=0, repeat=3)


def _on_device(args: tuple) -> tuple:
    """`args` with numpy arrays copied to the GPU once: timed with numpy arrays, each launch would copy them in
    and out, and the copies (a 4096^2 matmul's 200 MB) would drown the kernels' differences."""
    from ..runtime.device_array import to_device
    return tuple(to_device(a) if isinstance(a, np.ndarray) else a for a in args)


def _reference(kernel_of, default: Point, args: tuple, outputs: dict, target: str) -> tuple:
    """(the default's output values to check candidates against, the `results.Start` they are from, None), or
    (None, None, why there are none: the default failed). An output the default leaves NaN when it starts from
    NaN is one it also reads (or leaves unwritten): then the checks start from the outputs' given values."""
    given = results.Start(args, outputs, given=True)
    try:
        kernel = kernel_of(default)
        results.poison(args, outputs)
        kernel(*args)
        reference, start = results.values(args, outputs), results.Start(args, outputs, given=False)
        if any(np.isnan(v).any() for v in reference.values()):
            given.set(args, outputs)
            kernel(*args)
            reference, start = results.values(args, outputs), given
    except Exception as e:  # noqa: BLE001 - without a reference the candidates are timed unchecked
        if target == "cuda" and _breaks_the_context(e):
            raise RuntimeError(f"tuning: the default point {default} failed on the GPU ({e}); nothing was "
                               "stored") from e
        return None, None, f"the default failed: {type(e).__name__}: {e}"
    return reference, start, None


def tune(space: Space, build, args: tuple, *, op: str, shapes, dtypes, default: Point,
         target: str | None = None, force: bool = False, show: bool | None = None,
         outputs: dict | None = None) -> Point:
    """The fastest point of `space` for `build(point)(*args)` (cached on disk; `default` when off).

    Each candidate runs once timed; one within SLOW_CUT of the best so far is then timed in full (a median).
    `outputs` ({argument index: DSL type} of what the candidates write): a candidate faster than the best so
    far is run once more and must agree with `default`'s results there, else it is skipped as failed.
    `force` re-tunes even when a winner is stored.
    """
    target = target or get_target()
    _check_arguments(space, args, op, default, target, outputs)
    if not tuning_enabled() or (target == "cuda" and not config.gpu_status()[0]):   # nothing to time a GPU kernel on
        return default
    if not force:
        hit = cached_winner(space, op, shapes, dtypes, target, checked=bool(outputs))    # (unchecked: re-tuned)
        if hit is not None:
            return hit
    _check_storable(space)
    points = space.points()
    if not points:
        warnings.warn(f"tuning {op}: the space has no valid point (its checks pruned all {space.raw_size}: "
                      f"{dict(space.pruned())}); the default schedule is used", stacklevel=2)
        return default
    probe, full = _timer(target)
    kernels: dict = {}
    if target == "cuda":
        args = _on_device(args)

    def compile_one(p):
        try:
            kernel = build(p)
            kernel.compile(*args, target="cuda")
            return p, kernel
        except Exception as e:  # noqa: BLE001 - a candidate that does not compile is skipped, its error kept
            return p, e

    if target == "cuda":    # compile all first, in parallel; the timing loop then only loads cubins
        from ..backend.cpu.precompile import workers     # $TASKDSL_COMPILE_WORKERS, as graph builds
        with Progress(len(points), f"compiling {op}", show) as bar, ThreadPoolExecutor(workers()) as pool:
            for p, kernel in pool.map(compile_one, points):
                kernels[p] = kernel
                bar.step()

    def kernel_of(p):       # cuda: compiled above (the default too, unless it is off the space); cpu: numba's
        kernel = kernels[p] if p in kernels else compile_one(p)[1] if target == "cuda" else build(p)
        if isinstance(kernel, Exception):
            raise kernel
        return kernel
    reference, start, unchecked = _reference(kernel_of, default, args, outputs, target) if outputs else (None,) * 3
    best, best_time, failed, timings, first_failure = default, float("inf"), 0, [], None

    def progress() -> str:      # the bar's note: the best time so far and the failures
        parts = [f"best {best_time * 1e3:.3f} ms"] if best_time < float("inf") else []
        return ", ".join(parts + ([f"{failed} failed"] if failed else []))
    with Progress(len(points), f"tuning {op}", show) as bar:
        for p in points:
            try:
                kernel = kernel_of(p)
                run = lambda: kernel(*args)
                seconds = probe(run)
                timed_in_full = seconds <= SLOW_CUT * best_time     # only candidates that may win
                if timed_in_full:
                    seconds = full(run)
                if seconds < best_time and reference is not None:
                    results.check(run, args, outputs, reference, start)
            except Exception as e:  # noqa: BLE001 - a candidate that fails is skipped, the others still count
                if target == "cuda" and _breaks_the_context(e):
                    raise RuntimeError(f"tuning {op}: candidate {p} failed on the GPU ({e}), and the GPU cannot run "
                                       "anything more in this process; nothing was stored. The point has a bug to "
                                       "fix (or a check to refuse it); TASKDSL_TUNE=0 runs the default") from e
                failed += 1
                first_failure = first_failure or (p, e)
                bar.step(note=progress())
                continue
            timings.append([_point_json(p), seconds, timed_in_full])
            if seconds < best_time:
                best, best_time = p, seconds
            bar.step(note=progress())
    tuned = best_time < float("inf")
    if failed:      # a point the space's checks let through and that cannot run: a template or check to fix
        p, error = first_failure
        warnings.warn(f"tuning {op}: {failed} of {len(points)} candidates failed and were skipped"
                      f"{'' if tuned else ', the default schedule is used'} (first: {p}: "
                      f"{type(error).__name__}: {error})", stacklevel=2)
    if unchecked:
        warnings.warn(f"tuning {op}: the candidates' results were not checked: {unchecked}", stacklevel=2)
    if tuned:
        record = {"op": op, "shapes": repr(shapes), "dtypes": repr(dtypes), "device": device_name(target),
                  "timed_with": _timed_with(space), "point": _point_json(best), "seconds": best_time,
                  "candidates": len(points), "failed": failed, "checked": reference is not None,
                  "timings": sorted(timings, key=lambda t: t[1])}
        store(_record_path(op, shapes, dtypes, target), json.dumps(record, indent=1).encode())
    return best
