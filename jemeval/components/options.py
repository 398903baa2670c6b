"""The values a score's or detector's options may take, declared once and checked in one place.

A component declares a :class:`Range` per option beside the option itself (``ranges=`` of the
:func:`jemeval.score` decorator, the ``ranges`` class attribute of a :class:`jemeval.Detector`, the
``ranges`` of a pytorch-ood adapter's spec; ``relations`` between two options likewise);
:func:`check_option_values` refuses a value outside it in
one line. The score parser (:func:`jemeval.evaluation.batching.resolve_score`, which ``jemeval ood``,
``evaluate_ood`` and ``jemeval.testing`` share) calls it before any work starts, and the component bases
call it again when a score or detector is used directly from Python.

Why: an option out of range used to run. ``gen:gamma=-1``, ``openmax:tailsize=0`` or ``pnml:eps=-1`` gave
AUROCs that looked like any other, and ``gen:M=0`` made NaN scores that were blamed on the checkpoint.
Only what a value can be known to be wrong for without the data is checked here (``knn``'s ``k`` against
the number of fit images is the detector's fit minimum, :class:`jemeval.components.detector.FitMinimum`).
"""
from __future__ import annotations

import math
import numbers
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from jemeval.errors import UsageError, did_you_mean


@dataclass(frozen=True)
class Range:
    """The values one option takes: a number between bounds, a whole number, one of some choices, a flag,
    or a custom test (``accepts`` with its ``description``). ``none``: None is allowed too (a default
    computed from the data). ``label`` names the option in messages ("the temperature T")."""

    kind: str
    gt: float | None = None
    ge: float | None = None
    lt: float | None = None
    le: float | None = None
    choices: tuple[Any, ...] = ()
    none: bool = False
    label: str | None = None
    accepts: Callable[[Any], bool] | None = None
    description: str | None = None

    def contains(self, value: Any) -> bool:
        if value is None:
            return self.none
        if self.kind == "flag":
            return isinstance(value, bool)
        if self.kind == "choice":
            return value in self.choices
        if self.kind == "custom":
            return bool(self.accepts(value))
        number = _number(value)
        if number is None or (self.kind == "whole" and not float(number).is_integer()):
            return False
        return ((self.gt is None or number > self.gt) and (self.ge is None or number >= self.ge)
                and (self.lt is None or number < self.lt) and (self.le is None or number <= self.le))

    def describe(self) -> str:
        """What the value must be, as a message says it ("a finite number > 0", "a fraction in [0, 1)")."""
        text = {"flag": "True or False", "choice": "one of " + ", ".join(map(str, self.choices)),
                "custom": self.description or "a valid value"}.get(self.kind) or self._bounds()
        return text + (" or None" if self.none else "")

    def _bounds(self) -> str:
        noun = {"whole": "a whole number", "fraction": "a fraction", "number": "a finite number"}[self.kind]
        low = (f"({_g(self.gt)}" if self.gt is not None else f"[{_g(self.ge)}" if self.ge is not None else None)
        high = (f"{_g(self.lt)})" if self.lt is not None else f"{_g(self.le)}]" if self.le is not None else None)
        if low and high:
            return f"{noun} in {low}, {high}"
        if low:
            return f"{noun} {'>' if low[0] == '(' else '>='} {low[1:]}"
        if high:
            return f"{noun} {'<' if high[-1] == ')' else '<='} {high[:-1]}"
        return noun


def number(*, gt: float | None = None, ge: float | None = None, lt: float | None = None, le: float | None = None,
           none: bool = False, label: str | None = None) -> Range:
    """A finite number within the given bounds (gt: >, ge: >=, lt: <, le: <=)."""
    return Range("number", gt=gt, ge=ge, lt=lt, le=le, none=none, label=label)


