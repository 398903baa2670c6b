"""Paired significance tests: does model A beat model B on the same inputs?

Two models evaluated on the same images (same noise, same attack seeds) give paired outcomes, and a
paired test is far more sensitive than comparing two intervals: the inputs both models find hard
cancel out. Each test returns a plain dict (the report puts it beside the numbers) with ``test``,
the two values, their ``difference`` (a - b) and a two-sided ``p_value``.

* :func:`delong_test`: two correlated AUROCs (DeLong, DeLong & Clarke-Pearson 1988), computed by
  Sun & Xu's (2014) O(n log n) algorithm: midranks (ties count 1/2) give the structural components.
* :func:`mcnemar_exact`: two accuracies on paired correct/incorrect outcomes; the exact two-sided
  binomial test on the discordant pairs (b: only A right, c: only B right; b ~ Bin(b + c, 1/2)).
* :func:`paired_bootstrap`: any metric (ECE, NLL, FPR95, ...): both models' metric on the same
  resampled inputs; percentile interval, shifted-null p-value with add-one smoothing.
* :func:`holm`: Holm-Bonferroni adjusted p-values, for several comparisons in one report.
* :func:`pooled_groups`, :func:`seed_mean`, :func:`between_seeds`: seed groups (docs/evaluation.md,
  "Paired comparisons").
"""
from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from statistics import NormalDist

import numpy as np

from jemeval.errors import UsageError
from jemeval.evaluation.mrmc import or_hillis, or_hillis_outcomes
from jemeval.evaluation.placements import binary_labels, check_level, finite, midranks, placements

__all__ = ["between_seeds", "delong_test", "holm", "mcnemar_exact", "midranks", "or_hillis", "or_hillis_outcomes",
           "paired_bootstrap", "pooled_groups", "seed_mean"]

#: indices drawn per chunk by paired_bootstrap: chunk x n int64 (8 MB for n = 1000)
CHUNK = 1000


def _booleans(values, name: str) -> np.ndarray:
    """Per-input correct/incorrect outcomes: booleans or 0/1."""
    array = np.asarray(values).reshape(-1)
    if array.dtype != bool and not np.isin(array, (0, 1)).all():
        raise UsageError(f"{name} must hold booleans or 0/1 (one per input), got other values", param=name)
    return array.astype(bool)


def _two_sided_normal(z: float) -> float:
    """P(|Z| >= |z|) for a standard normal Z, by erfc (no cancellation in the far tail)."""
    return math.erfc(abs(z) / math.sqrt(2.0))


def delong_test(labels, scores_a, scores_b, *, level: float = 0.95) -> dict:
    """DeLong's test of AUROC(a) = AUROC(b) on the same inputs, with the interval of the difference.

    ``labels``: 1 = in-distribution (positive: jemeval's scores are higher for in-distribution), 0 =
    OOD. The variance of the difference is S10[a-b]/m + S01[a-b]/n from the covariance of the
    structural components; z = difference / its standard error; p = P(|Z| >= |z|). A zero
    variance (identical scores, or both models perfect) gives p = 1 when the AUROCs are equal.
    """
    level = check_level(level)
    labels = binary_labels(labels)
    a, b = finite(scores_a, "scores_a"), finite(scores_b, "scores_b")
    if not a.size == b.size == labels.size:
        raise UsageError(f"labels, scores_a and scores_b must be paired (one per input), got lengths "
                         f"{labels.size}, {a.size}, {b.size}", param="scores_b")
    pos, neg = labels, ~labels
    m, n = int(pos.sum()), int(neg.sum())
    if m < 2 or n < 2:
        raise UsageError(f"DeLong's test needs at least 2 in-distribution and 2 OOD inputs, got {m} and {n}",
                         param="labels")
    auc_a, v10_a, v01_a = placements(a[pos], a[neg])
    auc_b, v10_b, v01_b = placements(b[pos], b[neg])
    variance = float(np.var(v10_a - v10_b, ddof=1) / m + np.var(v01_a - v01_b, ddof=1) / n)
    difference = auc_a - auc_b
    half = NormalDist().inv_cdf(0.5 + level / 2.0) * math.sqrt(max(variance, 0.0))
    if variance > 0.0:
        p_value = _two_sided_normal(difference / math.sqrt(variance))
    else:
        p_value = 1.0 if difference == 0.0 else 0.0
    return {"test": "delong", "auroc_a": auc_a, "auroc_b": auc_b, "difference": difference,
            "ci_low": difference - half, "ci_high": difference + half, "p_value": p_value,
            "n_pos": m, "n_neg": n, "level": level}


