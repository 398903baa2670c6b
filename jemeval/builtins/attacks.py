"""Moved to :mod:`jemeval.builtins.foolbox_attacks` (0.3): this path keeps importing for one release,
with a DeprecationWarning, and gives the new module's names."""
from __future__ import annotations

import importlib
from typing import Any

from jemeval.deprecations import warn_deprecated

NEW = "jemeval.builtins.foolbox_attacks"
warn_deprecated(f"{__name__} is now {NEW}", stacklevel=2)


def __getattr__(name: str) -> Any:
    return getattr(importlib.import_module(NEW), name)
