"""Built-in fitted OOD detectors, from pytorch-ood; higher = more in-distribution.

Each is a :class:`jemeval.Detector`: ``fit`` on in-distribution training data once, then
``score``. The work is pytorch-ood's own (``fit_features`` / ``predict_features`` of its classes, on
the model's penultimate features, :meth:`jemeval.energy.model.EnergyModel.features_and_logits`),
with the sign flipped to jemeval's convention (pytorch-ood returns outlier scores):

* ``mahalanobis``: minus the smallest class-conditional Mahalanobis distance with a shared
  covariance (Lee et al. 2018); needs labelled fit data.
* ``knn``: minus the distance of the L2-normalised feature to its k-th nearest fitted neighbour
  (Sun et al. 2022); ``k`` (default 50).
* ``vim``: the energy of the logits minus the scaled norm of the feature's residual outside the top
  principal subspace of dimension ``d`` (Wang et al. 2022); ``d`` defaults to the paper's choice,
  1000 for D >= 1500 features, 512 for D >= 768, else D // 2.
* ``react``: the energy of the logits of features clipped at their ``percentile`` (default 0.9)
  over the fit data (Sun et al. 2021).
* ``dice``: the energy of the logits of a last layer whose ``p`` (default 0.9) least contributing
  weights are zeroed (Sun & Li 2022).

ReAct and DICE (like the ``ash`` score) assume non-negative (ReLU) penultimate features: clipping
at a high percentile or keeping the weights that contribute most means little when a quarter of
the features are negative (LeakyReLU), and DICE then scored the digits JEM at AUROC 0.05. They
declare it (``assumes_nonnegative_features``) and record the fraction of fit feature values below
0 in their state (``negative_fraction``); ``evaluate_ood`` turns a non-zero fraction into a note.

The fitted state (``state_dict()``) is tensors and plain values, which jemeval caches on disk
(:mod:`jemeval.caches.detectors`). ``grid`` is pytorch-ood's ``hyperparameter_space``.
"""
from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F

from jemeval.components.detector import Detector, FitMinimum
from jemeval.components.options import fraction, whole
from jemeval.deprecations import moved_names
from jemeval.errors import UsageError
from jemeval.hookspecs import hookimpl

#: extract_outputs is the Detector base's now (its default fit); the old name works for one release
__getattr__ = moved_names(__name__, {"extract_outputs": "jemeval.components.detector"})


def linear_head(model) -> tuple[torch.Tensor, torch.Tensor]:
    """(W, b) of the model's last layer, K x D and K, detached on the CPU (b = 0 without a bias)."""
    head = model.classifier()
    weight = getattr(head, "weight", None)
    if not torch.is_tensor(weight) or weight.dim() != 2:
        raise UsageError(f"architecture {getattr(model, 'arch', None)!r}: its last layer ({type(head).__name__}) is "
                         "not linear; vim, react and dice need a linear head")
    bias = getattr(head, "bias", None)
    bias = torch.zeros(weight.shape[0]) if bias is None else bias
    return weight.detach().float().cpu(), bias.detach().float().cpu()


def negative_fraction(features: torch.Tensor) -> float:
    """The fraction of feature values below 0 (0 for ReLU features; about a quarter after LeakyReLU)."""
    return float((features < 0).double().mean()) if features.numel() else 0.0


#: the help `jemeval list scores` shows for the detectors that assume ReLU features
RELU_HELP = "assumes non-negative (ReLU) features (a note says when the model's are not)"


def _linear(w: torch.Tensor, b: torch.Tensor):
    return lambda h: F.linear(h.flatten(1), w.to(h.device), b.to(h.device))


