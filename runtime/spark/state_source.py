"""The state reader: ``spark.read.format("localstate")``, a PySpark Python data source that returns a
job's committed state, its checkpoints and its changelogs as DataFrames (Spark 4's ``statestore``
source, for localstate jobs).

Guarantees:

* **committed state only**: a store partition's rows are its changelog replayed up to the offset its
  checkpoint records (last record per key, tombstones dropped; :func:`~localstate.runtime.driver.views.committed_contents`,
  the same replay as ``localstate inspect --from-changelog``). Records flushed after the checkpoint
  (a crash between the changelog flush and the checkpoint) are not read. Local stores are never
  read: they may be ahead of the commit, and they live on another host's disk;
* **a consistent cut**: every partition's checkpoint is read once, on the driver, when the DataFrame
  is planned; the Spark tasks read only changelogs, up to those offsets;
* **read-only**: like ``inspect``, nothing is written, created, locked, truncated or deleted
  (changelogs are opened with the system's read-only ``reader()``);
* **parallel**: one Spark partition per job partition (the checkpoints view: one row each).

The options are parsed by :class:`ReadOptions` (typed :class:`~localstate.errors.ConfigError` for an
unknown option or value), the rows made by one :class:`View` per ``view`` option.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, ClassVar, Iterator, Mapping

from pyspark.sql.datasource import DataSource, DataSourceReader, InputPartition

from localstate.core.checkpoint import Checkpoint
from localstate.core.config import JobConfig, StoreConfig, load_job_config
from localstate.core.engine import SerdeColumn, StateColumns
from localstate.runtime.driver.views import (changelog_partitions, changelog_records, checkpoint_manifest,
                                     committed_contents, live_filter, load_checkpoints, require_state, serde_column,
                                     store_config, store_serdes, value_splitter, NATIVE_TYPES)
from localstate.core.options import did_you_mean
from localstate.runtime.layout import resolve_epoch
from localstate.errors import ConfigError, SerdeError, StateNotFoundError
from localstate.runtime.spark.state_writer import BootstrapWriter, WriteOptions
from localstate.runtime.statedata.location import SavepointLocation, storage_options
from localstate.runtime.statedata.reader import Savepoint

__all__ = ["StateDataSource", "ReadOptions", "View", "StateView", "ChangeFeedView", "CheckpointsView",
           "ChangelogView", "SOURCE_NAME", "column_types", "load_view", "state_columns"]

SOURCE_NAME = "localstate"



# -- options -----------------------------------------------------------------------------------------

@dataclass(frozen=True)
class ReadOptions:
    """The reader's options, checked. Spark passes option names case-insensitively."""

    job: str
    store: str | None = None
    view: str = "state"
    raw: bool = False
    read_change_feed: bool = False
    start_offset: int = 0
    end_offset: int | str | None = None
    """None: each partition's committed offset; "end": the changelog's end (uncommitted records too)"""
    checkpoint_dir: str | None = None
    batch_id: int | None = None
    plugins: str | None = None
    savepoint: str | None = None
    """a savepoint (folder or URL) read like a live job: the state and checkpoints views"""
    endpoint: str | None = None
    region: str | None = None

    NAMES: ClassVar[dict[str, str]] = {
        "job": "job", "path": "job", "store": "store", "storename": "store", "view": "view", "raw": "raw",
        "readchangefeed": "read_change_feed", "startoffset": "start_offset", "endoffset": "end_offset",
        "checkpointdir": "checkpoint_dir", "batchid": "batch_id", "plugins": "plugins", "savepoint": "savepoint",
        "endpoint": "endpoint", "region": "region"}
    SHOWN: ClassVar[tuple[str, ...]] = ("job", "store", "view", "raw", "readChangeFeed", "startOffset", "endOffset",
                                        "checkpointDir", "batchId", "plugins", "savepoint", "endpoint", "region")
    VIEWS: ClassVar[tuple[str, ...]] = ("state", "checkpoints", "changelog")

    @classmethod
    def parse(cls, options: Mapping[str, str]) -> "ReadOptions":
        values: dict[str, Any] = {}
        for name, value in options.items():
            attribute = cls.NAMES.get(name.lower())
            if attribute is None:
                raise ConfigError.at(f"option {name!r}",
                                     f"unknown option of the localstate reader{_suggest(name, cls.SHOWN)}",
                                     hint=f"options: {', '.join(cls.SHOWN)} (docs/state-reader.md)")
            values[attribute] = value
        if not values.get("job") and not values.get("savepoint"):
            raise ConfigError.at("option 'job'", "the localstate reader needs the job file (or a savepoint)",
                                 hint='.option("job", "path/to/job.toml") (or .load("path/to/job.toml")), or '
                                      '.option("savepoint", "path/or/url")')
        view = str(values.get("view", "state")).lower()
        if view not in cls.VIEWS:
            raise ConfigError.at("option 'view'", f"unknown view {values['view']!r}{_suggest(view, cls.VIEWS)}",
                                 hint=f"views: {', '.join(cls.VIEWS)}")
        parsed = cls(job=str(values.get("job") or ""), store=values.get("store") or None, view=view,
                     raw=_flag(values, "raw"), read_change_feed=_flag(values, "read_change_feed"),
                     start_offset=_offset(values, "start_offset", 0),
                     end_offset=("end" if str(values.get("end_offset", "")).lower() == "end"
                                 else _offset(values, "end_offset", None)),
                     checkpoint_dir=values.get("checkpoint_dir") or None, batch_id=_offset(values, "batch_id", None),
                     plugins=values.get("plugins") or None, savepoint=values.get("savepoint") or None,
                     endpoint=values.get("endpoint") or None, region=values.get("region") or None)
        parsed._check_combinations()
        return parsed

    def _check_combinations(self) -> None:
        if self.view == "state" and self.store is None:
            raise ConfigError.at("option 'store'", "the state view reads one store",
                                 hint='.option("store", "<name>"); .option("view", "checkpoints") or "changelog" '
                                      "needs none")
        if self.view == "checkpoints" and self.store is not None:
            raise ConfigError.at("option 'store'", "the checkpoints view covers every store",
                                 hint="drop .option(\"store\", ...); the changelogs column maps store -> offset")
        if self.read_change_feed and self.view != "changelog":
            raise ConfigError.at("option 'readChangeFeed'", "the change feed is part of the changelog view",
                                 hint='.option("view", "changelog").option("readChangeFeed", "true")')
        if self.read_change_feed and self.store is None:
            raise ConfigError.at("option 'store'", "the change feed reads one store's changelog",
                                 hint='.option("store", "<name>")')
        if not self.read_change_feed and (self.start_offset or self.end_offset is not None):
            raise ConfigError.at("option 'startOffset'/'endOffset'", "offsets select change feed records",
                                 hint='add .option("view", "changelog").option("readChangeFeed", "true")')
        if self.raw and not (self.view == "state" or self.read_change_feed):
            raise ConfigError.at("option 'raw'", f"the {self.view} view has no keys or values",
                                 hint='raw applies to the state view and the change feed')
        if self.savepoint is not None and (self.view == "changelog" or self.checkpoint_dir or self.batch_id is not None):
            raise ConfigError.at("option 'savepoint'", "a savepoint has the state and checkpoints views only (no "
                                 "changelogs, no other cut)", hint='drop view "changelog", checkpointDir and batchId')

    def absolute(self) -> "ReadOptions":
        """These options with their paths made absolute (against this process's working directory):
        Spark reads them in its Python workers, whose working directory may differ."""
        def resolve(path: str | None) -> str | None:
            return None if path is None else str(Path(path).expanduser().resolve())
        savepoint = self.savepoint if self.savepoint is None or "://" in self.savepoint else resolve(self.savepoint)
        return replace(self, job=(resolve(self.job) or self.job) if self.job else "",
                       checkpoint_dir=resolve(self.checkpoint_dir), plugins=resolve(self.plugins), savepoint=savepoint)

    def as_options(self) -> dict[str, str]:
        """These options as Spark's ``.options(**...)`` takes them."""
        out = {"view": self.view, **({"job": self.job} if self.job else {})}
        for attribute, name in (("store", "store"), ("checkpoint_dir", "checkpointDir"), ("plugins", "plugins"),
                                ("batch_id", "batchId"), ("end_offset", "endOffset"), ("savepoint", "savepoint"),
                                ("endpoint", "endpoint"), ("region", "region")):
            if getattr(self, attribute) is not None:
                out[name] = str(getattr(self, attribute))
        if self.raw:
            out["raw"] = "true"
        if self.read_change_feed:
            out["readChangeFeed"] = "true"
        if self.start_offset:
            out["startOffset"] = str(self.start_offset)
        return out


