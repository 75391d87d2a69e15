"""User errors: a DSLError at the offending line (file, line, column, the line shown), or a
TypeError / ValueError at call time for arguments that do not match the annotations.

Expected line numbers are found from marker comments (`# E_...`) in this file, so the
tests do not depend on where in the file a kernel sits.
"""

from pathlib import Path

import numpy as np
import pytest

import taskdsl as td
from taskdsl import blockIdx, f32, i32, i64, spatial, threadIdx

from .markers import Markers

MARKS = Markers(__file__)
LINES = MARKS.lines
line_of = MARKS.line_of


def dsl_error(call, tag: str, *fragments: str, token: str | None = None) -> td.DSLError:
    """Run `call`, expect a DSLError at the line marked `tag` whose message has every fragment."""
    err = MARKS.expect_error(call, tag)
    line = line_of(tag)
    for fragment in fragments:
        assert fragment in err.message, f"{fragment!r} not in {err.message!r}"
    text = str(err)
    assert text.startswith(f"{err.loc.file}:{line}:{err.loc.col}: "), text
    source = LINES[line - 1]
    assert "\n" + " " * 4 + " " * err.loc.col + "^" in text, text   # with a caret under the column
    if token is not None:
        assert err.loc.col == source.index(token), (err.loc.col, source.index(token))
    return err


def vec(n=32, dtype=np.float32):
    return np.zeros(n, dtype)


# --------------------------------------------------------------------------- names and statements
def test_undefined_name():
    @td.kernel(grid=1, block=32)
    def k(X: f32[32], Y: f32[32]):
        Y[threadIdx.x] = X[threadIdx.x] + undefined_thing  # E_UNDEF  # noqa: F821

    dsl_error(lambda: k(vec(), vec()), "E_UNDEF", "name 'undefined_thing' is not defined", token="undefined_thing")


def test_misspelled_attribute_suggests_the_name():
    @td.kernel(grid=1, block=32)
    def k(X: f32[32]):
        X[threadIdx.xx] = td.exp(1.0)  # E_ATTR

    dsl_error(lambda: k(vec()), "E_ATTR", "'threadIdx' has no attribute 'xx'; did you mean 'x'?", token="threadIdx.xx")

    @td.kernel(grid=1, block=32)
    def m(X: f32[32]):
        X[threadIdx.x] = td.expp(1.0)  # E_ATTR_MODULE

    dsl_error(lambda: m(vec()), "E_ATTR_MODULE", "'td' has no attribute 'expp'; did you mean 'exp'?")


def test_with_statement():
    @td.kernel(grid=1, block=32)
    def k(X: f32[32]):
        with open("x") as f:  # E_WITH
            X[threadIdx.x] = 1.0

    dsl_error(lambda: k(vec()), "E_WITH", "'With' statements are not supported")


def test_try_statement():
    @td.kernel(grid=1, block=32)
    def k(X: f32[32]):
        try:  # E_TRY
            X[threadIdx.x] = 1.0
        except Exception:
            pass

    dsl_error(lambda: k(vec()), "E_TRY", "'Try' statements are not supported")


def test_lambda_expression():
    @td.kernel(grid=1, block=32)
    def k(X: f32[32]):
        f = lambda v: v * 2.0  # E_LAMBDA  # noqa: E731
        X[threadIdx.x] = 1.0

    err = dsl_error(lambda: k(vec()), "E_LAMBDA", "lambdas are not supported in kernels", token="lambda")
    assert err.hint == "Use a @td.func."


def test_expressions_kernels_do_not_have_are_named_in_words():
    """The message named the AST class ('ListComp', 'NamedExpr', 'JoinedStr')."""
    @td.kernel(grid=1, block=1)
    def comprehension(X: f32[4]):
        t = [X[i] for i in range(4)]  # E_LISTCOMP
        X[0] = t[0]

    err = dsl_error(lambda: comprehension(vec(4)), "E_LISTCOMP", "list comprehensions are not supported in kernels")
    assert "for loop" in err.hint

    @td.kernel(grid=1, block=1)
    def walrus(X: f32[4]):
        if (v := X[1]) > 0.0:  # E_WALRUS
            X[0] = v

    dsl_error(lambda: walrus(vec(4)), "E_WALRUS", "assignment expressions (:=) are not supported in kernels")

    @td.kernel(grid=1, block=1)
    def appended(X: f32[4]):
        values = [1.0, 2.0]
        values.append(X[0])  # E_APPEND
        X[1] = values[2]

    dsl_error(lambda: appended(vec(4)), "E_APPEND",
              "'values' is a compile-time tuple (a list in a kernel is one, fixed when the kernel is built): "
              "it has no 'append'")

    @td.kernel(grid=1, block=1)
    def declared(X: f32[4]):
        x: f32
        X[0] = x  # E_DECLARED

    dsl_error(lambda: declared(vec(4)), "E_DECLARED", "'x' is declared but never assigned a value")

    @td.func
    def divide(a, b):
        return a // b, a % b  # E_TUPLE_RETURN

    @td.kernel(grid=1, block=1)
    def pair(X: i32[4]):
        q, r = divide(X[0], 3)
        X[1] = q

    err = dsl_error(lambda: pair(vec(4, np.int32)), "E_TUPLE_RETURN", "a @td.func returns one number, not a tuple")
    assert "tensor" in err.hint


def test_nested_def():
    @td.kernel(grid=1, block=32)
    def k(X: f32[32]):
        def inner(v):  # E_DEF
            return v
        X[threadIdx.x] = 1.0

    dsl_error(lambda: k(vec()), "E_DEF", "'FunctionDef' statements are not supported")


def test_builtin_that_is_not_allowed():
    @td.kernel(grid=1, block=32)
    def k(X: f32[32]):
        X[threadIdx.x] = hash(3)  # E_BUILTIN

    dsl_error(lambda: k(vec()), "E_BUILTIN", "'hash'")


def test_expression_statement_without_effect():
    @td.kernel(grid=1, block=32)
    def k(X: f32[32]):
        X[threadIdx.x] + 1.0  # E_NOEFFECT

    dsl_error(lambda: k(vec()), "E_NOEFFECT", "no effect")


def test_kernel_returning_a_value():
    @td.kernel(grid=1, block=32)
    def k(X: f32[32]):
        return X[0]  # E_RETVAL

    dsl_error(lambda: k(vec()), "E_RETVAL", "cannot return a value")


# --------------------------------------------------------------------------- loops and mappings
def test_wrong_number_of_mapping_loop_variables():
    @td.kernel(grid=1, block=32)
    def k(X: f32[4, 8]):
        for i in spatial(4, 8)(threadIdx.x):  # E_MAPVARS
            X[i, 0] = 1.0

    dsl_error(lambda: k(np.zeros((4, 8), np.float32)), "E_MAPVARS", "2 variable names, got 1")


def test_mapping_not_called_on_a_worker():
    @td.kernel(grid=1, block=32)
    def k(X: f32[4, 8]):
        for i, j in spatial(4, 8):  # E_MAPCALL
            X[i, j] = 1.0

    dsl_error(lambda: k(np.zeros((4, 8), np.float32)), "E_MAPCALL", "must be called on a worker index")


