"""Where a run's numbers go besides metrics.csv: the loggers named by ``log_to`` (TensorBoard, wandb,
a plugin's), found in the registry (``register_loggers``; the contract is in :mod:`jemeval.components`).

:func:`check_loggers` runs while the settings are validated: unknown names, misspelt options and
missing packages fail there, before the run folder is touched. :func:`open_loggers` opens them on
the process that writes files; the trainer reaches them through one :class:`Loggers` (via
:class:`~jemeval.training.reporting.Reporter`), which sends every call to each logger and drops a
logger that raises, with one line on stderr: a broken sink never stops a run.
"""
from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from jemeval.errors import JemevalError
from jemeval.plugins import get_registry
from jemeval.registry import call_with_supported, check_options, parse_spec


def _factory(spec: str) -> tuple[str, Any, dict[str, Any]]:
    parsed = parse_spec(spec)
    factory = get_registry().get("logger", parsed.name)
    options = dict(parsed.options)
    if parsed.variant is not None:
        options["variant"] = parsed.variant
    return parsed.name, factory, options


def check_loggers(specs: Sequence[str]) -> None:
    """Raise a one-line error for a logger spec that cannot work (unknown name, option or package)."""
    for spec in specs:
        name, factory, options = _factory(spec)
        check_options(factory, options, f"logger {name!r}", skip=2)
        check = getattr(factory, "check", None)
        if callable(check):
            call_with_supported(check, **options)


class Loggers:
    """The open loggers of a run, called as one; ``note`` says on stderr when one is dropped."""

    def __init__(self, loggers: list[tuple[str, Any]], note: Callable[[str], None]) -> None:
        self.loggers = loggers
        self.note = note

    def __bool__(self) -> bool:
        return bool(self.loggers)

    def _call(self, method: str, *args: Any) -> None:
        for entry in list(self.loggers):
            name, logger = entry
            fn = getattr(logger, method, None)
            if fn is None:
                continue
            try:
                fn(*args)
            except Exception as exc:  # noqa: BLE001 - any failure of a sink: drop it, keep training
                self.loggers.remove(entry)
                text = (str(exc).strip().splitlines() or [""])[0][:160]
                self.note(f"logger {name!r} failed in {method} ({type(exc).__name__}: {text}) and is switched off; "
                          "metrics.csv keeps every number")

    def scalars(self, values: dict[str, float], step: int) -> None:
        self._call("log_scalars", values, step)

    def image(self, tag: str, image: Any, step: int) -> None:
        self._call("log_image", tag, image, step)

    def close(self) -> None:
        self._call("close")
        self.loggers = []


def open_loggers(specs: Sequence[str], out: Path, config: dict[str, Any], note: Callable[[str], None]) -> Loggers:
    """The loggers ``specs`` name, each writing under ``out/<name>`` (a one-line error if one cannot open)."""
    opened: list[tuple[str, Any]] = []
    try:
        for spec in specs:
            name, factory, options = _factory(spec)
            opened.append((name, call_with_supported(factory, Path(out) / name, config, **options)))
    except JemevalError:
        Loggers(opened, note).close()
        raise
    return Loggers(opened, note)
