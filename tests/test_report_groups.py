"""`jemeval report` with seed groups, paired tests, cost and the summary row (issue 26 items 1-4).

Four tiny digits classifiers trained here in seconds (two seeds of a longer run "A", two of a
short run "B": really different weights) stand for seed groups. Every number is checked against
an independent reference: the single runs' own records (statistics' mean and stdev), a DeLong
test written from the paper with an O(mn) kernel, a plain-numpy bootstrap, scipy's binomtest and
a hand-written Holm. Each item's refusals are attacked through the command line: one line, no
traceback, nothing written.
"""
from __future__ import annotations

import json
import math
import os
import shutil
import statistics
from pathlib import Path

import numpy as np
import pytest
import torch
from scipy.stats import binomtest, norm
from sklearn.metrics import roc_auc_score
from test_bad_inputs import assert_one_line_refusal, runner, snapshot

import jemeval
from jemeval.cli import cli
from jemeval.evaluation import mrmc
from jemeval.evaluation.figures_of_merit import bootstrap_counts
from jemeval.evaluation.metrics import ece, fpr95
from jemeval.formats.native import save_checkpoint
from jemeval.provenance import file_sha256
from jemeval.reports.compare import N_BOOT, apply_holm, compare, decided
from jemeval.reports.groups import aggregate
from jemeval.reports.summary import headline, training_cost
from jemeval.reports.tables import section_tables
from jemeval.results import Result

ARGS = ["--sections", "accuracy,calibration,ood,robust", "--n", "40", "--refine-steps", "0,1", "--epsilons", "0,0.5,1",
        "--ood", "uniform,interp", "--score", "logpx,maxprob", "--set", "robust.n=16", "--set", "robust.steps=2",
        "--device", "cpu"]
#: what a's first run records of its training (the others record nothing: a bare training loop)
TRAINING = {"device": "cpu", "device_name": "test cpu", "training": {"epoch": 3, "step": 60, "seconds": 2.5},
            "settings": {"sgld_steps": 5, "sampling": True}}


def tiny(path: Path, seed: int, steps: int, provenance: dict | None = None) -> Path:
    """A width-8 digits CNN after ``steps`` Adam steps from seed ``seed`` (a second at most)."""
    torch.manual_seed(seed)
    ds = jemeval.load_dataset("digits", "train")
    model = jemeval.create_model("cnn", 10, (1, 8, 8), width=8)
    opt = torch.optim.Adam(model.parameters(), lr=3e-3)
    g = torch.Generator().manual_seed(seed)
    for _ in range(steps):
        idx = torch.randint(0, len(ds), (64,), generator=g)
        loss = torch.nn.functional.cross_entropy(model(ds.x[idx]), ds.y[idx])
        opt.zero_grad()
        loss.backward()
        opt.step()
    model.eval()
    path.parent.mkdir(parents=True, exist_ok=True)
    save_checkpoint(path, model, dataset="digits", config={"epochs": 1}, provenance=provenance or {})
    return path


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    root = tmp_path_factory.mktemp("seeds")
    return {"a": [tiny(root / "a-s1" / "best.pt", 1, 60, TRAINING), tiny(root / "a-s2" / "best.pt", 2, 60)],
            "b": [tiny(root / "b-s3" / "best.pt", 3, 8), tiny(root / "b-s4" / "best.pt", 4, 8)], "root": root}


@pytest.fixture(scope="module")
def grouped(runs, tmp_path_factory):
    """One report of two seed groups given as globs, through the command line."""
    out = tmp_path_factory.mktemp("report") / "rep"
    root = runs["root"]
    result = runner().invoke(cli, ["report", "--model", str(root / "a-s*" / "best.pt"), "--name", "A", "--model",
                                   str(root / "b-s*" / "best.pt"), "--name", "B", "--out", str(out), *ARGS, "--json"])
    assert result.exit_code == 0, result.output
    return out, json.loads(result.stdout)


def single(path, section, **kw):
    """The single command's records for one checkpoint (the reference for each seed)."""
    fns = {"accuracy": jemeval.evaluate, "ood": jemeval.evaluate_ood}
    return fns[section](str(path), device="cpu", progress=False, n=40, seed=0, **kw)


