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

import copy
import math
import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch
from torch import nn
from torch.utils.data import Dataset

from jemeval.components import is_detector
from jemeval.data import input_shape_of, iterate_batches, names_no_path
from jemeval.errors import JemevalError, UsageError
from jemeval.formats.load import load_model
from jemeval.plugins import get_registry
from jemeval.progress import ProgressArg, progress_bar
from jemeval.registry import check_options, parse_spec
from jemeval.runtime.devices import resolve_device
from jemeval.runtime.shards import map_items, my_share
from jemeval.sampling.sgld import frozen

DEFAULT_BATCH_SIZE = 256


@dataclass(frozen=True)
class ScoreFn:
    """A resolved score: its label as written (``energy:T=2``), the function or detector, its options.

    A detector (:func:`jemeval.components.is_detector`) is this label's own instance, fitted by the
    caller with ``options`` before the batch loop scores with it.
    """

    label: str
    name: str
    fn: Any
    options: dict[str, Any] = field(default_factory=dict)

    @property
    def detector(self) -> bool:
        return is_detector(self.fn)

    @property
    def from_logits(self) -> Callable | None:
        """The logits-only form of the score, if it has one (then no extra forward pass)."""
        return None if self.detector else getattr(self.fn, "from_logits", None)

    @property
    def from_features(self) -> Callable | None:
        """The form that reads the batch's features and logits: ``from_features(model, features, logits,
        **options)`` of a function, ``score_features(features, logits)`` of a detector."""
        return getattr(self.fn, "score_features" if self.detector else "from_features", None)

    def on_batch(self, model: nn.Module, x: torch.Tensor, logits: torch.Tensor | None,
                 features: torch.Tensor | None = None) -> torch.Tensor:
        if self.detector:
            if features is not None and self.from_features is not None:
                return self.fn.score_features(features, logits)
            return self.fn.score(model, x)
        if self.from_logits is not None and logits is not None:
            return self.from_logits(logits, **self.options)
        if self.from_features is not None and features is not None:
            return self.from_features(model, features, logits, **self.options)
        return self.fn(model, x, **self.options)


def new_detector(obj: Any) -> Any:
    """This use's own detector: a registered class is instantiated, a registered object copied."""
    return obj() if isinstance(obj, type) else copy.deepcopy(obj)


def check_score_options(fn: Any, options: dict[str, Any], name: str) -> None:
    """Options a score accepts: a function's keywords after (model, x); a detector's after the data
    arguments of ``fit_features`` (model, features, logits, labels) or, without it, of ``fit``."""
    if is_detector(fn):
        target = getattr(fn, "fit_features", None)
        check_options(target or fn.fit, options, f"score {name!r}", skip=4 if target else 2)
    else:
        check_options(fn, options, f"score {name!r}", skip=2)


