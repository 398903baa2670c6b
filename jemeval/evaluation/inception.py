"""IS / FID / KID through torch-fidelity, with Inception weights jemeval verifies and never downloads.

torch-fidelity (``pip install 'jemeval[fidelity]'``) computes the Inception Score, FID and KID with
its TF1-compatible InceptionV3. The weights file is given (``inception_weights``, or
``$JEMEVAL_INCEPTION_WEIGHTS``); it is read once, loaded with ``weights_only=True`` and checked, so a
wrong or unsafe file is one clear error, and the library gets an in-memory copy of those verified
tensors, never the path (it would re-open the file with full pickle, and the file could have been
swapped in the meantime). Images are mapped from [-1, 1] to uint8 RGB (gray channels repeated) and
resized to 299 x 299 by the library; on 8 x 8 digits these numbers say little, which is noted.
"""
from __future__ import annotations

import hashlib
import io
import os
from collections import OrderedDict
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch
from torch.utils.data import Dataset

from jemeval.errors import CheckpointError, JemevalError, UsageError

INCEPTION_FILE = "weights-inception-2015-12-05-6726825d.pth"
INCEPTION_URL = f"https://github.com/toshas/torch-fidelity/releases/download/v0.2.0/{INCEPTION_FILE}"
INCEPTION_SHA256_PREFIX = "6726825d"  # torch.hub convention: the file name carries its hash prefix
WEIGHTS_ENV = "JEMEVAL_INCEPTION_WEIGHTS"
INCEPTION_METRICS = ("is", "fid", "kid")
_INCEPTION_KEYS = {"Conv2d_1a_3x3.conv.weight": (32, 3, 3, 3), "fc.weight": (1008, 2048)}


def missing_weights_message() -> str:
    return (f"IS/FID/KID need torch-fidelity's InceptionV3 weights, which jemeval never downloads: get "
            f"{INCEPTION_FILE} ({INCEPTION_URL}, or ~/.cache/torch/hub/checkpoints/ where torch-fidelity has run) "
            f"and give it as inception_weights (or set {WEIGHTS_ENV}); a Frechet distance in a checkpoint's "
            "feature space (metric fd) needs no Inception weights")


def require_torch_fidelity():
    try:
        import torch_fidelity
    except ImportError:
        raise JemevalError("IS/FID/KID need torch-fidelity: pip install 'jemeval[fidelity]' (or pip install "
                           "torch-fidelity); a Frechet distance in a checkpoint's feature space (metric fd) works "
                           "without it") from None
    return torch_fidelity


#: the last weights file validated in this process, by (path, size, mtime): its identity and the
#: tensors read from it. Only these tensors ever reach torch-fidelity; the file is not opened again.
_VERIFIED: dict[tuple[str, int, float], tuple[dict[str, Any], dict[str, torch.Tensor]]] = {}


def check_inception_weights(path: str | os.PathLike | None) -> dict[str, Any]:
    """Read an Inception weights file once, validate it, and keep its tensors; returns its identity.

    The bytes are read into memory once, hashed, and loaded with ``weights_only=True``; what
    torch-fidelity later gets is an in-memory copy of these verified tensors
    (:func:`verified_weights`), never the user's path. torch-fidelity itself loads with
    ``weights_only=False``, so a file swapped after this check (same size and mtime) must not be
    what it opens.
    """
    if not path:
        raise UsageError(missing_weights_message(), param="inception_weights")
    p = Path(path).expanduser()
    if not p.is_file():
        raise UsageError(f"inception_weights {str(p)!r} does not exist; " + missing_weights_message().split(": ", 1)[1],
                         param="inception_weights")
    stat = p.stat()
    key = (str(p.resolve()), stat.st_size, stat.st_mtime)
    if key in _VERIFIED:  # the CLI checks before sampling; fidelity() must not reload ~95 MB
        return dict(_VERIFIED[key][0])
    data = p.read_bytes()
    try:
        state = torch.load(io.BytesIO(data), map_location="cpu", weights_only=True)
    except Exception as exc:  # noqa: BLE001 - torch.load fails in many ways; each becomes one line
        first = ": ".join(filter(None, [type(exc).__name__, (str(exc).strip().splitlines() or [""])[0][:160]]))
        raise CheckpointError(f"Inception weights file {str(p)!r} is not a tensor-only PyTorch weights file ({first}); "
                              f"expected torch-fidelity's {INCEPTION_FILE}") from None
    problems = [k for k, shape in _INCEPTION_KEYS.items()
                if not (isinstance(state, dict) and torch.is_tensor(state.get(k)) and tuple(state[k].shape) == shape)]
    if problems:
        shape = list(_INCEPTION_KEYS[problems[0]])
        raise CheckpointError(f"Inception weights file {str(p)!r} is not torch-fidelity's InceptionV3 (no "
                              f"{problems[0]!r} of shape {shape}); expected {INCEPTION_FILE}")
    sha = hashlib.sha256(data).hexdigest()
    identity = {"path": str(p), "sha256": sha, "is_release_file": sha.startswith(INCEPTION_SHA256_PREFIX)}
    tensors = OrderedDict((k, v) for k, v in state.items() if isinstance(k, str) and torch.is_tensor(v))
    if isinstance(getattr(state, "_metadata", None), dict):  # module versions: load_state_dict reads them
        tensors._metadata = state._metadata
    _VERIFIED.clear()  # one ~95 MB state at a time
    _VERIFIED[key] = (identity, tensors)
    return dict(identity)


