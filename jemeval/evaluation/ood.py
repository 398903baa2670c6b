"""Out-of-distribution detection: how well does a score separate a model's data from other data?

``evaluate_ood(model, ["uniform", "interp"], scores=["logpx", "maxprob", "gradnorm"])`` runs the
shared batch loop once per dataset (logits computed once, every score derived from the same
batch), then reports one record per (score, OOD set) with the built-in OOD metrics (plugin
metrics when named with ``metrics``):

* AUROC and AUPR-In with in-distribution as the positive class;
* AUPR-Out with OOD as the positive class and negated scores;
* FPR95: the fraction of OOD inputs accepted at the threshold that keeps 95% of in-distribution
  inputs (lower is better).

Scores are "higher = more in-distribution" (README.md, Conventions). The per-example scores come
back in the result's ``extra["scores"]`` (:class:`~jemeval.artifacts.OODScores`), which the caller
may save (``save_npz``) so that anyone can recompute the metrics independently, or plot
(:func:`jemeval.plots.ood.plot_ood_result`).
"""
from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch

from jemeval.artifacts import OODScores
from jemeval.data import load_dataset, subsample
from jemeval.deprecations import deprecated_keywords
from jemeval.errors import UsageError
from jemeval.evaluation.batching import (
    DEFAULT_BATCH_SIZE,
    check_input_shape,
    check_input_sigma,
    prepare_model,
    resolve_scores,
    run_batches,
    training_dataset,
)
from jemeval.evaluation.metrics import select_metrics
from jemeval.progress import ProgressArg, progress_bar
from jemeval.provenance import provenance
from jemeval.registry import parse_spec, split_specs
from jemeval.results import Result

__all__ = ["DEFAULT_SCORES", "METRIC_NOTE", "OODScores", "compute_ood_scores", "evaluate_ood", "ood_records"]

DEFAULT_SCORES = ("logpx", "maxprob", "gradnorm")
METRIC_NOTE = (
    "AUROC and AUPR-In treat in-distribution as positive; AUPR-Out treats OOD as positive with negated "
    "scores; FPR95 is the fraction of OOD inputs accepted at the threshold keeping 95% of in-distribution "
    "inputs (lower is better). Scores: higher = more in-distribution."
)


def expand_ood_name(name: str, id_name: str) -> tuple[str, str, dict[str, Any]]:
    """(label, spec to load, extra options): a bare ``interp`` means interp of the ID dataset."""
    spec = parse_spec(name)
    if spec.name == "interp" and spec.variant is None and "base" not in spec.options:
        # the base goes in as an option, so an ID spec with classes (digits[0-4]) stays whole
        return f"interp:{id_name}", name, {"base": id_name}
    return name, name, {}


def load_ood_sets(model, ood: Sequence[str], id_name: str, id_size: int, *, split: str, n: int | None, seed: int,
                  data_root, download: bool) -> list[tuple[str, Any]]:
    """(label, dataset) for every OOD spec; synthetic sets take the model's input shape and, without
    ``n``, as many examples as the ID set. The ID set itself or a set named twice is refused."""
    loaded: list[tuple[str, Any]] = []
    for name in ood:
        label, spec, extra = expand_ood_name(name, id_name)
        if label == id_name:
            raise UsageError(f"OOD set {name!r} is the in-distribution set itself; choose another dataset")
        if label in (lbl for lbl, _ in loaded):
            raise UsageError(f"OOD set {label!r} is given twice")
        ds = load_dataset(spec, split, data_root, download, input_shape=model.input_shape, n=id_size, seed=seed,
                          **extra)
        ds = subsample(ds, n, seed)
        check_input_shape(model, ds, label)
        loaded.append((label, ds))
    return loaded


