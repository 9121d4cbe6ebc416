"""The plugin policy (``plugins.toml``): which entry-point plugins may load, aliases, and local
development plugins given as ``module:attr``.

Which file governs a job, first match wins (see docs/plugins.md, "Which policy applies"):

1. the operator's file: ``--plugins FILE`` on the CLI (``plugins=`` in code), else ``$LOCALSTATE_PLUGINS``;
2. the job's own choice, ``[job] plugins = "file.toml"``, resolved in the job file's directory and
   refused if it points outside it;
3. ``plugins.toml`` in the job file's directory;
4. the default policy: built-ins and every installed plugin may load.

Nothing is looked up in the current directory or its ancestors, so a ``plugins.toml`` dropped in a
shared directory such as ``/tmp`` governs nothing. A policy file that is present but unreadable or
malformed fails closed: :class:`~localstate.errors.ConfigError` naming the file, never a fallback.

Example::

    [policy]
    mode = "allowlist"                      # or "open" (the default)
    allow_distributions = ["acme-localstate-trie"]   # compared PEP 503-normalised
    allow_plugins = ["engines.trie"]        # "name" (any group) or "group.name"
    deny_plugins = []
    deny_distributions = []
    override_builtins = false               # true lets an alias replace a built-in name

    [aliases.engines]
    keyvalue = "kv"

    [local]
    paths = ["dev-plugins"]                 # added to sys.path when a local plugin loads
    trusted = false                         # true: local plugins pass allowlist mode
    [local.engines]
    scratch = "scratch_engine:ScratchFactory"
"""

from __future__ import annotations

import importlib.metadata as metadata
import logging
import os
import re
import sys
import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping

from localstate.core.tomlfile import read_toml_file
from localstate.errors import ConfigError, ConfigProblem

__all__ = ["GROUPS", "BUILTIN_DISTRIBUTION", "LOCAL_DISTRIBUTION", "ENV_VAR", "POLICY_FILE", "PluginPolicy",
           "PolicyLocation", "DiscoveredPlugin", "builtin_names", "discovered_plugins", "find_policy_file",
           "invalidate_discovery", "is_builtin_entry_point", "job_folder", "locate_policy", "normalize_distribution"]

logger = logging.getLogger(__name__)

#: Short group name -> entry-point group.
GROUPS = {"engines": "localstate.engines", "changelogs": "localstate.changelogs", "serdes": "localstate.serdes",
          "streams": "localstate.streams", "backends": "localstate.backends"}
BUILTIN_DISTRIBUTION = "localstate"
LOCAL_DISTRIBUTION = "(local plugins.toml)"
ENV_VAR = "LOCALSTATE_PLUGINS"
POLICY_FILE = "plugins.toml"
_MODES = ("open", "allowlist")
#: A policy is a few lines; the cap keeps a hostile file from stalling tomllib (dotted keys are quadratic).
_MAX_POLICY_BYTES = 64 * 1024
_TARGET = re.compile(r"^[A-Za-z_][\w.]*:[A-Za-z_][\w.]*$")
_FIX_HINT = "fix the policy file (see docs/plugins.md) or remove it; a broken policy never falls back to the default"


def normalize_distribution(name: str) -> str:
    """PEP 503 form of a distribution name: lowercase, runs of ``-``, ``_`` and ``.`` become ``-``."""
    return re.sub(r"[-_.]+", "-", name).lower()


def is_builtin_entry_point(ep: metadata.EntryPoint) -> bool:
    """True only for localstate's own plugins: the distribution is named ``localstate`` *and* the
    target lives in the ``localstate`` package (a look-alike distribution cannot claim built-in)."""
    return _is_builtin(ep.dist.name if ep.dist else "", ep.value)


def _is_builtin(distribution: str, target: str) -> bool:
    return normalize_distribution(distribution) == BUILTIN_DISTRIBUTION and target.strip().startswith("localstate.")


