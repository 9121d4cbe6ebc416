"""Continuous mode (``[spark] mode = "continuous"``): long-running Spark tasks that follow their
inputs record at a time, in epochs.

Micro-batches pay one Spark job per batch (scheduling, task launch, the hand-off to Python and back)
under every record's latency. Here the driver starts one Spark job per *epoch* (``[spark] epoch``,
default 5 minutes), with one long-running task per group of partitions (as many groups as the
master has task slots). Each task opens its partitions' instances and runs
:class:`~localstate.runtime.partition.follow.FollowingPartition` rounds until the epoch ends: records
are fed as they are appended, timers fire when due, and each partition commits by itself (state,
changelog offsets, input positions and outputs in one checkpoint, fenced by the generation its open
took) as soon as it has caught up, and on ``commit_interval``/``commit_every`` while busy. A record's
output is visible one poll and one commit after it was appended.

Between epochs the driver has control again: changelog compaction, configuration, fencing. A new
epoch's tasks reopen their partitions from the local stores they left at their last commit (no
restore from the changelog on the same host).

Failures: a killed worker fails its task, which Spark retries: the retry reopens its partitions at
their last commits and goes on to the same epoch end. A killed driver: each task checks every
:data:`DRIVER_CHECK` seconds that the driver process lives (same host) and stops without committing
when it does not; on a cluster the master stops the executors of a dead application. Either way the
next driver's tasks take new generations, which fence anything still running. A stop (SIGTERM) drops
a marker the tasks see within half a second (:data:`WAIT_FOR`): they commit what they hold and end,
and the run exits 0.
"""

from __future__ import annotations

import logging
import os
import pickle
import shutil
import socket
import threading
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from localstate.core.checkpoint import Checkpoint
from localstate.core.commit_stats import CommitStats
from localstate.core.config import JobConfig
from localstate.core.stream import InputStream, WaitableInput, open_input
from localstate.core.task import add_task_paths
from localstate.errors import InputError, LocalStateError
from localstate.runtime.driver.plan import BatchResult, PartitionPlan, RunSummary, lag_text, rate_text
from localstate.runtime.layout import create_changelog_streams, open_changelog_system
from localstate.runtime.partition.follow import FollowingPartition
from localstate.runtime.partition.instance import TaskInstance
from localstate.runtime.partition.sink import StreamSink
from localstate.runtime.spark.affinity.kept import acquire_partition
from localstate.runtime.spark.config import SparkConfig
from localstate.runtime.spark.driver import KEPT_BATCHES, BatchCompaction, SparkJobRunner
from localstate.runtime.spark.executor import task_attempt
from localstate.runtime.spark.failures import (executor_failure, failed_attempt_reasons, log_failed_attempts,
                                               record_failed_attempt, spark_failure)

__all__ = ["ContinuousRunner", "EpochPlan", "run_epoch", "group_partitions", "BUSY_POLL", "IDLE_POLL",
           "BUSY_FOR", "WAIT_FOR", "BUSY_TURN", "PROBE_EVERY", "DRIVER_CHECK", "PROGRESS_EVERY", "MIN_RUN", "FAILED_EPOCHS"]

log = logging.getLogger(__name__)

BUSY_POLL = 0.001
"""Seconds a task waits before looking at its inputs again while records keep arriving."""

IDLE_POLL = 0.05
"""...once no record arrived for :data:`BUSY_FOR` seconds: what an idle job pays, as polls."""

BUSY_FOR = 1.0

WAIT_FOR = 0.5
"""Seconds a task waits at most for records when every input can wait for them
(:class:`~localstate.core.stream.WaitableInput`: Kafka's long-poll fetch, the file inputs' inotify)
instead of probing them every :data:`BUSY_POLL` or :data:`IDLE_POLL`: it wakes as soon as one
arrives, and at least this often to see a stop."""

BUSY_TURN = 0.005
"""Seconds each input's wait takes per turn while records keep arriving, when several inputs wait
(:func:`_wait_for_records`); :data:`IDLE_POLL` once idle."""

