"""Foreign checkpoint layouts: recognised from their keys, built as jemeval EnergyModels.

Each supported layout is a :class:`ForeignLayout` in ``LAYOUTS``; ``match(obj)`` returns a
:class:`FoundCheckpoint` (or None) whose ``build`` returns the model. All three share the JEM
release's Wide ResNet module names (the JEM release's wideresnet.py, see docs/interop.md), so one WRN builder serves them;
they differ in the keys that tell them apart and in the BatchNorm mode their authors' samplers use:

* ``jem-release``: JEM (Grathwohl et al. 2020), no norm layers; its ``f.linear`` and
  ``energy_output`` heads are unused and dropped. Samples with the network in eval mode.
* ``jem-release-batchnorm``: the same code trained with ``--norm batch`` (``f.linear`` present).
* ``jem++/sada-jem``: JEM++ (Yang & Ji 2021) and SADA-JEM (Yang et al. 2023): BatchNorm, no
  ``f.linear``. Both keep BatchNorm in *train* mode while sampling, which is recorded as
  ``config["sgld"]["bn_mode"] = "train"`` so that ``jemeval sample`` and the SGLD refinement pick
  it up. JEM++'s ``--model yopo`` network registers its first conv and its stages a second time
  (``f.layer_one.*``, ``f.other_layers.*``); those aliases are checked equal and dropped.

:func:`convert` writes any of them as a jemeval checkpoint, with its source recorded.
"""
from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from .energy import EnergyModel
from .errors import CheckpointError, UsageError

#: SADA-JEM's 64 x 64 networks add a fourth stage; jemeval's WRN has three
_UNSUPPORTED_WRN_KEYS = (("f.layer4.", "a fourth WRN stage (f.layer4, SADA-JEM's 64x64 networks)"),)
#: JEM++ --model yopo: the same modules registered under a second name
_YOPO_ALIASES = (("f.layer_one.", "f.conv1."), ("f.other_layers.0.", "f.layer1."), ("f.other_layers.1.", "f.layer2."),
                 ("f.other_layers.2.", "f.layer3."), ("f.other_layers.3.", "f.bn1."))


@dataclass
class FoundCheckpoint:
    """A recognised foreign checkpoint: its layout, state dict, inferred config and sampler hints."""

    layout: str
    state: dict
    config: dict
    replay_buffer: Any
    builder: Callable[[FoundCheckpoint, str], EnergyModel]
    #: SGLD settings the layout's authors used (read by sampling commands via config["sgld"])
    sgld: dict = field(default_factory=dict)

    def build(self, path: str) -> EnergyModel:
        return self.builder(self, path)

    def source_config(self) -> dict:
        """What a converted checkpoint records about its source (its ``config``)."""
        return {"source_layout": self.layout, "arch_inferred": dict(self.config), "sgld": dict(self.sgld)}


@dataclass(frozen=True)
class ForeignLayout:
    name: str
    summary: str
    bn_mode: str
    match: Callable[[Any], FoundCheckpoint | None]


def _build_wrn(found: FoundCheckpoint, path: str) -> EnergyModel:
    from .checkpoints import _load_state, _shape_mismatch, strip_unused_official_keys
    from .models import create_model

    cfg = found.config
    model = create_model(
        "wrn", cfg["num_classes"], (cfg["in_channels"], 32, 32),
        depth=cfg["depth"], widen=cfg["widen"], norm=cfg["norm"], dropout=0.0,
        metadata={"dataset": None, "source_format": found.layout, "config": found.source_config()},
    )
    try:
        _load_state(model, strip_unused_official_keys(found.state), path)
    except RuntimeError as exc:
        raise _shape_mismatch(exc, path, "wrn") from None
    return model


