"""Robust accuracy vs epsilon: one line per (attack, refinement steps K, gradient mode).

Colour encodes K, line style the gradient mode (full, bpda, eot, bpda+eot; dash-dot for
gradient-free attacks), the marker the attack; a light band of the same colour is the 95% Wilson
interval where the records carry one. Lines that coincide (every gradient mode at 0 once the attack
wins, or K=0 under full and BPDA gradients, which are the same attack) stay distinguishable: where k
later lines run along a line, that line is drawn as a band k times wider underneath, and where k
later lines pass through one of its points, its marker gets k rings
(:func:`jemeval.plots.draw_overlaps`); no value is moved. For minimisation attacks the
robustness-distortion curve derived from the per-example minimal perturbations is drawn as a thin
step line of the same colour.
"""
from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

from jemeval.plots import draw_overlaps, pyplot, save_figure

LINESTYLES = {"full": "-", "bpda": "--", "eot": ":", "bpda+eot": (0, (5, 1, 1, 1, 1, 1)), "none": "-."}
MARKERS = {"pgd": "o", "boundary": "s", "pointwise": "^", "apgd-ce": "v", "apgd-dlr": "<", "apgd-t": ">",
           "fab": "P", "square": "X", "cw": "*", "autoattack": "h"}


def plot_robustness(records: Sequence[dict[str, Any]], path: str | Path, *,
                    min_perturbations: Sequence[dict[str, Any]] = (), title: str | None = None) -> Path:
    """Save the accuracy-vs-epsilon figure of ``jemeval robust`` records as a PNG."""
    save_figure(draw_robustness(records, min_perturbations=min_perturbations, title=title), path)
    return Path(path)


def draw_robustness(records: Sequence[dict[str, Any]], *, min_perturbations: Sequence[dict[str, Any]] = (),
                    title: str | None = None):
    """The accuracy-vs-epsilon matplotlib figure of ``jemeval robust`` records (the caller saves it)."""
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(6.4, 4.4))
    ks = sorted({r["refine_steps"] for r in records})
    colours = {k: plt.get_cmap("tab10")(i % 10) for i, k in enumerate(ks)}
    groups: dict[tuple, list[dict]] = {}
    for r in records:
        groups.setdefault((r["attack"], r["refine_steps"], r["grad_mode"]), []).append(r)
    lines, first = [], {}
    for (attack, k, mode), rows in groups.items():
        rows = sorted(rows, key=lambda r: r["epsilon"])
        label = f"K={k} {attack}" + ("" if mode == "none" else f" ({mode})")
        xy = ([r["epsilon"] for r in rows], [r["robust_accuracy"] for r in rows])
        key = (tuple(xy[0]), tuple(xy[1]))
        label += f" = {first[key]}" if key in first else ""  # the same values as a line drawn before
        first.setdefault(key, label)
        ax.plot(*xy, color=colours[k], linestyle=LINESTYLES.get(mode, "-"), marker=MARKERS.get(attack, "D"),
                markersize=4, label=label)
        lines.append((xy, colours[k], MARKERS.get(attack, "D")))
        if all(r.get("ci_low") is not None and r.get("ci_high") is not None for r in rows):
            ax.fill_between(xy[0], [r["ci_low"] for r in rows], [r["ci_high"] for r in rows], color=colours[k],
                            alpha=0.08, linewidth=0)
    draw_overlaps(ax, [xy for xy, _, _ in lines], [c for _, c, _ in lines], width=1.5, marker_size=4,
                  markers=[m for _, _, m in lines])
    for mp in min_perturbations:
        curve = mp.get("curve") or {}
        if curve.get("epsilon"):
            ax.step(curve["epsilon"], curve["robust_accuracy"], where="post",
                    color=colours.get(mp["refine_steps"], "gray"), linewidth=0.8, alpha=0.5)
    norm = records[0]["norm"] if records else ""
    n = records[0]["n"] if records else 0
    ax.set_xlabel(f"epsilon ({norm.upper()}, pixel units in [0, 1])")
    ax.set_ylabel("robust accuracy")
    ax.set_ylim(-0.02, 1.02)
    ax.grid(alpha=0.3)
    handles, labels = ax.get_legend_handles_labels()
    if any((mp.get("curve") or {}).get("epsilon") for mp in min_perturbations):
        from matplotlib.lines import Line2D

        handles.append(Line2D([], [], color="gray", linewidth=0.8, alpha=0.6, drawstyle="steps-post"))
        labels.append("from minimal perturbations")
    ax.legend(handles, labels, fontsize=7, loc="upper right")
    ax.set_title(title or f"robust accuracy vs epsilon ({norm}, n={n})", fontsize=9)
    return fig


def plot_robust_result(result, path: str | Path) -> Path:
    """The accuracy-vs-epsilon figure of a ``robust`` result, with its distortion curves."""
    s = result.provenance["settings"]
    title = (f"{s['data']}: robust accuracy vs {s['norm']} epsilon (n={s['n']}, chains={s['chains']}, "
             f"sigma={s['sigma']:g})")
    return plot_robustness(result.records, path, min_perturbations=result.extra["minimal_perturbations"], title=title)
