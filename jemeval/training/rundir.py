"""The run folder (``out``): one training process at a time, no silent replacement, no debris.

* :class:`RunLock`: ``DIR/.jemeval-train.lock``, created atomically (``O_CREAT | O_EXCL``) with the
  pid and host of the process training there, removed when it exits (also on an exception, Ctrl-C
  or SIGTERM/SIGHUP). A second process gets one line naming the holder; a lock left by a dead
  process (SIGKILL, power loss) is taken over with a note on stderr.
* :func:`claim`: what a (rank 0) trainer does before reading or writing anything in DIR: create DIR
  (not its parents), take the lock, refuse to start over an existing run unless ``resume`` or
  ``overwrite``, remove the old run's files for ``overwrite``, and remove the temporary files that
  a kill during an atomic write left behind.
* :func:`check_run_folder`: the same checks without touching anything, for a launcher to fail
  before it starts any process; :func:`check_launch` adds the rest of the one-line errors a
  ``jemeval train --nproc N`` worker would hit (the global batch, each process's share of the
  buffer, a resume's number of processes). The launch itself is :func:`jemeval.runtime.launch.relaunch`.
"""
from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import socket
import threading
import time
import uuid
from pathlib import Path
from typing import Any

from jemeval.atomic import stale_temp_files, write_failure
from jemeval.errors import UsageError
from jemeval.runtime.devices import resolve_device
from jemeval.runtime.distributed import DistContext
from jemeval.runtime.launch import check_nproc
from jemeval.training import ddp
from jemeval.training.checkpointing import load_resume_checkpoint, resume_path, saved_world_size
from jemeval.training.reporting import note
from jemeval.training.visuals import GRID_NAMES

RUN_FILES = ("last.pt", "best.pt", "metrics.csv")
LOCK_NAME = ".jemeval-train.lock"
#: The regular expression of the names the trainer writes atomically into DIR (for stale temp files).
_RUN_FILE_NAMES = r"last\.pt|best\.pt|metrics\.csv"
_BREAK_GRACE_S = 30.0  # a takeover guard older than this was left by a process killed mid-takeover
_RELEASE_SIGNALS = ("SIGTERM", "SIGHUP")


# -- checks -------------------------------------------------------------------------------------
def check_run_folder(config: Any) -> None:
    """Every refusal :func:`claim` would make for ``config``, without creating or changing a file."""
    out = Path(config.out_dir)
    _check_location(out, config)
    if out.is_dir():
        holder = RunLock(out).holder()
        if holder is not None and _alive(holder):
            raise UsageError(_busy(out, holder), param="out")
        _check_existing(out, config)


def check_launch(config: Any, nproc: int) -> None:
    """Before ``train --nproc N`` starts any process: the one-line errors its workers would hit (the
    processes against the devices, the run folder, the global batch, the buffer share, a resume's
    number of processes)."""
    check_nproc(nproc, resolve_device(config.device, name="device"))
    check_run_folder(config)
    ddp.check_global_batch(config.batch_size, nproc)
    planned = DistContext(world_size=nproc)
    if config.samples and not config.short_run:
        ddp.buffer_share(config.buffer_size, planned)
    if config.resume:
        saved = saved_world_size(load_resume_checkpoint(config.out_dir))
        ddp.check_world(saved, planned, Path(config.out_dir) / "last.pt")


def _check_location(out: Path, config: Any) -> None:
    """``out`` is a folder or can be created: its parent must exist, except for the default
    runs/DATASET (``config.out`` unset); a resume needs its last.pt."""
    if config.resume:
        resume_path(out)
    parents = config.out is None
    if out.exists() and not out.is_dir():
        raise UsageError(f"out {str(out)!r} is a file, not a run folder; choose a folder", param="out")
    parent = out.absolute().parent
    if not out.exists() and not parents and not parent.is_dir():
        raise UsageError(f"out {str(out)!r}: its parent folder {str(parent)!r} does not exist; create it first "
                         "(jemeval train creates only the run folder itself)", param="out")


