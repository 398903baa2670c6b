"""The learning-rate schedule of the JEM release as a pure function of (step, epoch).

Linear warm-up over the first ``warmup_iters`` iterations (lr * (step + 1) / warmup_iters), then the
base rate multiplied by ``decay_rate`` once for every decay epoch already reached. Being a function
of the counters only, it needs no scheduler state: a resumed run gets exactly the same rates.
``scale`` carries the reductions made by divergence recovery.
"""
from __future__ import annotations

from collections.abc import Sequence


def learning_rate(base_lr: float, step: int, epoch: int, *, warmup_iters: int = 0,
                  decay_epochs: Sequence[int] = (), decay_rate: float = 1.0, scale: float = 1.0) -> float:
    """The rate for iteration ``step`` (0-based, global) in ``epoch`` (0-based)."""
    lr = base_lr * scale * decay_rate ** sum(1 for e in decay_epochs if epoch >= e)
    if step < warmup_iters:
        lr *= (step + 1) / float(warmup_iters)
    return lr


def run_rate(config, step: int, epoch: int, scale: float = 1.0) -> float:
    """:func:`learning_rate` with a :class:`~.config.TrainConfig`'s settings (``scale``: recovery's)."""
    return learning_rate(config.lr, step, epoch, warmup_iters=config.warmup_iters, decay_epochs=config.decay_epochs,
                         decay_rate=config.decay_rate, scale=scale)


def schedule_warning(config, per_epoch: int) -> str | None:
    """One line naming what in ``config``'s schedule cannot happen in a run of ``per_epoch``
    iterations an epoch, or None: a warm-up longer than the run (the lr never reaches ``lr``), a
    decay at or after the last epoch (it never happens), a decay before the warm-up ends. Such a
    run still trains, at rates its settings do not say, so the trainer says it once at the start."""
    total, epochs, warmup = per_epoch * config.epochs, config.epochs, config.warmup_iters
    problems = []
    if warmup > total:
        end = run_rate(config, total - 1, epochs - 1)
        problems.append(f"the warm-up (warmup_iters={warmup}) is longer than the run ({total} iterations: {epochs} "
                        f"epochs of {per_epoch}), so the lr never reaches lr={config.lr:g} (it ends at {end:.2g})")
    late = [e for e in config.decay_epochs if e >= epochs]
    if late:
        one = len(late) == 1
        problems.append(f"decay_epochs {', '.join(map(str, late))} {'is' if one else 'are'} not before the last epoch "
                        f"(epochs={epochs}), so {'that decay never happens' if one else 'those decays never happen'}")
    first = min((e for e in config.decay_epochs if e < epochs), default=None)
    if first is not None and warmup <= total and warmup > first * per_epoch:
        problems.append(f"the first decay (epoch {first}, iteration {first * per_epoch}) comes before the warm-up of "
                        f"{warmup} iterations ends, so the lr never reaches lr={config.lr:g}")
    if not problems:
        return None
    return (f"warning: this schedule cannot complete: {'; '.join(problems)}; set warmup_iters/decay_epochs to fit, or "
            "leave them unset on a dataset without defaults of its own to derive them from its size")
