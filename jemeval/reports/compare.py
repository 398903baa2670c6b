"""Paired tests between the report's models, on the per-input outcomes of the same inputs.

Every model of a report is evaluated on the same inputs: the same seeded test subset
(:func:`jemeval.data.subsample` with the report's seed), the same seeded noise and OOD sets, the same
attack seeds. So two models' outcomes on input i are a pair, and a paired test sees differences
that two separate intervals hide (:mod:`jemeval.evaluation.paired`):

* AUROC per (score, OOD set): DeLong's test, from the per-example scores the ood Result keeps
  (``extra["scores"]``);
* FPR95 per (score, OOD set): paired bootstrap (``N_BOOT`` resamples, the report's seed);
* accuracy, robust accuracy (exact McNemar) and ECE, NLL (paired bootstrap): from a Result's
  ``extra["per_input"]``, a list of ``{<the row's setting keys>, "correct": [...]}`` (accuracy,
  robust) or ``{..., "probs": [[...]], "labels": [...]}`` (calibration), which ``evaluate``,
  ``calibrate`` and ``robust`` keep (the report's cache and report.json's runs hold them). A cached
  entry without them (an earlier build) gives its rows no test until ``--force``.

A seed group is tested on pooled per-input outcomes, stated in each record: DeLong and McNemar on
the seed pairs' outcomes concatenated (run i of A against run i of B), the bootstrap on the
seed-mean metric with every seed's outcome of an input resampled together; beside it Welch's test
on the per-seed values (``between_seeds``). Holm's correction runs over every comparison of the
report; a value is bolded as the best of its row only when its test against the next-best model is
significant after it (:func:`decided`).
"""
from __future__ import annotations

import itertools
import math
from collections.abc import Callable, Mapping
from typing import Any

import numpy as np

from jemeval.artifacts import OODScores
from jemeval.errors import UsageError
from jemeval.evaluation import paired
from jemeval.evaluation.metrics import DEFAULT_BINS, ece, fpr95, nll
from jemeval.reports.groups import row_key
from jemeval.reports.tables import SPECS, Table, fmt, fmt_key
from jemeval.results import Result

LEVEL = 0.95
N_BOOT = 2000
#: metric -> (test, the per-input key it reads)
PER_INPUT = {"accuracy": "correct", "robust_accuracy": "correct", "ece": "probs", "nll": "probs"}

#: (section, row key, metric) -> (kind, per-input arrays): kind "delong" (labels, scores), "mcnemar"
#: (correct,), or a bootstrap metric's name ("fpr95", "ece", "nll") with its arrays
Outcomes = dict[tuple[str, tuple, str], tuple[str, tuple[np.ndarray, ...]]]


def _fpr95(scores: np.ndarray, labels: np.ndarray) -> float:
    ids, oods = scores[labels == 1], scores[labels == 0]
    return fpr95(ids, oods) if len(ids) and len(oods) else float("nan")


def _ece(probs: np.ndarray, labels: np.ndarray) -> float:
    return ece(probs, labels, DEFAULT_BINS)


BOOTSTRAP: dict[str, Callable[..., float]] = {"fpr95": _fpr95, "ece": _ece, "nll": nll}


def outcomes(section: str, results: list[Result]) -> Outcomes:
    """One run's per-input outcomes for every (row, metric) of ``section`` that has them."""
    found: Outcomes = {}
    for result in results:
        scores = result.extra.get("scores")
        if section == "ood" and isinstance(scores, OODScores):
            for name in scores.score_names:
                ids = np.asarray(scores.id_scores[name], dtype=np.float64)
                for ood, per_score in scores.ood_scores.items():
                    oods = np.asarray(per_score[name], dtype=np.float64)
                    labels = np.r_[np.ones(len(ids)), np.zeros(len(oods))]
                    arrays = (labels, np.r_[ids, oods])
                    row = row_key(section, {"score": name, "ood": ood})
                    found[(section, row, "auroc")] = ("delong", arrays)
                    found[(section, row, "fpr95")] = ("fpr95", arrays[::-1])
        for item in result.extra.get("per_input") or []:
            row = row_key(section, item)
            if "correct" in item:
                metric = "robust_accuracy" if section == "robust" else "accuracy"
                found[(section, row, metric)] = ("mcnemar", (np.asarray(item["correct"]),))
            if "probs" in item and "labels" in item:
                arrays = (np.asarray(item["probs"], dtype=np.float64), np.asarray(item["labels"]))
                found.update({(section, row, m): (m, arrays) for m in ("ece", "nll")})
    return found


