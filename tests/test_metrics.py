"""OOD and calibration metrics against scikit-learn and hand computations (definitions in README.md, Conventions)."""
from __future__ import annotations

import numpy as np
import pytest
from sklearn.metrics import auc, average_precision_score, log_loss, precision_recall_curve, roc_auc_score

import jemeval
from jemeval import testing
from jemeval.evaluation import metrics as mf


@pytest.fixture(scope="module")
def scores():
    rng = np.random.default_rng(0)
    return rng.normal(1.0, 1.0, 300), rng.normal(0.0, 1.5, 200)


def _trapezoid_aupr(y, s):
    precision, recall, _ = precision_recall_curve(y, s)
    return auc(recall, precision)


def test_auroc_aupr_match_sklearn(scores):
    id_s, ood_s = scores
    y = np.r_[np.ones(300), np.zeros(200)]
    s = np.r_[id_s, ood_s]
    assert mf.auroc(id_s, ood_s) == pytest.approx(roc_auc_score(y, s), abs=1e-12)
    # AUPR as OpenOOD v1.5 and pytorch-ood compute it: the trapezoidal area under the PR curve
    assert mf.aupr_in(id_s, ood_s) == pytest.approx(_trapezoid_aupr(y, s), abs=1e-12)
    assert mf.aupr_out(id_s, ood_s) == pytest.approx(_trapezoid_aupr(1 - y, -s), abs=1e-12)
    # which is not average precision (the step-wise sum), though close to it
    assert mf.aupr_in(id_s, ood_s) != pytest.approx(average_precision_score(y, s), abs=1e-6)
    assert mf.aupr_in(id_s, ood_s) == pytest.approx(average_precision_score(y, s), abs=0.02)


def test_auroc_by_hand_pair_counting(scores):
    id_s, ood_s = scores
    id_s, ood_s = np.round(id_s, 1), np.round(ood_s, 1)  # ties count one half
    pairs = (id_s[:, None] > ood_s[None, :]).mean() + 0.5 * (id_s[:, None] == ood_s[None, :]).mean()
    assert mf.auroc(id_s, ood_s) == pytest.approx(pairs, abs=1e-12)


def test_separable_and_reversed():
    a, b = np.arange(10, 20.0), np.arange(0, 10.0)
    assert mf.auroc(a, b) == 1.0 and mf.fpr95(a, b) == 0.0
    assert mf.aupr_in(a, b) == pytest.approx(1.0, abs=1e-12) and mf.aupr_out(a, b) == pytest.approx(1.0, abs=1e-12)
    assert mf.auroc(b, a) == 0.0 and mf.fpr95(b, a) == 1.0


def test_fpr95_by_hand():
    id_s = np.arange(1, 101, dtype=float)  # keep 95 of 100: threshold is the 6th smallest, 6
    ood = np.array([0.0, 5.9, 6.0, 6.1, 50.0, 200.0])
    assert mf.fpr95(id_s, ood) == pytest.approx(4 / 6)
    # 0.95 * 20 must keep exactly 19 examples (no floating-point ceil to 20)
    id20 = np.arange(20, dtype=float)
    assert mf.fpr95(id20, np.array([0.5, 1.0, 2.0])) == pytest.approx(2 / 3)
    # ties at the threshold: every OOD input equal to it is accepted
    assert mf.fpr95(np.array([1.0] * 10 + [2.0] * 10), np.array([1.0, 0.9])) == 0.5


def test_fpr95_keeps_at_least_95_percent(scores):
    id_s, ood_s = scores
    t = np.sort(id_s)[len(id_s) - int(np.ceil(0.95 * len(id_s)))]
    assert np.mean(id_s >= t) >= 0.95
    assert mf.fpr95(id_s, ood_s) == pytest.approx(np.mean(ood_s >= t))


def test_bin_index_conventions():
    conf = np.array([0.0, 1e-12, 0.05, 0.0500001, 0.15, 0.5, 0.95, 0.9500001, 1.0])
    assert mf.bin_index(conf, 20).tolist() == [0, 0, 0, 1, 2, 9, 18, 19, 19]
    assert mf.bin_index(np.array([0.0, 0.25, 0.26, 1.0]), 4).tolist() == [0, 0, 1, 3]


