"""The ``jemeval`` command line: click commands as thin shells over jemeval's Python functions.

Every command, jemeval's own included, comes through the ``register_commands`` hook
(:mod:`jemeval.cli.default_commands` adds one per module of :mod:`jemeval.cli.commands`, ``train.py``
-> ``jemeval train``). Commands are imported only when listed or run, and the component built-ins
(torch) not at all for ``jemeval --help``, so it stays fast and a broken plugin or a heavy import
cannot break it. User mistakes raised as :class:`~jemeval.errors.JemevalError` become one
``Error: ...`` line (exit 2 for usage errors, 1 otherwise), never a traceback.
"""
from __future__ import annotations

import contextlib
import os
import re
import shutil
import sys
from collections.abc import Sequence

import click

from jemeval import __version__
from jemeval.atomic import space_problem
from jemeval.errors import JemevalError, JemevalWarning, UsageError, did_you_mean
from jemeval.plugins import get_plugin_manager

DEBUG_ENV = "JEMEVAL_DEBUG"


class JemevalGroup(click.Group):
    """Commands from the ``register_commands`` hook, plus translation of jemeval errors into one-line click errors."""

    def list_commands(self, ctx):
        return sorted(set(super().list_commands(ctx)) | set(get_plugin_manager().commands()))

    def get_command(self, ctx, name):
        cmd = super().get_command(ctx, name)
        if cmd is not None:
            return cmd
        entry = get_plugin_manager().commands().get(name)
        return None if entry is None else entry.load()

    def make_context(self, info_name, args, parent=None, **extra):
        """Help at one width (:func:`help_width`: the terminal's, at most :data:`HELP_WIDTH`, the width
        the commands' examples are written for; in a pipe or a file :data:`HELP_WIDTH`, where click
        would take 80). Subcommands inherit it, so every ``--help`` wraps its text and options alike."""
        extra.setdefault("terminal_width", help_width())
        return super().make_context(info_name, args, parent, **extra)

    def resolve_command(self, ctx, args):
        try:
            return super().resolve_command(ctx, args)
        except click.UsageError as exc:
            if args and "No such command" in str(exc):
                hint = did_you_mean(args[0], self.list_commands(ctx))
                raise click.UsageError(f"no command {args[0]!r}{hint}; see 'jemeval --help'", ctx) from None
            raise

    def main(self, args=None, prog_name=None, complete_var=None, standalone_mode=True, **extra):
        """As click's, except that every error is ONE line on stderr (click prints a usage block).

        ``standalone_mode=False`` keeps click's behaviour for callers that handle errors themselves.
        """
        if not standalone_mode:
            return super().main(args, prog_name, complete_var, standalone_mode=False, **extra)
        try:
            rv = super().main(args, prog_name, complete_var, standalone_mode=False, **extra)
        except click.UsageError as exc:
            message = exc.format_message()
            if "--help" not in message and exc.ctx is not None:  # click's own parse errors
                where = exc.ctx.command_path if exc.ctx is not None else "jemeval"
                message += f" (see '{where} --help')"
            _tell_peers(message)
            click.echo(f"Error: {message}", err=True)
            sys.exit(exc.exit_code)
        except click.ClickException as exc:
            _tell_peers(exc.format_message())
            click.echo(f"Error: {exc.format_message()}", err=True)
            sys.exit(exc.exit_code)
        except click.Abort:
            if not _quiet_worker():  # of --nproc workers, rank 0 alone says it
                click.echo("Aborted!", err=True)
            sys.exit(130)
        sys.exit(rv if isinstance(rv, int) else 0)

    def _invoked(self, ctx) -> click.Command | None:
        """The subcommand being run (its options name the flags in error messages)."""
        name = ctx.invoked_subcommand
        return self.get_command(ctx, name) if name else None

    def _commands(self, ctx) -> list[click.Command]:
        """Every command, for :func:`flag_message` to name those that have a flag the one run lacks."""
        return [c for c in (self.get_command(ctx, name) for name in self.list_commands(ctx)) if c is not None]

    def invoke(self, ctx):
        try:
            with one_line_warnings():
                return super().invoke(ctx)
        except UsageError as exc:
            raise click.UsageError(flag_message(exc, self._invoked(ctx), self._commands(ctx))) from None
        except JemevalError as exc:
            raise click.ClickException(flag_message(exc, self._invoked(ctx), self._commands(ctx))) from None
        except KeyboardInterrupt:  # as click.Abort at once: click would print an empty line first
            raise click.Abort() from None
        except (click.exceptions.Exit, click.ClickException, click.Abort):
            raise
        except Exception as exc:  # a bug in jemeval or a plugin: one line unless debugging
            if os.environ.get(DEBUG_ENV, "").strip() not in ("", "0"):
                raise
            if raised_while_interrupted(exc):  # clean-up code failing as a Ctrl-C unwinds: it is the Ctrl-C
                raise click.Abort() from None
            problem = space_problem(exc)  # a full disk met by a write that is not an atomic one
            if problem is not None:
                where = f" writing {str(exc.filename)!r}" if getattr(exc, "filename", None) else ""
                raise click.ClickException(f"{problem}{where}: free some space or choose another location") from None
            message = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
            raise click.ClickException(
                f"unexpected {type(exc).__name__}: {message} (a bug in jemeval or a plugin; "
                f"set {DEBUG_ENV}=1 for the traceback)"
            ) from None


