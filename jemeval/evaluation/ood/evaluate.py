"""Out-of-distribution detection: how well does a score separate a model's data from other data?

``evaluate_ood(model, ["uniform", "interp"], scores=["logpx", "maxprob", "gradnorm"])`` runs the
shared batch loop once per dataset (one forward pass per batch gives the logits, and the features
when a detector reads them; every score is derived from the same batch), then reports one record
per (score, OOD set) with the built-in OOD metrics (plugin metrics when named with ``metrics``):

* AUROC and AUPR-In with in-distribution as the positive class;
* AUPR-Out with OOD as the positive class and negated scores;
* FPR95: the fraction of OOD inputs accepted at the threshold that keeps 95% of in-distribution
  inputs (lower is better).

Scores are "higher = more in-distribution" (README.md, Conventions). Detectors (mahalanobis, knn,
vim, ...) are fitted first on the model's training images, once per (model, detector, options,
data), and cached on disk (:mod:`jemeval.evaluation.ood.fit`); ``tune_on`` picks hyperparameters on
an OOD validation set first (:mod:`jemeval.evaluation.ood.tune`). ``ood`` may name groups (``near``,
``far``; :mod:`jemeval.evaluation.ood.sets`): their sets are evaluated one by one, records carry a
``group`` key, and each group's mean is a record of its own (``ood`` = the group). The per-example
scores come back in the result's ``extra["scores"]`` (:class:`~jemeval.artifacts.OODScores`), which
the caller may save (``save_npz``) so that anyone can recompute the metrics independently, or plot
(:func:`jemeval.plots.ood.plot_ood_result`).
"""
from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from jemeval.artifacts import OODScores
from jemeval.context import RunContext, takes_context
from jemeval.deprecations import deprecated_keywords
from jemeval.errors import UsageError
from jemeval.evaluation.batching import (
    DEFAULT_BATCH_SIZE,
    BatchOutputs,
    ScoreFn,
    resolve_scores,
    resolved_options,
    run_batches,
)
from jemeval.evaluation.classes import class_alignment
from jemeval.evaluation.inputs import check_input_sigma, prepare_model, stamp, training_dataset
from jemeval.evaluation.limits import check_count
from jemeval.evaluation.metrics import select_metrics
from jemeval.evaluation.ood.fit import DetectorFitter, fit_sets
from jemeval.evaluation.ood.sets import load_id_set, load_ood_sets
from jemeval.evaluation.ood.tune import check_tune_set, tune_scores
from jemeval.progress import ProgressArg, progress_bar
from jemeval.registry import split_specs
from jemeval.results import Result
from jemeval.seen_images import check_ood_set

__all__ = ["DEFAULT_SCORES", "METRIC_NOTE", "OODScores", "compute_ood_scores", "evaluate_ood", "group_records",
           "ood_records"]

DEFAULT_SCORES = ("logpx", "maxprob", "gradnorm")
METRIC_NOTE = (
    "AUROC and AUPR-In treat in-distribution as positive; AUPR-Out treats OOD as positive with negated "
    "scores; FPR95 is the fraction of OOD inputs accepted at the threshold keeping 95% of in-distribution "
    "inputs (lower is better). Scores: higher = more in-distribution."
)


