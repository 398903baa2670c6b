"""Issue 27 item 2: adaptive (equal-mass) ECE, class-wise ECE, the debiased L2 calibration error and
the equal-mass reliability table.

Every number is checked against two independent implementations on the same inputs: Kumar et al.'s
reference package ``uncertainty-calibration`` (module ``calibration``, the test extra) and plain
Python written here from the papers' formulas, one example and one bin at a time. The edge cases
(ties at a cut, n not divisible by B, more bins than examples, a class never predicted) are
computed by hand as well. torchmetrics is not used: it is not a dependency, and its
MulticlassCalibrationError is the top-label equal-width ECE only (bins [lo, hi), float32).
"""
from __future__ import annotations

import json
from fractions import Fraction

import numpy as np
import pytest
from test_bad_inputs import assert_one_line_refusal, runner, snapshot

from jemeval.cli import cli
from jemeval.errors import UsageError
from jemeval.evaluation import metrics as mf
from jemeval.evaluation.calibration import calibrate, softmax64

NEW = ("adaptive-ece", "classwise-ece", "debiased-l2")


# -- plain references, from the papers' formulas ----------------------------------------------------
def _equal_mass_bins(conf, bins):
    """Bin number of every example: sorted confidences cut into min(B, n) runs of floor(n/B) (the
    first n mod B one more), each cut the midpoint of the values either side, bins (cut_i, cut_i+1],
    equal cuts merged (so a tie across a cut falls in the lower bin)."""
    order = sorted(float(c) for c in conf)
    n, parts = len(order), min(bins, len(order))
    sizes = [n // parts + (1 if i < n % parts else 0) for i in range(parts)]
    ends = np.cumsum(sizes)
    cuts = sorted({(order[e - 1] + order[e]) / 2.0 for e in ends[:-1]} | {1.0})
    return [next(i for i, cut in enumerate(cuts) if c <= cut) for c in conf], len(cuts)


def _plugin(values, targets, assign, nbins, power=1, debias=False):
    """sum_b n_b/N |mean target - mean value|^power (debias: minus acc(1-acc)/(n_b-1), bins >= 2)."""
    total = 0.0
    for b in range(nbins):
        members = [i for i, a in enumerate(assign) if a == b]
        if not members or (debias and len(members) < 2):
            continue
        acc = sum(float(targets[i]) for i in members) / len(members)
        conf = sum(float(values[i]) for i in members) / len(members)
        term = abs(acc - conf) ** power
        if debias:
            term -= acc * (1 - acc) / (len(members) - 1)
        total += len(members) / len(values) * term
    return total


def ref_adaptive_ece(probs, labels, bins):
    conf, correct = probs.max(1), probs.argmax(1) == labels
    assign, nbins = _equal_mass_bins(conf, bins)
    return _plugin(conf, correct, assign, nbins)


def ref_debiased_l2(probs, labels, bins):
    conf, correct = probs.max(1), probs.argmax(1) == labels
    assign, nbins = _equal_mass_bins(conf, bins)
    return max(_plugin(conf, correct, assign, nbins, power=2, debias=True), 0.0) ** 0.5


def ref_classwise_ece(probs, labels, bins):
    """Kull et al. 2019: (1/K) sum_k sum_b n_bk/N |freq of y=k - mean p_k|, exact rational edges (lo, hi]."""
    per_class = []
    for k in range(probs.shape[1]):
        assign = []
        for p in probs[:, k]:
            exact = Fraction(float(p))
            assign.append(next(b for b in range(bins) if exact <= Fraction(b + 1, bins)))
        per_class.append(_plugin(probs[:, k], labels == k, assign, bins))
    return sum(per_class) / len(per_class)


def _kumar():
    return pytest.importorskip("calibration", reason="the test extra's uncertainty-calibration (Kumar et al.)")


def kumar_all(probs, labels, bins):
    kc = _kumar()
    return {
        "adaptive-ece": kc.get_ece_em(probs, labels, num_bins=bins),
        "classwise-ece": kc.get_ece(probs, labels, num_bins=bins, mode="marginal"),
        "debiased-l2": kc.lower_bound_scaling_top_ce(probs, labels, p=2, debias=True, num_bins=bins,
                                                     binning_scheme=kc.get_equal_bins),
        "ece": kc.get_ece(probs, labels, num_bins=bins),
    }


def ours(probs, labels, bins):
    return {"adaptive-ece": mf.adaptive_ece(probs, labels, bins),
            "classwise-ece": mf.classwise_ece(probs, labels, bins),
            "debiased-l2": mf.debiased_l2(probs, labels, bins), "ece": mf.ece(probs, labels, bins)}


def _cases():
    rng = np.random.default_rng(27)
    out = []
    for n, k, bins, scale in [(1000, 10, 15, 3.0), (997, 5, 20, 2.0), (50, 3, 7, 1.0), (10, 4, 20, 4.0),
                              (301, 2, 10, 0.5)]:
        logits = rng.normal(size=(n, k)) * scale
        probs = softmax64(logits)
        labels = np.array([rng.choice(k, p=row) for row in softmax64(logits * 0.7)])
        out.append(pytest.param(probs, labels, bins, id=f"n{n}-k{k}-b{bins}"))
    # heavy ties, at cuts too: probabilities on a grid of 0.05 (rows need not sum to 1 for the metrics)
    probs = np.round(softmax64(rng.normal(size=(403, 4)) * 2) * 20) / 20
    out.append(pytest.param(probs, rng.integers(0, 4, 403), 12, id="ties-on-a-grid"))
    # a class never predicted and never a label (p_3 = 0.01 everywhere), confident predictions tied at 1.0
    probs = np.column_stack([softmax64(rng.normal(size=(211, 3)) * 6) * 0.99, np.full(211, 0.01)])
    probs[:40] = [0.99, 0.0, 0.0, 0.01]
    out.append(pytest.param(probs, rng.integers(0, 3, 211), 20, id="class-never-predicted"))
    return out


@pytest.mark.parametrize("probs, labels, bins", _cases())
def test_equal_to_kumar_and_to_the_formulas(probs, labels, bins):
    got = ours(probs, labels, bins)
    assert got["adaptive-ece"] == pytest.approx(ref_adaptive_ece(probs, labels, bins), abs=1e-12)
    assert got["classwise-ece"] == pytest.approx(ref_classwise_ece(probs, labels, bins), abs=1e-12)
    assert got["debiased-l2"] == pytest.approx(ref_debiased_l2(probs, labels, bins), abs=1e-12)
    reference = kumar_all(probs, labels, bins)
    for name, value in reference.items():
        assert got[name] == pytest.approx(value, abs=1e-6), name


def _binary(conf, correct):
    """Two-class rows of confidence ``conf`` (>= 0.5, predicting class 0), labelled to be right or wrong."""
    conf = np.asarray(conf, dtype=np.float64)
    return np.column_stack([conf, 1 - conf]), np.where(np.asarray(correct, bool), 0, 1)


def test_ties_at_a_cut_and_n_not_divisible_by_the_bins():
    # n = 7, B = 3: runs of 3, 2, 2 -> [0.6 0.7 0.7] [0.7 0.8] [0.9 0.95]; cuts 0.7 (a tie) and 0.85.
    # The three 0.7s all go to the lower bin: counts 4, 1, 2 (not 3, 2, 2).
    probs, labels = _binary([0.6, 0.7, 0.7, 0.7, 0.8, 0.9, 0.95], [1, 0, 1, 1, 0, 1, 1])
    table = mf.reliability_bins(probs, labels, 3, "equal-mass")
    assert table["count"].tolist() == [4, 1, 2]
    assert table["lower"].tolist() == pytest.approx([0.0, 0.7, 0.85], abs=1e-15)
    assert table["upper"].tolist() == pytest.approx([0.7, 0.85, 1.0], abs=1e-15)
    np.testing.assert_allclose(table["confidence"], [0.675, 0.8, 0.925], atol=1e-15)
    np.testing.assert_allclose(table["accuracy"], [0.75, 0.0, 1.0], atol=1e-15)
    assert mf.adaptive_ece(probs, labels, 3) == pytest.approx((4 * 0.075 + 0.8 + 2 * 0.075) / 7, abs=1e-15)
    # debiased: bin 0 (0.075^2 - 0.75*0.25/3) < 0, bin 1 has one example (adds 0), bin 2 0.075^2: the sum is < 0
    assert mf.debiased_l2(probs, labels, 3) == 0.0
    for name, value in kumar_all(probs, labels, 3).items():
        assert ours(probs, labels, 3)[name] == pytest.approx(value, abs=1e-12), name


def test_all_tied_merges_cuts_and_leaves_an_empty_bin():
    probs, labels = _binary([0.5] * 4, [1, 0, 1, 0])
    table = mf.reliability_bins(probs, labels, 2, "equal-mass")
    assert table["count"].tolist() == [4, 0] and np.isnan(table["accuracy"][1])
    assert mf.adaptive_ece(probs, labels, 2) == 0.0 and mf.adaptive_ece(probs, labels, 5) == 0.0
    # more bins than examples: one example per bin, here each bin's gap is |correct - conf|
    probs, labels = _binary([0.6, 0.8, 0.9], [0, 1, 1])
    assert mf.reliability_bins(probs, labels, 20, "equal-mass")["count"].tolist() == [1, 1, 1]
    assert mf.adaptive_ece(probs, labels, 20) == pytest.approx((0.6 + 0.2 + 0.1) / 3, abs=1e-15)


def test_debiased_l2_by_hand():
    # n = 6, B = 2: bins [0.6 0.6 0.7] and [0.9 0.9 0.9]; accuracies 0 and 2/3
    probs, labels = _binary([0.6, 0.6, 0.7, 0.9, 0.9, 0.9], [0, 0, 0, 1, 1, 0])
    acc, conf = np.array([0.0, 2 / 3]), np.array([1.9 / 3, 0.9])
    squared = np.sum(0.5 * ((conf - acc) ** 2 - acc * (1 - acc) / 2))
    assert squared > 0
    assert mf.debiased_l2(probs, labels, 2) == pytest.approx(np.sqrt(squared), abs=1e-15)
    plugin = np.sqrt(np.sum(0.5 * (conf - acc) ** 2))
    assert mf.debiased_l2(probs, labels, 2) < plugin  # the plug-in estimate is biased upwards


def test_classwise_ece_by_hand_with_values_on_edges_and_a_class_never_predicted():
    # B = 4. class 0: 0.25 (y != 0) in bin 0, 0.5 (y != 0) in bin 1, 0.75 (y = 0) in bin 2: gaps 0.25, 0.5, 0.25
    # class 1 mirrors it; class 2 (never predicted, never a label) is 0 everywhere: a gap of 0
    probs = np.array([[0.75, 0.25, 0.0], [0.5, 0.5, 0.0], [0.25, 0.75, 0.0]])
    labels = np.array([0, 1, 1])
    assert mf.classwise_ece(probs, labels, 4) == pytest.approx((1 / 3 + 1 / 3 + 0) / 3, abs=1e-15)
    assert mf.classwise_ece(probs, labels, 4) == pytest.approx(ref_classwise_ece(probs, labels, 4), abs=1e-15)
    # a class that is never the label but always gets probability 0.3 is miscalibrated by 0.3
    probs = np.array([[0.7, 0.3], [0.7, 0.3]])
    assert mf.classwise_ece(probs, np.array([0, 0]), 10) == pytest.approx(0.3, abs=1e-15)


def test_registered_opt_in_and_listed():
    names = [name for name, _ in mf.registered_metrics("calibration")]
    assert names[:8] == ["ece", "mce", "rms", "brier", "nll", *NEW]
    assert [name for name, _ in mf.select_metrics("calibration")] == ["ece", "mce", "rms", "brier", "nll"]
    assert [name for name, _ in mf.select_metrics("calibration", ["debiased-l2", "ece"])] == ["debiased-l2", "ece"]
    with pytest.raises(UsageError, match="did you mean 'adaptive-ece'"):
        mf.select_metrics("calibration", ["adaptiv-ece"])
    listed = runner().invoke(cli, ["list", "metrics"])
    assert listed.exit_code == 0 and all(name in listed.stdout for name in NEW), listed.output


# -- calibrate(), the command and the figure ---------------------------------------------------------
def _table_ece(rows, n):
    return sum(r["count"] / n * abs(r["accuracy"] - r["confidence"]) for r in rows if r["count"])


def test_calibrate_reports_the_new_metrics_and_equal_mass_bins(clf, reference):
    probs, labels = reference
    result = calibrate(clf, bins=15, metrics=["ece", *NEW], bins_strategy="equal-mass", temperature_scaling=True,
                       progress=False, device="cpu")
    raw, scaled = result.records
    for name, value in kumar_all(probs, labels, 15).items():
        assert raw[name] == pytest.approx(value, abs=1e-6), name
    settings = result.provenance["settings"]
    assert settings["bins"] == 15 and settings["bins_strategy"] == "equal-mass"
    assert settings["binning"] == {"ece": "uniform", "adaptive-ece": "equal-mass",
                                   "classwise-ece": "uniform, per class", "debiased-l2": "equal-mass"}
    for record in (raw, scaled):  # the table is the adaptive ECE's own bins, each record at its own T
        assert _table_ece(record["bins"], record["n"]) == pytest.approx(record["adaptive-ece"], abs=1e-12)
        assert len(record["bins"]) <= 15 and record["bins"][0]["lower"] == 0.0 and record["bins"][-1]["upper"] == 1.0
    uniform = calibrate(clf, bins=15, progress=False, device="cpu")
    assert uniform.provenance["settings"]["bins_strategy"] == "uniform"
    assert [b["upper"] for b in uniform.records[0]["bins"]] == pytest.approx([(i + 1) / 15 for i in range(15)])
    assert not set(NEW) & set(uniform.records[0])  # not reported unless named


def test_plot_follows_the_equal_mass_bins(clf, tmp_path, monkeypatch):
    from jemeval.plots import calibration as plots

    figures = []
    monkeypatch.setattr(plots, "save_figure", lambda fig, path: figures.append(fig))
    result = calibrate(clf, bins=8, metrics=["adaptive-ece"], bins_strategy="equal-mass", progress=False, device="cpu")
    plots.plot_calibration_result(result, tmp_path / "r.png")
    (fig,) = figures
    top, bottom = fig.axes[0], fig.axes[1]
    assert "equal-mass bins" in bottom.get_xlabel() and "ADAPTIVE-ECE" in top.get_title()
    widths = sorted(round(p.get_width(), 12) for p in bottom.patches)
    expected = sorted(round(b["upper"] - b["lower"], 12) for b in result.records[0]["bins"])
    assert widths == expected and len(set(widths)) > 1  # each bar spans its own bin
    (dots,) = [line for line in top.lines if line.get_marker() == "o"]  # where each bin's examples sit
    assert list(dots.get_xdata()) == [b["confidence"] for b in result.records[0]["bins"] if b["count"]]


def test_cli_metrics_and_strategy(digits_classifier_ckpt, reference, tmp_path):
    probs, labels = reference
    r = runner().invoke(cli, ["calibrate", "--model", digits_classifier_ckpt, "--metric", ",".join(NEW), "--bins", "10",
                              "--bins-strategy", "equal-mass", "--plot", str(tmp_path / "r.png"), "--json",
                              "--device", "cpu"])
    assert r.exit_code == 0, r.output
    data = json.loads(r.stdout)
    record = data["records"][0]
    for name, value in kumar_all(probs, labels, 10).items():
        if name in NEW:
            assert record[name] == pytest.approx(value, abs=1e-6), name
    assert data["provenance"]["settings"]["bins_strategy"] == "equal-mass"
    assert (tmp_path / "r.png").read_bytes()[:4] == b"\x89PNG"


@pytest.mark.parametrize("args, expected", [
    (["--bins-strategy", "quantile"], "--bins-strategy"),
    (["--metric", "adaptiv-ece"], "did you mean 'adaptive-ece'"),
    (["--metric", "debiased-l2", "--bins", "0"], "--bins must be >= 1"),
])
def test_cli_refuses_in_one_line_and_writes_nothing(digits_classifier_ckpt, tmp_path, monkeypatch, args, expected):
    import shutil

    shutil.copy(digits_classifier_ckpt, tmp_path / "m.pt")
    monkeypatch.chdir(tmp_path)
    before = snapshot(tmp_path)
    r = runner().invoke(cli, ["calibrate", "--model", "m.pt", *args, "--plot", "r.png", "--json", "--device", "cpu"])
    assert_one_line_refusal(r, expected)
    assert snapshot(tmp_path) == before


def test_python_api_refuses_an_unknown_strategy_before_any_work():
    from jemeval import testing

    with pytest.raises(UsageError, match="bins_strategy must be one of uniform, equal-mass") as info:
        calibrate(testing.tiny_model(input_shape=(1, 8, 8)), "digits", bins_strategy="quantile", progress=False,
                  device="cpu")
    assert info.value.param == "bins_strategy"
    with pytest.raises(ValueError, match="unknown binning strategy"):
        mf.reliability_bins(np.eye(2), np.array([0, 1]), 2, "quantile")
