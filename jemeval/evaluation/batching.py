"""The one batch loop every evaluation command shares.

For a model and a dataset it runs the network **once per batch** and derives everything from that
single forward pass: the logits, and every score that only needs the logits (built-in scores carry
a ``from_logits`` form, see :class:`jemeval.Score`), the features (``from_features``) or the input
gradient of log p~(x) (``from_input_grad``: ``gradnorm``). When a score reads that gradient, the
batch's one forward pass runs with grad and one backward gives it: logits, features and gradient
from the same pass, never a second forward. Scores that declare none of these forms (a plugin score
may do anything) are called on the same batch. The evaluation input noise ``sigma`` is applied once
per batch from a seeded generator, so the logits and every score see the *same* noisy inputs, and
the numbers are reproducible.

Results stay on the device until the loop ends (no per-batch host copies or ``.item()``) and come
back as numpy arrays. What every evaluation function checks before it gets here (the model, its
training dataset, input shapes, numeric arguments) is in :mod:`jemeval.evaluation.inputs`.
"""
from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch
from torch import nn
from torch.utils.data import Dataset

from jemeval.components import is_detector
from jemeval.components.adapters import new_detector
from jemeval.components.detector import Detector
from jemeval.components.options import check_option_values
from jemeval.components.score import Score, as_score
from jemeval.context import RunContext, takes_context
from jemeval.data import iterate_batches, loader_workers
from jemeval.deprecations import moved_names
from jemeval.energy.model import log_p
from jemeval.errors import JemevalError, UsageError
from jemeval.evaluation import inputs
from jemeval.plugins import get_registry
from jemeval.progress import progress_bar
from jemeval.registry import check_options, option_defaults, parse_spec
from jemeval.runtime.devices import resolve_device
from jemeval.runtime.memory import TRIM_EVERY, keep_memory_flat
from jemeval.runtime.shards import map_items, my_share
from jemeval.sampling.sgld import frozen

DEFAULT_BATCH_SIZE = 256


@dataclass(frozen=True)
class ScoreFn:
    """A resolved score: its label as written (``energy:T=2``), the :class:`~jemeval.Score` or
    :class:`~jemeval.Detector`, its options.

    A detector is this label's own instance, fitted by the caller with ``options`` before the batch
    loop scores with it.
    """

    label: str
    name: str
    fn: Score | Detector
    options: dict[str, Any] = field(default_factory=dict)

    @property
    def detector(self) -> bool:
        return isinstance(self.fn, Detector)

    @property
    def from_logits(self) -> Callable | None:
        """The logits-only form of the score, if it has one (then no extra forward pass)."""
        return None if self.detector else self.fn.from_logits

    @property
    def from_features(self) -> Callable | None:
        """The form that reads the batch's features and logits: ``from_features(model, features, logits,
        **options)`` of a function, ``score_features(features, logits)`` of a detector that ``uses_features``."""
        if self.detector:
            return self.fn.score_features if self.fn.uses_features else None
        return self.fn.from_features

    @property
    def from_input_grad(self) -> Callable | None:
        """The form that reads d log p~(x)/dx and the logits of the batch's one pass, if it has one."""
        return None if self.detector else getattr(self.fn, "from_input_grad", None)

    def on_batch(self, model: nn.Module, x: torch.Tensor, logits: torch.Tensor | None,
                 features: torch.Tensor | None = None, grad: torch.Tensor | None = None) -> torch.Tensor:
        if self.detector:
            if features is not None and self.from_features is not None:
                return self.fn.score_features(features, logits)
            return self.fn.score(model, x)
        if self.from_logits is not None and logits is not None:
            return self.from_logits(logits, **self.options)
        if self.from_features is not None and features is not None:
            return self.from_features(model, features, logits, **self.options)
        if self.from_input_grad is not None and grad is not None:
            return self.from_input_grad(grad, logits, **self.options)
        return self.fn(model, x, **self.options)


def option_target(fn: Score | Detector) -> tuple[Callable, int]:
    """What takes a score's options, and how many data arguments come first: a function's keywords
    after (model, x); a detector's after those of ``fit_features`` (model, features, logits, labels)
    when it ``uses_features``, else of ``fit`` (model, data)."""
    if isinstance(fn, Detector):
        return (fn.fit_features, 4) if fn.uses_features else (fn.fit, 2)
    return fn, 2