def test_assigning_to_a_loop_variable():
    @td.kernel(grid=1, block=32)
    def k(X: f32[32]):
        for i in range(4):
            i = i + 1  # E_LOOPVAR
            X[i] = 1.0

    dsl_error(lambda: k(vec()), "E_LOOPVAR", "cannot assign to the loop variable 'i'")


def test_reading_a_name_after_a_loop_over_it():
    # Python would give the loop's last value; a kernel's loop variable belongs to the loop
    @td.kernel(grid=1, block=1)
    def k(X: f32[32], n: i32):
        i = 7
        for i in range(n):
            X[i] = 1.0
        X[0] = i  # E_AFTERLOOP

    dsl_error(lambda: k(vec(), 3), "E_AFTERLOOP", "'i' is read after a loop over 'i'", "from before the loop",
              token="i  #")

    @td.kernel(grid=1, block=1)
    def fine(X: f32[32], n: i32):
        i = 7
        for i in range(n):          # a later loop over the name, and an assignment, end the warning
            X[i] = 1.0
        for i in range(2):
            X[i + 4] = 2.0
        i = n + 1
        X[i] = 3.0

    x = vec()
    fine(x, 3)
    np.testing.assert_array_equal(x[:6], [1, 1, 1, 0, 3, 2])


def test_reading_a_variable_assigned_on_some_paths_only():
    """Python raises UnboundLocalError where a thread skipped the assignment; a GPU thread would read an
    uninitialized register (and the cpu target one shared local): refused where it is read."""
    @td.kernel(grid=1, block=16)
    def branch(X: f32[16], Y: f32[16]):
        if threadIdx.x == 0:
            v = X[5]
        Y[threadIdx.x] = v  # E_MAYBE_IF

    dsl_error(lambda: branch(vec(16), vec(16)), "E_MAYBE_IF", "'v' may be unassigned here", token="v  #")

    @td.kernel(grid=1, block=1)
    def loop(X: f32[32], n: i32):
        for k in range(n):
            last = X[k]
        X[0] = last  # E_MAYBE_LOOP

    dsl_error(lambda: loop(vec(), 3), "E_MAYBE_LOOP", "'last' may be unassigned here", token="last  #")

    @td.kernel(grid=1, block=1)
    def early_break(X: f32[32]):
        for k in range(4):
            if X[k] > 0.0:
                break
            w = X[k]
        X[0] = w  # E_MAYBE_BREAK

    dsl_error(lambda: early_break(vec()), "E_MAYBE_BREAK", "'w' may be unassigned here")

    @td.kernel(grid=1, block=1)
    def while_loop(X: f32[32], n: i32):
        m = n
        while m > 0:
            t = X[m]
            m = m - 1
        X[0] = t  # E_MAYBE_WHILE

    dsl_error(lambda: while_loop(vec(), 3), "E_MAYBE_WHILE", "'t' may be unassigned here")


def test_variables_assigned_on_every_path_are_fine():
    """Both branches, a branch that returns or continues, a loop of a constant positive trip count, an unrolled
    loop and a device function's reassigned parameter: each read follows an assignment on every path."""
    @td.func
    def bumped(v: f32) -> f32:
        v = v + 1.0
        return v

    @td.kernel(grid=1, block=8)
    def k(X: f32[8], Y: f32[8]):
        t = threadIdx.x
        if t % 2 == 0:
            a = X[t]
        else:
            a = -X[t]
        if t == 7:
            Y[t] = 100.0
            return
        for r in range(2):
            b = a * 2.0 + r            # the loop runs: b is assigned after it
        for s in (1.0, 2.0):
            c = b + s
        acc = 0.0
        for j in range(8):
            if j > t:
                continue
            acc += X[j]
        Y[t] = bumped(c) + acc

    x = np.arange(8, dtype=np.float32)
    y = vec(8)
    k(x, y)
    sign = np.where(np.arange(8) % 2 == 0, 1.0, -1.0)
    want = (sign * x * 2 + 1) + 2 + 1 + np.cumsum(x)
    want[7] = 100.0
    np.testing.assert_allclose(y, want)


def test_assigning_to_a_mapping_loop_variable():
    @td.kernel(grid=1, block=32)
    def k(X: f32[32]):
        for (i) in spatial(32)(threadIdx.x):
            i += 1  # E_MAPLOOPVAR
            X[i] = 1.0

    dsl_error(lambda: k(vec()), "E_MAPLOOPVAR", "loop variable 'i'")


def test_non_constant_range_step():
    @td.kernel(grid=1, block=32)
    def k(X: f32["N"], step: i32):
        for j in range(0, N, step):  # E_STEP
            X[j] = 1.0

    dsl_error(lambda: k(vec(), 2), "E_STEP", "step of range() must be a non-zero int known at compile time")


def test_zero_range_step():
    @td.kernel(grid=1, block=32)
    def k(X: f32["N"]):
        for j in range(0, N, 0):  # E_STEP0
            X[j] = 1.0

    dsl_error(lambda: k(vec()), "E_STEP0", "step of range()")


def test_float_range_bound():
    @td.kernel(grid=1, block=32)
    def k(X: f32["N"]):
        for j in range(X[0]):  # E_FLOATRANGE
            X[j] = 1.0

    dsl_error(lambda: k(vec()), "E_FLOATRANGE", "range() bounds must be integers")


def test_return_inside_a_loop():
    @td.kernel(grid=1, block=32)
    def k(X: f32[32]):
        for j in range(4):
            if X[j] > 0.0:
                return  # E_LOOPRET
            X[j] = 1.0

    dsl_error(lambda: k(vec()), "E_LOOPRET", "'return' inside a loop is not supported")


def test_break_outside_a_loop():
    @td.kernel(grid=1, block=32)
    def k(X: f32[32]):
        for j in (1, 2):
            if j == 2:
                break  # E_BREAK
            X[j] = 1.0

    dsl_error(lambda: k(vec()), "E_BREAK", "'break' outside a runtime loop")


# --------------------------------------------------------------------------- indexing and types
def test_indexing_a_2d_tensor_with_one_index():
    @td.kernel(grid=1, block=32)
    def k(X: f32[4, 8], Y: f32[32]):
        Y[threadIdx.x] = X[threadIdx.x]  # E_RANK

    dsl_error(lambda: k(np.zeros((4, 8), np.float32), vec()), "E_RANK",
              "'X' has 2 dimensions but is indexed with 1 index")


def test_tensor_index_with_a_float():
    @td.kernel(grid=1, block=32)
    def k(X: f32[32], Y: f32[32]):
        Y[threadIdx.x] = X[X[0]]  # E_FLOATIDX

    dsl_error(lambda: k(vec(), vec()), "E_FLOATIDX", "tensor indices must be integers, got f32")


def test_bitwise_operator_on_floats():
    @td.kernel(grid=1, block=32)
    def k(X: f32[32], Y: f32[32]):
        Y[threadIdx.x] = X[threadIdx.x] & X[0]  # E_BITFLOAT

    dsl_error(lambda: k(vec(), vec()), "E_BITFLOAT", "'&' needs integer operands", "f32")


def test_invert_on_a_float():
    @td.kernel(grid=1, block=32)
    def k(X: f32[32], Y: f32[32]):
        Y[threadIdx.x] = ~X[threadIdx.x]  # E_INVFLOAT

    dsl_error(lambda: k(vec(), vec()), "E_INVFLOAT", "'~' needs an integer operand")


