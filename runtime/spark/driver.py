"""The driver: plans each micro-batch from the saved checkpoints, runs one Spark job per batch
(:mod:`.executor` on the executors), saves the returned checkpoints only when every partition
succeeded, and compacts changelogs between batches (:class:`BatchCompaction`).

What a batch costs besides its tasks is kept small (``python -m bench scaling`` measures it): the
JobConfig reaches the workers once per run (a Spark broadcast), plans are the only per-batch payload,
failed attempts are counted from the results (no status-tracker round trips), the partitions'
checkpoints are saved concurrently, and a run plans from the checkpoints it saved itself (read from
disk once, at the start of each run).

A run either ends when its inputs are drained (``run(until_drained=True)``, the default for library
callers) or *stands*: it waits for new input, polling the inputs' end offsets on the driver every
:data:`BUSY_POLL` seconds for :data:`BUSY_FOR` seconds after the last batch with input, then every
:data:`IDLE_POLL` seconds (no Spark job while idle), until :meth:`SparkJobRunner.stop`. A
standing run also plans a partition whose next processing-time timer (:attr:`Checkpoint.next_timer`)
is due, input or not, and wakes up for it; with neither input nor a due timer it starts no job."""

from __future__ import annotations

import logging
import pickle
import shutil
import threading
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, replace
from pathlib import Path
from typing import Any, Callable

from localstate.core.changelog import Compactable
from localstate.core.checkpoint import Checkpoint
from localstate.core.config import JobConfig
from localstate.runtime.layout import check_moved_inputs, check_no_history, checkpoint_store, checkpoint_where, \
    open_changelog_system, resolve_epoch
from localstate.runtime.spark.cluster import Placement, has_state, is_cluster_master
from localstate.runtime.spark.config import SparkConfig
from localstate.runtime.spark.context import spark_context
from localstate.runtime.spark.affinity.slots import WorkerAffinity
from localstate.runtime.spark.executor import run_partition, run_slot
from localstate.runtime.spark.failures import (failed_attempt_reasons, log_failed_attempts, merge_attempt_reasons,
                                               spark_failure)
from localstate.runtime.partition.faults import crash_point
from localstate.runtime.spark.affinity.kept import clear_requests
from localstate.runtime.driver.plan import BatchResult, PartitionPlan, RunSummary, progress_line
from localstate.core.stream import open_input
from localstate.core.stream import PENDING_TAIL_WARN_AFTER, IdentifiedInput, PendingTail, check_input_position
from localstate.runtime.partition.sink import StreamSink
from localstate.core.task import add_task_paths, load_task_class, merge_counts
from localstate.errors import FencedError, LocalStateError

__all__ = ["SparkJobRunner", "BatchCompaction", "IDLE_POLL", "BUSY_POLL", "BUSY_FOR", "STOP_GRACE", "IDLE_GIVE_BACK",
           "KEPT_BATCHES"]

log = logging.getLogger(__name__)

IDLE_POLL = 0.2
"""Seconds between two looks at the inputs' end offsets while a standing run has nothing to do."""

BUSY_POLL = 0.02
"""...for the first :data:`BUSY_FOR` seconds after the last batch that had input: while records keep
arriving, a record appended just after a batch was planned waits at most this long for the next
(instead of :data:`IDLE_POLL`, which is what a job without input pays, as a poll's cost)."""

BUSY_FOR = 5.0
"""Seconds without input after which a standing run polls every :data:`IDLE_POLL` seconds again."""

STOP_GRACE = 10.0
"""Seconds a batch running when :meth:`SparkJobRunner.stop` is called may take to complete (and be
committed); then its Spark job group is cancelled and nothing of it is committed."""

IDLE_GIVE_BACK = 45.0
"""Seconds of idleness after which a standing run asks its kept instances back (closed cleanly):
Spark stops Python workers that were idle for a minute, which would kill them in their stores."""

KEPT_BATCHES = 1000
"""Batches a standing run keeps in :attr:`RunSummary.batches` (older ones are only counted)."""


