"""The epoch loop: checkpoints, exact resumption, divergence recovery, progress, metrics, grids.

A run writes into its folder (``--out``, default runs/DATASET):

* ``last.pt`` at the start, after every epoch, after every recovery and on Ctrl-C / SIGTERM
  (mid-epoch: the epoch's permutation and position are stored too), always atomically, with
  everything a resume needs: weights, optimizer, replay buffer, counters, every RNG state, the
  metrics rows and the recovery adjustments. ``--resume`` continues bit-for-bit on CPU.
* ``best.pt`` whenever the validation accuracy improves (every epoch without a validation split).
* ``metrics.csv`` (see :mod:`.metrics`), rewritten from ``last.pt`` on every resume, and
  ``samples/*.png`` grids (see :mod:`.visuals`).

Before anything is read or written, rank 0 claims the folder (:mod:`.rundir`): it creates it (not
its parents), locks it against a second trainer, refuses to start over an existing run unless
``resume`` or ``overwrite``, and removes temporary files of writes a kill interrupted.

Under ``torchrun`` (or ``jemeval train --nproc N``) the same loop runs on every rank with
DistributedDataParallel; :mod:`.parallel` states what changes (global batch, per-rank buffers and
random streams, rank 0 writes, collective decisions).

Divergence (see :mod:`.divergence`) never crashes the run: it rolls back to ``last.pt``, reseeds,
and climbs the authors' ladder of remedies, logging each attempt; when ``max_recoveries`` is
spent it raises :class:`~jemeval.errors.TrainingDiverged` with one line saying what to try.
"""
from __future__ import annotations

import signal
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import asdict
from pathlib import Path
from typing import Any

import torch

from jemeval.energy.factory import create_model
from jemeval.errors import JemevalError, TrainingDiverged, UsageError
from jemeval.formats.native import read_checkpoint, save_checkpoint
from jemeval.provenance import provenance
from jemeval.runtime import distributed as D
from jemeval.runtime.devices import resolve_device
from jemeval.runtime.fastpath import FastPath
from jemeval.sampling.buffer import ReplayBuffer
from jemeval.training import parallel, rundir
from jemeval.training.augment import augment_for
from jemeval.training.config import TrainConfig, load_resume_checkpoint, resume_config
from jemeval.training.divergence import Adjustments, Divergence, DivergenceMonitor, RecoveryPolicy
from jemeval.training.evaluate import accuracy
from jemeval.training.metrics_log import MetricsLog
from jemeval.training.objectives import Weights
from jemeval.training.schedule import learning_rate
from jemeval.training.splits import prepare_data
from jemeval.training.state import capture_rng, reseed, restore_rng
from jemeval.training.step import StepOptions, TrainStep

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
        sums, images = parallel.reduce_sums(self.sums, self.images) if pooled else (self.sums, self.images)
        values = dict(zip(STAT_KEYS, sums.cpu().tolist()))
        world = D.dist.get_world_size() if pooled and D._active() else 1
        it = max(self.iterations, 1) * world
        out = {k: values[k] / it for k in ("loss", "pyx", "px", "pxy", "l2", "e_data", "e_sample")}
        out["train_acc"] = values["correct"] / images if images else float("nan")
        out["images"] = images
        return out

    def state(self) -> dict:
        return {"sums": dict(zip(STAT_KEYS, self.sums.cpu().tolist())), "iterations": self.iterations,
                "images": self.images, "seconds": self.seconds}