@deprecated_keywords(renamed={"sigma": "input_sigma"})
@takes_context(batch_size=DEFAULT_BATCH_SIZE)
def compute_ood_scores(
    model,
    ood: str | Sequence[str],
    *,
    id: str | None = None,
    scores: str | Sequence[str] = DEFAULT_SCORES,
    split: str = "test",
    n: int | None = None,
    input_sigma: float = 0.0,
    fit_on: str | None = None,
    fit_n: int | None = None,
    tune_on: str | None = None,
    class_map: Any = None,
    context: RunContext,
) -> tuple[OODScores, dict[str, Any]]:
    """Fit the detectors, then run the batch loop over the ID set and every OOD set; return the scores
    and the settings.

    ``n`` draws a seeded random subset of each set; synthetic sets (uniform, constant, gaussian)
    take the model's input shape and default to as many examples as the ID set. The input noise
    of set i (0 = ID) comes from a generator seeded with ``seed + i``.
    """
    model = prepare_model(model, context.device)
    check_input_sigma(input_sigma)
    ood = split_specs(ood, "ood")  # "uniform" is one set, "uniform,interp" two, as on the command line
    if not ood:
        raise UsageError("ood names no dataset; give e.g. 'uniform,interp' or 'near,far'", param="ood")
    score_fns = resolve_scores(split_specs(scores, "scores"))
    if not score_fns:
        raise UsageError("scores names no score; give e.g. 'logpx,maxprob'", param="scores")
    id_name = id or training_dataset(model, param="id")
    id_ds, id_info = load_id_set(model, id_name, split=split, n=n, fit_on=fit_on, context=context,
                                 fits=tune_on is not None or any(s.detector for s in score_fns))
    sets = load_ood_sets(model, ood, id_name, len(id_ds), split=split, n=n, context=context,
                         num_classes=getattr(id_ds, "num_classes", None))
    seen = {label: check_ood_set(id_name, label, ds, context=context, id_ds=id_ds)  # before fitting
            for label, ds, _ in sets}
    score_fns, fitting = fit_scores(
        model, score_fns, id_name=id_name, test_sets=[label for label, _, _ in sets], fit_on=fit_on, fit_n=fit_n,
        tune_on=tune_on, split=split, n=n, input_sigma=input_sigma, class_map=class_map, context=context)
    per_set: dict[str, dict[str, np.ndarray]] = {}
    settings_per_set: dict[str, Any] = {}
    for i, (label, ds) in enumerate([(id_name, id_ds), *[(label, ds) for label, ds, _ in sets]]):
        out = run_batches(model, ds, scores=score_fns, keep_logits=False, sigma=input_sigma, seed=context.seed + i,
                          context=context, desc=f"{'OOD' if i else 'ID'} {label}")
        per_set[label] = out.scores
        if i == 0:  # scores that assume ReLU features: the model's fraction of feature values < 0
            signs = feature_sign_checks(score_fns, out)
        notes, record = seen.get(label, ([], {})) if i else ([], {})
        settings_per_set[label] = {"n": len(out), "noise_seed": out.settings["noise_seed"],
                                   "info": getattr(ds, "info", None), **record, **({"notes": notes} if notes else {})}
    result = OODScores(id_name, [s.label for s in score_fns], per_set.pop(id_name), per_set)
    settings = {
        "id": id_name, "split": split, "ood": result.ood_names, "scores": result.score_names, "n": n,
        "sigma": float(input_sigma), "seed": int(context.seed), "batch_size": context.batch(DEFAULT_BATCH_SIZE),
        "sets": settings_per_set, "groups": {label: group for label, _, group in sets if group is not None},
        "score_options": {s.label: resolved_options(s) for s in score_fns},
        "id_data": id_info, **fitting, **({"feature_signs": signs} if signs else {}),
    }
    return result, settings


def fit_scores(model, score_fns: list[ScoreFn], *, id_name: str, test_sets: Sequence[str], fit_on: str | None,
               fit_n: int | None, tune_on: str | None, split: str, n: int | None, input_sigma: float,
               class_map: Any = None, context: RunContext) -> tuple[list[ScoreFn], dict[str, Any]]:
    """Fit the detectors among ``score_fns`` (and first tune the scores with a grid on ``tune_on``):
    the scores to evaluate and what was done (:mod:`jemeval.evaluation.ood.fit`, ``ood.tune``). A
    detector that fits on labels gets them as the model's classes (:mod:`jemeval.evaluation.classes`:
    the fit set and the model must have the same classes, or ``class_map`` maps them)."""
    if tune_on is None and not any(s.detector for s in score_fns):
        return score_fns, {}
    if tune_on is not None:
        check_tune_set(tune_on, id_name, test_sets)  # before any fitting
    sets = fit_sets(model, id_name, fit_on=fit_on, fit_n=fit_n, tune=tune_on is not None, split=split,
                    context=context)
    info: dict[str, Any] = {"fit_data": sets.info}
    if any(s.detector and s.fn.needs_labels for s in score_fns):
        classes = class_alignment(model, sets.fit, fit_on or id_name, class_map)
        sets.fit, info["class_map"] = classes.apply(sets.fit), classes.record
    fitter = DetectorFitter(model, sets, context=context)
    if tune_on is not None:
        score_fns, info["tuning"] = tune_scores(
            model, score_fns, fitter, tune_on=tune_on, id_name=id_name, test_sets=test_sets, split=split, n=n,
            input_sigma=input_sigma, context=context)
    info["detectors"] = {s.label: {"options": s.options, **fitter.ensure(s)} for s in score_fns if s.detector}
    return score_fns, info


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
    check_count("bootstrap", bootstrap, low=0)
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