class BatchCompaction:
    """Compaction while ``localstate run`` runs, so restore cost follows live state, not history.

    At the first batch of a run and then every ``interval`` seconds (the file changelog's
    ``compact_interval``, default 10 minutes) the driver marks a batch's plans ``roll_changelogs``:
    each task seals its active changelog segments (task instances kept open in the workers hold the
    writer locks, so only they can). Once that batch's checkpoints are saved,
    one compaction round runs in a background thread of the driver over every store partition, up to
    its checkpointed changelog offset: safe next to the live writers and readers (only sealed
    segments are rewritten, under compact.lock) and never past the checkpoint (trimming after a crash
    needs the values before it). One round at a time; :meth:`close` waits for a running one."""

    def __init__(self, job: JobConfig, system: Compactable, interval: float) -> None:
        self.job = job
        self.system = system
        self.interval = interval
        self.checkpoints = checkpoint_store(job)
        self.rounds = system.compaction_rounds(self.targets)  # run_once() from the batch loop
        self._last = float("-inf")  # the first batch of a run rolls: short runs compact too
        self._thread: threading.Thread | None = None

    @classmethod
    def for_job(cls, job: JobConfig) -> "BatchCompaction | None":
        """The job's compaction, or None if its changelog system cannot compact or it is disabled."""
        if not any(store.changelog is not None for store in job.stores.values()):
            return None
        system = open_changelog_system(job)
        interval = float(system.compact_interval or 0.0) if isinstance(system, Compactable) else 0.0
        if interval <= 0:
            system.close()
            return None
        return cls(job, system, interval)

    def targets(self) -> dict[tuple[str, int], int]:
        """``{(changelog stream, partition): checkpointed offset}`` of every logged store partition."""
        out = {}
        for partition in range(self.job.partitions):
            checkpoint = self.checkpoints.load(partition)
            if checkpoint is None:
                continue
            for name, store in self.job.stores.items():
                if store.changelog is not None and checkpoint.changelogs.get(name, 0) > 0:
                    out[(store.changelog, partition)] = checkpoint.changelogs[name]
        return out

    def due(self) -> bool:
        """True if the next batch should roll (the interval passed and no round is running)."""
        running = self._thread is not None and self._thread.is_alive()
        return not running and time.monotonic() - self._last >= self.interval

    def start_round(self) -> None:
        """Compact up to the checkpoints just saved, in the background."""
        self._last = time.monotonic()
        self._thread = threading.Thread(target=self._round, name="localstate-compaction", daemon=True)
        self._thread.start()

    def _round(self) -> None:
        stats = self.rounds.run_once()
        log.info("compaction round: %d -> %d changelog records, %d -> %d bytes, %d tombstone(s) dropped in "
                 "%.2fs", stats.records_before, stats.records_after, stats.bytes_before, stats.bytes_after,
                 stats.tombstones_dropped, stats.seconds)

    def close(self) -> None:
        if self._thread is not None:
            self._thread.join()
        self.system.close()


