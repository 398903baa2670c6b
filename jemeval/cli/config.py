"""``--config FILE``: a command's options from a YAML or TOML file; the command line overrides it.

Add it to a command with the :func:`config_option` decorator (``train``, ``ood`` and ``robust`` have
it); nothing else in the command changes: the file's values become the command's defaults
(click's ``default_map``), so every option (and argument) can come from the file, and each one typed
on the command line wins. Precedence: command line > environment variable (where an option has one)
> config file > the option's default.

The file is a mapping of option names to values. Keys are the long option names without the dashes,
with ``-`` or ``_`` (``sgld-lr`` or ``sgld_lr``); the Python parameter an option fills is accepted
too (``input_sigma`` for ood's ``--sigma``). A list is a comma list (``decay-epochs: [50, 100]`` is
``--decay-epochs 50,100``); ``null`` leaves the option unset. One file can serve several commands:
a top-level key named after a command (``train:``, ``ood:``) holds that command's section, whose
keys override the top-level ones; other commands' sections are skipped. An unknown key is an error
with a "did you mean". YAML is read with ``yaml.safe_load``, TOML with ``tomllib`` (``tomli`` on
Python 3.10), ``.json`` with ``json``: no file can run code.

What the file contributed is recorded: :func:`config_record` gives the file, its SHA-256 and the
keys it set, and :func:`jemeval.cli.output.emit` adds it, with every resolved option value, to the
result's provenance (``train`` stores it in the run's config, see its ``config_file``).
"""
from __future__ import annotations

import hashlib
import json
import sys
from pathlib import Path
from typing import Any

import click

from jemeval.cli.paths import PathOption, check_readable_kind
from jemeval.errors import UsageError, did_you_mean

#: where the loaded file's record is kept on the click context (``ctx.meta``)
CONFIG_META = "jemeval.config"
FORMATS = {".yaml": "yaml", ".yml": "yaml", ".toml": "toml", ".json": "json"}
#: parameters a file never sets: the file itself, printing it
NOT_FROM_FILE = frozenset({"config_file", "print_config"})
#: the largest config file read (a mapping of option names to values is a few KB)
MAX_BYTES = 1 << 20
#: the values a file may give an option: what the command line could type
SCALARS = (str, int, float, bool)


class ConfigOption(PathOption):
    """``--config``: an input file of the command (so no output may be written over it,
    :func:`jemeval.cli.paths.check_paths`), whose value lives in the context's config record."""

    def paths(self, ctx: click.Context) -> list[str]:
        record = config_record(ctx)
        return [record["file"]] if record else []


def config_option(fn=None, *, help: str | None = None):
    """The ``--config FILE`` option (a decorator: ``@config_option`` above or below the other options)."""
    def deco(fn):
        return click.option(
            "--config", "config_file", cls=ConfigOption, role="input", what="the config file",
            type=click.Path(dir_okay=False), is_eager=True, expose_value=False,
            callback=_apply_config, metavar="FILE",
            help=help or "Read options from a YAML or TOML file (keys: option names, e.g. sgld-lr: 1.0); options "
                         "given on the command line override it. Recorded in the result's provenance.")(fn)
    return deco(fn) if fn is not None else deco


def _apply_config(ctx: click.Context, param: click.Parameter, value: str | None) -> None:
    """Eager callback: the file's values become the command's defaults before any other option is read."""
    if value is None:
        return
    raw, digest = read_config_file(value)
    values = command_values(ctx, raw, value)
    ctx.default_map = {**(ctx.default_map or {}), **values}
    keys = canonical_keys(ctx.command)
    ctx.meta[CONFIG_META] = {"file": str(value), "sha256": digest, "keys": sorted(keys[name] for name in values)}


