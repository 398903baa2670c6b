"""SGLD refinement as a classifier: the JEM robustness defence, wrapped as a model.

Before classifying, each input is duplicated into ``chains`` copies, each copy gets
``sigma * N(0, I)`` noise and is moved by ``steps`` SGLD steps up log p~(x) (the shared
:class:`jemeval.sampling.sgld.SGLD`), and the logits of the refined copies are averaged
(the JEM paper's evaluation, docs/reproducing.md; the paper uses 5 chains and 0, 1 or 10 steps).

How an attacker differentiates through this stochastic, iterative defence decides how strong the
attack is, so it is an explicit, recorded setting (``grad_mode``):

``full``
    the exact gradient through every SGLD step (the graph w.r.t. the *input* only; parameters
    stay frozen). Stored, that graph grows with the steps (K networks' activations and their
    double-backward); with ``checkpoint`` (the default from 2 steps) each step keeps only its input
    and noise and is recomputed in the backward pass (:class:`CheckpointedStep`): the same numbers
    in memory flat in K, for 1.1-1.5x the time (benchmarks/refine_memory.py).
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
#: refinement with at least this many steps uses gradient checkpointing when ``checkpoint=None``: one
#: step's graph is what a checkpointed backward rebuilds anyway, so below 2 it would cost time for nothing
AUTO_CHECKPOINT_STEPS = 2


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

    def _randn(self, like: torch.Tensor, out: torch.Tensor | None = None) -> torch.Tensor:
        gen = self.generator if self.generator is not None and self.generator.device == like.device else None
        return torch.randn(like.shape, generator=gen, device=like.device, dtype=like.dtype, out=out)

    def _refine(self, x: torch.Tensor, *, create_graph: bool) -> torch.Tensor:
        if create_graph and self.checkpoint:
            return self._refine_checkpointed(x)
        gen = self.generator if self.generator is not None and self.generator.device == x.device else None
        return self.sgld.sample(self.model, x, create_graph=create_graph, generator=gen)

    def _refine_checkpointed(self, x: torch.Tensor) -> torch.Tensor:
        """The chain of :meth:`_refine` with ``create_graph``, each step stored as its input and noise
        only (:class:`CheckpointedStep`): the backward recomputes one step's graph at a time, so
        memory holds two images per step instead of ``steps`` networks' activations. Those images
        live in one block allocated up front: saved one by one between each step's transient
        buffers, they fragmented the CPU heap (peak 1.48x / 1.60x of K = 1 at K = 20 in full / eot
        mode, 1.32x / 1.35x in one block; benchmarks/README.md)."""
        store = torch.empty((self.steps, 2, *x.shape), dtype=x.dtype, device=x.device)
        step = _Step(self.sgld, self.model, self._randn, store)
        for k in range(self.steps):
            x = CheckpointedStep.apply(x, step, k)
        return x


class _Step:
    """One SGLD step of ``model``: its input gradient, the noise drawn as :meth:`SGLD.sample` draws it
    (``draw(like, out)``), and ``store[k]``: where step k keeps its input and its noise."""

    def __init__(self, sgld: SGLD, model: nn.Module, draw, store: torch.Tensor) -> None:
        self.sgld, self.model, self.draw, self.store = sgld, model, draw, store

    def grad(self, x: torch.Tensor, *, create_graph: bool) -> torch.Tensor:
        # frozen here too: the recomputation runs during backward, outside any outer context
        with frozen(self.model, train=(self.sgld.bn_mode == "train")):
            return input_grad(self.model, x, create_graph=create_graph)[1]


class CheckpointedStep(torch.autograd.Function):
    """One SGLD step whose backward recomputes it (gradient checkpointing written for a step that
    itself takes an input gradient).

    Why not ``torch.utils.checkpoint(use_reentrant=False)``: the step's inner ``autograd.grad``
    unpacks the tensors the checkpoint declined to save, which makes it recompute the network
    already in the forward pass and keeps part of each step's graph: measured on CPU
    (benchmarks/refine_memory.py, variant ``torch``) its memory grew 2.2x from K = 1 to 20, this
    one's 1.3x (flat from K = 2), in about the same time. Here the forward is
    one plain step (no graph: one forward and one backward of the network); only x, the noise and
    the RNG state are kept, and the backward rebuilds that one step's double-backward graph, takes
    its vector-Jacobian product and drops it. The noise is drawn after the input gradient, as
    :meth:`SGLD.sample` draws it, and saved; the RNG state is restored for the recomputation
    (dropout in a train-mode sampler draws the same masks) and the caller's stream is left as it
    was. The forward uses the differentiable form of the update, so its output equals the
    unchecked one bit for bit. Not differentiable twice.
    """

    @staticmethod
    def forward(ctx, x: torch.Tensor, step: _Step, k: int) -> torch.Tensor:
        ctx.step, ctx.rng = step, _rng_state(x.device)
        grad = step.grad(x.detach(), create_graph=False)
        noise = step.draw(x, out=step.store[k, 1])
        # on ctx, not save_for_backward: the slots share the store's version counter, which every
        # later step's writes bump; each slot is written once, before its own step reads it
        ctx.saved = step.store[k, 0].copy_(x), noise
        return step.sgld.update(x, grad, noise, create_graph=True)  # no graph: forward runs without grad

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, grad_out: torch.Tensor):
        x, noise = ctx.saved
        devices = [x.device] if x.device.type == "cuda" else []
        with torch.random.fork_rng(devices=devices), torch.enable_grad():
            _set_rng_state(x.device, ctx.rng)
            z = x.detach().requires_grad_(True)
            out = ctx.step.sgld.update(z, ctx.step.grad(z, create_graph=True), noise, create_graph=True)
            (grad_x,) = torch.autograd.grad(out, z, grad_out)
        return grad_x, None, None


def _rng_state(device: torch.device) -> tuple[torch.Tensor, torch.Tensor | None]:
    """The CPU generator's state and, on CUDA, the device's: what a recomputed step may draw from."""
    return torch.get_rng_state(), (torch.cuda.get_rng_state(device) if device.type == "cuda" else None)


def _set_rng_state(device: torch.device, state: tuple[torch.Tensor, torch.Tensor | None]) -> None:
    torch.set_rng_state(state[0])
    if state[1] is not None:
        torch.cuda.set_rng_state(state[1], device)
