"""Kernels that tests write as text: each is saved to a file and imported (a kernel needs its source)."""
from __future__ import annotations

import importlib.util
import itertools
import tempfile
from pathlib import Path

_counter = itertools.count()
_SCRATCH = tempfile.TemporaryDirectory(prefix="taskdsl_test_programs_")   # removed at exit


def load_program(text: str, stem: str):
    """The module whose source is `text`, from a fresh file named after `stem`."""
    path = Path(_SCRATCH.name) / f"{stem}_{next(_counter)}.py"
    path.write_text(text)
    spec = importlib.util.spec_from_file_location(path.stem, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module
