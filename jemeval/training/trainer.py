"""The training run, top to bottom, in the order nanoGPT's train.py reads: entering the run (process
group, run folder, last.pt for a resume), the learning-rate schedule, stop requests, then the loop
(:class:`Trainer`): setup, epochs of iterations, each epoch ended by validation and checkpoints, and
the rollback when the run diverges. Every other job is one call away, in the module that owns it:

* :mod:`.parts`          data, model, optimizer, replay buffer, the seeding, the iteration (:mod:`.step`)
* :mod:`.splits`         the training data, and which images each iteration trains on
* :mod:`.checkpointing`  what last.pt / best.pt hold (the :class:`~.position.RunPosition`, random
  states), and restoring them
* :mod:`.divergence`     detecting a divergence, and the ladder of remedies
* :mod:`.reporting`      metrics.csv, the progress bar, stderr, loggers; :mod:`.summary` the result
* :mod:`.rundir`         the run folder (lock, no silent replacement); :mod:`.ddp` what changes under DDP

A run writes into its folder (``out``, default runs/DATASET): last.pt at the start, after every
epoch, after every recovery and on a stop (mid-epoch positions included; a resume continues
bit-for-bit on CPU); best.pt whenever the validation accuracy improves; metrics.csv (rewritten from
last.pt on every resume); and samples/*.png grids (:mod:`.visuals`). Under ``torchrun`` (or
``jemeval train --nproc N``) the same loop runs on every rank with DistributedDataParallel.
"""
from __future__ import annotations

import functools
import signal
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import torch

from jemeval.deprecations import warn_deprecated
from jemeval.errors import TrainingDiverged
from jemeval.evaluation.accuracy import accuracy_on_arrays
from jemeval.formats.native import read_checkpoint
from jemeval.runtime import distributed as D
from jemeval.runtime.devices import resolve_device
from jemeval.runtime.distributed import DistContext
from jemeval.runtime.memory import TRIM_EVERY, keep_memory_flat
from jemeval.training import ddp, rundir
from jemeval.training.checkpointing import (
    load_resume_checkpoint,
    restore,
    save_best,
    save_last,
    saved_world_size,
    stored_config,
    stored_metrics,
)
from jemeval.training.config import TrainConfig, derive_from_data, resume_config
from jemeval.training.divergence import Divergence, check, check_validation
from jemeval.training.parts import build, make_step, seed_everything
from jemeval.training.position import EpochStats, RunPosition
from jemeval.training.reporting import Reporter
from jemeval.training.splits import batch, epoch_order
from jemeval.training.summary import TrainResult, summarize
from jemeval.training.visuals import save_epoch_grids


# -- entering the run: process group, run folder, last.pt ---------------------------------------------
@dataclass
class Session:
    """The run :func:`opened` entered."""

    config: TrainConfig  # for a resume: the stored configuration with the settings a resume may change
    device: torch.device
    ctx: DistContext
    checkpoint: dict[str, Any] | None  # last.pt of the run a resume continues


@contextmanager
def opened(config: TrainConfig) -> Iterator[Session]:
    """Join the process group, claim the run folder and (for a resume) read last.pt; undone on exit.

    Rank 0 claims the folder (:func:`.rundir.claim`: created, locked against a second trainer, a new
    run refused over an existing one); every rank gets its one-line refusal, so none waits for a failed
    rank 0. A resume reads last.pt under the lock (no other process writes it meanwhile) and takes its
    stored configuration. Leaving releases the lock and the process group, also on errors.
    """
    device = resolve_device(config.device, name="device")
    ctx = ddp.join(device, config.batch_size)
    lock, finished = None, False
    try:
        lock = ddp.on_main(lambda: rundir.claim(config), ctx)
        checkpoint = None
        if config.resume:
            checkpoint, config = _resumed(config, ctx)
        yield Session(config, ctx.device if ctx.distributed else device, ctx, checkpoint)
        finished = True
    finally:
        if lock is not None:
            lock.release()
        if ctx.distributed:
            D.destroy(synchronize=finished)


