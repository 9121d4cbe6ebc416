"""Read-only views of a job's state (``localstate inspect``, the state reader): checkpoints, store partitions, store
contents, changelog streams.

Guarantee: nothing here writes, creates, locks, truncates or deletes anything. Checkpoints are read
as files (not through :class:`CheckpointStore`, which creates its directory); file changelogs through
the system's read-only ``reader()`` (:class:`ReadOnlyPartitions`: file, no writer lock, a torn tail is
skipped, not truncated; kafka, no producer); LMDB is
opened ``readonly=True, lock=False``; RocksDB is opened read-only on a private snapshot in a temporary
directory (SST files hard-linked, the small files copied), because rocksdict rewrites its
``rocksdict-config.json`` even when opening read-only. It may run next to a live job: what it shows
is then a recent consistent view of each partition, not necessarily of all partitions together.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import tempfile
import time
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterable, Iterator

import lmdb
import rocksdict

from localstate.core.changelog import ChangelogPartition, ChangelogSystem, DurableCheckpoints, LocalStreams, \
    ManifestedChangelog, ManifestedStreams, ReadOnlyPartitions
from localstate.core.checkpoint import Checkpoint
from localstate.core.config import JobConfig, StoreConfig
from localstate.core.backend import coalesce_sorted
from localstate.core.logged import META_OFFSET, decode_offset
from localstate.runtime.layout import epoch_checkpoint_objects, open_changelog_system, state_directory, \
    store_directory
from localstate.core.engine import LiveEntries, SerdeColumn
from localstate.core.serdes import Serde
from localstate.errors import ChangelogError, CheckpointError, LocalStateError, SerdeError, StateNotFoundError
from localstate.core.options import did_you_mean
from localstate.core.stream import PendingTail, check_input_position, open_input, open_output

__all__ = ["StorePartitionInfo", "SegmentInfo", "ChangelogPartitionInfo", "Entry", "job_dir", "changelog_root",
           "load_checkpoints", "require_state", "live_filter", "value_splitter", "store_config", "store_partitions",
           "store_serdes", "store_entries",
           "resolve_stream", "changelog_partitions", "changelog_records", "open_changelog_reader",
           "checkpoint_manifest", "checkpoint_location", "committed_contents", "committed_columns", "stream_location",
           "dir_size",
           "InputPartitionInfo", "input_partitions",
           "decoder",
           "raw_value", "to_jsonable", "serde_column", "NATIVE_TYPES"]

log = logging.getLogger(__name__)

_ROCKSDB_META_CF = "localstate_meta"


# -- where things are ------------------------------------------------------------------------------

def job_dir(job: JobConfig) -> Path:
    """``<state_dir>/<job>`` (``.../epochs/<e>`` for a config bound to a later state epoch): its
    checkpoints and local stores."""
    return state_directory(job)


def stream_location(job: JobConfig, section: str, name: str) -> str:
    """Where input/output ``name`` lives, for people: a directory, or a Kafka topic (its
    ``location()``); ``(<system>)`` when it has no place or cannot be opened."""
    config = (job.inputs if section == "inputs" else job.outputs)[name]
    try:
        stream = open_input(job, name) if section == "inputs" else open_output(job, name)
        place = stream.location()
    except LocalStateError:
        place = None
    if place is None:
        return f"({config.system})"
    kind, where = place
    return where if kind == "path" else f"{kind} topic {where!r}"


def changelog_root(job: JobConfig) -> Path | None:
    """Directory of the job's changelog streams, or None when its system does not keep them locally."""
    try:
        system = open_changelog_system(job)
    except LocalStateError:
        return None
    try:
        return system.root if isinstance(system, LocalStreams) else None
    finally:
        system.close()


def dir_size(path: Path) -> int:
    """Bytes of the regular files under ``path`` (symlinks not followed)."""
    total = 0
    for folder, _dirs, files in os.walk(path):
        for name in files:
            try:
                stat = os.lstat(os.path.join(folder, name))
            except FileNotFoundError:
                continue
            total += stat.st_size if not os.path.islink(os.path.join(folder, name)) else 0
    return total


