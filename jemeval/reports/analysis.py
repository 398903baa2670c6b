"""What the report adds to the sections' numbers: each model's (seed group) records, the tests
between models and the rows they let the page bold, the cost of every number, and the summary row
per model (:func:`analyse`). Computed from the sections' Results alone, so a resumed report reads
exactly like an uninterrupted one."""
from __future__ import annotations

from typing import Any

from jemeval.reports.cache import Entry
from jemeval.reports.compare import apply_holm, compare, decided
from jemeval.reports.groups import aggregate, row_key
from jemeval.reports.page import ModelInfo, shown_records
from jemeval.reports.summary import choices, forward_passes, section_cost, summary_record, summary_values
from jemeval.results import Result


def labels(m: ModelInfo, size: int) -> dict[str, str]:
    """The keys naming a run in report.json: its model, and the run itself in a seed group of several."""
    return {"model": m.model} if size == 1 else {"model": m.model, "run": m.name}


def analyse(models: list[ModelInfo], plan: dict[str, dict[str, Any]], outcomes: dict[str, dict[str, list[Result]]],
            entries: dict[tuple[str, str], Entry], *, seed: int) -> dict[str, Any]:
    """What the report adds to the sections' numbers: each model's (group) records, the paired tests
    between models (Holm over all of them) and the rows they let the page bold, the cost of every
    number, and the summary row per model. The keys ``groups``, ``comparisons``, ``summary`` and
    ``cost`` go into report.json as they are."""
    groups = list(dict.fromkeys(m.model for m in models))
    members = {g: [m for m in models if m.model == g] for g in groups}
    shown = {s: {g: aggregate(s, {m.name: shown_records(s, outcomes[s][m.name]) for m in members[g]
                                  if m.name in outcomes[s]}) for g in groups
                 if any(m.name in outcomes[s] for m in members[g])} for s in plan}
    ran = {s: {g: [m for m in members[g] if m.name in outcomes[s]] for g in shown[s]} for s in plan}
    comparisons = [c for s in plan for c in compare(
        s, {g: [outcomes[s][m.name] for m in ms] for g, ms in ran[s].items()}, shown[s], seed=seed,
        seeds={g: [m.seed for m in ms] for g, ms in ran[s].items()})]
    apply_holm(comparisons)
    cost = {"sections": [section_cost(s, m.model, m.name, entries[(m.name, s)].seconds, outcomes[s][m.name])
                         for s in plan for m in models if m.name in outcomes[s]],
            "forward_passes": [p for s in ("accuracy", "robust") if s in plan for g in shown[s]
                               for p in forward_passes(s, g, outcomes[s][members[g][0].name]
                                                       if members[g][0].name in outcomes[s] else [])],
            "training": [{**labels(m, len(members[m.model])), **m.training} for m in models]}
    summary = [summary_row(g, members[g], {s: shown[s].get(g, []) for s in plan}, outcomes, plan, cost)
               for g in groups]
    return {"groups": {"models": [{"model": g, "runs": [{"run": m.name, "checkpoint": m.path, "sha256": m.sha256}
                                                         for m in members[g]]} for g in groups],
                       "records": [{"section": s, "model": g, **r} for s in plan for g in shown[s]
                                   for r in shown[s][g] if len(members[g]) > 1]},
            "comparisons": comparisons, "summary": summary, "cost": cost, "shown": shown,
            "decided": {s: decided(s, shown[s], comparisons, flagged_rows(s, shown[s])) for s in plan}}


def flagged_rows(section: str, shown: dict[str, list[dict[str, Any]]]) -> set[tuple[tuple, str, str]]:
    """(row, metric, model) of every number a check flagged: never bolded (robust accuracy)."""
    return {(row_key(section, r), "robust_accuracy", model) for model, records in shown.items() for r in records
            if r.get("flags")}


def summary_row(group: str, runs: list[ModelInfo], shown: dict[str, list[dict[str, Any]]],
                outcomes: dict[str, dict[str, list[Result]]], plan: dict[str, dict[str, Any]],
                cost: dict[str, Any]) -> dict[str, Any]:
    """The group's summary row: choices made on its group records, the numbers read from each run."""
    choice = choices(shown, plan)
    section = "robust" if "robust" in plan else "accuracy"
    passes = {p["refine_steps"]: p["forward_passes"] for p in cost["forward_passes"]
              if p["model"] == group and p["section"] == section}
    per_run = [summary_values({s: shown_records(s, outcomes[s][m.name]) for s in plan if m.name in outcomes[s]},
                              choice, passes, m.training) for m in runs]
    return summary_record(group, choice, per_run)