def _resumed(config: TrainConfig, ctx: DistContext) -> tuple[dict[str, Any], TrainConfig]:
    """last.pt of the run in ``config.out_dir`` and the configuration that continues it."""
    checkpoint = load_resume_checkpoint(config.out_dir)
    given = {k: v for k, v in asdict(config).items() if k != "out"}
    config = resume_config(stored_config(checkpoint), **given, out=config.out)
    ddp.check_world(saved_world_size(checkpoint), ctx, Path(config.out_dir) / "last.pt")
    return checkpoint, config


# -- the learning rate ----------------------------------------------------------------------------------
def learning_rate(base_lr: float, step: int, epoch: int, *, warmup_iters: int = 0,
                  decay_epochs: Sequence[int] = (), decay_rate: float = 1.0, scale: float = 1.0) -> float:
    """The JEM release's schedule at iteration ``step`` (0-based, global) of ``epoch`` (0-based): linear
    warm-up over the first ``warmup_iters`` iterations (lr * (step + 1) / warmup_iters), then the base
    rate times ``decay_rate`` once for every decay epoch reached. A function of the counters only, so it
    needs no scheduler state: a resumed run gets the same rates. ``scale``: divergence recovery's cuts."""
    lr = base_lr * scale * decay_rate ** sum(1 for e in decay_epochs if epoch >= e)
    if step < warmup_iters:
        lr *= (step + 1) / float(warmup_iters)
    return lr


def run_rate(config: TrainConfig, step: int, epoch: int, scale: float = 1.0) -> float:
    """:func:`learning_rate` with a :class:`~.config.TrainConfig`'s settings (``scale``: recovery's)."""
    return learning_rate(config.lr, step, epoch, warmup_iters=config.warmup_iters, decay_epochs=config.decay_epochs,
                         decay_rate=config.decay_rate, scale=scale)


def sampling_weight_scale(config: TrainConfig, step: int) -> float:
    """The share of ``px_weight`` and ``pxy_weight`` in force at iteration ``step`` (0-based): (step + 1)
    / px_warmup_iters during the p(x) warm-up, then 1. A small set's classifier needs its first
    iterations: at full weight from the start a 600-image 10-class RGB folder sat at chance in epochs
    2-4 and ended 0.13 lower (docs/data.md, "Your own RGB images"). Sampling runs from the first
    iteration (the weight is never 0), and the share is a function of the counter only, so a resumed
    run gets the same weights."""
    if step < config.px_warmup_iters:
        return (step + 1) / float(config.px_warmup_iters)
    return 1.0


def schedule_warning(config: TrainConfig, per_epoch: int) -> str | None:
    """One line naming what in ``config``'s schedule cannot happen in a run of ``per_epoch``
    iterations an epoch, or None: a warm-up longer than the run (the lr never reaches ``lr``), a
    decay at or after the last epoch (it never happens), a decay before the warm-up ends. Such a
    run still trains, at rates its settings do not say, so the trainer says it once at the start."""
    total, epochs, warmup = per_epoch * config.epochs, config.epochs, config.warmup_iters
    problems = []
    if warmup > total:
        end = run_rate(config, total - 1, epochs - 1)
        problems.append(f"the warm-up (warmup_iters={warmup}) is longer than the run ({total} iterations: {epochs} "
                        f"epochs of {per_epoch}), so the lr never reaches lr={config.lr:g} (it ends at {end:.2g})")
    late = [e for e in config.decay_epochs if e >= epochs]
    if late:
        one = len(late) == 1
        problems.append(f"decay_epochs {', '.join(map(str, late))} {'is' if one else 'are'} not before the last epoch "
                        f"(epochs={epochs}), so {'that decay never happens' if one else 'those decays never happen'}")
    first = min((e for e in config.decay_epochs if e < epochs), default=None)
    if first is not None and warmup <= total and warmup > first * per_epoch:
        problems.append(f"the first decay (epoch {first}, iteration {first * per_epoch}) comes before the warm-up of "
                        f"{warmup} iterations ends, so the lr never reaches lr={config.lr:g}")
    if not problems:
        return None
    return (f"warning: this schedule cannot complete: {'; '.join(problems)}; set warmup_iters/decay_epochs to fit, or "
            "leave them unset on a dataset without defaults of its own to derive them from its size")


