"""Comparison tables: one row per setting and metric, one column per model, the best value marked.

Records of the same section are matched across models by their setting keys (``refine_steps`` for
accuracy, ``score`` and ``ood`` for OOD detection, ...). A metric with a known direction (higher or
lower is better) has its best value per row marked (every tied best, when two or more models have
a value); a metric the report does not know (a plugin's) is shown unmarked. Intervals a record
carries (``ci_low``/``ci_high``, ``<metric>_lo``/``_hi``) are shown beside the value.
"""
from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from jemeval.results import MISSING

#: (record key, label, "max" | "min" | None)
Metric = tuple[str, str, str | None]


@dataclass
class Spec:
    """How a section's records become rows: the keys that identify a row, the metrics shown, the
    numeric keys that are bookkeeping (never metrics), and whether each metric gets its own table."""

    keys: list[tuple[str, str]]
    metrics: list[Metric]
    extra_metrics: bool = False
    bookkeeping: tuple[str, ...] = ()
    per_metric: bool = False
    only: dict[str, Any] = field(default_factory=dict)
    hide: dict[str, dict[str, Any]] = field(default_factory=dict)  # metric -> the row keys where it means nothing


SPECS: dict[str, Spec] = {
    "accuracy": Spec([("refine_steps", "K (refinement steps)")], [("accuracy", "accuracy", "max"),
                                                                   ("nll", "NLL", "min")]),
    "calibration": Spec([("calibration", "calibration")],
                        [("temperature", "temperature T", None), ("ece", "ECE", "min"), ("mce", "MCE", "min"),
                         ("rms", "RMS calibration error", "min"), ("brier", "Brier", "min"), ("nll", "NLL", "min"),
                         ("accuracy", "accuracy", "max")], extra_metrics=True, bookkeeping=("n",),
                        hide={"temperature": {"calibration": "none"}}),
    "ood": Spec([("score", "score"), ("ood", "OOD set")],
                [("auroc", "AUROC", "max"), ("aupr_in", "AUPR-In", "max"), ("aupr_out", "AUPR-Out", "max"),
                 ("fpr95", "FPR95", "min")], extra_metrics=True, bookkeeping=("n_id", "n_ood"), per_metric=True),
    "robust": Spec([("norm", "norm"), ("attack", "attack"), ("grad_mode", "gradient"), ("refine_steps", "K"),
                    ("epsilon", "epsilon")], [("robust_accuracy", "robust accuracy", "max")]),
    "samples": Spec([("class", "class")], [("target_rate", "target class rate", "max"),
                                           ("mean_confidence", "mean confidence", None),
                                           ("mean_log_px", "mean log p~(x)", None)], only={"class": "all"}),
}
ARROWS = {"max": " ↑", "min": " ↓", None: ""}
#: what a seed group's record adds (jemeval.reports.groups.mean_record): never a metric of its own
GROUP_KEYS = ("mean", "sd", "values", "n_seeds", "runs", "run", "flags")
#: (row key, metric) -> the one model whose value a paired test (Holm) found better than the next, or
#: None where the test found no difference: the only rows where a value is bolded as the best
Decided = dict[tuple[tuple, str], str | None]


@dataclass
class Table:
    """A rendered-agnostic table: header, rows of text cells, and which cells are the best."""

    columns: list[str]
    rows: list[list[str]]
    best: list[list[bool]]
    title: str | None = None
    label_columns: int = 1


#: keys whose numbers count things: shown as integers, never as 450.0000
COUNT_KEYS = frozenset({"n", "n_id", "n_ood", "examples", "epochs", "iterations", "sgld_steps", "forward_passes",
                        "chains", "refine_steps", "seeds", "b", "c", "n_boot"})
#: what marks a number a check flagged (the section's notes say why)
FLAGGED = " (flagged)"


def fmt(value: Any) -> str:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return MISSING
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return str(value)
    return str(value) if isinstance(value, int) else f"{value:.4f}"


def fmt_count(value: Any) -> str:
    """A count as an integer (a mean over seeds that is not whole keeps one decimal)."""
    if not _finite(value):
        return fmt(value)
    return str(int(round(value))) if float(value).is_integer() else f"{value:.1f}"


def fmt_seconds(value: Any) -> str:
    """Seconds to 3 significant figures, never in scientific notation (0.0123, 2.50, 18.6, 1230)."""
    if not _finite(value):
        return fmt(value)
    x = float(f"{float(value):.3g}")
    if x == 0 or abs(x) >= 100:
        return f"{x:.0f}"
    return f"{x:.{2 - math.floor(math.log10(abs(x)))}f}"


def fmt_p(value: Any) -> str:
    """A p-value as a reader reads it: 0.031, 0.5, 1, and "< 1e-4" below that."""
    if not _finite(value):
        return fmt(value)
    return "< 1e-4" if value < 1e-4 else f"{value:.2g}"


