"""torch-fidelity's feature extractors with weights jemeval verifies and never downloads.

torch-fidelity (``pip install 'jemeval[fidelity]'``) computes the Inception Score, FID, KID and
precision/recall with its TF1-compatible InceptionV3 or with VGG16. Their weights files are given
(``inception_weights`` / ``$JEMEVAL_INCEPTION_WEIGHTS``, ``vgg16_weights`` / ``$JEMEVAL_VGG16_WEIGHTS``);
each is read once, loaded with ``weights_only=True`` and checked (:func:`check_extractor_weights`),
so a wrong or unsafe file is one clear error, and the library gets an in-memory copy of those
verified tensors, never the path (it would re-open the file with full pickle, and the file could
have been swapped in the meantime). Extractors whose weights are code (CLIP's TorchScript, DINOv2
from torch.hub) are refused. Images are mapped from [-1, 1] to uint8 RGB (gray channels repeated)
and resized by the library (299 x 299 for Inception, 224 x 224 for VGG16); on 8 x 8 digits these
numbers say little, which is noted. The metrics themselves: :mod:`jemeval.evaluation.fidelity.extractors`.
"""
from __future__ import annotations

import contextlib
import hashlib
import io
import os
from collections import OrderedDict
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch.utils.data import Dataset

from jemeval.errors import CheckpointError, JemevalError, UsageError, did_you_mean

INCEPTION_FILE = "weights-inception-2015-12-05-6726825d.pth"
INCEPTION_URL = f"https://github.com/toshas/torch-fidelity/releases/download/v0.2.0/{INCEPTION_FILE}"
INCEPTION_SHA256_PREFIX = "6726825d"  # torch.hub convention: the file name carries its hash prefix
WEIGHTS_ENV = "JEMEVAL_INCEPTION_WEIGHTS"
INCEPTION = "inception-v3-compat"
INCEPTION_METRICS = ("is", "fid", "kid")


@dataclass(frozen=True)
class Extractor:
    """A torch-fidelity feature extractor jemeval can feed verified weights to."""

    name: str
    title: str  # how messages name the network
    needs: str  # what needs its weights, in messages
    file: str  # the release file's name
    url: str
    sha256_prefix: str
    keys: dict[str, tuple[int, ...]]  # tensors a genuine file has, with their shapes
    param: str  # the parameter that names the weights file
    env: str


EXTRACTORS = {e.name: e for e in (
    Extractor(INCEPTION, "InceptionV3", "IS/FID/KID", INCEPTION_FILE, INCEPTION_URL, INCEPTION_SHA256_PREFIX,
              {"Conv2d_1a_3x3.conv.weight": (32, 3, 3, 3), "fc.weight": (1008, 2048)}, "inception_weights",
              WEIGHTS_ENV),
    Extractor("vgg16", "VGG16", "precision/recall (and FID/KID on VGG16 features)", "vgg16-397923af.pth",
              "https://download.pytorch.org/models/vgg16-397923af.pth", "397923af",
              {"features.0.weight": (64, 3, 3, 3), "classifier.6.weight": (1000, 4096)}, "vgg16_weights",
              "JEMEVAL_VGG16_WEIGHTS"),
)}
#: torch-fidelity extractors whose weights are code, never loaded by jemeval
CODE_EXTRACTORS = ("clip-", "dinov2-")


def extractor(name: str) -> Extractor:
    """The extractor ``name`` (one-line errors for a refused or unknown one)."""
    if name in EXTRACTORS:
        return EXTRACTORS[name]
    if name.startswith(CODE_EXTRACTORS):
        raise UsageError(f"feature extractor {name!r} loads its weights as code (TorchScript or torch.hub), which "
                         f"jemeval never runs; choose {' or '.join(EXTRACTORS)}", param="feature_extractor")
    raise UsageError(f"unknown feature extractor {name!r}{did_you_mean(name, EXTRACTORS)}; choose "
                     f"{' or '.join(EXTRACTORS)}", param="feature_extractor")


def missing_weights_message(name: str = INCEPTION) -> str:
    e = extractor(name)
    return (f"{e.needs} need torch-fidelity's {e.title} weights, which jemeval never downloads: get "
            f"{e.file} ({e.url}, or ~/.cache/torch/hub/checkpoints/ where torch-fidelity has run) and give it as "
            f"{e.param} (or set {e.env}); a Frechet distance in a checkpoint's feature space (metric fd) needs no "
            "such weights")


def require_torch_fidelity():
    try:
        import torch_fidelity
    except ImportError:
        raise JemevalError("IS/FID/KID/precision/recall need torch-fidelity: pip install 'jemeval[fidelity]' (or "
                           "pip install torch-fidelity); a Frechet distance in a checkpoint's feature space (metric "
                           "fd) works without it") from None
    return torch_fidelity


#: the last weights file validated per extractor, by (extractor, path, size, mtime): its identity and
#: the tensors read from it. Only these tensors ever reach torch-fidelity; the file is not opened again.
#: A process-wide side effect, kept only while the run's cache policy has ``memory`` (:func:`weights_kept`).
_VERIFIED: dict[tuple[str, str, int, float], tuple[dict[str, Any], dict[str, torch.Tensor]]] = {}


