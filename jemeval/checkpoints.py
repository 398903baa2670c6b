"""Checkpoints: jemeval's own format, the JEM release's format, safe loading, atomic saving.

jemeval's format is a plain dict (tensors, numbers, strings, lists, dicts only) so that it loads
with ``torch.load(weights_only=True)``: opening a checkpoint can never execute code.

    {"format": "jemeval-checkpoint", "format_version": 1,
     "arch": "wrn", "arch_options": {...}, "num_classes": 10, "input_shape": [3, 32, 32],
     "normalization": None | {"mean": [...], "std": [...]}, "dataset": "cifar10" | None,
     "state_dict": {...}, "replay_buffer": Tensor | None,
     "training_state": None | {optimizer, scheduler, epoch, step, rng, ...},
     "config": {...}, "provenance": {...}}

The JEM release's checkpoints (``{"model_state_dict", "replay_buffer"}`` or a bare state dict of
its ``F`` module) are recognised from their keys; depth, width, norm and class count are inferred
from tensor shapes (the JEM release's wideresnet.py, see docs/interop.md).
"""
from __future__ import annotations

import hashlib
import os
import re
from pathlib import Path
from typing import Any

import torch

from .atomic import atomic_path
from .energy import EnergyModel
from .errors import CheckpointError, UnknownNameError, UsageError

FORMAT = "jemeval-checkpoint"
FORMAT_VERSION = 1
_OFFICIAL_UNUSED = ("energy_output.", "f.linear.")


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
        raise CheckpointError(f"checkpoint {str(p)!r} does not exist; pass the path of a .pt file (e.g. runs/digits/best.pt)")
    if p.is_dir():
        hint = " (it holds best.pt)" if (p / "best.pt").exists() else ""
        raise CheckpointError(f"checkpoint {str(p)!r} is a folder{hint}; pass the .pt file inside it, e.g. {str(p / 'best.pt')!r}")
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


def _looks_like_state_dict(obj: Any) -> bool:
    return isinstance(obj, dict) and bool(obj) and all(isinstance(k, str) for k in obj) and all(
        torch.is_tensor(v) for v in obj.values()
    )


def official_state_dict(obj: Any) -> dict[str, torch.Tensor] | None:
    """The WRN state dict inside a JEM-release checkpoint, or None if ``obj`` is not one."""
    state = obj.get("model_state_dict") if isinstance(obj, dict) and "model_state_dict" in obj else obj
    if _looks_like_state_dict(state) and "f.conv1.weight" in state and "class_output.weight" in state:
        return state
    return None


def infer_wrn_config(state: dict[str, torch.Tensor]) -> dict[str, Any]:
    """Depth, widen factor, norm, class count and channels of a WRN state dict in the release layout."""
    try:
        conv1 = state["f.conv1.weight"]
        first = state["f.layer1.0.conv1.weight"]
        blocks = {int(m.group(1)) for k in state if (m := re.match(r"f\.layer1\.(\d+)\.conv1\.weight$", k))}
        num_classes = state["class_output.weight"].shape[0]
    except KeyError as exc:
        raise CheckpointError(f"state dict lacks {exc.args[0]!r}: not a JEM Wide ResNet layout") from None
    widen = first.shape[0] // 16
    depth = 6 * len(blocks) + 4
    if "f.layer1.0.bn1.running_mean" in state or "f.bn1.running_mean" in state:
        norm = "batch"
    elif any(k.startswith("f.bn1.") or ".bn1." in k for k in state):
        raise CheckpointError("the checkpoint uses a norm layer jemeval does not know (only none and batch are supported)")
    else:
        norm = None
    return {"depth": depth, "widen": widen, "norm": norm, "num_classes": int(num_classes), "in_channels": int(conv1.shape[1])}