def group_records(records: list[dict[str, Any]], groups: dict[str, str]) -> list[dict[str, Any]]:
    """``records`` with a ``group`` key after ``ood`` (None for sets outside the groups) and, after the
    last set of each group for each score, the group's mean record: ``ood`` = the group, every metric
    the mean over its sets, ``n_ood`` their total; no intervals (``_lo``/``_hi`` None)."""
    if not groups:
        return records
    out: list[dict[str, Any]] = []
    for i, record in enumerate(records):
        keys = list(record)
        at = keys.index("ood") + 1
        out.append({k: record[k] for k in keys[:at]} | {"group": groups.get(record["ood"])}
                   | {k: record[k] for k in keys[at:]})
        group, later = groups.get(record["ood"]), records[i + 1:]
        if group is not None and not any(r["score"] == record["score"] and groups.get(r["ood"]) == group
                                         for r in later):
            members = [r for r in out if r["score"] == record["score"] and r["group"] == group and r["ood"] != group]
            out.append(_mean_record(members, group))
    return out


def _mean_record(members: list[dict[str, Any]], group: str) -> dict[str, Any]:
    first = members[0]
    mean: dict[str, Any] = {"score": first["score"], "id": first["id"], "ood": group, "group": group}
    for key in list(first)[4:]:
        if key == "n_ood":
            mean[key] = int(sum(r[key] for r in members))
        elif key == "n_id" or key.endswith(("_lo", "_hi")):
            mean[key] = first[key] if key == "n_id" else None
        else:
            mean[key] = float(np.mean([r[key] for r in members]))
    return mean


@deprecated_keywords(renamed={"sigma": "input_sigma"},
                     outputs={"save_scores": "jemeval.artifacts:save_ood_scores",
                              "plot": "jemeval.plots.ood:plot_ood_result"})
@takes_context(batch_size=DEFAULT_BATCH_SIZE)
def evaluate_ood(
    model,
    ood: str | Sequence[str],
    *,
    id: str | None = None,
    scores: str | Sequence[str] = DEFAULT_SCORES,
    split: str = "test",
    n: int | None = None,
    input_sigma: float = 0.0,
    metrics: str | Sequence[str] | None = None,
    bootstrap: int = 0,
    level: float = 0.95,
    fit_on: str | None = None,
    fit_n: int | None = None,
    tune_on: str | None = None,
    class_map: Any = None,
    context: RunContext,
) -> Result:
    """OOD detection of ``model`` (an EnergyModel or a checkpoint path) against each set in ``ood``
    (a list of dataset specs or group names such as ``near``/``far``, or one string: a spec or a comma
    list; ``scores`` and ``metrics`` likewise).

    The in-distribution set ``id`` defaults to the model's training dataset (``split`` split);
    ``input_sigma`` is the std of the noise added to every input. Detectors are fitted on the train
    split of ``fit_on`` (default: ``id``) less the images training held out, a seeded ``fit_n`` of
    them if given, and cached as the context's cache policy says (``cache=False``: neither read nor
    write the cache); ``tune_on`` names the OOD validation set that picks the hyperparameters of
    every score with a grid. ``class_map`` maps the fit set's classes to the model's for detectors
    that fit on labels (:mod:`jemeval.evaluation.classes`). ``seed``, ``device``, ``batch_size``,
    ``progress``, ``data_root``, ``download`` and ``cache`` are the run's
    :class:`~jemeval.context.RunContext` (``context=``).
    Returns a :class:`~jemeval.results.Result` with one record per (score, OOD set): score, id, ood
    (and ``group`` with groups), auroc, aupr_in, aupr_out, fpr95 (or the ``metrics`` named, plugin
    metrics too), n_id, n_ood, ``<metric>_lo``/``_hi`` with ``bootstrap`` > 0 resamples, plus one
    mean record per group and score. ``extra["scores"]`` holds the per-example scores
    (:class:`~jemeval.artifacts.OODScores`: ``save_npz``; figure: :func:`jemeval.plots.ood.plot_ood_result`).
    """
    model = prepare_model(model, context.device)
    metrics = None if metrics is None else split_specs(metrics, "metrics")
    resolve_metrics(metrics)  # fail on a misspelt metric before the (long) score computation
    check_bootstrap(bootstrap, level)
    ood_scores, settings = compute_ood_scores(model, ood, id=id, scores=scores, split=split, n=n,
                                              input_sigma=input_sigma, fit_on=fit_on, fit_n=fit_n, tune_on=tune_on,
                                              class_map=class_map, context=context)
    records = ood_records(ood_scores, metrics=metrics, bootstrap=bootstrap, level=level, seed=context.seed,
                          progress=context.progress)
    settings.update({"metrics": [k for k in records[0] if k not in ("score", "id", "ood", "n_id", "n_ood")
                                 and not k.endswith(("_lo", "_hi"))],
                     "bootstrap": int(bootstrap), "level": float(level) if bootstrap else None})
    read = [settings["id"], *settings["ood"], (settings.get("fit_data") or {}).get("data")]
    return Result(group_records(records, settings["groups"]), stamp("ood", model, context, settings, data=read),
                  extra={"scores": ood_scores},
                  notes=[METRIC_NOTE, *settings["id_data"]["notes"],
                         *(note for s in settings["sets"].values() for note in s.get("notes", ())),
                         *tuning_notes(settings.get("tuning")),
                         *feature_sign_notes(settings.get("feature_signs"))])


