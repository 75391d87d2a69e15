"""Shared test set-up: the target, a private cache, NVRTC compilation of every kernel that runs.

Tests run on the cpu target, or on the one $TASKDSL_TEST_TARGET names: with
TASKDSL_TEST_TARGET=cuda on a GPU machine, every kernel test of the suite runs on the GPU
and is checked against the same numpy oracles. Every kernel specialization a test launches
also has its CUDA C++ compiled for sm_90 by NVRTC (once per kernel and block shape, in one
program per test module; to a cubin where it holds inline PTX: `cuda_checks.py`), so the suite
proves the CUDA path on machines without a GPU.

Kernels are compiled with `td.fast_compile` (cpu: no IR unrolling, so numba compiles big kernels
several times faster; cuda: NVRTC at -Ofast-compile=max), except in modules that set
OPTIMIZED = True: those test the optimized code path (unrolled register tiles kept in locals) of
the templates and the kernel language; a test there marked @pytest.mark.fast_compile still runs
in fast mode (each says why).
"""
from __future__ import annotations

import functools
import gc
import os

# before numba is imported: numba formats the message of every failed typing attempt, thousands per kernel, and
# with colorama installed each formatting wraps the output streams (about 26 us: 1.5% of a tensor-core
# emulation's compile); numba's own test suite turns the highlighting off the same way
os.environ.setdefault("NUMBA_DISABLE_ERROR_MESSAGE_HIGHLIGHTING", "1")

import pytest
from hypothesis import settings

import taskdsl as td
from taskdsl.runtime.config import fast_compile_enabled
from taskdsl.runtime.kernel import Kernel

from . import host_twin
from .cuda_checks import CudaChecks
from .cuda_on_host import host_compiler, run_on_host
from .simulated_gpu import simulate_cuda_twin

# Under CI (the CI variable set, as CI services and .ci/run's clean-clone check do) hypothesis draws the same
# examples at every run, so a red CI is a regression, not a program drawn for the first time; other runs keep
# drawing new ones, which is how the random-program tests find compiler bugs (then pinned by an @example).
# (hypothesis is pinned in pyproject.toml: a new release draws other derandomized examples)
settings.register_profile("ci", derandomize=True, print_blob=True)
if os.environ.get("CI"):
    settings.load_profile("ci")

_compiled: set = set()
# TASKDSL_SIMULATED_GPU=1 without a GPU: the cuda twins run on the simulated GPU (tests/simulated_gpu.py), so
# the kernels the cuda target schedules (its templates, reductions, strategies) run on the cpu backend and
# are checked against the same oracles; with TASKDSL_SIMULATED_GPU=host their CUDA C++ runs on the host
# (tests/cuda_on_host.py). Other @gpu tests (real driver features) stay skipped.
SIMULATED_GPU = os.environ.get("TASKDSL_SIMULATED_GPU") in ("1", "host")

CUDA_CHECKS = CudaChecks()    # the CUDA sources of the kernels the tests launch, compiled when their module ends
# TASKDSL_HOST_TWIN=1: each cpu kernel call also runs its CUDA source on the host, from the same inputs
HOST_TWINS = host_twin.HostTwins() if host_twin.available() else None


@pytest.fixture(autouse=True, scope="module")
def _nvrtc_compiles_the_modules_kernels():
    """NVRTC compiles the CUDA C++ of every kernel the module's tests launched (`cuda_checks`)."""
    yield
    CUDA_CHECKS.compile_all()


def pytest_configure(config):
    os.environ.setdefault("TASKDSL_CACHE_DIR", os.path.join(os.path.dirname(__file__), "..", ".taskdsl-test-cache"))
    os.environ.setdefault("TASKDSL_COMPILE_WORKERS", "1")   # pytest-xdist already uses every core


@pytest.fixture
def elementwise_fusion(monkeypatch):
    """The graph pass fuse_elementwise on, as in an optimized build: it leaves graphs alone under the tests'
    td.fast_compile (one generic kernel per elementwise function serves them all)."""
    import importlib
    monkeypatch.setattr(importlib.import_module("taskdsl.graph.passes.fuse_elementwise"), "fast_compile_enabled",
                        lambda: False)


@pytest.fixture(params=[True, False], ids=["dot4", "register_tile"])
def dot4_products(monkeypatch, request):
    """8-bit integer products on the cpu planned as a host with byte dot-product instructions plans them (the dot4
    template, `stdlib_ops.matmul_dot4`; on a host without them its kernels run dot4's plain arithmetic) and as one
    without (the register-tile template); the parameter says which."""
    from stdlib_ops import conv, gemm, matmul_dot4
    monkeypatch.setattr(matmul_dot4, "available", lambda: request.param)
    caches = (gemm._plan, conv._plan)       # (as they are now: a test may replace them)
    for plans in caches:                    # made the other way
        plans.cache_clear()
    yield request.param
    for plans in caches:
        plans.cache_clear()


@pytest.fixture
def twin_target(request):
    """'cpu', 'cuda' or 'host' for the twins of a module with GPU_TWINS = True, else None."""
    return getattr(request, "param", None)


