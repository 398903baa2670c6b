"""Per-input outcomes of accuracy, calibration and robust Results: the report's paired tests run (issue 26 item 2).

One real `jemeval report` of two trained digits models (the session fixtures: a plain classifier
and a JEM) gives its accuracy, calibration (ECE, NLL) and robust rows a test and a p-value. Each is
checked against an independent reference: the McNemar p-value equals scipy's binomtest on the
discordant counts recomputed from the two models' own ``evaluate()`` runs; the bootstrap's
difference is the difference of the records' own ECE and NLL; the robust outcomes count what the
records count, at a sweep's last counts only. The cache round trip is attacked (a rerun reads
the outcomes back; a tampered entry is recomputed, never believed), the training cost is read
from best.pt (its wall time, this epoch's included), and ``--json`` stays short.
"""
from __future__ import annotations

import csv
import json
from pathlib import Path

import numpy as np
import pytest
import torch
from scipy.stats import binomtest
from test_bad_inputs import runner, snapshot

import jemeval
from jemeval.cli import cli
from jemeval.data import load_dataset, subsample
from jemeval.formats.native import read_checkpoint
from jemeval.provenance import file_sha256

SEED, N, ROBUST_N = 3, 60, 20
ARGS = ["--sections", "accuracy,calibration,robust", "--n", str(N), "--refine-steps", "0,1", "--norm", "l2",
        "--epsilons", "0,0.5,1", "--set", f"robust.n={ROBUST_N}", "--set", "robust.steps=1,2", "--seed", str(SEED),
        "--device", "cpu"]


@pytest.fixture(scope="module")
def models(digits_classifier_ckpt, digits_jem_ckpt):
    return {"CLS": Path(digits_classifier_ckpt), "JEM": Path(digits_jem_ckpt)}


@pytest.fixture(scope="module")
def reported(models, tmp_path_factory):
    """(report folder, the command's arguments, report.json) of one report of both models."""
    out = tmp_path_factory.mktemp("per-input") / "rep"
    args = ["report", "--model", str(models["CLS"]), "--model", str(models["JEM"]), "--name", "CLS", "--name", "JEM",
            "--out", str(out), *ARGS]
    result = runner().invoke(cli, args)
    assert result.exit_code == 0, result.output + result.stderr
    return out, args, json.loads((out / "report.json").read_text())


def runs_of(report: dict, section: str) -> dict[str, list[dict]]:
    by_model: dict[str, list[dict]] = {}
    for run in report["runs"]:
        if run["section"] == section:
            by_model.setdefault(run["model"], []).extend(run.get("per_input") or [])
    return by_model


def comparisons(report: dict, section: str, metric: str) -> list[dict]:
    return [c for c in report["comparisons"] if c["section"] == section and c["metric"] == metric]


def mcnemar_reference(a, b) -> tuple[int, int, float]:
    """(b, c, p) by scipy: the discordant counts and binomtest's two-sided p-value (1 without any)."""
    a, b = np.asarray(a, bool), np.asarray(b, bool)
    n_b, n_c = int((a & ~b).sum()), int((~a & b).sum())
    return n_b, n_c, 1.0 if n_b + n_c == 0 else binomtest(n_b, n_b + n_c, 0.5).pvalue


