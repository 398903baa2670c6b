"""The on-disk cache of fitted OOD detector states, so a second ``jemeval ood`` run does not refit.

A detector's ``state_dict()`` (tensors and plain values) is written atomically to
``$JEMEVAL_CACHE_DIR/detectors`` (default ``~/.cache/jemeval/detectors``) under a file named by its
detector and the hash of its key (what :mod:`jemeval.evaluation.ood_fit` fingerprints: model weights,
detector, options, fit data); the key is stored too and must match on reading. Files are read back
with ``torch.load(weights_only=True)``, never as a pickle. The file I/O lives here, outside
``evaluation/``, which computes and returns data only. A cache file that cannot be read, or a folder
that cannot be written, costs a refit and a warning, never the evaluation.
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
CACHE_FORMAT = 1


def cache_dir() -> Path:
    """Where fitted detector states live: ``$JEMEVAL_CACHE_DIR/detectors`` or ``~/.cache/jemeval/detectors``."""
    return Path(os.environ.get(CACHE_ENV) or "~/.cache/jemeval").expanduser() / "detectors"


def cache_path(name: str, key: str) -> Path:
    """The file of detector ``name`` fitted under ``key`` (a readable name, then the key's hash)."""
    safe = re.sub(r"[^A-Za-z0-9_.-]", "_", name)
    return cache_dir() / f"{safe}-{hashlib.sha256(key.encode()).hexdigest()[:24]}.pt"


def load_state(detector: Any, path: Path, key: str, label: str) -> bool:
    """Load the cached state at ``path`` into ``detector``; False when there is none to use."""
    if not callable(getattr(detector, "load_state_dict", None)) or not path.exists():
        return False
    try:
        saved = torch.load(path, map_location="cpu", weights_only=True)
        if not isinstance(saved, dict) or saved.get("key") != key:
            return False
        detector.load_state_dict(saved["state"])
        return True
    except Exception as exc:  # an unreadable cache file is refitted, never fatal
        warnings.warn(f"cached state {str(path)!r} of score {label!r} could not be read "
                      f"({type(exc).__name__}: {exc}); fitting again", stacklevel=2)
        return False


def save_state(detector: Any, path: Path, key: str, label: str) -> bool:
    """Cache the fitted state of ``detector`` (tensors and plain values); False when it cannot be."""
    if not callable(getattr(detector, "state_dict", None)):
        return False
    buffer = io.BytesIO()
    try:
        torch.save({"format": CACHE_FORMAT, "key": key, "state": detector.state_dict()}, buffer)
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