class Trainer:
    """Runs one training configuration; ``run()`` returns the summary dict.

    ``on_step(trainer)`` is called after every iteration (tests and notebooks use it, e.g. to call
    :meth:`request_stop`, which behaves exactly like Ctrl-C).
    """

    def __init__(self, config: TrainConfig, *, on_step: Callable[[Trainer], None] | None = None) -> None:
        self.config = config.validate()
        self.on_step = on_step
        self.out = Path(self.config.out_dir)
        self._stop_reason: str | None = None
        self._injections = 0

    # -- public controls -----------------------------------------------------------------------
    def request_stop(self, reason: str = "stop requested") -> None:
        """Finish the current iteration, save last.pt, and return (as on Ctrl-C / SIGTERM)."""
        self._stop_reason = self._stop_reason or reason

    # -- setup ---------------------------------------------------------------------------------
    def _enter_run(self) -> dict | None:
        """Join the process group, claim the run folder (rank 0 creates and locks it; every rank gets
        its one-line refusal, so none waits for a failed rank 0), and for a resume read last.pt,
        under the lock: no other process writes it meanwhile. Returns that checkpoint, or None."""
        self.device = resolve_device(self.config.device, name='--device')
        self.ctx = parallel.join(self.device, self.config.batch_size)
        self._owns_group = self.ctx.distributed
        if self.ctx.distributed:
            self.device = self.ctx.device
        self._lock = parallel.on_main(lambda: rundir.claim(self.config), self.ctx)
        if not self.config.resume:
            return None
        ckpt = load_resume_checkpoint(str(self.out))
        given = {k: v for k, v in asdict(self.config).items() if k != "out"}
        self.config = resume_config(ckpt["config"], **given, out=self.config.out)
        parallel.check_world(ckpt["training_state"].get("world_size"), self.ctx, self.out / "last.pt")
        return ckpt

    def _setup(self) -> None:
        ckpt = self._enter_run()
        cfg = self.config
        self.fastpath = FastPath.for_device(self.device, bf16=cfg.bf16, channels_last=cfg.channels_last,
                                            compile=cfg.compile, pin_memory=False)
        self.generator = torch.Generator(device=self.device)
        self._reseed(cfg.seed)

        self.data = prepare_data(cfg, self.device)
        self.num_classes = self.data.num_classes
        self.input_shape = self.data.input_shape
        self.augment = augment_for(cfg.augment, self.data.info, self.input_shape)
        self.model = create_model(cfg.arch, self.num_classes, self.input_shape, metadata={"dataset": cfg.dataset}).to(self.device)
        prepared = self.fastpath.prepare(self.model, wrap=self.ctx.wrap)  # eager module kept for checkpoints
        self.forward_model, self.sample_model = prepared.run, prepared.sample
        self.optimizer = self._make_optimizer()
        self.class_blocks = cfg.pxy_weight > 0 or cfg.class_cond_px
        self.buffer = None
        if cfg.samples and not cfg.short_run:
            share = parallel.buffer_share(cfg.buffer_size, self.ctx)  # each rank keeps buffer_size // world chains
            if self.class_blocks and share < self.num_classes:
                raise UsageError(f"--buffer-size {cfg.buffer_size} gives {share} chains per process, fewer than the "
                                 f"{self.num_classes} classes; class-conditional sampling needs at least one per class")
            self.buffer = ReplayBuffer(share, self.input_shape, num_classes=self.num_classes,
                                       reinit_freq=cfg.reinit_freq, device=self.device, generator=self.generator)
        self.monitor = DivergenceMonitor(cfg.max_abs_loss, cfg.max_abs_energy, cfg.energy_gap_band, cfg.gap_patience)
        self.policy = RecoveryPolicy(cfg.seed, sampling=cfg.samples)
        self.metrics = MetricsLog(self.out / "metrics.csv")  # kept on every rank, written by rank 0
        # counters
        self.epoch = 0  # completed epochs
        self.batch = 0  # iterations done in the current epoch
        self.step = 0  # global iteration counter
        self.perm: torch.Tensor | None = None
        self.lab_perm: torch.Tensor | None = None
        self.lab_pos = 0
        self.best_val_acc: float | None = None
        self.best_epoch: int | None = None
        self.recoveries = 0
        self.adjustments = Adjustments()
        self.elapsed = 0.0
        self.epoch_stats = EpochStats(self.device)
        self._build_step()
        if ckpt is not None:
            self._restore(ckpt)
            self._build_step()

    def _make_optimizer(self) -> torch.optim.Optimizer:
        cfg = self.config
        params = self.model.parameters()
        if cfg.optimizer == "adam":
            return torch.optim.Adam(params, lr=cfg.lr, betas=(0.9, 0.999), weight_decay=cfg.weight_decay)
        return torch.optim.SGD(params, lr=cfg.lr, momentum=cfg.momentum, weight_decay=cfg.weight_decay)

    def _reseed(self, seed: int) -> None:
        """Seed every generator; under DDP the trainer's generator gets this rank's own stream."""
        reseed(seed, self.generator)
        parallel.seed_generator(self.generator, seed, self.ctx)

    def _effective(self) -> TrainConfig:
        """The configuration with recovery adjustments applied (what is actually running)."""
        adj = self.adjustments
        changes: dict[str, Any] = {}
        if adj.sgld_steps is not None:
            changes["sgld_steps"] = adj.sgld_steps
        if adj.energy_l2 is not None:
            changes["energy_l2"] = adj.energy_l2
        return self.config.replace(**changes) if changes else self.config

    def _build_step(self) -> None:
        cfg = self._effective()
        self.sgld = cfg.sgld()
        weights = Weights(pyx=cfg.pyx_weight, px=cfg.px_weight, pxy=cfg.pxy_weight, l2=cfg.energy_l2)
        options = StepOptions(sigma=cfg.sigma, short_run=cfg.short_run, class_cond_px=cfg.class_cond_px,
                              fastpath=self.fastpath)
        self.train_step = TrainStep(self.model, self.optimizer, sgld=self.sgld, buffer=self.buffer, weights=weights,
                                    num_classes=self.num_classes, input_shape=self.input_shape, augment=self.augment,
                                    generator=self.generator, options=options, forward=self.forward_model,
                                    sample_forward=self.sample_model)

    # -- checkpoints ---------------------------------------------------------------------------
    def config_record(self) -> dict[str, Any]:
        """The full configuration as stored: effective SGLD settings, sigma, and resolved values."""
        record = self.config.to_dict()
        effective = self._effective()
        record["sgld"] = effective.sgld().settings()  # what sampling really uses (recovery may raise steps)
        record["effective"] = {"sgld_steps": effective.sgld_steps, "energy_l2": effective.energy_l2,
                               "lr_scale": self.adjustments.lr_scale}
        record["resolved"] = {
            "device": str(self.device), "fastpath": self.fastpath.settings(),
            "augment": self.augment.settings(), "data": self.data.describe(),
            "world_size": self.ctx.world_size, "backend": self.ctx.backend,
            "per_rank_batch": self._batches()[1], "per_rank_buffer": None if self.buffer is None else len(self.buffer),
        }
        return record

    def _rank_state(self) -> dict[str, Any]:
        """What differs between ranks: data shard position, random streams, unreduced epoch sums."""
        return {
            "perm": None if self.perm is None else self.perm.cpu(),
            "lab_perm": None if self.lab_perm is None else self.lab_perm.cpu(), "lab_pos": self.lab_pos,
            "rng": capture_rng(self.generator),
            "epoch_stats": self.epoch_stats.state() if self.batch else None,
        }

    def _training_state(self) -> dict[str, Any]:
        """Everything a resume needs (a collective under DDP: every rank's state is gathered)."""
        mine = self._rank_state()
        ranks = parallel.gather_objects(mine)
        return {
            "epoch": self.epoch, "batch": self.batch, "step": self.step,
            "world_size": self.ctx.world_size,
            **mine,  # rank 0's (the whole state in a single process)
            "ranks": ranks if self.ctx.distributed else None,
            "best_val_acc": self.best_val_acc, "best_epoch": self.best_epoch,
            "recoveries": self.recoveries, "adjustments": self.adjustments.as_dict(),
            "optimizer": self.optimizer.state_dict(),
            "scheduler": {"kind": "linear warm-up + step decay", "base_lr": self.config.lr,
                          "warmup_iters": self.config.warmup_iters, "decay_epochs": list(self.config.decay_epochs),
                          "decay_rate": self.config.decay_rate, "lr_scale": self.adjustments.lr_scale},
            "metrics": self.metrics.state(),
            "elapsed": self.elapsed,
        }

    def _provenance(self, **training: Any) -> dict[str, Any]:
        record = provenance(command="train", device=self.device, seed=self.config.seed, settings=self.config_record())
        record["training"] = {"epoch": self.epoch, "step": self.step, **training}
        return record

    def _gathered_buffer(self) -> torch.Tensor | None:
        """The replay buffer to save: every rank's chains in rank order (a collective under DDP)."""
        return None if self.buffer is None else D.all_gather_cat(self.buffer.data)

    def _save_last(self) -> Path:
        """Write last.pt (rank 0; every rank joins the gathers, then waits for the file)."""
        buffer, state = self._gathered_buffer(), self._training_state()
        path = self.out / "last.pt"
        if self.ctx.is_main:
            save_checkpoint(path, self.model, dataset=self.config.dataset, replay_buffer=buffer,
                            training_state=state, config=self.config_record(),
                            provenance=self._provenance(best_val_acc=self.best_val_acc))
        D.barrier()
        return path

    def _save_best(self, val_acc: float | None, train_acc: float) -> Path:
        """Write best.pt (rank 0; a collective under DDP like :meth:`_save_last`)."""
        buffer = self._gathered_buffer()
        path = self.out / "best.pt"
        if self.ctx.is_main:
            save_checkpoint(path, self.model, dataset=self.config.dataset, replay_buffer=buffer,
                            config=self.config_record(),
                            provenance=self._provenance(val_acc=val_acc, train_acc=train_acc))
        D.barrier()
        return path

    def _write_metrics(self) -> None:
        if self.ctx.is_main:
            self.metrics.write()

    def _restore(self, ckpt: dict, *, keep_history: bool = False) -> None:
        """Load weights, optimizer, buffer, counters and RNG from a checkpoint of this run.

        ``keep_history`` (rollback) keeps the metrics rows, recovery count and adjustments made
        since the checkpoint was written.
        """
        ts = ckpt["training_state"]
        mine = ts["ranks"][self.ctx.rank] if ts.get("ranks") else ts
        self.model.net.load_state_dict(ckpt["state_dict"])
        self.optimizer.load_state_dict(ts["optimizer"])
        if self.buffer is not None and ckpt.get("replay_buffer") is not None:
            share = len(self.buffer)
            chunk = ckpt["replay_buffer"][self.ctx.rank * share:(self.ctx.rank + 1) * share]
            self.buffer.data.copy_(chunk.to(self.buffer.data.device))
        restore_rng(mine["rng"], self.generator)
        self.epoch, self.batch, self.step = int(ts["epoch"]), int(ts["batch"]), int(ts["step"])
        self.perm = None if mine["perm"] is None else mine["perm"].to(self.generator.device)
        self.lab_perm = None if mine["lab_perm"] is None else mine["lab_perm"].to(self.generator.device)
        self.lab_pos = int(mine["lab_pos"])
        self.best_val_acc, self.best_epoch = ts["best_val_acc"], ts["best_epoch"]
        self.elapsed = float(ts.get("elapsed", 0.0))
        self.epoch_stats = EpochStats(self.device, mine.get("epoch_stats"))
        if not keep_history:
            self.metrics = MetricsLog(self.metrics.path, ts["metrics"])
            self.recoveries = int(ts["recoveries"])
            self.adjustments = Adjustments.from_dict(ts["adjustments"])
        self.monitor.reset()

    # -- recovery ------------------------------------------------------------------------------
    def _recover(self, div: Divergence) -> None:
        cfg = self.config
        attempt = self.recoveries + 1
        where = f"epoch {self.epoch + 1}, step {div.step}"
        self._log_event(f"diverged at {where}: {div.reason}", step=div.step)
        if attempt > cfg.max_recoveries:
            self.metrics.add(epoch=self.epoch + 1, step=div.step, event=f"gave up: recovery budget of {cfg.max_recoveries} spent")
            self._write_metrics()
            raise TrainingDiverged(
                f"training diverged at {where} ({div.reason}) and the recovery budget is spent "
                f"({cfg.max_recoveries} rollbacks); last good state: {str(self.out / 'last.pt')!r}; try a smaller --lr, "
                "more --sgld-steps, --energy-l2 0.1 or a larger --max-recoveries"
            )
        ckpt = read_checkpoint(self.out / "last.pt")
        self._restore(ckpt, keep_history=True)
        self.adjustments, changes = self.policy.apply(attempt, self.adjustments, cfg)
        self.recoveries = attempt
        self._reseed(self.adjustments.seed)
        self._build_step()
        self._log_event(f"recovered (attempt {attempt}/{cfg.max_recoveries}): rollback to epoch {self.epoch} "
                        f"(step {self.step}), {', '.join(changes)}", step=self.step)
        self._save_last()
        self._write_metrics()

    def _log_event(self, text: str, *, step: int) -> None:
        """A metrics row (epoch = the epoch in progress, 1-based) and the same line on stderr."""
        self.metrics.add(epoch=self.epoch + 1, step=step, event=text, lr=self._lr(), sgld_steps=self.sgld.steps)
        if self.ctx.is_main:
            print(f"jemeval train: {text}", file=sys.stderr, flush=True)

    def _check(self) -> None:
        """The divergence check, decided by all ranks together: if any rank diverged, all roll back."""
        try:
            self.monitor.check()
            local = None
        except Divergence as div:
            local = div
        if parallel.any_rank(local is not None, self.device) and local is None:
            local = Divergence("divergence detected on another process", self.step)
        if local is not None:
            raise local

    # -- the loop ------------------------------------------------------------------------------
    def _lr(self) -> float:
        cfg = self.config
        return learning_rate(cfg.lr, self.step, self.epoch, warmup_iters=cfg.warmup_iters, decay_epochs=cfg.decay_epochs,
                             decay_rate=cfg.decay_rate, scale=self.adjustments.lr_scale)

    def _batches(self) -> tuple[int, int]:
        """(iterations per epoch, this rank's batch): n // global batch iterations, the global
        batch split evenly over the ranks."""
        n = len(self.data.x)
        bs = min(self.config.batch_size, n)
        return n // bs, bs // self.ctx.world_size

    def _next_labelled(self, n: int) -> torch.Tensor:
        """The next ``n`` labelled indices, cycling through seeded permutations of the labelled set."""
        chunks, need = [], n
        total = len(self.data.labelled)
        while need > 0:
            if self.lab_perm is None or self.lab_pos >= total:
                self.lab_perm = torch.randperm(total, generator=self.generator, device=self.generator.device)
                self.lab_pos = 0
            take = min(need, total - self.lab_pos)
            chunks.append(self.lab_perm[self.lab_pos:self.lab_pos + take])
            self.lab_pos += take
            need -= take
        return self.data.labelled[torch.cat(chunks).to(self.data.labelled.device)]

    def _injection(self) -> str | None:
        spec = self.config.inject_divergence
        if not spec or self.step != int(spec.get("step", -1)) or self._injections >= int(spec.get("times", 1)):
            return None
        self._injections += 1
        return str(spec.get("kind", "nan"))

    def _progress(self, total: int):
        from tqdm.auto import tqdm

        disable = None if self.config.progress is None else not self.config.progress
        if not self.ctx.is_main:
            disable = True
        return tqdm(total=total, initial=self.batch, desc=f"epoch {self.epoch + 1}/{self.config.epochs}", unit="it",
                    file=sys.stderr, disable=disable, leave=False, dynamic_ncols=True)

    def _run_epoch(self) -> bool:
        """One (possibly resumed) epoch; False when stopped by a signal/request."""
        data, device = self.data, self.device
        nb, bs = self._batches()
        if self.perm is None:  # the same (seed, epoch) permutation on every rank, dealt out
            self.perm = D.shard_indices(len(data.x), self.ctx.rank, self.ctx.world_size, self.config.seed,
                                        self.epoch).to(self.generator.device)
        started = time.perf_counter()
        bar = self._progress(nb)
        try:
            for b in range(self.batch, nb):
                idx = self.perm[b * bs:(b + 1) * bs].to(data.x.device)
                if data.labelled is None:
                    x_lab, y_lab, x_data = data.x[idx], data.y[idx], None
                else:
                    lab = self._next_labelled(bs)
                    x_lab, y_lab, x_data = data.x[lab], data.y[lab], data.x[idx].to(device, non_blocking=True)
                lr = self._lr()
                for group in self.optimizer.param_groups:
                    group["lr"] = lr
                stats = self.train_step(x_lab.to(device, non_blocking=True), y_lab.to(device, non_blocking=True),
                                        x_data, inject=self._injection())
                self.epoch_stats.add(stats, len(y_lab))
                self.monitor.record(self.step, stats)
                self.step += 1
                self.batch = b + 1
                bar.update(1)
                if self.step % self.config.check_every == 0:
                    self._check()
                    if not bar.disable:
                        m = self.epoch_stats.means()
                        bar.set_postfix(loss=f"{m['loss']:.3g}", acc=f"{m['train_acc']:.3f}",
                                        E_data=f"{m['e_data']:.3g}", E_q=f"{m['e_sample']:.3g}", refresh=False)
                if self.on_step is not None:
                    self.on_step(self)
                if self._stop_requested(at_check=self.step % self.config.check_every == 0):
                    self._check()  # never save a diverged state
                    self.epoch_stats.seconds += time.perf_counter() - started
                    self.elapsed += time.perf_counter() - started
                    return False
            self._check()
        finally:
            bar.close()
        self._end_epoch(started)
        return True

    def _stop_requested(self, at_check: bool = True) -> bool:
        """A stop request (signal, :meth:`request_stop`) stops the run at this iteration.

        Under DDP the ranks agree on it (a collective with a host sync) only at the divergence-check
        iterations, so a stop waits at most ``check_every`` iterations and no sync is added per step.
        """
        if self.ctx.distributed:
            if not at_check:
                return False
            if parallel.any_rank(self._stop_reason is not None, self.device):
                self._stop_reason = self._stop_reason or "stop requested on another process"
        return bool(self._stop_reason)

    def _end_epoch(self, started: float) -> None:
        """Validation, metrics row, best.pt, grids, last.pt, metrics.csv, one stderr line."""
        cfg = self.config
        m = self.epoch_stats.means(pooled=True)
        prior = self.epoch_stats.seconds  # time spent on this epoch before a resume
        train_seconds = prior + (time.perf_counter() - started)
        val_acc = accuracy(self.model, self.data.x_val, self.data.y_val, batch_size=cfg.eval_batch_size,
                           sigma=cfg.eval_sigma, seed=cfg.seed)
        lr = self._lr_used()
        self.epoch += 1
        self.batch = 0
        self.perm = None
        self.epoch_stats = EpochStats(self.device)
        improved = val_acc is None or self.best_val_acc is None or val_acc > self.best_val_acc
        if improved:
            self.best_val_acc, self.best_epoch = val_acc, self.epoch
            self._save_best(val_acc, m["train_acc"])
        if cfg.samples and cfg.grid_every and self.epoch % cfg.grid_every == 0 and self.ctx.is_main:
            from jemeval.training.visuals import save_epoch_grids

            save_epoch_grids(self.out, self.epoch, model=self.model, sgld=self.sgld, buffer=self.buffer,
                             last_samples=self.train_step.last_samples, class_blocks=self.class_blocks,
                             num_classes=self.num_classes, input_shape=self.input_shape, seed=cfg.seed)
        seconds = prior + (time.perf_counter() - started)
        self.elapsed += time.perf_counter() - started
        rate = m["images"] / train_seconds if train_seconds > 0 else None
        self.metrics.add(epoch=self.epoch, step=self.step, train_acc=m["train_acc"], val_acc=val_acc, loss=m["loss"],
                         loss_pyx=m["pyx"], loss_px=m["px"], loss_pxy=m["pxy"], loss_l2=m["l2"],
                         energy_data=m["e_data"], energy_sample=m["e_sample"], energy_gap=m["e_sample"] - m["e_data"],
                         lr=lr, sgld_steps=self.sgld.steps if cfg.samples else 0, seconds=seconds,
                         images_per_s=rate, event="")
        self._save_last()
        self._write_metrics()
        if cfg.progress is not False and self.ctx.is_main:
            val = "-" if val_acc is None else f"{100 * val_acc:.1f}%"
            energies = f"  E(data) {m['e_data']:.3g}  E(samples) {m['e_sample']:.3g}" if cfg.samples else ""
            print(f"epoch {self.epoch}/{cfg.epochs}  loss {m['loss']:.4g}  train {100 * m['train_acc']:.1f}%  val {val}"
                  f"{energies}  lr {lr:.3g}  {seconds:.1f} s ({rate or 0:.0f} img/s)", file=sys.stderr, flush=True)

    def _lr_used(self) -> float:
        """The rate of the last iteration of the epoch in progress (call before counting it done)."""
        cfg = self.config
        return learning_rate(cfg.lr, max(self.step - 1, 0), self.epoch, warmup_iters=cfg.warmup_iters,
                             decay_epochs=cfg.decay_epochs, decay_rate=cfg.decay_rate, scale=self.adjustments.lr_scale)

    # -- signals -------------------------------------------------------------------------------
    def _on_signal(self, signum, frame) -> None:
        if self._stop_reason:  # a second Ctrl-C aborts at once
            raise KeyboardInterrupt
        name = signal.Signals(signum).name
        self._stop_reason = name
        print(f"\njemeval train: {name} received; saving last.pt after this iteration (again to abort)", file=sys.stderr, flush=True)

    def _install_signals(self) -> dict:
        if threading.current_thread() is not threading.main_thread():
            return {}
        return {sig: signal.signal(sig, self._on_signal) for sig in (signal.SIGINT, signal.SIGTERM)}

    # -- run -----------------------------------------------------------------------------------
    def run(self) -> dict[str, Any]:
        """Train to ``epochs``; returns the summary (on every rank; files come from rank 0)."""
        self._owns_group, self._lock = False, None
        try:
            self._setup()
            return self._run()
        finally:
            if self._lock is not None:
                self._lock.release()
            if self._owns_group:
                D.destroy()

    def _run(self) -> dict[str, Any]:
        cfg = self.config
        self._write_metrics()  # on a resume: from last.pt's rows, which a kill before the CSV write kept
        if not cfg.resume:
            self._save_last()
        previous = self._install_signals()
        status = "completed"
        try:
            while self.epoch < cfg.epochs:
                try:
                    finished = self._run_epoch()
                except Divergence as div:
                    self._recover(div)
                    continue
                if not finished:
                    status = "interrupted"
                    self._save_last()
                    self._write_metrics()
                    if self.ctx.is_main:
                        print(f"jemeval train: stopped ({self._stop_reason}) at epoch {self.epoch + 1}, step {self.step}; "
                              f"saved {self.out / 'last.pt'}; continue with --resume", file=sys.stderr, flush=True)
                    break
        finally:
            for sig, handler in previous.items():
                signal.signal(sig, handler)
        return self._summary(status)

    def _summary(self, status: str) -> dict[str, Any]:
        cfg = self.config
        epoch_rows = [r for r in self.metrics.rows if not r.get("event")]
        last = epoch_rows[-1] if epoch_rows else {}
        test_acc, note = None, None
        if status == "completed" and cfg.test_eval and self.ctx.is_main and (self.out / "best.pt").exists():
            test_acc, note = self._test_accuracy()
        rates = [r["images_per_s"] for r in epoch_rows if r.get("images_per_s")]
        return {
            "status": status,
            "dataset": cfg.dataset,
            "arch": cfg.arch,
            "out": str(self.out),
            "best": str(self.out / "best.pt") if (self.out / "best.pt").exists() else None,
            "last": str(self.out / "last.pt"),
            "metrics": str(self.metrics.path),
            "epochs": self.epoch,
            "steps": self.step,
            "best_epoch": self.best_epoch,
            "best_val_acc": self.best_val_acc,
            "final_train_acc": last.get("train_acc"),
            "final_val_acc": last.get("val_acc"),
            "test_acc": test_acc,
            "test_note": note,
            "recoveries": self.recoveries,
            "world_size": self.ctx.world_size,
            "seconds": self.elapsed,
            "images_per_s": sum(rates) / len(rates) if rates else None,
            "config": self.config_record(),
            "provenance": self._provenance(best_val_acc=self.best_val_acc),
        }

    def _test_accuracy(self) -> tuple[float | None, str | None]:
        """Accuracy of best.pt on the test split (eval_sigma noise; logits once, no gradients)."""
        from jemeval.data import load_dataset, to_arrays

        cfg = self.config
        try:
            test = load_dataset(cfg.dataset, "test", root=cfg.data_root, download=cfg.download)
        except JemevalError as exc:
            return None, f"no test accuracy: {exc}"
        x, y = to_arrays(test)
        best = read_checkpoint(self.out / "best.pt")
        self.model.net.load_state_dict(best["state_dict"])
        note = "npz datasets have no separate test split: this is the accuracy on the same file" if cfg.dataset_name == "npz" else None
        return accuracy(self.model, x, y, batch_size=cfg.eval_batch_size, sigma=cfg.eval_sigma, seed=cfg.seed), note
