"""What last.pt and best.pt hold, in one place: the run's position, its random states, and how a
resume or a rollback puts them back.

``last.pt`` holds everything a resume needs, in the plain-data layout of :mod:`jemeval.formats.native`
(it loads with ``weights_only=True``):

* ``state_dict``, ``replay_buffer`` (every rank's chains, in rank order), ``config`` (:func:`config_record`),
  ``provenance``;
* ``training_state`` (:func:`training_state`): the :class:`~.position.RunPosition` (epoch, batch, step, best epoch,
  recoveries, adjustments, elapsed time), the optimizer, the metrics.csv rows, the schedule's settings,
  the world size, and per rank (``ranks`` under DDP, the top level in one process) the data positions,
  the unreduced epoch sums and every random state (:func:`capture_rng`).

``best.pt`` is the same model file without the training state. Rank 0 writes; saving is a collective
under DDP (every rank joins the gathers, then waits for the file). Weights come back through
:func:`jemeval.formats.native.load_state`, which refuses non-finite values. Checkpoints written by
0.1 and 0.2 have this layout and resume as they are.

Reading a last.pt for a resume is here too, the configuration that continues it included
(:func:`resume_from`): :mod:`.config` checks settings and reads no file, so it imports nothing of
this module, whose writers take the run's :class:`~.parts.Parts` (built from a config).
"""
from __future__ import annotations

import os
import random
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import torch

from jemeval.data import absolute_spec
from jemeval.errors import UsageError
from jemeval.formats.native import load_state, read_checkpoint, save_checkpoint
from jemeval.provenance import provenance
from jemeval.registry import parse_spec
from jemeval.runtime import distributed as D
from jemeval.training import ddp
from jemeval.training.config import RESUME_OR_OVERWRITE, TrainConfig, resume_config
from jemeval.training.divergence import Adjustments
from jemeval.training.position import EpochStats, RunPosition

if TYPE_CHECKING:
    from jemeval.training.parts import Parts

# -- random states: a resumed run draws the same numbers as the uninterrupted one -------------------
def capture_rng(generator: torch.Generator | None = None) -> dict[str, Any]:
    """Every random state a run draws from, as plain tensors and numbers: the trainer's own generator
    (shuffling, buffer draws, SGLD noise, augmentation, sigma noise), torch's CPU and CUDA generators
    (initialisation, dropout), NumPy's and Python's. The JEM release stored none and could not resume."""
    np_state = np.random.get_state()
    py_version, py_state, py_gauss = random.getstate()
    state: dict[str, Any] = {
        "torch": torch.get_rng_state(),
        "cuda": torch.cuda.get_rng_state_all() if torch.cuda.is_available() else [],
        "numpy": {"keys": torch.from_numpy(np_state[1].astype(np.int64)), "pos": int(np_state[2]),
                  "has_gauss": int(np_state[3]), "cached_gaussian": float(np_state[4])},
        "python": {"version": int(py_version), "state": torch.tensor(py_state, dtype=torch.int64),
                   "gauss_next": py_gauss},
    }
    if generator is not None:
        state["generator"] = generator.get_state()
    return state


def restore_rng(state: dict[str, Any], generator: torch.Generator | None = None) -> None:
    """Put back what :func:`capture_rng` saved (CUDA states only onto as many devices as saved them)."""
    torch.set_rng_state(state["torch"].cpu())
    cuda = state.get("cuda") or []
    if cuda and torch.cuda.is_available() and len(cuda) == torch.cuda.device_count():
        torch.cuda.set_rng_state_all([s.cpu() for s in cuda])
    np_state = state["numpy"]
    np.random.set_state(("MT19937", np_state["keys"].numpy().astype(np.uint32), np_state["pos"],
                         np_state["has_gauss"], np_state["cached_gaussian"]))
    py = state["python"]
    random.setstate((py["version"], tuple(int(v) for v in py["state"].tolist()), py["gauss_next"]))
    if generator is not None and "generator" in state:
        generator.set_state(state["generator"].cpu())