# -- item 1: seed groups ---------------------------------------------------------------------------------
def test_group_records_are_mean_and_sd_of_the_single_runs(grouped, runs):
    out, report = grouped
    per_seed = [single(p, "accuracy", refine_steps=[0, 1]).records for p in runs["a"]]
    (k0,) = [r for r in report["groups"]["records"] if r["section"] == "accuracy" and r["model"] == "A"
             and r["refine_steps"] == 0]
    values = [rs[0]["accuracy"] for rs in per_seed]
    assert k0["values"]["accuracy"] == values and k0["n_seeds"] == 2 and k0["runs"] == ["A #1", "A #2"]
    assert k0["accuracy"] == pytest.approx(statistics.fmean(values), abs=1e-12)
    assert k0["sd"]["accuracy"] == pytest.approx(statistics.stdev(values), abs=1e-12)
    assert values[0] != values[1]  # two seeds really differ: the spread is no artefact
    # every run's own records are kept, named by model and run, equal to the single command's
    mine = [{k: v for k, v in r.items() if k not in ("section", "model", "run")} for r in report["records"]
            if r["section"] == "accuracy" and r.get("run") == "A #2"]
    assert mine == per_seed[1]
    md = (out / "report.md").read_text()
    row = next(line for line in md.splitlines() if line.startswith("| 0 | accuracy ↑ |"))
    assert f"| {statistics.fmean(values):.4f} +- {statistics.stdev(values):.4f} |" in row  # (n seeds): in the header
    assert "| K (refinement steps) | metric | A (2 seeds) | B (2 seeds) |" in md
    assert report["provenance"]["settings"]["models"][1] == {
        "name": "A #2", "checkpoint": str(runs["a"][1]), "sha256": file_sha256(runs["a"][1]),
        "arch": "cnn", "dataset": "digits", "group": "A"}


def test_a_group_of_one_is_shown_as_a_single_model(tmp_path, runs):
    result = jemeval.report({"A": str(runs["a"][0]), "B": [str(runs["b"][0])]}, out=tmp_path / "r",
                            sections="accuracy", n=40, device="cpu", progress=False)
    assert all("run" not in r for r in result.records) and result.extra["groups"]["records"] == []
    assert "+-" not in (tmp_path / "r" / "report.md").read_text()


def test_group_refusals_are_one_line_and_write_nothing(tmp_path, runs):
    a1 = runs["a"][0]
    copy = tmp_path / "copy" / "best.pt"
    copy.parent.mkdir()
    shutil.copyfile(a1, copy)  # the same weights under another name: no second seed
    link = tmp_path / "link.pt"
    link.symlink_to(a1)
    fifo = tmp_path / "fifo" / "best.pt"
    fifo.parent.mkdir()
    os.mkfifo(fifo)
    cases = [
        (["--model", str(tmp_path / "none-*" / "best.pt"), "--name", "A"], "matches no file"),
        (["--model", str(a1), "--model", str(copy), "--name", "A"], "are the same checkpoint"),
        (["--model", str(a1), "--model", str(link), "--name", "A"], "twice"),
        (["--model", str(tmp_path / "fi*" / "best.pt"), "--name", "A"], "is not a file"),
        (["--model", str(a1), "--model", str(runs["a"][1]), "--model", str(copy), "--name", "A", "--name", "B"],
         "--name gives 2 name(s) for 3 model(s)"),
    ]
    before = snapshot(tmp_path)
    for args, expected in cases:
        result = runner().invoke(cli, ["report", *args, "--out", str(tmp_path / "r"), "--device", "cpu"])
        assert_one_line_refusal(result, expected)
    assert snapshot(tmp_path) == before and not (tmp_path / "r").exists()


# -- item 2: paired tests ---------------------------------------------------------------------------------
def delong_reference(labels, a, b):
    """DeLong, DeLong & Clarke-Pearson (1988) with the O(mn) kernel psi (ties 1/2)."""
    labels = np.asarray(labels)

    def parts(s):
        pos, neg = s[labels == 1], s[labels == 0]
        psi = (pos[:, None] > neg[None, :]) + 0.5 * (pos[:, None] == neg[None, :])
        return psi.mean(), psi.mean(1), psi.mean(0)

    (auc_a, v10a, v01a), (auc_b, v10b, v01b) = parts(np.asarray(a)), parts(np.asarray(b))
    s10, s01 = np.cov(np.vstack([v10a, v10b])), np.cov(np.vstack([v01a, v01b]))
    var = (s10[0, 0] + s10[1, 1] - 2 * s10[0, 1]) / len(v10a) + (s01[0, 0] + s01[1, 1] - 2 * s01[0, 1]) / len(v01a)
    return auc_a - auc_b, 2 * norm.sf(abs(auc_a - auc_b) / math.sqrt(var)) if var > 0 else float(auc_a == auc_b)