def without_yopo_aliases(state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """Drop JEM++'s ``yopo`` aliases (``f.layer_one.*``, ``f.other_layers.*``) after checking
    each equals the canonical tensor it duplicates; a differing alias means a layout we don't know."""
    if not any(k.startswith(("f.layer_one.", "f.other_layers.")) for k in state):
        return state
    kept = {}
    for key, value in state.items():
        alias = next(((a, c) for a, c in _YOPO_ALIASES if key.startswith(a)), None)
        if alias is None:
            kept[key] = value
            continue
        canonical = alias[1] + key[len(alias[0]):]
        if canonical not in state or not torch.equal(state[canonical], value):
            raise CheckpointError(
                f"key {key!r} looks like a JEM++ yopo alias but does not equal {canonical!r}; "
                "this is not a layout jemeval knows"
            )
    return kept


def _reject_unsupported(state: dict[str, torch.Tensor]) -> None:
    for prefix, what in _UNSUPPORTED_WRN_KEYS:
        if any(k.startswith(prefix) for k in state):
            raise CheckpointError(f"the checkpoint has {what}, which jemeval's WRN does not support (32x32 models only)")


def _wrn_layout(name: str, summary: str, bn_mode: str, *, norm: str | None, linear: bool | None) -> ForeignLayout:
    """A WRN layout told apart by its norm and by whether the unused ``f.linear`` head is present."""

    def match(obj: Any) -> FoundCheckpoint | None:
        from .checkpoints import infer_wrn_config, official_state_dict, replay_buffer_of

        state = official_state_dict(obj)
        if state is None:
            return None
        state = without_yopo_aliases(state)
        cfg = infer_wrn_config(state)
        if cfg["norm"] != norm or (linear is not None and ("f.linear.weight" in state) != linear):
            return None
        _reject_unsupported(state)
        return FoundCheckpoint(name, state, cfg, replay_buffer_of(obj), _build_wrn, sgld={"bn_mode": bn_mode})

    return ForeignLayout(name, summary, bn_mode, match)


#: layouts tried in order by :func:`identify_foreign`
LAYOUTS: list[ForeignLayout] = [
    _wrn_layout("jem-release", "JEM release WRN, no norm layers (f.*, class_output.*; f.linear/energy_output ignored)",
                "eval", norm=None, linear=None),
    _wrn_layout("jem-release-batchnorm", "JEM release WRN trained with --norm batch (BatchNorm keys and f.linear)",
                "eval", norm="batch", linear=True),
    _wrn_layout("jem++/sada-jem", "JEM++ / SADA-JEM WRN (BatchNorm keys, no f.linear; yopo aliases accepted)",
                "train", norm="batch", linear=False),
]


def supported_layouts() -> str:
    """One line naming every supported layout (for error messages)."""
    return "; ".join(f"{layout.name}: {layout.summary}" for layout in LAYOUTS)


def unknown_layout_error(obj: Any, path: str) -> CheckpointError:
    """The one error for a file that is neither a jemeval checkpoint nor a supported layout."""
    keys = list(obj)[:4] if isinstance(obj, dict) else type(obj).__name__
    return CheckpointError(
        f"{path!r} is not a jemeval checkpoint nor a known layout (top-level keys: {keys}); expected a file "
        f"written by `jemeval train` or one of: {supported_layouts()}"
    )


def check_output_path(src: Path | str, dst: Path | str) -> Path:
    """A converter's output: a new .pt file that is not the input."""
    src, dst = Path(src), Path(dst)
    if dst.exists():
        what = "is the input file" if dst.resolve() == src.resolve() else "already exists"
        raise UsageError(f"output {str(dst)!r} {what}; remove it or give another output path")
    if dst.suffix != ".pt":
        raise UsageError(f"output must be a .pt file, got {str(dst)!r}")
    return dst


def write_converted(model: EnergyModel, source: str, dst: Path | str, *, layout: str, source_sha256: Any,
                    dataset: str | None = None, replay_buffer: Any = None, config: dict | None = None,
                    extra: dict | None = None, command: str = "convert"):
    """Save a converted model as a jemeval checkpoint (with provenance) and return the Result record.

    Shared by ``jemeval convert`` and plugin converters (e.g. jemeval-igebm's TensorFlow one).
    """
    from .checkpoints import save_checkpoint
    from .provenance import provenance
    from .results import Result

    config = {"source_layout": layout, "source_file": source, "source_sha256": source_sha256, **(config or {})}
    source_file = source if Path(source).is_file() else None  # a TF checkpoint is a prefix, hashed in settings
    prov = provenance(command=command, checkpoint=source_file, settings={"source_layout": layout, "dataset": dataset,
                                                                          "source_sha256": source_sha256})
    save_checkpoint(dst, model, dataset=dataset, replay_buffer=replay_buffer, config=config, provenance=prov)
    record = {
        "source": source, "output": str(dst), "layout": layout, "arch": model.arch, "arch_options": model.arch_options,
        "num_classes": model.num_classes, "dataset": dataset,
        "replay_buffer": None if replay_buffer is None else list(replay_buffer.shape),
        "source_sha256": source_sha256, **(extra or {}),
    }
    return Result([record], provenance=prov)


def identify_foreign(obj: Any) -> FoundCheckpoint | None:
    for layout in LAYOUTS:
        found = layout.match(obj)
        if found is not None:
            return found
    return None


# -- jemeval convert ---------------------------------------------------------------------------
def _looks_like_tensorflow(path: Path) -> bool:
    if path.is_dir():
        return (path / "checkpoint").exists()
    return path.suffix == ".index" or re.search(r"\.data-\d+-of-\d+$", path.name) is not None or (
        not path.exists() and Path(f"{path}.index").exists()
    )


def convert(path_in: str | Path, path_out: str | Path, *, dataset: str | None = None):
    """Write the foreign checkpoint ``path_in`` as a jemeval checkpoint at ``path_out``.

    The output records the source layout, the source file's SHA-256, the BatchNorm mode the
    layout's authors sample with (``config["sgld"]["bn_mode"]``) and, with ``dataset``, the
    training set (which a foreign checkpoint does not name; ``ood`` and ``calibrate`` use it as
    the in-distribution default). Returns a :class:`~jemeval.results.Result` describing the output.
    """
    from .checkpoints import (
        check_finite,
        file_sha256,
        is_jemeval_checkpoint,
        read_checkpoint,
    )

    src, dst = Path(path_in), Path(path_out)
    if _looks_like_tensorflow(src):
        raise UsageError(
            f"{str(src)!r} is a TensorFlow checkpoint; IGEBM release checkpoints are converted by the "
            "jemeval-igebm plugin: pip install 'jemeval-igebm[tf]', then jemeval-igebm-convert IN OUT"
        )
    check_output_path(src, dst)
    if dataset is not None:
        check_dataset_name(dataset)
    obj = read_checkpoint(src)
    if is_jemeval_checkpoint(obj):
        raise UsageError(f"{str(src)!r} is already a jemeval checkpoint; nothing to convert")
    found = identify_foreign(obj)
    if found is None:
        raise unknown_layout_error(obj, str(src))
    model = found.build(str(src))
    if found.replay_buffer is not None:
        check_finite(found.replay_buffer, "its replay buffer", str(src))
    return write_converted(
        model, str(src), dst, layout=found.layout, source_sha256=file_sha256(src), dataset=dataset,
        replay_buffer=found.replay_buffer, config=found.source_config(), extra={"bn_mode": found.sgld.get("bn_mode")},
    )


def check_dataset_name(dataset: str) -> None:
    from .errors import did_you_mean
    from .plugins import names
    from .registry import parse_spec

    known = names("dataset")
    name = parse_spec(dataset).name
    if name not in known:
        raise UsageError(f"unknown dataset {dataset!r}{did_you_mean(name, known)}; known datasets: {', '.join(known)}")