# -- checkpoints -------------------------------------------------------------------------------------

def load_checkpoints(job: JobConfig, directory: Path | None = None) -> dict[int, Checkpoint | None]:
    """Each partition's checkpoint (None where there is none), read without creating anything, from
    the job's checkpoint directory or ``directory`` (e.g. a copy of it) — or from shared storage when
    the job's changelog system keeps its checkpoints there (and no ``directory`` is given)."""
    if directory is None and _durable_checkpoints(job):
        return _load_durable_checkpoints(job)
    root = directory if directory is not None else job_dir(job) / "checkpoints"
    found: dict[int, Checkpoint | None] = {}
    for partition in range(job.partitions):
        path = root / f"{partition}.json"
        try:
            text = path.read_text(encoding="utf-8")
        except FileNotFoundError:
            found[partition] = None
            continue
        except (OSError, UnicodeDecodeError) as exc:
            raise CheckpointError(f"cannot read checkpoint {path}: {exc}", partition=partition, path=str(path),
                                  hint="check the file's permissions and disk") from exc
        checkpoint = Checkpoint.from_json(text, str(path))
        if checkpoint.partition != partition:
            raise CheckpointError(f"checkpoint {path} belongs to partition {checkpoint.partition}",
                                  partition=partition, path=str(path), field="partition",
                                  hint="put the file back where it came from")
        found[partition] = checkpoint
    return found


def _durable_checkpoints(job: JobConfig) -> bool:
    return issubclass(job.registry.changelog_system(job.changelog_system), DurableCheckpoints)


def _load_durable_checkpoints(job: JobConfig) -> dict[int, Checkpoint | None]:
    system = open_changelog_system(job)
    try:
        objects = epoch_checkpoint_objects(job, system)
        found: dict[int, Checkpoint | None] = {}
        for partition in range(job.partitions):
            latest = objects.latest(partition)
            found[partition] = None if latest is None else \
                Checkpoint.from_json(latest[1].decode("utf-8", "replace"), latest[0])
        return found
    finally:
        system.close()


def checkpoint_location(job: JobConfig) -> str | None:
    """Where the job's checkpoints live when its changelog system keeps them in shared storage (a
    URL), else None (the job's directory)."""
    if not _durable_checkpoints(job):
        return None
    system = open_changelog_system(job)
    try:
        return epoch_checkpoint_objects(job, system).describe()
    finally:
        system.close()


def require_state(job: JobConfig) -> dict[int, Checkpoint | None]:
    """The checkpoints, or StateNotFoundError when the job has no state at all (never run here)."""
    checkpoints = load_checkpoints(job)
    root = changelog_root(job)
    logged = [s.changelog for s in job.stores.values() if s.changelog]
    has_changelogs = root is not None and any((root / stream).is_dir() for stream in logged)
    has_changelogs = has_changelogs or any(c is not None for c in checkpoints.values())
    if not job_dir(job).exists() and not has_changelogs:
        raise StateNotFoundError(f"job {job.name!r} has no state in {job.state_dir}: it has not run with this "
                                 "state directory", path=str(job_dir(job)),
                                 hint="run it first (`localstate run JOB`), or check job.state_dir in the config")
    return checkpoints


# -- input partitions ---------------------------------------------------------------------------------

@dataclass
class InputPartitionInfo:
    """One input partition against the checkpoint: where the job is, where the input ends, what
    is still being appended, and what is wrong (a position the input does not hold any more)."""

    input: str
    partition: int
    position: int | None
    """the checkpointed next offset; None when no checkpoint names one (the job starts at 0)"""
    end: int | None
    """the input's current end; None when it could not be read (see ``problem``)"""
    pending_bytes: int = 0
    """bytes of an unterminated last record (:class:`~localstate.core.stream.PendingTail`)"""
    pending_since: float | None = None
    """when those bytes last changed (epoch seconds), None when there are none"""
    problem: str | None = None
    """why the position does not fit the input (InputPositionError), or why the end is unknown"""

    @property
    def lag(self) -> int | None:
        """Records the input holds past the position; None when the end is unknown or the position
        is past it."""
        if self.end is None:
            return None
        lag = self.end - (self.position or 0)
        return lag if lag >= 0 else None


