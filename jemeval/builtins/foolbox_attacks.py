"""Built-in attacks from foolbox, each a :class:`jemeval.Attack`, registered through
``register_attacks`` like a plugin's (the torchattacks ones are in
:mod:`jemeval.builtins.torchattacks_attacks`).

Each factory is called as ``factory(norm, **options)`` and returns an :class:`~jemeval.Attack`,
``attack(model, x, y, epsilons) -> Tensor[E, N, C, H, W]``; epsilons are in [0, 1] *pixel units*
and converted here to the [-1, 1] model space (x 2). foolbox is imported only when an attack runs,
with its (and eagerpy's) import-time warnings contained, so ``jemeval --help`` never pays for it.

* ``pgd``: projected gradient descent (foolbox L2PGD / LinfPGD) with random start and restarts
  (a restart keeps, per example and epsilon, the first adversarial found). The white-box attack.
* ``boundary``: the decision-based Boundary attack (Brendel et al. 2018), started, as in the JEM
  paper, from a correctly classified input of the model's top-2 class. Gradient-free.
* ``pointwise``: the Pointwise attack (Schott et al. 2019) from the same starting points.
  Gradient-free.

Boundary and Pointwise are *minimisation* attacks: they look for the smallest adversarial
perturbation of each input, so besides the per-epsilon adversarials they expose
``minimize(model, x, y)`` (see :class:`jemeval.Attack`) from which jemeval derives each example's
minimal perturbation and the robustness-distortion curve.

Decision-based attacks assume a deterministic classifier; a model with SGLD refinement is
stochastic. They therefore query the model with *common random numbers*: the global RNG is reset to
the same seed before every forward pass, so the decision surface the attack explores is fixed
(one fixed draw of the chains' noise). jemeval re-classifies the result with fresh chains anyway.

foolbox 3.3 (no release since 2024) breaks at import on a machine without a ``git`` binary (GitPython,
for its model zoo) and will on SciPy 2 (``scipy.ndimage.filters``): :func:`prepare_foolbox_import`
works around both, and a foolbox that still fails to import is reported in one line that says so.
foolbox models always get ``device=`` the attacked model's device (foolbox picks CUDA when visible).
"""
from __future__ import annotations

import contextlib
import importlib
import os
import sys
import warnings
from collections.abc import Sequence
from typing import Any

import torch
from torch import nn

from jemeval.components import pixel_to_model_scale
from jemeval.components.attack import Attack
from jemeval.errors import JemevalError, UsageError
from jemeval.evaluation.robust.threat import check_norm, project_to_ball
from jemeval.hookspecs import hookimpl

BOUNDS = (-1.0, 1.0)


# -- helpers shared by the adapters -------------------------------------------------------------
@contextlib.contextmanager
def quiet_foolbox():
    """Contain foolbox / eagerpy / scipy deprecation chatter (import time and run time)."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        warnings.simplefilter("ignore", FutureWarning)
        warnings.filterwarnings("ignore", module=r"(foolbox|eagerpy)(\.|$)")
        yield


def import_foolbox():
    """foolbox, imported the one way jemeval does it (see :func:`prepare_foolbox_import`)."""
    prepare_foolbox_import()
    with quiet_foolbox():
        try:
            import foolbox
        except Exception as exc:  # an import-time failure of any kind (GitPython raises ImportError)
            raise JemevalError(f"foolbox (pgd, boundary, pointwise) could not be imported: {type(exc).__name__}: "
                               f"{one_line(exc)}; the torchattacks attacks (apgd-ce, autoattack, ...) do not need "
                               "it") from None
    return foolbox


def prepare_foolbox_import() -> None:
    """Work around foolbox 3.3's import-time breakages before importing it.

    * foolbox imports GitPython (for its model zoo), which refuses to import without a ``git``
      binary unless ``GIT_PYTHON_REFRESH=quiet``: set it (if unset); no attack here uses git.
    * foolbox's blur attack imports ``scipy.ndimage.filters``, a namespace SciPy deprecated and
      will remove in 2.0: where it is gone, alias it to ``scipy.ndimage`` (same functions).
    """
    os.environ.setdefault("GIT_PYTHON_REFRESH", "quiet")
    if "scipy.ndimage.filters" not in sys.modules:
        with quiet_foolbox():
            try:
                importlib.import_module("scipy.ndimage.filters")
            except ImportError:
                sys.modules["scipy.ndimage.filters"] = importlib.import_module("scipy.ndimage")


def one_line(exc: BaseException) -> str:
    """The first non-empty line of an exception's message (GitPython's run to a dozen)."""
    lines = [line.strip() for line in str(exc).splitlines() if line.strip()]
    return lines[0] if lines else ""


def foolbox_model(model: nn.Module, device: torch.device | str | None = None):
    """``fb.PyTorchModel`` on [-1, 1] (the model must already be in eval mode), on ``device``, by
    default the model's own (foolbox would otherwise pick CUDA whenever it is visible)."""
    fb = import_foolbox()
    if device is None:
        device = next((p.device for p in model.parameters()), torch.device("cpu"))
    with quiet_foolbox():
        return fb.PyTorchModel(model, bounds=BOUNDS, device=device)


