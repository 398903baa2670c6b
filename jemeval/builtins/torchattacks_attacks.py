"""Built-in attacks from torchattacks (an optional extra): AutoAttack and its parts, and C&W.

Registered through ``register_attacks`` like a plugin's; each is a :class:`jemeval.Attack`, as the
foolbox ones (:mod:`jemeval.builtins.foolbox_attacks`) are. torchattacks is imported when an attack
is created (one line naming ``pip install 'jemeval[attacks]'`` when it is missing): it pins an old
``requests``, so it is not a dependency of jemeval itself.

* ``apgd-ce``, ``apgd-dlr``: APGD (Croce & Hein 2020) with the cross-entropy / DLR loss;
  ``apgd-t``: targeted APGD-DLR over the top classes. White-box, ``supports_eot``: in the EOT
  gradient modes jemeval passes ``eot_samples`` and APGD averages that many gradients per step
  (its ``eot_iter``), each through fresh refinement noise.
* ``fab``: FAB (Croce & Hein 2020), white-box; ``fab:targeted=true`` is AutoAttack's FAB-T.
* ``square``: the Square attack (Andriushchenko et al. 2020), score-based and gradient-free. It
  queries the model with common random numbers (one fixed noise draw, as the decision-based foolbox
  attacks do); jemeval re-checks with fresh noise.
* ``cw``: Carlini & Wagner's L2 attack (no binary search over c, as in torchattacks), a
  minimisation attack: its minimal adversarials are projected onto each epsilon ball.
* ``autoattack``: torchattacks' AutoAttack, ``version`` ``standard`` (APGD-CE, APGD-T, FAB-T,
  Square) or ``rand`` (APGD-CE and APGD-DLR with EOT, for randomised defences). ``steps`` sets
  every inner attack's iterations (default 100, AutoAttack's own; torchattacks' default is 10).
  The rand version averages :data:`AA_RAND_EOT` (20) gradients per step, as AutoAttack prescribes
  (torchattacks' ``eot_iter=20``), in every gradient mode: its ``own_eot_samples`` tells
  ``robust`` to pass 20 in full/bpda (and record it); the EOT modes pass ``eot_samples``.

torchattacks works on inputs in [0, 1]; jemeval's models take [-1, 1]. Each attack therefore sees
the model behind :class:`UnitInterval` (``x01 -> model(2 * x01 - 1)``). jemeval's epsilons are
already in [0, 1] pixel units, the unit of torchattacks' ``eps``, so they pass unchanged; the
adversarials come back to [-1, 1] with unchanged pixels kept bit for bit. Epsilon 0 returns the
clean inputs without running the attack.

Seeds: APGD, FAB and Square reseed torch's global RNG from their ``seed``; by default that is
the torch seed in force when the attack is called, which ``jemeval robust`` sets per attack call
(its seed + 7919 x batch), so a run is reproducible and an attack on one batch with ``seed`` S
equals torchattacks run directly with ``seed=S``. Library chatter on stdout goes to stderr (stdout
carries ``--json``).
"""
from __future__ import annotations

import contextlib
import sys
from collections.abc import Sequence
from typing import Any

import torch
from torch import nn

from jemeval.builtins.foolbox_attacks import CommonRandomNumbers
from jemeval.components import pixel_to_model_scale
from jemeval.components.attack import Attack
from jemeval.errors import JemevalError, UsageError, did_you_mean
from jemeval.evaluation.robust.threat import check_norm, project_to_ball
from jemeval.hookspecs import hookimpl

INSTALL_HINT = "pip install 'jemeval[attacks]'"
AA_VERSIONS = ("standard", "rand")
#: the EOT draws AutoAttack's rand version averages per gradient (torchattacks' APGD eot_iter=20 there)
AA_RAND_EOT = 20
TA_NORMS = {"linf": "Linf", "l2": "L2"}


