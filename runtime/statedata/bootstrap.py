"""Bootstrap: a job's initial state built from a table of ``(store, key, value)`` rows (Flink's State
Processor API bootstrap), before its stream starts.

Each row goes through the store's own engine (a kv engine on a memory backend whose changelog records
are captured): its serdes check and encode it, a store with ``ttl`` stamps its expiry, exactly as a
task's ``put`` would. The records are routed to their job partition by the job's partitioner and
staged as savepoint files (:class:`StagedWriter`, one per Spark task or one in process); the staged
savepoint is then started from (:func:`commit_bootstrap`: a new state epoch, switched to atomically),
so a bootstrap killed midway leaves the job as it was. Only kv stores are bootstrapped (the other
kinds have no key/value rows to take: fill them from a task). A store's keys should be unique: of
two rows with one key, which wins is not defined.

With ``savepoint``, the bootstrap writes back into that savepoint's state: its checkpoints (input
positions, watermarks, timers) and every store the rows do not name are kept, the stores they name
replaced (read a savepoint as a DataFrame, transform it, write it back: a migration)."""

from __future__ import annotations

import hashlib
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any, Iterable

from localstate.core.text import a
from localstate.core.changelog import ChangelogWriter
from localstate.core.config import JobConfig
from localstate.core.engine import StoreContext
from localstate.core.partitioner import partitions_of_bytes
from localstate.errors import ConfigError, StateNotFoundError
from localstate.runtime.layout import EpochPointer
from localstate.runtime.statedata.columns import store_columns, to_parquet
from localstate.runtime.statedata.loader import LoadOptions, load_savepoint
from localstate.runtime.statedata.location import SavepointLocation
from localstate.runtime.statedata.manifest import MANIFEST, FileEntry, SavepointManifest, StoreEntry
from localstate.runtime.statedata.reader import Savepoint
from localstate.runtime.statedata.routing import routing_bytes
from localstate.runtime.statedata.writer import check_empty

__all__ = ["StagedWriter", "commit_bootstrap", "bootstrap"]

ROWS_PER_PART = 200_000


class _Captured(ChangelogWriter):
    """The records an engine logs, kept in memory."""

    def __init__(self) -> None:
        self.records: list[tuple[bytes, bytes | None]] = []

    def append(self, key: bytes, value: bytes | None) -> None:
        self.records.append((key, value))

    def flush(self) -> int:
        return len(self.records)


class StagedWriter:
    """Stages rows of a job's kv stores as savepoint files at ``location`` (see the module docstring);
    ``files`` are what it wrote, for the manifest. ``writer`` names its files apart from other writers'."""

    def __init__(self, job: JobConfig, location: SavepointLocation, writer: str | None = None) -> None:
        self.job = job
        self.location = location
        self.writer = writer or uuid.uuid4().hex[:12]
        self.files: dict[str, FileEntry] = {}
        self.rows: dict[str, list[tuple[Any, Any]]] = {}
        self._parts = 0

    def add(self, store: str, key: Any, value: Any) -> None:
        rows = self.rows.get(store)
        if rows is None:
            _kv_store(self.job, store)
            rows = self.rows[store] = []
        rows.append((key, value))
        if len(rows) >= ROWS_PER_PART:
            self._stage(store)

    def close(self) -> dict[str, FileEntry]:
        for store in list(self.rows):
            self._stage(store)
        return self.files

    def _stage(self, store: str) -> None:
        rows = self.rows.pop(store, [])
        if not rows:
            return
        config = self.job.stores[store]
        records = _encoded(self.job, config, rows)
        keys = [key for key, _ in records]
        to_routing = routing_bytes(self.job.registry.serde(config.key_serde, allow_pickle=self.job.allow_pickle))
        targets = partitions_of_bytes(to_routing(keys), self.job.partitions).tolist()
        columns = store_columns(self.job, config)
        for partition in sorted(set(targets)):
            chosen = sorted((key, value) for (key, value), target in zip(records, targets) if target == partition)
            data = to_parquet([k for k, _ in chosen], [v for _, v in chosen], columns)
            key = f"stores/{store}/partition={partition}/part-{self.writer}-{self._parts:05d}.parquet"
            self._parts += 1
            self.location.put(key, data)
            self.files[key] = FileEntry(hashlib.sha256(data).hexdigest(), len(data), len(chosen))


