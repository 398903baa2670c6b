"""jemeval's own checkpoint format: a plain dict of tensors and plain data, saved atomically.

The format loads with ``torch.load(weights_only=True)``, so opening a checkpoint can never execute
code::

    {"format": "jemeval-checkpoint", "format_version": 1,
     "arch": "wrn", "arch_options": {...}, "num_classes": 10, "input_shape": [3, 32, 32],
     "normalization": None | {"mean": [...], "std": [...]}, "dataset": "cifar10" | None,
     "classes": None | ["airplane", ...] (one name per class),
     "state_dict": {...}, "replay_buffer": Tensor | None,
     "training_state": None | {optimizer, scheduler, epoch, step, rng, ...},
     "config": {...}, "provenance": {...}}

Reading any checkpoint file (ours or a foreign layout) goes through :func:`read_checkpoint`, which
turns every way a file can be wrong into one line; every layout's weights enter a model through
:func:`load_state`, which refuses non-finite values. Building a model from what was read is
:mod:`jemeval.formats.load`'s job.
"""
from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Any

import torch

from jemeval.atomic import atomic_path
from jemeval.energy.model import EnergyModel
from jemeval.errors import CheckpointError

FORMAT = "jemeval-checkpoint"
FORMAT_VERSION = 1


# -- saving ------------------------------------------------------------------------------------
def checkpoint_dict(
    model: EnergyModel,
    *,
    dataset: str | None = None,
    replay_buffer: torch.Tensor | None = None,
    training_state: dict | None = None,
    config: dict | None = None,
    provenance: dict | None = None,
) -> dict[str, Any]:
    return {
        "format": FORMAT,
        "format_version": FORMAT_VERSION,
        "arch": model.arch,
        "arch_options": dict(model.arch_options),
        "num_classes": model.num_classes,
        "input_shape": list(model.input_shape),
        "normalization": model.normalization,
        "dataset": dataset if dataset is not None else model.metadata.get("dataset"),
        "classes": model.metadata.get("classes"),
        "state_dict": {k: v.detach().cpu() for k, v in model.net.state_dict().items()},
        "replay_buffer": None if replay_buffer is None else replay_buffer.detach().cpu(),
        "training_state": training_state,
        "config": config or {},
        "provenance": provenance or {},
    }


def save_checkpoint(path: str | os.PathLike, model: EnergyModel, **fields: Any) -> Path:
    """Write a jemeval checkpoint atomically (temp file + rename)."""
    data = checkpoint_dict(model, **fields)
    with atomic_path(path) as tmp:
        torch.save(data, tmp)
    return Path(path)


# -- loading -----------------------------------------------------------------------------------
def read_checkpoint(path: str | os.PathLike, map_location: str | torch.device = "cpu") -> Any:
    """``torch.load(weights_only=True)`` with one-line errors for every way a file can be wrong."""
    p = Path(path)
    if not p.exists():
        raise CheckpointError(f"checkpoint {str(p)!r} does not exist; pass the path of a .pt file "
                              "(e.g. runs/digits/best.pt)")
    if p.is_dir():
        hint = " (it holds best.pt)" if (p / "best.pt").exists() else ""
        raise CheckpointError(f"checkpoint {str(p)!r} is a folder{hint}; pass the .pt file inside it, "
                              f"e.g. {str(p / 'best.pt')!r}")
    try:
        return torch.load(p, map_location=map_location, weights_only=True)
    except Exception as exc:
        text = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
        msg = f"{type(exc).__name__}: {text}" if text else type(exc).__name__
        if "Unsupported global" in str(exc) or "GLOBAL" in str(exc):  # a pickled class or function: refuse
            raise pickle_refusal(str(p), str(exc)) from None
        if "weights_only" in str(exc):  # torch's unpickler met bytes that are no pickle at all
            raise CheckpointError(f"{str(p)!r} is not a PyTorch checkpoint (its contents are not a saved "
                                  "tensor file); pass a .pt file written by torch.save or jemeval") from None
        raise CheckpointError(f"{str(p)!r} is not a readable PyTorch checkpoint ({msg[:200]})") from None


