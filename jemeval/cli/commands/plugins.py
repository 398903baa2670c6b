"""``jemeval plugins``: every loaded plugin, its version, hooks, components and errors."""
from __future__ import annotations

import json

import click

from jemeval.cli.paths import Command


def plugin_report() -> list[dict]:
    from jemeval.plugins import get_plugin_manager

    return [info.as_dict() for info in get_plugin_manager().plugin_infos()]


@click.command("plugins", cls=Command)
@click.option("--json", "as_json", is_flag=True, help="Print JSON.")
def cli(as_json):
    """List installed plugins (built-ins first) with versions and what they registered."""
    report = plugin_report()
    if as_json:
        click.echo(json.dumps(report, indent=2))
        return
    for p in report:
        kind = "built-in" if p["builtin"] else (p["distribution"] or "plugin")
        click.echo(f"{p['name']} {p['version'] or '(no version)'}  [{kind}]")
        for k, names in p["registered"].items():
            click.echo(f"    {k}s: {', '.join(names)}")
        if p["error"]:
            click.echo(f"    ERROR: {p['error']}")
