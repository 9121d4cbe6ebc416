"""Job configuration (TOML), validated in full before any data is touched.

Every problem is collected and reported in one :class:`~localstate.errors.ConfigError`, each at its
config path (``stores.counts.cache_size``). Example::

    [job]
    name = "page-view-counts"
    partitions = 4
    task = "my_tasks:PageViewCounter"     # module:Class, a StreamTask subclass
    commit_interval = "5s"
    changelog = "file"                    # default changelog system for every store
    state_dir = "state"                   # relative to this file
    # local_dir = "/mnt/ssd/localstate"   # per-host directory for local stores (default: see docs/cluster.md)

    [changelogs.file]                     # options of a changelog system
    segment_bytes = "64MB"

    [inputs.page-views]
    system = "jsonl"
    path = "data/page-views"

    [stores.counts]
    engine = "kv"
    backend = "rocksdb"
    key_serde = "string"
    value_serde = "int"
    # changelog = "counts-log"            # stream name; default "<job>-<store>-changelog"; false = none
"""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping

from localstate.core.engine import serde_problem
from localstate.core.names import name_problem
from localstate.core.options import did_you_mean, parse_duration, parse_path, validate_options
from localstate.core.policy import PluginPolicy, job_folder
from localstate.core.registry import Registry, registry_for
from localstate.core.time import TIME_OPTIONS, TIMER_STORE, TIMER_WRITE_BATCH, TimeConfig
from localstate.core.tomlfile import read_toml_file
from localstate.errors import ConfigError, ConfigProblem, LocalStateError

__all__ = ["StoreConfig", "StreamConfig", "JobConfig", "TimeConfig", "RESCALE_POLICIES", "job_policy", "load_job_config",
           "parse_job_config", "LOG_LEVELS",
           "apply_log_level"]

_JOB_KEYS = {"name", "partitions", "task", "commit_interval", "commit_every", "window_interval", "changelog",
             "state_dir", "local_dir", "allow_pickle", "plugins", "log_level", "pipelined_commits",
             "metrics_port", "metrics_host", "pythonpath"}
_STORE_KEYS = {"engine", "changelog", "key_serde", "value_serde", "rescale", "rescale_merge"}
#: ``[stores.<name>] rescale``: how a rescale moves the store's records to a new partition count
#: (docs/state-as-data.md): by each record's key (the default), merged into every new partition or into
#: partition 0, or routed by a user function ``module:function``.
RESCALE_POLICIES = ("key", "all", "one")
_SECTIONS = {"job", "stores", "inputs", "outputs", "changelogs", "spark", "time"}

LOG_LEVELS = ("CRITICAL", "ERROR", "WARNING", "INFO", "DEBUG")
"""Accepted ``job.log_level`` values (case-insensitive): the :mod:`logging` levels."""


def _pythonpath(value: Any) -> list[str]:
    """``job.pythonpath``: a list of usable folder paths."""
    if not isinstance(value, list):
        raise ValueError(f"must be a list of folders (relative to the job file's folder), got {value!r}")
    for index, entry in enumerate(value):
        try:
            parse_path(entry)
        except ValueError as exc:
            raise ValueError(f"entry {index}: {exc}") from None
    return list(value)


@dataclass(frozen=True)
class StoreConfig:
    """One ``[stores.<name>]`` table after validation."""

    name: str
    engine: str
    options: Mapping[str, Any]
    """Engine options, validated by the engine's factory."""
    changelog: str | None
    """Changelog stream name, or None when the store is not logged."""
    key_serde: str = "bytes"
    value_serde: str = "bytes"
    rescale: str = "key"
    """how a rescale redistributes the store's records: ``key``, ``all``, ``one`` (:data:`RESCALE_POLICIES`)
    or a user function ``module:function`` returning each record's routing key"""
    rescale_merge: str | None = None
    """``module:function`` merging the values one key has in several old partitions (a kv store
    redistributed with ``all`` or ``one``)"""


