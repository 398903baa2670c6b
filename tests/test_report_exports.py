"""`jemeval report --export openood,robustbench` and report.json's versioned schema (issue 26 items 5, 6;
issue 34 items 14, 15).

The exports are checked against the leaderboards' own files, kept in tests/data/leaderboards/ with
their source commits (OpenOOD v1.5's results/cifar10.csv; two RobustBench model_info files, its
ModelInfo dataclass and ThreatModel enum), and against the rules of their leaderboard code
(test_silent_exports.py writes them); their numbers against the report's records, recomputed here
(the near-group AUROC as the mean of the near sets' records, OpenOOD's cells as its eval_ood.py
writes them, RobustBench's percent strings as its update_json writes them). RobustBench has no
digits leaderboard: its files are written from a copy of the digits report relabelled cifar10 (the
export reads report.json alone). The attacks: a missing value (no autoattack, no near group, a
failed section, metadata not given) is '/' with a note in OpenOOD and a refusal naming the field in
RobustBench, never a number nor a null; a planted file or link at an export's name, a model name
with a path in it, an unknown format, a report.json of another schema version.
"""
from __future__ import annotations

import copy
import json
import os
import shutil
import statistics
import sys
from pathlib import Path

import pytest
from helpers import quick_digits_cnn
from test_bad_inputs import assert_one_line_refusal, runner, snapshot

import jemeval
from jemeval.cli import cli
from jemeval.errors import UsageError
from jemeval.reports import exports as X
from jemeval.reports.cache import EXPORT_NAMES, MANIFEST, REPORT_SCHEMA

DATA = Path(__file__).parent / "data" / "leaderboards"
OPENOOD = json.loads((DATA / "openood_v1.5.json").read_text(encoding="utf-8"))
ROBUSTBENCH = json.loads((DATA / "robustbench_model_info.json").read_text(encoding="utf-8"))
#: the paper's fields RobustBench wants and a report cannot know, as a user gives them
PAPER = {"name": "Your Classifier is Secretly an Energy Based Model and You Should Treat It Like One",
         "link": "https://arxiv.org/abs/1912.03263",
         "authors": "Will Grathwohl, Kuan-Chieh Wang, Jorn-Henrik Jacobsen, David Duvenaud, Mohammad Norouzi, "
                    "Kevin Swersky", "venue": "ICLR 2020", "reported": 40.5, "additional_data": False}
#: two models, three sections, OpenOOD's near/far groups, pgd and a short autoattack (seconds on one core)
ARGS = ["--sections", "accuracy,ood,robust", "--n", "40", "--ood", "near,far", "--refine-steps", "0,1",
        "--epsilons", "0,0.5", "--norm", "l2", "--attack", "pgd,autoattack:steps=2,queries=20",
        "--set", "robust.n=8", "--set", "robust.steps=2", "--device", "cpu"]


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    folder = tmp_path_factory.mktemp("models")
    return [quick_digits_cnn(folder / f"m{s}.pt", s) for s in (0, 1)]


def report_cli(out, models, *extra, names=("JEM", "CLF")):
    args = ["report", "--out", str(out)]
    for m, name in zip(models, names):
        args += ["--model", str(m), "--name", name]
    return runner().invoke(cli, args + ARGS + [str(e) for e in extra])


@pytest.fixture(scope="module")
def exported(tmp_path_factory, models):
    """The report the exports are written from, through the command line (each test exports a copy)."""
    out = tmp_path_factory.mktemp("report") / "rep"
    res = report_cli(out, models, "--json")
    assert res.exit_code == 0, res.output + res.stderr
    return out, json.loads(res.stdout)


def export_metadata(values: dict) -> dict:
    """The export metadata as jemeval reads ``values`` (imported here: jemeval 0.3's exports had none)."""
    from jemeval.reports.leaderboards import export_metadata as read

    return read(values)


def as_cifar10(src: Path, dst: Path) -> dict:
    """A copy of report folder ``src`` whose report.json says it evaluated cifar10: the report the
    RobustBench exports are written from (RobustBench has no digits leaderboard)."""
    shutil.copytree(src, dst)
    data = json.loads((dst / "report.json").read_text())
    data["provenance"]["settings"]["data"] = "cifar10"
    (dst / "report.json").write_text(json.dumps(data))
    return data


def csv_rows(path: Path) -> tuple[list[str], list[dict[str, str]]]:
    import csv

    with open(path, encoding="utf-8", newline="") as fh:
        reader = csv.DictReader(fh)
        return list(reader.fieldnames), list(reader)


