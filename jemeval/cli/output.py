"""Printing and saving a command's results, and the progress it shows (stderr).

``@output_options`` gives every command the same ``--json`` / ``--csv FILE`` / ``--markdown`` /
``--out FILE.json``; ``emit(result, **output)`` prints the table (or JSON) on stdout and writes the
requested files atomically. Progress and "wrote FILE" messages go to stderr, so ``--json``
stays clean: a bar on a terminal, one ``progress: ...`` line per stage when stderr is a pipe or a
file (:func:`jemeval.progress.command_line`), never a bar's carriage returns in a log.

The output rule: ``--out`` names a command's main product (the JSON result of an evaluation, the
PNG grid of ``sample``, the run folder of ``train``; ``convert`` writes its checkpoint to the
positional OUT); every extra file has its own named option (``--result``, ``--csv``, ``--plot``,
``--grid``, ``--save``, ``--save-scores``).
"""
from __future__ import annotations

import functools
import json
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import click

from jemeval.cli.config import config_record, resolved_options
from jemeval.cli.paths import output_path_option
from jemeval.progress import StderrProgress, command_line

#: help of the JSON result option: the main product (--out) of an evaluation, or an extra file (--result)
RESULT_HELP = {"--out": "Write the full JSON result (records + provenance) to FILE, this command's main product.",
               "--result": "Also write the full JSON result (records + provenance) to FILE."}


def progress(always: bool = False) -> StderrProgress:
    """The progress the commands pass to the computation: a tqdm bar on a terminal, one line per stage
    in a pipe or a file. ``always`` is kept for plugins written against 0.2 (it forced a bar into a
    pipe); progress always shows now, in the form that suits stderr."""
    return command_line()


def is_main_rank() -> bool:
    """False in the ranks other than 0 of a torchrun launch: only rank 0 prints and writes files."""
    return os.environ.get("RANK", "0") == "0"


def write_files(result: Any, *outputs: tuple[str | Path | None, Callable[[Any, Any], Any]]) -> None:
    """Write a command's extra files: each ``(path, writer)`` calls ``writer(result, path)`` and says
    so on stderr; a None path (the option not given) is skipped. Rank 0 alone writes."""
    for path, writer in outputs if is_main_rank() else ():
        if path is not None:
            writer(result, path)
            click.echo(f"wrote {path}", err=True)


def output_options(fn=None, *, result_flag: str = "--out", result_help: str | None = None):
    """--json, --csv FILE, --markdown and the JSON result file (``result_flag``: --out, or --result
    where the command's main product is another file). Usable as ``@output_options`` or
    ``@output_options(result_flag="--result")``."""
    def deco(fn):
        @click.option("--json", "as_json", is_flag=True,
                      help="Print machine-readable JSON (records + provenance) on stdout.")
        @output_path_option("--csv", "csv_path", metavar="FILE",
                            help="Also write the records as CSV (provenance in '# ' comment lines).")
        @click.option("--markdown", "as_markdown", is_flag=True,
                      help="Print a markdown table (with provenance) instead of the plain table.")
        @output_path_option(result_flag, "out_path", metavar="FILE", help=result_help or RESULT_HELP[result_flag])
        @functools.wraps(fn)
        def wrapper(*args, **kwargs):
            return fn(*args, **kwargs)

        return wrapper

    return deco(fn) if fn is not None else deco


def config_provenance() -> dict | None:
    """The config file the running command read (:mod:`jemeval.cli.config`) and the option values it
    ran with, as recorded in ``provenance["config"]``; None when no file was read."""
    ctx = click.get_current_context(silent=True)
    record = config_record(ctx)
    if record is None or ctx is None:
        return None
    return {**record, "options": resolved_options(ctx)}


def record_config(result) -> None:
    """Add :func:`config_provenance` to ``result.provenance["config"]``; nothing when no file was read."""
    config = config_provenance()
    if config is not None and "config" not in result.provenance:
        result.provenance["config"] = config


def without_per_input(result_json: dict[str, Any]) -> dict[str, Any]:
    """A result's JSON without its ``per_input`` extra: one value per evaluated input (the report's
    paired tests), kept in Python results, ``--out`` files and the report cache, too long for stdout."""
    return {k: v for k, v in result_json.items() if k != "per_input"}


def emit(result, *, as_json=False, csv_path=None, as_markdown=False, out_path=None, columns=None, title=None):
    """Print a :class:`~jemeval.results.Result` and save the requested files. A command run with
    ``--config FILE`` records the file and every resolved option in ``provenance["config"]``. Rank 0
    alone prints and writes."""
    if not is_main_rank():
        return
    record_config(result)
    if out_path:
        result.save_json(out_path)
        click.echo(f"wrote {out_path}", err=True)
    if csv_path:
        result.save_csv(csv_path, columns)
        click.echo(f"wrote {csv_path}", err=True)
    if as_json:
        click.echo(json.dumps(without_per_input(result.to_dict()), indent=2))
        return
    if as_markdown:
        click.echo(result.to_markdown(columns))
        return
    if title:
        click.echo(title)
    click.echo(result.table(columns))
    for note in result.notes:
        click.echo(f"note: {note}")