class SparkJobRunner:
    """Drives a job on Spark, batch by batch, committing on the driver: plan from the checkpoints,
    run one Spark task per planned partition, save the returned checkpoints."""

    affinity_class = WorkerAffinity
    """the worker affinity a local run uses (``[spark] worker_affinity``)"""

    def __init__(self, job: JobConfig, *, context: Any = None, master: str | None = None,
                 batch_size: int | None = None, fault: dict[str, Any] | None = None,
                 progress: Callable[[str], None] | None = print, keep_open: bool | None = None,
                 on_batch: Callable[[BatchResult, list[PartitionPlan]], None] | None = None) -> None:
        job = resolve_epoch(job)  # its current state epoch (docs/state-as-data.md); refuses a stale one
        self.job = job
        self.on_batch = on_batch
        """called after each committed batch with its result and plans (``localstate run``: progress.jsonl,
        metrics; :mod:`localstate.runtime.driver.progress`)"""
        self.spark = SparkConfig.of(job, master=master, batch_size=batch_size)
        """``[spark]``, validated once, with this run's master"""
        self.master = self.spark.master
        self._context = context
        self.batch_size = self.spark.batch_size
        self.fault = fault
        self.progress = progress
        self.cluster = is_cluster_master(self.master)
        # Worker affinity (kept instances, claims, keepers, spare slots) is for local masters: on a
        # cluster the warm local stores on each host give the affinity instead (see .cluster).
        self.keep_open = self.spark.worker_affinity if keep_open is None else keep_open and not self.cluster
        self.placement: Placement | None = None
        self._committed: dict[int, Checkpoint | None] = {}
        self._saved: dict[int, Checkpoint] = {}
        self.homes: dict[int, str] = {}
        """partition -> the home its committed checkpoint names (:attr:`Checkpoint.home`), for every
        partition with state, as the last :meth:`plan` read them: placement balances what each
        executor owns, not only what one batch runs (:func:`~.cluster.assign_executors`)"""
        self._input_ids: dict[int, dict[str, str]] = {}
        """partition -> input -> its identity at the last plan (IdentifiedInput), recorded in the batch's
        checkpoints"""
        """checkpoints this run saved (what :meth:`plan` uses instead of reading them back)"""
        self._shipped: Any = None
        """this run's JobConfig as a Spark broadcast (:meth:`_ship_job`)"""
        self._savers: ThreadPoolExecutor | None = None
        self.affinity: WorkerAffinity | None = None
        """this run's worker affinity (local masters, ``keep_open``), else None"""
        self.run_id = uuid.uuid4().hex
        self.pending_bytes = 0
        self.next_timer: float | None = None
        """the earliest processing-time timer not yet due, as the last standing plan saw it (None: none)"""
        """bytes of unterminated input tails (:class:`PendingTail`) found by the last :meth:`plan`"""
        self._tails_warned: dict[tuple[str, int], int] = {}
        """(input, partition) -> the offset of the unterminated tail last warned about"""
        self.trigger = self.spark.trigger
        """``[spark] trigger``: a batch starts at most once per this many seconds (0: at once)"""
        self.poll_interval = IDLE_POLL
        self.busy_poll_interval = BUSY_POLL
        self.stop_grace = STOP_GRACE
        self._stop = threading.Event()
        self._forced = threading.Event()
        self._running: str | None = None
        """the job group of the batch whose Spark job runs now, if any"""
        self._attempts: Path | None = None
        """local masters: where this run's failed task attempts leave their reasons"""
        self.checkpoints = checkpoint_store(job)
        self.inputs = {name: open_input(job, name) for name in sorted(job.inputs)}
        self.sink_check = StreamSink(job)  # validates [outputs.*] on the driver, before any task runs
        self.sink_check.close()
        add_task_paths(job)
        load_task_class(job.task)  # a task that cannot even be imported fails here, before Spark starts

    @property
    def context(self) -> Any:
        if self._context is None:
            # The JVM only schedules here (the tasks read their input in Python): the quick JIT.
            affinity = self.spark.worker_affinity
            self._context = spark_context(self.master, f"localstate:{self.job.name}", dict(self.spark.conf),
                                          quick_jit=affinity, affinity=affinity)
        return self._context

    def _create_changelogs(self) -> None:
        """Create the stores' changelog streams once, here, rather than in the first batch's tasks
        all at the same time (creating a stream is idempotent, but concurrent creation is a race
        that can fail a task attempt)."""
        changelogs = open_changelog_system(self.job)
        try:
            for store in self.job.stores.values():
                if store.changelog is not None:
                    changelogs.ensure_stream(store.changelog, self.job.partitions)
        finally:
            changelogs.close()

    def committed(self, partition: int) -> Checkpoint | None:
        """The partition's committed checkpoint: the one this run saved, else the one on disk (a
        run's first batch, a restarted driver). Only the driver saves checkpoints between batches, so
        the one it saved is the one on disk (a task that reopens the partition takes a new generation,
        which its result carries back)."""
        saved = self._saved.get(partition)
        return saved if saved is not None else self.checkpoints.load(partition)

    def plan(self, batch: int, timers: bool = False) -> tuple[list[PartitionPlan], int]:
        """Plans for the partitions with input to process, and the total lag before the batch. With
        ``timers`` (a standing run), also for the partitions whose next processing-time timer is due
        (:attr:`Checkpoint.next_timer`), input or not: their batch fires it.

        A checkpointed input position that does not fit the input any more (past its end: the input
        was replaced, truncated or re-created; below its first retained record) raises
        InputPositionError before anything runs, never a plan that silently reads nothing. Bytes of
        unterminated input tails are counted into :attr:`pending_bytes` (and logged once they stay
        unchanged for :data:`PENDING_TAIL_WARN_AFTER` seconds)."""
        plans, lag, pending = [], 0, 0
        now = time.time()
        self.next_timer = None
        self.homes = {}
        self._input_ids = {}
        for partition in range(self.job.partitions):
            loaded = self.committed(partition)
            if loaded is not None and loaded.home is not None and has_state(loaded):
                self.homes[partition] = loaded.home
            checkpoint = loaded or Checkpoint(partition)
            ranges = {}
            for name, source in self.inputs.items():
                start, end = checkpoint.inputs.get(name, 0), source.end_offset(partition)
                check_input_position(source, partition, checkpoint.inputs.get(name), end, checkpoint.input_ids.get(name))
                if isinstance(source, IdentifiedInput) and (identity := source.identity(partition)) is not None:
                    # what the input is now, recorded in the batch's checkpoints (see run_batch)
                    self._input_ids.setdefault(partition, {})[name] = identity
                if isinstance(source, PendingTail):
                    pending += self._pending_tail(name, source, partition, end)
                lag += end - start
                if self.batch_size is not None:
                    # No input can give more than the limit; an exact range also lets a reader run
                    # to its end (the jsonl reader then remembers where the next batch starts).
                    end = min(end, start + int(self.batch_size))
                ranges[name] = (start, end)
            due = False
            if timers and checkpoint.next_timer is not None:
                due = checkpoint.next_timer <= now
                if not due and (self.next_timer is None or checkpoint.next_timer < self.next_timer):
                    self.next_timer = checkpoint.next_timer
            if due or any(end > start for start, end in ranges.values()):
                self._committed[partition] = loaded
                plans.append(PartitionPlan(
                    batch, partition, ranges, self.batch_size, self.fault, self.run_id, self.keep_open,
                    cluster=self.cluster, committed=asdict(loaded) if self.cluster and loaded is not None else None,
                    checkpoint_where=str(self.checkpoints.path(partition)) if self.cluster else "",
                    tune_worker=self.spark.affinity_setting,
                    attempts=str(self._attempts) if self._attempts is not None else ""))
        self.pending_bytes = pending
        return plans, lag

    def check_inputs(self) -> None:
        """Check every partition's checkpointed input positions against the inputs as they are now
        (InputPositionError, see :func:`check_input_position`), without planning anything: what
        :meth:`run` does before it starts Spark. An input still read where it was before a rescale is
        refused (:func:`check_moved_inputs`)."""
        check_moved_inputs(self.job, self.inputs)
        for partition in range(self.job.partitions):
            checkpoint = self.committed(partition)
            if checkpoint is None:
                continue
            for name, source in self.inputs.items():
                if name in checkpoint.inputs:
                    check_input_position(source, partition, checkpoint.inputs[name], source.end_offset(partition),
                                         checkpoint.input_ids.get(name))

    def _pending_tail(self, name: str, source: PendingTail, partition: int, end: int) -> int:
        """Unterminated bytes at the end of ``source``'s ``partition`` (an append in progress: not
        read, never an error). Logs a WARNING once per run and tail when they have not changed for
        :data:`PENDING_TAIL_WARN_AFTER` seconds (a writer that stopped mid-record)."""
        pending = source.pending_bytes(partition)
        if not pending:
            return 0
        since = source.pending_since(partition)
        age = time.time() - since if since is not None else 0.0
        if age > PENDING_TAIL_WARN_AFTER and self._tails_warned.get((name, partition)) != end:
            self._tails_warned[(name, partition)] = end
            log.warning("input %r partition %d: %d byte(s) of an unterminated record at offset %d, unchanged for %.0fs "
                        "(warned after %.0fs): they are not read until their writer completes the record (a jsonl "
                        "line needs its newline); if the writer stopped, complete or remove them",
                        name, partition, pending, end, age, PENDING_TAIL_WARN_AFTER)
        return pending

    def _cluster_reasons(self, group: str, plans: list[PartitionPlan], batch: int) -> list[dict[str, Any]]:
        """On a cluster master: the failed attempts of the batch's Spark job as Spark's status store
        recorded them (type, message, host), which the executors cannot leave for the driver in a
        folder; [] elsewhere."""
        return self._placement().failed_attempts(group, plans, batch) if self.cluster else []

    def run_batch(self, batch: int, plans: list[PartitionPlan]) -> BatchResult:
        """One Spark job: a task per plan; then save every checkpoint, only if all tasks succeeded."""
        started = time.perf_counter()
        group = f"localstate-{self.run_id}-{batch}"
        shipped = self._ship_job()
        homes = self.homes if self.cluster else {}
        if homes:  # a restarted driver: which of its new executors hold these homes (may wait for them)
            self._placement().locate(homes, shipped, self._stop)
        self.context.setJobGroup(group, f"localstate {self.job.name} batch {batch}")
        self._running = group
        try:
            if self.cluster:
                # One task per plan, preferring the executor that holds its partition's warm state.
                placement = self._placement()
                results = placement.rdd(plans, homes).mapPartitions(
                    lambda items: [run_partition(shipped.value, plan) for plan in items]).collect()
            elif self.affinity is not None:
                results = self.affinity.run(batch, plans, shipped)
            else:
                rdd = self.context.parallelize(plans, len(plans))
                results = rdd.mapPartitions(
                    lambda items: [run_partition(shipped.value, plan) for plan in items]).collect()
        except BaseException:
            self._running = None
            log_failed_attempts(merge_attempt_reasons(failed_attempt_reasons(self._attempts, batch),
                                                      self._cluster_reasons(group, plans, batch)), retried=False)
            raise
        self._running = None
        collected = time.perf_counter()
        # A task's successful attempt number is the count of its attempts that failed before it
        # (Spark numbers them 0, 1, ...; speculation is off): no status-tracker round trips. Why
        # each failed: what the attempts left in the attempts folder, else their worker died.
        failed_attempts = sum(r.get("attempt", 0) for r in results)
        reasons = failed_attempt_reasons(self._attempts, batch, results)
        if failed_attempts:
            reasons = merge_attempt_reasons(reasons, self._cluster_reasons(group, plans, batch))
        log_failed_attempts(reasons)
        results = [r for r in results if r["partition"] is not None]  # spare slots ran nothing
        errors = [r for r in results if "error" in r]
        if errors:
            raise pickle.loads(errors[0]["error"])
        # On a cluster each checkpoint names its attempt's home: where the next run places the partition.
        checkpoints = [Checkpoint(**{**result["checkpoint"], "home": result.get("home")}) for result in results]
        if self._input_ids:  # the positions were planned against the inputs as they are now
            checkpoints = [replace(c, input_ids={**c.input_ids, **self._input_ids.get(c.partition, {})})
                           for c in checkpoints]
        if self.cluster:
            for checkpoint in checkpoints:
                self._check_attempt(checkpoint)
        crash_point("driver_commit")  # every task prepared its commit; no checkpoint of the batch saved yet
        self._save_checkpoints(checkpoints)
        if self.cluster:
            self._placement().record(group, plans, results)
        saved = time.perf_counter()
        if self.affinity is not None:
            self.affinity.record(results)
        out = BatchResult(batch, seconds=saved - started, tasks=len(results), failed_attempts=failed_attempts,
                          failed_attempt_reasons=reasons)
        for r in results:
            out.records_in += r["in"]
            out.records_out += r["out"]
            out.skipped += r["skipped"]
            out.dead_lettered += r["dead"]
            out.restore_seconds += r["restore_seconds"]
            out.replayed += r["replayed"]
            out.trimmed += r["trimmed"]
            out.reused += r["reused"]
            merge_counts(out.counts, r.get("counts") or {})
            if has_state(self._committed.get(r["partition"])):
                out.stateful += 1
                out.warm += bool(r["warm"])
            for key, value in r["timings"].items():
                out.task_seconds[key] = out.task_seconds.get(key, 0.0) + value
            out.busiest_task = max(out.busiest_task, sum(r["timings"].values()))
        out.driver_seconds = {"spark": max(0.0, collected - started - out.busiest_task),
                              "checkpoint": saved - collected}
        return out

    def _ship_job(self) -> Any:
        """This run's JobConfig as a Spark broadcast, made on first use in a run: a Python worker
        unpickles it once (Spark sends a broadcast to a reused worker only the first time) instead of
        every task of every batch unpickling it from its closure. Each run makes its own, so a reused
        worker never runs a batch with another run's (or job's) config."""
        if self._shipped is None:
            self._shipped = self.context.broadcast(self.job)
        return self._shipped

    def _save_checkpoints(self, checkpoints: list[Checkpoint]) -> None:
        """Save the batch's checkpoints, the partitions concurrently (each save waits for its fsyncs
        or its object store PUT; one at a time, they would add up). Each save is atomic and fenced by
        the generation its task instance took at open (a zombie attempt of a later run makes it fail,
        FencedError); the first error is raised once every save has ended. A partition whose save
        succeeded next to one that failed is committed: each partition's checkpoint stands alone."""
        def save(checkpoint: Checkpoint) -> None:
            self.checkpoints.save(checkpoint, expect_generation=checkpoint.generation)
            self._saved[checkpoint.partition] = checkpoint

        if len(checkpoints) == 1:
            save(checkpoints[0])
            return
        if self._savers is None:
            self._savers = ThreadPoolExecutor(max_workers=min(8, self.job.partitions),
                                              thread_name_prefix="localstate-checkpoint")
        futures = [self._savers.submit(save, checkpoint) for checkpoint in checkpoints]
        errors = [future.exception() for future in futures]
        for error in errors:
            if error is not None:
                raise error

    def _end_run(self) -> None:
        """Drop what a run made once for its batches: the broadcast JobConfig, the slot RDDs, the
        checkpoint-saving threads."""
        shipped, self._shipped = self._shipped, None
        if shipped is not None:
            try:
                shipped.destroy()
            except Exception:  # noqa: BLE001 - a stopped context: nothing left to free
                log.debug("destroying the broadcast job config failed", exc_info=True)
        savers, self._savers = self._savers, None
        if savers is not None:
            savers.shutdown()

    def _placement(self) -> Placement:
        if self.placement is None:
            self.placement = Placement(self.context, stable=self.job.local_dir is not None)
        return self.placement

    def _check_attempt(self, checkpoint: Checkpoint) -> None:
        """Cluster mode: the accepted attempt must have started from the checkpoint the driver planned
        (the generation after it); anything else is not this batch's attempt and is refused."""
        planned = self._committed.get(checkpoint.partition)
        expected = (planned.generation if planned is not None else 0) + 1
        if checkpoint.generation != expected:
            raise FencedError(f"task partition {checkpoint.partition} returned generation {checkpoint.generation}, "
                              f"but the batch was planned from generation {expected - 1}",
                              partition=checkpoint.partition, path=str(self.checkpoints.path(checkpoint.partition)),
                              hint="another driver may be running this job: stop it; the checkpoint is unchanged")

    def _initial_checkpoints(self) -> None:
        """Cluster mode: give every partition without a checkpoint its first one, here on the driver
        (locally, the task instance writes it at open). It names every output at its current end
        (refusing outputs that hold data no checkpoint covers), so a first attempt that fails after
        writing outputs is truncated by its retry; and a changelog with records but no checkpoint
        means the checkpoint is missing (CheckpointError), as on open."""
        missing = [p for p in range(self.job.partitions) if self.checkpoints.load(p) is None]
        if not missing:
            return
        sink = StreamSink(self.job)
        changelogs = open_changelog_system(self.job)
        try:
            for partition in missing:
                for name, store in self.job.stores.items():
                    if store.changelog is None:
                        continue
                    held = changelogs.partition(store.changelog, partition)
                    try:
                        check_no_history(held, store=name, partition=partition,
                                         checkpoint_where=checkpoint_where(self.checkpoints, partition))
                    finally:
                        held.close()
                outputs = sink.rollback(partition, {})
                self.checkpoints.save(Checkpoint(partition, outputs=dict(outputs)), expect_generation=0)
        finally:
            changelogs.close()
            sink.close()

    def stop(self, force: bool = False) -> None:
        """Ask :meth:`run` to stop, from any thread or a signal handler (``localstate run`` calls it on
        SIGTERM/SIGINT/SIGHUP): no further batch is planned; a batch running now may complete, and be
        committed, for up to :attr:`stop_grace` seconds, then its Spark job group is cancelled and
        nothing of it is committed. :meth:`run` then releases the kept instances and returns its
        summary (``stopped`` set). A stopped runner stays stopped: a later :meth:`run` returns at once.

        ``force`` (also after a first stop: ``localstate run`` on a second signal) does not wait: the
        running batch is cancelled now (nothing of it committed: it runs again at the next start), a
        compaction round is not waited for and the kept instances are not given back (they end with
        the Spark workers; the next open recovers them from the changelog). A checkpoint save already
        under way completes (each partition's save is atomic)."""
        if force:
            self._forced.set()
        if self._stop.is_set():
            return
        self._stop.set()
        threading.Thread(target=self._cancel_after_grace, name="localstate-stop", daemon=True).start()

    @property
    def stopping(self) -> bool:
        """True once :meth:`stop` was called."""
        return self._stop.is_set()

    def _cancel_after_grace(self) -> None:
        deadline = time.monotonic() + self.stop_grace
        while self._running is not None:
            if time.monotonic() >= deadline or self._forced.is_set():
                group = self._running
                if group is None:
                    return
                if self._forced.is_set():
                    log.warning("stopping now: cancelling the running batch (nothing of it is committed)")
                else:
                    log.warning("stopping: the running batch did not complete within %.0fs of the stop; cancelling "
                                "it (nothing of it is committed)", self.stop_grace)
                try:
                    self.context.cancelJobGroup(group)
                except Exception:  # noqa: BLE001 - a context already stopped: the batch failed anyway
                    log.debug("cancelling job group %s failed", group, exc_info=True)
                return
            time.sleep(0.05)

    def _wait(self, seconds: float) -> bool:
        """Sleep up to ``seconds``, waking up at once on :meth:`stop`; True if stopped."""
        return self._stop.wait(seconds) if seconds > 0 else self._stop.is_set()

    def run(self, batches: int | None = None, until_drained: bool = True) -> RunSummary:
        """Run batches until every input is consumed (``until_drained``, the default), or, with
        ``until_drained=False``, stand: when there is nothing to do, look at the inputs' end offsets
        every :attr:`poll_interval` seconds on the driver (no Spark job) and run the next batch as soon
        as records were appended. Either way the run ends after ``batches`` batches, or on
        :meth:`stop`. ``[spark] trigger`` paces the batches: one starts at most once per trigger
        interval."""
        summary = RunSummary(keep=None if until_drained else KEPT_BATCHES)
        self._saved.clear()  # a run plans its first batch from disk (a restarted driver does too)
        self.check_inputs()  # before Spark starts: an input changed under the job fails fast
        self.context  # start Spark before timing anything
        self.run_id = uuid.uuid4().hex
        self._tails_warned.clear()
        if not self.cluster:
            attempts = self.checkpoints.root / "attempts"
            shutil.rmtree(attempts, ignore_errors=True)  # what a killed driver's run left
            self._attempts = attempts / self.run_id
        if self.keep_open:
            self.affinity = self.affinity_class(self.context, self.checkpoints.root / "claims" / self.run_id, run_slot)
        partitions = range(self.job.partitions)
        clear_requests(self.checkpoints, partitions)
        self._create_changelogs()
        if self.cluster:
            self._initial_checkpoints()
        compaction = BatchCompaction.for_job(self.job)
        started = time.perf_counter()
        batch = 0
        last_start = float("-inf")
        idle_since: float | None = None
        try:
            while (batches is None or batch < batches) and not self._stop.is_set():
                if self._wait(last_start + self.trigger - time.monotonic()):
                    break
                planning = time.perf_counter()
                plans, lag = self.plan(batch, timers=not until_drained)
                planned = time.perf_counter()
                summary.pending_bytes = self.pending_bytes
                if not plans:
                    if until_drained:
                        break
                    now = time.monotonic()
                    idle_since = now if idle_since is None else idle_since
                    if self.affinity is not None and self.affinity.keepers and now - idle_since >= IDLE_GIVE_BACK:
                        self.affinity.give_back(self.checkpoints, self.job)
                    # A processing-time timer due before the next poll wakes the loop when it is due.
                    wait = self.busy_poll_interval if now - idle_since < BUSY_FOR else self.poll_interval
                    if self.next_timer is not None:
                        wait = min(wait, max(0.0, self.next_timer - time.time()))
                    self._wait(wait)
                    continue
                idle_since = None
                last_start = time.monotonic()
                roll = compaction is not None and compaction.due()
                if roll:
                    plans = [replace(plan, roll_changelogs=True) for plan in plans]
                try:
                    result = self.run_batch(batch, plans)
                except LocalStateError:
                    raise
                except Exception as exc:  # Py4JJavaError: the Spark job failed after its retries
                    if self._stop.is_set():  # cancelled by stop(): abandoned, nothing of it committed
                        log.warning("batch %d abandoned on stop: nothing of it is committed", batch)
                        log.debug("the abandoned batch's Spark error", exc_info=True)
                        summary.abandoned = batch
                        break
                    log.debug("Spark batch %d failed", batch, exc_info=True)
                    raise spark_failure(exc, batch) from None
                if roll:
                    compaction.start_round()  # type: ignore[union-attr]
                result.driver_seconds["plan"] = planned - planning
                result.seconds += planned - planning
                result.lag = lag - result.records_in
                result.pending_bytes = self.pending_bytes
                summary.add(result)
                if self.progress is not None:
                    self.progress(progress_line(result, len(plans)))
                if self.on_batch is not None:
                    self.on_batch(result, plans)
                batch += 1
        finally:
            summary.stopped = self._stop.is_set()
            summary.forced = self._forced.is_set()
            if compaction is not None and not summary.forced:
                compaction.close()  # waits for a running round (a forced stop leaves it to end with the process)
                summary.compaction_rounds = compaction.rounds.runs
            if self.affinity is not None:
                releasing = time.perf_counter()
                if not summary.forced:
                    self.affinity.release(self.checkpoints, self.job)
                self.affinity = None
                summary.release_seconds = time.perf_counter() - releasing
            if self._attempts is not None:
                shutil.rmtree(self._attempts, ignore_errors=True)
            self._end_run()
        summary.seconds = time.perf_counter() - started
        return summary
