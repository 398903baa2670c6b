"""A report in the leaderboards' formats (``jemeval report --export openood,robustbench``), and the
versioned schema of the report.json they read (alone: nothing is recomputed; old folders export too):

* ``openood.csv``: OpenOOD v1.5's leaderboard file (``results/<benchmark>.csv`` in Jingkang50/OpenOOD),
  one row per (model, score), every cell as OpenOOD writes it: numbers ``xx.xx ± y.yy`` (percent,
  the mean and numpy's std over a seed group's runs; ``± 0.00`` for one run), ``/`` where the report
  holds none, Outlier_Data ``Yes``/``No``. Near-OOD_AUROC and Far-OOD_AUROC are the report's ``near``
  and ``far`` group records (the means over the group's sets, as OpenOOD averages them), ID_Accuracy
  the accuracy section at K = 0 (the classifier the score reads). Postprocessor is OpenOOD's name for
  the score where it has one (maxprob -> MSP, logpx and energy -> EBO, ...), Training the model's name
  in the report, Arch jemeval's name of the architecture, Additional_Description the epochs the
  checkpoints record ("20 epochs", OpenOOD's own use of it).
* ``robustbench-<model>-<threat model>.json``: RobustBench's ``model_info`` file (its 12 keys in its
  order, then ``footnote`` and ``unreliable``); RobustBench keeps the threat model in the folder
  (``model_info/<dataset>/<threat_model>/``), so it is in the file's name, not in the file. The
  defence is the model at the largest K the robust section ran; ``autoattack_acc`` the lowest robust
  accuracy of ``autoattack`` at RobustBench's epsilon (Linf 8/255, 4/255 on ImageNet; L2 0.5);
  ``number_forward_passes`` K x chains + 1; ``unreliable`` true when the defence is stochastic (its SGLD
  chains draw noise) or a check of the robust section's checklist failed, the reasons in ``footnote``.

What only the model's authors know (the paper's link, name, authors, venue and reported accuracy;
whether training used additional or outlier data) comes from the export metadata
(:func:`jemeval.reports.leaderboards.export_metadata`: ``--set export.name=...``, or a JSON file with
``--set export.metadata=FILE``). A file the leaderboard would reject (a null where RobustBench's code
calls ``float``, a dataset it has no leaderboard for, a cell OpenOOD's converter cannot read;
:mod:`jemeval.reports.leaderboards`) is never written: the report's plan is checked before any
section runs (:func:`check_export_plan`), the files again before they are written, each refusal one
line naming the fields and how to give them. Files are listed in the manifest, then written
atomically, never through a link nor over a file jemeval did not write.
"""
from __future__ import annotations

import csv
import io
import json
import math
import os
import re
import statistics
from collections.abc import Mapping, Sequence
from importlib import resources
from pathlib import Path
from typing import Any

from jemeval.atomic import write_atomic
from jemeval.errors import UsageError, did_you_mean
from jemeval.registry import parse_spec
from jemeval.reports.cache import EXPORT_NAMES, MANIFEST, REPORT_SCHEMA, ReportFolder, read_manifest
from jemeval.reports.leaderboards import (
    OPENOOD_FIELDS,
    OPENOOD_NONE,
    ROBUSTBENCH_DATASETS,
    ROBUSTBENCH_FIELDS,
    check_metadata_models,
    missing_metadata,
    model_metadata,
    openood_cell,
    openood_problems,
    robustbench_problems,
)
from jemeval.runtime.shards import rank_and_world

FORMATS = ("openood", "robustbench")
OPENOOD_FILE = "openood.csv"
#: jemeval's scores under the names OpenOOD's leaderboard gives the same method (logpx = logsumexp = EBO at T = 1)
POSTPROCESSORS = {"maxprob": "MSP", "tscaling": "TempScale", "odin": "ODIN", "mahalanobis": "MDS", "rmd": "RMDS",
                  "logpx": "EBO", "energy": "EBO", "gradnorm-huang": "GradNorm", "react": "ReAct", "maxlogit": "MLS",
                  "klmatching": "KLM", "vim": "VIM", "knn": "KNN", "dice": "DICE", "ash": "ASH", "she": "SHE",
                  "gen": "GEN", "scale": "SCALE", "fdbd": "fDBD", "nci": "NCI", "openmax": "OpenMax"}