# -- item 1: accuracy ------------------------------------------------------------------------------------
def test_accuracy_mcnemar_equals_binomtest_on_each_models_own_evaluate(reported, models):
    _, _, report = reported
    own = {m: jemeval.evaluate(str(p), "digits", n=N, refine_steps=[0, 1], seed=SEED, device="cpu")
           for m, p in models.items()}
    reported_outcomes = runs_of(report, "accuracy")
    subset = subsample(load_dataset("digits", "test"), N, SEED)
    for m, result in own.items():  # the report's outcomes are the model's own, input by input
        assert reported_outcomes[m] == result.extra["per_input"]
        with torch.no_grad():  # K = 0 by hand: the model's predictions on the seeded subset, in its order
            predicted = jemeval.load_model(str(models[m])).eval()(subset.x).argmax(1)
        assert result.extra["per_input"][0]["correct"] == (predicted == subset.y).tolist()
        for record, item in zip(result.records, result.extra["per_input"], strict=True):
            assert item["refine_steps"] == record["refine_steps"] and len(item["correct"]) == record["n"] == N
            assert np.mean(item["correct"]) == pytest.approx(record["accuracy"], abs=1e-12)
    tests = comparisons(report, "accuracy", "accuracy")
    assert sorted(c["refine_steps"] for c in tests) == [0, 1]
    for c in tests:
        (a,), (b,) = ([i["correct"] for i in own[m].extra["per_input"] if i["refine_steps"] == c["refine_steps"]]
                      for m in (c["model_a"], c["model_b"]))
        n_b, n_c, p = mcnemar_reference(a, b)
        assert c["test"] == "mcnemar-exact" and (c["b"], c["c"], c["n"]) == (n_b, n_c, N)
        assert c["p_value"] == pytest.approx(p, abs=1e-12) and "p_holm" in c
    # the attack: a model evaluated on other inputs (another seed's subset) is not what the report pairs
    other = jemeval.evaluate(str(models["CLS"]), "digits", n=N, refine_steps=0, seed=SEED + 1, device="cpu")
    assert other.extra["per_input"][0]["correct"] != own["CLS"].extra["per_input"][0]["correct"]


def test_every_model_sees_the_same_inputs_in_the_same_order(reported):
    _, _, report = reported
    labels = subsample(load_dataset("digits", "test"), N, SEED).y.tolist()  # the subset, seeded by the seed alone
    per_model = runs_of(report, "calibration")
    assert set(per_model) == {"CLS", "JEM"}
    for items in per_model.values():
        assert [i["calibration"] for i in items] == ["none", "temperature"]
        assert all(i["labels"] == labels for i in items)


# -- item 2: calibration ---------------------------------------------------------------------------------
def test_calibration_bootstrap_difference_is_the_records_difference(reported, models):
    _, _, report = reported
    records = {(r["model"], r["calibration"]): r for r in report["records"] if r["section"] == "calibration"}
    per_model = runs_of(report, "calibration")
    for m, p in models.items():  # what the report kept is the model's own calibrate(), exactly (float64 JSON)
        own = jemeval.calibrate(str(p), "digits", n=N, temperature_scaling=True, seed=SEED, device="cpu")
        assert own.extra["per_input"] == per_model[m]
        for item, record in zip(per_model[m], own.records, strict=True):
            probs = np.asarray(item["probs"], dtype=np.float64)
            assert probs.shape == (N, 10) and np.allclose(probs.sum(1), 1.0, atol=1e-12)
            assert np.mean(probs.argmax(1) == np.asarray(item["labels"])) == record["accuracy"]
    for metric in ("ece", "nll"):
        tests = comparisons(report, "calibration", metric)
        assert sorted(c["calibration"] for c in tests) == ["none", "temperature"]
        for c in tests:
            a, b = (records[(m, c["calibration"])][metric] for m in (c["model_a"], c["model_b"]))
            assert c["test"] == "paired-bootstrap" and c["n_boot"] > 0 and c["seed"] == SEED
            assert c["difference"] == pytest.approx(a - b, abs=1e-12)
            assert 0.0 <= c["p_value"] <= 1.0 and c["ci_low"] <= c["difference"] <= c["ci_high"]


# -- item 3: robust --------------------------------------------------------------------------------------
ROW = ("norm", "attack", "grad_mode", "refine_steps", "epsilon")


def test_robust_outcomes_count_what_the_records_count_at_the_sweeps_last_counts(reported):
    _, _, report = reported
    records = [r for r in report["records"] if r["section"] == "robust"]
    assert {r["steps"] for r in records} == {1, 2}  # a sweep: the first count is in the records...
    final = {(r["model"], *(r[k] for k in ROW)): r for r in records if r["steps"] == 2}
    per_model = runs_of(report, "robust")
    seen = set()
    for m, items in per_model.items():
        for item in items:  # ...but only the last count has outcomes, each equal to its record's count
            record = final[(m, *(item[k] for k in ROW))]
            assert len(item["correct"]) == record["n"] == ROBUST_N
            assert sum(item["correct"]) == round(record["robust_accuracy"] * ROBUST_N)
            seen.add((m, *(item[k] for k in ROW)))
    assert seen == set(final)
    tests = comparisons(report, "robust", "robust_accuracy")
    assert len(tests) == len(final) // 2
    for c in tests:
        a, b = ([i for i in per_model[m] if all(i[k] == c[k] for k in ROW)] for m in (c["model_a"], c["model_b"]))
        n_b, n_c, p = mcnemar_reference(a[0]["correct"], b[0]["correct"])
        assert len(a) == len(b) == 1 and c["test"] == "mcnemar-exact" and (c["b"], c["c"]) == (n_b, n_c)
        assert c["p_value"] == pytest.approx(p, abs=1e-12)


