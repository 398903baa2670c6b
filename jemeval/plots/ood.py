"""OOD figures: per score, the histograms of in-distribution against each OOD set (JEM's Table 2
figure), the ROC curve and the precision-recall curve.

One row per score. The histogram panel overlays density histograms on shared bins, the
in-distribution set filled and every OOD set as an outline. The ROC panel draws one curve per OOD
set (in-distribution positive, so the area under each curve is the reported AUROC, shown in the
legend), the PR panel one step curve per set (in-distribution positive: its area is AUPR-In) with
the chance level of that set as a dotted line. Each OOD set keeps its colour across the row.
"""
from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from jemeval.evaluation.metrics import pr_points, roc_points
from jemeval.plots import draw_overlaps, pyplot, save_figure


def _bins(arrays: Sequence[np.ndarray], n_bins: int) -> np.ndarray:
    values = np.concatenate([a[np.isfinite(a)] for a in arrays])
    lo, hi = (float(values.min()), float(values.max())) if len(values) else (0.0, 1.0)
    if hi <= lo:  # all equal: a small window around the value
        lo, hi = lo - 0.5, hi + 0.5
    return np.linspace(lo, hi, n_bins + 1)


def _tag(name: str, value: float | None) -> str:
    return f", {name} {value:.3f}" if value is not None else ""


def _histogram_panel(ax, scores, s: str, metrics: dict, colors: list, n_bins: int) -> None:
    arrays = [scores.id_scores[s]] + [per[s] for per in scores.ood_scores.values()]
    bins = _bins(arrays, n_bins)
    top = 0.0
    id_values = scores.id_scores[s]
    if np.ptp(id_values) > 0:
        density, _, _ = ax.hist(id_values, bins=bins, density=True, color="0.55", alpha=0.6,
                                label=f"{scores.id_name} (in-dist., n={len(id_values)})")
        top = max(top, float(density.max()))
    else:
        ax.axvline(float(id_values[0]), color="0.55", linewidth=3, alpha=0.6,
                   label=f"{scores.id_name} (in-dist., all {id_values[0]:.3g})")
    for i, (ood_name, per) in enumerate(scores.ood_scores.items()):
        tag = _tag("AUROC", metrics.get((s, ood_name), {}).get("auroc"))
        color = colors[i % len(colors)]
        if np.ptp(per[s]) > 0:
            density, _, _ = ax.hist(per[s], bins=bins, density=True, histtype="step", linewidth=1.6,
                                    color=color, label=f"{ood_name}{tag}")
            top = max(top, float(density.max()))
        else:  # a point mass (e.g. constant images): a line, so it does not flatten the others
            ax.axvline(float(per[s][0]), color=color, linestyle="--", linewidth=1.6,
                       label=f"{ood_name} (all {per[s][0]:.3g}){tag}")
    if top > 0:
        ax.set_ylim(0, 1.08 * top)
    ax.set_title(s)
    ax.set_xlabel("score (higher = more in-distribution)")
    ax.set_ylabel("density")
    ax.legend(fontsize=7, loc="upper center", bbox_to_anchor=(0.5, -0.22), ncol=2, frameon=False)


def _finite(*arrays: np.ndarray) -> bool:
    return all(bool(np.isfinite(a).all()) for a in arrays)