class CommonRandomNumbers(nn.Module):
    """The wrapped model with the global RNG reset to ``seed`` before every forward pass.

    Makes a stochastic classifier (SGLD refinement, sigma noise) a fixed function of its input
    batch, which decision-based attacks need (their bookkeeping assumes repeatable decisions).
    """

    def __init__(self, model: nn.Module, seed: int) -> None:
        super().__init__()
        self.model = model
        self.seed = int(seed)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        devices = [x.device] if x.device.type == "cuda" else []
        with torch.random.fork_rng(devices=devices):
            torch.manual_seed(self.seed)
            return self.model(x)


# -- PGD ------------------------------------------------------------------------------------------
class PGDAttack(Attack):
    """PGD (foolbox L2PGD / LinfPGD) with random start and ``restarts`` independent runs.

    steps:        iterations per run (the JEM paper: 100)
    restarts:     independent random starts; per example and epsilon the first success is kept
                  (the JEM paper: 20)
    rel_stepsize: step size relative to epsilon (default 2.5 / steps, Madry et al.'s rule)
    random_start: start from a random point in the epsilon ball
    """

    def __init__(self, norm: str, *, steps: int = 40, restarts: int = 1, rel_stepsize: float | None = None,
                 random_start: bool = True) -> None:
        super().__init__(check_norm(norm))
        if int(steps) < 1:
            raise UsageError(f"attack 'pgd' needs steps >= 1 (e.g. pgd:steps=40), got {steps}")
        if int(restarts) < 1:
            raise UsageError(f"attack 'pgd' needs restarts >= 1 (e.g. pgd:restarts=5), got {restarts}")
        self.steps = int(steps)
        self.restarts = int(restarts)
        self.rel_stepsize = float(rel_stepsize) if rel_stepsize is not None else 2.5 / self.steps
        self.random_start = bool(random_start)

    @property
    def settings(self) -> dict[str, Any]:
        return {"attack": "pgd", "backend": "foolbox", "norm": self.norm, "steps": self.steps,
                "restarts": self.restarts, "rel_stepsize": self.rel_stepsize, "random_start": self.random_start}

    def foolbox_attack(self):
        """The foolbox attack object this adapter runs."""
        fb = import_foolbox()
        cls = fb.attacks.LinfPGD if self.norm == "linf" else fb.attacks.L2PGD
        attack = cls(steps=self.steps, rel_stepsize=self.rel_stepsize, random_start=self.random_start)
        return attack.repeat(self.restarts) if self.restarts > 1 else attack

    def forward(self, model: nn.Module, x: torch.Tensor, y: torch.Tensor, epsilons: Sequence[float],
                eot_samples: int | None = None) -> torch.Tensor:
        fb = import_foolbox()
        fmodel = foolbox_model(model, device=x.device)
        eps_model = [pixel_to_model_scale(e) for e in epsilons]
        with quiet_foolbox():
            _, clipped, _ = self.foolbox_attack()(fmodel, x, fb.criteria.Misclassification(y), epsilons=eps_model)
        return torch.stack([c.detach() for c in clipped])


