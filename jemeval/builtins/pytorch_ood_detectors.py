"""Every pytorch-ood 0.4.0 detector that applies to a trained classifier, through one adapter.

Each entry of :data:`SPECS` names a pytorch-ood class and what it reads of the evaluation's one
forward pass: the ``logits``, the penultimate ``features`` (N x D), or the features as ``maps``
(N x D x 1 x 1, for pytorch-ood's feature-map detectors), with the classifier's last linear layer
(``head``: W, b) and labelled fit data (``labels``) where the method needs them. Its options are the
class's constructor keywords, defaulting to OpenOOD v1.5's postprocessor configs where OpenOOD has
the method (``source`` says which); its ``grid`` is pytorch-ood's ``hyperparameter_space``.

* A class that fits (pytorch-ood's ``requires_fit``) becomes a :class:`PytorchOODDetector`: its
  fit calls pytorch-ood's ``fit_logits`` / ``fit_features`` / ``fit_feature_maps`` on the fit data's
  outputs, then scores with the matching ``predict_*``. The fitted state is whatever the pytorch-ood
  object holds after the fit, encoded as tensors and plain values
  (:func:`jemeval.builtins.pytorch_ood_state.encode`), so jemeval's
  on-disk detector cache stores it; loading rebuilds the object and sets those attributes back.
* A class that does not fit (GEN, LTS, SCALE, WeightedEBO) becomes a :class:`jemeval.Score` with a
  ``from_logits`` or ``from_features`` form: as a detector it would cost a pass over the training
  images for nothing.

Each spec also declares the values every option takes (``ranges``, checked when the score is parsed:
``gen:gamma=-1`` or ``openmax:tailsize=0`` ran before with default-like numbers) and, for fitted ones, the
fewest fit images (``min_fit``: ``gmm`` needs D + 1 images of each class, ``openmax`` ``tailsize`` of each).
VRA's default is OpenOOD's form (one pair of clipping thresholds over all fit activations), pytorch-ood's
per-feature thresholds its option ``per_feature=True``.

Both flip pytorch-ood's sign (it returns outlier scores): higher = more in-distribution. The
detectors pytorch-ood has that are left out (they need training-time heads or text embeddings,
hooks on inner layers, input gradients, or are jemeval scores already) are listed, with the reason,
in docs/evaluation.md ("Detectors from pytorch-ood").
"""
from __future__ import annotations

import importlib
import inspect
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch
from torch import nn

from jemeval.builtins.detectors import RELU_HELP, FittedDetector, linear_head, shared_covariance_minimum
from jemeval.builtins.pytorch_ood_state import decode, encode, fitted_attributes  # noqa: F401 (encode: its old home)
from jemeval.components.detector import FitMinimum
from jemeval.components.options import Below, Range, custom, flag, fraction, number, whole
from jemeval.components.score import ScoreFunction
from jemeval.errors import UsageError
from jemeval.hookspecs import hookimpl

#: where each method's default options come from
OPENOOD = "OpenOOD v1.5 configs/postprocessors/{}.yml"
PYTORCH_OOD = "pytorch-ood 0.4.0's defaults"
#: pytorch-ood's method suffix for each thing a detector reads
METHOD = {"logits": "logits", "features": "features", "maps": "feature_maps"}


@dataclass(frozen=True)
class Spec:
    """One pytorch-ood class as jemeval uses it (see the module docstring)."""

    name: str
    cls: str
    reads: str
    doc: str
    fits: bool = True
    head: bool = False
    labels: bool = False
    defaults: dict[str, Any] = field(default_factory=dict)
    grid: dict[str, list] = field(default_factory=dict)
    source: str = PYTORCH_OOD
    relu: bool = False
    #: option -> the values it takes (:mod:`jemeval.components.options`), one for every option in ``defaults``
    ranges: dict[str, Range] = field(default_factory=dict)
    #: relations between two options (:class:`jemeval.components.options.Below`)
    relations: tuple[Below, ...] = ()
    #: (dim, classes, options) -> the fewest fit images (:class:`jemeval.components.detector.FitMinimum`)
    min_fit: Callable[[int, int, dict[str, Any]], FitMinimum] | None = None
    #: options jemeval handles itself (not pytorch-ood's constructor keywords)
    own: tuple[str, ...] = ()
    #: fit(impl, inputs, labels, options) instead of pytorch-ood's fit_* (a form pytorch-ood does not have)
    fit_with: Callable[[Any, torch.Tensor, torch.Tensor, dict[str, Any]], None] | None = None
    #: score one example at a time: pytorch-ood's batch result depends on the batch (OpenMax)
    per_example: bool = False

    @property
    def impl(self) -> type:
        """The pytorch-ood class (imported at first use: registering the names stays cheap)."""
        return getattr(importlib.import_module("pytorch_ood.detector"), self.cls)


