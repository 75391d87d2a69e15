"""Targets, argument binding and launch details of Kernel objects."""

import math
import os
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

import taskdsl as td
from taskdsl import f16, bf16, f32, i32, threadIdx, blockIdx


@td.kernel(grid=lambda M, N: (td.cdiv(N, 16), M), block=16)
def add_rows(A: f32["M", "N"], B: f32["M", "N"], C: f32["M", "N"]):
    j = blockIdx.x * 16 + threadIdx.x
    if j < N:
        C[blockIdx.y, j] = A[blockIdx.y, j] + B[blockIdx.y, j]


def test_unknown_target_rejected():
    with pytest.raises(ValueError, match="cpu, cuda"):
        td.set_target("tpu")


def test_a_target_scope_restores_the_setting_it_found(monkeypatch):
    """Unset stays unset (TASKDSL_TARGET is read again after it), a set target comes back after an exception, and
    an unknown name changes nothing."""
    from taskdsl.runtime import config
    from taskdsl.runtime.config import target_scope
    monkeypatch.setitem(config._state, "target", None)
    with target_scope("cpu"):
        assert td.get_target() == "cpu"
    assert config._state["target"] is None
    monkeypatch.setitem(config._state, "target", "cpu")
    with pytest.raises(KeyError), target_scope("cpu"):
        config._state["target"] = "cuda"      # (as a body that set another target would leave it)
        raise KeyError("inside")
    assert config._state["target"] == "cpu"
    with pytest.raises(ValueError, match="cpu, cuda"), target_scope("tpu"):
        pass
    assert config._state["target"] == "cpu"


def test_target_from_environment():
    code = "import taskdsl as td; print(td.get_target())"
    env = dict(os.environ, TASKDSL_TARGET="cpu")
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "cpu"


@pytest.mark.parametrize("name", ["TASKDSL_DEBUG", "TASKDSL_FAST_COMPILE", "TASKDSL_CP_ASYNC_EARLY", "TASKDSL_PROGRESS",
                                  "TASKDSL_TUNE", "TASKDSL_FULL_TRACEBACKS", "TASKDSL_SHARE_CODE"])
def test_on_off_variables_read_alike(name, monkeypatch):
    """One reader (`config.env_switch`): TASKDSL_DEBUG=off was on, TASKDSL_DEBUG=2 silently on, TASKDSL_TUNE=2 an
    error; now every switch takes 1/true/yes/on and 0/false/no/off in any case, and refuses anything else."""
    from taskdsl.runtime import config, progress
    from taskdsl.schedule import tuner
    read = {"TASKDSL_DEBUG": config.debug_enabled, "TASKDSL_FAST_COMPILE": config.fast_compile_enabled,
            "TASKDSL_CP_ASYNC_EARLY": config.cp_async_early_enabled, "TASKDSL_PROGRESS": progress.enabled,
            "TASKDSL_TUNE": tuner.tuning_enabled, "TASKDSL_FULL_TRACEBACKS": config.full_tracebacks_enabled,
            "TASKDSL_SHARE_CODE": config.share_code_enabled}[name]
    for switch in ("debug", "fast_compile", "cp_async_early"):     # no td.debug() / ... choice above the variable
        monkeypatch.setitem(config._state, switch, None)
    try:
        for text, on in (("0", False), (" off ", False), ("No", False), ("", False), ("1", True), ("yes", True),
                         ("ON", True)):
            monkeypatch.setenv(name, text)
            config.environment.cache_clear()
            assert read() is on, text
        monkeypatch.setenv(name, "2")
        config.environment.cache_clear()
        with pytest.raises(ValueError, match=f"{name}='2': use 1 .* or 0 "):
            read()
    finally:
        monkeypatch.undo()
        config.environment.cache_clear()


def test_non_contiguous_arrays_are_written_in_place():
    a = np.arange(60, dtype=np.float32).reshape(6, 10)
    b = np.ones((10, 6), np.float32).T
    out = np.zeros((10, 12), np.float32)[:, ::2].T     # a strided (6, 10) view
    add_rows(a, b, out)
    np.testing.assert_array_equal(out, a + 1)


@td.kernel(block=1)
def running_sum(x: f32["N"], y: f32["N"]):
    for i in range(1, N):
        y[i] = y[i - 1] + x[i - 1]


def test_one_strided_view_passed_for_two_parameters_is_one_array_in_the_kernel():
    """The cpu target copies a non-contiguous operand; it copied the view once per parameter, so the kernel read
    stale values from one copy and the copy-backs undid each other's writes."""
    contiguous, strided = np.ones(6, np.float32), np.ones(12, np.float32)[::2]
    running_sum(contiguous, contiguous)
    running_sum(strided, strided)
    np.testing.assert_array_equal(contiguous, 2.0 ** np.arange(6))
    np.testing.assert_array_equal(strided, contiguous)


@td.kernel(block=8)
def first_column_plus_one(out: f32["N", 2], inp: f32["N"]):
    if threadIdx.x < N:
        out[threadIdx.x, 0] = inp[threadIdx.x] + 1.0


