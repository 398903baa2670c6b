"""Built-in metrics (OOD: AUROC, AUPR-In, AUPR-Out, FPR95; calibration: see jemeval.evaluation)."""
from __future__ import annotations

from ..hookspecs import hookimpl


@hookimpl
def register_metrics(register):
    from ..evaluation import metric_functions

    for name, fn in metric_functions.BUILTIN_METRICS.items():
        register(name, fn)