def input_partitions(job: JobConfig, checkpoints: dict[int, Checkpoint | None],
                     partitions: list[int] | None = None) -> list[InputPartitionInfo]:
    """Each input partition against its checkpointed position, read-only: the inputs' ends as the
    planner of ``localstate run`` finds them (files are only read; a Kafka input asks its broker),
    the same position check (a problem here is the InputPositionError a run would raise), and the
    unterminated bytes at their ends. An input that cannot be opened or read is reported in
    ``problem``, never raised."""
    found = []
    for name in sorted(job.inputs):
        try:
            source = open_input(job, name)
        except LocalStateError as exc:
            found += [InputPartitionInfo(name, p, None, None, problem=exc.message)
                      for p in (partitions if partitions is not None else range(job.partitions))]
            continue
        for partition in (partitions if partitions is not None else range(job.partitions)):
            checkpoint = checkpoints.get(partition)
            position = checkpoint.inputs.get(name) if checkpoint is not None else None
            identity = checkpoint.input_ids.get(name) if checkpoint is not None else None
            info = InputPartitionInfo(name, partition, position, None)
            try:
                info.end = source.end_offset(partition)
                if isinstance(source, PendingTail):
                    info.pending_bytes = source.pending_bytes(partition)
                    info.pending_since = source.pending_since(partition) if info.pending_bytes else None
                check_input_position(source, partition, position, info.end, identity)
            except LocalStateError as exc:
                info.problem = exc.message
            found.append(info)
    return found


# -- store partitions --------------------------------------------------------------------------------

@dataclass
class StorePartitionInfo:
    """One store partition as found on disk."""

    store: str
    partition: int
    engine: str
    backend: str | None
    directory: Path
    exists: bool
    bytes: int
    local_offset: int | None
    keys: int | None
    checkpoint_offset: int | None
    changelog_end: int | None
    notes: list[str] = field(default_factory=list)


def store_config(job: JobConfig, store: str) -> StoreConfig:
    if store not in job.stores:
        known = sorted(job.stores)
        raise StateNotFoundError(f"job {job.name!r} has no store {store!r}{did_you_mean(store, known)}",
                                 store=store, hint=f"stores of this job: {', '.join(known) or '(none)'}")
    return job.stores[store]


def _backend(config: StoreConfig) -> str | None:
    if config.engine in ("kv", "heap", "sketch"):
        return str(config.options.get("backend") or "rocksdb")
    return None


def store_partitions(job: JobConfig, store: str, checkpoints: dict[int, Checkpoint | None],
                     partitions: list[int] | None = None) -> list[StorePartitionInfo]:
    """What each partition of ``store`` holds locally, next to its checkpoint and changelog end."""
    config = store_config(job, store)
    backend = _backend(config)
    infos = []
    for partition in partitions if partitions is not None else range(job.partitions):
        directory = store_directory(job, store, partition)
        checkpoint = checkpoints.get(partition)
        info = StorePartitionInfo(
            store, partition, config.engine, backend, directory, directory.is_dir(),
            dir_size(directory) if directory.is_dir() else 0, None, None,
            checkpoint.changelogs.get(store, 0) if checkpoint is not None and config.changelog else None,
            _changelog_end(job, config.changelog, partition) if config.changelog else None)
        if info.exists:
            try:
                with _open_local(directory, backend) as local:
                    if local is not None:
                        info.local_offset = local.offset()
                        if config.engine == "kv":
                            info.keys = sum(1 for _ in local.scan())
                    elif config.engine == "search":
                        info.local_offset = _search_offset(directory, info.notes)
            except Exception as exc:  # noqa: BLE001 - an unreadable local store is shown, not fatal
                info.notes.append(f"local store unreadable: {type(exc).__name__}: {exc}")
        if config.changelog is None:
            info.notes.append("not logged (changelog = false): not fault tolerant")
        elif backend == "memory":
            info.notes.append("memory backend: no local files; contents come from the changelog")
        if (info.changelog_end is not None and info.checkpoint_offset is not None
                and info.changelog_end < info.checkpoint_offset):
            info.notes.append(f"the checkpoint says offset {info.checkpoint_offset} but the changelog ends at "
                              f"{info.changelog_end}: committed records are missing (restore the changelog, or "
                              "`localstate reset`)")
        if (info.local_offset is not None and info.checkpoint_offset is not None
                and info.local_offset != info.checkpoint_offset):
            info.notes.append(f"local offset {info.local_offset} != checkpointed {info.checkpoint_offset}: "
                              "the next start replays/trims to the checkpoint")
        infos.append(info)
    return infos