def test_overlapping_views_of_which_one_is_copied_are_refused():
    """`k(a, a[:, 0])` ran on a copy of the strided input, which went back after the kernel (an input, copied back
    all the same) and undid its writes to `a`: all zeros, silently. Overlapping views the kernel would see as two
    arrays are a ValueError; a strided input apart from the output runs as before."""
    a = np.zeros((5, 2), np.float32)
    with pytest.raises(ValueError, match="arguments 'out' .written. and 'inp' share memory and one of them is not "
                                         "C-contiguous"):
        first_column_plus_one(a, a[:, 0])
    with pytest.raises(ValueError, match="'out' .written. and 'inp' share memory"):
        first_column_plus_one(a[::-1], a[:, 1])      # both strided, interleaved rows of one block
    source = np.arange(10, dtype=np.float32)
    out = np.zeros((5, 2), np.float32)
    first_column_plus_one(out, source[::2])
    np.testing.assert_array_equal(out[:, 0], source[::2] + 1)


def test_overlapping_numpy_views_are_refused_on_the_cuda_target(simulated_gpu):
    """The cuda target copies each numpy argument to the GPU on its own, contiguous or not: different views of one
    memory, one of them written, are a ValueError there (the cpu runs contiguous ones in place); one view passed
    for two parameters is one array, as on the cpu."""
    a = np.zeros((5, 2), np.float32)
    with pytest.raises(ValueError, match="'out' .written. and 'inp' are different views of the same memory"):
        first_column_plus_one(a, a[:, 0])
    x = np.ones(7, np.float32)
    with pytest.raises(ValueError, match="'y' .written. and 'x' are different views"):
        running_sum(x[:6], x[1:])
    running_sum(x[1:], x[1:])
    np.testing.assert_array_equal(x, [1, *2.0 ** np.arange(6)])
    assert len(simulated_gpu.launches) == 1


@settings(max_examples=8, deadline=None)
@given(m=st.integers(0, 5), n=st.integers(0, 37))
def test_empty_and_odd_shapes(m, n):
    a = np.random.default_rng(m * 100 + n).standard_normal((m, n)).astype(np.float32)
    b = np.full((m, n), 2.0, np.float32)
    c = np.full((m, n), np.nan, np.float32)
    add_rows(a, b, c)            # m == 0 or n == 0: an empty grid runs nothing
    np.testing.assert_array_equal(c, a + b)


def test_binding_errors_say_what_to_do():
    a = np.ones((2, 3), np.float32)
    with pytest.raises(TypeError, match="astype"):
        add_rows(a.astype(np.float64), a, a)
    with pytest.raises(ValueError, match="must be 2-d"):
        add_rows(np.ones(3, np.float32), a, a)
    with pytest.raises(ValueError, match="size 'N' is 3"):
        add_rows(a, a, np.ones((2, 4), np.float32))
    with pytest.raises(TypeError, match="takes 3 arguments"):
        add_rows(a, a)
    with pytest.raises(TypeError, match="numpy array"):
        add_rows([[1.0]], a, a)


@td.kernel(grid=1, block=8)
def axpy_default(X: f32[8], Y: f32[8], alpha: f32 = 2.0, shift: i32 = 0):
    Y[threadIdx.x] = alpha * X[(threadIdx.x + shift) % 8] + Y[threadIdx.x]


def test_keyword_arguments_and_scalar_defaults_bind_as_in_python():
    x = np.arange(8, dtype=np.float32)
    for kwargs, alpha, shift in [({}, 2.0, 0), ({"alpha": 0.5}, 0.5, 0), ({"shift": 3}, 2.0, 3),
                                 ({"shift": 1, "alpha": -1.0}, -1.0, 1)]:
        y = np.ones(8, np.float32)
        axpy_default(x, Y=y, **kwargs)
        np.testing.assert_array_equal(y, alpha * np.roll(x, -shift) + 1, err_msg=str(kwargs))
    y = np.zeros(8, np.float32)
    axpy_default(Y=y, X=x, shift=2)
    np.testing.assert_array_equal(y, 2 * np.roll(x, -2))
    assert "alpha" in axpy_default.compile(x, y, alpha=1.5, target="cpu").source
    assert axpy_default.ir(x, Y=y) == axpy_default.ir(x, y, 2.0, 0)       # inspection binds as a call does
    assert "alpha" in axpy_default.source(x, y, shift=1, target="cpu")
    assert "alpha" in axpy_default.source(X=x, Y=y, target="cuda")
    for bad, message in [(lambda: axpy_default(x), "missing a required argument: 'Y'"),
                         (lambda: axpy_default(x, y, beta=1.0), "got an unexpected keyword argument 'beta'"),
                         (lambda: axpy_default(x, y, X=x), "multiple values for argument 'X'"),
                         (lambda: axpy_default(x, y, 1.0, 2, 3), "too many positional arguments")]:
        with pytest.raises(TypeError, match=r"takes 4 arguments \(X, Y, alpha, shift\): " + message):
            bad()


def test_tensor_parameters_cannot_have_defaults():
    with pytest.raises(TypeError, match="tensor parameter 'Y' cannot have a default"):
        @td.kernel(grid=1, block=8)
        def with_default(X: f32[8], Y: f32[8] = None):
            Y[threadIdx.x] = X[threadIdx.x]


