"""The contracts of jemeval's components, as code.

The kinds a plugin supplies each have a base or a marker here; evaluation reads their declared
attributes and never probes an object for optional ones:

* :class:`jemeval.Detector` (:mod:`jemeval.components.detector`): an OOD score with a fit stage
  (``fit`` / ``fit_features``, ``score`` / ``score_features``, ``state_dict``), its capabilities
  (``uses_features``, ``cacheable``, ``needs_labels``, ``grid``, ...) class attributes with defaults.
* :class:`jemeval.Attack` (:mod:`jemeval.components.attack`): one ``attack(model, x, y, epsilons)``
  that puts the model in eval mode and restores it; ``norms``, ``gradient_free``, ``minimization``,
  ``supports_eot``, ``own_eot_samples``, ``settings`` declared with defaults.
* :class:`jemeval.Score` (:mod:`jemeval.components.score`): the protocol of a plain score
  ``fn(model, x, **options) -> Tensor[N]`` and its optional ``from_logits`` / ``from_features``
  forms; the :func:`jemeval.score` decorator declares them on a function.
* Metrics: functions marked with :func:`ood_metric` or :func:`calibration_metric` (below).
* Training loggers: :class:`TrainingLogger` (below).

Objects written for 0.2's prose contracts (a detector with ``fit``/``score`` that subclasses nothing,
an attack callable with optional attributes) still work for one release: they are adapted into the
bases at first use, with one DeprecationWarning naming the base to subclass
(:mod:`jemeval.components.adapters`).

This module itself stays light (no torch): ``import jemeval`` imports it.

Metrics
-------
A metric is a callable marked with the task it serves:

* :func:`ood_metric`: ``fn(id_scores, ood_scores) -> float``; numpy arrays of scores where higher
  means more in-distribution (jemeval's score convention). AUROC, FPR95, ...
* :func:`calibration_metric`: ``fn(probs, labels) -> float``; probs is N x K softmax output,
  labels N ints. ECE, Brier, NLL, ...

``jemeval ood`` reports every registered OOD metric, ``jemeval calibrate`` every calibration
metric, so a plugin's metric shows up in both tables with no further work.

Training loggers
----------------
A logger factory is registered by name (``register_loggers``) and called once per run, on the
process that writes files (rank 0), as ``factory(log_dir, config, **options)``: ``log_dir`` is a
folder of the run (``<out>/<name>``, not created: the logger creates it if it needs it), ``config``
the run's settings (plain data), ``options`` what the spec gives (``wandb:project=jem``). A factory
may have ``check(**options)`` (a classmethod), called while the settings are validated, before any
file is written: it raises a one-line error when, say, the package it needs is missing. The object
it returns has the methods of :class:`TrainingLogger` (any may be left out):

* ``log_scalars(values, step)``: ``{"train/loss": 0.41, ...}`` every ``log_every`` iterations and
  ``{"epoch/val_acc": 0.97, ...}`` after each epoch; ``step`` is the global iteration;
* ``log_image(tag, image, step)``: each epoch's sample grids, ``image`` a 3 x H x W float tensor in
  [0, 1] (``torchvision.utils.make_grid``'s layout);
* ``close()``: at the end of the run (also after an error or a stop).

A logger that raises is dropped with one line on stderr; the run goes on (metrics.csv keeps every
number).
"""
from __future__ import annotations

from collections.abc import Callable
from typing import TypeVar

F = TypeVar("F", bound=Callable)

METRIC_TASKS = ("ood", "calibration")
#: the norms of jemeval's threat models (pixel units: see :func:`pixel_to_model_scale`)
NORMS = ("l2", "linf")


def ood_metric(fn: F) -> F:
    """Mark ``fn(id_scores, ood_scores) -> float`` as an OOD metric."""
    fn.task = "ood"
    return fn


def calibration_metric(fn: F) -> F:
    """Mark ``fn(probs, labels) -> float`` as a calibration metric."""
    fn.task = "calibration"
    return fn


def metric_task(obj) -> str | None:
    task = getattr(obj, "task", None)
    return task if task in METRIC_TASKS else None


def is_detector(obj) -> bool:
    """True for a score with a fit stage: a :class:`jemeval.Detector` (class or instance) or a
    duck-typed one with ``fit`` and ``score``, which is adapted at first use. Registration checks
    with it; evaluation only ever sees :class:`jemeval.Detector` instances."""
    return callable(getattr(obj, "fit", None)) and callable(getattr(obj, "score", None))


def pixel_to_model_scale(eps: float) -> float:
    """Epsilon in [0, 1] pixel units -> the same size in the [-1, 1] model input space."""
    return 2.0 * float(eps)


class TrainingLogger:
    """A training logger that does nothing: subclass it and override what your sink records
    (see "Training loggers" above)."""

    def log_scalars(self, values: dict[str, float], step: int) -> None:
        """Scalars of one step: ``train/<name>`` every ``log_every`` iterations, ``epoch/<name>`` per epoch."""

    def log_image(self, tag: str, image, step: int) -> None:
        """An image, 3 x H x W floats in [0, 1]: the grids ``samples/buffer`` and ``samples/conditional``."""

    def close(self) -> None:
        """The run has ended (completed, stopped or failed): flush and release what the logger holds."""
