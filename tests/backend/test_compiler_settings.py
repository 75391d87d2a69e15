"""numba's settings while a generated kernel compiles (`launch.compiler_settings`): which LLVM passes run at
each optimization level, and that nothing of them outlives the compile; and what the kernels' own pipeline
(`support.KernelCompiler`) may leave out."""
import os
import subprocess
import sys
from pathlib import Path

import numba
import numpy as np
import pytest
from numba.core import config
from numba.core import ir as numba_ir
from numba.core.compiler import run_frontend
from numba.core.registry import cpu_target
from numba.core.rewrites import rewrite_registry

import taskdsl as td
from taskdsl import f16, f32, threadIdx
from taskdsl.backend.cpu.launch import compiler_settings


@pytest.mark.parametrize("opt_level, function_passes", [(1, 0), (3, 1)])
def test_per_function_passes_run_at_a_low_level(monkeypatch, opt_level, function_passes):
    """The per-function pass pipelines are built at level 0 for a fast kernel (level 1) and at level 1 for an
    optimized one (level 3): the module pipeline at the kernel's level optimizes each function after them.
    After the compile numba's own settings are back."""
    codegen = cpu_target.target_context.codegen()
    built = []
    original = type(codegen)._pass_builder

    def spy(self, **kwargs):
        built.append(kwargs.get("opt", config.OPT))
        return original(self, **kwargs)

    monkeypatch.setattr(type(codegen), "_pass_builder", spy)
    before = config.OPT, config.SLP_VECTORIZE

    @numba.njit
    def twice(x):
        return x * 2.0

    with compiler_settings(opt_level):
        codegen._function_pass_manager()
        assert built == [function_passes]
        assert twice(np.float64(1.5)) == 3.0        # a function compiles and runs under them
    assert "_function_pass_manager" not in codegen.__dict__ and (config.OPT, config.SLP_VECTORIZE) == before


def test_settings_inside_settings_give_the_outer_ones_back():
    codegen = cpu_target.target_context.codegen()
    with compiler_settings(1):
        fast = codegen.__dict__["_function_pass_manager"]
        with compiler_settings(3):
            inner = codegen.__dict__["_function_pass_manager"]
            assert inner is not fast and inner.keywords == {"opt": 1} and config.OPT == 3
        assert codegen.__dict__["_function_pass_manager"] is fast and config.OPT == 1
        with compiler_settings(2):
            assert codegen.__dict__["_function_pass_manager"] is not fast
        assert codegen.__dict__["_function_pass_manager"] is fast
    assert "_function_pass_manager" not in codegen.__dict__


def _numba_highlighting(first: str, setting: str | None) -> str:
    """The class of numba's error-message scheme in a new process that imports `first`, then numba, with
    NUMBA_DISABLE_ERROR_MESSAGE_HIGHLIGHTING set to `setting` (None: unset)."""
    env = {k: v for k, v in os.environ.items() if k != "NUMBA_DISABLE_ERROR_MESSAGE_HIGHLIGHTING"}
    if setting is not None:
        env["NUMBA_DISABLE_ERROR_MESSAGE_HIGHLIGHTING"] = setting
    code = f"import {first}, numba.core.errors as e; print(type(e.termcolor()).__name__)"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, check=True,
                          cwd=Path(__file__).resolve().parents[2])
    return done.stdout.strip()


def test_taskdsl_turns_numbas_error_highlighting_off_before_numba_loads():
    """Highlighting wraps each of the thousands of typing errors numba raises and catches in a kernel's compile in
    terminal escapes (where colorama is installed): taskdsl's import turns it off before it imports numba
    (`numba_settings`), unless the environment says otherwise (an empty NUMBA_DISABLE_ERROR_MESSAGE_HIGHLIGHTING
    leaves numba's own choice)."""
    assert _numba_highlighting("taskdsl", None) == "NOPColorScheme"
    assert _numba_highlighting("taskdsl", "") == _numba_highlighting("numpy", "")



