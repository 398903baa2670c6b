"""Everything a run tells its user: metrics.csv, the progress bar, the lines on stderr, and the
loggers (TensorBoard, wandb, a plugin's: :mod:`.loggers`).

The loop never prints: the per-epoch line, the divergence and recovery events, the stop note and
the progress bar all go through one :class:`Reporter`. Every rank keeps the metrics rows (they
travel in last.pt); rank 0 alone writes metrics.csv, prints and logs. With ``progress=False`` (the
setting) there is no bar and no per-epoch line; events and notes are always printed. The loggers get
the iteration's statistics every ``log_every`` iterations (rank 0's batch), each epoch's metrics row,
and the epoch's sample grids.

The progress line says the time left to the end of the epoch and to the end of the run
(:mod:`.timeleft` says how it is estimated): on a terminal beside the bar (``left: epoch 00:12, run
03:45 | loss=...``), in a log on each epoch's start line and on a status line at most every
:attr:`Reporter.status_every` seconds (``progress: epoch 1/20: 31/50 it, 60.2 s (left: epoch 00:37, run
31:40)``).

metrics.csv (:class:`MetricsLog`) has one row per epoch, plus one per divergence event, rewritten
atomically. The rows also travel inside ``last.pt``, and every start and resume rewrites the file
from them: a kill between the checkpoint and the CSV write cannot leave the CSV a row short for good.
Read it with ``pandas.read_csv(path)``; the ``event`` column is empty on ordinary epochs and says what
happened otherwise ("diverged: ...", "recovered: rollback to epoch 3, reseed 1001, lr 5e-05").
"""
from __future__ import annotations

import csv
import io
import math
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from tqdm.auto import tqdm

from jemeval.atomic import write_text_atomic
from jemeval.plots.grids import grid_image
from jemeval.progress import LineBar, stderr_is_terminal
from jemeval.runtime.launch import quiet_worker
from jemeval.training.loggers import Loggers, open_loggers
from jemeval.training.position import EpochStats, RunPosition
from jemeval.training.timeleft import TimeLeft

COLUMNS = (
    "epoch", "step", "train_acc", "val_acc", "loss", "loss_pyx", "loss_px", "loss_pxy", "loss_l2",
    "energy_data", "energy_sample", "energy_gap", "lr", "sgld_steps", "seconds", "images_per_s", "event",
)

#: the iteration statistics the loggers get as train/<name> (the step's own values, not epoch means)
LOGGED_STATS = {"loss": "loss", "pyx": "loss_pyx", "px": "loss_px", "pxy": "loss_pxy", "l2": "loss_l2",
                "e_data": "energy_data", "e_sample": "energy_sample"}


def _cell(value: Any) -> Any:
    if value is None:
        return ""
    if isinstance(value, float):
        return "" if math.isnan(value) else f"{value:.6g}"
    return value


class MetricsLog:
    """The rows of metrics.csv (:data:`COLUMNS`), and the file."""

    def __init__(self, path: str | Path, rows: list[dict] | None = None) -> None:
        self.path = Path(path)
        self.rows: list[dict] = [dict(r) for r in (rows or [])]

    def add(self, **row: Any) -> dict:
        unknown = set(row) - set(COLUMNS)
        if unknown:
            raise KeyError(f"unknown metrics columns {sorted(unknown)}")
        full = {c: row.get(c) for c in COLUMNS}
        self.rows.append(full)
        return full

    def to_csv(self) -> str:
        buf = io.StringIO()
        writer = csv.writer(buf, lineterminator="\n")
        writer.writerow(COLUMNS)
        for row in self.rows:
            writer.writerow([_cell(row.get(c)) for c in COLUMNS])
        return buf.getvalue()

    def write(self) -> Path:
        return write_text_atomic(self.path, self.to_csv())

    def state(self) -> list[dict]:
        """Plain rows for the checkpoint (floats, ints, strings, None)."""
        return [dict(r) for r in self.rows]


def note(text: str) -> None:
    """One ``jemeval train: ...`` line on stderr (also for the run folder's notes, :mod:`.rundir`)."""
    print(f"jemeval train: {text}", file=sys.stderr, flush=True)


#: tqdm's bar without its own estimate of the time left (the postfix holds the run's, :mod:`.timeleft`)
BAR_FORMAT = "{l_bar}{bar}| {n_fmt}/{total_fmt} [{elapsed}, {rate_fmt}{postfix}]"


