"""Named component factories: strict about duplicates, helpful about typos.

Like timm's ``register_model``/``list_models`` (glob patterns) but, like torchvision, a name
registered twice is an error naming both plugins: a silently replaced score would change
published numbers. Factories, not instances, are stored so that heavy imports (foolbox, timm)
happen only when a component is actually used.

Names may be written as *specs* on the command line: ``NAME[:ARG][,key=value...]``::

    timm:resnet18            -> name "timm",   variant "resnet18"
    energy:T=2               -> name "energy", options {"T": 2.0}
    wrn:depth=16,widen=4     -> name "wrn",    options {"depth": 16, "widen": 4}
    interp:digits            -> name "interp", variant "digits"
    digits[0-4]              -> name "digits", classes (0, 1, 2, 3, 4)
"""
from __future__ import annotations

import ast
import fnmatch
import inspect
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from jemeval import hookspecs
from jemeval.components import is_detector
from jemeval.errors import DuplicateNameError, UnknownNameError, UsageError, did_you_mean


def _component_hooks() -> dict[str, str]:
    """kind -> hook name: every ``register_<kind>s`` hook that takes ``register`` defines a kind."""
    hooks = {}
    for name, spec in hookspecs.specs().items():
        found = re.fullmatch(r"register_(\w+)s", name)
        if found and "register" in inspect.signature(spec).parameters:
            hooks[found.group(1)] = name
    return hooks


#: kind -> the hook that fills it, and the kinds in the order the hooks are defined (model, dataset,
#: score, metric, attack, checkpoint_layout); both derived from :mod:`jemeval.hookspecs`
HOOKS: dict[str, str] = _component_hooks()
KINDS: tuple[str, ...] = tuple(HOOKS)
_NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.\-]*$")
_NAMES = "letters, digits, '_', '.', '-'"
#: a foreign layout keeps the name its authors' code goes by ('jem++/sada-jem'); nobody types it in a spec
_LAYOUT_NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.+/\-]*$")


def _is_layout(obj: Any) -> bool:
    return callable(getattr(obj, "match", None)) or callable(getattr(obj, "match_path", None))


#: kind -> (what its objects must be, the check); every other kind takes callables
_OBJECTS: dict[str, tuple[str, Callable[[Any], bool]]] = {
    "checkpoint_layout": ("an object with match(obj) or match_path(path) (a jemeval.formats.foreign.CheckpointLayout)",
                          _is_layout),
    "score": ("a function obj(model, x) or a detector with fit(model, dataset, **options) and score(model, x)",
              lambda obj: callable(obj) or is_detector(obj)),
}


def normalize_kind(kind: str) -> str:
    """``"models"`` -> ``"model"``: the Python API takes the plural forms ``jemeval list`` takes
    (and ``checkpoint-layouts`` for ``checkpoint_layouts``)."""
    if isinstance(kind, str):
        text = kind.strip().lower().replace("-", "_")
        if text in KINDS:
            return text
        if text.endswith("s") and text[:-1] in KINDS:
            return text[:-1]
    raise UsageError(f"unknown component kind {kind!r}{did_you_mean(str(kind), KINDS)}; kinds are {', '.join(KINDS)} "
                     "(or their plurals)")


@dataclass(frozen=True)
class Component:
    """One registered component and where it came from."""

    kind: str
    name: str
    obj: Any
    plugin: str
    help: str | None = None


@dataclass
class Spec:
    """A parsed component spec (see the module docstring)."""

    name: str
    variant: str | None = None
    options: dict[str, Any] = field(default_factory=dict)
    classes: tuple[int, ...] | None = None

    def __str__(self) -> str:
        text = self.name
        parts = ([self.variant] if self.variant is not None else []) + [
            f"{k}={v}" for k, v in self.options.items()
        ]
        if parts:
            text += ":" + ",".join(parts)
        if self.classes is not None:
            text += "[" + ",".join(str(c) for c in self.classes) + "]"
        return text


def _literal(value: str) -> Any:
    try:
        return ast.literal_eval(value)
    except (ValueError, SyntaxError):
        lowered = value.lower()
        if lowered in ("true", "false"):
            return lowered == "true"
        if lowered in ("none", "null"):
            return None
        return value


