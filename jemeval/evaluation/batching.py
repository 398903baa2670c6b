"""The one batch loop every evaluation command shares.

For a model and a dataset it runs the network **once per batch** and derives everything from that
single forward pass: the logits, and every score that only needs the logits (built-in scores carry
a ``from_logits`` attribute, see :mod:`jemeval.builtins.scores`). Scores that need more than the
logits (``gradnorm`` needs d log p~(x)/dx; a plugin score may do anything) are called on the same
batch. The evaluation input noise ``sigma`` is applied once per batch from a seeded generator, so
the logits and every score see the *same* noisy inputs, and the numbers are reproducible.

Results stay on the device until the loop ends (no per-batch host copies or ``.item()``) and come
back as numpy arrays.
"""
from __future__ import annotations

import math
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch
from torch import nn
from torch.utils.data import Dataset

from jemeval.data import iterate_batches
from jemeval.errors import JemevalError, UsageError
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
    from jemeval.plugins import get_registry

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
            raise JemevalError(f"score {label!r} returned shape {tuple(value.shape)} for a batch of {n}; a score returns one value per example")
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
    progress: bool | None = None,
    desc: str | None = None,
) -> BatchOutputs:
    """One pass over ``dataset``: logits once per batch, every score from that batch.

    ``sigma`` > 0 adds N(0, sigma^2) noise to every input (the JEM release used 0.03 at evaluation)
    from a generator seeded with ``seed`` on the model's device, before the logits and all scores
    are computed. The network runs in eval mode with frozen parameters; gradient scores still get
    input gradients (they enable grad themselves).
    """
    if not (sigma >= 0 and math.isfinite(sigma)):  # also refuses NaN
        raise UsageError(f"--sigma must be a finite number >= 0, got {sigma}")
    if batch_size <= 0:
        raise UsageError(f"--batch-size must be positive, got {batch_size}")
    device = torch.device(device) if device is not None else _model_device(model)
    generator = torch.Generator(device=device).manual_seed(int(seed)) if sigma > 0 else None
    logits_parts: list[torch.Tensor] = []
    label_parts: list[torch.Tensor] = []
    score_parts: dict[str, list[torch.Tensor]] = {s.label: [] for s in scores}
    # a forward pass only when something reads the logits (gradient scores do their own)
    need_logits = keep_logits or any(s.from_logits is not None for s in scores)
    logits = None
    bar = _progress(len(dataset), desc, progress)
    try:
        with frozen(model, train=False):
            for x, y in iterate_batches(dataset, batch_size, device):
                x = x.float()
                if generator is not None:
                    x = x + float(sigma) * torch.randn(x.shape, generator=generator, device=device, dtype=x.dtype)
                if need_logits:
                    with torch.no_grad():
                        logits = logits_of(model, x).float()
                n = x.shape[0]
                for s in scores:
                    score_parts[s.label].append(_check_score(s.label, s.on_batch(model, x, logits), n))
                if keep_logits:
                    logits_parts.append(logits)
                label_parts.append(y.long())
                if bar is not None:
                    bar.update(n)
    finally:
        if bar is not None:
            bar.close()
    if not label_parts:
        raise UsageError(f"dataset {getattr(dataset, 'spec', None) or ''} has no examples; choose a non-empty dataset or class subset")
    out_scores = {label: _to_numpy64(torch.cat(parts)) for label, parts in score_parts.items()}
    for label, values in out_scores.items():
        bad = ~np.isfinite(values)
        if bad.any():
            raise JemevalError(
                f"score {label!r} is not finite for {int(bad.sum())} of {len(values)} examples of "
                f"{getattr(dataset, 'spec', None) or 'the dataset'}; the model's outputs overflow there"
            )
    return BatchOutputs(
        logits=torch.cat(logits_parts).cpu().numpy() if keep_logits else None,
        labels=torch.cat(label_parts).cpu().numpy(),
        scores=out_scores,
        settings={"sigma": float(sigma), "noise_seed": int(seed) if sigma > 0 else None, "batch_size": int(batch_size)},
    )


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


def _progress(total: int, desc: str | None, progress: bool | None):
    """A tqdm bar on stderr; ``progress=None`` shows it only on a terminal."""
    if progress is False:
        return None
    from tqdm import tqdm

    return tqdm(total=total, desc=desc, unit="img", file=sys.stderr, disable=None if progress is None else not progress,
                leave=False)


def prepare_model(model, device: str | torch.device | None = None):
    """An EnergyModel from a model or a checkpoint path, on ``device``, in eval mode."""
    import os

    if isinstance(model, (str, os.PathLike)):
        from jemeval.formats.load import load_model

        return load_model(model, device=device or "cpu")
    if device is not None:
        model = model.to(resolve_device(device))
    return model.eval()


def check_input_shape(model, dataset: Dataset, name: str) -> None:
    """A dataset whose images do not fit the model fails with both shapes named."""
    from jemeval.data import input_shape_of

    expected = tuple(getattr(model, "input_shape", ()) or ())
    if not expected or len(dataset) == 0:
        return
    got = input_shape_of(dataset)
    if tuple(got) != expected:
        raise UsageError(
            f"dataset {name!r} has images of shape {tuple(got)} but the model takes {expected}; "
            "choose a dataset of the model's input shape"
        )


def training_dataset(model, *, option: str = "--data") -> str:
    """The dataset the model was trained on (checkpoint metadata), or an error naming ``option``."""
    name = (getattr(model, "metadata", None) or {}).get("dataset")
    if not name:
        raise UsageError(
            f"the checkpoint does not record its training dataset; name the dataset with {option} DATASET "
            f"(e.g. {option} cifar10)"
        )
    return str(name)