THREAT_MODELS = {"linf": "Linf", "l2": "L2"}  # RobustBench's ThreatModel values
STANDARD_EPS = {"Linf": 8 / 255, "L2": 0.5}  # RobustBench's CIFAR-10/100 leaderboards
IMAGENET_EPS = {"Linf": 4 / 255}
HOW_TO_GIVE = ("give them with --set export.FIELD=VALUE (every model), --set export.MODEL.FIELD=VALUE (one model) "
               "or --set export.metadata=FILE (a JSON object of the same)")


def export_formats(value: str | Sequence[str] | None) -> list[str]:
    """'openood,robustbench' (or a list) -> the formats, checked: an unknown one is one line with a suggestion."""
    items = value.split(",") if isinstance(value, str) else list(value or [])
    chosen = [str(item).strip().lower() for item in items if str(item).strip()]
    for item in chosen:
        if item not in FORMATS:
            raise UsageError(f"export {item!r} is not a leaderboard format{did_you_mean(item, FORMATS)}; give "
                             f"{' and/or '.join(FORMATS)}, comma-separated", param="export")
    if not chosen:
        raise UsageError(f"export is empty; give {' and/or '.join(FORMATS)}, comma-separated", param="export")
    return list(dict.fromkeys(chosen))


# -- report.json and its schema ---------------------------------------------------------------------
def report_schema() -> dict[str, Any]:
    """The JSON Schema of report.json (``jemeval/reports/schema/report.schema.json``, shipped in the package)."""
    return json.loads(resources.files("jemeval.reports").joinpath("schema", "report.schema.json").read_text("utf-8"))


#: the JSON types of the schema's ``type`` keyword (bool is no number, as in JSON Schema)
_TYPES = {"object": dict, "array": list, "string": str, "boolean": bool, "null": type(None),
          "number": (int, float), "integer": int}
#: the keywords :func:`schema_problems` checks; the others it reads are annotations
CHECKED_KEYWORDS = ("type", "required", "properties", "items", "const", "enum")
ANNOTATIONS = ("$schema", "$id", "title", "description")


def schema_problems(data: Any, schema: dict[str, Any] | None = None, where: str = "report.json") -> list[str]:
    """What in ``data`` breaks ``schema`` (default: report.json's), one line each; [] when it holds.
    A small JSON Schema checker (type, required, properties, items, const, enum): jsonschema is not
    a dependency, and these are the keywords report.schema.json uses (tests/test_report_exports.py
    checks that it uses no other)."""
    schema = report_schema() if schema is None else schema
    problems: list[str] = []
    kinds = schema.get("type")
    if kinds is not None:
        kinds = [kinds] if isinstance(kinds, str) else kinds
        if not any(isinstance(data, _TYPES[k]) and not (isinstance(data, bool) and k in ("number", "integer"))
                   for k in kinds):
            return [f"{where} is {type(data).__name__}, not {' or '.join(kinds)}"]
    if "const" in schema and data != schema["const"]:
        problems.append(f"{where} is {data!r}, not {schema['const']!r}")
    if "enum" in schema and data not in schema["enum"]:
        problems.append(f"{where} is {data!r}, not one of {schema['enum']!r}")
    if isinstance(data, dict):
        problems += [f"{where} has no {key!r}" for key in schema.get("required", []) if key not in data]
        for key, sub in schema.get("properties", {}).items():
            if key in data:
                problems += schema_problems(data[key], sub, f"{where}.{key}")
    if isinstance(data, list) and "items" in schema:
        for i, item in enumerate(data):
            problems += schema_problems(item, schema["items"], f"{where}[{i}]")
    return problems