def builtin_names(group: str) -> frozenset[str]:
    """Names of the built-in plugins of ``group`` (short group name, e.g. ``engines``)."""
    return frozenset(found.name for found in discovered_plugins(group) if found.builtin)


# -- discovery: once per process ----------------------------------------------------------------
@dataclass(frozen=True)
class DiscoveredPlugin:
    """One installed entry point of a localstate group, as found on disk, before any policy: its
    distribution's metadata read once (``ep.dist.name`` parses the METADATA file on every access)."""

    name: str
    target: str
    """'module:attr'"""
    distribution: str
    """the distribution's name as installed, or ``(unknown)``"""
    version: str
    builtin: bool
    """see :func:`is_builtin_entry_point`"""


_discovery_lock = threading.Lock()
_discovery: tuple[tuple[str, ...], dict[str, tuple[DiscoveredPlugin, ...]]] | None = None


def discovered_plugins(group: str) -> tuple[DiscoveredPlugin, ...]:
    """Every installed entry point of ``group`` (short name), in discovery order.

    Guarantee: ``importlib.metadata.entry_points()`` is scanned once per process for all groups
    together, and again only when ``sys.path`` has changed since (an entry added or removed, as a
    plugin installed into a new directory at run time) or after :func:`invalidate_discovery`.
    Thread safe. A scan costs milliseconds, so a job with thousands of stores must never scan per
    store (``python -m bench validate``)."""
    global _discovery
    key = tuple(sys.path)
    snapshot = _discovery
    if snapshot is not None and snapshot[0] == key:
        return snapshot[1].get(group, ())
    with _discovery_lock:
        snapshot = _discovery
        if snapshot is None or snapshot[0] != key:
            found: dict[str, tuple[DiscoveredPlugin, ...]] = {}
            everything = metadata.entry_points()  # one scan; select() is the version-proof way to filter it
            for short, full in GROUPS.items():
                items = []
                for ep in everything.select(group=full):
                    # dist.name and dist.version parse the METADATA file on every access: once each here.
                    dist = ep.dist
                    name = dist.name if dist else ""
                    items.append(DiscoveredPlugin(ep.name, ep.value, name or "(unknown)",
                                                  dist.version if dist else "", _is_builtin(name, ep.value)))
                found[short] = tuple(items)
            snapshot = _discovery = (key, found)
    return snapshot[1].get(group, ())


def invalidate_discovery() -> None:
    """Forget what :func:`discovered_plugins` found, so the next lookup scans the installed
    distributions again. Call it after installing or removing a plugin distribution into a
    directory already on ``sys.path`` while the process runs (changing ``sys.path`` itself is
    noticed without it). Registries built before re-derive their plugin lists on next use."""
    global _discovery
    with _discovery_lock:
        _discovery = None


# -- locating the file --------------------------------------------------------------------------
def job_folder(job_file: str | os.PathLike[str]) -> Path:
    """The job's folder: the one base every relative path of a job is resolved against (``state_dir``,
    ``[job] plugins`` and ``plugins.toml``, the task module's ``sys.path`` entry, ``[job]
    pythonpath``, input and output paths). It is the directory that holds the job file *as given*:
    when ``job.toml`` is a symlink, the folder of the link, not of its target (the file's own link
    is never followed, so the operator's folder decides the policy and the state, never whoever
    controls the target's folder). Symlinks among the folder's own ancestors are resolved as the OS
    resolves them; the result is absolute."""
    return Path(job_file).absolute().parent.resolve()


@dataclass(frozen=True)
class PolicyLocation:
    """Which policy file governs, and why: ``origin`` is ``--plugins``, ``$LOCALSTATE_PLUGINS``,
    ``job.plugins``, ``job folder`` or ``default`` (then ``path`` is None)."""

    path: Path | None
    origin: str


