"""Built-in checkpoint layouts: the JEM family's Wide ResNets, recognised from their keys.

All three share the JEM release's Wide ResNet module names (its wideresnet.py, see docs/interop.md),
so one WRN builder serves them; they differ in the keys that tell them apart and in the BatchNorm
mode their authors' samplers use:

* ``jem-release``: JEM (Grathwohl et al. 2020), no norm layers; its ``f.linear`` and
  ``energy_output`` heads are unused and dropped. Samples with the network in eval mode.
* ``jem-release-batchnorm``: the same code trained with its ``--norm batch`` (``f.linear`` present).
* ``jem++/sada-jem``: JEM++ (Yang & Ji 2021) and SADA-JEM (Yang et al. 2023): BatchNorm, no
  ``f.linear``. Both keep BatchNorm in *train* mode while sampling, which is recorded as
  ``config["sgld"]["bn_mode"] = "train"`` so that ``jemeval sample`` and the SGLD refinement pick
  it up. JEM++'s ``yopo`` network registers its first conv and its stages a second time
  (``f.layer_one.*``, ``f.other_layers.*``); those aliases are checked equal and dropped.
"""
from __future__ import annotations

import re
from typing import Any

import torch

from jemeval.energy.factory import create_model
from jemeval.energy.model import EnergyModel
from jemeval.errors import CheckpointError
from jemeval.formats.foreign import CheckpointLayout, FoundCheckpoint
from jemeval.formats.native import load_state, looks_like_state_dict, replay_buffer_of
from jemeval.hookspecs import hookimpl

_OFFICIAL_UNUSED = ("energy_output.", "f.linear.")


#: SADA-JEM's 64 x 64 networks add a fourth stage; jemeval's WRN has three
_UNSUPPORTED_WRN_KEYS = (("f.layer4.", "a fourth WRN stage (f.layer4, SADA-JEM's 64x64 networks)"),)


#: JEM++ --model yopo: the same modules registered under a second name
_YOPO_ALIASES = (("f.layer_one.", "f.conv1."), ("f.other_layers.0.", "f.layer1."), ("f.other_layers.1.", "f.layer2."),
                 ("f.other_layers.2.", "f.layer3."), ("f.other_layers.3.", "f.bn1."))


def official_state_dict(obj: Any) -> dict[str, torch.Tensor] | None:
    """The WRN state dict inside a JEM-release checkpoint, or None if ``obj`` is not one."""
    state = obj.get("model_state_dict") if isinstance(obj, dict) and "model_state_dict" in obj else obj
    if looks_like_state_dict(state) and "f.conv1.weight" in state and "class_output.weight" in state:
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
        raise CheckpointError("the checkpoint uses a norm layer jemeval does not know (only none and batch are "
                              "supported)")
    else:
        norm = None
    return {"depth": depth, "widen": widen, "norm": norm, "num_classes": int(num_classes),
            "in_channels": int(conv1.shape[1])}


def strip_unused_official_keys(state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    return {k: v for k, v in state.items() if not k.startswith(_OFFICIAL_UNUSED)}


def _build_wrn(cfg: dict[str, Any], state: dict[str, torch.Tensor], path: str) -> EnergyModel:
    model = create_model("wrn", cfg["num_classes"], (cfg["in_channels"], 32, 32),
                         depth=cfg["depth"], widen=cfg["widen"], norm=cfg["norm"], dropout=0.0)
    load_state(model, strip_unused_official_keys(state), path)
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
            raise CheckpointError(f"the checkpoint has {what}, which jemeval's WRN does not support "
                                  "(32x32 models only)")


def _wrn_layout(summary: str, bn_mode: str, *, norm: str | None, linear: bool | None) -> CheckpointLayout:
    """A WRN layout told apart by its norm and by whether the unused ``f.linear`` head is present."""

    def match(obj: Any) -> FoundCheckpoint | None:
        state = official_state_dict(obj)
        if state is None:
            return None
        state = without_yopo_aliases(state)
        cfg = infer_wrn_config(state)
        if cfg["norm"] != norm or (linear is not None and ("f.linear.weight" in state) != linear):
            return None
        _reject_unsupported(state)
        return FoundCheckpoint(lambda path: _build_wrn(cfg, state, path), config={"arch_inferred": dict(cfg)},
                               sgld={"bn_mode": bn_mode}, replay_buffer=replay_buffer_of(obj))

    return CheckpointLayout(summary, match=match)


#: name -> layout; the names are recorded in converted checkpoints (``config["source_layout"]``)
LAYOUTS: dict[str, CheckpointLayout] = {
    "jem-release": _wrn_layout("JEM release WRN, no norm layers (f.*, class_output.*; f.linear/energy_output ignored)",
                               "eval", norm=None, linear=None),
    "jem-release-batchnorm": _wrn_layout("JEM release WRN trained with --norm batch (BatchNorm keys and f.linear)",
                                         "eval", norm="batch", linear=True),
    "jem++/sada-jem": _wrn_layout("JEM++ / SADA-JEM WRN (BatchNorm keys, no f.linear; yopo aliases accepted)",
                                  "train", norm="batch", linear=False),
}


@hookimpl
def register_checkpoint_layouts(register):
    for name, layout in LAYOUTS.items():
        register(name, layout)