def _suggest(name: str, known: tuple[str, ...]) -> str:
    lowered = {k.lower(): k for k in known}
    hint = did_you_mean(name.lower(), list(lowered))
    for low, shown in lowered.items():
        hint = hint.replace(repr(low), repr(shown))
    return hint


def _flag(values: Mapping[str, Any], attribute: str) -> bool:
    text = str(values.get(attribute, "false")).strip().lower()
    if text not in ("true", "false"):
        raise ConfigError.at(f"option {_shown(attribute)!r}", f"expected true or false, got {values[attribute]!r}")
    return text == "true"


def _offset(values: Mapping[str, Any], attribute: str, default: int | None) -> int | None:
    if attribute not in values:
        return default
    try:
        number = int(str(values[attribute]).strip())
    except ValueError:
        number = -1
    if number < 0:
        raise ConfigError.at(f"option {_shown(attribute)!r}",
                             f"expected a non-negative integer, got {values[attribute]!r}",
                             hint="offsets and batch ids count from 0" + (
                                 '; "end" reads to the changelog\'s end' if attribute == "end_offset" else ""))
    return number


def _shown(attribute: str) -> str:
    head, *rest = attribute.split("_")
    return head + "".join(part.title() for part in rest)


# -- what the driver resolves once -------------------------------------------------------------------