def _parse_classes(text: str, spec: str) -> tuple[int, ...]:
    classes: list[int] = []
    for part in text.split(","):
        part = part.strip()
        try:
            if "-" in part:
                lo, hi = (int(p) for p in part.split("-", 1))
                classes.extend(range(lo, hi + 1))
            elif part:
                classes.append(int(part))
        except ValueError:
            raise UsageError(
                f"bad class list {text!r} in {spec!r}: write classes as e.g. 'digits[0-4]' or 'digits[1,3,5]'"
            ) from None
    if not classes:
        raise UsageError(f"empty class list in {spec!r}: write e.g. 'digits[0-4]'")
    return tuple(sorted(set(classes)))


def parse_spec(spec: str) -> Spec:
    """Parse ``NAME[:ARG][,key=value...][[classes]]`` into a :class:`Spec`."""
    text = spec.strip()
    classes = None
    m = re.match(r"^(.*)\[([^\]]*)\]$", text)
    if m:
        text, classes = m.group(1), _parse_classes(m.group(2), spec)
    name, _, rest = text.partition(":")
    if not name:
        raise UsageError(f"empty name in {spec!r}")
    variant, options = None, {}
    if rest:
        for item in rest.split(","):
            key, eq, value = item.partition("=")
            if eq and re.match(r"^[A-Za-z_][A-Za-z0-9_]*$", key.strip()):
                options[key.strip()] = _literal(value.strip())
            elif variant is None:
                variant = item
            else:  # a variant containing commas (e.g. a path): keep it whole
                variant = variant + "," + item
    return Spec(name=name, variant=variant, options=options, classes=classes)


#: an item of a comma list that is an option (``eps=0.0014``): it continues the spec before it
_OPTION_ITEM = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*=")


def split_specs(value: str | Sequence[str] | None, what: str) -> list[str]:
    """A comma list of specs (``"uniform,digits[0,1]"``; brackets keep their commas) or a sequence
    of them -> a list of specs. A single string is never iterated character by character, so
    ``evaluate_ood(m, "uniform")`` means the set 'uniform', as ``--ood uniform`` does.

    A spec's options are comma-separated too, so an item that is ``key=value`` continues the spec
    before it: ``"odin:T=1000,eps=0.0014,maxprob"`` is ``odin:T=1000,eps=0.0014`` and ``maxprob``
    (before, ``eps=0.0014`` was read as a score of its own); one with no ``NAME:`` before it stays an
    item of its own (and is then an unknown name)."""
    if value is None:
        return []
    if not isinstance(value, str):
        return [str(v).strip() for v in value if str(v).strip()]
    items: list[str] = []
    for item in _split_top_level(value):
        if _OPTION_ITEM.match(item) and items and ":" in items[-1]:
            items[-1] += "," + item
        else:
            items.append(item)
    if not items:
        raise UsageError(f"{what} is empty; give a comma-separated list")
    return items


def _split_top_level(value: str) -> list[str]:
    """The non-empty items of a comma list, brackets keeping their commas."""
    items, depth, cur = [], 0, ""
    for ch in value:
        if ch == "[":
            depth += 1
        elif ch == "]":
            depth -= 1
        if ch == "," and depth == 0:
            items.append(cur.strip())
            cur = ""
        else:
            cur += ch
    items.append(cur.strip())
    return [i for i in items if i]


class Registry:
    """Components by kind and name; filled by the plugin manager from the hooks."""

    def __init__(self) -> None:
        self._entries: dict[str, dict[str, Component]] = {k: {} for k in KINDS}
        #: ``(plugin, error)`` pairs for plugins that failed: named in unknown-name errors so that
        #: a component of a broken plugin fails clearly when it is requested.
        self.failures: list[tuple[str, str]] = []

    def add(self, kind: str, name: str, obj: Any, *, plugin: str, help: str | None = None) -> Component:
        kind = normalize_kind(kind)
        layout = kind == "checkpoint_layout"
        pattern, allowed = (_LAYOUT_NAME_RE, _NAMES + ", '+', '/'") if layout else (_NAME_RE, _NAMES)
        if not isinstance(name, str) or not pattern.match(name):
            raise UsageError(
                f"plugin {plugin!r} registered a {kind} with the invalid name {name!r}: names are "
                f"{allowed}, and start with a letter or digit"
            )
        what, check = _OBJECTS.get(kind, ("a callable", callable))
        if not check(obj):
            raise UsageError(f"plugin {plugin!r} registered {kind} {name!r} as a {type(obj).__name__}, not {what}")
        existing = self._entries[kind].get(name)
        if existing is not None:
            raise DuplicateNameError(
                f"{kind} {name!r} is registered twice: by plugin {existing.plugin!r} and by plugin {plugin!r}"
            )
        component = Component(kind, name, obj, plugin, help or _help_of(obj))
        self._entries[kind][name] = component
        return component

    def component(self, kind: str, name: str) -> Component:
        """The :class:`Component` for ``name``; a clear error with suggestions when unknown."""
        kind = normalize_kind(kind)
        entry = self._entries[kind].get(name)
        if entry is not None:
            return entry
        known = sorted(self._entries[kind])
        message = f"unknown {kind} {name!r}{did_you_mean(name, known)}; known {kind}s: {', '.join(known) or 'none'}"
        if self.failures:
            broken = "; ".join(f"plugin {p!r} failed to load: {e}" for p, e in self.failures)
            message += f" (note: {broken})"
        raise UnknownNameError(message)

    def get(self, kind: str, name: str) -> Any:
        return self.component(kind, name).obj

    def names(self, kind: str, pattern: str | None = None) -> list[str]:
        kind = normalize_kind(kind)
        names = sorted(self._entries[kind])
        if pattern:
            names = [n for n in names if fnmatch.fnmatchcase(n, pattern)]
        return names

    def components(self, kind: str) -> list[Component]:
        kind = normalize_kind(kind)
        return [self._entries[kind][n] for n in self.names(kind)]