# -- decision-based minimisation attacks -------------------------------------------------------------
def top2_starting_points(model: nn.Module, x: torch.Tensor, y: torch.Tensor,
                         pool_x: torch.Tensor | None = None, pool_y: torch.Tensor | None = None,
                         max_rounds: int = 8) -> tuple[torch.Tensor, torch.Tensor]:
    """(starting points, valid mask): for each input, a correctly classified input of its top-2
    class (the JEM paper's Boundary initialisation), else of the next most probable class.

    ``model`` is the (deterministic) function the attack will query. The pool defaults to the batch
    itself. A cleanly misclassified input is its own starting point. Candidates are re-checked on
    the batch as the attack will see it, and a candidate that is not adversarial there is replaced
    by the next one, all vectorised (``max_rounds`` rounds); ``valid`` marks inputs with a start.
    """
    pool_x = x if pool_x is None else pool_x
    pool_y = y if pool_y is None else pool_y
    with torch.no_grad():
        logits = model(x)
        pool_pred = model(pool_x).argmax(1)
    k = logits.shape[1]
    # class rank of every pool item for every input: lower = more probable class for that input
    class_rank = torch.empty_like(logits, dtype=torch.long)
    class_rank.scatter_(1, logits.argsort(1, descending=True), torch.arange(k, device=x.device).expand_as(logits))
    usable = (pool_pred == pool_y)  # correctly classified pool items
    rank = class_rank[:, pool_y.clamp(min=0)]  # N x P
    ok = usable.unsqueeze(0) & (pool_y.unsqueeze(0) != y.unsqueeze(1)) & (pool_y.unsqueeze(0) >= 0)
    big = k + 1
    order = torch.where(ok, rank, torch.full_like(rank, big)).argsort(dim=1, stable=True)  # N x P candidates
    n_candidates = ok.sum(1)
    pointer = torch.zeros(len(x), dtype=torch.long, device=x.device)
    misclassified = logits.argmax(1) != y
    valid = misclassified | (n_candidates > 0)
    for _ in range(max_rounds):
        cand = order.gather(1, pointer.clamp(max=order.shape[1] - 1).unsqueeze(1)).squeeze(1)
        starts = torch.where(misclassified.view(-1, *([1] * (x.dim() - 1))), x, pool_x[cand])
        with torch.no_grad():
            bad = valid & (model(starts).argmax(1) == y)
        if not bad.any():
            break
        pointer = pointer + bad.long()
        valid = valid & ~(bad & (pointer >= n_candidates))
    else:
        with torch.no_grad():
            valid = valid & (model(starts).argmax(1) != y)
    return starts, valid