def read_config_file(path: str | Path) -> tuple[dict[str, Any], str]:
    """(the file's top-level mapping, its SHA-256); one-line errors for a missing or malformed file."""
    p = Path(path)
    kind = FORMATS.get(p.suffix.lower())
    if kind is None:
        raise UsageError(f"config {str(p)!r}: unknown file type {p.suffix or '(none)'!r}; use a .yaml, .yml, .toml "
                         "or .json file", param="config_file")
    check_readable_kind(p, f"config {str(p)!r}")  # a FIFO would block the read forever
    try:
        if p.stat().st_size > MAX_BYTES:
            raise UsageError(f"config {str(p)!r} is {p.stat().st_size:,} bytes; a config file is a small mapping of "
                             f"option names to values (at most {MAX_BYTES:,} bytes)", param="config_file")
        data = p.read_bytes()
    except OSError as exc:
        raise UsageError(f"config {str(p)!r} cannot be read: {exc.strerror or exc}", param="config_file") from None
    try:
        parsed = _parse(data, kind)
    except ValueError as exc:  # yaml.YAMLError, tomllib.TOMLDecodeError, json.JSONDecodeError, bad UTF-8
        raise UsageError(f"config {str(p)!r} is not valid {kind.upper()}: {_first_line(exc)}",
                         param="config_file") from None
    except RecursionError:  # [[[[...]]]] 100,000 deep: the parsers recurse
        raise UsageError(f"config {str(p)!r} is nested too deeply; a config file is a mapping of option names to "
                         "values (a section per command at most)", param="config_file") from None
    if parsed is None:
        parsed = {}
    if not isinstance(parsed, dict):
        raise UsageError(f"config {str(p)!r} must hold a mapping of option names to values, not a "
                         f"{type(parsed).__name__}", param="config_file")
    return parsed, hashlib.sha256(data).hexdigest()


def _parse(data: bytes, kind: str) -> Any:
    text = data.decode("utf-8")
    if kind == "json":
        return json.loads(text)
    if kind == "toml":
        if sys.version_info >= (3, 11):
            import tomllib
        else:  # pragma: no cover - Python 3.10
            import tomli as tomllib
        return tomllib.loads(text)
    import yaml

    try:
        return yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise ValueError(str(exc).replace("\n", " ")) from None


def _first_line(exc: BaseException) -> str:
    text = " ".join(str(exc).split())
    return text[:200] or type(exc).__name__


def _key(name: str) -> str:
    return name.strip().lower().replace("_", "-")


def option_keys(command: click.Command) -> dict[str, click.Parameter]:
    """Every key a file may use for ``command``: long option names (``sgld-lr``), then the Python
    parameter names not already taken (``sgld-step-size``), all with ``-`` (``_`` is read as ``-``)."""
    params = [p for p in command.params if p.name and p.expose_value and p.name not in NOT_FROM_FILE
              and not getattr(p, "hidden", False)]
    keys: dict[str, click.Parameter] = {}
    for p in params:
        for opt in p.opts if isinstance(p, click.Option) else []:
            if opt.startswith("--"):
                keys.setdefault(_key(opt[2:]), p)
    for p in params:
        keys.setdefault(_key(p.name.rstrip("_")), p)
    return keys


def canonical_keys(command: click.Command) -> dict[str, str]:
    """Parameter name -> the key a config file writes it with (its long option name: ``sgld-lr``)."""
    return {p.name: key for key, p in reversed(list(option_keys(command).items()))}


def _sections(ctx: click.Context) -> set[str]:
    """Names a top-level section may have: every command of the group (``train``, ``ood``, ...)."""
    parent = ctx.parent
    names = {ctx.info_name or ctx.command.name or ""}
    if parent is not None and isinstance(parent.command, click.Group):
        names |= set(parent.command.list_commands(parent))
    return names


