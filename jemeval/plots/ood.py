"""Score histograms: in-distribution against each OOD set, one panel per score (JEM's Table 2 figure).

Each panel overlays density histograms on shared bins, the in-distribution set filled and every
OOD set as an outline, with the AUROC of each OOD set in the legend: one glance shows which score
separates which kind of OOD data.
"""
from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from jemeval.plots import pyplot, save_figure


def _bins(arrays: Sequence[np.ndarray], n_bins: int) -> np.ndarray:
    values = np.concatenate([a[np.isfinite(a)] for a in arrays])
    lo, hi = (float(values.min()), float(values.max())) if len(values) else (0.0, 1.0)
    if hi <= lo:  # all equal: a small window around the value
        lo, hi = lo - 0.5, hi + 0.5
    return np.linspace(lo, hi, n_bins + 1)


def plot_score_histograms(scores, path: str | Path, *, records: Sequence[dict[str, Any]] | None = None,
                          n_bins: int = 50, title: str | None = None) -> Path:
    """Write the histogram figure of an :class:`~jemeval.evaluation.ood.OODScores` to ``path`` (PNG)."""
    plt = pyplot()
    names = list(scores.score_names)
    auroc = {(r["score"], r["ood"]): r.get("auroc") for r in (records or [])}
    cols = min(3, len(names))
    rows = int(np.ceil(len(names) / cols))
    fig, axes = plt.subplots(rows, cols, figsize=(4.8 * cols, 4.2 * rows), squeeze=False)
    colors = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    for ax, s in zip(axes.flat, names, strict=False):
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
            value = auroc.get((s, ood_name))
            tag = f", AUROC {value:.3f}" if value is not None else ""
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
    for ax in list(axes.flat)[len(names):]:
        ax.set_visible(False)
    fig.suptitle(title or f"OOD scores: {scores.id_name} vs {', '.join(scores.ood_names)}", fontsize=10)
    fig.tight_layout()
    save_figure(fig, path)
    return Path(path)


def plot_ood_result(result, path: str | Path) -> Path:
    """The histogram figure of an ``evaluate_ood`` result (its ``extra["scores"]``), AUROCs in the legend."""
    return plot_score_histograms(result.extra["scores"], path, records=result.records)
