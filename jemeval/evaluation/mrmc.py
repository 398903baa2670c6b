"""Seed groups compared as methods: the Obuchowski-Rockette analysis with Hillis' degrees of freedom.

Two training recipes are compared on the same inputs by several runs (seeds) each. Two sources of
chance make their numbers differ: which inputs were drawn, and which networks training happened to
produce. A test that treats only the inputs as random (DeLong or McNemar on the runs' outcomes
concatenated) answers "do *these* networks differ?" and calls two equally good recipes different far
more often than it should, because runs of one recipe err on the same hard inputs and each run has
its own luck. Radiology met the same problem comparing two imaging modalities read by several
readers on the same cases; its answer is the multi-reader multi-case (MRMC) analysis of Obuchowski
& Rockette (1995) with the denominator degrees of freedom of Hillis (2007). Here seeds are the
readers and inputs the cases.

Each run gives a figure of merit theta (AUROC, accuracy, ECE, ...; :mod:`~jemeval.evaluation.figures_of_merit`),
and the covariance of the thetas over input sampling is estimated from the per-input outcomes
(DeLong's structural components for AUROC, the jackknife, or the bootstrap over inputs):
Var = its mean diagonal, Cov2 = runs of one method, Cov3 = runs of different methods (Cov1 = the
same reader under both methods, crossed design only).

* ``design="crossed"`` (run j of A and run j of B share something, e.g. the training seed: the
  classic MRMC design; equal group sizes): F = MS(T) / [MS(T*R) + r max(Cov2 - Cov3, 0)] on
  (1, ddf_H) degrees of freedom, ddf_H = [MS(T*R) + r max(Cov2 - Cov3, 0)]^2 / [MS(T*R)^2 / (r - 1)];
  standard error sqrt(2/r [MS(T*R) + r max(Cov2 - Cov3, 0)]). This reproduces OR-DBM MRMC's
  output on the Van Dyke data (tests/data/mrmc).
* ``design="nested"`` (runs of A and of B unrelated, any sizes >= 2: readers nested within methods):
  Var(mean A - mean B) = s_A^2/r_A + s_B^2/r_B + max(Cov2_A + Cov2_B - 2 Cov3, 0), where s^2 is a
  group's sample variance of theta (its expectation is the seed variance plus Var - Cov2); t =
  difference / sqrt(that) on Welch-Satterthwaite degrees of freedom of the two s^2 terms, the case
  term treated as known, as Hillis does for MS(T*R). With r_A = r_B it equals the crossed analysis
  when the runs share nothing, with the degrees of freedom of both groups' spreads.

Both are checked by simulation under the null (docs/evaluation.md, "Seed groups as methods").
"""
from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import numpy as np
from scipy import stats

from jemeval.errors import UsageError
from jemeval.evaluation.figures_of_merit import AUROC, Outcomes, figure
from jemeval.evaluation.placements import binary_labels, check_level, finite

COVARIANCES = ("delong", "jackknife", "bootstrap")
DESIGNS = ("crossed", "nested")
#: "hillis": Hillis' (2007) ddf as OR-DBM MRMC computes it; "hillis-upper80": the same formula with each
#: seed-spread term at its one-sided 80% upper confidence limit (UPPER_LEVEL), for groups of few runs
DDF_RULES = ("hillis", "hillis-upper80")
UPPER_LEVEL = 0.8
#: from this many runs in every group the plain Hillis ddf holds its level (see the module docstring)
HILLIS_FROM_RUNS = 5
N_BOOT = 2000


def covariance_matrix(runs: Sequence[Outcomes], covariance: str, *, n_boot: int = N_BOOT, seed: int = 0) -> np.ndarray:
    """The covariance over input sampling of the runs' figures of merit (runs x runs)."""
    if covariance == "delong":
        if not all(isinstance(r, AUROC) for r in runs):
            raise UsageError("covariance 'delong' is defined for AUROC only; use 'jackknife' or 'bootstrap'",
                             param="covariance")
        v10, v01 = np.stack([r.v10 for r in runs]), np.stack([r.v01 for r in runs])
        return np.atleast_2d(np.cov(v10, ddof=1)) / v10.shape[1] + np.atleast_2d(np.cov(v01, ddof=1)) / v01.shape[1]
    if covariance == "jackknife":
        loo = np.stack([r.leave_one_out() for r in runs])
        centred = loo - loo.mean(axis=1, keepdims=True)
        return (loo.shape[1] - 1) / loo.shape[1] * centred @ centred.T
    if covariance == "bootstrap":
        return np.atleast_2d(np.cov(np.stack([r.replicates(n_boot, seed) for r in runs]), ddof=1))
    raise UsageError(f"covariance must be one of {', '.join(COVARIANCES)}, got {covariance!r}", param="covariance")


