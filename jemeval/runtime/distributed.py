"""Utilities for data-parallel JEM training under ``torchrun`` (gloo on CPU, nccl on CUDA).

What a trainer needs and nothing more: read the launcher's environment into a :class:`DistContext`
(with one-line :class:`~jemeval.errors.JemevalError` messages for setups that cannot work),
deterministic per-rank shards of the training set, independent per-rank RNG streams for SGLD,
averaging of metrics, and "only rank 0 writes files" helpers.

Design notes for JEM:

* The global batch is split evenly so that a 2-process run with B/2 per rank gives the same
  averaged gradient as 1 process with batch B (tests/test_distributed.py checks it).
* Each rank keeps its own replay buffer and SGLD generator (:func:`rank_generator`): chains are
  independent across ranks, and a rank's stream does not depend on the world size's other ranks.
* Sample with the *unwrapped* module (:func:`jemeval.runtime.fastpath.unwrap`): SGLD needs only
  input gradients, and going through DistributedDataParallel's forward would arm its gradient
  reducer for a backward that never reduces parameter gradients.

What training does with these (the global batch, per-rank buffers, refusing a resume with another
world size) is in :mod:`jemeval.training.ddp`.
"""
from __future__ import annotations

import datetime
import gc
import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

from jemeval.errors import JemevalError, UsageError
from jemeval.runtime import agreement, arrival

ENV_KEYS = ("RANK", "WORLD_SIZE", "LOCAL_RANK")


@dataclass(frozen=True)
class DistContext:
    """Where this process stands: rank, world size, backend and its device."""

    rank: int = 0
    world_size: int = 1
    local_rank: int = 0
    backend: str | None = None
    device: torch.device = field(default_factory=lambda: torch.device("cpu"))

    @property
    def distributed(self) -> bool:
        return self.world_size > 1

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    def wrap(self, model: nn.Module, **ddp_options) -> nn.Module:
        """DistributedDataParallel around ``model`` when distributed, else ``model`` itself."""
        if not self.distributed:
            return model
        ids = [self.device.index] if self.device.type == "cuda" else None
        return nn.parallel.DistributedDataParallel(model, device_ids=ids, **ddp_options)


def init_from_env(
    *,
    backend: str | None = None,
    env: Mapping[str, str] | None = None,
    timeout_s: float = 600.0,
) -> DistContext:
    """Read RANK / WORLD_SIZE / LOCAL_RANK (as torchrun sets them) and join the process group.

    Without those variables (or with WORLD_SIZE=1) this is a single-process context and nothing
    is initialised. ``backend`` defaults to nccl when CUDA is available, else gloo; on CUDA each
    process uses ``cuda:LOCAL_RANK``. A launch that cannot work fails here, on every rank, with one line.
    """
    env = os.environ if env is None else env
    rank, world, local = (arrival.env_int(env, k) for k in ENV_KEYS)
    if world is None and rank is None:
        return DistContext()
    if world is None or rank is None:
        raise JemevalError("set both RANK and WORLD_SIZE (torchrun does), or neither for a single process")
    if world < 1 or not 0 <= rank < world:
        raise JemevalError(f"inconsistent launch: RANK={rank} must be in [0, WORLD_SIZE={world})")
    local = rank if local is None else local
    if local < 0 or local > rank:
        raise JemevalError(f"inconsistent launch: LOCAL_RANK={local} with RANK={rank}")
    if backend is None:
        backend = "nccl" if torch.cuda.is_available() else "gloo"
    device = _backend_device(backend, local)
    if world > 1 and not dist.is_initialized():
        _join_group(backend, rank, world, env, timeout_s)
    return DistContext(rank=rank, world_size=world, local_rank=local,
                       backend=backend if world > 1 else None, device=device)


def join(device: torch.device) -> DistContext:
    """The launch's context for work on ``device``: gloo processes on CPU, nccl on CUDA (one GPU per
    process, ``cuda:LOCAL_RANK``). A single process (no torchrun variables, or WORLD_SIZE=1) joins
    nothing. A launch that cannot work is one line (a UsageError; ``shared`` when every rank raises it,
    as :func:`jemeval.runtime.arrival.arrive` does)."""
    try:
        return init_from_env(backend="nccl" if device.type == "cuda" else "gloo")
    except JemevalError as exc:
        error = UsageError(str(exc))
        error.shared = getattr(exc, "shared", False)  # type: ignore[attr-defined]
        raise error from None


