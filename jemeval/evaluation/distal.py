"""Distal adversarials: nonsense images a classifier is confident about (the JEM paper's evaluation, docs/reproducing.md).

Start from U(-1, 1) noise and climb log p(y = target | x) by gradient ascent (Adam on the pixels,
clamped to [-1, 1]) for ``steps`` steps, optionally through K steps of SGLD refinement (the
defended classifier). A model whose confidence tracks the data density should *not* reach high
confidence on such images; an ordinary classifier usually reaches ~100% within a few steps.

The confidence reported is re-measured by a fresh refined classifier (new noise draws), not taken
from the optimisation.
"""
from __future__ import annotations

import sys
from collections.abc import Sequence

import torch

from jemeval.energy.model import EnergyModel
from jemeval.errors import UsageError
from jemeval.evaluation.batching import prepare_model
from jemeval.provenance import provenance
from jemeval.results import Result
from jemeval.runtime.devices import resolve_device
from jemeval.sampling.buffer import uniform_like_shape
from jemeval.sampling.recorded import recorded_sgld
from jemeval.sampling.refinement import RefinedClassifier
from jemeval.sampling.sgld import frozen


def distal(
    model: EnergyModel | str,
    targets: int | Sequence[int],
    *,
    n: int = 16,
    steps: int = 200,
    lr: float = 0.05,
    refine_steps: int = 0,
    grad_mode: str = "full",
    chains: int = 5,
    sigma: float = 0.0,
    seed: int = 0,
    device: str | torch.device = "cpu",
    grid: str | None = None,
    progress: bool | None = None,
) -> Result:
    """Optimise ``n`` noise images per target class towards p(target | x) -> 1.

    Returns one record per target with the confidence reached (mean, median, min, max over the
    images, re-measured with fresh chains) and the mean confidence at the start; ``extra`` holds
    every image's confidence and the mean-confidence trace. ``grid``: save the images as a PNG,
    one row per target, each captioned with its confidence.
    """
    from tqdm.auto import tqdm

    device = resolve_device(device)
    model = prepare_model(model, device)  # a path loads the checkpoint (its hash goes into provenance)
    targets = [targets] if isinstance(targets, int) else [int(t) for t in targets]
    if not targets:
        raise UsageError("no --target given; pass a class index such as --target 3")
    for t in targets:
        if not 0 <= t < model.num_classes:
            raise UsageError(f"--target {t} is not a class of this model: use 0..{model.num_classes - 1}")
    for name, value, low in (("--n", n, 1), ("--steps", steps, 0), ("--refine-steps", refine_steps, 0), ("--chains", chains, 1)):
        if int(value) < low:
            raise UsageError(f"{name} must be >= {low}, got {value}")
    if not lr > 0:
        raise UsageError(f"--lr must be > 0, got {lr}")
    if sigma < 0:
        raise UsageError(f"--sigma must be >= 0, got {sigma}")

    sgld = recorded_sgld(model, refine_steps)[0]
    attacked = RefinedClassifier(model, refine_steps, chains=chains, sigma=sigma, sgld=sgld, grad_mode=grad_mode)
    checker = RefinedClassifier(model, refine_steps, chains=chains, sigma=sigma, sgld=sgld,
                                generator=torch.Generator(device=device).manual_seed(seed + 1))
    g = torch.Generator(device=device).manual_seed(seed)
    y = torch.tensor(targets, device=device).repeat_interleave(n)
    x = uniform_like_shape(len(y), model.input_shape, device=device, generator=g).requires_grad_(True)
    with torch.no_grad():
        start_conf = checker(x).softmax(1).gather(1, y.view(-1, 1)).squeeze(1)
    opt = torch.optim.Adam([x], lr=lr)
    trace = []
    with torch.random.fork_rng(devices=[device] if device.type == "cuda" else []), frozen(model):
        torch.manual_seed(seed)
        for _ in tqdm(range(steps), desc="distal", file=sys.stderr,
                      disable=(None if progress is None else not progress)):
            logp = attacked(x).log_softmax(1).gather(1, y.view(-1, 1)).squeeze(1)
            trace.append(logp.detach().exp().mean())
            opt.zero_grad(set_to_none=True)
            (-logp.sum()).backward()
            opt.step()
            with torch.no_grad():
                x.clamp_(-1, 1)
    images = x.detach()
    with torch.no_grad():
        logits = checker(images)  # one pass: confidence and prediction from the same chains
        conf = logits.softmax(1).gather(1, y.view(-1, 1)).squeeze(1)
        predicted = logits.argmax(1)

    records = []
    for i, t in enumerate(targets):
        c = conf[i * n:(i + 1) * n]
        records.append({
            "target": t, "n": n, "steps": steps, "refine_steps": refine_steps, "grad_mode": grad_mode,
            "chains": chains, "sigma": sigma, "start_confidence": float(start_conf[i * n:(i + 1) * n].mean()),
            "mean_confidence": float(c.mean()), "median_confidence": float(c.median()),
            "min_confidence": float(c.min()), "max_confidence": float(c.max()),
            "predicted_as_target": float((predicted[i * n:(i + 1) * n] == t).double().mean()),
        })
    settings = {"targets": targets, "n": n, "steps": steps, "optimizer": "Adam on pixels, clamped to [-1, 1]", "lr": lr,
                "init": "U(-1, 1)", "objective": "log p(y = target | x)", "refinement": attacked.settings(),
                "confidence": "re-measured with fresh chains (generator seed + 1)"}
    result = Result(
        records=records,
        provenance=provenance(command="distal", model=model, device=device, seed=seed,
                              settings=settings),
        extra={"confidences": conf.tolist(), "targets_per_image": y.tolist(),
               "mean_confidence_trace": torch.stack(trace).tolist() if trace else []},
    )
    if grid:
        from jemeval.plots.grids import save_image_grid

        save_image_grid(images, grid, nrow=n, row_labels=[f"y={t}" for t in targets],
                        captions=[f"{float(c):.2f}" for c in conf],
                        title=f"distal adversarials: p(target | x) after {steps} steps, K={refine_steps}")
    return result