class EpochBar:
    """The bar of the epoch in progress (a tqdm bar, :class:`~jemeval.progress.LineBar` lines, or a
    disabled bar), keeping the time left (:class:`~.timeleft.TimeLeft`) up to date: every iteration is
    timed; a shown bar gets the estimate in front of its statistics (worked out again at most every
    :attr:`redraw` seconds: it shows whole seconds), lines get a status line at most every ``every``
    seconds. Ending the block ends the epoch's loop (the epoch's end is timed from there)."""

    redraw = 0.5

    def __init__(self, bar: tqdm | LineBar, time_left: TimeLeft, *, epoch: int, done: int, total: int,
                 every: float) -> None:
        self.bar, self.time_left, self.every = bar, time_left, every
        self.epoch, self.done, self.total = epoch, done, total
        self.lines = isinstance(bar, LineBar)
        self.stats = ""  # the running means (set_postfix), shown after the time left
        self.last_line = self.last_text = time_left.clock()

    @property
    def disable(self) -> bool:
        """As tqdm's: True when no bar is drawn (callers skip the host sync of its statistics)."""
        return self.bar.disable

    def update(self, n: int = 1) -> None:
        self.time_left.iterations_done(n)
        self.done += n
        if self.lines:
            self.bar.update(n)
            now = self.time_left.clock()
            if now - self.last_line >= self.every:
                self.bar.status(self.time_left.text(self.epoch, self.done, self.total))
                self.last_line = now
            return
        if not self.bar.disable and self.time_left.clock() - self.last_text >= self.redraw:
            self._postfix()  # before the update, whose redraw shows it
        self.bar.update(n)

    def set_postfix(self, refresh: bool = False, **values: str) -> None:
        """The epoch's statistics beside the bar (as tqdm's ``set_postfix``, after the time left)."""
        self.stats = ", ".join(f"{key}={value}" for key, value in values.items())
        self._postfix(refresh)

    def _postfix(self, refresh: bool = False) -> None:
        self.last_text = self.time_left.clock()
        left = self.time_left.text(self.epoch, self.done, self.total)
        self.bar.set_postfix_str(" | ".join(text for text in (left, self.stats) if text), refresh=refresh)

    def __enter__(self) -> EpochBar:
        return self

    def __exit__(self, *exc) -> None:
        self.time_left.loop_ended()
        self.bar.__exit__(*exc)


