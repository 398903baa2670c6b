"""Plots (matplotlib, Agg backend, PNG): one module per kind of figure.

grids.py (sample grids), ood.py (score histograms), calibration.py (reliability diagrams),
robustness.py (accuracy vs epsilon curves).
"""
from __future__ import annotations


def pyplot():
    """matplotlib.pyplot on the non-interactive Agg backend (no display needed)."""
    import matplotlib

    matplotlib.use("Agg", force=True)
    import matplotlib.pyplot as plt

    return plt


def save_figure(fig, path) -> None:
    """Save a figure atomically as PNG and close it."""
    from jemeval.atomic import atomic_path

    with atomic_path(path) as tmp:
        fig.savefig(tmp, format="png", dpi=120, bbox_inches="tight")
    pyplot().close(fig)
