"""User-facing errors.

Every mistake a user can make (an unknown name, a missing file, a checkpoint that is not ours)
raises a subclass of :class:`JemevalError` with a one-line message that says what was wrong and
what would be right. The command line turns these into a single ``Error: ...`` line and a
non-zero exit code instead of a traceback; Python callers can catch them as ordinary exceptions.
"""
from __future__ import annotations

import difflib
from collections.abc import Iterable


class JemevalError(Exception):
    """A problem the user can fix; the message is one line and says how."""


class JemevalWarning(UserWarning):
    """Numbers that are computed but need a caveat the user must see (e.g. test images that are also
    training images); the command line prints it as one ``warning: ...`` line on stderr."""


class UsageError(JemevalError, ValueError):
    """A bad argument or option value (exit code 2 on the command line).

    ``param`` names the Python parameter the message is about (``UsageError("lr must be > 0, got
    -1", param="lr")``): the core speaks of parameters, and the command line, which knows which
    flag fills which parameter, shows ``--lr`` in its place (:func:`jemeval.cli.flag_message`).
    """

    def __init__(self, message: str = "", *, param: str | None = None) -> None:
        super().__init__(message)
        self.param = param


class UnknownNameError(UsageError, KeyError):
    """A component name (model, dataset, score, metric, attack) that is not registered."""

    def __str__(self) -> str:  # KeyError would otherwise quote the message
        return str(self.args[0]) if self.args else ""


class DuplicateNameError(JemevalError):
    """Two plugins registered the same name for the same kind of component."""


class PluginError(JemevalError):
    """A plugin failed to load or to register its components."""


class CheckpointError(JemevalError):
    """A checkpoint file is missing, unreadable, not a checkpoint, or does not fit the model."""


class DatasetNotFoundError(JemevalError):
    """A dataset's files are not on disk (and were not to be downloaded)."""


class WriteError(JemevalError):
    """A file could not be written for lack of space (full disk, quota, file-size limit)."""


class TrainingDiverged(JemevalError):
    """Training diverged and the automatic recovery budget is spent."""


def did_you_mean(name: str, choices: Iterable[str], n: int = 3) -> str:
    """Return ``" (did you mean 'x'?)"`` for the closest choices, or ``""`` when none is close."""
    choices = list(choices)
    close = difflib.get_close_matches(name, choices, n=n, cutoff=0.5)
    if not close:
        lowered = {c.lower(): c for c in choices}
        close = [lowered[c] for c in difflib.get_close_matches(name.lower(), list(lowered), n=n, cutoff=0.5)]
    if not close:
        return ""
    return " (did you mean " + " or ".join(repr(c) for c in close) + "?)"