@dataclass(frozen=True)
class StreamConfig:
    """One ``[inputs.<name>]`` or ``[outputs.<name>]`` table; ``system`` picks the stream system."""

    name: str
    system: str
    options: Mapping[str, Any]


@dataclass(frozen=True)
class JobConfig:
    """A validated job."""

    name: str
    partitions: int
    task: str
    state_dir: Path
    local_dir: str | None = None
    """per-host directory for the local stores, as written (``$VARS`` are expanded on each host); None:
    ``<state_dir>/<job>/stores`` on a local master, under Spark's local directory on a cluster"""
    changelog_system: str = "file"
    changelog_options: Mapping[str, Mapping[str, Any]] = field(default_factory=dict)
    commit_interval: float = 5.0
    commit_every: int | None = None
    pipelined_commits: bool = True
    """``job.pipelined_commits``: let the in-process runtime pipeline commits when every logged store's
    changelog writes in the background (:class:`~localstate.core.changelog.DeferredDurability`, the
    objectstore changelog); False: every commit waits for its writes and its checkpoint"""
    window_interval: float | None = None
    allow_pickle: bool = False
    inputs: Mapping[str, StreamConfig] = field(default_factory=dict)
    outputs: Mapping[str, StreamConfig] = field(default_factory=dict)
    stores: Mapping[str, StoreConfig] = field(default_factory=dict)
    spark: Mapping[str, Any] = field(default_factory=dict)
    """``[spark]`` as the file gives it: the Spark runtime validates it (``localstate validate``
    and every run on Spark do, see :mod:`localstate.runtime.spark.config`)"""
    pythonpath: tuple[str, ...] = ()
    """``job.pythonpath``: extra folders for the task's imports, relative to the job file's folder"""
    time: TimeConfig = field(default_factory=TimeConfig)
    """``[time]``: allowed lateness of the watermark, and the timers (their store is
    ``stores[TIMER_STORE]`` when enabled)"""
    policy: PluginPolicy = field(default_factory=PluginPolicy)
    source: str | None = None
    log_level: str | None = None
    """``job.log_level`` (upper case), applied to the ``localstate`` loggers by :func:`apply_log_level`."""
    metrics_port: int | None = None
    """``job.metrics_port``: the driver's Prometheus endpoint (``localstate run``); None: off"""
    metrics_host: str = "127.0.0.1"
    """``job.metrics_host``: the address the endpoint binds to"""
    epoch: int = 0
    """the state epoch this config reads and writes (:mod:`localstate.runtime.layout`): 0, the layout
    of a job never rescaled, until a rescale or a start from a savepoint moves the job's state to a
    new epoch; set by :func:`~localstate.runtime.layout.resolve_epoch`, never by the job file"""
    base_dir: Path | None = None
    """the absolute folder every relative path of the job is resolved against
    (:func:`~localstate.core.policy.job_folder` of the job file); None: the job was given without
    one (a dict without ``base_dir``), and relative paths are relative to the current directory"""

    @property
    def registry(self) -> Registry:
        return registry_for(self.policy)


def load_job_config(path: str | os.PathLike[str], *, plugins: str | os.PathLike[str] | None = None,
                    registry: Registry | None = None, collect: list[ConfigProblem] | None = None,
                    data: Mapping[str, Any] | None = None) -> JobConfig:
    """Read and validate a job file. ``plugins`` is the operator's policy file: it wins over the job's
    own. ``collect`` as in :func:`parse_job_config` (an unreadable file still raises). ``data``: the
    file's content as the caller already parsed it (``read_toml_file``), so it is not parsed twice."""
    path = Path(path)
    if data is None:
        data = read_toml_file(path, "job config")
    return parse_job_config(data, base_dir=job_folder(path), source=str(path), plugins=plugins, registry=registry,
                            collect=collect)


