"""What the report page says, section by section, as blocks (:mod:`jemeval.reports.document`).

A title and the models, then per section: what its numbers mean (the single command's
conventions), the options it ran with, its comparison tables (models as columns, best in bold), the
one-line error of any model it failed for, the results' notes, and its figures; last the
provenance (versions, checkpoint hashes, device, seeds). Nothing here depends on whether a result
came from the cache, so a resumed report reads exactly like an uninterrupted one.
"""
from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from jemeval.evaluation.ood.evaluate import METRIC_NOTE
from jemeval.evaluation.robust.convergence import SWEEP_AXES, final_records
from jemeval.reports.document import Block, Bullets, Figure, Folded, Heading, Para
from jemeval.reports.summary import cost_tables, summary_table
from jemeval.reports.tables import FLAGGED, Table, fmt_key, section_tables
from jemeval.reports.tests_table import TESTS_TEXT, comparison_table
from jemeval.results import Result


@dataclass
class ModelInfo:
    name: str
    path: str
    sha256: str
    arch: str | None
    dataset: str | None
    group: str | None = None  # the model (seed group) this run belongs to; None: itself
    training: dict[str, Any] = field(default_factory=dict)  # the training cost its checkpoint records
    seed: int | None = None  # the training seed its checkpoint records (runs of two groups pair by it)
    classes: Any = None  # its ClassSpace (jemeval.evaluation.classes): checked against the data before any section
    input_shape: tuple | None = None  # (C, H, W): the shape the sections load the data at

    @property
    def model(self) -> str:
        return self.group or self.name


SECTION_TEXT = {
    "accuracy": ("Accuracy and NLL",
                 "Test accuracy and mean negative log-likelihood, after K steps of SGLD refinement of the inputs "
                 "(K = 0: the inputs as they are; K > 0: each input refined in several chains, logits averaged). "
                 "The numbers of `jemeval eval`."),
    "calibration": ("Calibration",
                    "Expected (ECE), maximum (MCE) and RMS calibration error over equal-width bins of the max "
                    "softmax confidence (intervals (lo, hi]), Brier score and NLL, before and after temperature "
                    "scaling (T fitted on held-out training images; it leaves the accuracy unchanged). The numbers "
                    "of `jemeval calibrate`."),
    "ood": ("OOD detection", METRIC_NOTE + " The numbers of `jemeval ood`."),
    "robust": ("Adversarial robustness",
               "An input counts as robust when it is classified correctly both clean and after the attack, the "
               "adversarial re-classified by jemeval with fresh refinement chains. Epsilons are in [0, 1] pixel "
               "units; ranges in brackets are 95% intervals where the records carry them. The numbers of "
               "`jemeval robust`."),
    "samples": ("Samples",
                "SGLD chains from the model (class-conditional chains ascend log p~(x, y)). Target class rate: the "
                "fraction of samples classified as the class they were drawn for. log p~(x) is unnormalised: "
                "compare it within a model, not across models. The numbers of `jemeval sample`."),
}
SIZES = {"accuracy": ("n",), "calibration": ("n",), "ood": ("n_id", "n_ood"), "robust": ("n",)}


def _options(options: dict[str, Any]) -> str:
    return ", ".join(f"`{k}={json.dumps(v)}`" for k, v in options.items())


def _sizes(section: str, runs: dict[str, list[Result]]) -> str:
    found = {key: sorted({r[key] for rs in runs.values() for res in rs for r in res.records if key in r})
             for key in SIZES.get(section, ())}
    return "; ".join(f"{k} = {', '.join(map(str, v))}" for k, v in found.items() if v)


def _notes(runs: dict[str, list[Result]], skip: str) -> list[str]:
    """Each note once, followed by the models it came from; robust's passed sanity checks are
    counted per model instead of listed (their failures stay notes), and its convergence verdicts
    (``attack_converged``) are left to their own block (:func:`convergence_blocks`)."""
    by_note: dict[str, list[str]] = {}
    for model, results in runs.items():
        checks = [c for res in results for c in res.extra.get("checks") or []]
        passed = {c["message"] for c in checks if c.get("passed")}
        verdicts = {c["message"] for c in checks if c.get("check") == CONVERGED_CHECK}
        if checks:
            by_note.setdefault(f"{len(passed)} of {len(checks)} sanity checks of the adaptive-defence checklist "
                               "passed", []).append(model)
        for note in dict.fromkeys(n for res in results for n in res.notes):
            if note not in skip and note not in passed and note not in verdicts:
                by_note.setdefault(note, []).append(model)
    return [f"{note} ({', '.join(models)})" for note, models in by_note.items()]