def resolve_scores(specs: Sequence[str]) -> list[ScoreFn]:
    """Score specs (``logpx``, ``energy:T=2``) -> :class:`ScoreFn`; unknown names fail with a suggestion."""
    registry = get_registry()
    resolved, seen = [], set()
    for text in specs:
        spec = parse_spec(text)
        if spec.variant is not None or spec.classes is not None:
            raise UsageError(f"score {text!r}: scores take only key=value options, e.g. 'energy:T=2'")
        fn = registry.get("score", spec.name)
        if is_detector(fn):
            fn = new_detector(fn)
        check_score_options(fn, spec.options, spec.name)
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
    features: np.ndarray | None = None  # N x D float32 penultimate features (None when not kept)
    negative_features: float | None = None  # fraction of feature values < 0 (None when no features computed)

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
    keep_features: bool = False,
    sigma: float = 0.0,
    seed: int = 0,
    batch_size: int = DEFAULT_BATCH_SIZE,
    device: str | torch.device | None = None,
    progress: ProgressArg = None,
    desc: str | None = None,
    before_batch: Callable[[int], Any] | None = None,
    check_finite: bool = True,
) -> BatchOutputs:
    """One pass over ``dataset``: logits (and features) once per batch, every score from that batch.

    ``sigma`` > 0 adds N(0, sigma^2) noise to every input (the evaluation input noise; the JEM
    release used 0.03) from a generator seeded with ``seed`` on the model's device, in dataset
    order, before the logits and all scores are computed. Under torchrun the batches are shared out
    over the processes and gathered (:func:`jemeval.runtime.shards.map_items`): the outputs of one
    process, noise included. When a score reads
    features (a fitted detector's ``score_features``) or ``keep_features`` is set, the forward pass
    gives the penultimate features too (:meth:`jemeval.energy.model.EnergyModel.features_and_logits`):
    still one pass per batch.
    The network runs in eval mode with frozen parameters; gradient scores still get input gradients
    (they enable grad themselves). ``progress``: see :mod:`jemeval.progress` (one unit per image).
    ``before_batch(b)`` runs before batch b is computed, e.g. to seed a stochastic model's stream
    for that batch (:func:`jemeval.runtime.shards.batch_seed`).
    Non-finite logits, features or scores stop the pass with one line naming the model and the first
    bad batch (:func:`check_finite_outputs`): finite weights can still overflow, and a metric of NaN
    reads as a number. ``check_finite=False`` leaves that to the caller (the trainer's validation,
    whose divergence checks own it).
    """
    check_input_sigma(sigma, "sigma")
    check_min("batch_size", batch_size, 1)
    device = torch.device(device) if device is not None else _model_device(model)
    # a forward pass only when something reads its outputs (gradient scores do their own)
    need_features = keep_features or any(s.from_features is not None for s in scores)
    need_logits = keep_logits or need_features or any(s.from_logits is not None for s in scores)

    generator = torch.Generator(device=device).manual_seed(int(seed)) if sigma > 0 else None

    def noisy_batches():
        """The batches with their input noise, drawn for every batch in order on every rank (the
        draws of the batches another rank runs are cheap, and keep one process's noise exactly)."""
        for x, y in iterate_batches(dataset, batch_size, device):
            x = x.float()
            if generator is not None:
                x = x + float(sigma) * torch.randn(x.shape, generator=generator, device=device, dtype=x.dtype)
            yield x, y

    def one(b: int, batch: tuple[torch.Tensor, torch.Tensor]) -> dict[str, torch.Tensor]:
        x, y = batch
        if before_batch is not None:
            before_batch(b)
        features, logits = _forward(model, x, need_logits, need_features)
        out = {s.label: _check_score(s.label, s.on_batch(model, x, logits, features), x.shape[0]) for s in scores}
        out.update({"logits": logits if keep_logits else None, "features": features if keep_features else None,
                    "labels": y.long()}, **_batch_summaries(logits, features))
        bar.update(x.shape[0])
        return {k: v.detach().cpu() for k, v in out.items() if v is not None}

    total = my_share(len(dataset), batch_size)  # this process's images (all of them in one process)
    with progress_bar(progress, total, desc or "", unit="img") as bar, frozen(model, train=False):
        done = map_items(one, noisy_batches())
    settings = {"sigma": float(sigma), "noise_seed": int(seed) if sigma > 0 else None, "batch_size": int(batch_size)}
    return _gather(done, model, dataset, scores, check_finite=check_finite, keep_logits=keep_logits,
                   keep_features=keep_features, settings=settings)


def _batch_summaries(logits: torch.Tensor | None, features: torch.Tensor | None) -> dict[str, torch.Tensor]:
    """Per-batch facts computed on the device and copied with the batch's outputs (no extra sync):
    whether the logits and features are finite, and how many feature values are negative."""
    out = {} if logits is None else {"_finite_logits": torch.isfinite(logits).all()}
    if features is not None:
        out.update(_finite_features=torch.isfinite(features).all(), _negative=(features < 0).double().mean())
    return out


