"""The threat model of ``jemeval robust``: norms, perturbation sizes and epsilon balls.

Epsilons are given and reported in [0, 1] *pixel units* (:func:`jemeval.pixel_to_model_scale`
converts them to the [-1, 1] model space, x 2); the sizes here are measured in the model space.
Shared by the robustness evaluation and the built-in attacks (:mod:`jemeval.builtins.attacks`).
"""
from __future__ import annotations

from collections.abc import Sequence

import torch

from jemeval.components import NORMS
from jemeval.errors import UsageError, did_you_mean


def check_norm(norm: str, allowed: Sequence[str] = NORMS, what: str = "norm") -> str:
    """The norm in lower case, or one line naming it, a suggestion and the allowed ones."""
    norm = str(norm).lower()
    if norm not in allowed:
        raise UsageError(f"unknown {what} {norm!r}{did_you_mean(norm, allowed)}: use one of {', '.join(allowed)}")
    return norm


def perturbation_norm(x: torch.Tensor, x_adv: torch.Tensor, norm: str) -> torch.Tensor:
    """Per-example size of ``x_adv - x`` in the *model* space (N,)."""
    d = (x_adv - x).flatten(1)
    return d.abs().amax(dim=1) if norm == "linf" else d.norm(dim=1)


def project_to_ball(x: torch.Tensor, x_adv: torch.Tensor, eps_model: float, norm: str) -> torch.Tensor:
    """foolbox's ``clip_perturbation``: Linf clamps the perturbation, L2 scales it down."""
    delta = x_adv - x
    if norm == "linf":
        delta = delta.clamp(-eps_model, eps_model)
    else:
        norms = delta.flatten(1).norm(dim=1).clamp_min(1e-12)
        factor = (eps_model / norms).clamp(max=1.0).view(-1, *([1] * (x.dim() - 1)))
        delta = delta * factor
    return x + delta
