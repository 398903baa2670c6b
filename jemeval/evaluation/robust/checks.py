"""The adaptive-defence checklist (Carlini et al. 2019; Tramer et al. 2020) run on ``robust`` records.

Each (attack, K, gradient mode) curve is checked: accuracy at epsilon 0 equals clean accuracy,
accuracy does not increase with epsilon, and a white-box attack brings accuracy near zero at the
largest epsilon, without refinement (K = 0) always, with refinement (K > 0) where that epsilon
puts every image within reach (Linf 1, or L2 the input's diameter): no input can be robust there,
so a refined model keeping accuracy measures the refinement's randomness, not robustness.

Across runs, two signs of obfuscated gradients (Athalye et al. 2018): a gradient-free attack
(square, boundary, pointwise) beating every white-box run at the same K and epsilon, and a
single-draw gradient mode (full, bpda) leaving accuracy much higher than an EOT mode (eot,
bpda+eot) of the same attack: the single-draw gradient is masked by the refinement's randomness.
Every check is a dict with ``check``, ``passed`` and a ``message`` ("check ok: ..." or "WARNING: ...").

A sweep (``eot_samples`` or ``steps`` given as a list) adds one more item, ``attack_converged``
(:mod:`jemeval.evaluation.robust.convergence`); the other checks then judge the sweep's last counts,
the numbers it reports.

:func:`record_flags` turns all of it into each record's ``flags``: the reasons a number must not be
read as robustness (a stochastic defence attacked without EOT, a failed check of its curve, an attack
not converged). A report never bolds a flagged number nor puts it in its summary.
"""
from __future__ import annotations

import math
from typing import Any

from jemeval.evaluation.robust.convergence import convergence_checks, final_records
from jemeval.sampling.refinement import EOT_MODES

#: K = 0 robust accuracy at the largest epsilon above this is flagged (the attack may be too weak)
LARGE_EPSILON_MAX_ACCURACY = 0.1
#: K > 0 robust accuracy above this at an epsilon that reaches every image is flagged
REACHABLE_MAX_ACCURACY = 0.05
#: a gradient-free attack beating the white-box one by more than this is flagged
OBFUSCATION_TOLERANCE = 0.02
#: a single-draw gradient mode above an EOT mode of the same attack by more than this is flagged
MASKING_TOLERANCE = 0.05
#: full and bpda: one noise draw per gradient (the modes the EOT modes extend)
SINGLE_DRAW_MODES = tuple(EOT_MODES.values())


def sanity_checks(records: list[dict[str, Any]], *, input_dims: int | None = None,
                  num_classes: int | None = None, verdicts: list[dict[str, Any]] = ()) -> list[dict[str, Any]]:
    """The checks printed with the results; each a dict with check, passed, message.

    ``input_dims`` (C x H x W) tells which L2 epsilon reaches every image; ``num_classes`` gives the
    chance level quoted in the messages; ``verdicts`` (a sweep's convergence verdicts) add the
    ``attack_converged`` checks, and the others then judge the sweep's last counts.
    """
    if verdicts:
        records = final_records(records)
    groups: dict[tuple, list[dict]] = {}
    for r in records:
        groups.setdefault((r["attack"], r["refine_steps"], r["grad_mode"]), []).append(r)
    checks: list[dict[str, Any]] = []
    for (attack, k, mode), rows in groups.items():
        rows = sorted(rows, key=lambda r: r["epsilon"])
        where = {"attack": attack, "refine_steps": k, "grad_mode": mode}
        label = f"{attack} K={k} {mode}"
        checks += [{"check": c["check"], **where, "passed": c["passed"], "message": c["message"]}
                   for c in curve_checks(label, k, rows, input_dims=input_dims, num_classes=num_classes)]
    extra = [obfuscation_check(records), masking_check(records)]
    return checks + [c for c in extra if c] + convergence_checks(verdicts)


def reaches_everything(norm: str | None, epsilon: float, input_dims: int | None) -> bool:
    """Whether an epsilon ball (pixel units) around any input holds every image of [0, 1]^D."""
    if norm == "linf":
        return epsilon >= 1 - 1e-9
    return norm == "l2" and input_dims is not None and epsilon >= math.sqrt(input_dims) - 1e-9