def check_score_options(fn: Score | Detector, options: dict[str, Any], name: str) -> None:
    """Every option a name the score takes, and a value within its declared range
    (:mod:`jemeval.components.options`): ``gen:gamma=-1`` is refused here, before any work."""
    target, skip = option_target(fn)
    check_options(target, options, f"score {name!r}", skip=skip)
    check_option_values(fn, options, name, defaults=option_defaults(target, skip=skip))


def resolved_options(score_fn: ScoreFn) -> dict[str, Any]:
    """Every option a score ran with: its defaults (OpenOOD's or pytorch-ood's, say) with the given
    ones over them, for the provenance (a bare ``ash`` records percentile 0.9)."""
    target, skip = option_target(score_fn.fn)
    return {**option_defaults(target, skip=skip), **score_fn.options}


def resolve_score(text: str) -> ScoreFn:
    """One score spec (``logpx``, ``energy:T=2``, ``odin:T=1000,eps=0.0014``) -> :class:`ScoreFn`: the one
    parser of score specs (the command line, ``evaluate_ood`` and :mod:`jemeval.testing` all use it).
    Unknown names fail with a suggestion; options are checked by name and range."""
    spec = parse_spec(text)
    if spec.variant is not None or spec.classes is not None:
        raise UsageError(f"score {text!r}: scores take only key=value options, e.g. 'energy:T=2'")
    registered = get_registry().get("score", spec.name)
    fn = new_detector(registered) if is_detector(registered) else as_score(registered)
    check_score_options(fn, spec.options, spec.name)
    return ScoreFn(str(spec), spec.name, fn, dict(spec.options))


def resolve_scores(specs: Sequence[str]) -> list[ScoreFn]:
    """Score specs -> :class:`ScoreFn` (:func:`resolve_score` each); a label given twice is refused."""
    resolved, seen = [], set()
    for text in specs:
        score = resolve_score(text)
        if score.label in seen:
            raise UsageError(f"score {score.label!r} is given twice")
        seen.add(score.label)
        resolved.append(score)
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


@takes_context(batch_size=DEFAULT_BATCH_SIZE)
def run_batches(
    model: nn.Module,
    dataset: Dataset,
    *,
    scores: Sequence[ScoreFn] = (),
    keep_logits: bool = True,
    keep_features: bool = False,
    sigma: float = 0.0,
    desc: str | None = None,
    before_batch: Callable[[int], Any] | None = None,
    check_finite: bool = True,
    context: RunContext,
) -> BatchOutputs:
    """One pass over ``dataset``: logits (and features) once per batch, every score from that batch.

    ``sigma`` > 0 adds N(0, sigma^2) noise to every input (the evaluation input noise; the JEM
    release used 0.03) from a generator seeded with the context's ``seed`` on the model's device
    (the context's ``device``, else the model's), in dataset order, before the logits and all scores
    are computed. Under torchrun the batches are shared out over the processes and gathered
    (:func:`jemeval.runtime.shards.map_items`): the outputs of one process, noise included. When a
    score reads features (a fitted detector's ``score_features``) or ``keep_features`` is set, the
    forward pass gives the penultimate features too
    (:meth:`jemeval.energy.model.EnergyModel.features_and_logits`): still one pass per batch.
    The network runs in eval mode with frozen parameters; gradient scores still get input gradients
    (they enable grad themselves). ``progress``: see :mod:`jemeval.progress` (one unit per image).
    ``before_batch(b)`` runs before batch b is computed, e.g. to seed a stochastic model's stream
    for that batch (:func:`jemeval.runtime.shards.batch_seed`).
    Non-finite logits, features or scores stop the pass with one line naming the model and the first
    bad batch (:func:`check_finite_outputs`): finite weights can still overflow, and a metric of NaN
    reads as a number. ``check_finite=False`` leaves that to the caller (the trainer's validation,
    whose divergence checks own it).
    """
    inputs.check_input_sigma(sigma, "sigma")
    batch_size = context.batch(DEFAULT_BATCH_SIZE)
    device = _model_device(model) if context.device is None else resolve_device(context.device)
    # a forward pass only when something reads its outputs; with grad when a score reads d log p~/dx
    need = _Needs.of(scores, keep_logits=keep_logits, keep_features=keep_features)

    def one(b: int, batch: tuple[torch.Tensor, torch.Tensor]) -> dict[str, torch.Tensor]:
        x, y = batch
        if before_batch is not None:
            before_batch(b)
        features, logits, grad = _forward(model, x, need)
        out = {s.label: _check_score(s.label, s.on_batch(model, x, logits, features, grad), x.shape[0])
               for s in scores}
        out.update({"logits": logits if keep_logits else None, "features": features if keep_features else None,
                    "labels": y.long()}, **_batch_summaries(logits, features))
        bar.update(x.shape[0])
        if need.grad and b % TRIM_EVERY == TRIM_EVERY - 1:
            keep_memory_flat()  # the gradient pass's freed buffers, else peak memory grows with N
        return {k: v.detach().cpu() for k, v in out.items() if v is not None}

    total = my_share(len(dataset), batch_size)  # this process's images (all of them in one process)
    with progress_bar(context.progress, total, desc or "", unit="img") as bar, frozen(model, train=False):
        done = map_items(one, noisy_batches(dataset, batch_size, device, sigma, context.seed, context.workers))
    keep_memory_flat()  # the pass's buffers, before the next pass (another set, another shape) fragments them
    settings = {"sigma": float(sigma), "noise_seed": int(context.seed) if sigma > 0 else None,
                "batch_size": int(batch_size), "workers": loader_workers(dataset, context.workers)}
    return _gather(done, model, dataset, scores, check_finite=check_finite, keep_logits=keep_logits,
                   keep_features=keep_features, settings=settings)