def fraction(*, gt: float | None = None, lt: float | None = None, label: str | None = None) -> Range:
    """A fraction: [0, 1] by default, an open end where ``gt=0`` or ``lt=1`` (percentiles are fractions,
    as in pytorch-ood; a value in (1, 100] gets the hint to divide by 100)."""
    return Range("fraction", gt=gt, ge=None if gt is not None else 0.0, lt=lt, le=None if lt is not None else 1.0,
                 label=label)


def whole(*, ge: int = 1, le: int | None = None, none: bool = False, label: str | None = None) -> Range:
    """A whole number >= ``ge`` (and <= ``le``); ``3.0`` counts as 3."""
    return Range("whole", ge=ge, le=le, none=none, label=label)


def choice(*values: Any, label: str | None = None) -> Range:
    return Range("choice", choices=tuple(values), label=label)


def flag(label: str | None = None) -> Range:
    return Range("flag", label=label)


def custom(accepts: Callable[[Any], bool], description: str, *, none: bool = False,
           label: str | None = None) -> Range:
    """A value ``accepts(value)`` is true for, described as ``description`` in messages."""
    return Range("custom", accepts=accepts, description=description, none=none, label=label)


@dataclass(frozen=True)
class Below:
    """A relation between two options: ``first`` strictly below ``second`` (VRA's lower percentile below
    its upper one: equal ones clip every activation to one value, and every input gets one score)."""

    first: str
    second: str

    def holds(self, values: Mapping[str, Any]) -> bool:
        a, b = _number(values.get(self.first)), _number(values.get(self.second))
        return a is None or b is None or a < b


def declared_ranges(component: Any) -> Mapping[str, Range]:
    """The ranges a score or detector declares ({} when it declares none: a plugin's options are its own)."""
    ranges = getattr(component, "ranges", None)
    return ranges if isinstance(ranges, Mapping) else {}


def check_option_values(component: Any, options: Mapping[str, Any], name: str, *,
                        defaults: Mapping[str, Any] | None = None) -> None:
    """Refuse, in one line, an option of ``component`` outside its declared :class:`Range`, or two
    options against a declared relation (the component's ``relations``: :class:`Below`).

    ``name`` is the score's registered name; ``defaults`` give the message's example (the component's
    default for that option, e.g. ``gen:gamma=0.1``).
    """
    ranges, what = declared_ranges(component), f"score {name!r}"
    _check_each(ranges, options, what, name, defaults or {})
    values = {**(defaults or {}), **options}
    for relation in getattr(component, "relations", None) or ():
        if (relation.first in options or relation.second in options) and not relation.holds(values):
            raise UsageError(f"{what}: {relation.first} ({_g(values[relation.first])}) must be below "
                             f"{relation.second} ({_g(values[relation.second])})")


def _check_each(ranges: Mapping[str, Range], options: Mapping[str, Any], what: str, name: str,
                defaults: Mapping[str, Any]) -> None:
    for key, value in options.items():
        allowed = ranges.get(key)
        if allowed is None or allowed.contains(value):
            continue
        if allowed.kind == "choice":
            close = did_you_mean(str(value), [str(c) for c in allowed.choices])
            raise UsageError(f"{what}: unknown {allowed.label or key} {value!r}{close}; choose "
                             f"{', '.join(map(str, allowed.choices))}")
        default = defaults.get(key)
        example = f" (e.g. {name}:{key}={_g(default)})" if default is not None else ""
        hint = ""
        number_value = _number(value)
        if allowed.kind == "fraction" and number_value is not None and 1.0 < number_value <= 100.0:
            hint = f"; use {number_value / 100:g} for {number_value:g}%"
        raise UsageError(f"{what}: {allowed.label or key} must be {allowed.describe()}{example}, got {value!r}{hint}")


def _number(value: Any) -> float | None:
    """``value`` as a finite float, or None (a bool, a string, NaN and inf are no numbers here)."""
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        return None
    value = float(value)
    return value if math.isfinite(value) else None


def _g(value: Any) -> str:
    return f"{value:g}" if isinstance(value, float) else str(value)
