"""The index of generated cpu modules by kernel IR, and the structural text of IR it is keyed by."""
import json
import os
import subprocess
import sys

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

import taskdsl as td
from taskdsl import ir
from taskdsl.runtime import cpu_modules


def _kernel(factor: float):
    @td.kernel(grid=lambda N: td.cdiv(N, 32), block=32)
    def scaled(X: td.f32["N"], Y: td.f32["N"]):  # noqa: F821 - N: the DSL's size symbol
        i = td.blockIdx.x * 32 + td.threadIdx.x
        if i < N:  # noqa: F821
            Y[i] = X[i] * factor

    return scaled


def _run(kernel, factor: float) -> None:
    x = np.arange(77, dtype=np.float32)
    y = np.zeros_like(x)
    kernel(x, y)
    np.testing.assert_array_equal(y, x * np.float32(factor))


@pytest.fixture
def generations(monkeypatch, tmp_path):
    """A fresh cache directory; counts the code generations (`emit_python` calls) made from now on."""
    from taskdsl.backend.cpu import codegen
    monkeypatch.setenv("TASKDSL_CACHE_DIR", str(tmp_path))
    calls = []
    real = codegen.emit_python

    def counting(*args, **kwargs):
        calls.append(args[0].name)
        return real(*args, **kwargs)

    monkeypatch.setattr(codegen, "emit_python", counting)
    return calls


def test_two_builds_of_one_kernel_have_one_text_and_other_kernels_another():
    block = (32, 1, 1)
    first, second, other = _kernel(2.0), _kernel(2.0), _kernel(3.0)
    text = ir.structural_text(first._lowered_ir(block))
    assert text == ir.structural_text(second._lowered_ir(block))        # new uids, same program
    assert text != ir.structural_text(other._lowered_ir(block))


def test_the_text_tells_apart_what_the_printer_does_not():
    i32, i64 = ir.types.i32, ir.types.i64
    assert ir.expr_str(ir.Const(3, i32)) == ir.expr_str(ir.Const(3, i64))
    assert ir.structural_text(ir.Const(3, i32)) != ir.structural_text(ir.Const(3, i64))
    a, b = ir.Var("k", i32), ir.Var("k", i32)       # two variables of one name
    twice, both = ir.Binary("+", a, a, i32), ir.Binary("+", a, b, i32)
    assert ir.expr_str(twice) == ir.expr_str(both)
    assert ir.structural_text(twice) != ir.structural_text(both)


@settings(max_examples=60, deadline=None)
@given(x=st.integers(-3, 3) | st.floats(-2, 2, width=32), y=st.integers(-3, 3) | st.floats(-2, 2, width=32),
       tx=st.sampled_from(["i32", "i64", "f32", "f64"]), ty=st.sampled_from(["i32", "i64", "f32", "f64"]),
       op=st.sampled_from(["+", "*", "<"]))
def test_equal_texts_mean_equal_expressions(x, y, tx, ty, op):
    def expr(value, dtype):
        t = getattr(ir.types, dtype)
        return ir.Binary(op, ir.Const(value, t), ir.Const(1, t), t)

    ex, ey = expr(x, tx), expr(y, ty)
    same = type(x) is type(y) and np.float64(x).tobytes() == np.float64(y).tobytes() and tx == ty   # -0.0 is not 0.0
    assert (ir.structural_text(ex) == ir.structural_text(ey)) == same


def test_values_it_cannot_spell_are_refused():
    with pytest.raises(ir.Unspellable):
        ir.structural_text(ir.Const(object(), ir.types.i32))


def test_a_kernel_built_again_skips_code_generation(generations, tmp_path):
    _run(_kernel(2.0), 2.0)
    assert len(generations) == 1
    index, = (tmp_path / "cpu").glob("*.json")
    record = json.loads(index.read_text())
    assert (tmp_path / "cpu" / f"k_{record['module']}.py").exists()
    cpu_modules._generated.clear()                   # as a new process: only the disk index is left
    _run(_kernel(2.0), 2.0)
    _run(_kernel(2.0), 2.0)
    _run(_kernel(4.0), 4.0)                          # another program: generated
    assert len(generations) == 2


