"""`jemeval report`: the single commands' numbers side by side, cached per (model, section), one page.

The report's numbers are checked against the single commands run alone with the same settings (the
command line and the Python functions); the page against what it must show (tables with the best
in bold, every figure inlined in the HTML); the cache against reruns, changed settings and --force;
and a section failing for one model against the rest of the report.
"""
from __future__ import annotations

import base64
import json
import re
from html.parser import HTMLParser
from pathlib import Path

import pytest
from click.testing import CliRunner
from helpers import without_timings

import jemeval
from jemeval.cli import cli
from jemeval.cli.commands.report import parse_set
from jemeval.evaluation.accuracy import evaluate
from jemeval.evaluation.ood.evaluate import evaluate_ood
from jemeval.formats.native import save_checkpoint
from jemeval.provenance import file_sha256
from jemeval.reports.build import default_names
from jemeval.reports.tables import section_tables

#: small settings for every section (two models, all five sections: seconds on one core)
TINY = ["--n", "40", "--refine-steps", "0,1", "--epsilons", "0,1", "--set", "robust.n=8", "--set", "robust.steps=2",
        "--set", "samples.n=2", "--set", "samples.steps=4", "--device", "cpu"]


def run(*args):
    return CliRunner().invoke(cli, [str(a) for a in args])




def of(records, section, model):
    """The records of one (section, model), as the single command gives them."""
    return [{k: v for k, v in r.items() if k not in ("section", "model")} for r in records
            if r["section"] == section and r["model"] == model]


@pytest.fixture(scope="module")
def built(tmp_path_factory, digits_jem_ckpt, digits_classifier_ckpt):
    """A full report of the JEM and the classifier through the command line (all five sections)."""
    out = tmp_path_factory.mktemp("report") / "rep"
    result = run("report", "--model", digits_jem_ckpt, "--model", digits_classifier_ckpt, "--name", "JEM",
                 "--name", "CLF", "--out", out, *TINY, "--json")
    assert result.exit_code == 0, result.output
    return out, json.loads(result.stdout)


# -- the numbers are the single commands' -----------------------------------------------------------
def test_report_numbers_equal_the_single_commands(built, digits_jem_ckpt, digits_classifier_ckpt):
    out, report = built
    singles = {
        "accuracy": "eval --n 40 --refine-steps 0,1",
        "calibration": "calibrate --n 40 --temperature-scaling",
        "ood": "ood --n 40 --ood uniform,constant,interp,gaussian",
        "robust": "robust --norm l2 --n 8 --steps 2 --refine-steps 0,1 --epsilons 0,1",
        "samples": "sample --class all --n 2 --steps 4",
    }
    for name, ckpt in (("JEM", digits_jem_ckpt), ("CLF", digits_classifier_ckpt)):
        for section, args in singles.items():
            alone = run(*args.split(), "--model", ckpt, "--device", "cpu", "--json")
            assert alone.exit_code == 0, alone.output
            expected = json.loads(alone.stdout)["records"]
            assert without_timings(of(report["records"], section, name)) == without_timings(expected), (name, section)
    assert json.loads((out / "report.json").read_text()) == report


