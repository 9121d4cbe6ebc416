"""Taking a savepoint: a job's committed state, as data.

:func:`take_savepoint` reads, for each partition, its latest committed checkpoint and, for every
logged store (the timer store included), the changelog coalesced to the last record per key up to
that checkpoint's offset, tombstones dropped (on the objectstore system: the snapshot and deltas the
checkpoint's manifest names). It reads the durable state only, read-only (the changelog systems'
readers; no lock, nothing created in the job's state), so it works while a standing job runs and
from another host. :func:`read_partition` and :func:`savepoint_manifest` also serve
:class:`~.durable.DurableState`, the same state read in place (what a rescale starts from).

Guarantees: every partition's records are those of the one checkpoint the manifest records for it
(a file changelog compacted while a partition was read is read again, at the newer checkpoint); the
manifest is written last, after every file it lists and their sha256, so a savepoint cut short by a
crash has no manifest and is never read as whole.
"""

from __future__ import annotations

import hashlib
import logging
import tempfile
from pathlib import Path
from typing import Any, Callable

from localstate.core.changelog import LocalStreams, NullChangelogWriter
from localstate.core.checkpoint import Checkpoint
from localstate.core.config import JobConfig, StoreConfig
from localstate.core.engine import StateFormat, StoreContext
from localstate.runtime.driver.views import committed_columns, input_partitions, load_checkpoints
from localstate.runtime.layout import open_changelog_system
from localstate.runtime.partition.faults import crash_point
from localstate.runtime.statedata.columns import store_columns, to_parquet
from localstate.runtime.statedata.location import SavepointLocation
from localstate.runtime.statedata.manifest import MANIFEST, FileEntry, SavepointManifest, StoreEntry, data_key
from localstate.errors import ChangelogError, LocalStateError, StateExistsError
from localstate.core.stream import open_input

__all__ = ["take_savepoint", "ROWS_PER_FILE", "check_empty", "store_formats", "logged_stores", "read_partition",
           "savepoint_manifest"]

log = logging.getLogger(__name__)

ROWS_PER_FILE = 1_000_000
"""Records per Parquet file: a store partition of more is split into parts (bounded memory)."""
_READ_ATTEMPTS = 3


def check_empty(location: SavepointLocation) -> None:
    """StateExistsError unless ``location`` holds nothing (a savepoint, whole or cut short)."""
    found = location.keys()
    if found:
        whole = any(key == MANIFEST for key, _ in found)
        what = "a savepoint" if whole else f"{len(found)} file(s) but no {MANIFEST} (a savepoint cut short)"
        raise StateExistsError(f"savepoint location {location.where()} already holds {what}",
                               path=location.where(),
                               hint="choose a new location for each savepoint (a savepoint is never overwritten); "
                                    "delete a savepoint cut short before reusing its location")


def logged_stores(job: JobConfig) -> list[StoreConfig]:
    """The job's stores with a changelog, the timer store included, by name."""
    return [config for _, config in sorted(job.stores.items()) if config.changelog is not None]


def store_formats(job: JobConfig) -> dict[str, str]:
    """Each store's stored layout under the job's options (:class:`StateFormat`), from an engine
    opened on scratch state (a memory backend, no changelog): what a checkpoint records."""
    formats: dict[str, str] = {}
    registry = job.registry
    with tempfile.TemporaryDirectory(prefix="localstate-formats-") as scratch:
        for config in logged_stores(job):
            options = dict(config.options)
            if "backend" in options:
                options["backend"] = "memory"
            if config.engine == "search":
                continue  # no stored layout of its own; opening an index costs
            context = StoreContext(job=job.name, store=config.name, partition=0, directory=Path(scratch) / config.name,
                                   options=options, key_serde=registry.serde(config.key_serde,
                                                                             allow_pickle=job.allow_pickle),
                                   value_serde=registry.serde(config.value_serde, allow_pickle=job.allow_pickle),
                                   changelog=NullChangelogWriter(), logged=False, extra={"registry": registry})
            context.directory.mkdir(parents=True, exist_ok=True)
            engine = registry.engine_factory(config.engine).create(context)
            try:
                if isinstance(engine, StateFormat):
                    formats[config.name] = engine.state_format
            finally:
                engine.close()
    return formats