def test_infinite_constant_converted_to_an_integer():
    @td.kernel(grid=1, block=32)
    def k(X: f32[32], Y: f32[32]):
        Y[threadIdx.x] = i32(1e300 * 1e300) + X[0]  # E_INFINT

    dsl_error(lambda: k(vec(), vec()), "E_INFINT", "inf has no i32 value", token="i32(")


def test_integer_literal_beyond_64_bits():
    @td.kernel(grid=1, block=32)
    def k(X: f32[32], Y: f32[32]):
        Y[threadIdx.x] = X[threadIdx.x * 2**70]  # E_BIGINT

    @td.kernel(grid=1, block=32)
    def k2(X: f32[32]):
        X[2**70] = 1.0  # E_BIGSTORE

    @td.kernel(grid=1, block=32)
    def k3(X: f32[32]):
        if k < 1.0:  # E_CTCOMPARE
            X[0] = 1.0

    # stored into an integer tensor, assigned or cast, such a number was wrapped modulo 2^64 silently
    @td.kernel(grid=1, block=1)
    def k4(X: i64[4]):
        X[0] = 2**70  # E_BIGINTSTORE

    @td.kernel(grid=1, block=1)
    def k5(X: i64[4]):
        v: i64 = -(2**64) - 5  # E_BIGINTVAR
        X[0] = v

    @td.kernel(grid=1, block=1)
    def k6(X: i64[4]):
        X[0] = i64(2**65 + 7)  # E_BIGINTCAST

    dsl_error(lambda: k(vec(), vec()), "E_BIGINT", "the integer literal 1180591620717411303424 does not fit in 64 bits")
    dsl_error(lambda: k2(vec()), "E_BIGSTORE", "does not fit in 64 bits")
    dsl_error(lambda: k3(vec()), "E_CTCOMPARE", "compile-time '<' failed: '<' not supported")
    for kernel, tag in ((k4, "E_BIGINTSTORE"), (k5, "E_BIGINTVAR"), (k6, "E_BIGINTCAST")):
        dsl_error(lambda: kernel(np.zeros(4, np.int64)), tag, "does not fit in 64 bits")

    @td.kernel(grid=1, block=1)
    def truthy(B: td.boolean[2], F: f32[2]):     # Python's bool(2**70) and float(2**70) are fine
        B[0] = 2**70
        F[0] = 2**70

    b, f = np.zeros(2, bool), np.zeros(2, np.float32)
    truthy(b, f)
    assert b[0] and f[0] == np.float32(2.0**70)


def test_constant_shift_count_out_of_range():
    @td.kernel(grid=1, block=32)
    def k(X: i32[32]):
        X[threadIdx.x] = X[threadIdx.x] >> 32  # E_SHIFT

    dsl_error(lambda: k(vec(dtype=np.int32)), "E_SHIFT", "shift by 32: the count must be in 0..31 for i32")


def test_compile_time_errors_of_unary_operators_and_math():
    @td.kernel(grid=1, block=32)
    def k(X: f32[32]):
        X[threadIdx.x] = ~1.5  # E_CTINVERT

    @td.kernel(grid=1, block=32)
    def k2(X: f32[32]):
        X[threadIdx.x] = td.exp(td.shared)  # E_CTEXP

    dsl_error(lambda: k(vec()), "E_CTINVERT", "compile-time 'Invert' failed: bad operand type")
    dsl_error(lambda: k2(vec()), "E_CTEXP", "exp() needs numbers, got Intrinsic")


def test_dtype_called_on_a_string():
    @td.kernel(grid=1, block=32)
    def k(X: f32[32]):
        X[threadIdx.x] = f32("1.5")  # E_DTYPESTR

    dsl_error(lambda: k(vec()), "E_DTYPESTR", "f32(x) takes one number", token='f32("1.5")')


def test_loop_that_never_ends():
    """The body never updates s, so `s > 0` folds to true: the GPU would hang (numba failed to compile it)."""
    @td.kernel(grid=1, block=32)
    def k(X: f32[32]):
        s = 16
        while s > 0:  # E_ENDLESS
            if threadIdx.x < s:
                X[threadIdx.x] += 1.0
            td.syncthreads()

    dsl_error(lambda: k(vec()), "E_ENDLESS", "this loop never ends", token="while")
    dsl_error(lambda: k.source(vec(), target="cuda"), "E_ENDLESS", "this loop never ends")


def test_tensor_slices_are_rejected():
    @td.kernel(grid=1, block=32)
    def k(X: f32[32], Y: f32[32]):
        Y[threadIdx.x] = X[0:4]  # E_SLICE

    dsl_error(lambda: k(vec(), vec()), "E_SLICE", "slices")


def test_compile_time_tuples_are_sliced_with_compile_time_bounds_only():
    @td.kernel(grid=1, block=32)
    def k(X: f32[32], Y: f32[32], n: i32):
        for w in (1.0, 2.0, 3.0)[n:]:  # E_RUNTIME_SLICE
            Y[threadIdx.x] += w * X[threadIdx.x]

    dsl_error(lambda: k(vec(), vec(), 1), "E_RUNTIME_SLICE", "can only be indexed by a compile-time value")


def test_assigning_to_a_parameter():
    @td.kernel(grid=1, block=32)
    def k(X: f32[32], alpha: f32):
        alpha = alpha * 2.0  # E_PARAM
        X[threadIdx.x] = alpha

    dsl_error(lambda: k(vec(), 1.0), "E_PARAM", "cannot assign to the parameter 'alpha'")


def test_storing_a_tensor_in_a_runtime_variable():
    @td.kernel(grid=1, block=32)
    def k(X: f32[32], Y: f32[32]):
        t = X  # E_TENSORVAR
        t = Y
        t[threadIdx.x] = 1.0

    dsl_error(lambda: k(vec(), vec()), "E_TENSORVAR", "runtime variable")


def test_math_function_with_wrong_arity():
    @td.kernel(grid=1, block=32)
    def k(X: f32[32]):
        X[threadIdx.x] = td.max(X[threadIdx.x])  # E_ARITY

    dsl_error(lambda: k(vec()), "E_ARITY", "max() takes 2 arguments, got 1")


# --------------------------------------------------------------------------- memory
def test_shared_shape_from_a_size_symbol():
    @td.kernel(grid=1, block=32)
    def k(X: f32["N"]):
        s = td.shared(f32, (N,))  # E_SHAREDSYM
        s[threadIdx.x] = 1.0

    err = dsl_error(lambda: k(vec()), "E_SHAREDSYM",
                    "the shape of td.shared() must be positive ints known at compile time, got (N,)")
    assert "Var(" not in err.message, err.message    # the user's name, not the IR node's repr


def test_shared_shape_with_a_zero():
    @td.kernel(grid=1, block=32)
    def k(X: f32[32]):
        s = td.shared(f32, (4, 0))  # E_SHAREDZERO
        X[threadIdx.x] = 1.0

    dsl_error(lambda: k(vec()), "E_SHAREDZERO", "the shape of td.shared()", "(4, 0)")


def test_registers_shape_with_a_float():
    @td.kernel(grid=1, block=32)
    def k(X: f32[32]):
        r = td.registers(f32, (2.5,))  # E_REGFLOAT
        X[threadIdx.x] = 1.0

    dsl_error(lambda: k(vec()), "E_REGFLOAT", "the shape of td.registers()")


