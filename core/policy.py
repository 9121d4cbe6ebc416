"""The plugin policy (``plugins.toml``): which entry-point plugins may load, aliases, and local
development plugins given as ``module:attr``.

Location, first found wins: an explicit path (``--plugins`` on the CLI, ``plugins`` in code), the
``LOCALSTATE_PLUGINS`` environment variable, then ``plugins.toml`` in the current directory or its
nearest ancestor. No file means the default policy: built-ins and every installed plugin may load.

Example::

    [policy]
    mode = "allowlist"                      # or "open" (the default)
    allow_distributions = ["acme-localstate-trie"]
    allow_plugins = ["engines.trie"]        # "name" (any group) or "group.name"
    deny_plugins = []
    deny_distributions = []

    [aliases.engines]
    keyvalue = "kv"

    [local]
    paths = ["dev-plugins"]                 # added to sys.path, relative to this file
    [local.engines]
    scratch = "scratch_engine:ScratchFactory"
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from localstate.core.tomlfile import read_toml_file
from localstate.errors import ConfigError, ConfigProblem

__all__ = ["GROUPS", "BUILTIN_DISTRIBUTION", "PluginPolicy", "find_policy_file", "ENV_VAR"]

#: Short group name -> entry-point group.
GROUPS = {"engines": "localstate.engines", "changelogs": "localstate.changelogs", "serdes": "localstate.serdes"}
BUILTIN_DISTRIBUTION = "localstate"
LOCAL_DISTRIBUTION = "(local plugins.toml)"
ENV_VAR = "LOCALSTATE_PLUGINS"
_MODES = ("open", "allowlist")


def find_policy_file(explicit: str | os.PathLike[str] | None = None, start: Path | None = None) -> Path | None:
    """Locate the policy file as documented in the module docstring."""
    if explicit:
        path = Path(explicit)
        if not path.is_file():
            raise ConfigError.at("plugins", f"plugin policy file {path} does not exist",
                                 hint="pass an existing plugins.toml or drop the option")
        return path
    env = os.environ.get(ENV_VAR)
    if env:
        path = Path(env)
        if not path.is_file():
            raise ConfigError.at(ENV_VAR, f"plugin policy file {path} does not exist",
                                 hint=f"point {ENV_VAR} at an existing plugins.toml or unset it")
        return path
    here = (start or Path.cwd()).resolve()
    for directory in (here, *here.parents):
        candidate = directory / "plugins.toml"
        if candidate.is_file():
            return candidate
    return None


@dataclass(frozen=True)
class PluginPolicy:
    """Immutable, hashable plugin policy; ships to Spark executors with the job."""

    mode: str = "open"
    allow_plugins: frozenset[str] = frozenset()
    allow_distributions: frozenset[str] = frozenset()
    deny_plugins: frozenset[str] = frozenset()
    deny_distributions: frozenset[str] = frozenset()
    aliases: tuple[tuple[str, str, str], ...] = ()
    """(group, alias, target)"""
    local: tuple[tuple[str, str, str], ...] = ()
    """(group, name, "module:attr")"""
    paths: tuple[str, ...] = ()
    source: str | None = field(default=None, compare=False)

    # -- loading -------------------------------------------------------------------------------
    @classmethod
    def load(cls, path: str | os.PathLike[str]) -> "PluginPolicy":
        path = Path(path)
        data = read_toml_file(path, "plugin policy")
        return cls.from_dict(data, source=str(path), base=path.parent)

    @classmethod
    def discover(cls, explicit: str | os.PathLike[str] | None = None) -> "PluginPolicy":
        path = find_policy_file(explicit)
        return cls.load(path) if path else cls()

    @classmethod
    def from_dict(cls, data: dict[str, Any], *, source: str | None = None, base: Path | None = None) -> "PluginPolicy":
        problems: list[ConfigProblem] = []
        unknown = set(data) - {"policy", "aliases", "local"}
        problems += [ConfigProblem(key, "unknown section; expected policy, aliases or local") for key in sorted(unknown)]

        policy = data.get("policy", {})
        mode = policy.get("mode", "open")
        if mode not in _MODES:
            problems.append(ConfigProblem("policy.mode", f"must be 'open' or 'allowlist', got {mode!r}"))
        lists: dict[str, frozenset[str]] = {}
        for key in ("allow_plugins", "allow_distributions", "deny_plugins", "deny_distributions"):
            value = policy.get(key, [])
            if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
                problems.append(ConfigProblem(f"policy.{key}", "must be a list of strings"))
                value = []
            lists[key] = frozenset(value)
        for key in sorted(set(policy) - {"mode", *lists}):
            problems.append(ConfigProblem(f"policy.{key}", "unknown key"))

        aliases: list[tuple[str, str, str]] = []
        for group, table in data.get("aliases", {}).items():
            if group not in GROUPS:
                problems.append(ConfigProblem(f"aliases.{group}", f"unknown group; expected one of {', '.join(GROUPS)}"))
                continue
            for alias, target in table.items():
                if not isinstance(target, str):
                    problems.append(ConfigProblem(f"aliases.{group}.{alias}", "target must be a plugin name"))
                else:
                    aliases.append((group, alias, target))

        local_section = dict(data.get("local", {}))
        raw_paths = local_section.pop("paths", [])
        paths: list[str] = []
        if not isinstance(raw_paths, list) or not all(isinstance(p, str) for p in raw_paths):
            problems.append(ConfigProblem("local.paths", "must be a list of directories"))
        else:
            paths = [str(((base or Path.cwd()) / p).resolve()) for p in raw_paths]
        local: list[tuple[str, str, str]] = []
        for group, table in local_section.items():
            if group not in GROUPS or not isinstance(table, dict):
                problems.append(ConfigProblem(f"local.{group}", f"unknown group; expected one of {', '.join(GROUPS)}"))
                continue
            for name, target in table.items():
                if not isinstance(target, str) or ":" not in target:
                    problems.append(ConfigProblem(f"local.{group}.{name}", "must be 'module:attribute'"))
                else:
                    local.append((group, name, target))
        if problems:
            raise ConfigError(problems, source=source)
        return cls(mode=mode, aliases=tuple(aliases), local=tuple(local), paths=tuple(paths), source=source, **lists)

    # -- decisions -----------------------------------------------------------------------------
    def resolve_alias(self, group: str, name: str) -> str:
        for alias_group, alias, target in self.aliases:
            if alias_group == group and alias == name:
                return target
        return name

    def decide(self, group: str, name: str, distribution: str) -> tuple[bool, str]:
        """Return (allowed, reason) for plugin ``name`` of ``group`` from ``distribution``."""
        qualified = f"{group}.{name}"
        if name in self.deny_plugins or qualified in self.deny_plugins:
            return False, f"plugin {qualified!r} is denied by {self._where()}"
        if distribution in self.deny_distributions:
            return False, f"distribution {distribution!r} is denied by {self._where()}"
        if self.mode == "open":
            return True, "allowed (open policy)"
        if distribution in (BUILTIN_DISTRIBUTION, LOCAL_DISTRIBUTION):
            return True, "allowed (built-in)" if distribution == BUILTIN_DISTRIBUTION else "allowed (local plugin)"
        if name in self.allow_plugins or qualified in self.allow_plugins:
            return True, f"allowed by allow_plugins in {self._where()}"
        if distribution in self.allow_distributions:
            return True, f"allowed by allow_distributions in {self._where()}"
        return False, f"not on the allowlist in {self._where()}"

    def _where(self) -> str:
        return self.source or "the plugin policy"