def import_torchattacks():
    """torchattacks, or one line saying it is an optional extra and how to install it."""
    try:
        import torchattacks
    except ImportError as exc:
        raise JemevalError(f"the torchattacks attacks (apgd-ce, apgd-dlr, apgd-t, fab, square, cw, autoattack) need "
                           f"the optional dependency torchattacks ({exc}): {INSTALL_HINT}") from None
    return torchattacks


class UnitInterval(nn.Module):
    """The wrapped model on [0, 1] inputs, torchattacks' range: ``x01 -> model(x01 * 2 - 1)``."""

    def __init__(self, model: nn.Module) -> None:
        super().__init__()
        self.model = model

    def forward(self, x01: torch.Tensor) -> torch.Tensor:
        return self.model(x01 * 2 - 1)


def to_unit(x: torch.Tensor) -> torch.Tensor:
    """[-1, 1] model space -> [0, 1]."""
    return (x + 1) / 2


def from_unit(x: torch.Tensor, x01: torch.Tensor, adv01: torch.Tensor) -> torch.Tensor:
    """An adversarial in [0, 1] back in the model space; pixels the attack left alone stay ``x``
    exactly (no round trip through (x + 1) / 2)."""
    adv01 = adv01.detach().to(x.device, x.dtype)
    return torch.where(adv01 == x01, x, adv01 * 2 - 1).clamp(-1, 1)


def classes_of(model: nn.Module, x: torch.Tensor) -> int:
    """The model's number of classes (``num_classes``, else from one forward pass that leaves the
    global RNG as it was)."""
    k = getattr(model, "num_classes", None)
    if k is not None:
        return int(k)
    with torch.no_grad(), torch.random.fork_rng(devices=[x.device] if x.device.type == "cuda" else []):
        return int(model(x[:1]).shape[1])


def check_positive(name: str, option: str, value) -> int:
    """A whole-number option >= 1 of attack ``name``, or one line with an example."""
    if int(value) != value or int(value) < 1:
        raise UsageError(f"attack {name!r} needs {option} >= 1 (e.g. {name}:{option}=100), got {value}")
    return int(value)


class TorchAttack(Attack):
    """One torchattacks attack behind jemeval's interface: ``attack(model, x, y, epsilons)``.

    Subclasses set ``name`` and write ``build(ta, model01, eps, num_classes, seed, eot_samples)``,
    the torchattacks object for one epsilon; ``min_classes`` refuses models its loss cannot attack.
    ``own_eot_samples``: the gradient draws the attack's definition averages itself (None: one, unless
    the caller passes ``eot_samples``).
    """

    name = "torchattacks"
    min_classes = 2

    def __init__(self, norm: str, *, seed: int | None = None) -> None:
        super().__init__(check_norm(norm))
        import_torchattacks()  # fail now, before any model is loaded or attacked
        self.seed = None if seed is None else int(seed)

    @property
    def settings(self) -> dict[str, Any]:
        return {"attack": self.name, "backend": f"torchattacks {import_torchattacks().__version__}",
                "norm": self.norm, "input_range": "[0, 1] (x01 = (x + 1) / 2); eps in pixel units, unchanged",
                "seed": self.seed if self.seed is not None else "the torch seed of each attack call"}

    def build(self, ta, model01: nn.Module, eps: float, *, num_classes: int, seed: int, eot_samples: int):
        raise NotImplementedError  # pragma: no cover - abstract

    def queried(self, model: nn.Module) -> nn.Module:
        """The model the attack queries (gradient-free attacks: a fixed noise draw)."""
        return model

    def call_seed(self) -> int:
        return self.seed if self.seed is not None else torch.initial_seed()

    def forward(self, model: nn.Module, x: torch.Tensor, y: torch.Tensor, epsilons: Sequence[float],
                eot_samples: int | None = None) -> torch.Tensor:
        ta = import_torchattacks()
        eot_samples = int(eot_samples) if eot_samples is not None else int(self.own_eot_samples or 1)
        num_classes = classes_of(model, x)
        if num_classes < self.min_classes:
            raise UsageError(f"attack {self.name!r} needs a model with at least {self.min_classes} classes; this one "
                             f"has {num_classes}: use apgd-ce or pgd")
        model01 = UnitInterval(self.queried(model)).eval()
        x01, seed, out = to_unit(x), self.call_seed(), []
        for eps in epsilons:
            if float(eps) == 0:
                out.append(x.clone())
                continue
            with contextlib.redirect_stdout(sys.stderr):
                attack = self.build(ta, model01, float(eps), num_classes=num_classes, seed=seed,
                                    eot_samples=int(eot_samples))
                adv01 = attack(x01, y)
            out.append(from_unit(x, x01, adv01))
        return torch.stack(out)


