"""Metric definitions (README.md, Conventions).

OOD metrics, ``fn(id_scores, ood_scores) -> float``; scores: higher = more in-distribution.

* AUROC: in-distribution is the positive class (scikit-learn's ``roc_auc_score``).
* AUPR-In: area under the precision-recall curve with in-distribution positive, by the trapezoidal
  rule over scikit-learn's ``precision_recall_curve`` (``sklearn.metrics.auc(recall, precision)``):
  the AUPR of OpenOOD v1.5 and pytorch-ood's ``OODMetrics``, so numbers compare with theirs.
* AUPR-Out: the same with OOD positive and negated scores.
* FPR95: the fraction of OOD inputs accepted (score >= threshold) at the threshold that keeps
  95% of in-distribution inputs (the ODIN / energy-OOD convention). The threshold is the 5th
  percentile of in-distribution scores taken as the largest t with at least 95% of ID scores >= t.

Calibration metrics, ``fn(probs, labels) -> float`` with probs N x K softmax outputs. Confidence is
the max probability, the prediction its argmax. Equal-width bins over confidence (default 20),
bin b holds the interval (b/B, (b+1)/B]; a confidence of exactly 0 falls in the first bin, 1.0 in
the last. With n_b examples in bin b, acc_b their accuracy and conf_b their mean confidence:

* ECE = sum_b n_b/N |acc_b - conf_b|;  MCE = max over non-empty bins |acc_b - conf_b|;
* RMS = sqrt(sum_b n_b/N (acc_b - conf_b)^2);
* Brier = mean over examples of sum_k (p_k - 1[k = y])^2 (the multi-class Brier score, 0..2);
* NLL = mean -log p_y (probabilities clipped at the smallest positive float64 so that a
  confidently wrong example costs about 708 nats instead of infinity).

Opt-in calibration metrics (named with ``--metric``; not in the default table):

* adaptive-ece: the ECE over equal-mass bins (:func:`equal_mass_edges`);
* classwise-ece (Kull et al. 2019): for each class k, the ECE of p_k against 1[y = k] over the
  equal-width bins above, averaged over all K classes (a class never predicted or never seen counts);
* debiased-l2 (Kumar et al. 2019): top-label, equal-mass bins, sqrt(max(0, sum_b n_b/N
  ((conf_b - acc_b)^2 - acc_b (1 - acc_b) / (n_b - 1)))), a bin of fewer than 2 examples adding 0.

These three follow the reference package ``uncertainty-calibration`` (module ``calibration``) to the
bin edge, so their numbers equal its ``get_ece_em``, ``get_ece(mode="marginal")`` and
``lower_bound_scaling_top_ce(p=2, debias=True, binning_scheme=get_equal_bins)``.

Metrics that accept a ``bins`` keyword get the command's ``--bins`` (plugin metrics too).
"""
from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from jemeval.components import calibration_metric, metric_task, ood_metric
from jemeval.errors import UsageError, did_you_mean
from jemeval.plugins import get_registry


def _labels_scores(id_scores, ood_scores):
    id_scores = np.asarray(id_scores, dtype=np.float64).reshape(-1)
    ood_scores = np.asarray(ood_scores, dtype=np.float64).reshape(-1)
    labels = np.concatenate([np.ones_like(id_scores), np.zeros_like(ood_scores)])
    return labels, np.concatenate([id_scores, ood_scores])


@ood_metric
def auroc(id_scores, ood_scores) -> float:
    """Area under the ROC curve, in-distribution positive."""
    from sklearn.metrics import roc_auc_score

    labels, scores = _labels_scores(id_scores, ood_scores)
    return float(roc_auc_score(labels, scores))


def _aupr(labels: np.ndarray, scores: np.ndarray) -> float:
    """Trapezoidal area under scikit-learn's precision-recall curve (OpenOOD's and pytorch-ood's AUPR)."""
    from sklearn.metrics import auc, precision_recall_curve

    precision, recall, _ = precision_recall_curve(labels, scores)
    return float(auc(recall, precision))


@ood_metric
def aupr_in(id_scores, ood_scores) -> float:
    """Area under the precision-recall curve (trapezoidal, as OpenOOD), in-distribution positive."""
    labels, scores = _labels_scores(id_scores, ood_scores)
    return _aupr(labels, scores)