def test_python_api_returns_the_results_and_paths(tmp_path, digits_classifier_ckpt):
    result = jemeval.report({"CLF": digits_classifier_ckpt}, out=tmp_path / "r", sections="accuracy,ood", n=30,
                            seed=3, ood=["uniform"], device="cpu", progress=False)
    alone = evaluate(digits_classifier_ckpt, n=30, seed=3, refine_steps=[0, 1], device="cpu", progress=False)
    assert result.results["CLF"]["accuracy"][0].records == alone.records
    ood = evaluate_ood(digits_classifier_ckpt, ["uniform"], n=30, seed=3, device="cpu", progress=False)
    assert result.results["CLF"]["ood"][0].records == ood.records
    assert result.results["CLF"]["ood"][0].extra["scores"].ood_names == ["uniform"]  # the scores, for figures
    assert of(result.records, "ood", "CLF") == ood.records
    assert [s["status"] for s in result.status] == ["computed", "computed"] and result.errors == {"CLF": {}}
    assert {k: Path(v).name for k, v in result.paths.items() if k != "figures"} == {
        "dir": "r", "markdown": "report.md", "html": "report.html", "json": "report.json"}
    assert sorted(p.name for p in result.paths["figures"]) == ["ood-histograms-1-CLF.png", "ood-roc.png"]
    models = result.provenance["settings"]["models"]
    assert models == [{"name": "CLF", "checkpoint": str(digits_classifier_ckpt),
                       "sha256": file_sha256(digits_classifier_ckpt), "arch": "cnn", "dataset": "digits"}]
    assert result.provenance["settings"]["options"]["ood"]["seed"] == 3 and result.provenance["device"] == "cpu"


# -- the page -------------------------------------------------------------------------------------------
class Images(HTMLParser):
    def __init__(self):
        super().__init__()
        self.sources, self.links = [], []

    def handle_starttag(self, tag, attrs):
        attrs = dict(attrs)
        if tag == "img":
            self.sources.append(attrs["src"])
        if tag in ("link", "script", "iframe") or (tag == "a" and attrs.get("href", "").startswith("http")):
            self.links.append(tag)


def test_page_markdown_and_self_contained_html(built):
    out, report = built
    md = (out / "report.md").read_text()
    for heading in ("# jemeval report: JEM vs CLF", "## Accuracy and NLL", "## Calibration", "## OOD detection",
                    "## Adversarial robustness", "## Samples", "## Provenance"):
        assert f"\n{heading}\n" in f"\n{md}"
    figures = re.findall(r"!\[[^\]]*\]\((figures/[^)]+\.png)\)", md)
    assert len(figures) == 7 and all((out / f).is_file() for f in figures)  # reliability, ROC, 2 histograms, ...
    assert sorted(p.name for p in (out / "figures").iterdir()) == sorted(Path(f).name for f in figures)
    # the best AUROC of a row is bold only when its paired test (after Holm over every test) says so
    row = next(line for line in md.splitlines() if line.startswith("| logpx | uniform |"))
    cells = [c.strip() for c in row.strip("|").split("|")]
    auroc = {r["model"]: round(r["auroc"], 4) for r in report["records"]
             if r["section"] == "ood" and r["score"] == "logpx" and r["ood"] == "uniform"}
    (test,) = [c for c in report["comparisons"] if (c["metric"], c.get("score"), c.get("ood")) == ("auroc", "logpx",
                                                                                                   "uniform")]
    best = max(auroc, key=auroc.get) if test["significant"] and auroc["JEM"] != auroc["CLF"] else None
    assert cells[2].startswith("**") == (best == "JEM") and cells[3].startswith("**") == (best == "CLF")
    assert "SHA-256" in md and file_sha256(report["provenance"]["settings"]["models"][0]["checkpoint"])[:16] in md

    parser = Images()
    parser.feed((out / "report.html").read_text())
    assert len(parser.sources) == 7 and parser.links == []
    for src in parser.sources:  # every figure is inside the page, as a PNG
        assert src.startswith("data:image/png;base64,")
        assert base64.b64decode(src.split(",", 1)[1])[:8] == b"\x89PNG\r\n\x1a\n"


def test_records_carry_section_and_model_and_the_provenance_the_hashes(built, digits_jem_ckpt):
    _, report = built
    assert {(r["section"], r["model"]) for r in report["records"]} == {
        (s, m) for s in ("accuracy", "calibration", "ood", "robust", "samples") for m in ("JEM", "CLF")}
    prov = report["provenance"]
    assert prov["command"] == "report" and prov["settings"]["preset"] == "quick"
    assert prov["settings"]["models"][0]["sha256"] == file_sha256(digits_jem_ckpt)
    assert {s: o["seed"] for s, o in prov["settings"]["options"].items()} == dict.fromkeys(
        ("accuracy", "calibration", "ood", "robust", "samples"), 0)
    runs = report["runs"]  # each section's own provenance, as the single command records it
    assert {(r["section"], r["model"], r["provenance"]["command"]) for r in runs} >= {
        ("robust", "JEM", "robust"), ("accuracy", "CLF", "eval"), ("samples", "JEM", "sample")}
    assert report["errors"] == []


