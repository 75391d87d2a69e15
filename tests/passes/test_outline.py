"""Outlined device functions (`@td.func(outline=True)`, `passes/outline.py`): the cpu target compiles the body
once, as a module of its own, and every kernel calling it calls it through its address. Results match numpy
where the body is outlined and where it stays inlined (a body that cannot be a function of its arguments, a block
of several threads, debug mode, CUDA)."""
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

import taskdsl as td
from taskdsl import blockIdx, f32, ir, threadIdx
from taskdsl.runtime import cpu_modules

SIZES = st.sampled_from([1, 2, 3, 7, 13, 31])
CALL = "rt.call_entry(outlined_0"


@td.func(outline=True)
def axpy_row(x, y, out, row, n, alpha):
    """out[row, :n] = alpha * x[row, :n] + y[row, :n], through a register row (its own)."""
    t = td.registers(f32, (4,))
    for j0 in range(0, n, 4):
        for j in range(4):
            t[j] = alpha * x[row, td.min(j0 + j, n - 1)]
        for j in range(td.min(4, n - j0)):
            out[row, j0 + j] = t[j] + y[row, j0 + j]


@td.kernel(grid=lambda M: M)
def axpy(x: f32["M", "N"], y: f32["M", "N"], out: f32["M", "N"], alpha: f32):
    axpy_row(x, y, out, blockIdx.x, N, alpha)


@td.kernel(grid=lambda M: M)
def axpy_relu(x: f32["M", "N"], y: f32["M", "N"], out: f32["M", "N"], alpha: f32):
    axpy_row(x, y, out, blockIdx.x, N, alpha)
    for j in range(N):
        out[blockIdx.x, j] = td.max(out[blockIdx.x, j], 0.0)


def _operands(m: int, n: int, seed: int):
    rng = np.random.default_rng(seed)
    x, y = (rng.standard_normal((m, n)).astype(np.float32) for _ in range(2))
    return x, y, np.full((m, n), np.nan, np.float32), np.float32(rng.uniform(-2, 2))


@pytest.fixture
def own_cache(monkeypatch, tmp_path):
    """A cache of this test's own, and no modules this process generated before."""
    monkeypatch.setenv("TASKDSL_CACHE_DIR", str(tmp_path))
    return tmp_path


@settings(max_examples=8, deadline=None)
@given(m=SIZES, n=SIZES, seed=st.integers(0, 2**16))
def test_an_outlined_body_runs_as_a_call_and_matches_numpy(m, n, seed):
    x, y, out, alpha = _operands(m, n, seed)
    axpy(x, y, out, alpha)
    np.testing.assert_allclose(out, alpha * x + y, rtol=1e-6, atol=1e-6)
    source = axpy.source(x, y, out, alpha, target="cpu")
    assert CALL in source and "# ---- outlined function 0" in source


@pytest.mark.parametrize("fast", [True, False], ids=["fast_compile", "optimized"])
def test_kernels_of_other_code_and_shapes_share_one_outlined_module(own_cache, fast):
    """Two kernels (one with an epilogue of its own) at two shapes each: the body is one module, compiled once."""
    td.fast_compile(fast)
    for kernel, relu in ((axpy, False), (axpy_relu, True)):
        for m, n in ((3, 5), (6, 17)):
            x, y, out, alpha = _operands(m, n, m * n)
            kernel(x, y, out, alpha)
            want = alpha * x + y
            np.testing.assert_allclose(out, np.maximum(want, 0) if relu else want, rtol=1e-6, atol=1e-6)
    listings = [k.source(*_operands(3, 5, 0), target="cpu") for k in (axpy, axpy_relu)]
    outlined = {text.split("# ---- outlined function 0 (its own module): `outlined_0` above\n")[1]
                for text in listings}
    assert len(outlined) == 1
    signatures = [p for p in (own_cache / "cpu").glob("k_*.py") if "\nSIGNATURE = " in p.read_text()]
    assert len(signatures) == 1


def test_a_kernel_of_bound_sizes_passes_them_to_its_outlined_body(own_cache):
    """A graph fixes a fused kernel's shapes in its IR (`passes.bind_sizes`): the sizes and extents the body reads
    still come in as arguments, so kernels of two bound shapes generate one outlined module."""
    from taskdsl.backend.cpu.codegen import emit_python
    from taskdsl.passes import bind_sizes, lower, lower_for_cpu
    fn = lower(axpy._frontend_ir((1, 1, 1)))
    lowered = [lower_for_cpu(bind_sizes(fn, {"M": m, "N": n}), debug=False) for m, n in ((3, 5), (64, 300))]
    assert len({emit_python(f).outlined[0].text for f in lowered}) == 1
    text = ir.function_str(lowered[0])
    assert "call outlined_0(x, out, y, n, alpha, blockIdx.x, 3, 5, " in text
    assert "# outlined_0:\nkernel axpy_row(" in text


def test_sizes_fixed_before_every_pass_do_not_fold_into_an_outlined_body():
    """Where a graph fixes the sizes before the first pass, `simplify` could prove the body's clamp
    `td.min(j0 + j, n - 1)` idle for N = 4 (j0 is 0 there) and drop it: the body would differ from other shapes' and
    make a module of its own. What the kernel's ranges say about one call stays out of the body."""
    from taskdsl.backend.cpu.codegen import emit_python
    from taskdsl.passes import bind_sizes, lower, lower_for_cpu
    fn = axpy._frontend_ir((1, 1, 1))
    lowered = [lower_for_cpu(lower(bind_sizes(fn, {"M": m, "N": n})), debug=False) for m, n in ((3, 4), (64, 300))]
    texts = {emit_python(f).outlined[0].text for f in lowered}
    assert len(texts) == 1 and "min(" in texts.pop()
    x, y, out, alpha = _operands(3, 4, 0)
    axpy(x, y, out, alpha)
    np.testing.assert_allclose(out, alpha * x + y, rtol=1e-6)


