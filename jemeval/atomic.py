"""Atomic file writes: write a temporary file in the target's folder, fsync, then rename.

A crash or Ctrl-C mid-write leaves the previous file intact, never half a checkpoint.
"""
from __future__ import annotations

import contextlib
import os
import re
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path

TEMP_SUFFIX = ".tmp"
#: What ``tempfile.mkstemp`` puts between prefix and suffix: 8 characters from this set.
_MKSTEMP_RANDOM = r"[a-z0-9_]{8}"


@contextlib.contextmanager
def atomic_path(path: str | os.PathLike) -> Iterator[Path]:
    """Yield a temporary path next to ``path``; on success it replaces ``path`` atomically."""
    target = Path(path)
    try:
        target.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=f".{target.name}.", suffix=TEMP_SUFFIX, dir=target.parent)
    except OSError as exc:  # a read-only or impossible location is the caller's path, not a bug
        from .errors import UsageError

        raise UsageError(f"cannot write {str(target)!r}: {exc.strerror or exc}; choose a writable location") from None
    os.close(fd)
    tmp_path = Path(tmp)
    try:
        yield tmp_path
        with open(tmp_path, "rb+") as fh:
            os.fsync(fh.fileno())
        os.chmod(tmp_path, _final_mode(target))  # mkstemp makes 0600 files; keep ordinary permissions
        os.replace(tmp_path, target)
    finally:
        if tmp_path.exists():
            tmp_path.unlink()


def _final_mode(target: Path) -> int:
    """The existing file's mode, else what ``open()`` would create under the current umask."""
    try:
        return target.stat().st_mode & 0o777
    except FileNotFoundError:
        umask = os.umask(0)
        os.umask(umask)
        return 0o666 & ~umask


def write_atomic(path: str | os.PathLike, writer: Callable[[Path], None]) -> Path:
    """Call ``writer(tmp_path)`` and move the result to ``path`` atomically."""
    with atomic_path(path) as tmp:
        writer(tmp)
    return Path(path)


def write_text_atomic(path: str | os.PathLike, text: str) -> Path:
    return write_atomic(path, lambda tmp: tmp.write_text(text))


def stale_temp_files(folder: str | os.PathLike, names: str) -> list[Path]:
    """The temporary files :func:`atomic_path` left in ``folder`` for targets whose names match the
    regular expression ``names`` (e.g. ``r"last\\.pt|best\\.pt"``).

    A kill between ``mkstemp`` and the rename leaves ``.NAME.XXXXXXXX.tmp`` behind. Only that exact
    pattern matches (a user's own hidden files never do); a caller removes them only when it knows
    no other writer is active in ``folder`` (e.g. while holding the folder's lock).
    """
    folder = Path(folder)
    if not folder.is_dir():
        return []
    pattern = re.compile(rf"\.(?:{names})\.{_MKSTEMP_RANDOM}{re.escape(TEMP_SUFFIX)}")
    return sorted(p for p in folder.iterdir() if pattern.fullmatch(p.name) and p.is_file())
