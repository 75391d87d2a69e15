"""Post-scheduling fusion: prologues and epilogues fused into scheduled anchors, and refusals."""
import math

import numpy as np
import pytest
from hypothesis import HealthCheck, assume, given, settings, strategies as st

import taskdsl as td
from stdlib_ops.design_matmul import matmul_kernel
from taskdsl import f32, threadIdx

GPU_TWINS = True   # every test also runs as a @gpu twin on the cuda target (conftest.py)


@td.kernel(grid=1, block=128)
def reverse_plus_one(A: f32[100], out: f32[100]):
    i = threadIdx.x
    if i < 100:
        out[i] = A[99 - i] + 1.0


C = td.placeholder("C", f32, (100,))
A_from_C = td.compute("A", (100,), lambda i: C[i] * 2.0)
OUT = td.placeholder("out", f32, (100,))
D_reshaped = td.compute("D", (2, 50), lambda a, b: OUT[a * 50 + b] * 3.0)


def _examples():
    return np.zeros(100, np.float32), np.zeros(100, np.float32)


def test_prologue_and_epilogue_of_the_issue_give_one_correct_kernel():
    fused = td.fuse(reverse_plus_one, *_examples(), prologues={"A": A_from_C}, epilogues={"out": D_reshaped})
    assert [name for name, _ in fused.params] == ["C", "D"]
    c = np.random.default_rng(0).standard_normal(100).astype(np.float32)
    d = np.zeros((2, 50), np.float32)
    fused(c, d)                                        # one kernel launch does all of it
    expected = ((c[::-1] * 2.0 + 1.0) * 3.0).reshape(2, 50)
    np.testing.assert_allclose(d, expected, rtol=1e-6)
    text = fused.ir(c, d)
    assert "C[99 - i] * 2.0" in text and "A[" not in text and "out[" not in text


