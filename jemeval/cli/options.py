"""Reusable option bundles and output handling for commands.

``@output_options`` gives every command the same ``--json`` / ``--csv FILE`` / ``--markdown`` /
``--out FILE.json``; ``emit(result, **output)`` prints the table (or JSON) on stdout and writes the
requested files atomically. Progress bars and messages go to stderr, so ``--json`` stays clean.
"""
from __future__ import annotations

import functools
from pathlib import Path

import click
import torch

from ..errors import UsageError


def output_options(fn):
    """--json, --csv FILE, --markdown, --out FILE.json."""
    @click.option("--json", "as_json", is_flag=True, help="Print machine-readable JSON (records + provenance) on stdout.")
    @click.option("--csv", "csv_path", type=click.Path(dir_okay=False, writable=True), help="Also write the records as CSV (provenance in '# ' comment lines).")
    @click.option("--markdown", "as_markdown", is_flag=True, help="Print a markdown table (with provenance) instead of the plain table.")
    @click.option("--out", "out_path", type=click.Path(dir_okay=False, writable=True), help="Also write the full JSON result to this file.")
    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        return fn(*args, **kwargs)

    return wrapper


def emit(result, *, as_json=False, csv_path=None, as_markdown=False, out_path=None, columns=None, title=None):
    """Print a :class:`~jemeval.results.Result` and save the requested files."""
    if out_path:
        result.save_json(out_path)
        click.echo(f"wrote {out_path}", err=True)
    if csv_path:
        result.save_csv(csv_path, columns)
        click.echo(f"wrote {csv_path}", err=True)
    if as_json:
        click.echo(result.to_json())
        return
    if as_markdown:
        click.echo(result.to_markdown(columns))
        return
    if title:
        click.echo(title)
    click.echo(result.table(columns))
    for note in result.notes:
        click.echo(f"note: {note}")


def sigma_option(fn):
    """--sigma: the evaluation input noise, an explicit and recorded setting (README.md, Conventions)."""
    return click.option(
        "--sigma", type=click.FloatRange(min=0.0), default=0.0, show_default=True,
        help="Std of Gaussian noise added to every evaluation input (the JEM release used 0.03: "
             "pass --sigma 0.03 to reproduce it).")(fn)


def batch_size_option(default: int = 256, help: str = "Examples per forward pass."):
    def deco(fn):
        return click.option("--batch-size", type=int, default=default, show_default=True, help=help)(fn)
    return deco


def device_option(fn):
    return click.option("--device", default="auto", show_default=True,
                        help="cpu, cuda, cuda:N or auto (cuda when available).")(fn)


def seed_option(default=0):
    def deco(fn):
        return click.option("--seed", type=int, default=default, show_default=True, help="Random seed (recorded).")(fn)
    return deco


def data_options(fn):
    """--data-root and --download for commands that read datasets."""
    fn = click.option("--download", is_flag=True, help="Download torchvision datasets that are missing (needs internet).")(fn)
    fn = click.option("--data-root", type=click.Path(file_okay=False), default=None,
                      help="Folder holding datasets (default: $JEMEVAL_DATA_ROOT or ~/.cache/jemeval/datasets).")(fn)
    return fn


def model_option(fn):
    return click.option("--model", "model_path", required=True, type=click.Path(),
                        help="A checkpoint: jemeval's (e.g. runs/digits/best.pt) or a JEM release file.")(fn)


def resolve_device(device: str | None) -> torch.device:
    """``--device``: the core parser (:func:`jemeval.devices.resolve_device`) naming the flag."""
    from ..devices import resolve_device as parse_device

    return parse_device(device, name="--device")


def split_list(value: str | None, what: str) -> list[str]:
    """'a,b , c' -> ['a', 'b', 'c'] (brackets kept together: 'digits[0,1],uniform')."""
    from ..registry import split_specs

    return split_specs(value, what)


def parse_floats(value: str, what: str) -> list[float]:
    try:
        return [float(eval_fraction(v)) for v in split_list(value, what)]
    except (ValueError, ZeroDivisionError):
        raise UsageError(f"{what} must be comma-separated numbers (fractions like 8/255 are fine), got {value!r}") from None


def eval_fraction(text: str) -> float:
    text = text.strip()
    if "/" in text:
        num, den = text.split("/", 1)
        return float(num) / float(den)
    return float(text)


def parse_ints(value: str, what: str) -> list[int]:
    try:
        return [int(v) for v in split_list(value, what)]
    except ValueError:
        raise UsageError(f"{what} must be comma-separated integers, got {value!r}") from None


def check_output_path(path: str | None, suffix: str, what: str) -> Path | None:
    if path is None:
        return None
    p = Path(path)
    if p.suffix.lower() != suffix:
        raise UsageError(f"{what} must be a {suffix} file, got {path!r}")
    return p
