"""safetensors: the weights of a jemeval model in the format model hubs share, with a JSON header.

``jemeval export MODEL.pt --format safetensors --out model.safetensors`` (:func:`export_safetensors`)
writes the network's ``state_dict`` tensors (the names of ``model.net.state_dict()``) and one
metadata entry, ``"jemeval"``: a JSON object with everything needed to rebuild the model::

    {"format": "jemeval-safetensors", "format_version": 1,
     "arch": "cnn", "arch_options": {"width": 32}, "num_classes": 10, "classes": null | ["0", ...],
     "input_shape": [1, 8, 8], "normalization": null | {"mean": [...], "std": [...]},
     "dataset": "digits" | null, "config": {...the training config...}, "provenance": {...}}

:func:`jemeval.load_model` reads such a file back (:func:`read_safetensors` turns it into the dict
of a jemeval checkpoint, so the same checks apply: the architecture must be registered, its options
pass :func:`jemeval.formats.load.checkpoint_arch_options`' allow-list, every field is checked against
the architecture by :func:`jemeval.formats.load.check_checkpoint_fields` and
:func:`jemeval.formats.load.build_for_state` (tensor dtypes, sizes), weights must be finite and
match). Reading never runs code: safetensors holds raw tensors and the header is JSON.
"""
from __future__ import annotations

import json
import os
import struct
from pathlib import Path
from typing import Any

import torch

from jemeval.atomic import atomic_path
from jemeval.energy.model import EnergyModel
from jemeval.errors import CheckpointError, UsageError
from jemeval.formats.native import FORMAT as NATIVE_FORMAT
from jemeval.formats.native import FORMAT_VERSION as NATIVE_VERSION
from jemeval.results import _plain as plain_data

FORMAT = "jemeval-safetensors"
FORMAT_VERSION = 1
HEADER_KEY = "jemeval"
SUFFIX = ".safetensors"
#: the header's fields and their JSON types (a file with a field of another type is refused)
_FIELDS = {"arch": (str,), "arch_options": (dict,), "num_classes": (int,), "input_shape": (list,),
           "normalization": (dict, type(None)), "dataset": (str, type(None)), "classes": (list, type(None)),
           "config": (dict, type(None)), "provenance": (dict, type(None))}
_REQUIRED = ("arch", "num_classes", "input_shape")


def _require_safetensors():
    try:
        import safetensors.torch as st
    except ImportError:  # pragma: no cover - a dependency of jemeval (and of timm)
        raise CheckpointError("safetensors files need the safetensors package: pip install safetensors") from None
    return st


def safetensors_header(model: EnergyModel, *, classes: list[str] | None = None,
                       provenance: dict | None = None) -> dict[str, Any]:
    """The ``"jemeval"`` header of ``model``: what :func:`read_safetensors` needs to rebuild it.
    ``classes`` default to the names the model records (timm's and torchvision's ImageNet names)."""
    meta = model.metadata or {}
    classes = classes if classes is not None else meta.get("classes")
    if classes is not None and len(classes) != model.num_classes:
        raise UsageError(f"classes gives {len(classes)} names, one per class is needed: the model has "
                         f"{model.num_classes} outputs",
                         param="classes")
    return plain_data({
        "format": FORMAT, "format_version": FORMAT_VERSION, "arch": model.arch,
        "arch_options": dict(model.arch_options), "num_classes": int(model.num_classes),
        "classes": None if classes is None else [str(c) for c in classes],
        "input_shape": [int(v) for v in model.input_shape], "normalization": model.normalization,
        "dataset": meta.get("dataset"), "config": meta.get("config") or None, "provenance": provenance,
    })


def save_safetensors(path: str | os.PathLike, model: EnergyModel, *, classes: list[str] | None = None,
                     provenance: dict | None = None) -> Path:
    """Write ``model``'s weights and header to ``path`` atomically (temp file + rename)."""
    st = _require_safetensors()
    header = safetensors_header(model, classes=classes, provenance=provenance)
    # safetensors refuses tensors that share memory (tied weights): each gets its own copy
    tensors = {k: v.detach().cpu().contiguous().clone() for k, v in model.net.state_dict().items()}
    with atomic_path(path) as tmp:
        st.save_file(tensors, str(tmp), metadata={HEADER_KEY: json.dumps(header, sort_keys=True)})
    return Path(path)


def is_safetensors(path: str | os.PathLike) -> bool:
    """Whether ``path`` is a safetensors file: by its suffix, or by its first bytes (an 8-byte
    little-endian header length, then the JSON header's ``{``; torch files start with ``PK`` or a
    pickle opcode)."""
    p = Path(path)
    if p.suffix.lower() == SUFFIX:
        return True
    try:
        with open(p, "rb") as fh:
            start = fh.read(9)
    except OSError:
        return False
    return len(start) == 9 and 1 < struct.unpack("<Q", start[:8])[0] < 100_000_000 and start[8:9] == b"{"


