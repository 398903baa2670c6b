"""Cost beside the numbers, and one summary row per model ("the JEM trilemma").

A robust accuracy bought with 20 refinement chains is not the same number as one from a single
forward pass, and a model trained 10x longer is not the same model. The report therefore states:

* per (model, section): the seconds its computation took (measured around the section's function,
  on the device named; a cached entry keeps the seconds of the run that computed it), the inputs it
  evaluated and inputs per second;
* per (model, section, K): forward passes per prediction, K refinement steps x chains + 1;
* per run: the training cost its checkpoint records (epochs, iterations, SGLD steps, wall time,
  device), where recorded.

The summary row of each model: clean accuracy, robust accuracy under the strongest attack run (the
lowest over attacks and gradient modes, at the headline epsilon, the same for every model), AUROC of
its best score (near and far when the OOD sets form those groups, else the mean over the sets), ECE
after temperature scaling, FID where samples were scored, forward passes per prediction at that K,
training time; for a seed group each is mean +- sd over its runs.

Like with like: the K of a model's row is the best only among the K whose robust numbers at the
headline point no check flagged (a stochastic defence attacked without EOT, a failed sanity check,
an attack not converged: :func:`jemeval.evaluation.robust.checks.record_flags`). A flagged number
never reaches the summary; where every K is flagged the robust cell is empty and the setting says why.
"""
from __future__ import annotations

import math
import statistics
from collections.abc import Mapping
from typing import Any

from jemeval.artifacts import OODScores, Samples
from jemeval.evaluation.robust.evaluate import MAX_EPSILON
from jemeval.reports.tables import Table, cell, fmt_count, fmt_key, fmt_seconds
from jemeval.results import Result

#: the summary's numbers: (key, column label)
SUMMARY = [("clean_accuracy", "clean accuracy ↑"), ("robust_accuracy", "robust accuracy ↑"),
           ("near_auroc", "near AUROC ↑"), ("far_auroc", "far AUROC ↑"), ("auroc", "AUROC, mean over OOD sets ↑"),
           ("ece_ts", "ECE (temperature-scaled) ↓"), ("fid", "FID ↓"), ("forward_passes", "forward passes"),
           ("training_seconds", "training time (s)")]


def training_cost(metadata: Mapping[str, Any]) -> dict[str, Any]:
    """The training cost a checkpoint records (None where it does not): epochs, iterations, SGLD
    steps per iteration and in all, wall time in seconds, the device."""
    prov = metadata.get("provenance") or {}
    training, settings = prov.get("training") or {}, prov.get("settings") or {}
    config = metadata.get("config") or {}
    iterations = training.get("step")
    per_iteration = (settings.get("effective") or {}).get("sgld_steps", settings.get("sgld_steps"))
    if settings and not settings.get("sampling", True):
        per_iteration = 0  # a run that draws no samples (e.g. px_weight 0)
    seconds = training.get("seconds", training.get("elapsed"))
    return {"epochs": training.get("epoch", config.get("epochs")), "iterations": iterations,
            "sgld_steps_per_iteration": per_iteration,
            "sgld_steps": iterations * per_iteration if isinstance(iterations, int) and
            isinstance(per_iteration, int) else None,
            "seconds": seconds, "device": prov.get("device"), "device_name": prov.get("device_name")}


def examples(section: str, results: list[Result]) -> int | None:
    """The inputs a section evaluated (each through every setting of the section): the test subset
    (accuracy, calibration, robust), in-distribution plus every OOD set (ood), the samples drawn."""
    for result in results:
        for value in result.extra.values():
            if isinstance(value, OODScores) and value.score_names:
                first = value.score_names[0]
                return len(value.id_scores[first]) + sum(len(s[first]) for s in value.ood_scores.values())
            if isinstance(value, Samples):
                return len(value.x)
    sizes = [r.get("n") for res in results for r in res.records if isinstance(r.get("n"), int)]
    return max(sizes) if sizes else None


def section_cost(section: str, model: str, run: str, seconds: float | None, results: list[Result]) -> dict[str, Any]:
    """The seconds a (run, section) took (a cached one: those of the run that computed it), its inputs, inputs/s."""
    prov = results[0].provenance if results else {}
    count = examples(section, results)
    rate = count / seconds if count and seconds else None
    return {"model": model, "run": run, "section": section, "seconds": seconds, "examples": count,
            "examples_per_s": rate, "device": prov.get("device"), "device_name": prov.get("device_name")}


def forward_passes(section: str, model: str, results: list[Result]) -> list[dict[str, Any]]:
    """Forward passes per prediction per K (K x chains + 1) of a section that refines its inputs."""
    out = []
    for result in results[:1]:
        settings = (result.provenance or {}).get("settings") or {}
        ks = settings.get("refine_steps")
        ks = ks if isinstance(ks, list) else [ks] if isinstance(ks, int) else []
        for k in ks:
            refinement = (settings.get("refinement") or {}).get(str(k)) or {}
            chains = settings.get("chains", refinement.get("chains", 1 if k == 0 else None))
            passes = k * chains + 1 if isinstance(chains, int) else None
            out.append({"model": model, "section": section, "refine_steps": k, "chains": chains if k else None,
                        "forward_passes": passes})
    return out