def _finite(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def fmt_key(key: str, value: Any, record: dict[str, Any]) -> str:
    """A setting as people write it: raw/temperature-scaled, Linf epsilons as k/255."""
    if key == "calibration":
        return {"none": "raw", "temperature": "temperature-scaled"}.get(value, str(value))
    if key == "epsilon" and isinstance(value, (int, float)):
        k = value * 255
        if record.get("norm") == "linf" and value and abs(k - round(k)) < 1e-6:
            return f"{round(k)}/255"
        return f"{value:g}"
    return fmt_count(value) if key in COUNT_KEYS else fmt(value)


def interval(record: dict[str, Any], key: str) -> tuple[float, float] | None:
    pairs = [(f"{key}_lo", f"{key}_hi")] + ([("ci_low", "ci_high")] if key == "robust_accuracy" else [])
    for lo, hi in pairs:
        if record.get(lo) is not None and record.get(hi) is not None:
            return float(record[lo]), float(record[hi])
    return None


def metrics_of(spec: Spec, records: Sequence[dict[str, Any]]) -> list[Metric]:
    """The spec's metrics present in ``records``, then (where the spec allows) any other numeric key."""
    present = {k for r in records for k in r}
    chosen = [m for m in spec.metrics if m[0] in present]
    if spec.extra_metrics:
        known = {m[0] for m in spec.metrics} | {k for k, _ in spec.keys} | set(spec.bookkeeping) | set(GROUP_KEYS)
        for r in records:
            for k, v in r.items():
                if (k not in known and not k.endswith(("_lo", "_hi")) and isinstance(v, (int, float))
                        and not isinstance(v, bool) and k not in {m[0] for m in chosen}):
                    chosen.append((k, k, None))
    return chosen


def best_marks(values: list[Any], better: str | None) -> list[bool]:
    """Which values are the best as shown (rounded like the table), when two or more can be compared."""
    numbers = [round(float(v), 4) if isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)
               else None for v in values]
    present = [v for v in numbers if v is not None]
    if better is None or len(present) < 2:
        return [False] * len(values)
    best = max(present) if better == "max" else min(present)
    return [v == best for v in numbers]


def section_tables(section: str, per_model: dict[str, list[dict[str, Any]]],
                   decided: Decided | None = None) -> list[Table]:
    """The comparison table(s) of ``section``: ``per_model`` maps each model name to its records
    (a seed group's: :func:`jemeval.reports.groups.aggregate`). With ``decided`` (the report's paired
    tests) a value is bold only where its test found it better than the next; without, the best
    value per row as shown."""
    spec = SPECS[section]
    models = list(per_model)
    per_model = {m: [r for r in rs if all(r.get(k) == v for k, v in spec.only.items())] for m, rs in per_model.items()}
    rows_by_key: dict[tuple, dict[str, dict[str, Any]]] = {}
    for model, records in per_model.items():
        for r in records:
            rows_by_key.setdefault(tuple(_hashable(r.get(k)) for k, _ in spec.keys), {})[model] = r
    metrics = metrics_of(spec, [r for rs in per_model.values() for r in rs])
    labels = [label for _, label in spec.keys]
    if spec.per_metric:
        return [_table(rows_by_key, models, spec, [metric], labels, title=metric[1] + _direction(metric[2]),
                       decided=decided) for metric in metrics]
    return [_table(rows_by_key, models, spec, metrics, [*labels, "metric"], decided=decided)]


def _direction(better: str | None) -> str:
    return {"max": " (higher is better)", "min": " (lower is better)"}.get(better, "")


def _hashable(value: Any) -> Any:
    return tuple(value) if isinstance(value, list) else value


def _table(rows_by_key, models, spec: Spec, metrics: list[Metric], columns: list[str], title=None,
           decided: Decided | None = None) -> Table:
    rows, best = [], []
    for row, by_model in rows_by_key.items():
        first = next(iter(by_model.values()))
        keys = [fmt_key(k, first.get(k), first) for k, _ in spec.keys]
        for key, label, better in metrics:
            if key in spec.hide and all(first.get(k) == v for k, v in spec.hide[key].items()):
                continue
            values = [by_model.get(m, {}).get(key) for m in models]
            if all(v is None for v in values):
                continue
            cells = [cell(by_model.get(m, {}), key) for m in models]
            rows.append(keys + ([] if spec.per_metric else [label + ARROWS[better]]) + cells)
            marks = (best_marks(values, better) if decided is None or better is None
                     else [m == decided.get((row, key)) for m in models])
            marks = [mark and not (key == "robust_accuracy" and by_model.get(m, {}).get("flags"))
                     for mark, m in zip(marks, models)]
            best.append([False] * len(columns) + marks)
    return Table(columns + [group_header(m, rows_by_key) for m in models], rows, best, title,
                 label_columns=len(columns))


def group_header(model: str, rows_by_key: dict[tuple, dict[str, dict[str, Any]]]) -> str:
    """A model's column header: its name, and for a seed group how many runs its cells average."""
    seeds = max((r.get("n_seeds") or 1 for by_model in rows_by_key.values() for m, r in by_model.items()
                 if m == model), default=1)
    return f"{model} ({seeds} seeds)" if seeds > 1 else model


def cell(record: dict[str, Any], key: str) -> str:
    """A value as the tables show it: with its interval, or ``mean +- sd`` for a seed group (the column
    header says how many seeds); a number a check flagged is marked :data:`FLAGGED`."""
    text = fmt_count(record.get(key)) if key in COUNT_KEYS else fmt(record.get(key))
    mark = FLAGGED if key == "robust_accuracy" and record.get("flags") and text != MISSING else ""
    n, sd = record.get("n_seeds"), (record.get("sd") or {}).get(key) if isinstance(record.get("sd"), dict) else None
    if isinstance(n, int) and n > 1 and text != MISSING:  # a seed group: mean +- sd over its runs
        return (f"{text} +- {fmt(sd)}" if isinstance(sd, (int, float)) else text) + mark
    span = interval(record, key)
    return (f"{text} [{span[0]:.3f}, {span[1]:.3f}]" if span and text != MISSING else text) + mark