def _constructed():
    """Rows chosen so that confidences are 0, 0.25 (an edge), 0.6, 0.75 (an edge) and 1.0; 4 bins, bin 1 empty."""
    probs = np.array([
        [0.0, 0.0],    # confidence 0 -> bin 0, predicts 0, label 1: wrong
        [0.25, 0.0],   # 0.25 (edge) -> bin 0, predicts 0, label 0: right
        [0.4, 0.6],    # 0.6 -> bin 2, predicts 1, label 1: right
        [0.75, 0.25],  # 0.75 (edge) -> bin 2, predicts 0, label 1: wrong
        [0.0, 1.0],    # 1.0 -> bin 3, right
        [1.0, 0.0],    # 1.0 -> bin 3, label 1: wrong
    ])
    labels = np.array([1, 0, 1, 1, 1, 1])
    return probs, labels


def test_ece_mce_rms_by_hand_with_edges_and_empty_bins():
    probs, labels = _constructed()
    # bin 0: conf mean 0.125, acc 0.5; bin 2: conf 0.675, acc 0.5; bin 3: conf 1.0, acc 0.5; bin 1 empty
    gaps = {0: abs(0.5 - 0.125), 2: abs(0.5 - 0.675), 3: abs(0.5 - 1.0)}
    weights = {0: 2 / 6, 2: 2 / 6, 3: 2 / 6}
    ece = sum(weights[b] * gaps[b] for b in gaps)
    assert mf.ece(probs, labels, bins=4) == pytest.approx(ece, abs=1e-12)
    assert mf.mce(probs, labels, bins=4) == pytest.approx(0.5, abs=1e-12)  # the empty bin is not a 0 gap
    expected_rms = np.sqrt(sum(weights[b] * gaps[b] ** 2 for b in gaps))
    assert mf.rms(probs, labels, bins=4) == pytest.approx(expected_rms, abs=1e-12)
    table = mf.reliability_bins(probs, labels, 4)
    assert table["count"].tolist() == [2, 0, 2, 2]
    assert np.isnan(table["confidence"][1]) and np.isnan(table["accuracy"][1])
    assert table["lower"].tolist() == [0, 0.25, 0.5, 0.75] and table["upper"].tolist() == [0.25, 0.5, 0.75, 1.0]


def test_ece_perfectly_calibrated_and_maximally_wrong():
    probs = np.array([[1.0, 0.0]] * 5)
    assert mf.ece(probs, np.zeros(5, int)) == 0.0
    assert mf.ece(probs, np.ones(5, int)) == 1.0


def test_brier_and_nll_against_references():
    rng = np.random.default_rng(1)
    logits = rng.normal(size=(100, 5)) * 3
    probs = np.exp(logits) / np.exp(logits).sum(1, keepdims=True)
    labels = rng.integers(0, 5, 100)
    onehot = np.eye(5)[labels]
    assert mf.brier(probs, labels) == pytest.approx(((probs - onehot) ** 2).sum(1).mean(), abs=1e-12)
    assert mf.nll(probs, labels) == pytest.approx(log_loss(labels, probs, labels=range(5)), abs=1e-9)
    # a probability of exactly 0 on the label costs a finite, large amount
    assert np.isfinite(mf.nll(np.array([[1.0, 0.0]]), np.array([1])))


def test_builtin_metrics_registered_and_pass_the_plugin_contract():
    names = jemeval.names("metric")
    for name in ("auroc", "aupr_in", "aupr_out", "fpr95", "ece", "mce", "rms", "brier", "nll"):
        assert name in names
        testing.check_metric(name)
    ood = [n for n, _ in mf.registered_metrics("ood")]
    cal = [n for n, _ in mf.registered_metrics("calibration")]
    assert ood[:4] == ["auroc", "aupr_in", "aupr_out", "fpr95"]
    assert cal[:5] == ["ece", "mce", "rms", "brier", "nll"]
    assert not set(ood) & set(cal)