# -- the summary row ----------------------------------------------------------------------------------
def headline(records: list[dict[str, Any]], plan: Mapping[str, Any]) -> tuple[str, float] | None:
    """(norm, epsilon) of the summary's robust accuracy, the same for every model: the first norm
    run, its largest epsilon below the norm's maximum when the list ends at it (that one is the
    sanity check every input fails), else its largest."""
    norms = [r.get("norm") for r in records if r.get("norm")]
    if not norms:
        return None
    norm = norms[0]
    eps = sorted({float(r["epsilon"]) for r in records if r.get("norm") == norm and r.get("epsilon") is not None})
    given = plan.get("epsilons")
    given = given.get(norm) if isinstance(given, dict) else given
    ends_at_max = isinstance(given, list) and given and (given[-1] == MAX_EPSILON or (norm == "linf" and
                                                                                      given[-1] == 1.0))
    return norm, eps[-2] if ends_at_max and len(eps) > 1 else eps[-1]


def robust_choice(records: list[dict[str, Any]], point: tuple[str, float]) -> tuple[int, float] | None:
    """(K, robust accuracy) at ``point``: per K the lowest over attacks and gradient modes (the
    strongest attack run), then the K where that is highest (the smaller K on a tie), among the K
    none of whose records at ``point`` is flagged; None where there is no such K."""
    worst: dict[int, float] = {}
    flagged: set[int] = set()
    for r in records:
        acc = r.get("robust_accuracy")
        if (r.get("norm"), r.get("epsilon")) == point and isinstance(acc, (int, float)):
            k = int(r.get("refine_steps") or 0)
            worst[k] = min(worst.get(k, math.inf), float(acc))
            if r.get("flags"):
                flagged.add(k)
    eligible = {k: v for k, v in worst.items() if k not in flagged}
    return max(sorted(eligible.items()), key=lambda kv: kv[1]) if eligible else None


def find(records: list[dict[str, Any]], key: str, **match: Any) -> float | None:
    """``key`` of the first record whose settings are ``match`` (None: no such record, or no number)."""
    value = next((r.get(key) for r in records if all(r.get(k) == v for k, v in match.items())), None)
    return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else None


def best_score(records: list[dict[str, Any]]) -> str | None:
    """The OOD score with the highest AUROC, near when the sets form that group, else the mean over sets."""
    by_score: dict[str, list[float]] = {}
    near = any(r.get("ood") == "near" for r in records)
    for r in records:
        if isinstance(r.get("auroc"), (int, float)) and (r.get("ood") == "near" if near else r.get("ood") not in (
                "near", "far")):
            by_score.setdefault(r["score"], []).append(float(r["auroc"]))
    return max(by_score, key=lambda s: statistics.fmean(by_score[s])) if by_score else None


def choices(shown: Mapping[str, list[dict[str, Any]]], plan: Mapping[str, Any]) -> dict[str, Any]:
    """What a model's summary row reads, chosen on its (group) records: the robust point and K, the best score."""
    robust = shown.get("robust") or []
    point = headline(robust, plan.get("robust") or {}) if robust else None
    pick = robust_choice(robust, point) if point else None
    return {"point": point, "refine_steps": pick[0] if pick else 0, "score": best_score(shown.get("ood") or []),
            "robust_flagged": bool(point) and pick is None}


def summary_values(shown: Mapping[str, list[dict[str, Any]]], choice: Mapping[str, Any],
                   passes: Mapping[int, int | None], training: Mapping[str, Any]) -> dict[str, float | None]:
    """One run's numbers of the summary row at the group's ``choice``."""
    k, point, score = choice["refine_steps"], choice["point"], choice["score"]
    robust, ood = shown.get("robust") or [], shown.get("ood") or []
    clean = find(shown.get("accuracy") or [], "accuracy", refine_steps=k)
    worst = [float(r["robust_accuracy"]) for r in robust if point and (r.get("norm"), r.get("epsilon")) == point
             and r.get("refine_steps") == k and isinstance(r.get("robust_accuracy"), (int, float))
             and not choice.get("robust_flagged")]
    if clean is None and point:
        clean = find(robust, "clean_accuracy", norm=point[0], refine_steps=k)
    sets = [float(r["auroc"]) for r in ood if r.get("score") == score and r.get("ood") not in ("near", "far")
            and isinstance(r.get("auroc"), (int, float))]
    fid = next((float(r["fid"]) for rs in shown.values() for r in rs if isinstance(r.get("fid"), (int, float))), None)
    return {"clean_accuracy": clean, "robust_accuracy": min(worst) if worst else None,
            "near_auroc": find(ood, "auroc", score=score, ood="near"), "far_auroc": find(ood, "auroc", score=score,
                                                                                        ood="far"),
            "auroc": statistics.fmean(sets) if sets else None,
            "ece_ts": find(shown.get("calibration") or [], "ece", calibration="temperature"), "fid": fid,
            "forward_passes": passes.get(k, 1 if k == 0 else None), "training_seconds": training.get("seconds")}