class FittedDetector(Detector):
    """Base of the built-in detectors: state fitted on features, scores from the batch's features.

    A subclass defines ``fit_features(model, features, logits, labels, **options)`` (its options are
    its keyword parameters) setting ``self.state``, and ``_build()`` turning the state into the
    pytorch-ood detector whose ``predict_features`` (or ``predict_feature_maps``) gives outlier scores.
    ``fit`` and ``score`` are :class:`~jemeval.Detector`'s: one forward pass, then the features' forms.
    """

    name = "detector"
    uses_features = True
    cacheable = True
    #: the help `jemeval list scores` shows (default: the first line of the docstring)
    help: str | None = None

    def __init__(self) -> None:
        self.state: dict[str, Any] | None = None
        self._impl = None

    def score_features(self, features: torch.Tensor, logits: torch.Tensor) -> torch.Tensor:
        if self._impl is None or self._impl.device != features.device:  # built once per device
            self._impl = self._build().to(features.device)
        return -self._outlier(self._impl, features.detach().float(), logits).detach().to(features.device)

    def state_dict(self) -> dict[str, Any]:
        return dict(self.state or {})

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.state, self._impl = dict(state), None

    def _fitted(self, state: dict[str, Any]):
        self.state, self._impl = state, None
        return self

    def _build(self):
        raise NotImplementedError

    def _outlier(self, impl, features: torch.Tensor, logits: torch.Tensor) -> torch.Tensor:
        """pytorch-ood's outlier score of the batch (higher = more OOD; ``score_features`` flips it)."""
        return impl.predict_features(features)


def shared_covariance_minimum(dim: int, classes: int) -> FitMinimum:
    """A covariance of D features shared by C classes (each image centred on its class mean) has rank at most
    N - C: below N = C + D it is singular, and the 1e-6 ridge pytorch-ood adds makes the distances along the
    directions no image spans a million times larger than the others."""
    means = f"{classes} class mean{'s' if classes != 1 else ''}"
    return FitMinimum(images=classes + dim, why=f"a covariance of {dim} features around {means} has full rank only "
                                                f"with {classes} + {dim} images")


class Mahalanobis(FittedDetector):
    """Mahalanobis distance to the closest class mean, shared covariance (Lee et al. 2018); needs labels."""

    name = "mahalanobis"
    needs_labels = True

    def fit_minimum(self, *, dim, classes, **options):
        return shared_covariance_minimum(dim, classes)

    def fit_features(self, model, features, logits, labels):
        from pytorch_ood.detector import Mahalanobis as Impl

        known = labels >= 0
        if not bool(known.any()):
            raise UsageError("score 'mahalanobis' needs labelled fit data (class means); the fit dataset has none")
        _, classes = torch.unique(labels[known], return_inverse=True)  # contiguous 0..C-1, as pytorch-ood asks
        impl = Impl(None).fit_features(features[known].float(), classes)
        return self._fitted({"mu": impl.mu, "cov": impl.cov, "precision": impl.precision})

    def _build(self):
        from pytorch_ood.detector import Mahalanobis as Impl

        impl = Impl(None)
        impl.mu, impl.cov, impl.precision = self.state["mu"], self.state["cov"], self.state["precision"]
        return impl


class KNN(FittedDetector):
    """Distance to the k-th nearest normalised training feature (Sun et al. 2022); option k."""

    name = "knn"
    grid = {"k": [50, 100, 200, 500, 1000]}
    ranges = {"k": whole()}

    def fit_minimum(self, *, dim, classes, k=50, **options):
        return FitMinimum(images=int(k), why="the distance to the k-th nearest fit image")

    def fit_features(self, model, features, logits, labels, *, k: int = 50):
        return self._fitted({"features": features.detach().float().cpu(), "k": int(k)})

    def _build(self):
        from pytorch_ood.detector import KNN as Impl

        features = self.state["features"]
        return Impl(None, k=int(self.state["k"])).fit_features(features, torch.zeros(len(features), dtype=torch.long))