def test_repeated_calls_reuse_the_checked_binding_but_new_signatures_are_checked():
    """A call with the shapes and dtypes of an earlier one skips the checks (same sizes and grid); any other
    call is checked as the first was, so a mismatch after a cached call is still refused."""
    a, b = np.ones((3, 20), np.float32), np.full((3, 20), 2.0, np.float32)
    first = add_rows.bind((a, b, np.zeros_like(a)))
    again = add_rows.bind((b, a, np.zeros_like(a)))
    assert (again.sizes, again.grid, again.block) == (first.sizes, first.grid, first.block) == \
        ({"M": 3, "N": 20}, (2, 3, 1), (16, 1, 1))
    assert again.values[0] is b
    with pytest.raises(ValueError, match="size 'N' is 20"):
        add_rows(a, b, np.zeros((3, 21), np.float32))
    with pytest.raises(TypeError, match="astype"):
        add_rows(a, b, np.zeros((3, 20), np.float64))
    c = np.zeros((3, 20), np.float32)
    add_rows(a, b, c)
    np.testing.assert_array_equal(c, a + b)


def test_scalar_binding_and_grid_callable_errors():
    @td.kernel(grid=lambda N, Q: 1, block=1)
    def needs_q(X: f32["N"]):
        X[0] = 1.0

    with pytest.raises(ValueError, match="'Q'"):
        needs_q(np.ones(2, np.float32))

    @td.kernel(grid=1, block=1)
    def int_scalar(X: i32[1], k: i32):
        X[0] = k

    with pytest.raises(TypeError, match="integer"):
        int_scalar(np.ones(1, np.int32), 1.5)
    x = np.zeros(1, np.int32)
    int_scalar(x, 7)
    assert x[0] == 7
    for big in (2 ** 31, np.int64(2 ** 32 + 7), np.uint32(3_000_000_000), -2 ** 31 - 1):   # numpy would wrap
        with pytest.raises(ValueError, match=r"argument 'k' = -?\d+ is outside the range of i32"):
            int_scalar(x, big)
    int_scalar(x, np.int64(-2 ** 31))
    assert x[0] == -2 ** 31


@td.kernel(grid=1, block=1)
def store_float_scalars(Out: td.f64[4], h: f16, b: bf16, s: f32, d: td.f64):
    Out[0] = h
    Out[1] = b
    Out[2] = s
    Out[3] = d


def _bf16_once(x: float) -> float:
    """`x` rounded to bfloat16 (8 significant bits, exponents from -126) in one step, ties to even: exact
    arithmetic on fractions (Python's round() of a Fraction breaks ties to even)."""
    from fractions import Fraction
    import math
    if x == 0:
        return x
    exponent = max(math.frexp(abs(x))[1] - 1, -126)      # of the leading bit; subnormals share -126's ulp
    ulp = Fraction(2) ** (exponent - 7)
    return math.copysign(float(round(Fraction(abs(x)) / ulp) * ulp), x)


@settings(max_examples=60, deadline=None)
@given(st.floats(-3.39e38, 3.39e38, allow_nan=False))
def test_a_bf16_scalar_is_rounded_once(x):
    """ml_dtypes rounds an f64 to f32 and then to bfloat16: 1 + 2^-8 + 2^-40 became 1.0 (the f32 step makes it a
    tie), where a bf16 literal of the kernel is 1 + 2^-7."""
    out = np.zeros(4)
    for value in (x, 1 + 2 ** -8 + 2 ** -40):
        store_float_scalars(out, 0.0, value, 0.0, 0.0)
        assert out[1] == _bf16_once(value)


def test_float_scalars_outside_their_type_are_refused():
    """Numpy would give inf (and a RuntimeWarning); an integer too large for any float an OverflowError naming
    nothing. Values that round to the largest finite value, and inf itself, pass."""
    out = np.zeros(4)
    zeros = dict(h=0.0, b=0.0, s=0.0, d=0.0)
    for name, value in (("h", 65520.0), ("h", -1e5), ("b", 3.4e38), ("s", 1e300), ("s", 10 ** 39), ("d", 10 ** 400)):
        with pytest.raises(ValueError, match=rf"argument '{name}' = .* is outside the range of"):
            store_float_scalars(out, *{**zeros, name: value}.values())
    store_float_scalars(out, 65519.0, 3.39e38, 3.4028235e38, np.inf)
    np.testing.assert_array_equal(out, [np.float16(65519.0), 3.3895313892515355e38, np.float32(3.4028235e38), np.inf])


def test_read_only_arrays_the_kernel_writes_are_refused():
    """Contiguous or strided (the copying path): a read-only output is a ValueError naming it; read-only inputs
    are fine."""
    a = np.ones((3, 20), np.float32)
    a.flags.writeable = False
    for out in (np.zeros((3, 20), np.float32), np.zeros((3, 40), np.float32)[:, ::2]):
        out.flags.writeable = False
        with pytest.raises(ValueError, match="argument 'C' is a read-only numpy array, but the kernel writes"):
            add_rows(a, a, out)
        assert not out.any()
    c = np.zeros((3, 20), np.float32)
    add_rows(a, a, c)
    np.testing.assert_array_equal(c, 2 * a)


