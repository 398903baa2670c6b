"""The report folder and its cache: every (model, section) result is kept as soon as it is computed.

``DIR/cache/<section>-<checkpoint sha256[:16]>.json`` holds a section's Results as JSON (records,
structured extras, provenance, notes), the hash of the settings that produced them
(:func:`jemeval.reports.settings.settings_hash`: options, checkpoint, device, the contents of the
dataset files the options name), the seconds they took and a checksum; the per-example OOD scores
and the generated samples go beside it as ``.npz`` files (the figures are drawn from them), each
with its SHA-256 in the JSON. Every file is written atomically and the JSON last, so a kill at any
moment leaves either a complete entry or none: a rerun with the same settings reuses complete
entries and computes the rest. An entry whose settings hash differs is recomputed and replaced;
one whose checksum, file hashes or value types do not hold is recomputed with a note (a cache
file is never trusted as written). A failed section is not cached: a rerun tries it again.

The folder is jemeval's only when it says so: ``DIR/.jemeval-report.json`` (the manifest) lists
every file a report wrote there, recorded before the file is written. A folder is claimed when it
is new, empty, holds a manifest, or was written by jemeval 0.1/0.2 (no manifest, and every file in
it is what those versions wrote: :func:`legacy_foreign`); anything else is refused in one line. Only
files the manifest lists are ever replaced or deleted, and nothing inside DIR that is a symbolic
link is written, deleted or read through.
"""
from __future__ import annotations

import hashlib
import json
import os
import re
import warnings
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch

from jemeval.artifacts import OODScores, Samples, SamplesResult
from jemeval.atomic import space_problem, stale_temp_files, write_text_atomic
from jemeval.errors import UsageError, WriteError
from jemeval.provenance import file_sha256
from jemeval.reports.tables import SPECS
from jemeval.results import Artifact, Result

CACHE = "cache"
FIGURES = "figures"
PRODUCTS = ("report.md", "report.html", "report.json")
FORMAT = "jemeval-report-cache/2"
#: the entry formats of jemeval 0.1/0.2 (a folder holding them is adopted; the entries are recomputed)
LEGACY_FORMATS = ("jemeval-report-cache/1", FORMAT)
MANIFEST = ".jemeval-report.json"
MANIFEST_FORMAT = "jemeval-report-folder/1"
#: report.json's layout (reports/schema/report.schema.json); one without "schema" (before 0.3) is version 1,
#: and version 2 changed only "comparisons": both are read (the exports read records, runs and provenance)
REPORT_SCHEMA = "jemeval-report/2"
READABLE_SCHEMAS = ("jemeval-report/1", REPORT_SCHEMA)
#: the leaderboard exports (:mod:`jemeval.reports.exports`) a report writes beside its products
EXPORT_NAMES = re.compile(r"openood\.csv|robustbench-[A-Za-z0-9_][A-Za-z0-9._-]*\.json")
ENTRY_JSON = re.compile(r"([a-z]+)-([0-9a-f]{16})\.json")
ENTRY_NPZ = re.compile(r"[a-z]+-[0-9a-f]{16}-\d+-[A-Za-z_][A-Za-z0-9_]*\.npz")
#: the temporary files jemeval.atomic leaves in each folder when killed mid-write
TEMP_NAMES = {"": r"report\.(?:md|html|json)|\.jemeval-report\.json", CACHE: r".+", FIGURES: r".+"}
ARTIFACT_KINDS = ("OODScores", "Samples")


@dataclass
class Entry:
    """One (model, section) outcome: its Results, or the one-line error that stopped it; ``note``
    says why a cached entry was not used (it did not match its checksum, ...), when it was not."""

    section: str
    sha256: str
    runs: list[Result] = field(default_factory=list)
    seconds: float | None = None
    cached: bool = False
    error: str | None = None
    note: str | None = None