def test_best_value_per_row_is_marked_by_direction():
    tables = section_tables("ood", {
        "A": [{"score": "logpx", "ood": "u", "auroc": 0.9, "fpr95": 0.3, "n_id": 5, "n_ood": 5, "plugin_m": 0.5}],
        "B": [{"score": "logpx", "ood": "u", "auroc": 0.8, "fpr95": 0.1, "n_id": 5, "n_ood": 5, "plugin_m": 0.7}],
        "C": [{"score": "logpx", "ood": "u", "auroc": 0.9, "fpr95": None, "n_id": 5, "n_ood": 5}],
    })
    by_title = {t.title: t for t in tables}
    assert list(by_title) == ["AUROC (higher is better)", "FPR95 (lower is better)", "plugin_m"]
    auroc, fpr, plugin = by_title.values()
    assert auroc.rows == [["logpx", "u", "0.9000", "0.8000", "0.9000"]]
    assert auroc.best == [[False, False, True, False, True]]  # the tie: both best
    assert fpr.rows[0][2:] == ["0.3000", "0.1000", "-"] and fpr.best[0][2:] == [False, True, False]
    assert plugin.best[0] == [False] * 5  # unknown direction: nothing marked
    (single,) = section_tables("accuracy", {"A": [{"refine_steps": 0, "accuracy": 0.5, "nll": 1.0, "n": 4}]})
    assert single.rows == [["0", "accuracy ↑", "0.5000"], ["0", "NLL ↓", "1.0000"]] and not any(map(any, single.best))
    (robust,) = section_tables("robust", {"A": [{"norm": "linf", "attack": "pgd", "grad_mode": "full",
                                                 "refine_steps": 1, "epsilon": 8 / 255, "robust_accuracy": 0.5,
                                                 "ci_low": 0.25, "ci_high": 0.75}]})
    assert robust.rows == [["linf", "pgd", "full", "1", "8/255", "robust accuracy ↑", "0.5000 [0.250, 0.750]"]]


# -- the cache --------------------------------------------------------------------------------------------
def test_rerun_reuses_changed_settings_recompute_force_recomputes_all(tmp_path, digits_classifier_ckpt):
    def report(**kw):
        return jemeval.report([digits_classifier_ckpt], names=["CLF"], out=tmp_path / "r",
                              sections=["accuracy", "calibration"], device="cpu", progress=False, **kw)

    first = report(n=30)
    text = (tmp_path / "r" / "report.json").read_text()
    again = report(n=30)
    assert [s["status"] for s in again.status] == ["cached", "cached"]
    written = json.loads((tmp_path / "r" / "report.json").read_text())
    assert without_timings(written) == without_timings(json.loads(text))
    assert again.records == first.records and (tmp_path / "r" / "report.md").read_text().count("0.") > 10
    changed = report(n=30, options={"accuracy": {"refine_steps": [0]}})
    assert [s["status"] for s in changed.status] == ["computed", "cached"]
    assert [r["refine_steps"] for r in of(changed.records, "accuracy", "CLF")] == [0]
    assert [s["status"] for s in report(n=30, force=True, options={"accuracy": {"refine_steps": [0]}}).status] == [
        "computed", "computed"]