def _mean_off_diagonal(block: np.ndarray) -> float:
    r = block.shape[0]
    return float((block.sum() - np.trace(block)) / (r * (r - 1))) if r > 1 else math.nan


def _crossed(theta_a, theta_b, cov, cautious: bool) -> dict[str, Any]:
    """MS(T), MS(T*R), the OR covariances and Hillis' error term of the two-method factorial design."""
    r = theta_a.size
    d = theta_a - theta_b
    ms_tr = float(np.var(d, ddof=1) / 2.0)
    block = cov[:r, r:]
    cov2 = (_mean_off_diagonal(cov[:r, :r]) + _mean_off_diagonal(cov[r:, r:])) / 2.0
    cov3 = _mean_off_diagonal(block)
    case = r * max(cov2 - cov3, 0.0)
    spread = _upper(ms_tr, r - 1) if cautious else ms_tr
    return {"ms_t": float(r * d.mean() ** 2 / 2.0), "ms_tr": ms_tr, "error_term": ms_tr + case,
            "var_error": float(np.mean(np.diag(cov))), "cov1": float(np.mean(np.diag(block))), "cov2": cov2,
            "cov3": cov3, "variance": 2.0 / r * (ms_tr + case),
            "df": _ratio((spread + case) ** 2, spread ** 2 / (r - 1))}


def _nested(theta_a, theta_b, cov, cautious: bool) -> dict[str, Any]:
    """The spreads of the two groups and the case term of readers nested within methods."""
    ra, rb = theta_a.size, theta_b.size
    spread_a, spread_b = float(np.var(theta_a, ddof=1)) / ra, float(np.var(theta_b, ddof=1)) / rb
    cov2_a, cov2_b = _mean_off_diagonal(cov[:ra, :ra]), _mean_off_diagonal(cov[ra:, ra:])
    cov3 = float(cov[:ra, ra:].mean())
    case = max(cov2_a + cov2_b - 2.0 * cov3, 0.0)
    spread = spread_a + spread_b
    nu = _ratio(spread ** 2, spread_a ** 2 / (ra - 1) + spread_b ** 2 / (rb - 1))  # Welch-Satterthwaite
    bound = _upper(spread, nu) if cautious and math.isfinite(nu) else spread
    return {"s2_a": spread_a * ra, "s2_b": spread_b * rb, "var_error": float(np.mean(np.diag(cov))),
            "cov2_a": cov2_a, "cov2_b": cov2_b, "cov3": cov3, "variance": spread + case,
            "df": _ratio((bound + case) ** 2, bound ** 2 / nu) if math.isfinite(nu) else math.inf}


def _upper(spread: float, df: float) -> float:
    """A spread's one-sided upper confidence limit at UPPER_LEVEL: spread x df / chi2_df(1 - UPPER_LEVEL)."""
    return spread * df / float(stats.chi2.ppf(1.0 - UPPER_LEVEL, df))


def _ratio(numerator: float, denominator: float) -> float:
    """Degrees of freedom; infinite when the spread they count is zero (the case term alone: normal)."""
    return numerator / denominator if denominator > 0 else math.inf


def _check_design(ra: int, rb: int, design: str, ddf: str | None) -> str:
    """The ddf rule to use (None: plain Hillis from HILLIS_FROM_RUNS runs in every group, else the
    upper-80 rule); a design the groups cannot have is refused in one line."""
    if design not in DESIGNS:
        raise UsageError(f"design must be one of {', '.join(DESIGNS)}, got {design!r}", param="design")
    if ddf is not None and ddf not in DDF_RULES:
        raise UsageError(f"ddf must be one of {', '.join(DDF_RULES)}, got {ddf!r}", param="ddf")
    if ra < 2 or rb < 2:
        raise UsageError(f"a method-level test needs at least 2 runs per group, got {ra} and {rb}; with one run a "
                         "side only the input-level test (these runs on these inputs) applies", param="scores_b")
    if design == "crossed" and ra != rb:
        raise UsageError(f"the crossed design pairs run j of one group with run j of the other, so the groups must "
                         f"be the same size, got {ra} and {rb}; use design='nested'", param="design")
    return ddf or ("hillis" if min(ra, rb) >= HILLIS_FROM_RUNS else "hillis-upper80")


