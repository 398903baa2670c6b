"""Reusable option bundles of the commands, and parsers of option values.

The files a command reads and writes are in :mod:`jemeval.cli.paths`, printing and saving results
in :mod:`jemeval.cli.output`. Each option's destination is the name of the Python parameter it
fills (``--sigma`` fills ``input_sigma``), so an error the core raises about that parameter is
shown with the flag (:func:`jemeval.cli.flag_message`).
"""
from __future__ import annotations

import contextlib
import functools
import os
import sys
from typing import TYPE_CHECKING

import click

from jemeval.cli.output import emit, output_options
from jemeval.cli.paths import Command, PathArgument, PathOption, dataset_option, input_path_option, output_path_option
from jemeval.errors import UsageError

if TYPE_CHECKING:
    import torch

#: names plugins written against jemeval 0.1 import from here (they are defined in paths and output)
__all__ = ["Command", "PathArgument", "PathOption", "dataset_option", "emit", "input_path_option", "output_options",
           "output_path_option"]


def sigma_option(fn):
    """--sigma: the evaluation input noise (``input_sigma``), an explicit and recorded setting."""
    return click.option(
        "--sigma", "input_sigma", type=click.FloatRange(min=0.0), default=0.0, show_default=True,
        help="Std of Gaussian noise added to every evaluation input (the JEM release used 0.03: "
             "pass --sigma 0.03 to reproduce it).")(fn)


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


def data_options(fn):
    """--data-root and --download for commands that read datasets."""
    fn = click.option("--download", is_flag=True,
                      help="Download torchvision datasets that are missing (needs internet).")(fn)
    fn = click.option("--data-root", type=click.Path(file_okay=False), default=None,
                      help="Folder holding datasets (default: $JEMEVAL_DATA_ROOT or ~/.cache/jemeval/datasets).")(fn)
    return fn


def model_option(fn):
    return input_path_option("--model", "model_path", what="the input checkpoint", required=True,
                             help="A checkpoint: jemeval's (e.g. runs/digits/best.pt) or a JEM release file.")(fn)


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
    rank (:func:`_as_rank`): rank 0 prints, writes files and reports any rank's error; the others
    say nothing."""
    @click.option("--nproc", type=click.IntRange(min=1), default=None, metavar="N",
                  help="Run in N processes on this machine (torchrun; gloo on CPU, nccl on CUDA with one GPU "
                       "each), the batches shared out; the same records as one process.")
    @functools.wraps(fn)
    def wrapper(*args, nproc=None, **kwargs):
        from jemeval.runtime.launch import check_nproc, launched_by_torchrun, relaunch

        if launched_by_torchrun(nproc):
            return _as_rank(fn, args, kwargs)
        if nproc is not None and nproc > 1:
            check_nproc(nproc, resolve_device(kwargs.get("device")))
            command = click.get_current_context().info_name
            sys.exit(relaunch(nproc, without_nproc(sys.argv[1:]), command=command))
        return fn(*args, **kwargs)

    return wrapper


def _as_rank(fn, args, kwargs):
    """Run the command as one rank of a torchrun launch: join the process group on this rank's
    device (``cuda:LOCAL_RANK`` or the CPU); rank 0 runs as usual, the others silently.

    Every rank ends with one exchange of errors (:func:`jemeval.runtime.distributed.raise_any`, the
    same collective :func:`jemeval.runtime.shards.map_batches` begins with): a rank that fails
    before or between the shared batches meets the others there, so all ranks stop together and
    rank 0 alone reports the error, in one line.
    """
    from jemeval.runtime.distributed import destroy, join, raise_any
    from jemeval.runtime.shards import sharded

    ctx = join(resolve_device(kwargs.get("device")))
    if "device" in kwargs:
        kwargs["device"] = str(ctx.device)
    result, error = None, None
    try:
        with contextlib.ExitStack() as quiet:
            quiet.enter_context(sharded())
            if not ctx.is_main:
                null = quiet.enter_context(open(os.devnull, "w"))
                quiet.enter_context(contextlib.redirect_stdout(null))
                quiet.enter_context(contextlib.redirect_stderr(null))
            try:
                result = fn(*args, **kwargs)
            except Exception as exc:  # noqa: BLE001 - every rank hears of it below
                if getattr(exc, "shared", False):
                    raise
                error = exc
            raise_any(error)
    except Exception:
        if ctx.is_main:
            raise
        return None  # rank 0 reports it
    finally:
        destroy()
    return result