def default_vim_dim(dim: int) -> int:
    """ViM's principal dimension as its paper chose it: 1000 for D >= 1500, 512 for D >= 768, else D // 2."""
    return 1000 if dim >= 1500 else 512 if dim >= 768 else max(1, dim // 2)


class ViM(FittedDetector):
    """Virtual-logit matching (Wang et al. 2022): energy minus the scaled residual norm; option d."""

    name = "vim"
    grid = {"d": [16, 32, 64, 128, 256, 512]}
    ranges = {"d": whole(none=True)}

    def fit_minimum(self, *, dim, classes, d=None, **options):
        d = default_vim_dim(dim) if d is None else int(d)
        return FitMinimum(images=d + 2, why=f"the top-{d} principal subspace holds every centred feature of {d} + 1 "
                                            "fit images or fewer, and ViM divides by their residual norm, then 0")

    def fit_features(self, model, features, logits, labels, *, d: int | None = None):
        from pytorch_ood.detector import ViM as Impl

        dim = features.shape[1]
        d = default_vim_dim(dim) if d is None else d
        if int(d) != d or not 1 <= int(d) < dim:
            raise UsageError(f"score 'vim': d must be a whole number in 1..{dim - 1} (below the feature dimension "
                             f"{dim}), got {d!r}")
        w, b = linear_head(model)
        impl = Impl(None, d=int(d), w=w, b=b).fit_features(features.float(), torch.zeros(len(features)))
        return self._fitted({"d": int(d), "w": w, "b": b, "u": impl.u,
                             "principal_subspace": impl.principal_subspace, "alpha": float(impl.alpha)})

    def _build(self):
        from pytorch_ood.detector import ViM as Impl

        impl = Impl(None, d=int(self.state["d"]), w=self.state["w"], b=self.state["b"])
        impl.u, impl.principal_subspace, impl.alpha = (self.state["u"], self.state["principal_subspace"],
                                                       float(self.state["alpha"]))
        return impl


class ReAct(FittedDetector):
    """Energy after clipping the features at their training percentile (Sun et al. 2021); option percentile."""

    name = "react"
    grid = {"percentile": [0.85, 0.90, 0.95, 0.99]}
    #: at 0 every feature is clipped to the smallest fit activation: one logit vector for every input
    ranges = {"percentile": fraction(gt=0.0)}
    assumes_nonnegative_features = True
    help = f"ReAct: energy after clipping features at a fit percentile; {RELU_HELP}"

    def fit_features(self, model, features, logits, labels, *, percentile: float = 0.9):
        from pytorch_ood.detector import ReAct as Impl

        w, b = linear_head(model)
        impl = Impl(None, _linear(w, b), percentile=float(percentile))
        impl.fit_feature_maps(features.float(), torch.zeros(len(features), dtype=torch.long))
        return self._fitted({"threshold": float(impl.threshold), "percentile": float(percentile), "w": w, "b": b,
                             "negative_fraction": negative_fraction(features)})

    def _build(self):
        from pytorch_ood.detector import ReAct as Impl

        return Impl(None, _linear(self.state["w"], self.state["b"]), threshold=float(self.state["threshold"]))

    def _outlier(self, impl, features, logits):
        return impl.predict_feature_maps(features)


class DICE(FittedDetector):
    """Energy of a sparsified last layer (Sun & Li 2022); option p, the fraction of weights zeroed."""

    name = "dice"
    grid = {"p": [0.1, 0.3, 0.5, 0.7, 0.9]}
    #: at 1 every weight is zeroed: the score is the energy of the bias, one value for every input
    ranges = {"p": fraction(lt=1.0)}
    assumes_nonnegative_features = True
    help = f"DICE: energy of a sparsified last layer; {RELU_HELP}"

    def fit_features(self, model, features, logits, labels, *, p: float = 0.9):
        from pytorch_ood.detector import DICE as Impl

        w, b = linear_head(model)
        impl = Impl(None, w, b, float(p)).fit_features(features.float(),
                                                                        torch.zeros(len(features), dtype=torch.long))
        return self._fitted({"p": float(p), "w": w, "b": b, "masked_w": impl.masked_w.cpu(),
                             "threshold": float(impl.threshold), "negative_fraction": negative_fraction(features)})

    def _build(self):
        from pytorch_ood.detector import DICE as Impl

        impl = Impl(None, self.state["w"], self.state["b"], float(self.state["p"]))
        impl.masked_w, impl.threshold, impl._is_fitted = self.state["masked_w"], self.state["threshold"], True
        return impl


@hookimpl
def register_scores(register):
    for detector in (Mahalanobis, KNN, ViM, ReAct, DICE):
        register(detector.name, detector, help=detector.help)
