"""The attack loop behind :func:`jemeval.evaluation.robust.evaluate.robust`: attack, re-check, count.

For every run (attack, refinement steps K, gradient mode) each batch of inputs is attacked through
a freshly built :class:`~jemeval.sampling.refinement.RefinedClassifier`, the adversarials are checked
(shape, range, inside every epsilon ball) and **re-classified by another refined classifier with
fresh chains**, ``draws`` times with fresh noise each time when the defence is stochastic: nothing
the attack says about its own success is trusted. An input counts as robust at epsilon only if it
is classified correctly clean and under every one of the draws (``robust_accuracy``, with its 95%
Wilson interval ``ci_low``/``ci_high``); ``robust_accuracy_mean`` averages the draws instead.
Minimisation attacks also give each input's minimal adversarial perturbation (verified the same
way: found if any draw misclassifies it).

In the EOT gradient modes an attack that averages gradients over noise draws itself
(``attack.supports_eot``, e.g. APGD's ``eot_iter``) is called with ``eot_samples=`` and attacks a
single-draw classifier; any other attack attacks a classifier that averages its logits over
``eot_samples`` draws. An attack whose definition prescribes its own draws (``own_eot_samples``:
AutoAttack's rand version, 20) gets them in the single-draw modes (full, bpda) too, and the
records say so (:func:`run_eot`). The clean pass stops on non-finite logits (one line naming the
model and the batch: :func:`jemeval.evaluation.batching.check_finite_outputs`).

Seeds depend on the batch, never on the batches run before it (so N processes, each running some
of the batches, give the records of one: :mod:`jemeval.runtime.shards`): on batch b the clean
predictions of K use the stream ``batch_seed(seed + 1000 + K, b)``, the re-checks of run i
``batch_seed(seed + 2000 + 97 i, b)`` (its draws continue that stream), and attack calls run with
torch and numpy seeded ``seed + 7919 b``. ``batch_seed(s, 0) == s``.
"""
from __future__ import annotations

import contextlib
import math
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch
from torch import nn

from jemeval.components import pixel_to_model_scale
from jemeval.components.attack import Attack
from jemeval.errors import JemevalError
from jemeval.evaluation.batching import check_finite_outputs
from jemeval.evaluation.robust.intervals import wilson_interval
from jemeval.evaluation.robust.threat import perturbation_norm, project_to_ball
from jemeval.progress import ProgressArg, ProgressBar, progress_bar
from jemeval.runtime.shards import batch_generator, map_batches, my_batches
from jemeval.sampling.refinement import EOT_MODES, RefinedClassifier
from jemeval.sampling.sgld import SGLD, frozen

#: seconds between progress updates inside one attack call (see :class:`Heartbeat`)
PROGRESS_REFRESH_S = 1.0


@contextlib.contextmanager
def seeded(seed: int, device: torch.device) -> Iterator[None]:
    """Seed torch (and numpy, for foolbox's Pointwise attack); restore both RNGs afterwards."""
    np_state = np.random.get_state()
    devices = [device] if device.type == "cuda" else []
    try:
        with torch.random.fork_rng(devices=devices):
            torch.manual_seed(seed)
            np.random.seed(seed % 2**32)
            yield
    finally:
        np.random.set_state(np_state)


class Heartbeat:
    """A forward hook that keeps the progress moving during one long attack call.

    An attack call on a batch runs for minutes (steps x restarts x refinement chains); the bar
    only advances when it returns. The hook counts the attacked model's forward passes and reports
    the count as the bar's note, at most every ``interval`` seconds.
    """

    def __init__(self, bar: ProgressBar, interval: float | None = None) -> None:
        self.bar, self.interval = bar, PROGRESS_REFRESH_S if interval is None else interval
        self.passes, self.shown = 0, time.monotonic()

    def __call__(self, module, inputs, output) -> None:
        self.passes += 1
        now = time.monotonic()
        if now - self.shown >= self.interval:
            self.shown = now
            self.bar.note(f"{self.passes} model passes")

    @contextlib.contextmanager
    def watching(self, module: nn.Module):
        handle = module.register_forward_hook(self)
        try:
            yield self
        finally:
            handle.remove()


