"""last.pt and best.pt: what a run saves, and how a resume or a rollback puts it back.

``last.pt`` holds everything a resume needs: weights, optimizer, the replay buffer (every rank's
chains, in rank order), counters, every random state (one per rank under DDP), the metrics rows and
the recovery adjustments, in the plain-data layout of :mod:`jemeval.formats.native` (it loads with
``weights_only=True``). ``best.pt`` is the same model file without the training state. Rank 0
writes; saving is a collective under DDP (every rank joins the gathers, then waits for the file).
Weights come back through :func:`jemeval.formats.native.load_state`, which refuses non-finite values.
"""
from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

from jemeval.formats.native import load_state, save_checkpoint
from jemeval.provenance import provenance
from jemeval.runtime import distributed as D
from jemeval.training.divergence import Adjustments
from jemeval.training.feed import batch_plan
from jemeval.training.metrics_log import MetricsLog
from jemeval.training.parts import Parts, effective_config
from jemeval.training.runstate import EpochStats, Progress
from jemeval.training.state import capture_rng, restore_rng


def config_record(parts: Parts, progress: Progress) -> dict[str, Any]:
    """The full configuration as stored: effective SGLD settings, sigma, and resolved values."""
    config = parts.config
    record = config.to_dict()
    effective = effective_config(config, progress.adjustments)
    record["sgld"] = effective.sgld().settings()  # what sampling really uses (recovery may raise steps)
    record["effective"] = {"sgld_steps": effective.sgld_steps, "energy_l2": effective.energy_l2,
                           "lr_scale": progress.adjustments.lr_scale}
    record["resolved"] = {
        "device": str(parts.device), "fastpath": parts.fastpath.settings(),
        "augment": parts.augment.settings(), "data": parts.data.describe(),
        "world_size": parts.ctx.world_size, "backend": parts.ctx.backend,
        "per_rank_batch": batch_plan(len(parts.data.x), config.batch_size, parts.ctx.world_size)[1],
        "per_rank_buffer": None if parts.buffer is None else len(parts.buffer),
    }
    return record


def run_provenance(parts: Parts, progress: Progress, **training: Any) -> dict[str, Any]:
    record = provenance(command="train", device=parts.device, seed=parts.config.seed,
                        settings=config_record(parts, progress))
    record["training"] = {"epoch": progress.epoch, "step": progress.step, **training}
    return record


def _rank_state(parts: Parts, progress: Progress) -> dict[str, Any]:
    """What differs between ranks: data shard position, random streams, unreduced epoch sums."""
    return {
        "perm": None if progress.perm is None else progress.perm.cpu(),
        "lab_perm": None if progress.lab_perm is None else progress.lab_perm.cpu(), "lab_pos": progress.lab_pos,
        "rng": capture_rng(parts.generator),
        "epoch_stats": progress.stats.state() if progress.batch else None,
    }


def training_state(parts: Parts, progress: Progress, metrics: MetricsLog) -> dict[str, Any]:
    """Everything a resume needs (a collective under DDP: every rank's state is gathered)."""
    config = parts.config
    mine = _rank_state(parts, progress)
    ranks = D.gather_objects(mine)
    return {
        "epoch": progress.epoch, "batch": progress.batch, "step": progress.step,
        "world_size": parts.ctx.world_size,
        **mine,  # rank 0's (the whole state in a single process)
        "ranks": ranks if parts.ctx.distributed else None,
        "best_val_acc": progress.best_val_acc, "best_epoch": progress.best_epoch,
        "recoveries": progress.recoveries, "adjustments": progress.adjustments.as_dict(),
        "optimizer": parts.optimizer.state_dict(),
        "scheduler": {"kind": "linear warm-up + step decay", "base_lr": config.lr,
                      "warmup_iters": config.warmup_iters, "decay_epochs": list(config.decay_epochs),
                      "decay_rate": config.decay_rate, "lr_scale": progress.adjustments.lr_scale},
        "metrics": metrics.state(),
        "elapsed": progress.elapsed,
    }


def _gathered_buffer(parts: Parts) -> torch.Tensor | None:
    """The replay buffer to save: every rank's chains in rank order (a collective under DDP)."""
    return None if parts.buffer is None else D.all_gather_cat(parts.buffer.data)


def save_last(parts: Parts, progress: Progress, metrics: MetricsLog) -> Path:
    """Write last.pt (rank 0; every rank joins the gathers, then waits for the file)."""
    buffer, state = _gathered_buffer(parts), training_state(parts, progress, metrics)
    path = parts.out / "last.pt"
    if parts.ctx.is_main:
        save_checkpoint(path, parts.model, dataset=parts.config.dataset, replay_buffer=buffer,
                        training_state=state, config=config_record(parts, progress),
                        provenance=run_provenance(parts, progress, best_val_acc=progress.best_val_acc))
    D.barrier()
    return path


def save_best(parts: Parts, progress: Progress, val_acc: float | None, train_acc: float) -> Path:
    """Write best.pt (rank 0; a collective under DDP like :func:`save_last`)."""
    buffer = _gathered_buffer(parts)
    path = parts.out / "best.pt"
    if parts.ctx.is_main:
        save_checkpoint(path, parts.model, dataset=parts.config.dataset, replay_buffer=buffer,
                        config=config_record(parts, progress),
                        provenance=run_provenance(parts, progress, val_acc=val_acc, train_acc=train_acc))
    D.barrier()
    return path


def restore(parts: Parts, progress: Progress, checkpoint: dict, path: Path, *, keep_history: bool = False) -> None:
    """Load weights, optimizer, this rank's buffer chains, counters and random states from a
    last.pt of this run.

    ``keep_history`` (a rollback) keeps the recovery count and adjustments made since the
    checkpoint was written; a resume takes them from the checkpoint (and its metrics rows, see
    :func:`stored_metrics`).
    """
    ts = checkpoint["training_state"]
    mine = ts["ranks"][parts.ctx.rank] if ts.get("ranks") else ts
    load_state(parts.model, checkpoint["state_dict"], str(path))
    parts.optimizer.load_state_dict(ts["optimizer"])
    if parts.buffer is not None and checkpoint.get("replay_buffer") is not None:
        share = len(parts.buffer)
        chunk = checkpoint["replay_buffer"][parts.ctx.rank * share:(parts.ctx.rank + 1) * share]
        parts.buffer.data.copy_(chunk.to(parts.buffer.data.device))
    restore_rng(mine["rng"], parts.generator)
    where = parts.generator.device
    progress.epoch, progress.batch, progress.step = int(ts["epoch"]), int(ts["batch"]), int(ts["step"])
    progress.perm = None if mine["perm"] is None else mine["perm"].to(where)
    progress.lab_perm = None if mine["lab_perm"] is None else mine["lab_perm"].to(where)
    progress.lab_pos = int(mine["lab_pos"])
    progress.best_val_acc, progress.best_epoch = ts["best_val_acc"], ts["best_epoch"]
    progress.elapsed = float(ts.get("elapsed", 0.0))
    progress.stats = EpochStats(parts.device, mine.get("epoch_stats"))
    if not keep_history:
        progress.recoveries = int(ts["recoveries"])
        progress.adjustments = Adjustments.from_dict(ts["adjustments"])
    parts.monitor.reset()


def stored_metrics(checkpoint: dict) -> list[dict]:
    """The metrics.csv rows saved in a last.pt (metrics.csv is rewritten from them on a resume)."""
    return checkpoint["training_state"]["metrics"]