PROBE_EVERY = 5.0
"""Seconds between two end probes at most while every wait times out: a safety net should a wait
miss a record (a round after a timed-out wait does not probe)."""

MIN_RUN = 1.0
"""Seconds a task runs at least, even when it opened its partitions after its epoch's end."""

FAILED_EPOCHS = 3
"""Epochs in a row whose Spark job fails (task attempts used up by dying workers) before the run
fails: a failed epoch's partitions keep their last commits, so the next epoch goes on from there."""

DRIVER_CHECK = 1.0
"""Seconds between a task's checks that its driver still lives (same host)."""

PROGRESS_EVERY = 1.0
"""Seconds between two progress reports of a continuous run (progress.jsonl, metrics, the console)."""

STOP_FILE = "stop"


@dataclass(frozen=True)
class EpochPlan:
    """What one long-running Spark task of a continuous run does in one epoch."""

    epoch: int
    partitions: tuple[int, ...]
    ends_at: float
    """wall-clock time (epoch seconds) at which every task of the epoch commits and ends together: a
    retried task ends with its siblings, which would otherwise wait for it with their partitions idle"""
    run_id: str
    control: str
    """the run's control folder: the driver drops :data:`STOP_FILE` there to stop the tasks"""
    driver_host: str = ""
    driver_pid: int = 0
    until_drained: bool = False
    """end as soon as every input is consumed (``--until-drained``)"""
    roll_changelogs: bool = False
    """seal the active changelog segments first (the driver's compaction round reaches them)"""
    attempts: str = ""
    """local masters: where a failed attempt leaves its reason (:func:`record_failed_attempt`)"""


def group_partitions(partitions: int, slots: int) -> list[tuple[int, ...]]:
    """The job's partitions dealt round robin into ``min(partitions, slots)`` groups: one
    long-running task each, so that every task has a slot and none waits for another to end."""
    groups = max(1, min(partitions, slots))
    return [tuple(range(g, partitions, groups)) for g in range(groups)]


# -- executor side ---------------------------------------------------------------------------------
@dataclass
class _Opened:
    follower: FollowingPartition
    sink: StreamSink
    changelogs: Any
    ended: bool = False

    def close(self, commit: bool) -> None:
        try:
            if commit:
                self.follower.finish()
                self.follower.instance.close(commit=False)  # finish() committed: nothing is left
            else:
                self.follower.instance.abandon()
        finally:
            self.sink.close()
            self.changelogs.close()


def _open(job: JobConfig, partition: int, inputs: dict[str, InputStream]) -> _Opened:
    changelogs = open_changelog_system(job)
    sink = StreamSink(job)
    instance = TaskInstance(job, partition, changelogs, sink)  # the job's commit_interval / commit_every
    try:
        acquire_partition(instance.checkpoints, partition)  # the previous epoch's task may still be closing
        instance.open()
    except BaseException:
        sink.close()
        changelogs.close()
        instance.checkpoints.unlock(partition)
        raise
    return _Opened(FollowingPartition(instance, inputs), sink, changelogs)


