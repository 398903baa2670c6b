"""robust's counts, checked before anything runs: each within its ceiling, the passes they make per
input, and the copies a forward pass holds at once (:mod:`jemeval.evaluation.limits`)."""
from __future__ import annotations

from collections.abc import Iterable, Sequence

import numpy as np

from jemeval.errors import UsageError
from jemeval.evaluation.limits import check_count, check_memory, check_passes
from jemeval.evaluation.robust.attack_loop import Batches, Defence, Run, native_eot
from jemeval.sampling.refinement import EOT_MODES

#: robust's counts and the ceiling each is held to (:data:`jemeval.evaluation.limits.CEILINGS`)
COUNT_KINDS = {"steps": "attack_steps", "eot_samples": "eot_samples", "restarts": "restarts", "chains": "chains",
               "draws": "draws"}


def check_counts(param: str, value: int | Sequence[int] | None) -> list[int] | None:
    """A count (``eot_samples``, ``steps``) or a sweep of them: whole numbers >= 1 within their
    ceiling (:mod:`jemeval.evaluation.limits`), distinct, in increasing order (a sweep's verdict
    compares its last two). None stays None."""
    if value is None:
        return None
    counts = list(value) if isinstance(value, Iterable) and not isinstance(value, (str, bytes)) else [value]
    if not counts:
        raise UsageError(f"{param} is empty; give a count or a list such as 1,5,10,20", param=param)
    for c in counts:
        try:
            whole = int(c) == c and int(c) >= 1
        except (TypeError, ValueError, OverflowError):
            whole = False
        if not whole:
            raise UsageError(f"{param} must be whole numbers >= 1 (a count, or a list such as 1,5,10,20), got {c!r}",
                             param=param)
        check_count(param, c, COUNT_KINDS.get(param, param))
    return sorted({int(c) for c in counts})


def check_sweep(eot_samples, steps) -> dict[str, list[int] | None]:
    """The counts: ``eot_samples`` as a list (one count, or a sweep), ``steps`` as a list when given
    as one (a sweep), else None: a single ``steps`` goes to the attacks as it always did."""
    return {"eot_samples": check_counts("eot_samples", eot_samples),
            "steps": None if steps is None or isinstance(steps, (int, np.integer)) else check_counts("steps", steps)}


def check_robust_counts(ks: Sequence[int], modes: Sequence[str], *, chains: int, restarts: int | None,
                        eot_samples, steps) -> dict[str, list[int] | None]:
    """The counts (:func:`check_sweep`, returned), ``restarts`` and a single ``steps`` within their
    ceilings, and the forward-and-backward passes one attack spends on one input at one epsilon, at
    most restarts x steps x EOT samples x (K x chains + 1), within theirs
    (:func:`~jemeval.evaluation.limits.check_passes`; counts an attack's own defaults set are not
    known here and count as 1)."""
    sweep = check_sweep(eot_samples, steps)
    if restarts is not None:
        check_count("restarts", restarts)
    if steps is not None and sweep["steps"] is None:
        check_count("steps", steps, "attack_steps")
    most_steps = max(sweep["steps"] or [steps or 1])
    eot = max(sweep["eot_samples"]) if any(m in EOT_MODES for m in modes) else 1
    k = max(ks)
    check_passes("steps", (restarts or 1) * most_steps * eot * (k * int(chains) + 1),
                 f"restarts {restarts or 1} x steps {most_steps} x eot_samples {eot} x (refine_steps {k} x chains "
                 f"{int(chains)} + 1)")
    return sweep


def check_defence_memory(defence: Defence, runs: list[Run], inputs: Batches) -> list[Run]:
    """The copies the refined classifier holds at once (batch x chains x the EOT samples a run draws
    in one forward, :func:`~jemeval.evaluation.limits.check_memory`) fit the device: checked per
    planned run before the first attack. Returns ``runs``."""
    batch = min(inputs.batch_size, len(inputs.x))
    refined = [r for r in runs if r.refine_steps > 0 or defence.chain_sigma > 0]
    if not refined or not batch:
        return runs
    eot = max((defence.eot_samples if r.grad_mode in EOT_MODES and not native_eot(r) else 1) for r in refined)
    check_memory("chains", [("batch_size", batch), ("chains", defence.chains), ("eot_samples", eot)],
                 inputs.x.shape[1:], inputs.x.device)
    return runs