def _gather(done: list[dict[str, torch.Tensor]], model: nn.Module, dataset: Dataset, scores: Sequence[ScoreFn], *,
            check_finite: bool, keep_logits: bool, keep_features: bool, settings: dict[str, Any]) -> BatchOutputs:
    """The per-batch outputs of :func:`run_batches` checked (finite) and joined in dataset order."""
    keys = ("logits", "features", "labels", "_finite_logits", "_finite_features", "_negative",
            *(s.label for s in scores))
    parts = {k: [d[k] for d in done] for k in keys if not done or k in done[0]}
    if not parts["labels"]:
        raise UsageError(f"dataset {getattr(dataset, 'spec', None) or ''} has no examples; choose a non-empty "
                         "dataset or class subset")
    sizes = [len(y) for y in parts["labels"]]
    of = str(getattr(dataset, "spec", None) or getattr(dataset, "name", None) or "the dataset")
    if check_finite:
        for key, what in (("_finite_logits", "logits"), ("_finite_features", "penultimate features"),
                          *((s.label, f"score {s.label!r}") for s in scores)):
            if key in parts:
                check_finite_outputs(what, parts[key], model, sizes=sizes, of=of)
    negative = (sum(float(f) * n for f, n in zip(parts["_negative"], sizes)) / sum(sizes)
                if "_negative" in parts else None)  # the fraction of feature values < 0, over the whole pass
    return BatchOutputs(
        logits=torch.cat(parts["logits"]).numpy() if keep_logits else None,
        labels=torch.cat(parts["labels"]).numpy(),
        scores={s.label: _to_numpy64(torch.cat(parts[s.label])) for s in scores},
        settings=settings,
        features=torch.cat(parts["features"]).numpy() if keep_features else None,
        negative_features=negative,
    )


def _forward(model: nn.Module, x: torch.Tensor, need_logits: bool,
             need_features: bool) -> tuple[torch.Tensor | None, torch.Tensor | None]:
    """(features, logits) of one batch without a graph, float32; None for what nobody reads."""
    if not need_logits:
        return None, None
    with torch.no_grad():
        if not need_features:
            return None, logits_of(model, x).float()
        if not callable(getattr(model, "features_and_logits", None)):
            raise UsageError(f"features-based scores need an EnergyModel (features_and_logits), got a "
                             f"{type(model).__name__}; load the model with jemeval.load_model")
        features, logits = model.features_and_logits(x)
        return features.float(), logits.float()


# -- non-finite outputs -----------------------------------------------------------------------------------
def model_label(model: Any) -> str:
    """How a message names a model: its checkpoint path when it was loaded from one (a refined
    classifier is named by the model it refines), else its architecture."""
    for m in (model, getattr(model, "model", None)):
        metadata = getattr(m, "metadata", None)
        path = ((metadata or {}).get("checkpoint") or {}).get("path") if isinstance(metadata, dict) else None
        if path:
            return f"checkpoint {str(path)!r}"
    arch = getattr(model, "arch", None) or getattr(getattr(model, "model", None), "arch", None)
    return f"the model ({arch})" if arch else f"the model ({type(model).__name__})"


def check_finite_outputs(what: str, per_batch: Sequence[torch.Tensor | None], model: Any, *, sizes: Sequence[int],
                         of: str | None = None, unit: str = "images") -> None:
    """Stop at the first batch whose ``what`` holds NaN or inf, naming the model and the batch.

    Every weight finite is not enough: weights x 1e30 pass the checkpoint's finite check, and the
    logits overflow. A metric computed from them reads as a number (ECE 0.0000, NLL "-", a NaN
    grid), so every evaluation stops instead, in one line. ``per_batch`` holds each batch's outputs
    already on the CPU (a bool tensor: a flag the batch computed on its device), ``sizes`` the
    number of ``unit`` in each batch, ``of`` what they are (a dataset).
    """
    start = 0
    for b, (t, size) in enumerate(zip(per_batch, sizes)):
        if t is not None and not bool(t.all() if t.dtype == torch.bool else torch.isfinite(t).all()):
            where = f" of {of}" if of else ""
            raise JemevalError(
                f"{model_label(model)} gives non-finite {what} (NaN or inf) on batch {b} ({unit} {start}-"
                f"{start + int(size) - 1}{where}): its outputs overflow although its weights are finite, and no "
                "metric is computed from them; use a checkpoint whose outputs are finite (an earlier one, or retrain)")
        start += int(size)


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