def existing_run(out: Path) -> list[str]:
    """The files of a previous run in ``out`` (empty for a new folder)."""
    return [name for name in RUN_FILES if (out / name).exists()]


def _check_existing(out: Path, config: Any) -> None:
    """A new run (neither ``resume`` nor ``overwrite``) must not start over an existing one."""
    found = existing_run(out)
    if found and not config.resume and not config.overwrite:
        raise UsageError(f"out {str(out)!r} already holds a training run ({', '.join(found)}): continue it with "
                         "resume=True, replace it with overwrite=True, or choose another out", param="out")


# -- claiming the folder ------------------------------------------------------------------------
def claim(config: Any) -> RunLock:
    """Create and lock the run folder, then make it ready for ``config`` (see the module docstring).

    The caller releases the returned lock when the run ends; on an error it is released here.
    """
    out = Path(config.out_dir)
    _check_location(out, config)
    created = not out.exists()
    try:
        out.mkdir(parents=config.out is None, exist_ok=True)
    except OSError as exc:
        raise UsageError(f"cannot create the run folder {str(out)!r}: {exc.strerror or exc}", param="out") from None
    try:
        lock = RunLock(out, created=created).acquire()
    except BaseException:
        if created:  # the folder this call made, still empty: nothing of the failed start is left
            with contextlib.suppress(OSError):
                out.rmdir()
        raise
    try:
        _check_existing(out, config)
        if config.overwrite:
            _remove_run(out)
        _remove_stale_temps(out)
    except BaseException:
        lock.release()
        raise
    return lock


def _remove_run(out: Path) -> None:
    """``overwrite``: delete the previous run's checkpoints, metrics and sample grids (nothing else)."""
    removed = [out / name for name in RUN_FILES if (out / name).exists()]
    samples = out / "samples"
    if samples.is_dir():
        removed += [p for p in samples.iterdir() if re.fullmatch(GRID_NAMES, p.name) and p.is_file()]
    for path in removed:
        path.unlink()
    if samples.is_dir() and not any(samples.iterdir()):
        samples.rmdir()
    if removed:
        note(f"overwrite: removed the previous run in {str(out)!r} ({len(removed)} files)")


def _remove_stale_temps(out: Path) -> None:
    """Temporary files of atomic writes that a kill interrupted (only jemeval's own names)."""
    stale = stale_temp_files(out, _RUN_FILE_NAMES) + stale_temp_files(out / "samples", GRID_NAMES)
    for path in stale:
        path.unlink(missing_ok=True)
    if stale:
        note(f"removed {len(stale)} temporary file(s) left by an interrupted write in {str(out)!r}")