def _weights_valid(value: Any) -> bool:
    """WeightedEBO's weights: numbers >= 0 ('a;b;...' on the command line), not all 0 (relu of the weights
    multiplies exp f_k: all 0 gives log 0). Their count, one per class, is checked against the model."""
    parts = value.split(";") if isinstance(value, str) else value
    try:
        weights = np.asarray([float(v) for v in parts], dtype=np.float64)
    except (TypeError, ValueError):
        return False
    return weights.size > 0 and bool(np.isfinite(weights).all() and (weights >= 0).all() and weights.sum() > 0)


def _vra_fit(impl, maps: torch.Tensor, labels: torch.Tensor, options: dict[str, Any]) -> None:
    """VRA's clipping thresholds. Default (OpenOOD v1.5's VRAPostprocessor): one pair, the lower and upper
    percentile of *all* activations of the fit images together; ``per_feature=True``: each feature's own
    percentiles over the fit images (pytorch-ood's VRA). Both with numpy's linear interpolation."""
    if options["per_feature"]:
        impl.fit_feature_maps(maps, labels)
        return
    values = maps[labels >= 0].detach().cpu().numpy()
    if not values.size:
        raise ValueError("No ID data")
    low, high = np.quantile(values.reshape(-1), [options["lower_percentile"], options["upper_percentile"]])
    impl._lower_threshold = torch.full(values.shape[1:], float(low), dtype=torch.float32)
    impl._upper_threshold = torch.full(values.shape[1:], float(high), dtype=torch.float32)


def _openmax_minimum(dim: int, classes: int, options: dict[str, Any]) -> FitMinimum:
    tail = int(options["tailsize"])
    return FitMinimum(per_class=tail, why=f"a Weibull fit on each class's {tail} largest distances to its centre")


