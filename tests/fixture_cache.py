"""A disk cache for the test suite's trained fixtures, shared by xdist workers and by concurrent runs.

Session-scoped fixtures live once per *process*: under ``pytest -n 2`` every worker used to train
the same digits models again. Here a fixture is built by exactly one process and reused by all:

- the entry's name holds a key: a hash of the package source (every ``*.py`` under it), the
  files that build the fixture (conftest.py, this module), the fixture's settings and the
  torch / Python versions. Change any of them and the old entry is simply never looked up again.
- one builder at a time per entry, under a ``filelock`` lock (an OS lock: a killed builder
  releases it, nothing stale to clean up by hand); the others wait, then reuse its result.
- an entry is built in a temporary folder, finished with a manifest (size and sha256 of every
  file) and renamed into place in one step. A reader uses an entry only when its manifest parses
  and every file matches it, so a half-written or damaged entry is rebuilt, never used.

The cache folder is ``$JEMEVAL_TEST_CACHE`` or ``<system temp>/jemeval-test-cache-<uid>``; it must
be ours and closed to other users (it holds checkpoints the tests load). Delete it to force a
rebuild. Entries unused for :data:`MAX_AGE_DAYS` days and builds abandoned for an hour are pruned.
"""
from __future__ import annotations

import getpass
import hashlib
import json
import os
import platform
import shutil
import sys
import tempfile
import time
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path

from filelock import FileLock, Timeout

ENV = "JEMEVAL_TEST_CACHE"
MANIFEST = "manifest.json"
MAX_AGE_DAYS = 14
ABANDONED_BUILD_S = 3600
#: how long a process waits for another one's build before giving up (training takes ~15-60 s)
LOCK_TIMEOUT_S = 1200.0


class Busy(RuntimeError):
    """Another process is building the entry and ``timeout`` ran out (at once for ``timeout=0``)."""


def cache_root() -> Path:
    """The cache folder, created 0700 if missing; refused when another user could write into it."""
    uid = os.getuid() if hasattr(os, "getuid") else getpass.getuser()
    root = Path(os.environ.get(ENV) or Path(tempfile.gettempdir()) / f"jemeval-test-cache-{uid}")
    root.mkdir(mode=0o700, parents=True, exist_ok=True)
    st = root.stat()
    if hasattr(os, "getuid") and (st.st_uid != os.getuid() or st.st_mode & 0o022):
        raise RuntimeError(f"test fixture cache {str(root)!r} is not private to this user (owner uid "
                           f"{st.st_uid}, mode {oct(st.st_mode & 0o777)}): set {ENV} to a folder of yours")
    return root


def source_key(package: Path, settings: Mapping, extra_files: Iterable[Path] = ()) -> str:
    """A hex digest that changes when any ``*.py`` under ``package`` (content, name, added or
    removed), any of ``extra_files``, ``settings``, torch's or Python's version changes."""
    digest = hashlib.sha256()
    files = sorted(p for p in Path(package).rglob("*.py") if "__pycache__" not in p.parts)
    named = [(p.relative_to(package).as_posix(), p) for p in files]
    named += [(f"<extra>/{Path(p).name}", Path(p)) for p in extra_files]
    for name, path in named:
        content = path.read_bytes()
        digest.update(f"{name}\0{len(content)}\0".encode())
        digest.update(content)
    digest.update(json.dumps(settings, sort_keys=True, default=repr).encode())
    digest.update(f"{_torch_version()}|{sys.version}|{platform.machine()}".encode())
    return digest.hexdigest()


def _torch_version() -> str:
    torch = sys.modules.get("torch")
    if torch is None:
        try:
            import torch
        except ImportError:
            return "no torch"
    return torch.__version__


def cached(name: str, key: str, build: Callable[[Path], None], root: Path | None = None,
           timeout: float = LOCK_TIMEOUT_S) -> Path:
    """The folder of entry ``name``/``key``, calling ``build(folder)`` to fill it only when no valid
    one exists, else waiting up to ``timeout`` s for the process building it (then :class:`Busy`).
    The returned folder is shared: copy files out of it, never write into it."""
    root = cache_root() if root is None else Path(root)
    entry = root / f"{name}-{key[:24]}"
    if _valid(entry, key):
        return _touch(entry)
    lock = FileLock(str(root / f".{entry.name}.lock"), timeout=timeout)  # empty files, kept: see _prune
    try:
        with lock:
            if _valid(entry, key):  # another process built it while we waited
                return _touch(entry)
            _prune(root)
            if entry.exists():  # damaged or half-written: set aside, never used
                _remove(entry)
            return _publish(entry, key, build)
    except Timeout:
        raise Busy(f"waited {timeout:.0f} s for another process to build test fixture {name!r} "
                   f"(lock {lock.lock_file}); if none is running, delete that file") from None


def _publish(entry: Path, key: str, build: Callable[[Path], None]) -> Path:
    """Build into a temporary folder next to ``entry``, write the manifest last, rename into place."""
    tmp = Path(tempfile.mkdtemp(prefix=f".build-{entry.name}-", dir=entry.parent))
    try:
        build(tmp)
        files = sorted(p for p in tmp.rglob("*") if p.is_file())
        manifest = {"key": key, "files": {p.relative_to(tmp).as_posix(): _fingerprint(p) for p in files}}
        (tmp / MANIFEST).write_text(json.dumps(manifest, indent=1))
        os.chmod(tmp, 0o755)  # mkdtemp's 0700 is fine too; readable like any other build output
        os.rename(tmp, entry)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return entry


def _fingerprint(path: Path) -> list:
    return [path.stat().st_size, hashlib.sha256(path.read_bytes()).hexdigest()]


def _valid(entry: Path, key: str) -> bool:
    """True only for a finished entry: its manifest names ``key`` and every file matches it."""
    try:
        manifest = json.loads((entry / MANIFEST).read_text())
        files = manifest["files"]
        if manifest["key"] != key or not files:
            return False
        present = {p.relative_to(entry).as_posix() for p in entry.rglob("*") if p.is_file()} - {MANIFEST}
        return present == set(files) and all(_fingerprint(entry / rel) == want for rel, want in files.items())
    except (OSError, ValueError, KeyError, TypeError):
        return False


def _touch(entry: Path) -> Path:
    """Mark the entry as used now (pruning goes by this time)."""
    try:
        os.utime(entry / MANIFEST)
    except OSError:
        pass
    return entry


def _remove(path: Path) -> None:
    """Rename aside first, so nothing ever sees a partly deleted folder under the entry's name."""
    aside = Path(tempfile.mkdtemp(prefix=".trash-", dir=path.parent))
    os.rename(path, aside / "entry")
    shutil.rmtree(aside, ignore_errors=True)


def _prune(root: Path) -> None:
    """Remove entries unused for MAX_AGE_DAYS days and builds or trash abandoned for an hour."""
    now = time.time()
    for path in root.iterdir():
        if not path.is_dir():
            continue  # lock files: deleting one that a process is about to take would let two build
        temporary = path.name.startswith((".build-", ".trash-"))
        limit = ABANDONED_BUILD_S if temporary else MAX_AGE_DAYS * 86400
        if now - _last_used(path) > limit:
            shutil.rmtree(path, ignore_errors=True)


def _last_used(path: Path) -> float:
    for candidate in (path / MANIFEST, path):
        try:
            return candidate.stat().st_mtime
        except OSError:
            continue
    return time.time()  # vanished meanwhile: nothing to prune
