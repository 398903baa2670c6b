"""The training loop, top to bottom: setup, then epochs of iterations, each epoch ended by
validation and checkpoints. Every other job is one call away, in its own module:

* :mod:`.session`   joins the process group, claims the run folder (:mod:`.rundir`), reads last.pt
* :mod:`.parts`     builds data, model, optimizer, replay buffer and the iteration (:mod:`.step`)
* :mod:`.feed`      the images of each iteration; :mod:`.schedule` its learning rate
* :mod:`.recovery`  divergence checks and rollbacks (:mod:`.divergence`)
* :mod:`.checkpointing`  last.pt / best.pt, and restoring them
* :mod:`.reporting` metrics.csv, the progress bar, stderr; :mod:`.summary` the result
* :mod:`.stopping`  Ctrl-C / SIGTERM / :meth:`Trainer.request_stop`: stop after this iteration

A run writes into its folder (``out``, default runs/DATASET): last.pt at the start, after every
epoch, after every recovery and on a stop (mid-epoch positions included; a resume continues
bit-for-bit on CPU); best.pt whenever the validation accuracy improves; metrics.csv (rewritten from
last.pt on every resume); and samples/*.png grids (:mod:`.visuals`). Under ``torchrun`` (or
``jemeval train --nproc N``) the same loop runs on every rank with DistributedDataParallel;
:mod:`.ddp` states what changes.
"""
from __future__ import annotations

import functools
import time
from collections.abc import Callable

from jemeval.evaluation.accuracy import accuracy_on_arrays
from jemeval.training import feed, session
from jemeval.training.checkpointing import restore, save_best, save_last, stored_metrics
from jemeval.training.config import TrainConfig, derive_from_data
from jemeval.training.divergence import Divergence
from jemeval.training.parts import build, make_step
from jemeval.training.recovery import check, check_validation, recover
from jemeval.training.reporting import Reporter
from jemeval.training.runstate import EpochStats, Progress
from jemeval.training.schedule import run_rate, schedule_warning
from jemeval.training.stopping import StopRequest
from jemeval.training.summary import TrainResult, summarize
from jemeval.training.visuals import save_epoch_grids


