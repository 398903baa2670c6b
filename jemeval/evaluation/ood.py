"""Out-of-distribution detection: how well does a score separate a model's data from other data?

``evaluate_ood(model, ["uniform", "interp"], scores=["logpx", "maxprob", "gradnorm"])`` runs the
shared batch loop once per dataset (logits computed once, every score derived from the same
batch), then reports one record per (score, OOD set) with the built-in OOD metrics (plugin
metrics when named with ``metrics``):

* AUROC and AUPR-In with in-distribution as the positive class;
* AUPR-Out with OOD as the positive class and negated scores;
* FPR95: the fraction of OOD inputs accepted at the threshold that keeps 95% of in-distribution
  inputs (lower is better).

Scores are "higher = more in-distribution" (README.md, Conventions). The per-example scores can be saved
(:meth:`OODScores.save_npz`) so that anyone can recompute the metrics independently.
"""
from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch

from jemeval.data import load_dataset, subsample
from jemeval.errors import UsageError
from jemeval.evaluation.batching import (
    DEFAULT_BATCH_SIZE,
    check_input_shape,
    prepare_model,
    resolve_scores,
    run_batches,
    training_dataset,
)
from jemeval.evaluation.metrics import select_metrics
from jemeval.registry import parse_spec, split_specs
from jemeval.results import Result

DEFAULT_SCORES = ("logpx", "maxprob", "gradnorm")
METRIC_NOTE = (
    "AUROC and AUPR-In treat in-distribution as positive; AUPR-Out treats OOD as positive with negated "
    "scores; FPR95 is the fraction of OOD inputs accepted at the threshold keeping 95% of in-distribution "
    "inputs (lower is better). Scores: higher = more in-distribution."
)


@dataclass
class OODScores:
    """Per-example scores of the in-distribution set and of each OOD set."""

    id_name: str
    score_names: list[str]
    id_scores: dict[str, np.ndarray]
    ood_scores: dict[str, dict[str, np.ndarray]] = field(default_factory=dict)  # set -> score -> values

    @property
    def ood_names(self) -> list[str]:
        return list(self.ood_scores)

    def save_npz(self, path: str | Path, provenance: dict | None = None) -> Path:
        """Write every set's scores to one .npz (atomically).

        Keys: ``id/<score>`` and ``ood/<set>/<score>`` (float64 arrays), plus ``id_name``,
        ``ood_names``, ``score_names`` and ``provenance`` (a JSON string). Read back with
        :meth:`load_npz` or plain ``numpy.load``.
        """
        from jemeval.atomic import atomic_path
        from jemeval.results import _plain

        arrays: dict[str, np.ndarray] = {
            "id_name": np.array(self.id_name),
            "ood_names": np.array(self.ood_names),
            "score_names": np.array(self.score_names),
            "provenance": np.array(json.dumps(_plain(provenance or {}))),
        }
        for s in self.score_names:
            arrays[f"id/{s}"] = self.id_scores[s]
            for name, per_score in self.ood_scores.items():
                arrays[f"ood/{name}/{s}"] = per_score[s]
        with atomic_path(path) as tmp, open(tmp, "wb") as fh:
            np.savez(fh, **arrays)
        return Path(path)

    @classmethod
    def load_npz(cls, path: str | Path) -> OODScores:
        with np.load(path, allow_pickle=False) as f:
            scores = [str(s) for s in f["score_names"]]
            oods = [str(s) for s in f["ood_names"]]
            return cls(
                id_name=str(f["id_name"]),
                score_names=scores,
                id_scores={s: f[f"id/{s}"] for s in scores},
                ood_scores={o: {s: f[f"ood/{o}/{s}"] for s in scores} for o in oods},
            )


def expand_ood_name(name: str, id_name: str) -> tuple[str, str, dict[str, Any]]:
    """(label, spec to load, extra options): a bare ``interp`` means interp of the ID dataset."""
    spec = parse_spec(name)
    if spec.name == "interp" and spec.variant is None and "base" not in spec.options:
        # the base goes in as an option, so an ID spec with classes (digits[0-4]) stays whole
        return f"interp:{id_name}", name, {"base": id_name}
    return name, name, {}