SPECS: tuple[Spec, ...] = (
    Spec("gen", "GEN", "logits", "GEN (Liu et al. 2023): generalized entropy of the top-M softmax probabilities; "
         "options gamma, M", fits=False, defaults={"gamma": 0.1, "M": 100}, source=OPENOOD.format("gen"),
         grid={"gamma": [0.01, 0.1, 0.5, 1, 2, 5, 10], "M": [10, 50, 100, 200, 500, 1000]},
         # gamma 0 makes every term 1 (one score for every input); M 0 averages nothing (NaN)
         ranges={"gamma": number(gt=0.0), "M": whole(none=True)}),
    Spec("weighted-ebo", "WeightedEBO", "logits", "Weighted energy (VOS, Du et al. 2022): log sum_k relu(w_k) "
         "exp f_k; option weights (K numbers, 'a;b;...'; default 1 each, which is energy)", fits=False,
         defaults={"weights": None}, source="VOS learns the weights in training; without them 1 each",
         ranges={"weights": custom(_weights_valid, "numbers >= 0, not all 0, one per class ('a;b;...')",
                                   none=True)}),
    Spec("lts", "LTS", "features", "LTS (Djurisic et al. 2024): energy of logits scaled by the features' top-p "
         "mass ratio; option p", fits=False, head=True, defaults={"p": 0.05}, ranges={"p": fraction()}),
    Spec("scale", "SCALE", "maps", f"SCALE (Xu et al. 2024): energy of features rescaled by their top mass; option "
         f"percentile; {RELU_HELP}", fits=False, head=True, defaults={"percentile": 0.85},
         grid={"percentile": [0.65, 0.70, 0.75, 0.80, 0.85, 0.90, 0.95]}, source=OPENOOD.format("scale"), relu=True,
         ranges={"percentile": fraction(lt=1.0)}),  # at 1 nothing survives: the rescaling divides by 0
    Spec("klmatching", "KLMatching", "logits", "KL matching (Hendrycks et al. 2022): minus the smallest KL "
         "divergence to a predicted class's mean softmax"),
    Spec("tscaling", "TemperatureScaling", "logits", "Max softmax after temperature scaling fitted by NLL on the "
         "labelled fit data (Guo et al. 2017); needs labels", labels=True),
    Spec("openmax", "OpenMax", "logits", "OpenMax (Bendale & Boult 2016): minus the Weibull-recalibrated "
         "unknown-class probability; needs labels; options tailsize, alpha, euclid_weight", labels=True,
         defaults={"tailsize": 25, "alpha": 10, "euclid_weight": 1.0},
         grid={"tailsize": [10, 20, 30, 40, 50], "alpha": [1, 3, 5, 10, 15, 20],
               "euclid_weight": [0.0, 0.25, 0.5, 0.75, 1.0]}, per_example=True,
         # tailsize <= 0 slices the sorted distances from the start ([-0:] is all of them); alpha 0 revises nothing
         ranges={"tailsize": whole(), "alpha": whole(), "euclid_weight": fraction()}, min_fit=_openmax_minimum),
    Spec("rmd", "RMD", "features", "Relative Mahalanobis distance (Ren et al. 2021): class minus background "
         "Gaussian distance; needs labels", labels=True,
         min_fit=lambda dim, classes, options: shared_covariance_minimum(dim, classes)),
    Spec("gmm", "GMM", "features", "Log-likelihood of a Gaussian per class (full covariance) on the features; "
         "needs labels; option reg", labels=True, defaults={"reg": 1e-6}, ranges={"reg": number(ge=0.0)},
         min_fit=lambda dim, classes, options: FitMinimum(
             per_class=dim + 1, why=f"a full covariance of {dim} features per class has full rank only with "
                                    f"{dim} + 1 images of the class")),
    Spec("she", "SHE", "features", "SHE (Zhang et al. 2023): inner product with the predicted class's mean "
         "correctly-classified feature; needs labels", head=True, labels=True, source=OPENOOD.format("she"),
         min_fit=lambda dim, classes, options: FitMinimum(
             per_class=1, every_class=True, why="each class's pattern is the mean of its correctly classified "
                                                "fit features")),
    Spec("nnguide", "NNGuide", "features", "NNGuide (Park et al. 2023): energy times the mean similarity to the k "
         "nearest energy-scaled fit features; option k", head=True, defaults={"k": 100},
         source=OPENOOD.format("nnguide") + " (K)", ranges={"k": whole()},
         min_fit=lambda dim, classes, options: FitMinimum(
             images=int(options["k"]), why="the mean similarity to the k nearest fit features")),
    Spec("fdbd", "fDBD", "features", "fDBD (Liu & Qin 2024): mean distance to the decision boundaries over the "
         "distance to the mean fit feature", head=True, source=OPENOOD.format("fdbd")),
    Spec("nci", "NCI", "features", "NCI (Liu & Qin 2025): cosine of the centred feature with its class's weight, "
         "plus alpha times its L1 norm; option alpha", head=True, defaults={"alpha": 0.0001},
         grid={"alpha": [0.0, 0.001, 0.01, 0.05, 0.1, 0.25, 0.5, 1.0]}, source=OPENOOD.format("nci"),
         ranges={"alpha": number(ge=0.0)}),
    Spec("pnml", "PNML", "features", "pNML (Bibas et al. 2021): minus the normalized regret of the last layer on "
         "the normalised features; option eps", head=True, defaults={"eps": 1e-12},
         # eps clamps the probabilities to [eps, 1 - eps]: 0 gives 0/0, 0.5 or more an empty interval
         ranges={"eps": number(gt=0.0, lt=0.5)},
         min_fit=lambda dim, classes, options: FitMinimum(
             images=dim, why=f"the inverse of X^T X for {dim} normalised features needs {dim} images; with fewer, its "
                             "pseudo-inverse counts the directions no fit image spans as fully supported")),
    Spec("vra", "VRA", "maps", "VRA (Xu et al. 2023): energy after clipping the features to the lower and upper "
         "percentile of all fit activations (OpenOOD's form; per_feature=True: each feature's own, pytorch-ood's); "
         "options lower_percentile, upper_percentile, per_feature", head=True,
         defaults={"lower_percentile": 0.10, "upper_percentile": 0.90, "per_feature": False},
         source=OPENOOD.format("vra") + " and its VRAPostprocessor (one global pair of thresholds)",
         grid={"upper_percentile": [0.85, 0.90, 0.95, 0.99], "lower_percentile": [0.01, 0.05, 0.10, 0.15]},
         ranges={"lower_percentile": fraction(), "upper_percentile": fraction(), "per_feature": flag()},
         relations=(Below("lower_percentile", "upper_percentile"),),
         own=("per_feature",), fit_with=_vra_fit),
)


