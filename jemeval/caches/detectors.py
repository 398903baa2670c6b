"""The on-disk cache of fitted OOD detector states, so a second ``jemeval ood`` run does not refit.

A detector's ``state_dict()`` (tensors and plain values) is written atomically to
``$JEMEVAL_CACHE_DIR/detectors`` (default ``~/.cache/jemeval/detectors``) under a file named by its
detector and the hash of its key (what :mod:`jemeval.evaluation.ood.fit` fingerprints: model weights,
detector, options, fit data); the key is stored too and must match on reading, and so must the
SHA-256 of the state (:func:`state_sha256`, stored beside it): a file whose values were changed
after jemeval wrote it is refitted with a note, never used. Files are read back with
``torch.load(weights_only=True)``, never as a pickle. The file I/O lives here, outside
``evaluation/``, which computes and returns data only. A cache file that cannot be read, or a folder
that cannot be written (read-only, full), costs a refit and a warning, never the evaluation.
"""
from __future__ import annotations

import hashlib
import io
import os
import re
import warnings
from pathlib import Path
from typing import Any

import torch

from jemeval.atomic import write_atomic
from jemeval.errors import JemevalError

CACHE_ENV = "JEMEVAL_CACHE_DIR"
CACHE_FORMAT = 2  # 2: with the state's SHA-256 (files of format 1 have other keys: never read)


def cache_dir(root: str | os.PathLike | None = None) -> Path:
    """Where fitted detector states live: ``ROOT/detectors`` for the run's cache folder ``root`` (its
    :class:`~jemeval.context.CachePolicy` ``dir``), else ``$JEMEVAL_CACHE_DIR/detectors`` or
    ``~/.cache/jemeval/detectors``."""
    return Path(root or os.environ.get(CACHE_ENV) or "~/.cache/jemeval").expanduser() / "detectors"


def cache_path(name: str, key: str, root: str | os.PathLike | None = None) -> Path:
    """The file of detector ``name`` fitted under ``key`` (a readable name, then the key's hash) in
    :func:`cache_dir` of ``root``."""
    safe = re.sub(r"[^A-Za-z0-9_.-]", "_", name)
    return cache_dir(root) / f"{safe}-{hashlib.sha256(key.encode()).hexdigest()[:24]}.pt"


def state_sha256(state: Any) -> str:
    """SHA-256 of a state dict's contents (every tensor's dtype, shape and bytes; plain values by
    type and repr), the same before it is saved and after it is read back."""
    h = hashlib.sha256()
    _digest(h, state)
    return h.hexdigest()


def _digest(h: Any, value: Any) -> None:
    if torch.is_tensor(value):
        t = value.detach().cpu().contiguous()
        h.update(f"T{t.dtype}{tuple(t.shape)};".encode())
        h.update(t.reshape(-1).view(torch.uint8).numpy().tobytes() if t.numel() else b"")
    elif isinstance(value, dict):
        h.update(f"D{len(value)};".encode())
        for k in sorted(value, key=repr):
            _digest(h, k)
            _digest(h, value[k])
    elif isinstance(value, (list, tuple)):
        h.update(f"L{len(value)};".encode())
        for v in value:
            _digest(h, v)
    else:
        h.update(f"V{type(value).__name__}:{value!r};".encode())


def load_state(detector: Any, path: Path, key: str, label: str) -> bool | str:
    """Load the cached state at ``path`` into ``detector`` (a :class:`jemeval.Detector`; one that is
    not ``cacheable`` never is): True, False when there is none to use
    (no file, another key), or a note (warned too) when the file is not what jemeval wrote (it is
    then refitted and replaced)."""
    if not detector.cacheable or not path.is_file():
        return False
    try:
        saved = torch.load(path, map_location="cpu", weights_only=True)
        if not isinstance(saved, dict) or saved.get("key") != key:
            return False
        if saved.get("state_sha256") != state_sha256(saved.get("state")):
            return warn(f"cached state {str(path)!r} of score {label!r} did not match its checksum; refitted")
        detector.load_state_dict(saved["state"])
        return True
    except Exception as exc:  # an unreadable cache file is refitted, never fatal
        return warn(f"cached state {str(path)!r} of score {label!r} could not be read "
                    f"({type(exc).__name__}: {exc}); fitting again")


def warn(note: str) -> str:
    warnings.warn(note, stacklevel=3)
    return note


def save_state(detector: Any, path: Path, key: str, label: str) -> bool:
    """Cache the fitted state of a ``cacheable`` detector (tensors and plain values); False when it cannot be."""
    if not detector.cacheable:
        return False
    buffer = io.BytesIO()
    try:
        state = detector.state_dict()
        torch.save({"format": CACHE_FORMAT, "key": key, "state": state, "state_sha256": state_sha256(state)}, buffer)
        torch.load(io.BytesIO(buffer.getvalue()), weights_only=True)  # what a later run will be able to read
    except Exception as exc:
        warnings.warn(f"the state_dict() of score {label!r} is not tensors and plain values "
                      f"({type(exc).__name__}); it is not cached and will be fitted again next time", stacklevel=2)
        return False
    try:
        path.parent.mkdir(parents=True, exist_ok=True)  # the cache owns its folder
        write_atomic(path, lambda tmp: tmp.write_bytes(buffer.getvalue()))
        return True
    except (OSError, JemevalError) as exc:
        warnings.warn(f"could not cache the fitted state of score {label!r} in {str(path.parent)!r} ({exc}); "
                      f"set {CACHE_ENV} to a writable folder", stacklevel=2)
        return False
