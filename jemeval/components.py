"""The shapes of metrics, attacks, detectors and training loggers.

Plain scores and models are fixed by README.md's conventions.

Detectors
---------
A registered score is either a function ``fn(model, x, **options) -> Tensor[N]`` or a *detector*: an
object (or a class, instantiated without arguments) with a fit stage::

    detector.fit(model, dataset, **options)      # in-distribution training data, once per (model, data)
    detector.score(model, x) -> Tensor[N]        # higher = more in-distribution

jemeval gives every use of a detector (``knn``, ``knn:k=10``) its own copy. Optional, all additive:
``fit_features(model, features, logits, labels, **options)`` and ``score_features(features, logits)``
(jemeval then computes features and logits once per batch for every detector; options are checked
against ``fit_features``' signature when it exists, else ``fit``'s), ``state_dict()`` /
``load_state_dict(state)`` with tensors and plain values only (the fitted state is then cached on
disk, so a second run does not refit), ``grid`` (option -> candidates, for ``tune_on``) and
``needs_labels`` (fit data must be labelled).

Metrics
-------
A metric is a callable marked with the task it serves:

* :func:`ood_metric`: ``fn(id_scores, ood_scores) -> float``; numpy arrays of scores where higher
  means more in-distribution (jemeval's score convention). AUROC, FPR95, ...
* :func:`calibration_metric`: ``fn(probs, labels) -> float``; probs is N x K softmax output,
  labels N ints. ECE, Brier, NLL, ...

``jemeval ood`` reports every registered OOD metric, ``jemeval calibrate`` every calibration
metric, so a plugin's metric shows up in both tables with no further work.

Attacks
-------
An attack factory is registered by name and called as ``factory(norm, **options)`` with norm
``"l2"`` or ``"linf"``; it returns an attack callable::

    attack(model, x, y, epsilons) -> Tensor[len(epsilons), N, C, H, W]

``model`` maps inputs in [-1, 1] to logits (an :class:`~jemeval.EnergyModel`, possibly wrapped by
SGLD refinement); ``epsilons`` are perturbation sizes in [0, 1] *pixel units* (the literature's
convention; the input space spans 2 units, so a pixel-unit epsilon e is 2e in model space). The
result holds one adversarial batch per epsilon, each within its epsilon-ball and inside [-1, 1].
jemeval re-classifies the adversarials itself, so an attack never reports its own success.
An attack may set ``attack.norms`` (the norms it supports) and ``attack.settings`` (a dict recorded
in results). Optional attributes ``jemeval robust`` understands (all additive; an attack with only
the base interface works unchanged):

* ``attack.gradient_free = True``: a decision-based attack (never differentiates the model). Its
  runs are recorded with ``grad_mode = "none"`` and compared with the white-box ones: a
  gradient-free attack that beats a white-box attack is flagged (obfuscated gradients).
* ``attack.minimization = True`` plus ``attack.minimize(model, x, y) -> Tensor[N, C, H, W]``:
  adversarials of (locally) minimal size, in model space (an input it could not attack is
  returned unchanged). jemeval then projects them onto each epsilon ball itself (foolbox's
  ``clip_perturbation``: Linf clamps, L2 scales the perturbation down) instead of calling
  ``attack(...)``, and reports each input's minimal perturbation (pixel units, verified by
  re-classification) and the robustness-distortion curve derived from it.
* ``attack.last_without_start``: after a call, the number of inputs it could not attack (e.g. no
  adversarial starting point); reported in the notes.
* ``attack.supports_eot = True``: the attack averages its gradients over noise draws itself
  (expectation over transformation, like APGD's ``eot_iter``). In the EOT gradient modes (eot,
  bpda+eot) jemeval then calls ``attack(model, x, y, epsilons, eot_samples=R)`` with a model that
  draws fresh noise on every forward pass; other attacks get a model that averages its logits over
  R draws in one pass instead.

The caller seeds torch and numpy before every attack call, freezes the model's parameters, and
validates the output (shape, [-1, 1], each epsilon ball) before re-classifying it.

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
    """True for a score with a fit stage (an object or class with ``fit`` and ``score``)."""
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
