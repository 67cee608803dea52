"""The plugin manager: hook specs, built-ins and everything under the entry-point group `rmq`.

Built-in plugins are registered through this package's own entry points, the same way a
third-party plugin is; when rmq runs from a source tree that was never installed (no entry
points), the built-in modules are registered directly so nothing silently disappears.  A plugin
that fails to import is a PluginLoadError naming it and the cause: skipping it would only move
the failure to the first lookup of a name it provides ("unknown allocate strategy ...").
"""
from __future__ import annotations

import importlib
import importlib.metadata
import threading
from typing import Any

import pluggy

from rmq_core import hookspecs
from rmq_core.errors import ConfigError, PluginLoadError, PluginNotFoundError

PROJECT = "rmq"
hookimpl = pluggy.HookimplMarker(PROJECT)

BUILTIN_PLUGIN_MODULES = (
    "rmq_plugins.allocate",
    "rmq_plugins.filter",
    "rmq_plugins.store",
    "rmq_plugins.transport",
    "rmq_plugins.metrics",
    "rmq_plugins.acl",
)

_lock = threading.Lock()
_pm: pluggy.PluginManager | None = None


def get_plugin_manager() -> pluggy.PluginManager:
    global _pm
    with _lock:
        if _pm is None:
            pm = pluggy.PluginManager(PROJECT)
            pm.add_hookspecs(hookspecs)
            _load_entry_points(pm)
            for modname in BUILTIN_PLUGIN_MODULES:
                try:
                    mod = importlib.import_module(modname)
                except Exception as e:  # noqa: BLE001 - any failure of a built-in is the user's to see
                    raise PluginLoadError(f"{modname!r} (built-in)", e) from e
                if not pm.is_registered(mod):
                    pm.register(mod, name=modname)
            pm.check_pending()  # a typo in a hook name fails loudly
            _pm = pm
        return _pm


def _load_entry_points(pm: pluggy.PluginManager) -> None:
    """pluggy's load_setuptools_entrypoints, but a plugin that fails to import is named."""
    for ep in importlib.metadata.entry_points(group=PROJECT):
        if pm.has_plugin(ep.name) or pm.is_blocked(ep.name):
            continue
        try:
            plugin = ep.load()
        except Exception as e:  # noqa: BLE001 - re-raised, naming the plugin
            raise PluginLoadError(f"{ep.name!r} ({ep.value})", e) from e
        pm.register(plugin, name=ep.name)


def _merged(hook_name: str) -> dict[str, Any]:
    pm = get_plugin_manager()
    merged: dict[str, Any] = {}
    # pluggy calls the last-registered first; reverse so later (third-party) plugins override.
    for result in reversed(getattr(pm.hook, hook_name)()):
        merged.update(result or {})
    return merged


_KINDS = {
    "allocate strategy": "rmq_allocate_strategies",
    "filter expression type": "rmq_filters",
    "offset store": "rmq_offset_stores",
    "transport": "rmq_transports",
    "metrics exporter": "rmq_metrics_exporters",
    "access validator": "rmq_access_validators",
}


def available(kind: str) -> dict[str, Any]:
    """All named implementations of a kind ('allocate strategy', 'filter expression type', ...)."""
    try:
        return _merged(_KINDS[kind])
    except KeyError:
        raise ConfigError(f"unknown plugin kind {kind!r}; kinds: {', '.join(_KINDS)}") from None


def lookup(kind: str, name: str) -> Any:
    """The implementation called `name`, or PluginNotFoundError listing the available names."""
    impls = available(kind)
    if name in impls:
        return impls[name]
    raise PluginNotFoundError(kind, name, impls)


def get_allocate_strategy(name: str):
    return lookup("allocate strategy", name)


def get_filter_factory(expression_type: str):
    return lookup("filter expression type", (expression_type or "TAG").upper())


def get_offset_store_factory(name: str):
    return lookup("offset store", name)


def get_transport(scheme: str):
    return lookup("transport", scheme)


def get_metrics_exporter_factory(name: str):
    return lookup("metrics exporter", (name or "").upper())


def get_access_validator_factory(name: str):
    return lookup("access validator", (name or "").strip().lower())


def has_impls(hook_name: str) -> bool:
    """True when some plugin implements an interception hook (so callers can skip the call)."""
    return bool(getattr(get_plugin_manager().hook, hook_name).get_hookimpls())


def reset_plugin_manager() -> None:
    """Forget the manager so the next call re-reads entry points (tests that install a plugin)."""
    global _pm
    with _lock:
        _pm = None