def _backend_device(backend: str, local_rank: int) -> torch.device:
    """This process's device: ``cuda:LOCAL_RANK`` (made current) for nccl, the CPU for gloo."""
    if backend == "gloo":
        return torch.device("cpu")
    if backend != "nccl":
        raise JemevalError(f"unknown distributed backend {backend!r}: choose gloo (CPU) or nccl (CUDA)")
    if not torch.cuda.is_available() or local_rank >= torch.cuda.device_count():
        have = torch.cuda.device_count() if torch.cuda.is_available() else 0
        raise JemevalError(f"backend nccl needs a CUDA device per process: LOCAL_RANK={local_rank} but {have} "
                           "GPU(s) visible; use the gloo backend on CPU")
    device = torch.device("cuda", local_rank)
    torch.cuda.set_device(device)
    return device


def _join_group(backend: str, rank: int, world: int, env: Mapping[str, str], timeout_s: float) -> None:
    """Join through the launch's store (from ``env``, which may not be os.environ), after every rank
    arrived (:func:`jemeval.runtime.arrival.arrive`): a rank that failed before joining, or a rank
    given another command line than rank 0's, is one line here, not a wait."""
    for key in ("MASTER_ADDR", "MASTER_PORT"):
        if key not in env:
            raise JemevalError(f"{key} is not set: launch with torchrun, or set MASTER_ADDR and MASTER_PORT")
    timeout = datetime.timedelta(seconds=timeout_s)
    try:
        store = arrival.launch_store(env, rank, world, timeout)
    except (ImportError, TypeError):  # a torch whose private store helper moved: join as torch does
        arrival.joining()
        dist.init_process_group(backend, rank=rank, world_size=world, timeout=timeout,
                                init_method=f"tcp://{env['MASTER_ADDR']}:{env['MASTER_PORT']}")
        return
    arrival.arrive(store, rank, world, env, timeout_s, agreement.declared())
    arrival.joining()
    dist.init_process_group(backend, rank=rank, world_size=world, store=store, timeout=timeout)


def available_cpus() -> int:
    """CPU cores this process may run on (its affinity mask, e.g. under taskset or a container's
    cpuset; ``os.cpu_count()`` where the platform has no such mask)."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except (AttributeError, OSError):
        return max(1, os.cpu_count() or 1)


def shard_indices(n: int, rank: int, world_size: int, seed: int, epoch: int, *, shuffle: bool = True,
                  drop_last: bool = False) -> torch.Tensor:
    """This rank's dataset indices for ``epoch``: the same permutation on every rank, dealt out.

    The permutation depends only on (seed, epoch), so every rank computes it without talking to
    the others; rank r takes positions r, r + W, r + 2W, ... Every rank gets the same count:
    the tail is padded with the permutation's first indices (or dropped with ``drop_last``), as
    ``DistributedSampler`` does. With world_size 1 the shard is the whole permutation.
    """
    if world_size < 1 or not 0 <= rank < world_size:
        raise JemevalError(f"rank {rank} is not in [0, world size {world_size})")
    if n < 0:
        raise ValueError(f"n must be >= 0, got {n}")
    if shuffle:
        g = torch.Generator().manual_seed(_mix(seed, epoch))
        order = torch.randperm(n, generator=g)
    else:
        order = torch.arange(n)
    if drop_last:
        order = order[: n - n % world_size]
    elif n % world_size and n > 0:
        pad = world_size - n % world_size
        order = torch.cat([order, order.repeat(pad // n + 1)[:pad]])
    return order[rank::world_size]


def rank_generator(seed: int, rank: int, device: torch.device | str = "cpu") -> torch.Generator:
    """A generator for this rank's SGLD noise and buffer draws, independent of other ranks'."""
    return torch.Generator(device=device).manual_seed(_mix(seed, rank, salt=0x5EED))


def _mix(*values: int, salt: int = 0x9E3779B97F4A7C15) -> int:
    """A 63-bit seed from small integers (splitmix64-style), so nearby inputs give unrelated streams."""
    h = salt & 0xFFFFFFFFFFFFFFFF
    for v in values:
        h = (h ^ (int(v) & 0xFFFFFFFFFFFFFFFF)) * 0xBF58476D1CE4E5B9 & 0xFFFFFFFFFFFFFFFF
        h ^= h >> 31
        h = h * 0x94D049BB133111EB & 0xFFFFFFFFFFFFFFFF
        h ^= h >> 29
    return h & 0x7FFFFFFFFFFFFFFF


def active() -> bool:
    return dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1


def all_reduce_mean(tensor: torch.Tensor) -> torch.Tensor:
    """Average ``tensor`` over ranks in place and return it (unchanged in a single process).

    Use it for logged metrics, not for gradients (DistributedDataParallel averages those). It is a
    collective: every rank must call it, and reading the result on the host synchronises.
    """
    if active():
        if tensor.is_floating_point():
            dist.all_reduce(tensor, op=dist.ReduceOp.SUM)
            tensor.div_(dist.get_world_size())
        else:
            raise TypeError(f"all_reduce_mean needs a floating-point tensor, got {tensor.dtype}")
    return tensor


def all_gather_cat(tensor: torch.Tensor) -> torch.Tensor:
    """Concatenate every rank's ``tensor`` along dim 0 (same shape on every rank), e.g. the
    per-rank replay buffers for a checkpoint. A collective; in a single process the tensor itself
    (no copy of a possibly large buffer: callers only read it)."""
    if not active():
        return tensor
    parts = [torch.empty_like(tensor) for _ in range(dist.get_world_size())]
    dist.all_gather(parts, tensor.contiguous())
    return torch.cat(parts)


def gather_objects(obj: Any) -> list[Any]:
    """Every rank's ``obj`` (picklable, CPU tensors) in rank order (a collective; ``[obj]`` in a single process)."""
    if not active():
        return [obj]
    out: list[Any] = [None] * dist.get_world_size()
    dist.all_gather_object(out, obj)
    return out


