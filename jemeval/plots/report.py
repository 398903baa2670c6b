"""Figures that compare models: reliability curves, ROC curves, robust accuracy and (after an attack
sweep) its convergence curves, models overlaid.

The single commands draw one model per figure (calibration.py, ood.py, robustness.py); a report
draws every model on the same axes, one colour per model, from the records and scores the
evaluation functions returned. ROC curves come from the per-example scores (in-distribution is the
positive class, as for AUROC); the AUROC in each legend entry is the record's, not recomputed.
"""
from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from jemeval.evaluation.robust.convergence import SWEEP_AXES
from jemeval.plots import pyplot, save_figure

LINESTYLES = ["-", "--", ":", "-."]
HEADINGS = {"none": "raw", "temperature": "temperature-scaled"}


def _colours(n: int) -> list:
    cmap = pyplot().get_cmap("tab10")
    return [cmap(i % 10) for i in range(n)]


def plot_reliability_overlay(per_model: Mapping[str, Sequence[dict[str, Any]]], path: str | Path) -> Path:
    """Accuracy against confidence per bin for every model (one panel per calibration: raw, scaled).
    Only non-empty bins are drawn; a marker's area grows with the examples in its bin."""
    plt = pyplot()
    kinds = list(dict.fromkeys(r.get("calibration", "none") for rs in per_model.values() for r in rs))
    fig, axes = plt.subplots(1, max(1, len(kinds)), figsize=(4.8 * max(1, len(kinds)), 4.6), squeeze=False)
    colours = _colours(len(per_model))
    for ax, kind in zip(axes[0], kinds):
        ax.plot([0, 1], [0, 1], linestyle="--", color="0.4", linewidth=1, label="perfect calibration")
        for colour, (model, records) in zip(colours, per_model.items()):
            for r in (r for r in records if r.get("calibration", "none") == kind):
                bins = [b for b in r["bins"] if b["count"]]
                total = max(1, sum(b["count"] for b in bins))
                conf = [b["confidence"] for b in bins]
                acc = [b["accuracy"] for b in bins]
                ax.plot(conf, acc, color=colour, linewidth=1.2, alpha=0.8)
                ax.scatter(conf, acc, s=[8 + 400 * b["count"] / total for b in bins], color=colour, alpha=0.75,
                           edgecolors="white", linewidths=0.5,
                           label=f"{model} (ECE {100 * r['ece']:.1f}%)" if "ece" in r else model)
        ax.set_xlim(0, 1)
        ax.set_ylim(0, 1.02)
        ax.set_xlabel("confidence (max softmax)")
        ax.set_ylabel("accuracy")
        ax.set_title(HEADINGS.get(kind, kind), fontsize=10)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8, loc="upper left")
    fig.suptitle("reliability: accuracy vs confidence per bin (marker area = examples in the bin)", fontsize=10)
    fig.tight_layout()
    save_figure(fig, path)
    return Path(path)