def predict_batches(predictor: nn.Module, x: torch.Tensor, batch_size: int) -> torch.Tensor:
    with torch.no_grad():
        return torch.cat([predictor(x[i:i + batch_size]).argmax(1) for i in range(0, len(x), batch_size)])


def logits_batches(predictor: nn.Module, x: torch.Tensor, batch_size: int) -> torch.Tensor:
    with torch.no_grad():
        return torch.cat([predictor(x[i:i + batch_size]) for i in range(0, len(x), batch_size)])


def validate_adversarials(adv: Any, x: torch.Tensor, epsilons: list[float], norm: str, name: str) -> torch.Tensor:
    """An attack's output must be Tensor[E, N, C, H, W], in bounds and in each epsilon ball."""
    expected = (len(epsilons), *x.shape)
    if not torch.is_tensor(adv) or tuple(adv.shape) != expected:
        got = tuple(adv.shape) if torch.is_tensor(adv) else type(adv).__name__
        raise JemevalError(f"attack {name!r} returned {got}, expected a tensor of shape {expected} "
                           "(epsilons x inputs)")
    adv = adv.detach().to(x.device, x.dtype)
    if not torch.isfinite(adv).all() or adv.min() < -1 - 1e-5 or adv.max() > 1 + 1e-5:
        raise JemevalError(f"attack {name!r} returned adversarials outside the input range [-1, 1] (or non-finite)")
    delta = (adv - x.unsqueeze(0)).flatten(2)
    sizes = delta.abs().amax(2) if norm == "linf" else delta.norm(dim=2)  # E x N, model space
    limits = torch.tensor([pixel_to_model_scale(e) for e in epsilons], device=x.device, dtype=x.dtype).unsqueeze(1)
    excess = sizes - limits * (1 + 1e-5) - 1e-5
    if (excess > 0).any():
        e = int((excess > 0).any(1).nonzero()[0])
        raise JemevalError(
            f"attack {name!r} returned perturbations larger than epsilon {epsilons[e]:g} ({norm}, pixel units): "
            f"largest {float(sizes[e].max()) / 2:.4g}; the attack must stay inside each epsilon ball"
        )
    return adv


def distortion_curve(min_pert: torch.Tensor, max_eps: float, points: int = 101) -> dict[str, list[float]]:
    """Robust accuracy as a function of epsilon from per-example minimal perturbations (pixel
    units; 0 for cleanly misclassified inputs, inf where no adversarial was found)."""
    grid = torch.linspace(0, max_eps, points, dtype=torch.float64)
    d = min_pert.double().cpu()
    acc = (d.unsqueeze(0) > grid.unsqueeze(1)).double().mean(1)
    return {"epsilon": grid.tolist(), "robust_accuracy": acc.tolist()}


def is_minimization(attack: Attack) -> bool:
    """A minimisation attack: it searches each input's smallest adversarial (``minimize``)."""
    return attack.minimization


#: the keys of a robust record that name its row (jemeval.reports.tables.SPECS["robust"])
OUTCOME_KEYS = ("norm", "attack", "grad_mode", "refine_steps", "epsilon")


# -- the defence and one run -----------------------------------------------------------------------
@dataclass
class Defence:
    """The refined classifier as ``robust`` configures it, and the seeded generators of its chains."""

    model: nn.Module
    chains: int
    chain_sigma: float
    sgld: SGLD
    eot_samples: int
    checkpoint: bool | None
    seed: int
    draws: int = 1

    @property
    def device(self) -> torch.device:
        return self.model.device

    def classifier(self, k: int, mode: str, generator: torch.Generator | None = None,
                   eot_samples: int | None = None) -> RefinedClassifier:
        """K refinement steps; a gradient-free run ("none") needs no gradient mode, so it gets "full"."""
        return RefinedClassifier(self.model, k, chains=self.chains, sigma=self.chain_sigma, sgld=self.sgld,
                                 grad_mode="full" if mode == "none" else mode,
                                 eot_samples=self.eot_samples if eot_samples is None else eot_samples,
                                 checkpoint=self.checkpoint, generator=generator)

    def stochastic(self, k: int) -> bool:
        """Whether K-step refinement is random (chain or SGLD noise): else one draw says it all."""
        return self.classifier(k, "full").stochastic

    def draws_for(self, k: int) -> int:
        """Re-check draws at K: ``draws``, or 1 where the classifier is deterministic."""
        return self.draws if self.stochastic(k) else 1

    def generator(self, offset: int, batch: int = 0) -> torch.Generator:
        """The chains' generator of stream ``offset`` for batch ``batch`` (its own stream per batch,
        :func:`jemeval.runtime.shards.batch_generator`; batch 0 is seeded with seed + offset)."""
        return batch_generator(self.seed + offset, batch, self.device)


