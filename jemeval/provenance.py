"""Provenance: what produced a result, recorded in every result file and checkpoint.

jemeval and plugin versions, torch version, device, checkpoint hash, seeds and every sampling or
evaluation setting: enough for someone else to know exactly what a number means.
"""
from __future__ import annotations

import datetime as _dt
import functools
import hashlib
import os
import platform
import subprocess
import sys
from pathlib import Path
from typing import Any

import torch

from jemeval.runtime.devices import device_description
from jemeval.runtime.memory import allocator_setting
from jemeval.runtime.shards import rank_and_world


def provenance(
    *,
    command: str | None = None,
    model: Any = None,
    checkpoint: str | None = None,
    device: str | torch.device | None = None,
    seed: int | None = None,
    settings: dict[str, Any] | None = None,
    data: dict[str, str] | None = None,
) -> dict[str, Any]:
    """A provenance record. ``model`` (an EnergyModel) contributes its checkpoint path and hash;
    ``data``: the SHA-256 of the files of each dataset spec read (:func:`jemeval.data.data_hashes`)."""
    from jemeval import __version__
    from jemeval.plugins import get_plugin_manager

    record: dict[str, Any] = {
        "jemeval_version": __version__,
        **source_checkout(),
        "plugins": {k: v for k, v in get_plugin_manager().versions().items()},
        "torch_version": str(torch.__version__),  # a TorchVersion would not load with weights_only
        "python_version": sys.version.split()[0],
        "platform": platform.platform(),
        "allocator": allocator_setting(),  # runtime/memory.py: glibc's mallopt settings, or why none
        **device_description(device),
        "created": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
    }
    if command:
        record["command"] = command
    ckpt = None
    if model is not None and getattr(model, "metadata", None):
        ckpt = model.metadata.get("checkpoint")
        record["model"] = {
            "arch": getattr(model, "arch", None),
            "arch_options": getattr(model, "arch_options", None),
            "num_classes": getattr(model, "num_classes", None),
            "input_shape": list(getattr(model, "input_shape", ()) or ()),
            "dataset": model.metadata.get("dataset"),
            "source_format": model.metadata.get("source_format"),
        }
    if checkpoint is not None:
        ckpt = {"path": str(checkpoint), "sha256": file_sha256(checkpoint)}
    if ckpt:
        record["checkpoint"] = ckpt
    if seed is not None:
        record["seed"] = seed
    if settings:
        record["settings"] = settings
    if data:
        record["data_sha256"] = dict(data)
    if rank_and_world()[1] > 1:  # a sharded evaluation (the records are those of one process)
        record["processes"] = rank_and_world()[1]
    return record


@functools.lru_cache(maxsize=1)
def source_checkout() -> dict[str, Any]:
    """``{"jemeval_commit": SHA, "jemeval_dirty": bool}`` when jemeval runs from a git checkout (an
    editable install), else ``{}``: two results of one version from different code are told apart.
    Asked of git once per process (``status`` with the file-system monitor off, which could run a
    command configured in the repository); anything unexpected leaves the fields out."""
    root = Path(__file__).resolve().parent.parent
    if not (root / ".git").exists():
        return {}
    git = ["git", "-C", str(root), "-c", "core.fsmonitor=false", "--no-optional-locks"]
    try:
        commit = subprocess.run([*git, "rev-parse", "HEAD"], capture_output=True, text=True, timeout=10, check=True)
        status = subprocess.run([*git, "status", "--porcelain", "--untracked-files=no", "--", "jemeval"],
                                capture_output=True, text=True, timeout=10, check=True)
    except (OSError, subprocess.SubprocessError):  # no git, not a repository git trusts, too slow
        return {}
    return {"jemeval_commit": commit.stdout.strip(), "jemeval_dirty": bool(status.stdout.strip())}


_HASH_CACHE: dict[tuple[int, int, int, int, int], str] = {}


def file_sha256(path: str | os.PathLike) -> str:
    """SHA-256 of a file: the checkpoint hash in provenance, and of every data file. Kept for this
    process by device, inode, size and change times (one ``stat``: a folder of 10,000 images is
    hashed once and looked up again at that cost), so a file replaced at the same path (even with
    its old mtime) is hashed again, and a file reached by two paths (a link) once."""
    st = os.stat(path)
    key = (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns)
    if key not in _HASH_CACHE:
        h = hashlib.sha256()
        with open(path, "rb") as fh:
            for block in iter(lambda: fh.read(1 << 20), b""):
                h.update(block)
        _HASH_CACHE[key] = h.hexdigest()
    return _HASH_CACHE[key]


def content_sha256(paths: list[str | os.PathLike]) -> str:
    """One SHA-256 over the contents of files and folders (every file under a folder, by relative
    path, symlinked folders not entered): what a cache of results derived from them is keyed on."""
    h = hashlib.sha256()
    for root in sorted(Path(p) for p in paths):
        h.update(f"{root}\0".encode())
        files = [(str(root), "")] if root.is_file() else _files_under(root)
        for path, relative in files:
            h.update(f"{relative}\0{file_sha256(path)}\0".encode())
    return h.hexdigest()


def _files_under(folder: Path) -> list[tuple[str, str]]:
    """(path, path relative to ``folder``) of every file under it, in the order pathlib sorts them
    (by path components), with plain strings: pathlib's objects cost more than the hashing of a
    folder of small images once its files are hashed."""
    found = []
    for dirpath, _, names in os.walk(folder):  # followlinks=False: a link to / is not crawled
        where = os.path.relpath(dirpath, folder)
        for name in names:
            path = os.path.join(dirpath, name)
            if os.path.isfile(path):
                found.append((path, name if where == "." else os.path.join(where, name)))
    return sorted(found, key=lambda item: item[1].split(os.sep))
