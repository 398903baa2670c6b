"""The report's figures, drawn into DIR/figures from the (cached) Results of every model.

Calibration, ROC, robustness and attack-convergence figures overlay the models (:mod:`jemeval.plots.report`); score
histograms and sample grids are drawn per model by the single commands' own plot functions. A
figure that cannot be drawn is replaced in the page by its one-line error, like a failed section.
"""
from __future__ import annotations

import re
from collections.abc import Callable
from pathlib import Path

from jemeval.artifacts import OODScores, Samples
from jemeval.evaluation.robust.convergence import final_records
from jemeval.plots import pyplot
from jemeval.plots.grids import save_samples_grid
from jemeval.plots.ood import plot_score_histograms
from jemeval.plots.report import (
    plot_convergence_overlay,
    plot_reliability_overlay,
    plot_robustness_overlay,
    plot_roc_overlay,
)
from jemeval.reports.cache import FIGURES, ReportFolder
from jemeval.reports.sections import failure
from jemeval.results import Result

#: section -> {model: [Result, ...]} (the models whose section succeeded)
Outcomes = dict[str, dict[str, list[Result]]]
#: every name :func:`figure_plan` gives a figure (a folder of jemeval 0.1/0.2 is recognised by them)
FIGURE_NAME = re.compile(r"calibration-reliability\.png|ood-roc\.png|robust\.png|robust-convergence\.png|"
                         r"(?:ood-histograms|samples)-[1-9][0-9]*-[A-Za-z0-9_.-]+\.png")


def is_figure_name(name: str) -> bool:
    return FIGURE_NAME.fullmatch(name) is not None


def slug(name: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.-]+", "-", name).strip("-") or "model"


def _records(runs: list[Result]) -> list[dict]:
    return [r for result in runs for r in result.records]


def _artifact(runs: list[Result], kind: type):
    return next((v for result in runs for v in result.extra.values() if isinstance(v, kind)), None)


def figure_plan(outcomes: Outcomes) -> list[tuple[str, str, str, Callable[[Path], object]]]:
    """(section, file name, caption, draw(path)) for every figure the outcomes allow."""
    plan = []
    calibration = {m: _records(runs) for m, runs in outcomes.get("calibration", {}).items()}
    if calibration:
        plan.append(("calibration", "calibration-reliability.png", "reliability diagrams, models overlaid",
                     lambda p: plot_reliability_overlay(calibration, p)))
    ood = {m: _artifact(runs, OODScores) for m, runs in outcomes.get("ood", {}).items()}
    ood = {m: s for m, s in ood.items() if s is not None}
    if ood:
        records = {m: _records(outcomes["ood"][m]) for m in ood}
        plan.append(("ood", "ood-roc.png", "ROC curves per score, models overlaid",
                     lambda p: plot_roc_overlay(ood, p, records)))
        for i, (model, scores) in enumerate(ood.items()):
            plan.append(("ood", f"ood-histograms-{i + 1}-{slug(model)}.png", f"{model}: OOD score histograms",
                         lambda p, s=scores, m=model: plot_score_histograms(
                             s, p, records=records[m], title=f"{m}: {s.id_name} vs {', '.join(s.ood_names)}")))
    plan += robust_figures(outcomes.get("robust", {}))
    for i, (model, runs) in enumerate(outcomes.get("samples", {}).items()):
        samples = _artifact(runs, Samples)
        if samples is not None and len(samples):
            plan.append(("samples", f"samples-{i + 1}-{slug(model)}.png", f"{model}: SGLD samples",
                         lambda p, s=samples: save_samples_grid(s, p)))
    return plan


def robust_figures(outcomes: dict[str, list[Result]]) -> list[tuple[str, str, str, Callable[[Path], object]]]:
    """robust.png (accuracy vs epsilon; a sweep at its last counts, the numbers the table shows) and,
    after a sweep, robust-convergence.png (accuracy vs each swept count, per curve)."""
    plan = []
    robust = {m: [r for res in runs for r in final_records(list(res.records))] for m, runs in outcomes.items()}
    if any(robust.values()):
        plan.append(("robust", "robust.png", "robust accuracy vs epsilon, models overlaid",
                     lambda p: plot_robustness_overlay(robust, p)))
    sweeps = {m: [(res.records, res.extra["convergence"]) for res in runs if res.extra.get("convergence")]
              for m, runs in outcomes.items()}
    sweeps = {m: s for m, s in sweeps.items() if s}
    if sweeps:
        plan.append(("robust", "robust-convergence.png", "attack convergence: robust accuracy vs EOT samples / "
                     "attack steps per (attack, K, gradient mode, epsilon), models overlaid, non-converged curves "
                     "ringed", lambda p: plot_convergence_overlay(sweeps, p)))
    return plan


def draw_figures(folder: ReportFolder, outcomes: Outcomes) -> dict[str, list[tuple[Path, str, str | None]]]:
    """Draw every figure into DIR/figures; section -> [(path, caption, error or None)]. Figures an
    earlier run drew that this one did not are removed: only those the folder's manifest lists (files
    jemeval wrote), never a user's file, never through a symbolic link."""
    plan = figure_plan(outcomes)
    folder.record(*[f"{FIGURES}/{name}" for _, name, _, _ in plan])
    drawn: dict[str, list[tuple[Path, str, str | None]]] = {}
    for section, name, caption, draw in plan:
        path = folder.target(f"{FIGURES}/{name}")
        try:
            draw(path)
            drawn.setdefault(section, []).append((path, caption, None))
        except Exception as exc:  # noqa: BLE001 - a figure's failure is shown in the page, the rest is written
            pyplot().close("all")
            drawn.setdefault(section, []).append((path, caption, failure(exc)))
    keep = {f"{FIGURES}/{p.name}" for figures in drawn.values() for p, _, error in figures if error is None}
    for rel in sorted(folder.files):
        if rel.startswith(f"{FIGURES}/") and rel not in keep:
            folder.remove(rel)
    return drawn