def _kv_store(job: JobConfig, store: str) -> None:
    config = job.stores.get(store)
    if config is None or store.startswith("_"):
        raise StateNotFoundError(f"job {job.name!r} has no store {store!r} to bootstrap", store=store,
                                 hint=f"its stores: {', '.join(sorted(s for s in job.stores if not s.startswith('_')))}")
    if config.engine != "kv" or config.changelog is None:
        raise ConfigError.at(f"stores.{store}", f"store {store!r} is {a(config.engine)} store"
                             + ("" if config.changelog else " without a changelog")
                             + ": a bootstrap fills logged kv stores", hint="fill other kinds from the task")


def _encoded(job: JobConfig, config: Any, rows: list[tuple[Any, Any]]) -> list[tuple[bytes, bytes]]:
    """``rows`` as the store's engine logs them (its serdes, a ttl store's expiry stamped now), the
    last row of a key winning."""
    registry = job.registry
    options = {**config.options, "backend": "memory"}
    captured = _Captured()
    with tempfile.TemporaryDirectory(prefix="localstate-bootstrap-") as scratch:
        context = StoreContext(job=job.name, store=config.name, partition=0, directory=Path(scratch), options=options,
                               key_serde=registry.serde(config.key_serde, allow_pickle=job.allow_pickle),
                               value_serde=registry.serde(config.value_serde, allow_pickle=job.allow_pickle),
                               changelog=captured, extra={"registry": registry})
        engine = registry.engine_factory(config.engine).create(context)
        try:
            engine.put_all(rows)  # type: ignore[attr-defined]
            engine.flush()
        finally:
            engine.close()
    return [(key, value) for key, value in dict(captured.records).items() if value is not None]


def commit_bootstrap(job: JobConfig, location: SavepointLocation, files: dict[str, FileEntry], *, yes: bool = False,
                     savepoint: Savepoint | None = None) -> EpochPointer:
    """Complete the staged savepoint at ``location`` (its manifest, written last) and start ``job``
    from it (see the module docstring)."""
    written = {key.split("/")[1] for key in files}
    stores: dict[str, StoreEntry] = {}
    checkpoints: dict[int, Any] = dict.fromkeys(range(job.partitions))
    inputs: dict[str, dict[str, Any]] = {}
    if savepoint is not None:
        source = savepoint.manifest
        if source.partitions != job.partitions:
            raise ConfigError.at("savepoint", f"the savepoint has {source.partitions} partitions, the job "
                                 f"{job.partitions}: write back with the savepoint's partition count (rescale after)")
        checkpoints, inputs = dict(source.checkpoints), dict(source.inputs)
        for name, entry in source.stores.items():
            if name in written:
                continue
            stores[name] = entry
            for key in (k for k in source.files if k.startswith(f"stores/{name}/")):
                data = savepoint.location.get(key)
                location.put(key, data or b"")
                files[key] = source.files[key]
    rows = {name: 0 for name in written}
    for key, entry in files.items():
        if key.split("/")[1] in rows:
            rows[key.split("/")[1]] += entry.rows
    for name in written:
        config = job.stores[name]
        stores[name] = StoreEntry(config.engine, dict(config.options), config.key_serde, config.value_serde,
                                  None, rows[name], store_columns(job, config).names)
    manifest = SavepointManifest(job=job.name, partitions=job.partitions, stores=stores, checkpoints=checkpoints,
                                 files=files, changelog_system=job.changelog_system,
                                 timer_key_serde=job.time.timer_key_serde, created=time.time(), inputs=inputs)
    location.put(MANIFEST, manifest.to_json())
    return load_savepoint(Savepoint.open(location), job, LoadOptions(yes=yes, source="bootstrap"))


def bootstrap(job: JobConfig, rows: Iterable[tuple[str, Any, Any]], location: SavepointLocation, *,
              yes: bool = False, savepoint: Savepoint | None = None) -> EpochPointer:
    """Bootstrap ``job`` from ``rows`` (``(store, key, value)``) in this process, staging them at
    ``location`` (an empty folder or URL, kept as the savepoint the job started from)."""
    check_empty(location)
    writer = StagedWriter(job, location)
    for store, key, value in rows:
        writer.add(store, key, value)
    return commit_bootstrap(job, location, writer.close(), yes=yes, savepoint=savepoint)