def _test(kind: str, runs_a: list[tuple], runs_b: list[tuple], *, seed: int,
          shared: Callable[[str, Callable, tuple], tuple[float, np.ndarray]] | None = None) -> dict[str, Any]:
    """The paired test of one (row, metric) between two groups' runs (pooled over seed pairs).
    ``shared(side, metric, arrays)``: a bootstrap side's resampled metric, computed once per model."""
    pairs = min(len(runs_a), len(runs_b))
    if kind == "delong":
        labels = np.concatenate([a[0] for a in runs_a[:pairs]])
        return paired.delong_test(labels, np.concatenate([a[1] for a in runs_a[:pairs]]),
                                  np.concatenate([b[1] for b in runs_b[:pairs]]), level=LEVEL)
    if kind == "mcnemar":
        return paired.mcnemar_exact(np.concatenate([a[0] for a in runs_a[:pairs]]),
                                    np.concatenate([b[0] for b in runs_b[:pairs]]))
    metric = BOOTSTRAP[kind]
    if len(runs_a) == len(runs_b) == 1:
        a, b = runs_a[0], runs_b[0]
    else:
        (a, b), metric = paired.pooled_groups(runs_a, runs_b), paired.seed_mean(metric)
    if shared is None or not _pairable(a, b):  # paired_bootstrap states what is wrong
        return paired.paired_bootstrap(metric, a, b, n_boot=N_BOOT, seed=seed, level=LEVEL)
    return _bootstrap_result(shared("a", metric, a), shared("b", metric, b), seed=seed)


def _pairable(a: tuple, b: tuple) -> bool:
    """Whether paired_bootstrap would accept ``a`` and ``b`` (one length, >= 2 inputs, arrays)."""
    arrays = [np.asarray(x) for x in (*a, *b)] if isinstance(a, tuple) and isinstance(b, tuple) else []
    return bool(arrays) and all(x.ndim > 0 for x in arrays) and len({len(x) for x in arrays}) == 1 \
        and len(arrays[0]) >= 2


def resampled(metric: Callable, arrays: tuple, *, seed: int, n_boot: int = N_BOOT) -> tuple[float, np.ndarray]:
    """One side of :func:`jemeval.evaluation.paired.paired_bootstrap`: the metric on the inputs and on
    each resample it draws (``default_rng(seed).integers(0, n, (CHUNK, n))`` rows, chunk by chunk).
    The draws depend on the seed and n alone, so every pair of a row resamples the same inputs and
    a model's side is computed once per row, not once per pair (N models: N, not N(N-1), metric runs)."""
    arrays = tuple(np.asarray(x) for x in arrays)
    n = len(arrays[0])
    everything = np.arange(n)  # the observed value, computed as paired_bootstrap computes it
    observed = float(np.asarray(metric(*(x[everything] for x in arrays)), dtype=np.float64))
    rng, values = np.random.default_rng(seed), np.empty(int(n_boot), dtype=np.float64)
    for start in range(0, int(n_boot), paired.CHUNK):
        index = rng.integers(0, n, size=(min(paired.CHUNK, int(n_boot) - start), n))
        values[start:start + len(index)] = [metric(*(x[row] for x in arrays)) for row in index]
    return observed, values