def mcnemar_exact(correct_a, correct_b) -> dict:
    """Exact McNemar test of accuracy(a) = accuracy(b) on paired per-input outcomes.

    Only the discordant inputs carry information: b (a right, b wrong) and c (a wrong, b right).
    Under the null each discordant input goes either way with probability 1/2, so b ~ Bin(b + c, 1/2)
    and the two-sided p-value is min(1, 2 P(X <= min(b, c))) (the binomial is symmetric, so this is
    also the "as likely or less likely" rule of scipy's binomtest). No discordant input: p = 1.
    """
    from scipy.stats import binom

    a, b_ = _booleans(correct_a, "correct_a"), _booleans(correct_b, "correct_b")
    if a.size != b_.size or a.size == 0:
        raise UsageError(f"correct_a and correct_b must be paired (one outcome per input, same inputs), got "
                         f"{a.size} and {b_.size} outcomes", param="correct_b")
    b = int(np.count_nonzero(a & ~b_))
    c = int(np.count_nonzero(~a & b_))
    p_value = 1.0 if b == c else min(1.0, 2.0 * float(binom.cdf(min(b, c), b + c, 0.5)))
    acc_a, acc_b = float(a.mean()), float(b_.mean())
    return {"test": "mcnemar-exact", "accuracy_a": acc_a, "accuracy_b": acc_b, "difference": acc_a - acc_b,
            "b": b, "c": c, "p_value": p_value, "n": int(a.size)}


def _per_input(arrays, name: str) -> tuple[np.ndarray, ...]:
    """A model's per-input arrays as a tuple (a bare array is a tuple of one)."""
    if isinstance(arrays, np.ndarray) or not isinstance(arrays, (tuple, list)):
        arrays = (arrays,)
    arrays = tuple(np.asarray(x) for x in arrays)
    if not arrays or any(x.ndim == 0 for x in arrays):
        raise UsageError(f"{name} must be a tuple of per-input arrays, e.g. (probs, labels)", param=name)
    return arrays


def _check_paired(a: tuple, b: tuple) -> int:
    lengths = {len(x) for x in a + b}
    if len(lengths) != 1:
        raise UsageError(f"a and b must hold arrays over the same inputs (one row per input), got lengths "
                         f"{sorted(lengths)}", param="b")
    n = lengths.pop()
    if n < 2:
        raise UsageError(f"a paired bootstrap needs at least 2 inputs, got {n}", param="a")
    return n


def _resampled_values(metric: Callable, arrays: tuple, index: np.ndarray, vectorized: bool) -> np.ndarray:
    """The metric on each row of the index matrix (chunk x n): one call per resample, or one in all."""
    if vectorized:
        return np.asarray(metric(*(x[index] for x in arrays)), dtype=np.float64).reshape(index.shape[0])
    return np.array([metric(*(x[row] for x in arrays)) for row in index], dtype=np.float64)


def paired_bootstrap(metric: Callable, a, b, *, n_boot: int = 2000, seed: int = 0, level: float = 0.95,
                     vectorized: bool = False) -> dict:
    """Paired bootstrap of metric(a) - metric(b): both models on the same resampled inputs.

    ``a``, ``b``: tuples of per-input arrays (e.g. ``(probs, labels)``), the same inputs in the same
    order. Resample r draws n input indices with replacement, ``rng.integers(0, n, size=n)`` from
    ``numpy.random.default_rng(seed)`` (drawn ``CHUNK`` rows at a time, the same stream), and
    d*_r = metric(a[idx]) - metric(b[idx]). The interval is the percentile interval of d*. The
    p-value is the shifted-null rule: d* - d centred on 0 stands for the null distribution of the
    observed d, so p = (1 + #{|d*_r - d| >= |d|}) / (n_boot + 1) (add-one: never 0, a resampling
    estimate cannot claim more). ``vectorized=True``: metric takes arrays with a leading resample
    axis (chunk x n x ...) and returns one value per resample (much faster for simple means); the
    observed values are then computed on a leading axis of one.
    """
    level = check_level(level)
    if int(n_boot) != n_boot or n_boot < 1:
        raise UsageError(f"n_boot must be a positive whole number of resamples, got {n_boot}", param="n_boot")
    a, b = _per_input(a, "a"), _per_input(b, "b")
    n = _check_paired(a, b)
    everything = np.arange(n)[None]  # the observed value: the identity "resample"
    value_a = float(_resampled_values(metric, a, everything, vectorized)[0])
    value_b = float(_resampled_values(metric, b, everything, vectorized)[0])
    difference = value_a - value_b
    rng = np.random.default_rng(seed)
    deltas = np.empty(int(n_boot), dtype=np.float64)
    for start in range(0, int(n_boot), CHUNK):
        index = rng.integers(0, n, size=(min(CHUNK, int(n_boot) - start), n))
        deltas[start:start + len(index)] = (_resampled_values(metric, a, index, vectorized)
                                            - _resampled_values(metric, b, index, vectorized))
        if not np.isfinite(deltas[:start + len(index)]).all() or not math.isfinite(difference):
            raise UsageError("the metric gave a non-finite value on the inputs or a resample (e.g. a resample "
                             "without one of the classes); choose a metric defined on every resample",
                             param="metric")
    extreme = np.count_nonzero(np.abs(deltas - difference) >= abs(difference))
    ci_low, ci_high = np.quantile(deltas, [0.5 - level / 2.0, 0.5 + level / 2.0])
    return {"test": "paired-bootstrap", "value_a": value_a, "value_b": value_b, "difference": difference,
            "ci_low": float(ci_low), "ci_high": float(ci_high), "p_value": (1.0 + extreme) / (n_boot + 1.0),
            "n_boot": int(n_boot), "seed": seed, "level": level}


