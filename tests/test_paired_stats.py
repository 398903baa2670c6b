"""Paired significance tests (issue 26 item 2) against independent references, and calibrated under the null.

References: scipy's binomtest (McNemar); DeLong written from the 1988 paper's O(m n) placement values;
a plain loop bootstrap drawing one resample at a time; Holm's step-down procedure run at many levels
(and statsmodels when installed). The null simulations draw both "models" from one distribution and
count p < 0.05; the power runs plant a large difference. Rates measured are in docs/evaluation.md.
"""
from __future__ import annotations

import math

import numpy as np
import pytest
from scipy.stats import binomtest, norm, ttest_ind
from sklearn.metrics import roc_auc_score

from jemeval.errors import UsageError
from jemeval.evaluation import metrics as mf
from jemeval.evaluation import paired

ALPHA = 0.05


# -- McNemar -----------------------------------------------------------------------------------------
@pytest.mark.parametrize("b,c,same", [(0, 0, 30), (7, 7, 10), (3, 12, 100), (40, 25, 5), (0, 9, 1), (1300, 1189, 50)])
def test_mcnemar_equals_scipy_binomtest(b, c, same):
    rng = np.random.default_rng(b * 7919 + c)
    # b inputs only A gets right, c only B, `same` both right and 4 both wrong, shuffled
    a = np.r_[np.ones(b), np.zeros(c), np.ones(same), np.zeros(4)].astype(bool)
    bb = np.r_[np.zeros(b), np.ones(c), np.ones(same), np.zeros(4)].astype(bool)
    order = rng.permutation(a.size)
    out = paired.mcnemar_exact(a[order], bb[order])
    expected = 1.0 if b + c == 0 else binomtest(b, b + c, 0.5).pvalue
    assert out["p_value"] == pytest.approx(expected, abs=1e-12)
    assert (out["b"], out["c"], out["n"]) == (b, c, a.size)
    assert out["accuracy_a"] == pytest.approx((b + same) / a.size, abs=1e-15)
    assert out["difference"] == pytest.approx((b - c) / a.size, abs=1e-15)
    assert out["test"] == "mcnemar-exact"


def test_mcnemar_random_tables_equal_scipy():
    rng = np.random.default_rng(1)
    for _ in range(200):
        n = int(rng.integers(1, 400))
        a, b = rng.random(n) < rng.random(), rng.random(n) < rng.random()
        out = paired.mcnemar_exact(a.astype(int), b)  # 0/1 ints are outcomes too
        k, m = int((a & ~b).sum()), int((a ^ b).sum())
        assert out["p_value"] == pytest.approx(1.0 if m == 0 else binomtest(k, m, 0.5).pvalue, abs=1e-12)


# -- DeLong ------------------------------------------------------------------------------------------
def delong_reference(labels, a, b, level=0.95):
    """DeLong, DeLong & Clarke-Pearson (1988): psi(X, Y) = 1, 1/2, 0; V10(X_i) = mean_j psi(X_i, Y_j),
    V01(Y_j) = mean_i psi(X_i, Y_j); S10_rs = sum_i (V10_r(X_i) - theta_r)(V10_s(X_i) - theta_s) / (m - 1),
    likewise S01; var(theta_a - theta_b) = (S10_aa + S10_bb - 2 S10_ab) / m + (same with S01) / n."""
    labels = np.asarray(labels)
    components = []
    for s in (np.asarray(a, float), np.asarray(b, float)):
        x, y = s[labels == 1], s[labels == 0]
        psi = (x[:, None] > y[None, :]) + 0.5 * (x[:, None] == y[None, :])
        components.append((psi.mean(), psi.mean(axis=1), psi.mean(axis=0)))
    (ta, v10a, v01a), (tb, v10b, v01b) = components
    m, n = v10a.size, v01a.size

    def s(u, v, tu, tv, k):
        return float(np.sum((u - tu) * (v - tv)) / (k - 1))

    var = ((s(v10a, v10a, ta, ta, m) + s(v10b, v10b, tb, tb, m) - 2 * s(v10a, v10b, ta, tb, m)) / m
           + (s(v01a, v01a, ta, ta, n) + s(v01b, v01b, tb, tb, n) - 2 * s(v01a, v01b, ta, tb, n)) / n)
    z = (ta - tb) / math.sqrt(var)
    half = norm.ppf(0.5 + level / 2) * math.sqrt(var)
    return ta, tb, 2 * norm.sf(abs(z)), ta - tb - half, ta - tb + half