def verified_weights(weights: dict[str, Any]) -> io.BytesIO:
    """An in-memory file of the tensors :func:`check_inception_weights` verified for ``weights``.

    Written by ``torch.save`` from plain tensors here, so torch-fidelity's ``torch.load(...,
    weights_only=False)`` unpickles only what jemeval wrote: nothing on disk can be swapped in.
    """
    state = next((tensors for identity, tensors in _VERIFIED.values() if identity["sha256"] == weights.get("sha256")),
                 None)
    if state is None:  # identity from an earlier check whose tensors were dropped: verify again
        again = check_inception_weights(weights.get("path"))
        if again["sha256"] != weights.get("sha256"):
            raise CheckpointError(f"Inception weights file {weights.get('path')!r} changed since it was checked "
                                  f"(sha256 {str(weights.get('sha256'))[:12]}... -> {again['sha256'][:12]}...); "
                                  "run again")
        return verified_weights(again)
    buffer = io.BytesIO()
    torch.save(state, buffer)
    buffer.seek(0)
    return buffer


def to_uint8_rgb(x: torch.Tensor) -> torch.Tensor:
    """[-1, 1] images -> uint8 RGB (gray repeated to 3 channels), what torch-fidelity expects."""
    u8 = ((x.float().clamp(-1, 1) + 1) * 127.5).round().to(torch.uint8)
    if u8.shape[1] == 1:
        u8 = u8.expand(-1, 3, -1, -1)
    if u8.shape[1] != 3:
        raise UsageError(f"IS/FID/KID need 1- or 3-channel images, got {u8.shape[1]} channels")
    return u8.contiguous()


class Uint8Images(Dataset):
    """An in-memory uint8 image tensor as the Dataset torch-fidelity reads (no files, no cache)."""

    def __init__(self, x: torch.Tensor):
        self.x = to_uint8_rgb(x)

    def __len__(self) -> int:
        return len(self.x)

    def __getitem__(self, i: int) -> torch.Tensor:
        return self.x[i]


def inception_metrics(samples: torch.Tensor, reference: torch.Tensor | None, weights: dict[str, Any], *,
                      metrics: Sequence[str] = INCEPTION_METRICS, batch_size: int = 64,
                      device: torch.device | str = "cpu", seed: int = 0, isc_splits: int = 10,
                      kid_subset_size: int = 1000) -> tuple[dict[str, tuple[float, float | None]], dict[str, Any]]:
    """{metric: (value, std or None)} and the library settings used, via torch_fidelity.calculate_metrics.

    Nothing is cached, nothing is downloaded: inputs are in-memory Datasets and the weights file
    is given (checked by :func:`check_inception_weights`).
    """
    tf = require_torch_fidelity()
    binary = [m for m in metrics if m in ("fid", "kid")]
    n1, n2 = len(samples), (len(reference) if reference is not None else None)
    if n1 < 2 or (binary and (n2 or 0) < 2):
        raise UsageError("IS/FID/KID need at least 2 samples and 2 reference images")
    opts = {
        "feature_extractor": "inception-v3-compat",
        "isc": "is" in metrics, "fid": "fid" in metrics, "kid": "kid" in metrics,
        "isc_splits": max(1, min(isc_splits, n1)), "kid_subset_size": min(kid_subset_size, n1, n2 or n1),
        "batch_size": batch_size, "rng_seed": seed,
    }
    try:
        out = tf.calculate_metrics(
            input1=Uint8Images(samples), input2=Uint8Images(reference) if binary else None,
            cuda=torch.device(device).type == "cuda", cache=False, verbose=False, save_cpu_ram=True,
            datasets_download=False, feature_extractor_weights_path=verified_weights(weights), **opts,
        )
    except RuntimeError as exc:  # e.g. load_state_dict: keys or shapes not InceptionV3's
        lines = [ln.strip() for ln in str(exc).splitlines() if ln.strip()] or [type(exc).__name__]
        detail = next((ln for ln in lines if ln.startswith(("Missing key", "Unexpected key", "size mismatch"))),
                      lines[0])
        detail = detail[:160] + ("..." if len(detail) > 160 else "")
        raise CheckpointError(f"torch-fidelity could not use the Inception weights {weights['path']!r} "
                              f"({detail}); expected {INCEPTION_FILE}") from None
    except ValueError as exc:  # torch-fidelity's argument checks
        raise UsageError(f"torch-fidelity rejected the settings: {str(exc).splitlines()[0][:200]}") from None
    values = {
        "is": (out.get("inception_score_mean"), out.get("inception_score_std")),
        "fid": (out.get("frechet_inception_distance"), None),
        "kid": (out.get("kernel_inception_distance_mean"), out.get("kernel_inception_distance_std")),
    }
    return {m: values[m] for m in metrics}, {**opts, "torch_fidelity_version": getattr(tf, "__version__", None)}


def inception_notes(x: torch.Tensor, weights: dict[str, Any]) -> list[str]:
    """What to keep in mind when reading IS/FID/KID of these samples with these weights."""
    notes = []
    if min(x.shape[2:]) < 32:
        notes.append(f"Inception metrics on {x.shape[2]}x{x.shape[3]} images upsampled to 299x299 say little; "
                     "compare the 'fd' values of a model trained on these images")
    if not weights["is_release_file"]:
        notes.append("the Inception weights are not torch-fidelity's release file (sha256 differs): "
                     "IS/FID/KID are not comparable with published numbers")
    return notes
