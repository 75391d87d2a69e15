"""Python constructs the translator once got wrong, each checked against the same function run as plain Python.

The oracle is the kernel's own Python function executed by the interpreter on numpy arrays (with its
`@td.func`s replaced by their Python functions), so a kernel must compute what Python computes.
"""
import functools
import types

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import taskdsl as td
from taskdsl import f32, i32
from taskdsl.frontend.decorators import DeviceFunction

from .markers import Markers

MARKS = Markers(__file__)
FEW = settings(max_examples=5, deadline=None)


def run_as_python(fn, *arrays):
    """Run `fn` as plain Python on copies of `arrays` (its device functions as their Python functions)."""
    namespace = {k: v.fn if isinstance(v, DeviceFunction) else v for k, v in fn.__globals__.items()}
    copies = [a.copy() for a in arrays]
    types.FunctionType(fn.__code__, namespace)(*copies)
    return copies


@functools.cache
def one_thread_kernel(fn):
    return td.kernel(block=1)(fn)


def check_against_python(fn, *arrays):
    """Run `fn` as a one-thread kernel and as Python; every array must end the same."""
    want = run_as_python(fn, *arrays)
    got = [a.copy() for a in arrays]
    one_thread_kernel(fn)(*got)
    for g, w in zip(got, want):
        np.testing.assert_array_equal(g, w)


# --------------------------------------------------------------------------- evaluation order
@td.func
def bump(X, i, v: f32) -> f32:
    X[i] = X[i] + 100.0         # a store the caller can see (tensors are passed by reference)
    return v


@td.func
def step(I, r: i32) -> i32:
    I[0] = I[0] + 1
    return r


@td.func
def add(a: f32, b: f32) -> f32:
    return a + b


def evaluation_order(X: f32[4], I: i32[2], Y: f32[8]):
    Y[0] = X[0] + bump(X, 0, 1.0)                       # an operand read before the call stores to it
    Y[1] = 1.0 if X[1] < bump(X, 1, 50.0) else 0.0      # a comparison
    Y[2] = add(X[2], bump(X, 2, 1.0))                   # @td.func arguments
    X[3] += bump(X, 3, 1.0)                             # the element is read before the value is computed
    Y[3] = X[3]
    Y[4] = X[I[0] + step(I, 0)]                         # an index
    Y[5] = max(X[0], bump(X, 0, -1000.0))               # a builtin's arguments
    Y[step(I, 6)] = I[0] * 1.0                          # the value is computed before the index
    Y[7] = 1.0 if 0.0 <= X[1] < bump(X, 1, 180.0) else 0.0   # a chained comparison


def test_operands_are_read_before_a_later_call_stores_to_them():
    x = np.array([1.0, 2.0, 3.0, 4.0], np.float32)
    check_against_python(evaluation_order, x, np.zeros(2, np.int32), np.zeros(8, np.float32))


def tuple_assignments(X: f32[3], Y: f32[3], Z: f32[3]):
    X[0], X[1] = X[1], X[0]                 # swap two elements
    Y[0], Y[1], Y[2] = Y[1], Y[2], Y[0]     # rotate three
    a = Z[0]
    a, Z[0] = Z[1], a                       # a name and an element
    Z[2] = a


@FEW
@given(st.lists(st.integers(-50, 50), min_size=9, max_size=9))
def test_tuple_assignment_to_elements_reads_the_old_values(values):
    x, y, z = (np.array(values[k:k + 3], np.float32) for k in (0, 3, 6))
    check_against_python(tuple_assignments, x, y, z)


def nested_unpacking(X: f32[3], Y: f32[3]):
    (a, b), Y[2] = (X[2], X[0]), X[1] + 1.0
    for k, (c, d) in enumerate(((1.0, X[1]), (2.0, X[2]))):
        a += c * d + k
    Y[0], Y[1] = a, b


def test_nested_tuple_unpacking():
    check_against_python(nested_unpacking, np.array([1.0, 2.0, 3.0], np.float32), np.zeros(3, np.float32))


# --------------------------------------------------------------------------- and / or
@td.func
def mark(Y, v: f32) -> f32:
    Y[3] = Y[3] + 1.0          # counts the calls: `or` must call it only when its left operand is false
    return v


def and_or_values(X: f32[2], K: i32[1], Y: f32[6]):
    a, b = X[0], X[1]
    Y[0] = a or b
    Y[1] = a and b
    Y[2] = (a > 0.0) and b or 5.0
    Y[4] = a or mark(Y, 7.0)
    Y[5] = 0 or K[0] or a