@deprecated_keywords(renamed={"sigma": "input_sigma"})
def compute_ood_scores(
    model,
    ood: str | Sequence[str],
    *,
    id: str | None = None,
    scores: str | Sequence[str] = DEFAULT_SCORES,
    split: str = "test",
    n: int | None = None,
    input_sigma: float = 0.0,
    seed: int = 0,
    batch_size: int = DEFAULT_BATCH_SIZE,
    device: str | torch.device | None = None,
    data_root: str | Path | None = None,
    download: bool = False,
    progress: ProgressArg = None,
) -> tuple[OODScores, dict[str, Any]]:
    """Run the batch loop over the ID set and every OOD set; return the scores and the settings.

    ``n`` draws a seeded random subset of each set; synthetic sets (uniform, constant, gaussian)
    take the model's input shape and default to as many examples as the ID set. The input noise
    of set i (0 = ID) comes from a generator seeded with ``seed + i``.
    """
    model = prepare_model(model, device)
    check_input_sigma(input_sigma)
    ood = split_specs(ood, "ood")  # "uniform" is one set, "uniform,interp" two, as on the command line
    if not ood:
        raise UsageError("ood names no dataset; give e.g. 'uniform,interp'", param="ood")
    score_fns = resolve_scores(split_specs(scores, "scores"))
    if not score_fns:
        raise UsageError("scores names no score; give e.g. 'logpx,maxprob'", param="scores")
    id_name = id or training_dataset(model, param="id")
    id_ds = subsample(load_dataset(id_name, split, data_root, download, input_shape=model.input_shape), n, seed)
    check_input_shape(model, id_ds, id_name)
    sets = [(id_name, id_ds), *load_ood_sets(model, ood, id_name, len(id_ds), split=split, n=n, seed=seed,
                                              data_root=data_root, download=download)]
    per_set: dict[str, dict[str, np.ndarray]] = {}
    settings_per_set: dict[str, Any] = {}
    for i, (label, ds) in enumerate(sets):
        out = run_batches(model, ds, scores=score_fns, keep_logits=False, sigma=input_sigma, seed=seed + i,
                          batch_size=batch_size, progress=progress, desc=f"{'OOD' if i else 'ID'} {label}")
        per_set[label] = out.scores
        settings_per_set[label] = {"n": len(out), "noise_seed": out.settings["noise_seed"],
                                   "info": getattr(ds, "info", None)}
    result = OODScores(id_name, [s.label for s in score_fns], per_set.pop(id_name), per_set)
    settings = {
        "id": id_name, "split": split, "ood": result.ood_names, "scores": result.score_names, "n": n,
        "sigma": float(input_sigma), "seed": int(seed), "batch_size": int(batch_size), "sets": settings_per_set,
    }
    return result, settings


def bootstrap_interval(metric, id_scores: np.ndarray, ood_scores: np.ndarray, *, n_boot: int, level: float,
                       rng: np.random.Generator) -> tuple[float, float]:
    """Percentile bootstrap interval: ID and OOD resampled independently with replacement."""
    values = np.empty(n_boot)
    for b in range(n_boot):
        a = id_scores[rng.integers(0, len(id_scores), len(id_scores))]
        o = ood_scores[rng.integers(0, len(ood_scores), len(ood_scores))]
        values[b] = metric(a, o)
    alpha = (1.0 - level) / 2.0
    return float(np.quantile(values, alpha)), float(np.quantile(values, 1.0 - alpha))


def resolve_metrics(metrics: Sequence[str] | None = None) -> list[tuple[str, Any]]:
    """(name, metric) for the OOD metrics named (default: the built-in ones), checked early."""
    return select_metrics("ood", metrics)


def check_bootstrap(bootstrap: int, level: float) -> None:
    if not bootstrap >= 0:
        raise UsageError(f"bootstrap must be >= 0, got {bootstrap}", param="bootstrap")
    if not 0 < level < 1:
        raise UsageError(f"need level in (0, 1) (the confidence level of the intervals), got {level}", param="level")


