"""The one batch loop every evaluation command shares.

For a model and a dataset it runs the network **once per batch** and derives everything from that
single forward pass: the logits, and every score that only needs the logits (built-in scores carry
a ``from_logits`` attribute, see :mod:`jemeval.builtins.scores`). Scores that need more than the
logits (``gradnorm`` needs d log p~(x)/dx; a plugin score may do anything) are called on the same
batch. The evaluation input noise ``sigma`` is applied once per batch from a seeded generator, so
the logits and every score see the *same* noisy inputs, and the numbers are reproducible.

Results stay on the device until the loop ends (no per-batch host copies or ``.item()``) and come
back as numpy arrays. The module also holds what every evaluation function checks the same way: the
model (:func:`prepare_model`), its training dataset, input shapes and numeric arguments.
"""
from __future__ import annotations

import math
import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch
from torch import nn
from torch.utils.data import Dataset

from jemeval.data import input_shape_of, iterate_batches
from jemeval.errors import JemevalError, UsageError
from jemeval.formats.load import load_model
from jemeval.plugins import get_registry
from jemeval.progress import ProgressArg, progress_bar
from jemeval.registry import check_options, parse_spec
from jemeval.runtime.devices import resolve_device
from jemeval.sampling.sgld import frozen

DEFAULT_BATCH_SIZE = 256


@dataclass(frozen=True)
class ScoreFn:
    """A resolved score: its label as written (``energy:T=2``), the callable and its options."""

    label: str
    name: str
    fn: Callable
    options: dict[str, Any] = field(default_factory=dict)

    @property
    def from_logits(self) -> Callable | None:
        """The logits-only form of the score, if it has one (then no extra forward pass)."""
        return getattr(self.fn, "from_logits", None)

    def on_batch(self, model: nn.Module, x: torch.Tensor, logits: torch.Tensor | None) -> torch.Tensor:
        if self.from_logits is not None:
            return self.from_logits(logits, **self.options)
        return self.fn(model, x, **self.options)


def resolve_scores(specs: Sequence[str]) -> list[ScoreFn]:
    """Score specs (``logpx``, ``energy:T=2``) -> :class:`ScoreFn`; unknown names fail with a suggestion."""
    registry = get_registry()
    resolved, seen = [], set()
    for text in specs:
        spec = parse_spec(text)
        if spec.variant is not None or spec.classes is not None:
            raise UsageError(f"score {text!r}: scores take only key=value options, e.g. 'energy:T=2'")
        fn = registry.get("score", spec.name)
        check_options(fn, spec.options, f"score {spec.name!r}", skip=2)
        label = str(spec)
        if label in seen:
            raise UsageError(f"score {label!r} is given twice")
        seen.add(label)
        resolved.append(ScoreFn(label, spec.name, fn, dict(spec.options)))
    return resolved


@dataclass
class BatchOutputs:
    """What one pass over a dataset produced (numpy, in dataset order)."""

    logits: np.ndarray | None  # N x K float32 (None when not kept)
    labels: np.ndarray  # N int64 (-1 for unlabelled sets)
    scores: dict[str, np.ndarray]  # score label -> N float64
    settings: dict[str, Any]  # sigma, noise seed, batch size: for provenance

    def __len__(self) -> int:
        return len(self.labels)


def logits_of(model: nn.Module, x: torch.Tensor) -> torch.Tensor:
    """Logits of an EnergyModel (``.logits``) or of any logits module (``model(x)``)."""
    fn = getattr(model, "logits", None)
    out = fn(x) if callable(fn) else model(x)
    return out.reshape(out.shape[0], -1) if out.dim() != 2 else out


def _check_score(label: str, value: torch.Tensor, n: int) -> torch.Tensor:
    if not torch.is_tensor(value):
        raise JemevalError(f"score {label!r} returned a {type(value).__name__}, not a tensor of {n} values")
    value = value.detach()
    if value.shape != (n,):
        value = value.reshape(-1) if value.numel() == n else value
        if value.shape != (n,):
            raise JemevalError(f"score {label!r} returned shape {tuple(value.shape)} for a batch of {n}; "
                               "a score returns one value per example")
    return value


