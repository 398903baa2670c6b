"""Reusable option bundles of the commands, and parsers of option values.

The files a command reads and writes are in :mod:`jemeval.cli.paths`, printing and saving results
in :mod:`jemeval.cli.output`. Each option's destination is the name of the Python parameter it
fills (``--input-sigma`` fills ``input_sigma``), so an error the core raises about that parameter is
shown with the flag (:func:`jemeval.cli.flag_message`).
"""
from __future__ import annotations

import functools
import math
import os
import sys
from typing import TYPE_CHECKING

import click

from jemeval.cli.config import config_record
from jemeval.cli.output import emit, output_options, progress
from jemeval.cli.paths import Command, PathArgument, PathOption, dataset_option, input_path_option, output_path_option
from jemeval.context import RunContext
from jemeval.errors import UsageError
from jemeval.runtime.workers import default_workers

if TYPE_CHECKING:
    import torch

#: names plugins written against jemeval 0.1 import from here (they are defined in paths and output)
__all__ = ["Command", "PathArgument", "PathOption", "dataset_option", "emit", "input_path_option", "output_options",
           "output_path_option"]


# -- noise: --input-sigma, --chain-sigma, and --sigma (deprecated) --------------------------------
#: what each noise parameter is, in the one line the deprecated --sigma prints
NOISE = {"input_sigma": ("--input-sigma", "the noise added to the evaluation inputs"),
         "chain_sigma": ("--chain-sigma", "the noise added to each refinement chain's copy of the input")}
#: where the values of a noise option and of the --sigma that fills the same parameter meet (ctx.meta)
NOISE_META = "jemeval.noise"
#: click's parameter sources, most explicit first (a ParameterSource is no IntEnum before click 8.2)
SOURCE_RANK = {"COMMANDLINE": 0, "ENVIRONMENT": 1, "DEFAULT_MAP": 2, "DEFAULT": 3}


class NoiseStd(click.ParamType):
    """A noise std: a finite number >= 0, refused at parsing naming the flag the user typed."""

    name = "float"

    def convert(self, value, param, ctx):
        try:
            number = float(value)
        except (TypeError, ValueError):
            self.fail(f"{value!r} is not a number", param, ctx)
        if not math.isfinite(number) or number < 0:
            self.fail(f"must be a finite number >= 0, got {value}", param, ctx)
        return number


class NoiseOption(click.Option):
    """``--input-sigma`` / ``--chain-sigma``: its value meets the deprecated ``--sigma`` filling the
    same parameter, if the command has one (:func:`_settle`)."""

    def handle_parse_result(self, ctx, opts, args):
        value, args = super().handle_parse_result(ctx, opts, args)
        _settle(ctx, self.name, "new", value)
        return value, args