@dataclass(frozen=True)
class Resolved:
    """The job, its checkpoints as of planning (the cut every Spark task reads at) and the options."""

    job: JobConfig
    options: ReadOptions
    checkpoints: dict[int, Checkpoint | None] = field(default_factory=dict)
    savepoint: dict[str, Any] | None = None
    """the savepoint read (``savepoint`` option): how to open its location again in a Spark task"""

    @property
    def store(self) -> StoreConfig:
        assert self.options.store is not None
        return self.job.stores[self.options.store]


def load_view(options: ReadOptions) -> tuple["View", Resolved]:
    """Load the job, check the store and read the checkpoints: every user error is raised here, on
    the driver, before a Spark task runs."""
    if options.savepoint is not None:
        return _savepoint_view(options)
    job = resolve_epoch(load_job_config(options.job, plugins=options.plugins))
    if options.store is not None:
        config = store_config(job, options.store)
        if config.changelog is None:
            raise StateNotFoundError(f"store {options.store!r} is not logged (changelog = false): it has no "
                                     "committed durable state to read", store=options.store,
                                     hint="set changelog = true on the store; local-only stores are seen with "
                                          "`localstate inspect --store` on their host")
    checkpoints = require_state(job)
    if options.checkpoint_dir is not None:
        checkpoints = _checkpoints_in(job, Path(options.checkpoint_dir))
    if options.batch_id is not None:
        _check_batch(checkpoints, options)
    resolved = Resolved(job, options, checkpoints)
    view: View
    if options.view == "checkpoints":
        view = CheckpointsView(resolved)
    elif options.view == "changelog":
        view = ChangeFeedView(resolved) if options.read_change_feed else ChangelogView(resolved)
    else:
        view = StateView(resolved)
    return view, resolved


