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

A sweep (``eot_samples`` or ``steps`` given as a list) adds one more item: an attack that has not
converged in its EOT samples or iterations overstates robustness, and nothing else in the record
says so. :func:`convergence` gives every (attack, K, grad mode, epsilon) curve its verdict: not
converged while robust accuracy still drops by more than its Wilson half-width between the last two
counts (``attack_converged``); the other checks then judge the sweep's last counts, the numbers it
reports (:func:`final_records`).
"""
from __future__ import annotations

import math
from typing import Any

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
    chance level quoted in the messages; ``verdicts`` (:func:`convergence`, a sweep's) add the
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
    return _check("white_box_beats_gradient_free", not beaten,
                  "no gradient-free attack beats the white-box attack" if not beaten else
                  "a gradient-free attack beats the white-box one (a sign of obfuscated gradients) at "
                  + ", ".join(f"K={k} eps={e:g} ({f:.3f} < {w:.3f})" for k, e, f, w in beaten))


def masking_check(records: list[dict[str, Any]]) -> dict[str, Any] | None:
    """A single-draw gradient mode (full, bpda) leaving accuracy more than MASKING_TOLERANCE above an
    EOT mode (eot, bpda+eot) of the same attack, K and epsilon; None when no point has both."""
    by_point: dict[tuple, dict[str, float]] = {}
    for r in records:
        by_point.setdefault((r["attack"], r["refine_steps"], r["epsilon"]), {})[r["grad_mode"]] = r["robust_accuracy"]
    compared, masked = False, []
    for (attack, k, eps), accs in sorted(by_point.items()):
        eot = {m: a for m, a in accs.items() if m in EOT_MODES}
        if not eot or not any(m in accs for m in SINGLE_DRAW_MODES):
            continue
        compared = True
        best_mode = min(eot, key=eot.get)
        masked += [f"{attack} K={k} eps={eps:g} ({m} {accs[m]:.3f} > {best_mode} {eot[best_mode]:.3f})"
                   for m in SINGLE_DRAW_MODES if m in accs and accs[m] > eot[best_mode] + MASKING_TOLERANCE]
    if not compared:
        return None
    return _check("eot_not_beating_single_draw", not masked,
                  "no single-draw gradient mode (full, bpda) is beaten by EOT by more than "
                  f"{MASKING_TOLERANCE}" if not masked else
                  "EOT gradients beat single-draw ones (gradient masking by the refinement's randomness: report "
                  "the EOT number) at " + ", ".join(masked))


def _check(name: str, passed: bool, text: str) -> dict[str, Any]:
    return {"check": name, "passed": bool(passed), "message": f"{'check ok' if passed else 'WARNING'}: {text}"}


# -- convergence of a sweep (eot_samples or steps given as a list) ----------------------------------
#: what a message calls the counts of each swept axis
SWEEP_AXES = {"eot_samples": "EOT samples", "steps": "attack steps"}
DETERMINISTIC = "the defence is deterministic at K={k} (no chain or SGLD noise), so every EOT count is the same " \
                "attack: converged"


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


def convergence(records: list[dict[str, Any]], *, swept: list[str],
                deterministic_ks: list[int] = ()) -> list[dict[str, Any]]:
    """One verdict per (attack, K, grad mode, epsilon) curve and swept axis (``eot_samples``,
    ``steps``), along that axis at the other's largest count: ``converged`` is False while robust
    accuracy drops from the second-last count to the last by more than the last one's Wilson
    half-width ((ci_high - ci_low) / 2: a drop the n inputs cannot put down to chance), else True;
    True without measuring for EOT at a K in ``deterministic_ks`` (no noise: every count is the same
    attack); None where the axis does not apply (a single-draw or gradient-free run, an attack
    without a steps setting)."""
    groups: dict[tuple, list[dict]] = {}
    for r in records:
        groups.setdefault((r["attack"], r["refine_steps"], r["grad_mode"], r["epsilon"]), []).append(r)
    verdicts = []
    for axis in swept:
        other = "steps" if axis == "eot_samples" else "eot_samples"
        for curve, rows in groups.items():
            top = max(r.get(other) or 0 for r in rows)
            rows = sorted((r for r in rows if (r.get(other) or 0) == top), key=lambda r: r.get(axis) or 0)
            verdicts.append(axis_verdict(axis, curve, rows, deterministic=curve[1] in deterministic_ks))
    return verdicts


def axis_verdict(axis: str, curve: tuple, rows: list[dict[str, Any]], *, deterministic: bool) -> dict[str, Any]:
    """The verdict of one curve along one axis (rows sorted by that axis's count)."""
    attack, k, mode, eps = curve
    label = f"{attack} K={k} {mode} eps={eps:g}"
    out = {"attack": attack, "refine_steps": k, "grad_mode": mode, "epsilon": eps, "axis": axis,
           "counts": [r.get(axis) for r in rows], "robust_accuracy": [r["robust_accuracy"] for r in rows],
           "half_width": None, "converged": None, "message": None}
    if len(rows) >= 2:
        (a, b), (before, last) = [r[axis] for r in rows[-2:]], [r["robust_accuracy"] for r in rows[-2:]]
        half = (rows[-1]["ci_high"] - rows[-1]["ci_low"]) / 2
        ok = before - last <= half
        out.update(half_width=half, converged=ok, message=(
            f"{label}: {before:.3f} -> {last:.3f} from {a} to {b} {SWEEP_AXES[axis]}, "
            + (f"within the {half:.3f} half-width: converged" if ok else
               f"more than the {half:.3f} half-width: not converged")))
    elif axis == "eot_samples" and deterministic:
        out.update(converged=True, message=f"{label}: {DETERMINISTIC.format(k=k)}")
    return out


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
    every curve that still drops, with its two numbers."""
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
        checks.append({**_check("attack_converged", not bad, text), **where})
    return checks


def converged_text(label: str, vs: list[dict[str, Any]]) -> str:
    """The message of a curve set that converged at every epsilon."""
    if vs[0]["half_width"] is None:
        return f"{label}: {DETERMINISTIC.format(k=vs[0]['refine_steps'])}"
    a, b = vs[0]["counts"][-2:]
    points = ", ".join(f"eps={v['epsilon']:g} {v['robust_accuracy'][-2]:.3f} -> {v['robust_accuracy'][-1]:.3f}"
                       for v in vs)
    return (f"{label}: converged from {a} to {b} {SWEEP_AXES[vs[0]['axis']]}, every drop within its Wilson "
            f"half-width ({points})")
