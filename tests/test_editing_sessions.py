"""Editing kernels during a session: an edited file is never run as other code than Python ran, and IPython's
`%autoreload` updates kernels imported by name as it updates functions.

The oracle is numpy on the code as written before and after the edit.
"""
import importlib
import os
import sys
import time
import types

import numpy as np
import pytest

import taskdsl as td

MODULE = '''
import taskdsl as td
from taskdsl import f32, threadIdx

SHIFT = 1.0


@td.func
def combine(a: f32, b: f32) -> f32:
    return a {op} b


@td.kernel(block=8)
def direct(x: f32[8], y: f32[8], out: f32[8]):
    out[threadIdx.x] = x[threadIdx.x] {op} y[threadIdx.x] + SHIFT


@td.kernel(block=8)
def through_func(x: f32[8], y: f32[8], out: f32[8]):
    out[threadIdx.x] = combine(x[threadIdx.x], y[threadIdx.x])


def make_nested():
    @td.kernel(block=8)
    def nested(x: f32[8], y: f32[8], out: f32[8]):
        out[threadIdx.x] = x[threadIdx.x] {op} y[threadIdx.x] + SHIFT
    return nested
'''

X, Y = np.arange(8, dtype=np.float32), np.full(8, 3.0, np.float32)


@pytest.fixture
def edited_module(tmp_path, monkeypatch):
    """`write(op)` writes the module with `op` in its sums (a newer modification time each time); `load()`
    imports it."""
    path = tmp_path / "edited_kernels.py"
    monkeypatch.syspath_prepend(str(tmp_path))

    def write(op: str) -> None:
        path.write_text(MODULE.format(op=op))
        stamp = time.time() + len(write.ops)         # a new modification time, as an editor's save gives
        write.ops.append(op)
        os.utime(path, (stamp, stamp))
    write.ops = []
    yield write, lambda: importlib.import_module("edited_kernels")
    sys.modules.pop("edited_kernels", None)


def _run(kernel) -> np.ndarray:
    out = np.zeros(8, np.float32)
    kernel(X, Y, out)
    return out


def test_an_edited_operator_in_a_module_not_reloaded_is_refused_when_the_kernel_is_built_again(edited_module):
    """The check that the file's text is the code Python ran compared constants and names only: with `+` edited to
    `-` (not reloaded), a rebuild (a global rebound) compiled the edited text, x - y + 7, silently; a kernel made
    inside a function was not checked at all."""
    write, load = edited_module
    write("+")
    module = load()
    nested = module.make_nested()
    np.testing.assert_array_equal(_run(module.direct), X + Y + 1)
    write("-")
    module.SHIFT = 7.0                       # read at compile time: the kernels are built again
    for kernel in (module.direct, nested):
        with pytest.raises(td.DSLError, match="is not the code Python ran: the file changed since it was run"):
            _run(kernel)
    module = importlib.reload(module)        # what the error says to do
    np.testing.assert_array_equal(_run(module.direct), X - Y + 1)
    np.testing.assert_array_equal(_run(module.make_nested()), X - Y + 1)


def test_kernels_and_device_functions_follow_a_reload_by_autoreload_rules(edited_module, monkeypatch):
    """IPython's autoreload applies its UPDATE_RULES to each old object of a reloaded module and its new twin;
    a kernel imported by name (`from m import k`) kept running the code from before the edit."""
    rules: list = []
    monkeypatch.setitem(sys.modules, "IPython.extensions.autoreload", types.SimpleNamespace(UPDATE_RULES=rules))
    write, load = edited_module
    write("+")
    module = load()
    direct, through_func, combine = module.direct, module.through_func, module.combine
    np.testing.assert_array_equal(_run(direct), X + Y + 1)
    np.testing.assert_array_equal(_run(through_func), X + Y)
    write("-")
    old = dict(vars(module))
    module = importlib.reload(module)
    for name, obj in old.items():            # what autoreload's update_generic does for each name
        rule = next((update for check, update in rules if check(obj, getattr(module, name, None))), None)
        if rule is not None:
            rule(obj, getattr(module, name))
    assert len(rules) == 2                   # one per kind: Kernel and DeviceFunction
    np.testing.assert_array_equal(_run(direct), X - Y + 1)
    np.testing.assert_array_equal(_run(through_func), X - Y)
    assert combine.fn is module.combine.fn


def test_ipython_autoreload_updates_a_kernel_imported_by_name(edited_module):
    """The same with IPython's own autoreload, where IPython is installed."""
    pytest.importorskip("IPython.extensions.autoreload")
    from IPython.core.interactiveshell import InteractiveShell
    write, _ = edited_module
    write("+")
    shell = InteractiveShell.instance()
    try:
        shell.run_cell("%load_ext autoreload\n%autoreload 2", store_history=False)
        shell.run_cell("from edited_kernels import direct", store_history=False).raise_error()
        np.testing.assert_array_equal(_run(shell.user_ns["direct"]), X + Y + 1)
        write("-")
        shell.run_cell("pass", store_history=False).raise_error()      # autoreload runs before each cell
        np.testing.assert_array_equal(_run(shell.user_ns["direct"]), X - Y + 1)
    finally:
        shell.run_cell("%autoreload 0", store_history=False)
        InteractiveShell.clear_instance()


ANNOTATED = '''
import taskdsl as td
from taskdsl import f32, i32, threadIdx

SHIFT = 0.5


@td.kernel(block=4)
def truncates(x: f32[4], out: f32[4]):
    v: {kind} = x[threadIdx.x] + SHIFT
    out[threadIdx.x] = v


@td.kernel(block=4)
def untouched(x: f32[4], out: f32[4]):
    out[threadIdx.x] = x[threadIdx.x] * 2.0
'''


def test_an_edited_local_annotation_in_a_module_not_reloaded_is_refused(tmp_path, monkeypatch):
    """A local's annotation makes no bytecode, so the check that the text is the code Python ran saw `v: i32` edited
    to `v: f32` as the same code: the rebuild compiled the edit, silently (1.75 where the running code gives
    1). The
    text as it was when the kernel was decorated tells it; a kernel of the same file that was not edited runs on."""
    path = tmp_path / "annotated_kernels.py"
    monkeypatch.syspath_prepend(str(tmp_path))
    path.write_text(ANNOTATED.format(kind="i32"))
    try:
        module = importlib.import_module("annotated_kernels")
        x, out = np.arange(4, dtype=np.float32) + 0.25, np.zeros(4, np.float32)
        module.truncates(x, out)
        np.testing.assert_array_equal(out, np.arange(4))       # i + 0.75 truncated
        path.write_text(ANNOTATED.format(kind="f32"))
        stamp = time.time() + 5
        os.utime(path, (stamp, stamp))
        module.SHIFT = 0.25                      # read at compile time: the kernels are built again
        with pytest.raises(td.DSLError, match="is not the code Python ran: the file changed since it was run"):
            module.truncates(x, out)
        module.untouched(x, out)
        np.testing.assert_array_equal(out, 2 * x)
        module = importlib.reload(module)
        module.truncates(x, out)
        np.testing.assert_array_equal(out, x + 0.5)
    finally:
        sys.modules.pop("annotated_kernels", None)
