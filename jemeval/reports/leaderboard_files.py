"""The report's numbers as the leaderboards' rows and files (:mod:`jemeval.reports.exports` checks
and writes them): OpenOOD v1.5's result-file rows, one per (model, score), and RobustBench's
model_info per (model, threat model), read from report.json alone. A value the report does not
hold stays None here, with the reason, so that the exports can refuse it (RobustBench) or write '/'
(OpenOOD) and say why."""
from __future__ import annotations

import csv
import io
import math
import re
import statistics
from collections.abc import Mapping, Sequence
from typing import Any

from jemeval.openood_benchmarks import ID_NAMES, benchmark_of
from jemeval.reports.leaderboards import (
    OPENOOD_FIELDS,
    OPENOOD_NONE,
    ROBUSTBENCH_FIELDS,
    model_metadata,
    openood_cell,
)

OPENOOD_FILE = "openood.csv"
#: jemeval's scores under the names OpenOOD's leaderboard gives the same method (logpx = logsumexp = EBO at T = 1)
POSTPROCESSORS = {"maxprob": "MSP", "tscaling": "TempScale", "odin": "ODIN", "mahalanobis": "MDS", "rmd": "RMDS",
                  "logpx": "EBO", "energy": "EBO", "gradnorm-huang": "GradNorm", "react": "ReAct", "maxlogit": "MLS",
                  "klmatching": "KLM", "vim": "VIM", "knn": "KNN", "dice": "DICE", "ash": "ASH", "she": "SHE",
                  "gen": "GEN", "scale": "SCALE", "fdbd": "fDBD", "nci": "NCI", "openmax": "OpenMax"}
THREAT_MODELS = {"linf": "Linf", "l2": "L2"}  # RobustBench's ThreatModel values
STANDARD_EPS = {"Linf": 8 / 255, "L2": 0.5}  # RobustBench's CIFAR-10/100 leaderboards
IMAGENET_EPS = {"Linf": 4 / 255}


# -- what the report holds ----------------------------------------------------------------------------
def report_models(data: dict[str, Any]) -> list[dict[str, Any]]:
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


def finite_numbers(values: Sequence[Any]) -> list[float]:
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
    return finite_numbers([r.get("accuracy") for r in _records(data, "accuracy", model) if r.get("refine_steps") == k])


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
    for model in report_models(data):
        records = _records(data, "ood", model["name"])
        scores = list(dict.fromkeys(str(r.get("score")) for r in records)) or [None]
        meta = model_metadata(metadata, model["name"])
        rows += [openood_row(data, model, score, [r for r in records if str(r.get("score")) == score], meta,
                             [] if notes is None else notes, [] if gaps is None else gaps) for score in scores]
    return rows


def openood_row(data: dict[str, Any], model: dict[str, Any], score: str | None, records: list[dict[str, Any]],
                meta: Mapping[str, Any], notes: list[str], gaps: list[str]) -> dict[str, Any]:
    name = model["name"]
    single = imagenet_report(data)
    row: dict[str, Any] = dict.fromkeys(OPENOOD_FIELDS)
    row["Training"] = name
    where = f"{OPENOOD_FILE} {name}" + (f" {score}" if score else "")
    if score is None:
        gaps.append(f"{where}: Postprocessor would be empty: " + _missing(data, "ood", name, "no OOD records"))
    else:
        row["Postprocessor"] = POSTPROCESSORS.get(score.split(":")[0], score)
        for group, field in (("near", "Near-OOD_AUROC"), ("far", "Far-OOD_AUROC")):
            row[field] = openood_cell(finite_numbers([r.get("auroc") for r in records
                                                if r.get("group") == group and r.get("ood") == group]),
                                      single=single)
            if row[field] == OPENOOD_NONE:
                notes.append(f"{where}: {field} is '/': " + _missing(
                    data, "ood", name, f"the report has no {group} group (run it with --ood near,far)"))
    row["ID_Accuracy"] = openood_cell(_accuracies(data, name, 0), single=single)
    if row["ID_Accuracy"] == OPENOOD_NONE:
        notes.append(f"{where}: ID_Accuracy is '/': " + _missing(data, "accuracy", name, "no accuracy record at K = 0"))
    if "outlier_data" in meta:
        row["Outlier_Data"] = "Yes" if meta["outlier_data"] else "No"
    else:
        gaps.append(f"{where}: Outlier_Data would be empty: outlier_data is not in the export metadata")
    hub = _hub_checkpoint(data, name)
    row["Arch"] = meta.get("architecture") or (hub[1] if hub else _arch(data, model, sep=" "))
    if not row["Arch"]:
        gaps.append(f"{where}: Arch would be empty: the report does not record the architecture (give "
                    "export.architecture)")
    epochs = _epochs(data, name)
    row["Additional_Description"] = meta.get("description") or (f"{epochs} epochs" if epochs else
                                                                hub[2] if hub else "")
    return row


