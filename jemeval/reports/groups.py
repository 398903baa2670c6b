"""Models as groups of runs: a name stands for one checkpoint or for several seeds of one recipe.

One checkpoint is one draw: JEM runs differ by seed by more than the differences a table of single
runs would bold. ``--model 'runs/jem-s*/best.pt' --name JEM`` (a glob, or several paths with one
name) makes JEM a *seed group*: each run is computed and cached on its own, exactly as a single
model is, and the page shows the group's mean, its standard deviation over the runs (n - 1 in the
denominator) and how many runs there were, ``mean +- sd (n seeds)``; report.json keeps every run's
records and each group's per-seed values. A group of one run is shown exactly as a single model.
"""
from __future__ import annotations

import glob
import math
import os
import statistics
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from jemeval.errors import UsageError
from jemeval.formats.load import is_model_source
from jemeval.reports.tables import SPECS

#: a --model value holding one of these (and naming no existing file) is a pattern
GLOB_CHARS = "*?["
#: numbers that describe the setting, never a result: not averaged with a spread
SETTING_NUMBERS = frozenset({"n", "n_id", "n_ood", "seed", "sigma", "split_seed", "steps", "restarts", "eot_samples",
                             "draws", "chains", "bins"})


def default_names(paths: Sequence[str]) -> list[str]:
    """runs/digits/best.pt -> "digits" (the run folder), other files -> their stem; clashes get a number."""
    names = [Path(p).parent.name if Path(p).stem in ("best", "last") and Path(p).parent.name else Path(p).stem
             for p in paths]
    return [f"{n} ({i + 1})" if names.count(n) > 1 else n for i, n in enumerate(names)]


def expand(value: str) -> list[str]:
    """The checkpoints one --model value names: itself (a file, a model source), or a glob's matches
    in sorted order (a pattern matching nothing is refused in one line)."""
    if is_model_source(value) or Path(value).is_file() or not any(c in value for c in GLOB_CHARS):
        return [value]
    matches = sorted(glob.glob(value))
    if not matches:
        raise UsageError(f"model {value!r} matches no file; give checkpoint files or a pattern that matches them "
                         "(e.g. 'runs/jem-s*/best.pt', quoted so the shell does not expand it)", param="models")
    return matches


def _items(value: Any) -> list[str]:
    if isinstance(value, (str, os.PathLike)):
        return expand(os.fspath(value))
    return [path for v in value for path in _items(v)]


def model_groups(models: Any, names: Sequence[str] | None) -> list[tuple[str, list[str]]]:
    """(name, checkpoint paths) per model: ``models`` is a path or glob, a list of them (one model
    each; with exactly one name, all of them form that one model's seed group), or a mapping
    name -> path, glob or list of paths."""
    if isinstance(models, Mapping):
        if names is not None:
            raise UsageError("names: the models are given as a mapping of names to paths already", param="names")
        names, values = [str(k) for k in models], list(models.values())
    else:
        values = [models] if isinstance(models, (str, os.PathLike)) else list(models)
        if names is not None and len(names) == 1 and len(values) > 1:
            values = [values]  # several paths, one name: a seed group
    if not values:
        raise UsageError("models is empty; give one or more checkpoints", param="models")
    groups = [_items(v) for v in values]
    names = default_names([os.fspath(v) if isinstance(v, (str, os.PathLike)) else g[0] for v, g in
                           zip(values, groups)]) if names is None else [str(n) for n in names]
    if len(names) != len(groups):
        raise UsageError(f"names gives {len(names)} name(s) for {len(groups)} model(s); give one per model (or one "
                         "name for several checkpoints: a seed group)", param="names")
    if len(set(names)) != len(names):
        raise UsageError(f"names must differ, got {names}", param="names")
    for name, paths in zip(names, groups):
        check_group(name, paths)
    check_shared_paths(list(zip(names, groups)), values)
    return list(zip(names, groups))


def check_shared_paths(groups: list[tuple[str, list[str]]], given: Sequence[Any] = ()) -> None:
    """One file in two models (two --model patterns matching it) refused before any checkpoint is
    read; a copy under another path is found by its SHA-256 (:func:`check_distinct_runs`). ``given``:
    the --model values the groups came from, quoted in the message when they are patterns."""
    owner: dict[str, tuple[int, str]] = {}  # resolved path (or model source) -> (group index, path)
    for i, (name, paths) in enumerate(groups):
        for p in paths:
            key = p if is_model_source(p) else os.path.realpath(p)
            if key in owner and owner[key][0] != i:
                j, first = owner[key]
                patterns = [str(given[k]) for k in (j, i) if k < len(given) and isinstance(given[k], (str, os.PathLike))
                            and any(c in os.fspath(given[k]) for c in GLOB_CHARS)]
                overlap = f" (the patterns {' and '.join(map(repr, patterns))} overlap)" if len(patterns) == 2 else ""
                raise UsageError(f"checkpoint {p!r} is in both {groups[j][0]!r} and {name!r}"
                                 + (f" (also as {first!r})" if first != p else "") + ": a paired test between the two "
                                 f"would compare that run with itself; give each its own checkpoints{overlap}",
                                 param="models")
            owner.setdefault(key, (i, p))


