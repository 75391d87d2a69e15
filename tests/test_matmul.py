"""The matmul of DESIGN.md section 3 (stdlib_ops/design_matmul.py) against numpy's A @ B on the cpu
target, plus its CUDA C++ (with #line directives into that file) compiled by NVRTC."""
import inspect
import os
from pathlib import Path

import numpy as np
from hypothesis import example, given, settings
from hypothesis import strategies as st

from stdlib_ops import design_matmul
from stdlib_ops.design_matmul import matmul_kernel as matmul

GPU_TWINS = True   # every test also runs as a @gpu twin on the cuda target (conftest.py)
OPTIMIZED = True   # the optimized cpu path (unrolled register tiles in locals), not td.fast_compile

PRIMES = [2, 3, 5, 7, 11, 13, 17, 31, 61, 67, 127, 131, 149]
DIMS = st.integers(1, 150) | st.sampled_from([1, 8, 63, 64, 65, 128] + PRIMES)


def check(m, n, k, seed=0):
    rng = np.random.default_rng(seed)
    a = rng.uniform(-1, 1, (m, k)).astype(np.float32)
    b = rng.uniform(-1, 1, (k, n)).astype(np.float32)
    c = np.full((m, n), np.nan, np.float32)
    matmul(a, b, c)
    ref = a.astype(np.float64) @ b.astype(np.float64)
    np.testing.assert_allclose(c, ref, rtol=1e-4, atol=1e-5 * k + 1e-6)


@settings(max_examples=12, deadline=None)
@given(m=DIMS, n=DIMS, k=DIMS, seed=st.integers(0, 2**16))
@example(m=1, n=1, k=1, seed=0)
@example(m=64, n=64, k=64, seed=0)
@example(m=128, n=128, k=8, seed=0)
@example(m=150, n=150, k=150, seed=0)
@example(m=1, n=149, k=3, seed=0)
@example(m=131, n=1, k=67, seed=0)
@example(m=7, n=5, k=1, seed=0)
def test_matmul_matches_numpy(m, n, k, seed):
    check(m, n, k, seed)


def test_matmul_257x131x67():
    check(257, 131, 67, seed=1)


def test_matmul_prime_2039():
    check(2039, 2039, 2039, seed=2)


def test_matmul_overwrites_every_output_exactly_once():
    a = np.ones((70, 9), np.float32)
    b = np.ones((9, 65), np.float32)
    c = np.full((70, 65), 1e6, np.float32)   # garbage in C must not leak into the result
    matmul(a, b, c)
    np.testing.assert_array_equal(c, np.full((70, 65), 9.0))


def test_matmul_cuda_source_has_line_directives_and_barriers():
    a, b, c = np.zeros((65, 9), np.float32), np.zeros((9, 33), np.float32), np.zeros((65, 33), np.float32)
    src = matmul.source(a, b, c, target="cuda")
    this = str(Path(design_matmul.__file__).resolve())
    directives = [line for line in src.splitlines() if line.startswith("#line ")]
    assert directives, src
    assert all(os.path.samefile(d.split('"')[1], this) for d in directives)
    lines, first = inspect.getsourcelines(matmul.__wrapped__)
    body_lines = {first + i for i, text in enumerate(lines) if "td.syncthreads()" in text}
    assert len(body_lines) == 2
    named = {int(d.split()[1]) for d in directives}
    assert body_lines <= named                    # each barrier's Python line is named
    assert src.count("__syncthreads();") == 2
    assert "__shared__" in src


def test_matmul_compiles_to_a_cubin():
    a, b, c = np.zeros((100, 17), np.float32), np.zeros((17, 70), np.float32), np.zeros((100, 70), np.float32)
    compiled = matmul.compile(a, b, c, target="cuda", arch="sm_80")
    assert isinstance(compiled.binary, bytes) and len(compiled.binary) > 0
    assert compiled.binary[:4] == b"\x7fELF"      # a cubin is an ELF file
    assert "__syncthreads()" in compiled.source


def test_matmul_with_k_zero_gives_zeros():
    a, b = np.zeros((5, 0), np.float32), np.zeros((0, 7), np.float32)
    c = np.full((5, 7), 3.0, np.float32)
    matmul(a, b, c)
    np.testing.assert_array_equal(c, np.zeros((5, 7)))


def test_matmul_with_no_rows_is_a_no_op():
    a, b, c = np.zeros((0, 4), np.float32), np.ones((4, 9), np.float32), np.zeros((0, 9), np.float32)
    matmul(a, b, c)   # grid (1, 0): nothing runs
    assert c.shape == (0, 9)