def _driver_alive(plan: EpochPlan) -> bool:
    """False only when the driver runs on this host and its process is gone."""
    if plan.driver_pid <= 0 or plan.driver_host != socket.gethostname():
        return True
    try:
        os.kill(plan.driver_pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def run_epoch(job: JobConfig, plan: EpochPlan) -> dict[str, Any]:
    """Executor side of one epoch for one group of partitions. Returns what it did, or ``{"error":
    pickled LocalStateError}`` for failures a retry cannot fix; others are raised for Spark to retry."""
    try:
        return _run_epoch(job, plan)
    except (Exception, SystemExit) as exc:
        first = plan.partitions[0] if plan.partitions else -1
        try:
            error = executor_failure(exc, plan.epoch, first)
        except BaseException:
            record_failed_attempt(plan.attempts, plan.epoch, first, task_attempt(), exc)
            raise
        return {"partitions": list(plan.partitions), "error": error}


def _run_epoch(job: JobConfig, plan: EpochPlan) -> dict[str, Any]:
    add_task_paths(job)
    stop = Path(plan.control) / STOP_FILE
    inputs = {name: open_input(job, name) for name in sorted(job.inputs)}
    opened: list[_Opened] = []
    clean = False
    reason = "epoch"
    try:
        for partition in plan.partitions:
            opened.append(_open(job, partition, inputs))
        if plan.roll_changelogs:
            for each in opened:
                _roll(each.follower.instance)
        woken = quiet = False
        busy_since = time.monotonic()
        driver_checked = probed = busy_since
        # On the monotonic clock; a task that opened after the epoch's end (a slow first start, a late
        # retry) still runs MIN_RUN seconds, so that each epoch makes progress.
        ends_at = busy_since + max(plan.ends_at - time.time(), MIN_RUN)
        while True:
            now = time.monotonic()
            if now >= ends_at:
                break
            if stop.exists():
                reason = "stop"
                break
            if now - driver_checked >= DRIVER_CHECK:
                driver_checked = now
                if not _driver_alive(plan):
                    reason = "driver gone"
                    log.warning("continuous epoch %d: the driver (pid %d) is gone: stopping without committing",
                                plan.epoch, plan.driver_pid)
                    return {"partitions": list(plan.partitions), "reason": reason}
            # A wait that timed out saw no record arrive: the round skips the end probes (on Kafka a
            # request each), but probes at least every PROBE_EVERY should a wait ever miss one.
            probe = not quiet or now - probed >= PROBE_EVERY
            if probe:
                probed = now
            fed = sum(each.follower.step(probe) for each in opened)
            if fed:
                busy_since, woken, quiet = time.monotonic(), False, False
                continue
            if plan.until_drained and all(each.follower.caught_up for each in opened):
                reason = "drained"
                break
            idle = time.monotonic() - busy_since >= BUSY_FOR
            wakeups = [w for w in (each.follower.next_wakeup() for each in opened) if w is not None]
            bounds = [max(0.0, ends_at - time.monotonic())] + wakeups
            waitable = _waitable(inputs)  # each round: an input may have found it cannot wait after all
            # A wait that woke for records the round then did not find sleeps once, so that a wait and
            # an end probe that disagree cannot spin.
            if _waits_now(waitable, idle) and not woken:
                timeout = min([WAIT_FOR] + bounds)
                woken = _wait_for_records(waitable, opened, timeout, IDLE_POLL if idle else BUSY_TURN)
                quiet = not woken and timeout > 0
            else:
                woken = quiet = False
                time.sleep(min([IDLE_POLL if idle else BUSY_POLL] + bounds))
        clean = True
    finally:
        errors: list[BaseException] = []
        for each in opened:
            try:
                each.close(commit=clean)
            except BaseException as exc:  # noqa: BLE001 - every partition is released, then the first raised
                errors.append(exc)
        for source in inputs.values():
            close = getattr(source, "close", None)
            if callable(close):
                close()
        if errors and clean:
            raise errors[0]
    return {"partitions": list(plan.partitions), "partition": plan.partitions[0] if plan.partitions else None,
            "reason": reason, "attempt": task_attempt(), "pid": os.getpid(),
            "records": {each.follower.partition: each.follower.records for each in opened},
            "commits": {each.follower.partition: each.follower.commits for each in opened},
            # Each partition's figures, its last commit's included: no checkpoint carries those.
            "commit_stats": {each.follower.partition: each.follower.instance.committer.accounting.stats.to_json()
                             for each in opened}}


def _waitable(inputs: dict[str, InputStream]) -> dict[str, WaitableInput]:
    """The inputs a task waits on: all of them when every one can wait, else none (a wait on
    some would leave the others unwatched: the task sleeps between probes instead)."""
    if inputs and all(isinstance(source, WaitableInput) and source.can_wait() for source in inputs.values()):
        return dict(inputs)  # type: ignore[arg-type]
    return {}


def _waits_now(waitable: dict[str, WaitableInput], idle: bool) -> bool:
    """Whether a task with nothing to read waits on its inputs rather than sleeping between probes:
    once idle, whenever they can wait; while records keep arriving, only when every wait wakes as soon
    as a record arrives (a broker may answer a waiting fetch late: those keep the busy probes)."""
    return bool(waitable) and (idle or all(source.wakes_at_once() for source in waitable.values()))


def _wait_for_records(inputs: dict[str, WaitableInput], opened: list[_Opened], timeout: float, turn: float) -> bool:
    """Wait until an input holds a record past a partition's position (True) or ``timeout`` passes
    (False). One input waits the whole time; several take turns of ``turn`` seconds each (their
    fetches stay in flight at the broker between turns, so a turn costs no request). An input that
    cannot wait (a broker error) makes the task sleep out the time instead and returns True, so that
    the next round probes: its end probe reports what is wrong."""
    deadline = time.monotonic() + timeout
    slice_ = timeout if len(inputs) == 1 else min(turn, timeout)
    while (remaining := deadline - time.monotonic()) > 0:
        for name, source in inputs.items():
            positions = {each.follower.partition: each.follower.instance.position(name) for each in opened}
            try:
                if source.wait_for_records(positions, min(slice_, remaining)):
                    return True
            except InputError:
                log.debug("continuous: input %s cannot wait for records; sleeping instead", name, exc_info=True)
                time.sleep(max(0.0, deadline - time.monotonic()))
                return True
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return False
    return False


def _roll(instance: TaskInstance) -> None:
    """Seal each store's active changelog segment (systems with a ``roll()`` capability)."""
    for store in instance.stores.values():
        roll = getattr(store.changelog, "roll", None) if store.changelog is not None else None
        if callable(roll):
            roll()


# -- driver side -----------------------------------------------------------------------------------
@dataclass
class _Progress:
    """What the driver saw at its last look at the checkpoints."""

    positions: dict[int, dict[str, int]] = field(default_factory=dict)
    outputs: dict[int, dict[str, int]] = field(default_factory=dict)
    stats: dict[int, CommitStats] = field(default_factory=dict)
    """each partition's last sound per-commit figures (:attr:`Checkpoint.commit_stats`)"""
    tick: int = 0
    at: float = field(default_factory=time.perf_counter)
    """when the last report was made"""


class ContinuousRunner(SparkJobRunner):
    """Drives a job in continuous mode: one Spark job per epoch, one long-running task per group of
    partitions (:func:`run_epoch`); the tasks commit by themselves. Progress is read from the
    committed checkpoints every :data:`PROGRESS_EVERY` seconds. :meth:`run` and :meth:`stop` behave
    as the micro-batch runner's (``batches`` counts epochs)."""

    def __init__(self, job: JobConfig, **kwargs: Any) -> None:
        super().__init__(job, **kwargs)
        self.epoch_seconds = self.spark.epoch
        self.control: Path | None = None

    def stop(self, force: bool = False) -> None:
        """As :meth:`SparkJobRunner.stop`; the running epoch's tasks see the stop within a poll,
        commit what they hold and end."""
        control = self.control
        if control is not None:
            try:
                (control / STOP_FILE).touch()
            except OSError:  # the grace period's cancellation stops them instead
                log.debug("cannot write the stop marker in %s", control, exc_info=True)
        super().stop(force)

    def slots(self) -> int:
        """Task slots of the master: one long-running task per slot at most."""
        return max(1, int(self.context.defaultParallelism))

    def run(self, batches: int | None = None, until_drained: bool = True) -> RunSummary:
        summary = RunSummary(keep=None if until_drained else KEPT_BATCHES)
        self.planner.start_run()
        self.check_inputs()
        context = self.context
        self.run_id = uuid.uuid4().hex
        root = self.checkpoints.root
        self.control = root / "continuous" / self.run_id
        shutil.rmtree(root / "continuous", ignore_errors=True)  # what a killed driver's run left
        self.control.mkdir(parents=True)
        attempts = root / "attempts"
        shutil.rmtree(attempts, ignore_errors=True)
        self._attempts = attempts / self.run_id
        if self.stop_control.stopping:  # stopped before the run began
            (self.control / STOP_FILE).touch()
        create_changelog_streams(self.job)
        if self.cluster:
            self.planner.initial_checkpoints()
        compaction = BatchCompaction.for_job(self.job)
        groups = group_partitions(self.job.partitions, self.slots())
        shipped = self._ship_job()
        progress = _Progress()
        self._look(progress, report=False)
        started = time.perf_counter()
        epoch = failed_in_a_row = 0
        try:
            while (batches is None or epoch < batches) and not self.stop_control.stopping:
                roll = compaction is not None and compaction.due()
                plans = [EpochPlan(epoch, group, time.time() + self.epoch_seconds, self.run_id, str(self.control),
                                   socket.gethostname(), os.getpid(), until_drained, roll, str(self._attempts))
                         for group in groups]
                group_name = f"localstate-{self.run_id}-{epoch}"
                context.setJobGroup(group_name, f"localstate {self.job.name} continuous epoch {epoch}")
                watcher = _Watcher(self, progress, summary)
                try:
                    with self.stop_control.running(group_name):
                        results = context.parallelize(plans, len(plans)).mapPartitions(
                            lambda items: [run_epoch(shipped.value, plan) for plan in items]).collect()
                except LocalStateError:
                    raise
                except Exception as exc:  # Py4JJavaError: an epoch's task failed after its retries
                    if self.stop_control.stopping:
                        log.warning("epoch %d cancelled on stop: its partitions keep their last commits", epoch)
                        summary.abandoned = epoch
                        break
                    failed_in_a_row += 1
                    error = spark_failure(exc, epoch)
                    if failed_in_a_row >= FAILED_EPOCHS:
                        raise error from None
                    log.warning("epoch %d failed (%s); its partitions keep their last commits: starting the next "
                                "epoch (%d of %d failed epochs in a row)", epoch, error, failed_in_a_row,
                                FAILED_EPOCHS)
                    epoch += 1
                    continue
                finally:
                    watcher.close()
                failed_in_a_row = 0
                errors = [r for r in results if "error" in r]
                if errors:
                    raise pickle.loads(errors[0]["error"])
                if roll:
                    compaction.start_round()  # type: ignore[union-attr]
                # Attempts that failed and were retried in the epoch (a killed worker), each with why.
                reasons = failed_attempt_reasons(self._attempts, epoch, results)
                log_failed_attempts(reasons)
                self._look(progress, summary=summary, tasks=len(plans),
                           failed=sum(r.get("attempt", 0) for r in results), reasons=reasons,
                           final=_final_stats(results))
                epoch += 1
                if until_drained and all(r.get("reason") == "drained" for r in results):
                    break
        finally:
            summary.stopped = self.stop_control.stopping
            summary.forced = self.stop_control.forced
            if compaction is not None and not summary.forced:
                compaction.close()
                summary.compaction_rounds = compaction.rounds.runs
            shutil.rmtree(self.control, ignore_errors=True)
            self.control = None
            if self._attempts is not None:
                shutil.rmtree(self._attempts, ignore_errors=True)
            self._end_run()
        summary.seconds = time.perf_counter() - started
        return summary

    def _look(self, seen: _Progress, *, report: bool = True, summary: RunSummary | None = None, tasks: int = 0,
              failed: int = 0, reasons: list[dict[str, Any]] | None = None,
              final: dict[int, CommitStats] | None = None) -> None:
        """Read every partition's committed checkpoint; report what was committed since the last look
        (a progress line, ``on_batch``: progress.jsonl and the metrics), if anything was. The tasks'
        per-commit figures are the difference of each partition's since the last look
        (:meth:`CommitStats.since_last`); a checkpoint without sound ones keeps the last seen. ``final``:
        at an epoch's end, each partition's figures as its task returned them (its last commit's too)."""
        plans: list[PartitionPlan] = []
        result = BatchResult(seen.tick, tasks=tasks, failed_attempts=failed, failed_attempt_reasons=list(reasons or []))
        commits = CommitStats()
        lag = 0
        for partition in range(self.job.partitions):
            checkpoint = self.checkpoints.load(partition) or Checkpoint(partition)
            before = seen.positions.get(partition, {})
            ranges = {name: (before.get(name, 0), position) for name, position in checkpoint.inputs.items()}
            result.records_in += sum(end - start for start, end in ranges.values())
            out_before = seen.outputs.get(partition, {})
            result.records_out += sum(max(0, end - out_before.get(name, 0)) for name, end in checkpoint.outputs.items())
            seen.positions[partition] = dict(checkpoint.inputs)
            seen.outputs[partition] = dict(checkpoint.outputs)
            stats = (final or {}).get(partition) or checkpoint.commit_stats
            if stats is not None:
                commits = commits.plus(stats.since_last(seen.stats.get(partition)))
                seen.stats[partition] = stats
            plans.append(PartitionPlan(seen.tick, partition, ranges, None, run_id=self.run_id))
        result.commit_stats = commits
        if not report or (result.records_in == 0 and result.records_out == 0 and not failed and not commits.commits):
            return
        # The lag only for a report: an idle run's looks probe no input (on Kafka a request each).
        for partition in range(self.job.partitions):
            for name, source in self.inputs.items():
                lag += max(0, source.end_offset(partition) - seen.positions[partition].get(name, 0))
        now = time.perf_counter()
        result.lag, result.seconds, seen.at = lag, now - seen.at, now
        seen.tick += 1
        if summary is not None:
            summary.add(result)
        if self.progress is not None:
            self.progress(committed_line(result))
        if self.on_batch is not None:
            self.on_batch(result, plans)


def _final_stats(results: list[dict[str, Any]]) -> dict[int, CommitStats]:
    """partition -> the per-commit figures an epoch's tasks returned (sound ones only: as a
    checkpoint's, anything else reads as absent)."""
    found: dict[int, CommitStats] = {}
    for result in results:
        stats = result.get("commit_stats")
        for partition, value in stats.items() if isinstance(stats, dict) else ():
            parsed = CommitStats.parse(value)
            if type(partition) is int and parsed is not None:
                found[partition] = parsed
    return found


def committed_line(result: BatchResult) -> str:
    """The console line of a continuous run's progress report: what was committed since the last."""
    failed = f" ({result.failed_attempts} failed task attempt(s) retried)" if result.failed_attempts else ""
    return (f"committed {result.batch}: in {result.records_in:,} out {result.records_out:,} in {result.seconds:.2f}s "
            f"({rate_text(result.records_in, result.seconds)}), {lag_text(result.lag, result.pending_bytes)}{failed}")


class _Watcher:
    """The driver's look at the committed checkpoints every :data:`PROGRESS_EVERY` seconds while an
    epoch runs (a thread; the epoch's Spark job blocks the run's own)."""

    def __init__(self, runner: ContinuousRunner, seen: _Progress, summary: RunSummary) -> None:
        self._runner = runner
        self._seen = seen
        self._summary = summary
        self._done = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="localstate-continuous-progress", daemon=True)
        self._thread.start()

    def _loop(self) -> None:
        while not self._done.wait(PROGRESS_EVERY):
            try:
                self._runner._look(self._seen, summary=self._summary)  # noqa: SLF001 - the runner's own progress, on its thread
            except Exception:  # noqa: BLE001 - progress is best effort; the epoch's result says what failed
                log.debug("continuous progress: reading the checkpoints failed", exc_info=True)

    def close(self) -> None:
        self._done.set()
        self._thread.join()


def runner_for(job: JobConfig, **kwargs: Any) -> SparkJobRunner:
    """The runner ``[spark] mode`` asks for: :class:`ContinuousRunner` or the micro-batch one."""
    continuous = SparkConfig.of(job, master=kwargs.get("master")).continuous
    return ContinuousRunner(job, **kwargs) if continuous else SparkJobRunner(job, **kwargs)