def section_blocks(section: str, options: dict[str, Any], runs: dict[str, list[Result]], errors: dict[str, str],
                   figures: list[tuple[Path, str, str | None]], out: Path,
                   analysis: dict[str, Any] | None = None) -> list[Block]:
    """A section's blocks; with the report's ``analysis`` (jemeval.reports.build.analyse) its tables show
    each model's group records and bold only what the paired tests decided, followed by those tests."""
    heading, text = SECTION_TEXT[section]
    sizes = _sizes(section, runs)
    blocks: list[Block] = [Heading(2, heading), Para(text), Para("Options: " + (_options(options) or "defaults")
                                                                + (f". Examples: {sizes}." if sizes else "."))]
    per_model = ({m: shown_records(section, results) for m, results in runs.items()} if analysis is None
                 else analysis["shown"][section])
    tables: list[Table] = (section_tables(section, per_model, None if analysis is None else
                                          analysis["decided"][section]) if per_model else [])
    sweep = sweep_text(runs) if section == "robust" else None
    blocks += ([Para(sweep)] if sweep else []) + [t for t in tables if t.rows]
    tests = comparison_table(section, analysis["comparisons"]) if analysis else None
    blocks += [tests] if tests else []
    if section == "robust":
        blocks += convergence_blocks(runs) + flagged_blocks(per_model)
    if errors:
        blocks.append(Bullets([f"**{m}**: failed: {e}" for m, e in errors.items()]))
    notes = _notes(runs, text)
    if notes:
        blocks += [Para("Notes:"), Bullets(notes)]
    for path, caption, error in figures:
        blocks.append(Para(f"Figure ({caption}) could not be drawn: {error}") if error else
                      Figure(path, path.relative_to(out).as_posix(), caption))
    return blocks


# -- robust: a sweep's last counts and its convergence verdicts ---------------------------------------
#: the checklist item of a sweep (jemeval.evaluation.robust.convergence.convergence_checks)
CONVERGED_CHECK = "attack_converged"


def shown_records(section: str, results: list[Result]) -> list[dict[str, Any]]:
    """The records a section's tables show: every record, except that robust shows each sweep at its
    last counts (:func:`~jemeval.evaluation.robust.convergence.final_records`, per norm's Result), the
    numbers a reader should quote, so no table cell mixes counts. A run without a sweep (or cached by
    a jemeval before sweeps) has one count per curve: all of its records."""
    if section != "robust":
        return [r for res in results for r in res.records]
    return [r for res in results for r in final_records(list(res.records))]


def _sweeps(runs: dict[str, list[Result]]) -> list[dict[str, list[int]]]:
    """The distinct sweeps (swept axis -> its counts) of the robust Results (provenance ``settings.sweep``)."""
    found = []
    for res in (res for results in runs.values() for res in results):
        sweep = (res.provenance.get("settings") or {}).get("sweep") or {}
        axes = {a: list(sweep[a]) for a in SWEEP_AXES if isinstance(sweep.get(a), list)}
        if axes and axes not in found:
            found.append(axes)
    return found


def sweep_text(runs: dict[str, list[Result]]) -> str | None:
    """The paragraph that states a sweep's counts and which of them the tables show; None without one."""
    sweeps = _sweeps(runs)
    if not sweeps:
        return None
    swept = "; ".join(", ".join(f"{SWEEP_AXES[a]} {', '.join(map(str, c))}" for a, c in s.items()) for s in sweeps)
    last = "; ".join(", ".join(f"{c[-1]} {SWEEP_AXES[a]}" for a, c in s.items()) for s in sweeps)
    return (f"Attack sweep: {swept} (paired: every count attacks the same inputs with the same seeds). The table "
            f"gives robust accuracy at the last counts ({last}; EOT samples apply to the eot and bpda+eot gradient "
            "modes), the numbers to quote; every count's records are in report.json, the curves in "
            "robust-convergence.png.")


def _verdict_cell(v: dict[str, Any]) -> str:
    state = "converged" if v["converged"] else "NOT converged"
    if v.get("drop") is None:
        return f"{state} (deterministic)"
    accs = " → ".join(f"{a:.3f}" for a in v["robust_accuracy"])
    return f"{state}: {accs} (-{v['broken']}/+{v['gained']} inputs, drop <= {v['drop_ci_high']:+.3f})"


def convergence_table(runs: dict[str, list[Result]]) -> Table:
    """Every model's convergence verdict per (norm, attack, gradient mode, K, epsilon, swept axis):
    robust accuracy at each count, the inputs the last count broke and regained, and the drop's upper
    95% limit (``extra["convergence"]``)."""
    models = list(runs)
    rows_by_key: dict[tuple, dict[str, dict[str, Any]]] = {}
    for model, results in runs.items():
        for res in results:
            norm = res.records[0].get("norm") if res.records else None
            for v in res.extra.get("convergence") or []:
                if v.get("converged") is not None:
                    key = (norm, v["attack"], v["grad_mode"], v["refine_steps"], v["epsilon"], v["axis"])
                    rows_by_key.setdefault(key, {})[model] = v
    rows = []
    for (norm, attack, mode, k, eps, axis), by_model in rows_by_key.items():
        counts = ", ".join(map(str, next(iter(by_model.values()))["counts"]))
        rows.append([str(norm), attack, mode, str(k), fmt_key("epsilon", eps, {"norm": norm}), SWEEP_AXES[axis],
                     counts, *[_verdict_cell(by_model[m]) if m in by_model else "-" for m in models]])
    columns = ["norm", "attack", "gradient", "K", "epsilon", "swept", "counts"]
    return Table(columns + models, rows, [[False] * (len(columns) + len(models)) for _ in rows],
                 title=f"Attack convergence ({CONVERGED_CHECK}): robust accuracy at each count; between the last two, "
                       "the inputs broken (-) and regained (+) and the drop's upper 95% limit; converged only when "
                       "the drop is not significant (exact McNemar) and that limit is below the tolerance",
                 label_columns=len(columns))