def _savepoint_view(options: ReadOptions) -> tuple["View", Resolved]:
    """A savepoint read like a live job: checked whole on the driver, its stores as its job configured
    them, its checkpoints the cut."""
    assert options.savepoint is not None
    location = SavepointLocation(storage_options(options.savepoint, endpoint=options.endpoint, region=options.region))
    savepoint = Savepoint.open(location)
    job = savepoint.job_config(plugins=options.plugins)
    if options.store is not None:
        store_config(job, options.store)
    resolved = Resolved(job, options, dict(savepoint.manifest.checkpoints), savepoint=location.spec)
    return (CheckpointsView(resolved) if options.view == "checkpoints" else StateView(resolved)), resolved


def _checkpoints_in(job: JobConfig, directory: Path) -> dict[int, Checkpoint | None]:
    """Checkpoints from a copy of the job's ``checkpoints`` directory (``<partition>.json``)."""
    if not directory.is_dir():
        raise StateNotFoundError(f"checkpoint directory {directory} does not exist", path=str(directory),
                                 hint="point checkpointDir at a copy of <state_dir>/<job>/checkpoints")
    found = load_checkpoints(job, directory)
    if not any(found.values()):
        raise StateNotFoundError(f"no checkpoint of job {job.name!r} in {directory}", path=str(directory),
                                 hint="checkpointDir holds <partition>.json files (a copy of the job's checkpoints)")
    return found


def _check_batch(checkpoints: Mapping[int, Checkpoint | None], options: ReadOptions) -> None:
    """``batchId``: the checkpoints read must be the state as of that Spark micro-batch, i.e. the last
    batch any partition applied is that one (a partition at an older batch got no rows since)."""
    applied = [b for c in checkpoints.values() if (b := c.batch) is not None]
    last = max(applied, default=None)
    if last != options.batch_id:
        where = f"the checkpoints in {options.checkpoint_dir}" if options.checkpoint_dir else "the job's checkpoints"
        state = "no DataFrame batch" if last is None else f"batch {last}"
        raise StateNotFoundError(f"{where} hold the state after {state}, not after batch {options.batch_id}",
                                 batch=options.batch_id,
                                 hint="localstate keeps the last checkpoint of each partition; to read an older "
                                      "batch, copy the checkpoints directory after it and pass it as checkpointDir")


# -- views -------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class Slice(InputPartition):
    """One Spark partition: a job partition and its checkpoint as of planning."""

    partition: int
    checkpoint: Checkpoint | None


class View(ABC):
    """One ``view``: its schema, and the rows of one Spark partition. Runs on the driver (schema,
    slices) and, pickled, in the Spark tasks (rows)."""

    def __init__(self, resolved: Resolved) -> None:
        self.resolved = resolved

    @abstractmethod
    def schema(self) -> str:
        """The DataFrame's schema as a DDL string."""

    def slices(self) -> list[Slice]:
        """One per job partition, each with its checkpoint (the cut the tasks read at)."""
        return [Slice(p, self.resolved.checkpoints.get(p)) for p in range(self.resolved.job.partitions)]

    @abstractmethod
    def rows(self, piece: Slice) -> Iterator[tuple]:
        """The rows of one job partition."""


def column_types(config: StoreConfig) -> tuple[str, str]:
    """Spark types of a store's ``key`` and ``value`` columns (see docs/state-reader.md)."""
    if config.engine != "kv":
        return "string", "string"
    return NATIVE_TYPES.get(config.key_serde, "string"), NATIVE_TYPES.get(config.value_serde, "string")


def _with_where(column: SerdeColumn) -> Any:
    """``column.decode`` taking the record's place too (``{"partition": p, "offset": o}``), added to a
    SerdeError's context."""
    def decode(data: bytes, where: dict[str, Any]) -> Any:
        try:
            return column.decode(data)
        except SerdeError as exc:
            exc.context.update(where)
            exc.args = (exc._render(),)
            raise
    return decode


class _Decoding:
    """Decodes a store's key and value bytes into its columns: native for int/string/bytes serdes of a
    kv store (a value the serde refuses is a SerdeError naming the record), JSON text otherwise
    (bytes that are not JSON: ``{"hex": ...}``)."""

    def __init__(self, resolved: Resolved) -> None:
        config = resolved.store
        self.store = config.name
        self.key_type, self.value_type = column_types(config)
        key_serde, value_serde = store_serdes(resolved.job, config)
        native = config.engine == "kv"
        self.key = _with_where(serde_column(key_serde, config.key_serde if native else None, config.name))
        self.value = _with_where(serde_column(value_serde, config.value_serde if native else None, config.name))


