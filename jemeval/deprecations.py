"""Old keyword arguments that keep working for one release, with a DeprecationWarning.

The Python API speaks one vocabulary (``input_sigma`` for noise on evaluation inputs,
``chain_sigma`` for the noise of refinement chains, ``data_root``, ``sgld_step_size``...), and
evaluation functions compute and return data. Calls written for the previous release still run:
:func:`deprecated_keywords` maps a renamed keyword to its new name, and an output keyword (``plot=``,
``save_scores=``) to a writer that the function's :class:`~jemeval.results.Result` is handed to
after it returns, so the function itself never writes a file. A writer is named by its import path
(``"jemeval.plots.ood:plot_ood_result"``), not imported: evaluation does not depend on the
presentation code, which only a call still using an old output keyword loads.
"""
from __future__ import annotations

import functools
import importlib
import inspect
import warnings
from collections.abc import Callable, Mapping
from typing import Any

#: a writer ``writer(result, path)``, or its import path "package.module:function"
Writer = Callable[[Any, Any], Any] | str

#: how long the old forms keep working
REMOVAL = "it will be removed in the next release"


def warn_deprecated(message: str, *, stacklevel: int = 2) -> None:
    """A DeprecationWarning saying ``message`` and when the old form goes away."""
    warnings.warn(f"{message} ({REMOVAL})", DeprecationWarning, stacklevel=stacklevel + 1)


def writer_of(ref: Writer) -> tuple[Callable[[Any, Any], Any], str]:
    """The writer and the name to tell users to call: a callable as it is, a path imported now."""
    if callable(ref):
        return ref, f"{ref.__module__}.{ref.__qualname__}"
    module, _, name = ref.partition(":")
    return getattr(importlib.import_module(module), name), f"{module}.{name}"


def deprecated_keywords(*, renamed: Mapping[str, str] | None = None, outputs: Mapping[str, Writer] | None = None):
    """Decorator: old keyword names and output keywords of ``fn`` still work, each with a warning.

    ``renamed`` maps an old keyword to its new name (giving both is a TypeError, as Python does for
    a keyword given twice). ``outputs`` maps an old keyword such as ``plot`` to ``writer(result,
    value)`` (a callable or its import path), called with the returned result when the keyword is
    given and not None: the writing happens in presentation helpers, not in the computation.
    """
    renamed = dict(renamed or {})
    outputs = dict(outputs or {})

    def decorate(fn):
        name = fn.__name__

        @functools.wraps(fn)
        def wrapper(*args, **kwargs):
            for old, new in renamed.items():
                if old in kwargs:
                    if new in kwargs:
                        raise TypeError(f"{name}() got {old!r} and {new!r}; {old!r} is the old name of {new!r}: "
                                        f"give only {new!r}")
                    warn_deprecated(f"{name}(): the keyword {old!r} is now {new!r}")
                    kwargs[new] = kwargs.pop(old)
            wanted = {key: kwargs.pop(key) for key in outputs if key in kwargs}
            result = fn(*args, **kwargs)
            for key, value in wanted.items():
                if value is not None:
                    writer, where = writer_of(outputs[key])
                    warn_deprecated(f"{name}({key}=...): {name} returns data and writes no files; "
                                    f"call {where}(result, path)")
                    writer(result, value)
            return result

        wrapper.renamed_keywords = dict(renamed)
        wrapper.output_keywords = tuple(outputs)
        return wrapper

    return decorate


def moved_names(old_module: str, new_homes: Mapping[str, str]) -> Callable[[str], Any]:
    """A module ``__getattr__`` for a module whose names moved: ``new_homes`` maps each old name to
    ``"new.module"`` (same name) or ``"new.module:new_name"``. Reading one still works and warns,
    naming the new path (as timm keeps ``timm.models.layers`` importing from ``timm.layers``)."""
    def __getattr__(name: str) -> Any:
        if name not in new_homes:
            raise AttributeError(f"module {old_module!r} has no attribute {name!r}")
        module, _, new_name = new_homes[name].partition(":")
        new_name = new_name or name
        warn_deprecated(f"{old_module}.{name} moved to {module}.{new_name}")
        return getattr(importlib.import_module(module), new_name)

    return __getattr__


_MISSING = object()


def moved_module(old_module: str, new_module: str) -> Callable[[str], Any]:
    """The module ``__getattr__`` of an alias module kept at a moved module's old path: the public names
    of ``new_module`` (its ``__all__``, what it defines, its constants; not what it merely imports)
    still read from ``old_module``, each with a warning naming the new path. Any other name is an
    AttributeError, as for any module."""
    def __getattr__(name: str) -> Any:
        module = importlib.import_module(new_module)
        value = getattr(module, name, _MISSING) if not name.startswith("_") else _MISSING
        home = getattr(value, "__module__", new_module) if callable(value) else new_module
        imported = inspect.ismodule(value) or home != new_module
        if value is _MISSING or (imported and name not in getattr(module, "__all__", ())):
            raise AttributeError(f"module {old_module!r} has no attribute {name!r}")
        warn_deprecated(f"{old_module} moved to {new_module}: import {name} from there")
        return value

    return __getattr__