# -- writing ------------------------------------------------------------------------------------------
def config_record(parts: Parts, position: RunPosition) -> dict[str, Any]:
    """The full configuration as stored: effective SGLD settings, sigma, and resolved values."""
    config = parts.config
    record = config.to_dict()
    effective = position.adjustments.applied_to(config)
    record["sgld"] = effective.sgld().settings()  # what sampling really uses (recovery may raise steps)
    record["effective"] = {"sgld_steps": effective.sgld_steps, "energy_l2": effective.energy_l2,
                           "lr_scale": position.adjustments.lr_scale}
    record["resolved"] = {
        "device": str(parts.device), "fastpath": parts.fastpath.settings(),
        "augment": parts.augment.settings(), "data": parts.data.describe(),
        "world_size": parts.ctx.world_size, "backend": parts.ctx.backend,
        "per_rank_batch": ddp.batch_plan(len(parts.data.x), config.batch_size, parts.ctx.world_size)[1],
        "per_rank_buffer": None if parts.buffer is None else len(parts.buffer),
    }
    return record


def run_provenance(parts: Parts, position: RunPosition, **training: Any) -> dict[str, Any]:
    """The checkpoint's provenance; ``training`` says where the run stood, with ``elapsed`` (training
    seconds over every session so far, unless ``training`` gives its own): the report's training cost."""
    record = provenance(command="train", device=parts.device, seed=parts.config.seed,
                        settings=config_record(parts, position), data=parts.data.info.get("data_sha256"))
    record["training"] = {"epoch": position.epoch, "step": position.step, "elapsed": position.elapsed, **training}
    return record


def _rank_state(parts: Parts, position: RunPosition) -> dict[str, Any]:
    """What differs between ranks: data shard position, random streams, unreduced epoch sums."""
    return {
        "perm": None if position.perm is None else position.perm.cpu(),
        "lab_perm": None if position.lab_perm is None else position.lab_perm.cpu(), "lab_pos": position.lab_pos,
        "rng": capture_rng(parts.generator),
        "epoch_stats": position.stats.state() if position.batch else None,
    }


def training_state(parts: Parts, position: RunPosition, metrics_rows: list[dict]) -> dict[str, Any]:
    """Everything a resume needs (a collective under DDP: every rank's state is gathered)."""
    config = parts.config
    mine = _rank_state(parts, position)
    ranks = D.gather_objects(mine)
    return {
        "epoch": position.epoch, "batch": position.batch, "step": position.step,
        "world_size": parts.ctx.world_size,
        **mine,  # rank 0's (the whole state in a single process)
        "ranks": ranks if parts.ctx.distributed else None,
        "best_val_acc": position.best_val_acc, "best_epoch": position.best_epoch,
        "recoveries": position.recoveries, "adjustments": position.adjustments.as_dict(),
        "optimizer": parts.optimizer.state_dict(),
        "scheduler": {"kind": "linear warm-up + step decay", "base_lr": config.lr,
                      "warmup_iters": config.warmup_iters, "decay_epochs": list(config.decay_epochs),
                      "decay_rate": config.decay_rate, "lr_scale": position.adjustments.lr_scale},
        "metrics": [dict(row) for row in metrics_rows],  # plain rows: floats, ints, strings, None
        "elapsed": position.elapsed,
    }


def _gathered_buffer(parts: Parts) -> torch.Tensor | None:
    """The replay buffer to save: every rank's chains in rank order (a collective under DDP)."""
    return None if parts.buffer is None else D.all_gather_cat(parts.buffer.data)


def save_last(parts: Parts, position: RunPosition, metrics_rows: list[dict]) -> Path:
    """Write last.pt (rank 0; every rank joins the gathers, then waits for the file)."""
    buffer, state = _gathered_buffer(parts), training_state(parts, position, metrics_rows)
    path = parts.out / "last.pt"
    if parts.ctx.is_main:
        save_checkpoint(path, parts.model, dataset=parts.config.dataset, replay_buffer=buffer,
                        training_state=state, config=config_record(parts, position),
                        provenance=run_provenance(parts, position, best_val_acc=position.best_val_acc))
    D.barrier()
    return path


