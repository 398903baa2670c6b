"""The report folder and its cache: every (model, section) result is kept as soon as it is computed.

``DIR/cache/<section>-<checkpoint sha256[:16]>.json`` holds a section's Results as JSON (records,
structured extras, provenance, notes), the hash of the settings that produced them
(:func:`jemeval.reports.settings.settings_hash`) and the seconds they took; the per-example OOD
scores and the generated samples go beside it as ``.npz`` files (the figures are drawn from them).
Every file is written atomically and the JSON last, so a kill at any moment leaves either a
complete entry or none: a rerun with the same settings reuses complete entries and computes the
rest. An entry whose settings hash differs (other options, other weights, another device) is
recomputed and replaced. A failed section is not cached: a rerun tries it again.
"""
from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch

from jemeval.artifacts import OODScores, Samples, SamplesResult
from jemeval.atomic import stale_temp_files, write_text_atomic
from jemeval.errors import UsageError
from jemeval.results import Artifact, Result

CACHE = "cache"
FIGURES = "figures"
PRODUCTS = ("report.md", "report.html", "report.json")
FORMAT = "jemeval-report-cache/1"


@dataclass
class Entry:
    """One (model, section) outcome: its Results, or the one-line error that stopped it."""

    section: str
    sha256: str
    runs: list[Result] = field(default_factory=list)
    seconds: float | None = None
    cached: bool = False
    error: str | None = None


def claim_folder(out: str | Path, *, create_parents: bool = False) -> Path:
    """Make ``out`` the report folder: create it (its parent must exist unless ``create_parents``),
    refuse a file or a folder holding other things, and remove temp files a kill left behind."""
    out = Path(out)
    if out.exists() and not out.is_dir():
        raise UsageError(f"out {str(out)!r} is a file; a report is a folder: choose a new or empty folder",
                         param="out")
    if out.is_dir():
        other = sorted(p.name for p in out.iterdir() if p.name not in (CACHE, FIGURES, *PRODUCTS))
        if other and not (out / CACHE).is_dir():
            shown = ", ".join(other[:3]) + (", ..." if len(other) > 3 else "")
            raise UsageError(f"out {str(out)!r} holds other files ({shown}) and no report; choose a new or empty "
                             "folder", param="out")
    elif not out.parent.is_dir() and not create_parents:
        raise UsageError(f"out {str(out)!r}: folder {str(out.parent)!r} does not exist; create it first or choose "
                         "another folder", param="out")
    for folder in (out, out / CACHE, out / FIGURES):
        folder.mkdir(parents=True, exist_ok=True)
    for folder, names in ((out, r"report\.(?:md|html|json)"), (out / CACHE, r".+"), (out / FIGURES, r".+")):
        for stale in stale_temp_files(folder, names):
            stale.unlink(missing_ok=True)
    return out


def _stem(out: Path, section: str, sha256: str) -> Path:
    return out / CACHE / f"{section}-{sha256[:16]}"


def save_entry(out: Path, section: str, sha256: str, key: str, runs: list[Result], seconds: float) -> Entry:
    """Keep a section's Results (artifacts first, the JSON last) and return them as a rerun reads them."""
    stem = _stem(out, section, sha256)
    artifacts = []
    for i, result in enumerate(runs):
        for name, value in result.extra.items():
            if isinstance(value, (OODScores, Samples)):
                path = stem.with_name(f"{stem.name}-{i}-{name}.npz")
                value.save_npz(path) if isinstance(value, Samples) else value.save_npz(path, result.provenance)
                artifacts.append({"run": i, "key": name, "kind": type(value).__name__, "file": path.name})
    entry = {"format": FORMAT, "section": section, "checkpoint_sha256": sha256, "settings_hash": key,
             "seconds": round(float(seconds), 3), "runs": [r.to_dict() for r in runs], "artifacts": artifacts}
    text = json.dumps(entry, indent=1)
    write_text_atomic(stem.with_suffix(".json"), text + "\n")
    return _entry(out, json.loads(text), cached=False)


def load_entry(out: Path, section: str, sha256: str, key: str) -> Entry | None:
    """The cached entry computed with settings hash ``key``, or None (missing, other settings, damaged)."""
    path = _stem(out, section, sha256).with_suffix(".json")
    try:
        entry = json.loads(path.read_text())
        if entry.get("format") != FORMAT or entry.get("settings_hash") != key:
            return None
        return _entry(out, entry, cached=True)
    except (OSError, ValueError, KeyError, TypeError):  # missing, half-written by an old version, damaged
        return None


def _entry(out: Path, entry: dict[str, Any], *, cached: bool) -> Entry:
    """Results rebuilt from the JSON entry (fresh ones too: a rerun and a first run read the same)."""
    runs = []
    for i, data in enumerate(entry["runs"]):
        extra = {k: v for k, v in data.items() if k not in ("records", "provenance", "notes")}
        for art in entry["artifacts"]:
            if art["run"] == i:
                extra[art["key"]] = load_artifact(out / CACHE / art["file"], art["kind"])
        cls = SamplesResult if entry["section"] == "samples" else Result
        runs.append(cls(data["records"], data["provenance"], extra, data.get("notes", [])))
    return Entry(entry["section"], entry["checkpoint_sha256"], runs, entry["seconds"], cached)


def load_artifact(path: Path, kind: str) -> Artifact:
    """An OODScores or Samples written by :func:`save_entry` (numpy, no pickle)."""
    if kind == "OODScores":
        return OODScores.load_npz(path)
    with np.load(path, allow_pickle=False) as f:
        prov = json.loads(str(f["provenance"]))
        t = {k: torch.from_numpy(np.asarray(f[k])) for k in ("x", "y", "log_p", "log_px", "predicted", "confidence",
                                                               "log_p_trace")}
    return Samples(x=t["x"], target=t["y"], log_p=t["log_p"], log_px=t["log_px"], predicted=t["predicted"],
                   confidence=t["confidence"], log_p_trace=t["log_p_trace"], settings=prov["settings"],
                   provenance=prov)