def state_columns(job: JobConfig, config: StoreConfig) -> StateColumns | None:
    """The typed columns the store's engine offers for its committed contents
    (:meth:`~localstate.core.engine.StorageEngineFactory.state_columns`: heap, sketch and search do),
    its key and value decoded as for a kv store (native ``int``/``string``/``bytes``, else JSON
    text); None: the engine offers none (kv stores, and third-party engines without them)."""
    registry = job.registry
    factory = registry.engine_factory(config.engine)
    serdes = []
    for name in (config.key_serde, config.value_serde):
        try:
            serdes.append(registry.serde(name, allow_pickle=job.allow_pickle))
        except Exception:  # noqa: BLE001 - a refused serde (pickle without allow_pickle): JSON of the bytes
            serdes.append(None)
    key = serde_column(serdes[0], config.key_serde, config.name)
    value = serde_column(serdes[1], config.value_serde, config.name)
    return factory.state_columns(config.name, dict(config.options), key, value)


class StateView(View):
    """``view = "state"``: the store's committed contents: the engine's typed columns where it offers
    them (:func:`state_columns`), else one row per live key."""

    def __init__(self, resolved: Resolved) -> None:
        super().__init__(resolved)
        raw = resolved.options.raw
        self.columns = None if raw else state_columns(resolved.job, resolved.store)
        self.decoding = None if raw or self.columns is not None else _Decoding(resolved)

    def schema(self) -> str:
        if self.columns is not None:
            return f"partition int, {self.columns.schema}"
        if self.decoding is None:
            return "partition int, key_bytes binary, value_bytes binary"
        return f"partition int, key {self.decoding.key_type}, value {self.decoding.value_type}"

    def rows(self, piece: Slice) -> Iterator[tuple]:
        entries = self._entries(piece)
        if self.columns is not None:
            try:
                for row in self.columns.rows(entries):
                    yield (piece.partition, *row)
            except SerdeError as exc:
                exc.context.setdefault("partition", piece.partition)
                exc.args = (exc._render(),)
                raise
            return
        if self.decoding is None:
            for key, value in entries:
                yield piece.partition, key, value
            return
        where = {"partition": piece.partition}
        decode_key, decode_value = self.decoding.key, self.decoding.value
        for key, value in entries:
            yield piece.partition, decode_key(key, where), decode_value(value, where)


    def _entries(self, piece: Slice) -> list[tuple[bytes, bytes]]:
        """The store partition's committed entries: from its changelog, or from the savepoint read."""
        resolved = self.resolved
        if resolved.savepoint is None:
            return committed_contents(resolved.job, resolved.store, piece.partition, piece.checkpoint)
        savepoint = Savepoint.open(SavepointLocation(resolved.savepoint), verify=False)  # checked when planned
        entries = savepoint.entries(resolved.store.name, piece.partition)
        live = live_filter(resolved.job, resolved.store, piece.checkpoint)
        return entries if live is None else list(live(entries))


class ChangeFeedView(View):
    """``view = "changelog"`` with ``readChangeFeed``: the store's changelog records between two
    offsets, each marked committed (below the checkpointed offset) or not."""

    def __init__(self, resolved: Resolved) -> None:
        super().__init__(resolved)
        self.decoding = None if resolved.options.raw else _Decoding(resolved)
        # a ttl store's values carry their expiry: decoded without it (raw shows the stored bytes)
        self.split = None if self.decoding is None else value_splitter(resolved.job, resolved.store)

    def schema(self) -> str:
        if self.decoding is None:
            kv = "key_bytes binary, value_bytes binary"
        else:
            kv = f"key {self.decoding.key_type}, value {self.decoding.value_type}"
        return f"partition int, offset bigint, {kv}, tombstone boolean, committed boolean"

    def rows(self, piece: Slice) -> Iterator[tuple]:
        options, config = self.resolved.options, self.resolved.store
        committed = piece.checkpoint.changelogs.get(config.name, 0) if piece.checkpoint is not None else 0
        end = committed if options.end_offset is None else (None if options.end_offset == "end" else options.end_offset)
        assert config.changelog is not None
        for record in changelog_records(self.resolved.job, config.changelog, piece.partition, options.start_offset,
                                        end, checkpoint_manifest(piece.checkpoint, config.name)):
            tombstone = record.value is None
            if self.decoding is None:
                key, value = record.key, record.value
            else:
                where = {"partition": piece.partition, "offset": record.offset}
                key = self.decoding.key(record.key, where)
                data = record.value if tombstone or self.split is None else self.split(record.value)[0]
                value = None if tombstone else self.decoding.value(data, where)
            yield piece.partition, record.offset, key, value, tombstone, record.offset < committed


