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
from dataclasses import replace
from pathlib import Path
from typing import Any, Callable

from localstate.core.changelog import Compactable
from localstate.core.checkpoint import Checkpoint
from localstate.core.config import JobConfig
from localstate.core.stream import open_input
from localstate.core.task import add_task_paths, load_task_class
from localstate.errors import LocalStateError
from localstate.runtime.driver.plan import BatchResult, PartitionPlan, RunSummary, progress_line
from localstate.runtime.driver.planner import BatchPlanner, has_state
from localstate.runtime.driver.stopping import STOP_GRACE, StopControl
from localstate.runtime.layout import checkpoint_store, create_changelog_streams, open_changelog_system, \
    resolve_epoch
from localstate.runtime.partition.faults import crash_point
from localstate.runtime.partition.sink import StreamSink
from localstate.runtime.spark.affinity.kept import clear_requests
from localstate.runtime.spark.affinity.slots import WorkerAffinity
from localstate.runtime.spark.cluster import Placement, is_cluster_master
from localstate.runtime.spark.config import SparkConfig
from localstate.runtime.spark.context import spark_context
from localstate.runtime.spark.executor import run_partition, run_slot
from localstate.runtime.spark.failures import (failed_attempt_reasons, log_failed_attempts, merge_attempt_reasons,
                                               spark_failure)

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
        self._shipped: Any = None
        """this run's JobConfig as a Spark broadcast (:meth:`_ship_job`)"""
        self._savers: ThreadPoolExecutor | None = None
        self.affinity: WorkerAffinity | None = None
        """this run's worker affinity (local masters, ``keep_open``), else None"""
        self.run_id = uuid.uuid4().hex
        self.trigger = self.spark.trigger
        """``[spark] trigger``: a batch starts at most once per this many seconds (0: at once)"""
        self.poll_interval = IDLE_POLL
        self.busy_poll_interval = BUSY_POLL
        self.stop_control = StopControl(lambda group: self.context.cancelJobGroup(group))
        """:meth:`stop`, and the running batch's Spark job group it cancels after its ``grace``"""
        self._attempts: Path | None = None
        """local masters: where this run's failed task attempts leave their reasons"""
        self.checkpoints = checkpoint_store(job)
        self.inputs = {name: open_input(job, name) for name in sorted(job.inputs)}
        self.planner = BatchPlanner(job, self.checkpoints, self.inputs, batch_size=self.batch_size,
                                    cluster=self.cluster)
        """plans the batches from the committed checkpoints, saves the returned ones"""
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

    def committed(self, partition: int) -> Checkpoint | None:
        """The partition's committed checkpoint (:meth:`BatchPlanner.committed`)."""
        return self.planner.committed(partition)

    def plan(self, batch: int, timers: bool = False) -> tuple[list[PartitionPlan], int]:
        """The batch's plans and the total lag before it (:meth:`BatchPlanner.plan`), each plan with
        this run's settings: its id, fault, ``keep_open``, worker tuning and attempts folder."""
        return self.planner.plan(batch, timers, fault=self.fault, run_id=self.run_id, keep_open=self.keep_open,
                                 tune_worker=self.spark.affinity_setting,
                                 attempts=str(self._attempts) if self._attempts is not None else "")

    def check_inputs(self) -> None:
        """Check the checkpointed input positions against the inputs as they are now, planning
        nothing (:meth:`BatchPlanner.check_inputs`): what :meth:`run` does before it starts Spark."""
        self.planner.check_inputs()

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
        homes = self.planner.homes if self.cluster else {}
        if homes:  # a restarted driver: which of its new executors hold these homes (may wait for them)
            self._placement().locate(homes, shipped, self.stop_control.requested)
        self.context.setJobGroup(group, f"localstate {self.job.name} batch {batch}")
        try:
            with self.stop_control.running(group):
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
            log_failed_attempts(merge_attempt_reasons(failed_attempt_reasons(self._attempts, batch),
                                                      self._cluster_reasons(group, plans, batch)), retried=False)
            raise
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
        checkpoints = self.planner.with_input_ids(
            [Checkpoint(**{**result["checkpoint"], "home": result.get("home")}) for result in results])
        if self.cluster:
            for checkpoint in checkpoints:
                self.planner.check_attempt(checkpoint)
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
            out.add_task(r, stateful=has_state(self.planner.planned_from(r["partition"])))
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
        save = self.planner.save
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

    def stop(self, force: bool = False) -> None:
        """Ask :meth:`run` to stop (:meth:`StopControl.stop`), from any thread or a signal handler
        (``localstate run`` calls it on SIGTERM/SIGINT/SIGHUP, with ``force`` on a second one): the batch
        running now gets :data:`STOP_GRACE` seconds to complete and be committed, else its Spark job
        group is cancelled. :meth:`run` then releases the kept instances and returns its summary
        (``stopped`` set); a later :meth:`run` returns at once. ``force`` cancels the running batch now
        (it runs again at the next start), waits for no compaction round and gives the kept instances
        not back (they end with the Spark workers; the next open recovers them from the changelog)."""
        self.stop_control.stop(force)

    @property
    def stopping(self) -> bool:
        """True once :meth:`stop` was called."""
        return self.stop_control.stopping

    def run(self, batches: int | None = None, until_drained: bool = True) -> RunSummary:
        """Run batches until every input is consumed (``until_drained``, the default), or, with
        ``until_drained=False``, stand: when there is nothing to do, look at the inputs' end offsets
        every :attr:`poll_interval` seconds on the driver (no Spark job) and run the next batch as soon
        as records were appended. Either way the run ends after ``batches`` batches, or on
        :meth:`stop`. ``[spark] trigger`` paces the batches: one starts at most once per trigger
        interval."""
        summary = RunSummary(keep=None if until_drained else KEPT_BATCHES)
        self.planner.start_run()  # a run plans its first batch from disk (a restarted driver does too)
        self.check_inputs()  # before Spark starts: an input changed under the job fails fast
        self.context  # start Spark before timing anything
        self.run_id = uuid.uuid4().hex
        if not self.cluster:
            attempts = self.checkpoints.root / "attempts"
            shutil.rmtree(attempts, ignore_errors=True)  # what a killed driver's run left
            self._attempts = attempts / self.run_id
        if self.keep_open:
            self.affinity = self.affinity_class(self.context, self.checkpoints.root / "claims" / self.run_id, run_slot)
        partitions = range(self.job.partitions)
        clear_requests(self.checkpoints, partitions)
        create_changelog_streams(self.job)
        if self.cluster:
            self.planner.initial_checkpoints()
        compaction = BatchCompaction.for_job(self.job)
        started = time.perf_counter()
        batch = 0
        last_start = float("-inf")
        idle_since: float | None = None
        try:
            while (batches is None or batch < batches) and not self.stop_control.stopping:
                if self.stop_control.wait(last_start + self.trigger - time.monotonic()):
                    break
                planning = time.perf_counter()
                plans, lag = self.plan(batch, timers=not until_drained)
                planned = time.perf_counter()
                summary.pending_bytes = self.planner.pending_bytes
                if not plans:
                    if until_drained:
                        break
                    now = time.monotonic()
                    idle_since = now if idle_since is None else idle_since
                    if self.affinity is not None and self.affinity.keepers and now - idle_since >= IDLE_GIVE_BACK:
                        self.affinity.give_back(self.checkpoints, self.job)
                    # A processing-time timer due before the next poll wakes the loop when it is due.
                    wait = self.busy_poll_interval if now - idle_since < BUSY_FOR else self.poll_interval
                    if self.planner.next_timer is not None:
                        wait = min(wait, max(0.0, self.planner.next_timer - time.time()))
                    self.stop_control.wait(wait)
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
                    if self.stop_control.stopping:  # cancelled by stop(): abandoned, nothing of it committed
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
                result.pending_bytes = self.planner.pending_bytes
                summary.add(result)
                if self.progress is not None:
                    self.progress(progress_line(result, len(plans)))
                if self.on_batch is not None:
                    self.on_batch(result, plans)
                batch += 1
        finally:
            summary.stopped = self.stop_control.stopping
            summary.forced = self.stop_control.forced
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