def load_report(out: str | os.PathLike) -> tuple[ReportFolder, dict[str, Any]]:
    """The report folder ``out`` (its manifest read) and its report.json, checked against the schema;
    a report.json without ``schema`` (jemeval 0.2) has the same layout and is read as version 1."""
    path = Path(out)
    if not os.path.lexists(path / MANIFEST):
        raise UsageError(f"out {str(path)!r} is not a report folder (no {MANIFEST}); run jemeval report into it "
                         "first", param="out")
    folder = ReportFolder(path, read_manifest(path))
    target = folder.target("report.json")
    if "report.json" not in folder.files or not target.is_file():
        raise UsageError(f"out {str(path)!r} has no report.json jemeval wrote; run jemeval report first", param="out")
    try:
        data = json.loads(target.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise UsageError(f"{str(target)!r} is not JSON ({exc}); rerun jemeval report", param="out") from None
    version = data.get("schema", REPORT_SCHEMA) if isinstance(data, dict) else None
    if version != REPORT_SCHEMA:
        raise UsageError(f"{str(target)!r} has schema {version!r}; this jemeval reads {REPORT_SCHEMA!r}: export it "
                         "with the jemeval that wrote it, or rerun jemeval report", param="out")
    problems = schema_problems({**data, "schema": version})
    if problems:
        raise UsageError(f"{str(target)!r} is not a report.json jemeval wrote ({problems[0]}); rerun jemeval report",
                         param="out")
    return folder, data


# -- what the report holds ----------------------------------------------------------------------------
def _models(data: dict[str, Any]) -> list[dict[str, Any]]:
    """The report's models: a seed group (its runs' records share ``model``) is one model."""
    models: dict[str, dict[str, Any]] = {}
    for m in data["provenance"].get("settings", {}).get("models") or []:
        name = m.get("group") or m["name"]
        models.setdefault(name, {**m, "name": name})
    return list(models.values()) or [{"name": n} for n in dict.fromkeys(r["model"] for r in data["records"])]


def _records(data: dict[str, Any], section: str, model: str) -> list[dict[str, Any]]:
    return [r for r in data["records"] if r.get("section") == section and r.get("model") == model]


def _runs(data: dict[str, Any], section: str, model: str) -> list[dict[str, Any]]:
    return [r for r in data.get("runs", []) if r.get("section") == section and r.get("model") == model]


def _numbers(values: Sequence[Any]) -> list[float]:
    return [float(v) for v in values if isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)]


def _missing(data: dict[str, Any], section: str, model: str, hint: str) -> str:
    """Why a value is not in the report: the section's error when it failed, else ``hint``."""
    for e in data.get("errors", []):
        if e.get("section") == section and e.get("model") == model:
            return f"the {section} section failed ({e.get('error')})"
    if section not in data["provenance"].get("settings", {}).get("sections", [section]):
        return f"the report has no {section} section"
    return hint


def _arch(data: dict[str, Any], model: dict[str, Any], sep: str = ",") -> str | None:
    """The architecture as jemeval names it (``cnn:width=4``; options joined by ``sep``), from the
    model's runs' provenance."""
    for run in data.get("runs", []):
        info = run.get("provenance", {}).get("model") if run.get("model") == model["name"] else None
        if isinstance(info, dict) and info.get("arch"):
            options = info.get("arch_options") or {}
            return info["arch"] + (":" + sep.join(f"{k}={v}" for k, v in options.items()) if options else "")
    return model.get("arch")


def _accuracies(data: dict[str, Any], model: str, k: int) -> list[float]:
    return _numbers([r.get("accuracy") for r in _records(data, "accuracy", model) if r.get("refine_steps") == k])