class Trainer:
    """Runs one training configuration; :meth:`run` returns its :class:`~.summary.TrainResult`.

    ``on_step(trainer)`` is called after every iteration (``trainer.step`` iterations done); it may
    call :meth:`request_stop`.
    """

    def __init__(self, config: TrainConfig, *, on_step: Callable[[Trainer], None] | None = None) -> None:
        self.config = config.validate()
        self.on_step = on_step
        self.stop = StopRequest()

    def request_stop(self, reason: str = "stop requested") -> None:
        """Finish the current iteration, save last.pt, and return (as on Ctrl-C / SIGTERM)."""
        self.stop.request(reason)

    @property
    def step(self) -> int:
        """Iterations done so far (the global step)."""
        return self.progress.step

    def run(self) -> TrainResult:
        """Train to ``epochs`` (on every rank; files come from rank 0)."""
        with session.opened(self.config) as opened:
            self._setup(opened)
            try:
                status = self._train()
            finally:
                self.report.close()  # the loggers (TensorBoard, wandb, ...), also after an error
            result = summarize(self.parts, self.progress, self.report.metrics, status)
            result.notes.extend(self.notes)
            return result

    def _setup(self, opened: session.Session) -> None:
        # settings a dataset without defaults left to its size, where resolving could not read it yet
        cfg = self.config = derive_from_data(opened.config)
        self.parts = p = build(cfg, opened.ctx, opened.device)
        self.progress = Progress(stats=EpochStats(p.device))
        self.report = Reporter(p.out, main=p.ctx.is_main, progress=cfg.progress, epochs=cfg.epochs,
                               samples=cfg.samples, log_to=cfg.log_to, log_every=cfg.log_every, config=cfg.to_dict())
        if opened.checkpoint is not None:  # a resume: continue exactly where last.pt stopped
            restore(p, self.progress, opened.checkpoint, p.out / "last.pt")
            self.report.restore_rows(stored_metrics(opened.checkpoint))
        self.train_step = make_step(p, self.progress.adjustments)
        warning = schedule_warning(cfg, feed.batch_plan(len(p.data.x), cfg.batch_size, p.ctx.world_size)[0])
        self.notes = [warning] if warning else []
        if warning:
            self.report.note(warning)

    def _train(self) -> str:
        """Epochs until ``epochs`` are done ("completed"), or until a stop ("interrupted")."""
        cfg, s = self.config, self.progress
        self.report.write_metrics()  # on a resume: from last.pt's rows, which a kill before the CSV write kept
        if not cfg.resume:
            save_last(self.parts, s, self.report.metrics)
        with self.stop.on_signals(self.report.signal_received):
            while s.epoch < cfg.epochs:
                try:
                    finished = self._epoch()
                except Divergence as div:  # roll back to last.pt, adjust, go on
                    self.train_step = recover(div, self.parts, s, self.report)
                    continue
                if not finished:
                    save_last(self.parts, s, self.report.metrics)
                    self.report.write_metrics()
                    self.report.stopped(self.stop.reason, s, self.parts.out / "last.pt")
                    return "interrupted"
        return "completed"

    def _epoch(self) -> bool:
        """The iterations of one (possibly resumed) epoch, then its end; False when stopped."""
        cfg, p, s = self.config, self.parts, self.progress
        iterations, size = feed.batch_plan(len(p.data.x), cfg.batch_size, p.ctx.world_size)
        feed.epoch_order(s, len(p.data.x), p.ctx, cfg.seed, p.generator.device)
        started = time.perf_counter()
        with self.report.bar(s, iterations) as bar:
            for b in range(s.batch, iterations):
                x_lab, y_lab, x_data = feed.batch(p.data, s, b, size, p.generator, p.device)
                for group in p.optimizer.param_groups:
                    group["lr"] = run_rate(cfg, s.step, s.epoch, s.adjustments.lr_scale)
                stats = self.train_step(x_lab, y_lab, x_data)
                s.stats.add(stats, len(y_lab))
                p.monitor.record(s.step, stats)
                s.step, s.batch = s.step + 1, b + 1
                bar.update(1)
                self.report.log_iteration(s.step, stats, len(y_lab), p.optimizer.param_groups[0]["lr"])
                at_check = s.step % cfg.check_every == 0
                if at_check:
                    check(p.monitor, s.step, p.device)
                    self.report.show_stats(bar, s.stats)
                if self.on_step is not None:
                    self.on_step(self)
                if self.stop.agreed(p.ctx, p.device, at_check=at_check):
                    check(p.monitor, s.step, p.device)  # never save a diverged state
                    s.stats.seconds += time.perf_counter() - started
                    s.elapsed += time.perf_counter() - started
                    return False
            check(p.monitor, s.step, p.device)
        self._end_epoch(started)
        return True

    def _end_epoch(self, started: float) -> None:
        """Validation (a collapse is a divergence: rolled back), best.pt, sample grids, the metrics row,
        last.pt, metrics.csv, one stderr line."""
        cfg, p, s = self.config, self.parts, self.progress
        m = s.stats.means(pooled=True)
        prior = s.stats.seconds  # time spent on this epoch before a resume
        train_seconds = prior + (time.perf_counter() - started)
        val_acc = accuracy_on_arrays(p.model, p.data.x_val, p.data.y_val, batch_size=cfg.eval_batch_size,
                                     sigma=cfg.eval_sigma, seed=cfg.seed)
        check_validation(val_acc, (s.best_val_acc, s.best_epoch), cfg.max_val_drop, s.step, p.device)
        lr = run_rate(cfg, max(s.step - 1, 0), s.epoch, s.adjustments.lr_scale)  # the epoch's last iteration's
        s.next_epoch()
        if val_acc is None or s.best_val_acc is None or val_acc > s.best_val_acc:
            s.best_val_acc, s.best_epoch = val_acc, s.epoch
            save_best(p, s, val_acc, m["train_acc"])
        sgld, step = self.train_step.sgld, self.train_step
        if cfg.samples and cfg.grid_every and s.epoch % cfg.grid_every == 0 and p.ctx.is_main:
            save_epoch_grids(p.out, s.epoch, model=p.model, sgld=sgld, buffer=p.buffer, last_samples=step.last_samples,
                             class_blocks=cfg.class_blocks, num_classes=p.data.num_classes,
                             input_shape=p.data.input_shape, seed=cfg.seed,
                             log_grid=functools.partial(self.report.log_grid, step=s.step))
        seconds = prior + (time.perf_counter() - started)
        s.elapsed += time.perf_counter() - started
        rate = m["images"] / train_seconds if train_seconds > 0 else None
        row = self.report.epoch_row(s, m, val_acc=val_acc, lr=lr, sgld_steps=sgld.steps if cfg.samples else 0,
                                    seconds=seconds, rate=rate)
        save_last(p, s, self.report.metrics)
        self.report.write_metrics()
        self.report.epoch_line(row)