def recs(report: dict, section: str, model: str, **where) -> list[dict]:
    return [r for r in report["records"] if r["section"] == section and r["model"] == model
            and all(r.get(k) == v for k, v in where.items())]


# -- item 5 (issue 34 item 14): OpenOOD ------------------------------------------------------------
def test_openood_csv_is_openoods_file_and_holds_the_reports_numbers(tmp_path, exported, models):
    src, report = exported
    out = tmp_path / "rep"
    shutil.copytree(src, out)
    res = report_cli(out, models, "--export", "openood", "--set", "export.outlier_data=no")  # resumes, then exports
    assert res.exit_code == 0, res.output + res.stderr
    assert f"wrote {out / 'openood.csv'}" in res.stderr and "computed" not in res.stdout
    text = (out / "openood.csv").read_text(encoding="utf-8")
    real = (DATA / OPENOOD["result_file"]["copy"]).read_text(encoding="utf-8")
    assert text.split("\n")[0] == real.split("\n")[0] == OPENOOD["header"]  # the same columns, same order
    from test_silent_exports import OPENOOD_NUMBER, openood_rule_breaks

    assert openood_rule_breaks(text) == [] == openood_rule_breaks(real)  # the same cell grammar
    header, rows = csv_rows(out / "openood.csv")
    assert header == OPENOOD["fields"]
    assert [(r["Training"], r["Postprocessor"]) for r in rows] == [
        (m, p) for m in ("JEM", "CLF") for p in ("EBO", "MSP", "gradnorm")]  # logpx, maxprob, gradnorm
    assert {"EBO", "MSP"} <= set(OPENOOD["postprocessors_seen"])
    for row, score in zip(rows, ["logpx", "maxprob", "gradnorm"] * 2):
        model = row["Training"]
        for group, field in (("near", "Near-OOD_AUROC"), ("far", "Far-OOD_AUROC")):
            members = [r["auroc"] for r in recs(report, "ood", model, score=score, group=group) if r["ood"] != group]
            assert len(members) >= 2  # digits: near = interp, rotate; far = uniform, constant, gaussian
            assert OPENOOD_NUMBER.fullmatch(row[field]) and row[field].endswith(" ± 0.00")  # one run
            assert abs(float(row[field].split(" ± ")[0]) - 100 * statistics.fmean(members)) <= 0.005 + 1e-9
        (acc,) = [r["accuracy"] for r in recs(report, "accuracy", model, refine_steps=0)]
        assert row["ID_Accuracy"] == f"{100 * acc:.2f} ± 0.00"
        assert row["Arch"] == "cnn:width=4" and row["Outlier_Data"] == "No"
        assert row["Additional_Description"] == ""  # these checkpoints record no epochs; OpenOOD leaves it empty


# -- item 5 (issue 34 item 15): RobustBench -------------------------------------------------------------
def test_robustbench_model_info_is_robustbenchs_file_and_holds_the_reports_numbers(tmp_path, exported):
    src, report = exported
    out = tmp_path / "rep"
    as_cifar10(src, out)
    written = X.write_exports(out, "robustbench", metadata=export_metadata(PAPER))
    assert sorted(p.name for p in written) == ["robustbench-CLF-L2.json", "robustbench-JEM-L2.json"]
    from test_silent_exports import robustbench_rule_breaks

    real = {rel: json.loads((DATA / rel).read_text()) for rel in ROBUSTBENCH["real_files"]["files"]}
    example = real["robustbench_cifar10_Linf/Carmon2019Unlabeled.json"]
    for model in ("JEM", "CLF"):
        info = json.loads((out / f"robustbench-{model}-L2.json").read_text(encoding="utf-8"))
        assert robustbench_rule_breaks(info) == []
        assert list(info)[:12] == list(example)[:12] == ROBUSTBENCH["fields"][:12]  # RobustBench's order
        assert set(info) <= set().union(*map(set, real.values()))  # no key its files do not have
        for key in example:
            assert type(info[key]) is type(example[key]), key  # "95.49", 1, "0.5", false
        # the defence: K = 1 (the largest run), 5 chains; autoattack at RobustBench's L2 eps 0.5
        (acc,) = [r["accuracy"] for r in recs(report, "accuracy", model, refine_steps=1)]
        aa = [r["robust_accuracy"] for r in recs(report, "robust", model, attack="autoattack", refine_steps=1)
              if abs(r["epsilon"] - 0.5) < 1e-12]
        assert aa and info["autoattack_acc"] == str(round(100 * min(aa), 2))
        assert info["clean_acc"] == str(round(100 * acc, 2))
        assert (info["eps"], info["dataset"], info["number_forward_passes"]) == ("0.5", "cifar10", 1 * 5 + 1)
        assert {k: info[k] for k in PAPER} == {**PAPER, "reported": "40.5"}
        # SGLD refinement draws noise: RobustBench's unreliable, said in the footnote
        assert info["unreliable"] is True and "stochastic" in info["footnote"]