def seed_mean_fpr95(ids, oods, counts):
    """FPR95 of each seed on the inputs repeated by ``counts`` (in-distribution first, then OOD), averaged."""
    values = []
    for i, o in zip(ids, oods):
        scores = np.repeat(np.r_[i, o], counts.astype(int))
        labels = np.repeat(np.r_[np.ones(len(i)), np.zeros(len(o))], counts.astype(int))
        values.append(fpr95(scores[labels == 1], scores[labels == 0]))
    return float(np.mean(values))


def holm_reference(p):
    order = sorted(range(len(p)), key=lambda i: p[i])
    out, running = [0.0] * len(p), 0.0
    for rank, i in enumerate(order):
        running = max(running, min(1.0, (len(p) - rank) * p[i]))
        out[i] = running
    return out


def test_method_level_or_hillis_and_runs_level_bootstrap_of_two_seed_groups(grouped, runs):
    """Two groups of 2 runs: each (score, metric) gets the method-level test (OR-Hillis on every run's own
    AUROC, readers nested: the runs record no training seed) which bold follows, and beside it the paired
    bootstrap of the seed means; both from the single runs' own scores."""
    _, report = grouped
    scores = {m: [single(p, "ood", ood=["uniform", "interp"], scores=["logpx", "maxprob"]).extra["scores"]
                  for p in runs[m.lower()]] for m in ("A", "B")}
    uniform = [c for c in report["comparisons"] if c["section"] == "ood" and c["ood"] == "uniform"]
    assert [(c["metric"], c["score"], c["scope"]) for c in uniform] == [  # the value tables' order
        (m, s, scope) for m in ("auroc", "fpr95") for s in ("logpx", "maxprob") for scope in ("method", "runs")]
    for c in uniform:
        assert (c["model_a"], c["model_b"], c["seeds_a"], c["seeds_b"]) == ("A", "B", 2, 2)
        ids = {m: [s.id_scores[c["score"]] for s in scores[m]] for m in scores}
        oods = {m: [s.ood_scores["uniform"][c["score"]] for s in scores[m]] for m in scores}
        labels = np.r_[np.ones(len(ids["A"][0])), np.zeros(len(oods["A"][0]))]
        per_run = {m: np.stack([np.r_[i, o] for i, o in zip(ids[m], oods[m])]) for m in scores}
        if c["scope"] == "method":
            assert c["decides"] and c["test"] == "or-hillis" and c["design"] == "nested"
            assert c["claim"].startswith("the methods differ")
            fom = "auroc" if c["metric"] == "auroc" else "fpr95"
            reference = mrmc.or_hillis_outcomes(fom, [(labels, s) for s in per_run["A"]],
                                                [(labels, s) for s in per_run["B"]], design="nested",
                                                covariance="delong" if fom == "auroc" else "jackknife")
            assert c["p_value"] == pytest.approx(reference["p_value"], rel=1e-12) and c["df"] == reference["df"]
            if fom == "auroc":  # the difference of the mean per-run AUROCs (scikit-learn), never of pooled scores
                means = {m: np.mean([roc_auc_score(labels, s) for s in per_run[m]]) for m in per_run}
                assert c["difference"] == pytest.approx(means["A"] - means["B"], abs=1e-12)
            continue
        assert not c["decides"] and c["test"] == "paired-bootstrap" and c["n_boot"] == N_BOOT and c["seed"] == 0
        assert c["claim"].startswith("these runs differ")
        if c["metric"] == "fpr95":  # every resample repeats the inputs; FPR95 recomputed on the repeated scores
            counts = np.concatenate(list(bootstrap_counts(len(labels), labels.astype(bool), N_BOOT, 0)))
            d = seed_mean_fpr95(ids["A"], oods["A"], np.ones(len(labels))) - seed_mean_fpr95(
                ids["B"], oods["B"], np.ones(len(labels)))
            deltas = np.array([seed_mean_fpr95(ids["A"], oods["A"], w) - seed_mean_fpr95(ids["B"], oods["B"], w)
                               for w in counts])
            assert c["difference"] == pytest.approx(d, abs=1e-12)
            assert c["p_value"] == pytest.approx((1 + np.count_nonzero(np.abs(deltas - d) >= abs(d))) / (N_BOOT + 1))
    for decides in (True, False):  # Holm within the tests bold follows, and within those beside them
        tested = [c for c in report["comparisons"] if c.get("p_value") is not None and c["decides"] is decides]
        assert [c["p_holm"] for c in tested] == pytest.approx(holm_reference([c["p_value"] for c in tested]))


