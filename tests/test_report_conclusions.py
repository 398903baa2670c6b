"""What the report concludes (issue 33): method-level tests for seed groups, flagged rows kept out of
bold and the summary, numbers a reader can read.

Five tiny digits classifiers (three runs of a longer recipe "A", two of a short one "B", trained here in
a second each) make groups of 3 and 2 runs; a sixth run alone stands for a single checkpoint. Robust
runs K = 0 (deterministic) and K = 1 (SGLD noise) with single-draw gradients, so every K = 1 number is
a stochastic defence attacked without EOT: flagged.
"""
from __future__ import annotations

import json

import numpy as np
import pytest
from test_bad_inputs import runner
from test_report_groups import tiny

from jemeval.cli import cli
from jemeval.evaluation import mrmc
from jemeval.evaluation.robust.checks import NO_EOT
from jemeval.reports.tables import fmt_count, fmt_p, fmt_seconds

ARGS = ["--sections", "accuracy,ood,robust", "--n", "40", "--refine-steps", "0,1", "--epsilons", "0,0.5,1",
        "--ood", "uniform", "--score", "logpx", "--set", "robust.n=16",
        "--set", "robust.steps=2", "--device", "cpu"]


@pytest.fixture(scope="module")
def three_and_two(tmp_path_factory):
    root = tmp_path_factory.mktemp("runs")
    a = [tiny(root / f"a-s{s}" / "best.pt", s, 60) for s in (1, 2, 3)]
    b = [tiny(root / f"b-s{s}" / "best.pt", s, 8) for s in (4, 5)]
    out = root / "rep"
    result = runner().invoke(cli, ["report", "--model", str(root / "a-s*" / "best.pt"), "--name", "A", "--model",
                                   str(root / "b-s*" / "best.pt"), "--name", "B", "--out", str(out), *ARGS, "--json"])
    assert result.exit_code == 0, result.output
    return out, json.loads(result.stdout), a, b


def test_groups_of_three_and_two_get_or_hillis_and_the_input_level_test_beside_it(three_and_two):
    out, report, a, b = three_and_two
    by_key: dict[tuple, list[dict]] = {}
    for c in report["comparisons"]:
        by_key.setdefault((c["section"], c.get("refine_steps"), c.get("score"), c.get("epsilon"), c["metric"]),
                          []).append(c)
    assert by_key, report["comparisons"]
    for tests in by_key.values():
        method, runs = tests
        assert (method["test"], method["scope"], method["decides"]) == ("or-hillis", "method", True)
        assert (method["seeds_a"], method["seeds_b"], method["design"]) == (3, 2, "nested")  # unequal: no pairing
        assert (runs["test"], runs["scope"], runs["decides"]) == ("paired-bootstrap", "runs", False)
        assert (runs["seeds_a"], runs["seeds_b"]) == (3, 2)
        assert method["claim"].startswith("the methods differ") and runs["claim"].startswith("these runs differ")
    # the method-level test is the per-run figures of merit of every run, recomputed from the runs' records
    (acc,) = [c for c in report["comparisons"] if c["section"] == "accuracy" and c["refine_steps"] == 0
              and c["scope"] == "method"]
    per_run = {m: [r["accuracy"] for r in report["records"] if r["section"] == "accuracy" and r["model"] == m
                   and r["refine_steps"] == 0] for m in ("A", "B")}
    assert len(per_run["A"]) == 3 and len(per_run["B"]) == 2
    assert acc["difference"] == pytest.approx(np.mean(per_run["A"]) - np.mean(per_run["B"]), abs=1e-12)
    page = (out / "report.md").read_text()
    assert "| K (refinement steps) | metric | A (3 seeds) | B (2 seeds) |" in page
    assert "the methods differ (bold)" in page and "these runs differ" in page and "3 vs 2" in page


def test_a_single_run_against_a_group_gets_the_input_level_test_and_says_why(three_and_two, tmp_path):
    _, _, a, b = three_and_two
    result = runner().invoke(cli, ["report", "--model", str(a[0]), "--name", "one", "--model",
                                   str(b[0].parent.parent / "b-s*" / "best.pt"), "--name", "B", "--sections",
                                   "accuracy", "--n", "40",
                                   "--refine-steps", "0", "--out", str(tmp_path / "r"), "--device", "cpu", "--json"])
    assert result.exit_code == 0, result.output
    (c,) = [c for c in json.loads(result.stdout)["comparisons"] if c["metric"] == "accuracy"]
    assert (c["test"], c["scope"], c["decides"], c["seeds_a"], c["seeds_b"]) == ("paired-bootstrap", "runs", True,
                                                                                 1, 2)
    assert c["method_level"] == "the method-level test needs two runs a side"
    assert "the method-level test needs two runs a side" in (tmp_path / "r" / "report.md").read_text()


def test_flagged_robust_rows_are_marked_never_bold_and_never_in_the_summary(three_and_two):
    out, report, _, _ = three_and_two
    robust = [r for r in report["groups"]["records"] if r["section"] == "robust"]
    k1 = [r for r in robust if r["refine_steps"] == 1]
    assert k1 and all(NO_EOT in r["flags"] for r in k1)  # K = 1: single draws on a stochastic defence
    assert all(NO_EOT not in r.get("flags", []) for r in robust if r["refine_steps"] == 0)
    (a_row, b_row) = report["summary"]
    assert a_row["refine_steps"] == 0 and a_row["robust_accuracy"] is not None  # A: K = 0 passed every check
    if any(r.get("flags") for r in robust if r["model"] == "B" and r["refine_steps"] == 0):
        assert b_row["robust_accuracy"] is None and b_row["robust_flagged"]  # every K flagged: no number at all
    page = (out / "report.md").read_text()
    section = page[page.index("## Adversarial robustness"):page.index("## Provenance")]
    marked = [line for line in section.splitlines() if line.startswith("| l2 | pgd | full | 1 |")
              and "robust accuracy ↑" in line]
    assert marked and all("(flagged)" in line and "**" not in line for line in marked)
    assert "stochastic defence attacked without EOT" in section and "never reach the summary" in section
    summary = page[page.index("*Summary"):page.index("## ")]
    assert "K=0" in summary and "K=1" not in summary


def test_numbers_a_reader_can_read():
    assert [fmt_p(p) for p in (0.03125, 0.5, 1.0, 0.00012, 3e-7, None)] == ["0.031", "0.5", "1", "0.00012", "< 1e-4",
                                                                            "-"]
    assert [fmt_seconds(s) for s in (0.012345, 2.5, 18.64, 1234.5)] == ["0.0123", "2.50", "18.6", "1230"]
    assert [fmt_count(c) for c in (450.0, 6, 2.5)] == ["450", "6", "2.5"]


def test_the_tests_table_follows_the_value_tables_order(three_and_two):
    out, report, _, _ = three_and_two
    robust = [(c["refine_steps"], c["epsilon"]) for c in report["comparisons"] if c["section"] == "robust"
              and c["scope"] == "method"]
    shown = [(r["refine_steps"], r["epsilon"]) for r in report["groups"]["records"] if r["section"] == "robust"
             and r["model"] == "A"]
    assert robust == [k for k in shown if k in robust]


def test_or_hillis_on_the_report_runs_needs_two_runs_a_side():
    with pytest.raises(ValueError, match="at least 2 runs per group"):
        mrmc.or_hillis_outcomes("accuracy", [(np.ones(5, bool),)], [(np.ones(5, bool),), (np.zeros(5, bool),)])