def test_a_failing_section_is_shown_and_the_rest_written(tmp_path, digits_jem_ckpt, digits_classifier_ckpt):
    # the classifier's checkpoint has no replay buffer to start chains from; the JEM's has one
    result = run("report", "--model", digits_jem_ckpt, "--model", digits_classifier_ckpt, "--name", "JEM", "--name",
                 "CLF", "--out", tmp_path / "r", "--sections", "accuracy,samples", "--n", "20", "--set",
                 "samples.init=buffer", "--set", "samples.n=1", "--set", "samples.steps=2", "--device", "cpu")
    assert result.exit_code == 1
    (line,) = result.stderr.strip().splitlines()[-1:]
    assert line.startswith("Error: the report was written to") and "1 section(s) failed: CLF / samples:" in line
    assert "stores no replay buffer" in line
    md = (tmp_path / "r" / "report.md").read_text()
    assert "- **CLF**: failed: checkpoint" in md and "stores no replay buffer" in md
    report = json.loads((tmp_path / "r" / "report.json").read_text())
    assert {(r["section"], r["model"]) for r in report["records"]} == {
        ("accuracy", "JEM"), ("accuracy", "CLF"), ("samples", "JEM")}
    assert [(e["section"], e["model"]) for e in report["errors"]] == [("samples", "CLF")]
    assert sorted(p.name for p in (tmp_path / "r" / "figures").iterdir()) == ["samples-1-JEM.png"]
    assert not list((tmp_path / "r" / "cache").glob("samples-*" + file_sha256(digits_classifier_ckpt)[:16] + "*"))


# -- user mistakes: one line, before any work ---------------------------------------------------------------
def test_user_mistakes_are_one_line(tmp_path, digits_classifier_ckpt):
    other = tmp_path / "svhn.pt"
    save_checkpoint(other, jemeval.create_model("cnn", 10, (1, 8, 8), width=4), dataset="svhn")
    (tmp_path / "notes").mkdir()
    (tmp_path / "notes" / "a.txt").write_text("mine")
    ckpt = str(digits_classifier_ckpt)
    cases = [
        (["--sections", "acuracy"], 2, "unknown --sections 'acuracy' (did you mean 'accuracy'?)"),
        (["--name", "a", "--name", "b"], 2, "--name gives 2 name(s) for 1 model(s); give one per model"),
        (["--set", "robust.stepz=3"], 2, "robust has no option 'stepz' (did you mean 'steps'"),
        (["--set", "robust"], 2, "--set takes SECTION.KEY=VALUE"),
        (["--set", "robustness.steps=3"], 2, "unknown section 'robustness' in --set (did you mean 'robust'?)"),
        (["--model", str(other)], 2, "trained on different datasets (digits, svhn); give --data"),
        (["--out", str(tmp_path / "notes")], 2, "holds other files (a.txt) and no report; choose a new or empty"),
        (["--out", str(tmp_path / "missing" / "r")], 2, "does not exist; create it first"),
        (["--out", ckpt], 2, "is a file"),
        (["--preset", "fast"], 2, "'fast' is not one of 'quick', 'paper'"),
    ]
    for args, code, expected in cases:
        out = [] if "--out" in args else ["--out", str(tmp_path / "r")]
        result = run("report", "--model", ckpt, *out, *args, "--device", "cpu")
        assert result.exit_code == code, (args, result.output)
        lines = result.output.strip().splitlines()
        assert len(lines) == 1 and expected in lines[0], (args, result.output)
    assert not (tmp_path / "r").exists() and (tmp_path / "notes" / "a.txt").read_text() == "mine"


def test_names_and_set_values():
    assert default_names(["runs/digits/best.pt", "runs/digits-baseline/best.pt", "x/jem.pt"]) == [
        "digits", "digits-baseline", "jem"]
    assert default_names(["a/run/best.pt", "b/run/best.pt"]) == ["run (1)", "run (2)"]
    assert parse_set(("robust.grad-mode=bpda,eot", "samples.steps=200", "robust.epsilons=0,8/255",
                      "ood.bootstrap=0", "calibration.temperature_scaling=false")) == {
        "robust": {"grad_mode": ["bpda", "eot"], "epsilons": [0, 8 / 255]}, "samples": {"steps": 200},
        "ood": {"bootstrap": 0}, "calibration": {"temperature_scaling": False}}
