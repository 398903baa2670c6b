"""Atomic file writes: write a temporary file in the target's folder, fsync, rename, fsync the folder.

A crash or Ctrl-C mid-write leaves the previous file intact, never half a checkpoint; the folder is
synced after the rename, so a power cut after the call returns cannot lose the new name either. The
temporary file is created with the permissions ``open()`` gives (the process umask applied by the
kernel, never read by changing it: ``os.umask`` is process-wide and a thread writing at the same
moment would get the wrong permissions); a replaced file keeps its own permissions. A full disk
(or quota, or file-size limit) gives one line naming the file, the previous file kept and the
temporary one removed. No folder is ever created here: a mistyped output path must not create
directories anywhere; code that owns a folder (the trainer's run folder) creates it itself.

The writer holds an advisory lock (``flock``) on its temporary file until the rename. A temporary
file nobody holds is one a killed writer left behind: every atomic write removes those of its own
target first (:func:`stale_temp_files` returns only unheld ones), so a kill just before a rename
leaves no litter past the next write of the same file, and a concurrent writer's file is never touched.
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
#: how writers that are not Python's own (safetensors' Rust I/O: "os error 28") say the same
FOREIGN_SPACE_ERRORS = {"(os error 28)": "no space left on device", "(os error 27)": "file too large",
                        "(os error 122)": "disk quota exceeded"}


@contextlib.contextmanager
def atomic_path(path: str | os.PathLike) -> Iterator[Path]:
    """Yield a temporary path next to ``path``; on success it replaces ``path`` atomically."""
    target = Path(path)
    for stale in stale_temp_files(target.parent, re.escape(target.name)):
        with contextlib.suppress(OSError):  # left by a killed write of this same file (no one holds it)
            stale.unlink()
    tmp_path, held = _temp_file_next_to(target)
    created_mode = stat.S_IMODE(os.fstat(held).st_mode)
    try:
        try:
            yield tmp_path
            held = _hold_again_if_replaced(tmp_path, held)
            with open(tmp_path, "rb+") as fh:
                os.fsync(fh.fileno())
            _keep_mode(target, tmp_path, created_mode)
            os.replace(tmp_path, target)
            fsync_folder(target.parent)
        except Exception as exc:  # noqa: BLE001 - OSError, torch's RuntimeError, SafetensorError, ...
            failure = write_failure(exc, target, kept=True)
            if failure is exc:
                raise
            raise failure from None
    finally:
        if tmp_path.exists():
            tmp_path.unlink()
        os.close(held)


def _temp_file_next_to(target: Path) -> tuple[Path, int]:
    """An empty temporary file in ``target``'s folder (so the final rename stays on one file system),
    and a descriptor holding its lock (closed by the caller once the file is renamed or removed)."""
    folder = target.parent
    if not folder.is_dir():
        what = "is not a folder" if folder.exists() else "does not exist"
        raise UsageError(f"cannot write {str(target)!r}: folder {str(folder)!r} {what}; "
                         "create it first or choose another location")
    for _ in range(100):
        tmp = folder / f".{target.name}.{_random_name()}{TEMP_SUFFIX}"
        try:
            fd = os.open(tmp, _CREATE_FLAGS, 0o666)  # 0o666 & ~umask, as open() would create it
            _lock(fd, block=True)
            return tmp, fd
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


def _lock(fd: int, *, block: bool) -> bool:
    """Take the advisory lock on ``fd``; False when another open file holds it (``block=False``).
    Where there is no ``flock`` (Windows) or the file system refuses locks, True."""
    try:
        import fcntl
    except ImportError:  # pragma: no cover - Windows
        return True
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | (0 if block else fcntl.LOCK_NB))
        return True
    except BlockingIOError:
        return False
    except OSError:  # ENOLCK on some network file systems: no lock to take
        return True


def _held(path: Path) -> bool:
    """Whether a writer still holds the temporary file ``path``. Without ``flock`` (Windows) no:
    there an open file cannot be removed anyway, and the removal's error is ignored."""
    try:
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_CLOEXEC", 0))
    except OSError:
        return True  # gone, a link, unreadable: leave it alone
    try:
        return not _lock(fd, block=False)
    finally:
        os.close(fd)


def _random_name() -> str:
    rng = random.SystemRandom()
    return "".join(rng.choice(_RANDOM_CHARS) for _ in range(8))


def space_problem(exc: BaseException) -> str | None:
    """'no space left on device' (or the like) when ``exc`` is a write failing for lack of room, else None."""
    if isinstance(exc, OSError) and exc.errno in SPACE_ERRNOS:
        return SPACE_ERRNOS[exc.errno]
    if isinstance(exc, RuntimeError) and any(marker in str(exc) for marker in TORCH_WRITE_FAILURES):
        return "no space left on device or file too large"
    return next((problem for marker, problem in FOREIGN_SPACE_ERRORS.items() if marker in str(exc)), None)


def write_failure(exc: BaseException, path: str | os.PathLike, *, kept: bool = False) -> BaseException:
    """The one-line error for a write of ``path`` that failed with ``exc``: no room (WriteError), a
    read-only or forbidden location (UsageError); any other failure is ``exc`` itself. ``kept``:
    the message says the previous file is unchanged (an atomic write)."""
    where = f"writing {str(path)!r}" + ("; the previous file (if any) is unchanged" if kept else "")
    problem = space_problem(exc)
    if problem is not None:
        return WriteError(f"{problem} {where}: free some space or choose another location")
    if isinstance(exc, OSError) and exc.errno in (errno.EROFS, errno.EACCES, errno.EPERM):
        return UsageError(f"cannot write {str(path)!r}: {exc.strerror.lower()}; choose a writable location")
    return exc


def _hold_again_if_replaced(tmp_path: Path, held: int) -> int:
    """The descriptor holding the lock on ``tmp_path`` now. A writer that wrote a file of its own and
    renamed it onto the temporary name (safetensors does) left the lock on the old one: lock the new one."""
    now, before = os.stat(tmp_path), os.fstat(held)
    if (now.st_dev, now.st_ino) == (before.st_dev, before.st_ino):
        return held
    fd = os.open(tmp_path, os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_CLOEXEC", 0))
    _lock(fd, block=True)
    os.close(held)
    return fd


def _keep_mode(target: Path, tmp_path: Path, created_mode: int) -> None:
    """A file being replaced keeps its permissions; a new one gets those ``open()`` gives (the
    temporary file's at creation: a writer that made its own file, 0600 for safetensors, does not
    choose them)."""
    try:
        mode = stat.S_IMODE(target.stat().st_mode)
    except FileNotFoundError:
        mode = created_mode
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
    pattern matches (a user's own hidden files never do), and only files no writer holds (a live
    write keeps its temporary file locked until the rename), so removing them is always safe.
    """
    folder = Path(folder)
    if not folder.is_dir():
        return []
    pattern = re.compile(rf"\.(?:{names})\.{_MKSTEMP_RANDOM}{re.escape(TEMP_SUFFIX)}")
    found = [p for p in folder.iterdir() if pattern.fullmatch(p.name) and p.is_file() and not p.is_symlink()]
    return sorted(p for p in found if not _held(p))
