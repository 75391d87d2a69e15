"""ONNX TopK against onnxruntime: hypothesis-drawn shapes (size-1 and prime axes), axes, k (0 to the axis's
length), largest / smallest, opsets 1 (k an attribute), 10 and 11, element types, and values with many ties and
NaNs; sorted=0; the graph op's refusals. Every kernel the tests launch is also compiled for CUDA by NVRTC
(tests/conftest.py)."""
import numpy as np
import pytest
from hypothesis import assume, given, note, settings
from hypothesis import strategies as st
from onnx import TensorProto, helper

import taskdsl.graph as tg
from taskdsl.graph import ops
from taskdsl.graph.onnx_import import OnnxImportError

from . import make_model, run_onnxruntime

pytest.importorskip("onnxruntime")

TYPES = {TensorProto.FLOAT: np.float32, TensorProto.FLOAT16: np.float16, TensorProto.DOUBLE: np.float64,
         TensorProto.INT32: np.int32, TensorProto.INT64: np.int64, TensorProto.UINT8: np.uint8}
OPSETS_BEFORE_LARGEST = (1, 10)     # largest and sorted are opset 11's


def topk_model(shape: list, k: int, axis: int, largest: int, elem: int, opset: int, sort: int = 1):
    """A one-node TopK model (k an initializer from opset 10, an attribute before)."""
    attrs = {"axis": axis} if opset < 11 else {"axis": axis, "largest": largest, "sorted": sort}
    inputs, inits = ["x"], {}
    if opset >= 10:
        inputs, inits = ["x", "k"], {"k": np.array([k], np.int64)}
    else:
        attrs["k"] = k
    node = helper.make_node("TopK", inputs, ["values", "indices"], **attrs)
    rank = len(shape)
    return make_model([node], [("x", shape, elem)], [("values", [None] * rank, elem),
                                                     ("indices", [None] * rank, TensorProto.INT64)], inits, opset=opset)