def summary_record(model: str, choice: Mapping[str, Any], per_run: list[dict[str, float | None]]) -> dict[str, Any]:
    """The model's summary row: each number the mean over its runs, with ``sd`` and ``values`` for a seed group."""
    point = choice["point"] or (None, None)
    record: dict[str, Any] = {"model": model, "refine_steps": choice["refine_steps"], "norm": point[0],
                              "epsilon": point[1], "score": choice["score"],
                              "robust_flagged": bool(choice.get("robust_flagged"))}
    sd: dict[str, float | None] = {}
    values: dict[str, list[float | None]] = {}
    for key, _ in SUMMARY:
        seen = [run[key] for run in per_run]
        finite = [v for v in seen if isinstance(v, (int, float)) and math.isfinite(v)]
        record[key] = statistics.fmean(finite) if finite else None
        if len(per_run) > 1:
            sd[key] = statistics.stdev(finite) if len(finite) > 1 else None
            values[key] = seen
    return {**record, **({"sd": sd, "values": values, "n_seeds": len(per_run)} if len(per_run) > 1 else {})}


# -- on the page --------------------------------------------------------------------------------------
def summary_table(summary: list[dict[str, Any]]) -> Table | None:
    """One row per model: the summary's numbers (columns no model has are left out), mean +- sd for a group."""
    shown = [(k, label) for k, label in SUMMARY if any(r.get(k) is not None for r in summary)]
    if not summary or not shown:
        return None
    rows = []
    for r in summary:
        robust = (f", {r['norm']} eps {fmt_key('epsilon', r['epsilon'], r)}" if r.get("norm") else "") + (
            " (every K flagged: no robust number)" if r.get("robust_flagged") else "")
        setting = f"K={r['refine_steps']}" + robust + (f", {r['score']}" if r.get("score") else "")
        rows.append([r["model"], fmt_count(r.get("n_seeds") or 1), setting] + [summary_cell(r, k) for k, _ in shown])
    columns = ["model", "runs", "setting"] + [label for _, label in shown]
    return Table(columns, rows, [[False] * len(columns) for _ in rows],
                 title="Summary (the JEM trilemma): one row per model, each at a setting whose checks passed",
                 label_columns=3)


def summary_cell(record: dict[str, Any], key: str) -> str:
    """A summary number: seconds to 3 significant figures, counts as integers, the rest as the tables show them."""
    if key not in ("training_seconds", "forward_passes"):
        return cell(record, key)
    show = fmt_seconds if key == "training_seconds" else fmt_count
    sd = (record.get("sd") or {}).get(key)
    return show(record.get(key)) + (f" +- {show(sd)}" if isinstance(sd, (int, float)) else "")


def cost_tables(cost: Mapping[str, Any]) -> list[Table]:
    """The seconds and inputs/s of every (run, section), the forward passes per prediction, the training cost."""
    tables = []
    sections = cost.get("sections") or []
    if sections:
        rows = [[c.get("run") or c["model"], c["section"], fmt_seconds(c["seconds"]), fmt_count(c["examples"]),
                 f"{c['examples_per_s']:.1f}" if c.get("examples_per_s") else "-",
                 f"{c.get('device') or '-'} ({c.get('device_name') or '-'})"] for c in sections]
        tables.append(_plain_table(["run", "section", "seconds", "inputs", "inputs/s", "device"], rows,
                                   "Compute per section (seconds measured around the section's function)"))
    passes = cost.get("forward_passes") or []
    if passes:
        rows = [[p["model"], p["section"], str(p["refine_steps"]), fmt_count(p["chains"]),
                 fmt_count(p["forward_passes"])] for p in passes]
        tables.append(_plain_table(["model", "section", "K", "chains", "forward passes per prediction"], rows,
                                   "Forward passes per prediction: K refinement steps x chains + 1"))
    training = cost.get("training") or []
    if training:
        rows = [[t.get("run") or t["model"], fmt_count(t.get("epochs")), fmt_count(t.get("iterations")),
                 fmt_count(t.get("sgld_steps")), fmt_seconds(t.get("seconds")), t.get("device") or "-"]
                for t in training]
        tables.append(_plain_table(["run", "epochs", "iterations", "SGLD steps", "wall time (s)", "device"], rows,
                                   "Training cost, as each checkpoint records it (- where it does not)"))
    return tables


def _plain_table(columns: list[str], rows: list[list[str]], title: str) -> Table:
    return Table(columns, rows, [[False] * len(columns) for _ in rows], title=title, label_columns=len(columns))
