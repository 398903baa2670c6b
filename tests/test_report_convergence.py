"""The report shows the attack-convergence curve (issue 27 item 3, last part).

``jemeval report --set robust.eot_samples=1,4 --set robust.steps=1,8`` runs robust's paired sweep in the
report's robust section: the table holds the sweep's last counts (equal to ``jemeval.robust`` run with
those single counts), the page names every model's verdict and the checklist item ``attack_converged``,
figures/robust-convergence.png overlays the models' curves, and a report folder whose cached robust
results predate the sweep (no ``converged`` key) still resumes.

The models are two small digits CNNs trained here for a few seconds, each saved as a checkpoint; a chain
noise of 0.3 makes K = 1 stochastic, so the EOT counts matter there. Epsilon 0.25 (not a k/255 value)
is written 0.25 in the tables.
"""
from __future__ import annotations

import json
import re

import pytest
from helpers import quick_digits_cnn, without_timings
from test_bad_inputs import assert_one_line_refusal, runner, snapshot

import jemeval
from jemeval.cli import cli
from jemeval.cli.commands.report import parse_set
from jemeval.reports.cache import checksum
from jemeval.reports.page import section_blocks
from jemeval.reports.settings import PRESETS, resolve_options
from jemeval.reports.tables import Table
from jemeval.results import Result

#: the robust section of the report and the direct call that must give its last counts
SWEEP = ["--sections", "robust", "--n", "20", "--refine-steps", "0,1", "--norm", "linf", "--epsilons", "0,0.25",
         "--chain-sigma", "0.3", "--set", "robust.grad_mode=eot", "--set", "robust.eot_samples=1,4",
         "--set", "robust.steps=1,8", "--device", "cpu"]
DIRECT = dict(norm="linf", n=20, refine_steps=[0, 1], epsilons=[0, 0.25], chain_sigma=0.3, grad_mode="eot",
              seed=0, device="cpu", progress=False)
PNG = b"\x89PNG\r\n\x1a\n"
#: what differs between two writes of the same page
CREATED = r"created \S+|\"created\": \"[^\"]*\""


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    folder = tmp_path_factory.mktemp("models")
    return [quick_digits_cnn(folder / f"m{s}.pt", s) for s in (0, 1)]


@pytest.fixture(scope="module")
def swept(tmp_path_factory, models):
    """The report with the sweep, through the command line."""
    out = tmp_path_factory.mktemp("report") / "rep"
    res = runner().invoke(cli, ["report", "--model", str(models[0]), "--model", str(models[1]), "--name", "A",
                                "--name", "B", "--out", str(out), *SWEEP, "--json"])
    assert res.exit_code == 0, res.output + res.stderr
    return out, json.loads(res.stdout)


def table_rows(page: str) -> dict[tuple[str, str], list[str]]:
    """The robust table's cells per (K, epsilon): the markdown rows 'linf | pgd | eot | K | eps | robust ...'."""
    rows = {}
    for line in page.splitlines():
        cells = [c.strip() for c in line.strip("|").split("|")]
        if len(cells) == 8 and cells[:3] == ["linf", "pgd", "eot"] and cells[5].startswith("robust accuracy"):
            rows[(cells[3], cells[4])] = [c.strip("*") for c in cells[6:]]
    return rows


def cell(record) -> str:
    return f"{record['robust_accuracy']:.4f} [{record['ci_low']:.3f}, {record['ci_high']:.3f}]"


# -- 1. the table shows the sweep's last counts, equal to robust run with those counts ------------------
def test_table_holds_the_last_counts_equal_to_robust_run_directly(swept, models):
    out, report = swept
    records = [r for r in report["records"] if r["model"] == "A"]
    assert {(r["eot_samples"], r["steps"]) for r in records if r["refine_steps"] == 1} == {(1, 1), (1, 8), (4, 1),
                                                                                             (4, 8)}
    alone = jemeval.robust(str(models[0]), eot_samples=4, steps=8, **DIRECT)
    top = {k: max((r["eot_samples"], r["steps"]) for r in records if r["refine_steps"] == k) for k in (0, 1)}
    swept_only = ("section", "model", "converged", "flags")  # a verdict, and the flag it raises, need a sweep
    last = [{k: v for k, v in r.items() if k not in swept_only} for r in records
            if (r["eot_samples"], r["steps"]) == top[r["refine_steps"]]]
    assert without_timings(last) == without_timings([{k: v for k, v in r.items() if k not in swept_only}
                                                     for r in alone.records])  # the sweep is paired
    page = (out / "report.md").read_text()
    rows = table_rows(page)
    assert len(rows) == 4, page
    for r in alone.records:
        eps = "0" if r["epsilon"] == 0 else f"{r['epsilon']:g}"
        shown = rows[(str(r["refine_steps"]), eps)][0]
        assert shown.removesuffix(" (flagged)") == cell(r)  # one count per cell: the last
    assert "Attack sweep: EOT samples 1, 4, attack steps 1, 8" in page
    assert "robust accuracy at the last counts (4 EOT samples, 8 attack steps" in page


