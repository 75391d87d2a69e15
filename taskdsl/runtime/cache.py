"""The on-disk compile cache: cubins (cuda) and generated modules with numba's machine code (cpu).

Layout under `cache_dir()` ($TASKDSL_CACHE_DIR, default ~/.cache/taskdsl):

    cuda/<key>.cubin  cuda/<key>.json     a cubin and its record (key, sha256, size, arch, compiler)
    cpu/k_<key>.py    cpu/__pycache__/k_<key>.*   a generated module and numba's cache files
    cpu/<key>.json                                 the module generated for a kernel IR (`cpu_modules`)
    tune/<key>.json                                a tuned schedule (`schedule.tuner`)
    numba/<package folder>/*.nbi, *.nbc            numba's code for the package's own launchers and helpers

Entries are written atomically (a temporary file, then a rename). taskdsl reads its files only as
bytes or JSON and checks them: a cubin whose bytes or key do not match its record, and a module
whose text does not hash to its name, are treated as missing, deleted and rebuilt. numba's own
files (`cpu/__pycache__`) are pickles numba loads itself; a damaged one is dropped and the kernel
recompiled (`backend.cpu.compile`). The cache folder is trusted as code is: it holds the modules
that are imported.

Storing is best effort: a cache folder that cannot be written (read-only, removed by `clear`
in another process meanwhile) costs the reuse, not the compile; a warning says so once.
The files of one entry share the key in their names; when the cache grows past its cap
($TASKDSL_CACHE_MAX_MB, default 2048) the least recently used entries are removed (never the
one just stored). A hit refreshes the entry's time. A module another process removes between its
lookup and its import is written again (`cpu_modules.entry_function`).
"""
from __future__ import annotations

import functools
import hashlib
import importlib.util
import json
import os
import re
import shutil
import tempfile
import time
import warnings
from dataclasses import dataclass
from pathlib import Path

from .config import cache_dir, cache_max_bytes, process_folder

_KEY = re.compile(r"^(?:k_)?([0-9a-f]{24,64})")
_KEYS = {"numba": re.compile(r"^(.+\.nb[ci])$")}       # numba's own files: each its own entry, keyed by its name
KINDS = ("cuda", "cpu", "tune", "numba")
# the file that makes an entry (others go with it); numba/ holds numba's own files for the package's launchers and
# helpers (`backend/cpu/numba_cache.py`), each file an entry: numba takes a data file gone as a miss
PRIMARY = {"cuda": ".cubin", "cpu": ".py", "tune": ".json", "numba": ".nbc"}


def cache_key(*parts: str) -> str:
    """A hex key for the given strings (source text, arch, compiler and taskdsl versions...)."""
    digest = hashlib.sha256()
    for part in parts:
        digest.update(part.encode())
        digest.update(b"\0")
    return digest.hexdigest()[:40]


@functools.cache
def code_fingerprint(package: str = "taskdsl") -> str:
    """A hash of taskdsl's own code (or another package's), which decides generated text and how it is compiled
    (NVRTC's options, say): part of the keys of what was built from it (read once a process: ~5 ms)."""
    digest = hashlib.sha256()
    root = Path(importlib.util.find_spec(package).origin).resolve().parent
    for folder, subfolders, files in os.walk(root):    # 40% faster than rglob
        subfolders.sort()
        for name in sorted(f for f in files if f.endswith(".py")):
            digest.update(Path(folder, name).read_bytes())
    return digest.hexdigest()


