"""Has the attack converged? A sweep's verdict, from a paired test of its last two counts.

A sweep (``eot_samples`` or ``steps`` given as a list) attacks the same inputs with the same seeds
at every count, so the counts' per-input outcomes are paired. Between the last two counts, b
inputs are robust at the weaker count and broken by the stronger one, c the reverse; the drop in
robust accuracy is (b - c) / n. The curve is **converged** only when

1. the drop is not significant by the exact McNemar test (two-sided, 0.05): the stronger attack
   did not break significantly more inputs, and
2. the drop's upper 95% confidence limit (Newcombe's (1998) hybrid score interval for a difference
   of paired proportions, his method 10) is below ``tolerance`` (default one percentage point of
   robust accuracy).

So "converged" guarantees, at 95% confidence, that one more step of the sweep's count would not
lower robust accuracy by ``tolerance`` or more on inputs like these. It does not say that the
attack is the strongest one: another attack, more restarts or a larger count further on can still
find more (the curve only says the last step stopped paying). An unpaired comparison (the last
count's Wilson half-width, 0.3) called a drop of 6 inputs and no gain converged although McNemar's
p is 0.031. A defence that draws no noise at a K is the same attack at every EOT count: converged
without measuring.
"""
from __future__ import annotations

import math
from typing import Any

import numpy as np

from jemeval.errors import UsageError
from jemeval.evaluation.paired import mcnemar_exact
from jemeval.evaluation.robust.intervals import Z_95, wilson_interval

#: what a message calls the counts of each swept axis
SWEEP_AXES = {"eot_samples": "EOT samples", "steps": "attack steps"}
DETERMINISTIC = "the defence is deterministic at K={k} (no chain or SGLD noise), so every EOT count is the same " \
                "attack: converged"
#: the default largest drop in robust accuracy between the last two counts that still counts as converged
TOLERANCE = 0.01
SIGNIFICANCE = 0.05


def check_tolerance(tolerance: float) -> float:
    """A tolerance in robust-accuracy units, 0 < tolerance < 1."""
    try:
        value = float(tolerance)
    except (TypeError, ValueError):
        value = math.nan
    if not 0.0 < value < 1.0:
        raise UsageError(f"converge_tolerance must be a robust-accuracy difference between 0 and 1 (e.g. 0.01 for one "
                         f"percentage point), got {tolerance!r}", param="converge_tolerance")
    return value


def paired_difference_interval(a: int, b: int, c: int, d: int, z: float = Z_95) -> tuple[float, float]:
    """Newcombe's (1998) method 10: the hybrid score interval of p1 - p2 = (b - c) / n for paired
    binary outcomes (a: both 1, b: first only, c: second only, d: neither). Each margin's Wilson
    interval (l1, u1), (l2, u2) is combined with the correlation phi of the 2 x 2 table (0 where a
    margin is empty): delta = sqrt((p1 - l1)^2 - 2 phi (p1 - l1)(u2 - p2) + (u2 - p2)^2) below,
    epsilon likewise above."""
    n = a + b + c + d
    p1, p2 = (a + b) / n, (a + c) / n
    (l1, u1), (l2, u2) = wilson_interval(a + b, n, z), wilson_interval(a + c, n, z)
    margins = (a + b) * (c + d) * (a + c) * (b + d)
    phi = (a * d - b * c) / math.sqrt(margins) if margins else 0.0
    below = math.sqrt(max((p1 - l1) ** 2 - 2 * phi * (p1 - l1) * (u2 - p2) + (u2 - p2) ** 2, 0.0))
    above = math.sqrt(max((u1 - p1) ** 2 - 2 * phi * (u1 - p1) * (p2 - l2) + (p2 - l2) ** 2, 0.0))
    theta = p1 - p2
    return max(theta - below, -1.0), min(theta + above, 1.0)


def paired_drop(before, after, tolerance: float = TOLERANCE) -> dict[str, Any]:
    """The paired comparison of two counts' per-input robust outcomes: b, c, the drop, McNemar's p,
    the drop's 95% interval and whether it counts as converged."""
    before, after = np.asarray(before, dtype=bool), np.asarray(after, dtype=bool)
    test = mcnemar_exact(before, after)
    a, b, c = int((before & after).sum()), test["b"], test["c"]
    low, high = paired_difference_interval(a, b, c, before.size - a - b - c)
    converged = test["p_value"] >= SIGNIFICANCE and high < tolerance
    return {"broken": b, "gained": c, "drop": (b - c) / before.size, "drop_ci_low": low, "drop_ci_high": high,
            "p_value": test["p_value"], "tolerance": tolerance, "converged": converged}


def _counts(r: dict[str, Any]) -> tuple[int, int]:
    return int(r.get("eot_samples") or 0), int(r.get("steps") or 0)


