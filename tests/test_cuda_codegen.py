"""The CUDA path without a GPU: generated source, #line mapping, NVRTC errors, arches, atomics, f16."""

import inspect
import re

import numpy as np
import pytest

import taskdsl as td
from taskdsl import f16, f32, i32, threadIdx, blockIdx
from taskdsl.backend.cuda.nvrtc import compile_cubin, compile_ptx, normalize_arch


def _line_of(fn, marker: str) -> int:
    lines, first = inspect.getsourcelines(fn)
    return first + next(i for i, text in enumerate(lines) if marker in text)


@td.kernel(grid=lambda N: td.cdiv(N, 64), block=64)
def axpy(X: f32["N"], Y: f32["N"], a: f32):
    i = blockIdx.x * 64 + threadIdx.x
    if i < N:
        Y[i] = a * X[i] + Y[i]   # marker: axpy-store


def test_line_directives_point_at_python_lines():
    x = np.ones(100, np.float32)
    src = axpy.source(x, x, 2.0, target="cuda")
    expected = _line_of(axpy.fn, "marker: axpy-store")
    directives = re.findall(r'#line (\d+) "([^"]+)"', src)
    assert (str(expected), __file__) in directives
    store_at = src.index("Y[i] = ")
    last_directive = src.rfind("#line", 0, store_at)
    assert src[last_directive:store_at].startswith(f'#line {expected} "{__file__}"')


def test_sizes_are_specialized_and_params_const():
    x = np.ones(100, np.float32)
    src = axpy.source(x, x, 2.0, target="cuda")
    assert "(i < 100)" in src
    assert "const float* __restrict__ X" in src and "float* __restrict__ Y" in src


@pytest.mark.parametrize("arch", ["sm_80", "sm_90", 90, "80"])
def test_compiles_for_each_arch(arch):
    x = np.ones(10, np.float32)
    compiled = axpy.compile(x, x, 1.0, target="cuda", arch=arch)
    assert isinstance(compiled.binary, bytes) and compiled.binary[:4] == b"\x7fELF"
    assert compiled.arch == normalize_arch(arch)


def test_threads_compiling_first_in_a_process_all_succeed():
    """A tuner compiles its candidates on a thread pool; off a GPU nothing imported cuda.core before, and eight
    threads importing it at once had some fail with "cannot import name 'Program'" (a fresh interpreter: this
    one imported it long ago)."""
    import subprocess
    import sys
    script = ("from concurrent.futures import ThreadPoolExecutor\n"
              "from taskdsl.backend.cuda.nvrtc import compile_cubin\n"
              "source = 'extern \"C\" __global__ void k(float* x) { x[0] = 1.0f; }'\n"
              "with ThreadPoolExecutor(8) as pool:\n"
              "    cubins = list(pool.map(lambda i: compile_cubin(source, fast=True), range(8)))\n"
              "print(sum(c[:4] == b'\\x7fELF' for c in cubins))\n")
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300)
    assert result.returncode == 0 and result.stdout.split() == ["8"], result.stderr[-2000:]


def test_bad_arch_is_a_clear_error():
    with pytest.raises(ValueError, match="sm_90"):
        normalize_arch("hopper")
    x = np.ones(10, np.float32)
    with pytest.raises(ValueError, match=r"cannot compile for sm_70; it compiles for sm_75, sm_80"):
        axpy.compile(x, x, 1.0, target="cuda", arch="sm_70")     # NVRTC 13 dropped Volta


@pytest.mark.parametrize("compile_to", [compile_cubin, compile_ptx])
def test_nvrtc_error_maps_to_python_line(compile_to):
    source = '#line 42 "user_kernels.py"\nextern "C" __global__ void k(float* a) { a[0] = not_declared; }\n'
    with pytest.raises(td.DSLError) as info:
        compile_to(source, "sm_90")
    assert info.value.loc.file == "user_kernels.py" and info.value.loc.line == 42
    assert "not_declared" in str(info.value) and "NVRTC log" in str(info.value)
    assert "\x00" not in str(info.value)        # NVRTC's C string ends in one: grep then calls the text binary


@pytest.mark.parametrize("dtype", [td.i32, td.u32, td.i64, td.u64, td.f32, td.f64])
@pytest.mark.parametrize("op", ["add", "sub", "max", "min", "exch"])
def test_every_atomic_compiles(dtype, op):
    atomic = getattr(td, f"atomic_{op}")

    @td.kernel(block=4)
    def k(x: dtype[4]):
        old = atomic(x[0], x[threadIdx.x])
        x[1] = old

    src = k.source(np.zeros(4, dtype.numpy), target="cuda")
    assert src.count("atomic") >= 1
    assert k.compile(np.zeros(4, dtype.numpy), target="cuda").binary


def test_ptx_is_the_kernels_for_the_virtual_arch():
    """compile_ptx: PTX text for `arch`'s virtual architecture, the f16 headers found as compile_cubin finds them."""
    x = np.ones(8, np.float16)

    @td.kernel(block=8)
    def twice(X: f16[8]):
        X[threadIdx.x] = X[threadIdx.x] * f16(2.0)

    ptx = compile_ptx(twice.source(x, target="cuda"), "sm_80", fast=True)
    assert re.search(r"^\.target sm_80$", ptx, re.M) and f".entry {twice.name}(" in ptx
    assert not ptx.endswith("\x00")


