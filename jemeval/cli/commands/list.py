"""``jemeval list [KIND] [PATTERN]``: registered names, optionally filtered by a glob."""
from __future__ import annotations

import inspect
import json
import re

import click

from jemeval.cli.paths import Command
from jemeval.components import metric_task
from jemeval.registry import KINDS


def list_components(kind: str | None = None, pattern: str | None = None) -> dict[str, list[dict]]:
    from jemeval.plugins import get_registry

    registry = get_registry()
    kinds = [kind] if kind else list(KINDS)
    return {
        k: [{"name": c.name, "plugin": c.plugin, "help": dataset_help(c) if k == "dataset" else c.help,
             **({"task": metric_task(c.obj)} if k == "metric" else {})}
            for c in registry.components(k) if c.name in set(registry.names(k, pattern))]
        for k in kinds
    }


def dataset_help(component) -> str | None:
    """A dataset's description as a reader wants it: the whole first paragraph of its docstring when
    the registered help is that paragraph's first line (a docstring wrapped mid-sentence was cut
    there), without reStructuredText markup (````x````, ``:func:`x```` -> x)."""
    text = component.help
    doc = inspect.getdoc(component.obj) or ""
    if text and doc.startswith(text):
        text = " ".join(doc.split("\n\n")[0].split())
    if not text:
        return text
    text = re.sub(r":[a-z]+:`~?([^`]*)`", r"\1", text)
    return re.sub(r"``([^`]*)``", r"\1", text)


PLURALS = {f"{k}s": k for k in KINDS} | {k: k for k in KINDS}


@click.command("list", cls=Command)
@click.argument("kind", required=False, type=click.Choice(sorted(PLURALS)),
                metavar=f"[{'|'.join(f'{k}s' for k in KINDS)}]")
@click.argument("pattern", required=False)
@click.option("--json", "as_json", is_flag=True, help="Print JSON.")
def cli(kind, pattern, as_json):
    """List registered components of one KIND, or of every kind; PATTERN is a glob such as 'w*'.

    KIND (singular or plural): models, datasets, scores, metrics, attacks, checkpoint_layouts (the
    foreign checkpoint formats --model reads) or loggers (train --log-to).
    """
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
