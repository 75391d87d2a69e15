"""passes.drop_exact_round_trips: a float cast to an integer type and back, where the value is already an integer within
the type's range, becomes the value (NaN: 0). The oracle is the graph's numpy reference, which evaluates the casts as
written; each test also asserts whether the pass replaced the round trip."""
from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra.numpy import arrays

import taskdsl.graph as tg
from taskdsl.graph import ops, passes

SPECIAL = [np.nan, np.inf, -np.inf, -0.0, 0.0, 0.5, -0.5, 2.5, 1e30, -1e30]
SHAPES = st.lists(st.sampled_from([0, 1, 2, 3, 7, 13]), max_size=3)


def values(shape):
    """f32 arrays of the given shape: ordinary values, halves, special ones and huge ones."""
    elements = st.one_of(st.sampled_from([np.float32(v) for v in SPECIAL]), st.floats(-400, 400, width=32))
    return arrays(np.float32, tuple(shape), elements=elements)


def quantize_dequantize(x, scale: float, zero: int | None, integer: str, low: float, high: float,
                        rounding: str = "rint"):
    """DequantizeLinear(QuantizeLinear(x)) as the ONNX importer builds it: x / scale rounded, plus the zero point
    (None: none), clipped to [low, high], cast to `integer`; back to f32, minus the zero point, times the scale."""
    q = ops.elementwise(rounding, ops.div(x, scale))
    if zero is not None:
        q = ops.add(q, tg.constant(np.float32(zero)))
    y = ops.cast(ops.cast(ops.clip(q, low, high), integer), "float32")
    return ops.mul(y if zero is None else ops.sub(y, tg.constant(np.float32(zero))), scale)


def casts(graph) -> int:
    """How many cast operators `graph` holds after the pass."""
    return sum(op.kind == "cast" for op in passes.drop_exact_round_trips(graph).nodes)


def check(y, x, data: np.ndarray, round_trips_left: int) -> None:
    """The compiled graph of y equals its numpy reference, the signs of zeros included; the pass leaves
    `round_trips_left` casts."""
    graph = tg.Graph([x], [y])
    graph = passes.fold_constants(passes.infer_shapes(graph))
    assert casts(graph) == round_trips_left
    got, = graph(data)
    want, = graph.reference(data)
    np.testing.assert_array_equal(got, want)
    np.testing.assert_array_equal(np.signbit(got), np.signbit(want))


@settings(max_examples=25, deadline=None)
@given(shape=SHAPES, data=st.data(), integer=st.sampled_from(["uint8", "int8", "int16", "uint16"]),
       scale=st.sampled_from([0.05, 1.0, 3.0, 1e-3]))
def test_a_quantize_dequantize_pair_loses_its_casts_and_keeps_its_values(shape, data, integer, scale):
    """The importer's pair over the type's whole range, values past it, NaN, infinities and signed zeros."""
    info = np.iinfo(integer)
    zero = data.draw(st.none() | st.integers(int(info.min), int(info.max)), label="zero")
    x = tg.input("x", tuple(shape), "float32")
    y = quantize_dequantize(x, scale, zero, integer, float(info.min), float(info.max))
    check(y, x, data.draw(values(shape), label="x"), round_trips_left=0)


@pytest.mark.parametrize("rounding, zero, integer, bounds", [
    ("floor", 3, "int8", (-128.0, 127.0)), ("ceil", None, "int8", (-128.0, 127.0)),
    ("rint", None, "int32", (-2.0**31, 2.0**30)), ("rint", 7, "uint8", (10.0, 20.0))])
def test_other_roundings_types_and_bounds(rounding, zero, integer, bounds):
    """floor and ceil give integers as rint does; any integral float within int32's range is an f32 there and back;
    bounds inside the type's range."""
    x = tg.input("x", (len(SPECIAL) + 4,), "float32")
    y = quantize_dequantize(x, 0.5, zero, integer, *bounds, rounding)
    check(y, x, np.array(SPECIAL + [63.7, -64.2, 100.0, 2.0**29 + 64], np.float32), round_trips_left=0)


