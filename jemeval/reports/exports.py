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
  checkpoints record ("20 epochs", OpenOOD's own use of it). A hub model (``timm:``, ``torchvision:``,
  ``pytorch-ood:``) has its library's model name as Arch and OpenOOD's description of such weights
  ("torchvision ckpt IMAGENET1K_V1", "timm ckpt"). On OpenOOD's ImageNet benchmarks (``--id
  imagenet``, ``imagenet200``) a single run's cell is the percentage alone (``76.02``), as its
  ``results/imagenet1k_ood.csv`` and ``imagenet200_ood.csv`` write them; a seed group keeps ``± std``.
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

import json
import math
import os
import re
from collections.abc import Mapping, Sequence
from importlib import resources
from pathlib import Path
from typing import Any

from jemeval.atomic import write_atomic
from jemeval.errors import UsageError, did_you_mean
from jemeval.registry import parse_spec
from jemeval.reports.cache import EXPORT_NAMES, MANIFEST, READABLE_SCHEMAS, ReportFolder, read_manifest
from jemeval.reports.leaderboard_files import (
    OPENOOD_FILE,
    THREAT_MODELS,
    eps_text,
    finite_numbers,
    imagenet_report,
    openood_csv,
    openood_rows,
    report_models,
    robustbench_eps,
    robustbench_files,
)
from jemeval.reports.leaderboards import (
    ROBUSTBENCH_DATASETS,
    check_metadata_models,
    missing_metadata,
    openood_problems,
    robustbench_problems,
)
from jemeval.runtime.shards import rank_and_world

FORMATS = ("openood", "robustbench")
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
    version = data.get("schema", READABLE_SCHEMAS[0]) if isinstance(data, dict) else None
    if version not in READABLE_SCHEMAS:
        raise UsageError(f"{str(target)!r} has schema {version!r}; this jemeval reads {', '.join(READABLE_SCHEMAS)}: "
                         "export it with the jemeval that wrote it, or rerun jemeval report", param="out")
    problems = schema_problems({**data, "schema": version})
    if problems:
        raise UsageError(f"{str(target)!r} is not a report.json jemeval wrote ({problems[0]}); rerun jemeval report",
                         param="out")
    return folder, data


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
        values = finite_numbers(given) if given is not None else [eps]  # robust's default list holds it
        if "autoattack" not in names:
            problems.append(f"{threat}: no autoattack run (add --attack ...,autoattack)")
        if not any(math.isclose(v, eps, rel_tol=1e-6, abs_tol=1e-9) for v in values):
            problems.append(f"{threat}: no epsilon {eps_text(eps, threat)} ({eps:.6g}), RobustBench's (add it to "
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
    models = [m["name"] for m in report_models(data)]
    check_metadata_models(metadata, models)
    texts: dict[str, str] = {}
    problems: list[str] = []
    if "openood" in formats:
        gaps: list[str] = []
        rows = openood_rows(data, metadata, notes, gaps)
        problems += gaps
        if not gaps:  # the rest, as OpenOOD's converter reads the cells
            single = imagenet_report(data)
            problems += [f"{OPENOOD_FILE} row {row['Training']} {row['Postprocessor']}: {p}" for row in rows
                         for p in openood_problems(row, single=single)]
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
