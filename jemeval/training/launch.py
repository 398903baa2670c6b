"""``jemeval train --nproc N``: the same command line again, in N processes on this machine,
through ``torch.distributed.run`` (DistributedDataParallel: gloo on CPU, nccl on CUDA).

Everything a worker would refuse is checked first (:func:`check_launch`: the devices, the run
folder, the global batch, each process's share of the buffer, a resume's number of processes), so
a mistake is one line before any process starts. Inside a worker the launch is not repeated
(:func:`launched_by_torchrun`).
"""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import torch

from jemeval.errors import UsageError
from jemeval.runtime.devices import resolve_device
from jemeval.runtime.distributed import DistContext, available_cpus
from jemeval.training import ddp
from jemeval.training.config import TrainConfig, load_resume_checkpoint
from jemeval.training.rundir import check_run_folder


def launched_by_torchrun(nproc: int) -> bool:
    """True inside a torchrun worker (then ``nproc`` must agree with its WORLD_SIZE)."""
    world = os.environ.get("WORLD_SIZE")
    if world is None:
        return False
    if int(world) != nproc:
        raise UsageError(f"nproc={nproc} disagrees with the launcher's WORLD_SIZE={world}: drop nproc under "
                         "torchrun", param="nproc")
    return True


def check_nproc(nproc: int, device: torch.device) -> None:
    """Refuse more local processes than there are devices for them, before any starts (one line):
    one GPU each with nccl, one CPU core each with gloo (more only thrash and can exhaust memory)."""
    if nproc < 1:
        raise UsageError(f"nproc must be >= 1, got {nproc}", param="nproc")
    if device.type == "cuda":
        have = torch.cuda.device_count()
        if nproc > have:
            raise UsageError(f"nproc={nproc} needs one GPU per process but {have} GPU(s) are visible: use "
                             f"nproc={have} or fewer, or device='cpu' for {nproc} gloo processes on CPU", param="nproc")
        return
    cores = available_cpus()
    if nproc > cores:
        raise UsageError(f"nproc={nproc} is more than the {cores} CPU core(s) available to gloo processes on CPU: "
                         f"use nproc={cores} or fewer", param="nproc")


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


def relaunch(nproc: int, args: list[str]) -> int:
    """Run the command line ``args`` (``train ...``, without ``--nproc``) under
    ``torch.distributed.run`` with ``nproc`` local processes; returns its exit status."""
    if "train" not in args:
        raise UsageError("nproc re-launches the command line and needs it: use torchrun "
                         f"--nproc-per-node {nproc} -m jemeval train ... instead", param="nproc")
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={nproc}",
           "-m", "jemeval", *args]
    env = dict(os.environ)
    env.setdefault("OMP_NUM_THREADS", str(max(1, available_cpus() // nproc)))
    try:
        return subprocess.call(cmd, env=env)
    except KeyboardInterrupt:  # the workers got the signal too: they save last.pt and stop
        return 130