def _epochs(data: dict[str, Any], model: str) -> int | None:
    """The epochs every run of ``model`` records having trained for (None unless they all agree)."""
    runs = [t for t in (data.get("cost") or {}).get("training", []) if t.get("model") == model]
    epochs = {t.get("epochs") for t in runs}
    (value,) = epochs if len(epochs) == 1 else (None,)
    return value if isinstance(value, int) and not isinstance(value, bool) else None


# -- OpenOOD ------------------------------------------------------------------------------------------
def openood_rows(data: dict[str, Any], metadata: Mapping[str, Any] | None = None,
                 notes: list[str] | None = None, gaps: list[str] | None = None) -> list[dict[str, Any]]:
    """One OpenOOD leaderboard row per (model, score) of the report (one row without a Postprocessor
    for a model whose OOD section did not run: refused when written). ``notes`` gets why a cell is
    ``/``, ``gaps`` why one is empty (OpenOOD has no empty cells)."""
    rows = []
    for model in _models(data):
        records = _records(data, "ood", model["name"])
        scores = list(dict.fromkeys(str(r.get("score")) for r in records)) or [None]
        meta = model_metadata(metadata, model["name"])
        rows += [openood_row(data, model, score, [r for r in records if str(r.get("score")) == score], meta,
                             [] if notes is None else notes, [] if gaps is None else gaps) for score in scores]
    return rows


def openood_row(data: dict[str, Any], model: dict[str, Any], score: str | None, records: list[dict[str, Any]],
                meta: Mapping[str, Any], notes: list[str], gaps: list[str]) -> dict[str, Any]:
    name = model["name"]
    row: dict[str, Any] = dict.fromkeys(OPENOOD_FIELDS)
    row["Training"] = name
    where = f"{OPENOOD_FILE} {name}" + (f" {score}" if score else "")
    if score is None:
        gaps.append(f"{where}: Postprocessor would be empty: " + _missing(data, "ood", name, "no OOD records"))
    else:
        row["Postprocessor"] = POSTPROCESSORS.get(score.split(":")[0], score)
        for group, field in (("near", "Near-OOD_AUROC"), ("far", "Far-OOD_AUROC")):
            row[field] = openood_cell(_numbers([r.get("auroc") for r in records
                                                if r.get("group") == group and r.get("ood") == group]))
            if row[field] == OPENOOD_NONE:
                notes.append(f"{where}: {field} is '/': " + _missing(
                    data, "ood", name, f"the report has no {group} group (run it with --ood near,far)"))
    row["ID_Accuracy"] = openood_cell(_accuracies(data, name, 0))
    if row["ID_Accuracy"] == OPENOOD_NONE:
        notes.append(f"{where}: ID_Accuracy is '/': " + _missing(data, "accuracy", name, "no accuracy record at K = 0"))
    if "outlier_data" in meta:
        row["Outlier_Data"] = "Yes" if meta["outlier_data"] else "No"
    else:
        gaps.append(f"{where}: Outlier_Data would be empty: outlier_data is not in the export metadata")
    row["Arch"] = meta.get("architecture") or _arch(data, model, sep=" ")
    if not row["Arch"]:
        gaps.append(f"{where}: Arch would be empty: the report does not record the architecture (give "
                    "export.architecture)")
    epochs = _epochs(data, name)
    row["Additional_Description"] = meta.get("description") or (f"{epochs} epochs" if epochs else "")
    return row


def openood_csv(data: dict[str, Any], metadata: Mapping[str, Any] | None = None) -> str:
    """openood.csv's text: OpenOOD's header and the rows (a None is an empty cell: refused when written)."""
    buffer = io.StringIO()
    writer = csv.DictWriter(buffer, fieldnames=OPENOOD_FIELDS, lineterminator="\n")
    writer.writeheader()
    writer.writerows(openood_rows(data, metadata))
    return buffer.getvalue()