# -- the cache round trip ----------------------------------------------------------------------------------
def test_rerun_reads_the_outcomes_back_and_a_tampered_entry_is_recomputed(reported, models):
    out, args, report = reported
    cache = snapshot(out / "cache")
    again = runner().invoke(cli, [*args, "--json"])
    assert again.exit_code == 0, again.stderr
    assert snapshot(out / "cache") == cache  # every section read back from its entry, none recomputed
    rerun = json.loads((out / "report.json").read_text())
    assert rerun["comparisons"] == report["comparisons"] and rerun["runs"] == report["runs"]
    assert json.loads(again.stdout) == rerun  # report --json prints report.json, outcomes included
    assert "recomputed" not in json.dumps(rerun.get("notes"))
    # the attack: one outcome flipped in a cached entry (a model made to look better) is not believed
    entry = out / "cache" / f"accuracy-{file_sha256(models['CLS'])[:16]}.json"
    data = json.loads(entry.read_text())
    flipped = data["runs"][0]["per_input"][0]["correct"]
    flipped[0] = not flipped[0]
    entry.write_text(json.dumps(data, indent=1) + "\n")
    with pytest.warns(UserWarning, match="did not match its checksum"):
        third = runner().invoke(cli, args)
    assert third.exit_code == 0, third.stderr
    healed = json.loads((out / "report.json").read_text())
    assert healed["comparisons"] == report["comparisons"]
    assert any("did not match its checksum" in note for note in healed["notes"])
    assert json.loads(entry.read_text())["runs"][0]["per_input"] == runs_of(report, "accuracy")["CLS"]


# -- item 4: training wall time in best.pt ------------------------------------------------------------------
def test_best_pt_records_the_training_seconds_so_far_and_the_report_shows_them(reported, models):
    _, _, report = reported
    run = models["JEM"].parent
    best = read_checkpoint(run / "best.pt")["provenance"]["training"]
    last = read_checkpoint(run / "last.pt")
    rows = list(csv.DictReader((run / "metrics.csv").open()))
    seconds = [float(r["seconds"]) for r in rows]
    epoch = best["epoch"]
    # independent reference: metrics.csv's per-epoch seconds, up to the best epoch (its own time included)
    assert sum(seconds[:epoch - 1]) - 0.05 <= best["elapsed"] <= sum(seconds[:epoch]) + 0.05
    # the best epoch's own time is in (its training and validation come before best.pt is written)
    assert best["elapsed"] >= sum(seconds[:epoch - 1]) + 0.5 * seconds[epoch - 1] > 0
    assert last["provenance"]["training"]["elapsed"] == pytest.approx(last["training_state"]["elapsed"])
    assert best["elapsed"] <= last["provenance"]["training"]["elapsed"]
    (cost,) = [t for t in report["cost"]["training"] if t["model"] == "JEM"]
    assert cost["seconds"] == pytest.approx(best["elapsed"])


# -- the command line: --json stays short, the files keep everything -----------------------------------
@pytest.mark.parametrize("command", ["eval", "calibrate --temperature-scaling",
                                     "robust --norm l2 --steps 2 --epsilons 0,0.5,1"])
def test_printed_json_leaves_the_per_input_outcomes_to_the_out_file(models, tmp_path, command):
    out = tmp_path / "result.json"
    result = runner().invoke(cli, [*command.split(), "--model", str(models["CLS"]), "--n", "30", "--seed", str(SEED),
                                   "--device", "cpu", "--json", "--out", str(out)])
    assert result.exit_code == 0, result.stderr
    printed, saved = json.loads(result.stdout), json.loads(out.read_text())
    assert printed == {k: v for k, v in saved.items() if k != "per_input"}  # all but the outcomes, on stdout
    assert [len(i.get("correct") or i.get("labels")) for i in saved["per_input"]] == [30] * len(saved["records"])
