"""jemeval: train and evaluate Joint Energy-based Models (JEM) and compare them with classifiers.

Public API (README.md, Conventions)::

    import jemeval
    model = jemeval.load_model("runs/digits/best.pt")      # an EnergyModel
    ds = jemeval.load_dataset("digits", split="test")
    jemeval.names("score")                                 # ['energy', 'gradnorm', ...]
    score = jemeval.get("score", "logpx")

Plugins implement hooks marked with :data:`jemeval.hookimpl` (see docs/plugins.md) and subclass the
component bases :class:`jemeval.Detector` and :class:`jemeval.Attack` (a score is a function, the
:class:`jemeval.Score` protocol, declared with :func:`jemeval.score`).
"""
from __future__ import annotations

__version__ = "0.3.0"

from jemeval.components import calibration_metric, ood_metric, pixel_to_model_scale  # noqa: E402
from jemeval.hookspecs import hookimpl  # noqa: E402

__all__ = [
    "__version__", "hookimpl", "ood_metric", "calibration_metric", "pixel_to_model_scale",
    "EnergyModel", "SGLD", "ReplayBuffer", "load_model", "load_dataset", "create_model",
    "get", "names", "save_checkpoint", "Detector", "Attack", "Score", "score", "RunContext", "CachePolicy",
    "train", "evaluate_ood", "calibrate", "evaluate", "robust", "sample", "fidelity", "report",
]

_LAZY = {
    "EnergyModel": ("jemeval.energy.model", "EnergyModel"),
    "SGLD": ("jemeval.sampling.sgld", "SGLD"),
    "ReplayBuffer": ("jemeval.sampling.buffer", "ReplayBuffer"),
    "load_model": ("jemeval.formats.load", "load_model"),
    "save_checkpoint": ("jemeval.formats.native", "save_checkpoint"),
    "load_dataset": ("jemeval.data", "load_dataset"),
    "create_model": ("jemeval.energy.factory", "create_model"),
    "get": ("jemeval.plugins", "get"),
    "names": ("jemeval.plugins", "names"),
    # the component bases (jemeval.components): subclass them in a plugin
    "Detector": ("jemeval.components.detector", "Detector"),
    "Attack": ("jemeval.components.attack", "Attack"),
    "Score": ("jemeval.components.score", "Score"),
    "score": ("jemeval.components.score", "score"),
    # the run's context every entry point takes (seed, device, batch size, progress, data, cache policy)
    "RunContext": ("jemeval.context", "RunContext"),
    "CachePolicy": ("jemeval.context", "CachePolicy"),
    # capability entry points, one per command (see each module for details)
    "train": ("jemeval.training", "train"),
    "evaluate_ood": ("jemeval.evaluation.ood.evaluate", "evaluate_ood"),
    "calibrate": ("jemeval.evaluation.calibration", "calibrate"),
    "evaluate": ("jemeval.evaluation.accuracy", "evaluate"),
    "robust": ("jemeval.evaluation.robust.evaluate", "robust"),
    "sample": ("jemeval.evaluation.generation", "sample"),
    "fidelity": ("jemeval.evaluation.fidelity.evaluate", "fidelity"),
    "report": ("jemeval.reports.build", "report"),
}


def __getattr__(name):  # lazy: `import jemeval` stays cheap and never loads plugins
    if name in _LAZY:
        import importlib

        module, attr = _LAZY[name]
        value = getattr(importlib.import_module(module), attr)
        globals()[name] = value
        return value
    raise AttributeError(f"module 'jemeval' has no attribute {name!r}")