@dataclass
class Run:
    """One (attack, K, gradient mode) of the evaluation."""

    name: str
    attack: Attack
    refine_steps: int
    grad_mode: str
    #: the EOT count of a sweep's run (None: the defence's ``eot_samples``)
    eot_samples: int | None = None
    #: the re-check noise stream (None: the run's own index); a sweep's counts share their base run's,
    #: so every count is re-checked under the same noise (paired)
    stream: int | None = None


@dataclass
class Batches:
    """The attacked inputs, their labels, the epsilons and how they are cut into attack calls."""

    x: torch.Tensor
    y: torch.Tensor
    epsilons: list[float]
    norm: str
    batch_size: int
    notes: list[str] = field(default_factory=list)  # about the inputs (a set without a test split)
    class_map: dict[str, Any] | None = None  # how the labels were mapped to the model's classes, if they were

    @property
    def spans(self) -> list[tuple[int, int]]:
        return [(i, min(i + self.batch_size, len(self.x))) for i in range(0, len(self.x), self.batch_size)]


def clean_correct(defence: Defence, ks: list[int], data: Batches, bar: ProgressBar) -> dict[int, torch.Tensor]:
    """Per K, which inputs fresh chains classify correctly (one step of the bar per batch; the
    batches shared out over the processes, :func:`jemeval.runtime.shards.map_batches`). Non-finite
    logits stop here, before any attack, naming the model and the first bad batch."""
    clean: dict[int, torch.Tensor] = {}
    sizes = [hi - lo for lo, hi in data.spans]
    for k in ks:
        bar.describe(f"robust: clean K={k}")

        def one(b: int, k: int = k) -> tuple[torch.Tensor, torch.Tensor]:
            lo, hi = data.spans[b]
            predictor = defence.classifier(k, "full", defence.generator(1000 + k, b))
            logits = logits_batches(predictor, data.x[lo:hi], data.batch_size)
            bar.update(1)
            return logits.argmax(1).cpu(), torch.isfinite(logits).all().cpu()

        done = map_batches(one, len(data.spans))
        check_finite_outputs("logits" + (f" after {k} refinement steps" if k else ""), [f for _, f in done],
                             defence.model, sizes=sizes, of="the attacked test subset")
        clean[k] = torch.cat([p for p, _ in done]).to(data.y.device) == data.y
    return clean


def own_eot_samples(attack: Attack) -> int:
    """The noise draws an attack's definition averages per gradient itself, in any gradient mode
    (``own_eot_samples``; AutoAttack's rand version: 20), else 1."""
    return int(attack.own_eot_samples or 1)


def native_eot(run: Run) -> bool:
    """The run averages gradients over noise draws inside the attack (``attack.supports_eot``): in
    the EOT modes, and in the single-draw modes for an attack that prescribes its own draws."""
    if run.grad_mode == "none" or not run.attack.supports_eot:
        return False
    return run.grad_mode in EOT_MODES or own_eot_samples(run.attack) > 1


def run_eot(defence: Defence, run: Run) -> int | None:
    """The noise draws averaged per gradient in a run, as its records say: None without gradients,
    ``eot_samples`` in the EOT modes, else the attack's own (:func:`own_eot_samples`: 1 for most)."""
    if run.grad_mode == "none":
        return None
    if run.grad_mode not in EOT_MODES:
        return own_eot_samples(run.attack)
    return defence.eot_samples if run.eot_samples is None else run.eot_samples


