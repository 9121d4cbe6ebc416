"""Plugin registry: finds engines, changelog systems, serdes, stream systems and storage backends by
name through entry points (and the policy's local plugins), lazily, and caches what it loaded for
the life of the process.

A plugin that fails to import is reported with its name, distribution, version and the import
error; it breaks only the stores that use it.
"""

from __future__ import annotations

import importlib
import logging
import sys
import threading
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Any, Mapping

from localstate.core.backend import KVBackend
from localstate.core.changelog import PLUGIN_API_VERSION, ChangelogSystem
from localstate.core.engine import StorageEngineFactory
from localstate.core.options import did_you_mean
from localstate.core.policy import (BUILTIN_DISTRIBUTION, GROUPS, LOCAL_DISTRIBUTION, DiscoveredPlugin, PluginPolicy,
                                    discovered_plugins, normalize_distribution)
from localstate.core.serdes import Serde
from localstate.core.stream import StreamSystem
from localstate.core.text import a
from localstate.errors import ConfigError, PluginLoadError, PluginNotFoundError, PluginRefusedError

__all__ = ["PluginInfo", "Registry", "registry_for", "backend_names", "open_backend", "open_store_backend"]

logger = logging.getLogger(__name__)

_KINDS: dict[str, type] = {"engines": StorageEngineFactory, "changelogs": ChangelogSystem, "serdes": Serde,
                           "backends": KVBackend}
_KIND_NAMES = {"engines": "StorageEngineFactory", "changelogs": "ChangelogSystem", "serdes": "Serde",
               "streams": "StreamSystem", "backends": "KVBackend"}


def _kind(group: str) -> type:
    if group == "streams":
        return StreamSystem
    return _KINDS[group]


@dataclass(frozen=True)
class PluginInfo:
    """What is known of one plugin: where it comes from and whether it may load."""

    group: str
    name: str
    target: str
    """'module:attr'"""
    distribution: str
    version: str
    allowed: bool
    reason: str


