"""Which images each iteration trains on: the epoch's order, this rank's batch, the labelled cycle.

An epoch is ``n // batch_size`` iterations over a (seed, epoch) permutation of the training set,
the same on every rank and dealt out (:func:`jemeval.runtime.distributed.shard_indices`), so the
ranks' b-th batches together are the single-process run's b-th batch. In a semi-supervised run
(``labels_per_class``) the p(x) term takes that batch and the cross-entropy cycles through seeded
permutations of the labelled images instead. Positions live in :class:`~.progress.Progress`, so
a resume continues mid-epoch with the same images.
"""
from __future__ import annotations

import torch

from jemeval.runtime import distributed as D
from jemeval.runtime.distributed import DistContext
from jemeval.training.progress import Progress
from jemeval.training.splits import TrainingData


def batch_plan(n: int, batch_size: int, world_size: int) -> tuple[int, int]:
    """(iterations per epoch, this rank's batch): n // global batch iterations, the global batch
    split evenly over the ranks."""
    bs = min(batch_size, n)
    return n // bs, bs // world_size


def epoch_order(progress: Progress, n: int, ctx: DistContext, seed: int, device: torch.device) -> torch.Tensor:
    """This rank's order of the epoch in progress (drawn once per epoch, kept for a resume)."""
    if progress.perm is None:
        progress.perm = D.shard_indices(n, ctx.rank, ctx.world_size, seed, progress.epoch).to(device)
    return progress.perm


def next_labelled(progress: Progress, labelled: torch.Tensor, n: int, generator: torch.Generator) -> torch.Tensor:
    """The next ``n`` labelled indices, cycling through seeded permutations of the labelled set."""
    chunks, need = [], n
    total = len(labelled)
    while need > 0:
        if progress.lab_perm is None or progress.lab_pos >= total:
            progress.lab_perm = torch.randperm(total, generator=generator, device=generator.device)
            progress.lab_pos = 0
        take = min(need, total - progress.lab_pos)
        chunks.append(progress.lab_perm[progress.lab_pos:progress.lab_pos + take])
        progress.lab_pos += take
        need -= take
    return labelled[torch.cat(chunks).to(labelled.device)]


def batch(data: TrainingData, progress: Progress, b: int, size: int, generator: torch.Generator,
          device: torch.device) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
    """(labelled images, their labels, the p(x) images or None when they are the labelled ones)
    of iteration ``b`` of the epoch, on ``device``."""
    idx = progress.perm[b * size:(b + 1) * size].to(data.x.device)
    if data.labelled is None:
        x_lab, y_lab, x_data = data.x[idx], data.y[idx], None
    else:
        lab = next_labelled(progress, data.labelled, size, generator)
        x_lab, y_lab, x_data = data.x[lab], data.y[lab], data.x[idx].to(device, non_blocking=True)
    return x_lab.to(device, non_blocking=True), y_lab.to(device, non_blocking=True), x_data
