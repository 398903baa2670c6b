"""The reference-features file of ``jemeval fidelity --ref-cache FILE.npz``.

Computing InceptionV3/VGG16 features over 50,000 reference images is the expensive part of FID; this
file keeps them between runs. It holds float arrays and a JSON string and is read with
``allow_pickle=False`` (torch-fidelity's own cache unpickles, so it is never used). A file made from
other reference images (their identity: the SHA-256 of the pixels, computed by the caller) or other
weights is refused with one line, never replaced. Each extractor's entry stores the SHA-256 of
its arrays, checked on every read: arrays changed after jemeval wrote them (or written by a version
that stored no hash) are computed again with a note and the file is rewritten, never used. Written
atomically; kept out of :mod:`jemeval.evaluation` because evaluation computes and returns data and
writes no file itself.
"""
from __future__ import annotations

import hashlib
import json
import os
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import torch

from jemeval.atomic import write_atomic
from jemeval.errors import UsageError

CACHE_FORMAT = "jemeval-reference-features"


class ReferenceCache:
    """The reference features of one reference set in a ``.npz`` file (see the module docstring)."""

    def __init__(self, path: str | os.PathLike, identity: dict[str, Any], info: dict | None) -> None:
        self.path = Path(path)
        if self.path.suffix.lower() != ".npz":
            raise UsageError(f"ref_cache must be a .npz file, got {str(self.path)!r}", param="ref_cache")
        self.identity = identity
        self.info = info or {}
        self.meta, self.arrays = self._read()
        self.hits: list[str] = []
        self.notes: list[str] = []
        self.written = False

    def _read(self) -> tuple[dict[str, Any], dict[str, np.ndarray]]:
        if not self.path.exists():
            return {"format": CACHE_FORMAT, "version": 1, "reference": {**self.identity, "info": self.info},
                    "extractors": {}}, {}
        try:
            with np.load(self.path, allow_pickle=False) as data:
                arrays = {k: data[k] for k in data.files}
            meta = json.loads(str(arrays.pop("meta")))
        except Exception as exc:  # noqa: BLE001 - not an npz, no meta, damaged: one line
            raise UsageError(f"ref_cache {str(self.path)!r} is not a reference-features file written by jemeval "
                             f"({type(exc).__name__}); give another file or delete it", param="ref_cache") from None
        if not isinstance(meta, dict) or meta.get("format") != CACHE_FORMAT or not isinstance(
                meta.get("extractors"), dict) or not isinstance(meta.get("reference", {}), dict):
            raise UsageError(f"ref_cache {str(self.path)!r} is not a reference-features file written by jemeval",
                             param="ref_cache")
        held = {k: meta.get("reference", {}).get(k) for k in self.identity}
        if held != self.identity:
            raise UsageError(f"ref_cache {str(self.path)!r} holds the features of other reference images "
                             f"({meta.get('reference', {}).get('info') or held}); give another file or delete it",
                             param="ref_cache")
        return meta, arrays

    def features(self, name: str, weights: dict[str, Any], layers: list[str],
                 compute: Callable[[], dict[str, torch.Tensor]]) -> dict[str, torch.Tensor]:
        """The reference features of ``layers`` from the file, or computed now and added to it."""
        entry = self.meta["extractors"].get(name)
        if entry is not None and not isinstance(entry, dict):
            entry = self._damaged(name)
        if entry is not None and entry.get("weights_sha256") != weights["sha256"]:
            raise UsageError(f"ref_cache {str(self.path)!r} holds {name} features of other weights (sha256 "
                             f"{str(entry.get('weights_sha256'))[:12]}...); give another file or delete it",
                             param="ref_cache")
        if entry is not None and not self._intact(name, entry):
            entry = None  # computed again (every layer) and the entry replaced
        if entry is not None and set(layers) <= set(entry["layers"]):
            self.hits.append(name)
            return {layer: torch.from_numpy(self.arrays[f"{name}/{layer}"]) for layer in layers}
        computed = compute()
        kept = sorted(set(computed) | set(entry["layers"] if entry else []))
        for layer, value in computed.items():
            self.arrays[f"{name}/{layer}"] = value.numpy()
        self.meta["extractors"][name] = {"weights_sha256": weights["sha256"], "layers": kept,
                                         "arrays_sha256": {layer: array_sha256(self.arrays[f"{name}/{layer}"])
                                                           for layer in kept}}
        self._write()
        return {layer: computed[layer] for layer in layers}

    def _intact(self, name: str, entry: dict[str, Any]) -> bool:
        """Whether every array of ``name`` is the one jemeval wrote (its stored SHA-256); else a note."""
        hashes = entry.get("arrays_sha256")
        layers = entry.get("layers")
        if (isinstance(hashes, dict) and isinstance(layers, list)
                and all(f"{name}/{layer}" in self.arrays and hashes.get(layer) == array_sha256(
                    self.arrays[f"{name}/{layer}"]) for layer in layers)):
            return True
        return self._damaged(name) is not None

    def _damaged(self, name: str) -> None:
        """Note (and warn) that the entry of ``name`` is not what jemeval wrote; drop its arrays."""
        note = f"ref_cache {str(self.path)!r}: the {name} features did not match their checksum; recomputed"
        warnings.warn(note, stacklevel=4)
        self.notes.append(note)
        self.arrays = {k: v for k, v in self.arrays.items() if not k.startswith(f"{name}/")}
        return None

    def _write(self) -> None:
        meta = np.array(json.dumps(self.meta, sort_keys=True))

        def save(tmp: Path) -> None:
            with open(tmp, "wb") as fh:  # a file object: np.savez would append .npz to a path
                np.savez(fh, meta=meta, **self.arrays)

        write_atomic(self.path, save)
        self.written = True

    def describe(self) -> dict[str, Any]:
        return {"path": str(self.path), "used": self.hits, "written": self.written, **self.identity,
                **({"recomputed": self.notes} if self.notes else {})}


def array_sha256(array: np.ndarray) -> str:
    """SHA-256 of an array's dtype, shape and bytes."""
    a = np.ascontiguousarray(array)
    h = hashlib.sha256(f"{a.dtype.str}{a.shape}".encode())
    h.update(a.tobytes())
    return h.hexdigest()


__all__ = ["CACHE_FORMAT", "ReferenceCache", "array_sha256"]
