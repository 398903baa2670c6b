"""How long a training run has left, to the end of the epoch in progress and to the end of the run:
what the progress line shows (:meth:`.reporting.Reporter.bar`, on a terminal and in a log).

The estimate comes from what this process measured, never from the settings:

* **Seconds per iteration**: the mean duration of the last :data:`WINDOW` iterations. An iteration
  lasts from the end of the one before it (for the first of an epoch's loop: from the loop's start)
  to its own end, so what happens between the loops (validation, checkpoints and grids at an
  epoch's end; the setup; a resume's restore; a rollback) never counts as an iteration. A recent
  window and not the run's mean, because the rate moves: the first iterations warm up (compile,
  caches), a divergence recovery raises the SGLD steps. On CUDA the loop does not wait for the device
  each iteration, so one duration is the host's; the window's mean is the device's rate once the
  queue is full.
* **The epoch**: its iterations left times the seconds per iteration.
* **The run**: the epoch's time left, plus every iteration of the epochs after it at the same rate,
  plus one epoch end for each epoch not yet ended (the one in progress included) at the mean
  duration of the epoch ends measured so far (validation, best.pt, the sample grids, which come
  every ``grid_every`` epochs and so weigh in at their share, last.pt and metrics.csv: from the loop's
  end to the epoch's line). During the first epoch none has been measured: the estimate leaves the
  epoch ends out until then.
* **Left out**: the test accuracy of best.pt after the last epoch (one pass over the test split
  without gradients, about a validation's cost per image), the rollbacks of divergences that have
  not happened yet, and the summary.
"""
from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable

#: iterations whose mean duration is the rate (about the divergence check's horizon: recent, not noisy)
WINDOW = 50


def clock_text(seconds: float) -> str:
    """``MM:SS`` or ``H:MM:SS`` (as tqdm writes its times), rounded to the second."""
    whole = max(int(round(seconds)), 0)
    hours, rest = divmod(whole, 3600)
    minutes, secs = divmod(rest, 60)
    return f"{hours:d}:{minutes:02d}:{secs:02d}" if hours else f"{minutes:02d}:{secs:02d}"


class TimeLeft:
    """The measurements of one run and the estimate made from them (see the module docstring).

    The reporter calls :meth:`loop_started` when an epoch's loop begins, :meth:`iterations_done` after
    each iteration, :meth:`loop_ended` when the loop ends (also by a stop or an error) and
    :meth:`epoch_ended` when the epoch's end (validation, checkpoints) is done; ``clock`` is the
    time in seconds (a test passes its own)."""

    def __init__(self, epochs: int, *, window: int = WINDOW, clock: Callable[[], float] = time.perf_counter) -> None:
        self.epochs = int(epochs)
        self.clock = clock
        self.durations: deque[float] = deque(maxlen=window)
        self.epoch_ends: list[float] = []
        self._last: float | None = None  # when the last iteration (or the loop's start) ended
        self._loop_end: float | None = None

    def loop_started(self) -> None:
        self._last, self._loop_end = self.clock(), None  # a rollback's time before it is no epoch end

    def iterations_done(self, n: int = 1) -> None:
        now = self.clock()
        if self._last is not None and n == 1:
            self.durations.append(now - self._last)
        elif self._last is not None and n > 0:
            self.durations.extend([(now - self._last) / n] * n)
        self._last = now

    def loop_ended(self) -> None:
        self._last, self._loop_end = None, self.clock()

    def epoch_ended(self) -> None:
        """The epoch's end is done: its duration (since :meth:`loop_ended`) joins the mean."""
        if self._loop_end is not None:
            self.epoch_ends.append(self.clock() - self._loop_end)
            self._loop_end = None

    def seconds_per_iteration(self) -> float | None:
        """The mean of the last :data:`WINDOW` iterations (None before the first)."""
        return sum(self.durations) / len(self.durations) if self.durations else None

    def left(self, epoch: int, done: int, per_epoch: int) -> tuple[float, float] | None:
        """(seconds to the end of the epoch, seconds to the end of the run) when ``epoch`` (0-based,
        in progress) has ``done`` of its ``per_epoch`` iterations behind it; None before any was timed."""
        rate = self.seconds_per_iteration()
        if rate is None:
            return None
        this_epoch = max(per_epoch - done, 0) * rate
        later = max(self.epochs - epoch - 1, 0) * per_epoch * rate
        ends = max(self.epochs - epoch, 0) * sum(self.epoch_ends) / len(self.epoch_ends) if self.epoch_ends else 0.0
        return this_epoch, this_epoch + later + ends

    def text(self, epoch: int, done: int, per_epoch: int) -> str:
        """``left: epoch 00:12, run 03:45`` ("" before any iteration was timed)."""
        left = self.left(epoch, done, per_epoch)
        return "" if left is None else f"left: epoch {clock_text(left[0])}, run {clock_text(left[1])}"
