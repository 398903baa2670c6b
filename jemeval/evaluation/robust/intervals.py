"""Confidence intervals for proportions (accuracies measured on n inputs).

A robust accuracy on 100 inputs is a binomial proportion with a standard error of up to 0.05:
two defences 0.04 apart on such a subset are not distinguishable. ``jemeval robust`` attaches a
95% Wilson score interval to every robust accuracy (``ci_low``, ``ci_high``). Wilson's interval
(Wilson 1927) keeps its coverage near the nominal level even at accuracies of 0 or 1 and small n,
where the textbook normal interval collapses to a point.
"""
from __future__ import annotations

import math

#: the 0.975 quantile of the standard normal distribution (two-sided 95%)
Z_95 = 1.959963984540054


def wilson_interval(successes: int, n: int, z: float = Z_95) -> tuple[float, float]:
    """(low, high) of the Wilson score interval for ``successes`` out of ``n`` trials.

    centre = (p + z^2 / 2n) / (1 + z^2 / n),
    half-width = z sqrt(p (1 - p) / n + z^2 / 4n^2) / (1 + z^2 / n), with p = successes / n.
    With n = 0 nothing is known: (0, 1).
    """
    successes, n = int(successes), int(n)
    if n < 0 or not 0 <= successes <= max(n, 0):
        raise ValueError(f"need 0 <= successes <= n, got successes={successes}, n={n}")
    if n == 0:
        return 0.0, 1.0
    p = successes / n
    z2 = z * z
    denom = 1.0 + z2 / n
    centre = (p + z2 / (2 * n)) / denom
    half = z * math.sqrt(p * (1 - p) / n + z2 / (4 * n * n)) / denom
    low = 0.0 if successes == 0 else max(0.0, centre - half)  # exact ends, not rounding residue
    high = 1.0 if successes == n else min(1.0, centre + half)
    return low, high