def test_robustbench_is_refused_before_anything_runs_where_it_would_be_rejected(tmp_path, models):
    """digits has no RobustBench leaderboard, the paper's fields are not given, no autoattack ran at
    its epsilon: each named in one line, before any section runs (no folder made)."""
    before = snapshot(tmp_path)
    res = report_cli(tmp_path / "new", models, "--export", "robustbench")
    assert_one_line_refusal(res, "--export would write files the leaderboards reject: robustbench: model 'JEM' lacks "
                                 "name, link, authors, venue, reported, additional_data")
    assert "RobustBench has leaderboards for cifar10, cifar100, imagenet only, and the report evaluates 'digits'" \
        in res.stderr and "--set export.metadata=FILE" in res.stderr
    res = report_cli(tmp_path / "new", models, "--export", "openood")
    assert_one_line_refusal(res, "openood: model 'JEM' lacks outlier_data; openood: model 'CLF' lacks outlier_data")
    res = report_cli(tmp_path / "new", models, "--export", "openood", "--set", "export.outlier_data=perhaps")
    assert_one_line_refusal(res, "outlier_data is true or false (yes or no), got 'perhaps'")
    res = report_cli(tmp_path / "new", models, "--export", "openood", "--set", "export.outlier_data=no",
                     "--set", "export.JEMM.venue=ICLR 2020")
    assert_one_line_refusal(res, "export metadata names model 'JEMM' (did you mean 'JEM'?)")
    assert snapshot(tmp_path) == before
    plan = {"robust": {"norm": ["l2", "linf"], "attacks": ["pgd"], "epsilons": {"l2": [0, 1], "linf": [8 / 255]}}}
    problems = X.plan_problems(["robustbench"], export_metadata(PAPER), ["JEM"], dataset="cifar10", plan=plan)
    assert problems == ["robustbench: L2: no autoattack run (add --attack ...,autoattack)",
                        "robustbench: L2: no epsilon 0.5 (0.5), RobustBench's (add it to --epsilons)",
                        "robustbench: Linf: no autoattack run (add --attack ...,autoattack)"]


def test_metadata_from_a_file_and_per_model(tmp_path, exported):
    src, _ = exported
    out = tmp_path / "rep"
    as_cifar10(src, out)
    (tmp_path / "meta.json").write_text(json.dumps({**PAPER, "CLF": {"name": "A plain classifier", "reported": "1"}}))
    metadata = export_metadata({"metadata": str(tmp_path / "meta.json"), "CLF.venue": "arXiv"})
    X.write_exports(out, "robustbench", metadata=metadata)
    jem, clf = (json.loads((out / f"robustbench-{m}-L2.json").read_text()) for m in ("JEM", "CLF"))
    assert (jem["name"], jem["venue"], jem["reported"]) == (PAPER["name"], "ICLR 2020", "40.5")
    assert (clf["name"], clf["venue"], clf["reported"], clf["link"]) == ("A plain classifier", "arXiv", "1",
                                                                          PAPER["link"])
    with pytest.raises(UsageError, match="unknown field 'venu' \\(did you mean 'venue'\\?\\)"):
        export_metadata({"venu": "ICLR"})
    with pytest.raises(UsageError, match="reported is the robust accuracy the paper reports, in percent"):
        export_metadata({"reported": "high"})


