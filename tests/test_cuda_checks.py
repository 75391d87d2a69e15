"""The suite's NVRTC check of launched kernels (`cuda_checks.py`): one program per module, failures named."""
import pytest

from .cuda_checks import CudaChecks

GOOD = 'extern "C" __global__ void __launch_bounds__(32) twin(float* __restrict__ y) {{ y[threadIdx.x] = {value}; }}\n'
BAD = 'extern "C" __global__ void broken(float* y) { y[0] = undefined_name; }\n'


def test_kernels_of_one_name_compile_together_and_each_source_once():
    checks = CudaChecks()
    for value in ("1.0f", "2.0f", "2.0f"):
        checks.add("tests/x.py::test_a", "twin", GOOD.format(value=value), fast=True)
    checks.add("tests/x.py::test_b", "twin", GOOD.format(value="3.0f"), fast=False)
    assert [len(q) for q in checks.queued.values()] == [2, 1]
    checks.compile_all()
    assert not any(checks.queued.values())


def test_a_kernel_that_does_not_compile_fails_naming_its_test():
    checks = CudaChecks()
    checks.add("tests/x.py::test_good", "twin", GOOD.format(value="1.0f"), fast=True)
    checks.add("tests/x.py::test_bad", "broken", BAD, fast=True)
    with pytest.raises(AssertionError, match=r"(?s)tests/x.py::test_bad: broken: .*undefined_name") as info:
        checks.compile_all()
    assert "test_good" not in str(info.value)