@pytest.mark.parametrize("decimals", [None, 1, 0])  # 0 decimals: heavy ties within and across classes
def test_delong_equals_the_papers_placement_values(decimals):
    rng = np.random.default_rng(3)
    labels = np.r_[np.ones(120), np.zeros(90)].astype(int)
    rng.shuffle(labels)
    shared = rng.normal(size=labels.size)
    a = shared + 1.2 * labels + rng.normal(0, 0.8, labels.size)
    b = 0.6 * shared + 0.7 * labels + rng.normal(0, 1.0, labels.size)
    if decimals is not None:
        a, b = np.round(a, decimals), np.round(b, decimals)
    out = paired.delong_test(labels, a, b, level=0.9)
    ta, tb, p, low, high = delong_reference(labels, a, b, level=0.9)
    assert out["auroc_a"] == pytest.approx(roc_auc_score(labels, a), abs=1e-12)
    assert out["auroc_b"] == pytest.approx(roc_auc_score(labels, b), abs=1e-12)
    for key, ref in [("auroc_a", ta), ("auroc_b", tb), ("p_value", p), ("ci_low", low), ("ci_high", high)]:
        assert out[key] == pytest.approx(ref, abs=1e-9), key
    assert out["difference"] == pytest.approx(ta - tb, abs=1e-12)
    assert (out["n_pos"], out["n_neg"], out["test"]) == (120, 90, "delong")


def test_delong_identical_scores_and_midranks():
    labels = np.array([1, 1, 0, 0, 1, 0])
    s = np.array([0.9, 0.5, 0.5, 0.1, 0.7, 0.5])
    out = paired.delong_test(labels, s, s.copy())
    assert (out["difference"], out["p_value"], out["ci_low"], out["ci_high"]) == (0.0, 1.0, 0.0, 0.0)
    x = np.array([3.0, 1.0, 3.0, 2.0, 3.0, 1.0])
    assert paired.midranks(x).tolist() == [5.0, 1.5, 5.0, 3.0, 5.0, 1.5]


# -- the paired bootstrap ----------------------------------------------------------------------------
def bootstrap_reference(metric, a, b, n_boot, seed, level=0.95):
    """One resample at a time: rng.integers(0, n, n), metric on both, the difference."""
    rng = np.random.default_rng(seed)
    n = len(a[0])
    d = metric(*a) - metric(*b)
    deltas = []
    for _ in range(n_boot):
        idx = rng.integers(0, n, size=n)
        deltas.append(metric(*[x[idx] for x in a]) - metric(*[x[idx] for x in b]))
    deltas = np.array(deltas)
    p = (1 + sum(abs(x - d) >= abs(d) for x in deltas)) / (n_boot + 1)
    return d, np.quantile(deltas, 0.5 - level / 2), np.quantile(deltas, 0.5 + level / 2), p


def _probs(rng, n, k=3, noise=1.0, shared=None):
    logits = (shared if shared is not None else rng.normal(0, 2, (n, k))) + rng.normal(0, noise, (n, k))
    e = np.exp(logits - logits.max(axis=1, keepdims=True))
    return e / e.sum(axis=1, keepdims=True)