def test_a_seed_group_is_one_row_mean_and_numpy_std_over_its_runs(tmp_path, models):
    """Two checkpoints under one name: OpenOOD's `mean ± std` (numpy's std over the runs, as its
    eval_ood.py), RobustBench's mean."""
    out = tmp_path / "rep"
    res = runner().invoke(cli, ["report", "--model", str(models[0].parent / "m*.pt"), "--name", "G", "--out", str(out),
                                "--sections", "accuracy,ood", "--n", "30", "--ood", "near,far", "--score", "maxprob",
                                "--refine-steps", "0", "--device", "cpu", "--export", "openood", "--set",
                                "export.outlier_data=false"])
    assert res.exit_code == 0, res.output + res.stderr
    report = json.loads((out / "report.json").read_text())
    _, rows = csv_rows(out / "openood.csv")
    assert [(r["Training"], r["Postprocessor"], r["Outlier_Data"]) for r in rows] == [("G", "MSP", "No")]
    near = [r["auroc"] for r in recs(report, "ood", "G", group="near", ood="near")]
    acc = [r["accuracy"] for r in recs(report, "accuracy", "G", refine_steps=0)]
    assert len(near) == len(acc) == 2  # one record per run
    import numpy as np

    assert rows[0]["Near-OOD_AUROC"] == f"{np.mean(100 * np.array(near)):.2f} ± {np.std(100 * np.array(near)):.2f}"
    assert rows[0]["ID_Accuracy"] == f"{np.mean(100 * np.array(acc)):.2f} ± {np.std(100 * np.array(acc)):.2f}"
    data = as_cifar10(out, tmp_path / "c10")
    gaps: dict = {}
    info = X.robustbench_files(data, metadata=export_metadata(PAPER), gaps=gaps)["robustbench-G-none.json"]
    assert info["clean_acc"] == str(round(100 * statistics.fmean(acc), 2)) and "mean of 2" in info["footnote"]
    assert info["autoattack_acc"] is None and gaps["robustbench-G-none.json"]["autoattack_acc"] == \
        "the report has no robust section"
    with pytest.raises(UsageError, match="robustbench-G-none.json: eps, autoattack_acc, unreliable would be null "
                                         "\\(the report has no robust section\\)"):
        X.write_exports(tmp_path / "c10", "robustbench", metadata=export_metadata(PAPER))
    assert not list((tmp_path / "c10").glob("robustbench-*"))


def test_missing_values_are_a_slash_or_a_refusal_never_a_number_or_null(tmp_path, models):
    """No near/far groups, no autoattack, K = 0 only: OpenOOD's '/' with a note; RobustBench refused,
    naming the field and why (quoting what the other attacks gave, never putting it in the field)."""
    out = tmp_path / "rep"
    jemeval.report({"M": str(models[0])}, out=out, sections="accuracy,ood,robust", n=30, ood=["uniform"],
                   refine_steps=[0], epsilons=[0, 0.5], options={"robust": {"n": 8, "steps": 2}}, device="cpu",
                   progress=False)
    notes: list[str] = []
    X.write_exports(out, ["openood"], metadata=export_metadata({"outlier_data": "yes"}), notes=notes)
    _, rows = csv_rows(out / "openood.csv")
    for row in rows:
        assert row["Near-OOD_AUROC"] == row["Far-OOD_AUROC"] == "/" and row["ID_Accuracy"].endswith(" ± 0.00")
        assert row["Outlier_Data"] == "Yes"
    assert "openood.csv M logpx: Near-OOD_AUROC is '/': the report has no near group (run it with --ood near,far)" \
        in notes
    data = as_cifar10(out, tmp_path / "c10")
    report = json.loads((out / "report.json").read_text())
    pgd = [r["robust_accuracy"] for r in recs(report, "robust", "M", attack="pgd") if r["epsilon"] == 0.5]
    gaps: dict = {}
    info = X.robustbench_files(data, metadata=export_metadata(PAPER), gaps=gaps)["robustbench-M-L2.json"]
    assert info["autoattack_acc"] is None and info["number_forward_passes"] == 1
    why = gaps["robustbench-M-L2.json"]["autoattack_acc"]
    assert why.startswith("the report has no autoattack record at eps 0.5, K = 0")
    assert f"pgd (full) gave {round(100 * pgd[0], 2)}" in why  # said, not put in the field
    before = snapshot(tmp_path / "c10")
    with pytest.raises(UsageError, match="robustbench-M-L2.json: autoattack_acc would be null \\(the report has no "
                                         "autoattack record at eps 0.5"):
        X.write_exports(tmp_path / "c10", "robustbench", metadata=export_metadata(PAPER))
    assert snapshot(tmp_path / "c10") == before
    fired = [c["message"] for run in report["runs"] for c in run.get("checks", []) if not c["passed"]]
    assert info["unreliable"] is bool(fired) and "stochastic" not in info["footnote"]  # K = 0: deterministic