def locate_policy(explicit: str | os.PathLike[str] | None = None, *, job_dir: Path | None = None,
                  job_plugins: str | None = None) -> PolicyLocation:
    """Pick the policy file by the documented precedence (module docstring). Never reads the file
    and never searches the current directory or any ancestor (the current directory only anchors a
    relative ``job_plugins`` when there is no ``job_dir``); raises ConfigError for a named file that
    is absent or a ``job_plugins`` that leaves the job's folder."""
    operator: PolicyLocation | None = None
    if explicit:
        operator = PolicyLocation(_present(Path(explicit), "plugins",
                                           "pass an existing plugins.toml or drop --plugins"), "--plugins")
    elif os.environ.get(ENV_VAR):
        operator = PolicyLocation(_present(Path(os.environ[ENV_VAR]), ENV_VAR,
                                           f"point {ENV_VAR} at an existing plugins.toml or unset it"),
                                  f"${ENV_VAR}")
    if operator is not None:
        if job_plugins:
            logger.warning("job.plugins = %r is ignored: the operator's policy %s (%s) governs this job",
                           job_plugins, operator.path, operator.origin)
        return operator
    if job_plugins is not None:
        # A job given as a dict (no file) names its policy relative to the current directory.
        return PolicyLocation(_inside_job_dir(Path(job_dir or Path.cwd()), job_plugins), "job.plugins")
    if job_dir is None:
        return PolicyLocation(None, "default")
    candidate = Path(job_dir) / POLICY_FILE
    # lexists, not is_file: a directory or dangling symlink here must fail closed, not be skipped.
    if os.path.lexists(candidate):
        return PolicyLocation(candidate, "job folder")
    return PolicyLocation(None, "default")


def find_policy_file(explicit: str | os.PathLike[str] | None = None, start: Path | None = None, *,
                     job_dir: Path | None = None, job_plugins: str | None = None) -> Path | None:
    """The governing policy file, or None for the default policy (see :func:`locate_policy`).
    ``start`` is the job's folder (older name of ``job_dir``); only that folder is looked in."""
    return locate_policy(explicit, job_dir=job_dir or start, job_plugins=job_plugins).path


def _present(path: Path, where: str, hint: str) -> Path:
    if not os.path.lexists(path):
        raise ConfigError.at(where, f"plugin policy file {path} does not exist", source=str(path), hint=hint)
    return path


def _inside_job_dir(job_dir: Path, value: str) -> Path:
    if not value.strip() or "\x00" in value:
        raise ConfigError.at("job.plugins", "must name a policy file in the job's folder",
                             hint='e.g. plugins = "plugins.toml", or drop the key')
    path = job_dir / value
    root = job_dir.resolve()
    # Resolve symlinks too: a link inside the folder that points elsewhere leaves the folder.
    if not path.resolve().is_relative_to(root):
        raise ConfigError.at("job.plugins", f"{value!r} resolves to {path.resolve()}, outside the job's folder {root}",
                             hint="keep the job's policy file next to the job file, or have the operator pass "
                                  f"--plugins / ${ENV_VAR}")
    return _present(path, "job.plugins", "create the file next to the job file or drop job.plugins")