def test_shared_with_a_non_dtype():
    @td.kernel(grid=1, block=32)
    def k(X: f32[32]):
        s = td.shared("float", (4,))  # E_SHAREDDTYPE
        X[threadIdx.x] = 1.0

    dsl_error(lambda: k(vec()), "E_SHAREDDTYPE", "expected a dtype")


def test_atomic_on_registers():
    @td.kernel(grid=1, block=32)
    def k(X: f32[32]):
        r = td.registers(f32, (2,))
        r[0] = 0.0
        td.atomic_add(r[0], 1.0)  # E_ATOMICREG
        X[threadIdx.x] = r[0]

    dsl_error(lambda: k(vec()), "E_ATOMICREG", "not registers")


# --------------------------------------------------------------------------- device functions
@td.func
def add2(a: f32, b: f32) -> f32:
    return a + b


@td.func
def bad_body(a: f32) -> f32:
    return a + missing_name  # E_FUNCBODY  # noqa: F821


def test_device_function_with_wrong_argument_count():
    @td.kernel(grid=1, block=32)
    def k(X: f32[32]):
        X[threadIdx.x] = add2(X[threadIdx.x])  # E_FUNCARGS

    dsl_error(lambda: k(vec()), "E_FUNCARGS", "'add2' takes 2 argument(s), got 1")


def test_error_inside_a_device_function_points_into_the_function():
    @td.kernel(grid=1, block=32)
    def k(X: f32[32]):
        X[threadIdx.x] = bad_body(X[threadIdx.x])  # E_FUNCBODY_CALL

    err = dsl_error(lambda: k(vec()), "E_FUNCBODY", "name 'missing_name' is not defined")
    assert err.loc.caller.line == line_of("E_FUNCBODY_CALL")


@td.func
def shared_first(v: f32) -> f32:
    buf = td.shared(f32, (64,))
    buf[threadIdx.x] = v
    td.syncthreads()  # E_FUNC_BARRIER
    return buf[0]


@td.func
def through(v: f32) -> f32:
    return shared_first(v)  # E_FUNC_INNER_CALL


def test_an_error_in_a_device_function_names_the_calls_it_was_inlined_from():
    """The barrier is in no branch of the helper: the branch is around the call. The message showed only the
    helper's line; it now shows each call, innermost first (a pass's error too, not only the translator's)."""
    @td.kernel(grid=1, block=64)
    def k(X: f32[64], Y: f32[64]):
        r = 0.0
        if X[threadIdx.x] > 0.0:
            r = through(X[threadIdx.x])  # E_FUNC_OUTER_CALL
        Y[threadIdx.x] = r

    err = dsl_error(lambda: k(vec(64), vec(64)), "E_FUNC_BARRIER", "'syncthreads()' inside a branch")
    inner, outer = err.loc.caller, err.loc.caller.caller
    assert (inner.line, outer.line, outer.caller) == (line_of("E_FUNC_INNER_CALL"), line_of("E_FUNC_OUTER_CALL"), None)
    text = str(err)
    assert text.index(f"in the @td.func called at {inner}") < text.index(f"in the @td.func called at {outer}")
    assert LINES[outer.line - 1].strip() in text


@td.func
def positive_part(a: f32) -> f32:  # E_FALLS_OFF
    if a > 0.0:
        return a


@td.func
def bare_return_first(a):
    if a > 0.0:
        return  # E_BARE_RETURN
    return a


@td.func
def no_value(a):
    a = a + 1.0


def test_a_device_function_must_return_its_value_on_every_path():
    """A thread falling off the end (or taking a bare return) would read the result uninitialized: in practice
    another thread's (the audit's [-1, 2, -3, 4] came out [0, 2, 2, 4])."""
    @td.kernel(grid=1, block=32)
    def k(X: f32[32]):
        X[threadIdx.x] = positive_part(X[threadIdx.x])

    dsl_error(lambda: k(vec()), "E_FALLS_OFF", "'positive_part' returns a value on some paths but can reach its end")

    @td.kernel(grid=1, block=32)
    def m(X: f32[32]):
        X[threadIdx.x] = bare_return_first(X[threadIdx.x])

    dsl_error(lambda: m(vec()), "E_BARE_RETURN", "every 'return' needs one")

    @td.kernel(grid=1, block=32)
    def n(X: f32[32]):
        X[threadIdx.x] = no_value(X[threadIdx.x])  # E_NO_VALUE

    dsl_error(lambda: n(vec()), "E_NO_VALUE", "'no_value' returns no value", token="no_value")


def test_returns_on_every_path_by_runtime_or_compile_time_branches_are_fine():
    mode = 2

    @td.func
    def magnitude(a):
        if a > 0.0:
            return a
        else:
            return -a

    @td.func
    def scaled(a):
        if mode == 1:
            return a
        elif mode == 2:
            return 2.0 * a

    @td.kernel(grid=1, block=4)
    def k(X: f32[4]):
        X[threadIdx.x] = scaled(magnitude(X[threadIdx.x]))

    x = np.array([-1, 2, -3, 4], np.float32)
    k(x)
    np.testing.assert_array_equal(x, [2, 4, 6, 8])


def test_nested_device_functions_may_be_defined_after_their_callers_and_recursion_is_an_error():
    """Inside a function (a schedule template's builder, say) a kernel may call a @td.func defined further down:
    the closure cell is empty at decoration (it was a raw 'Cell is empty' ValueError)."""
    def build():
        @td.kernel(grid=1, block=4)
        def k(X: f32[4]):
            X[threadIdx.x] = helper(X[threadIdx.x])

        @td.func
        def helper(a):
            return a + 1.0

        @td.func
        def fact(n: i32) -> i32:
            return 1 if n <= 1 else n * fact(n - 1)  # E_RECURSION

        @td.kernel(grid=1, block=4)
        def r(X: f32[4]):
            X[threadIdx.x] = fact(threadIdx.x)
        return k, r

    k, r = build()
    x = np.arange(4, dtype=np.float32)
    k(x)
    np.testing.assert_array_equal(x, [1, 2, 3, 4])
    err = dsl_error(lambda: r(x), "E_RECURSION", "nests too deeply (recursion is not supported)")
    # the recursive calls shown once, with their count (it listed 32 frames of the same line), then the kernel's
    assert str(err).count("in the @td.func called at") == 2 and "called there 31 more times" in str(err), str(err)
    assert str(err).rstrip().endswith("^") and "X[threadIdx.x] = fact(threadIdx.x)" in str(err)


def test_a_whole_tensor_is_no_condition_and_compares_by_its_elements():
    """`if x == y`, `if x`, `1.0 if x else 0.0`, `not x` with tensors: errors (they used to fold away silently)."""
    @td.kernel(grid=1, block=32)
    def k(X: f32[32], Y: f32[32]):
        if X == Y:  # E_TENSOR_EQ
            Y[threadIdx.x] = 1.0

    dsl_error(lambda: k(vec(), vec()), "E_TENSOR_EQ", "'X' is a whole tensor: compare its elements")

    @td.kernel(grid=1, block=32)
    def m(X: f32[32], Y: f32[32]):
        Y[threadIdx.x] = 1.0 if threadIdx.x < 4 and X else 0.0  # E_TENSOR_TRUTH

    dsl_error(lambda: m(vec(), vec()), "E_TENSOR_TRUTH", "'X' is a whole tensor, not a condition",
              token="threadIdx.x < 4 and X")

    @td.kernel(grid=1, block=32)
    def n(X: f32[32], Y: f32[32]):
        if not Y:  # E_TENSOR_NOT
            Y[threadIdx.x] = 1.0

    dsl_error(lambda: n(vec(), vec()), "E_TENSOR_NOT", "'Y' is a whole tensor, not a condition")