class FlatLinear(nn.Linear):
    """The classifier's last layer rebuilt from (W, b), taking features or N x D x 1 x 1 maps."""

    def forward(self, h: torch.Tensor) -> torch.Tensor:
        return super().forward(h.flatten(1))


def flat_linear(w: torch.Tensor, b: torch.Tensor) -> FlatLinear:
    head = FlatLinear(w.shape[1], w.shape[0])
    with torch.no_grad():
        head.weight.copy_(w)
        head.bias.copy_(b)
    return head.requires_grad_(False)


def with_defaults(spec: Spec, options: dict[str, Any]) -> dict[str, Any]:
    """The options with the defaults filled in, whole numbers as ints. Their values were checked against
    ``spec.ranges`` when the score was parsed (:func:`jemeval.components.options.check_option_values`);
    relations between options (VRA's lower percentile not above its upper) are pytorch-ood's to check."""
    merged = {**spec.defaults, **options}
    return {k: int(v) if spec.ranges.get(k) is not None and spec.ranges[k].kind == "whole" and v is not None else v
            for k, v in merged.items()}


def construct(spec: Spec, head: Any, options: dict[str, Any]):
    """pytorch-ood's object with no model (jemeval passes it the outputs) and ``head`` where it takes one."""
    args = (None, head) if spec.head else (None,)
    try:
        return spec.impl(*args, **{k: v for k, v in options.items() if k not in spec.own})
    except (ValueError, TypeError, AssertionError) as exc:
        raise UsageError(f"score {spec.name!r}: {exc}") from None


def _inputs(spec: Spec, features: torch.Tensor, logits: torch.Tensor) -> torch.Tensor:
    x = logits if spec.reads == "logits" else features
    x = x.detach().float()
    return x[:, :, None, None] if spec.reads == "maps" else x


# -- the adapters ----------------------------------------------------------------------------------
def _fit_labels(spec: Spec, labels: torch.Tensor) -> tuple[torch.Tensor | None, torch.Tensor]:
    """(mask of the examples to fit on or None for all, the labels pytorch-ood gets). Without ``labels`` the
    method ignores them: all 0 (jemeval's -1 would read as 'unknown' and pytorch-ood would drop them)."""
    if not spec.labels:
        return None, torch.zeros(len(labels), dtype=torch.long)
    known = labels >= 0
    if not bool(known.any()):
        raise UsageError(f"score {spec.name!r} needs labelled fit data; the fit dataset has none")
    y = labels[known].long()
    if spec.cls == "RMD":  # pytorch-ood's Mahalanobis asks for classes 0..C-1
        y = torch.unique(y, return_inverse=True)[1]
    return known, y


class PytorchOODDetector(FittedDetector):
    """A fitted pytorch-ood detector (its :class:`Spec` in ``spec``), scored from the shared forward pass;
    building per device, the state and the sign are :class:`~jemeval.builtins.detectors.FittedDetector`'s."""

    spec: Spec

    def fit_features(self, model, features, logits, labels, **options):
        spec = self.spec
        options = with_defaults(spec, options)
        w, b = linear_head(model) if spec.head else (None, None)
        impl = construct(spec, flat_linear(w, b) if spec.head else None, options)
        known, y = _fit_labels(spec, labels)
        x = _inputs(spec, features, logits)
        x = x if known is None else x[known]
        try:
            with torch.enable_grad():  # temperature scaling fits T with LBFGS
                if spec.fit_with is not None:
                    spec.fit_with(impl, x, y, options)
                else:
                    getattr(impl, f"fit_{METHOD[spec.reads]}")(x, y)
        except (ValueError, AssertionError, RuntimeError) as exc:
            raise UsageError(f"score {spec.name!r}: pytorch-ood's {spec.cls} could not fit on the fit data "
                             f"({type(exc).__name__}: {exc})") from None
        return self._fitted({"options": options, "w": w, "b": b, "fitted": fitted_attributes(impl)})

    def _outlier(self, impl, features: torch.Tensor, logits: torch.Tensor) -> torch.Tensor:
        predict = getattr(impl, f"predict_{METHOD[self.spec.reads]}")
        x = _inputs(self.spec, features, logits)
        if self.spec.per_example and len(x) > 1:  # pytorch-ood's result would depend on the rest of the batch
            return torch.cat([predict(x[i:i + 1]).reshape(1) for i in range(len(x))])
        return predict(x)

    def _build(self):
        state, spec = self.state, self.spec
        impl = construct(spec, flat_linear(state["w"], state["b"]) if spec.head else None, dict(state["options"]))
        for key, value in state["fitted"].items():
            setattr(impl, key, decode(value))
        return impl