VALUES = st.sampled_from([0.0, 1.5, -2.0])


@FEW
@given(VALUES, VALUES, st.sampled_from([0, 3]))
def test_and_or_give_the_operand_that_decides(a, b, k):
    check_against_python(and_or_values, np.array([a, b], np.float32), np.array([k], np.int32),
                         np.zeros(6, np.float32))


# --------------------------------------------------------------------------- builtins, is, in
def several_args_min_max(X: f32[3], K: i32[3], Y: f32[6]):
    Y[0] = min(X[0], X[1], X[2])
    Y[1] = max((X[0], X[1], X[2]))
    Y[2] = max(K[0], 2, K[1], K[2])
    Y[3] = min([K[0], X[1]])
    Y[4] = max(X[2], K[2], 0.5)
    Y[5] = min(X[1], X[1], K[1])


@FEW
@given(st.lists(st.sampled_from([-3, 0, 1, 2, 5]), min_size=6, max_size=6))
def test_min_max_of_several_runtime_values(values):
    check_against_python(several_args_min_max, np.array(values[:3], np.float32), np.array(values[3:], np.int32),
                         np.zeros(6, np.float32))


BIASES = (1, 2)


@td.func
def add_bias(Y, i, bias):
    if bias is not None:        # a compile-time test: the caller passes a tensor or None
        Y[i] = Y[i] + bias[0]


def identity_and_membership(X: f32[1], K: i32[3], Y: f32[6]):
    Y[0] = 1.0 if 2 in BIASES else 0.0
    Y[1] = 1.0 if BIASES is not None else 0.0
    Y[2] = 1.0 if K[0] in (3, K[1]) else 0.0
    Y[3] = 1.0 if K[0] not in BIASES else 0.0
    add_bias(Y, 4, X)
    add_bias(Y, 5, None)


@FEW
@given(st.lists(st.integers(0, 3), min_size=3, max_size=3))
def test_is_and_in(values):
    check_against_python(identity_and_membership, np.array([2.5], np.float32), np.array(values, np.int32),
                         np.zeros(6, np.float32))


# --------------------------------------------------------------------------- @td.func parameters
@td.func
def scaled_twice(v: f32, k: i32) -> f32:
    v = v * 2.0                 # a parameter reassigned: the caller's variable keeps its value
    for j in range(k):
        v += 1.0
    return v


@td.func
def first_positive(a: f32, b: f32) -> f32:
    if a > 0.0:
        return a                # the early return's flag is read by the statements after the if
    return b + a


def parameter_binding(X: f32[3], Y: f32[5]):
    a = X[0]
    n = 2
    Y[0] = scaled_twice(a, n)
    Y[1] = a                    # not doubled by the call
    Y[2] = add(a, a)            # one variable for both parameters, which the callee only reads
    Y[3] = first_positive(X[1], X[2])
    Y[4] = first_positive(X[2], scaled_twice(X[1], 1))


@FEW
@given(st.lists(st.integers(-5, 5), min_size=3, max_size=3))
def test_a_func_reads_its_callers_variables_and_assigns_its_own(values):
    check_against_python(parameter_binding, np.array(values, np.float32), np.zeros(5, np.float32))


def test_a_parameter_the_func_only_reads_is_the_callers_variable():
    """No copy for a parameter bound to a variable: one variable fewer for every later stage (on the cpu target,
    one per-thread array fewer across barriers); nor the flag of a return that ends the function."""
    def copies(X: f32[3], Y: f32[3]):
        a = X[0]
        Y[0] = add(a, X[1])

    text = one_thread_kernel(copies).ir(np.zeros(3, np.float32), np.zeros(3, np.float32))
    assigned = [line.split(":")[0].strip() for line in text.splitlines() if ": f32 = " in line]
    assert assigned == ["a", "b", "add_ret"]        # b: the element read, bound to the parameter once
    assert "returned" not in text


# --------------------------------------------------------------------------- errors
def test_starred_assignment_is_a_clear_error():
    @td.kernel(block=1)
    def k(X: f32[3]):
        a, *b = X[0], X[1], X[2]  # E_STARRED
        X[0] = a

    err = MARKS.expect_error(lambda: k(np.zeros(3, np.float32)), "E_STARRED")
    assert "starred assignment (a, *b = ...) is not supported" in err.message