def test_a_failed_check_or_a_failed_section_is_said(exported):
    _, report = exported
    data = copy.deepcopy(report)
    data["provenance"]["settings"]["data"] = "cifar10"
    meta = export_metadata(PAPER)
    for run in data["runs"]:
        for check in run.get("checks", []):
            check["passed"] = True
    calm = X.robustbench_files(data, refine_steps=0, metadata=meta)["robustbench-JEM-L2.json"]
    assert calm["unreliable"] is False and "unreliable" not in calm["footnote"]
    run = next(r for r in data["runs"] if r["section"] == "robust" and r["model"] == "JEM")
    run["checks"][0].update(passed=False, message="WARNING: planted: accuracy rises with epsilon")
    fired = X.robustbench_files(data, refine_steps=0, metadata=meta)["robustbench-JEM-L2.json"]
    assert fired["unreliable"] is True and "WARNING: planted: accuracy rises with epsilon" in fired["footnote"]
    # the robust section failed for CLF: refused, the failure named
    data["records"] = [r for r in data["records"] if not (r["section"] == "robust" and r["model"] == "CLF")]
    data["runs"] = [r for r in data["runs"] if not (r["section"] == "robust" and r["model"] == "CLF")]
    data["errors"] = [{"section": "robust", "model": "CLF", "error": "out of memory"}]
    gaps: dict = {}
    info = X.robustbench_files(data, metadata=meta, gaps=gaps)["robustbench-CLF-none.json"]
    assert info["autoattack_acc"] is info["eps"] is info["unreliable"] is None
    assert gaps["robustbench-CLF-none.json"]["autoattack_acc"] == "the robust section failed (out of memory)"
    with pytest.raises(UsageError, match="robustbench-CLF-none.json: eps, autoattack_acc, unreliable would be null "
                                         "\\(the robust section failed \\(out of memory\\)\\)"):
        X.export_texts(data, ["robustbench"], metadata=meta)


def test_exports_are_listed_kept_on_resume_and_replaced_only_when_listed(tmp_path, exported, models):
    src, _ = exported
    out = tmp_path / "rep"
    as_cifar10(src, out)
    X.write_exports(out, "robustbench", metadata=export_metadata(PAPER))
    listed = set(json.loads((out / MANIFEST).read_text())["files"])
    assert {"robustbench-JEM-L2.json", "robustbench-CLF-L2.json"} <= listed
    kept = (out / "robustbench-CLF-L2.json").read_bytes()
    # a renamed model's stale export goes; the other stays as it was
    data = json.loads((out / "report.json").read_text().replace('"JEM', '"JEM2'))
    (out / "report.json").write_text(json.dumps(data))
    X.write_exports(out, "robustbench", metadata=export_metadata(PAPER))
    assert (out / "robustbench-JEM2-L2.json").is_file() and not (out / "robustbench-JEM-L2.json").exists()
    assert (out / "robustbench-CLF-L2.json").read_bytes() == kept
    # the folder still resumes (its manifest lists exports), and another format's files stay
    res = report_cli(out, models, "--export", "openood", "--set", "export.outlier_data=no", names=("JEM2", "CLF"))
    assert res.exit_code == 0, res.output + res.stderr
    assert "cached" in res.stdout and "computed" not in res.stdout  # the status table: nothing recomputed
    assert (out / "robustbench-JEM2-L2.json").is_file() and (out / "openood.csv").is_file()
    assert "openood.csv" in json.loads((out / MANIFEST).read_text())["files"]


def test_a_planted_file_or_link_at_an_exports_name_is_refused(tmp_path, exported, models):
    src, _ = exported
    for attack in ("file", "link"):
        home = tmp_path / attack
        out = home / "rep"
        shutil.copytree(src, out)
        outside = home / "precious.json"
        outside.write_text("mine\n")
        victim = out / "openood.csv"  # not jemeval's: the manifest does not list it
        victim.write_text("a user's table\n") if attack == "file" else victim.symlink_to(outside)
        assert victim.name not in json.loads((out / MANIFEST).read_text())["files"]
        before = {k: v for k, v in snapshot(home).items() if not k.startswith("rep/report.") and "figures" not in k
                  and "cache" not in k and MANIFEST not in k}
        res = report_cli(out, models, "--export", "openood", "--set", "export.outlier_data=no")
        expected = "which jemeval did not write" if attack == "file" else "is a symbolic link"
        assert_one_line_refusal(res, expected)
        assert "the report is written to" in res.stderr and "its export is not" in res.stderr
        after = snapshot(home)
        assert {k: after.get(k) for k in before} == before
        assert outside.read_text() == "mine\n"


