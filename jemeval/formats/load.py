"""Loading a model from any checkpoint jemeval reads: its own format or a known foreign layout.

``load_model(path)`` reads the file safely (:func:`jemeval.formats.native.read_checkpoint`, or
:func:`jemeval.formats.safetensors.read_safetensors` for a ``.safetensors`` export), builds
the architecture the file names (jemeval's format, its options allow-listed) or a registered layout
recognises in it (:mod:`jemeval.formats.foreign`), loads the weights and records the file's SHA-256
for provenance.
"""
from __future__ import annotations

import os
import re
from typing import Any

import torch

from jemeval.energy.factory import create_model
from jemeval.energy.model import EnergyModel
from jemeval.errors import CheckpointError, UnknownNameError, UsageError
from jemeval.formats.foreign import foreign_model, identify_foreign, unknown_layout_error
from jemeval.formats.native import FORMAT, FORMAT_VERSION, is_jemeval_checkpoint, load_state, read_checkpoint
from jemeval.formats.safetensors import FORMAT as SAFETENSORS_FORMAT
from jemeval.formats.safetensors import is_safetensors, read_safetensors
from jemeval.plugins import get_registry
from jemeval.provenance import file_sha256
from jemeval.registry import accepted_options
from jemeval.runtime.devices import resolve_device

#: fields a jemeval checkpoint must have, and their types (a damaged file fails on the first wrong one)
_REQUIRED = {"arch": str, "num_classes": int, "input_shape": (list, tuple), "state_dict": dict}


#: option names that can make a factory open a file or fetch something (timm's checkpoint_path,
#: pretrained_cfg, ...): never taken from a checkpoint by a factory that accepts any keyword
_PATHLIKE_OPTION = re.compile(r"path|file|dir|url|cfg|cache|hub|pretrained|checkpoint|ckpt|weights", re.IGNORECASE)
_PLAIN = (bool, int, float, str, type(None))


def _check_fields(obj: dict, path: str) -> None:
    for key, kind in _REQUIRED.items():
        if key not in obj:
            raise CheckpointError(f"{path!r} is a damaged jemeval checkpoint (no {key!r}); re-save it with "
                                  "`jemeval train` or jemeval.save_checkpoint")
        if not isinstance(obj[key], kind):
            raise CheckpointError(f"{path!r} is a damaged jemeval checkpoint ({key!r} is a {type(obj[key]).__name__})")
    if not isinstance(obj.get("arch_options", {}), dict):
        raise CheckpointError(f"{path!r} is a damaged jemeval checkpoint ('arch_options' is not a dict)")


def checkpoint_arch_options(arch: str, options: dict, path: str) -> dict:
    """The ``arch_options`` of a checkpoint that may reach the model factory (an allow-list).

    A factory with a fixed signature (wrn, cnn, most plugins) takes only its own options. No factory,
    least of all one that accepts any keyword (``timm``, which forwards them to ``timm.create_model``),
    gets an option whose name is path-like (``checkpoint_path``, ``pretrained_cfg``, ...) with a
    value, nor a value that is not plain data: a tensor-only file must not make a library open another.
    """
    try:
        accepted = accepted_options(get_registry().get("model", arch), skip=2)
    except UnknownNameError as exc:
        raise CheckpointError(f"{path!r} needs model architecture {arch!r}, which no installed plugin provides; "
                              f"install the plugin that registers it ({exc})") from None
    for key, value in options.items():
        plain = isinstance(value, _PLAIN) or (
            isinstance(value, (list, tuple)) and all(isinstance(v, _PLAIN) for v in value))
        if accepted is not None and key not in accepted:
            refused = f"is not an option of {arch!r} (its options: {', '.join(accepted) or 'none'})"
        elif key != "variant" and value not in (None, False, "") and _PATHLIKE_OPTION.search(key):
            refused = "could make the model factory open a file"
        elif not plain:
            refused = f"is a {type(value).__name__}, not plain data"
        else:
            continue
        raise CheckpointError(f"{path!r} records architecture option {key!r}, which is refused: it {refused}")
    return dict(options)


def model_from_checkpoint(obj: Any, path: str = "<checkpoint>", device: str | torch.device = "cpu") -> EnergyModel:
    """Build the EnergyModel a loaded checkpoint object describes (either format)."""
    device = resolve_device(device)
    if is_jemeval_checkpoint(obj):
        if not isinstance(obj.get("format_version", 0), int):
            raise CheckpointError(f"{path!r} is a damaged jemeval checkpoint ('format_version' is not a number)")
        if obj.get("format_version", 0) > FORMAT_VERSION:
            raise CheckpointError(f"{path!r} was written by a newer jemeval (format {obj['format_version']}); "
                                  "upgrade jemeval")
        _check_fields(obj, path)
        options = checkpoint_arch_options(obj["arch"], obj.get("arch_options") or {}, path)
        try:
            model = create_model(
                obj["arch"], obj["num_classes"], obj["input_shape"],
                normalization=obj.get("normalization"),
                metadata={"dataset": obj.get("dataset"), "provenance": obj.get("provenance", {}),
                          "config": obj.get("config", {}), "source_format": FORMAT},
                **options,
            )
        except UsageError as exc:  # options the factory itself refuses (a WRN depth that is not 6n + 4, ...)
            raise CheckpointError(f"{path!r} records an architecture jemeval cannot build: {exc}") from None
        load_state(model, obj["state_dict"], path)
        return model.to(device).eval()

    found = identify_foreign(obj)
    if found is None:
        raise unknown_layout_error(obj, path)
    return foreign_model(found, path).to(device).eval()


def load_model(path: str | os.PathLike, device: str | torch.device = "cpu") -> EnergyModel:
    """Load a model, in eval mode, from a jemeval checkpoint, a ``.safetensors`` file written by
    ``jemeval export`` or a file in a registered foreign layout (JEM release, JEM++, SADA-JEM, a
    plugin's); layouts that are not one torch file need ``jemeval convert``."""
    if is_safetensors(path):
        obj = read_safetensors(path)
        model = model_from_checkpoint(obj, str(path), device)
        model.metadata.update(source_format=SAFETENSORS_FORMAT, classes=obj.get("classes"))
    else:
        model = model_from_checkpoint(read_checkpoint(path, map_location="cpu"), str(path), device)
    model.metadata.setdefault("checkpoint", {"path": str(path), "sha256": file_sha256(path)})
    return model