class Reporter:
    """metrics.csv (``metrics``), the progress bar and the stderr lines of one run."""

    #: in a log (stderr no terminal): a status line with the time left at most this often, in seconds
    status_every = 60.0

    def __init__(self, out: Path, *, main: bool, show_progress: bool | None, epochs: int, samples: bool,
                 log_to: tuple[str, ...] = (), log_every: int = 10, config: dict | None = None,
                 clock: Callable[[], float] = time.perf_counter) -> None:
        self.metrics = MetricsLog(out / "metrics.csv")
        self.main = main  # rank 0: the one that writes and prints
        #: TrainConfig.progress: None, tqdm decides (a bar on a terminal); False, no bar and no epoch lines
        self.show_progress = show_progress
        self.epochs = epochs
        self.samples = samples  # the epoch line shows sample energies only when training samples
        self.log_every = log_every
        self.loggers = open_loggers(log_to, out, config or {}, self.note) if main and log_to else Loggers([], note)
        self.time_left = TimeLeft(epochs, clock=clock)  # ``clock``: seconds (a test's own, for exact estimates)

    # -- metrics.csv ---------------------------------------------------------------------------
    def restore_rows(self, rows: list[dict]) -> None:
        """Continue the rows saved in last.pt (a resume rewrites metrics.csv from them)."""
        self.metrics = MetricsLog(self.metrics.path, rows)

    def write_metrics(self) -> None:
        if self.main:
            self.metrics.write()

    def epoch_row(self, position: RunPosition, means: dict[str, float], *, val_acc: float | None, lr: float,
                  sgld_steps: int, seconds: float, rate: float | None) -> dict[str, Any]:
        """The row of the epoch just completed (``means``: its pooled means, see
        :meth:`.position.EpochStats.means`), also sent to the loggers as ``epoch/<column>``."""
        row = self.metrics.add(
            epoch=position.epoch, step=position.step, train_acc=means["train_acc"], val_acc=val_acc,
            loss=means["loss"], loss_pyx=means["pyx"], loss_px=means["px"], loss_pxy=means["pxy"],
            loss_l2=means["l2"], energy_data=means["e_data"], energy_sample=means["e_sample"],
            energy_gap=means["e_sample"] - means["e_data"], lr=lr, sgld_steps=sgld_steps, seconds=seconds,
            images_per_s=rate, event="")
        if self.loggers:
            self.loggers.scalars({f"epoch/{k}": float(v) for k, v in row.items() if k not in ("epoch", "step", "event")
                                  and isinstance(v, (int, float)) and not isinstance(v, bool)}, position.step)
        return row

    def event(self, text: str, *, epoch: int, step: int, lr: float | None = None, sgld_steps: int | None = None,
              echo: bool = True) -> None:
        """A metrics row for an event of ``epoch`` (1-based, the one in progress) and, with ``echo``,
        the same line on stderr."""
        self.metrics.add(epoch=epoch, step=step, event=text, lr=lr, sgld_steps=sgld_steps)
        if echo:
            self.note(text)

    # -- loggers -------------------------------------------------------------------------------
    def log_iteration(self, step: int, stats: dict[str, torch.Tensor], images: int, lr: float) -> None:
        """Every ``log_every`` iterations: the step's own statistics as ``train/<name>`` (a host sync,
        only when a logger is open)."""
        if not self.loggers or step % self.log_every:
            return
        values = {f"train/{name}": float(stats[key]) for key, name in LOGGED_STATS.items() if key in stats}
        values["train/acc"] = float(stats["correct"]) / max(images, 1)
        values["train/lr"] = float(lr)
        self.loggers.scalars(values, step)

    def log_grid(self, tag: str, x: torch.Tensor, nrow: int, *, step: int) -> None:
        """A sample grid (N x C x H x W in [-1, 1], ``nrow`` per row) as ``samples/<tag>``."""
        if self.loggers:
            self.loggers.image(f"samples/{tag}", grid_image(x, nrow), step)

    def close(self) -> None:
        self.loggers.close()

    # -- stderr --------------------------------------------------------------------------------
    def note(self, text: str) -> None:
        if self.main:
            note(text)

    def epoch_line(self, row: dict[str, Any]) -> None:
        """``epoch 3/20  loss ...  train ...%  val ...%  E(data) ...  lr ...  1.2 s (900 img/s)``; called when
        the epoch's end is done, which ends its timing (:meth:`.timeleft.TimeLeft.epoch_ended`)."""
        self.time_left.epoch_ended()
        if self.show_progress is False or not self.main:
            return
        val = "-" if row["val_acc"] is None else f"{100 * row['val_acc']:.1f}%"
        energies = f"  E(data) {row['energy_data']:.3g}  E(samples) {row['energy_sample']:.3g}" if self.samples else ""
        print(f"epoch {row['epoch']}/{self.epochs}  loss {row['loss']:.4g}  train {100 * row['train_acc']:.1f}%  "
              f"val {val}{energies}  lr {row['lr']:.3g}  {row['seconds']:.1f} s ({row['images_per_s'] or 0:.0f} img/s)",
              file=sys.stderr, flush=True)

    def stopped(self, reason: str | None, position: RunPosition, last: Path) -> None:
        self.note(f"stopped ({reason}) at epoch {position.epoch + 1}, step {position.step}; saved {last}; "
                  "continue with --resume")

    @staticmethod
    def signal_received(name: str) -> None:
        """Said by every process that got the signal (each saves its part of last.pt), except the
        workers of ``--nproc`` other than rank 0 (one terminal: rank 0 says it for all)."""
        if quiet_worker():
            return
        print(f"\njemeval train: {name} received; saving last.pt after this iteration (again to abort)",
              file=sys.stderr, flush=True)

    # -- the progress bar ----------------------------------------------------------------------
    def bar(self, position: RunPosition, total: int) -> EpochBar:
        """The bar of the epoch in progress (a context manager; off on ranks other than 0), with the time
        left. By the rule of :mod:`jemeval.progress`: with ``progress=None`` a stderr that is no terminal
        (a log) gets the epoch's start line instead, status lines while it runs, and :meth:`epoch_line`
        ends it, so a long first epoch is not silent."""
        desc = f"epoch {position.epoch + 1}/{self.epochs}"
        self.time_left.loop_started()
        left = self.time_left.text(position.epoch, position.batch, total)
        if self.main and self.show_progress is None and not stderr_is_terminal():
            bar = LineBar(total, desc, unit="it", initial=position.batch, end_line=False, start_note=left)
        else:
            disable = True if not self.main else None if self.show_progress is None else not self.show_progress
            bar = tqdm(total=total, initial=position.batch, desc=desc, unit="it", file=sys.stderr, disable=disable,
                       leave=False, dynamic_ncols=True, bar_format=BAR_FORMAT, postfix=left or None)
        return EpochBar(bar, self.time_left, epoch=position.epoch, done=position.batch, total=total,
                        every=self.status_every)

    @staticmethod
    def show_stats(bar: EpochBar, stats: EpochStats) -> None:
        """The epoch's running means on the bar (a host sync, so only when the bar is shown)."""
        if not bar.disable:
            means = stats.means()
            bar.set_postfix(loss=f"{means['loss']:.3g}", acc=f"{means['train_acc']:.3f}",
                            E_data=f"{means['e_data']:.3g}", E_q=f"{means['e_sample']:.3g}", refresh=False)