def attack_batch(defence: Defence, run: Run, attacked: nn.Module, b: int, xb: torch.Tensor, yb: torch.Tensor,
                 data: Batches, bar: ProgressBar) -> tuple[torch.Tensor, torch.Tensor | None]:
    """(adversarials E x N, the raw minimal adversarials of a minimisation attack or None) of batch b."""
    eps, norm = data.epsilons, data.norm
    with seeded(defence.seed + 7919 * b, defence.device), frozen(defence.model), Heartbeat(bar).watching(attacked):
        if is_minimization(run.attack):
            raw = run.attack.minimize(attacked, xb, yb).detach()
            return torch.stack([project_to_ball(xb, raw, pixel_to_model_scale(e), norm) for e in eps]), raw
        if native_eot(run):
            return run.attack(attacked, xb, yb, eps, eot_samples=run_eot(defence, run)), None
        return run.attack(attacked, xb, yb, eps), None


def sweep_counts(run: Run) -> str:
    """' eot_samples=5 steps=10' for a run of a sweep (its counts), '' for any other run."""
    if run.stream is None:
        return ""
    steps = run.attack.settings.get("steps")
    return ((f" eot_samples={run.eot_samples}" if run.eot_samples is not None else "")
            + (f" steps={steps}" if steps is not None else ""))


def run_label(run: Run) -> str:
    """'pgd K=2 eot', and for a run of a sweep its counts: 'pgd K=2 eot eot_samples=5 steps=10'."""
    return f"{run.name} K={run.refine_steps} {run.grad_mode}{sweep_counts(run)}"


def attack_run(defence: Defence, run: Run, index: int, data: Batches, bar: ProgressBar):
    """(correct after attack R x E x N over the R re-check draws, verified minimal perturbations N or
    None, inputs without a start). The batches are shared out over the processes
    (:func:`jemeval.runtime.shards.map_batches`): each batch's attack and re-check chains are seeded
    by the batch alone."""
    bar.describe(f"robust: {run_label(run)}")
    attacked = defence.classifier(run.refine_steps, run.grad_mode,
                                  eot_samples=1 if native_eot(run) else run.eot_samples).eval()
    stream = index if run.stream is None else run.stream
    done = map_batches(lambda b: attack_one_batch(defence, run, stream, attacked, b, data, bar), len(data.spans))
    correct_adv = torch.cat([c for c, _, _ in done], dim=2).to(defence.device)
    min_pert = torch.cat([m for _, m, _ in done]).to(defence.device) if is_minimization(run.attack) else None
    return correct_adv, min_pert, sum(w for _, _, w in done)


def attack_one_batch(defence: Defence, run: Run, index: int, attacked: nn.Module, b: int, data: Batches,
                     bar: ProgressBar) -> tuple[torch.Tensor, torch.Tensor | None, int]:
    """Batch b of a run, on the CPU: (correct after attack R x E x n, verified minimal perturbations
    n or None, inputs without a start)."""
    lo, hi = data.spans[b]
    xb, yb = data.x[lo:hi], data.y[lo:hi]
    checker = defence.classifier(run.refine_steps, "full", defence.generator(2000 + 97 * index, b))
    eps, draws = data.epsilons, defence.draws_for(run.refine_steps)
    adv, raw = attack_batch(defence, run, attacked, b, xb, yb, data, bar)
    without_start = int(run.attack.last_without_start or 0)
    adv = validate_adversarials(adv, xb, eps, data.norm, run.name).reshape(-1, *xb.shape[1:])
    correct = torch.stack([predict_batches(checker, adv, data.batch_size).view(len(eps), -1) == yb
                           for _ in range(draws)])
    min_pert = None
    if raw is not None:  # verified minimal perturbation, pixel units: found if any draw is fooled
        fooled = torch.stack([predict_batches(checker, raw, data.batch_size) != yb for _ in range(draws)]).any(0)
        size = perturbation_norm(xb, raw, data.norm).double() / 2
        min_pert = torch.where(fooled, size, torch.full_like(size, math.inf)).cpu()
    bar.update(1)
    return correct.cpu(), min_pert, without_start


