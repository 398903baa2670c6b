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
  object holds after the fit, encoded as tensors and plain values (:func:`encode`), so jemeval's
  on-disk detector cache stores it; loading rebuilds the object and sets those attributes back.
* A class that does not fit (GEN, LTS, SCALE, WeightedEBO) becomes a :class:`jemeval.Score` with a
  ``from_logits`` or ``from_features`` form: as a detector it would cost a pass over the training
  images for nothing.

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

from jemeval.builtins.detectors import RELU_HELP, FittedDetector, linear_head
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
    nullable: tuple[str, ...] = ()
    #: score one example at a time: pytorch-ood's batch result depends on the batch (OpenMax)
    per_example: bool = False

    @property
    def impl(self) -> type:
        """The pytorch-ood class (imported at first use: registering the names stays cheap)."""
        return getattr(importlib.import_module("pytorch_ood.detector"), self.cls)


SPECS: tuple[Spec, ...] = (
    Spec("gen", "GEN", "logits", "GEN (Liu et al. 2023): generalized entropy of the top-M softmax probabilities; "
         "options gamma, M", fits=False, defaults={"gamma": 0.1, "M": 100}, source=OPENOOD.format("gen"),
         grid={"gamma": [0.01, 0.1, 0.5, 1, 2, 5, 10], "M": [10, 50, 100, 200, 500, 1000]}, nullable=("M",)),
    Spec("weighted-ebo", "WeightedEBO", "logits", "Weighted energy (VOS, Du et al. 2022): log sum_k relu(w_k) "
         "exp f_k; option weights (K numbers, 'a;b;...'; default 1 each, which is energy)", fits=False,
         defaults={"weights": None}, source="VOS learns the weights in training; without them 1 each",
         nullable=("weights",)),
    Spec("lts", "LTS", "features", "LTS (Djurisic et al. 2024): energy of logits scaled by the features' top-p "
         "mass ratio; option p", fits=False, head=True, defaults={"p": 0.05}),
    Spec("scale", "SCALE", "maps", f"SCALE (Xu et al. 2024): energy of features rescaled by their top mass; option "
         f"percentile; {RELU_HELP}", fits=False, head=True, defaults={"percentile": 0.85},
         grid={"percentile": [0.65, 0.70, 0.75, 0.80, 0.85, 0.90, 0.95]}, source=OPENOOD.format("scale"), relu=True),
    Spec("klmatching", "KLMatching", "logits", "KL matching (Hendrycks et al. 2022): minus the smallest KL "
         "divergence to a predicted class's mean softmax"),
    Spec("tscaling", "TemperatureScaling", "logits", "Max softmax after temperature scaling fitted by NLL on the "
         "labelled fit data (Guo et al. 2017); needs labels", labels=True),
    Spec("openmax", "OpenMax", "logits", "OpenMax (Bendale & Boult 2016): minus the Weibull-recalibrated "
         "unknown-class probability; needs labels; options tailsize, alpha, euclid_weight", labels=True,
         defaults={"tailsize": 25, "alpha": 10, "euclid_weight": 1.0},
         grid={"tailsize": [10, 20, 30, 40, 50], "alpha": [1, 3, 5, 10, 15, 20],
               "euclid_weight": [0.0, 0.25, 0.5, 0.75, 1.0]}, per_example=True),
    Spec("rmd", "RMD", "features", "Relative Mahalanobis distance (Ren et al. 2021): class minus background "
         "Gaussian distance; needs labels", labels=True),
    Spec("gmm", "GMM", "features", "Log-likelihood of a Gaussian per class (full covariance) on the features; "
         "needs labels; option reg", labels=True, defaults={"reg": 1e-6}),
    Spec("she", "SHE", "features", "SHE (Zhang et al. 2023): inner product with the predicted class's mean "
         "correctly-classified feature; needs labels", head=True, labels=True, source=OPENOOD.format("she")),
    Spec("nnguide", "NNGuide", "features", "NNGuide (Park et al. 2023): energy times the mean similarity to the k "
         "nearest energy-scaled fit features; option k", head=True, defaults={"k": 100},
         source=OPENOOD.format("nnguide") + " (K)"),
    Spec("fdbd", "fDBD", "features", "fDBD (Liu & Qin 2024): mean distance to the decision boundaries over the "
         "distance to the mean fit feature", head=True, source=OPENOOD.format("fdbd")),
    Spec("nci", "NCI", "features", "NCI (Liu & Qin 2025): cosine of the centred feature with its class's weight, "
         "plus alpha times its L1 norm; option alpha", head=True, defaults={"alpha": 0.0001},
         grid={"alpha": [0.0, 0.001, 0.01, 0.05, 0.1, 0.25, 0.5, 1.0]}, source=OPENOOD.format("nci")),
    Spec("pnml", "PNML", "features", "pNML (Bibas et al. 2021): minus the normalized regret of the last layer on "
         "the normalised features; option eps", head=True, defaults={"eps": 1e-12}),
    Spec("vra", "VRA", "maps", "VRA (Xu et al. 2023): energy after clipping the features to fit percentiles; "
         "options lower_percentile, upper_percentile", head=True,
         defaults={"lower_percentile": 0.10, "upper_percentile": 0.90}, source=OPENOOD.format("vra"),
         grid={"upper_percentile": [0.85, 0.90, 0.95, 0.99], "lower_percentile": [0.01, 0.05, 0.10, 0.15]}),
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


def check_options(spec: Spec, options: dict[str, Any]) -> dict[str, Any]:
    """The options with the defaults filled in; a whole number where the default is one, a number where it is a
    float (one line naming the option otherwise; pytorch-ood's own checks, e.g. fractions, come at construction)."""
    merged = {**spec.defaults, **options}
    for key, value in merged.items():
        default = spec.defaults.get(key)
        if (value is None and key in spec.nullable) or default is None:
            continue
        number = isinstance(value, (int, float)) and not isinstance(value, bool) and np.isfinite(value)
        if isinstance(default, int) and not (number and float(value).is_integer()):
            raise UsageError(f"score {spec.name!r}: {key} must be a whole number (e.g. {spec.name}:{key}={default}), "
                             f"got {value!r}")
        if isinstance(default, float) and not number:
            raise UsageError(f"score {spec.name!r}: {key} must be a number (e.g. {spec.name}:{key}={default}), "
                             f"got {value!r}")
        merged[key] = int(value) if isinstance(default, int) else value
    return merged


def construct(spec: Spec, head: Any, options: dict[str, Any]):
    """pytorch-ood's object with no model (jemeval passes it the outputs) and ``head`` where it takes one."""
    args = (None, head) if spec.head else (None,)
    try:
        return spec.impl(*args, **options)
    except (ValueError, TypeError, AssertionError) as exc:
        raise UsageError(f"score {spec.name!r}: {exc}") from None


def _inputs(spec: Spec, features: torch.Tensor, logits: torch.Tensor) -> torch.Tensor:
    x = logits if spec.reads == "logits" else features
    x = x.detach().float()
    return x[:, :, None, None] if spec.reads == "maps" else x


# -- fitted state as tensors and plain values ------------------------------------------------------
def _objects() -> dict[str, type]:
    """The only classes a state may rebuild (OpenMax's numpy model and its Weibull fits): never a name from a file."""
    from pytorch_ood.detector.openmax.libnotmr import LibNotMR
    from pytorch_ood.detector.openmax.numpy import OpenMax

    return {"OpenMax": OpenMax, "LibNotMR": LibNotMR}


def encode(value: Any) -> Any:
    """A fitted attribute as tensors and plain values that ``torch.load(weights_only=True)`` reads back."""
    if isinstance(value, nn.ParameterDict):
        return {"kind": "parameterdict", "keys": list(value.keys()), "values": [encode(v) for v in value.values()]}
    if isinstance(value, nn.Parameter):
        return {"kind": "parameter", "value": value.detach().cpu().clone(), "grad": value.requires_grad}
    if torch.is_tensor(value):
        return value.detach().cpu().clone()
    if isinstance(value, np.ndarray):
        return {"kind": "ndarray", "value": torch.from_numpy(value.copy())}
    if isinstance(value, np.generic):
        return {"kind": "npscalar", "value": torch.from_numpy(np.asarray(value).reshape(1))}
    if isinstance(value, dict):
        keys = [int(k) if isinstance(k, np.integer) else k for k in value]
        return {"kind": "dict", "keys": keys, "values": [encode(v) for v in value.values()]}
    if isinstance(value, (list, tuple)):
        return {"kind": type(value).__name__, "values": [encode(v) for v in value]}
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    if type(value).__name__ in _objects() and type(value) is _objects()[type(value).__name__]:
        return {"kind": "object", "class": type(value).__name__, "attrs": encode(vars(value))}
    raise TypeError(f"cannot store a fitted {type(value).__name__} as tensors and plain values")


def decode(value: Any) -> Any:
    """The inverse of :func:`encode`."""
    if not isinstance(value, dict):
        return value
    kind = value.get("kind")
    if kind == "parameterdict":
        return nn.ParameterDict({k: decode(v) for k, v in zip(value["keys"], value["values"])})
    if kind == "parameter":
        return nn.Parameter(value["value"].clone(), requires_grad=bool(value["grad"]))
    if kind == "ndarray":
        return value["value"].numpy().copy()
    if kind == "npscalar":
        return value["value"].numpy()[0]
    if kind == "dict":
        return {k: decode(v) for k, v in zip(value["keys"], value["values"])}
    if kind in ("list", "tuple"):
        items = [decode(v) for v in value["values"]]
        return items if kind == "list" else tuple(items)
    if kind == "object":
        cls = _objects()[value["class"]]
        obj = cls.__new__(cls)
        obj.__dict__.update(decode(value["attrs"]))
        return obj
    raise ValueError(f"not a stored detector value: {sorted(value)}")


def fitted_attributes(impl) -> dict[str, Any]:
    """What a pytorch-ood object holds after its fit, encoded; its head and callables are rebuilt instead."""
    out = {}
    for key, value in vars(impl).items():
        kept = torch.is_tensor(value) or isinstance(value, nn.ParameterDict)
        if key == "_device" or (callable(value) and not kept):  # the head, the energy function: rebuilt
            continue
        out[key] = encode(value)
    return out


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
        options = check_options(spec, options)
        w, b = linear_head(model) if spec.head else (None, None)
        impl = construct(spec, flat_linear(w, b) if spec.head else None, options)
        known, y = _fit_labels(spec, labels)
        x = _inputs(spec, features, logits)
        try:
            with torch.enable_grad():  # temperature scaling fits T with LBFGS
                getattr(impl, f"fit_{METHOD[spec.reads]}")(x if known is None else x[known], y)
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

    fit_features.__signature__ = _signature(("self", "model", "features", "logits", "labels"), spec.defaults)
    fit_features.__doc__ = f"Fit pytorch-ood's {spec.cls} on the fit data's {spec.reads} (options: defaults)."
    name = f"{spec.cls}Detector"
    return type(name, (PytorchOODDetector,), {
        "spec": spec, "name": spec.name, "help": spec.doc, "fit_features": fit_features, "__doc__": spec.doc,
        "needs_labels": spec.labels, "grid": {k: list(v) for k, v in spec.grid.items()},
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
        options = check_options(spec, options)
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
    return ScoreFunction(fn, grid=spec.grid, assumes_nonnegative_features=spec.relu, **forms)


#: name -> what is registered: a detector class (fitted) or a score (no fit)
ADAPTERS: dict[str, Any] = {s.name: detector_class(s) if s.fits else score_function(s) for s in SPECS}


@hookimpl
def register_scores(register):
    for spec in SPECS:
        register(spec.name, ADAPTERS[spec.name], help=spec.doc)