# -- RobustBench --------------------------------------------------------------------------------------
def _eps_text(eps: float, threat: str) -> str:
    """RobustBench's eps string: "8/255" for Linf fractions of 255, else the number ("0.5")."""
    steps = eps * 255
    if threat == "Linf" and steps > 0 and abs(steps - round(steps)) < 1e-6:
        return f"{round(steps)}/255"
    return f"{eps:g}"


def _acc_text(value: float) -> str:
    """RobustBench's accuracy string, as its update_json writes it: str(round(100 x accuracy, 2))."""
    return str(round(value * 100, 2))


def robustbench_eps(dataset: str | None, threat: str) -> float:
    """RobustBench's epsilon of ``threat`` on ``dataset`` (Linf 8/255, 4/255 on ImageNet; L2 0.5)."""
    return (IMAGENET_EPS if dataset == "imagenet" else {}).get(threat, STANDARD_EPS[threat])


def robustbench_files(data: dict[str, Any], *, refine_steps: int | None = None,
                      metadata: Mapping[str, Any] | None = None,
                      gaps: dict[str, dict[str, str]] | None = None) -> dict[str, dict[str, Any]]:
    """{file name: model_info} per model and norm; ``refine_steps``: the K of the defence (default:
    the largest the robust section ran); ``gaps`` gets, per file, why a field is None."""
    files: dict[str, dict[str, Any]] = {}
    for model in _models(data):
        records = _records(data, "robust", model["name"])
        norms = list(dict.fromkeys(str(r.get("norm")).lower() for r in records)) or [None]
        for norm in norms:
            why: dict[str, str] = {}
            info = robustbench_info(data, model, norm, [r for r in records if str(r.get("norm")).lower() == norm],
                                    refine_steps=refine_steps, meta=model_metadata(metadata, model["name"]), why=why)
            stem = re.sub(r"[^A-Za-z0-9._-]", "_", model["name"]).lstrip(".-") or "model"
            stem += f"-{THREAT_MODELS.get(str(norm), 'none')}"
            rel, i = f"robustbench-{stem}.json", 1
            while rel in files:  # two names that differ only in characters a file name cannot hold
                i += 1
                rel = f"robustbench-{stem}-{i}.json"
            files[rel] = info
            if gaps is not None:
                gaps[rel] = why
    return files


def robustbench_info(data: dict[str, Any], model: dict[str, Any], norm: str | None, records: list[dict[str, Any]],
                     *, refine_steps: int | None = None, meta: Mapping[str, Any] | None = None,
                     why: dict[str, str] | None = None) -> dict[str, Any]:
    """One model_info: the defence at K = ``refine_steps`` (default the largest run) under ``norm``;
    the paper's fields from ``meta``; ``why`` gets the reason of each field left None."""
    name, dataset = model["name"], data["provenance"].get("settings", {}).get("data")
    meta, why = meta or {}, {} if why is None else why
    threat = THREAT_MODELS.get(str(norm))
    ks = sorted({int(r["refine_steps"]) for r in records if isinstance(r.get("refine_steps"), int)})
    k = refine_steps if refine_steps is not None else (ks[-1] if ks else 0)
    info: dict[str, Any] = dict.fromkeys(ROBUSTBENCH_FIELDS)
    info.update({f: meta[f] for f in ("link", "name", "authors", "venue", "reported", "additional_data") if f in meta})
    why.update({f: "not in the export metadata" for f in ("link", "name", "authors", "venue", "reported",
                                                            "additional_data") if f not in meta})
    notes = [f"jemeval report of {name!r}: the model with K = {k} SGLD refinement steps before classifying"]
    info.update(dataset=dataset, architecture=meta.get("architecture") or _arch(data, model))
    chains = sorted({r.get("chains") for r in records if r.get("refine_steps") == k and r.get("chains")})
    info["number_forward_passes"] = 1 if k == 0 else (k * chains[0] + 1 if len(chains) == 1 else None)
    if info["number_forward_passes"] is None:
        why["number_forward_passes"] = _missing(data, "robust", name, f"no robust record at K = {k} with its chains")
    clean = _accuracies(data, name, k)
    info["clean_acc"] = _acc_text(statistics.fmean(clean)) if clean else None
    if clean:
        notes.append(f"clean_acc: the accuracy section at K = {k}" + (f", mean of {len(clean)}" if len(clean) > 1
                                                                       else ""))
    else:
        why["clean_acc"] = _missing(data, "accuracy", name, f"no accuracy record at K = {k}")
    if threat is None:
        why.update(dict.fromkeys(("eps", "autoattack_acc", "unreliable"), _missing(data, "robust", name, "no records")))
    else:
        eps = robustbench_eps(dataset, threat)
        info["eps"] = _eps_text(eps, threat)
        info["autoattack_acc"] = _autoattack(records, k, eps, threat, notes, why)
        info["unreliable"] = _unreliable(data, name, norm, k, notes)
    info["footnote"] = ". ".join(notes) + "."
    why.update({f: "the report does not record it" for f in ("dataset", "architecture") if info[f] is None})
    return info