class Registry:
    """Lookup of plugins by group and name under one :class:`PluginPolicy`."""

    def __init__(self, policy: PluginPolicy | None = None) -> None:
        self.policy = policy or PluginPolicy()
        self._loaded: dict[tuple[str, str], Any] = {}
        self._lock = threading.Lock()
        self._available: dict[str, tuple[tuple[DiscoveredPlugin, ...], tuple[PluginInfo, ...]]] = {}
        """group -> (the discovery it was derived from, the plugins with the policy's decisions)"""

    # -- discovery (no imports) ----------------------------------------------------------------
    def available(self, group: str) -> list[PluginInfo]:
        """Every plugin of ``group``, allowed or not, sorted by name.

        The installed entry points are discovered once per process (:func:`discovered_plugins`) and
        the policy is applied to them once per registry: a lookup per store costs a dict access.
        A new discovery (``sys.path`` changed, :func:`invalidate_discovery`) is noticed here."""
        found = discovered_plugins(group)
        cached = self._available.get(group)
        if cached is None or cached[0] is not found:
            cached = self._available[group] = (found, tuple(self._decide_all(group, found)))
        return list(cached[1])

    def _decide_all(self, group: str, found: tuple[DiscoveredPlugin, ...]) -> list[PluginInfo]:
        infos = []
        builtins = {plugin.name for plugin in found if plugin.builtin}
        for plugin in found:
            dist = plugin.distribution
            if plugin.builtin:
                dist = BUILTIN_DISTRIBUTION
            elif normalize_distribution(dist) == BUILTIN_DISTRIBUTION:
                # Named like localstate but pointing outside it: never treated as a built-in.
                dist = f"{dist} (look-alike, not localstate)"
            if plugin.name in builtins and dist != BUILTIN_DISTRIBUTION:
                # An installed plugin cannot take over a built-in name (that needs an explicit alias).
                allowed, reason = False, f"takes the name of the built-in {group[:-1]} {plugin.name!r}; refused"
            else:
                allowed, reason = self.policy.decide(group, plugin.name, dist)
            infos.append(PluginInfo(group, plugin.name, plugin.target, dist, plugin.version, allowed, reason))
        for local_group, name, target in self.policy.local:
            if local_group == group:
                allowed, reason = self.policy.decide(group, name, LOCAL_DISTRIBUTION)
                infos.append(PluginInfo(group, name, target, LOCAL_DISTRIBUTION, "", allowed, reason))
        return sorted(infos, key=lambda info: (info.name, info.distribution))

    def names(self, group: str) -> list[str]:
        return sorted({info.name for info in self.available(group) if info.allowed})

    # -- loading -------------------------------------------------------------------------------
    def load(self, group: str, name: str) -> Any:
        """Import and check the plugin object (a class) for ``name``; cached per process."""
        alias, name = name, self.policy.resolve_alias(group, name)
        if alias != name and self.policy.denies_name(group, alias):
            raise PluginRefusedError(f"{group[:-1]} plugin {alias!r} (alias of {name!r}) is denied by "
                                     f"{self.policy.source or 'the plugin policy'}",
                                     hint="remove it from deny_plugins if you trust it", plugin=alias)
        key = (group, name)
        with self._lock:
            if key not in self._loaded:
                if alias != name and (group, alias, name) in self.policy.overridden_builtins():
                    logger.warning("built-in %s name %r is aliased to %r by %s (override_builtins = true)",
                                   group[:-1], alias, name, self.policy.source)
                self._loaded[key] = self._load(group, name)
            return self._loaded[key]

    def _load(self, group: str, name: str) -> Any:
        candidates = [info for info in self.available(group) if info.name == name]
        if not candidates:
            known = self.names(group)
            raise PluginNotFoundError(
                f"no {group[:-1]} plugin named {name!r}{did_you_mean(name, known)}; available: "
                f"{', '.join(known) or '(none)'}",
                hint=f"install the distribution that provides it, or add it to [local.{group}] in plugins.toml",
                plugin=name)
        allowed = [info for info in candidates if info.allowed]
        if not allowed:
            info = candidates[0]
            raise PluginRefusedError(
                f"{group[:-1]} plugin {name!r} from {info.distribution} {info.version} is blocked: {info.reason}",
                hint="allow it in plugins.toml ([policy] allow_plugins / allow_distributions) if you trust it",
                plugin=name, distribution=info.distribution)
        if len(allowed) > 1:
            dists = ", ".join(f"{i.distribution} ({i.target})" for i in allowed)
            raise PluginRefusedError(
                f"{group[:-1]} plugin name {name!r} is provided by several distributions: {dists}",
                hint="deny all but one of them in plugins.toml ([policy] deny_distributions)", plugin=name)
        info = allowed[0]
        self._add_local_paths(info)
        obj = _import_target(info)
        _check_kind(group, info, obj)
        return obj

    def _add_local_paths(self, info: PluginInfo) -> None:
        # Only when an allowed local plugin is imported: listing or refusing one changes nothing.
        if info.distribution != LOCAL_DISTRIBUTION:
            return
        for path in self.policy.paths:
            if path not in sys.path:
                sys.path.append(path)

    def engine_factory(self, name: str) -> StorageEngineFactory:
        return self.load("engines", name)()

    def changelog_system(self, name: str) -> type[ChangelogSystem]:
        return self.load("changelogs", name)

    def backend(self, name: str) -> type[KVBackend]:
        return self.load("backends", name)

    def serde(self, name: str, *, allow_pickle: bool = False) -> Serde:
        serde_class = self.load("serdes", name)
        if serde_class.unsafe and not allow_pickle:
            raise PluginRefusedError(
                f"serde {name!r} can run arbitrary code when decoding data, and this job did not opt in",
                hint="set allow_pickle = true under [job] only if every input and changelog is trusted, "
                     "or use the json serde", plugin=name)
        return serde_class()

    def describe(self) -> list[tuple[PluginInfo, str]]:
        """Every plugin with its status: 'allowed', 'blocked' or 'broken', and why."""
        rows = []
        for group in GROUPS:
            for info in self.available(group):
                if not info.allowed:
                    rows.append((info, "blocked"))
                    continue
                try:
                    self._add_local_paths(info)
                    _check_kind(group, info, _import_target(info))
                    rows.append((info, "allowed"))
                except (PluginLoadError, PluginRefusedError) as exc:
                    rows.append((PluginInfo(info.group, info.name, info.target, info.distribution, info.version,
                                            False, exc.message), "broken"))
        return rows