def curve_checks(label: str, k: int, rows: list[dict[str, Any]], *, input_dims: int | None = None,
                 num_classes: int | None = None) -> list[dict[str, Any]]:
    """The checks of one accuracy-vs-epsilon curve (rows sorted by epsilon)."""
    out = []
    zero = [r for r in rows if r["epsilon"] == 0]
    if zero:
        acc, clean = zero[0]["robust_accuracy"], zero[0]["clean_accuracy"]
        ok = abs(acc - clean) < 1e-9
        out.append(_check("epsilon0_equals_clean", ok,
                          f"{label}: accuracy at epsilon 0 equals clean accuracy ({clean:.4f})" if ok else
                          f"{label}: accuracy at epsilon 0 ({acc:.4f}) differs from clean accuracy ({clean:.4f}); "
                          "with refinement this is re-check noise, without it a bug"))
    accs = [r["robust_accuracy"] for r in rows]
    rises = [(rows[i]["epsilon"], rows[i + 1]["epsilon"]) for i in range(len(rows) - 1)
             if accs[i + 1] > accs[i] + 1e-12]
    between = ", ".join(f"{a:g}->{b:g}" for a, b in rises)
    out.append(_check("non_increasing", not rises,
                      f"{label}: accuracy does not increase with epsilon" if not rises else
                      f"{label}: accuracy increases with epsilon between {between} (the attack is not finding the "
                      "adversarials it should)"))
    last = rows[-1]
    if k == 0 and not last.get("gradient_free") and last["epsilon"] > 0:
        acc, eps = last["robust_accuracy"], last["epsilon"]
        ok = acc <= LARGE_EPSILON_MAX_ACCURACY
        out.append(_check("large_epsilon_near_zero", ok,
                          f"{label}: accuracy at the largest epsilon {eps:g} is {acc:.4f} (near zero)" if ok else
                          f"{label}: accuracy at the largest epsilon {eps:g} is {acc:.4f} > "
                          f"{LARGE_EPSILON_MAX_ACCURACY}: the attack may be too weak (more steps or restarts) or "
                          "the largest epsilon too small"))
    elif k > 0 and not last.get("gradient_free") and reaches_everything(last.get("norm"), last["epsilon"],
                                                                        input_dims):
        out.append(reachable_check(label, last, num_classes))
    return out


def reachable_check(label: str, last: dict[str, Any], num_classes: int | None) -> dict[str, Any]:
    """K > 0 at an epsilon that reaches every image: nothing is robust there."""
    acc, eps = last["robust_accuracy"], last["epsilon"]
    chance = f"; chance is {1 / num_classes:.2f}" if num_classes else ""
    ok = acc <= REACHABLE_MAX_ACCURACY
    return _check("large_epsilon_near_zero", ok,
                  f"{label}: accuracy at epsilon {eps:g}, where every image is within reach, is {acc:.4f} (near zero)"
                  if ok else
                  f"{label}: accuracy {acc:.4f} at epsilon {eps:g}, where every image is within reach and no input "
                  f"can be robust{chance}: it measures the refinement's randomness (fresh noise at the re-check "
                  "undoing adversarials found under other noise), not robustness; attack with an EOT gradient mode "
                  "(eot, bpda+eot) and more steps, and re-check with more draws")


def obfuscation_check(records: list[dict[str, Any]]) -> dict[str, Any] | None:
    """A gradient-free attack beating every white-box run at the same K and epsilon; None when the
    records do not hold both kinds."""
    by_point: dict[tuple, dict[str, float]] = {}
    for r in records:
        kind = "free" if r.get("gradient_free") else "white"
        slot = by_point.setdefault((r["refine_steps"], r["epsilon"]), {})
        slot[kind] = min(slot.get(kind, math.inf), r["robust_accuracy"])
    if not any("free" in v and "white" in v for v in by_point.values()):
        return None
    beaten = sorted((k, e, v["free"], v["white"]) for (k, e), v in by_point.items()
                    if "free" in v and "white" in v and v["free"] < v["white"] - OBFUSCATION_TOLERANCE)
    text = ("no gradient-free attack beats the white-box attack" if not beaten else
            "a gradient-free attack beats the white-box one (a sign of obfuscated gradients) at "
            + ", ".join(f"K={k} eps={e:g} ({f:.3f} < {w:.3f})" for k, e, f, w in beaten))
    return _check("white_box_beats_gradient_free", not beaten, text,
                  points=[{"refine_steps": k, "epsilon": e} for k, e, _, _ in beaten])


