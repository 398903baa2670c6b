"""The score protocol: ``score(model, x, **options) -> Tensor[N]``, higher = more in-distribution.

A plain function is a score; what else jemeval may do with it is declared, not probed:

* ``from_logits(logits, **options)``: the score from the batch's logits alone, so the evaluation's
  one forward pass per batch serves it (``logpx``, ``energy``, ...);
* ``from_features(model, features, logits, **options)``: likewise from the penultimate features
  and logits (``ash``, ``gradnorm-huang``);
* ``from_input_grad(grad, logits, **options)``: the score from the input gradient of log p~(x)
  (d logsumexp f(x) / dx, per example) and the logits (``gradnorm``): when a batch needs it, the
  evaluation's one forward pass runs with grad and one backward gives it, so the logits, features
  and this gradient all come from the same pass;
* ``grid``: option -> candidates, searched by ``tune_on``;
* ``assumes_nonnegative_features``: the score presumes ReLU features (a note says when the
  model's are not);
* ``ranges``: option -> :class:`jemeval.components.options.Range`, the values it takes (``energy``'s
  T > 0): a value outside is refused in one line before any work (optional: a score that declares
  none has its options checked only by name).

The :func:`score` decorator declares them on a function (a :class:`ScoreFunction` keeps the
function's name, docstring and signature, so its options are checked against it)::

    @jemeval.score(from_logits=lambda logits: logits.amax(dim=1))
    def maxlogit(model, x):
        ...

An undecorated function stays registrable: :func:`as_score` gives it the defaults (and reads the
attributes 0.2 plugins set on the function object, once, here).
"""
from __future__ import annotations

import functools
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Protocol, runtime_checkable


@runtime_checkable
class Score(Protocol):
    """What the evaluation reads of a score (see the module docstring)."""

    from_logits: Callable[..., Any] | None
    from_features: Callable[..., Any] | None
    from_input_grad: Callable[..., Any] | None
    grid: Mapping[str, Sequence[Any]]
    assumes_nonnegative_features: bool

    def __call__(self, model: Any, x: Any, **options: Any) -> Any:
        """Tensor[N] for the batch ``x``, higher = more in-distribution."""


class ScoreFunction:
    """A score function with its capabilities declared (what :func:`score` makes)."""

    def __init__(self, fn: Callable[..., Any], *, from_logits: Callable[..., Any] | None = None,
                 from_features: Callable[..., Any] | None = None, from_input_grad: Callable[..., Any] | None = None,
                 grid: Mapping[str, Sequence[Any]] | None = None, assumes_nonnegative_features: bool = False,
                 ranges: Mapping[str, Any] | None = None) -> None:
        functools.update_wrapper(self, fn)  # name, docstring, module; signature through __wrapped__
        self.fn = fn
        self.from_logits = from_logits
        self.from_features = from_features
        self.from_input_grad = from_input_grad
        self.grid = {k: list(v) for k, v in (grid or {}).items()}
        self.assumes_nonnegative_features = bool(assumes_nonnegative_features)
        self.ranges = dict(ranges or {})

    def __call__(self, model: Any, x: Any, **options: Any) -> Any:
        if options and self.ranges:  # called directly (the evaluation checked them when it parsed the spec)
            from jemeval.components.options import check_option_values
            from jemeval.registry import option_defaults

            check_option_values(self, options, self.__name__.replace("_", "-"),
                                defaults=option_defaults(self.fn, skip=2))
        return self.fn(model, x, **options)

    def __repr__(self) -> str:
        return f"<score {getattr(self, '__qualname__', self.fn)!s}>"


def score(fn: Callable[..., Any] | None = None, *, from_logits: Callable[..., Any] | None = None,
          from_features: Callable[..., Any] | None = None, from_input_grad: Callable[..., Any] | None = None,
          grid: Mapping[str, Sequence[Any]] | None = None, assumes_nonnegative_features: bool = False,
          ranges: Mapping[str, Any] | None = None):
    """Decorator: ``fn(model, x, **options)`` as a :class:`Score` with the given capabilities
    (``@score`` alone declares none); ``ranges`` declares the values each option takes
    (:mod:`jemeval.components.options`)."""
    def decorate(f: Callable[..., Any]) -> ScoreFunction:
        return ScoreFunction(f, from_logits=from_logits, from_features=from_features,
                             from_input_grad=from_input_grad, grid=grid,
                             assumes_nonnegative_features=assumes_nonnegative_features, ranges=ranges)

    return decorate if fn is None else decorate(fn)


def as_score(obj: Callable[..., Any]) -> Score:
    """A registered score as a :class:`Score`: itself when it declares every attribute, else a
    :class:`ScoreFunction` with what the function object carries (0.2's attributes) or the defaults."""
    if isinstance(obj, Score):
        return obj
    return ScoreFunction(obj, from_logits=getattr(obj, "from_logits", None),
                         from_features=getattr(obj, "from_features", None),
                         from_input_grad=getattr(obj, "from_input_grad", None), grid=getattr(obj, "grid", None),
                         assumes_nonnegative_features=bool(getattr(obj, "assumes_nonnegative_features", False)),
                         ranges=getattr(obj, "ranges", None))