def holm(p_values: Sequence[float]) -> list[float]:
    """Holm-Bonferroni adjusted p-values, in the order given.

    Sorted ascending, p_(i) becomes max over j <= i of min(1, (m - j + 1) p_(j)) (m the number of
    comparisons): rejecting every adjusted p <= alpha is Holm's step-down procedure at family-wise
    error alpha. Monotone in the raw p-values and capped at 1.
    """
    p = np.asarray(list(p_values), dtype=np.float64).reshape(-1)
    if p.size == 0:
        return []
    if not np.all((p >= 0.0) & (p <= 1.0)):
        raise UsageError("p_values must be numbers between 0 and 1", param="p_values")
    order = np.argsort(p, kind="mergesort")
    scaled = (p.size - np.arange(p.size)) * p[order]
    adjusted = np.empty(p.size, dtype=np.float64)
    adjusted[order] = np.minimum(1.0, np.maximum.accumulate(scaled))
    return adjusted.tolist()


def pooled_groups(runs_a: Sequence, runs_b: Sequence) -> tuple[tuple[np.ndarray, ...], tuple[np.ndarray, ...]]:
    """Seed groups as per-input arrays with a seed axis: the input of a pooled paired bootstrap.

    ``runs_a``: one tuple of per-input arrays per seed of model A (e.g. ``[(probs_s1, labels),
    (probs_s2, labels)]``), all on the same inputs in the same order; likewise ``runs_b`` (the number
    of seeds may differ). Returns ``(a, b)``, each a tuple whose k-th array stacks the seeds' k-th
    arrays on axis 1 (n x seeds x ...). Resampling rows then resamples inputs and keeps every seed's
    outcome on an input together: ``paired_bootstrap(seed_mean(ece), a, b)`` tests the difference of
    the seed-mean ECEs, treating seeds as fixed (pair it with :func:`between_seeds`).
    """
    return _stack_runs(runs_a, "runs_a"), _stack_runs(runs_b, "runs_b")


def _stack_runs(runs: Sequence, name: str) -> tuple[np.ndarray, ...]:
    runs = [_per_input(run, name) for run in runs]
    if not runs or len({len(run) for run in runs}) != 1:
        raise UsageError(f"{name} must be one tuple of per-input arrays per seed, all with the same arrays",
                         param=name)
    shapes = {tuple(x.shape for x in run) for run in runs}
    if len(shapes) != 1:
        raise UsageError(f"{name}: every seed must be evaluated on the same inputs (array shapes differ: "
                         f"{sorted(shapes)})", param=name)
    return tuple(np.stack(arrays, axis=1) for arrays in zip(*runs))


def seed_mean(metric: Callable) -> Callable:
    """metric averaged over the seed axis (axis 1) of pooled arrays: the seed group's mean metric."""
    def mean_over_seeds(*arrays):
        return float(np.mean([metric(*(x[:, s] for x in arrays)) for s in range(arrays[0].shape[1])]))
    mean_over_seeds.__name__ = f"seed_mean_{getattr(metric, '__name__', 'metric')}"
    return mean_over_seeds


def between_seeds(values_a: Sequence[float], values_b: Sequence[float]) -> dict:
    """Welch's t-test on the per-seed values of two seed groups: is the difference beyond seed spread?

    The pooled paired tests hold the trained networks fixed; a second training run may differ more
    than the inputs' noise. Welch's statistic t = (mean_a - mean_b) / sqrt(s_a^2/k_a + s_b^2/k_b)
    with Welch-Satterthwaite degrees of freedom; with fewer than 2 seeds in a group nothing is
    known about the spread and the p-value is NaN.
    """
    from scipy.stats import t as student_t

    a, b = finite(values_a, "values_a"), finite(values_b, "values_b")
    out = {"test": "welch-t", "mean_a": float(a.mean()) if a.size else math.nan,
           "mean_b": float(b.mean()) if b.size else math.nan, "n_a": int(a.size), "n_b": int(b.size)}
    out["difference"] = out["mean_a"] - out["mean_b"]
    if a.size < 2 or b.size < 2:
        return {**out, "sd_a": math.nan, "sd_b": math.nan, "p_value": math.nan}
    va, vb = a.var(ddof=1) / a.size, b.var(ddof=1) / b.size
    out.update(sd_a=float(a.std(ddof=1)), sd_b=float(b.std(ddof=1)))
    if va + vb == 0.0:
        return {**out, "p_value": 1.0 if out["difference"] == 0.0 else 0.0}
    dof = (va + vb) ** 2 / (va ** 2 / (a.size - 1) + vb ** 2 / (b.size - 1))
    t_stat = out["difference"] / math.sqrt(va + vb)
    return {**out, "p_value": float(2.0 * student_t.sf(abs(t_stat), dof))}