def job_policy(path: str | os.PathLike[str], *, plugins: str | os.PathLike[str] | None = None) -> PluginPolicy:
    """The plugin policy that governs the job file at ``path``, by the same precedence as
    :func:`load_job_config`, without validating (or loading plugins for) the rest of the job."""
    path = Path(path)
    job = read_toml_file(path, "job config").get("job", {})
    job_plugins = job.get("plugins") if isinstance(job, dict) else None
    if job_plugins is not None and not isinstance(job_plugins, str):
        raise ConfigError.at("job.plugins", "must be the name of a policy file next to the job file",
                             source=str(path))
    return PluginPolicy.discover(plugins, job_dir=job_folder(path), job_plugins=job_plugins)


def parse_job_config(data: Mapping[str, Any], *, base_dir: Path | None = None, source: str | None = None,
                     plugins: str | os.PathLike[str] | None = None, registry: Registry | None = None,
                     collect: list[ConfigProblem] | None = None) -> JobConfig:
    """Validate an already-parsed TOML document. See the module docstring for the format.

    With ``collect``, problems are appended to it instead of raised, and a best-effort JobConfig is
    returned (invalid stores left out, invalid scalars at their defaults) so that ``validate`` can go
    on checking inputs, outputs and the task in the same run.

    ``base_dir``: the job's folder (:func:`~localstate.core.policy.job_folder` of the job file), which
    every relative path of the job is resolved against and where its policy is looked up; None: the
    current directory, and no job folder policy."""
    job_dir = Path(base_dir) if base_dir is not None else None
    base_dir = Path(base_dir or Path.cwd())
    problems: list[ConfigProblem] = collect if collect is not None else []
    add = lambda path, message: problems.append(ConfigProblem(path, message))  # noqa: E731

    for section in sorted(set(data) - _SECTIONS):
        add(section, "unknown section" + did_you_mean(section, sorted(_SECTIONS)))

    job = _table(data, "job", add)
    for key in sorted(set(job) - _JOB_KEYS):
        add(f"job.{key}", "unknown key" + did_you_mean(key, sorted(_JOB_KEYS)))

    log_level = job.get("log_level")
    if log_level is not None:
        if not isinstance(log_level, str) or log_level.upper() not in LOG_LEVELS:
            add("job.log_level", f"must be one of {', '.join(LOG_LEVELS)}, got {log_level!r}"
                + (did_you_mean(log_level.upper(), LOG_LEVELS) if isinstance(log_level, str) else ""))
            log_level = None
        else:
            log_level = log_level.upper()

    # The policy decides which plugins the rest of validation may load. Precedence (core/policy.py):
    # operator (plugins= or a given registry, then $LOCALSTATE_PLUGINS) > job.plugins > plugins.toml
    # in the job's folder > default; a dict parsed without base_dir has no folder to look in.
    job_plugins = job.get("plugins")
    if job_plugins is not None and not isinstance(job_plugins, str):
        add("job.plugins", f"must be the path of a plugin policy file (a string), got {job_plugins!r}")
        job_plugins = None  # the problem above fails the config; nothing falls open
    elif job_plugins is not None:
        _path_problem("job.plugins", job_plugins, add)
    # Fail closed: until a policy is read, only the built-ins may load.
    policy = PluginPolicy(mode="allowlist")
    try:
        if registry is not None and not plugins:
            policy = registry.policy
        else:
            policy = PluginPolicy.discover(plugins, job_dir=job_dir, job_plugins=job_plugins)
    except ConfigError as exc:
        if not all(p.path.startswith("job.") for p in exc.problems):
            raise  # a broken policy file is its own error, reported against that file
        problems.extend(exc.problems)
    registry = registry or registry_for(policy)

    name = job.get("name")
    if name is None:
        add("job.name", "required")
    elif problem := name_problem(name, "job"):
        add("job.name", problem)
    partitions = job.get("partitions", 1)
    if not isinstance(partitions, int) or isinstance(partitions, bool) or not 1 <= partitions <= 100_000:
        add("job.partitions", f"must be an integer from 1 to 100000, got {partitions!r}")
        partitions = 1
    task = job.get("task")
    if task is None:
        add("job.task", "required: the task class as 'module:Class'")
    elif not isinstance(task, str) or task.count(":") != 1 or not all(task.split(":")):
        add("job.task", f"must be 'module:Class', got {task!r}")
    commit_interval = _duration(job, "commit_interval", 5.0, add)
    window_interval = _duration(job, "window_interval", None, add)
    commit_every = job.get("commit_every")
    if commit_every is not None and (not isinstance(commit_every, int) or isinstance(commit_every, bool)
                                     or commit_every < 1):
        add("job.commit_every", f"must be a positive integer (records between commits), got {commit_every!r}")
        commit_every = None
    pipelined_commits = job.get("pipelined_commits", True)
    if not isinstance(pipelined_commits, bool):
        add("job.pipelined_commits", f"must be true or false (pipeline in-process commits when the changelog "
                                     f"writes in the background), got {pipelined_commits!r}")
        pipelined_commits = True
    allow_pickle = job.get("allow_pickle", False)
    if not isinstance(allow_pickle, bool):
        add("job.allow_pickle", "must be true or false")
        allow_pickle = False
    state_dir = job.get("state_dir", "state")
    if not isinstance(state_dir, str) or not state_dir:
        add("job.state_dir", "must be a directory path")
        state_dir = "state"
    elif _path_problem("job.state_dir", state_dir, add):
        state_dir = "state"
    local_dir = _local_dir(job.get("local_dir"), add)
    metrics_port, metrics_host = _metrics(job, add)
    pythonpath: list[str] = []
    try:
        pythonpath = _pythonpath(job.get("pythonpath", []))
    except ValueError as exc:
        add("job.pythonpath", str(exc))

    changelog_system = job.get("changelog", "file")
    changelog_options: dict[str, dict[str, Any]] = {}
    raw_changelogs = _table(data, "changelogs", add)
    systems_used = {changelog_system} | set(raw_changelogs)
    if not isinstance(changelog_system, str):
        add("job.changelog", "must be the name of a changelog system")
        systems_used.discard(changelog_system)
    for system in sorted(systems_used):
        raw = raw_changelogs.get(system, {})
        path = f"changelogs.{system}" if system in raw_changelogs else "job.changelog"
        if not isinstance(raw, dict):
            add(f"changelogs.{system}", f"must be a table of the changelog system's options, got {raw!r}")
            continue
        try:
            changelog_options[system] = registry.changelog_system(system).validate(raw, f"changelogs.{system}")
        except ConfigError as exc:
            problems.extend(exc.problems)
        except LocalStateError as exc:
            add(path, exc.message)

    _check_state_layout(name, changelog_options, add)

    stores: dict[str, StoreConfig] = {}
    for store_name, table in _table(data, "stores", add).items():
        store = _store(store_name, table, name, allow_pickle, registry, add, problems)
        if store is not None:
            stores[store_name] = store

    if TIMER_STORE in stores:
        add(f"stores.{TIMER_STORE}", f"store name {TIMER_STORE!r} is reserved for the job's timers ([time] "
                                     "timers = true); rename the store")
    time_config = _time(data, name, allow_pickle, registry, stores, add, problems)

    _shared_changelogs(stores, add)

    inputs = _streams(data, "inputs", add)
    outputs = _streams(data, "outputs", add)
    spark = _table(data, "spark", add)

    if problems and collect is None:
        raise ConfigError(problems, source=source)
    if collect is not None:  # best effort: placeholders where the value itself was the problem
        name = name if isinstance(name, str) and name_problem(name, "job") is None else "unnamed"
        task = task if isinstance(task, str) else ""
        changelog_system = changelog_system if isinstance(changelog_system, str) else "file"
    return JobConfig(
        name=name, partitions=partitions, task=task, state_dir=(base_dir / state_dir).resolve(), local_dir=local_dir,
        changelog_system=changelog_system, changelog_options=changelog_options, commit_interval=commit_interval,
        commit_every=commit_every, pipelined_commits=pipelined_commits, window_interval=window_interval,
        allow_pickle=allow_pickle, inputs=inputs, outputs=outputs, stores=stores, spark=spark,
        pythonpath=tuple(pythonpath), time=time_config,
        policy=policy,
        source=source, log_level=log_level, metrics_port=metrics_port, metrics_host=metrics_host,
        base_dir=job_dir.absolute().resolve() if job_dir is not None else None)


