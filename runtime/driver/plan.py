"""What the driver sends each Spark task (:class:`PartitionPlan`) and what comes back, summed per
batch and per run (:class:`BatchResult`, :class:`RunSummary`), with the phases time is measured in."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from localstate.core.task import merge_counts
from localstate.runtime.partition.lifecycle import TASK_PHASES

__all__ = ["PartitionPlan", "BatchResult", "RunSummary", "TASK_PHASES", "DRIVER_PHASES", "progress_line", "lag_text"]


@dataclass(frozen=True)
class PartitionPlan:
    """What one Spark task does in one batch."""

    batch: int
    partition: int
    ranges: dict[str, tuple[int, int]]
    """input stream -> [start, end) offsets"""
    limit: int | None
    """at most this many records (all inputs together); None = the whole ranges"""
    fault: dict[str, Any] | None = None
    """test/demo only: ``{"partition", "batch", "after", "marker"}`` SIGKILLs the worker once"""
    run_id: str = ""
    """the driver's run: a kept instance is reused only within the run that opened it"""
    keep_open: bool = False
    """keep the task instance open in the worker for the partition's next batch (see ``instances``)"""
    roll_changelogs: bool = False
    """seal the active changelog segments before processing, so the driver's next compaction round
    reaches the records in them (see :class:`BatchCompaction`)"""
    cluster: bool = False
    """cluster mode (:mod:`.cluster`): stores under the executor's local directory, the checkpoint
    from the plan (``committed``), nothing read from or locked on a shared file system"""
    committed: dict[str, Any] | None = None
    """cluster mode: the partition's committed checkpoint (as a dict), None if it has none yet"""
    checkpoint_where: str = ""
    """cluster mode: where the driver keeps the checkpoint (for error messages)"""
    tune_worker: bool = True
    """settle the Python worker before its first task (``[spark] worker_affinity``, as set: the
    worker tuning; see :func:`~localstate.runtime.spark.affinity.kept.settle_worker`)"""
    attempts: str = ""
    """local masters: the folder where an attempt that fails and is retried writes its reason for the
    driver (:func:`~.failures.record_failed_attempt`); "" = not recorded"""


#: Phases on the driver, per batch.
DRIVER_PHASES = ("plan", "spark", "checkpoint")
@dataclass
class BatchResult:
    """What one batch (or one tick of the continuous runner) did, summed over its tasks."""

    batch: int
    records_in: int = 0
    records_out: int = 0
    skipped: int = 0
    """bad input records skipped (``on_error = "skip"``)"""
    dead_lettered: int = 0
    lag: int = 0
    pending_bytes: int = 0
    """bytes of unterminated input tails when the batch was planned (appends in progress, not read yet)"""
    seconds: float = 0.0
    restore_seconds: float = 0.0
    replayed: int = 0
    """changelog records replayed into local stores that were behind their checkpoint"""
    trimmed: int = 0
    """keys re-written to their checkpointed value over changelog records past the checkpoint (an
    attempt that wrote and did not commit)"""
    tasks: int = 0
    failed_attempts: int = 0
    """task attempts that failed and were retried by Spark (a killed worker, an I/O error)"""
    failed_attempt_reasons: list[dict[str, Any]] = field(default_factory=list)
    """why each of those attempts failed, one dict per attempt: ``batch``, ``partition``, ``attempt``,
    ``type``, ``message``, ``host`` (``pid`` when the attempt reported it itself); an attempt whose
    Python worker died without a word has ``type`` ``"WorkerExited"``"""
    reused: int = 0
    """tasks that found their partition's instance still open in their worker"""
    stateful: int = 0
    """tasks whose partition had committed state to find (a changelog offset > 0)"""
    warm: int = 0
    """of those, tasks that found it warm: their local stores exactly at the committed offsets"""
    task_seconds: dict[str, float] = field(default_factory=dict)
    """:data:`TASK_PHASES` summed over the batch's tasks"""
    busiest_task: float = 0.0
    """seconds of the longest task (the batch's critical path inside Spark)"""
    driver_seconds: dict[str, float] = field(default_factory=dict)
    """:data:`DRIVER_PHASES`; ``spark`` is the Spark job's wall time minus the busiest task: scheduling,
    Python worker hand-off, plan and result (de)serialization"""
    counts: dict[str, dict[str, int]] = field(default_factory=dict)
    """what the batch's tasks dropped or redirected, summed (:class:`~localstate.core.task.TaskCounters`:
    ``late_records`` per window store, ``misrouted`` per input)"""
    commit_stats: Any = None
    """continuous mode: the per-commit figures (:class:`~localstate.core.commit_stats.CommitStats`) of
    the commits the partitions made since the last report, summed; None in micro-batch mode"""

    def add_task(self, result: dict[str, Any], stateful: bool) -> None:
        """Count one task's result (what :func:`~localstate.runtime.spark.executor.run_partition`
        returns) into the batch; ``stateful``: its partition had committed state to find."""
        self.records_in += result["in"]
        self.records_out += result["out"]
        self.skipped += result["skipped"]
        self.dead_lettered += result["dead"]
        self.restore_seconds += result["restore_seconds"]
        self.replayed += result["replayed"]
        self.trimmed += result["trimmed"]
        self.reused += result["reused"]
        merge_counts(self.counts, result.get("counts") or {})
        if stateful:
            self.stateful += 1
            self.warm += bool(result["warm"])
        for key, value in result["timings"].items():
            self.task_seconds[key] = self.task_seconds.get(key, 0.0) + value
        self.busiest_task = max(self.busiest_task, sum(result["timings"].values()))


