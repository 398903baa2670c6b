"""What the trainer does differently under DistributedDataParallel (``torchrun``), in one place.

The generic utilities (process group, shards, per-rank streams, collectives) are in
:mod:`jemeval.runtime.distributed`; this module applies them to training.

The semantics (docs/training.md, "Several processes"):

* ``batch_size`` is the GLOBAL batch: each of the W ranks trains on batch_size / W images per
  iteration; DDP averages the gradients, so one optimizer step sees the same global batch as a
  single process (it must divide evenly).
* The epoch's order depends only on (seed, epoch) (:func:`jemeval.runtime.distributed.shard_indices`), the
  same permutation on every rank, dealt out: the union of the ranks' b-th batches is exactly the
  single-process run's b-th batch.
* Each rank keeps its own replay buffer of buffer_size // W chains and its own random stream
  (:func:`jemeval.runtime.distributed.rank_generator`, seeded once by :func:`.parts.seed_everything`):
  SGLD noise, buffer draws, augmentation and sigma noise differ between ranks (and from a single process).
* Metrics are averaged over ranks; rank 0 alone writes files and prints. Checkpoints hold the
  gathered buffer (rank order), every rank's random state and the world size, so a resume with the
  same number of processes continues exactly; another number is refused.
* Collective decisions (divergence, stop requests) are agreed on by all ranks so none hangs.
"""
from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
import torch.distributed as dist

from jemeval.errors import UsageError
from jemeval.runtime import distributed as D


def join(device: torch.device, global_batch: int) -> D.DistContext:
    """The launch's :class:`~jemeval.runtime.distributed.DistContext` (gloo on CPU, nccl on CUDA).

    A single process (no torchrun variables, or WORLD_SIZE=1) joins nothing.
    """
    ctx = D.join(device)
    check_global_batch(global_batch, ctx.world_size)
    return ctx


def check_global_batch(global_batch: int, world_size: int) -> None:
    """``batch_size`` is the global batch: it must split evenly over the processes (one line)."""
    if world_size > 1 and global_batch % world_size:
        m = world_size
        raise UsageError(f"batch_size={global_batch} is the global batch and must be divisible by the "
                         f"{m} processes: use a multiple of {m}, e.g. {max(m, global_batch - global_batch % m)}",
                         param="batch_size")


def batch_plan(n: int, batch_size: int, world_size: int) -> tuple[int, int]:
    """(iterations per epoch, this rank's batch): n // global batch iterations, the global batch
    split evenly over the ranks."""
    bs = min(batch_size, n)
    return n // bs, bs // world_size


def check_world(saved: int | None, ctx: D.DistContext, path: Any) -> None:
    """Refuse to resume a run written by a different number of processes (one line)."""
    saved = 1 if saved is None else int(saved)
    if saved != ctx.world_size:
        raise UsageError(
            f"resume=True: {str(path)!r} was written by {saved} process(es) but this run has {ctx.world_size}: "
            f"continue it with nproc={saved} (or torchrun --nproc-per-node {saved}); data shards, random streams "
            "and replay buffers are per process", param="resume")


def any_rank(flag: bool, device: torch.device) -> bool:
    """True when ``flag`` holds on at least one rank (a collective; the flag itself in a single process)."""
    if not D.active():
        return flag
    t = torch.tensor([1.0 if flag else 0.0], device=device)
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    return bool(t.item() > 0)


def reduce_sums(sums: torch.Tensor, images: int) -> tuple[torch.Tensor, int]:
    """(statistics summed over ranks, images over ranks): the ranks' epoch sums pooled."""
    if not D.active():
        return sums, images
    world = dist.get_world_size()
    pooled = D.all_reduce_mean(torch.cat([sums.float(), sums.new_tensor([float(images)])]))
    return pooled[:-1] * world, round(float(pooled[-1]) * world)


def buffer_share(buffer_size: int, ctx: D.DistContext) -> int:
    """Chains kept by each rank: buffer_size // world (a clear error when that is none)."""
    share = buffer_size // ctx.world_size
    if share < 1:
        raise UsageError(f"buffer_size={buffer_size} leaves no chains for each of {ctx.world_size} processes: "
                         f"use at least {ctx.world_size}", param="buffer_size")
    return share


def on_main(fn: Callable[[], Any], ctx: D.DistContext) -> Any:
    """``fn()`` on rank 0 only (its result there, None elsewhere), with its error raised on every
    rank: a collective, so the other ranks stop too instead of waiting for rank 0 forever."""
    result, error = None, None
    if ctx.is_main:
        try:
            result = fn()
        except Exception as exc:  # noqa: BLE001 - re-raised below, after the other ranks heard of it
            error = exc
    D.raise_any(error)
    return result
