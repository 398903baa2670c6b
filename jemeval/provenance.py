"""Provenance: what produced a result, recorded in every result file and checkpoint.

jemeval and plugin versions, torch version, device, checkpoint hash, seeds and every sampling or
evaluation setting: enough for someone else to know exactly what a number means.
"""
from __future__ import annotations

import datetime as _dt
import hashlib
import os
import platform
import sys
from pathlib import Path
from typing import Any

import torch

from jemeval.runtime.devices import device_description
from jemeval.runtime.shards import rank_and_world


def provenance(
    *,
    command: str | None = None,
    model: Any = None,
    checkpoint: str | None = None,
    device: str | torch.device | None = None,
    seed: int | None = None,
    settings: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """A provenance record. ``model`` (an EnergyModel) contributes its checkpoint path and hash."""
    from jemeval import __version__
    from jemeval.plugins import get_plugin_manager

    record: dict[str, Any] = {
        "jemeval_version": __version__,
        "plugins": {k: v for k, v in get_plugin_manager().versions().items()},
        "torch_version": str(torch.__version__),  # a TorchVersion would not load with weights_only
        "python_version": sys.version.split()[0],
        "platform": platform.platform(),
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
    if rank_and_world()[1] > 1:  # a sharded evaluation (the records are those of one process)
        record["processes"] = rank_and_world()[1]
    return record


_HASH_CACHE: dict[tuple[str, int, float], str] = {}


def file_sha256(path: str | os.PathLike) -> str:
    """SHA-256 of a file (cached by path, size and mtime): the checkpoint hash in provenance."""
    p = Path(path).resolve()
    st = p.stat()
    key = (str(p), st.st_size, st.st_mtime)
    if key not in _HASH_CACHE:
        h = hashlib.sha256()
        with open(p, "rb") as fh:
            for block in iter(lambda: fh.read(1 << 20), b""):
                h.update(block)
        _HASH_CACHE[key] = h.hexdigest()
    return _HASH_CACHE[key]