@contextlib.contextmanager
def one_line_warnings():
    """jemeval's own warnings (:class:`~jemeval.errors.JemevalWarning`, e.g. test images that are also
    training images) as one ``warning: ...`` line on stderr each time they are raised (rank 0 of a
    launch alone); other warnings as Python shows them."""
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("always", JemevalWarning)
        python_shows = warnings.showwarning

        def show(message, category, filename, lineno, file=None, line=None):
            if not issubclass(category, JemevalWarning):
                return python_shows(message, category, filename, lineno, file, line)
            if not _quiet_worker():
                click.echo(f"warning: {message}", err=True)

        warnings.showwarning = show
        yield


#: the widest terminal help is laid out for (``max_content_width`` of every context); the text is 2
#: columns narrower, as click's own default (a line that fills the last column wraps on some terminals)
HELP_WIDTH = 100


def help_width() -> int:
    """The width of every ``--help`` text: the terminal's columns ($COLUMNS first; :data:`HELP_WIDTH`
    when there is no terminal), at most :data:`HELP_WIDTH`, less 2; never under 50 (as click)."""
    columns = shutil.get_terminal_size(fallback=(HELP_WIDTH, 24)).columns
    return max(min(columns, HELP_WIDTH) - 2, 50)


def raised_while_interrupted(exc: BaseException) -> bool:
    """Whether ``exc`` was raised while a Ctrl-C (KeyboardInterrupt) was being handled: its context
    chain holds one. Such an error is a consequence of the user's Ctrl-C, not a bug to report."""
    seen = set()
    while exc is not None and id(exc) not in seen:
        if isinstance(exc, KeyboardInterrupt):
            return True
        seen.add(id(exc))
        exc = exc.__context__
    return False


def _quiet_worker() -> bool:
    """jemeval.runtime.launch.quiet_worker without importing torch: a ``--nproc`` worker other than
    rank 0, which leaves reporting a Ctrl-C to rank 0."""
    return os.environ.get("JEMEVAL_RELAUNCHED") == "1" and os.environ.get("RANK", "0") != "0"


def _tell_peers(message: str) -> None:
    """A torchrun worker that stops before joining its process group (a bad option, a file missing on
    its node) leaves its line for the other ranks, which would otherwise wait for it until the
    timeout (:func:`jemeval.runtime.arrival.tell_peers`; torch is imported only in a launch)."""
    if os.environ.get("WORLD_SIZE", "1") not in ("", "0", "1"):
        from jemeval.runtime.arrival import tell_peers

        tell_peers(message)


