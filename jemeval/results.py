"""Results: a list of records plus provenance, written as JSON, CSV or markdown (atomically).

Every command returns a :class:`Result`; the CLI only chooses how to print or save it. Each
format carries the provenance: JSON as a ``provenance`` key, CSV as leading ``# `` comment lines
(read back with ``pandas.read_csv(path, comment="#")``), markdown as a fenced JSON block. In Python,
``result.to_pandas()`` (or ``pandas.DataFrame(result)``: a Result iterates over its records) is the
records as a DataFrame, and ``repr(result)`` is one short line, not every record.
"""
from __future__ import annotations

import io
import json
import math
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from jemeval.atomic import write_text_atomic


class Artifact:
    """Marks a data object in :attr:`Result.extra` (images, per-example scores) that stays in memory
    for Python callers: JSON and CSV output leave it out, and it saves itself (its own methods)."""


def _plain(obj: Any, *, keep_nan: bool = False) -> Any:
    """Make numpy / torch values JSON-friendly (NaN -> null; ``keep_nan``: left a float, for pandas)."""
    import torch

    if isinstance(obj, dict):
        return {str(k): _plain(v, keep_nan=keep_nan) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_plain(v, keep_nan=keep_nan) for v in obj]
    if torch.is_tensor(obj):
        return _plain(obj.detach().cpu().tolist(), keep_nan=keep_nan)
    if isinstance(obj, np.ndarray):
        return _plain(obj.tolist(), keep_nan=keep_nan)
    if isinstance(obj, np.generic):
        return _plain(obj.item(), keep_nan=keep_nan)
    if isinstance(obj, float) and not keep_nan and (math.isnan(obj) or math.isinf(obj)):
        return None
    if isinstance(obj, Path):
        return str(obj)
    return obj


@dataclass
class Result:
    """Records (one dict per row) with their provenance and any extra structured output.

    ``extra`` holds structured output beside the records (written into the JSON result) and
    :class:`Artifact` objects (kept for Python callers, left out of the JSON).
    """

    records: list[dict[str, Any]]
    provenance: dict[str, Any] = field(default_factory=dict)
    extra: dict[str, Any] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        extra = {k: v for k, v in self.extra.items() if not isinstance(v, Artifact)}
        out = {"records": self.records, **extra, "provenance": self.provenance}
        if self.notes:
            out["notes"] = self.notes
        return _plain(out)

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), indent=2, sort_keys=False)

    def to_pandas(self, columns: list[str] | None = None):
        """The records as a pandas DataFrame, one row per record (``columns``: those, in that order).
        Tensors and numpy values become plain Python values, as in the JSON and CSV outputs (a missing
        number is NaN); the provenance stays in :attr:`provenance`."""
        return _dataframe(self.records, columns, keep_nan=True)

    #: the name of :meth:`to_pandas` up to 0.2, kept
    frame = to_pandas

    def __iter__(self) -> Iterator[dict[str, Any]]:
        """The records, so that ``pandas.DataFrame(result)`` and ``for record in result`` work."""
        return iter(self.records)

    def __repr__(self) -> str:
        """One line (a notebook or a log shows this, not every record and the whole provenance): the
        kind, the record count and first columns, what produced them, e.g.
        ``<Result ood: 12 records (score, id, ood, auroc, ...); jemeval 0.3.0, cpu>``."""
        prov = self.provenance if isinstance(self.provenance, dict) else {}
        columns = table_columns(self.records)
        parts = [f"{len(self.records)} record{'' if len(self.records) == 1 else 's'}"]
        if columns:
            parts[0] += f" ({', '.join(columns[:REPR_COLUMNS])}{', ...' if len(columns) > REPR_COLUMNS else ''})"
        made = [f"jemeval {prov['jemeval_version']}"] if prov.get("jemeval_version") else []
        made += [str(prov["device"])] if prov.get("device") else []
        parts += [", ".join(made)] if made else []
        parts += [f"{len(self.notes)} note{'' if len(self.notes) == 1 else 's'}"] if self.notes else []
        kind = f" {prov['command']}" if prov.get("command") else ""
        return f"<{type(self).__name__}{kind}: {'; '.join(parts)}>"

    def table(self, columns: list[str] | None = None, floatfmt: str = ".4f") -> str:
        if not self.records:
            return "(no results)"
        return text_table(_plain(self.records), columns, floatfmt)

    def to_csv(self, columns: list[str] | None = None) -> str:
        buf = io.StringIO()
        for line in json.dumps(_plain(self.provenance), sort_keys=True).splitlines():
            buf.write(f"# provenance: {line}\n")
        _dataframe(self.records, columns).to_csv(buf, index=False)  # inf, like NaN, an empty field
        return buf.getvalue()

    def to_markdown(self, columns: list[str] | None = None, floatfmt: str = ".4f") -> str:
        table = markdown_table(_plain(self.records), columns, floatfmt)
        prov = json.dumps(_plain(self.provenance), indent=2, sort_keys=True)
        notes = "".join(f"\n> {n}\n" for n in self.notes)
        return (f"{table}\n{notes}\n<details><summary>provenance</summary>\n\n```json\n{prov}\n```\n"
                "</details>\n")

    def save_json(self, path: str | Path) -> Path:
        return write_text_atomic(path, self.to_json() + "\n")

    def save_csv(self, path: str | Path, columns: list[str] | None = None) -> Path:
        return write_text_atomic(path, self.to_csv(columns))


def _dataframe(records: list[dict[str, Any]], columns: list[str] | None = None, *, keep_nan: bool = False):
    import pandas as pd

    df = pd.DataFrame(_plain(records, keep_nan=keep_nan))
    if columns:
        df = df[[c for c in columns if c in df.columns]]
    return df


#: how a missing value (None, NaN) prints in tables and markdown; JSON has null, CSV an empty field
MISSING = "-"
#: the record keys ``repr(result)`` names before "..."
REPR_COLUMNS = 4


def table_columns(rows: list[dict[str, Any]], columns: list[str] | None = None) -> list[str]:
    """``columns`` that some row has (in that order), or every key in order of first appearance."""
    present = list(dict.fromkeys(k for row in rows for k in row))
    return [c for c in columns if c in present] if columns else present


def _missing(value: Any) -> bool:
    return value is None or (isinstance(value, float) and math.isnan(value))


def _cell(value: Any, floatfmt: str) -> str:
    if _missing(value):
        return MISSING
    if isinstance(value, float):
        return format(value, floatfmt)
    return str(value)


def text_table(rows: list[dict[str, Any]], columns: list[str] | None = None, floatfmt: str = ".4f") -> str:
    """A plain right-aligned table; missing values print as ``-`` (the one rule for every table)."""
    columns = table_columns(rows, columns)
    cells = [[_cell(row.get(c), floatfmt) for c in columns] for row in rows]
    widths = [max([len(c)] + [len(r[i]) for r in cells]) for i, c in enumerate(columns)]
    return "\n".join(" ".join(v.rjust(w) for v, w in zip(line, widths)) for line in [columns, *cells])


def markdown_table(rows: list[dict[str, Any]], columns: list[str] | None = None, floatfmt: str = ".4f") -> str:
    """A pipe (GitHub) markdown table; missing values print as ``-`` as in :func:`text_table`."""
    from tabulate import tabulate

    columns = table_columns(rows, columns)
    body = [[None if _missing(row.get(c)) else str(row[c]) if isinstance(row[c], bool) else row[c]
             for c in columns] for row in rows]
    return tabulate(body, headers=columns, tablefmt="pipe", floatfmt=floatfmt, missingval=MISSING)