def _search_offset(directory: Path, notes: list[str]) -> int | None:
    # The search engine's marker says offset o (commit not done) or n (done); which one needs tantivy
    # to compare opstamps, so both are shown.
    try:
        marker = json.loads((directory / "search-offset.json").read_bytes())
        notes.append(f"search index marker: offset {marker['offset']} or {marker['next']} (by tantivy opstamp)")
        return int(marker["next"])
    except (OSError, ValueError, KeyError, TypeError):
        return None


class _LocalReader:
    """Read-only access to a kv backend directory: the offset and the live entries in key order."""

    def offset(self) -> int | None:
        return decode_offset(self.meta(META_OFFSET))

    def meta(self, key: bytes) -> bytes | None:
        raise NotImplementedError

    def scan(self, start: bytes | None = None) -> Iterator[tuple[bytes, bytes]]:
        raise NotImplementedError

    def close(self) -> None:
        """Release the handle (and any private snapshot)."""


class _LMDBReader(_LocalReader):
    def __init__(self, path: Path) -> None:
        # readonly + lock=False: no lock file is created or written, no map is grown.
        self.env = lmdb.open(str(path), readonly=True, lock=False, max_dbs=2, readahead=False)
        self.data = self.env.open_db(b"data", create=False)
        self.meta_db = self.env.open_db(b"meta", create=False)

    def meta(self, key: bytes) -> bytes | None:
        with self.env.begin(db=self.meta_db) as txn:
            return txn.get(key)

    def scan(self, start: bytes | None = None) -> Iterator[tuple[bytes, bytes]]:
        with self.env.begin(db=self.data, buffers=False) as txn:
            cursor = txn.cursor()
            if (cursor.set_range(start) if start is not None else cursor.first()):
                yield from cursor.iternext()

    def close(self) -> None:
        self.env.close()


class _RocksReader(_LocalReader):
    def __init__(self, path: Path) -> None:
        self.snapshot = Path(tempfile.mkdtemp(prefix="localstate-inspect-"))
        try:
            _snapshot_rocksdb(path, self.snapshot)
            self.db = rocksdict.Rdict(str(self.snapshot), options=rocksdict.Options(raw_mode=True),
                                      column_families={_ROCKSDB_META_CF: rocksdict.Options(raw_mode=True)},
                                      access_type=rocksdict.AccessType.read_only())
        except BaseException:
            shutil.rmtree(self.snapshot, ignore_errors=True)
            raise

    def meta(self, key: bytes) -> bytes | None:
        return self.db.get_column_family(_ROCKSDB_META_CF).get(key)

    def scan(self, start: bytes | None = None) -> Iterator[tuple[bytes, bytes]]:
        it = self.db.iter()
        it.seek(start) if start is not None else it.seek_to_first()
        while it.valid():
            yield it.key(), it.value()
            it.next()
        del it

    def close(self) -> None:
        self.db.close()
        shutil.rmtree(self.snapshot, ignore_errors=True)


def _snapshot_rocksdb(source: Path, target: Path) -> None:
    """A private copy of a RocksDB directory to open read-only: SST files (immutable) hard-linked
    where the file system allows it, everything else copied; info logs and the LOCK skipped."""
    for entry in os.scandir(source):
        if not entry.is_file(follow_symlinks=False) or entry.name.startswith("LOG") or entry.name == "LOCK":
            continue
        destination = target / entry.name
        if entry.name.endswith(".sst"):
            try:
                os.link(entry.path, destination)
                continue
            except OSError:
                pass
        shutil.copyfile(entry.path, destination)