def flag_message(exc: JemevalError, command: click.Command | None,
                 commands: Sequence[click.Command] = ()) -> str:
    """The error's text with parameter names written as the flags that set them.

    The core names Python parameters (it is also called from Python); only the command line knows
    its flags: ``resume=True`` -> ``--resume``, ``nproc=4`` -> ``--nproc 4``, a bare mention of the
    parameter the error is about (``exc.param``: ``lr`` -> ``--lr``) and of any multi-word option
    name (``sgld_steps`` -> ``--sgld-steps``). Quoted values and paths are left alone. A flag the
    error is about that this command lacks (``download=True`` in ``jemeval export``) is named as the
    flag of the ``commands`` that have it, the Python form beside it.
    """
    text = str(exc)
    if command is None:
        return text
    param = getattr(exc, "param", None)
    text = _flag_elsewhere(text, param, command, commands)
    for option in command.params:
        if not isinstance(option, click.Option) or not option.name:
            continue
        name, flag = re.escape(option.name), max(option.opts, key=len)
        if option.is_flag:
            text = re.sub(rf"(?<![\w.-]){name}=True\b", lambda _, f=flag: f, text)
        text = re.sub(rf"(?<![\w.-]){name}=('[^']*'|\"[^\"]*\"|[^\s,;)]+)",
                      lambda m, f=flag: f"{f} {_unquoted(m.group(1))}", text)
        if option.name == param or "_" in option.name:
            text = re.sub(rf"(?<![\w./'\"-]){name}(?![\w./'\"=-])", lambda _, f=flag: f, text)
    return text


def _flag_elsewhere(text: str, param: str | None, command: click.Command, commands: Sequence[click.Command]) -> str:
    """``param=True`` where ``command`` has no such flag: the commands whose flag it is, and the Python form."""
    if not param or f"{param}=True" not in text or any(o.name == param for o in command.params):
        return text
    having = sorted(c.name for c in commands if c.name and any(
        isinstance(o, click.Option) and o.is_flag and o.name == param for o in c.params))
    if not having:
        return text
    flag = "--" + param.replace("_", "-")
    return re.sub(rf"(?<![\w.-]){re.escape(param)}=True\b",
                  lambda _: f"{flag} of `jemeval {'|'.join(having)}` ({param}=True in Python)", text)


def _unquoted(value: str) -> str:
    return value[1:-1] if len(value) >= 2 and value[0] == value[-1] and value[0] in "'\"" else value


@click.group(cls=JemevalGroup, context_settings={"help_option_names": ["-h", "--help"],
                                                 "max_content_width": HELP_WIDTH})
@click.version_option(__version__, prog_name="jemeval")
def cli():
    """Train and evaluate Joint Energy-based Models (JEM) and compare them with classifiers.

    \b
    Typical use:
      jemeval train digits                      # the embedded default, minutes on a CPU
      jemeval ood --model runs/digits/best.pt --ood uniform,interp:digits
      jemeval calibrate --model runs/digits/best.pt --plot reliability.png
      jemeval robust --model runs/digits/best.pt --norm l2 --refine-steps 0,2
      jemeval plugins                           # what is installed

    Files: --out names a command's main product (the JSON result of an evaluation, the PNG grid of
    sample, the run folder of train); extra files have their own options (--csv, --plot, --grid,
    --save, --save-scores, --result). No command writes over a file it reads; a missing output
    folder is refused, never created.
    """


def main(argv=None) -> int:
    """The ``jemeval`` program (console script, ``python -m jemeval``): the process's allocator is set up
    for batch loops first (:func:`jemeval.runtime.memory.tune_allocator`; not when ``cli`` is invoked
    inside another program, whose allocator is its own)."""
    from jemeval.runtime.memory import tune_allocator

    tune_allocator()  # keep a batch's buffers: no CPU time lost in the kernel (docs/performance.md)
    try:
        return cli.main(args=argv, prog_name="jemeval", standalone_mode=True)
    except KeyboardInterrupt:  # pragma: no cover - interactive
        click.echo("Aborted.", err=True)
        return 130


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