class ReportFolder:
    """DIR and the files jemeval wrote in it (the manifest's list, relative POSIX paths)."""

    def __init__(self, path: str | os.PathLike, files: Iterable[str] = ()) -> None:
        self.path = Path(path)
        self.files = set(files)
        self.removed: set[str] = set()

    def target(self, rel: str) -> Path:
        """DIR/``rel``, refused in one line when it or a folder on the way inside DIR is a link."""
        parts = Path(rel).parts
        for i in range(1, len(parts) + 1):
            if os.path.islink(self.path.joinpath(*parts[:i])):
                raise link_error(self.path, "/".join(parts[:i]))
        return self.path / rel

    def record(self, *rels: str) -> None:
        """List ``rels`` in the manifest before they are written (a kill in between leaves no unlisted file)."""
        new = set(rels) - self.files
        if new:
            self.files |= new
            self.save()

    def remove(self, rel: str) -> None:
        """Delete DIR/``rel`` if, and only if, jemeval wrote it (the manifest lists it)."""
        if rel not in self.files:
            return
        self.target(rel).unlink(missing_ok=True)
        self.files.discard(rel)
        self.removed.add(rel)
        self.save()

    def save(self) -> None:
        """Write the manifest: this run's list, with what another report writing here at the same time
        listed meanwhile (the folder is not locked)."""
        try:
            self.files |= read_manifest(self.path) - self.removed
        except UsageError:  # none yet (or not readable: this run's list replaces it)
            pass
        text = json.dumps({"format": MANIFEST_FORMAT, "files": sorted(self.files)}, indent=1)
        write_text_atomic(self.target(MANIFEST), text + "\n")


def link_error(out: Path, rel: str) -> UsageError:
    return UsageError(f"out {str(out)!r}: {rel} is a symbolic link; jemeval does not write through links: remove "
                      "it or choose a new or empty folder", param="out")


def claim_folder(out: str | os.PathLike, *, create_parents: bool = False,
                 figure_name: Callable[[str], bool] = lambda name: False) -> ReportFolder:
    """Make ``out`` the report folder (see the module docstring): create it (its parent must exist
    unless ``create_parents``), or adopt it; refuse a file, links, and a folder holding files jemeval
    did not write. The manifest is written at once (a read-only location fails here, in one line),
    and temp files a kill left behind are removed. ``figure_name`` tells the figure names apart."""
    out = Path(out)
    if out.exists() and not out.is_dir():
        raise UsageError(f"out {str(out)!r} is a file; a report is a folder: choose a new or empty folder",
                         param="out")
    if out.is_dir():
        folder = existing_folder(out, figure_name)
    elif not out.parent.is_dir() and not create_parents:
        raise UsageError(f"out {str(out)!r}: folder {str(out.parent)!r} does not exist; create it first or choose "
                         "another folder", param="out")
    else:
        make_folder(out, parents=create_parents)
        folder = ReportFolder(out)
    folder.save()
    for sub in (CACHE, FIGURES):
        make_folder(folder.target(sub))
    for sub, names in TEMP_NAMES.items():
        for stale in stale_temp_files(out / sub, names):
            stale.unlink(missing_ok=True)
    return folder


def make_folder(path: Path, *, parents: bool = False) -> None:
    """mkdir, with the one-line errors of :mod:`jemeval.atomic` (a read-only or full location)."""
    try:
        path.mkdir(parents=parents, exist_ok=True)
    except OSError as exc:
        problem = space_problem(exc)
        if problem is not None:
            raise WriteError(f"{problem} creating {str(path)!r}; free some space or choose another location") from None
        raise UsageError(f"cannot write {str(path)!r}: {exc.strerror or exc}; choose a writable location",
                         param="out") from None


def existing_folder(out: Path, figure_name: Callable[[str], bool]) -> ReportFolder:
    """The ReportFolder of an existing folder, or the one-line refusal."""
    for rel in (MANIFEST, CACHE, FIGURES, *PRODUCTS, *(f"{sub}/{p.name}" for sub in (CACHE, FIGURES)
                                                      if (out / sub).is_dir() and not (out / sub).is_symlink()
                                                      for p in sorted((out / sub).iterdir()))):
        if os.path.islink(out / rel):
            raise link_error(out, rel)
    if os.path.lexists(out / MANIFEST):
        files = read_manifest(out)
        foreign = [rel for rel in managed_entries(out) if rel not in files]
        if foreign:
            raise UsageError(f"out {str(out)!r} holds files jemeval did not write where a report writes "
                             f"({_shown(foreign)}; {MANIFEST} does not list them); move them out or choose a new or "
                             "empty folder", param="out")
        return ReportFolder(out, files)
    if not [p for p in out.iterdir() if not _temp(p.name, "")]:
        return ReportFolder(out)
    foreign = legacy_foreign(out, figure_name)
    if foreign:
        raise UsageError(f"out {str(out)!r} holds other files ({_shown(foreign)}) and no report; choose a new or "
                         "empty folder (jemeval never changes files it did not write)", param="out")
    return ReportFolder(out, managed_entries(out))  # a report folder of jemeval 0.1/0.2, adopted


def _shown(names: list[str]) -> str:
    return ", ".join(names[:3]) + (", ..." if len(names) > 3 else "")


