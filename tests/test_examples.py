"""Run every script in examples/ (each asserts its results against numpy)."""
from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

EXAMPLES = Path(__file__).resolve().parent.parent / "examples"
NAMES = ["matmul", "reduction", "softmax", "custom_op_model"]


def _load(name: str):
    spec = importlib.util.spec_from_file_location(f"taskdsl_example_{name}", EXAMPLES / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_every_example_is_listed():
    assert sorted(p.stem for p in EXAMPLES.glob("*.py")) == sorted(NAMES)


@pytest.mark.parametrize("name", NAMES)
def test_example_runs(name, capsys):
    module = _load(name)
    module.main()   # raises (np.testing.assert_allclose) on a wrong result
    assert capsys.readouterr().out.strip(), f"examples/{name}.py printed nothing"
