"""jemeval's own commands, added through ``register_commands`` like any plugin's (datasette's
``default_*`` modules): one module per command in :mod:`jemeval.cli.commands` (``train.py`` ->
``jemeval train``, ``foo_bar.py`` -> ``jemeval foo-bar``), each defining a click command ``cli``.

They are added as lazy commands, so the hook imports none of them: ``jemeval train`` imports only
``train.py``, and a heavy import in one command cannot slow down or break another.
"""
from __future__ import annotations

import pkgutil

from jemeval.cli import commands
from jemeval.hookspecs import hookimpl


def command_modules() -> dict[str, str]:
    """Command name -> module, for every public module of :mod:`jemeval.cli.commands`."""
    return {
        m.name.replace("_", "-").removesuffix("-cmd"): f"{commands.__name__}.{m.name}"
        for m in pkgutil.iter_modules(commands.__path__)
        if not m.name.startswith("_")
    }


@hookimpl
def register_commands(cli):
    for name, module in command_modules().items():
        cli.add_lazy_command(name, f"{module}:cli")
