"""Running one section for one model: the evaluation function itself, nothing re-implemented.

:func:`run_section` calls the section's function (:data:`jemeval.reports.settings.FUNCTIONS`) with
the checkpoint path, exactly as the single command does, and returns its Results: one, or one per
norm for ``robust``. :func:`failure` turns what a failing section raised into the one line the
report prints in that section's place, so one model's failure never stops the others.
"""
from __future__ import annotations

import os
from typing import Any

from jemeval.context import RunContext, takes_context
from jemeval.errors import JemevalError
from jemeval.reports.settings import FUNCTIONS, ROBUST_NORMS_KEY, epsilons_for
from jemeval.results import Result


@takes_context
def run_section(section: str, model: str | os.PathLike, options: dict[str, Any], *,
                context: RunContext) -> list[Result]:
    """The Results of ``section``'s function for the checkpoint ``model`` with ``options``, run in the
    report's ``context`` (its device, progress and cache policy; the options set what they name)."""
    fn = FUNCTIONS[section]
    if section != "robust":
        return [fn(str(model), **options, context=context)]
    rest = {k: v for k, v in options.items() if k not in (ROBUST_NORMS_KEY, "epsilons")}
    return [fn(str(model), norm=norm, epsilons=epsilons_for(options.get("epsilons"), norm), **rest, context=context)
            for norm in options[ROBUST_NORMS_KEY]]


def failure(exc: Exception) -> str:
    """One line for the page: a jemeval error's own message, else the exception's kind and first line."""
    text = str(exc).strip()
    first = text.splitlines()[0] if text else ""
    if isinstance(exc, JemevalError):
        return first or type(exc).__name__
    return f"unexpected {type(exc).__name__}: {first}" if first else f"unexpected {type(exc).__name__}"