# -- scores that assume non-negative (ReLU) features: DICE, ReAct, ASH -----------------------------
def assumes_nonnegative_features(fn: Any) -> bool:
    """Whether a score (:class:`~jemeval.Score` or :class:`~jemeval.Detector`) declares
    ``assumes_nonnegative_features``: it prunes, clips or rescales the penultimate activations as if
    they were ReLU outputs."""
    return bool(fn.assumes_nonnegative_features)


def feature_sign_checks(score_fns: Sequence[ScoreFn], id_outputs: BatchOutputs | None) -> dict[str, dict[str, Any]]:
    """For each score that assumes non-negative features: the fraction of the model's feature values
    below 0, from the features a detector was fitted on (its state's ``negative_fraction``), else
    from the in-distribution features scored (``id_outputs``); for the provenance and the notes."""
    checks: dict[str, dict[str, Any]] = {}
    for s in score_fns:
        if not assumes_nonnegative_features(s.fn):
            continue
        state = s.fn.state_dict() if s.detector and s.fn.cacheable else None
        if isinstance(state, dict) and state.get("negative_fraction") is not None:
            checks[s.label] = {"negative_fraction": float(state["negative_fraction"]), "measured_on": "fit features"}
        elif id_outputs is not None and id_outputs.negative_features is not None:
            checks[s.label] = {"negative_fraction": float(id_outputs.negative_features),
                               "measured_on": "in-distribution features scored"}
    return checks


def feature_sign_notes(checks: dict[str, dict[str, Any]] | None) -> list[str]:
    """One note per score whose ReLU assumption the model's features break (any value < 0)."""
    return [
        f"score {label!r} assumes non-negative (ReLU) penultimate features, but {c['negative_fraction']:.1%} of this "
        f"model's {c['measured_on']} are negative (e.g. after LeakyReLU): its pruning/clipping then works against "
        "the features and can invert the score (AUROC far below 0.5); compare it with energy before reading it"
        for label, c in (checks or {}).items() if c["negative_fraction"] > 0
    ]


def tuning_notes(tuning: dict[str, Any] | None) -> list[str]:
    """One line saying what tuning chose (the full record is in the provenance settings)."""
    if not tuning:
        return []
    chosen = "; ".join(f"{label} " + ", ".join(f"{k}={v}" for k, v in rec["chosen"].items())
                       for label, rec in tuning["scores"].items())
    return [f"Hyperparameters tuned on {tuning['tune_on']} (AUROC against held-out in-distribution images): "
            f"{chosen or 'no score has a grid'}."]
