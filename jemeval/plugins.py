"""The plugin manager: built-in and third-party plugins, loaded softly and listed honestly.

* Built-ins are ordinary plugins (``DEFAULT_PLUGINS``), registered through the same hooks. They are
  imported when first needed: the command plugin when the command line lists or finds a command, the
  component plugins (which import torch) when the registry is first built, so ``jemeval --help``
  stays fast and the Python API never imports the command line.
* Third-party plugins come from the entry-point group ``jemeval``. Set
  ``JEMEVAL_DISABLE_PLUGIN_AUTOLOAD=1`` to skip them (built-ins still load), like pytest's
  ``PYTEST_DISABLE_PLUGIN_AUTOLOAD``.
* Plugins are loaded on the first request for a component or a command, never at import time. A
  plugin that fails to import or whose hook raises is reported once on stderr, shown with its error
  by ``jemeval plugins``, and named in the error raised when one of its components is asked for.
  The other plugins keep working.
* Each hook implementation is called on its own (:func:`call_hookimpl`), with the arguments it names
  and a ``register`` callback (or command group) bound to its plugin, so every component and command
  is stamped with the plugin that supplied it and one plugin's failure stays its own.
"""
from __future__ import annotations

import importlib
import os
import sys
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from importlib import metadata
from typing import Any

import pluggy

from jemeval import __version__, hookspecs
from jemeval.command_group import CommandCollector, PluginCommand
from jemeval.errors import DuplicateNameError, JemevalError, PluginError
from jemeval.registry import HOOKS, KINDS, Registry

ENTRY_POINT_GROUP = "jemeval"
DISABLE_AUTOLOAD_ENV = "JEMEVAL_DISABLE_PLUGIN_AUTOLOAD"
#: the built-in component plugins, imported (by name: nothing here imports them statically) when the
#: registry is first built
COMPONENT_PLUGINS = (
    "jemeval.builtins.models",
    "jemeval.builtins.datasets",
    "jemeval.builtins.ood_datasets",
    "jemeval.builtins.openood_lists",
    "jemeval.builtins.scores",
    "jemeval.builtins.detectors",
    "jemeval.builtins.pytorch_ood_detectors",
    "jemeval.builtins.metrics",
    "jemeval.builtins.foolbox_attacks",
    "jemeval.builtins.torchattacks_attacks",
    "jemeval.builtins.layouts",
    "jemeval.builtins.pretrained",
    "jemeval.builtins.loggers",
)
#: the built-in plugin that adds jemeval's own commands through ``register_commands``, imported when
#: the command line first lists or looks up a command
COMMANDS_PLUGIN = "jemeval.cli.default_commands"
DEFAULT_PLUGINS = (*COMPONENT_PLUGINS, COMMANDS_PLUGIN)


@dataclass
class PluginInfo:
    """What ``jemeval plugins`` shows for one plugin."""

    name: str
    version: str | None
    builtin: bool
    distribution: str | None = None
    hooks: list[str] = field(default_factory=list)  # the hooks it implements
    #: what it registered: kind (model, ..., checkpoint_layout) or "command" -> names
    registered: dict[str, list[str]] = field(default_factory=dict)
    errors: list[str] = field(default_factory=list)  # load-time errors (import, invalid hooks)
    hook_errors: dict[str, list[str]] = field(default_factory=dict)  # hook name -> errors of its last run

    def all_errors(self) -> list[str]:
        return self.errors + [e for hook in sorted(self.hook_errors) for e in self.hook_errors[hook]]

    def as_dict(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "version": self.version,
            "builtin": self.builtin,
            "distribution": self.distribution,
            "hooks": sorted(self.hooks),
            "registered": {k: sorted(v) for k, v in self.registered.items() if v},
            "error": "; ".join(self.all_errors()) or None,
        }


def call_hookimpl(impl: pluggy.HookImpl, **arguments: Any) -> Any:
    """Call one hook implementation with the arguments it names, by keyword (pluggy's rule: an
    implementation may take any subset of its hook's arguments), so that a hook may gain arguments
    without breaking the plugins written before."""
    return impl.function(**{name: arguments[name] for name in impl.argnames})