def test_numpy_math_and_kernel_calls_inside_kernels_point_to_what_works():
    import math

    @td.kernel(grid=1, block=32)
    def k(X: f32[32]):
        X[threadIdx.x] = math.exp(X[threadIdx.x])  # E_MATH_EXP

    err = dsl_error(lambda: k(vec()), "E_MATH_EXP", "calling 'exp'")
    assert "td.exp(...)" in str(err)

    @td.kernel(grid=1, block=32)
    def inner(X: f32[32]):
        X[threadIdx.x] = 1.0

    @td.kernel(grid=1, block=32)
    def outer(X: f32[32]):
        inner(X)  # E_KERNEL_CALL

    err = dsl_error(lambda: outer(vec()), "E_KERNEL_CALL", "a kernel cannot call the kernel 'inner'")
    assert "@td.func" in str(err)


def test_scalars_and_attributes_are_not_tensors_and_device_functions_take_plain_parameters():
    @td.kernel(grid=1, block=32)
    def k(X: f32[32], alpha: f32):
        X[threadIdx.x] = alpha[0]  # E_SCALAR_INDEX

    dsl_error(lambda: k(vec(), 2.0), "E_SCALAR_INDEX", "'alpha' is a number (f32), not a tensor")

    @td.kernel(grid=1, block=32)
    def m(X: f32[32]):
        X.shape = (4, 8)  # E_ATTR_ASSIGN

    dsl_error(lambda: m(vec()), "E_ATTR_ASSIGN", "cannot assign to 'X.shape'")
    for bad in ("def f(a, b=2.0):\n    return a * b", "def f(*a):\n    return a[0]"):
        namespace = {}
        exec(bad, namespace)
        with pytest.raises(TypeError, match="plain names, passed by position"):
            td.func(namespace["f"])
    with pytest.raises(TypeError, match="not a size-symbol name"):
        f32["N*2"]


def test_device_function_called_from_python():
    with pytest.raises(RuntimeError, match="add2"):
        add2(1.0, 2.0)


# --------------------------------------------------------------------------- barriers and shuffles
def test_syncthreads_under_a_thread_dependent_if():
    @td.kernel(grid=1, block=32)
    def k(X: f32[32]):
        if threadIdx.x < 5:
            td.syncthreads()  # E_SYNCIF
        X[threadIdx.x] = 1.0

    dsl_error(lambda: k(vec()), "E_SYNCIF", "'syncthreads()' inside a branch or loop that depends on threadIdx",
              token="td.syncthreads")
    assert "syncthreads()" in k.ir(vec())       # the frontend's IR is printed: lowering's checks raise (as documented)
    for stage in (lambda: k.ir(vec(), stage="lowered"), lambda: k.source(vec(), target="cuda")):
        dsl_error(stage, "E_SYNCIF", "'syncthreads()' inside a branch", token="td.syncthreads")


def test_syncthreads_under_a_condition_on_a_thread_dependent_variable():
    @td.kernel(grid=1, block=64)
    def k(X: f32[64]):
        v = X[threadIdx.x]
        if v > 0.0:
            td.syncthreads()  # E_SYNCDATA
        X[threadIdx.x] = 1.0

    dsl_error(lambda: k(vec(64)), "E_SYNCDATA", "syncthreads()")


def test_syncthreads_in_a_thread_dependent_loop():
    @td.kernel(grid=1, block=32)
    def k(X: f32[32]):
        for j in range(threadIdx.x):
            td.syncthreads()  # E_SYNCLOOP
        X[threadIdx.x] = 1.0

    dsl_error(lambda: k(vec()), "E_SYNCLOOP", "syncthreads()")


def test_syncthreads_in_a_loop_left_by_a_divergent_break():
    @td.kernel(grid=1, block=32)
    def k(X: f32[32]):
        for j in range(4):
            if X[threadIdx.x] > j:
                break
            td.syncthreads()  # E_SYNCBREAK
        X[threadIdx.x] = 1.0

    dsl_error(lambda: k(vec()), "E_SYNCBREAK", "syncthreads()")


def test_syncthreads_under_a_warp_uniform_condition_is_still_divergent_for_the_block():
    @td.kernel(grid=1, block=64)
    def k(X: f32[64]):
        if threadIdx.x < 32:
            td.syncthreads()  # E_SYNCWARP
        X[threadIdx.x] = 1.0

    dsl_error(lambda: k(vec(64)), "E_SYNCWARP", "syncthreads()")


def test_shuffle_under_a_lane_dependent_if():
    @td.kernel(grid=1, block=32)
    def k(X: f32[32]):
        v = X[threadIdx.x]
        if threadIdx.x % 2 == 0:
            v = td.shfl_xor(v, 1)  # E_SHFLIF
        X[threadIdx.x] = v

    dsl_error(lambda: k(vec()), "E_SHFLIF", "'shfl_xor()' inside a branch or loop that differs between the lanes")


def test_shuffle_in_a_lane_dependent_loop():
    @td.kernel(grid=1, block=32)
    def k(X: f32[32]):
        v = X[threadIdx.x]
        for j in range(threadIdx.x % 4):
            v += td.shfl_down(v, 1)  # E_SHFLLOOP
        X[threadIdx.x] = v

    dsl_error(lambda: k(vec()), "E_SHFLLOOP", "shfl_down()")


def test_shuffle_width_must_be_a_power_of_two():
    @td.kernel(grid=1, block=32)
    def k(X: f32[32]):
        X[threadIdx.x] = td.shfl_xor(X[threadIdx.x], 1, width=12)  # E_SHFLWIDTH

    dsl_error(lambda: k(vec()), "E_SHFLWIDTH", "width of a warp shuffle must be a power of two")


def test_shuffle_under_a_warp_uniform_condition_is_allowed():
    @td.kernel(grid=1, block=64)
    def k(X: f32[64]):
        v = X[threadIdx.x]
        if threadIdx.x // 32 == 0:
            v = td.shfl_xor(v, 1)
        X[threadIdx.x] = v

    x = np.arange(64, dtype=np.float32)
    k(x)
    want = np.arange(64)
    want[:32] ^= 1                   # lanes of warp 0 swap with their neighbour; warp 1 is untouched
    np.testing.assert_array_equal(x, want)


# --------------------------------------------------------------------------- call-time errors
@td.kernel(grid=lambda N: td.cdiv(N, 32), block=32)
def scale(X: f32["N", "K"], Y: f32["N", "K"], Z: f32[4], alpha: f32, count: i32):
    i = blockIdx.x * 32 + threadIdx.x
    if i < N:
        Y[i, 0] = X[i, 0] * alpha


def good_args():
    return [np.zeros((5, 3), np.float32), np.zeros((5, 3), np.float32), np.zeros(4, np.float32), 1.0, 2]