def noisy_batches(dataset: Dataset, batch_size: int, device: torch.device, sigma: float,
                  seed: int, workers: int | None = None) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
    """The batches of ``dataset`` on ``device`` with their input noise, drawn from one generator seeded
    with ``seed`` for every batch in order on every rank (the draws of the batches another rank runs
    are cheap, and keep one process's noise exactly). ``workers``: DataLoader processes decoding a
    dataset read image by image (:func:`jemeval.data.iterate_batches`; None: the machine's default)."""
    generator = torch.Generator(device=device).manual_seed(int(seed)) if sigma > 0 else None
    for x, y in iterate_batches(dataset, batch_size, device, num_workers=workers):
        x = x.float()
        if generator is not None:
            x = x + float(sigma) * torch.randn(x.shape, generator=generator, device=device, dtype=x.dtype)
        yield x, y


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


@dataclass(frozen=True)
class _Needs:
    """What the batch's one forward pass must give: logits, features, d log p~(x)/dx."""

    logits: bool
    features: bool
    grad: bool

    @classmethod
    def of(cls, scores: Sequence[ScoreFn], *, keep_logits: bool, keep_features: bool) -> _Needs:
        features = keep_features or any(s.from_features is not None for s in scores)
        grad = any(s.from_input_grad is not None for s in scores)
        logits = keep_logits or features or grad or any(s.from_logits is not None for s in scores)
        return cls(logits, features, grad)


def _forward(model: nn.Module, x: torch.Tensor,
             need: _Needs) -> tuple[torch.Tensor | None, torch.Tensor | None, torch.Tensor | None]:
    """(features, logits, d log p~(x)/dx) of one batch from one forward pass, float32, detached;
    None for what nobody reads. Without a gradient to give, the pass builds no graph; with one,
    the parameters are frozen (:func:`run_batches` runs under ``frozen``), so autograd records the
    input's branch only and the backward stops at x."""
    if not need.logits:
        return None, None, None
    if need.features and not callable(getattr(model, "features_and_logits", None)):
        raise UsageError(f"features-based scores need an EnergyModel (features_and_logits), got a "
                         f"{type(model).__name__}; load the model with jemeval.load_model")
    source = x.detach().requires_grad_(True) if need.grad else x
    with torch.set_grad_enabled(need.grad):
        features, logits = model.features_and_logits(source) if need.features else (None, logits_of(model, source))
        grad = torch.autograd.grad(log_p(logits).sum(), source)[0] if need.grad else None
    return (None if features is None else features.detach().float()), logits.detach().float(), grad


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


#: 0.2's names of this module that moved to :mod:`jemeval.evaluation.inputs` (reading one warns)
__getattr__ = moved_names(__name__, {name: "jemeval.evaluation.inputs" for name in (
    "prepare_model", "check_min", "check_input_sigma", "check_refine_steps", "check_input_shape", "training_dataset",
    "recorded_dataset")})
