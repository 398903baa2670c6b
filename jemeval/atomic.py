"""Atomic file writes: write a temporary file in the target's folder, fsync, rename, fsync the folder.

A crash or Ctrl-C mid-write leaves the previous file intact, never half a checkpoint; the folder is
synced after the rename, so a power cut after the call returns cannot lose the new name either. The
temporary file is created with the permissions ``open()`` gives (the process umask applied by the
kernel, never read by changing it: ``os.umask`` is process-wide and a thread writing at the same
moment would get the wrong permissions); a replaced file keeps its own permissions. A full disk
(or quota, or file-size limit) gives one line naming the file, the previous file kept and the
temporary one removed. No folder is ever created here: a mistyped output path must not create
directories anywhere; code that owns a folder (the trainer's run folder) creates it itself.
"""
from __future__ import annotations

import contextlib
import errno
import os
import random
import re
import stat
from collections.abc import Callable, Iterator
from pathlib import Path

from jemeval.errors import UsageError, WriteError

TEMP_SUFFIX = ".tmp"
#: The 8 random characters between prefix and suffix of a temporary name (``tempfile.mkstemp``'s alphabet,
#: so the temporary files of older versions are recognised too).
_RANDOM_CHARS = "abcdefghijklmnopqrstuvwxyz0123456789_"
_MKSTEMP_RANDOM = r"[a-z0-9_]{8}"
#: flags of the temporary file: new (never an existing file or a planted symlink), write-only
_CREATE_FLAGS = os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_CLOEXEC", 0)

#: errno values that mean "no room for this file" rather than a bug or a permission problem
SPACE_ERRNOS = {errno.ENOSPC: "no space left on device", errno.EFBIG: "file too large",
                getattr(errno, "EDQUOT", errno.ENOSPC): "disk quota exceeded"}
#: torch.save reports a failed write (a full disk, typically) as a RuntimeError from its zip writer
TORCH_WRITE_FAILURES = ("inline_container", "PytorchStreamWriter", "file write failed")


@contextlib.contextmanager
def atomic_path(path: str | os.PathLike) -> Iterator[Path]:
    """Yield a temporary path next to ``path``; on success it replaces ``path`` atomically."""
    target = Path(path)
    tmp_path = _temp_file_next_to(target)
    try:
        try:
            yield tmp_path
            with open(tmp_path, "rb+") as fh:
                os.fsync(fh.fileno())
            _keep_mode(target, tmp_path)
            os.replace(tmp_path, target)
            fsync_folder(target.parent)
        except (OSError, RuntimeError) as exc:
            problem = space_problem(exc)
            if problem is None:
                raise
            raise WriteError(f"{problem} writing {str(target)!r}; the previous file (if any) is unchanged: "
                             "free some space or choose another location") from None
    finally:
        if tmp_path.exists():
            tmp_path.unlink()


def _temp_file_next_to(target: Path) -> Path:
    """An empty temporary file in ``target``'s folder (so the final rename stays on one file system)."""
    folder = target.parent
    if not folder.is_dir():
        what = "is not a folder" if folder.exists() else "does not exist"
        raise UsageError(f"cannot write {str(target)!r}: folder {str(folder)!r} {what}; "
                         "create it first or choose another location")
    for _ in range(100):
        tmp = folder / f".{target.name}.{_random_name()}{TEMP_SUFFIX}"
        try:
            os.close(os.open(tmp, _CREATE_FLAGS, 0o666))  # 0o666 & ~umask, as open() would create it
            return tmp
        except FileExistsError:
            continue
        except OSError as exc:  # a read-only or full location is the caller's path, not a bug
            problem = space_problem(exc)
            if problem is not None:
                raise WriteError(f"{problem} writing {str(target)!r}; free some space or choose another "
                                 "location") from None
            raise UsageError(f"cannot write {str(target)!r}: {exc.strerror or exc}; choose a writable "
                             "location") from None
    raise WriteError(f"cannot write {str(target)!r}: no free temporary name in {str(folder)!r}")


def _random_name() -> str:
    rng = random.SystemRandom()
    return "".join(rng.choice(_RANDOM_CHARS) for _ in range(8))


def space_problem(exc: BaseException) -> str | None:
    """'no space left on device' (or the like) when ``exc`` is a write failing for lack of room, else None."""
    if isinstance(exc, OSError) and exc.errno in SPACE_ERRNOS:
        return SPACE_ERRNOS[exc.errno]
    if isinstance(exc, RuntimeError) and any(marker in str(exc) for marker in TORCH_WRITE_FAILURES):
        return "no space left on device or file too large"
    return None


def _keep_mode(target: Path, tmp_path: Path) -> None:
    """A file being replaced keeps its permissions; a new one keeps those it was created with."""
    try:
        mode = stat.S_IMODE(target.stat().st_mode)
    except FileNotFoundError:
        return
    os.chmod(tmp_path, mode)


def fsync_folder(folder: str | os.PathLike) -> None:
    """Make a rename in ``folder`` durable (POSIX: fsync the directory). Where a folder cannot be
    opened or synced (Windows, some network file systems) there is nothing more to do."""
    try:
        fd = os.open(folder, os.O_RDONLY | getattr(os, "O_DIRECTORY", 0))
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


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

    A kill between creating the temporary file and the rename leaves ``.NAME.XXXXXXXX.tmp`` behind. Only that exact
    pattern matches (a user's own hidden files never do); a caller removes them only when it knows
    no other writer is active in ``folder`` (e.g. while holding the folder's lock).
    """
    folder = Path(folder)
    if not folder.is_dir():
        return []
    pattern = re.compile(rf"\.(?:{names})\.{_MKSTEMP_RANDOM}{re.escape(TEMP_SUFFIX)}")
    return sorted(p for p in folder.iterdir() if pattern.fullmatch(p.name) and p.is_file())