@ood_metric
def aupr_out(id_scores, ood_scores) -> float:
    """Area under the precision-recall curve (trapezoidal), OOD positive with negated scores."""
    labels, scores = _labels_scores(id_scores, ood_scores)
    return _aupr(1 - labels, -scores)


@ood_metric
def fpr95(id_scores, ood_scores) -> float:
    """Fraction of OOD inputs accepted at the threshold that keeps 95% of in-distribution inputs."""
    id_scores = np.sort(np.asarray(id_scores, dtype=np.float64).reshape(-1))
    ood_scores = np.asarray(ood_scores, dtype=np.float64).reshape(-1)
    # keep ceil(0.95 n) in-distribution inputs (integer arithmetic: 0.95 * n is inexact in
    # floating point): the threshold is the score of the k-th largest
    k = -(-95 * len(id_scores) // 100)
    threshold = id_scores[len(id_scores) - k]
    return float(np.mean(ood_scores >= threshold))


def roc_points(id_scores, ood_scores) -> tuple[np.ndarray, np.ndarray]:
    """(false positive rate, true positive rate) of the ROC curve, in-distribution positive: the
    trapezoids under these points are exactly :func:`auroc` (scikit-learn's ``roc_curve``)."""
    from sklearn.metrics import roc_curve

    labels, scores = _labels_scores(id_scores, ood_scores)
    fpr, tpr, _ = roc_curve(labels, scores)
    return fpr, tpr


def pr_points(id_scores, ood_scores) -> tuple[np.ndarray, np.ndarray]:
    """(recall, precision) of the precision-recall curve, in-distribution positive; the straight
    lines through them enclose :func:`aupr_in` (the trapezoidal area)."""
    from sklearn.metrics import precision_recall_curve

    labels, scores = _labels_scores(id_scores, ood_scores)
    precision, recall, _ = precision_recall_curve(labels, scores)
    return recall, precision


# -- calibration ---------------------------------------------------------------------------------
DEFAULT_BINS = 20


def _probs_labels(probs, labels) -> tuple[np.ndarray, np.ndarray]:
    probs = np.asarray(probs, dtype=np.float64)
    labels = np.asarray(labels).reshape(-1).astype(np.int64)
    if probs.ndim != 2 or len(probs) != len(labels):
        raise ValueError(f"probs must be N x K and labels N; got {probs.shape} and {labels.shape}")
    return probs, labels


def bin_edges(bins: int) -> np.ndarray:
    """The B + 1 edges b / B (each the correctly rounded double, so 0.15 is the literal 0.15)."""
    bins = int(bins)
    if bins < 1:
        raise ValueError(f"the number of bins must be >= 1, got {bins}")
    return np.arange(bins + 1, dtype=np.float64) / bins


def bin_index(confidence, bins: int) -> np.ndarray:
    """The bin of each confidence: bin b holds (b/B, (b+1)/B]; 0 goes to bin 0, 1 to bin B - 1."""
    edges = bin_edges(bins)
    idx = np.searchsorted(edges, np.asarray(confidence, dtype=np.float64), side="left") - 1
    return np.clip(idx, 0, int(bins) - 1)


BIN_STRATEGIES = ("uniform", "equal-mass")


def equal_mass_edges(confidence, bins: int) -> np.ndarray:
    """The edges of equal-mass bins over ``confidence``, by the rule of Kumar et al.'s reference
    package (``calibration.get_equal_bins``) so that numbers compare with it exactly.

    The sorted confidences are cut into min(B, n) consecutive runs by ``np.array_split``: each run
    holds floor(n/B) values and the first n mod B runs one more. Each inner edge is the midpoint of
    the last value of a run and the first of the next; 0 and 1 close the ends. A bin holds
    (lower, upper], so values tied across a cut (the edge is then that very value) all go to the
    lower bin, and equal edges merge: heavy ties give fewer than B bins, or an empty one.
    """
    bins = int(bins)
    if bins < 1:
        raise ValueError(f"the number of bins must be >= 1, got {bins}")
    conf = np.sort(np.asarray(confidence, dtype=np.float64).reshape(-1))
    if len(conf) == 0:
        return np.array([0.0, 1.0])
    runs = np.array_split(conf, min(bins, len(conf)))
    inner = [(a[-1] + b[0]) / 2.0 for a, b in zip(runs[:-1], runs[1:])]
    return np.concatenate([[0.0], np.unique(np.array([*inner, 1.0]))])


def strategy_edges(confidence, bins: int, strategy: str = "uniform") -> np.ndarray:
    """The bin edges of ``strategy``: "uniform" (b/B) or "equal-mass" (:func:`equal_mass_edges`)."""
    if strategy == "uniform":
        return bin_edges(bins)
    if strategy == "equal-mass":
        return equal_mass_edges(confidence, bins)
    raise ValueError(f"unknown binning strategy {strategy!r}; known: {', '.join(BIN_STRATEGIES)}")


def binned(values, targets, edges) -> dict[str, np.ndarray]:
    """Per bin (edges[i], edges[i+1]] (a value at or below the first edge goes to bin 0): lower/upper
    edge, count, mean value ("confidence") and mean target ("accuracy"), NaN for empty bins."""
    values = np.asarray(values, dtype=np.float64)
    m = len(edges) - 1
    idx = np.clip(np.searchsorted(edges[1:], values, side="left"), 0, m - 1)
    count = np.bincount(idx, minlength=m).astype(np.int64)
    conf_sum = np.bincount(idx, weights=values, minlength=m)
    acc_sum = np.bincount(idx, weights=np.asarray(targets, dtype=np.float64), minlength=m)
    with np.errstate(invalid="ignore", divide="ignore"):
        conf = np.where(count > 0, conf_sum / np.maximum(count, 1), np.nan)
        acc = np.where(count > 0, acc_sum / np.maximum(count, 1), np.nan)
    return {"lower": edges[:-1], "upper": edges[1:], "count": count, "confidence": conf, "accuracy": acc}


def reliability_bins(probs, labels, bins: int = DEFAULT_BINS, strategy: str = "uniform") -> dict[str, np.ndarray]:
    """Per-bin lower/upper edge, count, mean confidence and accuracy (NaN for empty bins), in
    equal-width (``strategy="uniform"``) or equal-mass bins."""
    probs, labels = _probs_labels(probs, labels)
    confidence = probs.max(axis=1)
    correct = (probs.argmax(axis=1) == labels).astype(np.float64)
    return binned(confidence, correct, strategy_edges(confidence, bins, strategy))


def _gaps(probs, labels, bins, strategy: str = "uniform") -> tuple[np.ndarray, np.ndarray]:
    table = reliability_bins(probs, labels, bins, strategy)
    weight = table["count"] / max(int(table["count"].sum()), 1)
    gap = np.nan_to_num(np.abs(table["accuracy"] - table["confidence"]), nan=0.0)
    return weight, gap


@calibration_metric
def ece(probs, labels, bins: int = DEFAULT_BINS) -> float:
    """Expected calibration error: sum_b n_b/N |acc_b - conf_b| (equal-width bins)."""
    weight, gap = _gaps(probs, labels, bins)
    return float(np.sum(weight * gap))


@calibration_metric
def mce(probs, labels, bins: int = DEFAULT_BINS) -> float:
    """Maximum calibration error: the largest |acc_b - conf_b| over non-empty bins."""
    weight, gap = _gaps(probs, labels, bins)
    return float(gap[weight > 0].max()) if np.any(weight > 0) else float("nan")


@calibration_metric
def rms(probs, labels, bins: int = DEFAULT_BINS) -> float:
    """Root-mean-square calibration error: sqrt(sum_b n_b/N (acc_b - conf_b)^2)."""
    weight, gap = _gaps(probs, labels, bins)
    return float(np.sqrt(np.sum(weight * gap ** 2)))


@calibration_metric
def brier(probs, labels) -> float:
    """Multi-class Brier score: mean over examples of sum_k (p_k - 1[k = y])^2."""
    probs, labels = _probs_labels(probs, labels)
    onehot = np.zeros_like(probs)
    onehot[np.arange(len(labels)), labels] = 1.0
    return float(np.mean(np.sum((probs - onehot) ** 2, axis=1)))


@calibration_metric
def nll(probs, labels) -> float:
    """Negative log-likelihood: mean -log p(y | x) of the true labels."""
    probs, labels = _probs_labels(probs, labels)
    p = probs[np.arange(len(labels)), labels]
    return float(np.mean(-np.log(np.maximum(p, np.finfo(np.float64).tiny))))


@calibration_metric
def adaptive_ece(probs, labels, bins: int = DEFAULT_BINS) -> float:
    """Adaptive ECE: sum_b n_b/N |acc_b - conf_b| over equal-mass bins, which keep every bin
    populated where confidences crowd near 1 (the reference package's ``get_ece_em``)."""
    weight, gap = _gaps(probs, labels, bins, "equal-mass")
    return float(np.sum(weight * gap))


@calibration_metric
def classwise_ece(probs, labels, bins: int = DEFAULT_BINS) -> float:
    """Class-wise ECE (Kull et al. 2019): the ECE of every class's probability p_k against 1[y = k]
    over equal-width bins, averaged over all classes: calibration of the whole vector, not only the top."""
    probs, labels = _probs_labels(probs, labels)
    edges = bin_edges(bins)
    per_class = []
    for k in range(probs.shape[1]):
        table = binned(probs[:, k], labels == k, edges)
        gap = np.nan_to_num(np.abs(table["accuracy"] - table["confidence"]), nan=0.0)
        per_class.append(np.sum(table["count"] / len(labels) * gap))
    return float(np.mean(per_class))


@calibration_metric
def debiased_l2(probs, labels, bins: int = DEFAULT_BINS) -> float:
    """Debiased top-label L2 calibration error (Kumar et al. 2019, "Verified uncertainty calibration"):
    each equal-mass bin's squared gap less its expected sampling noise acc_b (1 - acc_b) / (n_b - 1)
    (bins of fewer than 2 examples add 0), weighted by n_b/N, then sqrt(max(0, .)) as the reference
    package's ``unbiased_l2_ce`` reports it. The plug-in estimate is biased upwards for small bins."""
    table = reliability_bins(probs, labels, bins, "equal-mass")
    count, acc, conf = table["count"], table["accuracy"], table["confidence"]
    big = count >= 2
    terms = (conf[big] - acc[big]) ** 2 - acc[big] * (1.0 - acc[big]) / (count[big] - 1.0)
    squared = float(np.sum(count[big] / max(int(count.sum()), 1) * terms))
    return float(np.sqrt(max(squared, 0.0)))


#: name -> metric, registered by jemeval.builtins.metrics; what a command reports by default
BUILTIN_METRICS = {
    "auroc": auroc, "aupr_in": aupr_in, "aupr_out": aupr_out, "fpr95": fpr95,
    "ece": ece, "mce": mce, "rms": rms, "brier": brier, "nll": nll,
}
#: built-in metrics reported only when named (``--metric adaptive-ece``): defaults stay as they were
OPT_IN_METRICS = {"adaptive-ece": adaptive_ece, "classwise-ece": classwise_ece, "debiased-l2": debiased_l2}
#: the bins each built-in calibration metric measures in (recorded in calibrate's settings)
METRIC_BINNING = {"ece": "uniform", "mce": "uniform", "rms": "uniform", "adaptive-ece": "equal-mass",
                  "classwise-ece": "uniform, per class", "debiased-l2": "equal-mass"}


def registered_metrics(task: str) -> list[tuple[str, object]]:
    """(name, metric) for every registered metric of ``task`` ("ood" or "calibration").

    Built-ins come first in their documented order, plugin metrics after them by name.
    """
    registry = get_registry()
    found = [(c.name, c.obj) for c in registry.components("metric") if metric_task(c.obj) == task]
    order = {name: i for i, name in enumerate([*BUILTIN_METRICS, *OPT_IN_METRICS])}
    return sorted(found, key=lambda item: (order.get(item[0], len(order)), item[0]))


TASK_NAMES = {"ood": "OOD", "calibration": "calibration"}


def select_metrics(task: str, names: Sequence[str] | None = None) -> list[tuple[str, object]]:
    """(name, metric) for the ``task`` metrics named, checked (with a "did you mean"); by default
    only the built-in ones. Plugin metrics are opt-in (named with ``--metric``): installing a
    plugin must not change what a command reports by default."""
    available = registered_metrics(task)
    if names is None:
        return [(name, fn) for name, fn in available if name in BUILTIN_METRICS]
    by_name = dict(available)
    for name in names:
        if name not in by_name:
            raise UsageError(f"unknown {TASK_NAMES[task]} metric {name!r}{did_you_mean(name, by_name)}; "
                             f"known: {', '.join(by_name)}")
    return [(name, by_name[name]) for name in dict.fromkeys(names)]
