"""SGLD refinement as a classifier: the JEM robustness defence, wrapped as a model.

Before classifying, each input is duplicated into ``chains`` copies, each copy gets
``sigma * N(0, I)`` noise and is moved by ``steps`` SGLD steps up log p~(x) (the shared
:class:`jemeval.sampling.sgld.SGLD`), and the logits of the refined copies are averaged
(the JEM paper's evaluation, docs/reproducing.md; the paper uses 5 chains and 0, 1 or 10 steps).

How an attacker differentiates through this stochastic, iterative defence decides how strong the
attack is, so it is an explicit, recorded setting (``grad_mode``):

``full``
    the exact gradient through every SGLD step (the graph w.r.t. the *input* only; parameters
    stay frozen). Memory grows with the steps, so each step can be recomputed during the backward
    pass instead of stored (``checkpoint``; by default on from 5 steps).
``bpda``
    forward: logits at the refined input; backward: the refinement is treated as the identity,
    i.e. the gradient of the logits at the refined point, passed straight to the input. This is
    what the JEM release effectively computed (its update writes ``x.data`` outside autograd).
``eot``
    expectation over transformation: the logits averaged over ``eot_samples`` independent draws
    of the chains' noise, each differentiated exactly as in ``full``.
``bpda+eot``
    BPDA's identity backward, averaged over ``eot_samples`` independent noise draws: the cheap
    gradient of ``bpda`` without its single-draw variance (the usual attack on a randomised,
    non-differentiable pre-processing defence; Athalye et al. 2018).

An attack that averages gradients over draws itself (APGD's ``eot_iter``) gets a classifier with
``eot_samples=1`` in the EOT modes and does the averaging in its own loop instead (see
:mod:`jemeval.evaluation.attack_loop`).

With ``steps=0`` and ``sigma=0`` the wrapper returns the model's own logits, bit for bit, so a
K = 0 attack is exactly an attack on the plain model.
"""
from __future__ import annotations

import dataclasses
from typing import Any

import torch
from torch import nn

from jemeval.energy.model import log_p
from jemeval.errors import UsageError
from jemeval.sampling.recorded import recorded_sgld, sampler_note
from jemeval.sampling.sgld import SGLD, frozen, input_grad

GRAD_MODES = ("full", "bpda", "eot", "bpda+eot")
#: the modes that average over ``eot_samples`` noise draws, and the single-draw mode each extends
EOT_MODES = {"eot": "full", "bpda+eot": "bpda"}
#: refinement with at least this many steps uses gradient checkpointing when ``checkpoint=None``
AUTO_CHECKPOINT_STEPS = 5


