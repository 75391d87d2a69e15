"""numba's settings while a generated kernel compiles (`launch.compiler_settings`): which LLVM passes run at
each optimization level, and that nothing of them outlives the compile."""
import numba
import numpy as np
import pytest
from numba.core import config
from numba.core.registry import cpu_target

from taskdsl.backend.cpu.launch import compiler_settings


@pytest.mark.parametrize("opt_level, function_passes", [(1, 0), (3, 3)])
def test_fast_kernels_skip_the_per_function_passes(monkeypatch, opt_level, function_passes):
    """A fast kernel (level 1) builds its per-function pass pipelines at level 0 (the module pipeline at
    level 1 simplifies each function once); an optimized one keeps numba's level-3 ones. After the compile
    numba's own settings are back."""
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
            assert "_function_pass_manager" not in codegen.__dict__ and config.OPT == 3
        assert codegen.__dict__["_function_pass_manager"] is fast and config.OPT == 1
        with compiler_settings(2):
            assert codegen.__dict__["_function_pass_manager"] is not fast
        assert codegen.__dict__["_function_pass_manager"] is fast
    assert "_function_pass_manager" not in codegen.__dict__
