"""The suite's NVRTC check of launched kernels (`cuda_checks.py`): one program per module, failures named."""
import pytest

from . import cuda_checks
from .cuda_checks import CudaChecks

GOOD = 'extern "C" __global__ void __launch_bounds__(32) twin(float* __restrict__ y) {{ y[threadIdx.x] = {value}; }}\n'
BAD = 'extern "C" __global__ void broken(float* y) { y[0] = undefined_name; }\n'
BAD_PTX = 'extern "C" __global__ void bad_ptx(float* y) { asm volatile("no.such.instruction;"); }\n'
FENCE = 'extern "C" __global__ void fence(float* y) { asm volatile("membar.gl;"); y[0] = 1.0f; }\n'


def test_kernels_of_one_name_compile_together_and_each_source_once():
    checks = CudaChecks()
    for value in ("1.0f", "2.0f", "2.0f"):
        checks.add("tests/x.py::test_a", "twin", GOOD.format(value=value), fast=True)
    checks.add("tests/x.py::test_b", "twin", GOOD.format(value="3.0f"), fast=False)
    assert [len(q) for q in checks.queued.values()] == [2, 1]
    checks.compile_all()
    assert not any(checks.queued.values())


@pytest.mark.parametrize("kernel, source, error", [("broken", BAD, "undefined_name"),
                                                   ("bad_ptx", BAD_PTX, r"ptxas .*'no'")])   # ptxas's refusal
def test_a_kernel_that_does_not_compile_fails_naming_its_test(kernel, source, error):
    checks = CudaChecks()
    checks.add("tests/x.py::test_good", "twin", GOOD.format(value="1.0f"), fast=True)
    checks.add("tests/x.py::test_bad", kernel, source, fast=True)
    with pytest.raises(AssertionError, match=rf"(?s)tests/x.py::test_bad: {kernel}: .*{error}") as info:
        checks.compile_all()
    assert "test_good" not in str(info.value)


def test_a_source_an_earlier_module_built_is_not_compiled_again_and_a_failed_one_is():
    """After a module's compile, the same source (in the same mode) is not queued again; another mode's is, and so
    is everything of a program that failed."""
    checks = CudaChecks()
    checks.add("tests/x.py::test_a", "twin", GOOD.format(value="1.0f"), fast=True)
    checks.compile_all()
    checks.add("tests/y.py::test_b", "twin", GOOD.format(value="1.0f"), fast=True)
    checks.add("tests/y.py::test_c", "twin", GOOD.format(value="1.0f"), fast=False)
    assert [len(q) for q in checks.queued.values()] == [0, 1]
    checks.add("tests/y.py::test_d", "broken", BAD, fast=True)
    checks.add("tests/y.py::test_d", "twin", GOOD.format(value="4.0f"), fast=True)
    with pytest.raises(AssertionError):
        checks.compile_all()
    for source in (BAD, GOOD.format(value="4.0f")):
        checks.add("tests/z.py::test_e", "again", source, fast=True)
    assert len(checks.queued[True]) == 2


def test_only_sources_with_inline_ptx_are_assembled(monkeypatch):
    """Inline PTX goes through ptxas (a cubin): the front end passes any text; the other sources stop at PTX."""
    assert cuda_checks.compile_ptx(BAD_PTX, "sm_90")        # what PTX alone lets through
    built = []
    for name in ("compile_cubin", "compile_ptx"):
        compile_to = getattr(cuda_checks, name)
        monkeypatch.setattr(cuda_checks, name, lambda unit, *a, f=compile_to, n=name: built.append((n, unit)) or
                            f(unit, *a))
    checks = CudaChecks()
    checks.add("tests/x.py::test_a", "twin", GOOD.format(value="1.0f"), fast=True)
    checks.add("tests/x.py::test_b", "fence", FENCE, fast=True)
    checks.compile_all()
    assert {(name, "fence" in unit, "twin" in unit) for name, unit in built} == \
        {("compile_cubin", True, False), ("compile_ptx", False, True)}
