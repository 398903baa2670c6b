"""The plugin hooks: the only way components enter jemeval.

Each hook receives a ``register`` callable, ``register(name, obj, *, help=None)``. Built-in
components use exactly the same hooks (see :mod:`jemeval.builtins`), so a third-party plugin can do
everything a built-in can. pluggy lets an implementation accept a subset of a hook's arguments,
so hooks may gain arguments later without breaking plugins; they will never lose one.
"""
from __future__ import annotations

import pluggy

PROJECT_NAME = "jemeval"

hookspec = pluggy.HookspecMarker(PROJECT_NAME)
hookimpl = pluggy.HookimplMarker(PROJECT_NAME)


@hookspec
def register_models(register):
    """Register model factories: ``obj(num_classes, input_shape, **options) -> nn.Module`` giving logits."""


@hookspec
def register_datasets(register):
    """Register dataset factories: ``obj(split, root, download, **options) -> Dataset`` of (x in [-1, 1], y)."""


@hookspec
def register_scores(register):
    """Register OOD scores: ``obj(model, x, **options) -> Tensor[N]``, higher = more in-distribution."""


@hookspec
def register_metrics(register):
    """Register metrics: callables marked with :func:`jemeval.ood_metric` or :func:`jemeval.calibration_metric`."""


@hookspec
def register_attacks(register):
    """Register attack factories: ``obj(norm, **options) -> attack(model, x, y, epsilons) -> Tensor[E, N, ...]``."""
