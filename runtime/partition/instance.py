"""One live task partition: the user's task with its stores, inputs' positions, time and outputs.

:class:`TaskInstance` composes the parts that do the work, as Kafka Streams' ``StreamTask`` does:

* its stores (:class:`~.stores.StoreSet`: open, recover to the checkpoint, flush);
* the feed loop (:class:`~.feeder.Feeder`);
* the commit policy and checkpoint saves (:class:`~.committer.Committer`);
* its watermark, clock and timers (:class:`~.timers.PartitionTime`).

Every runner uses it through the steps of :class:`~.lifecycle.PartitionTask`: the Spark executors,
the DataFrame step, the TaskTestDriver and the continuous runtime.

Commit (exactly-once state): fire the due timers -> flush every store (local write + changelog
durable, end offsets known) -> deliver outputs (durable, positions known; transactional outputs
leave their transaction open) -> atomically write the checkpoint (input positions, changelog
offsets, output positions and open transactions, watermark, next timer, generation) -> commit the
output transactions. On open, every logged store is brought back to exactly the checkpoint
(:mod:`.recovery`), outputs written after it are rolled back, and inputs resume from the checkpointed
positions. Pipelined commits (``job.pipelined_commits``, on a changelog that writes in the
background): see :mod:`.committer`.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Callable, Iterable, Mapping

from localstate.core.changelog import ChangelogSystem
from localstate.core.checkpoint import Checkpoint, CheckpointStore
from localstate.core.config import JobConfig
from localstate.core.stream import InputRecord
from localstate.core.task import (Collector, Coordinator, Envelope, StreamTask, TaskContext, TaskCounters,
                                  load_task_class, merge_counts)
from localstate.core.time import TIMER_STORE
from localstate.core.tracebacks import raise_task_error
from localstate.runtime.layout import checkpoint_store, store_root
from localstate.runtime.partition.committer import CommitPolicy, Committer, ConfiguredCommits
from localstate.runtime.partition.faults import crash_point, is_armed
from localstate.runtime.partition.feeder import Feeder
from localstate.runtime.partition.records import FeedStats, InputPolicy
from localstate.runtime.partition.recovery import StoreRecovery
from localstate.runtime.partition.release import Release
from localstate.runtime.partition.sink import MemorySink, OutputSink
from localstate.runtime.partition.stores import StoreSet
from localstate.runtime.partition.timers import PartitionTime

__all__ = ["TaskInstance"]


def _before_timer() -> None:
    crash_point("timer_fire")


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
    """cluster mode: this attempt's unique id, recorded in its checkpoints and next to the local
    stores it writes (see :class:`~.stores.StoreSet`)"""
    processing_clock: Callable[[], float] = time.time
    """processing time (seconds since the epoch) for timers and the stores' TTL: the wall clock
    unless given (the TaskTestDriver's is moved by the test)"""
    commit_policy: CommitPolicy | None = None
    """when to commit between calls into the task (default: the job's ``commit_every``/``commit_interval``)"""

    def __post_init__(self) -> None:
        self.task_factory = load_task_class(self.task_factory or self.job.task)
        if self.checkpoints is None:
            self.checkpoints = checkpoint_store(self.job)
        if self.local_root is None:
            self.local_root = store_root(self.job)
        if self.commit_policy is None:
            self.commit_policy = ConfiguredCommits(self.job.commit_interval, self.job.commit_every)
        self.time = PartitionTime(self.job, self.partition, self.processing_clock)
        """the partition's watermark, clock and timers (``context.timers``, each store's ``time``)"""
        self.stores = StoreSet(self.job, self.partition, self.changelogs, self.checkpoints, self.local_root,
                               self.attempt, self.time)
        self.committer = Committer(self.checkpoints, self.partition, self.commit_policy, self.clock)
        self.positions: dict[str, int] = {}
        self.input_ids: dict[str, str] = {}
        """input -> identity of what it read (:attr:`Checkpoint.input_ids`), carried from commit to commit"""
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
        self.task: StreamTask | None = None
        self.feeder: Feeder | None = None
        self.timers_fired = 0
        self.pipelined = False
        """whether :meth:`commit` is pipelined (decided at :meth:`open`, see :mod:`.committer`)"""
        self._last_window = self.clock()
        self._open = False

    # -- lifecycle -----------------------------------------------------------------------------
    def open(self) -> list[StoreRecovery]:
        """Lock the partition, recover every store to the checkpoint, and init the task."""
        self.checkpoints.lock(self.partition)
        try:
            return self._open_locked()
        except BaseException:
            self._release_all().log_first()  # another error is on its way up: what fails here is logged
            raise

    def _open_locked(self) -> list[StoreRecovery]:
        loaded = self.checkpoints.load(self.partition)
        checkpoint = loaded if loaded is not None else Checkpoint(self.partition)
        self.time = PartitionTime(self.job, self.partition, self.processing_clock, checkpoint.watermark)
        self.stores = StoreSet(self.job, self.partition, self.changelogs, self.checkpoints, self.local_root,
                               self.attempt, self.time)
        self.stores.open(loaded)
        self.pipelined = self.job.pipelined_commits and self.stores.writes_in_background and not self.sink.transactional
        # Its output transactions first (its state counts them); rollback returns every output's position.
        self.sink.resume(self.partition, checkpoint.transactions)
        outputs = self.sink.rollback(self.partition, checkpoint.outputs) or dict(checkpoint.outputs)
        self.positions, self.input_ids = dict(checkpoint.inputs), dict(checkpoint.input_ids)
        self.batch = checkpoint.batch
        self.generation = checkpoint.generation + 1
        self.committer.accounting.opened(self.generation)
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
        self.sink.fence(self.partition)  # only now (no saved checkpoint names an older transaction)
        self.feeder = Feeder(self.task, self.partition, self.collector, self.coordinator, self.counters, self.positions,
                             self.time, len(self.job.inputs) > 1, self.committer.accounting)
        context = TaskContext(self.job.name, self.partition, self.job.partitions, self.stores.task_stores(),
                              self.job, timers=self.time, counters=self.counters)
        try:
            self.task.init(context)
        except (Exception, SystemExit) as exc:
            raise_task_error(exc, "init()", partition=self.partition,
                             hint="fix the task's init(); no input was processed and the state is unchanged")
        self._open = True
        self.committer.last_commit = self._last_window = self.clock()
        return self.stores.recoveries

    @property
    def recoveries(self) -> list[StoreRecovery]:
        """What opening did to each store (:class:`StoreRecovery`)."""
        return self.stores.recoveries

    def _create_task(self) -> StreamTask:
        """Construct the user's task; a failure is a TaskError naming the user's file and line."""
        try:
            return self.task_factory()  # type: ignore[misc,operator]
        except (Exception, SystemExit) as exc:
            name = getattr(self.task_factory, "__qualname__", None) or repr(self.task_factory)
            raise_task_error(exc, f"constructor {name}()", partition=self.partition,
                             hint="fix the task's __init__ (or factory); no input was processed and the state "
                                  "is unchanged")

    def close(self, commit: bool = True) -> None:
        """Stop cleanly: optionally commit, wait for the pipelined commits in flight, close the task;
        stores and locks are released whatever fails, and the first error is raised."""
        try:
            if self._open and commit:
                self.commit()
            self.committer.settle()
            if self.task is not None and self._open:
                try:
                    self.task.close()
                except (Exception, SystemExit) as exc:
                    raise_task_error(exc, "close()", partition=self.partition,
                                     hint="fix the task's close(); what was committed stays committed")
        except BaseException:
            self._release_all().log_first()  # a failed commit too lets go of the stores and the locks
            raise
        self.abandon()

    def abandon(self) -> None:
        """Drop everything without committing (what a crash does, minus the process dying); a
        pipelined commit in flight finishes first. Guarantee: every store is closed and every lock
        released even when a step fails, so the partition can open again in this process; the first
        error is raised afterwards, any later one logged."""
        self._release_all().raise_first()

    def _release_all(self) -> Release:
        """Close and release everything, each step attempted whatever failed before (:class:`Release`)."""
        release = Release(self.partition)
        release(self.committer.drop, "waiting for the commits in flight")
        self.stores.close_all(release)
        release(lambda: self.checkpoints.unlock(self.partition), "releasing the partition lock")
        self._open = False
        return release

    # -- the steps a runtime calls -------------------------------------------------------------
    def position(self, stream: str) -> int:
        """The next offset to process from input ``stream`` (this partition)."""
        return self.positions.get(stream, 0)

    def feed(self, records: Iterable[tuple[str, InputRecord]], policies: Mapping[str, InputPolicy] | None = None,
             *, autocommit: bool = False) -> FeedStats:
        """Feed ``(input stream, record)`` pairs through the one feed loop (:mod:`.feeder`), from the
        inputs' positions. With ``autocommit`` the instance commits between records as its commit
        policy says and stops when the task asks to shut down; else only the caller commits."""
        between, due_in = (self._between, self.committer.records_until_due) if autocommit else (None, None)
        return self.feeder.feed(records, policies, between, due_in)  # type: ignore[union-attr]

    def process(self, envelope: Envelope) -> bool:
        """Process one record unless the checkpoint already covers it. May commit afterwards."""
        return self.process_all((envelope,)) == 1

    def process_all(self, envelopes: Iterable[Envelope], policies: Mapping[str, InputPolicy] | None = None) -> int:
        """Process ``envelopes`` in order, skipping those the checkpoint already covers; commits as
        configured and stops when the task asks to shut down. Returns how many were processed."""
        # The feed loop builds each envelope again, from the record it carries.
        records = ((e.stream, InputRecord(e.offset, e.key, e.value, e.timestamp)) for e in envelopes
                   if e.offset >= self.positions.get(e.stream, 0))
        return self.feed(records, policies, autocommit=True).records

    def _between(self, processed: int) -> bool:
        """Between two records (or batches) of an autocommitting feed: commit if due; True stops the feed."""
        self.committer.processed += processed
        self._commit_if_due()
        return self.coordinator.shutdown_requested

    def _commit_if_due(self) -> None:
        if self.committer.due(self.coordinator.commit_requested):
            self.commit()

    def refresh_store_time(self) -> None:
        """Stores that read their time once per commit (ttl) read it now: a batch starts."""
        self.stores.refresh_time()

    def fire_timers(self) -> int:
        """Fire every due timer through the task's ``on_timer`` (see :mod:`.timers`); their outputs
        and deletions are part of the next commit. Returns how many fired. Crash points:
        ``timer_fire`` before each timer, ``after_timers`` after a round that fired any."""
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

    def maybe_window(self) -> bool:
        """Call the task's window() if ``window_interval`` has passed; True if it did."""
        interval = self.job.window_interval
        if interval is not None and self.clock() - self._last_window >= interval:
            self.window()
            return True
        return False

    def window(self) -> None:
        """Fire the due timers, then the task's ``window()``; then commit if the policy says so."""
        self.fire_timers()
        self._last_window = self.clock()
        try:
            self.task.window(self.collector, self.coordinator)  # type: ignore[union-attr]
        except (Exception, SystemExit) as exc:
            raise_task_error(exc, "window()", partition=self.partition,
                             hint="fix the task's window(); state is rolled back to the last commit on restart")
        self._commit_if_due()

    # -- commit --------------------------------------------------------------------------------
    def commit(self) -> Checkpoint:
        """Flush every store, deliver outputs, write the checkpoint atomically. Pipelined (see
        :mod:`.committer`), the checkpoint is saved in the background once its objects are durable;
        the error of a finished save is raised here."""
        if not self.pipelined:
            checkpoint = self.prepare_commit()
            self.save_checkpoint(checkpoint)
            return checkpoint
        self.committer.make_room()
        try:
            checkpoint, waits = self._prepare(in_flight=True)
        except BaseException:
            # Typically the flush found a delta PUT failed, which also fails the save in flight: let
            # the saves finish first, so that nothing is pending once this error is raised.
            self.committer.wait_all()
            raise
        self.committer.submit(checkpoint, waits, self.generation)
        self._counted()
        return checkpoint

    def settle_commit(self) -> None:
        """Wait until every pipelined commit in flight is saved (a failure: reopen the instance)."""
        self.committer.settle()

    def prepare_commit(self) -> Checkpoint:
        """First half of a commit: flush every store (changelogs durable) and deliver outputs.
        Returns the checkpoint to write; until it is written, a restart rolls all of this back.
        The Spark runtime returns it to the driver, which writes it once every partition succeeded:
        it always waits for the changelogs' writes (never pipelined)."""
        self.committer.prepare()
        return self._prepare(in_flight=False)[0]

    def _prepare(self, in_flight: bool) -> tuple[Checkpoint, list[Callable[[], None]]]:
        """Fire the due timers (their outputs and deletions belong to this commit), flush the stores,
        deliver the outputs, build the checkpoint; with ``in_flight`` the waits to do before it may be
        saved are returned with it."""
        self.fire_timers()
        self.prepared_counts = self.counters.take()
        self.stores.flush()
        outputs = self.sink.write(self.partition, self.collector.take())
        manifests, waits = self.stores.manifests(in_flight)
        return replace(self._checkpoint(outputs, manifests), transactions=self.sink.pending(self.partition)), waits

    def save_checkpoint(self, checkpoint: Checkpoint) -> None:
        """Second half of a commit: save ``checkpoint`` (fenced by generation), commit its outputs."""
        self.committer.save(checkpoint, self.generation)
        self.sink.commit(self.partition)
        self._counted()

    def _counted(self) -> None:
        """A commit was made: the commit triggers start over."""
        self.coordinator.commit_requested = False
        self.committer.counted()
        merge_counts(self.counted, self.prepared_counts)

    def _checkpoint(self, outputs: Mapping[str, int],
                    manifests: dict[str, dict[str, Any]] | None = None) -> Checkpoint:
        """The checkpoint of the current positions (``manifests``: taken already; default: now)."""
        if manifests is None:
            manifests, _waits = self.stores.manifests(in_flight=False)
        return Checkpoint(
            partition=self.partition, generation=self.generation, inputs=dict(self.positions),
            changelogs=self.stores.changelog_offsets(), outputs=dict(outputs), batch=self.batch,
            attempt=self.attempt, manifests=manifests, watermark=self.time.watermark,
            next_timer=self.time.next_processing_timer, formats=self.stores.formats(),
            input_ids=dict(self.input_ids), commit_stats=self.committer.accounting.snapshot())
