"""The files a command reads and writes, checked before it runs.

Options made with :func:`output_path_option`, :func:`input_path_option` and :func:`dataset_option`
(and :func:`jemeval.cli.options.model_option`, :func:`jemeval.cli.config.config_option`) carry their
role, so the files a command reads are derived from the parsed command itself, never from a hand
list: :class:`Command` checks every output against every input before the command runs
(:func:`check_paths`): no command may write over a file it reads (its config file included), two
outputs may not name one file, an output has the extension it should, no output folder is created,
no output is a symbolic link or lies inside a model cache (:func:`check_output_place`), and no
input is a FIFO, socket or device (reading one would block or never end).
"""
from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import click

from jemeval.errors import UsageError
from jemeval.registry import split_specs


class _PathRole:
    """A click parameter that names files: ``role`` is "output", "input" or "dataset" (a list of
    dataset specs whose npz:FILE / folder:DIR parts are inputs). ``what`` describes an input in
    messages ("the input checkpoint"); ``suffix`` is the extension an output must have."""

    def __init__(self, *args, role: str, what: str | None = None, suffix: str | None = None, **kwargs):
        self.role, self.what, self.suffix = role, what, suffix
        super().__init__(*args, **kwargs)

    @property
    def label(self) -> str:
        """How the user typed it: '--out' for an option, 'OUT' for an argument."""
        return self.opts[0] if isinstance(self, click.Option) else (self.metavar or self.name.upper())

    def paths(self, ctx: click.Context) -> list[str]:
        """The paths this parameter names in the parsed command (an option that exposes no value,
        such as ``--config``, overrides this)."""
        return _values(ctx.params.get(self.name))


class PathOption(_PathRole, click.Option):
    pass


class PathArgument(_PathRole, click.Argument):
    pass


class Command(click.Command):
    """Every jemeval command: its file options are checked (:func:`check_paths`) before it runs."""

    def invoke(self, ctx: click.Context):
        check_paths(ctx)
        return super().invoke(ctx)


def output_path_option(*decls: str, suffix: str | None = None, **kwargs):
    """An option naming a file the command writes (checked by :func:`check_paths`)."""
    return click.option(*decls, cls=PathOption, role="output", suffix=suffix,
                        type=click.Path(dir_okay=False), **kwargs)


def input_path_option(*decls: str, what: str, **kwargs):
    """An option naming a file the command reads; ``what`` names it in messages ("the samples file")."""
    kwargs.setdefault("type", click.Path())
    return click.option(*decls, cls=PathOption, role="input", what=what, **kwargs)


def class_map_option(fn=None, *, help: str | None = None):
    """--class-map FILE: which model class each class of the data is, where the two differ
    (:mod:`jemeval.evaluation.classes`); the file is an input (no output may go over it)."""
    def deco(fn):
        return input_path_option(
            "--class-map", "class_map", what="the class map", metavar="FILE", default=None,
            help=help or "Map the data's classes to the model's where they differ (number or names): a JSON object "
                         "or a CSV of 'data class,model class', names or indices (docs/data.md, class maps). "
                         "Without it such a pair is refused, unless the data's class names are the model's.")(fn)

    return deco(fn) if fn is not None else deco


def dataset_option(*decls: str, **kwargs):
    """An option naming datasets (a spec or a comma list); their npz:/folder: files are inputs."""
    return click.option(*decls, cls=PathOption, role="dataset", what="a dataset read", **kwargs)


def check_paths(ctx: click.Context) -> None:
    """Refuse, before any work, an input that is not a regular file or folder, and a bad output path:
    a wrong extension, a missing folder, a file the command reads (same path after following
    symlinks, or the same inode), or another output's file."""
    params = [p for p in ctx.command.params if isinstance(p, _PathRole)]
    inputs = list(_input_paths(ctx, params))
    for what, label, path in inputs:
        check_readable_kind(path, f"{label} {str(path)!r} ({what})")
    outputs = [(p, value) for p in params if p.role == "output" for value in p.paths(ctx)]
    done: list[tuple[str, str]] = []
    for param, path in outputs:
        label = param.label
        if param.suffix and Path(path).suffix.lower() != param.suffix:
            raise UsageError(f"{label} must be a {param.suffix} file, got {path!r}")
        _check_folder(label, path)
        for what, in_label, in_path in inputs:
            if same_file(path, in_path) or _inside(path, in_path):
                where = "inside " if _inside(path, in_path) else ""
                raise UsageError(f"{label} {path!r} is {where}{what} ({in_label}); choose another output path")
        for other_label, other in done:
            if same_file(path, other):
                raise UsageError(f"{label} {path!r} is also {other_label}; give each output its own file")
        check_output_place(label, path)
        done.append((label, path))


