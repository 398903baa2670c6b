"""Which of the model's classes each label of a dataset is: the check every evaluation that compares
predictions with labels runs first (accuracy, calibration, robustness, detectors fitted on labels).

A label is a class index of its dataset; a prediction is a class index of the model. They are the
same classes only when the two class lists agree, and nothing in the tensors says whether they do:
a 1000-class ImageNet model on a 3-class folder read the folder's a, b, c as tench, goldfish and
great white shark, and reported accuracy 0 with exit code 0. :func:`class_alignment` compares the
classes each side declares (their number, and their names where both record them):

* they agree, or the model records this very dataset as its training set (a model ``jemeval train``
  wrote), or the data declares no classes of its own (an npz, whose count is only its largest label
  plus one: its labels are taken as the model's indices, as before): the labels are used as they are;
* the data's class names are all among the model's (timm's ImageNet names and synset ids,
  torchvision's ``categories``, an export's ``--classes``): each label is mapped to the model class
  of its name, and the map is recorded;
* otherwise the pair is refused in one line, unless ``class_map`` maps them: a JSON object or a CSV
  file of ``data class -> model class`` (names or indices; :func:`read_class_map`), or a dict.

The map in use is recorded in the result's provenance (``settings["class_map"]``).
"""
from __future__ import annotations

import csv
import io
import json
import os
import re
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
from torch.utils.data import Dataset, Subset

from jemeval.data import ClassSubset, absolute_spec
from jemeval.errors import JemevalError, UsageError, did_you_mean
from jemeval.evaluation.relabel import labels_of, relabelled
from jemeval.registry import parse_spec

#: how a class map is described in messages (the command line writes --class-map FILE)
HOW = "class_map=FILE (a JSON object or CSV of data class -> model class, by name or index; docs/data.md)"


@dataclass(frozen=True)
class ClassSpace:
    """One side's classes: how many it declares (None: not declared) and their names (None: not recorded);
    ``ids`` are other names of the same classes (timm's ImageNet synset ids)."""

    count: int | None
    names: tuple[str, ...] | None = None
    ids: tuple[str, ...] | None = None

    def describe(self) -> str:
        more = ", ..." if self.names and len(self.names) > 3 else ""
        shown = f" ({', '.join(self.names[:3])}{more})" if self.names else ""
        return f"{self.count} classes{shown}" if self.count is not None else "no declared classes"


@dataclass(frozen=True)
class ClassAlignment:
    """The data's labels as the model's classes: ``lut[y]`` is the model class of label y (None: the
    labels are the model's classes already), and the provenance record (None when nothing is mapped)."""

    lut: np.ndarray | None = None
    record: dict[str, Any] | None = None

    def apply(self, ds: Dataset) -> Dataset:
        """``ds`` with its labels mapped (``ds`` itself when there is nothing to map)."""
        if self.lut is None:
            return ds
        what = repr((self.record or {}).get("file") or "the class map")
        return relabelled(ds, self.lut, num_classes=(self.record or {}).get("model_classes"), what=what)


# -- the two sides ----------------------------------------------------------------------------------
def model_classes(model) -> ClassSpace:
    """The model's classes: its number of outputs and the names its metadata records."""
    meta = getattr(model, "metadata", None) or {}
    k = int(model.num_classes)
    return ClassSpace(k, _names(meta.get("classes"), k), _names(meta.get("class_ids"), k))


def data_classes(ds: Dataset) -> ClassSpace:
    """The dataset's declared classes (``num_classes``) and their names (``classes``: torchvision's
    CIFAR, an image folder's folder names) read through the subsets that wrap it. A count inferred
    from the labels present (an npz's: ``num_classes_from = "labels"``) declares nothing: its labels
    may be any of the model's classes."""
    count = getattr(ds, "num_classes", None)
    base = ds
    while isinstance(base, (Subset, ClassSubset)):
        base = base.dataset if isinstance(base, Subset) else base.base
    count = int(count) if count and getattr(base, "num_classes_from", None) != "labels" else None
    return ClassSpace(count, _names(getattr(base, "classes", None), count) if count else None)


def _names(names: Any, k: int | None) -> tuple[str, ...] | None:
    if isinstance(names, (list, tuple)) and len(names) == k and all(isinstance(n, str) for n in names):
        return tuple(names)
    return None


def _same_data(recorded: Any, data: str) -> bool:
    """Whether the model's recorded training set is ``data`` (name and variant; a class subset or
    options of the same set still count)."""
    if not isinstance(recorded, str) or not recorded:
        return False
    try:
        a, b = parse_spec(absolute_spec(recorded)), parse_spec(absolute_spec(data))
    except JemevalError:
        return False
    return (a.name, a.variant) == (b.name, b.variant)


# -- names ---------------------------------------------------------------------------------------
def _key(name: str) -> str:
    return re.sub(r"[\s_-]+", " ", str(name)).strip().casefold()