def test_bootstrap_equals_a_plain_loop_across_chunks():
    rng = np.random.default_rng(5)
    n = 150
    labels = rng.integers(0, 3, n)
    shared = rng.normal(0, 2, (n, 3))
    a, b = (_probs(rng, n, shared=shared), labels), (_probs(rng, n, noise=1.5, shared=shared), labels)
    n_boot = paired.CHUNK + 237  # crosses a chunk boundary: the chunks must continue one stream
    out = paired.paired_bootstrap(mf.ece, a, b, n_boot=n_boot, seed=11, level=0.9)
    d, low, high, p = bootstrap_reference(mf.ece, a, b, n_boot, 11, level=0.9)
    assert out["difference"] == pytest.approx(d, abs=1e-12)
    assert (out["ci_low"], out["ci_high"], out["p_value"]) == pytest.approx((low, high, p), abs=1e-12)
    assert out["value_a"] == pytest.approx(mf.ece(*a), abs=1e-15)
    assert (out["n_boot"], out["seed"], out["test"]) == (n_boot, 11, "paired-bootstrap")
    again = paired.paired_bootstrap(mf.ece, a, b, n_boot=n_boot, seed=11, level=0.9)
    assert again == out  # deterministic for a seed
    other = paired.paired_bootstrap(mf.ece, a, b, n_boot=n_boot, seed=12, level=0.9)
    assert (other["ci_low"], other["ci_high"]) != (out["ci_low"], out["ci_high"])


def _nll_batched(probs, labels):
    """NLL per resample: probs (r, n, K), labels (r, n) -> (r,)."""
    return -np.log(np.take_along_axis(probs, labels[..., None], axis=-1)[..., 0]).mean(axis=-1)


def test_vectorized_metric_equals_the_loop():
    rng = np.random.default_rng(6)
    n, labels = 80, rng.integers(0, 3, 80)
    a, b = (_probs(rng, n), labels), (_probs(rng, n), labels)
    out = paired.paired_bootstrap(_nll_batched, a, b, n_boot=300, seed=2, vectorized=True)
    d, low, high, p = bootstrap_reference(mf.nll, a, b, 300, 2)
    assert (out["difference"], out["ci_low"], out["ci_high"], out["p_value"]) == pytest.approx(
        (d, low, high, p), abs=1e-12)


# -- Holm ----------------------------------------------------------------------------------------------
def test_holm_by_hand():
    # sorted 0.005, 0.01, 0.03, 0.04 -> x4, x3, x2, x1 = 0.02, 0.03, 0.06, 0.04 -> running max 0.06
    assert paired.holm([0.01, 0.04, 0.03, 0.005]) == pytest.approx([0.03, 0.06, 0.06, 0.02], abs=1e-15)
    assert paired.holm([0.3, 0.9, 0.2]) == pytest.approx([0.6, 0.9, 0.6], abs=1e-15)
    assert paired.holm([0.5, 0.6]) == [1.0, 1.0]  # capped at 1
    assert paired.holm([0.04]) == [0.04] and paired.holm([]) == []


def _step_down(p, alpha):
    """Holm (1979): reject the smallest p while p_(i) <= alpha / (m - i + 1), stop at the first that is not."""
    rejected = set()
    for i, j in enumerate(np.argsort(p, kind="mergesort")):
        if p[j] > alpha / (len(p) - i):
            break
        rejected.add(int(j))
    return rejected


def test_holm_adjusted_p_is_the_step_down_procedure_at_every_level():
    rng = np.random.default_rng(7)
    for _ in range(200):
        p = rng.random(int(rng.integers(1, 12))) ** 3
        p[rng.random(p.size) < 0.2] = p[0]  # ties
        adjusted = np.array(paired.holm(p))
        assert np.all(adjusted >= p) and np.all(adjusted <= 1)
        assert np.all(np.diff(adjusted[np.argsort(p, kind="mergesort")]) >= 0)  # monotone
        for alpha in (0.001, 0.01, 0.05, 0.1, 0.3):
            assert {int(i) for i in np.flatnonzero(adjusted <= alpha)} == _step_down(p, alpha)