def run_records(defence: Defence, run: Run, data: Batches, correct_adv: torch.Tensor, is_clean: torch.Tensor,
                median: float | None, seconds: float) -> list[dict[str, Any]]:
    """One record per epsilon of a run; ``correct_adv`` is draws x epsilons x inputs."""
    robust = correct_adv.all(0) & is_clean.unsqueeze(0)  # E x N: correct clean and under every draw
    draws = int(correct_adv.shape[0])
    correct_draws = (correct_adv & is_clean).sum((0, 2)).tolist()  # per epsilon, over draws and inputs
    clean_acc = float(is_clean.double().mean())
    settings = dict(run.attack.settings)
    mode, n, eot = run.grad_mode, len(data.x), run_eot(defence, run)
    records = []
    for e, count, total in zip(data.epsilons, robust.sum(1).tolist(), correct_draws):
        low, high = wilson_interval(count, n)
        records.append({
            "attack": run.name, "norm": data.norm, "epsilon": e, "refine_steps": run.refine_steps,
            "robust_accuracy": count / n, "clean_accuracy": clean_acc, "n": n, "grad_mode": mode,
            "ci_low": low, "ci_high": high, "draws": draws, "robust_accuracy_mean": total / (draws * n),
            "chains": defence.chains, "sigma": defence.chain_sigma, "eot_samples": eot,
            "steps": settings.get("steps"), "restarts": settings.get("restarts"),
            "gradient_free": bool(run.attack.gradient_free),
            "median_min_perturbation": median, "seconds": round(seconds, 3),
            "converged": None,  # a sweep's verdict (jemeval.evaluation.robust.convergence.convergence)
        })
    return records


def minimal_perturbations(defence: Defence, run: Run, data: Batches, min_pert: torch.Tensor,
                          is_clean: torch.Tensor) -> dict[str, Any]:
    """The per-example minimal perturbations of a minimisation run (0 where the clean input is
    already misclassified), their median and the robustness-distortion curve."""
    min_pert = torch.where(is_clean, min_pert, torch.zeros_like(min_pert))
    max_eps = max(data.epsilons)
    return {
        "attack": run.name, "norm": data.norm, "refine_steps": run.refine_steps, "grad_mode": run.grad_mode,
        "eot_samples": run_eot(defence, run), "steps": run.attack.settings.get("steps"),
        "median": float(min_pert.median()), "found": int(torch.isfinite(min_pert).sum()),
        "values": [v if math.isfinite(v) else None for v in min_pert.tolist()],
        "curve": distortion_curve(min_pert, max_eps if max_eps > 0 else 1.0),
    }


def run_attacks(defence: Defence, runs: list[Run], ks: list[int], data: Batches, *, progress: ProgressArg = None,
                outcomes: list[dict] | None = None) -> tuple[list[dict], list[dict], list[str]]:
    """Every run on every batch: (records, minimal perturbations, notes). ``outcomes``, when given,
    gets one entry per record (same order): its row keys and ``correct``, which inputs are robust.

    The progress has one step per clean-prediction batch and per attacked batch; a
    :class:`Heartbeat` moves it inside each attack call.
    """
    records, min_perturbations, notes = [], [], []
    total = (len(ks) + len(runs)) * len(my_batches(len(data.spans)))  # this process's batches
    with progress_bar(progress, total, "robust", unit="batch", leave=True) as bar:
        clean = clean_correct(defence, ks, data, bar)
        for index, run in enumerate(runs):
            start = time.perf_counter()
            correct_adv, min_pert, without_start = attack_run(defence, run, index, data, bar)
            seconds = time.perf_counter() - start
            is_clean, median = clean[run.refine_steps], None
            if min_pert is not None:
                min_perturbations.append(minimal_perturbations(defence, run, data, min_pert, is_clean))
                median = min_perturbations[-1]["median"]
            if without_start:
                notes.append(f"{run.name} K={run.refine_steps}{sweep_counts(run)}: {without_start} input(s) had no "
                             "adversarial starting point and were not attacked")
            records += run_records(defence, run, data, correct_adv, is_clean, median, seconds)
            if outcomes is not None:  # the E x N outcome the records count, for the report's paired tests
                robust = (correct_adv.all(0) & is_clean.unsqueeze(0)).cpu()
                outcomes += [{**{k: r[k] for k in OUTCOME_KEYS}, "correct": row.tolist()}
                             for r, row in zip(records[len(records) - len(robust):], robust)]
    return records, min_perturbations, notes
