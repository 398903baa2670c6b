"""Reliability diagrams: accuracy against confidence per bin, with the ECE printed on the figure.

One column per calibration record (raw, and temperature-scaled when fitted). The top panel draws
each non-empty bin's accuracy as a bar with its gap to the diagonal shaded; **empty bins are
hatched grey and labelled, never drawn as if perfectly calibrated**. The bottom panel shows how
many examples fall in each bin (log scale), since a large gap in a bin of three examples means
little. In equal-mass bins (``calibrate(bins_strategy="equal-mass")``) each bar spans its own
bin's edges, so narrow bins show where the confidences crowd.
"""
from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

from jemeval.plots import pyplot, save_figure


def plot_reliability(records: Sequence[dict[str, Any]], path: str | Path, *, title: str | None = None,
                     strategy: str = "uniform") -> Path:
    """Write a reliability diagram for calibration records (each with ``bins`` and ``ece``) to ``path``;
    ``strategy`` ("uniform" or "equal-mass") names the bins on the axis, each bar spans its own bin."""
    plt = pyplot()
    cols = len(records)
    fig, axes = plt.subplots(2, cols, figsize=(4.6 * cols, 5.6), squeeze=False,
                             gridspec_kw={"height_ratios": [3, 1]}, sharex="col")
    for j, record in enumerate(records):
        _draw_reliability(axes[0, j], record, strategy)
        _draw_bin_counts(axes[1, j], record["bins"], strategy)
    if title:
        fig.suptitle(title, fontsize=10)
    fig.tight_layout(rect=(0, 0.07, 1, 1))
    fig.legend(handles=_reliability_legend(strategy), loc="lower center", ncol=2 if cols == 1 else 4, fontsize=8,
               frameon=False)
    save_figure(fig, path)
    return Path(path)


def _draw_reliability(ax, record: dict[str, Any], strategy: str) -> None:
    """One record's bars (accuracy, gap to confidence; empty bins hatched), the diagonal, the title."""
    bins = record["bins"]
    for b in bins:
        left, width = b["lower"], b["upper"] - b["lower"]
        centre = left + width / 2
        if not b["count"]:
            ax.axvspan(left, b["upper"], facecolor="0.93", edgecolor="0.7", hatch="///", linewidth=0)
            continue
        acc, conf = b["accuracy"], b["confidence"]
        ax.bar(centre, acc, width=width, color="tab:blue", edgecolor="white", linewidth=0.6)
        lo, hi = sorted((acc, conf))
        ax.bar(centre, hi - lo, bottom=lo, width=width, facecolor="none", edgecolor="tab:red", hatch="\\\\",
               linewidth=0.8)
    ax.plot([0, 1], [0, 1], linestyle="--", color="0.3", linewidth=1)
    if strategy == "equal-mass":  # a wide bin's bar hides where its examples sit: mark (mean conf, acc)
        full = [b for b in bins if b["count"]]
        ax.plot([b["confidence"] for b in full], [b["accuracy"] for b in full], "o", color="black", markersize=3)
    ax.set_xlim(0, 1)
    ax.set_ylim(0, 1)
    ax.set_ylabel("accuracy")
    name, t = record.get("calibration", "none"), record.get("temperature")
    heading = "raw" if name == "none" else f"{name} scaling (T = {t:.3f})" if t is not None else name
    # the numbers go in the title, where they can never hide a bar
    numbers = [f"{key.upper()} = {100 * record[key]:.2f}%" for key in ("ece", "adaptive-ece", "mce") if key in record]
    ax.set_title(f"{heading}\n" + "   ".join([*numbers, f"accuracy = {100 * record['accuracy']:.1f}%"]), fontsize=9)


def _draw_bin_counts(ax_n, bins: Sequence[dict[str, Any]], strategy: str) -> None:
    """The examples per bin (log scale), an empty bin marked with the empty-set sign."""
    for b in bins:
        if not b["count"]:
            ax_n.text((b["lower"] + b["upper"]) / 2, 0.5, "\u2205", transform=ax_n.get_xaxis_transform(),
                      ha="center", va="center", fontsize=7, color="0.5")
    centres = [(b["lower"] + b["upper"]) / 2 for b in bins]
    widths = [b["upper"] - b["lower"] for b in bins]
    ax_n.bar(centres, [b["count"] for b in bins], width=widths, color="0.5", edgecolor="white", linewidth=0.6)
    if any(b["count"] for b in bins):
        ax_n.set_yscale("log")
    ax_n.set_xlabel(f"confidence (max softmax), {len(bins)} {'equal-mass ' if strategy == 'equal-mass' else ''}bins")
    ax_n.set_ylabel("examples")


def _reliability_legend(strategy: str) -> list:
    from matplotlib.lines import Line2D
    from matplotlib.patches import Patch

    handles = [
        Patch(facecolor="tab:blue", label="accuracy of the bin"),
        Patch(facecolor="none", edgecolor="tab:red", hatch="\\\\", label="gap to the bin's mean confidence"),
        Patch(facecolor="0.93", edgecolor="0.7", hatch="///", label="empty bin (no examples, no value)"),
        Line2D([0], [0], linestyle="--", color="0.3", label="perfect calibration"),
    ]
    if strategy == "equal-mass":
        handles.append(Line2D([0], [0], marker="o", linestyle="", color="black", markersize=3,
                              label="bin's (mean confidence, accuracy)"))
    return handles


def plot_calibration_result(result, path: str | Path) -> Path:
    """The reliability diagram of a ``calibrate`` result, titled with the data it was measured on."""
    settings = result.provenance["settings"]
    title = f"{settings['data']} ({settings['split']}, n={result.records[0]['n']})"
    return plot_reliability(result.records, path, title=title, strategy=settings.get("bins_strategy", "uniform"))