def _bootstrap_result(side_a: tuple[float, np.ndarray], side_b: tuple[float, np.ndarray], *,
                      seed: int) -> dict[str, Any]:
    """paired_bootstrap's record from its two sides (the same arithmetic, so the same numbers)."""
    (value_a, values_a), (value_b, values_b) = side_a, side_b
    difference, deltas = value_a - value_b, values_a - values_b
    if not np.isfinite(deltas).all() or not math.isfinite(difference):
        raise UsageError("the metric gave a non-finite value on the inputs or a resample (e.g. a resample "
                         "without one of the classes); choose a metric defined on every resample", param="metric")
    extreme = np.count_nonzero(np.abs(deltas - difference) >= abs(difference))
    ci_low, ci_high = np.quantile(deltas, [0.5 - LEVEL / 2.0, 0.5 + LEVEL / 2.0])
    return {"test": "paired-bootstrap", "value_a": value_a, "value_b": value_b, "difference": difference,
            "ci_low": float(ci_low), "ci_high": float(ci_high), "p_value": (1.0 + extreme) / (N_BOOT + 1.0),
            "n_boot": N_BOOT, "seed": seed, "level": LEVEL}


def _pooling(kind: str, n_a: int, n_b: int) -> str | None:
    if n_a == n_b == 1:
        return None
    if kind in ("delong", "mcnemar"):
        return (f"pooled: the per-input outcomes of {min(n_a, n_b)} seed pair(s) concatenated (run i of one "
                "model with run i of the other)")
    return f"pooled: the seed-mean metric ({n_a} and {n_b} seeds), every seed's outcome of an input resampled together"


def compare(section: str, groups: Mapping[str, list[list[Result]]], values: Mapping[str, list[dict[str, Any]]], *,
            seed: int) -> list[dict[str, Any]]:
    """Every paired test of ``section`` between every two models (in report order): ``groups``: model
    -> its runs' Results; ``values``: model -> its (group) records, for the per-seed values of the
    between-seed check. One record per (row, metric, pair), Holm not yet applied."""
    per_model = {m: [outcomes(section, results) for results in runs] for m, runs in groups.items()}
    records, sides = [], {}
    for model_a, model_b in itertools.combinations(list(groups), 2):
        shared = set.intersection(*(set(o) for o in per_model[model_a] + per_model[model_b]))
        for key in sorted(shared, key=repr):
            records.append(_record(key, model_a, model_b, per_model, values, seed=seed, sides=sides))
    return records


def _record(key, model_a: str, model_b: str, per_model, values, *, seed: int,
            sides: dict | None = None) -> dict[str, Any]:
    section, row, metric = key
    kind = per_model[model_a][0][key][0]
    runs_a = [o[key][1] for o in per_model[model_a]]
    runs_b = [o[key][1] for o in per_model[model_b]]
    fields = {k: v for (k, _), v in zip(SPECS[section].keys, row)}
    record: dict[str, Any] = {"section": section, **fields, "metric": metric, "model_a": model_a, "model_b": model_b}
    def shared(side: str, metric: Callable, arrays: tuple) -> tuple[float, np.ndarray]:
        """A model's bootstrap side, kept in ``sides`` per (model, row, metric, how it is pooled)."""
        memo_key = (model_a if side == "a" else model_b, key, getattr(metric, "__name__", repr(metric)))
        if sides is None or memo_key not in sides:
            found = resampled(metric, arrays, seed=seed)
            if sides is None:
                return found
            sides[memo_key] = found
        return sides[memo_key]

    try:
        test = _test(kind, runs_a, runs_b, seed=seed, shared=shared)
    except Exception as exc:  # noqa: BLE001 - a test that cannot run is stated, never the report's end
        return {**record, "test": kind, "p_value": None, "error": str(exc).strip().splitlines()[0][:200]}
    record.update({k: test[k] for k in ("test", "difference", "p_value") if k in test})
    record.update({k: test[k] for k in ("ci_low", "ci_high", "level", "n_boot", "seed", "b", "c", "n") if k in test})
    pooling = _pooling(kind, len(runs_a), len(runs_b))
    if pooling:
        record["pooled"] = pooling
        record["between_seeds"] = _between(values, model_a, model_b, row, section, metric)
    return record


