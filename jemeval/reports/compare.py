"""Tests between the report's models on the same inputs, each saying what it claims.

Every model of a report is evaluated on the same inputs: the same seeded test subset, noise, OOD
sets and attack seeds. A model is one checkpoint or a seed group (several runs of one recipe), and
what a test may claim depends on which:

* two seed groups of >= 2 runs each: **the methods differ** (scope ``method``): the Obuchowski-
  Rockette analysis with Hillis' degrees of freedom (:func:`jemeval.evaluation.mrmc.or_hillis_outcomes`),
  seeds and inputs both random. Bold follows it. Its design is ``crossed`` when the runs pair up by
  their training seed (run with seed s of one group against seed s of the other) and ``nested`` otherwise;
  every run of both groups is used. Beside it, **these runs differ** (scope ``runs``): a paired
  bootstrap over inputs of the difference of the groups' mean figures of merit, the runs held fixed
  (:func:`jemeval.evaluation.mrmc.seed_mean_bootstrap`).
* a single run against a group: only the input-level test (these runs differ); the method-level
  test needs two runs a side, and the record says so (``method_level``).
* two single runs: DeLong (AUROC), exact McNemar (accuracy, robust accuracy) or the paired bootstrap
  (FPR95, ECE, NLL) on their per-input outcomes: these two networks differ.

Every comparison record carries ``test``, ``scope``, ``claim``, ``seeds_a``, ``seeds_b``,
``decides`` (whether bold follows it) and its numbers. Holm's correction runs over the tests that
decide bold and, separately, over the tests beside them. The per-input outcomes come from the
Results (ood's ``extra["scores"]``; ``extra["per_input"]`` of evaluate, calibrate and robust); a
cached entry without them gives its rows no test until ``--force``.
"""
from __future__ import annotations

import itertools
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from jemeval.artifacts import OODScores
from jemeval.evaluation import mrmc, paired
from jemeval.evaluation.figures_of_merit import AUROC, ECE, FPR95, NLL, Accuracy, Outcomes
from jemeval.reports.groups import row_key
from jemeval.reports.tables import SPECS
from jemeval.results import Result

LEVEL = 0.95
N_BOOT = 2000
#: the covariance of the method-level test per figure of merit (DeLong's is exact for AUROC)
COVARIANCE = {"auroc": "delong"}
CLAIMS = {"method": "the methods differ (training seeds and inputs random)",
          "runs": "these runs differ (inputs random, the trained networks fixed)"}
NEEDS_TWO = "the method-level test needs two runs a side"

#: (section, row key, metric) -> one run's Outcomes
RunOutcomes = dict[tuple[str, tuple, str], Outcomes]


def outcomes(section: str, results: list[Result]) -> RunOutcomes:
    """One run's per-input outcomes for every (row, metric) of ``section`` that has them."""
    found: RunOutcomes = {}
    for result in results:
        scores = result.extra.get("scores")
        if section == "ood" and isinstance(scores, OODScores):
            for name in scores.score_names:
                ids = np.asarray(scores.id_scores[name], dtype=np.float64)
                for ood, per_score in scores.ood_scores.items():
                    oods = np.asarray(per_score[name], dtype=np.float64)
                    arrays = (np.r_[np.ones(len(ids)), np.zeros(len(oods))], np.r_[ids, oods])
                    row = row_key(section, {"score": name, "ood": ood})
                    found.update(_labelled(section, row, arrays))
        for item in result.extra.get("per_input") or []:
            row = row_key(section, item)
            if "correct" in item:
                metric = "robust_accuracy" if section == "robust" else "accuracy"
                found[(section, row, metric)] = Accuracy(item["correct"])
            if "probs" in item and "labels" in item:
                probs, labels = np.asarray(item["probs"], dtype=np.float64), np.asarray(item["labels"])
                found[(section, row, "ece")] = ECE(probs, labels)
                found[(section, row, "nll")] = NLL(probs, labels)
    return found


def _labelled(section: str, row: tuple, arrays: tuple) -> RunOutcomes:
    """AUROC and FPR95 of one (score, OOD set); a set too small for either gives no test."""
    out: RunOutcomes = {}
    for metric, cls in (("auroc", AUROC), ("fpr95", FPR95)):
        try:
            out[(section, row, metric)] = cls(*arrays)
        except ValueError:  # fewer than 2 inputs on a side, or non-finite scores: stated by the missing test
            continue
    return out