def test_a_model_name_cannot_put_an_export_elsewhere(exported):
    _, report = exported
    data = json.loads(json.dumps(report).replace('"JEM"', '"../../x/evil"').replace('"CLF"', '"..\\\\evil"'))
    names = list(X.robustbench_files(data))
    assert len(names) == 2 and all(EXPORT_NAMES.fullmatch(n) and "/" not in n and "\\" not in n for n in names)


def test_an_unknown_export_is_one_line_with_a_suggestion(tmp_path, models):
    before = snapshot(tmp_path)
    res = report_cli(tmp_path / "new", models, "--export", "openood,robustbnech")
    assert_one_line_refusal(res, "export 'robustbnech' is not a leaderboard format (did you mean 'robustbench'?)")
    assert "--export" in res.stderr and snapshot(tmp_path) == before  # nothing computed, no folder made
    with pytest.raises(UsageError, match="did you mean 'openood'"):
        X.export_formats("openod")


# -- item 6: report.json's schema -------------------------------------------------------------------
def _keywords(schema: dict) -> set[str]:
    found = set(schema)
    for sub in list(schema.get("properties", {}).values()) + ([schema["items"]] if "items" in schema else []):
        found |= _keywords(sub)
    return found


def test_report_json_is_versioned_and_valid_against_the_shipped_schema(exported):
    out, report = exported
    assert report["schema"] == REPORT_SCHEMA == "jemeval-report/2"
    schema = X.report_schema()
    assert schema["properties"]["schema"]["enum"] == ["jemeval-report/1", REPORT_SCHEMA]
    assert X.schema_problems(report) == [] and X.schema_problems(json.loads((out / "report.json").read_text())) == []
    # the checker checks every keyword the schema uses (none silently ignored)
    assert _keywords(schema) <= set(X.CHECKED_KEYWORDS) | set(X.ANNOTATIONS)
    import jsonschema  # the library the hand-written checker must agree with (test extra)

    validator = jsonschema.Draft202012Validator(schema)
    assert list(validator.iter_errors(report)) == []
    # tampered copies fail, each naming what is wrong
    broken = copy.deepcopy(report)
    del broken["records"][3]["model"]
    broken["provenance"]["command"] = "ood"
    broken["errors"] = [{"section": "robust", "model": "JEM", "error": 3}]
    problems = X.schema_problems(broken)
    assert len(problems) == len(list(validator.iter_errors(broken))) == 3
    assert any("records[3] has no 'model'" in p for p in problems)
    assert any("provenance.command is 'ood', not 'report'" in p for p in problems)
    assert any("errors[0].error is int, not string" in p for p in problems)


def test_the_schema_ships_in_the_package():
    if sys.version_info >= (3, 11):
        import tomllib
    else:  # pragma: no cover
        import tomli as tomllib
    root = Path(__file__).parent.parent
    config = tomllib.loads((root / "pyproject.toml").read_text())
    globs = config["tool"]["setuptools"]["package-data"]["jemeval"]
    shipped = {p for g in globs for p in (root / "jemeval").glob(g)}
    assert root / "jemeval" / "reports" / "schema" / "report.schema.json" in shipped


def test_an_old_report_folder_resumes_and_exports(tmp_path, exported, models):
    """A report.json as jemeval 0.2 wrote it (no "schema"): exported as is, and the rerun resumes from the
    cache and writes the versioned one. A report.json of an unknown version is refused in one line."""
    src, _ = exported
    out = tmp_path / "rep"
    shutil.copytree(src, out)
    old = json.loads((out / "report.json").read_text())
    old.pop("schema")
    for key in ("groups", "comparisons", "summary", "cost"):  # what 0.3 adds
        old.pop(key, None)
    (out / "report.json").write_text(json.dumps(old))
    assert {p.name for p in X.write_exports(out, "openood", metadata=export_metadata({"outlier_data": False}))} == {
        "openood.csv"}
    res = report_cli(out, models)
    assert res.exit_code == 0, res.output + res.stderr
    assert "cached" in res.stdout and "computed" not in res.stdout  # resumed from the cache
    assert json.loads((out / "report.json").read_text())["schema"] == REPORT_SCHEMA
    future = json.loads((out / "report.json").read_text()) | {"schema": "jemeval-report/9"}
    (out / "report.json").write_text(json.dumps(future))
    before = snapshot(out)
    with pytest.raises(UsageError, match="has schema 'jemeval-report/9'; this jemeval reads jemeval-report/1, "
                                         "jemeval-report/2"):
        X.write_exports(out, "openood,robustbench")
    assert snapshot(out) == before
    assert os.path.isfile(out / "openood.csv")
