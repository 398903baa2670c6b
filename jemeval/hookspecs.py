"""The plugin hooks: the only way components and commands enter jemeval.

Every ``register_<kind>s(register)`` hook defines a kind of component (``register_models`` ->
``model``; :data:`jemeval.registry.KINDS` is derived from this module, never written out) and
receives ``register(name, obj, *, help=None)``. ``register_commands(cli)`` receives a click group
to add commands to. Built-ins use exactly the same hooks (:data:`jemeval.plugins.DEFAULT_PLUGINS`),
so a third-party plugin can do everything a built-in can.

jemeval calls each implementation with the arguments it names (as pluggy does), so a hook may gain
arguments later without breaking the plugins written before; a hook never loses one. Every hook
here is documented, with its signature, in docs/plugins.md (a test checks both ways).
"""
from __future__ import annotations

import inspect
from collections.abc import Callable

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


@hookspec
def register_checkpoint_layouts(register):
    """Register foreign checkpoint layouts: :class:`jemeval.formats.foreign.CheckpointLayout` objects whose
    ``match(obj)`` (a file's contents) or ``match_path(path)`` (files torch cannot read) recognises a checkpoint."""


@hookspec
def register_loggers(register):
    """Register training loggers: ``obj(log_dir, config, **options)`` returning an object with ``log_scalars(values,
    step)``, ``log_image(tag, image, step)`` and ``close()`` (:class:`jemeval.components.TrainingLogger`)."""


@hookspec
def register_commands(cli):
    """Add click commands to the ``jemeval`` group: ``@cli.command()``, ``cli.add_command(cmd)`` or
    ``cli.add_lazy_command(name, "module:attr")`` (imported only when listed or run)."""


def specs() -> dict[str, Callable]:
    """Every hook of this module, by name, in the order they are defined."""
    return {name: fn for name, fn in globals().items()
            if inspect.isfunction(fn) and hasattr(fn, f"{PROJECT_NAME}_spec")}


def signature(name: str) -> str:
    """``"register_models(register)"``: how docs/plugins.md writes a hook."""
    return f"{name}({', '.join(inspect.signature(specs()[name]).parameters)})"