def or_test(theta_a: np.ndarray, theta_b: np.ndarray, cov: np.ndarray, *, design: str, ddf: str | None = None,
            level: float = 0.95) -> dict[str, Any]:
    """The OR-Hillis test of mean theta_a = mean theta_b given the thetas' covariance over inputs
    (``cov``: (r_a + r_b) square, A's runs first). Returns the dict of :func:`or_hillis`."""
    level = check_level(level)
    ra, rb = theta_a.size, theta_b.size
    ddf = _check_design(ra, rb, design, ddf)
    parts = (_crossed if design == "crossed" else _nested)(theta_a, theta_b, cov, ddf == "hillis-upper80")
    difference = float(theta_a.mean() - theta_b.mean())
    se, df = math.sqrt(max(parts["variance"], 0.0)), parts["df"]
    if se > 0:
        t_value = difference / se
        reference = stats.t(df) if math.isfinite(df) else stats.norm()  # df infinite: no seed spread at all
        p_value = float(2.0 * reference.sf(abs(t_value)))
        half = float(reference.ppf(0.5 + level / 2.0)) * se
    else:  # no spread at all: equal thetas are no evidence, unequal ones are certain
        t_value, p_value, half = (0.0, 1.0, 0.0) if difference == 0 else (math.copysign(math.inf, difference), 0.0, 0.0)
    return {"test": "or-hillis", "design": design, "ddf_rule": ddf, "statistic": t_value ** 2, "df_numerator": 1,
            "df": df, "p_value": p_value, "difference": difference, "std_error": se,
            "interval": [difference - half, difference + half], "value_a": float(theta_a.mean()),
            "value_b": float(theta_b.mean()), "values_a": theta_a.tolist(), "values_b": theta_b.tolist(),
            "seeds_a": ra, "seeds_b": rb, "level": level,
            **{k: v for k, v in parts.items() if k not in ("variance", "df")}}


def _prepared(fom, runs: Sequence, name: str) -> list[Outcomes]:
    """Each run as an Outcomes of the figure of merit (runs given as tuples of per-input arrays, or
    as Outcomes already), all on the same inputs."""
    cls = figure(fom)
    out = [r if isinstance(r, Outcomes) else cls(*(r if isinstance(r, (tuple, list)) else (r,))) for r in runs]
    if not out:
        raise UsageError(f"{name} holds no runs", param=name)
    return out


def _check_same_inputs(runs: list[Outcomes]) -> None:
    sizes = {r.n for r in runs}
    if len(sizes) != 1:
        raise UsageError(f"every run must be evaluated on the same inputs, got {sorted(sizes)} inputs",
                         param="scores_b")
    strata = [r.strata for r in runs if r.strata is not None]
    if any(not np.array_equal(strata[0], s) for s in strata[1:]):
        raise UsageError("every run must be evaluated on the same inputs (the in-distribution/OOD labels differ)",
                         param="labels")


def or_hillis_outcomes(fom, runs_a: Sequence, runs_b: Sequence, *, covariance: str = "jackknife",
                       level: float = 0.95, design: str | None = None, ddf: str | None = None,
                       n_boot: int = N_BOOT, seed: int = 0) -> dict[str, Any]:
    """The OR-Hillis test for any figure of merit computed from per-input outcomes.

    ``fom``: "accuracy" (robust accuracy too), "nll", "ece", "fpr95", "auroc", or an
    :class:`~jemeval.evaluation.figures_of_merit.Outcomes` class; ``runs_a``/``runs_b``: one tuple of
    per-input arrays per run (``(correct,)``, ``(probs, labels)``, ``(labels, scores)``), or Outcomes
    already built. ``design``: None = crossed when the groups are the same size (row j of each is
    reader j), nested otherwise. ``ddf``: "hillis" (Hillis 2007, as OR-DBM MRMC), "hillis-upper80"
    (each seed spread at its 80% upper confidence limit), or None: "hillis" when every group has at
    least HILLIS_FROM_RUNS runs, "hillis-upper80" below (where the plain rule is liberal).
    ``n_boot``/``seed``: the bootstrap covariance's resamples.
    """
    a, b = _prepared(fom, runs_a, "runs_a"), _prepared(fom, runs_b, "runs_b")
    _check_same_inputs(a + b)
    if covariance not in type(a[0]).covariances:
        raise UsageError(f"covariance {covariance!r} is not available for {type(a[0]).name}; choose one of "
                         f"{', '.join(type(a[0]).covariances)}", param="covariance")
    theta = np.array([r.value() for r in a + b])
    cov = covariance_matrix(a + b, covariance, n_boot=n_boot, seed=seed)
    design = design or ("crossed" if len(a) == len(b) else "nested")
    result = or_test(theta[:len(a)], theta[len(a):], cov, design=design, ddf=ddf, level=level)
    return {**result, "figure_of_merit": type(a[0]).name, "covariance": covariance,
            **({"n_boot": int(n_boot), "seed": int(seed)} if covariance == "bootstrap" else {})}