def apply_log_level(job: JobConfig) -> None:
    """Apply ``job.log_level`` to the ``localstate`` loggers (and give them a stderr handler when
    nothing else configured logging), so the setting has an effect. No-op when unset."""
    if job.log_level is None:
        return
    logger = logging.getLogger("localstate")
    logger.setLevel(job.log_level)
    if not logging.getLogger().handlers and not logger.handlers:
        handler = logging.StreamHandler()
        handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
        logger.addHandler(handler)


def _metrics(job: Mapping[str, Any], add) -> tuple[int | None, str]:  # noqa: ANN001
    """``job.metrics_port`` (an integer 1..65535, or unset: no endpoint) and ``job.metrics_host`` (a
    host name or address, default 127.0.0.1)."""
    port = job.get("metrics_port")
    if port is not None and (not isinstance(port, int) or isinstance(port, bool) or not 1 <= port <= 65535):
        add("job.metrics_port", f"must be a TCP port from 1 to 65535 (the driver's Prometheus endpoint), got {port!r}")
        port = None
    host = job.get("metrics_host", "127.0.0.1")
    if not isinstance(host, str) or not host.strip() or any(ord(ch) < 0x21 for ch in host):
        add("job.metrics_host", f"must be a host name or address to bind the metrics endpoint to, got {host!r}")
        host = "127.0.0.1"
    return port, host