def atomic_write(path: Path, data: bytes) -> None:
    """Write `data` to `path` so that readers see either the old file or the whole new one."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        os.chmod(tmp, 0o666 & ~_UMASK)       # mkstemp makes 0600: a cache shared by a group stays readable
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


_UMASK = _umask()       # read once, at import: os.umask can only be read by setting it


def store(path: Path, data: bytes) -> bool:
    """`atomic_write`, best effort: False (and a warning, once) where the cache cannot be written."""
    try:
        atomic_write(path, data)
        return True
    except OSError as e:
        _warn_unwritable(e)
        return False


_warned: set = set()


def _warn_unwritable(error: OSError) -> None:
    folder = str(cache_dir())
    if folder not in _warned:
        _warned.add(folder)
        warnings.warn(f"taskdsl: cannot write the compile cache at {folder} ({error}); compiling without storing "
                      "the results. Point TASKDSL_CACHE_DIR at a writable folder to keep them.", stacklevel=3)


def touch(path: Path) -> None:
    """Mark a cache file used now (for the least-recently-used eviction); best effort."""
    try:
        now = time.time()
        os.utime(path, (now, now))
    except OSError:
        pass


def cpu_module(key: str, text: str) -> Path:
    """The file holding a generated cpu module (written once; its name carries `key`): in the cache, or where the
    cache cannot be written, in a temporary folder of this process."""
    path = cache_dir() / "cpu" / f"k_{key}.py"
    try:
        if path.read_text() == text:
            touch(path)
            return path
    except (OSError, ValueError):
        if path.is_dir():       # a folder in its place would make every later store fail (a warning each run)
            remove(path)
    data = text.encode()
    if store(path, data):
        keep_under_cap(len(data) + NUMBA_BYTES_PER_MODULE, keep=key)
        return path
    return scratch_module(key, text)


def scratch_module(key: str, text: str) -> Path:
    """A generated module written to this process's own folder (removed at exit), which no eviction or `clear`
    of another process touches."""
    path = _scratch_folder() / f"k_{key}.py"
    atomic_write(path, text.encode())
    return path


_scratch: list = []


def _scratch_folder() -> Path:
    """A folder of this process for generated modules when the cache cannot take them (removed at exit)."""
    if not _scratch:
        _scratch.append(process_folder("taskdsl-nocache-"))
    return _scratch[0]


def load_cubin(key: str) -> bytes | None:
    """The cached cubin for `key`, or None when absent or damaged (a damaged entry is deleted)."""
    folder = cache_dir() / "cuda"
    binary, record = folder / f"{key}.cubin", folder / f"{key}.json"
    try:
        meta = json.loads(record.read_text())
        data = binary.read_bytes()
    except (OSError, ValueError):
        remove(binary, record)
        return None
    if not isinstance(meta, dict) or meta.get("key") != key or len(data) != meta.get("size") \
            or hashlib.sha256(data).hexdigest() != meta.get("sha256"):
        remove(binary, record)
        return None
    touch(binary)
    return data


def store_cubin(key: str, data: bytes, **meta) -> None:
    """Cache a cubin under `key` with a JSON record, then keep the cache under its cap (best effort)."""
    folder = cache_dir() / "cuda"
    record = {"key": key, "sha256": hashlib.sha256(data).hexdigest(), "size": len(data), "created": time.time(),
              **meta}
    text = json.dumps(record, indent=1).encode()
    if store(folder / f"{key}.cubin", data) and store(folder / f"{key}.json", text):
        keep_under_cap(len(data) + len(text), keep=key)


def remove(*paths: Path | str) -> None:
    """Delete cache files, whatever is in their place (a folder too); best effort."""
    for p in map(Path, paths):
        try:
            if p.is_dir() and not p.is_symlink():
                shutil.rmtree(p, ignore_errors=True)
            else:
                p.unlink(missing_ok=True)
        except OSError:
            pass


@dataclass
class Entry:
    """The files of one cached compilation."""

    kind: str
    key: str
    files: list           # their paths (str)
    size: int
    last_used: float
    primary: bool = False       # whether it has its kind's main file (a cubin, a module, a tuning record)


def entries() -> list:
    """Every entry of the cache, grouped by key (files vanishing meanwhile, another process's doing, are skipped;
    so are temporary files being written)."""
    return _scan()[0]


STALE_SECONDS = 3600.0      # a temporary file this old lost its writer (a killed process): `evict` removes it


def _files_below(folder: Path):
    """The directory entries below `folder`, at any depth, each carrying its type (os.scandir); folders vanishing
    meanwhile are skipped."""
    pending = [folder]
    while pending:
        try:
            with os.scandir(pending.pop()) as found:
                for item in found:
                    if item.is_dir(follow_symlinks=False):
                        pending.append(item.path)
                    yield item
        except OSError:
            continue


def _scan() -> tuple:
    """(the cache's entries, its temporary files older than STALE_SECONDS)."""
    root = cache_dir()
    groups: dict = {}
    stale = []
    now = time.time()
    for kind in KINDS:
        folder = root / kind
        if not folder.is_dir():
            continue
        pattern, primary, top = _KEYS.get(kind, _KEY), PRIMARY[kind], str(folder)
        for item in _files_below(folder):   # strings, not Paths: with rglob, Paths took a third of the scan's time
            match = pattern.match(item.name)
            temporary = ".tmp" in item.name          # a file being written, ours or numba's
            if match is None and not temporary:
                continue
            try:
                if not item.is_file():
                    continue
                stat = item.stat()
            except OSError:
                continue
            if temporary:
                if now - stat.st_mtime > STALE_SECONDS:
                    stale.append(item.path)
                continue
            entry = groups.setdefault((kind, match.group(1)), Entry(kind, match.group(1), [], 0, 0.0))
            entry.files.append(item.path)
            entry.size += stat.st_size
            entry.last_used = max(entry.last_used, stat.st_mtime)
            in_place = kind == "numba" or os.path.dirname(item.path) == top    # numba/: a folder per package folder
            entry.primary = entry.primary or (in_place and item.name.endswith(primary))
    return list(groups.values()), stale


def evict(limit: int, keep: str | None = None) -> int:
    """Remove least recently used entries (but `keep`'s) until the cache holds at most `limit` bytes, and stale
    temporary files; return how many entries."""
    return _evict(limit, keep)[0]


def _evict(limit: int, keep: str | None) -> tuple:
    """(entries removed, bytes the cache holds after): `evict`."""
    found, stale = _scan()
    remove(*stale)
    total = sum(e.size for e in found)
    removed = 0
    for entry in sorted(found, key=lambda e: e.last_used):
        if total <= limit:
            break
        if entry.key == keep:
            continue
        remove(*entry.files)
        total -= entry.size
        removed += entry.primary
    return removed, total


# Scanning the cache (a stat of each of its files) after every store cost 0.2 s a compile with 8000 files: a
# process scans at its first store and then adds what it stores to that total, scanning again when the total
# would pass the cap or is older than RESCAN_SECONDS (other processes store too, and numba writes its files
# beside ours: the estimate runs low by what they wrote since).
RESCAN_SECONDS = 60.0
# what numba writes for a generated module once it compiles it (its index and machine code in cpu/__pycache__, ~26 KB
# for a small kernel): counted when the module is stored, or the estimate passed the cap only at a thirtieth of it
NUMBA_BYTES_PER_MODULE = 32 * 1024
_estimates: dict = {}       # cache folder -> (bytes it held at the last scan plus what this process stored since,
                            # time.monotonic() of that scan)


def keep_under_cap(stored: int, keep: str) -> None:
    """After storing `stored` bytes under key `keep`: evict down to the cap ($TASKDSL_CACHE_MAX_MB) if the cache
    may be over it."""
    limit, folder = cache_max_bytes(), cache_dir()
    total, scanned = _estimates.get(folder, (None, 0.0))
    now = time.monotonic()
    if total is not None and total + stored <= limit and now - scanned < RESCAN_SECONDS:
        _estimates[folder] = total + stored, scanned
        return
    _estimates[folder] = _evict(limit, keep)[1], now


def info() -> dict:
    """Location, cap and per-kind entry counts (cubins, modules, tuning records) and sizes of the cache."""
    summary = {"path": str(cache_dir()), "max_bytes": cache_max_bytes(), "kinds": {}}
    for e in entries():
        kind = summary["kinds"].setdefault(e.kind, {"entries": 0, "bytes": 0})
        kind["entries"] += e.primary
        kind["bytes"] += e.size
    return summary


def clear() -> int:
    """Delete every cached artifact (and nothing else in the folder); return the number of entries removed."""
    removed = 0
    for entry in entries():
        remove(*entry.files)
        removed += entry.primary
    if any(e.primary for e in entries()):
        raise OSError(f"could not remove every entry of {cache_dir()}: check that it is writable")
    return removed