def check_inception_weights(path: str | os.PathLike | None) -> dict[str, Any]:
    """:func:`check_extractor_weights` for torch-fidelity's InceptionV3."""
    return check_extractor_weights(path, INCEPTION)


def check_extractor_weights(path: str | os.PathLike | None, name: str = INCEPTION) -> dict[str, Any]:
    """Read an extractor's weights file once, validate it, and keep its tensors; returns its identity
    (``path``, ``sha256``, ``is_release_file``, ``extractor``).

    The bytes are read into memory once, hashed, and loaded with ``weights_only=True``; what
    torch-fidelity later gets is an in-memory copy of these verified tensors
    (:func:`verified_weights`), never the user's path. torch-fidelity itself loads with
    ``weights_only=False``, so a file swapped after this check (same size and mtime) must not be
    what it opens.
    """
    e = extractor(name)
    if not path:
        raise UsageError(missing_weights_message(name), param=e.param)
    p = Path(path).expanduser()
    if not p.is_file():
        raise UsageError(f"{e.param} {str(p)!r} does not exist; " + missing_weights_message(name).split(": ", 1)[1],
                         param=e.param)
    stat = p.stat()
    key = (e.name, str(p.resolve()), stat.st_size, stat.st_mtime)
    if key in _VERIFIED:  # the CLI checks before sampling; fidelity() must not reload ~95 MB
        return dict(_VERIFIED[key][0])
    data = p.read_bytes()
    try:
        state = torch.load(io.BytesIO(data), map_location="cpu", weights_only=True)
    except Exception as exc:  # noqa: BLE001 - torch.load fails in many ways; each becomes one line
        first = ": ".join(filter(None, [type(exc).__name__, (str(exc).strip().splitlines() or [""])[0][:160]]))
        raise CheckpointError(f"{e.title} weights file {str(p)!r} is not a tensor-only PyTorch weights file "
                              f"({first}); expected {e.file}") from None
    problems = [k for k, shape in e.keys.items()
                if not (isinstance(state, dict) and torch.is_tensor(state.get(k)) and tuple(state[k].shape) == shape)]
    if problems:
        shape = list(e.keys[problems[0]])
        raise CheckpointError(f"{e.title} weights file {str(p)!r} is not torch-fidelity's {e.title} (no "
                              f"{problems[0]!r} of shape {shape}); expected {e.file}")
    sha = hashlib.sha256(data).hexdigest()
    identity = {"path": str(p), "sha256": sha, "is_release_file": sha.startswith(e.sha256_prefix),
                "extractor": e.name}
    tensors = OrderedDict((k, v) for k, v in state.items() if isinstance(k, str) and torch.is_tensor(v))
    if isinstance(getattr(state, "_metadata", None), dict):  # module versions: load_state_dict reads them
        tensors._metadata = state._metadata
    for old in [k for k in _VERIFIED if k[0] == e.name]:  # one state per extractor at a time (~95-530 MB)
        del _VERIFIED[old]
    _VERIFIED[key] = (identity, tensors)
    return dict(identity)


def forget_verified_weights() -> None:
    """Drop every verified weights file kept in this process (the next check reads its file again)."""
    _VERIFIED.clear()


@contextlib.contextmanager
def weights_kept(memory: bool) -> Iterator[None]:
    """Run a block; with ``memory`` False (the run's :class:`~jemeval.context.CachePolicy`), the
    verified weights it read are not kept in this process afterwards, even when it fails."""
    try:
        yield
    finally:
        if not memory:
            forget_verified_weights()


def verified_weights(weights: dict[str, Any]) -> io.BytesIO:
    """An in-memory file of the tensors :func:`check_extractor_weights` verified for ``weights``.

    Written by ``torch.save`` from plain tensors here, so torch-fidelity's ``torch.load(...,
    weights_only=False)`` unpickles only what jemeval wrote: nothing on disk can be swapped in.
    """
    name = weights.get("extractor", INCEPTION)
    state = next((tensors for identity, tensors in _VERIFIED.values() if identity["sha256"] == weights.get("sha256")
                  and identity["extractor"] == name), None)
    if state is None:  # identity from an earlier check whose tensors were dropped: verify again
        again = check_extractor_weights(weights.get("path"), name)
        if again["sha256"] != weights.get("sha256"):
            raise CheckpointError(f"{name} weights file {weights.get('path')!r} changed since it was checked "
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


def inception_notes(x: torch.Tensor, weights: dict[str, Any]) -> list[str]:
    """What to keep in mind when reading these metrics of these samples with these weights."""
    notes = []
    name = weights.get("extractor", INCEPTION)
    if min(x.shape[2:]) < 32:
        notes.append(f"{extractor(name).title} metrics on {x.shape[2]}x{x.shape[3]} images upsampled to the "
                     "network's input say little; compare the 'fd' values of a model trained on these images")
    if not weights["is_release_file"]:
        notes.append(f"the {extractor(name).title} weights are not torch-fidelity's release file "
                     f"{extractor(name).file} (sha256 differs): the values are not comparable with published numbers")
    return notes