def _local_dir(value: Any, add) -> str | None:  # noqa: ANN001
    """``job.local_dir``: an absolute path, possibly starting with an environment variable that each
    host expands (``${SPARK_LOCAL_DIRS}``-style, e.g. set per host in spark-env.sh); None if unset."""
    if value is None:
        return None
    if not isinstance(value, str) or not value:
        add("job.local_dir", "must be a directory path on each executor host")
        return None
    if _path_problem("job.local_dir", value, add):
        return None
    if not (os.path.isabs(value) or value.startswith("$")):
        add("job.local_dir", f"must be an absolute path (it is resolved on every executor host), got {value!r}")
        return None
    return value


def _path_problem(key: str, value: str, add) -> bool:  # noqa: ANN001
    """Report an unusable path (NUL, control characters, too long) at ``key``; True if reported."""
    try:
        parse_path(value)
    except ValueError as exc:
        add(key, str(exc))
        return True
    return False


def _time(data: Mapping[str, Any], job_name: Any, allow_pickle: bool, registry: Registry,  # noqa: PLR0913
          stores: dict[str, StoreConfig], add, problems: list[ConfigProblem]) -> TimeConfig:  # noqa: ANN001
    """The validated ``[time]`` table; with ``timers = true`` the timer store is added to ``stores``
    as :data:`TIMER_STORE` (a kv store of raw bytes, logged)."""
    raw = _table(data, "time", add)
    try:
        checked = validate_options(TIME_OPTIONS, raw, "time")
    except ConfigError as exc:
        problems.extend(exc.problems)
        return TimeConfig()
    serde = checked["timer_key_serde"]
    try:
        registry.serde(serde, allow_pickle=allow_pickle)
    except ValueError as exc:
        add("time.timer_key_serde", str(exc))
    except LocalStateError as exc:
        add("time.timer_key_serde", exc.message + (f" ({exc.hint})" if exc.hint else ""))
    config = TimeConfig(checked["allowed_lateness"], checked["timers"], serde, checked["past_timers"],
                        checked["timer_rescale"])
    if not config.timers:
        for key in ("timer_backend", "timer_changelog", "timer_key_serde", "past_timers", "timer_rescale"):
            if key in raw:
                add(f"time.{key}", "applies to timers only: set timers = true in [time] (or remove this key)")
        return config
    changelog = checked["timer_changelog"]
    if changelog is None:
        changelog = f"{job_name}-timers-changelog" if name_problem(job_name, "job") is None else "unnamed"
    elif problem := name_problem(changelog, "changelog stream"):
        add("time.timer_changelog", problem)
        return config
    # Timers are written and scanned, never read by key: no object cache. Their keys lead with the
    # timestamp, so a spill lands all over the store; a B-tree (LMDB copies each page it touches)
    # rewrites most of its pages per spill however few keys it holds: spill less often. A pending
    # timer is a ~30-byte key and an empty value, so the bound stays some megabytes.
    options: dict[str, Any] = {"cache_size": 0, "write_batch_size": TIMER_WRITE_BATCH}
    if checked["timer_backend"] is not None:
        options["backend"] = checked["timer_backend"]
    try:
        validated = registry.engine_factory("kv").validate_options(TIMER_STORE, options)
    except ConfigError as exc:
        # The kv engine names the store's option; say which [time] key sets it.
        problems.extend(ConfigProblem("time.timer_backend", p.message) for p in exc.problems)
        return config
    except LocalStateError as exc:
        add("time.timers", exc.message + (f" ({exc.hint})" if exc.hint else ""))
        return config
    stores[TIMER_STORE] = StoreConfig(TIMER_STORE, "kv", validated, changelog, "bytes", "bytes")
    return config