def test_a_round_trip_stays_where_the_integers_are_read_elsewhere():
    """An 8-bit activation read by the next product and, dequantized, by a residual: the integers are made anyway,
    so both casts stay, and the values are the reference's."""
    x = tg.input("x", (len(SPECIAL) + 3,), "float32")
    q = ops.cast(ops.clip(ops.add(ops.elementwise("rint", ops.div(x, 0.5)), tg.constant(np.float32(3))), 0.0, 255.0),
                 "uint8")
    graph = passes.fold_constants(passes.infer_shapes(tg.Graph([x], [ops.cast(q, "float32"), ops.cast(q, "int32")])))
    assert sum(op.kind == "cast" for op in passes.drop_exact_round_trips(graph).nodes) == 3
    data = np.array(SPECIAL + [63.7, -64.2, 200.0], np.float32)
    for got, want in zip(graph(data), graph.reference(data)):
        np.testing.assert_array_equal(got, want)


@pytest.mark.parametrize("case", ["bounds past the type", "no rounding", "one bound", "int32 bounds past it in f32"])
def test_round_trips_that_change_values_stay(case):
    """Where the cast to the integer type is not exact, both casts stay and the values are the casts'."""
    x = tg.input("x", (len(SPECIAL) + 4,), "float32")
    data = np.array(SPECIAL + [300.7, -300.2, 2.0**24 + 1, 2.0**31], np.float32)
    if case == "bounds past the type":
        y = quantize_dequantize(x, 1.0, 0, "uint8", 0.0, 300.0)
    elif case == "no rounding":
        y = ops.cast(ops.cast(ops.clip(x, 0.0, 255.0), "uint8"), "float32")
    elif case == "one bound":
        y = ops.cast(ops.cast(ops.clip(ops.elementwise("rint", x), 0.0, None), "uint8"), "float32")
    else:       # 2^31 - 1 is 2^31 in f32
        y = ops.cast(ops.cast(ops.clip(ops.elementwise("rint", x), -2.0**31, 2.0**31 - 1), "int32"), "float32")
    check(y, x, data, round_trips_left=2)


def test_a_products_epilogue_takes_the_whole_chain_of_pairs():
    """A matmul, then two quantize-dequantize pairs with a bias between: one kernel, the pairs' round trips
    `nan_to_zero` in its epilogue (each reads its value once, as an epilogue needs), values as the reference's (the
    product of small integers is exact; a multiply-add contracted into an FMA may move a value by one step)."""
    rng = np.random.default_rng(5)
    x = tg.input("x", (13, 29), "float32")
    w = tg.constant(rng.integers(-3, 4, (29, 7)).astype(np.float32))
    b = tg.constant(rng.standard_normal(7).astype(np.float32))
    y = quantize_dequantize(ops.matmul(x, w), 0.05, 3, "int8", -128.0, 127.0)
    y = quantize_dequantize(ops.add(y, b), 0.1, 200, "uint8", 0.0, 255.0)
    graph = tg.Graph([x], [y])
    compiled = graph.compile("cpu")
    fused, = [op for op in compiled.graph.nodes if op.kind == "fused"]
    assert fused.attrs["epilogue"].count("nan_to_zero") == 2 and "cast" not in fused.attrs["epilogue"]
    data = rng.integers(-4, 5, (13, 29)).astype(np.float32)
    data[0, :3] = [np.nan, np.inf, -np.inf]
    got, = compiled(data)
    want, = graph.reference(data)
    np.testing.assert_allclose(got, want, rtol=0, atol=0.1001)


def test_long_chains_and_values_read_twice_are_walked_once_each():
    """The integer check recursed once per operator (an 8000-operator chain, an unrolled loop's, died with
    RecursionError) and walked a value read twice twice (a doubling DAG of 60 levels: 2^60 visits)."""
    x = tg.input("x", (3,))
    chain = doubled = ops.elementwise("rint", ops.mul(x, 10.0))
    for k in range(6000):
        chain = ops.add(chain, 1.0) if k % 2 else ops.sub(chain, 1.0)
    for _ in range(60):
        doubled = ops.sub(ops.add(doubled, doubled), doubled)
    for y in (chain, doubled):
        graph = tg.Graph([x], [ops.cast(ops.cast(ops.clip(y, 0.0, 255.0), "uint8"), "float32")])
        assert casts(graph) == 0
    xa = np.array([0.26, 3.1, -2.0], np.float32)
    np.testing.assert_array_equal(passes.drop_exact_round_trips(graph).reference(xa)[0], graph.reference(xa)[0])
