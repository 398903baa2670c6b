"""The threat model of ``jemeval robust``: norms, perturbation sizes and epsilon balls.

Epsilons are given and reported in [0, 1] *pixel units* (:func:`jemeval.pixel_to_model_scale`
converts them to the [-1, 1] model space, x 2); the sizes here are measured in the model space.
Shared by the robustness evaluation and the built-in attacks (:mod:`jemeval.builtins.attacks`).
"""
from __future__ import annotations

import math
from collections.abc import Iterable, Sequence

import numpy as np
import torch

from jemeval.components import NORMS
from jemeval.errors import UsageError, did_you_mean

#: an epsilon written "max" is the norm's largest: Linf 1, L2 the diameter of the input space,
#: sqrt(C x H x W) in pixel units. Every image is within reach there, so the large-epsilon sanity
#: check (:func:`jemeval.evaluation.robust.checks.reaches_everything`) runs at every K; the report's
#: presets end their L2 lists with it, whatever the dataset's image size.
MAX_EPSILON = "max"


def epsilon_limit(norm: str, input_shape: Sequence[int]) -> float:
    """The largest epsilon of ``norm`` in pixel units: Linf 1, L2 sqrt(C x H x W)."""
    return 1.0 if norm == "linf" else math.sqrt(float(np.prod(input_shape)))


def epsilon_value(e: float | str, limit: float) -> float:
    """One epsilon as a number: ``"max"`` is ``limit``; anything else must be a number."""
    if isinstance(e, str) and e.strip().lower() == MAX_EPSILON:
        return float(limit)
    try:
        return float(e)
    except (TypeError, ValueError):
        raise UsageError(f"epsilon {e!r} is not a number: give numbers in [0, 1] pixel units (e.g. 8/255 as "
                         f"0.0314) or {MAX_EPSILON!r} for the norm's largest", param="epsilons") from None


# -- argument checking -------------------------------------------------------------------------------
def check_epsilons(epsilons: Iterable[float | str], norm: str, input_shape: Sequence[int]) -> list[float]:
    """Epsilons in pixel units: finite, >= 0, Linf <= 1, L2 <= the largest possible L2 distance
    (``"max"``: that largest, :data:`MAX_EPSILON`)."""
    dims = int(np.prod(input_shape))
    limit = epsilon_limit(norm, input_shape)
    eps = [epsilon_value(e, limit) for e in epsilons]
    if not eps:
        raise UsageError("epsilons is empty; give e.g. 0,8/255,16/255", param="epsilons")
    for e in eps:
        if not math.isfinite(e) or e < 0 or e > limit + 1e-9:
            raise UsageError(
                f"epsilon {e:g} is out of range for {norm}: epsilons are in [0, 1] pixel units, so {norm} "
                f"epsilons must lie in [0, {limit:g}]" + (f" (sqrt of {dims} input dimensions)" if norm == "l2" else "")
                + "; e.g. 0,8/255,16/255 for linf or 0,0.5,1 for l2", param="epsilons"
            )
    return sorted(set(eps))



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
