"""How many DataLoader processes decode a dataset read image by image, when the user does not say.

A folder of JPEGs (or a torchvision set) is decoded image by image. Decoding in the main process
between batches leaves the model idle while it runs; worker processes decode the next batches while
the model computes. ``workers=None`` (the default of every command and of :class:`~jemeval.context.RunContext`)
means :func:`default_workers`: one CPU is left to the model's own threads, and more than 8 decoders
seldom help (torchvision's and timm's reference scripts use 4-16 for ImageNet on a GPU). Sets held as
arrays (npz, digits, the derived OOD sets) are sliced in the main process and never start a worker.
The numbers never depend on the count: the same images arrive in the same order.
"""
from __future__ import annotations

import os

#: the most decoding processes the default starts
MAX_DEFAULT_WORKERS = 8


def usable_cpus() -> int:
    """The CPUs this process may run on (its affinity mask where the OS has one: a container's or
    a SLURM job's share, not the machine's count)."""
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):  # macOS, Windows
        return os.cpu_count() or 1


def default_workers() -> int:
    """``min(8, CPUs - 1)``: 0 on one CPU, 1 on two, 8 from nine CPUs up."""
    return max(0, min(MAX_DEFAULT_WORKERS, usable_cpus() - 1))


def resolve_workers(workers: int | None) -> int:
    """``workers`` as given, or :func:`default_workers` for None."""
    return default_workers() if workers is None else int(workers)