def test_numpy_subclasses_bind_as_their_memory():
    """A masked array or np.matrix is bound as a plain view of its memory, on a first call and a repeated one."""
    a = np.ma.masked_array(np.arange(60, dtype=np.float32).reshape(3, 20))
    b = np.asmatrix(np.full((3, 20), 2.0, np.float32))
    for _ in range(2):
        c = np.ma.masked_array(np.zeros((3, 20), np.float32))
        add_rows(a, b, c)
        np.testing.assert_array_equal(c.data, np.asarray(a) + 2.0)


def test_compiled_kernel_repr_leaves_out_source_and_binary():
    x = np.zeros(8, np.float32)
    text = repr(axpy_default.compile(x, x, target="cuda"))
    assert text.startswith("CompiledKernel(target='cuda', arch='sm_90'") and len(text) < 200


@pytest.mark.parametrize("switch", [td.debug, td.fast_compile])
def test_switches_take_booleans(switch):
    for bad in ("no", "0", 2, None):
        with pytest.raises(TypeError, match="takes True or False"):
            switch(bad)
    switch(0)
    switch(False)


@pytest.mark.parametrize("grid, block, message", [
    (1, 2048, "2048 threads"), ((1, 70000), 32, r"grid\.y is 70000"), (2**31, 1, r"grid\.x is 2147483648"),
    (1, (1, 1, 128), r"block\.z is 128")])
def test_launch_limits_hold_on_every_target(grid, block, message):
    """The cpu target ran grids and blocks that no GPU launches (the per-axis limits): a kernel tried there
    failed at its first GPU launch."""
    @td.kernel(grid=grid, block=block)
    def too_big(X: f32[1]):
        X[0] = 1.0

    with pytest.raises(ValueError, match=message):
        too_big(np.ones(1, np.float32))


@settings(max_examples=6, deadline=None)
@given(n=st.sampled_from([1, 7, 31, 64, 97]))
def test_half_precision_on_cpu_matches_numpy(n):
    @td.kernel(grid=1, block=128)
    def mix(X: f16["N"], W: bf16["N"], Y: f16["N"], Z: f32["N"]):
        i = threadIdx.x
        if i < N:
            Y[i] = X[i] * 1.5 - (-X[i])
            Z[i] = td.exp(X[i]) + W[i]

    import ml_dtypes
    rng = np.random.default_rng(n)
    x = rng.standard_normal(n).astype(np.float16)
    w = rng.standard_normal(n).astype(ml_dtypes.bfloat16)
    y = np.zeros(n, np.float16)
    z = np.zeros(n, np.float32)
    mix(x, w, y, z)
    xf = x.astype(np.float32)
    np.testing.assert_array_equal(y, (xf * 1.5 + xf).astype(np.float16))
    np.testing.assert_allclose(z, np.exp(xf) + w.astype(np.float32), rtol=1e-5, atol=1e-6)


def test_disk_cache_is_reused_by_a_new_process(tmp_path):
    code = ("import numpy as np, taskdsl as td\n"
            "@td.kernel(grid=1, block=4)\n"
            "def k(X: td.f32[4]):\n"
            "    X[td.threadIdx.x] = td.threadIdx.x * 2.0\n"
            "x = np.zeros(4, np.float32); k(x); print(x.tolist())\n")
    script = tmp_path / "kern.py"
    script.write_text(code)
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))     # importable without pip install -e
    env = dict(os.environ, TASKDSL_CACHE_DIR=str(tmp_path / "cache"), TASKDSL_TARGET="cpu",
               PYTHONPATH=os.pathsep.join(filter(None, [root, os.environ.get("PYTHONPATH")])))
    for _ in range(2):
        out = subprocess.run([sys.executable, str(script)], env=env, capture_output=True, text=True, check=True)
        assert out.stdout.strip() == "[0.0, 2.0, 4.0, 6.0]"
    cached = list((tmp_path / "cache" / "cpu").glob("*.py"))
    assert len(cached) == 1 and list((tmp_path / "cache" / "cpu" / "__pycache__").glob("*.nbi"))


def _scale_kernel(factor: float):
    @td.kernel(grid=lambda N: td.cdiv(N, 32), block=32, name=f"scale_{int(factor)}")
    def scale(x: f32["N"], y: f32["N"]):
        i = blockIdx.x * 32 + threadIdx.x
        if i < N:
            y[i] = x[i] * factor
    return scale


