"""Starting a job from a savepoint: the new state is written as a new epoch, then switched to in one
atomic step.

The saved state is read through :class:`~.saved.SavedState`: a savepoint's files
(:class:`~.reader.Savepoint`), or a stopped job's committed state read in place
(:class:`~.durable.DurableState`, what ``rescale`` starts from).

:func:`load_savepoint` reserves a new epoch number in the job's epoch pointer, writes every logged
store's records into the new epoch's changelog streams (re-partitioned by :mod:`.routing` when the
partition count changes; migrated and re-encoded by :mod:`.sources`), writes each new partition's
checkpoint, and only then replaces the pointer (:func:`~localstate.runtime.layout.write_epoch`: a
temporary file and a rename, or one PUT). A process killed at any point before that write leaves the
pointer naming the old epoch, intact and runnable (what the new epoch got so far is never read, and
its number is never handed out again); killed after it, the new epoch is complete. The old epoch is
kept, its checkpoints marked retired (a run that started before cannot write there), until
``localstate reset --old-epochs`` removes it.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field, replace
from typing import Any, Callable

from localstate.core.changelog import ChangelogPartition, ListedHistory, ManifestedChangelog
from localstate.core.checkpoint import Checkpoint
from localstate.core.config import JobConfig, StoreConfig
from localstate.core.partitioner import partition_for
from localstate.core.time import TIMER_STORE
from localstate.errors import InputLagError, RescaleError, SavepointMismatchError, StateExistsError
from localstate.runtime.driver.views import load_checkpoints
from localstate.runtime.layout import (EpochPointer, epoch_checkpoint_store, open_changelog_system, read_epoch,
                                       with_epoch, write_epoch)
from localstate.runtime.partition.faults import crash_point
from localstate.runtime.statedata.saved import SavedState
from localstate.runtime.statedata.routing import KeyRouter, MergeRouter, Placed, router_for
from localstate.runtime.statedata.sources import Migration, StoreSource
from localstate.runtime.statedata.timer_routing import TimerRouter, window_stores_of
from localstate.runtime.statedata.writer import logged_stores, store_formats

__all__ = ["LoadOptions", "load_savepoint", "has_state", "FLUSH_BYTES"]

log = logging.getLogger(__name__)

FLUSH_BYTES = 16 << 20
"""Bytes appended to one new changelog partition between its flushes (bounded memory)."""


@dataclass
class LoadOptions:
    """How a savepoint is taken in (see :func:`load_savepoint`)."""

    yes: bool = False
    """replace a job that has state (its current epoch is kept, no longer current)"""
    migrations: dict[str, Migration] = field(default_factory=dict)
    drop_stores: set[str] = field(default_factory=set)
    """stores of the savepoint the job no longer has, dropped on purpose"""
    other_job: bool = False
    """take a savepoint of a job of another name"""
    source: str = ""
    """what the new epoch comes from, for the pointer (``rescale``, ``savepoint <where>``)"""
    progress: Callable[[str], None] | None = None


def has_state(job: JobConfig) -> bool:
    """Whether ``job`` (bound to an epoch) has committed anything."""
    return any(checkpoint is not None for checkpoint in load_checkpoints(job).values())


def load_savepoint(savepoint: SavedState, job: JobConfig, options: LoadOptions | None = None) -> EpochPointer:
    """Make ``savepoint`` the state of ``job`` (its partition count, stores, backends, serdes and
    changelog system as the job file says now) in a new epoch, and switch to it; returns the new
    pointer. Refuses (nothing changed): a savepoint of another job (SavepointMismatchError), stores
    that do not fit, a job that has state without ``options.yes`` (StateExistsError), a partition
    count change the savepoint's inputs or stores make unsound (InputLagError, RescaleError).
    Crash points: ``epoch_reserved``, ``epoch_store`` (after each store), ``epoch_checkpoints``,
    ``epoch_flipped``."""
    options = options or LoadOptions()
    manifest = savepoint.manifest
    _check_fits(savepoint, job, options)
    current = read_epoch(job)
    current_job = with_epoch(job, current.epoch)
    if not options.yes and has_state(current_job):
        raise StateExistsError(f"job {job.name!r} already has state (epoch {current.epoch}): starting it from "
                               f"{savepoint.where()} would replace it", job=job.name,
                               hint="re-run with --yes to switch to the savepoint's state (the current state is kept, "
                                    "no longer current, until `localstate reset --old-epochs --yes`)")
    rescaled = manifest.partitions != job.partitions
    moved = _check_drained(savepoint) if rescaled else {}
    new = max(current.reserved, current.epoch) + 1
    history = dict(current.history)
    if current.partitions is not None or (manifest.job == job.name and manifest.epoch == current.epoch):
        history.setdefault(str(current.epoch), current.partitions or manifest.partitions)
    history[str(new)] = job.partitions
    write_epoch(job, replace(current, reserved=new, history=history))
    crash_point("epoch_reserved")
    target = with_epoch(job, new)
    writer = _EpochWriter(savepoint, target, options)
    written = writer.write()
    checkpoints = epoch_checkpoint_store(target)
    for checkpoint in _checkpoints(savepoint, target, written, writer.next_timer, writer.formats):
        checkpoints.save(checkpoint)
    crash_point("epoch_checkpoints")
    pointer = EpochPointer(epoch=new, partitions=job.partitions, reserved=new, previous=current.epoch, history=history,
                           source=options.source or f"savepoint {savepoint.where()}", created=time.time(),
                           moved_inputs=moved if rescaled else dict(current.moved_inputs))
    write_epoch(job, pointer)
    crash_point("epoch_flipped")
    try:
        epoch_checkpoint_store(current_job).retire(f"epoch {current.epoch} was replaced by epoch {new} "
                                                   f"({pointer.source})")
    except Exception as exc:  # noqa: BLE001 - the switch is done; the marker only fences late runs
        log.warning("could not mark epoch %d retired: %s", current.epoch, exc)
    return pointer


def _check_fits(savepoint: SavedState, job: JobConfig, options: LoadOptions) -> None:
    manifest = savepoint.manifest
    if manifest.job != job.name and not options.other_job:
        raise SavepointMismatchError(f"savepoint {savepoint.where()} belongs to job {manifest.job!r}, not "
                                     f"{job.name!r}", job=job.name, savepoint_job=manifest.job,
                                     hint="use a savepoint of this job; to seed this job with another job's state on "
                                          "purpose, pass --other-job")
    missing = sorted(set(manifest.stores) - {c.name for c in logged_stores(job)} - set(options.drop_stores))
    if missing:
        raise SavepointMismatchError(f"the savepoint holds store(s) {', '.join(missing)} that job {job.name!r} does not "
                                     "have (or keeps without a changelog)", stores=", ".join(missing),
                                     hint="add them back to the job, or drop their state on purpose with "
                                          "--drop-store NAME")
    unknown = sorted(set(options.migrations) - set(manifest.stores))
    if unknown:
        raise SavepointMismatchError(f"migration(s) for store(s) {', '.join(unknown)} that the savepoint does not "
                                     "hold", stores=", ".join(unknown), hint="name stores of the savepoint")


def _check_drained(savepoint: SavedState) -> dict[str, str]:
    """With another partition count, every input must have been drained when the savepoint was taken
    (InputLagError otherwise); returns each input's place then, which the new state refuses to read."""
    moved: dict[str, str] = {}
    for name, entry in sorted(savepoint.manifest.inputs.items()):
        for partition, lag in sorted(entry.get("lag", {}).items(), key=lambda item: int(item[0])):
            if lag is None or lag > 0:
                what = "an unknown number of" if lag is None else f"{lag}"
                raise InputLagError(
                    f"input {name!r} partition {partition} held {what} record(s) the job had not processed when the "
                    "savepoint was taken: with another partition count they would reach partitions that do not hold "
                    "their keys' state", input=name, partition=int(partition), lag=lag,
                    hint="run the job to the end of its inputs first (`localstate run JOB --until-drained`), then take "
                         "the savepoint (or rescale) again")
        if entry.get("place"):
            moved[name] = entry["place"]
    return moved


