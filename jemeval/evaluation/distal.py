"""Distal adversarials: nonsense images a classifier is confident about (JEM's evaluation, docs/reproducing.md).

Start from U(-1, 1) noise and climb log p(y = target | x) by gradient ascent (Adam on the pixels,
clamped to [-1, 1]) for ``steps`` steps, optionally through K steps of SGLD refinement (the
defended classifier). A model whose confidence tracks the data density should *not* reach high
confidence on such images; an ordinary classifier usually reaches ~100% within a few steps.

The confidence reported is re-measured by a fresh refined classifier (new noise draws), not taken
from the optimisation. The images come back in ``extra["images"]``
(:class:`~jemeval.artifacts.Images`); :func:`jemeval.plots.grids.save_distal_grid` draws them.
"""
from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

from jemeval.artifacts import Images
from jemeval.context import RunContext, takes_context
from jemeval.deprecations import deprecated_keywords
from jemeval.energy.model import EnergyModel
from jemeval.errors import UsageError
from jemeval.evaluation.batching import check_finite_outputs
from jemeval.evaluation.inputs import check_min, prepare_model, stamp
from jemeval.evaluation.limits import check_count, check_memory, check_passes
from jemeval.progress import ProgressArg, progress_bar
from jemeval.results import Result
from jemeval.sampling.buffer import uniform_like_shape
from jemeval.sampling.recorded import recorded_sgld
from jemeval.sampling.refinement import RefinedClassifier
from jemeval.sampling.sgld import frozen


def check_targets(target: int | Sequence[int], num_classes: int) -> list[int]:
    targets = [target] if isinstance(target, int) else [int(t) for t in target]
    if not targets:
        raise UsageError("target is empty; give a class index such as 3", param="target")
    for t in targets:
        if not 0 <= t < num_classes:
            raise UsageError(f"target {t} is not a class of this model: use 0..{num_classes - 1}", param="target")
    return targets


@deprecated_keywords(renamed={"targets": "target", "sigma": "chain_sigma"},
                     outputs={"grid": "jemeval.plots.grids:save_distal_grid"})
@takes_context
def distal(
    model: EnergyModel | str,
    target: int | Sequence[int],
    *,
    n: int = 16,
    steps: int = 200,
    lr: float = 0.05,
    refine_steps: int = 0,
    grad_mode: str = "full",
    chains: int = 5,
    chain_sigma: float = 0.0,
    context: RunContext,
) -> Result:
    """Optimise ``n`` noise images per target class (``target``: one class or a list) towards
    p(target | x) -> 1, through ``refine_steps`` SGLD steps in ``chains`` copies noised by
    ``chain_sigma``.

    Returns one record per target with the confidence reached (mean, median, min, max over the
    images, re-measured with fresh chains) and the mean confidence at the start; ``extra`` holds
    every image's confidence, the mean-confidence trace and the images (``extra["images"]``).
    ``seed``, ``device`` and ``progress``: the run's :class:`~jemeval.context.RunContext`.
    """
    check_distal_args(n=n, steps=steps, lr=lr, refine_steps=refine_steps, chains=chains, chain_sigma=chain_sigma)
    model, seed = prepare_model(model, context.device), context.seed  # a path loads the checkpoint (hashed)
    targets = check_targets(target, model.num_classes)
    refined = refine_steps > 0 or chain_sigma > 0  # every image in chains copies at once
    check_memory("n", [("n", n), ("targets", len(targets))] + ([("chains", chains)] if refined else []),
                 model.input_shape, model.device)
    sgld = recorded_sgld(model, refine_steps)[0]
    attacked = RefinedClassifier(model, refine_steps, chains=chains, sigma=chain_sigma, sgld=sgld, grad_mode=grad_mode)
    checker = RefinedClassifier(model, refine_steps, chains=chains, sigma=chain_sigma, sgld=sgld,
                                generator=torch.Generator(device=model.device).manual_seed(seed + 1))
    y = torch.tensor(targets, device=model.device).repeat_interleave(n)
    images, start_conf, trace = optimise(attacked, checker, y, steps=steps, lr=lr, seed=seed,
                                         progress=context.progress)
    with torch.no_grad():
        logits = checker(images)  # one pass: confidence and prediction from the same chains
    check_finite_outputs("logits", [logits.detach().cpu()], model, sizes=[len(y)], of="the optimised images")
    conf = logits.softmax(1).gather(1, y.view(-1, 1)).squeeze(1)
    records = [distal_record(t, conf[i * n:(i + 1) * n], start_conf[i * n:(i + 1) * n],
                             logits.argmax(1)[i * n:(i + 1) * n], n=n, steps=steps, refine_steps=refine_steps,
                             grad_mode=grad_mode, chains=chains, chain_sigma=chain_sigma)
               for i, t in enumerate(targets)]
    settings = {"targets": targets, "n": n, "steps": steps, "optimizer": "Adam on pixels, clamped to [-1, 1]", "lr": lr,
                "init": "U(-1, 1)", "objective": "log p(y = target | x)", "refinement": attacked.settings(),
                "confidence": "re-measured with fresh chains (generator seed + 1)"}
    return Result(
        records=records,
        provenance=stamp("distal", model, context, settings),
        extra={"confidences": conf.tolist(), "targets_per_image": y.tolist(),
               "mean_confidence_trace": torch.stack(trace).tolist() if trace else [],
               "images": Images(images.cpu())},
    )