def convergence_blocks(runs: dict[str, list[Result]]) -> list[Block]:
    """The verdicts table and the ``attack_converged`` checklist items, each with the models it came
    from (a failed one says "... not converged"); nothing where no sweep ran."""
    table = convergence_table(runs)
    by_message: dict[str, list[str]] = {}
    for model, results in runs.items():
        for c in (c for res in results for c in res.extra.get("checks") or []):
            if c.get("check") == CONVERGED_CHECK:
                by_message.setdefault(c["message"], []).append(model)
    if not table.rows and not by_message:
        return []
    items = [f"{message} ({', '.join(models)})" for message, models in by_message.items()]
    return [table] + ([Para(f"Checklist item `{CONVERGED_CHECK}`:"), Bullets(items)] if items else [])


def flagged_blocks(per_model: dict[str, list[dict[str, Any]]]) -> list[Block]:
    """What each number marked flagged is flagged for (robust): never bolded, never in the summary."""
    items = []
    for model, records in per_model.items():
        for r in records:
            if r.get("flags"):
                where = ", ".join(f"{label} {fmt_key(k, r.get(k), r)}" for k, label in
                                  (("attack", "attack"), ("grad_mode", "gradient"), ("refine_steps", "K"),
                                   ("epsilon", "eps")))
                items.append(f"{model}, {where}: {'; '.join(r['flags'])}")
    if not items:
        return []
    return [Para(f"Numbers marked{FLAGGED} are not robustness as measured: they are never bolded and never reach the "
                 "summary. Why each is flagged:"), Bullets(items)]


def model_table(models: list[ModelInfo]) -> Table:
    rows = [[m.name, m.path, m.arch or "-", m.dataset or "-", m.sha256[:16]] for m in models]
    return Table(["model", "checkpoint", "architecture", "dataset", "SHA-256 (first 16)"], rows,
                 [[False] * 5 for _ in rows], label_columns=5)


def provenance_blocks(provenance: dict[str, Any]) -> list[Block]:
    p = provenance
    line = (f"jemeval {p.get('jemeval_version')}, torch {p.get('torch_version')}, Python {p.get('python_version')}, "
            f"{p.get('platform')}; device {p.get('device')} ({p.get('device_name') or '-'}"
            + (f", {p['cpu_threads']} threads" if p.get("cpu_threads") else "") + f"); created {p.get('created')}.")
    seeds = {s: o.get("seed") for s, o in (p.get("settings", {}).get("options") or {}).items()}
    return [Heading(2, "Provenance"), Para(line), Para("Seeds: " + _options(seeds) + "."),
            Folded("provenance (JSON)", json.dumps(p, indent=2, sort_keys=True), "json")]


def report_blocks(*, title: str, preset: str, models: list[ModelInfo], plan: dict[str, dict[str, Any]],
                  outcomes: dict[str, dict[str, list[Result]]], errors: dict[str, dict[str, str]],
                  figures: dict[str, list], provenance: dict[str, Any], out: Path,
                  analysis: dict[str, Any] | None = None) -> list[Block]:
    grouped = GROUPED if any(m.model != m.name for m in models) else ""
    blocks: list[Block] = [Heading(1, title), Para(INTRO.format(preset=preset, sections=", ".join(plan),
                                                                grouped=grouped)), model_table(models)]
    summary = summary_table(analysis["summary"]) if analysis else None
    blocks += [summary] if summary else []
    blocks += [Para(TESTS_TEXT)] if analysis and analysis["comparisons"] else []
    for section, options in plan.items():
        blocks += section_blocks(section, options, outcomes.get(section, {}), errors.get(section, {}),
                                 figures.get(section, []), out, analysis)
    if analysis:
        blocks += [Heading(2, "Cost"), Para(COST_TEXT), *cost_tables(analysis["cost"])]
    return blocks + provenance_blocks(provenance)


INTRO = ("Written by `jemeval report` (preset `{preset}`, sections {sections}). Models are the columns of every "
         "table (↑: higher is better, ↓: lower is better){grouped}. A value is in **bold** only where the test that "
         "decides its row (between two seed groups: do the methods differ; otherwise: do these runs differ) found "
         "it better than the next-best model at the 0.05 level after Holm's correction; rows without a test (no "
         "per-input outcomes) and numbers a check flagged bold nothing.")
GROUPED = ("; a seed group shows `mean +- sd` over its runs (sd: n - 1 in the denominator), the number of seeds in "
           "its column header")
COST_TEXT = ("What each number cost: the seconds of each section's computation on the device named (a cached "
             "section keeps the seconds of the run that computed it), the forward passes each prediction needs, "
             "and the training cost the checkpoints record.")
