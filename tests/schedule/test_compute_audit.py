"""Regression tests of the tensor-expression layer as a user prototyping interactively meets it: td.placeholder,
td.compute, td.reduce and td.op, with their errors, on the cpu target and on the simulated GPU (cuda launches
of td.DeviceArrays run on the cpu). Every value is checked against numpy directly.
"""
import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

import taskdsl as td
from taskdsl import ir
from taskdsl.compute import size_var


@pytest.fixture(params=["cpu", "cuda"])
def target(request):
    """'cpu', or 'cuda' on the simulated GPU (tests/simulated_gpu.py)."""
    if request.param == "cuda":
        request.getfixturevalue("simulated_gpu")
    return request.param


def run(op, target: str, *arrays) -> list:
    """The op's outputs as numpy arrays, its inputs passed as td.DeviceArrays on the cuda target."""
    if target == "cuda":
        arrays = [td.to_device(a) for a in arrays]
    return [o.numpy() if isinstance(o, td.DeviceArray) else o for o in op(*arrays)]


X = td.placeholder("X", td.f32, ("M", "N"))
Y = td.compute("Y", ("M", "N"), lambda i, j: X[i, j] + 1.0)


# ---------------------------------------------------------------- definition and op errors
def test_a_tensor_is_not_iterable_and_an_op_takes_lists():
    """Python iterated a tensor through __getitem__ with 0, 1, 2, ... forever (list(Y) hung, td.op([X], Y) too),
    and td.op(X, [Y]) took X's failed X[0] as the end of a list: 'the outputs read X, which are not inputs'."""
    with pytest.raises(TypeError, match=r"tensor 'Y' is not iterable"):
        iter(Y)
    with pytest.raises(TypeError, match=r"op inputs must be a list of tensors.*td.op\(\[A, B\], \[Y\]\)"):
        td.op(X, [Y])
    with pytest.raises(ValueError, match=r"placeholder 'X' twice"):
        td.op([X, X], [Y])


def test_definition_errors_name_the_definition():
    """A function of the wrong arity, or no function, was Python's bare TypeError from inside td.compute."""
    with pytest.raises(TypeError, match=r"compute 'Bad': the function must take 2 argument\(s\).*signature is \(i\)"):
        td.compute("Bad", ("M", "N"), lambda i: X[i, 0])
    with pytest.raises(TypeError, match=r"reduce 'Bad': the function must take 2 argument\(s\) \(the output indices, "
                                        r"then the reduction indices\)"):
        td.reduce("Bad", ("M",), ("N",), lambda i: X[i, 0])
    with pytest.raises(TypeError, match=r"compute 'Bad': expected a function of one index per output axis, got float"):
        td.compute("Bad", ("M",), 3.0)
    with pytest.raises(TypeError, match=r"'X' is indexed with a slice"):
        td.compute("Bad", ("M",), lambda i: X[i, :])
    with pytest.raises(ValueError, match=r"compute 'Bad': the shape must be a tuple"):
        td.compute("Bad", None, lambda: 1.0)
    with pytest.raises(ValueError, match=r"gather_runs must be a positive int, got 0"):
        td.compute("Bad", ("M",), lambda i: X[i, 0], gather_runs=0)
    with pytest.raises(TypeError, match=r"compute: the name must be a non-empty string, got 3"):
        td.compute(3, ("M",), lambda i: X[i, 0])
    with pytest.raises(TypeError, match=r"placeholder 'P': unknown type name 'f31'; use a taskdsl type"):
        td.placeholder("P", "f31", (3,))


def test_dtypes_by_name_numpy_dtype_and_numpy_scalar_bodies():
    """A numpy dtype or a type's name was an AttributeError ('type object numpy.float32 has no attribute name')
    deep in the Tensor; a body returning a numpy scalar was refused."""
    assert td.placeholder("P", np.float32, (3,)).dtype == td.f32
    assert td.placeholder("P", np.dtype("int64"), (3,)).dtype == td.i64
    assert td.placeholder("P", "bf16", (3,)).dtype == td.bf16
    assert td.compute("C", ("M",), lambda i: X[i, 0], dtype="f16").dtype == td.f16
    assert td.reduce("R", ("M",), ("N",), lambda i, k: X[i, k], dtype=np.float64).dtype == td.f64
    assert td.compute("C", (2,), lambda i: np.float32(1.5)).dtype == td.f32


# ---------------------------------------------------------------- reads of a fixed index outside a tensor
FIXED = td.compute("Fixed", ("M",), lambda i: X[i, 5])
NEGATIVE = td.compute("Negative", ("M",), lambda i: X[i, -1])
PAST_END = td.compute("PastEnd", ("M",), lambda i: X[i, size_var("N")])
GUARDED = td.compute("Guarded", ("M",), lambda i: ir.Select(size_var("N") > 5, X[i, 5], ir.const(-1.0), td.f32))
GUARDED_OP = td.op([X], [GUARDED])