class PluginManager:
    """Owns the pluggy manager, the plugin records and the registry and commands built from them."""

    def __init__(self, *, autoload: bool | None = None) -> None:
        if autoload is None:
            autoload = os.environ.get(DISABLE_AUTOLOAD_ENV, "").strip().lower() not in ("1", "true", "yes")
        self.autoload = autoload
        self.pm = pluggy.PluginManager(hookspecs.PROJECT_NAME)
        self.pm.add_hookspecs(hookspecs)
        self.infos: dict[str, PluginInfo] = {}
        self._registry: Registry | None = None
        self._commands: dict[str, PluginCommand] | None = None
        self._warned: set[str] = set()
        self._lock = threading.RLock()
        if autoload:
            self._load_entry_points()

    # -- loading -------------------------------------------------------------------------------
    def _load_builtins(self, names: tuple[str, ...] = DEFAULT_PLUGINS) -> None:
        for module_name in names:
            if module_name not in self.infos:
                module = importlib.import_module(module_name)
                info = PluginInfo(module_name, __version__, builtin=True, distribution="jemeval")
                self._add(module, module_name, info)

    def _add(self, plugin: object, name: str, info: PluginInfo) -> None:
        try:
            self.pm.register(plugin, name=name)
            self.pm.check_pending()
            info.hooks = [caller.name for caller in self.pm.get_hookcallers(plugin) or ()]
        except pluggy.PluginValidationError as exc:
            if self.pm.is_registered(plugin):
                self.pm.unregister(plugin)
            info.errors.append(f"invalid hook: {exc}")
            self._warn(name, info.errors[-1])
        except ValueError as exc:  # name already registered
            info.errors.append(str(exc))
            self._warn(name, str(exc))
        self.infos[name] = info
        self._registry = self._commands = None

    def _load_entry_points(self) -> None:
        for ep in sorted(metadata.entry_points(group=ENTRY_POINT_GROUP), key=lambda e: e.name):
            if ep.name in self.infos:
                continue  # the same distribution seen twice on sys.path
            dist = getattr(ep, "dist", None)
            info = PluginInfo(ep.name, getattr(dist, "version", None), builtin=False,
                              distribution=getattr(dist, "name", None))
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
        """Register a plugin object (a module or any object with hookimpls); the registry and the
        commands are rebuilt with it on their next use."""
        with self._lock:
            self._load_builtins()
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
            return name

    def unregister(self, name: str) -> None:
        with self._lock:
            plugin = self.pm.get_plugin(name)
            if plugin is not None:
                self.pm.unregister(plugin)
            self.infos.pop(name, None)
            self._registry = self._commands = None

    # -- calling the hooks ---------------------------------------------------------------------
    def _each_impl(self, hook_name: str, call: Callable[[pluggy.HookImpl, PluginInfo], None]) -> None:
        """``call(impl, info)`` for every implementation of the hook, built-ins first (so that a
        plugin's duplicate is the one blamed); a failure is recorded against its plugin only."""
        impls = [i for i in getattr(self.pm.hook, hook_name).get_hookimpls() if i.plugin_name in self.infos]
        for impl in sorted(impls, key=lambda i: not self.infos[i.plugin_name].builtin):
            info = self.infos[impl.plugin_name]
            try:
                call(impl, info)
            except JemevalError as exc:
                self._record_failure(info, hook_name, f"{hook_name}: {exc}")
            except Exception as exc:
                self._record_failure(info, hook_name, f"{hook_name} raised {type(exc).__name__}: {exc}")

    def _record_failure(self, info: PluginInfo, hook_name: str, message: str) -> None:
        info.hook_errors.setdefault(hook_name, []).append(message)
        self._warn(info.name, message)

    def _start_hook(self, hook_name: str, key: str) -> None:
        """Forget what the last run of ``hook_name`` recorded (``registered[key]`` and its errors)."""
        for info in self.infos.values():
            info.registered[key] = []
            info.hook_errors.pop(hook_name, None)

    # -- the registry --------------------------------------------------------------------------
    @property
    def registry(self) -> Registry:
        with self._lock:
            if self._registry is None:
                self._load_builtins(COMPONENT_PLUGINS)
                self._registry = self._build_registry()
            return self._registry

    def _build_registry(self) -> Registry:
        registry = Registry()
        for kind in KINDS:
            self._start_hook(HOOKS[kind], kind)

            def call(impl, info, kind=kind):
                def register(name, obj, *, help=None):
                    registry.add(kind, name, obj, plugin=info.name, help=help)
                    info.registered[kind].append(name)

                call_hookimpl(impl, register=register)

            self._each_impl(HOOKS[kind], call)
        for info in self.infos.values():
            registry.failures.extend((info.name, error) for error in info.all_errors())
        return registry

    # -- the commands --------------------------------------------------------------------------
    def commands(self) -> dict[str, PluginCommand]:
        """Every command of the ``jemeval`` group (built-in and plugins'), by name, from ``register_commands``.

        Imports only the built-in command plugin and the installed plugins, not the component
        built-ins: listing commands must not cost a torch import.
        """
        with self._lock:
            if self._commands is None:
                self._load_builtins((COMMANDS_PLUGIN,))
                self._commands = self._collect_commands()
            return self._commands

    def _collect_commands(self) -> dict[str, PluginCommand]:
        table: dict[str, PluginCommand] = {}
        self._start_hook("register_commands", "command")

        def call(impl, info):
            collector = CommandCollector()
            call_hookimpl(impl, cli=collector)
            taken = []
            for name, target in collector.collected().items():
                if name in table:  # refused; the plugin's other commands are kept
                    taken.append(f"command {name!r} is added twice: by plugin {table[name].plugin!r} "
                                 f"and by plugin {info.name!r}")
                    continue
                table[name] = PluginCommand(name, info.name, target)
                info.registered["command"].append(name)
            if taken:
                raise DuplicateNameError("; ".join(taken))

        self._each_impl("register_commands", call)
        return table

    # -- reports -------------------------------------------------------------------------------
    def plugin_infos(self) -> list[PluginInfo]:
        """Every plugin, built-ins first, after running every hook (so ``registered`` is complete)."""
        with self._lock:
            self._load_builtins()
            _ = self.registry  # run the component hooks
            self.commands()
            return sorted(self.infos.values(), key=lambda i: (not i.builtin, i.name))

    def versions(self) -> dict[str, str | None]:
        """Plugin name -> version of every installed or registered plugin, and jemeval's, for provenance."""
        with self._lock:
            plugins = sorted((i for i in self.infos.values() if not i.builtin), key=lambda i: i.name)
            return {i.name: i.version for i in plugins} | {"jemeval": __version__}


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
    """The registered object for ``kind`` (model, dataset, score, metric, attack, checkpoint_layout) and ``name``."""
    return get_registry().get(kind, name)


def names(kind: str, pattern: str | None = None) -> list[str]:
    """The sorted registered names of ``kind``, optionally filtered by a glob ``pattern``."""
    return get_registry().names(kind, pattern)