@td.func(outline=True)
def scale_row(x, out, row, n, alpha):
    for j in range(n):
        out[row, j] = alpha * x[row, j]


@td.kernel(grid=lambda M: M, block=4)
def scale_by_threads(x: f32["M", "N"], out: f32["M", "N"]):
    if threadIdx.x == 0:
        scale_row(x, out, blockIdx.x, N, 3.0)


@td.kernel(grid=lambda M: M)
def scale_shared_registers(x: f32["M", "N"], out: f32["M", "N"]):
    t = td.registers(f32, (1,))
    t[0] = 2.0
    scale_row(x, out, blockIdx.x, N, 3.0)
    out[blockIdx.x, 0] = out[blockIdx.x, 0] * t[0]


@td.func(outline=True)
def fill_row(out, row, n, t):
    for j in range(n):
        out[row, j] = t[0] * j


@td.kernel(grid=lambda M: M)
def fill_from_the_kernels_registers(out: f32["M", "N"]):
    t = td.registers(f32, (1,))
    t[0] = blockIdx.x + 1.0
    fill_row(out, blockIdx.x, N, t)


def test_bodies_that_cannot_be_functions_of_their_arguments_stay_inlined():
    """A block of several threads (their variables live in per-thread arrays), and a register buffer the kernel
    passes to the body (the function's registers are its own): inlined, and right. Registers the body does not
    read stay the kernel's."""
    x = np.arange(15, dtype=np.float32).reshape(3, 5)
    for kernel, want, outlined in ((scale_by_threads, 3 * x, False),
                                   (scale_shared_registers, 3 * x * np.array([2, 1, 1, 1, 1]), True)):
        out = np.zeros_like(x)
        kernel(x, out)
        np.testing.assert_allclose(out, want)
        assert (CALL in kernel.source(x, out, target="cpu")) == outlined
    out = np.zeros_like(x)
    fill_from_the_kernels_registers(out)
    np.testing.assert_allclose(out, (np.arange(3)[:, None] + 1.0) * np.arange(5))
    assert CALL not in fill_from_the_kernels_registers.source(out, target="cpu")


def test_debug_mode_inlines_and_checks_the_body():
    """Debug mode checks every access against its tensor: an outlined body's too, with the line in the function."""
    x, y, out, alpha = _operands(3, 5, 0)
    td.debug(True)
    try:
        axpy(x, y, out, alpha)
        assert CALL not in axpy.source(x, y, out, alpha, target="cpu")
        with pytest.raises(td.DSLError, match=r"(?s)out-of-bounds read of 'x'.*in the @td.func called at"):
            read_past_the_row(x, np.zeros_like(x))
    finally:
        td.debug(False)
    np.testing.assert_allclose(out, alpha * x + y, rtol=1e-6, atol=1e-6)


@td.func(outline=True)
def copy_row_and_one_more(x, out, row, n):
    for j in range(n + 1):
        out[row, td.min(j, n - 1)] = x[row, j]


@td.kernel(grid=lambda M: M)
def read_past_the_row(x: f32["M", "N"], out: f32["M", "N"]):
    copy_row_and_one_more(x, out, blockIdx.x, N)


def test_an_indexed_kernel_finds_its_outlined_modules_again(own_cache):
    """A kernel generated before loads its module and its outlined function's from the index; with the outlined
    module gone, the kernel is generated anew."""
    from taskdsl.passes import lower
    fn = axpy._frontend_ir((1, 1, 1))
    generated, _ = cpu_modules.cpu_module(fn, lambda: lower(fn), debug=False, fast=True)
    cpu_modules._generated.clear()
    src, _ = cpu_modules.cpu_module(fn, lambda: None, debug=False, fast=True)     # from the index: nothing lowered
    assert src.outlined[0].text == generated.outlined[0].text
    assert len(src.outlined) == 1 and "\nSIGNATURE = " in src.outlined[0].text
    path = Path(cpu_modules.outlined_jobs(src)[0].path)
    path.unlink()
    cpu_modules._generated.clear()
    assert cpu_modules._load(cpu_modules._ir_key(fn, lambda: None, True, False)) is None
    again, _ = cpu_modules.cpu_module(fn, lambda: lower(fn), debug=False, fast=True)
    assert again.outlined[0].text == src.outlined[0].text and path.exists()


@td.func(outline=True)
def repeat_into(out, row, times):
    """A number argument (3 here) is a runtime value in an outlined function: the loop stays a loop."""
    for j in range(times):
        out[row, j] = j * 1.0


@td.kernel(grid=lambda M: M)
def three_ramps(out: f32["M", "N"]):
    repeat_into(out, blockIdx.x, 3)


def test_number_arguments_are_runtime_values():
    out = np.zeros((2, 4), np.float32)
    three_ramps(out)
    np.testing.assert_array_equal(out, [[0, 1, 2, 0]] * 2)
    source = three_ramps.source(out, target="cpu")
    assert CALL in source and "def kernel_repeat_into(out, times, " in source