def test_half_kernels_compile_with_runtime_headers():
    @td.kernel(grid=1, block=32)
    def half_scale(X: f16["N"], Y: f16["N"]):
        i = threadIdx.x
        if i < N:
            Y[i] = X[i] * 0.5

    x = np.ones(8, np.float16)
    src = half_scale.source(x, x, target="cuda")
    assert "#include <cuda_fp16.h>" in src and "__half" in src
    assert half_scale.compile(x, x, target="cuda").binary

    @td.kernel(grid=1, block=32)
    def rounded_through_half(X: f32["N"], Y: f32["N"]):       # 16-bit values only inside: a cast, a local
        i = threadIdx.x
        if i < N:
            h = td.cast(X[i], f16)
            Y[i] = h * 2.0

    y = np.ones(8, np.float32)
    assert "#include <cuda_fp16.h>" in rounded_through_half.source(y, y, target="cuda")
    assert rounded_through_half.compile(y, y, target="cuda").binary


def test_signed_minimums_are_literals_of_their_own_type():
    """-2**31 written as a literal is a long in C++ (its magnitude is no int), which made max(int, long) of an
    i32 max-reduction's identity ambiguous for NVRTC; likewise -2**63 for i64."""
    @td.kernel(grid=1, block=4)
    def floor_at_minimum(X: i32[4], Y: i32[4], Z: td.i64[4]):
        Y[threadIdx.x] = max(X[threadIdx.x], -2147483648)
        Z[threadIdx.x] = max(td.cast(X[threadIdx.x], td.i64), -9223372036854775808)

    x = np.array([-2**31, -5, 0, 2**31 - 1], np.int32)
    y, z = np.empty_like(x), np.empty(4, np.int64)
    src = floor_at_minimum.source(x, y, z, target="cuda")
    assert "(-2147483647 - 1)" in src and "(-9223372036854775807LL - 1)" in src
    compile_cubin(src, "sm_90", "floor_at_minimum", fast=True)
    floor_at_minimum(x, y, z)
    np.testing.assert_array_equal(y, x)
    np.testing.assert_array_equal(z, x.astype(np.int64))


