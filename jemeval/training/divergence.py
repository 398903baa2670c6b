"""Divergence: detect it from the iteration statistics, and decide how to recover.

JEM training is known to diverge (a chain with atypically high energy produces huge gradients);
the release simply crashes when |loss| > 1e8 and the authors recovered by hand: restart from the
last checkpoint with another seed, then lower the learning rate, then more SGLD steps (20 -> 40),
then an L2 penalty (~0.1) on the energies. :class:`RecoveryPolicy` automates exactly that ladder;
:class:`DivergenceMonitor` decides when it is needed.

Detection, checked every ``check_every`` iterations (one host synchronisation for the whole window):
* a non-finite loss or energy;
* |loss| > ``max_abs_loss`` (the release's 1e8);
* any |E(x)| of data or samples > ``max_abs_energy`` (energies exploding);
* the gap mean E(samples) - mean E(data) outside +-``energy_gap_band`` for more than
  ``gap_patience`` consecutive iterations (in stable PCD training it oscillates around 0);
* at every epoch end, before last.pt is written: a validation accuracy more than ``max_val_drop``
  below the best so far (:func:`check_validation`).

Under DDP every rank decides together (:func:`check`, :func:`check_validation`), so none waits for a
rank that rolled back. The rollback itself is the trainer's (:meth:`.trainer.Trainer._roll_back`).
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

import torch

from jemeval.training import ddp


class Divergence(Exception):
    """Raised inside the epoch loop when the monitor sees a divergence (caught by the trainer, which
    rolls back to last.pt and climbs the :class:`RecoveryPolicy` ladder)."""

    def __init__(self, reason: str, step: int) -> None:
        super().__init__(reason)
        self.reason = reason
        self.step = step


@dataclass
class DivergenceMonitor:
    max_abs_loss: float = 1e8
    max_abs_energy: float = 1e5
    energy_gap_band: float = 1e3
    gap_patience: int = 20
    _pending: list[tuple[int, torch.Tensor]] = field(default_factory=list, repr=False)
    _outside: int = 0

    def record(self, step: int, stats: dict[str, torch.Tensor]) -> None:
        """Keep one iteration's statistics (device tensors; no synchronisation)."""
        gap = stats["e_sample"].float() - stats["e_data"].float()
        row = torch.stack([stats["loss"].float(), stats["abs_energy"].float(), gap])
        self._pending.append((step, row))

    def reset(self) -> None:
        self._pending.clear()
        self._outside = 0

    def check(self) -> None:
        """Examine the pending iterations in order; raise :class:`Divergence` at the first bad one."""
        if not self._pending:
            return
        steps = [s for s, _ in self._pending]
        rows = torch.stack([r for _, r in self._pending]).cpu().tolist()
        self._pending.clear()
        for step, (loss, abs_energy, gap) in zip(steps, rows):
            if not math.isfinite(loss):
                raise Divergence(f"non-finite loss ({loss})", step)
            if not math.isfinite(abs_energy):
                raise Divergence("non-finite energy", step)
            if abs(loss) > self.max_abs_loss:
                raise Divergence(f"|loss| {abs(loss):.3g} > {self.max_abs_loss:.3g}", step)
            if abs_energy > self.max_abs_energy:
                raise Divergence(f"energy magnitude {abs_energy:.3g} > {self.max_abs_energy:.3g}", step)
            if math.isnan(gap):  # no negatives (plain classifier)
                continue
            if abs(gap) > self.energy_gap_band:
                self._outside += 1
                if self._outside > self.gap_patience:
                    raise Divergence(f"energy gap E(samples) - E(data) = {gap:.3g} outside "
                                     f"+-{self.energy_gap_band:.3g} for {self._outside} iterations", step)
            else:
                self._outside = 0


@dataclass
class Adjustments:
    """What recovery has changed so far (persisted in the checkpoint so a resume keeps it)."""

    lr_scale: float = 1.0
    sgld_steps: int | None = None  # None: the configured number
    energy_l2: float | None = None  # None: the configured penalty
    seed: int | None = None  # None: the configured seed

    def as_dict(self) -> dict:
        return {"lr_scale": self.lr_scale, "sgld_steps": self.sgld_steps, "energy_l2": self.energy_l2,
                "seed": self.seed}

    @classmethod
    def from_dict(cls, d: dict | None) -> Adjustments:
        return cls(**(d or {}))

    def applied_to(self, config: Any) -> Any:
        """``config`` (a :class:`~.config.TrainConfig`) with these adjustments in force: what is
        actually running (the learning rate's scale is applied by the schedule itself)."""
        changes: dict[str, Any] = {}
        if self.sgld_steps is not None:
            changes["sgld_steps"] = self.sgld_steps
        if self.energy_l2 is not None:
            changes["energy_l2"] = self.energy_l2
        return config.replace(**changes) if changes else config


@dataclass
class RecoveryPolicy:
    """The authors' ladder, one rung per attempt (attempt numbers start at 1).

    1: roll back + reseed; 2: + halve the learning rate; 3: + double the SGLD steps;
    4: + energy L2 penalty of at least 0.1; 5 and later: halve the learning rate again.
    Every attempt rolls back to the last good checkpoint and reseeds.
    """

    base_seed: int
    sampling: bool = True

    def seed_for(self, attempt: int) -> int:
        return self.base_seed + 1000 * attempt + 1

    def apply(self, attempt: int, adj: Adjustments, config) -> tuple[Adjustments, list[str]]:
        changes: list[str] = []
        new = Adjustments(**adj.as_dict())
        new.seed = self.seed_for(attempt)
        changes.append(f"reseed {new.seed}")
        rung = attempt if self.sampling else (1 if attempt == 1 else 2)
        if rung == 2 or rung >= 5:
            new.lr_scale = adj.lr_scale * 0.5
            changes.append(f"lr {config.lr * new.lr_scale:.3g}")
        elif rung == 3:
            new.sgld_steps = 2 * (adj.sgld_steps or config.sgld_steps)
            changes.append(f"sgld_steps {new.sgld_steps}")
        elif rung == 4:
            new.energy_l2 = max(0.1, adj.energy_l2 if adj.energy_l2 is not None else config.energy_l2)
            changes.append(f"energy_l2 {new.energy_l2:g}")
        return new, changes


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