def test_is_on_a_runtime_value_is_a_clear_error():
    @td.kernel(block=1)
    def k(X: f32[3]):
        X[0] = 1.0 if X[1] is None else 0.0  # E_IS_RUNTIME

    err = MARKS.expect_error(lambda: k(np.zeros(3, np.float32)), "E_IS_RUNTIME")
    assert "'is' compares values known at compile time" in err.message and "==" in err.hint


def test_in_needs_a_compile_time_tuple():
    @td.kernel(block=1)
    def k(X: f32[3]):
        X[0] = 1.0 if X[1] in X else 0.0  # E_IN_TENSOR

    err = MARKS.expect_error(lambda: k(np.zeros(3, np.float32)), "E_IN_TENSOR")
    assert "needs a tuple or list known at compile time" in err.message


@pytest.mark.parametrize("call", ["min(X[0])", "max(X[0], X[1], key=abs)"])
def test_min_max_misuse_is_a_clear_error(call, tmp_path):
    path = tmp_path / "kernel_min.py"
    path.write_text("import taskdsl as td\nfrom taskdsl import f32\n\n"
                    f"@td.kernel(block=1)\ndef k(X: f32[3]):\n    X[2] = {call}\n")
    namespace: dict = {}
    exec(compile(path.read_text(), str(path), "exec"), namespace)  # noqa: S102 - a test kernel in a file
    with pytest.raises(td.DSLError) as info:
        namespace["k"](np.zeros(3, np.float32))
    assert info.value.loc.line == 6 and call in str(info.value)
    assert "min()" in info.value.message or "max()" in info.value.message


def test_and_or_of_a_non_number_is_a_clear_error():
    @td.kernel(block=1)
    def k(X: f32[3]):
        X[0] = X[1] or None  # E_OR_NONE

    err = MARKS.expect_error(lambda: k(np.zeros(3, np.float32)), "E_OR_NONE")
    assert "'or' of a runtime value needs numbers" in err.message


# --------------------------------------------------------------------------- cuda
@pytest.mark.parametrize("fn, shapes", [
    (evaluation_order, ((4, np.float32), (2, np.int32), (8, np.float32))),
    (and_or_values, ((2, np.float32), (1, np.int32), (6, np.float32))),
    (several_args_min_max, ((3, np.float32), (3, np.int32), (6, np.float32))),
    (identity_and_membership, ((1, np.float32), (3, np.int32), (6, np.float32))),
])
def test_the_kernels_compile_to_cuda(fn, shapes):
    assert one_thread_kernel(fn).compile(*(np.zeros(n, t) for n, t in shapes), target="cuda").binary


def test_a_module_reloaded_after_an_edit_of_a_local_annotation_runs_the_edit(tmp_path, monkeypatch):
    """Local annotations are not in the bytecode: the edited def's code object equals the old one, and the parsed
    source cached by code object was the old text's (`v: i32` ran after the edit to `v: f32`)."""
    import importlib
    import os
    import sys
    source = ("import taskdsl as td\nfrom taskdsl import f32, i32\n\n\n@td.kernel(block=1)\n"
              "def k(x: f32[1]):\n    v: i32 = 2.75\n    x[0] = v\n")
    path = tmp_path / "edited_annotation.py"
    path.write_text(source)
    monkeypatch.syspath_prepend(str(tmp_path))
    module = importlib.import_module("edited_annotation")
    try:
        x = np.zeros(1, np.float32)
        module.k(x)
        assert x[0] == 2.0
        path.write_text(source.replace("v: i32", "v: f32"))
        os.utime(path, ns=(path.stat().st_atime_ns, path.stat().st_mtime_ns + 10**9))   # a later edit, surely
        module = importlib.reload(module)
        module.k(x)
        assert x[0] == 2.75
    finally:
        sys.modules.pop("edited_annotation", None)


@td.func
def clamp(v: f32, lo: f32, hi: f32) -> f32:
    """v held within [lo, hi]."""
    return td.min(td.max(v, lo), hi)


def test_a_device_function_keeps_its_functions_name_docstring_and_signature():
    import inspect
    assert clamp.__name__ == "clamp" and clamp.__doc__ == "v held within [lo, hi]."
    assert clamp.__module__ == __name__ and list(inspect.signature(clamp).parameters) == ["v", "lo", "hi"]