def pickle_refusal(path: str, detail: str = "") -> CheckpointError:
    """The one error for a file that needs full pickle: says what jemeval *can* load and how to get
    there (``jemeval convert`` reads through the same safe loader, so it cannot help here)."""
    found = re.search(r"GLOBAL ([\w.]+)", detail) or re.search(r"Unsupported global: ([\w.]+)", detail)
    what = f" ({found.group(1)})" if found else ""
    return CheckpointError(
        f"{path!r} contains Python objects{what} that could run code when loaded, so jemeval refuses it: in the "
        "environment that created it, re-save only the tensors, e.g. torch.save(model.state_dict(), 'weights.pt'); "
        "jemeval loads tensor-only files (its own, and the JEM release layouts that `jemeval convert` rewrites)"
    )


def check_finite(tensors: Any, what: str, path: str) -> None:
    """Refuse NaN/inf in a tensor or in the floating tensors of a state dict, naming the first one.

    A diverged run's weights otherwise evaluate to confident garbage (ECE 0, accuracy at chance)
    with exit code 0; this is the one check where weights (and replay buffers) enter.
    """
    items = tensors.items() if isinstance(tensors, dict) else [(None, tensors)]
    for key, value in items:
        if torch.is_tensor(value) and (value.is_floating_point() or value.is_complex()):
            bad = ~torch.isfinite(value)
            if bool(bad.any()):
                where = f"{what} tensor {key!r}" if key is not None else what
                raise CheckpointError(
                    f"{path!r} has non-finite values in {where} ({int(bad.sum())} of {value.numel()} are NaN or inf): "
                    "the run that wrote it diverged; use an earlier checkpoint"
                )


def is_jemeval_checkpoint(obj: Any) -> bool:
    return isinstance(obj, dict) and obj.get("format") == FORMAT


def looks_like_state_dict(obj: Any) -> bool:
    """A non-empty dict of named tensors (what ``load_state`` takes and foreign layouts hold)."""
    return isinstance(obj, dict) and bool(obj) and all(isinstance(k, str) for k in obj) and all(
        torch.is_tensor(v) for v in obj.values()
    )


def replay_buffer_of(obj: Any) -> torch.Tensor | None:
    """The replay buffer stored in a checkpoint object of either format, if any."""
    if isinstance(obj, dict):
        buf = obj.get("replay_buffer")
        if torch.is_tensor(buf):
            return buf
    return None


def load_state(model: EnergyModel, state: dict, path: str) -> None:
    """Copy ``state`` into the model: every layout's weights enter here, so they are checked here."""
    if not looks_like_state_dict(state):
        raise CheckpointError(f"{path!r} is a damaged checkpoint: its state_dict is not a dict of named tensors")
    check_finite(state, "weight", path)
    try:
        result = model.net.load_state_dict(state, strict=False)
    except RuntimeError as exc:  # a tensor of the wrong shape
        first = [line.strip() for line in str(exc).splitlines() if "size mismatch" in line][:1]
        detail = first[0] if first else str(exc).splitlines()[0]
        raise CheckpointError(f"{path!r} does not match architecture {model.arch!r}: {detail}") from None
    if result.missing_keys or result.unexpected_keys:
        missing = ", ".join(result.missing_keys[:3])
        unexpected = ", ".join(result.unexpected_keys[:3])
        raise CheckpointError(
            f"{path!r} does not match architecture {model.arch!r} with options {model.arch_options}: "
            f"missing keys [{missing}{'...' if len(result.missing_keys) > 3 else ''}], "
            f"unexpected keys [{unexpected}{'...' if len(result.unexpected_keys) > 3 else ''}]"
        )