def test_a_table_never_mixes_counts_whatever_the_records_order():
    """The attack: a sweep whose records come last count first (a plugin, or an edited cache)."""
    def rec(eot, steps, acc):
        return {"attack": "pgd", "norm": "l2", "refine_steps": 1, "grad_mode": "eot", "epsilon": 0.5, "n": 10,
                "robust_accuracy": acc, "ci_low": acc - 0.1, "ci_high": acc + 0.1, "eot_samples": eot, "steps": steps}
    records = [rec(8, 20, 0.3), rec(1, 20, 0.9), rec(8, 5, 0.6), rec(1, 5, 0.95)]
    res = Result(records, {"settings": {"sweep": {"eot_samples": [1, 8], "steps": [5, 20]}}})
    blocks = section_blocks("robust", {}, {"M": [res]}, {}, [], out=None)
    (table,) = [b for b in blocks if isinstance(b, Table) and b.columns[-2:] == ["metric", "M"]]
    assert [row[-1] for row in table.rows] == ["0.3000 [0.200, 0.400]"]


# -- 2. the verdicts and the checklist item on the page ---------------------------------------------
def verdict_text(v) -> str:
    """A verdict as the page must state it, built from the result's own ``convergence`` entry."""
    state = "converged" if v["converged"] else "NOT converged"
    if v.get("drop") is None:
        return f"{state} (deterministic)"
    accs = " → ".join(f"{a:.3f}" for a in v["robust_accuracy"])
    return f"{state}: {accs} (-{v['broken']}/+{v['gained']} inputs, drop <= {v['drop_ci_high']:+.3f})"


def test_page_names_each_models_verdict_and_the_checklist_item(swept):
    out, report = swept
    page = (out / "report.md").read_text()
    robust = page[page.index("## Adversarial robustness"):page.index("## Provenance")]
    assert "Attack convergence (attack_converged)" in robust and "Checklist item `attack_converged`:" in robust
    runs = {r["model"]: r for r in report["runs"]}
    for column, model in ((8, "A"), (9, "B")):
        verdicts = runs[model]["convergence"]
        assert len(verdicts) == 8  # 2 K x 2 epsilons x 2 swept axes
        for v in verdicts:
            eps = "0" if v["epsilon"] == 0 else f"{v['epsilon']:g}"
            axis = {"eot_samples": "EOT samples", "steps": "attack steps"}[v["axis"]]
            (row,) = [line for line in robust.splitlines()
                      if line.startswith(f"| linf | pgd | eot | {v['refine_steps']} | {eps} | {axis} |")]
            assert row.split("|")[column].strip() == verdict_text(v)
        for check in (c for c in runs[model]["checks"] if c["check"] == "attack_converged"):
            assert re.search(re.escape(check["message"]) + r" \((A, B|A|B)\)", robust)
            assert check["passed"] or "not converged" in check["message"]


def test_a_verdict_that_did_not_converge_is_named_and_ringed(tmp_path):
    """The attack: a sweep whose attack still drops between its last two counts."""
    from jemeval.evaluation.robust.checks import record_flags, sanity_checks
    from jemeval.evaluation.robust.convergence import convergence, mark_converged
    from jemeval.plots.report import plot_convergence_overlay

    def rec(eot, robust):
        return {"attack": "pgd", "norm": "l2", "refine_steps": 1, "grad_mode": "eot", "epsilon": 0.5, "n": 50,
                "robust_accuracy": len(robust) / 50, "clean_accuracy": 0.9, "ci_low": 0.1, "ci_high": 0.9,
                "eot_samples": eot, "steps": 10}, {"correct": [i in robust for i in range(50)]}
    (r1, o1), (r4, o4), (r16, o16) = rec(1, set(range(40))), rec(4, set(range(30))), rec(16, set(range(15)))
    records = [r1, r4, r16]
    verdicts = convergence(records, [o1, o4, o16], swept=["eot_samples"])
    mark_converged(records, verdicts)
    checks = sanity_checks(records, verdicts=verdicts)
    record_flags(records, checks, stochastic_ks=[1])
    res = Result(records, {"settings": {"sweep": {"eot_samples": [1, 4, 16]}}},
                 extra={"checks": checks, "convergence": verdicts}, notes=[c["message"] for c in checks])
    blocks = section_blocks("robust", {}, {"M": [res]}, {}, [], out=None)
    (table,) = [b for b in blocks if isinstance(b, Table) and b.title and "attack_converged" in b.title]
    (v,) = verdicts
    assert (v["broken"], v["gained"]) == (15, 0)
    assert table.rows == [["l2", "pgd", "eot", "1", "0.5", "EOT samples", "1, 4, 16",
                           f"NOT converged: 0.800 → 0.600 → 0.300 (-15/+0 inputs, drop <= {v['drop_ci_high']:+.3f})"]]
    bullets = [b for b in blocks if type(b).__name__ == "Bullets"]
    assert any("WARNING: pgd K=1 eot eps=0.5: 0.600 -> 0.300 from 4 to 16 EOT samples" in item
               and "not converged" in item and item.endswith("(M)") for b in bullets for item in b.items)
    # the number the sweep reports is flagged where it stands, and the page says why
    assert r16["flags"] == ["attack not converged"]
    assert any("M, attack pgd, gradient eot, K 1, eps 0.5: attack not converged" in item
               for b in bullets for item in b.items)
    path = plot_convergence_overlay({"M": [(records, verdicts)]}, tmp_path / "c.png")
    assert path.read_bytes()[:8] == PNG