def masking_check(records: list[dict[str, Any]]) -> dict[str, Any] | None:
    """A single-draw gradient mode (full, bpda) leaving accuracy more than MASKING_TOLERANCE above an
    EOT mode (eot, bpda+eot) of the same attack, K and epsilon; None when no point has both."""
    by_point: dict[tuple, dict[str, float]] = {}
    for r in records:
        by_point.setdefault((r["attack"], r["refine_steps"], r["epsilon"]), {})[r["grad_mode"]] = r["robust_accuracy"]
    compared, masked, points = False, [], []
    for (attack, k, eps), accs in sorted(by_point.items()):
        eot = {m: a for m, a in accs.items() if m in EOT_MODES}
        if not eot or not any(m in accs for m in SINGLE_DRAW_MODES):
            continue
        compared = True
        best_mode = min(eot, key=eot.get)
        beaten = [m for m in SINGLE_DRAW_MODES if m in accs and accs[m] > eot[best_mode] + MASKING_TOLERANCE]
        masked += [f"{attack} K={k} eps={eps:g} ({m} {accs[m]:.3f} > {best_mode} {eot[best_mode]:.3f})" for m in beaten]
        points += [{"attack": attack, "refine_steps": k, "epsilon": eps, "grad_mode": m} for m in beaten]
    if not compared:
        return None
    text = (f"no single-draw gradient mode (full, bpda) is beaten by EOT by more than {MASKING_TOLERANCE}"
            if not masked else "EOT gradients beat single-draw ones (gradient masking by the refinement's "
            "randomness: report the EOT number) at " + ", ".join(masked))
    return _check("eot_not_beating_single_draw", not masked, text, points=points)


def _check(name: str, passed: bool, text: str, points: list[dict[str, Any]] | None = None) -> dict[str, Any]:
    """A check; ``points``: where a failed cross-run check applies (the records it flags)."""
    return {"check": name, "passed": bool(passed), "message": f"{'check ok' if passed else 'WARNING'}: {text}",
            **({"points": points} if points else {})}


# -- flags: the records a report must not read as robustness ---------------------------------------
#: flag texts (a record's ``flags`` lists the ones that apply)
NO_EOT = "stochastic defence attacked without EOT (a single-draw gradient)"
NOT_CONVERGED = "attack not converged"
#: failed checks that flag nothing, by whether the defence draws noise at the record's K: the convergence
#: check has its own flag, and a noisy defence's accuracy at epsilon 0 differs from its clean accuracy by the
#: re-check's fresh noise (the check's message says so)
NOT_A_FLAW = {False: ("attack_converged",), True: ("attack_converged", "epsilon0_equals_clean")}


def record_flags(records: list[dict[str, Any]], checks: list[dict[str, Any]],
                 stochastic_ks: list[int]) -> None:
    """Each record's ``flags``: a single-draw white-box gradient (full, bpda) at a K whose refinement
    draws noise; every failed check of its curve or point ("failed check: <name>", except
    :data:`NOT_A_FLAW`); a sweep that has not converged. An empty list: nothing known against it."""
    for r in records:
        flags = []
        if r["refine_steps"] in stochastic_ks and r["grad_mode"] in SINGLE_DRAW_MODES and not r.get("gradient_free"):
            flags.append(NO_EOT)
        for c in checks:
            if not c.get("passed") and c.get("check") not in NOT_A_FLAW[r["refine_steps"] in stochastic_ks] \
                    and _applies(c, r):
                flags.append(f"failed check: {c['check']}")
        if r.get("converged") is False:
            flags.append(NOT_CONVERGED)
        r["flags"] = list(dict.fromkeys(flags))


def _applies(check: dict[str, Any], record: dict[str, Any]) -> bool:
    """Whether a failed check concerns the record: its curve (attack, K, grad mode) or one of its points."""
    if "points" in check:
        return not record.get("gradient_free") and any(all(record.get(k) == v for k, v in p.items())
                                                       for p in check["points"])
    where = [k for k in ("attack", "refine_steps", "grad_mode") if k in check]
    return bool(where) and all(record.get(k) == check[k] for k in where)