def test_python_floor_division_on_possibly_negative_values():
    @td.kernel(grid=1, block=8)
    def floors(X: i32[8], Y: i32[8]):
        Y[threadIdx.x] = X[threadIdx.x] // 3 + X[threadIdx.x] % 3

    x = np.arange(-4, 4, dtype=np.int32)
    src = floors.source(x, x, target="cuda")
    assert "td_floordiv<int>" in src and "td_floormod<int>" in src   # operands may be negative
    out = np.empty_like(x)
    floors(x, out)
    np.testing.assert_array_equal(out, x // 3 + x % 3)
    index_src = axpy.source(np.ones(4, np.float32), np.ones(4, np.float32), 1.0, target="cuda")
    assert "td_floordiv" not in index_src   # index arithmetic on threadIdx/blockIdx stays plain


def test_floor_division_by_a_power_of_two_is_a_shift_and_a_mask():
    """// 4 and % 4 of a signed int of any sign: an arithmetic shift and a mask, which are Python's floor
    semantics in two's complement (no sign correction, no helper's branch)."""
    @td.kernel(grid=1, block=8)
    def quarters(X: i32[8], Y: i32[8]):
        Y[threadIdx.x] = X[threadIdx.x] // 4 * 10 + X[threadIdx.x] % 4

    x = np.arange(-9, 15, 3, dtype=np.int32)
    src = quarters.source(x, x, target="cuda")
    assert ">> 2)" in src and "& 3)" in src and "td_floor" not in src.split("extern")[1]
    compile_cubin(src, "sm_90", "quarters", fast=True)
    np.testing.assert_array_equal((x >> 2) * 10 + (x & 3), x // 4 * 10 + x % 4)   # the identity, on negatives too
    out = np.empty_like(x)
    quarters(x, out)
    np.testing.assert_array_equal(out, x // 4 * 10 + x % 4)


def test_cuda_launch_without_gpu_is_a_clear_error():
    usable, _ = td.gpu_status()
    if usable:
        pytest.skip("a GPU is present")
    with pytest.raises(RuntimeError, match="set_target\\('cpu'\\)"):
        td.set_target("cuda")


def test_shared_memory_past_48k_becomes_dynamic():
    @td.kernel(grid=1, block=256)
    def big_tile(X: f32[256], Y: f32[256]):
        tile = td.shared(f32, (128, 128))          # 64 KiB: too much for static __shared__
        flag = td.shared(i32, (1,))
        if threadIdx.x < 128:
            for r in range(128):
                tile[r, threadIdx.x] = X[threadIdx.x] + r
        if threadIdx.x == 0:
            flag[0] = 1
        td.syncthreads()
        c = threadIdx.x % 128
        Y[threadIdx.x] = tile[c, c] + flag[0]

    x = np.arange(256, dtype=np.float32)
    compiled = big_tile.compile(x, x, target="cuda")
    assert compiled.dynamic_shared_bytes == 128 * 128 * 4 + 16
    assert "extern __shared__" in compiled.source and "td_dynamic_smem + 65536" in compiled.source
    small = axpy.compile(x, x, 1.0, target="cuda")
    assert small.dynamic_shared_bytes == 0 and "extern __shared__" not in small.source
    y = np.empty_like(x)
    big_tile(x, y)                                   # and the cpu target runs it as written
    c = np.arange(256) % 128
    np.testing.assert_array_equal(y, x[c] + c + 1)


# Python names that are C++ keywords, CUDA built-ins or not ASCII still make valid CUDA identifiers.
@td.kernel(grid=1, block=32)
def double(X: f32[32], Y: f32[32]):
    auto = X[threadIdx.x]
    new = auto + auto
    Y[threadIdx.x] = new


@td.kernel(grid=1, block=32)
def signed(X: f32[32], Y: f32[32]):
    this = X[threadIdx.x]
    warpSize = this * 3.0
    Y[threadIdx.x] = warpSize


@td.kernel(grid=1, block=32)
def größe(X: f32[32], Y: f32[32]):
    maß = X[threadIdx.x]
    Y[threadIdx.x] = maß - 1.0


@td.kernel(grid=1, block=32)
def xor(compl: f32[32], Y: f32[32]):     # C++'s alternative tokens and newer keywords (NVRTC: "expected an identifier")
    constexpr = compl[threadIdx.x]
    NULL = constexpr * 2.0              # a macro of every NVRTC program
    xor_eq = NULL * 2.0
    Y[threadIdx.x] = xor_eq


@pytest.mark.parametrize("kernel, expected", [(double, lambda x: 2 * x), (signed, lambda x: 3 * x),
                                               (größe, lambda x: x - 1), (xor, lambda x: 4 * x)],
                         ids=["double", "signed", "grosse", "xor"])
def test_kernels_and_variables_named_like_cpp_keywords_compile(kernel, expected):
    x = np.random.rand(32).astype(np.float32)
    y = np.empty_like(x)
    kernel(x, y)      # the conftest also builds its CUDA source with NVRTC
    np.testing.assert_allclose(y, expected(x), rtol=1e-6)
    for arch in ("sm_80", "sm_90"):
        assert compile_cubin(kernel.source(x, y, target="cuda"), arch, fast=True)


@pytest.mark.parametrize("name", ["main", "printf", "fmodf", "copysign", "normcdf", "__bump", "_Bump"])
def test_kernels_named_like_c_library_functions_compile(name):
    """NVRTC declares C's math and library functions in every program: an `extern "C"` kernel of the same
    name would redeclare one (sm_90: "function main cannot be marked __device__ or __global__")."""
    def body(X: f32[32]):
        X[threadIdx.x] = X[threadIdx.x] + 1.0

    kernel = td.kernel(grid=1, block=32, name=name)(body)
    x = np.arange(32, dtype=np.float32)
    kernel(x)
    np.testing.assert_array_equal(x, np.arange(32) + 1)
    assert compile_cubin(kernel.source(x, target="cuda"), "sm_90", fast=True)


def test_mixed_signedness_comparisons_are_exact_in_cuda():
    """C would compare `-1 < 1u` as unsigned (false); the generated code widens, or tests the sign first."""
    @td.kernel(grid=1, block=1)
    def compare(A: i32[1], U: td.u32[1], L: td.i64[1], W: td.u64[1], Out: td.boolean[3]):
        Out[0] = A[0] < U[0]
        Out[1] = L[0] < W[0]
        Out[2] = U[0] < -1

    args = (np.zeros(1, np.int32), np.zeros(1, np.uint32), np.zeros(1, np.int64), np.zeros(1, np.uint64),
            np.zeros(3, np.bool_))
    src = compare.source(*args, target="cuda")
    assert "(((long long)(A[0])) < ((long long)(U[0])))" in src
    assert "((L[0] < 0LL) ? true : (((unsigned long long)(L[0])) < W[0]))" in src
    assert "(((long long)(U[0])) < -1LL)" in src
    assert compile_cubin(src, "sm_90", fast=True)


def test_a_kernel_file_whose_path_holds_a_quote_compiles(tmp_path, monkeypatch):
    """The path went into `#line N "..."` as it was: a `"` in it ended the string (NVRTC: "expected a file name")."""
    folder = tmp_path / 'say "hi"'
    folder.mkdir()
    (folder / "quoted.py").write_text("import taskdsl as td\nfrom taskdsl import f32, threadIdx\n\n\n"
                                      "@td.kernel(grid=1, block=32)\ndef bump(X: f32[32]):\n"
                                      "    X[threadIdx.x] = X[threadIdx.x] + 1.0\n")
    monkeypatch.syspath_prepend(str(folder))
    import quoted
    x = np.zeros(32, np.float32)
    source = quoted.bump.source(x, target="cuda")
    assert '#line 7 "' in source and "say 'hi'" in source
    assert compile_cubin(source, "sm_90", fast=True)
