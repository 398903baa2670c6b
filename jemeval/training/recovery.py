"""Divergence never crashes a run: it is detected (:mod:`.divergence`), then rolled back.

:func:`check` raises :class:`~.divergence.Divergence` when any rank's monitor saw one (all ranks
decide together, so none waits for a rank that rolled back). :func:`recover` rolls back to last.pt,
reseeds and climbs the authors' ladder of remedies (:class:`~.divergence.RecoveryPolicy`), logging
each attempt; when ``max_recoveries`` is spent it raises :class:`~jemeval.errors.TrainingDiverged`
with one line saying what to try.
"""
from __future__ import annotations

import torch

from jemeval.errors import TrainingDiverged
from jemeval.formats.native import read_checkpoint
from jemeval.training import ddp
from jemeval.training.checkpointing import restore, save_last
from jemeval.training.divergence import Divergence, DivergenceMonitor
from jemeval.training.parts import Parts, effective_config, make_step, seed_everything
from jemeval.training.reporting import Reporter
from jemeval.training.runstate import Progress
from jemeval.training.schedule import run_rate
from jemeval.training.step import TrainStep


def check(monitor: DivergenceMonitor, step: int, device: torch.device) -> None:
    """The divergence check, decided by all ranks together: if any rank diverged, all roll back."""
    try:
        monitor.check()
        local = None
    except Divergence as div:
        local = div
    if ddp.any_rank(local is not None, device) and local is None:
        local = Divergence("divergence detected on another process", step)
    if local is not None:
        raise local


def check_validation(val_acc: float | None, best: tuple[float | None, int | None], max_drop: float, step: int,
                     device: torch.device) -> None:
    """An epoch whose validation accuracy fell more than ``max_drop`` below the best so far (``best``:
    accuracy, epoch) diverged too: JEM's energies can run away within one epoch without crossing the
    per-iteration thresholds (seen on digits with the first ``recipe="fast"``, seed 4: 0.95 -> 0.33 in one epoch),
    and such a state must never be saved as last.pt, the state every rollback returns to. Decided by
    all ranks together, like :func:`check`."""
    best_acc, best_epoch = best
    collapsed = val_acc is not None and best_acc is not None and best_acc - val_acc > max_drop
    if ddp.any_rank(collapsed, device):
        if not collapsed:
            raise Divergence("validation accuracy collapsed on another process", step)
        raise Divergence(f"validation accuracy {val_acc:.4f} is more than {max_drop:g} below the best "
                         f"({best_acc:.4f}, epoch {best_epoch})", step)


def recover(div: Divergence, parts: Parts, progress: Progress, report: Reporter) -> TrainStep:
    """Roll back to last.pt and apply the next rung of the ladder; returns the iteration rebuilt
    with the new settings (raises :class:`TrainingDiverged` when the budget is spent)."""
    cfg = parts.config
    attempt = progress.recoveries + 1
    where = f"epoch {progress.epoch + 1}, step {div.step}"
    _event(report, parts, progress, f"diverged at {where}: {div.reason}", step=div.step)
    last = parts.out / "last.pt"
    if attempt > cfg.max_recoveries:
        report.event(f"gave up: recovery budget of {cfg.max_recoveries} spent", epoch=progress.epoch + 1,
                     step=div.step, echo=False)
        report.write_metrics()
        raise TrainingDiverged(
            f"training diverged at {where} ({div.reason}) and the recovery budget is spent "
            f"({cfg.max_recoveries} rollbacks); last good state: {str(last)!r}; try a smaller lr, "
            "more sgld_steps, energy_l2=0.1 or a larger max_recoveries")
    restore(parts, progress, read_checkpoint(last), last, keep_history=True)
    progress.adjustments, changes = parts.policy.apply(attempt, progress.adjustments, cfg)
    progress.recoveries = attempt
    seed_everything(parts.generator, progress.adjustments.seed, parts.ctx)
    step = make_step(parts, progress.adjustments)
    _event(report, parts, progress, f"recovered (attempt {attempt}/{cfg.max_recoveries}): rollback to epoch "
           f"{progress.epoch} (step {progress.step}), {', '.join(changes)}", step=progress.step)
    save_last(parts, progress, report.metrics)
    report.write_metrics()
    return step


def _event(report: Reporter, parts: Parts, progress: Progress, text: str, *, step: int) -> None:
    """An event row with the learning rate and SGLD steps in force, and the line on stderr."""
    lr = run_rate(parts.config, progress.step, progress.epoch, progress.adjustments.lr_scale)
    sgld_steps = effective_config(parts.config, progress.adjustments).sgld_steps
    report.event(text, epoch=progress.epoch + 1, step=step, lr=lr, sgld_steps=sgld_steps)