def test_a_kernel_found_in_the_index_is_not_lowered(generations):
    _run(_kernel(2.0), 2.0)
    cpu_modules._generated.clear()
    again = _kernel(2.0)
    x = np.zeros(77, np.float32)
    again.compile(x, x, target="cpu")       # not a call: the tests' CUDA twin of a call lowers it for NVRTC
    assert len(generations) == 1 and again._lowered == {}      # keyed by its frontend IR


def test_a_kernel_with_a_custom_task_mapping_is_indexed_by_its_lowered_ir(generations):
    """Its frontend IR cannot be spelled (the mapping is a Python function); after `lower` it is plain loops."""
    def build():
        backwards = td.TaskMapping((32,), 32, lambda w: [(31 - w,)])

        @td.kernel(grid=1, block=32)
        def reversed_copy(X: td.f32[32], Y: td.f32[32]):
            for i, in backwards(td.threadIdx.x):
                Y[i] = X[i]

        return reversed_copy

    x = np.arange(32, dtype=np.float32)
    for _ in range(2):
        y = np.zeros_like(x)
        cpu_modules._generated.clear()
        build()(x, y)
        np.testing.assert_array_equal(y, x)
    assert len(generations) == 1


def test_the_memory_of_this_process_is_bounded_and_the_disk_index_remains(generations, monkeypatch):
    monkeypatch.setattr(cpu_modules, "GENERATED_KEPT", 2)
    for factor in (2.0, 3.0, 4.0, 5.0):
        _run(_kernel(factor), factor)
    assert len(cpu_modules._generated) <= 2 and len(generations) == 4
    _run(_kernel(2.0), 2.0)                          # forgotten here, found on disk
    assert len(generations) == 4


def test_fast_compile_and_optimized_code_are_indexed_apart(generations):
    td.fast_compile(True)
    _run(_kernel(2.0), 2.0)
    td.fast_compile(False)
    _run(_kernel(2.0), 2.0)
    assert len(generations) == 2


def test_debug_kernels_are_not_indexed(generations, tmp_path):
    td.debug(True)
    try:
        _run(_kernel(2.0), 2.0)
        _run(_kernel(2.0), 2.0)
    finally:
        td.debug(False)
    assert len(generations) == 2
    assert not list((tmp_path / "cpu").glob("*.json"))


@pytest.mark.parametrize("damage", ["garbage", "missing field", "module gone"])
def test_a_damaged_entry_is_regenerated(generations, tmp_path, damage):
    _run(_kernel(2.0), 2.0)
    index, = (tmp_path / "cpu").glob("*.json")
    record = json.loads(index.read_text())
    if damage == "garbage":
        index.write_text("{not json")
    elif damage == "missing field":
        index.write_text(json.dumps({k: v for k, v in record.items() if k != "entry"}))
    else:
        (tmp_path / "cpu" / f"k_{record['module']}.py").unlink()
    cpu_modules._generated.clear()
    _run(_kernel(2.0), 2.0)
    assert len(generations) == 2
    assert json.loads(index.read_text()) == record       # indexed again, to the same module


_NEW_PROCESS = """
import numpy as np, taskdsl as td, stdlib_ops
from taskdsl.backend.cpu import codegen
generated = []
real = codegen.emit_python
codegen.emit_python = lambda fn, *a, **k: generated.append(fn.name) or real(fn, *a, **k)
td.set_target("cpu")
a = np.arange(35 * 17, dtype=np.float32).reshape(35, 17) / 100
b = np.ones((17, 29), np.float32)
np.testing.assert_allclose(stdlib_ops.matmul(a, b), a @ b, rtol=1e-5)
np.testing.assert_allclose(stdlib_ops.softmax(a, axis=-1), np.exp(a) / np.exp(a).sum(-1, keepdims=True), rtol=1e-5)
print(len(generated))
"""


def test_a_new_process_finds_the_kernels_an_earlier_one_generated(tmp_path):
    """The key must not depend on anything a process makes up (uids, counters): stdlib kernels, twice."""
    env = dict(os.environ, TASKDSL_CACHE_DIR=str(tmp_path), TASKDSL_FAST_COMPILE="1")

    def generations() -> int:
        out = subprocess.run([sys.executable, "-c", _NEW_PROCESS], env=env, capture_output=True, text=True, check=True)
        return int(out.stdout.split()[-1])

    assert generations() >= 2
    assert generations() == 0