class _NameIndex:
    """The model's classes by name: a full name, an id (a synset), or one of the comma-separated
    synonyms of a name ("tench" for "tench, Tinca tinca"); the first of those that matches decides."""

    def __init__(self, space: ClassSpace):
        self.tables: list[dict[str, set[int]]] = []
        names, ids = space.names or (), space.ids or ()
        for words in ([[n] for n in names], [[i] for i in ids], [n.split(",") for n in names]):
            table: dict[str, set[int]] = {}
            for index, parts in enumerate(words):
                for part in parts:
                    if part.strip():
                        table.setdefault(_key(part), set()).add(index)
            self.tables.append(table)

    def find(self, name: str) -> set[int]:
        for table in self.tables:
            if _key(name) in table:
                return table[_key(name)]
        return set()

    def known(self) -> list[str]:
        return [k for table in self.tables for k in table]


# -- the check ------------------------------------------------------------------------------------
def class_alignment(model, ds: Dataset, data: str, class_map: Any = None, *,
                    param: str = "class_map") -> ClassAlignment:
    """How the labels of ``ds`` (the dataset ``data``) become ``model``'s classes (see the module
    docstring); refused in one line when they cannot be matched and ``class_map`` does not map them."""
    recorded = (getattr(model, "metadata", None) or {}).get("dataset")
    return align(model_classes(model), recorded, ds, data, class_map, param=param)


def align(ours: ClassSpace, recorded: Any, ds: Dataset, data: str, class_map: Any = None, *,
          param: str = "class_map") -> ClassAlignment:
    """:func:`class_alignment` for a model known by its classes ``ours`` and its recorded training set
    (``jemeval report`` checks every model this way before any section runs)."""
    theirs = data_classes(ds)
    if class_map is not None:
        return _given_map(class_map, ours, theirs, ds, data, param)
    if theirs.count is None or (theirs.count == ours.count and _same_data(recorded, data)):
        return ClassAlignment()
    if theirs.count == ours.count and (not theirs.names or not ours.names or
                                       [_key(n) for n in theirs.names] == [_key(n) for n in ours.names]):
        return ClassAlignment()
    by_name = _by_names(ours, theirs)
    if by_name is not None:
        lut = np.asarray(by_name, dtype=np.int64)
        return ClassAlignment(lut, {"by": "names", "map": _record_map(theirs, ours, lut),
                                    "data_classes": theirs.count, "model_classes": ours.count})
    raise UsageError(_mismatch(data, ours, theirs), param=param)


def _by_names(ours: ClassSpace, theirs: ClassSpace) -> list[int] | None:
    """The model class of each of the data's class names, when every one names exactly one."""
    if not theirs.names or not (ours.names or ours.ids):
        return None
    index = _NameIndex(ours)
    found = [index.find(name) for name in theirs.names]
    return [next(iter(f)) for f in found] if all(len(f) == 1 for f in found) else None


def _mismatch(data: str, ours: ClassSpace, theirs: ClassSpace) -> str:
    """The refusal: what each side has, what reading the labels as they are would do, what to give."""
    why = ""
    if theirs.names and (ours.names or ours.ids):
        index = _NameIndex(ours)
        missing = [n for n in theirs.names if len(index.find(n)) != 1]
        kind = "ambiguous" if len(index.find(missing[0])) > 1 else "not among them"
        why = f"; the data's class name {missing[0]!r} is {kind}"
    return (f"dataset {data!r} has {theirs.describe()} but the model has {ours.describe()}{why}: its labels are "
            f"not the model's class indices, and comparing them would measure nothing; map them with {HOW}")


def _record_map(theirs: ClassSpace, ours: ClassSpace, lut: np.ndarray) -> dict[str, Any]:
    """``{data class: model class}`` as recorded (names where the sides have them, else indices)."""
    out: dict[str, Any] = {}
    for label, target in enumerate(lut.tolist()):
        if target < 0:
            continue
        key = theirs.names[label] if theirs.names else str(label)
        out[key] = {"index": int(target), **({"name": ours.names[target]} if ours.names else {})}
    return out


# -- a given map ------------------------------------------------------------------------------------
def read_class_map(source: Any, *, param: str = "class_map") -> tuple[list[tuple[str, str]], dict[str, Any]]:
    """The (data class, model class) pairs of a class map, as text, and where they came from: ``source``
    is a dict, or the path of a JSON object (``{"cat": 281, "dog": "golden retriever"}``) or a CSV file
    of two columns (``data,model``; an optional header line ``data,model``; ``#`` comment lines)."""
    if isinstance(source, Mapping):
        return [(str(k), _text(v, param)) for k, v in source.items()], {"given": "mapping"}
    if not isinstance(source, (str, os.PathLike)):
        raise UsageError(f"{param} must be a file (.json or .csv) or a dict, got {type(source).__name__}",
                         param=param)
    from jemeval.provenance import file_sha256

    path = Path(source)
    if not path.is_file():
        raise UsageError(f"{param} file {str(path)!r} does not exist (a .json or .csv of data class -> model class)",
                         param=param)
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise UsageError(f"{param} file {str(path)!r} cannot be read as UTF-8 text ({type(exc).__name__})",
                         param=param) from None
    pairs = _json_pairs(text, path, param) if path.suffix.lower() == ".json" else _csv_pairs(text, path, param)
    return pairs, {"file": str(path), "sha256": file_sha256(path)}