def test_recorded_launches_compile_ahead_in_worker_processes(tmp_path, monkeypatch):
    from taskdsl.backend.cpu import precompile
    monkeypatch.setenv("TASKDSL_CACHE_DIR", str(tmp_path))      # nothing compiled yet
    monkeypatch.setenv("TASKDSL_COMPILE_WORKERS", "2")
    kernels = {factor: _scale_kernel(factor) for factor in (2.0, 3.0)}
    x = np.arange(37, dtype=np.float32)
    outs = {factor: np.zeros_like(x) for factor in kernels}
    with precompile.recording() as jobs:
        for factor, k in kernels.items():
            k(x, outs[factor])
            k(x, outs[factor])                                   # a repeated launch: one job
    assert len(jobs) == 2 and not any(o.any() for o in outs.values())    # recorded, not run
    assert precompile.pending(jobs) == jobs
    with precompile.AheadCompiler() as ahead:
        for job in jobs:
            ahead.submit(job)
        ahead.wait()
    assert precompile.pending(jobs) == []                       # the workers' code is in numba's disk cache
    for factor, k in kernels.items():
        k(x, outs[factor])
        np.testing.assert_array_equal(outs[factor], x * np.float32(factor))


def test_a_compile_job_compiles_the_launcher_its_launches_take():
    """A recorded job names the signature of `parallel.launch` its launches take, and compiling the job (what a
    worker does) compiles that launcher too: the main process then only loads it, where it compiled all of them
    one after another once the workers had finished."""
    from taskdsl.backend.cpu import precompile
    from taskdsl.backend.cpu.parallel import launch

    @td.kernel(grid=1, block=1)
    def unusual_scalars(x: f32[2], a: td.i16, b: td.u8, c: td.f64):    # a launcher signature no other test takes
        x[0] = f32(a * b) + f32(c)

    x = np.zeros(2, np.float32)
    with precompile.recording() as jobs:
        unusual_scalars(x, -3, 200, 0.5)
    job, = jobs
    assert job.launcher and job.launcher not in launch.overloads and not x.any()
    precompile.compile_job(job)
    assert job.launcher in launch.overloads
    launchers = set(launch.overloads)
    unusual_scalars(x, -3, 200, 0.5)
    assert set(launch.overloads) == launchers and x[0] == -599.5      # it launched through the job's launcher


def test_jobs_compile_in_workers_while_recording_goes_on(tmp_path, monkeypatch):
    from taskdsl.backend.cpu import precompile
    monkeypatch.setenv("TASKDSL_CACHE_DIR", str(tmp_path))      # nothing compiled yet
    monkeypatch.setenv("TASKDSL_COMPILE_WORKERS", "2")
    monkeypatch.setenv("TASKDSL_NUM_THREADS", "2")      # 2 blocks on 2 threads: shares of `parallel.launch`
    td.fast_compile(False)
    kernels = {factor: _scale_kernel(factor) for factor in (4.0, 5.0)}
    x = np.arange(37, dtype=np.float32)
    outs = {factor: np.zeros_like(x) for factor in kernels}
    with precompile.AheadCompiler() as ahead:
        with ahead.recording():
            kernels[4.0](x, outs[4.0])
            assert len(ahead.futures) == 1                      # submitted at once, before the recording ends
            kernels[5.0](x, outs[5.0])
            kernels[5.0](x, outs[5.0])                          # a repeated launch: no second job
            jobs = list(precompile._local.recorder.jobs)
        assert len(ahead.futures) == 2 and not any(o.any() for o in outs.values())    # recorded, not run
        ahead.wait()
    assert precompile.pending(jobs) == []                       # the workers' code is in numba's disk cache
    for factor, k in kernels.items():
        k(x, outs[factor])
        np.testing.assert_array_equal(outs[factor], x * np.float32(factor))


def test_a_workers_compile_error_reaches_the_caller(tmp_path, monkeypatch):
    from taskdsl.backend.cpu import precompile
    monkeypatch.setenv("TASKDSL_COMPILE_WORKERS", "2")
    module = tmp_path / "broken.py"
    module.write_text("from numba import njit\n\n@njit(cache=True)\ndef entry(x):\n    return undefined_name + x\n")
    from numba import types
    job = precompile.Job(str(module), "entry", (types.int64,))
    with pytest.raises(Exception, match="undefined_name"):
        with precompile.AheadCompiler() as ahead:
            ahead.submit(job)
            ahead.wait()


@settings(max_examples=25, deadline=None)
@given(shape=st.lists(st.integers(0, 9), max_size=3).map(tuple),
       dtype=st.sampled_from([np.float32, np.float16, np.int64, np.uint8, np.bool_]))
def test_aligned_host_arrays_start_a_cache_line(shape, dtype):
    from taskdsl.runtime.host import empty_aligned
    a = empty_aligned(shape, dtype)
    assert a.shape == shape and a.dtype == dtype and a.flags.c_contiguous and a.flags.writeable
    assert a.size == 0 or a.ctypes.data % 64 == 0      # (an empty array has no memory to align)
    a[...] = np.arange(a.size).reshape(shape).astype(dtype)      # every element is usable memory
    np.testing.assert_array_equal(a.reshape(-1), np.arange(a.size).astype(dtype))


def _stuck_compile(job):
    """A compile job that never finishes (a worker stuck on a lock)."""
    import time
    time.sleep(600)