def _import_target(info: PluginInfo) -> Any:
    module_name, _, attr = info.target.partition(":")
    try:
        obj = importlib.import_module(module_name.strip())
        for part in attr.strip().split("."):
            obj = getattr(obj, part)
        return obj
    except Exception as exc:  # an import can fail in any way; report it, never crash others
        raise PluginLoadError(
            f"{info.group[:-1]} plugin {info.name!r} ({info.target}) from {info.distribution} "
            f"{info.version} failed to load: {type(exc).__name__}: {exc}",
            hint=f"reinstall or fix the distribution {info.distribution!r}, or deny the plugin in plugins.toml",
            plugin=info.name, distribution=info.distribution) from exc


def _check_kind(group: str, info: PluginInfo, obj: Any) -> None:
    kind = _kind(group)
    if not (isinstance(obj, type) and issubclass(obj, kind)):
        raise PluginRefusedError(
            f"{group[:-1]} plugin {info.name!r} ({info.target}) from {info.distribution} is not "
            f"{a(_KIND_NAMES[group])} subclass (got {obj!r:.80})",
            hint=f"register a subclass of localstate.{_KIND_NAMES[group]} under this entry point",
            plugin=info.name, distribution=info.distribution)
    api = getattr(obj, "plugin_api", None)
    if api != PLUGIN_API_VERSION:
        raise PluginRefusedError(
            f"{group[:-1]} plugin {info.name!r} from {info.distribution} {info.version} declares plugin API "
            f"version {api!r}; this localstate speaks version {PLUGIN_API_VERSION}",
            hint=f"upgrade {info.distribution} to a release built for plugin API {PLUGIN_API_VERSION}",
            plugin=info.name, distribution=info.distribution)


@lru_cache(maxsize=16)
def registry_for(policy: PluginPolicy) -> Registry:
    """The per-process registry for ``policy`` (Spark executors resolve plugins by name here)."""
    return Registry(policy)


# -- storage backends, opened by name ------------------------------------------------------------
def backend_names(registry: Any = None) -> list[str]:
    """Names of the backends ``registry`` (default: the default policy's) may load: the one list."""
    return _registry(registry).names("backends")


def open_backend(kind: str, directory: Path, options: Mapping[str, Any], *, store: str = "",
                 partition: int | None = None, registry: Any = None) -> KVBackend:
    """Open backend ``kind`` for one store partition, found by name in ``registry`` (the job's; default:
    the registry of the default plugin policy). Unknown or refused names raise the registry's typed
    errors, reported at ``stores.<store>.backend``."""
    try:
        backend_class = _registry(registry).load("backends", kind)
    except PluginNotFoundError as exc:
        raise ConfigError.at(f"stores.{store}.backend", exc.message, hint=exc.hint) from None
    return backend_class.open(Path(directory), options, store=store, partition=partition)


def open_store_backend(context: Any, options: Mapping[str, Any]) -> KVBackend:
    """Open the backend a store partition's validated ``options`` name (``backend``, default rocksdb)
    in its directory, through the job's registry when the runtime passed one (``context.extra``)."""
    return open_backend(options.get("backend", "rocksdb"), context.directory, options, store=context.store,
                        partition=context.partition, registry=context.extra.get("registry"))


def _registry(registry: Any) -> Any:
    if registry is not None:
        return registry
    return registry_for(PluginPolicy())
