"""`jemeval calibrate`: metrics from the model's logits, the per-bin table, temperature scaling, CLI."""
from __future__ import annotations

import json
from fractions import Fraction

import numpy as np
import pytest
from click.testing import CliRunner
from scipy.optimize import minimize_scalar

import jemeval
from jemeval.cli import cli
from jemeval.errors import UsageError
from jemeval.evaluation.calibration import calibrate, fit_temperature, softmax64
from jemeval.plots.calibration import plot_calibration_result


def run(*args):
    return CliRunner().invoke(cli, [str(a) for a in args])


def _hand_ece(probs, labels, bins):
    """ECE with exact rational bin edges, one bin at a time: (lo, hi], 0 in the first bin."""
    conf, correct = probs.max(1), probs.argmax(1) == labels
    total, table = 0.0, []
    for b in range(bins):
        lo, hi = Fraction(b, bins), Fraction(b + 1, bins)
        mask = np.array([(Fraction(c) > lo or (b == 0 and c == 0)) and Fraction(c) <= hi for c in conf])
        table.append(int(mask.sum()))
        if mask.any():
            total += mask.mean() * abs(correct[mask].mean() - conf[mask].mean())
    return total, table


def test_calibrate_matches_hand_computation(clf, reference):
    probs, labels = reference
    result = calibrate(clf, progress=False)
    (record,) = result.records
    assert {"ece", "mce", "rms", "brier", "nll", "accuracy", "n", "bins"} <= set(record)
    ece, counts = _hand_ece(probs, labels, 20)
    assert record["ece"] == pytest.approx(ece, abs=1e-6)
    assert [b["count"] for b in record["bins"]] == counts and record["n"] == 450 == sum(counts)
    assert record["accuracy"] == pytest.approx(np.mean(probs.argmax(1) == labels))
    assert record["nll"] == pytest.approx(-np.log(probs[np.arange(450), labels]).mean(), abs=1e-6)
    assert record["brier"] == pytest.approx(((probs - np.eye(10)[labels]) ** 2).sum(1).mean(), abs=1e-6)
    for b in record["bins"]:
        assert set(b) == {"lower", "upper", "count", "confidence", "accuracy"}
        if b["count"] == 0:  # empty bins carry no value, not a perfect calibration
            assert b["confidence"] is None and b["accuracy"] is None
    assert result.provenance["settings"]["sigma"] == 0.0 and result.provenance["settings"]["bins"] == 20


def test_fit_temperature_matches_scipy():
    rng = np.random.default_rng(0)
    logits = rng.normal(size=(2000, 5)) * 4
    true_t = 2.5
    p = softmax64(logits, true_t)
    labels = np.array([rng.choice(5, p=row) for row in p])

    def nll(t):
        q = softmax64(logits, t)
        return -np.log(q[np.arange(len(labels)), labels]).mean()

    best = minimize_scalar(nll, bounds=(0.05, 20), method="bounded", options={"xatol": 1e-8}).x
    t = fit_temperature(logits, labels)
    assert t == pytest.approx(best, rel=1e-4)
    assert t == pytest.approx(true_t, rel=0.15)


def test_fit_temperature_stays_bounded_on_a_perfectly_classified_set():
    from jemeval.evaluation.calibration import TEMPERATURE_BOUNDS, temperature_at_bound

    logits = np.array([[0.5, 0.0], [0.0, 0.3], [0.4, 0.0]])
    labels = np.array([0, 1, 0])  # all correct: NLL decreases monotonically as T -> 0
    t = fit_temperature(logits, labels)
    assert t == pytest.approx(TEMPERATURE_BOUNDS[0], rel=1e-3) and temperature_at_bound(t)


def test_temperature_scaling_reported_beside_raw(clf, tmp_path):
    plot = tmp_path / "rel.png"
    result = calibrate(clf, temperature_scaling=True, bins=10, progress=False)
    plot_calibration_result(result, plot)
    raw, scaled = result.records
    assert raw["calibration"] == "none" and raw["temperature"] == 1.0
    assert scaled["calibration"] == "temperature" and scaled["temperature"] > 0
    assert scaled["accuracy"] == raw["accuracy"]  # dividing logits by T keeps every prediction
    assert len(scaled["bins"]) == 10
    validation = result.provenance["settings"]["validation"]
    assert validation["n"] == 269 and "train" in validation["source"]  # 20% of the 1,347 training images
    assert result.notes  # warns that T was fitted on images the model may have trained on
    assert plot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_cli_json_csv_and_bin_table(digits_classifier_ckpt, tmp_path):
    r = run("calibrate", "--model", digits_classifier_ckpt, "--bins", 5, "--json", "--sigma", 0.03, "--device", "cpu")
    assert r.exit_code == 0, r.output
    data = json.loads(r.stdout)
    assert len(data["records"][0]["bins"]) == 5 and data["provenance"]["settings"]["sigma"] == 0.03
    csv = tmp_path / "cal.csv"
    r = run("calibrate", "--model", digits_classifier_ckpt, "--n", 100, "--csv", csv, "--device", "cpu")
    assert r.exit_code == 0, r.output
    assert "ece" in r.stdout and "lower" in r.stdout and "count" in r.stdout  # summary, then the per-bin table
    header = [line for line in csv.read_text().splitlines() if not line.startswith("#")][0]
    assert header.startswith("calibration,temperature,ece,mce,rms,brier,nll,accuracy,n") and "bins" not in header


