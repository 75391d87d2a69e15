"""Run every ```python block of README.md and docs/*.md, so the documentation cannot drift from the code.

A page's blocks run in order in one namespace (a page reads as one session), in a scratch
working directory; a block indented under a list item runs too, and a block that reads `sys.argv` is a script
shown with its command line, which is not run. Each block is written to a file first: kernels need their source, as
in a notebook. A block that raises fails the test with the page and block number.
"""
from __future__ import annotations

import re
import textwrap
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
BLOCK = re.compile(r"^( *)```python\n(.*?)^\1```", re.S | re.M)


def _blocks(page: Path) -> list[str]:
    blocks = [textwrap.dedent(code) for _, code in BLOCK.findall(page.read_text(encoding="utf-8"))]
    return [code for code in blocks if "sys.argv" not in code]


PAGES_WITH_CODE = [p for p in PAGES if _blocks(p)]


def test_the_pages_have_code_to_run():
    names = {p.relative_to(ROOT).as_posix() for p in PAGES_WITH_CODE}
    assert {"README.md", "docs/getting-started.md", "docs/tutorial.md", "docs/dsl-reference.md"} <= names


@pytest.mark.parametrize("page", PAGES_WITH_CODE, ids=lambda p: p.relative_to(ROOT).as_posix())
def test_page_runs(page, tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    namespace = {"__name__": f"doc_{page.stem.replace('-', '_')}"}
    for i, code in enumerate(_blocks(page)):
        path = tmp_path / f"{page.stem}_block{i}.py"
        path.write_text(code, encoding="utf-8")
        try:
            exec(compile(code, str(path), "exec"), namespace)
        except Exception as e:
            pytest.fail(f"{page.relative_to(ROOT)}, python block {i + 1}: {type(e).__name__}: {e}\n{code}")
    capsys.readouterr()