def _between(values, model_a: str, model_b: str, row: tuple, section: str, metric: str) -> dict[str, Any] | None:
    """Welch's test on the two groups' per-seed values of the row's metric (None without them)."""
    def seeds(model):
        for r in values.get(model, []):
            if row_key(section, r) == row:
                per = (r.get("values") or {}).get(metric) if isinstance(r.get("values"), dict) else None
                return [v for v in per if v is not None] if per else [r[metric]] if r.get(metric) is not None else []
        return []
    a, b = seeds(model_a), seeds(model_b)
    return paired.between_seeds(a, b) if a and b else None


def apply_holm(comparisons: list[dict[str, Any]], level: float = LEVEL) -> None:
    """Holm over every comparison of the report with a p-value: ``p_holm`` and ``significant`` (at 1 - level)."""
    tested = [c for c in comparisons if c.get("p_value") is not None]
    for c, p in zip(tested, paired.holm([c["p_value"] for c in tested])):
        c["p_holm"], c["significant"] = p, bool(p <= 1.0 - level)


def decided(section: str, values: Mapping[str, list[dict[str, Any]]],
            comparisons: list[dict[str, Any]]) -> dict[tuple[tuple, str], str | None]:
    """(row, metric) -> the model bolded as the best: the best (mean) value of the row when its
    test against the next-best model is significant after Holm and agrees in sign; None otherwise.
    Rows without a test are absent (the page bolds nothing there)."""
    directions = {k: better for k, _, better in SPECS[section].metrics if better}
    by_row: dict[tuple[tuple, str], dict[str, float]] = {}
    for model, records in values.items():
        for r in records:
            for metric in directions:
                if isinstance(r.get(metric), (int, float)) and not isinstance(r.get(metric), bool):
                    by_row.setdefault((row_key(section, r), metric), {})[model] = float(r[metric])
    tests = {(row_key(section, c), c["metric"], c["model_a"], c["model_b"]): c for c in comparisons
             if c["section"] == section}
    out: dict[tuple[tuple, str], str | None] = {}
    for (row, metric), by_model in by_row.items():
        sign = 1.0 if directions[metric] == "max" else -1.0
        ranked = sorted(by_model, key=lambda m: -sign * by_model[m])
        if len(ranked) < 2:
            continue
        best, second = ranked[:2]
        test = tests.get((row, metric, best, second)) or tests.get((row, metric, second, best))
        if test is None:
            continue
        diff = test.get("difference")
        towards_best = diff is not None and (diff if test["model_a"] == best else -diff) * sign > 0
        out[(row, metric)] = best if test.get("significant") and towards_best and \
            by_model[best] != by_model[second] else None
    return out


def comparison_table(section: str, comparisons: list[dict[str, Any]]) -> Table | None:
    """The section's paired tests: one row per (setting, metric, pair), the difference (a - b) with its
    interval, the test, its p-value raw and after Holm, and the verdict; None without any."""
    rows = [c for c in comparisons if c["section"] == section]
    if not rows:
        return None
    keys = SPECS[section].keys
    body = []
    for c in rows:
        diff = fmt(c.get("difference"))
        if c.get("ci_low") is not None:
            diff += f" [{c['ci_low']:.3f}, {c['ci_high']:.3f}]"
        verdict = ("cannot run: " + c["error"] if c.get("error") else
                   "significant" if c.get("significant") else "not significant")
        test = c["test"] + (f" ({c['n_boot']} resamples, seed {c['seed']})" if c.get("n_boot") else "")
        test += " (pooled over seeds)" if c.get("pooled") else ""
        body.append([fmt_key(k, c.get(k), c) for k, _ in keys] + [
            c["metric"], f"{c['model_a']} - {c['model_b']}", diff, test, fmt(c.get("p_value")), fmt(c.get("p_holm")),
            verdict])
    columns = [label for _, label in keys] + ["metric", "difference of", "difference [95% interval]", "test", "p",
                                              "p (Holm)", f"at {1 - LEVEL:g}"]
    return Table(columns, body, [[False] * len(columns) for _ in body], title="Paired tests on the same inputs",
                 label_columns=len(columns))