def or_hillis(labels, scores_a, scores_b, *, covariance: str = "delong", level: float = 0.95,
              design: str | None = None, ddf: str | None = None, n_boot: int = N_BOOT,
              seed: int = 0) -> dict[str, Any]:
    """Obuchowski-Rockette with Hillis' denominator df: do two methods' mean AUROCs differ, seeds
    and inputs both random?

    ``labels``: 1 = in-distribution (positive), 0 = OOD, one per input; ``scores_a``, ``scores_b``:
    arrays [runs, inputs] of the two groups' scores on those inputs (the groups may differ in size).
    ``covariance``: "delong", "jackknife" or "bootstrap". Returns a dict with ``test`` ("or-hillis"),
    ``statistic`` (F on 1 and ``df`` degrees of freedom), ``df`` (Hillis' denominator df),
    ``p_value``, ``difference`` (mean AUROC a - b), ``std_error``, ``interval`` (at ``level``),
    ``seeds_a``, ``seeds_b``, the design and the variance components.
    """
    labels = binary_labels(labels)
    a, b = finite(scores_a, "scores_a", ndim=2), finite(scores_b, "scores_b", ndim=2)
    for name, s in (("scores_a", a), ("scores_b", b)):
        if s.shape[1] != labels.size:
            raise UsageError(f"{name} must be runs x inputs with one score per label ({labels.size}), got shape "
                             f"{s.shape}", param=name)
    return or_hillis_outcomes("auroc", [(labels, s) for s in a], [(labels, s) for s in b], covariance=covariance,
                              level=level, design=design, ddf=ddf, n_boot=n_boot, seed=seed)


def seed_mean_bootstrap(fom, runs_a: Sequence, runs_b: Sequence, *, n_boot: int = N_BOOT, seed: int = 0,
                        level: float = 0.95) -> dict[str, Any]:
    """Do *these* runs differ on inputs like these? A paired bootstrap over inputs of the difference
    of the two groups' mean figures of merit: every resample keeps each input's outcomes from every
    run together (:func:`~jemeval.evaluation.figures_of_merit.bootstrap_counts`). Percentile interval;
    p = (1 + #{|d* - d| >= |d|}) / (n_boot + 1), the shifted-null rule of
    :func:`jemeval.evaluation.paired.paired_bootstrap`. Seeds are held fixed: this says nothing about
    another training run of either method (that is :func:`or_hillis_outcomes`)."""
    level = check_level(level)
    a, b = _prepared(fom, runs_a, "runs_a"), _prepared(fom, runs_b, "runs_b")
    _check_same_inputs(a + b)
    value_a, value_b = float(np.mean([r.value() for r in a])), float(np.mean([r.value() for r in b]))
    deltas = (np.mean([r.replicates(n_boot, seed) for r in a], axis=0)
              - np.mean([r.replicates(n_boot, seed) for r in b], axis=0))
    difference = value_a - value_b
    if not (np.isfinite(deltas).all() and math.isfinite(difference)):
        raise UsageError(f"{type(a[0]).name} is not finite on the inputs or on a resample", param="fom")
    extreme = int(np.count_nonzero(np.abs(deltas - difference) >= abs(difference)))
    low, high = np.quantile(deltas, [0.5 - level / 2.0, 0.5 + level / 2.0])
    return {"test": "paired-bootstrap", "figure_of_merit": type(a[0]).name, "value_a": value_a, "value_b": value_b,
            "difference": difference, "interval": [float(low), float(high)],
            "p_value": (1.0 + extreme) / (int(n_boot) + 1.0), "n_boot": int(n_boot), "seed": int(seed),
            "seeds_a": len(a), "seeds_b": len(b), "level": level}