def read_header(path: str | os.PathLike) -> dict[str, Any]:
    """The validated ``"jemeval"`` header of a safetensors file (one-line errors for every problem)."""
    st = _require_safetensors()
    p = Path(path)
    if not p.is_file():
        raise CheckpointError(f"safetensors file {str(p)!r} does not exist")
    try:
        with st.safe_open(str(p), framework="pt") as fh:
            metadata = fh.metadata() or {}
    except Exception as exc:  # noqa: BLE001 - SafetensorError, OSError, ...: one line
        detail = (str(exc).strip().splitlines() or [type(exc).__name__])[0][:160]
        raise CheckpointError(f"{str(p)!r} is not a readable safetensors file ({detail})") from None
    if HEADER_KEY not in metadata:
        raise CheckpointError(f"{str(p)!r} holds weights without jemeval's header (no {HEADER_KEY!r} metadata), so "
                              "the architecture is unknown; export the checkpoint with `jemeval export`, or build "
                              "the model yourself and load the tensors with safetensors.torch.load_file")
    try:
        header = json.loads(metadata[HEADER_KEY])
    except json.JSONDecodeError as exc:
        raise CheckpointError(f"{str(p)!r} has a damaged jemeval header (not JSON: {exc.msg} at character "
                              f"{exc.pos})") from None
    return _check_header(header, str(p))


def _check_header(header: Any, path: str) -> dict[str, Any]:
    if not isinstance(header, dict) or header.get("format") != FORMAT:
        raise CheckpointError(f"{path!r} has a jemeval header of another kind (format "
                              f"{header.get('format') if isinstance(header, dict) else type(header).__name__!r}, "
                              f"expected {FORMAT!r})")
    version = header.get("format_version")
    if not isinstance(version, int) or version > FORMAT_VERSION:
        raise CheckpointError(f"{path!r} was written by a newer jemeval (header format_version {version!r}); "
                              "upgrade jemeval")
    for key in _REQUIRED:
        if key not in header:
            raise CheckpointError(f"{path!r} has a damaged jemeval header (no {key!r})")
    for key, kinds in _FIELDS.items():
        if key in header and (not isinstance(header[key], kinds) or isinstance(header[key], bool)):
            raise CheckpointError(f"{path!r} has a damaged jemeval header ({key!r} is a "
                                  f"{type(header[key]).__name__})")
    # the values (num_classes, input_shape, normalization, classes, tensor dtypes against the architecture)
    # are checked by load_model for a .pt and a .safetensors file alike: jemeval.formats.load.model_from_checkpoint
    return header


def read_safetensors(path: str | os.PathLike) -> dict[str, Any]:
    """A safetensors file as the dict of a jemeval checkpoint (weights on the CPU, no training state),
    for :func:`jemeval.formats.load.model_from_checkpoint`."""
    st = _require_safetensors()
    header = read_header(path)
    try:
        state = st.load_file(str(path), device="cpu")
    except Exception as exc:  # noqa: BLE001 - a truncated or damaged tensor section
        detail = (str(exc).strip().splitlines() or [type(exc).__name__])[0][:160]
        raise CheckpointError(f"{str(path)!r} is not a readable safetensors file ({detail})") from None
    return {
        "format": NATIVE_FORMAT, "format_version": NATIVE_VERSION, "arch": header["arch"],
        "arch_options": header.get("arch_options") or {}, "num_classes": header["num_classes"],
        "input_shape": header["input_shape"], "normalization": header.get("normalization"),
        "dataset": header.get("dataset"), "state_dict": state, "replay_buffer": None, "training_state": None,
        "config": header.get("config") or {}, "provenance": header.get("provenance") or {},
        "classes": header.get("classes"),
    }


def export_safetensors(model: EnergyModel, out: str | os.PathLike, *, classes: list[str] | None = None,
                       provenance: dict | None = None) -> dict[str, Any]:
    """Write ``model`` as ``out`` (.safetensors) and return the export record (what was written)."""
    out = Path(out)
    if out.suffix.lower() != SUFFIX:
        raise UsageError(f"out must be a {SUFFIX} file, got {str(out)!r}", param="out")
    save_safetensors(out, model, classes=classes, provenance=provenance)
    n_params = sum(int(t.numel()) for t in model.net.state_dict().values() if torch.is_tensor(t))
    return {"output": str(out), "format": "safetensors", "arch": model.arch, "arch_options": model.arch_options,
            "num_classes": model.num_classes, "input_shape": list(model.input_shape),
            "dataset": (model.metadata or {}).get("dataset"), "tensors": len(model.net.state_dict()),
            "parameters": n_params, "bytes": out.stat().st_size}