def test_bold_only_where_the_test_is_significant(grouped):
    out, report = grouped
    md = (out / "report.md").read_text()
    table = md.split("*AUROC (higher is better)*")[1].split("\n\n")[1]
    significant = {(c["score"], c["ood"]): c for c in report["comparisons"] if c["metric"] == "auroc"
                   and c["decides"]}
    for line in table.splitlines()[2:]:
        score, ood, a, b = [x.strip() for x in line.strip("|").split("|")]
        c = significant[(score, ood)]
        assert (a.startswith("**") or b.startswith("**")) == bool(c["significant"]), line
    for section in ("accuracy", "calibration", "robust"):  # per-input outcomes (tests/test_per_input_outcomes.py)
        assert all(c.get("p_value") is not None for c in report["comparisons"] if c["section"] == section)
    if not any(c.get("significant") for c in report["comparisons"] if c["section"] == "accuracy"):
        assert "**" not in md.split("## Accuracy and NLL")[1].split("## Calibration")[0]


def test_never_bold_without_a_significant_difference_in_its_direction():
    values = {m: [{"refine_steps": 0, "accuracy": acc, "nll": nll}] for m, acc, nll in (
        ("A", 0.9, 0.3), ("B", 0.8, 0.5), ("C", 0.7, 0.6))}
    for p, diff, bold in ((0.001, 0.1, "A"), (0.2, 0.1, None), (0.001, -0.1, None)):
        tests = [{"section": "accuracy", "refine_steps": 0, "metric": "accuracy", "model_a": "A", "model_b": "B",
                  "difference": diff, "p_value": p, "decides": True},
                 {"section": "accuracy", "refine_steps": 0, "metric": "accuracy", "model_a": "B", "model_b": "C",
                  "difference": 0.1, "p_value": 1e-6, "decides": True}]
        apply_holm(tests)
        choice = decided("accuracy", values, tests)
        assert choice == {((0,), "accuracy"): bold}
        (table,) = section_tables("accuracy", values, choice)
        assert table.best[0][2:] == [bold == m for m in "ABC"] and not any(table.best[1])  # NLL: no test


def synthetic(per_input, n_records=None):
    return Result([{"refine_steps": 0, "calibration": "none"}] * (n_records or 1), {}, {"per_input": per_input})


def test_mcnemar_and_calibration_bootstrap_from_per_input_outcomes():
    rng = np.random.default_rng(5)
    a, b = rng.random(60) < 0.8, rng.random(60) < 0.6
    (c,) = compare("accuracy", {"A": [[synthetic([{"refine_steps": 0, "correct": a.tolist()}])]],
                                "B": [[synthetic([{"refine_steps": 0, "correct": b.tolist()}])]]}, {}, seed=0)
    discordant = int((a & ~b).sum()), int((~a & b).sum())
    assert c["test"] == "mcnemar-exact" and (c["b"], c["c"]) == discordant
    assert c["p_value"] == pytest.approx(binomtest(discordant[0], sum(discordant), 0.5).pvalue, abs=1e-12)
    probs = {m: rng.dirichlet(np.ones(3) * s, 50) for m, s in (("A", 0.5), ("B", 3.0))}
    labels = rng.integers(0, 3, 50)
    comps = compare("calibration", {m: [[synthetic([{"calibration": "none", "probs": p.tolist(),
                                                     "labels": labels.tolist()}])]] for m, p in probs.items()},
                    {}, seed=0)
    (e,) = [c for c in comps if c["metric"] == "ece"]
    assert e["difference"] == pytest.approx(ece(probs["A"], labels, 20) - ece(probs["B"], labels, 20), abs=1e-12)
    # the attack: per-input outcomes over other inputs (a swapped file) are refused as a pair, never tested
    (bad,) = compare("accuracy", {"A": [[synthetic([{"refine_steps": 0, "correct": a.tolist()}])]],
                                  "B": [[synthetic([{"refine_steps": 0, "correct": b[:50].tolist()}])]]}, {}, seed=0)
    assert bad["p_value"] is None and "paired" in bad["error"]
    apply_holm([bad])
    assert "significant" not in bad