def strip_unused_official_keys(state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    return {k: v for k, v in state.items() if not k.startswith(_OFFICIAL_UNUSED)}


def _load_state(model: EnergyModel, state: dict, path: str) -> None:
    """Copy ``state`` into the model: every layout's weights enter here, so they are checked here."""
    if not _looks_like_state_dict(state):
        raise CheckpointError(f"{path!r} is a damaged checkpoint: its state_dict is not a dict of named tensors")
    check_finite(state, "weight", path)
    result = model.net.load_state_dict(state, strict=False)
    if result.missing_keys or result.unexpected_keys:
        missing = ", ".join(result.missing_keys[:3])
        unexpected = ", ".join(result.unexpected_keys[:3])
        raise CheckpointError(
            f"{path!r} does not match architecture {model.arch!r} with options {model.arch_options}: "
            f"missing keys [{missing}{'...' if len(result.missing_keys) > 3 else ''}], "
            f"unexpected keys [{unexpected}{'...' if len(result.unexpected_keys) > 3 else ''}]"
        )


def _shape_mismatch(exc: RuntimeError, path: str, arch: str | None) -> CheckpointError:
    first = [line.strip() for line in str(exc).splitlines() if "size mismatch" in line][:1]
    detail = first[0] if first else str(exc).splitlines()[0]
    return CheckpointError(f"{path!r} does not match architecture {arch!r}: {detail}")


#: fields a jemeval checkpoint must have, and their types (a damaged file fails on the first wrong one)
_REQUIRED = {"arch": str, "num_classes": int, "input_shape": (list, tuple), "state_dict": dict}
#: option names that can make a factory open a file or fetch something (timm's checkpoint_path,
#: pretrained_cfg, ...): never taken from a checkpoint by a factory that accepts any keyword
_PATHLIKE_OPTION = re.compile(r"path|file|dir|url|cfg|cache|hub|pretrained|checkpoint|ckpt|weights", re.IGNORECASE)
_PLAIN = (bool, int, float, str, type(None))


def _check_fields(obj: dict, path: str) -> None:
    for key, kind in _REQUIRED.items():
        if key not in obj:
            raise CheckpointError(f"{path!r} is a damaged jemeval checkpoint (no {key!r}); re-save it with `jemeval train` "
                                  "or jemeval.save_checkpoint")
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
    from .plugins import get_registry
    from .registry import accepted_options

    try:
        accepted = accepted_options(get_registry().get("model", arch), skip=2)
    except UnknownNameError as exc:
        raise CheckpointError(f"{path!r} needs model architecture {arch!r}, which no installed plugin provides; "
                              f"install the plugin that registers it ({exc})") from None
    for key, value in options.items():
        plain = isinstance(value, _PLAIN) or (isinstance(value, (list, tuple)) and all(isinstance(v, _PLAIN) for v in value))
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
    from .devices import resolve_device
    from .models import create_model

    device = resolve_device(device)
    if is_jemeval_checkpoint(obj):
        if not isinstance(obj.get("format_version", 0), int):
            raise CheckpointError(f"{path!r} is a damaged jemeval checkpoint ('format_version' is not a number)")
        if obj.get("format_version", 0) > FORMAT_VERSION:
            raise CheckpointError(f"{path!r} was written by a newer jemeval (format {obj['format_version']}); upgrade jemeval")
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
        try:
            _load_state(model, obj["state_dict"], path)
        except RuntimeError as exc:
            raise _shape_mismatch(exc, path, obj.get("arch")) from None
        return model.to(device).eval()

    from .interop import (  # JEM release and follow-up layouts
        identify_foreign,
        unknown_layout_error,
    )

    found = identify_foreign(obj)
    if found is None:
        raise unknown_layout_error(obj, path)
    return found.build(path).to(device).eval()


def load_model(path: str | os.PathLike, device: str | torch.device = "cpu") -> EnergyModel:
    """Load a model from a jemeval checkpoint or a JEM-release checkpoint, in eval mode."""
    obj = read_checkpoint(path, map_location="cpu")
    model = model_from_checkpoint(obj, str(path), device)
    model.metadata.setdefault("checkpoint", {"path": str(path), "sha256": file_sha256(path)})
    return model


def replay_buffer_of(obj: Any) -> torch.Tensor | None:
    """The replay buffer stored in a checkpoint object of either format, if any."""
    if isinstance(obj, dict):
        buf = obj.get("replay_buffer")
        if torch.is_tensor(buf):
            return buf
    return None


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