class _EpochWriter:
    """Writes every logged store of the new epoch from the savepoint; returns, per store, each new
    partition's changelog end offset and manifest."""

    def __init__(self, savepoint: SavedState, target: JobConfig, options: LoadOptions) -> None:
        self.savepoint = savepoint
        self.target = target
        self.options = options
        self.old = savepoint.manifest.partitions
        self.new = target.partitions
        self.formats = store_formats(target)
        self.next_timer: dict[int, float] = {}
        """new partition -> its earliest processing-time timer (when the timers were re-partitioned)"""

    def write(self) -> dict[str, dict[int, tuple[int, dict[str, Any] | None]]]:
        stores = [c for c in logged_stores(self.target) if c.name != TIMER_STORE]
        timers = self.target.stores.get(TIMER_STORE)
        window_stores = self._window_stores() if timers is not None and self.old != self.new else set()
        routers: dict[str, KeyRouter | MergeRouter] = {}
        written = {}
        for config in stores:
            streams, router = self._write_store(config, window_stores)
            written[config.name] = streams
            if router is not None:
                routers[config.name] = router
        if timers is not None:
            written[TIMER_STORE] = self._write_timers(timers, routers)
        return written

    def _window_stores(self) -> set[str]:
        if TIMER_STORE not in self.savepoint.manifest.stores:
            return set()
        decode = self.target.registry.serde(self.savepoint.manifest.timer_key_serde,
                                            allow_pickle=self.target.allow_pickle).deserialize
        found: set[str] = set()
        for partition in range(self.old):
            for keys, _ in self.savepoint.records(TIMER_STORE, partition):
                found |= window_stores_of(keys, decode)
        return found

    def _source(self, config: StoreConfig) -> StoreSource | None:
        if config.name not in self.savepoint.manifest.stores:
            return None
        return StoreSource(self.savepoint, config, self.target, self.formats.get(config.name),
                           self.options.migrations.get(config.name))

    def _write_store(self, config: StoreConfig, window_stores: set[str]
                     ) -> tuple[dict[int, tuple[int, dict[str, Any] | None]], KeyRouter | MergeRouter | None]:
        source = self._source(config)
        router = None
        with _Streams(self.target, config, self.new) as streams:
            if source is not None:
                if self.old != self.new:
                    router = router_for(self.target, config, self.old, self.new, window_stores)
                for partition in range(self.old):
                    for keys, values in source.chunks(partition):
                        streams.write(router.route(partition, keys, values) if router else {partition: (keys, values)})
                        streams.write(_by_new_key(source.take_moved(), self.new))
                if router is not None:
                    streams.write(router.copy_records())
            done = streams.finish()
        self._progress(f"store {config.name}: {sum(streams.records.values()):,} record(s) in {self.new} partition(s)")
        crash_point("epoch_store")
        return done, router

    def _write_timers(self, config: StoreConfig, routers: dict[str, Any]) -> dict[int, tuple[int, dict[str, Any] | None]]:
        source = self._source(config) if TIMER_STORE in self.savepoint.manifest.stores else None
        convert = self._timer_key_converter()
        router = TimerRouter(self.target, self.old, self.new, self.savepoint.manifest.timer_key_serde) \
            if self.old != self.new else None

        def window_targets(store: str, partition: int) -> dict[int | None, set[int]]:
            found = routers.get(store)
            return getattr(found, "window_targets", {}).get(partition, {})
        with _Streams(self.target, config, self.new) as streams:
            for partition in range(self.old if source is not None else 0):
                for keys, _ in source.chunks(partition):  # type: ignore[union-attr]
                    placed = router.route(partition, keys, window_targets) if router else {partition: (keys, [b""] * len(keys))}
                    streams.write({q: ([convert(k) for k in ks], vs) for q, (ks, vs) in placed.items()})
            done = streams.finish()
        if router is not None:
            self.next_timer = router.next_timer
        crash_point("epoch_store")
        return done

    def _timer_key_converter(self) -> Callable[[bytes], bytes]:
        old, new = self.savepoint.manifest.timer_key_serde, self.target.time.timer_key_serde
        if old == new:
            return lambda entry: entry
        registry, pickle = self.target.registry, self.target.allow_pickle
        decode, encode = registry.serde(old, allow_pickle=pickle).deserialize, registry.serde(new, allow_pickle=pickle).serialize
        return lambda entry: entry[:9] + encode(decode(entry[9:]))

    def _progress(self, text: str) -> None:
        if self.options.progress is not None:
            self.options.progress(text)


