"""Evaluation on several processes: whole batches dealt out to the ranks, results gathered.

An evaluation that runs batch by batch (attacks, OOD scores, SGLD chains) gives the same records in
N processes as in one when two things hold, and this module provides both:

* **The work is split by whole batches** (:func:`map_batches`, :func:`map_items`): batch b runs on
  rank b mod N with exactly the examples, batch size and BatchNorm statistics it has in a single process, and the
  results come back in batch order on every rank.
* **Every random stream depends on (seed, batch index) only** (:func:`batch_generator`), never on
  how many batches a process ran before it. Batch 0 uses the seed itself, so a run that fits in one
  batch keeps the numbers it had before streams were split by batch.

Only inside :func:`sharded` (what ``--nproc`` sets up) is the work dealt out. Errors stop every
rank (:func:`jemeval.runtime.distributed.raise_any`): a rank that fails in its batches still takes
part in the exchange, so the others learn of it instead of waiting forever.
Outside ``torchrun`` (or with one process) everything here is the single-process computation.
"""
from __future__ import annotations

import contextlib
import math
from collections.abc import Callable, Iterable, Iterator
from typing import Any, TypeVar

import torch
import torch.distributed as dist

from jemeval.runtime import distributed as D

T = TypeVar("T")


_SHARDING = False  # set by sharded(): only then is the work dealt out


@contextlib.contextmanager
def sharded() -> Iterator[None]:
    """Deal the batches of the evaluations run inside out over the process group's ranks.

    The commands' ``--nproc`` (and ``torchrun -m jemeval ...``) run them inside it; from Python,
    under torchrun: ``with sharded(): result = robust(...)`` on every rank. Outside it, code that runs
    under a process group for another purpose (a DDP trainer's validation) computes every batch
    itself, as it always did.
    """
    global _SHARDING
    before, _SHARDING = _SHARDING, True
    try:
        yield
    finally:
        _SHARDING = before


def rank_and_world() -> tuple[int, int]:
    """(this process's rank, the number of processes sharing the batches): (0, 1) outside
    :func:`sharded` or a process group."""
    if not (_SHARDING and D.active()):
        return 0, 1
    return dist.get_rank(), dist.get_world_size()


def my_batches(n_batches: int) -> range:
    """The batch indices this rank runs: b with b mod N == rank (every batch, in one process)."""
    rank, world = rank_and_world()
    return range(rank, n_batches, world)


def my_share(n: int, batch_size: int) -> int:
    """How many of ``n`` examples (in batches of ``batch_size``) this rank runs: its progress total."""
    return sum(min(batch_size, n - b * batch_size) for b in my_batches(math.ceil(n / batch_size)))


def batch_seed(seed: int, index: int) -> int:
    """The seed of batch ``index``'s random streams: ``seed`` itself for batch 0, an unrelated
    63-bit mix of (seed, index) for the others (so seed 1's batch 0 is not seed 0's batch 1)."""
    return int(seed) if index == 0 else D._mix(seed, index, salt=0xBA7C4)


def batch_generator(seed: int, index: int, device: torch.device | str = "cpu") -> torch.Generator:
    """A generator on ``device`` for batch ``index`` (:func:`batch_seed`)."""
    return torch.Generator(device=device).manual_seed(batch_seed(seed, index))


def map_batches(fn: Callable[[int], T], n_batches: int) -> list[T]:
    """``[fn(0), ..., fn(n_batches - 1)]`` on every rank, each rank computing only its own batches.

    ``fn(b)`` must return something picklable with tensors on the CPU (it travels between ranks).
    A collective: every rank must call it with the same ``n_batches``; an error in any rank's
    ``fn`` is raised on every rank (after all of them finished or failed their batches).
    """
    return map_items(lambda b, _: fn(b), range(n_batches))


def map_items(fn: Callable[[int, Any], T], items: Iterable[Any]) -> list[T]:
    """``[fn(b, item) for b, item in enumerate(items)]`` on every rank, each rank computing only its
    own batches (b mod N == rank) and passing over the others' items (``items`` is read on every
    rank, e.g. a dataset's batches in order). Otherwise as :func:`map_batches`."""
    rank, world = rank_and_world()
    results: list[Any] = []
    error, count = None, 0
    try:
        for b, item in enumerate(items):
            count += 1
            if b % world == rank:
                results.append(fn(b, item))
    except Exception as exc:  # noqa: BLE001 - raised on every rank by raise_any
        error = exc
    if world == 1:
        if error is not None:
            raise error
        return results
    D.raise_any(error)
    return interleave(D.gather_objects(results), count)


def interleave(per_rank: list[list[T]], n_batches: int) -> list[T]:
    """Batch order from the ranks' lists (rank r holds batches r, r + N, ...)."""
    world = len(per_rank)
    return [per_rank[b % world][b // world] for b in range(n_batches)]