def test_wrong_dtype_mentions_astype():
    args = good_args()
    args[0] = args[0].astype(np.float64)
    with pytest.raises(TypeError, match=r"'X'.*float32.*astype") as info:
        scale(*args)
    assert "float64" in str(info.value)


def test_wrong_rank():
    args = good_args()
    args[1] = np.zeros(15, np.float32)
    with pytest.raises(ValueError, match=r"'Y' must be 2-d"):
        scale(*args)


def test_inconsistent_size_symbol_names_the_symbol():
    args = good_args()
    args[1] = np.zeros((5, 4), np.float32)
    with pytest.raises(ValueError, match=r"size 'K' is 3 .* but 4 in 'Y'"):
        scale(*args)


def test_fixed_dimension_mismatch():
    args = good_args()
    args[2] = np.zeros(5, np.float32)
    with pytest.raises(ValueError, match=r"'Z' must be 4"):
        scale(*args)


def test_wrong_argument_count():
    with pytest.raises(TypeError, match=r"takes 5 arguments"):
        scale(*good_args()[:4])


def test_non_array_tensor_argument():
    args = good_args()
    args[0] = [[0.0] * 3] * 5
    with pytest.raises(TypeError, match=r"'X' must be a numpy array"):
        scale(*args)


def test_float_for_an_integer_scalar():
    args = good_args()
    args[4] = 2.5
    with pytest.raises(TypeError, match=r"'count' must be an integer"):
        scale(*args)


def test_array_for_a_scalar():
    args = good_args()
    args[3] = np.zeros(1, np.float32)
    with pytest.raises(TypeError, match=r"'alpha' must be a scalar of type f32"):
        scale(*args)


def test_grid_callable_asking_for_an_unknown_name():
    @td.kernel(grid=lambda M: M, block=32)
    def k(X: f32["N"]):
        X[threadIdx.x] = 1.0

    with pytest.raises(ValueError, match=r"'M'.*not a size symbol or scalar parameter"):
        k(vec())


def test_block_too_large():
    @td.kernel(grid=1, block=(32, 32, 2))
    def k(X: f32["N"]):
        X[0] = 1.0

    with pytest.raises(ValueError, match="1024"):
        k(vec())


def test_bad_annotation_is_reported_at_decoration():
    with pytest.raises(TypeError, match="annotate parameter 'X'"):
        @td.kernel(grid=1, block=32)
        def k(X):
            X[0] = 1.0


def test_annotation_that_is_not_a_type():
    with pytest.raises(TypeError, match="annotate parameter 'X'.*got {1: 2}"):
        @td.kernel(grid=1, block=32)
        def k(X: {1: 2}):
            X[0] = 1.0


def test_size_symbol_shadowing_a_parameter():
    @td.kernel(grid=1, block=32)
    def k(X: f32["X"]):
        X[0] = 1.0

    with pytest.raises(td.DSLError, match="same name as a parameter"):
        k(vec())


# ---------------------------------------------------------------- from an audit of loops, mappings and positions
def test_break_and_continue_may_not_leave_mapping_or_unrolled_loops():
    """A break in a task-mapping loop left the wrong loop (or stopped the cpu's thread emulation), and one in a
    loop over a compile-time tuple left the runtime loop around it: both are errors now."""
    def mapping_break(x: td.f32[4], out: td.i32[4]):
        c = 0
        for i in td.spatial(4)(td.threadIdx.x):
            if x[i] > 0.0:
                break
            c += 1
        out[td.threadIdx.x] = c

    def unrolled_continue(out: td.i32[1]):
        c = 0
        for q in range(3):
            for v in (1, 2, 3):
                if q == 1:
                    continue
                c += v
        out[0] = c

    x, o = np.zeros(4, np.float32), np.zeros(4, np.int32)
    with pytest.raises(td.DSLError, match="'break' in a task-mapping loop"):
        td.kernel(block=4)(mapping_break)(x, o)
    with pytest.raises(td.DSLError, match="'continue' in a loop over a compile-time tuple"):
        td.kernel(block=1)(unrolled_continue)(o[:1])

    @td.kernel(block=1)
    def leaves_range(out: td.i32[1]):          # a runtime loop inside a mapping loop may still be left
        c = 0
        for i in td.repeat(2)(td.threadIdx.x):
            for k in range(5):
                if k == 3:
                    break
                c += 1
        out[0] = c

    leaves_range(o[:1])
    assert o[0] == 6


def test_workers_outside_the_mapping_run_no_tasks():
    """A negative worker index ran another worker's tasks (floor-mod wrapped it); workers run tasks only within
    0 .. workers - 1, as on the host."""
    @td.kernel(block=8)
    def shifted(hits: td.i32[4]):
        for i in td.spatial(4)(td.threadIdx.x - 2):
            td.atomic_add(hits[i], 1)

    hits = np.zeros(4, np.int32)
    shifted(hits)
    assert hits.tolist() == [1, 1, 1, 1]
    assert ">= 0" in shifted.source(hits, target="cuda")


def test_a_mapping_with_more_workers_than_its_worker_index_reaches():
    """spatial(64) on 32 threads: the tasks of workers 32-63 would never run (it ran half the work silently)."""
    @td.kernel(block=32)
    def k(X: f32[64]):
        for i in spatial(64)(threadIdx.x):  # E_TOO_MANY_WORKERS
            X[i] = 1.0

    dsl_error(lambda: k(vec(64)), "E_TOO_MANY_WORKERS", "the mapping has 64 workers, but its worker index reaches 31",
              "workers 32 to 63 would never run")


def test_a_mapping_sized_by_a_size_symbol():
    @td.kernel(block=32)
    def k(X: f32["N"]):
        for i in spatial(N)(threadIdx.x):  # E_SYMBOL_MAPPING  # noqa: F821
            X[i] = 1.0

    err = dsl_error(lambda: k(vec()), "E_SYMBOL_MAPPING", "'N', a value known only when the kernel runs")
    assert "@td.func" not in str(err)


def test_a_mapping_sized_by_arithmetic_on_a_size_symbol_shows_it_as_written():
    """The IR's repr (`Binary(op='//', a=Binary(...` five levels deep) was what the message showed."""
    @td.kernel(block=32)
    def k(X: f32["N"]):
        for i in (td.repeat(td.cdiv(N, 32)) * spatial(32))(threadIdx.x):  # E_SYMBOL_ARITHMETIC  # noqa: F821
            X[i] = 1.0

    err = dsl_error(lambda: k(vec()), "E_SYMBOL_ARITHMETIC", "'(N + 32 - 1) // 32', a value known only when the")
    assert "Binary(" not in str(err)