def roc_points(id_scores: np.ndarray, ood_scores: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(false positive rate, true positive rate) with in-distribution as the positive class."""
    from sklearn.metrics import roc_curve

    labels = np.r_[np.ones(len(id_scores)), np.zeros(len(ood_scores))]
    values = np.nan_to_num(np.r_[id_scores, ood_scores].astype(np.float64), nan=-np.inf)
    fpr, tpr, _ = roc_curve(labels, np.clip(values, -1e300, 1e300))
    return fpr, tpr


def plot_roc_overlay(per_model: Mapping[str, Any], path: str | Path,
                     records: Mapping[str, Sequence[dict[str, Any]]] | None = None) -> Path:
    """ROC curves of every model's OODScores: one panel per score, a colour per model, a line style
    per OOD set; the legend gives each curve's AUROC from ``records`` (model -> OOD records)."""
    plt = pyplot()
    scores = list(dict.fromkeys(s for sc in per_model.values() for s in sc.score_names))
    sets = list(dict.fromkeys(o for sc in per_model.values() for o in sc.ood_names))
    cols = min(3, len(scores))
    rows = -(-len(scores) // cols)
    fig, axes = plt.subplots(rows, cols, figsize=(4.8 * cols, 4.6 * rows), squeeze=False)
    auroc = {(m, r["score"], r["ood"]): r.get("auroc") for m, rs in (records or {}).items() for r in rs}
    for ax, score in zip(axes.flat, scores):
        ax.plot([0, 1], [0, 1], color="0.6", linewidth=0.8, linestyle=":")
        for colour, (model, sc) in zip(_colours(len(per_model)), per_model.items()):
            for i, ood in enumerate(sets):
                if score not in sc.score_names or ood not in sc.ood_scores:
                    continue
                fpr, tpr = roc_points(sc.id_scores[score], sc.ood_scores[ood][score])
                value = auroc.get((model, score, ood))
                tag = f" ({value:.3f})" if value is not None else ""
                ax.plot(fpr, tpr, color=colour, linestyle=LINESTYLES[i % len(LINESTYLES)], linewidth=1.4,
                        label=f"{model} / {ood}{tag}")
        ax.set_title(score, fontsize=10)
        ax.set_xlabel("false positive rate (OOD accepted)")
        ax.set_ylabel("true positive rate (in-dist. accepted)")
        ax.set_xlim(-0.01, 1.01)
        ax.set_ylim(-0.01, 1.01)
        ax.legend(fontsize=7, loc="lower right")
    for ax in list(axes.flat)[len(scores):]:
        ax.set_visible(False)
    fig.suptitle("ROC curves, in-distribution positive (AUROC in brackets)", fontsize=10)
    fig.tight_layout()
    save_figure(fig, path)
    return Path(path)


def plot_robustness_overlay(per_model: Mapping[str, Sequence[dict[str, Any]]], path: str | Path) -> Path:
    """Robust accuracy vs epsilon for every model: one panel per norm, a colour per model, a line
    style per refinement steps K (and gradient mode); 95% intervals shaded where records have them."""
    plt = pyplot()
    norms = list(dict.fromkeys(r["norm"] for rs in per_model.values() for r in rs))
    fig, axes = plt.subplots(1, max(1, len(norms)), figsize=(6.0 * max(1, len(norms)), 4.4), squeeze=False)
    for ax, norm in zip(axes[0], norms):
        runs = list(dict.fromkeys((r["attack"], r["refine_steps"], r["grad_mode"]) for rs in per_model.values()
                                  for r in rs if r["norm"] == norm))
        for colour, (model, records) in zip(_colours(len(per_model)), per_model.items()):
            for i, (attack, k, mode) in enumerate(runs):
                rows = sorted((r for r in records if r["norm"] == norm and (r["attack"], r["refine_steps"],
                               r["grad_mode"]) == (attack, k, mode)), key=lambda r: r["epsilon"])
                if not rows:
                    continue
                eps = [r["epsilon"] for r in rows]
                ax.plot(eps, [r["robust_accuracy"] for r in rows], color=colour, marker="o", markersize=3.5,
                        linestyle=LINESTYLES[i % len(LINESTYLES)], label=f"{model}: K={k} {attack} ({mode})")
                if all(r.get("ci_low") is not None and r.get("ci_high") is not None for r in rows):
                    ax.fill_between(eps, [r["ci_low"] for r in rows], [r["ci_high"] for r in rows], color=colour,
                                    alpha=0.12, linewidth=0)
        ax.set_xlabel(f"epsilon ({norm.upper()}, pixel units in [0, 1])")
        ax.set_ylabel("robust accuracy")
        ax.set_ylim(-0.02, 1.02)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7, loc="upper right")
        ax.set_title(f"robust accuracy vs {norm} epsilon", fontsize=10)
    fig.tight_layout()
    save_figure(fig, path)
    return Path(path)


#: one robust Result as the convergence figure reads it: (its records, its ``extra["convergence"]``)
Sweep = tuple[Sequence[dict[str, Any]], Sequence[dict[str, Any]]]


def _curve(v: dict[str, Any]) -> tuple:
    return v["attack"], v["refine_steps"], v["grad_mode"], v["epsilon"]


def _sweep_band(records: Sequence[dict[str, Any]], v: dict[str, Any]) -> list[tuple[float, float]] | None:
    """The 95% interval of each point of a verdict's curve, from the records behind it (at the other
    axis's largest count, as the verdict was taken); None where a record lacks one."""
    other = "steps" if v["axis"] == "eot_samples" else "eot_samples"
    band = []
    for count in v["counts"]:
        rows = [r for r in records if (r["attack"], r["refine_steps"], r["grad_mode"], r["epsilon"], r.get(v["axis"]))
                == (v["attack"], v["refine_steps"], v["grad_mode"], v["epsilon"], count)]
        rows = [r for r in rows if (r.get(other) or 0) == max((q.get(other) or 0) for q in rows)]
        if not rows or rows[0].get("ci_low") is None or rows[0].get("ci_high") is None:
            return None
        band.append((rows[0]["ci_low"], rows[0]["ci_high"]))
    return band


def _sweep_curves(per_model: Mapping[str, Sequence[Sweep]]) -> dict[tuple[str, str], list[tuple[str, list, dict]]]:
    """(norm, swept axis) -> [(model, records, verdict)] for every curve with two or more counts at an
    epsilon above 0 (at 0 nothing is attacked)."""
    panels: dict[tuple[str, str], list[tuple[str, list, dict]]] = {}
    for model, sweeps in per_model.items():
        for records, verdicts in sweeps:
            norm = records[0]["norm"] if records else "?"
            for v in verdicts:
                if len(v["counts"]) > 1 and v["epsilon"] > 0:
                    panels.setdefault((norm, v["axis"]), []).append((model, list(records), v))
    return panels


def plot_convergence_overlay(per_model: Mapping[str, Sequence[Sweep]], path: str | Path) -> Path:
    """Robust accuracy vs each swept count (EOT samples, attack steps; log scale) for every model: one
    panel per (norm, swept axis), a colour per model, a line style and marker per (attack, K, grad
    mode, epsilon) curve, the 95% Wilson band where the records carry one. A curve that has not
    converged (:func:`jemeval.evaluation.robust.convergence.convergence`) gets a ring on its last point and
    "NOT converged" in the legend."""
    plt = pyplot()
    panels = _sweep_curves(per_model)
    fig, axes = plt.subplots(1, max(1, len(panels)), figsize=(6.4 * max(1, len(panels)), 4.6), squeeze=False)
    colours = dict(zip(per_model, _colours(len(per_model))))
    markers = ["o", "s", "^", "v", "D", "P", "X", "*"]
    for ax, ((norm, axis), curves) in zip(axes[0], panels.items()):
        shapes = list(dict.fromkeys(_curve(v) for _, _, v in curves))
        for model, records, v in curves:
            i = shapes.index(_curve(v))
            colour = colours[model]
            label = f"{model}: K={v['refine_steps']} {v['attack']} ({v['grad_mode']}) eps={v['epsilon']:g}"
            ax.plot(v["counts"], v["robust_accuracy"], color=colour, linestyle=LINESTYLES[i % len(LINESTYLES)],
                    marker=markers[i % len(markers)], markersize=4,
                    label=label + ("" if v["converged"] is not False else " NOT converged"))
            if v["converged"] is False:
                ax.plot(v["counts"][-1:], v["robust_accuracy"][-1:], marker="o", markersize=11, color=colour,
                        markerfacecolor="none", linestyle="none")
            band = _sweep_band(records, v)
            if band:
                ax.fill_between(v["counts"], [b[0] for b in band], [b[1] for b in band], color=colour, alpha=0.08,
                                linewidth=0)
        counts = sorted({c for _, _, v in curves for c in v["counts"]})
        ax.set_xscale("log")
        ax.set_xticks(counts, [str(c) for c in counts])
        ax.minorticks_off()
        ax.set_xlabel(f"{SWEEP_AXES[axis]} (log scale)")
        ax.set_ylabel("robust accuracy")
        ax.set_ylim(-0.02, 1.02)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7, loc="upper right")
        ax.set_title(f"robust accuracy vs {SWEEP_AXES[axis]} ({norm}; paired: same inputs and seeds)", fontsize=10)
    fig.tight_layout()
    save_figure(fig, path)
    return Path(path)
