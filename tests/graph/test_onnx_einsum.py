"""Einsum against onnxruntime: random equations (one to three operands, repeated labels for diagonals and traces,
ellipses that broadcast, explicit and implicit outputs) over odd, prime and size-1 dims; and its clear errors."""
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from onnx import TensorProto, helper

import taskdsl.graph as tg
from taskdsl.graph import OnnxImportError

from . import assert_close, make_model, rand, run_onnxruntime

LABELS = "abcde"      # onnxruntime 1.32 refuses upper-case labels (test_upper_case_labels: numpy)
ELEM = {np.float32: TensorProto.FLOAT, np.float64: TensorProto.DOUBLE, np.int64: TensorProto.INT64}


@st.composite
def einsum_cases(draw):
    """(equation, operand shapes): up to three terms of up to four labels each (repeats allowed), some with an
    ellipsis: the same number of dims in each (as the operator requires), any of them 1 (broadcast)."""
    size = {label: draw(st.sampled_from([1, 2, 3, 5, 7])) for label in LABELS}
    ellipsis = draw(st.lists(st.sampled_from([2, 3]), max_size=2)) if draw(st.booleans()) else None
    terms, shapes = [], []
    for _ in range(draw(st.integers(1, 3))):
        labels = draw(st.lists(st.sampled_from(LABELS), max_size=4))
        if ellipsis is not None and draw(st.booleans()):
            dims = [1 if draw(st.booleans()) else d for d in ellipsis]
            at = draw(st.integers(0, len(labels)))
            terms.append("".join(labels[:at]) + "..." + "".join(labels[at:]))
            shapes.append([size[label] for label in labels[:at]] + dims + [size[label] for label in labels[at:]])
        else:
            terms.append("".join(labels))
            shapes.append([size[label] for label in labels])
    equation = ",".join(terms)
    if draw(st.booleans()):         # explicit: some of the labels, in any order, and the ellipsis if there is one
        used = sorted(set("".join(terms).replace(".", "")))
        output = draw(st.permutations(used))[:draw(st.integers(0, len(used)))]
        if "..." in equation:
            output.insert(draw(st.integers(0, len(output))), "...")
        equation += "->" + "".join(output)
    return equation, shapes


def _model(equation: str, shapes: list, elem=TensorProto.FLOAT):
    names = [f"x{k}" for k in range(len(shapes))]
    node = helper.make_node("Einsum", names, ["y"], equation=equation)
    out_shape = np.einsum(equation, *(np.zeros(shape) for shape in shapes)).shape
    return make_model([node], [(name, shape, elem) for name, shape in zip(names, shapes)],
                      [("y", list(out_shape), elem)], opset=12)


@settings(max_examples=20, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(case=einsum_cases(), dtype=st.sampled_from([np.float32, np.int64]))
def test_random_equations_match_onnxruntime(case, dtype):
    equation, shapes = case
    model = _model(equation, shapes, ELEM[dtype])
    feeds = {f"x{k}": rand(shape, k, dtype, low=-3, high=3) for k, shape in enumerate(shapes)}
    got, want = tg.from_onnx(model)(feeds)[0], run_onnxruntime(model, feeds)[0]
    assert got.dtype == want.dtype and got.shape == want.shape, equation
    assert_close(got, want, rtol=1e-5, atol=1e-4)


@pytest.mark.parametrize("equation, shapes", [
    ("bhqd,bhkd->bhqk", [(2, 3, 5, 4), (2, 3, 7, 4)]),      # attention scores
    ("bhqk,bhkd->bhqd", [(2, 3, 5, 7), (2, 3, 7, 4)]),
    ("ii", [(5, 5)]),                                       # trace
    ("ii->i", [(5, 5)]),                                    # diagonal
    ("i,j->ij", [(3,), (4,)]),                              # outer product
    ("...ij,...jk", [(2, 1, 3, 4), (2, 5, 4, 2)]),          # broadcast batched matmul
    ("ij->", [(3, 0)]),                                     # empty: a sum of nothing
])
def test_common_equations(equation, shapes):
    model = _model(equation, shapes)
    feeds = {f"x{k}": rand(shape, k) for k, shape in enumerate(shapes)}
    got, want = tg.from_onnx(model)(feeds)[0], run_onnxruntime(model, feeds)[0]
    assert got.shape == want.shape
    assert_close(got, want, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(got, np.einsum(equation, *feeds.values()), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("equation, shapes", [("bA,Ac", [(2, 3), (3, 4)]), ("Ba,aB", [(2, 3), (3, 2)]),
                                              ("...i,i...->...", [(4, 3), (3, 4)]),
                                              ("...ij,...jk", [(2, 1, 3, 4), (5, 4, 2)])])
def test_upper_case_labels_and_numpy_broadcasting(equation, shapes):
    """Upper-case labels sort before lower-case ones in an implicit output; an ellipsis may stand for different
    numbers of dims (right-aligned, as numpy broadcasts): numpy is the oracle (onnxruntime refuses both)."""
    xs = [rand(shape, k) for k, shape in enumerate(shapes)]
    model = _model(equation, shapes)
    np.testing.assert_allclose(tg.from_onnx(model)(*xs)[0], np.einsum(equation, *xs), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("equation, shapes, message", [
    ("ij,jk", [(2, 3)], "has 2 operand terms for 1 inputs"),
    ("ij1", [(2, 3, 4)], "labels are letters"),
    ("ijk", [(2, 3)], "does not match its operand's rank 2"),
    ("ij,jk->ik", [(2, 3), (4, 5)], "label 'j' has size 3 in one operand and 4 in another"),
    ("ij->iz", [(2, 3)], "the output's labels must be distinct labels of the operands"),
    ("ij->ii", [(2, 2)], "the output's labels must be distinct labels of the operands"),
])
def test_bad_equations_are_import_errors(equation, shapes, message):
    names = [f"x{k}" for k in range(len(shapes))]
    node = helper.make_node("Einsum", names, ["y"], equation=equation)
    model = helper.make_model(helper.make_graph(
        [node], "bad", [helper.make_tensor_value_info(n, TensorProto.FLOAT, s) for n, s in zip(names, shapes)],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)]),
        opset_imports=[helper.make_opsetid("", 12)])
    with pytest.raises(OnnxImportError, match=message):
        tg.from_onnx(model)