def ood_records(
    scores: OODScores,
    *,
    metrics: Sequence[str] | None = None,
    bootstrap: int = 0,
    level: float = 0.95,
    seed: int = 0,
    progress: ProgressArg = None,
) -> list[dict[str, Any]]:
    """One record per (score, OOD set) with the built-in OOD metrics (or the ``metrics`` named, plugin
    ones too); ``bootstrap`` > 0 adds ``<metric>_lo``/``_hi`` percentile intervals at ``level``."""
    available = resolve_metrics(metrics)
    check_bootstrap(bootstrap, level)
    rng = np.random.default_rng(seed)
    records = []
    total = len(scores.score_names) * len(scores.ood_scores) if bootstrap else 0
    with progress_bar(progress if bootstrap else False, total, f"bootstrap x{bootstrap}") as bar:
        for s in scores.score_names:
            id_values = scores.id_scores[s]
            for ood_name, per_score in scores.ood_scores.items():
                ood_values = per_score[s]
                record: dict[str, Any] = {"score": s, "id": scores.id_name, "ood": ood_name}
                for name, fn in available:
                    record[name] = float(fn(id_values, ood_values))
                record["n_id"] = len(id_values)
                record["n_ood"] = len(ood_values)
                for name, fn in available if bootstrap else ():
                    lo, hi = bootstrap_interval(fn, id_values, ood_values, n_boot=bootstrap, level=level, rng=rng)
                    record[f"{name}_lo"], record[f"{name}_hi"] = lo, hi
                bar.update(1)
                records.append(record)
    return records


@deprecated_keywords(renamed={"sigma": "input_sigma"},
                     outputs={"save_scores": "jemeval.artifacts:save_ood_scores",
                              "plot": "jemeval.plots.ood:plot_ood_result"})
def evaluate_ood(
    model,
    ood: str | Sequence[str],
    *,
    id: str | None = None,
    scores: str | Sequence[str] = DEFAULT_SCORES,
    split: str = "test",
    n: int | None = None,
    input_sigma: float = 0.0,
    seed: int = 0,
    metrics: str | Sequence[str] | None = None,
    bootstrap: int = 0,
    level: float = 0.95,
    batch_size: int = DEFAULT_BATCH_SIZE,
    device: str | torch.device | None = None,
    data_root: str | Path | None = None,
    download: bool = False,
    progress: ProgressArg = None,
) -> Result:
    """OOD detection of ``model`` (an EnergyModel or a checkpoint path) against each set in ``ood``
    (a list of dataset specs, or one string: a spec or a comma list; ``scores`` and ``metrics``
    likewise).

    The in-distribution set ``id`` defaults to the model's training dataset (``split`` split);
    ``input_sigma`` is the std of the noise added to every input. Returns a
    :class:`~jemeval.results.Result` with one record per (score, OOD set): score, id, ood, auroc,
    aupr_in, aupr_out, fpr95 (or the ``metrics`` named, plugin metrics too), n_id, n_ood, and
    ``<metric>_lo``/``_hi`` with ``bootstrap`` > 0 resamples. ``extra["scores"]`` holds the
    per-example scores (:class:`~jemeval.artifacts.OODScores`: ``save_npz``; figure:
    :func:`jemeval.plots.ood.plot_ood_result`).
    """
    model = prepare_model(model, device)
    metrics = None if metrics is None else split_specs(metrics, "metrics")
    resolve_metrics(metrics)  # fail on a misspelt metric before the (long) score computation
    check_bootstrap(bootstrap, level)
    ood_scores, settings = compute_ood_scores(
        model, ood, id=id, scores=scores, split=split, n=n, input_sigma=input_sigma, seed=seed,
        batch_size=batch_size, device=device, data_root=data_root, download=download, progress=progress,
    )
    records = ood_records(ood_scores, metrics=metrics, bootstrap=bootstrap, level=level, seed=seed,
                          progress=progress)
    settings.update({"metrics": [k for k in records[0] if k not in ("score", "id", "ood", "n_id", "n_ood")
                                 and not k.endswith(("_lo", "_hi"))],
                     "bootstrap": int(bootstrap), "level": float(level) if bootstrap else None})
    prov = provenance(command="ood", model=model, device=model.device, seed=seed, settings=settings)
    return Result(records, prov, extra={"scores": ood_scores}, notes=[METRIC_NOTE])