def _curve_panels(ax_roc, ax_pr, scores, s: str, metrics: dict, colors: list) -> None:
    """The ROC and PR curves of score ``s``, one per OOD set (sets with non-finite scores are skipped).
    Where curves coincide (two sets both separated perfectly, say) they show as nested bands."""
    id_values = scores.id_scores[s]
    sets = [(i, name, per[s]) for i, (name, per) in enumerate(scores.ood_scores.items()) if _finite(id_values, per[s])]
    roc = [roc_points(id_values, values) for _, _, values in sets]
    pr = [pr_points(id_values, values) for _, _, values in sets]
    for (i, name, values), (fpr, tpr), (recall, precision) in zip(sets, roc, pr):
        color, found = colors[i % len(colors)], metrics.get((s, name), {})
        ax_roc.plot(fpr, tpr, color=color, linewidth=1.4, label=f"{name}{_tag('AUROC', found.get('auroc'))}")
        ax_pr.plot(recall, precision, color=color, linewidth=1.4,
                   label=f"{name}{_tag('AUPR-In', found.get('aupr_in'))}")
        ax_pr.axhline(len(id_values) / (len(id_values) + len(values)), color=color, linestyle=":", linewidth=0.8)
    line_colors = [colors[i % len(colors)] for i, _, _ in sets]
    draw_overlaps(ax_roc, roc, line_colors, width=1.4)
    draw_overlaps(ax_pr, pr, line_colors, width=1.4)
    ax_roc.plot([0, 1], [0, 1], linestyle="--", color="0.6", linewidth=0.8)
    ax_roc.set(xlim=(-0.03, 1.03), ylim=(-0.03, 1.03), xlabel="false positive rate (OOD accepted)",
               ylabel="true positive rate (in-dist. accepted)", title=f"{s}: ROC")
    ax_pr.set(xlim=(-0.03, 1.03), ylim=(-0.03, 1.03), xlabel="recall (in-dist. positive)", ylabel="precision",
              title=f"{s}: precision-recall (dotted: chance)")
    for ax, where in ((ax_roc, "lower right"), (ax_pr, "lower left")):
        if ax.get_legend_handles_labels()[0]:
            ax.legend(fontsize=7, loc=where)
        ax.grid(alpha=0.3)


def draw_ood_figure(scores, *, records: Sequence[dict[str, Any]] | None = None, n_bins: int = 50,
                    title: str | None = None, curves: bool = True):
    """The matplotlib figure of an :class:`~jemeval.evaluation.ood.OODScores`: one row per score, its
    histograms and (``curves``) its ROC and PR curves; the caller saves or closes it."""
    plt = pyplot()
    names = list(scores.score_names)
    metrics = {(r["score"], r["ood"]): r for r in (records or [])}
    colors = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    if curves:
        rows, cols = len(names), 3
        fig, axes = plt.subplots(rows, cols, figsize=(4.8 * cols, 4.4 * rows), squeeze=False)
        for row, s in zip(axes, names):
            _histogram_panel(row[0], scores, s, metrics, colors, n_bins)
            _curve_panels(row[1], row[2], scores, s, metrics, colors)
    else:
        cols = min(3, len(names))
        rows = int(np.ceil(len(names) / cols))
        fig, axes = plt.subplots(rows, cols, figsize=(4.8 * cols, 4.2 * rows), squeeze=False)
        for ax, s in zip(axes.flat, names, strict=False):
            _histogram_panel(ax, scores, s, metrics, colors, n_bins)
        for ax in list(axes.flat)[len(names):]:
            ax.set_visible(False)
    fig.suptitle(title or f"OOD scores: {scores.id_name} vs {', '.join(scores.ood_names)}", fontsize=10)
    fig.tight_layout()
    return fig


def plot_score_histograms(scores, path: str | Path, *, records: Sequence[dict[str, Any]] | None = None,
                          n_bins: int = 50, title: str | None = None, curves: bool = False) -> Path:
    """Write the histogram figure of an :class:`~jemeval.evaluation.ood.OODScores` to ``path`` (PNG);
    with ``curves``, each score's ROC and PR curves beside its histograms."""
    save_figure(draw_ood_figure(scores, records=records, n_bins=n_bins, title=title, curves=curves), path)
    return Path(path)


def plot_ood_result(result, path: str | Path) -> Path:
    """The figure of an ``evaluate_ood`` result (its ``extra["scores"]``): per score, histograms, ROC
    and PR curves, with AUROC and AUPR-In in the legends (``jemeval ood --plot``)."""
    return plot_score_histograms(result.extra["scores"], path, records=result.records, curves=True)
