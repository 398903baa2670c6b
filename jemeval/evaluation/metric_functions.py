"""Metric definitions (contracts.md). Scores: higher = more in-distribution.

* AUROC: in-distribution is the positive class (scikit-learn's ``roc_auc_score``).
* AUPR-In: average precision with in-distribution positive.
* AUPR-Out: average precision with OOD positive and negated scores.
* FPR95: the fraction of OOD inputs accepted (score >= threshold) at the threshold that keeps
  95% of in-distribution inputs (the ODIN / energy-OOD convention). The threshold is the 5th
  percentile of in-distribution scores taken as the largest t with at least 95% of ID scores >= t.
"""
from __future__ import annotations

import numpy as np

from ..interfaces import calibration_metric, ood_metric


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


@ood_metric
def aupr_in(id_scores, ood_scores) -> float:
    """Area under the precision-recall curve (average precision), in-distribution positive."""
    from sklearn.metrics import average_precision_score

    labels, scores = _labels_scores(id_scores, ood_scores)
    return float(average_precision_score(labels, scores))


@ood_metric
def aupr_out(id_scores, ood_scores) -> float:
    """Average precision with OOD positive and negated scores."""
    from sklearn.metrics import average_precision_score

    labels, scores = _labels_scores(id_scores, ood_scores)
    return float(average_precision_score(1 - labels, -scores))


@ood_metric
def fpr95(id_scores, ood_scores) -> float:
    """Fraction of OOD inputs accepted at the threshold that keeps 95% of in-distribution inputs."""
    id_scores = np.sort(np.asarray(id_scores, dtype=np.float64).reshape(-1))
    ood_scores = np.asarray(ood_scores, dtype=np.float64).reshape(-1)
    # keep ceil(0.95 n) in-distribution inputs: the threshold is the score of the k-th largest
    k = int(np.ceil(0.95 * len(id_scores)))
    threshold = id_scores[len(id_scores) - k]
    return float(np.mean(ood_scores >= threshold))


#: name -> metric, registered by jemeval.builtins.metrics
BUILTIN_METRICS = {"auroc": auroc, "aupr_in": aupr_in, "aupr_out": aupr_out, "fpr95": fpr95}