# -- stopping cleanly -------------------------------------------------------------------------------------
class StopRequest:
    """Why the run should stop (None: it should not). Ctrl-C / SIGTERM, or :meth:`Trainer.request_stop`,
    end the run after the current iteration with last.pt saved (mid-epoch positions included), so a
    resume continues exactly; a second Ctrl-C aborts at once. Under DDP the ranks agree on a stop (a
    collective with a host sync) only at the divergence-check iterations: a stop waits at most
    ``check_every`` iterations, and no synchronisation is added per step."""

    def __init__(self) -> None:
        self.reason: str | None = None

    def request(self, reason: str) -> None:
        self.reason = self.reason or reason

    def agreed(self, ctx: DistContext, device: torch.device, *, at_check: bool) -> bool:
        """Whether to stop at this iteration (every rank must call it: a collective under DDP)."""
        if ctx.distributed:
            if not at_check:
                return False
            if ddp.any_rank(self.reason is not None, device):
                self.request("stop requested on another process")
        return bool(self.reason)

    @contextmanager
    def on_signals(self, notify: Callable[[str], None]) -> Iterator[None]:
        """SIGINT and SIGTERM request a stop (``notify(name)`` says so) while the block runs."""
        if threading.current_thread() is not threading.main_thread():
            yield
            return

        def handler(signum, frame) -> None:
            if self.reason:  # a second Ctrl-C aborts at once
                raise KeyboardInterrupt
            name = signal.Signals(signum).name
            self.reason = name
            notify(name)

        previous = {sig: signal.signal(sig, handler) for sig in (signal.SIGINT, signal.SIGTERM)}
        try:
            yield
        finally:
            for sig, old in previous.items():
                signal.signal(sig, old)


