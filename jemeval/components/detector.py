"""The detector base: an OOD score with a fit stage, in the shape of pytorch-ood's ``Detector``.

pytorch-ood's ``Detector`` has ``fit(loader)`` / ``fit_features(x, y)`` and ``predict(x)`` /
``predict_features(x)``, and raises ``RequiresFittingException`` when used unfitted. jemeval's
detectors get the model as an argument (one registered detector serves every model) and keep
jemeval's sign: higher = more in-distribution (pytorch-ood's ``predict`` returns outlier scores,
the opposite sign)::

    detector.fit(model, dataset, **options)                         # ID training images, once
    detector.fit_features(model, features, logits, labels, **options)
    detector.score(model, x) -> Tensor[N]                           # alias: predict
    detector.score_features(features, logits) -> Tensor[N]          # alias: predict_features

A subclass writes either ``fit`` and ``score`` or ``fit_features`` and ``score_features`` (then
``fit`` and ``score`` come from the base: one forward pass gives the features and logits, and
jemeval shares that pass between every detector of a run). What jemeval may do with a detector is
declared as class attributes, read by the evaluation and never probed:

* ``uses_features``: fit and score on the batch's features and logits (derived: True when the class
  defines ``fit_features`` and ``score_features``, unless it sets it);
* ``cacheable``: ``state_dict()`` / ``load_state_dict(state)`` hold the fitted state in tensors and
  plain values, cached on disk (:mod:`jemeval.caches.detectors`) so a second run does not refit
  (derived: True when the class defines both, unless it sets it);
* ``needs_labels``: the fit data must be labelled; ``assumes_nonnegative_features``: the score
  presumes ReLU penultimate features (a note says when the model's are not);
* ``grid``: option -> candidates, searched by ``tune_on``; ``needs_fit``: scoring before a fit
  raises :class:`NotFittedError` (set False for a detector whose fit is optional);
* ``ranges``: option -> :class:`jemeval.components.options.Range`, the values each option takes
  (``knn``'s k a whole number >= 1): a value outside is refused in one line;
* :meth:`Detector.fit_minimum`: the fewest fit images (in all, of each class) the fitted state means
  something with (``gmm``: a full covariance per class needs D + 1 images of each class); a smaller fit
  set is refused in one line naming the detector, the count and the minimum.

The options of ``--score NAME:k=3`` are the keyword parameters of ``fit_features`` (with
``uses_features``) or of ``fit``. The unfitted check wraps the methods a subclass defines (once, when
the class is created), so every detector, a plugin's included, fails in one line instead of deep
inside a matrix product; the same wrappers check the options' ranges and the fit minimum, whoever
calls the fit (the evaluation, or a user in Python). torch is imported where it is used: a plugin
module that subclasses :class:`Detector` at its top stays cheap to import (``jemeval --help`` imports
every plugin).
"""
from __future__ import annotations

import functools
import inspect
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from jemeval.errors import JemevalError, UsageError

if TYPE_CHECKING:
    import torch

#: the methods after which a detector is fitted, and those that need it fitted
FITTING = ("fit", "fit_features", "load_state_dict")
SCORING = ("score", "score_features")


class NotFittedError(JemevalError):
    """A detector was asked for scores before it was fitted (pytorch-ood's ``RequiresFittingException``)."""