def final_records(records: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The records of each (attack, K, grad mode) at its largest counts (EOT samples, then steps):
    what a sweep reports; every record where nothing was swept."""
    last: dict[tuple, tuple[int, int]] = {}
    for r in records:
        key = (r["attack"], r["refine_steps"], r["grad_mode"])
        last[key] = max(last.get(key, (-1, -1)), _counts(r))
    return [r for r in records if _counts(r) == last[(r["attack"], r["refine_steps"], r["grad_mode"])]]


def convergence(records: list[dict[str, Any]], outcomes: list[dict[str, Any]], *, swept: list[str],
                deterministic_ks: list[int] = (), tolerance: float = TOLERANCE) -> list[dict[str, Any]]:
    """One verdict per (attack, K, grad mode, epsilon) curve and swept axis (``eot_samples``,
    ``steps``), along that axis at the other's largest count (the module docstring says when it is
    converged); ``outcomes``: per record (same order), its inputs' robust outcomes ``correct``.
    True without measuring for EOT at a K in ``deterministic_ks``; None where the axis does not
    apply (a single-draw or gradient-free run, an attack without a steps setting)."""
    if len(outcomes) != len(records):
        raise ValueError(f"convergence needs one outcome per record, got {len(outcomes)} for {len(records)}")
    groups: dict[tuple, list[tuple[dict, dict]]] = {}
    for r, o in zip(records, outcomes):
        groups.setdefault((r["attack"], r["refine_steps"], r["grad_mode"], r["epsilon"]), []).append((r, o))
    verdicts = []
    for axis in swept:
        other = "steps" if axis == "eot_samples" else "eot_samples"
        for curve, rows in groups.items():
            top = max(r.get(other) or 0 for r, _ in rows)
            rows = sorted(((r, o) for r, o in rows if (r.get(other) or 0) == top), key=lambda ro: ro[0].get(axis) or 0)
            verdicts.append(axis_verdict(axis, curve, rows, deterministic=curve[1] in deterministic_ks,
                                         tolerance=tolerance))
    return verdicts


def axis_verdict(axis: str, curve: tuple, rows: list[tuple[dict, dict]], *, deterministic: bool,
                 tolerance: float = TOLERANCE) -> dict[str, Any]:
    """The verdict of one curve along one axis ((record, outcome) rows sorted by that axis's count)."""
    attack, k, mode, eps = curve
    label = f"{attack} K={k} {mode} eps={eps:g}"
    out = {"attack": attack, "refine_steps": k, "grad_mode": mode, "epsilon": eps, "axis": axis,
           "counts": [r.get(axis) for r, _ in rows], "robust_accuracy": [r["robust_accuracy"] for r, _ in rows],
           "converged": None, "message": None}
    if len(rows) >= 2 and eps == 0:  # the attack may not move the input: every count is the same run
        out.update(converged=True, message=f"{label}: nothing to attack at epsilon 0: converged")
    elif len(rows) >= 2:
        (first, before), (second, after) = rows[-2:]
        out.update(paired_drop(before["correct"], after["correct"], tolerance))
        counts = f"from {first[axis]} to {second[axis]} {SWEEP_AXES[axis]}"
        out["message"] = f"{label}: {first['robust_accuracy']:.3f} -> {second['robust_accuracy']:.3f} {counts}, " \
                         + drop_text(out)
    elif axis == "eot_samples" and deterministic:
        out.update(converged=True, message=f"{label}: {DETERMINISTIC.format(k=k)}")
    return out


def drop_text(v: dict[str, Any]) -> str:
    """What the paired comparison found, in words."""
    found = (f"{v['broken']} inputs broken and {v['gained']} regained (exact McNemar p = {v['p_value']:.2g}), drop "
             f"{v['drop']:+.3f}, upper 95% limit {v['drop_ci_high']:+.3f}")
    if v["converged"]:
        return f"{found} < tolerance {v['tolerance']:g}: converged"
    if v["p_value"] < SIGNIFICANCE:
        return f"{found}: not converged (the drop is significant)"
    return (f"{found}: not converged (the limit is not below {v['tolerance']:g}: more inputs, or a larger "
            "converge tolerance, can settle it)")


def mark_converged(records: list[dict[str, Any]], verdicts: list[dict[str, Any]]) -> None:
    """Each record's ``converged``: False if its curve has not converged along a swept axis, True if
    it has along every axis that applies, None where none does (or nothing was swept)."""
    flags: dict[tuple, list[bool]] = {}
    for v in verdicts:
        if v["converged"] is not None:
            flags.setdefault((v["attack"], v["refine_steps"], v["grad_mode"], v["epsilon"]), []).append(v["converged"])
    for r in records:
        got = flags.get((r["attack"], r["refine_steps"], r["grad_mode"], r["epsilon"]))
        r["converged"] = all(got) if got else None


def convergence_checks(verdicts: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """One ``attack_converged`` check per (attack, K, grad mode, swept axis); a failed one names
    every curve that has not converged, with its numbers."""
    groups: dict[tuple, list[dict]] = {}
    for v in verdicts:
        if v["converged"] is not None:
            groups.setdefault((v["attack"], v["refine_steps"], v["grad_mode"], v["axis"]), []).append(v)
    checks = []
    for (attack, k, mode, axis), vs in groups.items():
        bad = [v["message"] for v in vs if not v["converged"]]
        where = {"attack": attack, "refine_steps": k, "grad_mode": mode, "axis": axis}
        text = ("; ".join(bad) + f" (run more {SWEEP_AXES[axis]} until the last two counts agree)" if bad
                else converged_text(f"{attack} K={k} {mode}", vs))
        checks.append({"check": "attack_converged", **where, "passed": not bad,
                       "message": f"{'WARNING' if bad else 'check ok'}: {text}"})
    return checks


def converged_text(label: str, vs: list[dict[str, Any]]) -> str:
    """The message of a curve set that converged at every epsilon."""
    measured = [v for v in vs if v.get("drop") is not None]
    if not measured:
        return f"{label}: {DETERMINISTIC.format(k=vs[0]['refine_steps'])}"
    a, b = measured[0]["counts"][-2:]
    points = ", ".join(f"eps={v['epsilon']:g} {v['robust_accuracy'][-2]:.3f} -> {v['robust_accuracy'][-1]:.3f} "
                       f"(upper limit {v['drop_ci_high']:+.3f})" for v in measured)
    return (f"{label}: converged from {a} to {b} {SWEEP_AXES[vs[0]['axis']]}: no significant drop and every drop's "
            f"upper 95% limit below the tolerance {measured[0]['tolerance']:g} ({points})")