class MinimizationAttack(Attack):
    """A foolbox decision-based minimisation attack started from top-2-class inputs.

    Subclasses give ``name`` and ``make(fb)`` (the foolbox attack). ``minimize`` returns the
    smallest adversarials found (inputs left unchanged where no start exists); a call projects
    them onto each epsilon ball, as foolbox's own ``__call__`` does.
    """

    gradient_free = True
    minimization = True
    name = "minimization"

    def __init__(self, norm: str, *, crn_seed: int = 0) -> None:
        super().__init__(check_norm(norm))
        self.crn_seed = int(crn_seed)
        #: inputs for which no adversarial starting point was found in the last call
        self.last_without_start = 0

    def make(self, fb):  # pragma: no cover - abstract
        raise NotImplementedError

    @property
    def settings(self) -> dict[str, Any]:
        return {"attack": self.name, "backend": "foolbox", "norm": self.norm,
                "init": "correctly classified input of the top-2 class",
                "common_random_numbers_seed": self.crn_seed}

    def forward_minimal(self, model: nn.Module, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        """Adversarials of (locally) minimal size in the model space; unchanged inputs where the
        attack had no adversarial starting point (re-classification counts those as robust)."""
        fb = import_foolbox()
        crn = CommonRandomNumbers(model, self.crn_seed).eval()
        # Dropping inputs without a start changes the batch, hence the fixed noise draw, hence
        # possibly other starts' validity: repeat until the batch the attack sees is consistent.
        active = torch.arange(len(x), device=x.device)
        for _ in range(10):
            starts, ok = top2_starting_points(crn, x[active], y[active], pool_x=x, pool_y=y)
            if ok.all():
                break
            active = active[ok]
        else:
            active = active[:0]
        self.last_without_start = len(x) - len(active)
        out = x.clone()
        if len(active):
            fmodel = foolbox_model(crn, device=x.device)
            with quiet_foolbox():
                adv = self.make(fb).run(fmodel, x[active], fb.criteria.Misclassification(y[active]),
                                        starting_points=starts)
            out[active] = adv.detach().to(out.dtype)
        return out

    def forward(self, model: nn.Module, x: torch.Tensor, y: torch.Tensor, epsilons: Sequence[float],
                eot_samples: int | None = None) -> torch.Tensor:
        adv = self.forward_minimal(model, x, y)
        return torch.stack([project_to_ball(x, adv, pixel_to_model_scale(e), self.norm) for e in epsilons])


class BoundaryAttack(MinimizationAttack):
    """Boundary attack (foolbox), decision-based, from a correctly classified top-2-class input.

    steps: iterations (foolbox's default 25,000 is far more than a quick evaluation needs)
    spherical_step, source_step: initial step sizes (adapted during the run)
    """

    name = "boundary"

    def __init__(self, norm: str, *, steps: int = 1000, spherical_step: float = 0.01, source_step: float = 0.01,
                 crn_seed: int = 0) -> None:
        super().__init__(norm, crn_seed=crn_seed)
        if int(steps) < 1:
            raise UsageError(f"attack 'boundary' needs steps >= 1 (e.g. boundary:steps=1000), got {steps}")
        self.steps = int(steps)
        self.spherical_step = float(spherical_step)
        self.source_step = float(source_step)

    @property
    def settings(self) -> dict[str, Any]:
        return {**super().settings, "steps": self.steps, "spherical_step": self.spherical_step,
                "source_step": self.source_step}

    def make(self, fb):
        return fb.attacks.BoundaryAttack(steps=self.steps, spherical_step=self.spherical_step,
                                         source_step=self.source_step)


class PointwiseAttack(MinimizationAttack):
    """Pointwise attack (foolbox): resets pixels to their clean values while still adversarial."""

    name = "pointwise"

    def __init__(self, norm: str, *, l2_binary_search: bool = True, crn_seed: int = 0) -> None:
        super().__init__(norm, crn_seed=crn_seed)
        self.l2_binary_search = bool(l2_binary_search)

    @property
    def settings(self) -> dict[str, Any]:
        return {**super().settings, "l2_binary_search": self.l2_binary_search}

    def make(self, fb):
        return fb.attacks.PointwiseAttack(l2_binary_search=self.l2_binary_search)


def pgd(norm: str, *, steps: int = 40, restarts: int = 1, rel_stepsize: float | None = None,
        random_start: bool = True) -> PGDAttack:
    """PGD with random restarts (foolbox), white-box: gradients through the model."""
    return PGDAttack(norm, steps=steps, restarts=restarts, rel_stepsize=rel_stepsize, random_start=random_start)


def boundary(norm: str, *, steps: int = 1000, spherical_step: float = 0.01, source_step: float = 0.01,
             crn_seed: int = 0) -> BoundaryAttack:
    """Boundary attack (foolbox), gradient-free, from a correctly classified top-2-class input."""
    return BoundaryAttack(norm, steps=steps, spherical_step=spherical_step, source_step=source_step, crn_seed=crn_seed)


def pointwise(norm: str, *, l2_binary_search: bool = True, crn_seed: int = 0) -> PointwiseAttack:
    """Pointwise attack (foolbox), gradient-free, from a correctly classified top-2-class input."""
    return PointwiseAttack(norm, l2_binary_search=l2_binary_search, crn_seed=crn_seed)


#: name -> attack factory
BUILTIN_ATTACKS: dict = {"pgd": pgd, "boundary": boundary, "pointwise": pointwise}


@hookimpl
def register_attacks(register):
    for name, factory in BUILTIN_ATTACKS.items():
        register(name, factory)