def extract_outputs(model, dataset, batch_size: int = 256) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(features, logits, labels) of a whole dataset, on the CPU: what a detector fits on when it is
    called on its own (jemeval's evaluation computes them once for all detectors instead)."""
    import torch

    from jemeval.data import iterate_batches
    from jemeval.sampling.sgld import frozen

    device = getattr(model, "device", torch.device("cpu"))
    parts: list[tuple[torch.Tensor, ...]] = []
    with frozen(model, train=False), torch.no_grad():
        for x, y in iterate_batches(dataset, batch_size, device):
            features, logits = model.features_and_logits(x.float())
            parts.append((features.float().cpu(), logits.float().cpu(), y.long().cpu()))
    if not parts:
        raise UsageError("the fit dataset has no examples; choose a non-empty dataset")
    features, logits, labels = (torch.cat(p) for p in zip(*parts))
    return features, logits, labels


@dataclass(frozen=True)
class FitMinimum:
    """The fewest fit images a detector's fitted state means what it says with: ``images`` in all,
    ``per_class`` of each class the fit data holds (of each of the model's classes with
    ``every_class``); ``why`` says what needs them (a message quotes it). Labelled images are counted
    when ``per_class`` is set or the detector ``needs_labels``."""

    images: int = 1
    per_class: int = 0
    every_class: bool = False
    why: str = ""


def fit_options(detector: Detector, options: dict[str, Any]) -> dict[str, Any]:
    """The options a fit runs with: the defaults of ``fit_features`` (or ``fit``) with ``options`` over them."""
    from jemeval.registry import option_defaults

    method, skip = (detector.fit_features, 4) if detector.uses_features else (detector.fit, 2)
    return {**option_defaults(method, skip=skip), **options}


def check_fit_options(detector: Detector, options: dict[str, Any]) -> None:
    """The options' declared ranges (:mod:`jemeval.components.options`), before a fit."""
    if options:
        from jemeval.components.options import check_option_values

        check_option_values(detector, options, detector.label, defaults=fit_options(detector, {}))


def check_fit_size(detector: Detector, features: torch.Tensor, logits: torch.Tensor, labels: torch.Tensor,
                   options: dict[str, Any]) -> None:
    """Refuse a fit set smaller than the detector's :meth:`~Detector.fit_minimum`, in one line naming the
    detector, the count and the minimum (before: ``gmm``, ``rmd`` and ``openmax`` fitted on one image
    printed AUROCs)."""
    import torch

    known = labels[labels >= 0].long() if labels is not None else torch.zeros(0, dtype=torch.long)
    counts = torch.bincount(known, minlength=int(logits.shape[1]) if logits is not None else 0)
    present = counts[counts > 0]
    need = detector.fit_minimum(dim=int(features.shape[1]) if features is not None and features.dim() > 1 else 0,
                                classes=int(len(present)), **fit_options(detector, options))
    if need is None:
        return
    what = f"score {detector.label!r}" + (f" ({_options_text(options)})" if options else "")
    why = f" ({need.why})" if need.why else ""
    labelled = need.per_class > 0 or detector.needs_labels
    n = int(len(known)) if labelled else int(len(features) if features is not None else len(labels))
    if labelled and n == 0:
        return  # no labels at all: the detector's own "needs labelled fit data" says so
    if n < need.images:
        raise UsageError(f"{what} needs at least {need.images} {'labelled ' if labelled else ''}fit images{why}, got "
                         f"{n}: fit on more images (fit_n, fit_on)", param="fit_n")
    per_class = counts if need.every_class else present
    if need.per_class > 0 and len(per_class) and int(per_class.min()) < need.per_class:
        c = int(torch.nonzero(counts == per_class.min())[0])
        of = f"each of the model's {len(counts)} classes" if need.every_class else "each class"
        raise UsageError(f"{what} needs at least {need.per_class} fit images of {of}{why}; class {c} has "
                         f"{int(counts[c])}: fit on more images (fit_n, fit_on)", param="fit_n")


def _options_text(options: dict[str, Any]) -> str:
    return ",".join(f"{k}={v}" for k, v in options.items())


def _marks_fitted(method):
    @functools.wraps(method)
    def fitting(self, *args, **kwargs):
        if method.__name__ in ("fit", "fit_features"):
            check_fit_options(self, kwargs)
        if method.__name__ == "fit_features" and len(args) >= 4:  # (model, features, logits, labels)
            check_fit_size(self, args[1], args[2], args[3], kwargs)
        out = method(self, *args, **kwargs)
        self._fit_done = True
        return out

    return fitting


def _needs_fitted(method):
    @functools.wraps(method)
    def scoring(self, *args, **kwargs):
        if self.needs_fit and not self._fit_done:
            raise NotFittedError(f"detector {self.label!r} is not fitted: call fit(model, dataset) (or fit_features) "
                                 "first; jemeval.evaluate_ood fits it on the model's training images")
        return method(self, *args, **kwargs)

    return scoring


class Detector:
    """Base of OOD detectors (see the module docstring): subclass it and register the class."""

    #: how messages name the detector (default: the class name)
    name: str | None = None
    uses_features: bool = False
    cacheable: bool = False
    needs_labels: bool = False
    needs_fit: bool = True
    assumes_nonnegative_features: bool = False
    grid: dict[str, list] = {}
    #: option -> :class:`jemeval.components.options.Range`; relations between two options (``Below``)
    ranges: dict[str, Any] = {}
    relations: tuple = ()
    _fit_done = False

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        for names, wrap in ((FITTING, _marks_fitted), (SCORING, _needs_fitted)):
            for name in names:
                if inspect.isfunction(cls.__dict__.get(name)):
                    setattr(cls, name, wrap(cls.__dict__[name]))
        if "uses_features" not in cls.__dict__:
            cls.uses_features = cls._defines("fit_features") and cls._defines("score_features")
        if "cacheable" not in cls.__dict__:
            cls.cacheable = cls._defines("state_dict") and cls._defines("load_state_dict")

    @classmethod
    def _defines(cls, method: str) -> bool:
        return getattr(cls, method) is not getattr(Detector, method)

    @property
    def label(self) -> str:
        return self.name or type(self).__name__

    @property
    def fitted(self) -> bool:
        """Whether scores may be asked for: after ``fit``, ``fit_features`` or ``load_state_dict``."""
        return self._fit_done or not self.needs_fit

    def fit(self, model, dataset, **options) -> Detector:
        """Fit on ``dataset`` (in-distribution training images): by default one pass of the model over
        it, then :meth:`fit_features`."""
        if not self.uses_features:
            raise NotImplementedError(f"{type(self).__name__} defines neither fit(model, dataset) nor "
                                      "fit_features(model, features, logits, labels) with score_features")
        return self.fit_features(model, *extract_outputs(model, dataset), **options)

    def fit_features(self, model, features: torch.Tensor, logits: torch.Tensor, labels: torch.Tensor,
                     **options) -> Detector:
        """Fit on the fit data's penultimate features (N x D), logits (N x K) and labels (N, -1 unlabelled)."""
        raise NotImplementedError(f"{type(self).__name__} does not fit on features (uses_features is False)")

    def fit_minimum(self, *, dim: int, classes: int, **options) -> FitMinimum | None:
        """The fewest fit images for these ``options`` (every option, defaults filled in), features of
        ``dim`` dimensions and ``classes`` classes in the fit data: by default one image."""
        return FitMinimum()

    def score(self, model, x: torch.Tensor) -> torch.Tensor:
        """Tensor[N], higher = more in-distribution: by default :meth:`score_features` of one forward pass."""
        if not self.uses_features:
            raise NotImplementedError(f"{type(self).__name__} defines neither score(model, x) nor score_features")
        import torch

        with torch.no_grad():
            features, logits = model.features_and_logits(x)
        return self.score_features(features, logits)

    def score_features(self, features: torch.Tensor, logits: torch.Tensor) -> torch.Tensor:
        """Tensor[N] from a batch's features and logits (the forward pass jemeval shares)."""
        raise NotImplementedError(f"{type(self).__name__} does not score features (uses_features is False)")

    def predict(self, model, x: torch.Tensor) -> torch.Tensor:
        """pytorch-ood's name for :meth:`score`, with jemeval's sign (higher = more in-distribution)."""
        return self.score(model, x)

    def predict_features(self, features: torch.Tensor, logits: torch.Tensor) -> torch.Tensor:
        """pytorch-ood's name for :meth:`score_features`, with jemeval's sign."""
        return self.score_features(features, logits)

    def state_dict(self) -> dict[str, Any]:
        """The fitted state, tensors and plain values only (used when ``cacheable``)."""
        return {}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore a state :meth:`state_dict` returned (used when ``cacheable``)."""

    def __repr__(self) -> str:
        return f"{type(self).__name__}(fitted={self.fitted})"


def state_bytes(detector: Any) -> int | None:
    """How many bytes a fitted detector keeps (the tensors and arrays of its ``state_dict``: for knn
    the fit features), recorded with each fit in the ood provenance so that what a fit set of N
    images costs in memory is visible; None for a detector whose state jemeval cannot see (not
    ``cacheable``: it declares no ``state_dict``)."""
    if not getattr(detector, "cacheable", False):
        return None

    def size(value: Any) -> int:
        if hasattr(value, "element_size") and hasattr(value, "nelement"):  # a torch tensor
            return int(value.element_size() * value.nelement())
        if hasattr(value, "nbytes") and hasattr(value, "dtype"):  # a numpy array
            return int(value.nbytes)
        if isinstance(value, dict):
            return sum(size(v) for v in value.values())
        if isinstance(value, (list, tuple)):
            return sum(size(v) for v in value)
        return 0

    return size(detector.state_dict())
