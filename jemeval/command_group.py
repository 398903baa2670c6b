"""What ``register_commands(cli)`` gives a plugin: a click group that collects its commands.

Each implementation of the hook gets a fresh :class:`CommandCollector`, so jemeval knows which plugin
added which command and refuses a name that is taken (a plugin cannot replace ``jemeval train``).
Besides click's ``@cli.command()``, ``@cli.group()`` and ``cli.add_command(cmd)``,
``cli.add_lazy_command(name, "module:attr")`` names a command without importing its module: it is
imported when the command is listed (``jemeval --help``) or run. A command whose import fails shows
up as a command that says so, so a broken plugin never breaks ``jemeval --help``.
"""
from __future__ import annotations

import importlib
from dataclasses import dataclass

import click

from jemeval.errors import UsageError


class CommandCollector(click.Group):
    """The ``cli`` argument of ``register_commands``: a click group whose commands jemeval adds to its own."""

    def __init__(self) -> None:
        super().__init__("jemeval")
        #: name -> "module:attr" of a click command imported only when needed
        self.lazy_commands: dict[str, str] = {}

    def add_lazy_command(self, name: str, import_path: str) -> None:
        """Add the click command ``import_path`` (``"package.module:attr"``) as ``name``, importing it
        only when ``jemeval --help`` lists it or it is run (keeps ``--help`` fast)."""
        module, sep, attr = str(import_path).partition(":")
        if not (sep and module and attr):
            raise UsageError(f"lazy command {name!r}: write its import path as 'module:attr', got {import_path!r}")
        self.lazy_commands[name] = import_path

    def collected(self) -> dict[str, click.Command | str]:
        """Every command added, by name: a click command or the import path of a lazy one."""
        both = sorted(set(self.commands) & set(self.lazy_commands))
        if both:
            raise UsageError(f"command {both[0]!r} is added twice (as a command and as a lazy command)")
        return {**self.commands, **self.lazy_commands}


@dataclass(frozen=True)
class PluginCommand:
    """A command of the ``jemeval`` group and the plugin that added it."""

    name: str
    plugin: str
    #: the click command, or the "module:attr" import path of a lazy one
    target: click.Command | str

    def load(self) -> click.Command:
        """The click command, imported if lazy; a command that reports the failure if that import fails."""
        if isinstance(self.target, click.Command):
            return self.target
        module, _, attr = self.target.partition(":")
        try:
            command = getattr(importlib.import_module(module), attr)
        except Exception as exc:  # a broken plugin must not break --help or the other commands
            return broken_command(self.name, f"command {self.name!r} of plugin {self.plugin!r} failed to load: "
                                             f"{type(exc).__name__}: {exc}")
        if not isinstance(command, click.Command):
            return broken_command(self.name, f"command {self.name!r} of plugin {self.plugin!r} is a "
                                             f"{type(command).__name__} ({self.target}), not a click command")
        return command


def broken_command(name: str, message: str) -> click.Command:
    """A stand-in that lists ``message`` as its help and fails with it, in one line, when run."""

    def fail(**_):
        raise click.ClickException(message)

    return click.Command(name, callback=fail, help=message, short_help=f"(failed to load) {message}",
                         context_settings={"ignore_unknown_options": True, "allow_extra_args": True})
