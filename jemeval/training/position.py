"""Where a run stands: the :class:`RunPosition` (epoch, batch, step, best epoch, recoveries, the data
positions) and the :class:`EpochStats` of the epoch in progress.

Plain state, changed by the loop and read by the modules around it: :mod:`.splits` moves the data
positions, :mod:`.reporting` shows the statistics, :mod:`.checkpointing` saves and restores the whole
of it in last.pt. It sits below all three (it imports none of them), so their imports run one way.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import torch

from jemeval.runtime import distributed as D
from jemeval.training import ddp
from jemeval.training.divergence import Adjustments

STAT_KEYS = ("loss", "pyx", "px", "pxy", "l2", "e_data", "e_sample", "correct")


class EpochStats:
    """Running sums of one epoch's iteration statistics, kept on the device (no per-iteration sync)."""

    def __init__(self, device: torch.device, saved: dict | None = None) -> None:
        self.sums = torch.zeros(len(STAT_KEYS), dtype=torch.float32, device=device)
        self.iterations = 0
        self.images = 0  # labelled images seen (a host counter: batch sizes are known)
        self.seconds = 0.0
        if saved:
            self.sums = torch.tensor([saved["sums"][k] for k in STAT_KEYS], dtype=torch.float32, device=device)
            self.iterations, self.images = int(saved["iterations"]), int(saved["images"])
            self.seconds = float(saved["seconds"])

    def add(self, stats: dict[str, torch.Tensor], images: int) -> None:
        self.sums += torch.stack([stats[k].float() for k in STAT_KEYS])
        self.iterations += 1
        self.images += images

    def means(self, *, pooled: bool = False) -> dict[str, float]:
        """Per-iteration means and the training accuracy; ``pooled`` averages over every rank
        (a collective under DDP: every rank must call it) and counts every rank's images."""
        sums, images = ddp.reduce_sums(self.sums, self.images) if pooled else (self.sums, self.images)
        values = dict(zip(STAT_KEYS, sums.cpu().tolist()))
        world = D.dist.get_world_size() if pooled and D.active() else 1
        it = max(self.iterations, 1) * world
        out = {k: values[k] / it for k in ("loss", "pyx", "px", "pxy", "l2", "e_data", "e_sample")}
        out["train_acc"] = values["correct"] / images if images else float("nan")
        out["images"] = images
        return out

    def state(self) -> dict:
        return {"sums": dict(zip(STAT_KEYS, self.sums.cpu().tolist())), "iterations": self.iterations,
                "images": self.images, "seconds": self.seconds}


@dataclass
class RunPosition:
    """Where the run stands: everything that changes while training (the other parts are built once,
    :mod:`.parts`). Saved whole in last.pt, so a resumed run continues exactly where it stopped."""

    stats: EpochStats  # the epoch in progress
    epoch: int = 0  # completed epochs
    batch: int = 0  # iterations done in the current epoch
    step: int = 0  # global iteration counter
    perm: torch.Tensor | None = None  # this rank's order of the epoch's images (None: not drawn yet)
    lab_perm: torch.Tensor | None = None  # the current cycle through the labelled images (semi-supervised)
    lab_pos: int = 0  # position in that cycle
    best_val_acc: float | None = None
    best_epoch: int | None = None
    recoveries: int = 0
    adjustments: Adjustments = field(default_factory=Adjustments)
    elapsed: float = 0.0  # training seconds over every session of the run

    def next_epoch(self) -> None:
        """Count the epoch in progress as done; the next one draws a new order and new sums."""
        self.epoch += 1
        self.batch = 0
        self.perm = None
        self.stats = EpochStats(self.stats.sums.device)