# ---------------------------------------------------------------- from an audit of kernels written as a new user
def test_messages_name_what_the_user_wrote_not_the_ir():
    """A size symbol named `len` called as the builtin showed `Var(name='len', ...)`; threadIdx as a number showed
    `_Dim3`; a plain helper's `if` on a runtime value gave advice for compute definitions (`ir.Select`)."""
    @td.kernel(block=1)
    def symbol_called(X: f32["len"], O: i32[1]):
        O[0] = len(X)   # E_RUNTIME_CALLEE

    err = dsl_error(lambda: symbol_called(vec(5), np.zeros(1, np.int32)), "E_RUNTIME_CALLEE",
                    "'len' is a runtime i32 value here, not a function", token="len(X)")
    assert "Var(" not in str(err) and "rename it" in str(err)

    @td.kernel(block=1)
    def dim3_as_number(X: f32[4]):
        X[1] = X[0] if X[1] > 0 else threadIdx  # E_DIM3_NUMBER

    dsl_error(lambda: dim3_as_number(vec(4)), "E_DIM3_NUMBER", "got threadIdx itself (use threadIdx.x, .y or .z)")

    def magnitude(v):
        return v if v > 0 else -v

    @td.kernel(block=1)
    def helper_branches(X: f32[1], O: f32[1]):
        O[0] = magnitude(X[0])  # E_HELPER_BRANCH

    err = dsl_error(lambda: helper_branches(vec(1), vec(1)), "E_HELPER_BRANCH",
                    "calling 'magnitude' at compile time failed: it tests a value known only when the kernel runs")
    assert "Select" not in str(err) and "@td.func" in str(err)


def test_equality_in_helpers_and_custom_mappings_is_a_comparison_or_an_error():
    """`==` on a runtime value in a plain Python helper, or in a custom mapping's function, was Python's identity
    test (always False): now a comparison, and an `if` on it a DSLError as for `<`."""
    def pick(v):
        return v == 0

    def branchy(v):
        return 100 if v == 0 else 7

    @td.kernel(block=4)
    def flags(out: td.i32[4]):
        out[td.threadIdx.x] = td.cast(pick(td.threadIdx.x), td.i32)

    o = np.zeros(4, np.int32)
    flags(o)
    assert o.tolist() == [1, 0, 0, 0]

    def branches(out: td.i32[4]):
        out[td.threadIdx.x] = branchy(td.threadIdx.x)

    with pytest.raises(td.DSLError, match="calling 'branchy' at compile time failed"):
        td.kernel(block=4)(branches)(o)
    swap = td.TaskMapping((8,), 4, lambda w: [(2 * w,), (2 * w + 1,)] if w % 2 == 0 else [(2 * w + 1,), (2 * w,)])

    def swapped(out: td.i32[4, 2]):
        c = 0
        for i in swap(td.threadIdx.x):
            out[td.threadIdx.x, c] = i
            c += 1

    with pytest.raises(td.DSLError, match="custom task mapping"):
        td.kernel(block=4)(swapped)(np.zeros((4, 2), np.int32))


def test_constant_indices_outside_the_tensor_are_errors():
    def last(x: td.f32[3], out: td.f32[1]):
        out[0] = x[-1]

    def past(x: td.f32[3], out: td.f32[1]):
        out[0] = x[3]

    x, o = np.ones(3, np.float32), np.zeros(1, np.float32)
    with pytest.raises(td.DSLError, match="index -1 of 'x' is negative"):
        td.kernel(grid=1, block=1)(last)(x, o)
    with pytest.raises(td.DSLError, match="index 3 is past the end of axis 0 of 'x'"):
        td.kernel(grid=1, block=1)(past)(x, o)


def test_a_nested_kernel_with_a_column_0_docstring_line_parses_and_columns_count_characters():
    def make():
        @td.kernel(grid=1, block=1)
        def documented(out: td.f32[1]):
            """A docstring whose next line starts at column 0:
this one."""
            out[0] = 1.0
        return documented

    o = np.zeros(1, np.float32)
    make()(o)
    assert o[0] == 1.0

    def accented(out: td.f32[1]):
        s = "ééé"; out[0] = bogus      # noqa: F821, E702
    with pytest.raises(td.DSLError) as err:
        td.kernel(grid=1, block=1)(accented)(o)
    line = err.value.loc.source_line()
    assert line[err.value.loc.col:].startswith("bogus")


# ---------------------------------------------------------------- where a DSLError is raised from
@td.kernel(grid=1, block=4)
def undefined_read(X: f32[4]):
    X[threadIdx.x] = not_defined_anywhere  # noqa: F821  # E_TRACEBACK


PACKAGE = Path(td.__file__).resolve().parent


def _frames(exc: BaseException) -> list:
    tb, frames = exc.__traceback__, []
    while tb is not None:
        frames.append(str(Path(tb.tb_frame.f_code.co_filename).resolve()))
        tb = tb.tb_next
    return frames


@pytest.mark.parametrize("entry", ["call", "source", "ir", "compile"])
def test_a_dsl_error_is_raised_from_the_kernel_method_not_the_compiler(entry, monkeypatch):
    """Its traceback ends at the kernel's method (one frame of taskdsl, not twenty of the translator): the message
    already names the line. TASKDSL_FULL_TRACEBACKS=1 keeps the compiler's frames."""
    from taskdsl.runtime import config
    x = vec(4)
    run = {"call": lambda: undefined_read(x), "source": lambda: undefined_read.source(x, target="cpu"),
           "ir": lambda: undefined_read.ir(x), "compile": lambda: undefined_read.compile(x, target="cpu")}[entry]
    try:
        for full in (False, True):
            monkeypatch.setenv("TASKDSL_FULL_TRACEBACKS", "1" if full else "0")
            config.environment.cache_clear()
            err = dsl_error(run, "E_TRACEBACK", "name 'not_defined_anywhere' is not defined")
            compiler = [Path(f).name for f in _frames(err) if Path(f).is_relative_to(PACKAGE)]
            if full:
                assert "translator.py" in compiler, compiler
            else:
                assert compiler == ["kernel.py"], compiler
    finally:
        monkeypatch.undo()
        config.environment.cache_clear()


def test_a_kernel_without_source_says_where_to_define_it():
    """An exec'd string (as `python -c` or an old plain REPL) keeps no source for the translator to read."""
    namespace = {"td": td, "f32": f32, "threadIdx": threadIdx}
    exec("@td.kernel(grid=1, block=4)\ndef k(X: f32[4]):\n    X[threadIdx.x] = 1.0\n", namespace)  # noqa: S102
    with pytest.raises(td.DSLError, match="cannot read the source of 'k'.*a notebook cell.*Python 3.13"):
        namespace["k"](vec(4))


def test_other_text_under_the_kernels_file_name_is_not_taken_for_its_source(monkeypatch):
    """linecache may hold other text under an exec'd string's name ("<string>"; Python 3.13 registers more):
    the translator read it as the kernel's source and failed an internal assertion ("not a def")."""
    import linecache
    namespace = {"td": td, "f32": f32, "threadIdx": threadIdx}
    exec("@td.kernel(grid=1, block=4)\ndef k(X: f32[4]):\n    X[threadIdx.x] = 1.0\n", namespace)  # noqa: S102
    lines = ["x = 1\n", "y = 2\n", "z = 3\n"]
    monkeypatch.setitem(linecache.cache, "<string>", (sum(map(len, lines)), None, lines, "<string>"))
    with pytest.raises(td.DSLError, match=r"cannot read the source of 'k' \(the text at <string>:1 is not the def"):
        namespace["k"](vec(4))


