"""``jemeval list [KIND] [PATTERN]``: registered names, optionally filtered by a glob."""
from __future__ import annotations

import json

import click

from jemeval.cli.paths import Command
from jemeval.components import metric_task
from jemeval.registry import KINDS


def list_components(kind: str | None = None, pattern: str | None = None) -> dict[str, list[dict]]:
    from jemeval.plugins import get_registry

    registry = get_registry()
    kinds = [kind] if kind else list(KINDS)
    return {
        k: [{"name": c.name, "plugin": c.plugin, "help": c.help,
             **({"task": metric_task(c.obj)} if k == "metric" else {})}
            for c in registry.components(k) if c.name in set(registry.names(k, pattern))]
        for k in kinds
    }


PLURALS = {f"{k}s": k for k in KINDS} | {k: k for k in KINDS}


@click.command("list", cls=Command)
@click.argument("kind", required=False, type=click.Choice(sorted(PLURALS)),
                metavar="[models|datasets|scores|metrics|attacks]")
@click.argument("pattern", required=False)
@click.option("--json", "as_json", is_flag=True, help="Print JSON.")
def cli(kind, pattern, as_json):
    """List registered components; PATTERN is a glob such as 'w*'."""
    listing = list_components(PLURALS[kind] if kind else None, pattern)
    if as_json:
        click.echo(json.dumps(listing, indent=2))
        return
    for k, items in listing.items():
        click.echo(f"{k}s:")
        if not items:
            click.echo(f"  (no {k}s match {pattern!r})" if pattern else f"  (no {k}s registered)")
        for item in items:
            help_text = f"  {item['help']}" if item["help"] else ""
            task = f" ({item['task']})" if item.get("task") else ""
            click.echo(f"  {item['name']:<12} [{item['plugin']}]{task}{help_text}")