def values(shape: list, elem: int, seed: int, nans: bool) -> np.ndarray:
    """Few distinct values (ties everywhere), NaNs among floats where asked."""
    rng = np.random.default_rng(seed)
    x = rng.integers(0 if elem == TensorProto.UINT8 else -3, 4, shape).astype(TYPES[elem])
    if nans and x.size and np.dtype(TYPES[elem]).kind == "f":
        x.flat[rng.integers(0, x.size, 1 + x.size // 4)] = np.nan
    return x


@settings(max_examples=8, deadline=None)
@given(data=st.data(), shape=st.lists(st.sampled_from([1, 2, 3, 5, 7]), min_size=1, max_size=3),
       elem=st.sampled_from(sorted(TYPES)), opset=st.sampled_from([1, 10, 11, 24]), nans=st.booleans(),
       seed=st.integers(0, 99))
def test_topk_matches_onnxruntime(data, shape, elem, opset, nans, seed):
    """Values and indices equal onnxruntime's, ties in index order and NaN above every number."""
    floats = np.dtype(TYPES[elem]).kind == "f"
    assume(floats or opset >= 11)       # (integers are opset 11's)
    axis = data.draw(st.integers(-len(shape), len(shape) - 1), label="axis")
    k = data.draw(st.integers(1 if opset == 1 else 0, shape[axis]), label="k")     # (opset 1: k >= 1)
    largest = 1 if opset in OPSETS_BEFORE_LARGEST else data.draw(st.sampled_from([0, 1]), label="largest")
    x = values(shape, elem, seed, nans)
    note(f"x = {x!r}")
    model = topk_model(shape, k, axis, largest, elem, opset)
    got = tg.from_onnx(model).compile()({"x": x})
    if elem == TensorProto.FLOAT16:     # onnxruntime has no f16 TopK: its f32 one, on the same (exact) values
        wide_model = topk_model(shape, k, axis, largest, TensorProto.FLOAT, opset)
        wide = run_onnxruntime(wide_model, {"x": x.astype(np.float32)})
        want = [wide[0].astype(np.float16), wide[1]]
    else:
        want = run_onnxruntime(model, {"x": x})
    for g, w in zip(got, want):
        assert g.dtype == w.dtype and g.shape == w.shape
        np.testing.assert_array_equal(g, w)


def long_row_values(shape: list, elem: int, seed: int, nans: bool, order: str) -> np.ndarray:
    """Values of a few hundred kinds (ties), signed zeros and NaNs among floats where asked, along the last axis in
    random order or sorted (ascending makes every element enter a largest-first selection)."""
    rng = np.random.default_rng(seed)
    low = 0 if elem == TensorProto.UINT8 else -100
    x = rng.integers(low, 100, shape).astype(TYPES[elem])
    if np.dtype(TYPES[elem]).kind == "f":
        x = x / 4
        x[x == 0] *= np.where(rng.random(int((x == 0).sum())) < 0.5, -1, 1).astype(x.dtype)    # -0.0 ties 0.0
        if nans:
            x.flat[rng.integers(0, x.size, 1 + x.size // 50)] = np.nan
    if order != "random":
        x = np.sort(x, axis=-1)
        x = x if order == "ascending" else x[..., ::-1].copy()
    return x


@settings(max_examples=8, deadline=None)
@given(n=st.sampled_from([129, 1009, 4099]), k=st.one_of(st.integers(1, 24), st.sampled_from([25, 129, 1009, 4099])),
       elem=st.sampled_from(sorted(TYPES)),
       largest=st.sampled_from([0, 1]), nans=st.booleans(),
       order=st.sampled_from(["random", "ascending", "descending"]),
       seed=st.integers(0, 99))
def test_topk_of_long_rows_matches_onnxruntime(n, k, elem, largest, nans, order, seed):
    """A few of thousands, as a vocabulary's top-k (on the cpu, `stdlib_ops.topk.keeps_best` selects by its kernel,
    about n comparisons a row), or more, up to the whole row sorted (a merge sort): values and indices equal
    onnxruntime's."""
    k = min(k, n)
    x = long_row_values([2, n], elem, seed, nans, order)
    note(f"x = {x!r}")
    model = topk_model([2, n], k, -1, largest, elem, 11)
    got = tg.from_onnx(model).compile()({"x": x})
    if elem == TensorProto.FLOAT16:     # (onnxruntime has no f16 TopK: its f32 one, on the same values)
        wide = run_onnxruntime(topk_model([2, n], k, -1, largest, TensorProto.FLOAT, 11), {"x": x.astype(np.float32)})
        want = [wide[0].astype(np.float16), wide[1]]
    else:
        want = run_onnxruntime(model, {"x": x})
    for g, w in zip(got, want):
        np.testing.assert_array_equal(g, w)


def test_topk_past_the_selections_k_along_a_middle_axis():
    """k above stdlib_ops.topk.MAX_K (on the cpu a quickselect and a merge sort of each row), the whole row, and a
    few that `keeps_best` give onnxruntime's results on the same rows, along a middle axis."""
    from stdlib_ops.topk import MAX_K, keeps_best
    x = long_row_values([2, 3, 300], TensorProto.FLOAT, 3, True, "random").transpose(0, 2, 1).copy()
    assert keeps_best(16, 300) and not keeps_best(MAX_K, 300) and not keeps_best(MAX_K + 1, 10 ** 6)
    for k in (MAX_K + 1, 300, MAX_K, 16):
        model = topk_model([2, 300, 3], k, 1, 1, TensorProto.FLOAT, 11)
        got, want = tg.from_onnx(model).compile()({"x": x}), run_onnxruntime(model, {"x": x})
        for g, w in zip(got, want):
            np.testing.assert_array_equal(g, w)


def test_the_scan_of_adjacent_elements_tests_a_chunk_at_once_and_keeps_the_order():
    """Where a row's elements are adjacent (inner 1), `keeps_best`'s kernel is compiled for it and tests CHUNK
    elements against the bar at once, one by one only where one enters; along a middle axis, the general kernel.
    Rows where every element enters (ascending), none past the first k (descending), ties, NaNs and random values:
    numpy's stable order (a NaN above every number, ties by index), both orders, each kernel."""
    from stdlib_ops import topk
    n, k = 5 * topk.CHUNK + 3, 4
    rng = np.random.default_rng(11)
    x = np.stack([np.arange(n), -np.arange(n), rng.integers(0, 3, n), rng.standard_normal(n),
                  rng.standard_normal(n)]).astype(np.float32)
    x[3, [9, 40, n - 1]] = np.nan
    x[4, k + topk.CHUNK - 1::topk.CHUNK] += 10   # each chunk's last element (the chunks start at k) enters
    for largest in (True, False):
        nan_above = np.where(np.isnan(x), np.inf, x)
        order = np.argsort(-nan_above if largest else nan_above, axis=1, kind="stable")[:, :k]
        for inner in (1, 3):
            rows = np.repeat(x[:, :, None], inner, axis=2)
            values, indices = np.empty((5, k, inner), np.float32), np.empty((5, k, inner), np.int64)
            kernel = topk.topk_rows(rows, values, indices, largest)
            assert kernel.name.endswith("_rows") == (inner == 1)
            for c in range(inner):
                np.testing.assert_array_equal(indices[:, :, c], order)
                np.testing.assert_array_equal(values[:, :, c], np.take_along_axis(x, order, 1))


@pytest.mark.parametrize("rounds", [None, 1])
def test_the_merge_sorts_selection_and_its_fallback_keep_numpys_order(monkeypatch, rounds):
    """k above MAX_K: a quickselect (its pivots sampled in a row this long) moves each row's k first to its
    front before the merge sort; past SELECT_ROUNDS partitions (cut to 1 here) it gives up and the row is
    sorted whole. Rows of many ties, NaNs, a sorted one, and one whose first pivot has a quarter of the row ahead
    of it (for its 2300 first, the rest is sampled again, from a point past the front): numpy's stable order of the
    row (a NaN above every number, ties by index), both orders."""
    from stdlib_ops import topk
    if rounds is not None:
        monkeypatch.setattr(topk, "SELECT_ROUNDS", rounds)
    topk.topk_sorted_kernel.cache_clear()
    try:
        rng = np.random.default_rng(5)
        n = 2 * topk.SAMPLE ** 2 + 13     # a long row: its pivots are sampled while the rest is this long
        x = rng.integers(0, 7, (5, n)).astype(np.float32)
        x[1, ::9] = np.nan
        x[2] = np.arange(n)
        x[3] = rng.standard_normal(n)
        x[4] = rng.standard_normal(n)       # its sampled elements: a quarter of the row ahead of their median
        x[4, ::n // topk.SAMPLE] = np.quantile(x[4], np.linspace(0.99, 0.5, topk.SAMPLE + 1))
        for largest, k in ((True, 700), (False, 129), (True, 2300), (True, n)):
            values, indices = np.empty((5, k, 1), np.float32), np.empty((5, k, 1), np.int64)
            topk.topk_rows(x[:, :, None], values, indices, largest)
            nan_above = np.where(np.isnan(x), np.inf, x)         # a NaN above every number (first of the largest)
            order = np.argsort(-nan_above if largest else nan_above, axis=1, kind="stable")[:, :k]
            np.testing.assert_array_equal(indices[:, :, 0], order)
            np.testing.assert_array_equal(values[:, :, 0], np.take_along_axis(x, order, 1))
    finally:
        topk.topk_sorted_kernel.cache_clear()


def test_unsorted_topk_selects_what_onnxruntime_selects():
    """sorted=0 leaves the order to the operator: taskdsl sorts anyway; the selected elements are onnxruntime's."""
    x = np.array([[5, 1, 5, 2, 5, 1, 0, 7, 7], [0, 0, 1, 1, 2, 2, 3, 3, 4]], np.float32)
    for largest in (0, 1):
        model = topk_model([2, 9], 4, 1, largest, TensorProto.FLOAT, 11, sort=0)
        got_values, got_indices = tg.from_onnx(model).compile()({"x": x})
        want_values, want_indices = run_onnxruntime(model, {"x": x})
        sorted_model = topk_model([2, 9], 4, 1, largest, TensorProto.FLOAT, 11)
        np.testing.assert_array_equal(got_indices, run_onnxruntime(sorted_model, {"x": x})[1])
        np.testing.assert_array_equal(np.sort(got_values, axis=1), np.sort(want_values, axis=1))
        np.testing.assert_array_equal(np.sort(got_indices, axis=1), np.sort(want_indices, axis=1))


def test_topk_refusals():
    """k past the axis, a K of more than one value, bool and 0-d tensors are clear errors."""
    with pytest.raises(OnnxImportError, match="between 0 and the axis's length 5"):
        tg.from_onnx(topk_model([2, 5], 6, -1, 1, TensorProto.FLOAT, 11))
    two = make_model([helper.make_node("TopK", ["x", "k"], ["v", "i"])], [("x", [2, 5])],
                     [("v", [None, None]), ("i", [None, None], TensorProto.INT64)], {"k": np.array([1, 2], np.int64)},
                     opset=11)
    with pytest.raises(OnnxImportError, match="K must be one integer"):
        tg.from_onnx(two)
    with pytest.raises(ValueError, match="k must be between 0 and the axis's length 5, got 6"):
        ops.topk(tg.input("x", (2, 5)), 6)
    with pytest.raises(TypeError, match="not defined on bool"):
        ops.topk(tg.input("b", (2, 5), "bool"), 1)
    with pytest.raises(ValueError, match="at least one axis"):
        ops.topk(tg.input("s", ()), 1)


def test_topk_graph_op_matches_numpy_along_a_middle_axis():
    """ops.topk against numpy's stable argsort (descending by a stable sort of the negation) on a 3-d tensor."""
    x = np.random.default_rng(5).integers(-4, 5, (3, 7, 2)).astype(np.float32)
    t = tg.input("x", x.shape)
    graph = tg.trace(lambda a: ops.topk(a, 4, axis=1), t)
    got_values, got_indices = graph.compile()({"x": x})
    order = np.argsort(-x, axis=1, kind="stable")[:, :4]
    np.testing.assert_array_equal(got_indices, order)
    np.testing.assert_array_equal(got_values, np.take_along_axis(x, order, axis=1))
