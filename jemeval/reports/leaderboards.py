"""What OpenOOD's and RobustBench's leaderboards accept, and the facts about a model that only its
authors know (the export metadata): the checks :mod:`jemeval.reports.exports` runs before it writes.

The rules are read off the code that turns each project's files into its leaderboard (not copied):

* OpenOOD v1.5 (Jingkang50/OpenOOD, branch ``leaderboard``, ``utils/convert.csv.to.json.py`` and
  ``table_template.html.j2``): ``results/<benchmark>.csv`` is read by pandas; every number cell is
  ``mean ± std`` over training runs (``scripts/eval_ood.py`` writes ``'{:.2f} ± {:.2f}'`` of the
  percentages' ``np.mean`` and ``np.std``: ``± 0.00`` for one run) or ``/`` where there is none;
  Training, Postprocessor and Arch are strings (NaN breaks its ``split``/``replace``) and, with
  Additional_Description, make the name of a JSON file, so hold no ``/`` and stay within a file
  name's 255 bytes; Outlier_Data is ``Yes`` or ``No`` (the page ticks ``Yes``). Its files quote no
  cell: a cell holds no comma, quote or line break.
* RobustBench (RobustBench/robustbench, ``robustbench/leaderboard/template.py``, ``utils.py``,
  ``leaderboard.html.j2``): ``model_info/<dataset>/<threat_model>/<model>.json``; the leaderboard
  sorts on ``float(external or autoattack_acc)`` and ``list_available_models`` on
  ``float(clean_acc)``, so both are number strings; the page shows link, name, clean_acc,
  additional_data (ticked when truthy), architecture and venue, the BibTeX export splits venue and
  authors; ``dataset`` is a ``BenchmarkDataset`` value and the threat model is the folder (no key).
  Every one of its 188 Linf/L2 files holds the 12 keys of :data:`ROBUSTBENCH_REQUIRED`, none null,
  plus optionally ``external``, ``footnote`` (a string or null) and ``unreliable`` (a boolean).

tests/data/leaderboards/ keeps real files of both, with their source commits, and the tests check
these rules against them.
"""
from __future__ import annotations

import json
import math
import re
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from jemeval.errors import UsageError, did_you_mean

# -- OpenOOD ------------------------------------------------------------------------------------------
#: OpenOOD v1.5's leaderboard columns, in its order
OPENOOD_FIELDS = ("Training", "Postprocessor", "Near-OOD_AUROC", "Far-OOD_AUROC", "ID_Accuracy", "Outlier_Data",
                  "Arch", "Additional_Description")
OPENOOD_NUMBERS = ("Near-OOD_AUROC", "Far-OOD_AUROC", "ID_Accuracy")
#: OpenOOD's number cell: percent mean ± population std, two decimals each; ``/`` where there is none.
#: Its ImageNet files (``results/imagenet1k_ood.csv``, ``imagenet200_ood.csv``: one checkpoint each)
#: hold the percentage alone (``76.02``); its converter reads the first number of either form
OPENOOD_CELL = re.compile(r"\d+\.\d\d ± \d+\.\d\d|/")
OPENOOD_SINGLE_CELL = re.compile(r"\d+\.\d\d( ± \d+\.\d\d)?|/")
OPENOOD_NONE = "/"
#: the columns OpenOOD's converter names a file after (Arch with "/" replaced by "-")
OPENOOD_NAMING = ("Training", "Postprocessor", "Arch", "Additional_Description")
FILE_NAME_BYTES = 255


def openood_cell(values: Sequence[float], *, single: bool = False) -> str:
    """OpenOOD's cell of fractions ``values`` (one per training run): percent ``mean ± std`` with
    numpy's std (ddof 0, as its eval_ood.py), ``± 0.00`` for one run, ``/`` for none. ``single``:
    one run is the percentage alone, as OpenOOD's ImageNet files write it (``76.02``)."""
    if not values:
        return OPENOOD_NONE
    percent = [100 * float(v) for v in values]
    if single and len(percent) == 1:
        return f"{percent[0]:.2f}"
    mean = math.fsum(percent) / len(percent)
    std = math.sqrt(math.fsum((p - mean) ** 2 for p in percent) / len(percent))
    return f"{mean:.2f} ± {std:.2f}"


def openood_file_name(row: Mapping[str, str]) -> str:
    """The JSON file OpenOOD's converter writes for ``row`` (its naming, spaces as underscores)."""
    name = f"{row['Training']}_{row['Postprocessor']}_{str(row['Arch']).replace('/', '-')}"
    name += f"_{row['Additional_Description']}" if row.get("Additional_Description") else ""
    return (name + ".json").replace(" ", "_")