def imagenet_report(data: dict[str, Any]) -> bool:
    """Whether the report's OOD section is OpenOOD's ImageNet-1k or ImageNet-200 benchmark (its ID
    set), whose result files (``results/imagenet1k_ood.csv``, ``imagenet200_ood.csv``) write one
    number a cell."""
    ids = {str(r["id"]) for r in data.get("records", []) if r.get("section") == "ood" and r.get("id")}
    found = [benchmark_of(i) for i in ids]
    return bool(found) and all(b is not None and b.name in ID_NAMES for b in found)


#: the hub sources whose weights OpenOOD describes by their library ("torchvision ckpt")
_HUB_LIBRARIES = ("timm", "torchvision", "pytorch-ood")


def _hub_checkpoint(data: dict[str, Any], model: str) -> tuple[str, str, str] | None:
    """(library, the library's model name, OpenOOD's description: "torchvision ckpt IMAGENET1K_V1") of
    a model loaded from a hub source (``timm:``, ``torchvision:``, ``pytorch-ood:``), else None."""
    for run in data.get("runs", []):
        ckpt = (run.get("provenance") or {}).get("checkpoint") if run.get("model") == model else None
        library = str((ckpt or {}).get("source") or "").partition(":")[0]
        if library in _HUB_LIBRARIES and ckpt.get("name"):
            weights = str(ckpt.get("revision") or "").rpartition(".")[2] if library == "torchvision" else ""
            return library, str(ckpt["name"]).replace("/", "-"), f"{library} ckpt" + (f" {weights}" if weights else "")
    return None


def openood_csv(data: dict[str, Any], metadata: Mapping[str, Any] | None = None) -> str:
    """openood.csv's text: OpenOOD's header and the rows (a None is an empty cell: refused when written)."""
    buffer = io.StringIO()
    writer = csv.DictWriter(buffer, fieldnames=OPENOOD_FIELDS, lineterminator="\n")
    writer.writeheader()
    writer.writerows(openood_rows(data, metadata))
    return buffer.getvalue()


# -- RobustBench --------------------------------------------------------------------------------------
def eps_text(eps: float, threat: str) -> str:
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
    for model in report_models(data):
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
        info["eps"] = eps_text(eps, threat)
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
    aa = [r for r in at if str(r.get("attack")).split(":")[0] == "autoattack"
          and finite_numbers([r.get("robust_accuracy")])]
    if not aa:
        others = sorted((r["robust_accuracy"], str(r.get("attack")), str(r.get("grad_mode"))) for r in at
                        if finite_numbers([r.get("robust_accuracy")]))
        seen = f"; {others[0][1]} ({others[0][2]}) gave {_acc_text(others[0][0])}" if others else ""
        why["autoattack_acc"] = (f"the report has no autoattack record at eps {eps_text(eps, threat)}, K = {k} (add "
                                 f"--attack autoattack and the epsilon){seen}")
        return None
    runs: dict[Any, list[dict[str, Any]]] = {}
    for r in aa:  # a seed group's runs: each run's lowest, then their mean
        runs.setdefault(r.get("run"), []).append(r)
    worst = [min(rs, key=lambda r: r["robust_accuracy"]) for rs in runs.values()]
    bounds = finite_numbers([worst[0].get("ci_low"), worst[0].get("ci_high")])
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