def check_distal_args(*, n: int, steps: int, lr: float, refine_steps: int, chains: int, chain_sigma: float) -> None:
    """Every argument of :func:`distal` but the target, before the model is loaded; the counts within
    their ceilings, and steps x (K x chains + 1) passes per image within theirs
    (:mod:`jemeval.evaluation.limits`)."""
    for name, value, low in (("n", n, 1), ("steps", steps, 0), ("refine_steps", refine_steps, 0),
                             ("chains", chains, 1)):
        check_min(name, int(value), low)
    for name, value, kind, low in (("steps", steps, "ascent_steps", 0), ("refine_steps", refine_steps, None, 0),
                                   ("chains", chains, None, 1)):
        check_count(name, value, kind, low=low)
    check_passes("steps", int(steps) * (int(refine_steps) * int(chains) + 1),
                 f"steps {int(steps)} x (refine_steps {int(refine_steps)} x chains {int(chains)} + 1)")
    if not lr > 0:
        raise UsageError(f"lr must be > 0, got {lr}", param="lr")
    check_min("chain_sigma", chain_sigma, 0)


def optimise(attacked: RefinedClassifier, checker: RefinedClassifier, y: torch.Tensor, *, steps: int, lr: float,
             seed: int, progress: ProgressArg) -> tuple[torch.Tensor, torch.Tensor, list[torch.Tensor]]:
    """(images, confidence at the start, mean-confidence trace): Adam on U(-1, 1) pixels ascending
    log p(y | x) of ``attacked``, clamped to [-1, 1] after every step (one progress unit each).
    Non-finite logits at the start (a model whose finite weights overflow) stop before any step."""
    model, device = attacked.model, attacked.device
    x = uniform_like_shape(len(y), model.input_shape, device=device,
                           generator=torch.Generator(device=device).manual_seed(seed)).requires_grad_(True)
    with torch.no_grad():
        start_logits = checker(x)
    check_finite_outputs("logits", [start_logits.cpu()], model, sizes=[len(y)], of="the U(-1, 1) start images")
    start_conf = start_logits.softmax(1).gather(1, y.view(-1, 1)).squeeze(1)
    opt = torch.optim.Adam([x], lr=lr)
    trace = []
    with torch.random.fork_rng(devices=[device] if device.type == "cuda" else []), frozen(model), \
            progress_bar(progress, steps, "distal", leave=True) as bar:
        torch.manual_seed(seed)
        for _ in range(steps):
            logp = attacked(x).log_softmax(1).gather(1, y.view(-1, 1)).squeeze(1)
            trace.append(logp.detach().exp().mean())
            opt.zero_grad(set_to_none=True)
            (-logp.sum()).backward()
            opt.step()
            with torch.no_grad():
                x.clamp_(-1, 1)
            bar.update(1)
    return x.detach(), start_conf, trace


def distal_record(target: int, conf: torch.Tensor, start_conf: torch.Tensor, predicted: torch.Tensor,
                  **settings: Any) -> dict[str, Any]:
    """One target's record: how confident the model became, re-measured with fresh chains."""
    s = settings
    return {
        "target": target, "n": s["n"], "steps": s["steps"], "refine_steps": s["refine_steps"],
        "grad_mode": s["grad_mode"], "chains": s["chains"], "sigma": s["chain_sigma"],
        "start_confidence": float(start_conf.mean()), "mean_confidence": float(conf.mean()),
        "median_confidence": float(conf.median()), "min_confidence": float(conf.min()),
        "max_confidence": float(conf.max()), "predicted_as_target": float((predicted == target).double().mean()),
    }