def _text(value: Any, param: str) -> str:
    if isinstance(value, bool) or not isinstance(value, (int, str)):
        raise UsageError(f"{param}: a model class is a class index or name, not {value!r}", param=param)
    return str(value)


def _json_pairs(text: str, path: Path, param: str) -> list[tuple[str, str]]:
    try:
        obj = json.loads(text)
    except json.JSONDecodeError as exc:
        raise UsageError(f"{param} file {str(path)!r} is not JSON ({exc.msg} at line {exc.lineno}); write an object "
                         'such as {"cat": 281, "dog": "golden retriever"}', param=param) from None
    if not isinstance(obj, dict):
        raise UsageError(f"{param} file {str(path)!r} holds a JSON {type(obj).__name__}, not an object of data class "
                         '-> model class such as {"cat": 281}', param=param)
    return [(str(k), _text(v, param)) for k, v in obj.items()]


def _csv_pairs(text: str, path: Path, param: str) -> list[tuple[str, str]]:
    rows = [[c.strip() for c in row] for row in csv.reader(io.StringIO(text))
            if row and any(c.strip() for c in row) and not row[0].lstrip().startswith("#")]
    if rows and [c.casefold() for c in rows[0]] == ["data", "model"]:
        rows = rows[1:]
    for number, row in enumerate(rows, 1):
        if len(row) != 2 or not all(row):
            raise UsageError(f"{param} file {str(path)!r}: row {number} {','.join(row)!r} is not 'data class,model "
                             "class' (two non-empty columns; quote a name that holds a comma)", param=param)
    if not rows:
        raise UsageError(f"{param} file {str(path)!r} maps no class; write one 'data class,model class' per line",
                         param=param)
    return [(a, b) for a, b in rows]


def _given_map(class_map: Any, ours: ClassSpace, theirs: ClassSpace, ds: Dataset, data: str,
               param: str) -> ClassAlignment:
    """The labels mapped as ``class_map`` says: every class present in ``ds`` mapped, once."""
    pairs, origin = read_class_map(class_map, param=param)
    present = np.unique(labels_of(ds))
    present = present[present >= 0]
    size = max(theirs.count or 0, int(present.max()) + 1 if len(present) else 0)
    lut = np.full(size, -1, dtype=np.int64)
    index = _NameIndex(ours)
    for key, value in pairs:
        label = _data_label(key, theirs, size, data, param)
        if lut[label] >= 0:
            raise UsageError(f"{param} maps the data class {key!r} (label {label}) twice", param=param)
        lut[label] = _model_label(value, ours, index, param)
    missing = [int(c) for c in present if lut[c] < 0]
    if missing:
        names = [theirs.names[c] if theirs.names else str(c) for c in missing[:3]]
        raise UsageError(f"{param} leaves {len(missing)} class(es) of dataset {data!r} unmapped ({', '.join(names)}"
                         f"{', ...' if len(missing) > 3 else ''}); map every class of the data to a model class",
                         param=param)
    return ClassAlignment(lut, {"by": "class_map", **origin, "map": _record_map(theirs, ours, lut),
                                "data_classes": theirs.count, "model_classes": ours.count})


def _data_label(key: str, theirs: ClassSpace, size: int, data: str, param: str) -> int:
    """The data class ``key`` names: one of its names, else an index."""
    if theirs.names:
        keys = [_key(n) for n in theirs.names]
        if _key(key) in keys:
            return keys.index(_key(key))
    if key.strip().isdigit() and int(key) < size:
        return int(key)
    known = list(theirs.names or []) or [str(i) for i in range(size)]
    raise UsageError(f"{param}: dataset {data!r} has no class {key!r}{did_you_mean(key, known)}; its classes: "
                     f"{', '.join(known[:10])}{', ...' if len(known) > 10 else ''}", param=param)


def _model_label(value: str, ours: ClassSpace, index: _NameIndex, param: str) -> int:
    """The model class ``value`` names: an index below the model's number of classes, else a name."""
    if value.strip().isdigit():
        if int(value) < int(ours.count or 0):
            return int(value)
        raise UsageError(f"{param}: the model has {ours.count} classes (0-{int(ours.count or 1) - 1}), so it has no "
                         f"class {value}", param=param)
    found = index.find(value)
    if len(found) == 1:
        return next(iter(found))
    if found:
        which = ", ".join(map(str, sorted(found)))
        raise UsageError(f"{param}: {value!r} names {len(found)} of the model's classes ({which}); give the index",
                         param=param)
    hint = did_you_mean(value, index.known()) if ours.names or ours.ids else ""
    records = "" if ours.names or ours.ids else " (the model records no class names: give an index)"
    raise UsageError(f"{param}: the model has no class named {value!r}{hint}{records}", param=param)
