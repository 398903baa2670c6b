"""The attack base, in the shape of torchattacks' ``Attack``: one call that sets the model's mode and
restores it, the settings in ``repr``, capabilities as class attributes with defaults.

An attack is made per norm by its registered factory, ``factory(norm, **options)`` (a subclass of
:class:`Attack` registered as the class itself is such a factory), and called as::

    attack(model, x, y, epsilons) -> Tensor[len(epsilons), N, C, H, W]

``model`` maps inputs in [-1, 1] to logits (an :class:`~jemeval.EnergyModel`, possibly wrapped by
SGLD refinement); ``epsilons`` are perturbation sizes in [0, 1] *pixel units* (the literature's
convention; the input space spans 2 units, so a pixel-unit epsilon e is 2e in model space:
:func:`jemeval.pixel_to_model_scale`). The result holds one adversarial batch per epsilon, each
within its epsilon-ball and inside [-1, 1]. jemeval re-classifies the adversarials itself, so an
attack never reports its own success. The call runs :meth:`Attack.forward` with the model in eval
mode and gives every module its own mode back afterwards (torchattacks does the same; an attack
that leaves BatchNorm in train mode would change the model it was handed).

What ``jemeval robust`` does with an attack is declared, never probed:

* ``norms``: the norms it supports; another norm is refused in one line when the attack is made.
* ``settings``: a dict recorded in the results (and shown by ``repr``).
* ``gradient_free = True``: a decision-based attack (never differentiates the model). Its runs are
  recorded with ``grad_mode = "none"`` and compared with the white-box ones: a gradient-free attack
  that beats a white-box attack is flagged (obfuscated gradients).
* ``minimization = True``: :meth:`Attack.minimize` (``forward_minimal`` in a subclass) returns
  adversarials of (locally) minimal size in model space (an input it could not attack unchanged);
  jemeval projects them onto each epsilon ball itself (foolbox's ``clip_perturbation``: Linf clamps,
  L2 scales the perturbation down) and reports each input's minimal perturbation (pixel units,
  verified by re-classification) and the robustness-distortion curve.
* ``last_without_start``: after a call, the number of inputs it could not attack (no adversarial
  starting point); reported in the notes.
* ``supports_eot = True``: the attack averages its gradients over noise draws itself (expectation
  over transformation, like APGD's ``eot_iter``). In the EOT gradient modes jemeval then calls
  ``attack(model, x, y, epsilons, eot_samples=R)`` with a model that draws fresh noise on every
  forward pass; other attacks get a model that averages its logits over R draws in one pass.
* ``own_eot_samples``: the draws the attack's definition averages per gradient in every gradient
  mode (AutoAttack's rand version: 20); None for one.

The caller seeds torch and numpy before every attack call, freezes the model's parameters, and
validates the output (shape, [-1, 1], each epsilon ball) before re-classifying it. This module
imports no torch: a plugin module that subclasses :class:`Attack` at its top stays cheap to import.
"""
from __future__ import annotations

import contextlib
from collections.abc import Iterator, Sequence
from typing import TYPE_CHECKING, Any

from jemeval.components import NORMS
from jemeval.errors import JemevalError, UsageError

if TYPE_CHECKING:
    import torch
    from torch import nn


@contextlib.contextmanager
def eval_mode(model: Any) -> Iterator[None]:
    """``model`` in eval mode inside the block; every module's own train/eval flag restored after."""
    from torch import nn

    modules = list(model.modules()) if isinstance(model, nn.Module) else []
    flags = [m.training for m in modules]
    try:
        if modules:
            model.eval()
        yield
    finally:
        for module, flag in zip(modules, flags):
            module.training = flag


class Attack:
    """Base of adversarial attacks (see the module docstring): subclass it, write :meth:`forward`
    (and :meth:`forward_minimal` for a minimisation attack), register the class or a factory."""

    #: how records and messages name the attack (default: the class name)
    name: str | None = None
    norms: tuple[str, ...] = NORMS
    gradient_free: bool = False
    minimization: bool = False
    supports_eot: bool = False
    own_eot_samples: int | None = None
    last_without_start: int = 0

    def __init__(self, norm: str) -> None:
        if norm not in self.norms:
            raise UsageError(f"attack {self.label!r} does not support norm {norm!r}; it supports "
                             f"{', '.join(self.norms)}")
        self.norm = norm

    @property
    def label(self) -> str:
        return self.name or type(self).__name__

    @property
    def settings(self) -> dict[str, Any]:
        """What the results record about this attack (override to add its options)."""
        return {"attack": self.label, "norm": self.norm}

    def __repr__(self) -> str:
        shown = ", ".join(f"{k}={v!r}" for k, v in self.settings.items() if k != "attack")
        return f"{type(self).__name__}({shown})"

    def __call__(self, model: nn.Module, x: torch.Tensor, y: torch.Tensor, epsilons: Sequence[float],
                 eot_samples: int | None = None) -> torch.Tensor:
        """Adversarials E x N x C x H x W; ``eot_samples`` is given only to ``supports_eot`` attacks."""
        with eval_mode(model):
            return self.forward(model, x, y, epsilons, eot_samples=eot_samples)

    def minimize(self, model: nn.Module, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        """A minimisation attack's smallest adversarials (model space), the model in eval mode."""
        if not self.minimization:
            raise JemevalError(f"attack {self.label!r} is not a minimisation attack (minimization is False); call "
                               "it as attack(model, x, y, epsilons)")
        with eval_mode(model):
            return self.forward_minimal(model, x, y)

    def forward(self, model: nn.Module, x: torch.Tensor, y: torch.Tensor, epsilons: Sequence[float],
                eot_samples: int | None = None) -> torch.Tensor:
        """The attack itself (called by ``attack(...)`` with the model in eval mode)."""
        raise NotImplementedError(f"{type(self).__name__} does not define forward(model, x, y, epsilons)")

    def forward_minimal(self, model: nn.Module, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        """The minimisation itself (called by :meth:`minimize` with the model in eval mode)."""
        raise NotImplementedError(f"{type(self).__name__} does not define forward_minimal(model, x, y)")
