"""Built-in attacks (foolbox behind jemeval's attack interface; see jemeval.evaluation.attacks)."""
from __future__ import annotations

from jemeval.hookspecs import hookimpl


@hookimpl
def register_attacks(register):
    from jemeval.evaluation import attacks

    for name, factory in attacks.BUILTIN_ATTACKS.items():
        register(name, factory)
