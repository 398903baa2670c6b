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