def _check_state_layout(name: Any, changelog_options: Mapping[str, Mapping[str, Any]], add) -> None:  # noqa: ANN001
    """The job's directory and the file changelog's directory inside the state dir must differ: a job
    named like the changelog directory would own, and its ``reset`` delete, every job's changelogs."""
    path = changelog_options.get("file", {}).get("path")
    if not isinstance(name, str) or not isinstance(path, str) or Path(path).is_absolute():
        return
    parts = Path(path).parts
    if parts and parts[0] == name:
        add("job.name", f"job name {name!r} is the file changelog's directory ([changelogs.file] path = "
                        f"{path!r}) in the state directory; rename the job or move the changelogs")


def _shared_changelogs(stores: Mapping[str, StoreConfig], add) -> None:  # noqa: ANN001
    """Each logged store needs a changelog stream of its own: a changelog partition has one writer
    (two stores on one stream would fail the run with "already open for writing", and could only
    restore each other's records). Reported at every sharing store's ``changelog``."""
    owners: dict[str, list[str]] = {}
    for store in stores.values():
        if store.changelog is not None:
            owners.setdefault(store.changelog, []).append(store.name)
    for stream, names in sorted(owners.items()):
        for name in names if len(names) > 1 else ():
            others = ", ".join(repr(other) for other in names if other != name)
            add(f"stores.{name}.changelog", f"changelog stream {stream!r} is also the changelog of store {others}: "
                                            "each store needs its own (name another with changelog = \"...\")")


def _table(data: Mapping[str, Any], key: str, add) -> dict[str, Any]:  # noqa: ANN001
    value = data.get(key, {})
    if not isinstance(value, dict):
        add(key, "must be a table")
        return {}
    return value


def _duration(job: Mapping[str, Any], key: str, default: float | None, add) -> float | None:  # noqa: ANN001
    if key not in job:
        return default
    try:
        return parse_duration(job[key])
    except ValueError as exc:
        add(f"job.{key}", str(exc))
        return default