class CheckpointsView(View):
    """``view = "checkpoints"``: each job partition's checkpoint (null fields: never committed)."""

    def schema(self) -> str:
        return ("partition int, committed boolean, generation bigint, batch_id bigint, inputs map<string,bigint>, "
                "changelogs map<string,bigint>, outputs map<string,bigint>")

    def rows(self, piece: Slice) -> Iterator[tuple]:
        c = piece.checkpoint
        if c is None:
            yield piece.partition, False, None, None, None, None, None
            return
        yield (piece.partition, True, c.generation, c.batch, dict(c.inputs), dict(c.changelogs),
               dict(c.outputs))


class ChangelogView(View):
    """``view = "changelog"``: per logged store (or the one ``store``) and partition, where its
    changelog is, its offsets against the checkpointed one, and its segment files."""

    def schema(self) -> str:
        return ("store string, stream string, partition int, location string, exists boolean, "
                "start_offset bigint, end_offset bigint, committed_offset bigint, uncommitted boolean, "
                "segments array<struct<name:string,bytes:bigint>>, bytes bigint")

    def rows(self, piece: Slice) -> Iterator[tuple]:
        job, options = self.resolved.job, self.resolved.options
        names = [options.store] if options.store is not None else sorted(job.stores)
        for name in names:
            config = job.stores[name]
            if config.changelog is None:
                continue
            [info] = changelog_partitions(job, config.changelog, config, {piece.partition: piece.checkpoint},
                                          [piece.partition])
            committed = info.checkpoint_offset or 0
            location = str(info.directory) if info.directory is not None else job.changelog_system
            yield (name, info.stream, info.partition, location, info.exists, info.start, info.end, committed,
                   info.end > committed, [(s.name, s.bytes) for s in info.segments] if info.directory else None,
                   sum(s.bytes for s in info.segments) if info.directory else None)


# -- the Spark data source ---------------------------------------------------------------------------

class StateDataSource(DataSource):
    """``spark.read.format("localstate")``: see the module docstring and docs/state-reader.md."""

    @classmethod
    def name(cls) -> str:
        return SOURCE_NAME

    def __init__(self, options: Mapping[str, str]) -> None:
        super().__init__(options)  # type: ignore[arg-type]
        self._view: View | None = None

    def view(self) -> View:
        if self._view is None:
            self._view, _ = load_view(ReadOptions.parse(dict(self.options)))
        return self._view

    def schema(self) -> str:
        return self.view().schema()

    def reader(self, schema: Any) -> DataSourceReader:
        return StateReader(self.view())

    def writer(self, schema: Any, overwrite: bool) -> Any:
        """``df.write.format("localstate")``: a bootstrap (:mod:`localstate.runtime.spark.state_writer`)."""
        return BootstrapWriter(WriteOptions.parse(dict(self.options)), overwrite, list(schema.fieldNames()))


class StateReader(DataSourceReader):
    """Plans one Spark partition per job partition; each reads its rows through the view."""

    def __init__(self, view: View) -> None:
        self.view = view

    def partitions(self) -> list[InputPartition]:
        return list(self.view.slices())

    def read(self, partition: InputPartition) -> Iterator[tuple]:
        assert isinstance(partition, Slice)
        yield from self.view.rows(partition)

