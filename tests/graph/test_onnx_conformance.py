"""ONNX backend node conformance: the node test cases shipped in the onnx package
(`onnx.backend.test.case.node.collect_testcases`) for every supported operator, imported with from_onnx and run
on the cpu target.

A case is selected when all its nodes are supported operators (single-node cases, and the "expanded" function
cases built from supported operators). Each must pass (same dtype and shape, values within the case's rtol/atol,
as onnx's own backend runner checks) or be refused with UnsupportedOnnxError (a data type, opset or attribute
value the importer does not take); a mismatch or any other error fails. Inputs that fix shapes (a Reshape's shape,
Slice's starts, ...) are graph inputs in these cases: they are given with from_onnx(constants=...), which is what
the ConstantRequiredError asks for. Graphs are compiled with the passes up to dead-code elimination, without
fusion partitioning: these cases check the importer and the operators' semantics (fusion compiles one template per
fused problem, which would make this set take many minutes; test_fusion.py covers it). The pass rate is printed at
the end of the session (conftest.py). Each group also has a @gpu twin on the cuda target (a GPU, or the
simulated one with TASKDSL_SIMULATED_GPU=1).
"""
import functools
import warnings

import ml_dtypes
import numpy as np
import onnx
import pytest

import taskdsl as td
import taskdsl.graph as tg
from taskdsl.graph import passes
from taskdsl.graph.onnx_import import SUPPORTED_OPERATORS, ConstantRequiredError, UnsupportedOnnxError

from ..simulated_gpu import simulate_cuda_twin
from .conftest import CONFORMANCE

GPU_TWINS = True
MULTI_NODE = "multi-node"
UNFUSED = [passes.infer_shapes, passes.fold_constants, passes.eliminate_dead_code]


@pytest.fixture(autouse=True)
def _cpu_target_and_nvrtc(monkeypatch, twin_target):
    """The cpu target (or the twin's) with fast compilation (generic kernels shared by the cases), without the
    NVRTC compile of every launched kernel that tests/conftest.py adds: these cases check semantics, and their
    kernels come from the same rule scheduler the other tests compile."""
    simulate_cuda_twin(monkeypatch, twin_target)
    td.set_target(twin_target or "cpu")
    td.fast_compile(True)
    yield
    td.set_target("cpu")


@functools.cache
def cases_by_group() -> dict:
    """Selected node cases, grouped by operator (cases of several nodes in MULTI_NODE)."""
    from onnx.backend.test.case.node import collect_testcases
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        cases = collect_testcases(None)
    groups: dict = {}
    supported = set(SUPPORTED_OPERATORS)
    for case in cases:
        ops = [node.op_type for node in case.model.graph.node]
        if set(ops) <= supported:
            groups.setdefault(ops[0] if len(ops) == 1 else MULTI_NODE, []).append(case)
    return groups


def _array(value) -> np.ndarray | list:
    """A case's input or output value as an array (a sequence's, which graph inputs and outputs cannot be, as the
    list it is)."""
    if isinstance(value, list):
        return value
    return onnx.numpy_helper.to_array(value) if isinstance(value, onnx.TensorProto) else np.asarray(value)


def run_case(case, pipeline: list = UNFUSED) -> str:
    """'passed' or 'unsupported' when compiled with the passes of `pipeline`; raises AssertionError (or the
    error) when the case fails."""
    inputs, expected = case.data_sets[0]
    feeds = {vi.name: _array(v) for vi, v in zip(case.model.graph.input, inputs)}
    constants: dict = {}
    while True:
        try:
            graph = tg.from_onnx(case.model, constants=constants)
            break
        except ConstantRequiredError as e:
            if all(name in constants for name in e.inputs):
                raise
            constants.update({name: feeds[name] for name in e.inputs})
        except UnsupportedOnnxError:
            return "unsupported"
    compiled = graph.compile(passes=pipeline)
    with np.errstate(all="ignore"):
        outputs = compiled({t.name: feeds[t.name] for t in graph.inputs})
    for got, want in zip(outputs, (_array(v) for v in expected)):
        assert got.dtype == want.dtype and got.shape == want.shape, \
            f"got {got.dtype}{list(got.shape)}, expected {want.dtype}{list(want.shape)}"
        if want.dtype.kind in "biu":
            np.testing.assert_array_equal(got, want)
        else:
            np.testing.assert_allclose(got.astype(np.float64), want.astype(np.float64), rtol=_rtol(case, want.dtype),
                                       atol=_atol(case, want))
    return "passed"


def _rtol(case, dtype: np.dtype) -> float:
    """The case's rtol, or for a 16-bit float output at least two units in its last place: the expected values
    round each intermediate result of an expanded function to 16 bits, which taskdsl computes in f32 and rounds
    once (docs/graph.md)."""
    if dtype.itemsize == 2:
        return max(case.rtol, 2 * float(ml_dtypes.finfo(dtype).eps))
    return case.rtol


# operators each of whose output elements sums terms along a whole axis: an element whose terms cancel to 0 carries
# their rounding, which is relative to their size, not to its own (an inverse DFT's imaginary part at the Nyquist
# bin: exactly 0, expected 1.9e-7 (numpy's complex64 noise), taskdsl 5.5e-15, onnxruntime -7.1e-6, atol 1e-7)
SUMMED_OUTPUTS = {"DFT"}


def _atol(case, want: np.ndarray) -> float:
    """The case's atol, or for an operator of SUMMED_OUTPUTS at least 8 units in the last place of the output's
    largest magnitude."""
    if not {node.op_type for node in case.model.graph.node} & SUMMED_OUTPUTS or not want.size:
        return case.atol
    return max(case.atol, 8 * float(ml_dtypes.finfo(want.dtype).eps) * float(np.abs(want).max()))


@pytest.mark.parametrize("group", sorted(SUPPORTED_OPERATORS) + [MULTI_NODE])
def test_node_cases(group, twin_target):
    cases = cases_by_group().get(group, [])
    if not cases:
        pytest.skip(f"the onnx package has no node cases for {group}")
    failures = []
    results = CONFORMANCE if twin_target == "cpu" else {}     # the printed pass rate is the cpu target's
    for case in cases:
        try:
            results[case.name] = run_case(case)
        except Exception as e:   # a mismatch, or an error that is not the clear UnsupportedOnnxError
            results[case.name] = f"failed: {e}"
            failures.append(f"{case.name}: {type(e).__name__}: {str(e)[:300]}")
    assert not failures, f"{len(failures)} of {len(cases)} {group} cases failed:\n" + "\n".join(failures)