def test_stuck_compile_workers_are_stopped_and_the_kernels_compile_at_launch(tmp_path, monkeypatch):
    """A worker that never finishes made the graph compile wait forever; now a warning, and the kernel
    compiles at its first launch."""
    from taskdsl.backend.cpu import precompile
    monkeypatch.setenv("TASKDSL_CACHE_DIR", str(tmp_path))      # nothing compiled yet
    monkeypatch.setenv("TASKDSL_COMPILE_WORKERS", "2")
    monkeypatch.setattr(precompile, "compile_job", _stuck_compile)
    kernel = _scale_kernel(6.0)
    x, out = np.arange(11, dtype=np.float32), np.zeros(11, np.float32)
    with precompile.AheadCompiler() as ahead:
        with ahead.recording():
            kernel(x, out)
        processes = list(ahead._pool._processes.values())
        with pytest.warns(RuntimeWarning, match="finished nothing in 1 s and were stopped; 1 kernels compile"):
            ahead.wait(stall_seconds=1)
    assert not any(p.is_alive() for p in processes)
    kernel(x, out)
    np.testing.assert_array_equal(out, x * np.float32(6.0))


def test_an_interrupt_stops_the_compile_workers_at_once(tmp_path, monkeypatch):
    """An interrupt of this process alone (an IDE's or a debugger's; a terminal's Ctrl-C reaches the workers too)
    waited for the jobs running in the workers before it reached the caller."""
    from taskdsl.backend.cpu import precompile
    monkeypatch.setenv("TASKDSL_CACHE_DIR", str(tmp_path))
    monkeypatch.setenv("TASKDSL_COMPILE_WORKERS", "2")
    monkeypatch.setattr(precompile, "compile_job", _stuck_compile)
    monkeypatch.setattr(precompile, "pending", lambda jobs: list(jobs))    # (another test may have compiled it)
    x, out = np.arange(11, dtype=np.float32), np.zeros(11, np.float32)
    start = time.monotonic()
    with pytest.raises(KeyboardInterrupt):
        with precompile.AheadCompiler() as ahead:
            with ahead.recording():
                _scale_kernel(7.0)(x, out)
            processes = list(ahead._pool._processes.values())
            raise KeyboardInterrupt
    assert time.monotonic() - start < 60 and not any(p.is_alive() for p in processes)


@pytest.mark.parametrize("value", ["0", "-1", "x", "2.5"])
def test_bad_compile_worker_counts_are_refused(monkeypatch, value):
    from taskdsl.backend.cpu import precompile
    monkeypatch.setenv("TASKDSL_COMPILE_WORKERS", value)
    with pytest.raises(td.ConfigError, match=f"TASKDSL_COMPILE_WORKERS={value!r}: set it to a positive whole number"):
        precompile.workers()


@td.kernel(grid=1, block=4)
def _reciprocal(Y: td.f32[4], a: td.f32):
    Y[td.threadIdx.x] = 1.0 / a


@td.kernel(grid=1, block=4)
def _scale_bf16(X: td.f32[4], Y: td.f32[4], a: td.bf16):
    Y[td.threadIdx.x] = X[td.threadIdx.x] * a


def test_scalars_equal_as_numbers_but_not_as_bits_are_bound_apart():
    """-0.0 == 0.0, so a call with 0.0 after one with -0.0 reused its binding: 1 / 0.0 gave -inf."""
    y = np.zeros(4, np.float32)
    for value in (-0.0, 0.0, np.float32(-0.0), np.float32(0.0), -0.0, float("nan"), float("nan")):
        _reciprocal(y, value)
        with np.errstate(divide="ignore", invalid="ignore"):
            np.testing.assert_array_equal(y, np.float32(1.0) / np.float32(value))


@given(value=st.floats(-1e4, 1e4, allow_nan=False, width=32))
@settings(max_examples=10, deadline=None)
def test_bf16_scalar_parameters_are_passed_by_value(value):
    """A bf16 scalar became the uint16 of its number (3.0 -> the bits 0x0003, a denormal); an ml_dtypes
    bfloat16 scalar was refused."""
    import ml_dtypes
    x, y = np.arange(4, dtype=np.float32), np.zeros(4, np.float32)
    rounded = np.float32(ml_dtypes.bfloat16(value))
    for arg in (value, ml_dtypes.bfloat16(value)):
        _scale_bf16(x, y, arg)
        np.testing.assert_array_equal(y, x * rounded)


@td.kernel(grid=lambda N: td.cdiv(N, 64), block=64)
def axpy(x: f32["N"], y: f32["N"], alpha: f32, shift: i32):
    i = blockIdx.x * 64 + threadIdx.x
    if i < N:
        y[i] = alpha * x[i] + shift


@td.kernel(grid=lambda blocks: blocks, block=4)
def fill_blocks(y: i32["N"], blocks: i32, value: i32):
    y[blockIdx.x * 4 + threadIdx.x] = value


