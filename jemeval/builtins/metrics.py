"""Built-in metrics (OOD: AUROC, AUPR-In, AUPR-Out, FPR95; calibration: see jemeval.evaluation)."""
from __future__ import annotations

from jemeval.hookspecs import hookimpl


@hookimpl
def register_metrics(register):
    from jemeval.evaluation import metrics as metric_functions

    for name, fn in metric_functions.BUILTIN_METRICS.items():
        register(name, fn)
