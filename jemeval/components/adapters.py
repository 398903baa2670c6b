"""0.2's duck-typed plugin components adapted into the bases, for one release.

A detector that subclasses nothing (``fit`` and ``score``, optional ``fit_features``,
``state_dict``, ``grid``, ...) and an attack callable with optional attributes (``norms``,
``gradient_free``, ``minimize``, ...) still work: :func:`new_detector` and :func:`as_attack` wrap
them, at their first use, in an adapter that *is* a :class:`~jemeval.components.detector.Detector`
or :class:`~jemeval.components.attack.Attack`, so the evaluation only ever reads declared attributes.
This module is the one place that looks for the optional attributes of 0.2's contracts. Each plugin
object warns once per process (a DeprecationWarning naming the base class to subclass).
"""
from __future__ import annotations

import copy
from collections.abc import Hashable
from typing import Any

from jemeval.components import NORMS
from jemeval.components.attack import Attack
from jemeval.components.detector import Detector
from jemeval.deprecations import warn_deprecated
from jemeval.errors import UsageError

#: the plugin objects (their qualified names) already warned about in this process
_WARNED: set[Hashable] = set()


def _origin(obj: Any) -> str:
    """``module.qualname`` of a function or class, else of the object's class."""
    target = obj if hasattr(obj, "__qualname__") else type(obj)
    return f"{getattr(target, '__module__', '?')}.{target.__qualname__}"


def warn_once(obj: Any, kind: str, base: str) -> None:
    """One DeprecationWarning per plugin object and process: ``obj`` does not subclass ``base``."""
    origin = _origin(obj)
    if origin in _WARNED:
        return
    _WARNED.add(origin)
    warn_deprecated(f"{kind} {origin} does not subclass {base}: duck-typed {kind}s are adapted for one more "
                    f"release; subclass {base} (docs/plugins.md)", stacklevel=4)


class PluginDetector(Detector):
    """A duck-typed detector behind the :class:`Detector` interface: its own methods (and so their
    signatures, which the options are checked against), its optional attributes read once."""

    needs_fit = False  # 0.2 detectors keep their own checks

    def __init__(self, obj: Any) -> None:
        self.wrapped = obj
        self.name = type(obj).__name__
        self.needs_labels = bool(getattr(obj, "needs_labels", False))
        self.assumes_nonnegative_features = bool(getattr(obj, "assumes_nonnegative_features", False))
        self.grid = {k: list(v) for k, v in (getattr(obj, "grid", None) or {}).items()}
        self.uses_features = _callable(obj, "fit_features") and _callable(obj, "score_features")
        self.cacheable = _callable(obj, "state_dict") and _callable(obj, "load_state_dict")
        self.fit, self.score = obj.fit, obj.score
        if self.uses_features:
            self.fit_features, self.score_features = obj.fit_features, obj.score_features
        if self.cacheable:
            self.state_dict, self.load_state_dict = obj.state_dict, obj.load_state_dict


def _callable(obj: Any, name: str) -> bool:
    return callable(getattr(obj, name, None))


def new_detector(obj: Any) -> Detector:
    """This use's own detector: a registered class instantiated, a registered object copied, and a
    duck-typed one adapted (with its warning)."""
    detector = obj() if isinstance(obj, type) else copy.deepcopy(obj)
    if isinstance(detector, Detector):
        return detector
    warn_once(obj, "detector", "jemeval.Detector")
    return PluginDetector(detector)


class PluginAttack(Attack):
    """A duck-typed attack callable behind the :class:`Attack` interface. Its optional attributes are
    read at each use (an attack may set ``last_without_start`` after a call, ``settings`` later)."""

    def __init__(self, attack: Any, norm: str, name: str | None = None) -> None:
        self.wrapped = attack
        self.norm = norm
        self.name = str(name or getattr(attack, "name", None) or getattr(attack, "__name__", None)
                        or type(attack).__name__)

    norms = property(lambda self: tuple(getattr(self.wrapped, "norms", NORMS)))
    gradient_free = property(lambda self: bool(getattr(self.wrapped, "gradient_free", False)))
    minimization = property(lambda self: bool(getattr(self.wrapped, "minimization", False))
                            and _callable(self.wrapped, "minimize"))
    supports_eot = property(lambda self: bool(getattr(self.wrapped, "supports_eot", False)))
    own_eot_samples = property(lambda self: getattr(self.wrapped, "own_eot_samples", None))
    last_without_start = property(lambda self: int(getattr(self.wrapped, "last_without_start", 0) or 0))
    settings = property(lambda self: dict(getattr(self.wrapped, "settings", {}) or {}))

    def forward(self, model, x, y, epsilons, eot_samples=None):
        if eot_samples is None:
            return self.wrapped(model, x, y, epsilons)
        return self.wrapped(model, x, y, epsilons, eot_samples=eot_samples)

    def forward_minimal(self, model, x, y):
        return self.wrapped.minimize(model, x, y)


def as_attack(attack: Any, norm: str, name: str | None = None) -> Attack:
    """``attack`` as an :class:`Attack`: itself, or a duck-typed callable adapted (with its warning)."""
    if isinstance(attack, Attack):
        return attack
    if not callable(attack):
        raise UsageError(f"attack {name or type(attack).__name__!r} is a {type(attack).__name__}, not an attack: "
                         "its factory must return a jemeval.Attack (or a callable attack(model, x, y, epsilons))")
    warn_once(attack, "attack", "jemeval.Attack")
    return PluginAttack(attack, norm, name)
