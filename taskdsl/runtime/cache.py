"""The on-disk compile cache: cubins (cuda) and generated modules with numba's machine code (cpu).

Layout under `cache_dir()` ($TASKDSL_CACHE_DIR, default ~/.cache/taskdsl):

    cuda/<key>.cubin  cuda/<key>.json     a cubin and its record (sha256, size, arch, compiler)
    cpu/k_<key>.py    cpu/__pycache__/k_<key>.*   a generated module and numba's cache files
    cpu/<key>.json                                 the module generated for a kernel IR (`cpu_modules`)

Entries are written atomically (a temporary file, then a rename), are only ever read as
bytes or JSON (nothing is unpickled by taskdsl itself), and a cubin whose bytes do not match
its record is treated as missing, deleted and rebuilt. The files of one entry share the key
in their names; when the cache grows past its cap ($TASKDSL_CACHE_MAX_MB, default 2048)
the least recently used entries are removed. A hit refreshes the entry's time.
"""
from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from .config import cache_dir

_KEY = re.compile(r"^(?:k_)?([0-9a-f]{24,64})")


def cache_key(*parts: str) -> str:
    """A hex key for the given strings (source text, arch, compiler and taskdsl versions...)."""
    digest = hashlib.sha256()
    for part in parts:
        digest.update(part.encode())
        digest.update(b"\0")
    return digest.hexdigest()[:40]


def max_bytes() -> int:
    """The size cap of the cache directory in bytes ($TASKDSL_CACHE_MAX_MB)."""
    return int(float(os.environ.get("TASKDSL_CACHE_MAX_MB", "2048")) * 2**20)


def atomic_write(path: Path, data: bytes) -> None:
    """Write `data` to `path` so that readers see either the old file or the whole new one."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def cpu_module(key: str, text: str) -> Path:
    """The cache file holding a generated cpu module (written once); its name carries `key`."""
    path = cache_dir() / "cpu" / f"k_{key}.py"
    if not path.exists() or path.read_text() != text:
        atomic_write(path, text.encode())
        evict(max_bytes())
    return path


def load_cubin(key: str) -> bytes | None:
    """The cached cubin for `key`, or None when absent or damaged (a damaged entry is deleted)."""
    folder = cache_dir() / "cuda"
    binary, record = folder / f"{key}.cubin", folder / f"{key}.json"
    try:
        meta = json.loads(record.read_text())
        data = binary.read_bytes()
    except (OSError, ValueError):
        _remove(binary, record)
        return None
    if len(data) != meta.get("size") or hashlib.sha256(data).hexdigest() != meta.get("sha256"):
        _remove(binary, record)
        return None
    now = time.time()
    os.utime(binary, (now, now))
    return data


def store_cubin(key: str, data: bytes, **meta) -> None:
    """Cache a cubin under `key` with a JSON record, then keep the cache under its cap."""
    folder = cache_dir() / "cuda"
    record = {"sha256": hashlib.sha256(data).hexdigest(), "size": len(data), "created": time.time(), **meta}
    atomic_write(folder / f"{key}.cubin", data)
    atomic_write(folder / f"{key}.json", json.dumps(record, indent=1).encode())
    evict(max_bytes())


def _remove(*paths: Path) -> None:
    for p in paths:
        p.unlink(missing_ok=True)


@dataclass
class Entry:
    """The files of one cached compilation."""

    kind: str
    key: str
    files: list
    size: int
    last_used: float


def entries() -> list:
    """Every entry of the cache, grouped by key."""
    root = cache_dir()
    groups: dict = {}
    for kind in ("cuda", "cpu"):
        folder = root / kind
        if not folder.exists():
            continue
        for path in folder.rglob("*"):
            match = _KEY.match(path.name)
            if not path.is_file() or match is None or path.suffix == ".tmp":
                continue
            entry = groups.setdefault((kind, match.group(1)), Entry(kind, match.group(1), [], 0, 0.0))
            stat = path.stat()
            entry.files.append(path)
            entry.size += stat.st_size
            entry.last_used = max(entry.last_used, stat.st_mtime)
    return list(groups.values())


def evict(limit: int) -> int:
    """Remove least recently used entries until the cache holds at most `limit` bytes; return how many."""
    all_entries = sorted(entries(), key=lambda e: e.last_used)
    total = sum(e.size for e in all_entries)
    removed = 0
    for entry in all_entries:
        if total <= limit:
            break
        _remove(*entry.files)
        total -= entry.size
        removed += 1
    return removed


def info() -> dict:
    """Location, cap and per-kind entry counts and sizes of the cache."""
    summary = {"path": str(cache_dir()), "max_bytes": max_bytes(), "kinds": {}}
    for e in entries():
        kind = summary["kinds"].setdefault(e.kind, {"entries": 0, "bytes": 0})
        kind["entries"] += 1
        kind["bytes"] += e.size
    return summary


def clear() -> int:
    """Delete every cached artifact; return the number of entries removed."""
    count = len(entries())
    for kind in ("cuda", "cpu"):
        shutil.rmtree(cache_dir() / kind, ignore_errors=True)
    return count