def _reader(directory: Path, backend: str | None) -> _LocalReader | None:
    """A reader of the store partition's kv backend directory, or None if there is none on disk."""
    path = directory / backend if backend in ("rocksdb", "lmdb") else None
    if path is None or not path.is_dir():
        return None
    return _RocksReader(path) if backend == "rocksdb" else _LMDBReader(path)


@contextmanager
def _open_local(directory: Path, backend: str | None) -> Iterator[_LocalReader | None]:
    reader = _reader(directory, backend)
    try:
        yield reader
    finally:
        if reader is not None:
            reader.close()


# -- changelogs ----------------------------------------------------------------------------------------

def _changelog_end(job: JobConfig, stream: str, partition: int) -> int | None:
    system = open_changelog_system(job)
    if not isinstance(system, LocalStreams):
        system.close()
        return None
    if not system.partition_dir(stream, partition).is_dir():
        return None
    reader = system.reader(stream, partition)
    try:
        return reader.end_offset()
    finally:
        reader.close()


@dataclass
class SegmentInfo:
    name: str
    bytes: int


@dataclass
class ChangelogPartitionInfo:
    stream: str
    partition: int
    directory: Path | None
    """None for a system that does not keep its streams locally"""
    exists: bool
    start: int | None
    end: int
    checkpoint_offset: int | None
    segments: list[SegmentInfo]


def resolve_stream(job: JobConfig, name: str) -> tuple[str, StoreConfig | None]:
    """A changelog stream by its name or by its store's name -> (stream, the store it logs)."""
    for store in job.stores.values():
        if name in (store.changelog, store.name) and store.changelog:
            return store.changelog, store
    known = sorted(s.changelog for s in job.stores.values() if s.changelog)
    raise StateNotFoundError(f"job {job.name!r} has no changelog stream {name!r}", stream=name,
                             hint=f"changelog streams of this job: {', '.join(known) or '(none)'} "
                                  "(a store name works too)")


def changelog_partitions(job: JobConfig, stream: str, store: StoreConfig | None,
                         checkpoints: dict[int, Checkpoint | None],
                         partitions: list[int] | None = None) -> list[ChangelogPartitionInfo]:
    """Each partition of changelog ``stream``: first and end offsets, the checkpointed offset and, for
    a system keeping streams locally, its directory and segment files. Read-only."""
    system = open_changelog_system(job)
    try:
        return [_changelog_partition(system, stream, store, partition, checkpoints.get(partition))
                for partition in (partitions if partitions is not None else range(job.partitions))]
    finally:
        system.close()


def _changelog_partition(system: ChangelogSystem, stream: str, store: StoreConfig | None, partition: int,
                         checkpoint: Checkpoint | None) -> ChangelogPartitionInfo:
    local = isinstance(system, LocalStreams)
    directory = system.partition_dir(stream, partition) if local else None
    committed = checkpoint.changelogs.get(store.name, 0) if checkpoint is not None and store else None
    manifest = checkpoint_manifest(checkpoint, store.name) if store else None
    reader = open_changelog_reader(system, stream, partition, manifest)
    if reader is None:
        return ChangelogPartitionInfo(stream, partition, directory, False, None, 0, committed, [])
    try:
        end = reader.end_offset()
        first = next(iter(reader.read(0, end)), None)
    finally:
        reader.close()
    if local:
        segments = [SegmentInfo(name, size) for name, size in system.segments(stream, partition)]
    elif isinstance(system, ManifestedStreams) and manifest is not None:
        segments = [SegmentInfo(name, size) for name, size in system.manifest_objects(manifest)]
    else:
        segments = []
    return ChangelogPartitionInfo(stream, partition, directory, True, first.offset if first is not None else None,
                                  end, committed, segments)