def run_batches(
    model: nn.Module,
    dataset: Dataset,
    *,
    scores: Sequence[ScoreFn] = (),
    keep_logits: bool = True,
    sigma: float = 0.0,
    seed: int = 0,
    batch_size: int = DEFAULT_BATCH_SIZE,
    device: str | torch.device | None = None,
    progress: ProgressArg = None,
    desc: str | None = None,
) -> BatchOutputs:
    """One pass over ``dataset``: logits once per batch, every score from that batch.

    ``sigma`` > 0 adds N(0, sigma^2) noise to every input (the evaluation input noise; the JEM
    release used 0.03) from a generator seeded with ``seed`` on the model's device, before the
    logits and all scores are computed. The network runs in eval mode with frozen parameters;
    gradient scores still get input gradients (they enable grad themselves). ``progress``: see
    :mod:`jemeval.progress` (one unit per image).
    """
    check_input_sigma(sigma, "sigma")
    check_min("batch_size", batch_size, 1)
    device = torch.device(device) if device is not None else _model_device(model)
    generator = torch.Generator(device=device).manual_seed(int(seed)) if sigma > 0 else None
    # a forward pass only when something reads the logits (gradient scores do their own)
    need_logits = keep_logits or any(s.from_logits is not None for s in scores)
    parts: dict[str, list[torch.Tensor]] = {"logits": [], "labels": [], **{s.label: [] for s in scores}}
    with progress_bar(progress, len(dataset), desc or "", unit="img") as bar, frozen(model, train=False):
        for x, y in iterate_batches(dataset, batch_size, device):
            x = x.float()
            if generator is not None:
                x = x + float(sigma) * torch.randn(x.shape, generator=generator, device=device, dtype=x.dtype)
            logits = _logits_no_grad(model, x) if need_logits else None
            for s in scores:
                parts[s.label].append(_check_score(s.label, s.on_batch(model, x, logits), x.shape[0]))
            if keep_logits:
                parts["logits"].append(logits)
            parts["labels"].append(y.long())
            bar.update(x.shape[0])
    if not parts["labels"]:
        raise UsageError(f"dataset {getattr(dataset, 'spec', None) or ''} has no examples; choose a non-empty "
                         "dataset or class subset")
    out_scores = {s.label: _finite_scores(s.label, torch.cat(parts[s.label]), dataset) for s in scores}
    return BatchOutputs(
        logits=torch.cat(parts["logits"]).cpu().numpy() if keep_logits else None,
        labels=torch.cat(parts["labels"]).cpu().numpy(),
        scores=out_scores,
        settings={"sigma": float(sigma), "noise_seed": int(seed) if sigma > 0 else None, "batch_size": int(batch_size)},
    )


def _logits_no_grad(model: nn.Module, x: torch.Tensor) -> torch.Tensor:
    with torch.no_grad():
        return logits_of(model, x).float()


def _finite_scores(label: str, values: torch.Tensor, dataset: Dataset) -> np.ndarray:
    """A score's values as float64 numpy; an overflowing model is named, not averaged into NaN."""
    values = _to_numpy64(values)
    bad = ~np.isfinite(values)
    if bad.any():
        raise JemevalError(
            f"score {label!r} is not finite for {int(bad.sum())} of {len(values)} examples of "
            f"{getattr(dataset, 'spec', None) or 'the dataset'}; the model's outputs overflow there"
        )
    return values


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
    """One number of SGLD refinement steps or a list of them: whole numbers >= 0 (0 = no refinement)."""
    steps = [refine_steps] if isinstance(refine_steps, (int, np.integer)) else list(refine_steps)
    if not steps:
        raise UsageError("refine_steps is empty; give e.g. 0,1,10", param="refine_steps")
    for k in steps:
        if int(k) != k or int(k) < 0:
            raise UsageError(f"refine_steps must be integers >= 0 (0 = no refinement), got {k}", param="refine_steps")
    return [int(k) for k in steps]


def _to_numpy64(values: torch.Tensor) -> np.ndarray:
    """float64 numpy (half/bfloat16 scores widened first: numpy has no bfloat16)."""
    if not values.is_floating_point() or values.dtype in (torch.float16, torch.bfloat16):
        values = values.float()
    return values.cpu().numpy().astype(np.float64)


def _model_device(model: nn.Module) -> torch.device:
    dev = getattr(model, "device", None)
    if isinstance(dev, torch.device):
        return dev
    for p in model.parameters():
        return p.device
    return torch.device("cpu")


def prepare_model(model, device: str | torch.device | None = None):
    """An EnergyModel from a model or a checkpoint path, on ``device``, in eval mode."""
    if isinstance(model, (str, os.PathLike)):
        return load_model(model, device=device or "cpu")
    if device is not None:
        model = model.to(resolve_device(device))
    return model.eval()


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


def training_dataset(model, *, param: str = "data") -> str:
    """The dataset the model was trained on (checkpoint metadata), or an error naming ``param``."""
    name = (getattr(model, "metadata", None) or {}).get("dataset")
    if not name:
        raise UsageError(f"the checkpoint does not record its training dataset; give {param}=DATASET "
                         "(e.g. cifar10)", param=param)
    return str(name)