def read_manifest(out: Path) -> set[str]:
    """The files DIR's manifest lists (each a product or a plain name in cache/ or figures/)."""
    if os.path.islink(out / MANIFEST):
        raise link_error(out, MANIFEST)
    try:
        data = json.loads((out / MANIFEST).read_text())
        files = set(data["files"]) if data.get("format") == MANIFEST_FORMAT else None
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        files = None
    if files is None or not all(isinstance(f, str) and _listable(f) for f in files):
        raise UsageError(f"out {str(out)!r}: {MANIFEST} is not a report manifest jemeval wrote; choose a new or "
                         "empty folder", param="out")
    return files


def _listable(rel: str) -> bool:
    sub, _, name = rel.rpartition("/")
    if not sub:
        return rel in PRODUCTS or EXPORT_NAMES.fullmatch(rel) is not None
    return sub in (CACHE, FIGURES) and name not in ("", ".", "..") and "/" not in name


def managed_entries(out: Path) -> list[str]:
    """What a report writes that exists in DIR: the products, and the entries of cache/ and figures/
    (temp files of a kill aside)."""
    found = [p for p in PRODUCTS if os.path.lexists(out / p)]
    for sub in (CACHE, FIGURES):
        if (out / sub).is_dir():
            found += [f"{sub}/{p.name}" for p in sorted((out / sub).iterdir()) if not _temp(p.name, sub)]
    return found


def legacy_foreign(out: Path, figure_name: Callable[[str], bool]) -> list[str]:
    """The entries of a folder without a manifest that jemeval 0.1/0.2 would not have written there.
    Such a report folder has cache/ (entries that parse as the cache format, their .npz files), maybe
    figures/ (PNGs named as :func:`jemeval.reports.figures.figure_plan` names them) and the three
    products (report.md/.html/.json as the page writes them); anything else means a user's folder."""
    foreign = []
    for p in sorted(out.iterdir()):
        if _temp(p.name, "") or (p.name in PRODUCTS and p.is_file() and _is_product(p)):
            continue
        if p.name == CACHE and p.is_dir():
            foreign += [f"{CACHE}/{q.name}" for q in sorted(p.iterdir()) if not _is_cache_file(q)]
        elif p.name == FIGURES and p.is_dir():
            foreign += [f"{FIGURES}/{q.name}" for q in sorted(p.iterdir()) if not _is_figure(q, figure_name)]
        else:
            foreign.append(p.name + ("/" if p.is_dir() else ""))
    if not (out / CACHE).is_dir():  # every report folder of 0.1/0.2 has one
        foreign = foreign or [p.name for p in sorted(out.iterdir()) if not _temp(p.name, "")]
    return sorted(set(foreign), key=lambda rel: (rel not in PRODUCTS, rel))


def _temp(name: str, sub: str) -> bool:
    """Whether ``name`` is a temp file jemeval.atomic leaves in DIR/``sub`` when killed mid-write."""
    return re.fullmatch(rf"\.(?:{TEMP_NAMES[sub]})\.[a-z0-9_]{{8}}\.tmp", name) is not None


def _head(path: Path, n: int = 4096) -> bytes:
    with open(path, "rb") as fh:
        return fh.read(n)


def _is_product(path: Path) -> bool:
    try:
        if path.name == "report.md":
            return _head(path).startswith(b"# jemeval report")
        if path.name == "report.html":
            return b"<title>jemeval report" in _head(path)
        data = json.loads(path.read_text())
        return isinstance(data, dict) and data.get("provenance", {}).get("command") == "report"
    except (OSError, ValueError, AttributeError):
        return False


def _is_cache_file(path: Path) -> bool:
    if not path.is_file():
        return False
    if _temp(path.name, CACHE):
        return True
    if ENTRY_NPZ.fullmatch(path.name):
        return _head(path, 4) == b"PK\x03\x04"  # an .npz is a zip file
    m = ENTRY_JSON.fullmatch(path.name)
    try:
        entry = json.loads(path.read_text()) if m else None
        return bool(m) and entry.get("format") in LEGACY_FORMATS and entry.get("section") == m.group(1) and str(
            entry.get("checkpoint_sha256", "")).startswith(m.group(2))
    except (OSError, ValueError, AttributeError):
        return False


def _is_figure(path: Path, figure_name: Callable[[str], bool]) -> bool:
    if _temp(path.name, FIGURES):
        return True
    try:
        return path.is_file() and figure_name(path.name) and _head(path, 8) == b"\x89PNG\r\n\x1a\n"
    except OSError:
        return False


# -- the entries -----------------------------------------------------------------------------------
def _stem(section: str, sha256: str) -> str:
    return f"{CACHE}/{section}-{sha256[:16]}"