def compute_ood_scores(
    model,
    ood: str | Sequence[str],
    *,
    id: str | None = None,
    scores: str | Sequence[str] = DEFAULT_SCORES,
    split: str = "test",
    n: int | None = None,
    sigma: float = 0.0,
    seed: int = 0,
    batch_size: int = DEFAULT_BATCH_SIZE,
    device: str | torch.device | None = None,
    data_root: str | Path | None = None,
    download: bool = False,
    progress: bool | None = None,
) -> tuple[OODScores, dict[str, Any]]:
    """Run the batch loop over the ID set and every OOD set; return the scores and the settings.

    ``n`` draws a seeded random subset of each set; synthetic sets (uniform, constant, gaussian)
    take the model's input shape and default to as many examples as the ID set. The sigma noise of
    set i (0 = ID) comes from a generator seeded with ``seed + i``.
    """
    model = prepare_model(model, device)
    ood = split_specs(ood, "ood")  # "uniform" is one set, "uniform,interp" two, as on the command line
    if not ood:
        raise UsageError("give at least one OOD dataset, e.g. --ood uniform,interp")
    score_fns = resolve_scores(split_specs(scores, "scores"))
    if not score_fns:
        raise UsageError("give at least one score, e.g. --score logpx,maxprob")
    id_name = id or training_dataset(model, option="--id")
    id_ds = subsample(load_dataset(id_name, split, data_root, download, input_shape=model.input_shape), n, seed)
    check_input_shape(model, id_ds, id_name)

    loaded = []
    for name in ood:
        label, spec, extra = expand_ood_name(name, id_name)
        if label == id_name:
            raise UsageError(f"OOD set {name!r} is the in-distribution set itself; choose another dataset")
        if label in (lbl for lbl, _ in loaded):
            raise UsageError(f"OOD set {label!r} is given twice")
        ds = load_dataset(spec, split, data_root, download, input_shape=model.input_shape, n=len(id_ds), seed=seed, **extra)
        ds = subsample(ds, n, seed)
        check_input_shape(model, ds, label)
        loaded.append((label, ds))

    settings_per_set: dict[str, Any] = {}
    outputs = run_batches(model, id_ds, scores=score_fns, keep_logits=False, sigma=sigma, seed=seed,
                          batch_size=batch_size, progress=progress, desc=f"ID {id_name}")
    result = OODScores(id_name, [s.label for s in score_fns], outputs.scores)
    settings_per_set[id_name] = {"n": len(outputs), "noise_seed": outputs.settings["noise_seed"],
                                 "info": getattr(id_ds, "info", None)}
    for i, (label, ds) in enumerate(loaded, start=1):
        out = run_batches(model, ds, scores=score_fns, keep_logits=False, sigma=sigma, seed=seed + i,
                          batch_size=batch_size, progress=progress, desc=f"OOD {label}")
        result.ood_scores[label] = out.scores
        settings_per_set[label] = {"n": len(out), "noise_seed": out.settings["noise_seed"],
                                   "info": getattr(ds, "info", None)}
    settings = {
        "id": id_name, "split": split, "ood": [lbl for lbl, _ in loaded], "scores": result.score_names,
        "n": n, "sigma": float(sigma), "seed": int(seed), "batch_size": int(batch_size), "sets": settings_per_set,
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


def ood_records(
    scores: OODScores,
    *,
    metrics: Sequence[str] | None = None,
    bootstrap: int = 0,
    level: float = 0.95,
    seed: int = 0,
    progress: bool | None = None,
) -> list[dict[str, Any]]:
    """One record per (score, OOD set) with the built-in OOD metrics (or the ``metrics`` named, plugin ones too)."""
    available = resolve_metrics(metrics)
    if bootstrap < 0:
        raise UsageError(f"--bootstrap must be >= 0, got {bootstrap}")
    if not 0 < level < 1:
        raise UsageError(f"the confidence level must lie in (0, 1), got {level}")
    rng = np.random.default_rng(seed)
    records = []
    bar = None
    if bootstrap:
        import sys

        from tqdm import tqdm

        bar = tqdm(total=len(scores.score_names) * len(scores.ood_scores), desc=f"bootstrap x{bootstrap}",
                   file=sys.stderr, disable=None if progress is None else not progress, leave=False)
    for s in scores.score_names:
        id_values = scores.id_scores[s]
        for ood_name, per_score in scores.ood_scores.items():
            ood_values = per_score[s]
            record: dict[str, Any] = {"score": s, "id": scores.id_name, "ood": ood_name}
            for name, fn in available:
                record[name] = float(fn(id_values, ood_values))
            record["n_id"] = len(id_values)
            record["n_ood"] = len(ood_values)
            if bootstrap:
                for name, fn in available:
                    lo, hi = bootstrap_interval(fn, id_values, ood_values, n_boot=bootstrap, level=level, rng=rng)
                    record[f"{name}_lo"], record[f"{name}_hi"] = lo, hi
                bar.update(1)
            records.append(record)
    if bar is not None:
        bar.close()
    return records


def evaluate_ood(
    model,
    ood: str | Sequence[str],
    *,
    id: str | None = None,
    scores: str | Sequence[str] = DEFAULT_SCORES,
    split: str = "test",
    n: int | None = None,
    sigma: float = 0.0,
    seed: int = 0,
    metrics: str | Sequence[str] | None = None,
    bootstrap: int = 0,
    level: float = 0.95,
    batch_size: int = DEFAULT_BATCH_SIZE,
    device: str | torch.device | None = None,
    data_root: str | Path | None = None,
    download: bool = False,
    save_scores: str | Path | None = None,
    plot: str | Path | None = None,
    progress: bool | None = None,
) -> Result:
    """OOD detection of ``model`` (an EnergyModel or a checkpoint path) against each set in ``ood``
    (a list of dataset specs, or one string: a spec or a comma list, like ``--ood``; ``scores`` and
    ``metrics`` likewise).

    The in-distribution set defaults to the model's training dataset (test split). Returns a
    :class:`~jemeval.results.Result` with one record per (score, OOD set): score, id, ood, auroc,
    aupr_in, aupr_out, fpr95 (or the ``metrics`` named, plugin metrics too), n_id, n_ood, and ``<metric>_lo``/``_hi`` with
    ``bootstrap`` > 0 resamples. ``save_scores`` writes the per-example scores (.npz), ``plot`` the
    score histograms (.png).
    """
    from jemeval.provenance import provenance

    model = prepare_model(model, device)
    metrics = None if metrics is None else split_specs(metrics, "metrics")
    resolve_metrics(metrics)  # fail on a misspelt metric before the (long) score computation
    if bootstrap < 0 or not 0 < level < 1:
        raise UsageError(f"--bootstrap must be >= 0 and --level in (0, 1), got {bootstrap} and {level}")
    ood_scores, settings = compute_ood_scores(
        model, ood, id=id, scores=scores, split=split, n=n, sigma=sigma, seed=seed, batch_size=batch_size,
        device=device, data_root=data_root, download=download, progress=progress,
    )
    records = ood_records(ood_scores, metrics=metrics, bootstrap=bootstrap, level=level, seed=seed,
                          progress=progress)
    settings.update({"metrics": [k for k in records[0] if k not in ("score", "id", "ood", "n_id", "n_ood")
                                 and not k.endswith(("_lo", "_hi"))],
                     "bootstrap": int(bootstrap), "level": float(level) if bootstrap else None})
    prov = provenance(command="ood", model=model, device=model.device, seed=seed, settings=settings)
    result = Result(records, prov, notes=[METRIC_NOTE])
    if save_scores is not None:
        ood_scores.save_npz(save_scores, prov)
    if plot is not None:
        from jemeval.plots.ood import plot_score_histograms

        plot_score_histograms(ood_scores, plot, records=records)
    return result
