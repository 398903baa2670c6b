"""A command run as one rank of a torchrun launch (one or several nodes): what it declares before
the ranks meet, how it joins and runs its share, and how it ends when something went wrong.

Before joining, every rank declares the parsed options and the content of every file and folder
the command reads (the SHA-256 that provenance and the caches use, kept for the run): nodes given
different command lines or different copies of a file stop with one line naming the difference
(:mod:`jemeval.runtime.agreement`) instead of each computing with its own. An error every rank
raises alike (a shared one) is said once per node, by the node's first process
(:func:`jemeval.runtime.launch.reports_errors`); every process ends with its exit status.
"""
from __future__ import annotations

import contextlib
import os
from pathlib import Path
from typing import Any

import click

from jemeval.cli.paths import input_paths
from jemeval.errors import JemevalError, UsageError


def run_as_rank(fn, args, kwargs, device):
    """Run the command as one rank of a torchrun launch: join the process group on this rank's
    device (``device``, the parsed ``--device``: ``cuda:LOCAL_RANK`` or the CPU); rank 0 runs as
    usual, the others silently. Before joining, the command line is declared for the ranks'
    comparison (:func:`agree_on_command`).

    Every rank ends with one exchange of errors (:func:`jemeval.runtime.distributed.raise_any`, the
    same collective :func:`jemeval.runtime.shards.map_batches` begins with): a rank that fails
    before or between the shared batches meets the others there, so all ranks stop together, with
    the error's exit status; the first process of each node says it (one line per node,
    :func:`jemeval.runtime.launch.reports_errors`).
    """
    from jemeval.runtime.distributed import destroy, join, raise_any
    from jemeval.runtime.shards import sharded

    agree_on_command(click.get_current_context())
    try:
        ctx = join(device)
    except JemevalError as exc:
        _said_once_per_node(exc)
    if "device" in kwargs:
        kwargs["device"] = str(ctx.device)
    result, error, together = None, None, False
    try:
        with contextlib.ExitStack() as quiet:
            quiet.enter_context(sharded())
            if not ctx.is_main:
                null = quiet.enter_context(open(os.devnull, "w"))
                quiet.enter_context(contextlib.redirect_stdout(null))
                quiet.enter_context(contextlib.redirect_stderr(null))
            try:
                result = fn(*args, **kwargs)
            except Exception as exc:  # noqa: BLE001 - every rank hears of it below
                if getattr(exc, "shared", False):
                    raise
                error = exc
            raise_any(error)
            together = True
    except Exception as exc:
        together = getattr(exc, "shared", False)  # every rank raised it from the same exchange
        if ctx.is_main:
            raise
        _said_once_per_node(exc)
    finally:
        destroy(synchronize=together)
    return result


def _said_once_per_node(error: Exception) -> None:
    """Raise ``error`` (the CLI says it) in the process that reports its node's errors, else end
    this process silently with the status it would have had: 2 for a usage error, 1 otherwise. An
    error only this process had, before it met the others, is always said (and told to the others)."""
    from jemeval.runtime.launch import reports_errors

    if reports_errors() or not getattr(error, "shared", False):
        raise error
    raise click.exceptions.Exit(2 if isinstance(error, UsageError) else 1)


def agree_on_command(ctx: click.Context) -> None:
    """Under a launch of several processes, declare the command's options and the content of the
    files it reads for the comparison the ranks make when they meet; nothing in a single process."""
    if os.environ.get("WORLD_SIZE", "1") in ("", "0", "1"):
        return
    from jemeval.runtime.agreement import expect_agreement

    expect_agreement(command_options(ctx), files_read(ctx))


def command_options(ctx: click.Context) -> dict[str, str]:
    """Every option and argument of the parsed command by its flag: ``{"--n": "200", ...}``."""
    return {_label(p): _shown(ctx.params[p.name]) for p in ctx.command.params if p.name in ctx.params}


def files_read(ctx: click.Context) -> dict[str, str]:
    """Every file or folder the parsed command reads, by what it is, with its content's SHA-256:
    ``{"the input checkpoint 'm.pt' (--model)": "sha256 ...", ...}`` ("missing" where there is none)."""
    return {f"{what} {str(path)!r} ({label})": _content(path) for what, label, path in input_paths(ctx)}


def _label(param: click.Parameter) -> str:
    """The parameter as the user types it: its longest flag, or an argument's metavar."""
    if isinstance(param, click.Option):
        return max(param.opts, key=len)
    return param.metavar or param.name.upper()


def _shown(value: Any) -> str:
    if value is None:
        return "not given"
    if isinstance(value, (str, os.PathLike)):
        return repr(str(value))
    if isinstance(value, (list, tuple)):
        return ",".join(_shown(v) for v in value) or "none"
    return str(value)


def _content(path: Path) -> str:
    """A file's content as the start of its SHA-256 (``sha256sum`` shows it whole), a folder's as
    one SHA-256 over its files (:func:`jemeval.provenance.content_sha256`), or that it is missing."""
    from jemeval.provenance import content_sha256, file_sha256

    if not path.exists():
        return "missing"
    return f"sha256 {(file_sha256(path) if path.is_file() else content_sha256([path]))[:16]}"