def pytest_generate_tests(metafunc):
    """Modules that set GPU_TWINS = True get each test twice: on cpu, and as a @gpu test on cuda; those that also
    set HOST_RUNS = True a third time, their kernels' CUDA source run on the host (tests/cuda_on_host.py)."""
    if getattr(metafunc.module, "GPU_TWINS", False):
        twins = ["cpu", pytest.param("cuda", marks=pytest.mark.gpu)]
        if getattr(metafunc.module, "HOST_RUNS", False):
            twins.append(pytest.param("host", marks=pytest.mark.skipif(
                host_compiler() is None, reason="no host C++ compiler ($CXX, g++ or clang++)")))
        metafunc.parametrize("twin_target", twins, indirect=True)


@pytest.fixture(autouse=True)
def _default_schedules_on_gpus(monkeypatch, request):
    """GPU tests run at the templates' default schedules: on a GPU, matmul and conv plans tune by default,
    timing every point of each new shape's space (the tests check results; the benchmarks tune). A fixture
    of its own, as modules override _cpu_target_and_nvrtc."""
    if request.node.get_closest_marker("gpu") is not None or os.environ.get("TASKDSL_TEST_TARGET") == "cuda":
        monkeypatch.setenv("TASKDSL_TUNE", "0")


@pytest.fixture(autouse=True)
def _cpu_target_and_nvrtc(monkeypatch, request, twin_target):
    """Run on the cpu target (or a twin's target) and NVRTC-compile each launched kernel."""
    optimized = getattr(request.module, "OPTIMIZED", False) and not request.node.get_closest_marker("fast_compile")
    td.fast_compile(not optimized)
    simulate_cuda_twin(monkeypatch, twin_target)
    if twin_target is not None:
        td.set_target("cpu" if twin_target == "host" else twin_target)
    elif request.node.get_closest_marker("gpu") is None:
        td.set_target(os.environ.get("TASKDSL_TEST_TARGET", "cpu"))
    original = Kernel.__call__
    undefined = request.node.get_closest_marker("undefined_behavior") is not None   # no host twins: C's UB
    # kernel calls run their CUDA source on the host (tests/cuda_on_host.py) instead of the cpu kernel
    on_host = twin_target == "host" or request.node.get_closest_marker("cuda_on_host") is not None
    if on_host and host_compiler() is None:
        pytest.skip("no host C++ compiler ($CXX, g++ or clang++) to run CUDA sources on the host")

    def call_and_queue_cuda(self, *args, **kwargs):
        run = functools.partial(run_on_host if on_host else original, self, *args, **kwargs)
        args = self.arguments(args, kwargs)
        if HOST_TWINS is not None and not on_host and td.get_target() == "cpu" and not undefined:
            HOST_TWINS.call(self, run, args)
        else:
            run()
        binding = self.bind(args)
        key = (id(self), binding.block)
        if key not in _compiled and 0 not in binding.grid:
            CUDA_CHECKS.add(request.node.nodeid, self.name, self.source(*args, target="cuda"), fast_compile_enabled())
            _compiled.add(key)

    monkeypatch.setattr(Kernel, "__call__", call_and_queue_cuda)
    yield
    td.debug(False)
    td.fast_compile(False)
    td.cp_async_early(False)


@pytest.fixture
def simulated_gpu(monkeypatch):
    """The cuda target on a simulated GPU (tests/simulated_gpu.py): device code paths on machines without one,
    the launches running their CUDA C++ on the host where it can (`cuda_source_on_host`)."""
    from .simulated_gpu import cuda_source_on_host, install
    gpu = install(monkeypatch, cuda_source=cuda_source_on_host())
    td.set_target("cuda")
    yield gpu
    td.set_target("cpu")


def pytest_sessionfinish(session):
    """A pytest-xdist worker hands its host-twin counts to the controller; the heap is collected once and frozen."""
    if HOST_TWINS is not None and hasattr(session.config, "workeroutput"):     # a pytest-xdist worker
        session.config.workeroutput["host_twins"] = dict(HOST_TWINS.counts)
    # pytest's cleanup after this runs five full collections to find unraisable exceptions; on a worker's heap (over
    # a million objects, most held by the kernels cached in memory) they could pass the 5 s in which pytest-xdist
    # wants a worker done before it interrupts it (a PytestUnraisableExceptionWarning: KeyboardInterrupt in a gc
    # callback). This one collection finds the same exceptions; freezing what survives keeps it out of the five.
    gc.collect()
    gc.freeze()


@pytest.hookimpl(optionalhook=True)
def pytest_testnodedown(node, error):
    """pytest-xdist's controller: add up the workers' host-twin counts."""
    if HOST_TWINS is not None:
        HOST_TWINS.counts.update(getattr(node, "workeroutput", {}).get("host_twins", {}))


def pytest_terminal_summary(terminalreporter):
    """The host twins' counts (TASKDSL_HOST_TWIN=1): runs, and calls passed over by reason."""
    if HOST_TWINS is not None:
        for line in HOST_TWINS.summary():
            terminalreporter.write_line(line)


def pytest_collection_modifyitems(config, items):
    usable, reason = td.gpu_status()
    if usable:
        return
    skip = pytest.mark.skip(reason=f"no usable GPU ({reason})")
    for item in items:
        simulated = SIMULATED_GPU and getattr(item, "callspec", None) is not None and \
            item.callspec.params.get("twin_target") == "cuda"
        if item.get_closest_marker("gpu") is not None and not simulated:
            item.add_marker(skip)