# -- items 3 and 4: cost and the summary row ------------------------------------------------------------
def test_cost_per_section_forward_passes_and_training(grouped, runs):
    _, report = grouped
    cost = report["cost"]
    by = {(c["run"], c["section"]): c for c in cost["sections"]}
    assert by[("A #1", "accuracy")]["examples"] == 40 and by[("A #1", "ood")]["examples"] == 40 * 3
    for c in cost["sections"]:
        assert c["seconds"] > 0 and c["device"] == "cpu" and c["examples_per_s"] == pytest.approx(
            c["examples"] / c["seconds"])
    chains = report["runs"][0]["provenance"]["settings"]["refinement"]["1"]["chains"]
    assert {(p["section"], p["refine_steps"], p["forward_passes"]) for p in cost["forward_passes"]} == {
        (s, 0, 1) for s in ("accuracy", "robust")} | {(s, 1, chains + 1) for s in ("accuracy", "robust")}
    first = next(t for t in cost["training"] if t["run"] == "A #1")
    assert first == {"model": "A", "run": "A #1", "epochs": 3, "iterations": 60, "sgld_steps_per_iteration": 5,
                     "sgld_steps": 300, "seconds": 2.5, "device": "cpu", "device_name": "test cpu"}
    assert training_cost({"config": {"epochs": 1}}) == {
        "epochs": 1, "iterations": None, "sgld_steps_per_iteration": None, "sgld_steps": None, "seconds": None,
        "device": None, "device_name": None}  # nothing recorded: nothing invented


def test_summary_row_per_model_mean_and_sd_over_seeds(grouped):
    out, report = grouped
    (a, _) = report["summary"]
    k, eps = a["refine_steps"], a["epsilon"]
    per_run = {run: [r for r in report["records"] if r.get("run") == run] for run in ("A #1", "A #2")}
    clean = [next(r["accuracy"] for r in rs if r["section"] == "accuracy" and r["refine_steps"] == k)
             for rs in per_run.values()]
    robust = [min(r["robust_accuracy"] for r in rs if r["section"] == "robust" and r["refine_steps"] == k
                  and r["epsilon"] == eps) for rs in per_run.values()]
    ece_ts = [next(r["ece"] for r in rs if r["section"] == "calibration" and r["calibration"] == "temperature")
              for rs in per_run.values()]
    assert eps == 1.0 and a["norm"] == "l2"  # the list does not end at the norm's maximum: its largest
    for key, values in (("clean_accuracy", clean), ("robust_accuracy", robust), ("ece_ts", ece_ts)):
        assert a["values"][key] == values and a[key] == pytest.approx(statistics.fmean(values))
        assert a["sd"][key] == pytest.approx(statistics.stdev(values))
    assert a["training_seconds"] == 2.5 and a["values"]["training_seconds"] == [2.5, None]
    md = (out / "report.md").read_text()
    row = next(line for line in md.splitlines() if line.startswith("| A | 2 | K="))
    assert f"| {statistics.fmean(clean):.4f} +- {statistics.stdev(clean):.4f} |" in row


def test_headline_epsilon_leaves_out_the_norms_maximum():
    records = [{"norm": "l2", "epsilon": e} for e in (0.0, 0.5, 2.0, 8.0)]
    assert headline(records, {"epsilons": {"l2": [0, 0.5, 2, "max"]}}) == ("l2", 2.0)  # 8: the sanity check
    assert headline(records, {"epsilons": [0, 0.5, 2, 8]}) == ("l2", 8.0)


def test_aggregate_keeps_settings_and_drops_per_run_intervals():
    rows = aggregate("robust", {"r1": [{"norm": "l2", "attack": "pgd", "grad_mode": "full", "refine_steps": 0,
                                        "epsilon": 0.5, "robust_accuracy": 0.5, "ci_low": 0.2, "ci_high": 0.8, "n": 8}],
                                "r2": [{"norm": "l2", "attack": "pgd", "grad_mode": "full", "refine_steps": 0,
                                        "epsilon": 0.5, "robust_accuracy": 0.75, "ci_low": 0.4, "ci_high": 0.9,
                                        "n": 8}]})
    (row,) = rows
    assert row["robust_accuracy"] == 0.625 and row["n"] == 8 and "ci_low" not in row
    assert row["sd"] == {"robust_accuracy": pytest.approx(statistics.stdev([0.5, 0.75]))}