def training_seed_order(seeds_a: Sequence[Any], seeds_b: Sequence[Any]) -> tuple[list[int], list[int]] | None:
    """(order of A's runs, order of B's runs) pairing them by training seed, when the two groups hold
    exactly the same distinct seeds; None otherwise (the runs are then unrelated: nested design)."""
    known = all(isinstance(s, int) and not isinstance(s, bool) for s in (*seeds_a, *seeds_b))
    if not (known and seeds_a) or len(set(seeds_a)) != len(seeds_a) or sorted(seeds_a) != sorted(seeds_b):
        return None
    return sorted(range(len(seeds_a)), key=lambda i: seeds_a[i]), sorted(range(len(seeds_b)), key=lambda i: seeds_b[i])


def compare(section: str, groups: Mapping[str, list[list[Result]]], values: Mapping[str, list[dict[str, Any]]], *,
            seed: int, seeds: Mapping[str, Sequence[Any]] | None = None) -> list[dict[str, Any]]:
    """Every test of ``section`` between every two models (report order), in the row order of the
    section's tables: ``groups``: model -> its runs' Results; ``values``: model -> its (group)
    records (they give the row order); ``seeds``: model -> its runs' training seeds (None where
    unknown). One or two records per (row, metric, pair); Holm not yet applied."""
    per_model = {m: [outcomes(section, results) for results in runs] for m, runs in groups.items()}
    seeds = seeds or {}
    records = []
    for model_a, model_b in itertools.combinations(list(groups), 2):
        shared = set.intersection(*(set(o) for o in per_model[model_a] + per_model[model_b]))
        pairing = training_seed_order(list(seeds.get(model_a) or []), list(seeds.get(model_b) or []))
        if pairing and (len(pairing[0]) != len(per_model[model_a]) or len(pairing[1]) != len(per_model[model_b])):
            pairing = None  # seeds not given for every run
        for key in ordered_keys(section, values, shared):
            runs_a = [o[key] for o in per_model[model_a]]
            runs_b = [o[key] for o in per_model[model_b]]
            if pairing:
                runs_a, runs_b = [runs_a[i] for i in pairing[0]], [runs_b[i] for i in pairing[1]]
            base = _base(key, model_a, model_b, len(runs_a), len(runs_b))
            records += tests(base, runs_a, runs_b, seed=seed, design="crossed" if pairing else "nested")
    return records


def ordered_keys(section: str, values: Mapping[str, list[dict[str, Any]]], keys: set) -> list[tuple]:
    """``keys`` in the order the section's tables show them: rows in the order the models' records
    first give them; per metric table first where the section has one table per metric (ood)."""
    rows = list(dict.fromkeys(row_key(section, r) for records in values.values() for r in records))
    metrics = [m for m, _, _ in SPECS[section].metrics] + sorted({k[2] for k in keys} - {
        m for m, _, _ in SPECS[section].metrics})
    ordered = ([(section, row, m) for m in metrics for row in rows] if SPECS[section].per_metric
               else [(section, row, m) for row in rows for m in metrics])
    return [k for k in ordered if k in keys] + sorted(keys - set(ordered), key=repr)


def _base(key: tuple, model_a: str, model_b: str, seeds_a: int, seeds_b: int) -> dict[str, Any]:
    section, row, metric = key
    fields = {k: v for (k, _), v in zip(SPECS[section].keys, row)}
    return {"section": section, **fields, "metric": metric, "model_a": model_a, "model_b": model_b,
            "seeds_a": seeds_a, "seeds_b": seeds_b}


def tests(base: dict[str, Any], runs_a: list[Outcomes], runs_b: list[Outcomes], *, seed: int,
          design: str) -> list[dict[str, Any]]:
    """The comparison records of one (row, metric, pair): see the module docstring."""
    if len(runs_a) >= 2 and len(runs_b) >= 2:
        covariance = COVARIANCE.get(runs_a[0].name, "jackknife")
        method = _run(base, "method", True, lambda: mrmc.or_hillis_outcomes(
            type(runs_a[0]), runs_a, runs_b, covariance=covariance, design=design, level=LEVEL))
        return [method, _run(base, "runs", False, lambda: mrmc.seed_mean_bootstrap(
            type(runs_a[0]), runs_a, runs_b, n_boot=N_BOOT, seed=seed, level=LEVEL))]
    if len(runs_a) == len(runs_b) == 1:
        return [_run(base, "runs", True, lambda: _single_pair(runs_a[0], runs_b[0], seed=seed))]
    record = _run(base, "runs", True, lambda: mrmc.seed_mean_bootstrap(type(runs_a[0]), runs_a, runs_b,
                                                                       n_boot=N_BOOT, seed=seed, level=LEVEL))
    return [{**record, "method_level": NEEDS_TWO}]


