"""Old keyword arguments that keep working for one release, with a DeprecationWarning.

The Python API speaks one vocabulary (``input_sigma`` for noise on evaluation inputs,
``chain_sigma`` for the noise of refinement chains, ``data_root``, ``sgld_step_size``...), and
evaluation functions compute and return data. Calls written for the previous release still run:
:func:`deprecated_keywords` maps a renamed keyword to its new name, and an output keyword (``plot=``,
``save_scores=``) to a writer that the function's :class:`~jemeval.results.Result` is handed to
after it returns, so the function itself never writes a file.
"""
from __future__ import annotations

import functools
import warnings
from collections.abc import Callable, Mapping
from typing import Any

#: how long the old forms keep working
REMOVAL = "it will be removed in the next release"


def warn_deprecated(message: str, *, stacklevel: int = 2) -> None:
    """A DeprecationWarning saying ``message`` and when the old form goes away."""
    warnings.warn(f"{message} ({REMOVAL})", DeprecationWarning, stacklevel=stacklevel + 1)


def deprecated_keywords(*, renamed: Mapping[str, str] | None = None,
                        outputs: Mapping[str, Callable[[Any, Any], Any]] | None = None):
    """Decorator: old keyword names and output keywords of ``fn`` still work, each with a warning.

    ``renamed`` maps an old keyword to its new name (giving both is a TypeError, as Python does for
    a keyword given twice). ``outputs`` maps an old keyword such as ``plot`` to ``writer(result,
    value)``, called with the returned result when the keyword is given and not None: the
    writing happens in the caller's presentation helpers, not in the computation.
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
                    warn_deprecated(f"{name}({key}=...): {name} returns data and writes no files; "
                                    f"call {outputs[key].__module__}.{outputs[key].__name__}(result, path)")
                    outputs[key](result, value)
            return result

        wrapper.renamed_keywords = dict(renamed)
        wrapper.output_keywords = tuple(outputs)
        return wrapper

    return decorate