class APGDAttack(TorchAttack):
    """APGD with the cross-entropy (``apgd-ce``) or DLR (``apgd-dlr``) loss, or targeted (``apgd-t``)."""

    supports_eot = True

    def __init__(self, norm: str, *, name: str, loss: str, steps: int = 100, restarts: int = 1, rho: float = 0.75,
                 seed: int | None = None) -> None:
        self.name, self.loss = name, loss
        self.min_classes = 4 if loss == "dlr-targeted" else 3 if loss == "dlr" else 2
        super().__init__(norm, seed=seed)
        self.steps = check_positive(name, "steps", steps)
        self.restarts = check_positive(name, "restarts", restarts)
        self.rho = float(rho)

    @property
    def settings(self) -> dict[str, Any]:
        return {**super().settings, "loss": self.loss, "steps": self.steps, "restarts": self.restarts,
                "rho": self.rho, "eot": "eot_iter = eot_samples in the EOT gradient modes (APGD averages gradients)"}

    def build(self, ta, model01, eps, *, num_classes, seed, eot_samples):
        common = {"norm": TA_NORMS[self.norm], "eps": eps, "steps": self.steps, "n_restarts": self.restarts,
                  "seed": seed, "eot_iter": eot_samples, "rho": self.rho}
        if self.loss == "dlr-targeted":
            return ta.APGDT(model01, n_classes=num_classes, **common)
        return ta.APGD(model01, loss=self.loss, **common)


class FABAttack(TorchAttack):
    """FAB; ``targeted=True`` runs AutoAttack's FAB-T (every other class as a target)."""

    name = "fab"

    def __init__(self, norm: str, *, steps: int = 100, restarts: int = 1, targeted: bool = False,
                 alpha_max: float = 0.1, eta: float = 1.05, beta: float = 0.9, seed: int | None = None) -> None:
        super().__init__(norm, seed=seed)
        self.steps = check_positive("fab", "steps", steps)
        self.restarts = check_positive("fab", "restarts", restarts)
        self.targeted = bool(targeted)
        self.alpha_max, self.eta, self.beta = float(alpha_max), float(eta), float(beta)

    @property
    def settings(self) -> dict[str, Any]:
        return {**super().settings, "steps": self.steps, "restarts": self.restarts, "targeted": self.targeted,
                "alpha_max": self.alpha_max, "eta": self.eta, "beta": self.beta}

    def build(self, ta, model01, eps, *, num_classes, seed, eot_samples):
        return ta.FAB(model01, norm=TA_NORMS[self.norm], eps=eps, steps=self.steps, n_restarts=self.restarts,
                      alpha_max=self.alpha_max, eta=self.eta, beta=self.beta, seed=seed,
                      multi_targeted=self.targeted, n_classes=num_classes)