def check_group(name: str, paths: list[str]) -> None:
    """Every run of a group is a checkpoint file (or a model source), each named once."""
    for p in paths:
        if not Path(p).is_file() and not is_model_source(p):
            raise UsageError(f"model {p!r} is not a file; give checkpoint files (e.g. runs/digits/best.pt) or "
                             "model sources (timm:NAME, torchvision:NAME, ...)", param="models")
    seen: dict[str, str] = {}
    for p in paths:
        key = p if is_model_source(p) else os.path.realpath(p)
        if key in seen:
            raise UsageError(f"model {name!r} names {p!r} twice ({seen[key]!r}); each run of a seed group must be "
                             "another checkpoint", param="models")
        seen[key] = p


def run_names(group: str, paths: list[str]) -> list[str]:
    """The runs' names: the group's own for a group of one, ``JEM #1``, ``JEM #2``, ... otherwise."""
    return [group] if len(paths) == 1 else [f"{group} #{i + 1}" for i in range(len(paths))]


def check_distinct_runs(groups: Mapping[str, Sequence[Any]]) -> None:
    """Every run is another checkpoint: within a seed group, a checkpoint named twice (the same
    SHA-256 under two paths: a copy) would show a spread of zero it does not have; across models,
    one checkpoint in two of them would make their paired tests compare a run with itself. Either
    is refused in one line naming the checkpoint (by path and SHA-256) and the model(s).
    ``groups``: name -> ModelInfos."""
    owner: dict[str, tuple[str, str]] = {}  # SHA-256 -> (model, path)
    for name, infos in groups.items():
        seen: dict[str, str] = {}
        for m in infos:
            if m.sha256 in seen:
                raise UsageError(f"model {name!r}: {m.path!r} and {seen[m.sha256]!r} are the same checkpoint "
                                 f"(SHA-256 {m.sha256[:16]}...); each run of a seed group must be another training "
                                 "run", param="models")
            seen[m.sha256] = m.path
        for sha, path in seen.items():
            if sha in owner:
                other, other_path = owner[sha]
                same = ("the same file" if os.path.realpath(path) == os.path.realpath(other_path)
                        else f"the same checkpoint as {other_path!r}")
                raise UsageError(f"checkpoint {path!r} is in both {other!r} and {name!r} ({same}, SHA-256 "
                                 f"{sha[:16]}...): a paired test between the two would compare that run with itself; "
                                 "give each its own checkpoints", param="models")
        owner.update({sha: (name, path) for sha, path in seen.items()})


# -- the numbers of a group -------------------------------------------------------------------------
def _number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def _interval_key(key: str) -> bool:
    return key.endswith(("_lo", "_hi")) or key in ("ci_low", "ci_high")


def row_key(section: str, record: Mapping[str, Any]) -> tuple:
    """The setting that identifies a record's row in ``section``'s tables (matched across runs and models)."""
    return tuple(tuple(v) if isinstance(v := record.get(k), list) else v for k, _ in SPECS[section].keys)


def aggregate(section: str, per_run: Mapping[str, list[dict[str, Any]]]) -> list[dict[str, Any]]:
    """A group's records from its runs' records: one per row, each metric the mean over the runs
    that have it, with ``mean``, ``sd`` (None for one value) and ``values`` (per seed, run order) per
    metric, ``n_seeds`` and ``runs``. A group of one run: its records unchanged."""
    if len(per_run) == 1:
        return [dict(r) for r in next(iter(per_run.values()))]
    rows: dict[tuple, dict[str, dict[str, Any]]] = {}
    for run, records in per_run.items():
        for r in records:
            rows.setdefault(row_key(section, r), {})[run] = r
    return [mean_record(section, by_run) for by_run in rows.values()]


def mean_record(section: str, by_run: Mapping[str, dict[str, Any]]) -> dict[str, Any]:
    """One row of a group (see :func:`aggregate`); per-run intervals are dropped (the spread replaces them);
    ``flags``: every run's, together."""
    keys = {k for k, _ in SPECS[section].keys} | set(SPECS[section].bookkeeping) | SETTING_NUMBERS
    records = list(by_run.values())
    out: dict[str, Any] = {}
    mean: dict[str, float] = {}
    sd: dict[str, float | None] = {}
    values: dict[str, list[float | None]] = {}
    for key, first in records[0].items():
        if _interval_key(key) or (isinstance(first, (list, dict)) and key not in keys):
            continue
        if key in keys or not (first is None or (isinstance(first, (int, float)) and not isinstance(first, bool))):
            out[key] = first
            continue
        seen = [r.get(key) for r in records]
        finite = [float(v) for v in seen if _number(v)]
        if not finite:
            out[key] = None
            continue
        out[key] = mean[key] = math.fsum(finite) / len(finite)
        sd[key] = statistics.stdev(finite) if len(finite) > 1 else None
        values[key] = [float(v) if _number(v) else None for v in seen]
    if any("flags" in r for r in records):  # a number any run's checks flagged is flagged for the group
        out["flags"] = list(dict.fromkeys(f for r in records for f in r.get("flags") or []))
    return {**out, "mean": mean, "sd": sd, "values": values, "n_seeds": len(records), "runs": list(by_run)}