# -- the loop ---------------------------------------------------------------------------------------------
class Trainer:
    """Runs one training configuration; :meth:`run` returns its :class:`~.summary.TrainResult`.

    ``on_step(trainer)`` is called after every iteration (``trainer.step`` iterations done); it may
    call :meth:`request_stop`. While running, ``trainer.position`` is where the run stands.
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
        return self.position.step

    @property
    def progress(self) -> RunPosition:
        """The old name of :attr:`position` (0.2)."""
        warn_deprecated("Trainer.progress is now Trainer.position (a RunPosition)")
        return self.position

    def run(self) -> TrainResult:
        """Train to ``epochs`` (on every rank; files come from rank 0)."""
        with opened(self.config) as session:
            self._setup(session)
            try:
                status = self._train()
            finally:
                self.report.close()  # the loggers (TensorBoard, wandb, ...), also after an error
            result = summarize(self.parts, self.position, self.report.metrics, status)
            result.notes.extend(self.notes)
            return result

    def _setup(self, session: Session) -> None:
        # settings a dataset without defaults left to its size, where resolving could not read it yet
        config = self.config = derive_from_data(session.config)
        self.parts = parts = build(config, session.ctx, session.device)
        self.position = RunPosition(stats=EpochStats(parts.device))
        self.report = Reporter(parts.out, main=parts.ctx.is_main, show_progress=config.progress, epochs=config.epochs,
                               samples=config.samples, log_to=config.log_to, log_every=config.log_every,
                               config=config.to_dict())
        if session.checkpoint is not None:  # a resume: continue exactly where last.pt stopped
            restore(parts, self.position, session.checkpoint, parts.out / "last.pt")
            self.report.restore_rows(stored_metrics(session.checkpoint))
        self.train_step = make_step(parts, self.position.adjustments)
        per_epoch = ddp.batch_plan(len(parts.data.x), config.batch_size, parts.ctx.world_size)[0]
        warning = schedule_warning(config, per_epoch)
        self.notes = [*([parts.init_note] if parts.init_note else []), *parts.data.info.get("notes", ()),
                      *([warning] if warning else [])]
        for note in self.notes:  # the data's (images in two splits, entries not read), the schedule's
            self.report.note(note)

    def _train(self) -> str:
        """Epochs until ``epochs`` are done ("completed"), or until a stop ("interrupted")."""
        config, position = self.config, self.position
        self.report.write_metrics()  # on a resume: from last.pt's rows, which a kill before the CSV write kept
        if not config.resume:
            save_last(self.parts, position, self.report.metrics.rows)
        with self.stop.on_signals(self.report.signal_received):
            while position.epoch < config.epochs:
                try:
                    finished = self._epoch()
                except Divergence as divergence:  # roll back to last.pt, adjust, go on
                    self._roll_back(divergence)
                    continue
                if not finished:
                    save_last(self.parts, position, self.report.metrics.rows)
                    self.report.write_metrics()
                    self.report.stopped(self.stop.reason, position, self.parts.out / "last.pt")
                    return "interrupted"
        return "completed"

    def _epoch(self) -> bool:
        """The iterations of one (possibly resumed) epoch, then its end; False when stopped."""
        config, parts, position = self.config, self.parts, self.position
        iterations, size = ddp.batch_plan(len(parts.data.x), config.batch_size, parts.ctx.world_size)
        epoch_order(position, len(parts.data.x), parts.ctx, config.seed, parts.generator.device)
        started = time.perf_counter()
        with self.report.bar(position, iterations) as bar:
            for index in range(position.batch, iterations):
                x_lab, y_lab, x_data = batch(parts.data, position, index, size, parts.generator, parts.device)
                for group in parts.optimizer.param_groups:
                    group["lr"] = run_rate(config, position.step, position.epoch, position.adjustments.lr_scale)
                share = sampling_weight_scale(config, position.step)
                stats = self.train_step(x_lab, y_lab, x_data, sampling_scale=share)
                position.stats.add(stats, len(y_lab))
                parts.monitor.record(position.step, stats)
                position.step, position.batch = position.step + 1, index + 1
                bar.update(1)
                self.report.log_iteration(position.step, stats, len(y_lab), parts.optimizer.param_groups[0]["lr"])
                at_check = position.step % config.check_every == 0
                if position.step % TRIM_EVERY == 0:
                    keep_memory_flat(default_allocator=False)  # a tuned heap's free pages, once it has grown
                if at_check:
                    check(parts.monitor, position.step, parts.device)
                    self.report.show_stats(bar, position.stats)
                if self.on_step is not None:
                    self.on_step(self)
                if self.stop.agreed(parts.ctx, parts.device, at_check=at_check):
                    check(parts.monitor, position.step, parts.device)  # never save a diverged state
                    position.stats.seconds += time.perf_counter() - started
                    position.elapsed += time.perf_counter() - started
                    return False
            check(parts.monitor, position.step, parts.device)
        self._end_epoch(started)
        return True

    def _end_epoch(self, started: float) -> None:
        """Validation (a collapse is a divergence: rolled back), best.pt, sample grids, the metrics row,
        last.pt, metrics.csv, one stderr line."""
        config, parts, position = self.config, self.parts, self.position
        means = position.stats.means(pooled=True)
        prior = position.stats.seconds  # time spent on this epoch before a resume
        train_seconds = prior + (time.perf_counter() - started)
        val_acc = accuracy_on_arrays(parts.model, parts.data.x_val, parts.data.y_val,
                                     batch_size=config.eval_batch_size, sigma=config.eval_sigma, seed=config.seed)
        check_validation(val_acc, (position.best_val_acc, position.best_epoch), config.max_val_drop, position.step,
                         parts.device)
        lr = run_rate(config, max(position.step - 1, 0), position.epoch,
                      position.adjustments.lr_scale)  # the epoch's last iteration's
        position.next_epoch()
        if val_acc is None or position.best_val_acc is None or val_acc > position.best_val_acc \
                or config.best_by == "last":  # a fine-tune keeps its end (recipes.FINETUNE)
            position.best_val_acc, position.best_epoch = val_acc, position.epoch
            save_best(parts, position, val_acc, means["train_acc"],
                      elapsed=position.elapsed + (time.perf_counter() - started))  # this epoch's time included
        self._save_grids()
        seconds = prior + (time.perf_counter() - started)
        position.elapsed += time.perf_counter() - started
        rate = means["images"] / train_seconds if train_seconds > 0 else None
        sgld_steps = self.train_step.sgld.steps if config.samples else 0
        row = self.report.epoch_row(position, means, val_acc=val_acc, lr=lr, sgld_steps=sgld_steps,
                                    seconds=seconds, rate=rate)
        save_last(parts, position, self.report.metrics.rows)
        self.report.write_metrics()
        self.report.epoch_line(row)

    def _save_grids(self) -> None:
        """The sample grids of the epoch just completed, every ``grid_every`` epochs (rank 0)."""
        config, parts, epoch = self.config, self.parts, self.position.epoch
        if not (config.samples and config.grid_every and epoch % config.grid_every == 0 and parts.ctx.is_main):
            return
        save_epoch_grids(parts.out, epoch, model=parts.model, sgld=self.train_step.sgld, buffer=parts.buffer,
                         last_samples=self.train_step.last_samples, class_blocks=config.class_blocks,
                         num_classes=parts.data.num_classes, input_shape=parts.data.input_shape, seed=config.seed,
                         log_grid=functools.partial(self.report.log_grid, step=self.position.step))

    def _roll_back(self, divergence: Divergence) -> None:
        """Divergence never crashes a run: roll back to last.pt, reseed and climb the authors' ladder of
        remedies (:class:`~.divergence.RecoveryPolicy`), rebuilding the iteration with the new settings;
        each attempt is a metrics row and a stderr line. When ``max_recoveries`` is spent, raise
        :class:`~jemeval.errors.TrainingDiverged` with one line saying what to try."""
        config, parts, position = self.config, self.parts, self.position
        attempt = position.recoveries + 1
        where = f"epoch {position.epoch + 1}, step {divergence.step}"
        self._event(f"diverged at {where}: {divergence.reason}", step=divergence.step)
        last = parts.out / "last.pt"
        if attempt > config.max_recoveries:
            self.report.event(f"gave up: recovery budget of {config.max_recoveries} spent", epoch=position.epoch + 1,
                              step=divergence.step, echo=False)
            self.report.write_metrics()
            raise TrainingDiverged(
                f"training diverged at {where} ({divergence.reason}) and the recovery budget is spent "
                f"({config.max_recoveries} rollbacks); last good state: {str(last)!r}; try a smaller lr, "
                "more sgld_steps, energy_l2=0.1 or a larger max_recoveries")
        restore(parts, position, read_checkpoint(last), last, keep_history=True)
        position.adjustments, changes = parts.policy.apply(attempt, position.adjustments, config)
        position.recoveries = attempt
        seed_everything(position.adjustments.seed, parts.generator, parts.ctx)
        self.train_step = make_step(parts, position.adjustments)
        self._event(f"recovered (attempt {attempt}/{config.max_recoveries}): rollback to epoch {position.epoch} "
                    f"(step {position.step}), {', '.join(changes)}", step=position.step)
        save_last(parts, position, self.report.metrics.rows)
        self.report.write_metrics()

    def _event(self, text: str, *, step: int) -> None:
        """An event row with the learning rate and SGLD steps in force, and the line on stderr."""
        position = self.position
        lr = run_rate(self.config, position.step, position.epoch, position.adjustments.lr_scale)
        sgld_steps = position.adjustments.applied_to(self.config).sgld_steps
        self.report.event(text, epoch=position.epoch + 1, step=step, lr=lr, sgld_steps=sgld_steps)
