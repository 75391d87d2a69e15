"""Find lines of a test file by marker comments (`# TAG`), so expected line numbers never go stale."""
import os
import re
from pathlib import Path

import pytest

import taskdsl as td


class Markers:
    """The marked lines of one source file."""

    def __init__(self, path: str):
        self.path = Path(path).resolve()
        self.lines = self.path.read_text().splitlines()

    def line_of(self, tag: str) -> int:
        """The 1-based number of the line that carries the marker comment `# tag`."""
        marker = re.compile(r"#\s*" + re.escape(tag) + r"(\s|$)")
        hits = [n for n, text in enumerate(self.lines, 1) if marker.search(text)]
        assert len(hits) == 1, f"marker {tag!r} found {len(hits)} times"
        return hits[0]

    def expect_error(self, call, tags, pattern: str | None = None) -> td.DSLError:
        """Run `call`; expect a DSLError at one of the marked lines, showing that line."""
        with pytest.raises(td.DSLError) as info:
            call()
        err = info.value
        lines = {self.line_of(t) for t in ([tags] if isinstance(tags, str) else tags)}
        assert err.loc is not None and os.path.samefile(err.loc.file, self.path), str(err)
        assert err.loc.line in lines, f"expected a line in {sorted(lines)}, got {err.loc.line}: {err}"
        if pattern is not None:
            assert re.search(pattern, err.message), f"{pattern!r} does not match {err.message!r}"
        assert self.lines[err.loc.line - 1].strip() in str(err)
        return err