def _autoattack(records: list[dict[str, Any]], k: int, eps: float, threat: str, notes: list[str],
                why: dict[str, str]) -> str | None:
    """The lowest robust accuracy of autoattack at (K, eps) over its gradient modes, or None with the
    reason in ``why`` (naming what the other attacks gave there)."""
    at = [r for r in records if r.get("refine_steps") == k and isinstance(r.get("epsilon"), (int, float))
          and math.isclose(r["epsilon"], eps, rel_tol=1e-6, abs_tol=1e-9)]
    aa = [r for r in at if str(r.get("attack")).split(":")[0] == "autoattack" and _numbers([r.get("robust_accuracy")])]
    if not aa:
        others = sorted((r["robust_accuracy"], str(r.get("attack")), str(r.get("grad_mode"))) for r in at
                        if _numbers([r.get("robust_accuracy")]))
        seen = f"; {others[0][1]} ({others[0][2]}) gave {_acc_text(others[0][0])}" if others else ""
        why["autoattack_acc"] = (f"the report has no autoattack record at eps {_eps_text(eps, threat)}, K = {k} (add "
                                 f"--attack autoattack and the epsilon){seen}")
        return None
    runs: dict[Any, list[dict[str, Any]]] = {}
    for r in aa:  # a seed group's runs: each run's lowest, then their mean
        runs.setdefault(r.get("run"), []).append(r)
    worst = [min(rs, key=lambda r: r["robust_accuracy"]) for rs in runs.values()]
    bounds = _numbers([worst[0].get("ci_low"), worst[0].get("ci_high")])
    interval = (f", 95% interval [{_acc_text(bounds[0])}, {_acc_text(bounds[1])}]" if len(bounds) == 2
                and len(worst) == 1 else f", the mean over {len(worst)} runs" if len(worst) > 1 else "")
    modes = ", ".join(sorted({str(w.get("grad_mode")) for w in worst}))
    notes.append(f"autoattack_acc: jemeval's autoattack ({modes} gradients, the lowest of "
                 f"{len(next(iter(runs.values())))}) on {worst[0].get('n')} test images{interval}")
    return _acc_text(statistics.fmean(w["robust_accuracy"] for w in worst))


def _unreliable(data: dict[str, Any], model: str, norm: str, k: int, notes: list[str]) -> bool:
    """RobustBench's flag: the defence draws noise (its SGLD chains at K > 0), or a check of the robust
    section's checklist failed (each quoted in ``notes``)."""
    runs = [run for run in _runs(data, "robust", model)
            if str(run.get("provenance", {}).get("settings", {}).get("norm", norm)).lower() == norm]
    stochastic = any(k in (run["provenance"].get("settings", {}).get("stochastic_refine_steps") or [])
                     for run in runs if isinstance(run.get("provenance"), dict))
    if stochastic:
        notes.append(f"unreliable: the defence is stochastic (SGLD refinement with noise at K = {k}); RobustBench "
                     "accepts deterministic defences only and its attacks need EOT for it")
    failed = [(f"{run['run']}: " if run.get("run") else "") + str(c.get("message")) for run in runs
              for c in run.get("checks", []) or [] if isinstance(c, dict) and c.get("passed") is False]
    notes += [f"unreliable: a sanity check failed: {message}" for message in failed]
    return bool(stochastic or failed)


