"""Plots (matplotlib, Agg backend, PNG): one module per kind of figure, drawn from returned data.

grids.py (sample grids, distal adversarials), ood.py (score histograms), calibration.py (reliability
diagrams), robustness.py (accuracy vs epsilon curves). Each module has a ``plot_*_result(result,
path)`` (or ``save_*_grid``) that draws an evaluation function's :class:`~jemeval.results.Result`:
what the command line calls for ``--plot`` / ``--grid``. Plots never import the command line.
"""
from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from jemeval.atomic import atomic_path

#: how much wider a segment is drawn per later line that runs along it (see :func:`draw_overlaps`)
LAYER_WIDTH = 2.6


def pyplot():
    """matplotlib.pyplot on the non-interactive Agg backend (no display needed)."""
    import matplotlib

    matplotlib.use("Agg", force=True)
    import matplotlib.pyplot as plt

    return plt


def save_figure(fig, path) -> None:
    """Save a figure atomically as PNG and close it."""
    with atomic_path(path) as tmp:
        fig.savefig(tmp, format="png", dpi=120, bbox_inches="tight")
    pyplot().close(fig)


def _points(x: Sequence[float], y: Sequence[float]) -> list[tuple[float, float]]:
    return list(zip((float(v) for v in x), (float(v) for v in y)))


def _segments(points: list[tuple[float, float]]) -> list[tuple[tuple[float, float], tuple[float, float]]]:
    return [(a, b) if a <= b else (b, a) for a, b in zip(points, points[1:]) if a != b]


def draw_overlaps(ax, lines: Sequence[tuple[Sequence[float], Sequence[float]]], colors: Sequence[Any], *,
                  width: float, marker_size: float | None = None, markers: Sequence[str] | None = None) -> None:
    """Keep coinciding lines visible without moving any value: under each line (``lines`` in drawing
    order), every segment that k later lines also run along is drawn again ``k * LAYER_WIDTH`` wider
    in the line's colour, and (with ``marker_size``) every point k later lines pass through gets a
    hollow marker ``k * 2.5`` points larger. Coinciding lines show as nested bands and rings."""
    from matplotlib.collections import LineCollection

    points = [_points(x, y) for x, y in lines]
    segments = [set(_segments(p)) for p in points]
    for i, (own, color) in enumerate(zip(points, colors)):
        later_segments, later_points = segments[i + 1:], [set(p) for p in points[i + 1:]]
        shared = [(seg, sum(seg in later for later in later_segments)) for seg in dict.fromkeys(_segments(own))]
        shared = [(seg, k) for seg, k in shared if k]
        if shared:
            ax.add_collection(LineCollection([list(seg) for seg, _ in shared], colors=[color],
                                             linewidths=[width + LAYER_WIDTH * k for _, k in shared],
                                             zorder=1.5 - 0.01 * i, capstyle="round"))
        if marker_size is None:
            continue
        for point in dict.fromkeys(own):
            k = sum(point in later for later in later_points)
            if k:
                ax.plot(*point, linestyle="none", marker=markers[i] if markers else "o",
                        markersize=marker_size + 2.5 * k, markerfacecolor="none", markeredgecolor=color,
                        markeredgewidth=1.0, zorder=1.6 - 0.01 * i)