@dataclass
class RunSummary:
    batches: list[BatchResult] = field(default_factory=list)
    """the run's batches; with :attr:`keep`, only the latest ``keep`` (older ones are folded into
    :attr:`folded`, so that a standing run's summary does not grow with every batch)"""
    seconds: float = 0.0
    release_seconds: float = 0.0
    """closing the instances kept open in the workers, at the end of the run"""
    compaction_rounds: int = 0
    """changelog compaction rounds completed while the job ran (:class:`BatchCompaction`)"""
    pending_bytes: int = 0
    """bytes of unterminated input tails at the run's last plan: records still being appended (a jsonl
    line without its newline, an incomplete file-log record), not read and not in :attr:`lag`"""

    stopped: bool = False
    """the run ended because it was asked to stop (:meth:`SparkJobRunner.stop`, a signal)"""
    abandoned: int | None = None
    """the batch a stop abandoned (its Spark job cancelled, nothing of it committed), if any"""
    forced: bool = False
    """the stop was forced (``stop(force=True)``): the batch in flight was not waited for, and the
    instances kept in the workers were not given back (they end with Spark; the next open recovers)"""
    keep: int | None = None
    """keep at most this many batches in :attr:`batches` (None: all)"""
    folded: BatchResult | None = None
    """the totals of the batches dropped from :attr:`batches` (``batch`` = how many)"""

    def add(self, result: BatchResult) -> None:
        """Append a batch; beyond :attr:`keep`, fold the oldest into :attr:`folded`."""
        self.batches.append(result)
        if self.keep is not None and len(self.batches) > self.keep:
            oldest = self.batches.pop(0)
            folded = self.folded = self.folded or BatchResult(0)
            folded.batch += 1
            for name in ("records_in", "records_out", "skipped", "dead_lettered", "seconds", "restore_seconds",
                         "replayed", "trimmed", "tasks", "failed_attempts", "reused", "stateful", "warm",
                         "busiest_task"):
                setattr(folded, name, getattr(folded, name) + getattr(oldest, name))
            for name in ("task_seconds", "driver_seconds"):
                totals = getattr(folded, name)
                for key, value in getattr(oldest, name).items():
                    totals[key] = totals.get(key, 0.0) + value
            merge_counts(folded.counts, oldest.counts)

    def _all(self) -> list[BatchResult]:
        return ([self.folded] if self.folded is not None else []) + self.batches

    @property
    def batch_count(self) -> int:
        """Batches the run committed (those folded away included)."""
        return len(self.batches) + (self.folded.batch if self.folded is not None else 0)

    @property
    def warm_fraction(self) -> float | None:
        """Fraction of the tasks with committed state that found it warm in their local stores (no
        replay, no rebuild); None if no task had state to find."""
        stateful = sum(b.stateful for b in self._all())
        return sum(b.warm for b in self._all()) / stateful if stateful else None

    @property
    def records_in(self) -> int:
        return sum(b.records_in for b in self._all())

    @property
    def records_out(self) -> int:
        return sum(b.records_out for b in self._all())

    @property
    def lag(self) -> int:
        return self.batches[-1].lag if self.batches else 0

    @property
    def busy_seconds(self) -> float:
        """Wall time spent in batches: :attr:`seconds` less the waits of a standing run for input."""
        return sum(b.seconds for b in self._all())

    def breakdown(self) -> dict[str, float]:
        """Where the wall time went, in seconds that add up to about :attr:`seconds`: driver phases,
        Spark overhead, and the task phases (summed over all tasks, then scaled to the batches'
        critical paths, i.e. their busiest tasks: the tasks of one batch run in parallel)."""
        batches = self._all()
        out = {name: sum(b.driver_seconds.get(name, 0.0) for b in batches) for name in DRIVER_PHASES}
        busy = sum(b.busiest_task for b in batches)
        summed = {name: sum(b.task_seconds.get(name, 0.0) for b in batches) for name in TASK_PHASES}
        total = sum(summed.values())
        for name, value in summed.items():
            out[name] = value / total * busy if total else 0.0
        out["release"] = self.release_seconds
        return out


