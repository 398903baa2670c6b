"""Foreign checkpoint layouts: recognised from their keys, built as jemeval EnergyModels.

Each layout is a :class:`ForeignLayout` in ``LAYOUTS``: ``match(obj)`` returns the state dict
(or None) and ``build`` returns the model. The JEM release (WRN without BatchNorm, with the
unused ``f.linear`` and ``energy_output`` heads) and its BatchNorm follow-ups (JEM++, SADA-JEM:
norm layers, no ``f.linear``) share the same WRN module names.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

from .energy import EnergyModel
from .errors import CheckpointError


@dataclass
class FoundCheckpoint:
    layout: str
    state: dict
    config: dict
    replay_buffer: Any
    builder: Callable[["FoundCheckpoint", str], EnergyModel]

    def build(self, path: str) -> EnergyModel:
        return self.builder(self, path)


def _build_wrn(found: FoundCheckpoint, path: str) -> EnergyModel:
    from .checkpoints import _load_state, _shape_mismatch, strip_unused_official_keys
    from .models import create_model

    cfg = found.config
    model = create_model(
        "wrn", cfg["num_classes"], (cfg["in_channels"], 32, 32),
        depth=cfg["depth"], widen=cfg["widen"], norm=cfg["norm"],
        metadata={"dataset": None, "source_format": found.layout},
    )
    # WRN options are all known: `norm=None` must stay explicit in arch_options
    model.arch_options = {"depth": cfg["depth"], "widen": cfg["widen"], "norm": cfg["norm"], "dropout": 0.0}
    try:
        _load_state(model, strip_unused_official_keys(found.state), path)
    except RuntimeError as exc:
        raise _shape_mismatch(exc, path, "wrn") from None
    return model


def _match_wrn(obj: Any) -> FoundCheckpoint | None:
    from .checkpoints import infer_wrn_config, official_state_dict, replay_buffer_of

    state = official_state_dict(obj)
    if state is None:
        return None
    cfg = infer_wrn_config(state)
    if cfg["norm"] is None:
        layout = "jem-release"
    else:
        layout = "jem++/sada-jem" if "f.linear.weight" not in state else "jem-release-batchnorm"
    return FoundCheckpoint(layout, state, cfg, replay_buffer_of(obj), _build_wrn)


#: matchers tried in order by :func:`identify_foreign`
LAYOUTS: list[Callable[[Any], FoundCheckpoint | None]] = [_match_wrn]


def identify_foreign(obj: Any) -> FoundCheckpoint | None:
    for match in LAYOUTS:
        try:
            found = match(obj)
        except CheckpointError:
            raise
        if found is not None:
            return found
    return None
