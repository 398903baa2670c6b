"""Foreign checkpoint layouts: the interface a layout implements, and finding the one a file is in.

Layouts are components of kind ``checkpoint_layout``, registered through the
``register_checkpoint_layouts`` hook: the JEM-family Wide ResNets by :mod:`jemeval.builtins.layouts`,
others by plugins (jemeval-igebm's TensorFlow release). A :class:`CheckpointLayout` recognises a
checkpoint in one of two ways:

* ``match(obj)``: ``obj`` is the file's contents as ``torch.load(weights_only=True)`` read them
  (a dict of tensors and plain data). Used by :func:`jemeval.load_model` (so every ``--model``
  reads the layout directly) and by ``jemeval convert``.
* ``match_path(path)``: for checkpoints torch cannot read as one file (a TensorFlow checkpoint
  prefix, a folder). Called with the path as the user gave it, before anything is read; used by
  ``jemeval convert`` only, which writes the model as a jemeval checkpoint once.

Either returns a :class:`FoundCheckpoint` when the checkpoint is in its layout and ``None`` when it
is not, and raises :class:`~jemeval.errors.CheckpointError` (one line) for a checkpoint that is in
its layout but cannot be used. Exactly one layout may claim a checkpoint: two that both match are an
error naming both, as two components of one name are.
"""
from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Any

import torch

from jemeval.energy.model import EnergyModel
from jemeval.errors import CheckpointError
from jemeval.plugins import get_registry


@dataclass
class FoundCheckpoint:
    """A recognised foreign checkpoint: how to build its model and what a conversion records."""

    #: builds the model with the checkpoint's weights: ``build(path) -> EnergyModel`` (``path`` for messages)
    build: Callable[[str], EnergyModel]
    #: the layout's name; jemeval sets it to the name the layout is registered under
    layout: str | None = None
    #: recorded in the model's and the converted checkpoint's ``config`` (e.g. the inferred architecture)
    config: dict = field(default_factory=dict)
    #: SGLD settings the layout's authors used (``bn_mode``, ``clamp``), read by sampling via config["sgld"]
    sgld: dict = field(default_factory=dict)
    replay_buffer: torch.Tensor | None = None
    #: the source recorded by a conversion when it is not the path given (a TensorFlow checkpoint's prefix)
    source: str | None = None
    #: the source's hash(es) when it is not one file (default: the SHA-256 of the file given)
    source_sha256: Any = None
    #: extra keys of the conversion record (``jemeval convert --json``)
    notes: dict = field(default_factory=dict)

    def source_config(self) -> dict:
        """What the model (and a converted checkpoint) records about its source, under ``config``."""
        return {"source_layout": self.layout, **self.config, "sgld": dict(self.sgld)}


@dataclass(frozen=True)
class CheckpointLayout:
    """A foreign checkpoint layout (see the module docstring); give ``match``, ``match_path`` or both."""

    #: one line for ``jemeval list checkpoint_layouts`` and for the error listing the known layouts
    summary: str
    match: Callable[[Any], FoundCheckpoint | None] | None = None
    match_path: Callable[[str], FoundCheckpoint | None] | None = None


def _identify(method: str, arg: Any) -> FoundCheckpoint | None:
    """The one registered layout whose ``method`` claims ``arg``, with its registered name; None if none."""
    found = []
    for component in get_registry().components("checkpoint_layout"):
        matcher = getattr(component.obj, method, None)
        result = matcher(arg) if callable(matcher) else None
        if result is not None:
            found.append((component, replace(result, layout=component.name)))
    if len(found) > 1:
        raise CheckpointError(
            "the checkpoint matches several layouts: "
            + " and ".join(f"{c.name!r} (plugin {c.plugin!r})" for c, _ in found)
            + "; uninstall the plugin that should not claim it"
        )
    return found[0][1] if found else None


def identify_foreign(obj: Any) -> FoundCheckpoint | None:
    """The layout of a loaded checkpoint object (``match``), or None."""
    return _identify("match", obj)


def identify_path(path: str | os.PathLike) -> FoundCheckpoint | None:
    """The layout of a checkpoint torch cannot read as one file (``match_path``), or None."""
    return _identify("match_path", str(path))


def foreign_model(found: FoundCheckpoint, path: str) -> EnergyModel:
    """Build a found checkpoint's model, recording its source layout and config in ``model.metadata``."""
    model = found.build(path)
    model.metadata.setdefault("dataset", None)
    model.metadata.update(source_format=found.layout, config=found.source_config())
    return model


def supported_layouts() -> str:
    """One line naming every registered layout (for error messages)."""
    return "; ".join(f"{c.name}: {c.help}" for c in get_registry().components("checkpoint_layout"))


def unknown_layout_error(obj: Any, path: str) -> CheckpointError:
    """The one error for a file that is neither a jemeval checkpoint nor a supported layout."""
    keys = list(obj)[:4] if isinstance(obj, dict) else type(obj).__name__
    return CheckpointError(
        f"{path!r} is not a jemeval checkpoint nor a known layout (top-level keys: {keys}); expected a file "
        f"written by `jemeval train` or one of: {supported_layouts()}"
    )