def open_changelog_reader(system: ChangelogSystem, stream: str, partition: int,
                          manifest: dict[str, Any] | None = None) -> ChangelogPartition | None:
    """One changelog partition opened for reading only, or None when a local stream has no such
    partition. Opened with the system's read-only ``reader()`` where it has one (file: no writer lock,
    nothing truncated; kafka: no producer, nobody fenced), else through ``partition()``. A partition
    whose committed content is named by its checkpoint (``adopt(manifest)``, e.g. on object storage)
    is given ``manifest`` first, so it shows exactly the committed chain."""
    if isinstance(system, LocalStreams) and not system.partition_dir(stream, partition).is_dir():
        return None
    opener = system.reader if isinstance(system, ReadOnlyPartitions) else system.partition
    opened = opener(stream, partition)
    if isinstance(opened, ManifestedChangelog):
        try:
            opened.adopt(manifest)
        except BaseException:
            opened.close()
            raise
    return opened


def checkpoint_manifest(checkpoint: Checkpoint | None, store: str) -> dict[str, Any] | None:
    """The changelog manifest ``checkpoint`` records for ``store`` (None: none, or a system without them)."""
    return None if checkpoint is None else checkpoint.manifests.get(store)


def changelog_records(job: JobConfig, stream: str, partition: int, start: int = 0,
                      end: int | None = None, manifest: dict[str, Any] | None = None) -> Iterator[Any]:
    """Raw records of one changelog partition, ``start <= offset < end`` (``end`` None: its flushed
    end); nothing if it does not exist."""
    system = open_changelog_system(job)
    try:
        reader = open_changelog_reader(system, stream, partition, manifest)
        if reader is None:
            return
        try:
            yield from reader.read(start, end if end is not None else reader.end_offset())
        finally:
            reader.close()
    finally:
        system.close()


def committed_contents(job: JobConfig, config: StoreConfig, partition: int,
                       checkpoint: Checkpoint | None, *, live: bool = True) -> list[tuple[bytes, bytes]]:
    """A store partition's committed durable state: its changelog replayed up to the offset
    ``checkpoint`` records (0 without one), last record per key, tombstones dropped, in key (byte)
    order. Records after that offset (flushed before a crash, never committed) are not read.
    ``live``: entries as a reader sees them (a ttl store's expired entries dropped, each value
    without its expiry; :func:`live_filter`); False: as stored, raw (what a savepoint keeps).

    Raises ChangelogError when the changelog ends before the checkpointed offset (committed records
    are missing), StateNotFoundError for a store without a changelog."""
    keys, values = committed_columns(job, config, partition, checkpoint)
    entries = list(zip(keys, values))
    live_entries = live_filter(job, config, checkpoint) if live else None
    return entries if live_entries is None else list(live_entries(entries))  # type: ignore[arg-type]


def committed_columns(job: JobConfig, config: StoreConfig, partition: int,
                      checkpoint: Checkpoint | None) -> tuple[list[bytes], list[bytes]]:
    """:func:`committed_contents` as stored (raw), in two columns: the keys in byte order and their
    values. The changelog is read as column runs and coalesced in one sort (``coalesce_sorted``: in C
    where the extension is built), so only the records kept become objects."""
    if config.changelog is None:
        raise StateNotFoundError(f"store {config.name!r} has no changelog (changelog = false): it keeps no "
                                 "durable state", store=config.name, partition=partition,
                                 hint="only logged stores can be read from their committed state; "
                                      "set changelog = true on the store to make it durable")
    upto = checkpoint.changelogs.get(config.name, 0) if checkpoint is not None else 0
    if upto == 0:
        return [], []
    system = open_changelog_system(job)
    try:
        reader = open_changelog_reader(system, config.changelog, partition,
                                       checkpoint_manifest(checkpoint, config.name))
        if reader is None:
            raise _missing_records(config, partition, upto, 0)
        try:
            end = reader.end_offset()
            if end < upto:
                raise _missing_records(config, partition, upto, end)
            key_runs: list[Any] = []
            value_runs: list[Any] = []
            for run in reader.read_columns(0, upto):
                if run.framed is not None:  # still in the bytes read: objects only for the records kept
                    key_runs.append(run.framed)
                    value_runs.append(None)
                else:
                    key_runs.append(run.keys)
                    value_runs.append(run.values)
        finally:
            reader.close()
    finally:
        system.close()
    merged = coalesce_sorted(key_runs, value_runs)
    if not merged.deletes:
        return merged.key_column, merged.value_column
    kept = [i for i, value in enumerate(merged.value_column) if value is not None]
    return [merged.key_column[i] for i in kept], [merged.value_column[i] for i in kept]