# -- before the report runs: would the exports be accepted? -------------------------------------------
def _robust_plan_problems(dataset: str, plan: Mapping[str, Mapping[str, Any]]) -> list[str]:
    """Why the report's robust section, as planned, cannot give RobustBench's autoattack_acc."""
    if dataset not in ROBUSTBENCH_DATASETS:
        return [f"RobustBench has leaderboards for {', '.join(ROBUSTBENCH_DATASETS)} only, and the report evaluates "
                f"{dataset!r} (its files' dataset key)"]
    if "robust" not in plan:
        return ["the report has no robust section (add robust to --sections)"]
    options, problems = plan["robust"], []
    attacks = options.get("attacks", "pgd")
    names = {parse_spec(a).name for a in ([attacks] if isinstance(attacks, str) else attacks) if isinstance(a, str)}
    for norm in options.get("norm") or ["l2"]:
        threat = THREAT_MODELS.get(str(norm))
        if threat is None:
            problems.append(f"RobustBench has no {norm} leaderboard (it has {', '.join(THREAT_MODELS)})")
            continue
        eps = robustbench_eps(dataset, threat)
        given = options.get("epsilons")
        given = given.get(norm) if isinstance(given, dict) else given
        values = _numbers(given) if given is not None else [eps]  # robust's default list holds it
        if "autoattack" not in names:
            problems.append(f"{threat}: no autoattack run (add --attack ...,autoattack)")
        if not any(math.isclose(v, eps, rel_tol=1e-6, abs_tol=1e-9) for v in values):
            problems.append(f"{threat}: no epsilon {_eps_text(eps, threat)} ({eps:.6g}), RobustBench's (add it to "
                            "--epsilons)")
    return problems


def plan_problems(formats: Sequence[str], metadata: Mapping[str, Any] | None, models: Sequence[str], *,
                  dataset: str, plan: Mapping[str, Mapping[str, Any]]) -> list[str]:
    """Why the exports of a report about to run with ``plan`` on ``dataset`` would be refused."""
    check_metadata_models(metadata, models)
    problems = []
    if "openood" in formats:
        problems += [f"openood: {p}" for p in missing_metadata(["openood"], metadata, models)]
        problems += [f"openood: model name {m!r} cannot be a Training cell (OpenOOD names a file after it: no '/', "
                     "comma, quote or line break)" for m in models if re.search(r"[/,\"\r\n]", m)]
        if "ood" not in plan:
            problems.append("openood: the report has no ood section (add ood to --sections)")
    if "robustbench" in formats:
        problems += [f"robustbench: {p}" for p in missing_metadata(["robustbench"], metadata, models)]
        problems += [f"robustbench: {p}" for p in _robust_plan_problems(dataset, plan)]
    return problems


def check_export_plan(formats: Sequence[str], metadata: Mapping[str, Any] | None, models: Sequence[str], *,
                      dataset: str, plan: Mapping[str, Mapping[str, Any]]) -> None:
    """Refuse, in one line before any section runs, exports the leaderboards would reject."""
    problems = plan_problems(formats, metadata, models, dataset=dataset, plan=plan)
    if problems:
        lacking = any("lacks" in p for p in problems)
        raise UsageError("export would write files the leaderboards reject: " + "; ".join(problems)
                         + (f"; {HOW_TO_GIVE}" if lacking else ""), param="export")