def raise_any(error: BaseException | None) -> None:
    """Raise on every rank when any rank had an error (a collective): its own error where it
    happened, the first failing rank's one line (a UsageError naming the same parameter, or a
    JemevalError) elsewhere, so no rank waits forever for one that stopped. The raised error is
    marked ``shared`` (every rank, rank 0 included, raises it: rank 0 alone need report it)."""
    told = gather_objects(None if error is None else (str(error), _usage_param(error)))
    failed = [t for t in told if t is not None]
    if error is not None:
        error.shared = True  # type: ignore[attr-defined]
        raise error
    if failed:
        message, param = failed[0]  # param: the UsageError's parameter; False for any other error
        copy = JemevalError(message) if param is False else UsageError(message, param=param)
        copy.shared = True  # type: ignore[attr-defined]
        raise copy


def shared_error(error: Exception) -> Exception:
    """The error every rank agrees on, for code that handles an error and goes on (a collective
    unless ``error`` already went through :func:`raise_any`): each rank's own error where it had
    one, else the first failing rank's. In a single process, ``error`` itself."""
    if getattr(error, "shared", False):
        return error
    try:
        raise_any(error)
    except Exception as agreed:  # noqa: BLE001 - raise_any always raises here: error is not None
        return agreed
    return error


def main_value(obj: Any) -> Any:
    """Rank 0's ``obj`` on every rank (a collective; ``obj`` itself in a single process): a decision
    every rank must take the same way, e.g. whether a cached result can be used."""
    return gather_objects(obj)[0]


def _usage_param(error: BaseException) -> str | None | bool:
    """A UsageError's parameter (None when it names none); False for every other error."""
    return error.param if isinstance(error, UsageError) else False


def barrier() -> None:
    """Wait for every rank (a no-op in a single process), e.g. after rank 0 wrote a checkpoint."""
    if active():
        dist.barrier()


def destroy(*, synchronize: bool = False) -> None:
    """Leave the process group (safe to call when none was joined).

    ``synchronize``: first wait for every rank (a barrier), for ranks that all finished the same
    collectives (a run's normal end, or an error every rank agreed on). Then no rank tears its
    connections down while a peer's last collective is still in flight, and the group's C++ objects
    (gloo's worker threads and the work they hold) are freed here, while the interpreter is alive:
    freed during interpreter shutdown instead, they can abort the process ("terminate called
    without an active exception", exit -6) after it wrote its results. Not for a rank that stopped
    on its own (a Ctrl-C): its peers may never reach the barrier.
    """
    if not (dist.is_available() and dist.is_initialized()):
        return
    if synchronize and dist.get_world_size() > 1:
        try:
            dist.barrier()
        except Exception:  # noqa: BLE001 - a peer that is gone: leave anyway, the results are written
            pass
    dist.destroy_process_group()
    gc.collect()