def value_splitter(job: JobConfig, config: StoreConfig | None
                   ) -> Callable[[bytes], tuple[bytes, float | None]] | None:
    """For a store whose stored values carry more than the serde's bytes (a kv store with ``ttl``):
    a function splitting a stored value into those bytes and its expiry; None for every other store."""
    if config is None:
        return None
    factory = job.registry.engine_factory(config.engine)
    options = dict(config.options)
    if not isinstance(factory, LiveEntries) or factory.live_entries(config.name, options, _ReaderTime(None)) is None:
        return None
    return lambda data: factory.stored_value(options, data)


class _ReaderTime:
    """The time a reader of stored state judges expiry by: the clock, and the watermark the checkpoint
    saved (None when it saved none: nothing has expired in event time)."""

    def __init__(self, checkpoint: Checkpoint | None) -> None:
        self._watermark = getattr(checkpoint, "watermark", None)

    def processing_time(self) -> float:
        return time.time()

    @property
    def watermark(self) -> float | None:
        return self._watermark


def live_filter(job: JobConfig, config: StoreConfig, checkpoint: Checkpoint | None
                ) -> Callable[[Iterable[tuple[bytes, bytes]]], Iterator[tuple[bytes, bytes]]] | None:
    """The store's filter of stored entries to the live ones, values as their serde wrote them
    (:class:`~localstate.core.engine.LiveEntries`: a kv store with ``ttl`` drops expired entries and
    the expiry of each value); None when stored entries are shown as they are."""
    factory = job.registry.engine_factory(config.engine)
    if not isinstance(factory, LiveEntries):
        return None
    return factory.live_entries(config.name, dict(config.options), _ReaderTime(checkpoint))


def _missing_records(config: StoreConfig, partition: int, upto: int, end: int) -> ChangelogError:
    return ChangelogError(f"store {config.name!r} partition {partition}: the checkpoint says changelog offset "
                          f"{upto} but the changelog ends at {end}: committed records are missing",
                          store=config.name, stream=config.changelog, partition=partition, offset=upto,
                          hint="restore the changelog (or point the job at the right changelog system); "
                               "`localstate reset` starts the job over")


# -- store contents ----------------------------------------------------------------------------------

@dataclass(frozen=True)
class Entry:
    partition: int
    key: Any
    value: Any
    source: str
    """'local' or 'changelog'"""


def decoder(serde: Serde | None):  # noqa: ANN202
    def decode(data: bytes) -> Any:
        if serde is not None:
            try:
                return serde.deserialize(data)
            except Exception:  # noqa: BLE001 - engine-internal encodings: shown as below
                pass
        return raw_value(data)
    return decode


def raw_value(data: bytes) -> Any:
    """Bytes without a serde: the JSON they hold when they are a JSON object or array (engines such as
    search log documents as JSON), else the bytes themselves (shown as hex)."""
    if data[:1] in (b"{", b"["):
        try:
            return json.loads(data.decode("utf-8"))
        except ValueError:
            pass
    return data


def store_serdes(job: JobConfig, config: StoreConfig) -> tuple[Serde | None, Serde | None]:
    """The store's serdes for decoding kv contents; None (raw bytes) for other engines, whose
    changelog records are engine encodings, and for serdes that could run code (pickle)."""
    registry = job.registry
    serdes = []
    for name in (config.key_serde, config.value_serde):
        try:
            serdes.append(registry.serde(name, allow_pickle=job.allow_pickle))
        except Exception:  # noqa: BLE001 - a refused serde: show raw bytes
            serdes.append(None)
    key_serde, value_serde = serdes
    if config.engine != "kv":
        return key_serde if config.engine in ("heap", "search") else None, None
    return key_serde, value_serde


