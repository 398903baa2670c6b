"""metrics.csv: one row per epoch, plus one row per divergence event, rewritten atomically.

The rows also travel inside ``last.pt``, and every start and resume rewrites the file from them: a
kill between the checkpoint and the CSV write cannot leave the CSV a row short for good. Read it with
``pandas.read_csv(path)``; the ``event`` column is empty on ordinary epochs and says what
happened otherwise ("diverged: ...", "recovered: rollback to epoch 3, reseed 1001, lr 5e-05").
"""
from __future__ import annotations

import csv
import io
import math
from pathlib import Path
from typing import Any

from jemeval.atomic import write_text_atomic

COLUMNS = (
    "epoch", "step", "train_acc", "val_acc", "loss", "loss_pyx", "loss_px", "loss_pxy", "loss_l2",
    "energy_data", "energy_sample", "energy_gap", "lr", "sgld_steps", "seconds", "images_per_s", "event",
)


def _cell(value: Any) -> Any:
    if value is None:
        return ""
    if isinstance(value, float):
        return "" if math.isnan(value) else f"{value:.6g}"
    return value


class MetricsLog:
    def __init__(self, path: str | Path, rows: list[dict] | None = None) -> None:
        self.path = Path(path)
        self.rows: list[dict] = [dict(r) for r in (rows or [])]

    def add(self, **row: Any) -> dict:
        unknown = set(row) - set(COLUMNS)
        if unknown:
            raise KeyError(f"unknown metrics columns {sorted(unknown)}")
        full = {c: row.get(c) for c in COLUMNS}
        self.rows.append(full)
        return full

    def to_csv(self) -> str:
        buf = io.StringIO()
        writer = csv.writer(buf, lineterminator="\n")
        writer.writerow(COLUMNS)
        for row in self.rows:
            writer.writerow([_cell(row.get(c)) for c in COLUMNS])
        return buf.getvalue()

    def write(self) -> Path:
        return write_text_atomic(self.path, self.to_csv())

    def state(self) -> list[dict]:
        """Plain rows for the checkpoint (floats, ints, strings, None)."""
        return [dict(r) for r in self.rows]