def check_output_place(label: str, path: str) -> None:
    """Refuse an output path that is a symbolic link (the write would land wherever it points) or that
    lies in a model cache (:func:`check_outside_model_caches`; a Hub cache file is a link too)."""
    check_outside_model_caches(label, path)
    if os.path.islink(path):
        raise UsageError(f"{label} {path!r} is a symbolic link (to {os.readlink(path)!r}); jemeval never writes "
                         "through a link: give the path of a regular file")


def check_outside_model_caches(label: str, path: str | os.PathLike) -> None:
    """Refuse an output file or folder inside a model cache (the Hugging Face cache, torch hub's, where
    pytorch-ood keeps its weights too), symlinks followed: a later load would read what was written
    there as the published weights (and a Hub cache file is a link to its blob)."""
    from jemeval.builtins.pretrained.hubs import model_cache_dirs  # torch only when a command runs

    resolved = Path(path).resolve()
    for what, folder in model_cache_dirs():
        if folder.resolve() == resolved or folder.resolve() in resolved.parents:
            raise UsageError(f"{label} {path!r} is inside {what} {str(folder)!r}, where downloaded model weights "
                             "live and are read back unchecked; choose an output path outside it")


def same_file(a: str | os.PathLike, b: str | os.PathLike) -> bool:
    """True when ``a`` and ``b`` name one file: the same inode, or the same path once symlinks are followed."""
    try:
        if os.path.samefile(a, b):
            return True
    except (OSError, ValueError):  # one of them does not exist (yet)
        pass
    return Path(a).resolve() == Path(b).resolve()


def _inside(path: str, folder: str | os.PathLike) -> bool:
    """True when ``path`` lies inside the folder ``folder`` (writing there changes a folder dataset)."""
    return Path(folder).is_dir() and Path(folder).resolve() in Path(path).resolve().parents


def _check_folder(label: str, path: str) -> None:
    folder = Path(path).parent
    if not folder.is_dir():
        what = "is not a folder" if folder.exists() else "does not exist"
        raise UsageError(f"{label} {path!r}: folder {str(folder)!r} {what}; create it first or choose another "
                         "output path")


def _values(value: Any) -> list[str]:
    if value is None:
        return []
    return [str(v) for v in value] if isinstance(value, (list, tuple)) else [str(value)]


def input_paths(ctx: click.Context) -> list[tuple[str, str, Path]]:
    """(description, option, path) for every file and folder the parsed command reads."""
    return list(_input_paths(ctx, [p for p in ctx.command.params if isinstance(p, _PathRole)]))


def _input_paths(ctx: click.Context, params: list[_PathRole]) -> Iterator[tuple[str, str, Path]]:
    """(description, option, path) for every file the parsed command reads. A checkpoint's recorded
    training set is never among them: it is used only when it names no path
    (:func:`jemeval.data.names_no_path`)."""
    for p in params:
        for value in p.paths(ctx):
            if p.role == "input":
                yield p.what, p.label, Path(value)
            elif p.role == "dataset":
                for spec in split_specs(value, p.label) if value.strip() else []:
                    yield from ((f"the {_kind(f)} of dataset {spec!r}", p.label, f) for f in dataset_files(spec))


def check_readable_kind(path: str | os.PathLike, label: str) -> None:
    """Refuse an existing input that is neither a regular file nor a folder (a FIFO, socket or
    device): reading it would block forever or never end. ``label`` names it in the message."""
    import stat

    try:
        mode = os.stat(path).st_mode
    except (OSError, ValueError):  # missing: the command's own loading says so
        return
    if not (stat.S_ISREG(mode) or stat.S_ISDIR(mode)):
        kind = ("a FIFO (named pipe)" if stat.S_ISFIFO(mode) else "a socket" if stat.S_ISSOCK(mode)
                else "a device" if stat.S_ISCHR(mode) or stat.S_ISBLK(mode) else "not a regular file")
        raise UsageError(f"{label} is {kind}; give a regular file")


def _kind(path: Path) -> str:
    return "folder" if path.is_dir() else "file"


def dataset_files(spec: str) -> list[Path]:
    """The files and folders a dataset spec names (:func:`jemeval.data.dataset_files`)."""
    from jemeval.data import dataset_files as files  # torch only when a command runs, never for --help

    return files(spec)
