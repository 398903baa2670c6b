"""`jemeval report --export openood,robustbench` and report.json's versioned schema (issue 26 items 5, 6).

The exports' field names are checked against the anchors' own files, kept in tests/data/leaderboards/
with their source commit (OpenOOD v1.5's results/*.csv header; a RobustBench model_info file, its
ModelInfo dataclass and ThreatModel enum); their numbers against the report's records, recomputed
here (the near-group AUROC as the mean of the near sets' records, RobustBench's percent strings as
its update_json writes them). The attacks: a missing value (no autoattack, no near group, a failed
section) must be null with a note, never a number; a planted file or link at an export's name, a
model name with a path in it, an unknown format, a report.json of another schema version.
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
    """The report with both exports, through the command line."""
    out = tmp_path_factory.mktemp("report") / "rep"
    res = report_cli(out, models, "--export", "openood,robustbench", "--json")
    assert res.exit_code == 0, res.output + res.stderr
    for name in ("openood.csv", "robustbench-JEM.json", "robustbench-CLF.json"):
        assert f"wrote {out / name}" in res.stderr
    return out, json.loads(res.stdout)


def csv_rows(path: Path) -> tuple[list[str], list[dict[str, str]]]:
    import csv

    with open(path, encoding="utf-8", newline="") as fh:
        reader = csv.DictReader(fh)
        return list(reader.fieldnames), list(reader)


def recs(report: dict, section: str, model: str, **where) -> list[dict]:
    return [r for r in report["records"] if r["section"] == section and r["model"] == model
            and all(r.get(k) == v for k, v in where.items())]


# -- item 5: OpenOOD --------------------------------------------------------------------------------
def test_openood_csv_has_openoods_columns_and_the_reports_numbers(exported):
    out, report = exported
    header, rows = csv_rows(out / "openood.csv")
    assert header == OPENOOD["fields"] and ",".join(header) == OPENOOD["header"]
    assert [(r["Training"], r["Postprocessor"]) for r in rows] == [
        (m, p) for m in ("JEM", "CLF") for p in ("EBO", "MSP", "gradnorm")]  # logpx, maxprob, gradnorm
    assert {"EBO", "MSP"} <= set(OPENOOD["postprocessors_seen"])
    for row, score in zip(rows, ["logpx", "maxprob", "gradnorm"] * 2):
        model = row["Training"]
        for group, field in (("near", "Near-OOD_AUROC"), ("far", "Far-OOD_AUROC")):
            members = [r["auroc"] for r in recs(report, "ood", model, score=score, group=group) if r["ood"] != group]
            assert len(members) >= 2  # digits: near = interp, rotate; far = uniform, constant, gaussian
            assert abs(float(row[field]) - 100 * statistics.fmean(members)) <= 0.005 + 1e-9, (row, field)
        (acc,) = [r["accuracy"] for r in recs(report, "accuracy", model, refine_steps=0)]
        assert row["ID_Accuracy"] == f"{100 * acc:.2f}"
        assert row["Arch"] == "cnn:width=4"
        assert row["Outlier_Data"] == "" and "Outlier_Data: null" in row["Additional_Description"]
        assert f"jemeval score {score}" in row["Additional_Description"]


# -- item 5: RobustBench ----------------------------------------------------------------------------
def test_robustbench_model_info_has_robustbenchs_keys_and_the_reports_numbers(exported):
    out, report = exported
    example = ROBUSTBENCH["example"]
    allowed = set(ROBUSTBENCH["model_info_dataclass"]["fields"]) | {"unreliable", "threat_model"}
    for model in ("JEM", "CLF"):
        info = json.loads((out / f"robustbench-{model}.json").read_text(encoding="utf-8"))
        assert [k for k in info if k != "threat_model"] == ROBUSTBENCH["fields"]
        assert set(info) <= allowed and info["threat_model"] in ROBUSTBENCH["threat_model"]["values"]
        for key in ("number_forward_passes", "eps", "clean_acc", "autoattack_acc", "unreliable", "dataset"):
            assert type(info[key]) is type(example[key]), key  # RobustBench's types: "95.49", 1, "0.5", false
        # the defence: K = 1 (the largest run), 5 chains; autoattack at RobustBench's L2 eps 0.5
        (acc,) = [r["accuracy"] for r in recs(report, "accuracy", model, refine_steps=1)]
        aa = [r["robust_accuracy"] for r in recs(report, "robust", model, attack="autoattack", refine_steps=1)
              if abs(r["epsilon"] - 0.5) < 1e-12]
        assert aa and info["autoattack_acc"] == str(round(100 * min(aa), 2))
        assert info["clean_acc"] == str(round(100 * acc, 2))
        assert (info["threat_model"], info["eps"], info["dataset"]) == ("L2", "0.5", "digits")
        assert info["number_forward_passes"] == 1 * 5 + 1
        # SGLD refinement draws noise: RobustBench's unreliable, said in the footnote
        assert info["unreliable"] is True and "stochastic" in info["footnote"]
        for key in ("link", "name", "authors", "venue", "reported", "additional_data"):
            assert info[key] is None and key in info["footnote"]


def test_a_seed_group_is_one_row_mean_and_sd_over_its_runs(tmp_path, models):
    """Two checkpoints under one name: OpenOOD's `mean ± sd` (sample sd over the runs), RobustBench's mean."""
    out = tmp_path / "rep"
    res = runner().invoke(cli, ["report", "--model", str(models[0].parent / "m*.pt"), "--name", "G", "--out", str(out),
                                "--sections", "accuracy,ood", "--n", "30", "--ood", "near,far", "--score", "maxprob",
                                "--refine-steps", "0", "--device", "cpu", "--export", "openood,robustbench"])
    assert res.exit_code == 0, res.output + res.stderr
    report = json.loads((out / "report.json").read_text())
    _, rows = csv_rows(out / "openood.csv")
    assert [(r["Training"], r["Postprocessor"]) for r in rows] == [("G", "MSP")]
    near = [r["auroc"] for r in recs(report, "ood", "G", group="near", ood="near")]
    acc = [r["accuracy"] for r in recs(report, "accuracy", "G", refine_steps=0)]
    assert len(near) == len(acc) == 2  # one record per run
    assert rows[0]["Near-OOD_AUROC"] == f"{100 * statistics.fmean(near):.2f} ± {100 * statistics.stdev(near):.2f}"
    assert rows[0]["ID_Accuracy"] == f"{100 * statistics.fmean(acc):.2f} ± {100 * statistics.stdev(acc):.2f}"
    info = json.loads((out / "robustbench-G.json").read_text())
    assert info["clean_acc"] == str(round(100 * statistics.fmean(acc), 2)) and "mean of 2" in info["footnote"]
    assert info["autoattack_acc"] is None and "the report has no robust section" in info["footnote"]


def test_missing_values_are_null_with_a_note_never_a_number(tmp_path, models):
    """No near/far groups, no autoattack, K = 0 only: the exports hold nulls and say why."""
    out = tmp_path / "rep"
    jemeval.report({"M": str(models[0])}, out=out, sections="accuracy,ood,robust", n=30, ood=["uniform"],
                   refine_steps=[0], epsilons=[0, 0.5], options={"robust": {"n": 8, "steps": 2}}, device="cpu",
                   progress=False)
    X.write_exports(out, ["openood", "robustbench"])
    _, rows = csv_rows(out / "openood.csv")
    for row in rows:
        assert row["Near-OOD_AUROC"] == row["Far-OOD_AUROC"] == "" and row["ID_Accuracy"] != ""
        assert "Near-OOD_AUROC: null, the report has no near group" in row["Additional_Description"]
    info = json.loads((out / "robustbench-M.json").read_text())
    report = json.loads((out / "report.json").read_text())
    pgd = [r["robust_accuracy"] for r in recs(report, "robust", "M", attack="pgd") if r["epsilon"] == 0.5]
    assert info["autoattack_acc"] is None and info["number_forward_passes"] == 1
    assert "autoattack_acc: null, the report has no autoattack record at eps 0.5, K = 0" in info["footnote"]
    assert f"pgd (full) gave {round(100 * pgd[0], 2)}" in info["footnote"]  # said, not put in the field
    fired = [c["message"] for run in report["runs"] for c in run.get("checks", []) if not c["passed"]]
    assert info["unreliable"] is bool(fired) and "stochastic" not in info["footnote"]  # K = 0: deterministic


def test_a_failed_check_or_a_failed_section_is_said(exported):
    _, report = exported
    data = copy.deepcopy(report)
    for run in data["runs"]:
        for check in run.get("checks", []):
            check["passed"] = True
    calm = X.robustbench_files(data, refine_steps=0)["robustbench-JEM.json"]
    assert calm["unreliable"] is False and "unreliable" not in calm["footnote"]
    run = next(r for r in data["runs"] if r["section"] == "robust" and r["model"] == "JEM")
    run["checks"][0].update(passed=False, message="WARNING: planted: accuracy rises with epsilon")
    fired = X.robustbench_files(data, refine_steps=0)["robustbench-JEM.json"]
    assert fired["unreliable"] is True and "WARNING: planted: accuracy rises with epsilon" in fired["footnote"]
    # the robust section failed for CLF: nulls, and the failure named
    data["records"] = [r for r in data["records"] if not (r["section"] == "robust" and r["model"] == "CLF")]
    data["runs"] = [r for r in data["runs"] if not (r["section"] == "robust" and r["model"] == "CLF")]
    data["errors"] = [{"section": "robust", "model": "CLF", "error": "out of memory"}]
    info = X.robustbench_files(data)["robustbench-CLF.json"]
    assert info["autoattack_acc"] is info["eps"] is info["threat_model"] is info["unreliable"] is None
    assert "the robust section failed (out of memory)" in info["footnote"]


def test_exports_are_listed_kept_on_resume_and_replaced_only_when_listed(tmp_path, exported, models):
    src, _ = exported
    out = tmp_path / "rep"
    shutil.copytree(src, out)
    listed = set(json.loads((out / MANIFEST).read_text())["files"])
    assert {"openood.csv", "robustbench-JEM.json", "robustbench-CLF.json"} <= listed
    kept = (out / "robustbench-CLF.json").read_bytes()
    # the folder still resumes (its manifest lists exports), and a renamed model's stale export goes
    res = report_cli(out, models, "--export", "robustbench", names=("JEM2", "CLF"))
    assert res.exit_code == 0, res.output + res.stderr
    assert "cached" in res.stdout and "computed" not in res.stdout  # the status table: nothing recomputed
    assert (out / "robustbench-JEM2.json").is_file() and not (out / "robustbench-JEM.json").exists()
    assert (out / "robustbench-CLF.json").read_bytes() == kept and (out / "openood.csv").is_file()


def test_a_planted_file_or_link_at_an_exports_name_is_refused(tmp_path, exported, models):
    src, _ = exported
    for attack in ("file", "link"):
        home = tmp_path / attack
        out = home / "rep"
        shutil.copytree(src, out)
        outside = home / "precious.json"
        outside.write_text("mine\n")
        victim = out / ("openood.csv" if attack == "file" else "robustbench-JEM.json")
        victim.unlink()
        victim.write_text("a user's table\n") if attack == "file" else victim.symlink_to(outside)
        manifest = json.loads((out / MANIFEST).read_text())
        manifest["files"].remove(victim.name)  # not jemeval's: the manifest does not list it
        (out / MANIFEST).write_text(json.dumps(manifest))
        before = {k: v for k, v in snapshot(home).items() if not k.startswith("rep/report.") and "figures" not in k
                  and "cache" not in k and MANIFEST not in k}
        res = report_cli(out, models, "--export", "openood,robustbench")
        expected = "which jemeval did not write" if attack == "file" else "is a symbolic link"
        assert_one_line_refusal(res, expected)
        after = snapshot(home)
        assert {k: after.get(k) for k in before} == before
        assert outside.read_text() == "mine\n"


def test_a_model_name_cannot_put_an_export_elsewhere(exported):
    _, report = exported
    data = json.loads(json.dumps(report).replace('"JEM"', '"../../x/evil"').replace('"CLF"', '"..\\\\evil"'))
    names = list(X.export_texts(data, ["robustbench"]))
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
    assert {p.name for p in X.write_exports(out, "openood")} == {"openood.csv"}
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