class RefinedClassifier(nn.Module):
    """``forward(x)`` -> logits after SGLD refinement, averaged over noisy chains (N x K).

    Quacks like an :class:`~jemeval.energy.model.EnergyModel` (``logits``, ``log_px``, ``energy``,
    ``probs``, ``predict``, ``num_classes``, ``input_shape``, ``metadata``) so that scores,
    metrics and attacks treat a defended model like any other.
    """

    def __init__(
        self,
        model: nn.Module,
        steps: int,
        *,
        chains: int = 5,
        sigma: float = 0.0,
        sgld: SGLD | None = None,
        grad_mode: str = "full",
        eot_samples: int = 1,
        checkpoint: bool | None = None,
        generator: torch.Generator | None = None,
    ) -> None:
        super().__init__()
        if int(steps) < 0:
            raise UsageError(f"refinement steps must be >= 0 (0 = no refinement), got {steps}")
        if int(chains) < 1:
            raise UsageError(f"chains must be >= 1, got {chains}")
        if float(sigma) < 0:
            raise UsageError(f"sigma must be >= 0, got {sigma}")
        if grad_mode not in GRAD_MODES:
            raise UsageError(f"grad_mode must be one of {', '.join(GRAD_MODES)}, got {grad_mode!r}")
        if int(eot_samples) < 1:
            raise UsageError(f"eot_samples must be >= 1, got {eot_samples}")
        self.model = model
        self.steps = int(steps)
        self.chains = int(chains)
        self.sigma = float(sigma)
        base = sgld if sgld is not None else recorded_sgld(model, self.steps)[0]
        self.sgld = dataclasses.replace(base, steps=self.steps)
        self.grad_mode = grad_mode
        self.eot_samples = int(eot_samples) if grad_mode in EOT_MODES else 1
        self.checkpoint = (self.steps >= AUTO_CHECKPOINT_STEPS) if checkpoint is None else bool(checkpoint)
        self.generator = generator

    # -- the EnergyModel look-alike ---------------------------------------------------------------
    @property
    def num_classes(self) -> int:
        return int(self.model.num_classes)

    @property
    def input_shape(self) -> tuple[int, ...]:
        return tuple(self.model.input_shape)

    @property
    def metadata(self) -> dict[str, Any]:
        return getattr(self.model, "metadata", {})

    @property
    def arch(self):
        return getattr(self.model, "arch", None)

    @property
    def arch_options(self):
        return getattr(self.model, "arch_options", None)

    @property
    def device(self) -> torch.device:
        for p in self.model.parameters():
            return p.device
        return torch.device("cpu")

    @property
    def stochastic(self) -> bool:
        """Whether two calls on the same input can differ (chain noise, or SGLD noise in >= 1 step):
        only then do noise draws, EOT and repeated re-checks mean anything."""
        return self.sigma > 0 or (self.steps > 0 and self.sgld.noise > 0)

    def logits(self, x: torch.Tensor) -> torch.Tensor:
        return self(x)

    def log_px(self, x: torch.Tensor) -> torch.Tensor:
        """logsumexp of the refined (chain-averaged) logits."""
        return log_p(self(x))

    def energy(self, x: torch.Tensor) -> torch.Tensor:
        return -self.log_px(x)

    def probs(self, x: torch.Tensor) -> torch.Tensor:
        return self(x).softmax(dim=1)

    def predict(self, x: torch.Tensor) -> torch.Tensor:
        return self(x).argmax(dim=1)

    def settings(self) -> dict[str, Any]:
        """Everything that defines the defence, for provenance records."""
        return {
            "refine_steps": self.steps,
            "chains": self.chains,
            "sigma": self.sigma,
            "grad_mode": self.grad_mode,
            "eot_samples": self.eot_samples,
            "checkpoint": self.checkpoint,
            "sgld": self.sgld.settings(),
            **({"sgld_note": note} if (note := sampler_note(self.model)) else {}),
        }

    def extra_repr(self) -> str:
        return (f"steps={self.steps}, chains={self.chains}, sigma={self.sigma}, "
                f"grad_mode={self.grad_mode!r}, eot_samples={self.eot_samples}")

    # -- the defence -------------------------------------------------------------------------------
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.steps == 0 and self.sigma == 0.0:
            return self.model(x)  # nothing stochastic: the plain logits, exactly
        n, copies = x.shape[0], self.chains * self.eot_samples
        xs = x.unsqueeze(1).expand(n, copies, *x.shape[1:]).reshape(n * copies, *x.shape[1:])
        if self.sigma:
            xs = xs + self.sigma * self._randn(xs)
        needs_graph = torch.is_grad_enabled() and x.requires_grad
        if self.steps == 0:
            refined = xs
        elif not needs_graph:
            refined = self._refine(xs.detach(), create_graph=False)
        elif self.grad_mode in ("bpda", "bpda+eot"):
            # forward at the refined point, backward as if refinement were the identity
            refined = xs + (self._refine(xs.detach(), create_graph=False) - xs).detach()
        else:  # full / eot: differentiate through every step
            refined = self._refine(xs, create_graph=True)
        logits = self.model(refined)
        return logits.reshape(n, copies, -1).mean(dim=1)

    def _randn(self, like: torch.Tensor) -> torch.Tensor:
        gen = self.generator if self.generator is not None and self.generator.device == like.device else None
        return torch.randn(like.shape, generator=gen, device=like.device, dtype=like.dtype)

    def _refine(self, x: torch.Tensor, *, create_graph: bool) -> torch.Tensor:
        if create_graph and self.checkpoint:
            return self._refine_checkpointed(x)
        gen = self.generator if self.generator is not None and self.generator.device == x.device else None
        return self.sgld.sample(self.model, x, create_graph=create_graph, generator=gen)

    def _refine_checkpointed(self, x: torch.Tensor) -> torch.Tensor:
        """The SGLD update of :class:`~jemeval.sampling.sgld.SGLD` with the graph kept through every
        step, each step recomputed in the backward pass (torch.utils.checkpoint) instead of
        stored: memory grows with one step's activations, not with ``steps`` of them."""
        from torch.utils.checkpoint import checkpoint

        sgld, model = self.sgld, self.model

        def step(x_k: torch.Tensor, noise: torch.Tensor) -> torch.Tensor:
            # frozen here too: the recomputation runs during backward, outside any outer context
            with frozen(model, train=(sgld.bn_mode == "train")):
                _, grad = input_grad(model, x_k, create_graph=True)
            return sgld.update(x_k, grad, noise, create_graph=True)

        for _ in range(self.steps):
            x = checkpoint(step, x, self._randn(x), use_reentrant=False)
        return x