def _help_of(obj: Any) -> str | None:
    """An object's ``summary`` (a checkpoint layout's) or the first line of its docstring."""
    summary = getattr(obj, "summary", None)
    return summary if isinstance(summary, str) and summary else _first_line(getattr(obj, "__doc__", None))


def _first_line(doc: str | None) -> str | None:
    if not doc:
        return None
    for line in doc.strip().splitlines():
        if line.strip():
            return line.strip()
    return None


def accepted_options(obj: Callable, *, skip: int = 0) -> list[str] | None:
    """The keyword options ``obj`` accepts after its first ``skip`` parameters; None when it takes
    ``**kwargs`` (or has no readable signature), i.e. when any name would reach it."""
    try:
        params = list(inspect.signature(obj).parameters.values())
    except (TypeError, ValueError):
        return None
    if any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params):
        return None
    named = (inspect.Parameter.KEYWORD_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD)
    return [p.name for p in params[skip:] if p.kind in named]


def option_defaults(obj: Callable, *, skip: int = 0) -> dict[str, Any]:
    """The default of every keyword option ``obj`` takes after its first ``skip`` parameters (those
    without a default left out): what a component ran with where the user set nothing."""
    try:
        params = list(inspect.signature(obj).parameters.values())[skip:]
    except (TypeError, ValueError):
        return {}
    named = (inspect.Parameter.KEYWORD_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD)
    return {p.name: p.default for p in params if p.kind in named and p.default is not inspect.Parameter.empty}


def check_options(obj: Callable, options: dict[str, Any], what: str, *, skip: int = 0) -> None:
    """Raise a one-line UsageError if ``obj`` does not accept the keyword ``options``.

    ``what`` names the component (e.g. "score 'energy'"); ``skip`` is the number of positional
    parameters the caller fills (``model, x`` for a score). Lets ``--score energy:X=3`` fail with
    "score 'energy' has no option 'X' (options: T)" instead of a TypeError from deep inside.
    """
    if not options:
        return
    accepted = accepted_options(obj, skip=skip)
    if accepted is None:
        return
    for key in options:
        if key not in accepted:
            listing = ", ".join(accepted) if accepted else "none"
            raise UsageError(f"{what} has no option {key!r}{did_you_mean(key, accepted)}; its options: {listing}")


def call_with_supported(factory: Callable, *args, context: dict[str, Any] | None = None, **options):
    """Call ``factory(*args, **options)``, adding the ``context`` keywords it accepts.

    Context values (the model's input shape for a synthetic dataset, say) are offered, not forced:
    a factory that does not name them is not bothered. Explicit ``options`` always pass through, so
    a misspelt option still fails loudly.
    """
    if context:
        try:
            params = inspect.signature(factory).parameters
        except (TypeError, ValueError):
            params = {}
        takes_any = any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values())
        for key, value in context.items():
            if key not in options and (takes_any or key in params):
                options[key] = value
    try:
        return factory(*args, **options)
    except TypeError as exc:
        if "unexpected keyword argument" in str(exc):
            raise UsageError(f"{getattr(factory, '__name__', factory)}: {exc}") from None
        raise