def test_epilogue_through_split_transpose_and_merge_of_axes():
    """out viewed as (2, 5, 10) = (head, row, col), heads moved next to the columns, merged: (5, 20)."""
    merged = td.compute("E", (5, 20), lambda r, j: OUT[j // 10 * 50 + r * 10 + j % 10] - 1.0)
    fused = td.fuse(reverse_plus_one, *_examples(), epilogues={"out": merged})
    a = np.random.default_rng(3).standard_normal(100).astype(np.float32)
    e = np.zeros((5, 20), np.float32)
    fused(a, e)
    expected = a[::-1].reshape(2, 5, 10).transpose(1, 0, 2).reshape(5, 20)
    np.testing.assert_allclose(e, expected, rtol=1e-6, atol=1e-6)


def test_matmul_with_bias_gelu_and_transpose_epilogue():
    m, n, k = 70, 45, 33
    cm = td.placeholder("C", f32, (m, n))
    bias = td.placeholder("bias", f32, (n,))
    biased = td.compute("biased", (m, n), lambda i, j: cm[i, j] + bias[j])
    gelu = td.compute("gelu", (m, n), lambda i, j: 0.5 * biased[i, j] * (1.0 + td.erf(biased[i, j] * 0.7071067811865476)))
    out_t = td.compute("out_t", (n, m), lambda j, i: gelu[i, j])
    rng = np.random.default_rng(1)
    a, b = rng.standard_normal((m, k)).astype(np.float32), rng.standard_normal((k, n)).astype(np.float32)
    fused = td.fuse(matmul_kernel, a, b, np.zeros((m, n), np.float32), epilogues={"C": out_t})
    bb = rng.standard_normal(n).astype(np.float32)
    result = np.zeros((n, m), np.float32)
    fused(a, b, bb, result)
    from math import erf
    x = a.astype(np.float64) @ b + bb
    expected = (0.5 * x * (1.0 + np.vectorize(erf)(x / np.sqrt(2.0)))).T
    np.testing.assert_allclose(result, expected, rtol=1e-4, atol=1e-4)
    assert "__syncthreads" in fused.source(a, b, bb, result, target="cuda")


def test_reduce_anchor_with_elementwise_epilogue():
    x = td.placeholder("X", f32, ("R", "K"))
    s = td.reduce("S", ("R",), ("K",), lambda i, kk: x[i, kk], op="sum")
    op = td.op([x], [s])
    data = np.random.default_rng(2).standard_normal((37, 500)).astype(np.float32)
    op(data)
    anchor, = op.kernels
    stand_in = td.placeholder("S", f32, (37,))
    scale = td.placeholder("scale", f32, (37,))
    scaled = td.compute("scaled", (37,), lambda i: td.exp(stand_in[i]) * scale[i])
    fused = td.fuse(anchor, data, np.zeros(37, np.float32), epilogues={"S": scaled})
    w = np.linspace(0.5, 1.5, 37).astype(np.float32)
    out = np.zeros(37, np.float32)
    fused(data, w, out)
    np.testing.assert_allclose(out, np.exp(data.astype(np.float64).sum(1)) * w, rtol=1e-4)


def test_an_epilogue_in_place_reads_its_shortcut_from_the_output_and_takes_no_parameter_for_it():
    """A residual sum computed in place (`compute.in_place`): the kernel reads the shortcut from the output's own
    memory, each element before its store, as a memory plan that puts the output over the shortcut needs."""
    m, n, k = 37, 29, 19
    cm, short = td.placeholder("C", f32, (m, n)), td.placeholder("R", f32, (m, n))
    summed = td.compute("Y", (m, n), lambda i, j: td.max(cm[i, j] + short[i, j], 0.0))
    rng = np.random.default_rng(5)
    a, b = rng.standard_normal((m, k)).astype(np.float32), rng.standard_normal((k, n)).astype(np.float32)
    fused = td.fuse(matmul_kernel, a, b, np.zeros((m, n), np.float32),
                    epilogues={"C": td.in_place(summed, short)})
    assert [name for name, _ in fused.params] == ["A", "B", "Y"]
    r = rng.standard_normal((m, n)).astype(np.float32)
    y = r.copy()
    fused(a, b, y)
    np.testing.assert_allclose(y, np.maximum(a.astype(np.float64) @ b + r, 0.0), rtol=1e-5, atol=1e-5)


def test_in_place_requests_that_could_read_overwritten_elements_are_refused():
    cm, short = td.placeholder("C", f32, (8, 8)), td.placeholder("R", f32, (8, 8))
    examples = (np.zeros((8, 8), np.float32),) * 3
    transposed = td.compute("Y", (8, 8), lambda i, j: cm[i, j] + short[j, i])
    with pytest.raises(td.FusionError, match="another element than its own"):
        td.fuse(matmul_kernel, *examples, epilogues={"C": td.in_place(transposed, short)})
    summed = td.compute("Y", (8, 8), lambda i, j: cm[i, j] + short[i, j])
    doubled = td.compute("A2", (8, 8), lambda i, j: short[i, j] * 2.0)
    with pytest.raises(td.FusionError, match="a prologue reads too"):
        td.fuse(matmul_kernel, *examples, prologues={"A": doubled}, epilogues={"C": td.in_place(summed, short)})
    with pytest.raises(ValueError, match="of its own shape and type only"):
        td.in_place(summed, td.placeholder("R", f32, (8, 9)))
    with pytest.raises(TypeError, match="a compute over a placeholder"):
        td.in_place(summed, doubled)


@td.kernel(grid=1, block=128)
def strided_scale(A: f32[100], out: f32[100], step: td.i32, scale: f32):
    i = threadIdx.x
    if i < 100:
        out[i] = A[i * step % 100] * scale


@settings(max_examples=6, deadline=None)
@given(step=st.integers(-7, 7), scale=st.floats(-4, 4, width=32))
def test_constants_become_part_of_the_fused_kernel(step, scale):
    """fuse(constants=...) builds scalar arguments into the kernel: they leave its parameters and fold."""
    a = np.random.default_rng(step + 7).standard_normal(100).astype(np.float32)
    fused = td.fuse(strided_scale, *_examples(), step, scale, epilogues={"out": D_reshaped}, constants=("step",))
    assert [name for name, _ in fused.params] == ["A", "scale", "D"]
    d = np.zeros((2, 50), np.float32)
    fused(a, np.float32(scale), d)
    expected = (a[np.arange(100) * step % 100] * np.float32(scale) * 3.0).reshape(2, 50)
    np.testing.assert_allclose(d, expected, rtol=1e-6)
    assert "step" not in fused.ir(a, np.float32(scale), d)


def test_non_fusible_requests_are_refused_with_a_reason():
    args = _examples()
    with pytest.raises(td.FusionError, match="not bijective"):
        td.fuse(reverse_plus_one, *args, epilogues={"out": td.compute("E", (100,), lambda i: OUT[i // 2])})
    swapped = td.compute("E", (100,), lambda i: OUT[(i + 1) % 100])      # a rotation: bijective, no reshape
    with pytest.raises(td.FusionError, match="not a permutation of the digits"):
        td.fuse(reverse_plus_one, *args, epilogues={"out": swapped})
    with pytest.raises(td.FusionError, match="elements"):
        td.fuse(reverse_plus_one, *args, epilogues={"out": td.compute("E", (50,), lambda i: OUT[i])})
    total = td.reduce("total", (100,), (3,), lambda i, r: C[i] * r, op="sum")
    with pytest.raises(td.FusionError, match="injective compute"):
        td.fuse(reverse_plus_one, *args, prologues={"A": total})
    with pytest.raises(td.FusionError, match="no tensor parameter 'B'"):
        td.fuse(reverse_plus_one, *args, prologues={"B": A_from_C})
    with pytest.raises(td.FusionError, match="no scalar parameter 'A'"):
        td.fuse(reverse_plus_one, *args, constants=("A",))
    with pytest.raises(td.FusionError, match="writes 'out'"):
        td.fuse(reverse_plus_one, *args, prologues={"out": A_from_C})
    # a placeholder named like the anchor's other tensor, or an epilogue named like its input, made a kernel of two
    # parameters of one name (a keyword call could not say which)
    residual = td.compute("D", (100,), lambda i: OUT[i] + td.placeholder("A", f32, (100,))[i])
    named_a = td.compute("A", (100,), lambda i: OUT[i])
    for request in ({"epilogues": {"out": residual}}, {"epilogues": {"out": named_a}}):
        with pytest.raises(td.FusionError, match="two parameters named 'A': a definition's placeholder is named"):
            td.fuse(reverse_plus_one, *args, **request)
    with pytest.raises(TypeError, match="fuse: prologues must be a dict of parameter name -> compute definition, "
                                        "got list"):
        td.fuse(reverse_plus_one, *args, prologues=[("A", A_from_C)])
    bigger = td.compute("A", (101,), lambda i: C[i % 100])
    with pytest.raises(td.FusionError, match="shape"):
        td.fuse(reverse_plus_one, *args, prologues={"A": bigger})

    @td.kernel(grid=1, block=128)
    def accumulate(A: f32[100], out: f32[100]):
        i = threadIdx.x
        if i < 100:
            out[i] += A[i]

    with pytest.raises(td.FusionError, match="reads its output"):
        td.fuse(accumulate, *args, epilogues={"out": D_reshaped})
    with pytest.raises(td.FusionError, match="exactly one index"):
        td.fuse(reverse_plus_one, *args, epilogues={"out": td.compute("E", (100,), lambda i: C[i])})
    with pytest.raises(td.FusionError, match="never writes 'A'"):
        td.fuse(reverse_plus_one, *args, epilogues={"A": td.compute("E", (100,), lambda i: A_ph[i] * 2.0)})
    gather = td.placeholder("P", td.i32, (100,))
    with pytest.raises(td.FusionError, match="computed from tensor values"):
        td.fuse(reverse_plus_one, *args, epilogues={"out": td.compute("E", (100,), lambda i: OUT[gather[i]])})
    as_int = td.placeholder("out", td.i32, (100,))
    with pytest.raises(td.FusionError, match="is i32, but the anchor's output is f32"):
        td.fuse(reverse_plus_one, *args, epilogues={"out": td.compute("E", (100,), lambda i: as_int[i] * 2)})


A_ph = td.placeholder("A", f32, (100,))


def test_prologues_and_epilogues_reading_outside_a_tensor_are_refused_as_td_op_refuses_them():
    """td.op refused these definitions; fused, the kernel read past the end of C and bias, silently."""
    past_c = td.compute("A", (100,), lambda i: C[i + 1000])
    with pytest.raises(ValueError, match=r"compute 'A' reads C\[i0 \+ 1000\]: index 1000 on axis 0 is outside "
                                         r"\[0, 100\) for 100 of its 100 elements"):
        td.fuse(reverse_plus_one, *_examples(), prologues={"A": past_c})
    bias = td.placeholder("bias", f32, (2,))
    past_bias = td.compute("E", (2, 50), lambda a, b: OUT[a * 50 + b] + bias[a + 1])
    with pytest.raises(ValueError, match=r"reads bias\[i0 \+ 1\]: index 2 on axis 0 is outside \[0, 2\) for 50 "
                                         r"of its 100 elements"):
        td.fuse(reverse_plus_one, *_examples(), epilogues={"out": past_bias})
    guarded = td.compute("E", (2, 50), lambda a, b: OUT[a * 50 + b] + td.ir.Select(a < 1, bias[a + 1], 0.0, f32))
    fused = td.fuse(reverse_plus_one, *_examples(), epilogues={"out": guarded})    # a guarded read is fine
    a, e, b = np.arange(100, dtype=np.float32), np.zeros((2, 50), np.float32), np.array([5, 7], np.float32)
    fused(a, b, e)
    np.testing.assert_array_equal(e, (a[::-1] + 1).reshape(2, 50) + np.array([[7], [0]], np.float32))


def test_definitions_reading_what_the_fused_kernel_writes_are_refused():
    """An epilogue reading the anchor's other output (the same kernel writes it), and an output the anchor also
    reads back through an asynchronous copy, are refused: each had run, the first with wrong results."""
    @td.kernel(grid=1, block=16)
    def two_outputs(A: f32[16], lo: f32[16], hi: f32[16]):
        i = threadIdx.x
        lo[i] = A[i] - 1.0
        hi[i] = A[i] + 1.0

    z = np.zeros(16, np.float32)
    lo, hi = td.placeholder("lo", f32, (16,)), td.placeholder("hi", f32, (16,))
    with pytest.raises(td.FusionError, match="'D' reads 'hi', which the fused kernel writes"):
        td.fuse(two_outputs, z, z, z, epilogues={"lo": td.compute("D", (16,), lambda i: lo[i] * hi[i])})

    @td.kernel(grid=1, block=16)
    def copy_back(A: f32[16], out: f32[16], again: f32[16]):
        staged = td.shared(f32, (16,))
        i = threadIdx.x
        out[i] = A[i] * 2.0
        td.syncthreads()
        td.cp_async(staged[i], out[(i + 1) % 16], 1)
        td.cp_async_commit()
        td.cp_async_wait(0)
        again[i] = staged[i]

    out = td.placeholder("out", f32, (16,))
    with pytest.raises(td.FusionError, match="reads its output 'out'"):
        td.fuse(copy_back, z, z, z, epilogues={"out": td.compute("E", (16,), lambda i: out[i] + 1.0)})


def test_a_grid_over_a_scalar_follows_each_call_and_defaults_apply():
    """A grid callable of a scalar the fused kernel keeps is evaluated at each call (it was fixed at the example's
    value: a call with another value wrote a quarter of the output); scalar defaults apply as in a call."""
    @td.kernel(grid=lambda N, step: td.cdiv(N, 16 * step), block=16)
    def strided(X: f32["N"], Y: f32["N"], step: int, scale: f32 = 2.0):
        for s in range(step):
            g = (td.blockIdx.x * step + s) * 16 + threadIdx.x
            if g < N:
                Y[g] = X[g] * scale

    x = np.arange(64, dtype=np.float32)
    source = td.placeholder("C", f32, (64,))
    fused = td.fuse(strided, x, np.zeros(64, np.float32), 4,
                    prologues={"X": td.compute("X", (64,), lambda i: source[i] + 1.0)})
    for step in (4, 1, 3):
        y = np.zeros(64, np.float32)
        fused(y, step, 2.0, x)
        np.testing.assert_array_equal(y, (x + 1) * 2)

    @td.kernel(grid=1, block=lambda width: width)
    def by_width(X: f32[64], Y: f32[64], width: int):
        if threadIdx.x < 64:
            Y[threadIdx.x] = X[threadIdx.x]

    with pytest.raises(td.FusionError, match="constants=\\('width',\\)"):
        td.fuse(by_width, x, x.copy(), 64, prologues={"X": td.compute("X", (64,), lambda i: source[i])})
    assert td.fuse(by_width, x, x.copy(), 64, constants=("width",),
                   prologues={"X": td.compute("X", (64,), lambda i: source[i])}) is not None


def test_empty_outputs_fuse_and_the_op_returns_copies_of_inputs():
    @td.kernel(grid=lambda N: td.cdiv(N, 16), block=16)
    def copy_rows(A: f32["N", 2], out: f32["N", 2]):
        i = td.blockIdx.x * 16 + threadIdx.x
        if i < N:
            out[i, 0] = A[i, 0]
            out[i, 1] = A[i, 1]

    e = np.zeros((0, 2), np.float32)
    out = td.placeholder("out", f32, (0, 2))
    fused = td.fuse(copy_rows, e, e.copy(), epilogues={"out": td.compute("D", (0, 2), lambda i, j: out[i, j] * 2.0)})
    fused(e, e.copy())
    x_ph = td.placeholder("X", f32, (3,))
    x = np.ones(3, np.float32)
    same, = td.op([x_ph], [x_ph])(x)
    assert same is not x and np.array_equal(same, x)


@td.kernel(grid=lambda A: A, block=lambda B: B)
def double3(X: f32["A", "B", "C"], Y: f32["A", "B", "C"]):
    for k in range(C):
        Y[td.blockIdx.x, threadIdx.x, k] = X[td.blockIdx.x, threadIdx.x, k] * 2.0


@pytest.mark.parametrize("view", ["split_last", "merge_first", "split_and_transpose"])
def test_reshape_epilogues_index_each_dimension_without_unravelling(view):
    """A reshape epilogue indexes the output per dimension: splitting the last axis costs a `//` and a `%`
    of that axis alone, never a division of the anchor's linear index (which hides the row from LLVM)."""
    a, b, p, q = 3, 5, 4, 7
    y = td.placeholder("Y", f32, (a, b, p * q))
    if view == "split_last":
        epi = td.compute("E", (a, b, p, q), lambda i, j, s, t: y[i, j, s * q + t] + 1.0)
        expected = lambda x: (2 * x + 1).reshape(a, b, p, q)
    elif view == "merge_first":
        epi = td.compute("E", (a * b, p * q), lambda r, c: y[r // b, r % b, c] + 1.0)
        expected = lambda x: (2 * x + 1).reshape(a * b, p * q)
    else:
        epi = td.compute("E", (a, q, b, p), lambda i, t, j, s: y[i, j, s * q + t] + 1.0)
        expected = lambda x: (2 * x + 1).reshape(a, b, p, q).transpose(0, 3, 1, 2)
    x = np.random.default_rng(4).standard_normal((a, b, p * q)).astype(np.float32)
    fused = td.fuse(double3, x, np.zeros_like(x), epilogues={"Y": epi})
    e = np.zeros(epi.shape if isinstance(epi.shape[0], int) else tuple(int(d.value) for d in epi.shape), np.float32)
    fused(x, e)
    np.testing.assert_allclose(e, expected(x), rtol=1e-6)
    store = next(line for line in fused.ir(x, e).splitlines() if "E[" in line and "=" in line)
    assert str(b * p * q) not in store and str(a * b * p * q) not in store, store   # no linear index
    if view != "merge_first":
        assert f"k // {q}" in store and f"k % {q}" in store, store


def test_an_epilogue_merging_heads_reads_its_other_operands_without_index_arithmetic():
    """Attention's heads merged after a product (H, S, D) -> (S, H * D), plus an operand per (head, column): its
    loads are simplified knowing that the anchor stores in bounds, so head `(z * D + k) // D % H` is z, no division
    or remainder left an element (they kept a QDQ BERT's merge-heads product scalar: 484 us, now 198)."""
    h, s, d = 3, 5, 4
    y, side = td.placeholder("Y", f32, (h, s, d)), td.placeholder("side", f32, (h, d))
    epi = td.compute("E", (s, h * d), lambda r, c: y[c // d, r, c % d] + side[c // d, c % d])
    x = np.random.default_rng(6).standard_normal((h, s, d)).astype(np.float32)
    extra = np.random.default_rng(7).standard_normal((h, d)).astype(np.float32)
    fused = td.fuse(double3, x, np.zeros_like(x), epilogues={"Y": epi})
    e = np.zeros((s, h * d), np.float32)
    fused(x, extra, e)
    np.testing.assert_allclose(e, (2 * x + extra[:, None, :]).transpose(1, 0, 2).reshape(s, h * d), rtol=1e-6)
    store = next(line for line in fused.ir(x, extra, e).splitlines() if "E[" in line and "=" in line)
    assert "side[" in store and "//" not in store and "%" not in store, store


def _group(draw, factors: list, parts: int) -> tuple:
    """`factors` cut into `parts` consecutive groups (some may be empty: size 1), multiplied."""
    cuts = sorted(draw(st.lists(st.integers(0, len(factors)), min_size=parts - 1, max_size=parts - 1)))
    return tuple(math.prod(factors[a:b]) for a, b in zip([0] + cuts, cuts + [len(factors)]))


@st.composite
def _reshape_transpose(draw):
    """An anchor shape (A, B, C) and an epilogue view of its elements: the same factors in another order,
    grouped into other dimensions (so boundaries need not align), then transposed."""
    factors = draw(st.lists(st.sampled_from([2, 2, 3, 4, 5, 7]), min_size=1, max_size=4))
    anchor = _group(draw, factors, 3)
    assume(anchor[1] <= 1024)     # double3 runs a thread per element of the middle axis
    view = _group(draw, draw(st.permutations(factors)), draw(st.integers(1, 4)))
    return anchor, view, tuple(draw(st.permutations(range(len(view)))))


@settings(max_examples=20, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(case=_reshape_transpose())
def test_any_reshape_and_transpose_epilogue_is_inverted_exactly(case):
    """Per-dimension inversion agrees with numpy for reshapes into any factorization (size-1 axes, primes,
    digits that straddle the anchor's dimensions) followed by any transpose."""
    anchor, view, perm = case
    y = td.placeholder("Y", f32, anchor)

    def fcompute(*ix):
        at = [None] * len(view)
        for axis, i in zip(perm, ix):
            at[axis] = i
        linear = 0
        for i, n in zip(at, view):
            linear = linear * n + i
        b, c = anchor[1], anchor[2]
        return y[linear // (b * c), linear // c % b, linear % c] + 1.0

    epi = td.compute("E", tuple(view[p] for p in perm), fcompute)
    x = np.random.default_rng(5).standard_normal(anchor).astype(np.float32)
    fused = td.fuse(double3, x, np.zeros_like(x), epilogues={"Y": epi})
    e = np.zeros(tuple(view[p] for p in perm), np.float32)
    fused(x, e)
    np.testing.assert_allclose(e, (2 * x + 1).reshape(view).transpose(perm), rtol=1e-6)