def save_best(parts: Parts, position: RunPosition, val_acc: float | None, train_acc: float, *,
              elapsed: float | None = None) -> Path:
    """Write best.pt (rank 0; a collective under DDP like :func:`save_last`). ``elapsed``: the training
    seconds so far, this epoch's included (the caller's clock; default ``position.elapsed``)."""
    buffer = _gathered_buffer(parts)
    path = parts.out / "best.pt"
    seconds = position.elapsed if elapsed is None else float(elapsed)
    if parts.ctx.is_main:
        save_checkpoint(path, parts.model, dataset=parts.config.dataset, replay_buffer=buffer,
                        config=config_record(parts, position),
                        provenance=run_provenance(parts, position, val_acc=val_acc, train_acc=train_acc,
                                                  elapsed=seconds))
    D.barrier()
    return path


# -- reading --------------------------------------------------------------------------------------------
def resume_path(out: str | os.PathLike) -> Path:
    """``out/last.pt``, which a resume continues (a one-line error when there is none)."""
    path = Path(out) / "last.pt"
    if not path.exists():
        raise UsageError(f"resume=True: no {str(path)!r} to continue; run without resume=True or pass the run's out",
                         param="out")
    return path


def load_resume_checkpoint(out: str) -> dict[str, Any]:
    """The ``last.pt`` of the run in ``out``, checked to hold what a resume needs (one-line errors)."""
    path = resume_path(out)
    ckpt = read_checkpoint(path)
    if not (isinstance(ckpt, dict) and isinstance(ckpt.get("training_state"), dict)
            and isinstance(ckpt.get("config"), dict)):
        raise UsageError(f"resume=True: {str(path)!r} holds no training state (best.pt carries none; only last.pt "
                         "written by jemeval train can be resumed)", param="resume")
    return ckpt


def restore(parts: Parts, position: RunPosition, checkpoint: dict, path: Path, *, keep_history: bool = False) -> None:
    """Load weights, optimizer, this rank's buffer chains, the position and random states from a
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
    position.epoch, position.batch, position.step = int(ts["epoch"]), int(ts["batch"]), int(ts["step"])
    position.perm = None if mine["perm"] is None else mine["perm"].to(where)
    position.lab_perm = None if mine["lab_perm"] is None else mine["lab_perm"].to(where)
    position.lab_pos = int(mine["lab_pos"])
    position.best_val_acc, position.best_epoch = ts["best_val_acc"], ts["best_epoch"]
    position.elapsed = float(ts.get("elapsed", 0.0))
    position.stats = EpochStats(parts.device, mine.get("epoch_stats"))
    if not keep_history:
        position.recoveries = int(ts["recoveries"])
        position.adjustments = Adjustments.from_dict(ts["adjustments"])
    parts.monitor.reset()


def stored_metrics(checkpoint: dict) -> list[dict]:
    """The metrics.csv rows saved in a last.pt (metrics.csv is rewritten from them on a resume)."""
    return checkpoint["training_state"]["metrics"]


def stored_config(checkpoint: dict) -> dict[str, Any]:
    """The configuration record a last.pt was written with (what a resume continues)."""
    return checkpoint["config"]


def resume_from(dataset: str, **given: Any) -> TrainConfig:
    """The config that continues the run in ``given["out"]`` (default ``runs/DATASET``).

    ``given`` holds only what the caller set explicitly: everything else comes from the stored run,
    and an explicit setting that differs from it is an error (see :func:`.config.resume_config`).
    """
    if given.get("overwrite"):
        raise UsageError(RESUME_OR_OVERWRITE, param="overwrite")
    out = given.get("out") or f"runs/{parse_spec(dataset).name}"
    stored = stored_config(load_resume_checkpoint(out))
    dataset = absolute_spec(dataset)  # as TrainConfig records it
    if stored.get("dataset") not in (None, dataset):
        raise UsageError(f"resume=True: the run in {str(out)!r} is on {stored.get('dataset')!r}, not {dataset!r}",
                         param="resume")
    return resume_config(stored, **{**given, "out": str(out)})


def saved_world_size(checkpoint: dict) -> int | None:
    """How many processes wrote a last.pt (None: a run from before DDP support, one process)."""
    return checkpoint["training_state"].get("world_size")


def load_weights(model: torch.nn.Module, path: Path) -> None:
    """The weights of the checkpoint at ``path`` (best.pt) into ``model``; non-finite ones are refused."""
    load_state(model, read_checkpoint(path)["state_dict"], str(path))