@pytest.mark.parametrize("target", ["cpu", "cuda"])
def test_new_scalar_values_reuse_the_prepared_launch(target, monkeypatch, request):
    """A scalar changing at every call took the whole path each time (checks, binding, a new prepared launch:
    ~0.1 ms on the cpu); now its value is checked and the launch of the same shapes reused. A scalar the grid reads
    still sizes the grid anew, and a value out of its type's range is still refused."""
    from taskdsl.runtime.kernel import Kernel
    if target == "cuda":
        request.getfixturevalue("simulated_gpu")
    binds = []      # launches prepared
    name = "_prepare_cuda" if target == "cuda" else "_prepare_cpu"
    original = getattr(Kernel, name)
    monkeypatch.setattr(Kernel, name, lambda self, *a: binds.append(self.name) or original(self, *a))
    host_x = np.arange(100, dtype=np.float32)
    device = (lambda a: td.to_device(a)) if target == "cuda" else (lambda a: a)
    host = (lambda a: a.numpy()) if target == "cuda" else (lambda a: a)
    x, y = device(host_x), device(np.zeros(100, np.float32))
    for k in range(12):
        alpha = np.float32(0.5 * k - 2)
        axpy(x, y, float(alpha), k)
        np.testing.assert_array_equal(host(y), alpha * host_x + np.float32(k))
    assert binds.count("axpy") == 1
    with pytest.raises(ValueError, match="'shift' = 1099511627776 is outside the range of i32"):
        axpy(x, y, 1.0, 2**40)
    out = device(np.zeros(12, np.int32))
    for blocks in (1, 3, 2):
        fill_blocks(out, blocks, blocks + 10)
        np.testing.assert_array_equal(host(out)[:blocks * 4], blocks + 10)
    assert binds.count("fill_blocks") == 3


@td.kernel(block=2)
def store_narrow(X: f32[2], H: f16[2], B: bf16[2]):
    H[threadIdx.x] = X[threadIdx.x]
    B[threadIdx.x] = X[threadIdx.x]


def test_a_nan_stored_to_16_bits_keeps_its_sign():
    """-NaN from f32 became +NaN (0x7e00, 0x7fc0); numpy and ml_dtypes keep the sign (0xfe00, 0xffc0)."""
    import ml_dtypes
    x = np.array([0xffc00000, 0x7fc00001], np.uint32).view(np.float32)
    h, b = np.zeros(2, np.float16), np.zeros(2, ml_dtypes.bfloat16)
    store_narrow(x, h, b)
    np.testing.assert_array_equal(h.view(np.uint16), x.astype(np.float16).view(np.uint16))
    np.testing.assert_array_equal(b.view(np.uint16), [0xffc0, 0x7fc0])


def test_numba_helpers_are_cached_by_the_files_they_inline_too(monkeypatch):
    """support.py's f16 conversions inline ir/types.py's rounding; numba checks a function's own file only, so an
    edit of the rounding kept the helpers cached with the old one, and kernels (which link them) too."""
    import inspect
    from taskdsl.backend.cpu import numba_cache, support
    from taskdsl.backend.cpu.compile import compiler_fingerprint
    stamp = support.f32_to_f16._cache._impl.locator.get_source_stamp()
    assert stamp[1] == numba_cache._inlined_stamps() and "ir/types.py" in numba_cache.INLINED_FROM
    before = compiler_fingerprint.__wrapped__()
    original = inspect.getsource
    monkeypatch.setattr(inspect, "getsource", lambda f: original(f) + ("# edited" if f.__name__ ==
                                                                         "narrow_float_bits" else ""))
    assert compiler_fingerprint.__wrapped__() != before


def test_a_thread_recording_launches_leaves_other_threads_launches_running(tmp_path, monkeypatch):
    """Recording (a graph's compile) switched every thread's cpu launches to recording: the kernels another thread
    called while a graph compiled did not run, silently."""
    import threading
    from taskdsl.backend.cpu import precompile
    monkeypatch.setenv("TASKDSL_CACHE_DIR", str(tmp_path))
    kernel = _scale_kernel(9.0)
    x, out = np.arange(13, dtype=np.float32), np.zeros(13, np.float32)
    recording, other_done = threading.Event(), threading.Event()

    def other():
        recording.wait()
        kernel(x, out)
        other_done.set()
    thread = threading.Thread(target=other)
    thread.start()
    with precompile.recording():
        recording.set()
        assert other_done.wait(120)
    thread.join()
    np.testing.assert_array_equal(out, x * np.float32(9.0))


def _job_of_a_cleared_cache(job):
    raise FileNotFoundError(2, "No such file or directory", "cpu/k_gone.py")


def test_a_job_whose_module_the_cache_lost_compiles_at_first_launch(tmp_path, monkeypatch):
    """`cache clear` (or another process's eviction) during a graph's compile made the compile fail with the
    worker's FileNotFoundError."""
    from taskdsl.backend.cpu import precompile
    monkeypatch.setenv("TASKDSL_CACHE_DIR", str(tmp_path))
    monkeypatch.setenv("TASKDSL_COMPILE_WORKERS", "2")
    monkeypatch.setattr(precompile, "compile_job", _job_of_a_cleared_cache)
    monkeypatch.setattr(precompile, "pending", lambda jobs: list(jobs))    # (another test may have compiled it)
    # a factor no other test uses: with 3.0, this test's compile (kept by the process, whatever the cache folder)
    # left test_recorded_launches_compile_ahead_in_worker_processes, run after it, with a job not pending
    kernel = _scale_kernel(8.0)
    x, out = np.arange(9, dtype=np.float32), np.zeros(9, np.float32)
    with precompile.AheadCompiler() as ahead:
        with ahead.recording():
            kernel(x, out)
        assert ahead.futures
        ahead.wait()
    kernel(x, out)
    np.testing.assert_array_equal(out, x * np.float32(8.0))


