"""``jemeval train --nproc N``: what training checks before it re-launches itself in N processes
(DistributedDataParallel, gloo on CPU, nccl on CUDA).

The launch itself (:func:`jemeval.runtime.launch.relaunch`) and the check of the processes against
the devices are shared with the evaluation commands in :mod:`jemeval.runtime.launch`; here are the
rest of the one-line errors a training worker would hit (the run folder, the global batch, each
process's share of the buffer, a resume's number of processes), raised before any process starts.
"""
from __future__ import annotations

from pathlib import Path

from jemeval.runtime.devices import resolve_device
from jemeval.runtime.distributed import DistContext
from jemeval.runtime.launch import check_nproc
from jemeval.training import ddp
from jemeval.training.config import TrainConfig, load_resume_checkpoint
from jemeval.training.rundir import check_run_folder


def check_launch(config: TrainConfig, nproc: int) -> None:
    """The one-line errors a worker would hit, raised before any process starts."""
    check_nproc(nproc, resolve_device(config.device, name="device"))
    check_run_folder(config)
    ddp.check_global_batch(config.batch_size, nproc)
    planned = DistContext(world_size=nproc)
    if config.samples and not config.short_run:
        ddp.buffer_share(config.buffer_size, planned)
    if config.resume:
        state = load_resume_checkpoint(config.out_dir)["training_state"]
        ddp.check_world(state.get("world_size"), planned, Path(config.out_dir) / "last.pt")
