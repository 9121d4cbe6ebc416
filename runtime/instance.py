"""The in-process runtime of one task partition: open and recover its stores, feed the user's
task in order, commit atomically. Tests, the TaskTestDriver and each Spark task all use it.

Commit (exactly-once state): flush every store (local write + changelog durable, end offsets known)
-> deliver outputs (durable, positions known) -> atomically write the checkpoint (input positions,
changelog offsets, output positions, generation). On open, every logged store is brought back to
exactly the checkpoint (:mod:`localstate.core.recovery`), outputs written after it are rolled back,
and inputs resume from the checkpointed positions; records below those positions are skipped.

Pipelined commits (``job.pipelined_commits``, on by default): when every logged store's changelog
only *starts* its write at flush (:class:`~localstate.core.changelog.DeferredDurability`: the
objectstore's delta PUT), :meth:`TaskInstance.commit` flushes the stores, delivers the outputs and
builds checkpoint N naming the objects in flight, then returns; a committer thread saves checkpoint N
once every object it names is durably written. At most :data:`PIPELINE_DEPTH` commits are in
flight (a commit beyond that first waits for the oldest save); saves run in order on that one
thread, fenced by generation as always, and a save that a newer commit already follows is skipped
(the newer checkpoint covers it). :meth:`TaskInstance.close` and :meth:`TaskInstance.settle_commit`
wait for every save. A crash with commit N pending is a
crash between a flush and its checkpoint: recovery rolls the stores back to checkpoint N-1, the sink
trims the outputs to it and the inputs resume from it. A failed write surfaces, typed, at the next
commit or close, and checkpoint N is never saved. :meth:`TaskInstance.prepare_commit` (the Spark
path: the driver saves the checkpoint) always waits for durability.
"""

from __future__ import annotations

import concurrent.futures
import logging
import time
from collections import deque
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from itertools import islice
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Iterable, Mapping, Protocol

from localstate.core.changelog import ChangelogPartition, ChangelogSystem, DeferredDurability, ManifestedChangelog, NullChangelogWriter
from localstate.core.checkpoint import Checkpoint, CheckpointStore
from localstate.core.config import TIMER_STORE, JobConfig
from localstate.core.corruption import wipe_local
from localstate.core.engine import StateFormat, StorageEngine, StoreContext, TimedStore
from localstate.core.layout import store_root, store_directory, checkpoint_store, check_no_history, checkpoint_where
from localstate.runtime.faults import crash_point, crash_points, is_armed
from localstate.runtime.timers import PartitionTime
from localstate.runtime.records import BATCH_ROWS, CHUNK, PROCESS_HINT, ArrowRows, ColumnRows, FeedStats, \
    InputPolicy, apply_on_error, make_envelope
from localstate.core.fsutil import ensure_dir, os_error, read_nofollow, write_atomic
from localstate.core.names import safe_join
from localstate.core.recovery import StoreRecovery, compaction_horizon, is_stale, recover_store
from localstate.core.task import BatchTask, Collector, Coordinator, Envelope, OutgoingMessage, StreamTask, \
    TaskContext, TaskCounters, load_task_class, merge_counts, record_batch
from localstate.core.tracebacks import raise_task_error
from localstate.errors import ConfigError, StoreCorruptError, StoreIOError

__all__ = ["OutputSink", "MemorySink", "TaskInstance", "PROCESS_HINT"]

if TYPE_CHECKING:
    from localstate.core.streams.base import InputRecord

log = logging.getLogger(__name__)

PIPELINE_DEPTH = 2
"""Pipelined commits in flight at most: one being saved and one waiting behind it, so a commit does
not wait when one save (a PUT plus the checkpoint's requests, each needing the GIL back from the
busy task thread) takes a little longer than a batch."""


def _before_timer() -> None:
    crash_point("timer_fire")


class OutputSink(Protocol):
    """Where committed outputs go. ``write`` is durable and returns the end position of each
    stream written; ``rollback`` discards anything after the given positions (exactly-once outputs
    for sinks that can do it) and may return the position of every output for the next checkpoint."""

    def write(self, partition: int, messages: list[OutgoingMessage]) -> Mapping[str, int]: ...

    def rollback(self, partition: int, positions: Mapping[str, int]) -> Mapping[str, int] | None: ...


class MemorySink:
    """Outputs kept in lists per (stream, partition): for tests and the TaskTestDriver."""

    def __init__(self) -> None:
        self.streams: dict[tuple[str, int], list[OutgoingMessage]] = {}

    def write(self, partition: int, messages: list[OutgoingMessage]) -> dict[str, int]:
        for message in messages:
            self.streams.setdefault((message.stream, partition), []).append(message)
        return {stream: len(items) for (stream, p), items in self.streams.items() if p == partition}

    def rollback(self, partition: int, positions: Mapping[str, int]) -> None:
        for (stream, p), items in self.streams.items():
            if p == partition:
                del items[positions.get(stream, 0):]

    def messages(self, stream: str) -> list[OutgoingMessage]:
        return [m for (s, _), items in sorted(self.streams.items()) if s == stream for m in items]


