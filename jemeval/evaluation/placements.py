"""The pieces every paired analysis shares: checked inputs, midranks and DeLong's placement values.

Kept apart from :mod:`jemeval.evaluation.paired` (tests of two runs) and
:mod:`jemeval.evaluation.mrmc` (tests of two groups of runs) so that both build on the same
definitions and neither imports the other's machinery.
"""
from __future__ import annotations

import numpy as np

from jemeval.errors import UsageError


def check_level(level: float) -> float:
    """A confidence level strictly between 0 and 1."""
    level = float(level)
    if not 0.0 < level < 1.0:
        raise UsageError(f"level must be between 0 and 1 (e.g. 0.95), got {level}", param="level")
    return level


def finite(values, name: str, *, ndim: int = 1) -> np.ndarray:
    """A float64 array of finite values with ``ndim`` dimensions (a 1-D input is one run when
    ``ndim`` is 2): a NaN score would make every rank meaningless."""
    array = np.asarray(values, dtype=np.float64)
    array = array.reshape(-1) if ndim == 1 else np.atleast_2d(array)
    if array.ndim != ndim:
        raise UsageError(f"{name} must be an array of {'runs x inputs' if ndim == 2 else 'inputs'}, got shape "
                         f"{array.shape}", param=name)
    if not np.isfinite(array).all():
        raise UsageError(f"{name} holds {int((~np.isfinite(array)).sum())} non-finite values; "
                         "scores must be finite numbers", param=name)
    return array


def binary_labels(labels, name: str = "labels") -> np.ndarray:
    """1 = in-distribution (the positive class), 0 = OOD, as a boolean array."""
    labels = np.asarray(labels).reshape(-1)
    if not np.isin(labels, (0, 1)).all():
        raise UsageError(f"{name} must be 1 (in-distribution) or 0 (OOD), got other values", param=name)
    return labels.astype(bool)


def midranks(x: np.ndarray) -> np.ndarray:
    """1-based ranks of ``x``, tied values sharing the mean of their ranks (vectorised, O(n log n))."""
    order = np.argsort(x, kind="mergesort")
    ordered = x[order]
    starts_group = np.r_[True, ordered[1:] != ordered[:-1]]
    starts = np.flatnonzero(starts_group)
    ends = np.r_[starts[1:], x.size]  # positions starts..ends-1 hold ranks starts+1..ends
    ranks = np.empty(x.size, dtype=np.float64)
    ranks[order] = ((starts + 1 + ends) / 2.0)[np.cumsum(starts_group) - 1]
    return ranks


def placements(positives: np.ndarray, negatives: np.ndarray) -> tuple[float, np.ndarray, np.ndarray]:
    """AUROC and DeLong's structural components V10 (per positive) and V01 (per negative).

    Sun & Xu (2014): with midranks tx within the positives, ty within the negatives and tz within
    both, V10_i = (tz_i - tx_i) / n is the fraction of negatives below positive i (ties 1/2) and
    V01_j = 1 - (tz_{m+j} - ty_j) / m the fraction of positives above negative j. The AUROC is the
    mean of either.
    """
    m, n = positives.size, negatives.size
    tz = midranks(np.concatenate([positives, negatives]))
    v10 = (tz[:m] - midranks(positives)) / n
    v01 = 1.0 - (tz[m:] - midranks(negatives)) / m
    auc = (tz[:m].sum() - m * (m + 1) / 2.0) / (m * n)
    return float(auc), v10, v01