class SquareAttack(TorchAttack):
    """Square: random square-shaped updates kept when the margin loss improves; queries only."""

    name = "square"
    gradient_free = True

    def __init__(self, norm: str, *, queries: int = 5000, restarts: int = 1, p_init: float = 0.8,
                 loss: str = "margin", seed: int | None = None, crn_seed: int = 0) -> None:
        super().__init__(norm, seed=seed)
        self.queries = check_positive("square", "queries", queries)
        self.restarts = check_positive("square", "restarts", restarts)
        if loss not in ("margin", "ce"):
            raise UsageError(f"attack 'square' loss must be margin or ce, got {loss!r}")
        self.p_init, self.loss, self.crn_seed = float(p_init), loss, int(crn_seed)

    @property
    def settings(self) -> dict[str, Any]:
        return {**super().settings, "queries": self.queries, "restarts": self.restarts, "p_init": self.p_init,
                "loss": self.loss, "common_random_numbers_seed": self.crn_seed}

    def queried(self, model):
        return CommonRandomNumbers(model, self.crn_seed)

    def build(self, ta, model01, eps, *, num_classes, seed, eot_samples):
        return ta.Square(model01, norm=TA_NORMS[self.norm], eps=eps, n_queries=self.queries, n_restarts=self.restarts,
                         p_init=self.p_init, loss=self.loss, seed=seed)


