"""The plugin manager: built-in and third-party plugins, loaded softly and listed honestly.

* Built-ins are ordinary plugins (``DEFAULT_PLUGINS``), registered through the same hooks.
* Third-party plugins come from the entry-point group ``jemeval``. Set
  ``JEMEVAL_DISABLE_PLUGIN_AUTOLOAD=1`` to skip them (built-ins still load), like pytest's
  ``PYTEST_DISABLE_PLUGIN_AUTOLOAD``.
* Plugins are loaded lazily, on the first request for a component, never at import time, so a
  broken plugin cannot break ``jemeval --help``. A plugin that fails to import or whose hook raises
  is reported once on stderr, shown with its error by ``jemeval plugins``, and named in the error
  raised when one of its components is asked for. The other plugins keep working.
* Each hook implementation is called on its own with a ``register`` callback bound to its plugin,
  so every component is stamped with the plugin that supplied it.
"""
from __future__ import annotations

import importlib
import os
import sys
import threading
from dataclasses import dataclass, field
from importlib import metadata
from typing import Any

import pluggy

from jemeval import hookspecs
from jemeval.errors import JemevalError, PluginError
from jemeval.registry import HOOKS, KINDS, Registry

ENTRY_POINT_GROUP = "jemeval"
DISABLE_AUTOLOAD_ENV = "JEMEVAL_DISABLE_PLUGIN_AUTOLOAD"
DEFAULT_PLUGINS = (
    "jemeval.builtins.models",
    "jemeval.builtins.datasets",
    "jemeval.builtins.scores",
    "jemeval.builtins.metrics",
    "jemeval.builtins.attacks",
)


@dataclass
class PluginInfo:
    """What ``jemeval plugins`` shows for one plugin."""

    name: str
    version: str | None
    builtin: bool
    distribution: str | None = None
    hooks: list[str] = field(default_factory=list)
    registered: dict[str, list[str]] = field(default_factory=dict)
    errors: list[str] = field(default_factory=list)  # load-time errors (import, invalid hooks)
    hook_errors: list[str] = field(default_factory=list)  # errors from the last registry build

    def as_dict(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "version": self.version,
            "builtin": self.builtin,
            "distribution": self.distribution,
            "hooks": sorted(self.hooks),
            "registered": {k: sorted(v) for k, v in self.registered.items() if v},
            "error": "; ".join(self.errors + self.hook_errors) or None,
        }


