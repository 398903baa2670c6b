"""Plots (matplotlib, Agg backend, PNG): one module per kind of figure, drawn from returned data.

grids.py (sample grids, distal adversarials), ood.py (score histograms), calibration.py (reliability
diagrams), robustness.py (accuracy vs epsilon curves). Each module has a ``plot_*_result(result,
path)`` (or ``save_*_grid``) that draws an evaluation function's :class:`~jemeval.results.Result`:
what the command line calls for ``--plot`` / ``--grid``. Plots never import the command line.
"""
from __future__ import annotations

from jemeval.atomic import atomic_path


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