def checksum(entry: dict[str, Any]) -> str:
    """SHA-256 of an entry's canonical JSON (every key but the checksum itself)."""
    body = {k: v for k, v in entry.items() if k != "checksum"}
    return hashlib.sha256(json.dumps(body, sort_keys=True, separators=(",", ":")).encode()).hexdigest()


def save_entry(folder: ReportFolder, section: str, sha256: str, key: str, runs: list[Result],
               seconds: float) -> Entry:
    """Keep a section's Results (artifacts first, the JSON with their hashes and its checksum last)
    and return them as a rerun reads them."""
    stem = _stem(section, sha256)
    planned = [(i, name, value, f"{stem}-{i}-{name}.npz") for i, result in enumerate(runs)
               for name, value in result.extra.items() if isinstance(value, (OODScores, Samples))]
    folder.record(*[rel for *_, rel in planned], stem + ".json")
    artifacts = []
    for i, name, value, rel in planned:
        path = folder.target(rel)
        value.save_npz(path) if isinstance(value, Samples) else value.save_npz(path, runs[i].provenance)
        artifacts.append({"run": i, "key": name, "kind": type(value).__name__, "file": path.name,
                          "sha256": file_sha256(path)})
    entry = json.loads(json.dumps({
        "format": FORMAT, "section": section, "checkpoint_sha256": sha256, "settings_hash": key,
        "seconds": round(float(seconds), 3), "runs": [r.to_dict() for r in runs], "artifacts": artifacts}))
    entry["checksum"] = checksum(entry)
    write_text_atomic(folder.target(stem + ".json"), json.dumps(entry, indent=1) + "\n")
    return _entry(folder.path, entry, cached=False)


def load_entry(out: Path, section: str, sha256: str, key: str, notes: list[str] | None = None) -> Entry | None:
    """The cached entry computed with settings hash ``key``, or None: missing, other settings, or not
    what jemeval wrote (checksum, an artifact's SHA-256 or a value's type wrong: a note is added to
    ``notes`` and warned, and the caller recomputes it)."""
    rel = _stem(section, sha256) + ".json"
    path = out / rel
    if not path.is_file() or path.is_symlink():
        return None
    try:
        entry = json.loads(path.read_text())
        if not isinstance(entry, dict) or entry.get("format") != FORMAT or entry.get("settings_hash") != key:
            return None  # another version's or other settings': recomputed and replaced
        problem = None if entry.get("checksum") == checksum(entry) else "did not match its checksum"
        problem = problem or entry_problem(out / CACHE, entry, section, sha256)
        if problem is None:
            return _entry(out, entry, cached=True)
    except Exception as exc:  # noqa: BLE001 - a damaged entry is recomputed, never the report's end
        problem = f"could not be read ({type(exc).__name__})"
    note = f"cached entry {rel} {problem}; recomputed"
    warnings.warn(note, stacklevel=2)
    if notes is not None:
        notes.append(note)
    return None


def entry_problem(cache: Path, entry: dict[str, Any], section: str, sha256: str) -> str | None:
    """What is wrong with an entry whose checksum holds (values of the wrong types, artifact files
    that are not the ones written), or None."""
    runs, arts = entry.get("runs"), entry.get("artifacts")
    metrics = {k for k, _, _ in SPECS[section].metrics} if section in SPECS else set()
    typed = (entry.get("section") == section and entry.get("checkpoint_sha256") == sha256
             and _number(entry.get("seconds")) and isinstance(runs, list) and isinstance(arts, list)
             and all(isinstance(run, dict) and isinstance(run.get("records"), list)
                     and isinstance(run.get("provenance"), dict) and isinstance(run.get("notes", []), list)
                     and all(isinstance(n, str) for n in run.get("notes", [])) for run in runs)
             and all(isinstance(r, dict) and all(_number(v) or v is None for k, v in r.items() if k in metrics
                                                 or k.endswith(("_lo", "_hi", "ci_low", "ci_high")))
                     for run in runs for r in run["records"])
             and all(isinstance(a, dict) and a.get("kind") in ARTIFACT_KINDS and isinstance(a.get("run"), int)
                     and 0 <= a["run"] < len(runs) and ENTRY_NPZ.fullmatch(str(a.get("file")))
                     and a["file"] == f"{section}-{sha256[:16]}-{a['run']}-{a.get('key')}.npz" for a in arts))
    if not typed:
        return "has values of the wrong types"
    changed = [a["file"] for a in arts if not (cache / a["file"]).is_file() or (cache / a["file"]).is_symlink()
               or file_sha256(cache / a["file"]) != a.get("sha256")]
    return f"did not match its checksum ({changed[0]} changed)" if changed else None


def _number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


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