def test_unguarded_fixed_reads_outside_a_tensor_are_errors():
    """X[i, 5] of a 4-wide X, or X[i, -1] (numpy's last element), read out of bounds in every kernel, silently."""
    x = np.arange(12, dtype=np.float32).reshape(3, 4)
    with pytest.raises(ValueError, match=r"compute 'Fixed' reads X\[i0, 5\]: index 5 on axis 1 is outside \[0, 4\)"):
        td.op([X], [FIXED])(x)
    with pytest.raises(ValueError, match=r"compute 'Negative' reads X\[i0, -1\].*do not count from the end"):
        td.op([X], [NEGATIVE]).kernels_for(x)
    with pytest.raises(ValueError, match=r"index 4 on axis 1 is outside \[0, 4\)"):
        td.op([X], [PAST_END]).source(x)
    fine = np.arange(24, dtype=np.float32).reshape(3, 8)
    np.testing.assert_array_equal(td.op([X], [FIXED])(fine)[0], fine[:, 5])
    np.testing.assert_array_equal(td.op([X], [FIXED])(np.zeros((0, 4), np.float32))[0], np.zeros(0, np.float32))


@given(n=st.integers(1, 40), shift=st.integers(-3, 3))
@settings(max_examples=25, deadline=None)
def test_unguarded_reads_an_axis_moves_out_of_a_tensor_are_errors(n, shift):
    """X[i + 1] read past the end for the last element: the kernel returned garbage there, silently (the reference
    raised). Every read of a definition of up to CHECKED_DOMAIN elements is now checked at the first call; the
    same read guarded by a select, or one that stays inside, runs."""
    V1 = td.placeholder("V1", td.f32, ("L",))
    shifted = td.compute("Shifted", ("L",), lambda i: V1[i + shift])
    guarded = td.compute("Guarded", ("L",), lambda i: ir.Select((i + shift >= 0) & (i + shift < size_var("L")),
                                                                V1[i + shift], ir.const(0.0), td.f32))
    v = np.arange(1, n + 1, dtype=np.float32)
    expected = np.array([v[i + shift] if 0 <= i + shift < n else 0.0 for i in range(n)], np.float32)
    np.testing.assert_array_equal(td.op([V1], [guarded])(v)[0], expected)
    outside = sum(1 for i in range(n) if not 0 <= i + shift < n)
    if outside:
        with pytest.raises(ValueError, match=rf"compute 'Shifted' reads V1\[i0 \+ {shift}\]: index -?\d+ on axis 0 is "
                                             rf"outside \[0, {n}\) for {outside} of its {n} elements"):
            td.op([V1], [shifted])(v)
    else:
        np.testing.assert_array_equal(td.op([V1], [shifted])(v)[0], expected)


def test_guarded_fixed_reads_run(target):
    """A read that a select guards is no error: it is not made where it would leave the tensor."""
    narrow, wide = np.arange(12, dtype=np.float32).reshape(3, 4), np.arange(24, dtype=np.float32).reshape(3, 8)
    np.testing.assert_array_equal(run(GUARDED_OP, target, narrow)[0], np.full(3, -1.0, np.float32))
    np.testing.assert_array_equal(run(GUARDED_OP, target, wide)[0], wide[:, 5])


def test_a_select_guards_only_where_its_condition_keeps_the_read_inside():
    """Any select counted as a guard: `A[i + 1] if i < N else 0` (a condition true everywhere) read one past A's
    end at the last element, silently (55.0 of the array A was a view of), where the reference raised."""
    a = td.placeholder("A", td.f32, ("N",))
    n = size_var("N")
    loose = td.compute("Loose", ("N",), lambda i: ir.Select(i < n, a[i + 1], ir.const(0.0), td.f32))
    wrong_side = td.compute("WrongSide", ("N",), lambda i: ir.Select(i + 1 < n, ir.const(0.0), a[i + 1], td.f32))
    tight = td.compute("Tight", ("N",), lambda i: ir.Select(i + 1 < n, a[i + 1], ir.const(0.0), td.f32))
    either = td.compute("Either", ("N",), lambda i: ir.Cast((i + 1 >= n) | (a[i + 1] > 0.0), td.f32))
    backing = np.arange(6, dtype=np.float32) * 11
    view = backing[:5]
    for t in (loose, wrong_side):
        with pytest.raises(ValueError, match=rf"compute '{t.name}' reads A\[i0 \+ 1\]: index 5 on axis 0 is outside "
                                             r"\[0, 5\) for 1 of its 5 elements"):
            td.op([a], [t])(view)
    np.testing.assert_array_equal(td.op([a], [tight])(view)[0], [11, 22, 33, 44, 0])
    np.testing.assert_array_equal(td.op([a], [either])(view)[0], [1, 1, 1, 1, 1])