def _by_new_key(moved: list[tuple[Any, bytes, bytes]], partitions: int) -> Placed:
    """Records a migration gave a new key, each placed in its new key's partition."""
    placed: Placed = {}
    for key, data, value in moved:
        bucket = placed.setdefault(partition_for(key, partitions), ([], []))
        bucket[0].append(data)
        bucket[1].append(value)
    return placed


class _Streams:
    """The new epoch's changelog partitions of one store: appended to, flushed every
    :data:`FLUSH_BYTES`, each checked to start empty."""

    def __init__(self, job: JobConfig, config: StoreConfig, partitions: int) -> None:
        assert config.changelog is not None
        self.system = open_changelog_system(job)
        self.stream = config.changelog
        self.store = config.name
        self.partitions = partitions
        self.open: dict[int, ChangelogPartition] = {}
        self.pending = dict.fromkeys(range(partitions), 0)
        self.records = dict.fromkeys(range(partitions), 0)

    def __enter__(self) -> "_Streams":
        self.system.ensure_stream(self.stream, self.partitions)
        return self

    def partition(self, partition: int) -> ChangelogPartition:
        found = self.open.get(partition)
        if found is None:
            found = self.system.partition(self.stream, partition)
            if isinstance(found, ManifestedChangelog):
                found.adopt(None)
            history = found.stored_history() if isinstance(found, ListedHistory) else None
            if found.end_offset() or history is not None:
                found.close()
                raise StateExistsError(f"changelog {self.stream!r} partition {partition} of the new state already holds "
                                       "records", stream=self.stream, partition=partition,
                                       hint="another stream of this name exists: rename the store's changelog, or "
                                            "remove the stream")
            self.open[partition] = found
        return found

    def write(self, placed: Placed) -> None:
        for partition, (keys, values) in placed.items():
            if not keys:
                continue
            changelog = self.partition(partition)
            changelog.append_many(zip(keys, values))
            self.records[partition] += len(keys)
            self.pending[partition] += sum(map(len, keys)) + sum(map(len, values))
            if self.pending[partition] >= FLUSH_BYTES:
                changelog.flush()
                self.pending[partition] = 0

    def finish(self) -> dict[int, tuple[int, dict[str, Any] | None]]:
        out = {}
        for partition in range(self.partitions):
            changelog = self.partition(partition)
            end = changelog.flush()
            manifest = changelog.manifest() if isinstance(changelog, ManifestedChangelog) else None
            out[partition] = (end, manifest)
        return out

    def __exit__(self, *exc: object) -> None:
        for changelog in self.open.values():
            changelog.close()
        self.system.close()