@dataclass
class _Store:
    name: str
    engine: StorageEngine
    changelog: ChangelogPartition | None


@dataclass
class TaskInstance:
    """One live task partition. Not thread safe: one caller drives it."""

    job: JobConfig
    partition: int
    changelogs: ChangelogSystem
    sink: OutputSink = field(default_factory=MemorySink)
    task_factory: Callable[[], StreamTask] | str | None = None
    clock: Callable[[], float] = time.monotonic
    checkpoints: CheckpointStore | None = None
    """where checkpoints are read and written: the job's :class:`CheckpointStore` unless given (on a
    cluster, the driver's checkpoint as the plan carries it, see :mod:`localstate.runtime.spark.cluster`)"""
    local_root: Path | None = None
    """the directory the local stores live under: :func:`store_root` unless given"""
    attempt: str | None = None
    """cluster mode: this attempt's unique id. It is recorded next to each local store when the store
    has been recovered, and in every checkpoint this instance prepares; at the next open on this host
    local state is kept only if the committed checkpoint names the attempt that last wrote it, else it
    is discarded and rebuilt (it may hold an uncommitted attempt's writes at the committed offsets)"""
    processing_clock: Callable[[], float] = time.time
    """processing time (seconds since the epoch) for timers and the stores' TTL: the wall clock
    unless given (the TaskTestDriver's is moved by the test)"""

    def __post_init__(self) -> None:
        self.task_factory = load_task_class(self.task_factory or self.job.task)
        if self.checkpoints is None:
            self.checkpoints = checkpoint_store(self.job)
        if self.local_root is None:
            self.local_root = store_root(self.job)
        self.stores: dict[str, _Store] = {}
        self.positions: dict[str, int] = {}
        self.input_ids: dict[str, str] = {}
        """input -> identity of what it read (:attr:`Checkpoint.input_ids`), carried from commit to
        commit; the planner that checks an input's identity records the current one (a driver)"""
        self.generation = 0
        self.batch: int | None = None
        """the last DataFrame micro-batch applied (:attr:`Checkpoint.batch`), carried into every checkpoint"""
        self.collector = Collector()
        self.coordinator = Coordinator()
        self.counters = TaskCounters()
        """what the task partition dropped or redirected (``context.counters``), taken at each commit"""
        self.prepared_counts: dict[str, dict[str, int]] = {}
        """the counts the last prepared commit covers (reported with its batch once it is saved)"""
        self.counted: dict[str, dict[str, int]] = {}
        """the counts of every commit this instance made, summed"""
        self.recoveries: list[StoreRecovery] = []
        self.task: StreamTask | None = None
        self.time = PartitionTime(self.job, self.partition, self.processing_clock)
        """the partition's watermark, clock and timers (``context.timers``, each store's ``time``)"""
        self.timers_fired = 0
        self.processed_since_commit = 0
        self.commits = 0
        self.pipelined = False
        """whether :meth:`commit` is pipelined (decided at :meth:`open`, see the module docstring)"""
        self._saves: deque[Future[None]] = deque()  # pipelined commits' checkpoint saves, oldest first
        self._submitted = 0  # pipelined commits submitted so far (a save knows whether a newer one follows)
        self._committer: ThreadPoolExecutor | None = None
        self.commit_wait_seconds = 0.0
        """time :meth:`settle_commit` waited for a pipelined commit's save (what pipelining did not hide)"""
        self.checkpoint_seconds = 0.0
        """time spent saving checkpoints, on whichever thread saved them (the committer's, pipelined)"""
        self._last_commit = self._last_window = self.clock()
        self._open = False

    # -- lifecycle -----------------------------------------------------------------------------
    def open(self) -> list[StoreRecovery]:
        """Lock the partition, recover every store to the checkpoint, and init the task."""
        self.checkpoints.lock(self.partition)
        try:
            return self._open_locked()
        except BaseException:
            self._release_after_failure()
            raise

    def _open_locked(self) -> list[StoreRecovery]:
        checkpoint = self.checkpoints.load(self.partition)
        manifests = checkpoint.manifests if checkpoint is not None else {}
        committed_attempt = checkpoint.attempt if checkpoint is not None else None
        self.time = PartitionTime(self.job, self.partition, self.processing_clock,
                                  checkpoint.watermark if checkpoint is not None else None)
        formats = checkpoint.formats if checkpoint is not None else {}
        for name, store in self.job.stores.items():
            self.stores[name] = self._open_store(name, store, manifests.get(name), committed_attempt, formats.get(name))
        if checkpoint is not None:
            self._check_state_formats(checkpoint.formats)
        fresh = checkpoint is None
        if checkpoint is None:
            self._check_fresh()
            checkpoint = Checkpoint(self.partition)
        logged = [store.changelog for store in self.stores.values() if store.changelog is not None]
        self.pipelined = self.job.pipelined_commits and bool(logged) and all(
            isinstance(changelog, DeferredDurability) and isinstance(changelog, ManifestedChangelog)
            for changelog in logged)
        for name, store in self.stores.items():
            if store.changelog is not None:
                if name not in checkpoint.changelogs and not fresh:
                    # A store new to the job starts empty; one whose changelog holds records is refused.
                    check_no_history(store.changelog, store=name, partition=self.partition, entry_only=True,
                                     checkpoint_where=checkpoint_where(self.checkpoints, self.partition))
                offset = checkpoint.changelogs.get(name, 0)
                self.recoveries.append(self._recover(name, store, offset))
            else:
                store.engine.flush()
        if self.attempt is not None:
            for name in self.stores:  # from here on, this attempt writes the local state
                marker = self._attempt_marker(name)
                try:
                    ensure_dir(self.local_root, marker.parent)
                except OSError as exc:
                    raise os_error(exc, "create the directory", marker.parent, StoreIOError, store=name,
                                   partition=self.partition) from exc
                write_atomic(marker, self.attempt.encode(), error=StoreIOError)
        # The sink returns every output's position (StreamSink), so even this first checkpoint covers
        # the outputs: a restart then truncates what this instance wrote instead of refusing it.
        outputs = self.sink.rollback(self.partition, checkpoint.outputs) or dict(checkpoint.outputs)
        self.positions = dict(checkpoint.inputs)
        self.input_ids = dict(checkpoint.input_ids)
        self.batch = checkpoint.batch
        self.generation = checkpoint.generation + 1
        self.task = self._create_task()
        timers = self.stores.get(TIMER_STORE)
        if timers is not None:
            self.time.attach(timers.engine, self.job.registry.serde(self.job.time.timer_key_serde,
                                                                    allow_pickle=self.job.allow_pickle),
                             task_fires=type(self.task).on_timer is not StreamTask.on_timer)
        # Taking a new generation fences any stale instance still writing with the old one. Everything
        # a checkpoint records is in place by now (the timers above: their next processing-time
        # timer), so this checkpoint carries every field of the one it follows.
        self.checkpoints.save(self._checkpoint(outputs), expect_generation=checkpoint.generation)
        context = TaskContext(self.job.name, self.partition, self.job.partitions,
                              {name: s.engine for name, s in self.stores.items() if name != TIMER_STORE}, self.job,
                              timers=self.time, counters=self.counters)
        try:
            self.task.init(context)
        except (Exception, SystemExit) as exc:
            raise_task_error(exc, "init()", partition=self.partition,
                             hint="fix the task's init(); no input was processed and the state is unchanged")
        self._open = True
        self._last_commit = self._last_window = self.clock()
        return self.recoveries

    def _check_state_formats(self, recorded: Mapping[str, str]) -> None:
        """ConfigError if a store's engine lays out its state otherwise than the checkpoint recorded
        (:class:`StateFormat`: e.g. ``ttl`` added to or removed from a kv store's options), before
        anything reads the old state in the wrong layout."""
        for name, store in self.stores.items():
            now = store.engine.state_format if isinstance(store.engine, StateFormat) else None
            before = recorded.get(name)
            if before is not None and now is not None and before != now:
                raise ConfigError.at(
                    f"stores.{name}",
                    f"store {name!r} (partition {self.partition}) holds state committed in the {before!r} layout, "
                    f"but its options now give {now!r} (such as ttl added or removed): its state would be read "
                    f"in the wrong layout",
                    hint=f"put the store's options back as they were, or start store {name!r} over "
                         f"(`localstate reset`, or a new store name)")

    def _create_task(self) -> StreamTask:
        """Construct the user's task; a failure is a TaskError naming the user's file and line."""
        try:
            return self.task_factory()  # type: ignore[misc]
        except (Exception, SystemExit) as exc:
            name = getattr(self.task_factory, "__qualname__", None) or repr(self.task_factory)
            raise_task_error(exc, f"constructor {name}()", partition=self.partition,
                             hint="fix the task's __init__ (or factory); no input was processed and the state "
                                  "is unchanged")

    def _attempt_marker(self, store: str) -> Path:
        """``<root>/<job>/attempts/<store>/<partition>``: the attempt that last wrote this host's local
        state of the store partition (cluster mode), kept beside the stores, not inside them."""
        return safe_join(self.local_root, self.job.name, "attempts", store, str(self.partition))

    def _forget_attempt(self, store: str) -> None:
        marker = self._attempt_marker(store)
        try:
            marker.unlink(missing_ok=True)  # a symlink is removed itself, never followed
        except OSError as exc:
            raise os_error(exc, "remove the attempt marker", marker, StoreIOError, store=store,
                           partition=self.partition) from exc

    def _last_attempt(self, store: str) -> str | None:
        try:
            return read_nofollow(self._attempt_marker(store)).decode("ascii", "replace")
        except FileNotFoundError:
            return None
        except OSError as exc:
            raise os_error(exc, "read the attempt marker of", self._attempt_marker(store), StoreIOError,
                           store=store, partition=self.partition) from exc

    def _open_store(self, name: str, config: Any, manifest: dict[str, Any] | None = None,
                    committed_attempt: str | None = None, state_format: str | None = None) -> _Store:
        registry = self.job.registry
        factory = registry.engine_factory(config.engine)
        changelog = None
        if config.changelog is not None:
            self.changelogs.ensure_stream(config.changelog, self.job.partitions)
            changelog = self.changelogs.partition(config.changelog, self.partition)
            if isinstance(changelog, ManifestedChangelog):
                # The checkpoint, not the storage, says which objects hold committed records.
                changelog.adopt(manifest)
        directory = store_directory(self.job, name, self.partition, self.local_root)
        try:
            ensure_dir(self.local_root, directory)
        except OSError as exc:
            raise os_error(exc, "create the store directory", directory, StoreIOError, store=name,
                           partition=self.partition) from exc
        context = StoreContext(
            job=self.job.name, store=name, partition=self.partition, directory=directory, options=config.options,
            key_serde=registry.serde(config.key_serde, allow_pickle=self.job.allow_pickle),
            value_serde=registry.serde(config.value_serde, allow_pickle=self.job.allow_pickle),
            changelog=changelog if changelog is not None else NullChangelogWriter(), logged=changelog is not None,
            # backends are found through the job's plugin policy; state_format: the layout the committed
            # checkpoint recorded (an engine may trust its state to be in it, see _check_state_formats)
            extra={"registry": registry, "state_format": state_format}, time=self.time)
        had_files = any(directory.iterdir())
        if self.attempt is None:
            # This instance writes the store without an attempt id (local mode): no attempt may later
            # take what it leaves as its own (a local-mode job sharing a cluster job's local_dir).
            self._forget_attempt(name)
        if had_files and changelog is not None and self.attempt is not None \
                and self._last_attempt(name) != committed_attempt:
            # Written by an attempt the driver did not commit (or not last): its offsets may match the
            # checkpoint's while its content does not. Local state is a cache: rebuild it.
            wipe_local(directory, "store", "it was last written by a task attempt that is not the committed one",
                       store=name, partition=self.partition)
            had_files = False
        try:
            engine = factory.create(context)
        except StoreCorruptError as exc:
            if changelog is None:
                raise
            engine = self._rebuild(factory, context, None, f"local state is damaged ({exc.message})")
        if changelog is not None and engine.local_offset() is None and had_files:
            # Unusable local state: start from an empty directory so stale keys cannot survive.
            engine = self._rebuild(factory, context, engine, "local state is unusable")
        if changelog is not None and is_stale(engine.local_offset(), changelog):
            # Compaction dropped a tombstone this state has not applied: replaying only the tail would
            # bring the deleted key back.
            engine = self._rebuild(factory, context, engine,
                                   f"local state (offset {engine.local_offset()}) is older than the changelog's "
                                   f"compaction horizon {compaction_horizon(changelog)}")
        return _Store(name, engine, changelog)

    def _recover(self, name: str, store: _Store, offset: int) -> StoreRecovery:
        """Recover ``store`` to changelog ``offset``; local state found damaged on the way is discarded
        and the store rebuilt from the changelog, once."""
        discard = lambda: self._discard_local(name)  # noqa: E731
        label = f"{name}[{self.partition}]"
        try:
            return recover_store(store.engine, store.changelog, offset, label=label, discard=discard)
        except StoreCorruptError as exc:
            log.warning("store %s partition %d: %s; rebuilding it from the changelog", name, self.partition,
                        exc.message)
            return recover_store(discard(), store.changelog, offset, label=label, discard=discard)

    def _discard_local(self, name: str) -> StorageEngine:
        """Close store ``name``, empty its directory and open it again, empty (recovery replays it)."""
        store = self.stores[name]
        factory = self.job.registry.engine_factory(self.job.stores[name].engine)
        store.engine = self._rebuild(factory, store.engine.context, store.engine, None)
        return store.engine

    def _rebuild(self, factory: Any, context: StoreContext, engine: StorageEngine | None,
                 reason: str | None) -> StorageEngine:
        """The one way local state is thrown away: close ``engine``, empty the store's directory and
        open a fresh, empty engine there (recovery then rebuilds it from the changelog). Local state
        is only a cache of the changelog."""
        if engine is not None:
            engine.close()
        wipe_local(context.directory, "state", reason, store=context.store, partition=context.partition)
        return factory.create(context)

    def _check_fresh(self) -> None:
        """No checkpoint: every logged store must be without records (see :func:`check_no_history`)."""
        where = checkpoint_where(self.checkpoints, self.partition)
        for name, store in self.stores.items():
            if store.changelog is not None:
                check_no_history(store.changelog, store=name, partition=self.partition, checkpoint_where=where)

    def close(self, commit: bool = True) -> None:
        """Stop cleanly: optionally commit, wait for the pipelined commit in flight to be saved (its
        error is raised), close the task; the stores and every lock (each changelog partition's writer
        lock, the partition lock) are released whatever fails. The first error is raised: a failed
        commit's rather than a store that then failed to close too (that one is logged)."""
        try:
            if self._open and commit:
                self.commit()
            self.settle_commit()
            if self.task is not None and self._open:
                try:
                    self.task.close()
                except (Exception, SystemExit) as exc:
                    raise_task_error(exc, "close()", partition=self.partition,
                                     hint="fix the task's close(); what was committed stays committed")
        except BaseException:
            self._release_after_failure()  # a failed commit too lets go of the stores and the locks
            raise
        self.abandon()

    def abandon(self) -> None:
        """Drop everything without committing (what a crash does, minus the process dying). A
        pipelined commit in flight finishes first (saved if its writes land, else dropped, logged):
        a later instance's generation must come after any checkpoint this one saves.

        Guarantee: every store is closed and every lock this instance holds (each changelog
        partition's writer lock, the partition lock) is released, even when closing a store fails
        (a full disk, an engine's bug): a new instance of the partition can then open in this
        process. The first error is raised afterwards; any later one is logged."""
        errors = self._release_all()
        if errors:
            raise errors[0]

    def _release_after_failure(self) -> None:
        """Release everything while another error is on its way up: that one stays the error raised,
        and what failed here is logged."""
        released = self._release_all()
        if released:
            log.warning("task partition %d: releasing the instance after a failure also failed: %s: %s",
                        self.partition, type(released[0]).__name__, released[0])

    def _release_all(self) -> list[BaseException]:
        """Close and release everything (see :meth:`abandon`), each step attempted whatever failed
        before it. Returns the errors, in order; all but the first are logged here."""
        errors: list[BaseException] = []

        def attempt(step: Callable[[], Any], what: str) -> None:
            try:
                step()
            except BaseException as exc:  # noqa: BLE001 - every lock is released first, then it is raised
                if errors:
                    log.warning("task partition %d: %s also failed while releasing the instance: %s: %s",
                                self.partition, what, type(exc).__name__, exc)
                errors.append(exc)

        attempt(self._drop_saves, "waiting for the commits in flight")
        stores = list(self.stores.items())
        self.stores.clear()
        for name, store in stores:
            attempt(store.engine.close, f"closing store {name!r}")
            if store.changelog is not None:
                attempt(store.changelog.close, f"closing the changelog of store {name!r}")
        attempt(lambda: self.checkpoints.unlock(self.partition), "releasing the partition lock")
        self._open = False
        return errors

    def _drop_saves(self) -> None:
        """Let the pipelined commits in flight finish (logged if not saved) and stop the committer."""
        saves, self._saves = list(self._saves), deque()
        concurrent.futures.wait(saves)
        for save in saves:
            if save.exception() is not None:
                log.warning("task partition %d: a commit in flight was not saved (%s); the last saved "
                            "checkpoint stays the committed one", self.partition, save.exception())
        if self._committer is not None:
            self._committer.shutdown(wait=True)
            self._committer = None

    # -- processing ----------------------------------------------------------------------------
    def position(self, stream: str) -> int:
        """The next offset to process from input ``stream`` (this partition)."""
        return self.positions.get(stream, 0)

    def feed(self, records: Iterable[tuple[str, "InputRecord"]], policies: Mapping[str, InputPolicy] | None = None,
             *, autocommit: bool = False) -> FeedStats:
        """The one feed loop (see :mod:`localstate.runtime.records`): feed ``(input stream, record)``
        pairs, in processing order, starting at the inputs' positions. Per record: the ``process``
        crash point; ``task.process()`` (a failure becomes a TaskError naming the user's frame) or,
        for a bad record, the input's ``on_error`` policy from ``policies`` (none: fail with an
        InputError); the input's position advances past it. With ``autocommit`` the instance commits
        between records as configured (``commit_every``/``commit_interval``, coordinator requests)
        and stops when the task asks to shut down; without it (a Spark batch) nothing commits until
        the caller does, and nothing runs between records but the loop itself.

        A :class:`BatchTask` gets the same records as Arrow batches (:meth:`_feed_batches`); the items
        may then also be :class:`ArrowRows`."""
        if isinstance(self.task, BatchTask):
            return self._feed_batches(records, policies, autocommit)
        stats = FeedStats()
        policies = policies or {}
        items = iter(records)
        partition = self.partition
        process = self.task.process  # type: ignore[union-attr]
        collector, coordinator, positions = self.collector, self.coordinator, self.positions
        envelope, point, clock = make_envelope, crash_point, time.perf_counter
        partition_time = self.time
        after_record = self._after_record if autocommit else None
        reading = 0.0
        n = 0
        try:
            while True:
                # Records are pulled in chunks so that reading and processing are timed apart for free.
                started = clock()
                chunk = list(islice(items, CHUNK))
                reading += clock() - started
                if not chunk:
                    break
                if chunk[0].__class__ is ArrowRows:  # rows held as Arrow (the DataFrame step)
                    chunk = [pair for rows in chunk for pair in rows.records()]
                for name, record in chunk:
                    point("process")
                    n += 1
                    if record.error is None:
                        ts = record.ts
                        try:
                            process(envelope(name, partition, record.offset, record.key, record.value, ts),
                                    collector, coordinator)
                        except (Exception, SystemExit) as exc:
                            raise_task_error(exc, "process()", stream=name, partition=partition,
                                             offset=record.offset, hint=PROCESS_HINT)
                        if ts is not None and ts > partition_time.high:
                            partition_time.high = ts  # after process(): it saw the watermark before the record
                    else:
                        apply_on_error(policies.get(name), self, name, record, stats)
                    positions[name] = record.offset + 1
                    if after_record is not None and after_record():
                        return stats
        finally:
            stats.records = n
            stats.read_seconds = reading
        return stats

    def _feed_batches(self, records: Iterable[Any], policies: Mapping[str, InputPolicy] | None,
                      autocommit: bool) -> FeedStats:
        """:meth:`feed` for a BatchTask (see :mod:`localstate.runtime.records`): up to
        :data:`BATCH_ROWS` records at a time become one Arrow batch (bad records get their input's
        ``on_error``, per row, and are left out of it), :class:`ArrowRows` items are delivered as they
        are; the inputs' positions advance past each whole batch, and with ``autocommit`` commits
        happen only between batches."""
        stats = FeedStats()
        policies = policies or {}
        items = iter(records)
        clock = time.perf_counter
        several = len(self.job.inputs) > 1
        reading = 0.0
        n = 0
        try:
            while True:
                started = clock()
                chunk = list(islice(items, BATCH_ROWS))
                reading += clock() - started
                if not chunk:
                    break
                if chunk[0].__class__ is ColumnRows:
                    for rows in chunk:
                        count = self._feed_columns(rows, policies, stats, several)
                        n += count
                        if autocommit and self._after_batch(count):
                            return stats
                    continue
                if chunk[0].__class__ is ArrowRows:
                    for rows in chunk:
                        count = rows.batch.num_rows
                        crash_points("process", count)
                        if count:
                            self._deliver(rows.batch, rows.stream, rows.start, count)
                            self._observe_column(rows.batch)
                            self.positions[rows.stream] = rows.start + count
                        n += count
                        if autocommit and self._after_batch(count):
                            return stats
                    continue
                crash_points("process", len(chunk))  # reached once per record, good or bad, as per record
                names, chosen = zip(*chunk)
                offsets, keys, values, times, errors, _raws = zip(*chosen)
                if errors.count(None) != len(errors):  # bad records: on_error per row, left out of the batch
                    good = []
                    for name, record in chunk:
                        if record.error is None:
                            good.append((name, record))
                        else:
                            apply_on_error(policies.get(name), self, name, record, stats)
                    if good:
                        good_names, good_records = zip(*good)
                        g_offsets, keys, values, times, _e, _r = zip(*good_records)
                    else:
                        good_names, g_offsets = (), ()
                else:
                    good_names, g_offsets = names, offsets
                if g_offsets:
                    batch = record_batch(list(good_names), list(g_offsets), list(keys), list(values), list(times),
                                         with_stream=several)
                    self._deliver(batch, good_names[0], g_offsets[0], len(g_offsets))
                    self._observe(times)  # after the batch: process_batch() saw the watermark before it
                positions = self.positions
                if len(set(names)) == 1:
                    positions[names[0]] = offsets[-1] + 1
                else:
                    for name, offset in zip(names, offsets):
                        positions[name] = offset + 1
                n += len(chunk)
                if autocommit and self._after_batch(len(chunk)):
                    return stats
        finally:
            stats.records = n
            stats.read_seconds = reading
        return stats

    def _feed_columns(self, rows: ColumnRows, policies: Mapping[str, InputPolicy], stats: FeedStats,
                      several: bool) -> int:
        """One chunk of an input read as columns: the ``process`` crash point per row, ``on_error``
        per bad row (in offset order), one batch of the good rows; the position moves past the chunk.
        Returns the rows fed."""
        name, columns = rows.stream, rows.columns
        count = columns.rows
        crash_points("process", count)
        for record in columns.bad:
            apply_on_error(policies.get(name), self, name, record, stats)
        if columns.offsets:
            batch = record_batch([name], columns.offsets, columns.keys, columns.values, columns.timestamps,
                                 with_stream=several)
            self._deliver(batch, name, columns.offsets[0], len(columns.offsets))
            self._observe_column(batch)  # after the batch: process_batch() saw the watermark before it
        self.positions[name] = columns.end
        return count

    def _observe(self, timestamps: Iterable[float | None]) -> None:
        """The event timestamps of a batch about to be delivered (None: a row without one)."""
        high = max((ts for ts in timestamps if ts is not None), default=None)
        if high is not None:
            self.time.observe(high)

    def _observe_column(self, batch: Any) -> None:
        """:meth:`_observe` of an Arrow batch's ``timestamp`` column."""
        import pyarrow.compute as pc  # the Arrow rows path has pyarrow loaded already

        if "timestamp" in batch.schema.names:
            self.time.observe(pc.max(batch.column("timestamp")).as_py())

    def refresh_store_time(self) -> None:
        """Make every store that reads its time once per commit (``core.engine.TimedStore``: a kv
        store with ttl) read the partition's time now: at a batch's start and when a test driver
        moves time."""
        for store in self.stores.values():
            if isinstance(store.engine, TimedStore):
                store.engine.refresh_time()

    def fire_timers(self) -> int:
        """Fire every due timer through the task's ``on_timer`` (see :mod:`localstate.runtime.timers`);
        their outputs and deletions are part of the next commit. Returns how many fired. Crash
        points: ``timer_fire`` before each timer, ``after_timers`` after a round that fired any."""
        if not self.time.due():
            return 0
        fired = self.time.fire(self.task.on_timer, self.collector, self.coordinator,  # type: ignore[union-attr]
                               self._timer_failed, _before_timer if is_armed("timer_fire") else None)
        if fired:
            self.timers_fired += fired
            crash_point("after_timers")
        return fired

    def _timer_failed(self, exc: BaseException, key: Any, timestamp: float) -> None:
        """The task's ``on_timer`` raised ``exc`` for the timer of ``key`` at ``timestamp``: a TaskError."""
        raise_task_error(exc, "on_timer()", partition=self.partition,
                         hint=f"fix the task's on_timer() (it failed for key {key!r} at {timestamp!r}); "
                              "state and timers are rolled back to the last commit on restart")

    def _deliver(self, batch: Any, stream: str, offset: int, rows: int) -> None:
        """``process_batch()`` of one batch (``rows`` rows, the first at ``stream``/``offset``); a
        failure becomes a TaskError naming the user's frame and the batch's first row."""
        try:
            self.task.process_batch(batch, self.collector, self.coordinator)  # type: ignore[union-attr]
        except (Exception, SystemExit) as exc:
            raise_task_error(exc, "process_batch()", stream=stream, partition=self.partition, offset=offset,
                             rows=rows, hint=PROCESS_HINT)

    def _after_batch(self, rows: int) -> bool:
        """Between two batches of an autocommitting feed: commit if due; True stops the feed."""
        self.processed_since_commit += rows
        self._after_call()
        return self.coordinator.shutdown_requested

    def process(self, envelope: Envelope) -> bool:
        """Process one record unless the checkpoint already covers it. May commit afterwards."""
        return self.process_all((envelope,)) == 1

    def process_all(self, envelopes: Iterable[Envelope], policies: Mapping[str, InputPolicy] | None = None) -> int:
        """Process ``envelopes`` in order, skipping those the checkpoint already covers; commits as
        configured and stops when the task asks to shut down. Returns how many were processed."""
        from localstate.core.streams.base import InputRecord  # the stream contract; imported when used

        # The feed loop builds each envelope again, from the record it carries.
        records = ((e.stream, InputRecord(e.offset, e.key, e.value, e.timestamp)) for e in envelopes
                   if e.offset >= self.positions.get(e.stream, 0))
        return self.feed(records, policies, autocommit=True).records

    def _after_record(self) -> bool:
        """Between two records of an autocommitting feed: commit if due; True stops the feed."""
        self.processed_since_commit += 1
        self._after_call()
        return self.coordinator.shutdown_requested

    def maybe_window(self) -> None:
        """Call the task's window() if ``window_interval`` has passed."""
        interval = self.job.window_interval
        if interval is not None and self.clock() - self._last_window >= interval:
            self.window()

    def window(self) -> None:
        self.fire_timers()
        self._last_window = self.clock()
        try:
            self.task.window(self.collector, self.coordinator)  # type: ignore[union-attr]
        except (Exception, SystemExit) as exc:
            raise_task_error(exc, "window()", partition=self.partition,
                             hint="fix the task's window(); state is rolled back to the last commit on restart")
        self._after_call()

    def _after_call(self) -> None:
        every = self.job.commit_every
        if (self.coordinator.commit_requested or (every is not None and self.processed_since_commit >= every)
                or (every is None and self.clock() - self._last_commit >= self.job.commit_interval)):
            self.commit()

    # -- commit --------------------------------------------------------------------------------
    def commit(self) -> Checkpoint:
        """Flush every store, deliver outputs, write the checkpoint atomically. Pipelined (see the
        module docstring), the checkpoint is saved in the background once its objects are durable.
        At most :data:`PIPELINE_DEPTH` commits are in flight: beyond that, this waits for the oldest
        save; the error of a finished save is raised here."""
        if not self.pipelined:
            checkpoint = self.prepare_commit()
            self.save_checkpoint(checkpoint)
            return checkpoint
        self._settle_saves(keep=PIPELINE_DEPTH - 1)
        try:
            checkpoint, waits = self._prepare(in_flight=True)
        except BaseException:
            # Typically the flush found a delta PUT failed, which also fails the save in flight: let
            # the saves finish first, so that nothing is pending once this error is raised.
            concurrent.futures.wait(self._saves)
            raise
        if self._committer is None:
            self._committer = ThreadPoolExecutor(1, thread_name_prefix=f"localstate-commit-{self.partition}")
        self._submitted += 1
        self._saves.append(self._committer.submit(self._save_when_durable, checkpoint, waits, self._submitted))
        self._counted()
        return checkpoint

    @property
    def commit_pending(self) -> bool:
        """Whether a pipelined commit's checkpoint may not be saved yet (see :meth:`settle_commit`): a
        save still running or queued (one that finished, failed or not, is no longer pending)."""
        return self.commits_in_flight > 0

    @property
    def commits_in_flight(self) -> int:
        """Pipelined commits whose save is still running or queued (at most :data:`PIPELINE_DEPTH`)."""
        return sum(not save.done() for save in self._saves)

    def settle_commit(self) -> None:
        """Wait until every pipelined commit in flight is saved (or superseded). Raises a typed error
        (a write it names failed: ChangelogError; its checkpoint could not be saved: CheckpointError,
        FencedError): the last saved checkpoint stays the committed one, and the instance must be
        reopened (:meth:`abandon`, then a new instance) to go on from it."""
        self._settle_saves(keep=0)

    def _settle_saves(self, keep: int) -> None:
        """Collect the finished saves (raising the first error) and wait until at most ``keep`` are
        still in flight."""
        saves = self._saves
        while saves and (saves[0].done() or len(saves) > keep):
            waited = time.perf_counter()
            try:
                saves[0].result()
            finally:
                self.commit_wait_seconds += time.perf_counter() - waited
                saves.popleft()

    def _save_when_durable(self, checkpoint: Checkpoint, waits: list[Callable[[], None]], number: int) -> None:
        """Committer thread: wait until every object ``checkpoint`` names is durable, then save it,
        unless a newer commit was submitted meanwhile: its checkpoint, saved next on this thread,
        covers everything this one does (checkpoints are cumulative), so this save is skipped. That
        keeps the saves from falling behind when one takes longer than a batch."""
        for durable in waits:
            durable()
        crash_point("commit_pending")  # every commit's save reaches it, skipped or not (tests count them)
        if number < self._submitted:
            return
        self._save(checkpoint)

    def prepare_commit(self) -> Checkpoint:
        """First half of a commit: flush every store (changelogs durable) and deliver outputs.
        Returns the checkpoint to write; until it is written, a restart rolls all of this back.
        The Spark runtime returns it to the driver, which writes it once every partition succeeded:
        it always waits for the changelogs' writes (never pipelined)."""
        self.settle_commit()
        checkpoint, _waits = self._prepare(in_flight=False)
        return checkpoint

    def _prepare(self, in_flight: bool) -> tuple[Checkpoint, list[Callable[[], None]]]:
        """Flush the stores, deliver the outputs, build the checkpoint. ``in_flight``: take the
        manifests of :class:`DeferredDurability` changelogs without waiting; the waits to do before
        the checkpoint may be saved are returned with it. Due timers fire first: their outputs and
        deletions are part of this commit."""
        self.fire_timers()
        self.prepared_counts = self.counters.take()
        for index, store in enumerate(self.stores.values()):
            store.engine.flush()
            if index == 0:
                crash_point("mid_flush")
        crash_point("after_flush")
        outputs = self.sink.write(self.partition, self.collector.take())
        manifests: dict[str, dict[str, Any]] = {}
        waits: list[Callable[[], None]] = []
        for name, store in self.stores.items():
            changelog = store.changelog
            if in_flight and isinstance(changelog, DeferredDurability):
                taken = changelog.in_flight_manifest()
                manifests[name] = taken.manifest
                waits.append(taken.durable)
            elif isinstance(changelog, ManifestedChangelog):
                manifests[name] = changelog.manifest()
        return self._checkpoint(outputs, manifests), waits

    def save_checkpoint(self, checkpoint: Checkpoint) -> None:
        """Second half of a commit: write ``checkpoint`` atomically (fenced by generation)."""
        self._save(checkpoint)
        self._counted()

    def _save(self, checkpoint: Checkpoint) -> None:
        started = time.perf_counter()
        self.checkpoints.save(checkpoint, expect_generation=self.generation)
        self.checkpoint_seconds += time.perf_counter() - started
        crash_point("after_checkpoint")

    def _counted(self) -> None:
        """A commit was made: the commit triggers start over."""
        self.coordinator.commit_requested = False
        self.processed_since_commit = 0
        self.commits += 1
        merge_counts(self.counted, self.prepared_counts)
        self._last_commit = self.clock()

    def _checkpoint(self, outputs: Mapping[str, int],
                    manifests: dict[str, dict[str, Any]] | None = None) -> Checkpoint:
        """The checkpoint of the current positions (``manifests``: taken already; default: now)."""
        if manifests is None:
            manifests = {name: s.changelog.manifest() for name, s in self.stores.items()
                         if isinstance(s.changelog, ManifestedChangelog)}
        return Checkpoint(
            partition=self.partition, generation=self.generation, inputs=dict(self.positions),
            changelogs={name: s.changelog.end_offset() for name, s in self.stores.items() if s.changelog is not None},
            outputs=dict(outputs), batch=self.batch, attempt=self.attempt, manifests=manifests,
            watermark=self.time.watermark, next_timer=self.time.next_processing_timer,
            formats={name: s.engine.state_format for name, s in self.stores.items()
                     if isinstance(s.engine, StateFormat)},
            input_ids=dict(self.input_ids))