# -- writing ------------------------------------------------------------------------------------------
def export_texts(data: dict[str, Any], formats: Sequence[str], *, refine_steps: int | None = None,
                 metadata: Mapping[str, Any] | None = None, notes: list[str] | None = None) -> dict[str, str]:
    """{file name in DIR: its text} for ``formats``; a file the leaderboard would reject is refused
    in one line naming it, its fields and why (nothing is returned then). ``notes``: why a cell is '/'."""
    models = [m["name"] for m in _models(data)]
    check_metadata_models(metadata, models)
    texts: dict[str, str] = {}
    problems: list[str] = []
    if "openood" in formats:
        gaps: list[str] = []
        rows = openood_rows(data, metadata, notes, gaps)
        problems += gaps
        if not gaps:  # the rest, as OpenOOD's converter reads the cells
            problems += [f"{OPENOOD_FILE} row {row['Training']} {row['Postprocessor']}: {p}" for row in rows
                         for p in openood_problems(row)]
        texts[OPENOOD_FILE] = openood_csv(data, metadata)
    if "robustbench" in formats:
        why: dict[str, dict[str, str]] = {}
        infos = robustbench_files(data, refine_steps=refine_steps, metadata=metadata, gaps=why)
        for rel, info in infos.items():
            reasons: dict[str, list[str]] = {}
            for key in (k for k, v in info.items() if v is None):
                reasons.setdefault(why[rel].get(key, "not in the report"), []).append(key)
            problems += [f"{rel}: {', '.join(keys)} would be null ({reason})" for reason, keys in reasons.items()]
            problems += [f"{rel}: {p}" for p in robustbench_problems(info) if not p.endswith(" is null")]
            texts[rel] = json.dumps(info, indent=2, ensure_ascii=False) + "\n"
    if problems:
        lacking = any("export metadata" in p for p in problems)
        raise UsageError("export refused, the leaderboards would reject it: " + "; ".join(problems)
                         + (f"; {HOW_TO_GIVE}" if lacking else ""), param="export")
    return texts


def _format_of(rel: str) -> str | None:
    return "openood" if rel == OPENOOD_FILE else "robustbench" if rel.startswith("robustbench-") else None


def write_exports(out: str | os.PathLike, formats: str | Sequence[str], *, refine_steps: int | None = None,
                  metadata: Mapping[str, Any] | None = None, notes: list[str] | None = None) -> list[Path]:
    """Write ``formats`` (openood, robustbench) of the report in folder ``out`` into it; the paths
    written. ``metadata``: what only the authors know (:func:`~jemeval.reports.leaderboards.export_metadata`
    reads it from ``--set export.*`` values). Each file is checked against what its leaderboard
    accepts, listed in the manifest, then written atomically; an export of the same format that
    this one does not write again (a renamed model) is removed. A file the leaderboard would reject,
    a file at an export's name that jemeval did not write, or a link there, is refused in one line
    before anything is written. ``notes`` gets why a cell is '/'. Under torchrun only rank 0 writes
    (the others return [])."""
    chosen = export_formats(formats)
    if rank_and_world()[0] != 0:
        return []
    folder, data = load_report(out)
    texts = export_texts(data, chosen, refine_steps=refine_steps, metadata=metadata, notes=notes)
    assert all(EXPORT_NAMES.fullmatch(rel) for rel in texts), sorted(texts)
    targets = {rel: folder.target(rel) for rel in texts}  # a link on the way is refused here
    foreign = [rel for rel in texts if rel not in folder.files and os.path.lexists(targets[rel])]
    if foreign:
        raise UsageError(f"out {str(folder.path)!r} holds {foreign[0]}, which jemeval did not write: the export is "
                         "not written; move that file out and export again", param="out")
    stale = sorted(rel for rel in folder.files if _format_of(rel) in chosen and rel not in texts)
    folder.record(*texts)
    for rel, text in texts.items():
        write_atomic(targets[rel], lambda tmp, text=text: tmp.write_bytes(text.encode("utf-8")))
    for rel in stale:
        folder.remove(rel)
    return list(targets.values())