def command_values(ctx: click.Context, raw: dict[str, Any], path: str | Path) -> dict[str, Any]:
    """The file's values for this command, by parameter name (what ``ctx.default_map`` takes)."""
    name, sections = ctx.info_name or ctx.command.name, _sections(ctx)
    merged = {k: v for k, v in raw.items() if not (isinstance(v, dict) and k in sections)}
    own = raw.get(name)
    if isinstance(own, dict):
        merged.update(own)
    keys, values = option_keys(ctx.command), {}
    for key, value in merged.items():
        param = keys.get(_key(str(key)))
        if param is None:
            hint = did_you_mean(_key(str(key)), keys) or f"; {name}'s options: {', '.join(sorted(keys))}"
            raise UsageError(f"config {str(path)!r}: {name} has no option {str(key)!r}{hint}", param="config_file")
        if value is None:
            continue  # null: not set, the option keeps its default
        values[param.name] = _option_value(param, value, key, path)
    return values


def _option_value(param: click.Parameter, value: Any, key: str, path: str | Path) -> Any:
    """A value as the command line would give it: a list becomes a comma list for a one-value option."""
    where = f"config {str(path)!r}: {key}"
    if isinstance(value, dict):
        raise UsageError(f"{where} is a mapping; give a value (a section is named after a command)",
                         param="config_file")
    for item in value if isinstance(value, list) else [value]:
        if not isinstance(item, (*SCALARS, list)):  # a YAML/TOML date or time
            raise UsageError(f"{where} is a {type(item).__name__} ({item}), not a value of this option: give a "
                             "number or text (quote a date to pass it as text)", param="config_file")
    if getattr(param, "multiple", False) or param.nargs != 1:
        return [_text(v) for v in value] if isinstance(value, list) else [value]
    if isinstance(value, list):
        return ",".join(_text(v) for v in value)
    is_bool = isinstance(param.type, click.types.BoolParamType)
    if isinstance(value, bool) and not is_bool and not getattr(param, "is_flag", False):
        raise UsageError(f"{where} is {str(value).lower()}, not a value of this option (YAML reads yes/no/on/off "
                         "as true/false: quote the text)", param="config_file")
    if isinstance(param.type, click.types.IntParamType) and isinstance(value, float) and not value.is_integer():
        raise UsageError(f"{where} must be a whole number, got {value}", param="config_file")
    return value


def _text(value: Any) -> str:
    if isinstance(value, (dict, list)):
        raise UsageError(f"a list item must be a single value, got {value!r}", param="config_file")
    return str(value).lower() if isinstance(value, bool) else str(value)


def config_record(ctx: click.Context | None = None) -> dict[str, Any] | None:
    """The config file a command read ({"file", "sha256", "keys"}), or None when it read none."""
    ctx = ctx if ctx is not None else click.get_current_context(silent=True)
    while ctx is not None:
        if CONFIG_META in ctx.meta:
            return dict(ctx.meta[CONFIG_META])
        ctx = ctx.parent
    return None


def resolved_options(ctx: click.Context) -> dict[str, Any]:
    """Every option value the command runs with (file and command line merged), by config key."""
    keys = canonical_keys(ctx.command)
    return {keys[name]: value for name, value in ctx.params.items() if name in keys}


def render_config(command: click.Command, values: dict[str, Any], *, title: str) -> str:
    """A complete config file for ``command`` (YAML, every option with its help as a comment), with
    ``values`` (by parameter name) filled in: what ``--print-config`` prints."""
    import textwrap

    import yaml

    lines = [f"# {line}" for line in title.splitlines()]
    keys = canonical_keys(command)
    for param in command.params:
        if param.name not in keys:
            continue
        help_text = " ".join((getattr(param, "help", None) or "").split())
        lines += ["", *(f"# {line}" for line in textwrap.wrap(help_text, 98, break_on_hyphens=False))]
        value = values.get(param.name)
        value = list(value) if isinstance(value, tuple) else value
        text = yaml.safe_dump(value, default_flow_style=True, width=1000).removesuffix("...\n").strip()
        lines.append(f"{keys[param.name]}: {text}")
    return "\n".join(lines) + "\n"