def _checkpoints(savepoint: SavedState, target: JobConfig, written: dict[str, dict[int, tuple[int, dict[str, Any] | None]]],
                 next_timer: dict[int, float], formats: dict[str, str]) -> list[Checkpoint]:
    """Each new partition's checkpoint: the new changelogs' offsets and manifests; with the same
    partition count the savepoint's positions, watermark, timers and outputs as they were, else every
    input from the start of its new layout, the lowest watermark, each partition's earliest timer."""
    manifest = savepoint.manifest
    old = manifest.checkpoints
    rescaled = manifest.partitions != target.partitions
    batch = _common_batch(old) if rescaled else None
    marks = [c.watermark for c in old.values() if c is not None and c.watermark is not None]
    out = []
    for partition in range(target.partitions):
        changelogs = {store: streams[partition][0] for store, streams in written.items()}
        manifests = {store: streams[partition][1] for store, streams in written.items()
                     if streams[partition][1] is not None}
        before = old.get(partition) if not rescaled else None
        if not rescaled:
            kept = before or Checkpoint(partition)
            out.append(replace(kept, generation=0, changelogs=changelogs, manifests=manifests, formats=formats,
                               attempt=None, outputs=_outputs(kept.outputs)))
            continue
        carried = old.get(partition)
        out.append(Checkpoint(
            partition, inputs={name: 0 for name in target.inputs}, changelogs=changelogs, manifests=manifests,
            formats=formats, outputs=_outputs(carried.outputs) if carried is not None else {}, batch=batch,
            watermark=min(marks) if marks else None, next_timer=next_timer.get(partition)))
    return out


def _outputs(outputs: dict[str, int]) -> dict[str, int]:
    """Output positions carried to the new epoch; the DataFrame step's count of its last batch's output
    rows is not (that file stays with the old epoch)."""
    return {name: position for name, position in outputs.items() if name != "dataframe-outputs"}


def _common_batch(checkpoints: dict[int, Checkpoint | None]) -> int | None:
    batches = {c.batch for c in checkpoints.values() if c is not None and c.batch is not None}
    if len(batches) > 1:
        raise RescaleError(f"the partitions applied different DataFrame batches ({', '.join(map(str, sorted(batches)))}):"
                           " a partition count change is sound only between two batches",
                           hint="let the query finish its batch (or run it once more), then rescale")
    return batches.pop() if batches else None