def _store(store_name: str, table: Any, job_name: Any, allow_pickle: bool, registry: Registry, add,  # noqa: ANN001
           problems: list[ConfigProblem]) -> StoreConfig | None:
    path = f"stores.{store_name}"
    if problem := name_problem(store_name, "store"):
        add(path, problem)
        return None
    if not isinstance(table, dict):
        add(path, "must be a table")
        return None
    ok = True
    engine = table.get("engine")
    if not isinstance(engine, str):
        add(f"{path}.engine", "required: the engine plugin name, e.g. 'kv'")
        ok = False
    # A default derived from an invalid job name is not reported again: the job name already is.
    default_changelog = f"{job_name}-{store_name}-changelog" if name_problem(job_name, "job") is None else "unnamed"
    changelog = table.get("changelog", default_changelog)
    if changelog is False:
        changelog = None
    elif changelog is True:
        changelog = default_changelog
    elif isinstance(changelog, str):
        if problem := name_problem(changelog, "changelog stream"):
            add(f"{path}.changelog", problem)
            ok = False
    else:
        add(f"{path}.changelog", "must be a stream name or false")
        ok = False
    serdes, loaded = {}, {}
    for key in ("key_serde", "value_serde"):
        serde = table.get(key, "bytes")
        try:
            loaded[key] = registry.serde(serde, allow_pickle=allow_pickle) if isinstance(serde, str) else None
            if not isinstance(serde, str):
                raise ValueError("must be a serde name such as 'string', 'int' or 'json'")
        except ValueError as exc:
            add(f"{path}.{key}", str(exc))
            ok = False
        except LocalStateError as exc:
            add(f"{path}.{key}", exc.message + (f" ({exc.hint})" if exc.hint else ""))
            ok = False
        serdes[key] = serde
    options: dict[str, Any] = {}
    if isinstance(engine, str):
        raw_options = {k: v for k, v in table.items() if k not in _STORE_KEYS}
        try:
            factory = registry.engine_factory(engine)
            options = factory.validate_options(store_name, raw_options)
        except ConfigError as exc:
            problems.extend(exc.problems)
            ok = False
        except LocalStateError as exc:
            add(f"{path}.engine", exc.message + (f" ({exc.hint})" if exc.hint else ""))
            ok = False
        else:
            uses = factory.serdes(options)
            for key, use in (("key_serde", uses.key), ("value_serde", uses.value)):
                problem = serde_problem(engine, options, key[:-6], use, loaded.get(key), set_here=key in table)
                if problem is not None:
                    add(f"{path}.{key}", problem)
                    ok = False
    rescale, rescale_merge = _rescale_keys(path, table, add)
    if not ok or rescale is None:
        return None
    return StoreConfig(store_name, engine, options, changelog, serdes["key_serde"], serdes["value_serde"],
                       rescale, rescale_merge)


def _is_function(value: Any) -> bool:
    """Whether ``value`` reads as ``module:function``."""
    return isinstance(value, str) and value.count(":") == 1 and all(value.split(":"))


def _rescale_keys(path: str, table: Mapping[str, Any], add) -> tuple[str | None, str | None]:  # noqa: ANN001
    """A store's ``rescale`` and ``rescale_merge`` (None, None when reported)."""
    rescale = table.get("rescale", "key")
    merge = table.get("rescale_merge")
    if not (rescale in RESCALE_POLICIES or _is_function(rescale)):
        add(f"{path}.rescale", f"must be one of {', '.join(RESCALE_POLICIES)} or a routing function "
                               f"'module:function', got {rescale!r}")
        return None, None
    if merge is not None and not _is_function(merge):
        add(f"{path}.rescale_merge", f"must be a merge function 'module:function', got {merge!r}")
        return None, None
    if merge is not None and rescale not in ("all", "one"):
        add(f"{path}.rescale_merge", 'applies to rescale = "all" or "one" (values of one key merged from '
                                     'several partitions)')
        return None, None
    return rescale, merge


def _streams(data: Mapping[str, Any], section: str, add) -> dict[str, StreamConfig]:  # noqa: ANN001
    streams = {}
    for stream_name, table in _table(data, section, add).items():
        path = f"{section}.{stream_name}"
        if problem := name_problem(stream_name, "stream"):
            add(path, problem)
            continue
        if not isinstance(table, dict) or not isinstance(table.get("system"), str):
            add(f"{path}.system", "required: the stream system, e.g. 'jsonl', 'file', 'generator' or 'kafka'")
            continue
        streams[stream_name] = StreamConfig(stream_name, table["system"],
                                            {k: v for k, v in table.items() if k != "system"})
    return streams