def test_numba_compiles_for_the_host_without_f16_arithmetic():
    """On a host with AVX512-FP16, numba's codegen takes the host's features less it (`numba_settings`): LLVM would
    contract f16 products and sums past the rounding a fused 16-bit kernel does between steps (the fused graph's
    bits are checked by test_fuse_elementwise's 16-bit case). F16C's conversions stay."""
    from llvmlite import binding
    host = binding.get_host_cpu_features()
    features = cpu_target.target_context.codegen()._get_host_cpu_features().split(",")
    if not host.get("avx512fp16"):
        pytest.skip("this host has no AVX512-FP16")
    assert "-avx512fp16" in features and "+f16c" in features and "+avx512f" in features

@td.kernel(grid=1, block=32)
def _math_and_halves(X: f32["N"], H: f16["N"], Out: f32["N"]):
    i = threadIdx.x
    x = X[i] if i < N else 0.0
    y = td.pow(x, 2.0) + td.exp(x) + td.max(x, 0.5) + td.shfl_xor(x, 1)
    if i < N:
        Out[i] = y if x > 0.0 else f32(H[i]) * td.rsqrt(x * x + 1.0)


def _kernels_and_arguments() -> list:
    """(kernel, arguments) pairs whose generated code holds the constructs the cpu backend emits: shared memory
    and barriers, warp shuffles, atomics, math functions and f16 conversions, the tensor-core emulation."""
    from stdlib_ops import matmul_simt, matmul_tc

    from ..kernels import histogram, tree_sum, warp_sums
    from ..ops.test_matmul_tc import SMALL
    x, h = np.ones(64, np.float32), np.ones(64, np.float16)
    a = np.ones((1, 16, 32), np.float16)
    tc = matmul_tc.tc_matmul_kernel(SMALL, td.f16, td.f32, 8)
    return [(tree_sum, (x, np.zeros(1, np.float32))), (warp_sums, (x, np.zeros(2, np.float32))),
            (histogram, (np.zeros(64, np.int32), np.zeros(4, np.int32), np.zeros(1, np.float32))),
            (_math_and_halves, (x, h, x.copy())),
            (tc, (a, a.reshape(1, 32, 16), np.zeros((1, 16, 16), np.float32), matmul_simt.batch_index((), (), ()), 1))]


@pytest.mark.parametrize("fast", [True, False])
def test_generated_kernels_hold_nothing_the_dropped_passes_change(fast):
    """`support.KernelCompiler` drops numba's rewrites before typing and its dead-branch pruning, as generated
    code gives them nothing to do. Checked on numba's IR of generated kernels: no rewrite matches a block (a `**`,
    a `print`, a `raise`, a constant index of a tuple would), and no branch tests a constant."""
    td.set_target("cpu")
    td.fast_compile(fast)
    for kernel, args in _kernels_and_arguments():
        namespace: dict = {}
        source = kernel.source(*args, target="cpu").replace("cache=True", "cache=False")   # cached from a file only
        exec(compile(source, f"<{kernel.name}>", "exec"), namespace)
        entry, = [v for name, v in namespace.items() if name.startswith("kernel_")]
        func_ir = run_frontend(entry.py_func)
        for block in func_ir.blocks.values():
            for rewrite in rewrite_registry.rewrites["before-inference"]:
                assert not rewrite().match(func_ir, block, None, None), (kernel.name, rewrite.__name__)
            branch = block.terminator
            if isinstance(branch, numba_ir.Branch):
                assert not isinstance(func_ir.get_definition(branch.cond), numba_ir.Const), kernel.name


def test_compiled_kernels_keep_no_copy_of_numbas_ir():
    """`support.KernelCompiler` leaves out numba's type annotation, a copy of the typed IR that each compiled
    kernel would keep for the life of the process; the kernel still computes."""
    from taskdsl.backend.cpu.support import KernelCompiler

    def axpy(a, x, y):
        for i in range(x.size):
            y[i] += a * x[i]

    compiled = numba.njit(pipeline_class=KernelCompiler)(axpy)
    x, y = np.arange(5, dtype=np.float32), np.ones(5, np.float32)
    compiled(np.float32(2), x, y)
    np.testing.assert_array_equal(y, 1 + 2 * x)
    result, = compiled.overloads.values()
    assert result.type_annotation is None