def test_compile_workers_fork_under_numbas_compiler_lock_and_end_with_their_parent(tmp_path):
    """A worker forked while another thread compiled inherited numba's compiler lock held, and waited out
    STALL_SECONDS; a process killed during a graph's compile left its workers alive for good (also where
    SIGTERM is ignored, as some CI runners start processes)."""
    script = tmp_path / "parent.py"
    script.write_text(
        "import os, signal, sys, time\n"
        "signal.signal(signal.SIGTERM, signal.SIG_IGN)\n"
        "import concurrent.futures\n"
        "from numba.core.compiler_lock import global_compiler_lock\n"
        "from taskdsl.backend.cpu import precompile\n"
        "locked = []\n"
        "submit = concurrent.futures.ProcessPoolExecutor.submit\n"
        "def checked(self, *a, **k):\n"
        "    locked.append(global_compiler_lock.is_locked())\n"
        "    return submit(self, *a, **k)\n"
        "concurrent.futures.ProcessPoolExecutor.submit = checked\n"
        "precompile.pending = lambda jobs: list(jobs)\n"
        "def stuck(job):\n"
        "    time.sleep(600)\n"
        "precompile.compile_job = stuck\n"
        "ahead = precompile.AheadCompiler(2)\n"
        "ahead.submit(precompile.Job('x.py', 'f', ()))\n"
        "print(locked, *[p.pid for p in ahead._pool._processes.values()], flush=True)\n"
        "time.sleep(600)\n")
    root = str(Path(__file__).resolve().parents[1])
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in (root, os.environ.get("PYTHONPATH")) if p))
    parent = subprocess.Popen([sys.executable, str(script)], env=env, stdout=subprocess.PIPE, text=True)
    try:
        line = parent.stdout.readline().split()
        assert line[0] == "[True]", line
        workers = [int(pid) for pid in line[1:]]
        assert workers
    finally:
        parent.kill()
        parent.wait()
    def running(pid: int) -> bool:
        try:        # (a worker reaped between an exists() and the open() raised FileNotFoundError)
            return "zombie" not in Path(f"/proc/{pid}/status").read_text()
        except FileNotFoundError:
            return False

    for _ in range(100):
        if not any(running(pid) for pid in workers):
            break
        time.sleep(0.1)
    else:
        raise AssertionError(f"the workers {workers} outlived their killed parent")


def test_a_compile_worker_whose_parent_ended_before_it_started_ends_at_once():
    """The parent killed between a worker's fork and its death-signal request sent it no signal: it stayed."""
    from taskdsl.backend.cpu import precompile
    child = os.fork()
    if child == 0:
        try:
            precompile._end_with_parent(parent=-1)      # never this child's parent
        finally:
            os._exit(3)
    _, status = os.waitpid(child, 0)
    assert os.waitstatus_to_exitcode(status) == 0


@pytest.mark.parametrize("name, spellings", [
    ("f32", [np.float32, np.dtype(np.float32), "float32", "f4", np.dtype(">f4"), np.dtype("<f4")]),
    ("f64", [np.float64, float, "float64", np.dtype(">f8")]),
    ("i64", [np.int64, "int64", np.dtype(">i8")]),
    ("u16", [np.uint16, "uint16"]),
    ("bool", [np.bool_, bool, "bool"]),
])
def test_numpy_dtypes_map_to_the_same_type_however_spelled(name, spellings):
    from taskdsl.ir.types import from_numpy
    for spelling in spellings * 2:      # the second time from what was remembered
        assert from_numpy(spelling).name == name, spelling


def test_dtypes_without_a_type_are_refused_every_time():
    from taskdsl.ir.types import from_numpy
    for spelling in [np.complex64, "U3", [("a", np.float32)], np.dtype([("a", np.float32)])] * 2:
        with pytest.raises(TypeError, match="no taskdsl type"):
            from_numpy(spelling)
    import ml_dtypes
    assert from_numpy(ml_dtypes.bfloat16) is bf16 and from_numpy(np.dtype(ml_dtypes.bfloat16)) is bf16


@settings(max_examples=20, deadline=None)
@given(shape=st.lists(st.integers(0, 40), max_size=3).map(tuple))
def test_operator_results_start_a_cache_line_unless_small(shape):
    import stdlib_ops
    from taskdsl.runtime.arrays import SMALL_RESULT_BYTES
    x = np.arange(math.prod(shape), dtype=np.float32).reshape(shape)
    y = stdlib_ops.add(x, 1.0)
    np.testing.assert_array_equal(y, x + 1)
    assert y.flags.c_contiguous and y.flags.writeable
    if y.nbytes >= SMALL_RESULT_BYTES:       # (below, numpy's own allocation: 16-byte aligned)
        assert y.ctypes.data % 64 == 0
