"""What every evaluation entry point does first and last: the model, its data, its arguments, its provenance.

:func:`prepare_model` gives an EnergyModel on the run's device (a checkpoint path is loaded);
:func:`training_dataset` / :func:`recorded_dataset` read the dataset a checkpoint records, but only a
plain registered name (a checkpoint never chooses which local files a command reads);
:func:`check_input_shape` and the ``check_*`` functions refuse a bad argument in one line naming the
parameter; :func:`stamp` writes the provenance every Result carries. The batch size is checked once,
where the :class:`~jemeval.context.RunContext` is made.
"""
from __future__ import annotations

import math
import os
from collections.abc import Sequence
from typing import Any

import numpy as np
import torch
from torch.utils.data import Dataset

from jemeval.context import RunContext
from jemeval.data import data_hashes, input_shape_of, names_no_path
from jemeval.errors import UsageError
from jemeval.evaluation.limits import check_count
from jemeval.formats.load import load_model
from jemeval.provenance import provenance
from jemeval.runtime.devices import resolve_device


def prepare_model(model, device: str | torch.device | None = None):
    """An EnergyModel from a model or a checkpoint path, on ``device``, in eval mode."""
    if isinstance(model, (str, os.PathLike)):
        return load_model(model, device=device or "cpu")
    if device is not None:
        model = model.to(resolve_device(device))
    return model.eval()


def stamp(command: str, model, context: RunContext, settings: dict[str, Any],
          data: Sequence[str] | None = None) -> dict[str, Any]:
    """The provenance of an entry point's Result: the command, the model (checkpoint path and hash),
    the device it ran on, the run's seed, the ``settings`` that define the numbers and the SHA-256 of
    the files of the datasets read (``data``: their specs; default: ``settings["data"]``)."""
    read = [settings.get("data")] if data is None else data
    return provenance(command=command, model=model, device=model.device, seed=context.seed, settings=settings,
                      data=data_hashes(read))


# -- argument checks shared by the evaluation functions ------------------------------------------------
def check_min(param: str, value, low) -> None:
    """``value`` of parameter ``param`` must be at least ``low`` (one line naming the parameter)."""
    if not value >= low:  # also refuses NaN
        raise UsageError(f"{param} must be >= {low}, got {value}", param=param)


def check_input_sigma(value: float, param: str = "input_sigma") -> float:
    """The evaluation input noise: a finite number >= 0."""
    if not (value >= 0 and math.isfinite(value)):  # also refuses NaN
        raise UsageError(f"{param} must be a finite number >= 0, got {value}", param=param)
    return float(value)


def check_refine_steps(refine_steps: int | Sequence[int]) -> list[int]:
    """One number of SGLD refinement steps or a list of them: whole numbers >= 0 (0 = no refinement),
    within their ceiling (:mod:`jemeval.evaluation.limits`)."""
    steps = [refine_steps] if isinstance(refine_steps, (int, np.integer)) else list(refine_steps)
    if not steps:
        raise UsageError("refine_steps is empty; give e.g. 0,1,10", param="refine_steps")
    for k in steps:
        if int(k) != k or int(k) < 0:
            raise UsageError(f"refine_steps must be integers >= 0 (0 = no refinement), got {k}", param="refine_steps")
        check_count("refine_steps", k, low=0)
    return [int(k) for k in steps]


def model_data_options(model) -> dict[str, Any]:
    """What a dataset is offered of the model it feeds: its input shape, and its own preprocessing
    (a hub model's resize, crop and interpolation, ``metadata["preprocessing"]``) where it records one."""
    meta = getattr(model, "metadata", None) or {}
    preprocess = meta.get("preprocessing")  # offered only where recorded: a set is loaded (and shared) as before
    return {"input_shape": model.input_shape, **({"preprocess": preprocess} if preprocess else {})}


def check_input_shape(model, dataset: Dataset, name: str) -> None:
    """A dataset whose images do not fit the model fails with both shapes named."""
    expected = tuple(getattr(model, "input_shape", ()) or ())
    if not expected or len(dataset) == 0:
        return
    got = input_shape_of(dataset)
    if tuple(got) != expected:
        raise UsageError(
            f"dataset {name!r} has images of shape {tuple(got)} but the model takes {expected}; "
            "choose a dataset of the model's input shape"
        )


# -- the dataset a checkpoint records -------------------------------------------------------------------
def training_dataset(model, *, param: str = "data") -> str:
    """The dataset the model was trained on (checkpoint metadata), or an error naming ``param``."""
    name = (getattr(model, "metadata", None) or {}).get("dataset")
    if not name:
        raise UsageError(f"the checkpoint does not record its training dataset; give {param}=DATASET "
                         "(e.g. cifar10)", param=param)
    return recorded_dataset(str(name), param=param)


def recorded_dataset(spec: str, *, param: str = "data") -> str:
    """A dataset spec a checkpoint (or any file) recorded, used only when it is a plain registered name
    (:func:`jemeval.data.names_no_path`): a downloaded checkpoint must not choose which local files a
    command reads (``folder:/`` crawled the disk, ``npz:/etc/passwd`` was opened). Otherwise one
    line quoting the spec, so the user can give it themselves as ``param``."""
    if not names_no_path(spec):
        shown = repr(spec) if any(c.isspace() or c in ",;)'\"" for c in spec) else spec  # copyable as a flag value
        raise UsageError(f"the checkpoint records its training set as {spec!r}, not a plain dataset name (it can "
                         "name local files); jemeval never lets a checkpoint choose which files to read: give "
                         f"{param}={shown} (or another dataset)", param=param)
    return spec