def _single_pair(a: Outcomes, b: Outcomes, *, seed: int) -> dict[str, Any]:
    """Two single runs: DeLong, exact McNemar, or the paired bootstrap of the figure of merit."""
    if isinstance(a, AUROC):
        out = paired.delong_test(a.arrays[0], a.arrays[1], b.arrays[1], level=LEVEL)
        return {**out, "interval": [out["ci_low"], out["ci_high"]]}
    if isinstance(a, Accuracy):
        return paired.mcnemar_exact(a.arrays[0], b.arrays[0])
    return mrmc.seed_mean_bootstrap(type(a), [a], [b], n_boot=N_BOOT, seed=seed, level=LEVEL)


#: what a comparison record keeps of a test's dict
KEPT = ("test", "difference", "p_value", "design", "ddf_rule", "statistic", "df", "std_error", "covariance",
        "n_boot", "seed", "b", "c", "n", "level")


def _run(base: dict[str, Any], scope: str, decides: bool, test) -> dict[str, Any]:
    """One comparison record; a test that cannot run is stated (its one-line reason), never the report's end."""
    record = {**base, "scope": scope, "claim": CLAIMS[scope], "decides": decides}
    try:
        out = test()
    except Exception as exc:  # noqa: BLE001 - reported in the page and report.json
        return {**record, "test": "or-hillis" if scope == "method" else None, "p_value": None,
                "error": str(exc).strip().splitlines()[0][:200]}
    record.update({k: out[k] for k in KEPT if k in out})
    if out.get("interval") is not None:
        record["ci_low"], record["ci_high"] = (float(v) for v in out["interval"])
    return record


def apply_holm(comparisons: list[dict[str, Any]], level: float = LEVEL) -> None:
    """Holm over the tests that decide bold, and separately over those beside them: ``p_holm`` and
    ``significant`` (at 1 - level) on every record with a p-value."""
    for decides in (True, False):
        tested = [c for c in comparisons if c.get("p_value") is not None and bool(c.get("decides")) is decides]
        for c, p in zip(tested, paired.holm([c["p_value"] for c in tested])):
            c["p_holm"], c["significant"] = p, bool(p <= 1.0 - level)


def decided(section: str, values: Mapping[str, list[dict[str, Any]]], comparisons: list[dict[str, Any]],
            flagged: set[tuple[tuple, str, str]] = frozenset()) -> dict[tuple[tuple, str], str | None]:
    """(row, metric) -> the model bolded as the best: the best (mean) value of the row when the test
    that decides (Holm) finds it better than the next-best model, in the same direction, and the
    row is not flagged for either (``flagged``: (row, metric, model)); None otherwise. Rows
    without a test are absent (the page bolds nothing there)."""
    directions = {k: better for k, _, better in SPECS[section].metrics if better}
    by_row: dict[tuple[tuple, str], dict[str, float]] = {}
    for model, records in values.items():
        for r in records:
            for metric in directions:
                if isinstance(r.get(metric), (int, float)) and not isinstance(r.get(metric), bool):
                    by_row.setdefault((row_key(section, r), metric), {})[model] = float(r[metric])
    tests_by = {(row_key(section, c), c["metric"], c["model_a"], c["model_b"]): c for c in comparisons
                if c["section"] == section and c.get("decides")}
    out: dict[tuple[tuple, str], str | None] = {}
    for (row, metric), by_model in by_row.items():
        sign = 1.0 if directions[metric] == "max" else -1.0
        ranked = sorted(by_model, key=lambda m: -sign * by_model[m])
        if len(ranked) < 2:
            continue
        best, second = ranked[:2]
        test = tests_by.get((row, metric, best, second)) or tests_by.get((row, metric, second, best))
        if test is None:
            continue
        diff = test.get("difference")
        towards_best = diff is not None and (diff if test["model_a"] == best else -diff) * sign > 0
        clean = not {(row, metric, best), (row, metric, second)} & set(flagged)
        out[(row, metric)] = best if test.get("significant") and towards_best and clean and \
            by_model[best] != by_model[second] else None
    return out
