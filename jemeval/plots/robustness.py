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

After a sweep (``eot_samples`` or ``steps`` given as a list) the figure gains one panel per swept
axis: robust accuracy vs EOT samples or attack steps (log scale), one line per (attack, K, grad
mode, epsilon) curve with its Wilson band, a curve that has not converged drawn with a hollow last
point and marked in the legend; the epsilon panel then shows the sweep's last counts.
"""
from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

from jemeval.evaluation.robust.convergence import SWEEP_AXES, final_records
from jemeval.plots import draw_overlaps, pyplot, save_figure

LINESTYLES = {"full": "-", "bpda": "--", "eot": ":", "bpda+eot": (0, (5, 1, 1, 1, 1, 1)), "none": "-."}
MARKERS = {"pgd": "o", "boundary": "s", "pointwise": "^", "apgd-ce": "v", "apgd-dlr": "<", "apgd-t": ">",
           "fab": "P", "square": "X", "cw": "*", "autoattack": "h"}
#: a sweep panel's markers, one per epsilon
SWEEP_MARKERS = ["o", "s", "^", "v", "D", "P", "X", "*", "h", "<", ">"]


def plot_robustness(records: Sequence[dict[str, Any]], path: str | Path, *,
                    min_perturbations: Sequence[dict[str, Any]] = (), title: str | None = None) -> Path:
    """Save the accuracy-vs-epsilon figure of ``jemeval robust`` records as a PNG."""
    save_figure(draw_robustness(records, min_perturbations=min_perturbations, title=title), path)
    return Path(path)


def draw_robustness(records: Sequence[dict[str, Any]], *, min_perturbations: Sequence[dict[str, Any]] = (),
                    title: str | None = None):
    """The accuracy-vs-epsilon matplotlib figure of ``jemeval robust`` records (the caller saves it)."""
    fig, ax = pyplot().subplots(figsize=(6.4, 4.4))
    draw_epsilon_axes(ax, records, min_perturbations=min_perturbations, title=title)
    return fig


def draw_epsilon_axes(ax, records: Sequence[dict[str, Any]], *, min_perturbations: Sequence[dict[str, Any]] = (),
                      title: str | None = None) -> None:
    """Robust accuracy vs epsilon on ``ax``: one line per (attack, K, grad mode)."""
    plt = pyplot()
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


def draw_sweep_axes(ax, records: Sequence[dict[str, Any]], verdicts: Sequence[dict[str, Any]], axis: str) -> None:
    """Robust accuracy vs one swept count on ``ax`` (``verdicts``: the result's ``convergence``): one
    line per curve the axis applies to (epsilon 0, where nothing is attacked, left out), colour = K,
    line style = grad mode, marker = epsilon; its Wilson band; a ring on the last point where not converged."""
    plt = pyplot()
    curves = [v for v in verdicts if v["axis"] == axis and len(v["counts"]) > 1 and v["epsilon"] > 0]
    colours = {k: plt.get_cmap("tab10")(i % 10) for i, k in enumerate(sorted({v["refine_steps"] for v in curves}))}
    epsilons = sorted({v["epsilon"] for v in curves})
    for v in curves:
        colour, marker = colours[v["refine_steps"]], SWEEP_MARKERS[epsilons.index(v["epsilon"]) % len(SWEEP_MARKERS)]
        label = f"K={v['refine_steps']} {v['attack']} ({v['grad_mode']}) eps={v['epsilon']:g}"
        ax.plot(v["counts"], v["robust_accuracy"], color=colour, linestyle=LINESTYLES.get(v["grad_mode"], "-"),
                marker=marker, markersize=4, label=label + ("" if v["converged"] else " NOT converged"))
        if not v["converged"]:
            ax.plot(v["counts"][-1:], v["robust_accuracy"][-1:], marker="o", markersize=10, color=colour,
                    markerfacecolor="none", linestyle="none")
        band = [_interval(records, v, axis, c) for c in v["counts"]]
        if all(b is not None for b in band):
            ax.fill_between(v["counts"], [b[0] for b in band], [b[1] for b in band], color=colour, alpha=0.08,
                            linewidth=0)
    counts = sorted({c for v in curves for c in v["counts"]})
    ax.set_xscale("log")
    if counts:
        ax.set_xticks(counts, [str(c) for c in counts])
        ax.minorticks_off()
        ax.legend(fontsize=7, loc="upper right")
    ax.set_xlabel(f"{SWEEP_AXES[axis]} (log scale)")
    ax.set_ylabel("robust accuracy")
    ax.set_ylim(-0.02, 1.02)
    ax.grid(alpha=0.3)
    ax.set_title(f"robust accuracy vs {SWEEP_AXES[axis]} (paired: same inputs and seeds)", fontsize=9)


def _interval(records: Sequence[dict[str, Any]], v: dict[str, Any], axis: str, count: int):
    """(ci_low, ci_high) of the record behind one point of a sweep curve (at the other axis's
    largest count, as the verdict), or None."""
    other = "steps" if axis == "eot_samples" else "eot_samples"
    rows = [r for r in records if (r["attack"], r["refine_steps"], r["grad_mode"], r["epsilon"], r.get(axis))
            == (v["attack"], v["refine_steps"], v["grad_mode"], v["epsilon"], count)]
    rows = [r for r in rows if (r.get(other) or 0) == max((q.get(other) or 0) for q in rows)]
    return (rows[0]["ci_low"], rows[0]["ci_high"]) if rows and rows[0].get("ci_low") is not None else None


def draw_robust_sweep(records: Sequence[dict[str, Any]], verdicts: Sequence[dict[str, Any]], *,
                      min_perturbations: Sequence[dict[str, Any]] = (), title: str | None = None):
    """The figure of a sweep: robust accuracy vs epsilon at the last counts, then one panel per swept
    axis (robust accuracy vs the count)."""
    axes = [a for a in SWEEP_AXES if any(v["axis"] == a for v in verdicts)]
    fig, panels = pyplot().subplots(1, 1 + len(axes), figsize=(6.4 * (1 + len(axes)), 4.4), squeeze=False)
    final = final_records(list(records))
    shown = {(r["attack"], r["refine_steps"], r["grad_mode"], r.get("eot_samples"), r.get("steps")) for r in final}
    mps = [mp for mp in min_perturbations
           if (mp["attack"], mp["refine_steps"], mp["grad_mode"], mp.get("eot_samples"), mp.get("steps")) in shown]
    draw_epsilon_axes(panels[0][0], final, min_perturbations=mps, title=title)
    for ax, axis in zip(panels[0][1:], axes):
        draw_sweep_axes(ax, records, verdicts, axis)
    return fig


def plot_robust_result(result, path: str | Path) -> Path:
    """The accuracy-vs-epsilon figure of a ``robust`` result, with its distortion curves; after a
    sweep, with the accuracy-vs-count panels (:func:`draw_robust_sweep`)."""
    s = result.provenance["settings"]
    title = (f"{s['data']}: robust accuracy vs {s['norm']} epsilon (n={s['n']}, chains={s['chains']}, "
             f"sigma={s['sigma']:g})")
    verdicts = result.extra.get("convergence")
    if not verdicts:
        return plot_robustness(result.records, path, min_perturbations=result.extra["minimal_perturbations"],
                               title=title)
    save_figure(draw_robust_sweep(result.records, verdicts, min_perturbations=result.extra["minimal_perturbations"],
                                  title=title), path)
    return Path(path)