def take_savepoint(job: JobConfig, location: SavepointLocation, *,
                   progress: Callable[[str], None] | None = None) -> SavepointManifest:
    """Write a savepoint of ``job``'s committed state (at its current epoch) to ``location``, which
    must be empty; returns its manifest. Crash points: ``savepoint_file`` after each file,
    ``savepoint_manifest`` before the manifest."""
    check_empty(location)
    stores = logged_stores(job)
    columns = {config.name: store_columns(job, config) for config in stores}
    files: dict[str, FileEntry] = {}
    records = dict.fromkeys((config.name for config in stores), 0)
    checkpoints: dict[int, Checkpoint | None] = {}
    for partition in range(job.partitions):
        checkpoint, contents = read_partition(job, stores, partition)
        checkpoints[partition] = checkpoint
        for name, (keys, values) in contents.items():
            records[name] += len(keys)
            for part, start in enumerate(range(0, max(len(keys), 1), ROWS_PER_FILE)):
                if not keys:
                    break
                chunk = slice(start, start + ROWS_PER_FILE)
                data = to_parquet(keys[chunk], values[chunk], columns[name])
                key = data_key(name, partition, part)
                location.put(key, data)
                files[key] = FileEntry(hashlib.sha256(data).hexdigest(), len(data), len(keys[chunk]))
                crash_point("savepoint_file")
        if progress is not None:
            progress(f"partition {partition}: {sum(len(k) for k, _ in contents.values()):,} record(s)")
    manifest = savepoint_manifest(job, stores, checkpoints, files=files, records=records,
                                  columns={name: list(found.names) for name, found in columns.items()})
    crash_point("savepoint_manifest")
    location.put(MANIFEST, manifest.to_json())
    return manifest


def savepoint_manifest(job: JobConfig, stores: list[StoreConfig], checkpoints: dict[int, Checkpoint | None], *,
                       files: dict[str, FileEntry] | None = None, records: dict[str, int] | None = None,
                       columns: dict[str, list[str]] | None = None) -> SavepointManifest:
    """The manifest of ``job``'s state at ``checkpoints`` (one per partition): its stores as
    configured now, their state formats as the checkpoints recorded them, each input's place and lag.
    ``files``, ``records`` and ``columns`` are a written savepoint's (state read in place has no
    files, and its records are not counted: 0)."""
    formats = _formats(checkpoints)
    records = records or {}
    columns = columns or {}
    return SavepointManifest(
        inputs=_inputs(job, checkpoints),
        job=job.name, partitions=job.partitions, epoch=job.epoch, changelog_system=job.changelog_system,
        timer_key_serde=job.time.timer_key_serde, checkpoints=checkpoints, files=files or {},
        stores={config.name: StoreEntry(config.engine, dict(config.options), config.key_serde, config.value_serde,
                                        formats.get(config.name), records.get(config.name, 0),
                                        columns.get(config.name, []))
                for config in stores})


def _inputs(job: JobConfig, checkpoints: dict[int, Checkpoint | None]) -> dict[str, dict[str, Any]]:
    """Each input's place and lag per partition, as the savepoint's checkpoints left them."""
    out: dict[str, dict[str, Any]] = {}
    for info in input_partitions(job, checkpoints):
        entry = out.setdefault(info.input, {"place": None, "lag": {}})
        entry["lag"][str(info.partition)] = info.lag
    for name in out:
        try:
            place = open_input(job, name).location()
        except LocalStateError:
            place = None
        out[name]["place"] = None if place is None else f"{place[0]}:{place[1]}"
    return out


def _formats(checkpoints: dict[int, Checkpoint | None]) -> dict[str, str]:
    merged: dict[str, str] = {}
    for checkpoint in checkpoints.values():
        if checkpoint is not None:
            merged.update(checkpoint.formats)
    return merged


def read_partition(job: JobConfig, stores: list[StoreConfig], partition: int
                   ) -> tuple[Checkpoint | None, dict[str, tuple[list[bytes], list[bytes]]]]:
    """One partition's checkpoint and every store's committed records at it. The changelogs'
    compaction state is noted before the checkpoint is read and compared after: a compaction that ran
    meanwhile (it may have dropped a record the checkpoint still needs, keeping a later one) makes the
    partition be read again, at the checkpoint then current."""
    for attempt in range(1, _READ_ATTEMPTS + 1):
        before = _compaction_state(job, stores, partition)
        checkpoint = load_checkpoints(job)[partition] if job.partitions else None
        try:
            contents = {config.name: committed_columns(job, config, partition, checkpoint) for config in stores}
        except ChangelogError:
            if attempt == _READ_ATTEMPTS:
                raise
            log.info("partition %d: an object the checkpoint names went away while it was read; reading again "
                     "at the newest checkpoint", partition)
            continue
        if _compaction_state(job, stores, partition) == before:
            return checkpoint, contents
        log.info("partition %d: its changelogs were compacted while they were read; reading again", partition)
    raise ChangelogError(f"partition {partition}: the changelogs kept being compacted while the savepoint read them",
                         partition=partition, hint="take the savepoint again (or when the job is stopped)")


def _compaction_state(job: JobConfig, stores: list[StoreConfig], partition: int) -> Any:
    """What compaction has done to the partition's local changelogs: their sealed segments (names and
    sizes; compaction rewrites or deletes only those). None for systems without local segments."""
    system = open_changelog_system(job)
    try:
        if not isinstance(system, LocalStreams):
            return None
        state = []
        for config in stores:
            assert config.changelog is not None
            if system.partition_dir(config.changelog, partition).is_dir():
                state.append(tuple(system.segments(config.changelog, partition))[:-1])
        return state
    finally:
        system.close()
