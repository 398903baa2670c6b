"""Built-in metrics (OOD: AUROC, AUPR-In, AUPR-Out, FPR95; calibration: see jemeval.evaluation).

The opt-in calibration metrics (adaptive-ece, classwise-ece, debiased-l2) are registered too, so
``--metric`` and ``jemeval list metrics`` reach them; only ``BUILTIN_METRICS`` are reported by default.
"""
from __future__ import annotations

from jemeval.hookspecs import hookimpl


@hookimpl
def register_metrics(register):
    from jemeval.evaluation import metrics as metric_functions

    for name, fn in {**metric_functions.BUILTIN_METRICS, **metric_functions.OPT_IN_METRICS}.items():
        register(name, fn)
