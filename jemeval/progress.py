"""Progress reporting: long computations report how far they are, the caller decides how it shows.

A *progress* is a callable ``progress(total, desc, *, unit="it", leave=False) -> ProgressBar``. The
bar it returns takes ``update(n)`` (n more units done), ``describe(text)`` (what runs now),
``note(text)`` (a short status, e.g. a count of model passes inside one long call) and
``close()``; it is also a context manager. Evaluation functions take a ``progress`` argument and
open their bars with :func:`progress_bar`, which accepts:

* ``False``: nothing is shown;
* ``True``: a tqdm bar on stderr (``tqdm.auto``: a widget in a notebook);
* ``None`` (the default everywhere): a tqdm bar on stderr when stderr is a terminal;
* any callable of the shape above (a GUI, a logger, a test's recorder).

So computation never draws anything itself and never imports tqdm: this module does, lazily, and
only when a bar is shown. The command line passes :func:`command_line`: a bar on a terminal and,
when stderr is a pipe or a file (a log, CI), one line per stage instead (:class:`LineBar`: its
start, a line when the stage's description changes, its end with counts and seconds), never a
bar's carriage returns: a redirected 10-minute run fills its log as it goes. The rule is
:meth:`StderrProgress.__call__`'s, and the trainer's epoch bar follows it too (stderr keeps stdout
clean for ``--json``).
"""
from __future__ import annotations

import sys
import time
from collections.abc import Callable

from jemeval.errors import UsageError


class ProgressBar:
    """A bar that shows nothing: what ``progress=False`` gives, and the base of every bar."""

    def update(self, n: int = 1) -> None:
        """``n`` more units of the total are done."""

    def describe(self, text: str) -> None:
        """What is running now (replaces the description given when the bar was opened)."""

    def note(self, text: str) -> None:
        """A short status beside the count, for work that moves inside one unit."""

    def close(self) -> None:
        """The work is over (also when it failed)."""

    def __enter__(self) -> ProgressBar:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


#: what evaluation functions accept as ``progress``
Progress = Callable[..., ProgressBar]
ProgressArg = bool | Progress | None


def silent(total: int, desc: str, *, unit: str = "it", leave: bool = False) -> ProgressBar:
    """The progress that shows nothing."""
    return ProgressBar()


class TqdmBar(ProgressBar):
    """A tqdm bar behind the :class:`ProgressBar` interface."""

    def __init__(self, bar) -> None:
        self.bar = bar

    def update(self, n: int = 1) -> None:
        self.bar.update(n)

    def describe(self, text: str) -> None:
        self.bar.set_description(text)

    def note(self, text: str) -> None:
        self.bar.set_postfix_str(text, refresh=True)

    def close(self) -> None:
        self.bar.close()


#: what every stage line starts with (a log reader, or a test, tells progress from messages by it)
LINE_PREFIX = "progress: "


def stderr_is_terminal() -> bool:
    """Whether ``sys.stderr`` (as it is now: a test or a rank may have replaced it) is a terminal."""
    try:
        return bool(sys.stderr.isatty())
    except (AttributeError, ValueError):  # no isatty, or a closed stream
        return False


def is_progress_line(line: str) -> bool:
    """A line :class:`LineBar` wrote (what a check of a command's messages leaves aside)."""
    return line.startswith(LINE_PREFIX)


class LineBar(ProgressBar):
    """Progress as lines on stderr, for a stderr that is not a terminal: one line when the stage
    starts, one when its description changes (the next step of the same stage), one when it ends
    (done/total and seconds; with ``end_line=False`` the caller writes its own). Counts and notes in
    between print nothing: a log gets a few lines per stage, never a bar redrawn with carriage
    returns; a caller whose stage runs long may add a :meth:`status` line now and then (``start_note``
    is the same text on the start line). A stage that ends by an exception says nothing more (the
    error is the one line)."""

    #: as a disabled tqdm bar: callers that would refresh a bar's text (a host sync) skip it
    disable = True

    def __init__(self, total: int, desc: str, *, unit: str = "it", initial: int = 0, end_line: bool = True,
                 start_note: str = "") -> None:
        self.total, self.desc, self.unit, self.done = int(total), desc or "progress", unit, int(initial)
        self.stage, self.end_line, self.closed = self.desc, end_line, False
        self.started = time.perf_counter()
        done = f"{self.done}/" if self.done else ""
        self._line(f"{self.desc}: {done}{self.total} {unit} ...{f' ({start_note})' if start_note else ''}")

    def _line(self, text: str) -> None:
        print(f"{LINE_PREFIX}{text}", file=sys.stderr, flush=True)

    def _seconds(self) -> str:
        return f"{time.perf_counter() - self.started:.1f} s"

    def update(self, n: int = 1) -> None:
        self.done += n

    def status(self, text: str) -> None:
        """A line in the middle of the stage: the count so far, the seconds, and ``text``."""
        self._line(f"{self.desc}: {self.done}/{self.total} {self.unit}, {self._seconds()} ({text})")

    def describe(self, text: str) -> None:
        if text and text != self.stage:
            self.stage = text
            self._line(f"{text} ... ({self.done}/{self.total} {self.unit} done, {self._seconds()})")

    def close(self) -> None:
        if not self.closed:
            self.closed = True
            if self.end_line:
                self._line(f"{self.desc}: {self.done}/{self.total} {self.unit} in {self._seconds()}")

    def __exit__(self, exc_type, *exc) -> None:
        if exc_type is not None:
            self.closed = True  # failed or interrupted: the error (or "Aborted!") says so
        self.close()


class StderrProgress:
    """Progress on stderr, by one rule: a tqdm bar when stderr is a terminal (or ``always``: what
    ``progress=True`` asks for, a notebook's widget included); otherwise, with ``lines`` (the command
    line's), one :class:`LineBar` line per stage, and nothing without (``progress=None`` in Python)."""

    def __init__(self, always: bool = False, lines: bool = False) -> None:
        self.always, self.lines = bool(always), bool(lines)

    def __call__(self, total: int, desc: str, *, unit: str = "it", leave: bool = False) -> ProgressBar:
        if self.always or stderr_is_terminal():
            from tqdm.auto import tqdm

            return TqdmBar(tqdm(total=total, desc=desc, unit=unit, file=sys.stderr, leave=leave,
                                disable=False if self.always else None))
        return LineBar(total, desc, unit=unit) if self.lines else ProgressBar()

    def __repr__(self) -> str:
        return f"StderrProgress(always={self.always}, lines={self.lines})"


def command_line() -> StderrProgress:
    """The command line's progress: a bar on a terminal, one line per stage in a pipe or a file."""
    return StderrProgress(lines=True)


def resolve_progress(progress: ProgressArg) -> Progress:
    """The progress callable for what a caller passed as ``progress`` (see the module docstring)."""
    if progress is False:
        return silent
    if progress is None or progress is True:
        return StderrProgress(always=progress is True)
    if callable(progress):
        return progress
    raise UsageError(f"progress must be True, False, None or a callable returning a bar, got {progress!r}",
                     param="progress")


def progress_bar(progress: ProgressArg, total: int, desc: str, *, unit: str = "it",
                 leave: bool = False) -> ProgressBar:
    """Open a bar of ``total`` units for ``progress`` (False, True, None or a progress callable)."""
    return resolve_progress(progress)(total, desc, unit=unit, leave=leave)