# -- the lock -----------------------------------------------------------------------------------
class RunLock:
    """An exclusive, pid-stamped lock file in a run folder (see the module docstring)."""

    def __init__(self, folder: str | os.PathLike, *, created: bool = False) -> None:
        self.path = Path(folder) / LOCK_NAME
        #: the folder was made for this run: a run that ends before writing anything leaves no folder
        self.created = created
        self._token: str | None = None
        self._handlers: dict[int, Any] = {}

    def acquire(self) -> RunLock:
        """Take the lock, or raise :class:`UsageError` naming the live process that holds it."""
        for _ in range(20):
            if self._create():
                self._install_signals()
                return self
            holder = self.holder()
            if holder is None:  # vanished, or being written this instant: look again
                time.sleep(0.05)
                continue
            if _alive(holder):
                raise UsageError(_busy(self.path.parent, holder), param="out")
            self._break(holder)
        raise UsageError(f"could not lock {str(self.path.parent)!r}: {str(self.path)!r} keeps changing; "
                         "is another jemeval train starting there?")

    def release(self) -> None:
        """Remove the lock file if it is still this holder's (idempotent)."""
        self._restore_signals()
        if self._token is not None and (self.holder() or {}).get("token") == self._token:
            self.path.unlink(missing_ok=True)
            if self.created and not any(self.path.parent.iterdir()):
                self.path.parent.rmdir()  # a run refused before its first file: nothing left behind
        self._token = None

    def holder(self) -> dict | None:
        """The lock file's record (pid, host, start, token); None when there is none or it is unreadable."""
        try:
            record = json.loads(self.path.read_text())
        except (OSError, ValueError):
            return self._unreadable()
        return record if isinstance(record, dict) and isinstance(record.get("pid"), int) else self._unreadable()

    def _unreadable(self) -> dict | None:
        """An empty or garbled lock file: None (look again) while young, a dead holder once old."""
        try:
            age = time.time() - self.path.stat().st_mtime
        except OSError:
            return None
        return {"pid": -1, "host": socket.gethostname(), "token": None} if age > _BREAK_GRACE_S else None

    def _create(self) -> bool:
        token = uuid.uuid4().hex
        record = {"pid": os.getpid(), "host": socket.gethostname(), "start": _process_start(os.getpid()),
                  "token": token}
        try:
            fd = os.open(self.path, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
        except FileExistsError:
            return False
        except OSError as exc:
            raise UsageError(f"cannot lock the run folder: {str(self.path)!r}: {exc.strerror or exc}") from None
        try:
            with os.fdopen(fd, "w") as fh:
                fh.write(json.dumps(record) + "\n")
        except OSError as exc:  # a full disk: no half-written lock may stay behind to block the next run
            self.path.unlink(missing_ok=True)
            raise write_failure(exc, self.path) from None
        self._token = token
        return True

    def _break(self, stale: dict) -> None:
        """Remove a dead holder's lock; a guard file makes sure only one process does so at a time."""
        guard = self.path.with_name(self.path.name + ".break")
        try:
            fd = os.open(guard, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
        except FileExistsError:
            try:
                if time.time() - guard.stat().st_mtime > _BREAK_GRACE_S:
                    guard.unlink(missing_ok=True)
            except OSError:
                pass
            time.sleep(0.05)
            return
        try:
            if self.holder() == stale:
                self.path.unlink(missing_ok=True)
                note(f"took over the lock of {str(self.path.parent)!r} left by process {stale['pid']}, "
                      "which is no longer running")
        finally:
            os.close(fd)
            guard.unlink(missing_ok=True)

    def _install_signals(self) -> None:
        """SIGTERM / SIGHUP (default action: die without cleanup) raise SystemExit, so the lock is released."""
        if threading.current_thread() is not threading.main_thread():
            return
        for name in _RELEASE_SIGNALS:
            sig = getattr(signal, name, None)
            if sig is not None and signal.getsignal(sig) is signal.SIG_DFL:
                self._handlers[sig] = signal.signal(sig, _exit_on_signal)

    def _restore_signals(self) -> None:
        for sig, handler in self._handlers.items():
            if signal.getsignal(sig) is _exit_on_signal:
                signal.signal(sig, handler)
        self._handlers = {}


def _exit_on_signal(signum, frame) -> None:
    raise SystemExit(128 + signum)


def _busy(out: Path, holder: dict) -> str:
    where = "" if holder.get("host") == socket.gethostname() else f" on host {holder.get('host')!r}"
    return (f"out {str(out)!r} is in use by another jemeval train (process {holder['pid']}{where}); wait for it "
            f"to finish or choose another out (if no such process runs, delete {str(out / LOCK_NAME)!r})")


def _alive(holder: dict) -> bool:
    """Whether the lock's holder still runs. A holder on another host (or on Windows) is assumed
    alive (we cannot tell); on this host the pid must exist and, where /proc tells, have the recorded start time
    (a recycled pid, e.g. in a restarted container, is not the holder)."""
    if holder.get("host") != socket.gethostname() or os.name == "nt":  # Windows: os.kill(pid, 0) is no probe
        return True
    pid = holder["pid"]
    if pid <= 0:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # exists, owned by another user
        pass
    start = holder.get("start")
    return start is None or _process_start(pid) in (None, start)


def _process_start(pid: int) -> str | None:
    """The process's start time in clock ticks since boot (Linux /proc), or None where unknown."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    fields = stat[stat.rfind(")") + 2:].split()
    return fields[19] if len(fields) > 19 else None