class OldSigmaOption(click.Option):
    """``--sigma``, kept for one release with its old meaning in this command (``fills``: input_sigma
    in ood, calibrate, eval and report; chain_sigma in robust and distal). Its value goes to that
    parameter: the command, the result's provenance and a config file's record see only the new
    name. A config file's ``sigma`` key is this option too, so old files keep working."""

    def __init__(self, *args, fills: str, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.fills = fills

    def handle_parse_result(self, ctx, opts, args):
        value, args = super().handle_parse_result(ctx, opts, args)
        ctx.params.pop(self.name, None)  # the command never receives it
        _settle(ctx, self.fills, "old", value, self)
        return value, args


def _source_rank(ctx: click.Context, name: str) -> int:
    source = ctx.get_parameter_source(name)
    return SOURCE_RANK.get(getattr(source, "name", ""), SOURCE_RANK["DEFAULT"])


def _settle(ctx: click.Context, target: str, role: str, value, old: OldSigmaOption | None = None) -> None:
    """Once both the noise option and the deprecated --sigma filling ``target`` are parsed: the more
    explicit source wins (command line > config file > default), the same source twice is refused,
    and a --sigma that was given says so in one line."""
    seen = ctx.meta.setdefault(NOISE_META, {}).setdefault(target, {})
    seen[role] = (value, old)
    if len(seen) < 2 or ctx.resilient_parsing:
        return
    old_value, old = seen["old"]
    flag = NOISE[target][0]
    old_rank, new_rank = _source_rank(ctx, old.name), _source_rank(ctx, target)
    if old_value is None or old_rank == SOURCE_RANK["DEFAULT"]:
        return
    if old_rank == new_rank:
        if old_rank == SOURCE_RANK["DEFAULT_MAP"]:
            raise UsageError(f"config {(config_record(ctx) or {}).get('file', '')!r} sets both 'sigma' and "
                             f"'{flag[2:]}' ('sigma' is the old name of '{flag[2:]}' in {ctx.info_name}): keep only "
                             f"'{flag[2:]}'")
        raise UsageError(f"--sigma and {flag} both given (--sigma is the old name of {flag} in {ctx.info_name}): "
                         f"give only {flag}")
    _announce(ctx, target, from_file=old_rank == SOURCE_RANK["DEFAULT_MAP"])
    if old_rank < new_rank:
        ctx.params[target] = old_value
        ctx.set_parameter_source(target, ctx.get_parameter_source(old.name))


def _announce(ctx: click.Context, target: str, *, from_file: bool) -> None:
    """The deprecation line, once per run: not again in the workers a ``--nproc`` launch starts (the
    launching process said it), and by rank 0 alone under torchrun."""
    if os.environ.get("JEMEVAL_RELAUNCHED") == "1" or os.environ.get("RANK", "0") != "0":
        return
    flag, meaning = NOISE[target]
    if from_file:
        record = config_record(ctx) or {}
        said = f"config {record.get('file', '')!r}: the key 'sigma' is deprecated; write '{flag[2:]}'"
    else:
        said = f"--sigma is deprecated; use {flag}"
    click.echo(f"note: {said} ({meaning}, what {ctx.info_name}'s --sigma meant); the old name goes in the "
               "next release", err=True)


def noise_option(target: str, *, default: float | None = 0.0, help: str, old_sigma: bool = False):
    """``--input-sigma`` or ``--chain-sigma`` (``target``: input_sigma or chain_sigma), and with
    ``old_sigma`` the deprecated ``--sigma`` meaning the same in this command."""
    def deco(fn):
        if old_sigma:
            fn = click.option("--sigma", "sigma", cls=OldSigmaOption, fills=target, type=NoiseStd(), default=None,
                              help=f"Deprecated: the old name of {NOISE[target][0]} in this command (removed in "
                                   "the next release).")(fn)
        return click.option(NOISE[target][0], target, cls=NoiseOption, type=NoiseStd(), default=default,
                            show_default=default is not None, help=help)(fn)
    return deco


INPUT_SIGMA_HELP = ("Std of Gaussian noise added to every evaluation input; give 0.03 to reproduce the JEM "
                    "release, which noised every input.")
CHAIN_SIGMA_HELP = ("Std of the noise added to each refinement chain's copy of the input before its SGLD "
                    "steps; give 0.03 to reproduce the JEM release's refinement.")


def sigma_option(fn):
    """--input-sigma: the evaluation input noise (``input_sigma``), an explicit and recorded setting;
    --sigma, its old name in ood, calibrate and eval, kept for one release."""
    return noise_option("input_sigma", help=INPUT_SIGMA_HELP, old_sigma=True)(fn)


def chain_sigma_option(fn=None, *, old_sigma: bool = False):
    """--chain-sigma: the noise of the refinement chains (``chain_sigma``); with ``old_sigma`` also
    --sigma, its old name in robust and distal, kept for one release."""
    deco = noise_option("chain_sigma", help=CHAIN_SIGMA_HELP, old_sigma=old_sigma)
    return deco(fn) if fn is not None else deco


def batch_size_option(default: int = 256, help: str = "Examples per forward pass."):
    def deco(fn):
        return click.option("--batch-size", type=int, default=default, show_default=True, help=help)(fn)
    return deco


def device_option(fn):
    return click.option("--device", default="auto", show_default=True,
                        help="cpu, cuda, cuda:N or auto (cuda when available).")(fn)


#: a seed every generator takes (numpy's need >= 0, torch's fit in 64 bits)
SEED = click.IntRange(0, 2**63 - 1)


def seed_option(default=0):
    def deco(fn):
        return click.option("--seed", type=SEED, default=default, show_default=True, help="Random seed (recorded).")(fn)
    return deco


def data_root_option(fn):
    """--data-root: the folder holding datasets."""
    return click.option("--data-root", type=click.Path(file_okay=False), default=None,
                        help="Folder holding datasets (default: $JEMEVAL_DATA_ROOT or ~/.cache/jemeval/datasets).")(fn)


def data_options(fn):
    """--data-root and --download for commands that read datasets."""
    fn = click.option("--download", is_flag=True,
                      help="Download torchvision datasets and --model weights (timm:, torchvision:, pytorch-ood:, "
                           "hf:) that are missing (needs internet).")(fn)
    return data_root_option(fn)


NO_CACHE_HELP = ("Neither read nor write jemeval's caches (fitted detectors in $JEMEVAL_CACHE_DIR/detectors, default "
                 "~/.cache/jemeval/detectors): fit again.")


#: --workers: how many processes decode a dataset read image by image (None: the machine's default)
workers_option = click.option("--workers", type=click.IntRange(min=0), default=None, help=(
    "Processes decoding a dataset read image by image (folder:, torchvision sets) while the model computes; "
    "0 decodes between batches in this process. The same numbers for any count. npz and built-in array sets "
    f"use none. [default: min(8, CPUs - 1): {default_workers()} here]"))


def run_options(*, batch_size: int | None = 256, batch_help: str = "Examples per forward pass.", data: bool = True,
                download: bool = True, no_cache: bool = False, no_cache_help: str = NO_CACHE_HELP):
    """The options of a command's run context, as one bundle: --seed, --device, --batch-size (unless
    ``batch_size`` is None), --data-root, --download and --workers (with ``data``; ``download=False``
    leaves --download out) and --no-cache (with ``no_cache``). The command receives one ``context``
    (:class:`jemeval.context.RunContext`, with the command line's progress) instead of those values,
    and hands it to the function it wraps: a new run setting is a field of RunContext and an option
    here, nothing in the commands.

    Put it last (just above ``def cli``): the wrappers above it (``--nproc``, ``--model``) still see
    the values of --device and --download as the user gave them."""
    options = [seed_option(0), device_option]
    if batch_size is not None:
        options.append(batch_size_option(batch_size, batch_help))
    if data:
        options.append(data_options if download else data_root_option)
        options.append(workers_option)
    if no_cache:
        options.append(click.option("--no-cache", "no_cache", is_flag=True, help=no_cache_help))

    def deco(fn):
        @functools.wraps(fn)
        def wrapper(*args, **kwargs):
            kwargs["context"] = context_from_options(kwargs)
            return fn(*args, **kwargs)

        for option in reversed(options):
            wrapper = option(wrapper)
        return wrapper

    return deco


def context_from_options(values: dict):
    """The :class:`~jemeval.context.RunContext` of the parsed options (each one popped from ``values``):
    the device parsed (errors name --device), the progress the command line shows (stderr)."""
    return RunContext(seed=values.pop("seed"), device=resolve_device(values.pop("device")),
                      batch_size=values.pop("batch_size", None), progress=progress(),
                      data_root=values.pop("data_root", None), download=bool(values.pop("download", False)),
                      cache=not values.pop("no_cache", False), workers=values.pop("workers", 0))


class ModelOption(PathOption):
    """``--model``: a checkpoint file, or a model source (``timm:resnet18``, ...) whose cached weights
    file is an input too (:func:`jemeval.formats.load.model_source_files`): no output goes over it."""

    def paths(self, ctx: click.Context) -> list[str]:
        from jemeval.formats.load import model_source_files

        values = super().paths(ctx)
        return values + [f for v in values for f in model_source_files(v)]


MODEL_HELP = ("A checkpoint (jemeval's, e.g. runs/digits/best.pt, or a JEM release file) or a pretrained model: "
              "timm:NAME, torchvision:NAME[:WEIGHTS], pytorch-ood:KEY, hf:ORG/NAME (docs/models.md).")


def model_option(fn):
    """--model (a checkpoint or a model source). In a command with --download, the flag also lets
    a model source that is not cached be fetched (:func:`jemeval.formats.load.model_downloads`)."""
    @click.option("--model", "model_path", cls=ModelOption, role="input", what="the input checkpoint",
                  type=click.Path(), required=True, help=MODEL_HELP)
    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        from jemeval.formats.load import model_downloads

        with model_downloads(bool(kwargs.get("download"))):
            return fn(*args, **kwargs)

    return wrapper


def resolve_device(device: str | None) -> torch.device:
    """``--device``: the core parser (:func:`jemeval.runtime.devices.resolve_device`) naming the flag."""
    from jemeval.runtime.devices import resolve_device as parse_device

    return parse_device(device, name="--device")


def split_list(value: str | None, what: str) -> list[str]:
    """'a,b , c' -> ['a', 'b', 'c'] (brackets kept together: 'digits[0,1],uniform')."""
    from jemeval.registry import split_specs

    return split_specs(value, what)


def parse_floats(value: str, what: str) -> list[float]:
    try:
        return [float(eval_fraction(v)) for v in split_list(value, what)]
    except (ValueError, ZeroDivisionError):
        raise UsageError(f"{what} must be comma-separated numbers (fractions like 8/255 are fine), "
                         f"got {value!r}") from None


def parse_epsilons(value: str, what: str) -> list[float | str]:
    """Perturbation sizes: numbers or fractions, and ``max`` (the norm's largest, where every input
    is within reach: the large-epsilon sanity check runs there)."""
    items = split_list(value, what)
    try:
        return [v.strip().lower() if v.strip().lower() == "max" else float(eval_fraction(v)) for v in items]
    except (ValueError, ZeroDivisionError):
        raise UsageError(f"{what} must be comma-separated numbers (fractions like 8/255 are fine) or max, "
                         f"got {value!r}") from None


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


def without_nproc(args: list[str]) -> list[str]:
    """``args`` with ``--nproc N`` / ``--nproc=N`` removed (the command line a worker runs)."""
    out, skip = [], False
    for a in args:
        if skip:
            skip = False
        elif a == "--nproc":
            skip = True
        elif not a.startswith("--nproc="):
            out.append(a)
    return out


def nproc_option(fn):
    """``--nproc N`` for an evaluation command: re-launch the command line in N processes on this
    machine through torchrun (gloo on CPU, nccl on CUDA with one GPU per process); the command's
    computation shares its batches out (:mod:`jemeval.runtime.shards`) and gives the records of one
    process. Under ``torchrun -m jemeval ...`` (with or without ``--nproc``) the command runs as one
    rank (:func:`jemeval.cli.ranks.run_as_rank`): rank 0 prints and writes files, the first process
    of each node reports an error every rank shares; the others say nothing."""
    @click.option("--nproc", type=click.IntRange(min=1), default=None, metavar="N",
                  help="Run in N processes on this machine (torchrun; gloo on CPU, nccl on CUDA with one GPU "
                       "each), the batches shared out; the same records as one process.")
    @functools.wraps(fn)
    def wrapper(*args, nproc=None, **kwargs):
        from jemeval.cli.ranks import run_as_rank
        from jemeval.runtime.launch import check_nproc, launched_by_torchrun, relaunch

        if launched_by_torchrun(nproc):
            return run_as_rank(fn, args, kwargs, resolve_device(kwargs.get("device")))
        if nproc is not None and nproc > 1:
            check_nproc(nproc, resolve_device(kwargs.get("device")))
            command = click.get_current_context().info_name
            sys.exit(relaunch(nproc, without_nproc(sys.argv[1:]), command=command))
        return fn(*args, **kwargs)

    return wrapper