def store_entries(job: JobConfig, store: str, checkpoints: dict[int, Checkpoint | None], *,
                  partitions: list[int] | None = None, from_changelog: bool = False,
                  key_filter: Any = None) -> Iterator[Entry]:
    """The contents of ``store``, partition by partition in key (byte) order, decoded.

    From the local rocksdb/lmdb store where there is one (unless ``from_changelog``), else from the
    changelog replayed up to the checkpointed offset (last record per key, tombstones delete).
    ``key_filter(decoded_key) -> bool`` selects keys."""
    config = store_config(job, store)
    backend = _backend(config)
    key_serde, value_serde = store_serdes(job, config)
    decode_key, decode_value = decoder(key_serde), decoder(value_serde)
    for partition in partitions if partitions is not None else range(job.partitions):
        directory = store_directory(job, store, partition)
        use_local = (config.engine == "kv" and not from_changelog and backend in ("rocksdb", "lmdb")
                     and (directory / backend).is_dir())
        local = None
        if use_local:
            try:
                local = _reader(directory, backend)
            except Exception as exc:  # noqa: BLE001 - local state is a cache: fall back to the changelog
                log.warning("store %s partition %d: cannot read the local %s store (%s: %s); showing the "
                            "changelog up to the checkpoint instead", store, partition, backend,
                            type(exc).__name__, exc)
        if local is not None:
            live = live_filter(job, config, checkpoints.get(partition))
            try:
                for kb, vb in (local.scan() if live is None else live(local.scan())):
                    key = decode_key(kb)
                    if key_filter is None or key_filter(key):
                        yield Entry(partition, key, decode_value(vb), "local")
            finally:
                local.close()
            continue
        if config.changelog is None:
            raise StateNotFoundError(f"store {store!r} partition {partition} has no local store on disk and no "
                                     "changelog (changelog = false)", store=store, partition=partition,
                                     path=str(directory), hint="nothing persistent to show for this store")
        for kb, vb in committed_contents(job, config, partition, checkpoints.get(partition)):
            key = decode_key(kb)
            if key_filter is None or key_filter(key):
                yield Entry(partition, key, decode_value(vb), "changelog")


#: Serdes whose decoded values have a native column type (Spark ``bigint``, ``string``, ``binary``;
#: Arrow ``int64``, ``string``, ``binary``); any other serde's values are a string column holding JSON text.
NATIVE_TYPES = {"int": "bigint", "string": "string", "bytes": "binary"}


def serde_column(serde: Serde | None, native: str | None, store: str) -> SerdeColumn:
    """The column of values decoded with ``serde``: a native Spark type for the ``int``, ``string``
    and ``bytes`` serdes (``native``: the serde's name when its column is to be native; a value the
    serde refuses is a SerdeError naming the store and the record), else JSON text (bytes the serde
    cannot decode, or that have no serde: ``{"hex": ...}``)."""
    if serde is None or native not in NATIVE_TYPES:
        lenient = decoder(serde)
        return SerdeColumn("string", lambda data: json.dumps(to_jsonable(lenient(data)), sort_keys=True))
    if native == "bytes":
        return SerdeColumn("binary", bytes)

    def strict(data: bytes) -> Any:
        try:
            return serde.deserialize(data)
        except Exception as exc:  # noqa: BLE001 - any serde failure is reported the same way
            problem = exc.message if isinstance(exc, SerdeError) else f"{type(exc).__name__}: {exc}"
            raise SerdeError(f"store {store!r}: {problem}", store=store,
                             hint="check that the store's serde matches what was written; "
                                  '.option("raw", "true") reads the bytes') from exc
    return SerdeColumn(NATIVE_TYPES[native], strict)


def to_jsonable(value: Any) -> Any:
    """JSON-safe form of a decoded key or value: bytes become {"hex": ...}."""
    if isinstance(value, (bytes, bytearray, memoryview)):
        return {"hex": bytes(value).hex()}
    if isinstance(value, dict):
        return {str(k): to_jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [to_jsonable(v) for v in value]
    if value is None or isinstance(value, (str, int, float, bool)):
        return value
    return repr(value)