# -- the policy ---------------------------------------------------------------------------------
@dataclass(frozen=True)
class PluginPolicy:
    """Immutable, hashable plugin policy; ships to Spark executors with the job (no discovery there).

    Distribution names are held PEP 503-normalised. Built-ins are always allowed unless denied;
    every other plugin, local ones included, passes the same deny and (in allowlist mode) allow rules.
    """

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
    override_builtins: bool = False
    local_trusted: bool = False
    source: str | None = field(default=None, compare=False)
    origin: str = field(default="default", compare=False)
    """How the file was chosen (see :class:`PolicyLocation`)."""

    # -- loading -------------------------------------------------------------------------------
    @classmethod
    def load(cls, path: str | os.PathLike[str], *, origin: str = "explicit") -> "PluginPolicy":
        """Read and validate one policy file; any defect is a ConfigError naming the file."""
        path = Path(path)
        data = read_toml_file(path, "plugin policy file", max_bytes=_MAX_POLICY_BYTES, hint=_FIX_HINT)
        return cls.from_dict(data, source=str(path), base=path.parent, origin=origin)

    @classmethod
    def discover(cls, explicit: str | os.PathLike[str] | None = None, *, job_dir: Path | None = None,
                 job_plugins: str | None = None) -> "PluginPolicy":
        """The policy that governs (see :func:`locate_policy`), loaded; the default if there is none."""
        where = locate_policy(explicit, job_dir=job_dir, job_plugins=job_plugins)
        return cls.load(where.path, origin=where.origin) if where.path else cls()

    @classmethod
    def from_dict(cls, data: Mapping[str, Any], *, source: str | None = None, base: Path | None = None,
                  origin: str = "explicit") -> "PluginPolicy":
        """Validate a parsed policy; every problem is reported at its dotted path."""
        problems: list[ConfigProblem] = []
        add = lambda path, message: problems.append(ConfigProblem(path, message))  # noqa: E731
        if not isinstance(data, Mapping):
            raise ConfigError.at("", "the policy must be a TOML table", source=source, hint=_FIX_HINT)
        for key in sorted(set(data) - {"policy", "aliases", "local"}):
            add(key, "unknown section; expected policy, aliases or local")

        policy = _section(data, "policy", add)
        mode = policy.get("mode", "open")
        if not isinstance(mode, str) or mode not in _MODES:
            add("policy.mode", f"must be 'open' or 'allowlist', got {_show(mode)}")
            mode = "allowlist"
        lists: dict[str, frozenset[str]] = {}
        for key in ("allow_plugins", "allow_distributions", "deny_plugins", "deny_distributions"):
            value = policy.get(key, [])
            if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
                add(f"policy.{key}", "must be a list of strings")
                value = []
            if key.endswith("_distributions"):
                value = [normalize_distribution(v) for v in value]
            lists[key] = frozenset(value)
        override = _flag(policy, "override_builtins", "policy", add)
        for key in sorted(set(policy) - {"mode", "override_builtins", *lists}):
            add(f"policy.{key}", "unknown key")

        local_section = dict(_section(data, "local", add))
        raw_paths = local_section.pop("paths", [])
        trusted = _flag(local_section, "trusted", "local", add)
        local_section.pop("trusted", None)
        paths: list[str] = []
        if not isinstance(raw_paths, list) or not all(isinstance(p, str) and "\x00" not in p for p in raw_paths):
            add("local.paths", "must be a list of directories")
        else:
            paths = [str(((base or Path.cwd()) / p).resolve()) for p in raw_paths]
        builtins = {group: builtin_names(group) for group in GROUPS}
        local: list[tuple[str, str, str]] = []
        for group, table in local_section.items():
            if group not in GROUPS:
                add(f"local.{group}", f"unknown group; expected paths, trusted or one of {', '.join(GROUPS)}")
            elif not isinstance(table, dict):
                add(f"local.{group}", "must be a table of name = 'module:attribute'")
            else:
                for name, target in table.items():
                    if not isinstance(target, str) or not _TARGET.match(target.strip()):
                        add(f"local.{group}.{name}", "must be 'module:attribute'")
                    elif name in builtins[group]:
                        add(f"local.{group}.{name}", f"{name!r} is a built-in {group[:-1]}; a local plugin "
                                                     "cannot take its name (pick another name)")
                    else:
                        local.append((group, name, target.strip()))

        aliases: list[tuple[str, str, str]] = []
        for group, table in _section(data, "aliases", add).items():
            if group not in GROUPS:
                add(f"aliases.{group}", f"unknown group; expected one of {', '.join(GROUPS)}")
            elif not isinstance(table, dict):
                add(f"aliases.{group}", "must be a table of alias = 'plugin name'")
            else:
                local_names = {name for g, name, _ in local if g == group}
                for alias, target in table.items():
                    if not isinstance(target, str) or not target.strip():
                        add(f"aliases.{group}.{alias}", "target must be a plugin name")
                    elif alias in builtins[group] and not override:
                        add(f"aliases.{group}.{alias}", f"would retarget the built-in {group[:-1]} {alias!r} to "
                                                        f"{target!r}; refused unless [policy] override_builtins = true")
                    elif alias in local_names:
                        add(f"aliases.{group}.{alias}", f"{alias!r} is also a [local.{group}] plugin")
                    else:
                        aliases.append((group, alias, target.strip()))
        if problems:
            raise ConfigError(problems, source=source, hint=_FIX_HINT)
        return cls(mode=mode, aliases=tuple(aliases), local=tuple(local), paths=tuple(paths),
                   override_builtins=override, local_trusted=trusted, source=source, origin=origin, **lists)

    # -- decisions -----------------------------------------------------------------------------
    def resolve_alias(self, group: str, name: str) -> str:
        for alias_group, alias, target in self.aliases:
            if alias_group == group and alias == name:
                return target
        return name

    def overridden_builtins(self) -> list[tuple[str, str, str]]:
        """The aliases that replace a built-in name (only possible with ``override_builtins``)."""
        builtins = {group: builtin_names(group) for group in GROUPS}
        return [(g, alias, target) for g, alias, target in self.aliases if alias in builtins[g]]

    def decide(self, group: str, name: str, distribution: str) -> tuple[bool, str]:
        """Return (allowed, reason) for plugin ``name`` of ``group`` from ``distribution``.

        ``distribution`` is :data:`BUILTIN_DISTRIBUTION` only for verified built-ins (see
        :func:`is_builtin_entry_point`) and :data:`LOCAL_DISTRIBUTION` for ``[local]`` plugins.
        """
        qualified = f"{group}.{name}"
        dist = normalize_distribution(distribution)
        if self.denies_name(group, name):
            return False, f"plugin {qualified!r} is denied by {self._where()}"
        if dist in self.deny_distributions:
            return False, f"distribution {distribution!r} is denied by {self._where()}"
        if distribution == BUILTIN_DISTRIBUTION:
            return True, "allowed (built-in)"
        if self.mode == "open":
            return True, "allowed (open policy)"
        if name in self.allow_plugins or qualified in self.allow_plugins:
            return True, f"allowed by allow_plugins in {self._where()}"
        if distribution == LOCAL_DISTRIBUTION:
            if self.local_trusted:
                return True, f"allowed ([local] trusted = true in {self._where()})"
            return False, (f"local plugin not on the allowlist in {self._where()} (add {qualified!r} to "
                           "allow_plugins or set [local] trusted = true)")
        if dist in self.allow_distributions:
            return True, f"allowed by allow_distributions in {self._where()}"
        return False, f"not on the allowlist in {self._where()}"

    def denies_name(self, group: str, name: str) -> bool:
        """Whether ``deny_plugins`` names ``name`` (plain or ``group.name``). Matching is generous,
        case-insensitive with ``-_.`` folded, so a deny rule cannot be dodged by spelling."""
        denied = {normalize_distribution(d) for d in self.deny_plugins}
        return normalize_distribution(name) in denied or normalize_distribution(f"{group}.{name}") in denied

    def describe_source(self) -> str:
        """One line for operators: which file governs and why, or the default."""
        if self.source is None:
            return "default (no policy file): built-ins and every installed plugin may load"
        return f"{self.source} (chosen by {self.origin})"

    def _where(self) -> str:
        return self.source or "the plugin policy"


def _section(data: Mapping[str, Any], key: str, add: Any) -> Mapping[str, Any]:
    value = data.get(key, {})
    if not isinstance(value, dict):
        add(key, f"must be a table, got {_show(value)}")
        return {}
    return value


def _flag(table: Mapping[str, Any], key: str, section: str, add: Any) -> bool:
    value = table.get(key, False)
    if not isinstance(value, bool):
        add(f"{section}.{key}", f"must be true or false, got {_show(value)}")
        return False
    return value


def _show(value: Any) -> str:
    """A short rendering of a bad value (a hostile file may hold huge or deep ones)."""
    text = repr(value) if isinstance(value, (str, int, float, bool)) else type(value).__name__
    return text if len(text) <= 60 else text[:57] + "..."