class CWAttack(TorchAttack):
    """Carlini & Wagner L2 (Adam on tanh-space pixels, fixed c): minimal adversarials, projected."""

    name = "cw"
    norms = ("l2",)
    minimization = True

    def __init__(self, norm: str, *, c: float = 1.0, kappa: float = 0.0, steps: int = 100, lr: float = 0.01) -> None:
        super().__init__(norm)
        self.c, self.kappa, self.lr = float(c), float(kappa), float(lr)
        self.steps = check_positive("cw", "steps", steps)

    @property
    def settings(self) -> dict[str, Any]:
        return {**super().settings, "c": self.c, "kappa": self.kappa, "steps": self.steps, "lr": self.lr}

    def forward_minimal(self, model: nn.Module, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        """The smallest misclassified point C&W found per input (``x`` itself where none)."""
        ta = import_torchattacks()
        x01 = to_unit(x)
        with contextlib.redirect_stdout(sys.stderr):
            attack = ta.CW(UnitInterval(model).eval(), c=self.c, kappa=self.kappa, steps=self.steps, lr=self.lr)
            adv01 = attack(x01, y)
        return from_unit(x, x01, adv01)

    def forward(self, model, x, y, epsilons, eot_samples=None):
        adv = self.forward_minimal(model, x, y)
        return torch.stack([project_to_ball(x, adv, pixel_to_model_scale(e), self.norm) for e in epsilons])


class AutoAttackEnsemble(TorchAttack):
    """torchattacks' AutoAttack with jemeval's steps; the rand version averages 20 gradient draws
    (:data:`AA_RAND_EOT`) unless the caller passes ``eot_samples`` (robust's EOT modes)."""

    name = "autoattack"

    def __init__(self, norm: str, *, version: str = "standard", steps: int = 100, queries: int = 5000,
                 seed: int | None = None) -> None:
        if version not in AA_VERSIONS:
            raise UsageError(f"unknown AutoAttack version {version!r}{did_you_mean(str(version), AA_VERSIONS)}: use "
                             f"{' or '.join(AA_VERSIONS)}", param="aa_version")
        self.version = version
        self.supports_eot = version == "rand"
        self.own_eot_samples = AA_RAND_EOT if version == "rand" else None
        self.min_classes = 4 if version == "standard" else 3
        super().__init__(norm, seed=seed)
        self.steps = check_positive("autoattack", "steps", steps)
        self.queries = check_positive("autoattack", "queries", queries)

    @property
    def settings(self) -> dict[str, Any]:
        parts = ("apgd-ce, apgd-t, fab-t, square" if self.version == "standard"
                 else f"apgd-ce, apgd-dlr, each with eot_iter = {AA_RAND_EOT} (AutoAttack's rand) in the single-draw "
                      "gradient modes (full, bpda), eot_samples in the EOT modes")
        return {**super().settings, "version": self.version, "attacks": parts, "steps": self.steps,
                **({"queries": self.queries} if self.version == "standard" else {"eot_iter_full_bpda": AA_RAND_EOT})}

    def build(self, ta, model01, eps, *, num_classes, seed, eot_samples):
        aa = ta.AutoAttack(model01, norm=TA_NORMS[self.norm], eps=eps, version=self.version, n_classes=num_classes,
                           seed=seed)
        for inner in aa._autoattack.attacks:  # the ensemble's parts read these when they run
            if hasattr(inner, "n_queries"):
                inner.n_queries = self.queries
            else:
                inner.steps = self.steps
            if hasattr(inner, "eot_iter"):
                inner.eot_iter = eot_samples
        return aa


# -- the factories ------------------------------------------------------------------------------------
def apgd_ce(norm: str, *, steps: int = 100, restarts: int = 1, rho: float = 0.75,
            seed: int | None = None) -> APGDAttack:
    """APGD with the cross-entropy loss (torchattacks), white-box; EOT through its eot_iter."""
    return APGDAttack(norm, name="apgd-ce", loss="ce", steps=steps, restarts=restarts, rho=rho, seed=seed)


def apgd_dlr(norm: str, *, steps: int = 100, restarts: int = 1, rho: float = 0.75,
             seed: int | None = None) -> APGDAttack:
    """APGD with the DLR loss (torchattacks; >= 3 classes), white-box; EOT through its eot_iter."""
    return APGDAttack(norm, name="apgd-dlr", loss="dlr", steps=steps, restarts=restarts, rho=rho, seed=seed)


def apgd_t(norm: str, *, steps: int = 100, restarts: int = 1, rho: float = 0.75,
           seed: int | None = None) -> APGDAttack:
    """Targeted APGD-DLR over every other class (torchattacks APGDT; >= 4 classes), white-box."""
    return APGDAttack(norm, name="apgd-t", loss="dlr-targeted", steps=steps, restarts=restarts, rho=rho, seed=seed)


def fab(norm: str, *, steps: int = 100, restarts: int = 1, targeted: bool = False, alpha_max: float = 0.1,
        eta: float = 1.05, beta: float = 0.9, seed: int | None = None) -> FABAttack:
    """FAB (torchattacks), white-box; targeted=True is AutoAttack's FAB-T."""
    return FABAttack(norm, steps=steps, restarts=restarts, targeted=targeted, alpha_max=alpha_max, eta=eta,
                     beta=beta, seed=seed)


def square(norm: str, *, queries: int = 5000, restarts: int = 1, p_init: float = 0.8, loss: str = "margin",
           seed: int | None = None, crn_seed: int = 0) -> SquareAttack:
    """Square attack (torchattacks), score-based, gradient-free, on one fixed noise draw."""
    return SquareAttack(norm, queries=queries, restarts=restarts, p_init=p_init, loss=loss, seed=seed,
                        crn_seed=crn_seed)


def cw(norm: str, *, c: float = 1.0, kappa: float = 0.0, steps: int = 100, lr: float = 0.01) -> CWAttack:
    """Carlini & Wagner L2 (torchattacks), white-box minimisation attack."""
    return CWAttack(norm, c=c, kappa=kappa, steps=steps, lr=lr)


def autoattack(norm: str, *, version: str = "standard", steps: int = 100, queries: int = 5000,
               seed: int | None = None) -> AutoAttackEnsemble:
    """AutoAttack (torchattacks): version standard or rand (APGD-CE/DLR with EOT, randomised defences)."""
    return AutoAttackEnsemble(norm, version=version, steps=steps, queries=queries, seed=seed)


#: name -> attack factory
TORCHATTACKS_ATTACKS: dict = {"apgd-ce": apgd_ce, "apgd-dlr": apgd_dlr, "apgd-t": apgd_t, "fab": fab,
                              "square": square, "cw": cw, "autoattack": autoattack}


@hookimpl
def register_attacks(register):
    for name, factory in TORCHATTACKS_ATTACKS.items():
        register(name, factory)