# ---------------------------------------------------------------- intermediates whose shapes are computed from sizes
V = td.placeholder("V", td.f32, ("L",))
_L = size_var("L")
PADDED = td.compute("Padded", (td.cdiv(_L, 4), 4),
                    lambda i, j: ir.Select(i * 4 + j < _L, V[i * 4 + j], ir.const(0.0), td.f32))
ROW_MAX = td.reduce("RowMax", (td.cdiv(_L, 4),), (4,), lambda i, k: PADDED[i, k], op="max")
TOTAL = td.reduce("Total", (), (td.cdiv(_L, 4),), lambda k: ROW_MAX[k] * 2.0, op="sum")
CENTRED = td.compute("Centred", (td.cdiv(_L, 4), 4), lambda i, j: PADDED[i, j] - ROW_MAX[i] + ir.Cast(_L, td.f32))
COMPUTED_SHAPES = td.op([V], [PADDED, TOTAL, CENTRED])


@pytest.mark.parametrize("n", [1, 10, 37])
def test_kernels_reading_only_intermediates_of_computed_shapes(target, n):
    """A kernel whose parameters all have dims like cdiv(L, 4) could not bind L from any argument's shape: a
    KeyError 'L' from the launch's shape check (TOTAL reads only ROW_MAX; CENTRED only PADDED and ROW_MAX)."""
    v = np.random.default_rng(n).standard_normal(n).astype(np.float32)
    rows = -(-n // 4)
    padded = np.pad(v, (0, rows * 4 - n)).reshape(rows, 4)
    row_max = padded.max(axis=1)
    got_padded, total, centred = run(COMPUTED_SHAPES, target, v)
    np.testing.assert_array_equal(got_padded, padded)
    np.testing.assert_allclose(total, (row_max * 2).sum(dtype=np.float64), rtol=1e-6)
    np.testing.assert_allclose(centred, padded - row_max[:, None] + n, rtol=1e-6)


def test_an_output_listed_twice_is_two_arrays():
    """Both places got the same array object, so writing one result changed the other."""
    x = np.arange(6, dtype=np.float32).reshape(2, 3)
    first, second = td.op([X], [Y, Y])(x)
    first[0, 0] = 100.0
    np.testing.assert_array_equal(second, x + 1.0)


# ---------------------------------------------------------------- from an audit of the API as a new user meets it
def test_a_0_d_compute_runs(target):
    """A 0-d td.compute crashed the cpu schedule (IndexError stepping coordinates it has none of)."""
    s = td.placeholder("S", td.f32, ())
    doubled = td.compute("Doubled", (), lambda: s[()] * 2.0)
    v = td.placeholder("V", td.f32, ("K",))
    total = td.reduce("Total", (), ("K",), lambda k: v[k], op="sum")
    plus_one = td.compute("PlusOne", (), lambda: total[()] + 1.0)
    out, = run(td.op([s], [doubled]), target, np.array(3.0, np.float32))
    assert out.shape == () and out == 6.0
    out, = run(td.op([v], [plus_one]), target, np.arange(5, dtype=np.float32))
    assert out.shape == () and out == 11.0


def test_placeholder_dims_computed_from_symbols_math_names_and_sizes_past_i32_are_errors():
    """A placeholder of (N * 2,) failed at the call (AttributeError: 'Binary' has no 'name'); td.math_expr took a
    misspelled name (a KeyError when run) and failed on numbers alone; N * N was computed in i32 (the reference gave
    a (0,) output for N = 65536, the op a false 'negative size' for N = 50000, or ran a 2^32-element axis)."""
    with pytest.raises(ValueError, match=r"placeholder 'E': dims must be ints or size symbols, got N \* 2"):
        td.placeholder("E", td.f32, (size_var("N") * 2,))
    with pytest.raises(ValueError, match=r"td.math_expr: no math function 'expp'; the functions are abs, acos"):
        td.math_expr("expp", [X[0, 0]])
    assert td.math_expr("exp", [1.0]) == pytest.approx(np.exp(1.0))
    assert td.math_expr("max", [2, 3.5]) == 3.5
    a = td.placeholder("A", td.f32, ("N",))
    n = size_var("N")
    outer = td.op([a], [td.compute("Outer", (n * n,), lambda i: a[i // n] * a[i % n])])
    for size in (50000, 65536):     # N * N past 2^31 - 1, and 2^32 (0 in i32)
        message = f"'Outer' would have an axis of N \\* N = {size * size} elements for N={size}, past the 2147483647"
        with pytest.raises(ValueError, match=message):
            outer.reference(np.ones(size, np.float32))
        with pytest.raises(ValueError, match=message):
            outer(np.ones(size, np.float32))
    small = np.arange(3, dtype=np.float32)
    np.testing.assert_array_equal(outer(small)[0], np.outer(small, small).ravel())