def lag_text(lag: int, pending_bytes: int) -> str:
    """``lag N``, with ``(+B bytes unterminated)`` when input tails are still being appended."""
    return f"lag {lag:,}" + (f" (+{pending_bytes:,} bytes unterminated)" if pending_bytes else "")


def rate_text(records: int, seconds: float) -> str:
    """``N rec/s``: whole records per second, one decimal below 10 (5 records in 48 s is 0.1, not 0)."""
    rate = records / seconds if seconds > 0 else 0.0
    return f"{rate:,.0f} rec/s" if rate >= 10 or rate == 0 else f"{rate:.1f} rec/s"


def summary_line(summary: RunSummary) -> str:
    """The last line of a run: ``done:`` (or ``stopped:``, ``stopped now:`` when forced), its batches and records, its wall time and
    the time spent in batches, whose rate it shows (a standing run waits for input between batches:
    a rate over its wall time would fall with every idle minute)."""
    ended = "stopped now" if summary.forced else "stopped" if summary.stopped else "done"
    abandoned = f" (batch {summary.abandoned} abandoned, not committed)" if summary.abandoned is not None else ""
    busy = summary.busy_seconds
    return (f"{ended}: {summary.batch_count} batch(es){abandoned}, {summary.records_in:,} records in, "
            f"{summary.records_out:,} out, {summary.seconds:.1f}s ({busy:.1f}s in batches: "
            f"{rate_text(summary.records_in, busy)}), {lag_text(summary.lag, summary.pending_bytes)}")


def progress_line(result: BatchResult, tasks: int) -> str:
    extra = f" skipped {result.skipped:,}" if result.skipped else ""
    extra += f" dead-lettered {result.dead_lettered:,}" if result.dead_lettered else ""
    extra += f" restored {result.replayed:,} trimmed {result.trimmed:,}" if result.replayed or result.trimmed else ""
    extra += f" warm {result.warm}/{result.stateful}" if result.stateful else ""
    extra += "".join(f" {kind.replace('_', ' ')} {sum(labels.values()):,}"
                     for kind, labels in sorted(result.counts.items()))
    extra += f" ({result.failed_attempts} failed task attempt(s) retried)" if result.failed_attempts else ""
    return (f"batch {result.batch}: {tasks} task(s), in {result.records_in:,} out {result.records_out:,} in "
            f"{result.seconds:.2f}s ({rate_text(result.records_in, result.seconds)}), {lag_text(result.lag, result.pending_bytes)}{extra}")