def test_holm_equals_statsmodels():
    from statsmodels.stats import multitest  # the library Holm is checked against (test extra)

    rng = np.random.default_rng(8)
    for size in (1, 2, 5, 15, 40):
        p = rng.random(size) ** 2
        p[: size // 3] = p[-1]  # ties
        assert paired.holm(p) == pytest.approx(multitest.multipletests(p, method="holm")[1], abs=1e-15)


# -- seed groups ---------------------------------------------------------------------------------------
def test_pooled_groups_seed_mean_and_between_seeds():
    rng = np.random.default_rng(9)
    n, labels = 60, rng.integers(0, 3, 60)
    runs_a = [(_probs(rng, n), labels) for _ in range(3)]
    runs_b = [(_probs(rng, n), labels) for _ in range(2)]
    a, b = paired.pooled_groups(runs_a, runs_b)
    assert a[0].shape == (n, 3, 3) and b[1].shape == (n, 2)
    metric = paired.seed_mean(mf.nll)
    assert metric(*a) == pytest.approx(np.mean([mf.nll(*r) for r in runs_a]), abs=1e-12)
    out = paired.paired_bootstrap(metric, a, b, n_boot=50, seed=0)
    assert out["difference"] == pytest.approx(np.mean([mf.nll(*r) for r in runs_a])
                                              - np.mean([mf.nll(*r) for r in runs_b]), abs=1e-12)
    va, vb = [0.97, 0.975, 0.982], [0.961, 0.969]
    check = paired.between_seeds(va, vb)
    assert check["p_value"] == pytest.approx(ttest_ind(va, vb, equal_var=False).pvalue, abs=1e-12)
    assert check["sd_a"] == pytest.approx(np.std(va, ddof=1)) and check["n_b"] == 2
    assert math.isnan(paired.between_seeds([0.97], vb)["p_value"])  # one seed: the spread is unknown


# -- the attacks: inputs that do not pair up are refused in one line -----------------------------------
@pytest.mark.parametrize("call,words", [
    (lambda: paired.mcnemar_exact([1, 0, 1], [1, 0]), "paired"),  # one model evaluated on fewer inputs
    (lambda: paired.mcnemar_exact([1, 2, 0], [1, 0, 1]), "0/1"),  # counts passed for outcomes
    (lambda: paired.delong_test([1, 0, 1, 0], [1, 2, 3, 4], [1, 2, 3]), "paired"),
    (lambda: paired.delong_test([1, 0, 1, 0], [1, np.nan, 3, 4], [1, 2, 3, 4]), "non-finite"),
    (lambda: paired.delong_test([1, 0, 2, 0], [1, 2, 3, 4], [1, 2, 3, 4]), "labels"),
    (lambda: paired.delong_test([1, 0, 0, 0], [1, 2, 3, 4], [1, 2, 3, 4]), "at least 2"),
    (lambda: paired.delong_test([1, 0, 1, 0], [1, 2, 3, 4], [1, 2, 3, 4], level=95), "level"),
    (lambda: paired.paired_bootstrap(mf.nll, (np.ones((5, 2)) / 2, np.zeros(5, int)),
                                     (np.ones((4, 2)) / 2, np.zeros(4, int))), "same inputs"),
    (lambda: paired.paired_bootstrap(mf.nll, (np.ones((5, 2)) / 2, np.zeros(5, int)),
                                     (np.ones((5, 2)) / 2, np.zeros(5, int)), n_boot=0), "n_boot"),
    (lambda: paired.paired_bootstrap(lambda s, y: mf.auroc(s[y == 1], s[y == 0]),
                                     (np.arange(4.0), np.array([1, 0, 0, 0])),
                                     (np.arange(4.0), np.array([1, 0, 0, 0])), n_boot=20), "non-finite"),
    (lambda: paired.holm([0.01, 1.5]), "between 0 and 1"),
    (lambda: paired.pooled_groups([(np.ones(5),), (np.ones(4),)], [(np.ones(5),)]), "same inputs"),
])
@pytest.mark.filterwarnings("ignore::sklearn.exceptions.UndefinedMetricWarning")  # the AUROC case
def test_unpaired_inputs_are_refused_in_one_line(call, words):
    with pytest.raises(UsageError) as info:
        call()
    message = str(info.value)
    assert words in message and "\n" not in message and info.value.param


# -- calibrated under the null, powerful against a planted difference -------------------------------------
def _rate(p_values):
    return float(np.mean(np.asarray(p_values) < ALPHA))


def _at_or_below_level(rate, reps):
    return rate <= ALPHA + 3 * math.sqrt(ALPHA * (1 - ALPHA) / reps)  # three binomial standard errors


def _mcnemar_rates(reps=1000, n=200):
    rng = np.random.default_rng(100)
    null, power = [], []
    for _ in range(reps):
        p = rng.beta(4, 1.5, n)  # per-input difficulty shared by both models
        null.append(paired.mcnemar_exact(rng.random(n) < p, rng.random(n) < p)["p_value"])
        power.append(paired.mcnemar_exact(rng.random(n) < p, rng.random(n) < p - 0.15)["p_value"])
    return _rate(null), _rate(power)


def _delong_rates(reps=500, n=200):
    rng = np.random.default_rng(200)
    null, power = [], []
    for _ in range(reps):
        labels = (rng.random(n) < 0.5).astype(int)
        shared = rng.normal(size=n)  # the inputs both models find hard
        a, b = (shared + 1.0 * labels + rng.normal(0, 0.7, n) for _ in range(2))
        null.append(paired.delong_test(labels, a, b)["p_value"])
        weak = shared + 0.4 * labels + rng.normal(0, 0.7, n)
        power.append(paired.delong_test(labels, a, weak)["p_value"])
    return _rate(null), _rate(power)


def _ece_batched(conf, correct, bins=15):
    """ECE per resample from per-input confidence and correctness (r, n) -> (r,): the equal-width
    bins of metrics.ece, all resamples in one bincount."""
    index = np.arange(conf.shape[0])[:, None] * bins + mf.bin_index(conf, bins)
    gap = np.bincount(index.ravel(), (correct - conf).ravel(), conf.shape[0] * bins).reshape(-1, bins)
    return np.abs(gap).sum(axis=-1) / conf.shape[1]


def _conf_correct(probs, labels):
    return probs.max(axis=1), (probs.argmax(axis=1) == labels).astype(np.float64)


def _bootstrap_rates(metric, per_input, reps=300, n=200):
    """Labels drawn from softmax(shared): a model softmax(shared + noise) is near calibrated and one
    with 3x the logits overconfident (a planted ECE and NLL difference)."""
    rng = np.random.default_rng(300)
    null, power = [], []
    for r in range(reps):
        shared = rng.normal(0, 1.5, (n, 3))
        truth = _probs(rng, n, noise=0.0, shared=shared)
        labels = (rng.random((n, 1)) > truth.cumsum(axis=1)).sum(axis=1)
        a, b = (per_input(_probs(rng, n, noise=0.5, shared=shared), labels) for _ in range(2))
        null.append(paired.paired_bootstrap(metric, a, b, n_boot=400, seed=r, vectorized=True)["p_value"])
        sharp = per_input(_probs(rng, n, noise=0.5, shared=3 * shared), labels)
        power.append(paired.paired_bootstrap(metric, a, sharp, n_boot=400, seed=r, vectorized=True)["p_value"])
    return _rate(null), _rate(power)


def test_batched_ece_is_metrics_ece():
    rng = np.random.default_rng(4)
    probs, labels = _probs(rng, 300), rng.integers(0, 3, 300)
    conf, correct = _conf_correct(probs, labels)
    assert _ece_batched(np.stack([conf, conf[::-1]]), np.stack([correct, correct[::-1]])) == pytest.approx(
        [mf.ece(probs, labels, bins=15)] * 2, abs=1e-12)


@pytest.mark.parametrize("name,simulate,reps", [
    ("mcnemar", _mcnemar_rates, 1000),
    ("delong", _delong_rates, 500),
    ("bootstrap-nll", lambda: _bootstrap_rates(_nll_batched, lambda p, y: (p, y)), 300),
    ("bootstrap-ece", lambda: _bootstrap_rates(_ece_batched, _conf_correct), 300),
])
def test_calibrated_under_the_null_and_powerful(name, simulate, reps):
    null_rate, power = simulate()
    print(f"{name}: rate of p < {ALPHA} under the null {null_rate:.3f} ({reps} repetitions), power {power:.3f}")
    assert _at_or_below_level(null_rate, reps), (name, null_rate)
    assert power >= 0.8, (name, power)