def _signature(lead: tuple[str, ...], defaults: dict[str, Any]) -> inspect.Signature:
    """``lead`` positional parameters, then the options as keywords: what jemeval checks ``--score NAME:opt=`` by."""
    p = inspect.Parameter
    return inspect.Signature([p(n, p.POSITIONAL_OR_KEYWORD) for n in lead]
                             + [p(k, p.KEYWORD_ONLY, default=v) for k, v in defaults.items()])


def detector_class(spec: Spec) -> type[PytorchOODDetector]:
    """A :class:`PytorchOODDetector` subclass for ``spec`` whose ``fit_features`` names the options."""
    def fit_features(self, model, features, logits, labels, **options):
        return PytorchOODDetector.fit_features(self, model, features, logits, labels, **options)

    def fit_minimum(self, *, dim, classes, **options):
        return FitMinimum() if spec.min_fit is None else spec.min_fit(dim, classes, options)

    fit_features.__signature__ = _signature(("self", "model", "features", "logits", "labels"), spec.defaults)
    fit_features.__doc__ = f"Fit pytorch-ood's {spec.cls} on the fit data's {spec.reads} (options: defaults)."
    name = f"{spec.cls}Detector"
    return type(name, (PytorchOODDetector,), {
        "spec": spec, "name": spec.name, "help": spec.doc, "fit_features": fit_features, "__doc__": spec.doc,
        "needs_labels": spec.labels, "grid": {k: list(v) for k, v in spec.grid.items()}, "ranges": dict(spec.ranges),
        "relations": spec.relations, "fit_minimum": fit_minimum,
        "assumes_nonnegative_features": spec.relu, "__module__": __name__, "__qualname__": name})


def _weights(value: Any, k: int) -> torch.Tensor:
    """WeightedEBO's weights: K numbers (a sequence, or 'a;b;...' on the command line); None -> 1 each."""
    if value is None:
        return torch.ones(k)
    parts = value.split(";") if isinstance(value, str) else value
    try:
        weights = torch.tensor([float(v) for v in parts], dtype=torch.float32)
    except (TypeError, ValueError):
        weights = None
    if weights is None or weights.shape != (k,) or not bool(torch.isfinite(weights).all()):
        raise UsageError(f"score 'weighted-ebo': weights must be {k} finite numbers (one per class, e.g. "
                         f"weighted-ebo:weights={';'.join(['1'] * min(k, 3))}...), got {value!r}")
    return weights


def score_function(spec: Spec) -> ScoreFunction:
    """A pytorch-ood class that needs no fit as a :class:`jemeval.Score` with its logits/features form."""
    def outlier(model, features, logits, options: dict[str, Any]) -> torch.Tensor:
        options = with_defaults(spec, options)
        if spec.cls == "WeightedEBO":
            options["weights"] = _weights(options["weights"], logits.shape[1]).to(logits.device)
        head = model.classifier() if spec.head else None
        impl = construct(spec, (lambda h: head(h.flatten(1))) if spec.head else None, options)
        return getattr(impl, f"predict_{METHOD[spec.reads]}")(_inputs(spec, features, logits))

    def from_logits(logits, **options):
        return -outlier(None, None, logits, options).detach()

    def from_features(model, features, logits, **options):
        return -outlier(model, features, logits, options).detach()

    def fn(model, x, **options):
        with torch.no_grad():
            if spec.reads == "logits":
                return from_logits(model.logits(x), **options)
            features, logits = model.features_and_logits(x)
            return from_features(model, features, logits, **options)

    fn.__signature__ = _signature(("model", "x"), spec.defaults)
    fn.__name__ = fn.__qualname__ = spec.name.replace("-", "_")
    fn.__doc__ = spec.doc
    forms: dict[str, Callable] = {"from_logits": from_logits} if spec.reads == "logits" else {
        "from_features": from_features}
    out = ScoreFunction(fn, grid=spec.grid, assumes_nonnegative_features=spec.relu, ranges=spec.ranges, **forms)
    out.relations = spec.relations
    return out


#: name -> what is registered: a detector class (fitted) or a score (no fit)
ADAPTERS: dict[str, Any] = {s.name: detector_class(s) if s.fits else score_function(s) for s in SPECS}


@hookimpl
def register_scores(register):
    for spec in SPECS:
        register(spec.name, ADAPTERS[spec.name], help=spec.doc)