def test_plugin_calibration_metrics_are_opt_in(digits_classifier_ckpt, tmp_path, reference):
    """An installed plugin's metric changes no default output; --metric names it (and picks built-ins)."""
    from jemeval import testing

    class Plugin:
        @jemeval.hookimpl
        def register_metrics(self, register):
            @jemeval.calibration_metric
            def test_mean_confidence(probs, labels):
                return float(np.max(probs, axis=1).mean())

            register("test-mean-confidence", test_mean_confidence)

    with testing.registered_plugin(Plugin(), name="test-cal-plugin"):
        default = run("calibrate", "--model", digits_classifier_ckpt, "--device", "cpu", "--json")
        named = run("calibrate", "--model", digits_classifier_ckpt, "--metric", "ece,test-mean-confidence",
                    "--no-bins", "--plot", tmp_path / "r.png", "--device", "cpu")
        typo = run("calibrate", "--model", digits_classifier_ckpt, "--metric", "test-mean-confidense",
                   "--device", "cpu")
    record = json.loads(default.stdout)["records"][0]
    assert [k for k in record if k not in ("calibration", "temperature")] == [
        "ece", "mce", "rms", "brier", "nll", "accuracy", "n", "bins"]
    assert named.exit_code == 0, named.output
    header, row = named.stdout.splitlines()[:2]
    assert header.split() == ["calibration", "temperature", "ece", "accuracy", "n", "test-mean-confidence"]
    probs, _ = reference
    assert float(row.split()[-1]) == pytest.approx(probs.max(1).mean(), abs=1e-4)
    assert (tmp_path / "r.png").exists()  # the diagram copes with a metric subset without mce
    assert typo.exit_code == 2 and "did you mean 'test-mean-confidence'" in typo.output


@pytest.mark.parametrize("args, message", [
    (["--data", "uniform"], "needs a labelled dataset"),
    (["--data", "digts"], "did you mean 'digits'"),
    (["--bins", "0"], "--bins must be >= 1"),
    (["--plot", "x.jpg"], "--plot must be a .png file"),
])
@pytest.mark.any_device
def test_cli_usage_errors(digits_classifier_ckpt, args, message):
    r = run("calibrate", "--model", digits_classifier_ckpt, *args)
    assert r.exit_code == 2, r.output
    assert message in r.output and "Traceback" not in r.output


def test_missing_dataset_asks_for_data():
    from jemeval import testing

    with pytest.raises(UsageError, match="give data=DATASET") as info:
        calibrate(testing.tiny_model(input_shape=(1, 8, 8)), progress=False)
    assert info.value.param == "data"


def test_old_sigma_and_plot_keywords_still_work(clf, tmp_path):
    with pytest.warns(DeprecationWarning) as caught:
        old = calibrate(clf, n=60, sigma=0.05, plot=tmp_path / "r.png", progress=False)
    assert {str(w.message).split(":")[0] for w in caught} == {"calibrate(plot=...)", "calibrate()"}
    assert any("'sigma' is now 'input_sigma'" in str(w.message) for w in caught)
    new = calibrate(clf, n=60, input_sigma=0.05, progress=False)
    assert old.records == new.records and old.provenance["settings"]["sigma"] == 0.05
    assert (tmp_path / "r.png").read_bytes()[:4] == b"\x89PNG"


def test_temperature_fitted_on_the_trainers_held_out_split(digits_classifier_ckpt):
    model = jemeval.load_model(digits_classifier_ckpt)
    model.metadata["config"] = {"dataset": "digits", "val_size": 150, "split_seed": 1234}
    result = calibrate(model, temperature_scaling=True, n=50, progress=False)
    validation = result.provenance["settings"]["validation"]
    assert validation["n"] == 150 and "held out" in validation["source"]
    assert not result.notes
    # the very images the trainer held out: the one split definition, shared with training
    from jemeval.data import split_indices
    from jemeval.training.splits import split_indices as training_split_indices

    assert training_split_indices is split_indices
    assert len(split_indices(1347, 150, 1234)[1]) == 150


def test_softmax64_and_temperature_nll_match_hand_computation():
    from jemeval.evaluation.calibration import temperature_nll

    logits = np.array([[1000.0, 0.0, -1000.0], [2.0, 1.0, 0.0]])  # huge logits: no overflow, no log(0)
    p = softmax64(logits, 2.0)
    e = np.exp(np.array([1.0, 0.5, 0.0]))
    np.testing.assert_allclose(p[1], e / e.sum(), rtol=1e-15)
    np.testing.assert_allclose(p[0], [1.0, np.exp(-500.0), 0.0], rtol=1e-12, atol=0)
    assert p.dtype == np.float64 and np.allclose(p.sum(1), 1.0)
    # label 2 of row 0 is a confident mistake: -log p = (500 + 500) + log(1 + e^-500 + e^-1000) exactly
    expected = ((1000.0 + np.log1p(np.exp(-500.0))) + (np.log(e.sum()) - 0.5)) / 2
    assert temperature_nll(logits, np.array([2, 1]), 2.0) == pytest.approx(expected, rel=1e-12)