def test_the_decorators_take_plain_functions_only():
    """A staticmethod under @td.kernel, decorators stacked or doubled, a functools.partial: an internal
    AttributeError ('... has no attribute __code__'). Another decorator's wrapper is a function: its body is what a
    @td.func runs (a factory of device functions)."""
    import functools

    def fill(x: f32[4]):
        x[threadIdx.x] = 1.0

    def twice(f):
        @functools.wraps(f)
        def wrapper(v):
            return f(v) * 2.0
        return wrapper

    cases = [(td.kernel(block=4), staticmethod(fill), "got staticmethod .*: put @td.kernel innermost"),
             (td.func, td.kernel(block=4)(fill), "got a @td.kernel .*: a function is either a @td.kernel or a "
                                                 "@td.func, once"),
             (td.kernel(block=4), td.func(fill), "got a @td.func"),
             (td.kernel(block=4), functools.partial(fill), "got partial")]
    for decorate, target, message in cases:
        with pytest.raises(TypeError, match=message):
            decorate(target)

    @td.func
    @twice
    def plus_one(v):
        return v + 1.0

    @td.kernel(grid=1, block=4)
    def k(X: f32[4]):
        X[threadIdx.x] = plus_one(X[threadIdx.x])

    x = np.arange(4, dtype=np.float32)
    k(x)
    np.testing.assert_array_equal(x, [2, 4, 6, 8])


SCALE = 2.0


def test_a_local_read_before_it_has_a_value_says_why():
    """`SCALE = SCALE * x` (a global of that name) and a loop variable read after its loop were told "may be
    unassigned here: ... one branch of an `if`, or a loop that may run no iteration", with no if and a loop that
    runs."""
    @td.kernel(grid=1, block=4)
    def hides(X: f32[4]):
        SCALE = SCALE * X[0]  # E_HIDESGLOBAL
        X[threadIdx.x] = SCALE

    @td.kernel(grid=1, block=1)
    def after(X: f32[4]):
        for i in range(3):
            X[i] = 1.0
        X[3] = i  # E_LOOPVARAFTER

    dsl_error(lambda: hides(vec(4)), "E_HIDESGLOBAL", "'SCALE' is assigned in this function, which makes it a local "
              "variable throughout (as in Python)", "it is not the global 'SCALE'", token="SCALE *")
    err = dsl_error(lambda: after(vec(4)), "E_LOOPVARAFTER", "'i' is the variable of the loop at line "
                    f"{line_of('E_LOOPVARAFTER') - 2}, which has no value after its loop")
    assert "last = i" in str(err)


def test_messages_show_the_users_values_not_ir_objects():
    """Messages showed `Load(buffer=Buffer(name='x', ...))`, `calling 'Buffer(...)'`, "not Var", "got Buffer" and
    `Binary(op='//', ...)`."""
    @td.kernel(grid=1, block=4)
    def swapped(X: f32[4]):
        X[threadIdx.x] = td.cast(f32, X[0])  # E_SWAPPEDCAST

    @td.kernel(grid=1, block=4)
    def called(X: f32[4]):
        X[threadIdx.x] = X(1)  # E_CALLTENSOR

    @td.kernel(grid=1, block=4)
    def masked(X: f32[4], M: td.boolean[4]):
        X[M] = 1.0  # E_MASKINDEX

    @td.kernel(grid=lambda N: N // threadIdx.x, block=4)
    def gridded(X: f32["N"]):
        X[threadIdx.x] = 1.0

    dsl_error(lambda: swapped(vec(4)), "E_SWAPPEDCAST", "expected a dtype such as td.f32, got the runtime value "
                                                        "X[0] (f32)")
    dsl_error(lambda: called(vec(4)), "E_CALLTENSOR", "the whole tensor 'X' (index it, X[i], for an element) cannot "
                                                      "be called")
    dsl_error(lambda: masked(vec(4), np.zeros(4, bool)), "E_MASKINDEX", "tensor indices must be integers, got the "
                                                                        "whole tensor 'M'")
    with pytest.raises(ValueError, match=r"grid must be an int or a tuple of 1-3 ints, got \(4 // threadIdx.x\): it "
                                         r"is computed on the host"):
        gridded(vec(4))


def test_host_api_mistakes_are_named():
    """A misspelt keyword was reported as the parameter it left without a value; name=3 raised re.sub's TypeError;
    a keyword-only grid parameter failed at the call with '<lambda>() takes 0 positional arguments'; f32[4][4]
    raised "'TensorSpec' object is not subscriptable"."""
    @td.kernel(grid=1, block=4)
    def add(x: f32[4], y: f32[4], out: f32[4]):
        out[threadIdx.x] = x[threadIdx.x] + y[threadIdx.x]

    def body(x: f32[4]):
        x[threadIdx.x] = 1.0

    with pytest.raises(TypeError, match=r"kernel 'add' takes 3 arguments \(x, y, out\): got an unexpected keyword "
                                        r"argument 'out2'"):
        add(vec(4), vec(4), out2=vec(4))
    with pytest.raises(TypeError, match="@td.kernel's name must be a string, got 3"):
        td.kernel(block=4, name=3)(body)
    with pytest.raises(TypeError, match=r"the grid callable's parameter 'N' \(keyword-only\) cannot be passed"):
        td.kernel(grid=lambda *, N: N, block=4)(body)
    with pytest.raises(TypeError, match=r"f32\[4\]\[4\] is C's form: write f32\[4, 4\]"):
        f32[4][4]


def test_numpy_functions_on_runtime_values_point_at_taskdsls_own():
    """np.where, np.clip and np.mean of runtime values were told to "decorate it with @td.func" (numpy's code
    cannot be) or nothing at all."""
    @td.kernel(grid=1, block=32)
    def where(X: f32[32], Y: f32[32]):
        Y[threadIdx.x] = np.where(X[threadIdx.x] > 0, X[threadIdx.x], 0.0)  # E_NPWHERE

    @td.kernel(grid=1, block=32)
    def mean(X: f32[32], Y: f32[32]):
        Y[threadIdx.x] = np.mean((X[0], X[1]))  # E_NPMEAN

    for kernel, tag in ((where, "E_NPWHERE"), (mean, "E_NPMEAN")):
        err = dsl_error(lambda: kernel(vec(), vec()), tag, "at compile time failed")
        assert "numpy's functions run at compile time" in err.hint and "`a if c else b` for np.where" in err.hint


@td.func
def is_even(n):
    return 1 if n == 0 else is_odd(n - 1)  # E_MUTUAL


@td.func
def is_odd(n):
    return 0 if n == 0 else is_even(n - 1)


def test_a_recursion_through_two_functions_is_shown_once_with_its_count():
    """Two @td.funcs calling each other listed all 32 nested calls (a 102-line message); one repeated call was
    already folded."""
    @td.kernel(grid=1, block=4)
    def k(X: f32[4]):
        X[threadIdx.x] = is_even(threadIdx.x)

    err = dsl_error(lambda: k(vec(4)), "E_MUTUAL", "nests too deeply (recursion is not supported)")
    text = str(err)
    assert "... the 2 calls above repeat 15 more times" in text and len(text.splitlines()) < 20, text


def test_a_name_hiding_a_global_says_so_when_its_attribute_is_read():
    """A local `td = X[0]` made the later `td.sqrt` fail with "runtime values have no attribute 'sqrt'" only."""
    @td.kernel(grid=1, block=4)
    def k(X: f32[4]):
        td = X[0]
        X[threadIdx.x] = td.sqrt(2.0)  # E_HIDDENTD

    err = dsl_error(lambda: k(vec(4)), "E_HIDDENTD", "runtime values have no attribute 'sqrt'")
    assert "'td' is a runtime f32 value here" in err.hint and "hides the global 'td'" in err.hint