# -- 3. the figure ------------------------------------------------------------------------------------
def test_convergence_figure_is_drawn_listed_and_in_the_manifest(swept):
    out, report = swept
    fig = out / "figures" / "robust-convergence.png"
    assert fig.read_bytes()[:8] == PNG
    manifest = json.loads((out / ".jemeval-report.json").read_text())["files"]
    assert "figures/robust-convergence.png" in manifest and "figures/robust.png" in manifest
    assert "](figures/robust-convergence.png)" in (out / "report.md").read_text()
    from jemeval.reports.figures import is_figure_name

    assert is_figure_name("robust-convergence.png") and not is_figure_name("robust-convergence.jpg")


# -- 4. resuming: a sweep from the cache, and a folder cached before sweeps -------------------------
def test_rerun_reads_the_sweep_from_the_cache_and_writes_the_same_page(swept, models):
    out, _ = swept
    before = (out / "report.md").read_text()
    res = runner().invoke(cli, ["report", "--model", str(models[0]), "--model", str(models[1]), "--name", "A",
                                "--name", "B", "--out", str(out), *SWEEP])
    assert res.exit_code == 0, res.stderr
    assert res.stdout.count("cached") == 2 and "computed" not in res.stdout  # both models' robust from the cache
    assert re.sub(CREATED, "", (out / "report.md").read_text()) == re.sub(CREATED, "", before)


def test_a_folder_cached_before_sweeps_still_resumes(tmp_path, models):
    """The attack: cache entries as jemeval wrote them before this change (records without
    ``converged``, no ``convergence``), under the quick preset's unchanged settings."""
    args = ["report", "--model", str(models[0]), "--out", str(tmp_path / "r"), "--sections", "robust",
            "--set", "robust.n=10", "--set", "robust.steps=2", "--device", "cpu"]
    assert runner().invoke(cli, args).exit_code == 0
    (entry,) = (tmp_path / "r" / "cache").glob("robust-*.json")
    data = json.loads(entry.read_text())
    for run in data["runs"]:
        for r in run["records"]:
            del r["converged"]
        assert "convergence" not in run
    data["checksum"] = checksum(data)
    entry.write_text(json.dumps(data, indent=1) + "\n")
    page = (tmp_path / "r" / "report.md").read_text()
    res = runner().invoke(cli, args)
    assert res.exit_code == 0, res.stderr
    assert " robust " in res.stdout and "cached" in res.stdout and "computed" not in res.stdout
    assert "recomputed" not in res.stderr and json.loads(entry.read_text()) == data  # used as it is
    assert re.sub(CREATED, "", (tmp_path / "r" / "report.md").read_text()) == re.sub(CREATED, "", page)
    assert "attack_converged" not in page and "Attack sweep" not in page
    assert not (tmp_path / "r" / "figures" / "robust-convergence.png").exists()


# -- --set parsing, the presets, a bad count ------------------------------------------------------------
def test_set_parses_count_lists_and_the_presets_sweep_nothing():
    assert parse_set(("robust.eot_samples=1,4,16", "robust.steps=10,50,100", "robust.eot-samples=[2,3]")) == {
        "robust": {"eot_samples": [2, 3], "steps": [10, 50, 100]}}
    for preset in PRESETS:
        (robust,) = resolve_options(preset=preset, sections=["robust"], dataset="digits", overrides={}).values()
        assert "eot_samples" not in robust and isinstance(robust["steps"], int)
    assert PRESETS["quick"]["robust"]["steps"] == 10 and PRESETS["paper"]["robust"]["steps"] == 100


@pytest.mark.parametrize("value, words", [("0,4", "robust.eot_samples: eot_samples must be whole numbers >= 1"),
                                          ("1,2.5", "robust.eot_samples: eot_samples must be whole numbers >= 1")])
def test_a_bad_count_is_one_line_before_anything_runs(tmp_path, models, value, words):
    before = snapshot(tmp_path)
    res = runner().invoke(cli, ["report", "--model", str(models[0]), "--out", str(tmp_path / "r"), "--sections",
                                "accuracy,robust", "--set", f"robust.eot_samples={value}", "--device", "cpu"])
    assert_one_line_refusal(res, words)
    assert snapshot(tmp_path) == before


def test_a_bad_steps_sweep_is_one_line(tmp_path, models):
    before = snapshot(tmp_path)
    res = runner().invoke(cli, ["report", "--model", str(models[0]), "--out", str(tmp_path / "r"), "--sections",
                                "robust", "--set", "robust.steps=10,-1", "--device", "cpu"])
    assert_one_line_refusal(res, "robust.steps: steps must be whole numbers >= 1")
    assert snapshot(tmp_path) == before