class PluginManager:
    """Owns the pluggy manager, the plugin records and the registry built from them."""

    def __init__(self, *, autoload: bool | None = None) -> None:
        if autoload is None:
            autoload = os.environ.get(DISABLE_AUTOLOAD_ENV, "").strip().lower() not in ("1", "true", "yes")
        self.autoload = autoload
        self.pm = pluggy.PluginManager(hookspecs.PROJECT_NAME)
        self.pm.add_hookspecs(hookspecs)
        self.infos: dict[str, PluginInfo] = {}
        self._registry: Registry | None = None
        self._warned: set[str] = set()
        self._lock = threading.RLock()
        from jemeval import __version__

        for module_name in DEFAULT_PLUGINS:
            module = importlib.import_module(module_name)
            self._add(module, module_name, PluginInfo(module_name, __version__, builtin=True, distribution="jemeval"))
        if autoload:
            self._load_entry_points()

    # -- loading -------------------------------------------------------------------------------
    def _add(self, plugin: object, name: str, info: PluginInfo) -> None:
        try:
            self.pm.register(plugin, name=name)
            self.pm.check_pending()
        except pluggy.PluginValidationError as exc:
            if self.pm.is_registered(plugin):
                self.pm.unregister(plugin)
            info.errors.append(f"invalid hook: {exc}")
            self._warn(name, info.errors[-1])
        except ValueError as exc:  # name already registered
            info.errors.append(str(exc))
            self._warn(name, str(exc))
        self.infos[name] = info

    def _load_entry_points(self) -> None:
        for ep in sorted(metadata.entry_points(group=ENTRY_POINT_GROUP), key=lambda e: e.name):
            dist = getattr(ep, "dist", None)
            info = PluginInfo(
                ep.name,
                getattr(dist, "version", None),
                builtin=False,
                distribution=getattr(dist, "name", None),
            )
            if ep.name in self.infos:
                continue  # the same distribution seen twice on sys.path
            try:
                plugin = ep.load()
            except Exception as exc:  # a broken plugin must not break the others
                info.errors.append(f"import failed: {type(exc).__name__}: {exc}")
                self._warn(ep.name, info.errors[-1])
                self.infos[ep.name] = info
                continue
            self._add(plugin, ep.name, info)

    def _warn(self, name: str, message: str) -> None:
        key = f"{name}:{message}"
        if key not in self._warned:
            self._warned.add(key)
            print(f"jemeval: warning: plugin {name!r}: {message}", file=sys.stderr)

    # -- registering test plugins --------------------------------------------------------------
    def register(self, plugin: object, name: str | None = None, version: str | None = None) -> str:
        """Register a plugin object (a module or any object with hookimpls) and rebuild the registry."""
        with self._lock:
            name = name or getattr(plugin, "__name__", None) or f"plugin-{id(plugin)}"
            if name in self.infos:
                raise PluginError(f"a plugin named {name!r} is already registered")
            if self.pm.is_registered(plugin):
                raise PluginError(
                    f"this plugin object is already registered as {self.pm.get_name(plugin)!r} (installed?); "
                    "use its components by name, or uninstall it to test the module directly"
                )
            info = PluginInfo(name, version or getattr(plugin, "__version__", None), builtin=False)
            self._add(plugin, name, info)
            self._registry = None
            return name

    def unregister(self, name: str) -> None:
        with self._lock:
            plugin = self.pm.get_plugin(name)
            if plugin is not None:
                self.pm.unregister(plugin)
            self.infos.pop(name, None)
            self._registry = None

    # -- the registry --------------------------------------------------------------------------
    @property
    def registry(self) -> Registry:
        with self._lock:
            if self._registry is None:
                self._registry = self._build_registry()
            return self._registry

    def _build_registry(self) -> Registry:
        registry = Registry()
        for info in self.infos.values():
            info.hooks, info.registered, info.hook_errors = [], {k: [] for k in KINDS}, []
        for kind in KINDS:
            hook_name = HOOKS[kind]
            caller = getattr(self.pm.hook, hook_name)
            # registration order: built-ins first, so a later plugin's duplicate is the one blamed
            for impl in caller.get_hookimpls():
                info = self.infos.get(impl.plugin_name)
                if info is None:
                    continue
                if hook_name not in info.hooks:
                    info.hooks.append(hook_name)

                def register(name, obj, *, help=None, _kind=kind, _plugin=impl.plugin_name, _info=info):
                    registry.add(_kind, name, obj, plugin=_plugin, help=help)
                    _info.registered[_kind].append(name)

                try:
                    impl.function(register)
                except JemevalError as exc:
                    self._record_failure(registry, info, f"{hook_name}: {exc}")
                except Exception as exc:
                    self._record_failure(registry, info, f"{hook_name} raised {type(exc).__name__}: {exc}")
        for info in self.infos.values():
            registry.failures.extend((info.name, error) for error in info.errors + info.hook_errors)
        return registry

    def _record_failure(self, registry: Registry, info: PluginInfo, message: str) -> None:
        info.hook_errors.append(message)
        self._warn(info.name, message)

    def plugin_infos(self) -> list[PluginInfo]:
        self.registry  # make sure hooks ran, so `registered` is filled
        return sorted(self.infos.values(), key=lambda i: (not i.builtin, i.name))

    def versions(self) -> dict[str, str | None]:
        """Plugin name -> version, for provenance."""
        return {i.name: i.version for i in self.plugin_infos() if not i.builtin} | {
            "jemeval": next((i.version for i in self.infos.values() if i.builtin), None)
        }


_manager: PluginManager | None = None
_manager_lock = threading.Lock()


def get_plugin_manager() -> PluginManager:
    """The process-wide plugin manager, created on first use."""
    global _manager
    with _manager_lock:
        if _manager is None:
            _manager = PluginManager()
        return _manager


def reset_plugin_manager() -> None:
    """Forget the current manager (the next request rebuilds it, re-reading entry points)."""
    global _manager
    with _manager_lock:
        _manager = None


def get_registry() -> Registry:
    return get_plugin_manager().registry


def get(kind: str, name: str) -> Any:
    """The registered object for ``kind`` (model, dataset, score, metric, attack) and ``name``."""
    return get_registry().get(kind, name)


def names(kind: str, pattern: str | None = None) -> list[str]:
    """The sorted registered names of ``kind``, optionally filtered by a glob ``pattern``."""
    return get_registry().names(kind, pattern)
