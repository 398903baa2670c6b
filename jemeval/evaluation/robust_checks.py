"""The adaptive-defence checklist (Carlini et al. 2019; Tramer et al. 2020) run on ``robust`` records.

Each (attack, K, gradient mode) curve is checked: accuracy at epsilon 0 equals clean accuracy,
accuracy does not increase with epsilon, and without refinement (K = 0) a white-box attack brings
accuracy near zero at the largest epsilon. Across attacks, a gradient-free attack must not beat the
white-box one at the same K and epsilon (a sign of obfuscated gradients). Every check is a dict with
``check``, ``passed`` and a ``message`` ("check ok: ..." or "WARNING: ...").
"""
from __future__ import annotations

import math
from typing import Any

#: K = 0 robust accuracy at the largest epsilon above this is flagged (the attack may be too weak)
LARGE_EPSILON_MAX_ACCURACY = 0.1
#: a gradient-free attack beating the white-box one by more than this is flagged
OBFUSCATION_TOLERANCE = 0.02


def sanity_checks(records: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The checks printed with the results; each a dict with check, passed, message."""
    groups: dict[tuple, list[dict]] = {}
    for r in records:
        groups.setdefault((r["attack"], r["refine_steps"], r["grad_mode"]), []).append(r)
    checks: list[dict[str, Any]] = []
    for (attack, k, mode), rows in groups.items():
        rows = sorted(rows, key=lambda r: r["epsilon"])
        where = {"attack": attack, "refine_steps": k, "grad_mode": mode}
        label = f"{attack} K={k} {mode}"
        checks += [{"check": c["check"], **where, "passed": c["passed"], "message": c["message"]}
                   for c in curve_checks(label, k, rows)]
    obfuscation = obfuscation_check(records)
    return checks + ([obfuscation] if obfuscation else [])


def curve_checks(label: str, k: int, rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
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
    return out


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
    return _check("white_box_beats_gradient_free", not beaten,
                  "no gradient-free attack beats the white-box attack" if not beaten else
                  "a gradient-free attack beats the white-box one (a sign of obfuscated gradients) at "
                  + ", ".join(f"K={k} eps={e:g} ({f:.3f} < {w:.3f})" for k, e, f, w in beaten))


def _check(name: str, passed: bool, text: str) -> dict[str, Any]:
    return {"check": name, "passed": bool(passed), "message": f"{'check ok' if passed else 'WARNING'}: {text}"}