def openood_problems(row: Mapping[str, Any], *, single: bool = False) -> list[str]:
    """What in one openood.csv row OpenOOD's converter would crash on or misread; [] when none.
    ``single``: an ImageNet benchmark's row, whose cells may be the percentage alone."""
    problems = [f"{k} is missing" for k in OPENOOD_FIELDS if k not in row]
    if problems:
        return problems
    for key in ("Training", "Postprocessor", "Arch"):
        if not isinstance(row[key], str) or not row[key].strip():
            problems.append(f"{key} is empty")
    for key in OPENOOD_FIELDS:
        if isinstance(row[key], str) and re.search(r"[,\"\r\n]", row[key]):
            problems.append(f"{key} {row[key]!r} holds a comma, quote or line break")
    for key in ("Training", "Postprocessor", "Additional_Description"):
        if "/" in str(row[key] or ""):
            problems.append(f"{key} {row[key]!r} holds '/' (OpenOOD names a file after it)")
    grammar = OPENOOD_SINGLE_CELL if single else OPENOOD_CELL
    problems += [f"{k} {row[k]!r} is not 'xx.xx ± y.yy'{', xx.xx' if single else ''} or '/'" for k in OPENOOD_NUMBERS
                 if not (isinstance(row[k], str) and grammar.fullmatch(row[k]))]
    if row["Outlier_Data"] not in ("Yes", "No"):
        problems.append(f"Outlier_Data {row['Outlier_Data']!r} is not Yes or No")
    if not problems and len(openood_file_name(row).encode()) > FILE_NAME_BYTES:
        problems.append(f"Training, Postprocessor, Arch and Additional_Description name a file of more than "
                        f"{FILE_NAME_BYTES} bytes; shorten them")
    return problems


# -- RobustBench --------------------------------------------------------------------------------------
#: the keys every RobustBench model_info file of a Linf/L2 leaderboard holds, none null, in its order
ROBUSTBENCH_REQUIRED = ("link", "name", "authors", "additional_data", "number_forward_passes", "dataset", "venue",
                        "architecture", "eps", "clean_acc", "reported", "autoattack_acc")
#: the keys jemeval writes: the required ones, then the two optional ones it fills
ROBUSTBENCH_FIELDS = (*ROBUSTBENCH_REQUIRED, "footnote", "unreliable")
ROBUSTBENCH_TYPES: dict[str, type | tuple[type, ...]] = {
    **dict.fromkeys(ROBUSTBENCH_REQUIRED, str), "additional_data": bool, "number_forward_passes": int,
    "external": str, "footnote": (str, type(None)), "unreliable": bool}
#: the strings RobustBench's code turns into numbers (float(...))
ROBUSTBENCH_NUMBERS = ("clean_acc", "autoattack_acc", "external")
#: RobustBench's BenchmarkDataset values: the leaderboards there are
ROBUSTBENCH_DATASETS = ("cifar10", "cifar100", "imagenet")


def _number_text(value: Any) -> bool:
    try:
        return math.isfinite(float(value))
    except (TypeError, ValueError):
        return False


def robustbench_problems(info: Mapping[str, Any]) -> list[str]:
    """What in one model_info RobustBench's code would crash on or reject; [] when none."""
    problems = [f"{k} is missing" for k in ROBUSTBENCH_REQUIRED if k not in info]
    problems += [f"{k} is not a RobustBench key" for k in info if k not in ROBUSTBENCH_TYPES]
    for key, kind in ROBUSTBENCH_TYPES.items():
        if key in info and (not isinstance(info[key], kind) or (kind is int and isinstance(info[key], bool))):
            problems.append(f"{key} is null" if info[key] is None else f"{key} is {type(info[key]).__name__}")
    problems += [f"{k} {info[k]!r} is not a number" for k in ROBUSTBENCH_NUMBERS
                 if isinstance(info.get(k), str) and not _number_text(info[k])]
    if isinstance(info.get("dataset"), str) and info["dataset"] not in ROBUSTBENCH_DATASETS:
        problems.append(f"dataset {info['dataset']!r} has no RobustBench leaderboard (it has "
                        f"{', '.join(ROBUSTBENCH_DATASETS)})")
    return problems


# -- the metadata: what only the model's authors know -------------------------------------------------
#: field -> (the formats that need it, what it is)
METADATA: dict[str, tuple[tuple[str, ...], str]] = {
    "name": (("robustbench",), "the paper's title"),
    "link": (("robustbench",), "the paper's URL"),
    "authors": (("robustbench",), "the paper's authors, comma-separated"),
    "venue": (("robustbench",), "where the paper appeared, e.g. 'ICLR 2020'"),
    "reported": (("robustbench",), "the robust accuracy the paper reports, in percent"),
    "additional_data": (("robustbench",), "true when training used data beyond the dataset's training set"),
    "outlier_data": (("openood",), "true when training used outlier data (outlier exposure)"),
    "architecture": ((), "the architecture as the leaderboards show it (default: jemeval's name)"),
    "description": ((), "OpenOOD's Additional_Description (default: the epochs the checkpoints record)"),
}
METADATA_FILE_KEY = "metadata"
BOOLEANS = {"true": True, "yes": True, "false": False, "no": False}


