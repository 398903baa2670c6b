"""Progress reporting: long computations report how far they are, the caller decides how it shows.

A *progress* is a callable ``progress(total, desc, *, unit="it", leave=False) -> ProgressBar``. The
bar it returns takes ``update(n)`` (n more units done), ``describe(text)`` (what runs now),
``note(text)`` (a short status, e.g. a count of model passes inside one long call) and
``close()``; it is also a context manager. Evaluation functions take a ``progress`` argument and
open their bars with :func:`progress_bar`, which accepts:

* ``False``: nothing is shown;
* ``True``: a tqdm bar on stderr;
* ``None`` (the default everywhere): a tqdm bar on stderr when stderr is a terminal;
* any callable of the shape above (a GUI, a logger, a test's recorder).

So computation never draws anything itself and never imports tqdm: this module does, lazily, and
only when a bar is shown. The command line passes :class:`StderrProgress` (stderr keeps stdout
clean for ``--json``).
"""
from __future__ import annotations

import sys
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


class StderrProgress:
    """tqdm bars on stderr: only when stderr is a terminal, or always (``always=True``)."""

    def __init__(self, always: bool = False) -> None:
        self.always = bool(always)

    def __call__(self, total: int, desc: str, *, unit: str = "it", leave: bool = False) -> ProgressBar:
        from tqdm.auto import tqdm

        return TqdmBar(tqdm(total=total, desc=desc, unit=unit, file=sys.stderr, leave=leave,
                            disable=False if self.always else None))

    def __repr__(self) -> str:
        return f"StderrProgress(always={self.always})"


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