def test_numpy_integers_are_dims_of_annotations():
    assert f32[np.int64(4), "N"].dims == (4, "N") and type(f32[np.int64(4)].dims[0]) is int


@td.kernel(block=1)
def square_only(A: f32["N", "N"]):
    A[0, 0] = 1.0


def test_a_size_twice_in_one_annotation_says_the_axes_disagree():
    with pytest.raises(ValueError, match="size 'N' is 3 from an earlier axis of this argument but 4 in 'A'"):
        square_only(np.zeros((3, 4), np.float32))


@td.kernel(block=1)
def yields(x: f32[1]):
    yield 1


def test_a_yield_statement_is_named():
    with pytest.raises(td.DSLError, match="'yield' expressions are not supported in kernels"):
        yields(np.zeros(1, np.float32))


def test_a_kernel_whose_file_changed_since_it_ran_is_refused(tmp_path):
    """The kernel was built from the file's text, not from the code Python ran: an editor running an unsaved buffer
    (exec under the file's name), or a module edited after import, ran other code, silently; a def moved by the
    edit was blamed on `python -c`."""
    saved = ("import taskdsl as td\nfrom taskdsl import f32, threadIdx\n\n\n@td.kernel(block=4)\n"
             "def k(x: f32[4]):\n    x[threadIdx.x] = 2.0\n")
    path = tmp_path / "edited_cells.py"
    path.write_text(saved)
    for text in (saved.replace("2.0", "1.0"), "# a line above\n" + saved):
        namespace: dict = {}
        exec(compile(text if text.startswith("import") else saved, str(path), "exec"), namespace)
        if not text.startswith("import"):
            path.write_text(text)          # the def moved after it ran
        with pytest.raises(td.DSLError, match="is not the code Python ran: the file changed since it was run"):
            namespace["k"](np.zeros(4, np.float32))
        path.write_text(saved)


def _nested_kernel_with_a_docstring():
    @td.kernel(block=4)
    def nested(x: f32[4]):
        """A docstring of
        two lines (the dedented text's differs from the code's)."""
        x[td.threadIdx.x] = 3.0
    return nested


def test_a_nested_kernel_with_a_multi_line_docstring_is_not_taken_for_an_edited_file():
    """The check that the text is the code Python ran compared docstrings, which the dedent of a nested def changes:
    every f16 matmul on cuda (a nested @td.func with such a docstring) was refused."""
    x = np.zeros(4, np.float32)
    _nested_kernel_with_a_docstring()(x)
    np.testing.assert_array_equal(x, 3.0)


@td.func
def _bumped_if(v: td.i64, k: td.i64) -> td.i64:
    if k > 0:
        v = v + 10
    return v


@td.func
def _counted_down(v: td.i64, k: td.i64) -> td.i64:
    while k > 0:
        v = v + 10
        k -= 1
    return v


@td.kernel(block=64)
def _constant_arguments_reassigned(OUT: td.i64[64, 2]):
    t = td.threadIdx.x
    OUT[t, 0] = _bumped_if(5, t // 32)          # 5 bound to v, which a runtime if reassigns
    OUT[t, 1] = _counted_down(t, 3)             # 3 bound to k, which the loop counts down


def test_a_constant_argument_of_a_parameter_the_func_reassigns_is_a_runtime_variable():
    """The constant was bound as a compile-time value: `v = v + 10` under a runtime if took effect while
    translating, in every thread (15 for warp 0 too), and `while k > 0: k -= 1` was refused as endless."""
    out = np.zeros((64, 2), np.int64)
    _constant_arguments_reassigned(out)
    t = np.arange(64)
    np.testing.assert_array_equal(out[:, 0], np.where(t // 32 > 0, 15, 5))
    np.testing.assert_array_equal(out[:, 1], t + 30)


def test_print_shows_a_runtime_value_as_the_expression_it_stands_for(capsys):
    """`print` runs while the kernel translates: a runtime value printed as the IR's repr (`Load(buffer=Buffer(...`),
    now as the expression (and a compile-time value as itself)."""
    @td.kernel(block=4)
    def shows(X: f32["N"]):
        i = td.threadIdx.x
        print("at", X[i] * 2.0, N, 3 + 4)   # noqa: F821 (N: X's size symbol)
        X[i] = 1.0

    x = np.zeros(4, np.float32)
    shows(x)
    assert capsys.readouterr().out == "at X[i] * 2.0 N 7\n"
    np.testing.assert_array_equal(x, np.ones(4, np.float32))