def required_metadata(formats: Sequence[str]) -> list[str]:
    return [f for f, (needed_by, _) in METADATA.items() if any(fmt in needed_by for fmt in formats)]


def _field_value(field: str, value: Any, where: str) -> Any:
    """One metadata value, checked and in the leaderboards' type (bool, or text)."""
    if field in ("additional_data", "outlier_data"):
        flag = value if isinstance(value, bool) else BOOLEANS.get(str(value).strip().lower())
        if flag is None:
            raise UsageError(f"{where}: {field} is true or false (yes or no), got {value!r}", param="export")
        return flag
    if isinstance(value, bool) or not isinstance(value, (str, int, float)) or not str(value).strip():
        raise UsageError(f"{where}: {field} is {METADATA[field][1]}: a non-empty text, got {value!r}", param="export")
    if field == "reported":
        if not _number_text(value):
            raise UsageError(f"{where}: reported is {METADATA['reported'][1]} (e.g. 62.5), got {value!r}",
                             param="export")
        return str(round(float(value), 2)) if not isinstance(value, str) else value.strip()
    return str(value).strip()


def _fields(values: Mapping[str, Any], where: str) -> dict[str, Any]:
    out = {}
    for key, value in values.items():
        if key not in METADATA:
            raise UsageError(f"{where}: unknown field {key!r}{did_you_mean(key, list(METADATA))}; the fields are "
                             f"{', '.join(METADATA)}", param="export")
        out[key] = _field_value(key, value, where)
    return out


def read_metadata_file(path: str | Path) -> dict[str, Any]:
    """A metadata file: a JSON object of fields (every model) and/or model names holding objects of
    fields (that model)."""
    try:
        data = json.loads(Path(path).read_text(encoding="utf-8"))
    except OSError as exc:
        raise UsageError(f"export.metadata {str(path)!r} cannot be read ({exc.strerror or exc})", param="export") \
            from None
    except ValueError as exc:
        raise UsageError(f"export.metadata {str(path)!r} is not JSON ({exc})", param="export") from None
    if not isinstance(data, dict):
        raise UsageError(f"export.metadata {str(path)!r} must hold a JSON object of fields (and/or of model names "
                         "holding fields)", param="export")
    return data


def export_metadata(values: Mapping[str, Any] | None) -> dict[str, dict[str, Any]]:
    """``{"": fields for every model, model: its own fields}`` from ``values``: fields (``name``,
    ``link``, ... :data:`METADATA`), ``MODEL.FIELD`` keys or model names holding fields, and
    ``metadata``: a JSON file of the same (read first; the values given beside it win)."""
    values = dict(values or {})
    layers = [read_metadata_file(values.pop(METADATA_FILE_KEY))] if METADATA_FILE_KEY in values else []
    out: dict[str, dict[str, Any]] = {"": {}}
    for layer in [*layers, values]:
        for key, value in layer.items():
            if isinstance(value, Mapping):
                out.setdefault(str(key), {}).update(_fields(value, f"export metadata of model {key!r}"))
            elif key in METADATA or "." not in key:
                out[""].update(_fields({key: value}, "export metadata"))
            else:
                model, _, field = str(key).rpartition(".")
                out.setdefault(model, {}).update(_fields({field: value}, f"export metadata of model {model!r}"))
    return out


def model_metadata(metadata: Mapping[str, Mapping[str, Any]] | None, model: str) -> dict[str, Any]:
    """The fields of ``model``: every model's, then its own over them."""
    metadata = metadata or {}
    return {**metadata.get("", {}), **metadata.get(model, {})}


def check_metadata_models(metadata: Mapping[str, Any] | None, models: Sequence[str]) -> None:
    """Metadata for a model the report does not hold (a typo) is refused, not silently unused."""
    for name in metadata or {}:
        if name and name not in models:
            raise UsageError(f"export metadata names model {name!r}{did_you_mean(name, list(models))}, which the "
                             f"report does not hold (it holds {', '.join(map(repr, models))})", param="export")


def missing_metadata(formats: Sequence[str], metadata: Mapping[str, Any] | None,
                     models: Sequence[str]) -> list[str]:
    """'model 'JEM' lacks link, name' per model lacking a field ``formats`` need; [] when none."""
    need = required_metadata(formats)
    out = []
    for model in models:
        lacking = [f for f in need if f not in model_metadata(metadata, model)]
        if lacking:
            out.append(f"model {model!r} lacks {', '.join(lacking)}")
    return out
