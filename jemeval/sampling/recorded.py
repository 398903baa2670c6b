"""The one way to build a sampler for a checkpoint: explicit settings, else the recorded ones, else JEM's.

Every command that samples from a trained model (refinement in eval/robust/distal, ``sample``)
reads a checkpoint's sampler settings here, so they all agree on aliases (``sgld_lr`` vs
``step_size``), on precedence, and on what they say when training used another sampler.
"""
from __future__ import annotations

from torch import nn

from jemeval.sampling.sgld import SGLD

#: JEM release's SGLD settings, used when neither the caller nor the checkpoint gives them
JEM_SGLD = {"step_size": 1.0, "noise": 0.01, "clamp": None, "bn_mode": "eval"}
#: other names training configs use for the same settings
_SGLD_ALIASES = {"step_size": ("step_size", "lr", "sgld_lr"), "noise": ("noise", "std", "sgld_std"),
                 "clamp": ("clamp",), "bn_mode": ("bn_mode",)}


def recorded_sampler_settings(model: nn.Module) -> dict:
    """The sampler settings a checkpoint recorded (``metadata["config"]["sgld"]``), or ``{}``."""
    config = (getattr(model, "metadata", None) or {}).get("config") or {}
    cfg = config.get("sgld") if isinstance(config, dict) else None
    return cfg if isinstance(cfg, dict) else {}


def trained_sampler(model: nn.Module) -> str | None:
    """The sampler the model was trained with when it was not plain SGLD (e.g. "proximal-sgld")."""
    name = recorded_sampler_settings(model).get("sampler")
    return str(name) if name and name != "sgld" else None


def recorded_sgld(model: nn.Module, steps: int, **overrides) -> tuple[SGLD, str]:
    """The plain SGLD for evaluating ``model``: explicit ``overrides`` (None = not given), else the
    settings the checkpoint recorded, else the JEM release's; plus a note saying where they came from.

    Every command that samples (refinement, sample, robust, distal, eval) builds its sampler here,
    so they all read a checkpoint the same way. A proximal-SGLD checkpoint contributes only the
    plain-SGLD settings (step size, noise, clamp, BatchNorm mode), and the note says so.
    """
    cfg = recorded_sampler_settings(model)
    merged = dict(JEM_SGLD)
    for key, aliases in _SGLD_ALIASES.items():
        found = next((cfg[a] for a in aliases if cfg.get(a) is not None), None)
        if found is not None:
            merged[key] = found
    merged.update({k: v for k, v in overrides.items() if v is not None})
    source = "checkpoint config" if cfg else "JEM release defaults"
    if trained_sampler(model):
        source += (f" (trained with {trained_sampler(model)}; sampling uses plain SGLD with its step size, "
                   "noise, clamp and BatchNorm mode)")
    merged["clamp"] = tuple(merged["clamp"]) if merged["clamp"] is not None else None
    return SGLD(steps=int(steps), step_size=float(merged["step_size"]), noise=float(merged["noise"]),
                clamp=merged["clamp"], bn_mode=str(merged["bn_mode"])), source


def sampler_note(model: nn.Module) -> str | None:
    """What evaluation records when training used another sampler (None for plain SGLD)."""
    name = trained_sampler(model)
    if name is None:
        return None
    return (f"trained with {name}; evaluation samples with plain SGLD using the recorded step size, noise, "
            "clamp and BatchNorm mode (the sampler's other settings are not used)")
